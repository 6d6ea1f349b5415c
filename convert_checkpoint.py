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
from pathlib import Path

import modeling
from bert_recipe.io.atomic_io import atomic_torch_save
from bert_recipe.io.checkpoint_io import from_pretrained, nvidia_state_dict, save_hf_directory
from bert_recipe.io.cli import InputError, add_debug_argument, check_output_path, script_errors

MODELS = {
    "pretraining": modeling.BertForPreTraining,
    "qa": modeling.BertForQuestionAnswering,
    "classification": modeling.BertForSequenceClassification,
    "encoder": modeling.BertModel,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="convert_checkpoint.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", required=True, help="checkpoint: HF directory, .pt, .bin or .safetensors")
    p.add_argument("--output", required=True, help="output directory (--format hf) or .pt file (--format nvidia)")
    p.add_argument("--format", choices=("hf", "nvidia"), default="hf", help="what to write (default: hf)")
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="pretraining",
        help="which model the checkpoint holds (default: pretraining)",
    )
    p.add_argument("--num_labels", type=int, default=2, help="classifier outputs, with --model classification")
    p.add_argument("--config_file", default=None, help="bert_config.json, when none sits in or beside the input")
    p.add_argument("--vocab_file", default=None, help="vocab.txt to copy into a Hugging Face directory")
    add_debug_argument(p)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Every input and the output checked before the checkpoint is read (one-line InputError each)."""
    if not Path(args.input).exists():
        raise InputError(
            f"--input {args.input} not found: give a checkpoint (.pt, .bin, .safetensors or a Hugging Face folder)"
        )
    for flag, value in (("--config_file", args.config_file), ("--vocab_file", args.vocab_file)):
        if value is not None and not Path(value).is_file():
            raise InputError(f"{flag} {value} {'is a folder' if Path(value).is_dir() else 'not found'}: name the file")
    if args.vocab_file is not None and args.format != "hf":
        raise InputError("--vocab_file is copied into a Hugging Face folder only: use it with --format hf")
    if args.model == "classification" and args.num_labels < 1:
        raise InputError(f"--num_labels must be at least 1, got {args.num_labels}")
    check_output_path(args.output, "--output", folder=args.format == "hf")


def main(argv=None) -> int:
    """0 when the output was written; bad input, a checkpoint that cannot be read safely or does not fit, or a
    full disk: one line on stderr and exit status 1 (--debug: the traceback)."""
    with script_errors("convert_checkpoint.py", argv):
        return _main(argv)


def _main(argv) -> int:
    args = parse_args(argv)
    check_args(args)
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
