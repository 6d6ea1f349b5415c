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

import modeling
from checkpoint_io import from_pretrained, nvidia_state_dict, save_hf_directory
from utils import atomic_torch_save

MODELS = {
    "pretraining": modeling.BertForPreTraining,
    "qa": modeling.BertForQuestionAnswering,
    "classification": modeling.BertForSequenceClassification,
    "encoder": modeling.BertModel,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="checkpoint: HF directory, .pt, .bin or .safetensors")
    p.add_argument("--output", required=True, help="output directory (--format hf) or .pt file (--format nvidia)")
    p.add_argument("--format", choices=("hf", "nvidia"), default="hf", help="what to write (default: hf)")
    p.add_argument("--model", choices=sorted(MODELS), default="pretraining",
                   help="which model the checkpoint holds (default: pretraining)")
    p.add_argument("--num_labels", type=int, default=2, help="classifier outputs, with --model classification")
    p.add_argument("--config_file", default=None, help="bert_config.json, when none sits in or beside the input")
    p.add_argument("--vocab_file", default=None, help="vocab.txt to copy into a Hugging Face directory")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cls = MODELS[args.model]
    kwargs = {"num_labels": args.num_labels} if args.model == "classification" else {}
    try:
        model = from_pretrained(cls, args.input, config=args.config_file, **kwargs)
    except (FileNotFoundError, ValueError) as e:
        print(f"convert_checkpoint.py: {e}", file=sys.stderr)
        return 2
    if args.format == "hf":
        save_hf_directory(model, args.output, vocab_file=args.vocab_file)
    else:
        atomic_torch_save({"model": nvidia_state_dict(model), "config": model.config.to_dict()}, args.output)
    print(f"wrote {args.output} ({args.format}, {cls.__name__}, {modeling.count_parameters(model):,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
