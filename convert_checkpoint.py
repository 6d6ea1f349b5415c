"""Convert any checkpoint the model loader reads into a Hugging Face directory or an NVIDIA-style .pt.

    python convert_checkpoint.py --input results/pretrain/ckpt_1000.pt --output hf_model/ --format hf \
        --vocab_file vocab.txt
    python convert_checkpoint.py --input hf_model/ --output bert_nvidia.pt --format nvidia

Inputs: a Hugging Face directory, a ckpt_<step>.pt of run_pretraining.py / run_squad.py / run_glue.py, an NVIDIA
DeepLearningExamples checkpoint, or a plain state-dict file (with --config_file). Weights are read without
executing pickled code; keys that fit nowhere are an error, never silently dropped.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import modeling
from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_torch_save
from bert_recipe.io.checkpoint_io import from_pretrained, nvidia_state_dict, save_hf_directory
from bert_recipe.io.cli import check_output_path, script_errors
from bert_recipe.io.flags import flag

MODELS = {
    "pretraining": modeling.BertForPreTraining,
    "qa": modeling.BertForQuestionAnswering,
    "classification": modeling.BertForSequenceClassification,
    "encoder": modeling.BertModel,
}


@dataclass(frozen=True)
class Conversion:
    """What to read, what to write."""

    input: str | None = flag(None, required=True)
    """checkpoint: HF directory, .pt, .bin or .safetensors"""
    output: str | None = flag(None, required=True)
    """output directory (--format hf) or .pt file (--format nvidia)"""
    format: Literal["hf", "nvidia"] = "hf"
    """what to write (default: hf)"""
    model: str = flag("pretraining", choices=sorted(MODELS))
    """which model the checkpoint holds (default: pretraining)"""
    num_labels: int = 2
    """classifier outputs, with --model classification"""
    config_file: str | None = None
    """bert_config.json, when none sits in or beside the input"""
    vocab_file: str | None = None
    """vocab.txt to copy into a Hugging Face directory"""


@dataclass(frozen=True)
class ConvertConfig(flags.Config):
    """Every flag of convert_checkpoint.py."""

    conversion: Conversion = field(default_factory=Conversion)

    ungrouped: ClassVar[tuple[str, ...]] = ("conversion",)
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"

    def rules(self) -> list[tuple[bool, str]]:
        """Every input checked before the checkpoint is read (the output after them, by check_output_path)."""
        c = self.conversion
        files = {"--config_file": c.config_file, "--vocab_file": c.vocab_file}
        return [
            (
                not Path(c.input).exists(),
                f"--input {c.input} not found: give a checkpoint (.pt, .bin, .safetensors or a Hugging Face folder)",
            ),
            *[
                (
                    value is not None and not Path(value).is_file(),
                    f"{name} {value} {'is a folder' if Path(value or '').is_dir() else 'not found'}: name the file",
                )
                for name, value in files.items()
            ],
            (
                c.vocab_file is not None and c.format != "hf",
                "--vocab_file is copied into a Hugging Face folder only: use it with --format hf",
            ),
            (c.model == "classification" and c.num_labels < 1, f"--num_labels must be at least 1, got {c.num_labels}"),
        ]


def main(argv=None) -> int:
    """0 when the output was written; bad input, a checkpoint that cannot be read safely or does not fit, or a
    full disk: one line on stderr and exit status 1 (--debug: the traceback)."""
    with script_errors("convert_checkpoint.py", argv):
        return _main(argv)


def _main(argv) -> int:
    args = flags.parse(ConvertConfig, "convert_checkpoint.py", __doc__, argv).conversion
    check_output_path(args.output, "--output", folder=args.format == "hf")  # before the checkpoint is read
    cls = MODELS[args.model]
    kwargs = {"num_labels": args.num_labels} if args.model == "classification" else {}
    model = from_pretrained(cls, args.input, config=args.config_file, **kwargs)
    if args.format == "hf":
        save_hf_directory(model, args.output, vocab_file=args.vocab_file)
    else:
        atomic_torch_save({"model": nvidia_state_dict(model), "config": model.config.to_dict()}, args.output)
    print(f"wrote {args.output} ({args.format}, {cls.__name__}, {modeling.count_parameters(model):,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
