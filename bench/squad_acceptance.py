"""SQuAD v1.1 acceptance run: fine-tune the real all-MiniLM-L6-v2 weights on the first 40 articles of the v1.1 dev
set, evaluate on the other 8, and compare with a first-sentence baseline scored by the same evaluator.

    .venv/bin/python -m bench.squad_acceptance                  # from the repository root; ~1 h on 2 busy cores
    .venv/bin/python -m bench.squad_acceptance --precision bf16 --threads 1 --epochs 2

The 48 articles of dev-v1.1.json (../shared/data/squad-v1.1-dev) are split by article, so no context is shared
between training and evaluation. The run goes through run_squad.main with the flags printed in the result, so it
exercises the real script (features, cache, training loop, post-processing, in-process evaluation) and the
official evaluate-v1.1.py as --eval_script. `--precision auto` first times a few training steps of real windows in
fp32 and in bf16 and keeps the faster one (bf16 autocast needs AVX512-BF16 or AMX to pay off on a CPU).

Writes <out>/acceptance.json (scores, baseline, timings, command, date) and prints a small Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Mapping

import torch

import run_squad
from bench import study_utils as su
from bert_recipe.io import atomic_io, cli
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.tasks import squad, squad_metrics
from modeling import BertForQuestionAnswering
from tokenization import BertTokenizer

REPO = su.REPO


def first_sentence_baseline(path_or_json: str | os.PathLike | Mapping) -> dict[str, str]:
    """qas_id -> the first sentence of its context (up to the first '.', '!' or '?' followed by whitespace): a
    floor that any trained model must beat by far."""
    predictions = {}
    for article in squad.squad_articles(path_or_json):
        for paragraph in article["paragraphs"]:
            context = paragraph.get("context", "")
            match = re.search(r"[.!?](\s|$)", context)
            first = context[: match.start() + 1] if match else context
            for qa in paragraph.get("qas", []):
                predictions[str(qa["id"])] = first.strip()
    return predictions


def split_dev(dev_file: Path, out_dir: Path, n_train_articles: int) -> tuple[Path, Path]:
    data = json.loads(dev_file.read_text(encoding="utf-8"))
    articles = data["data"]
    if len(articles) <= n_train_articles:
        raise cli.InputError(
            f"{dev_file} has {len(articles)} articles; need more than {n_train_articles}: give "
            "a larger --dev_file or fewer --train_articles"
        )
    train, evaluation = out_dir / "train-40.json", out_dir / "eval-8.json"
    atomic_io.atomic_write_json(train, {"version": data["version"], "data": articles[:n_train_articles]}, indent=None)
    atomic_io.atomic_write_json(
        evaluation, {"version": data["version"], "data": articles[n_train_articles:]}, indent=None
    )
    return train, evaluation


def time_precisions(init: Path, train_file: Path, args) -> dict[str, float]:
    """Training sequences/s of fp32 and bf16 on the same real windows (2 steps each after one warm-up step)."""
    tokenizer = BertTokenizer(init / "vocab.txt", do_lower_case=True)
    examples = squad.read_squad_examples(train_file, True, False)[:64]
    features = squad.convert_examples_to_features(examples, tokenizer, args.max_seq_length, 128, 64, True)
    windows = run_squad.Windows(features[: args.batch_size], with_answers=True)
    batch = run_squad.collate([windows[i] for i in range(len(windows))])
    model = from_pretrained(BertForQuestionAnswering, init, log=None).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    speeds = {}
    for precision in ("fp32", "bf16"):
        times = [su.timed_step(model, batch, optimizer, precision, torch.device("cpu")) for _ in range(3)]
        speeds[precision] = len(batch["input_ids"]) / min(times[1:])
        print(
            f"precision {precision}: {speeds[precision]:.2f} training sequences/s "
            f"(windows of {batch['input_ids'].shape[1]} tokens)",
            flush=True,
        )
    return speeds


def main(argv: list[str] | None = None) -> dict:
    """Bad input or a failed step: one line on stderr ("squad_acceptance: error: ..."), exit status 1."""
    with cli.script_errors("squad_acceptance", argv):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--dev_file", default=str(su.DATA / "squad-v1.1-dev/dev-v1.1.json"))
    p.add_argument("--eval_script", default=str(su.DATA / "squad-eval-scripts/evaluate-v1.1.py"))
    p.add_argument("--out_dir", default=str(REPO / "results/squad_acceptance"))
    p.add_argument("--train_articles", type=int, default=40)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    init = su.minilm_dir()
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_file, eval_file = split_dev(Path(args.dev_file), out_dir, args.train_articles)

    speeds = time_precisions(init, train_file, args) if args.precision == "auto" else {}
    precision = max(speeds, key=speeds.get) if speeds else args.precision
    run_argv = [
        "--init_checkpoint",
        str(init),
        "--do_lower_case",
        "--train_file",
        str(train_file),
        "--predict_file",
        str(eval_file),
        "--do_train",
        "--do_predict",
        "--do_eval",
        "--eval_script",
        args.eval_script,
        "--output_dir",
        str(out_dir / "run"),
        "--max_seq_length",
        str(args.max_seq_length),
        "--doc_stride",
        "128",
        "--train_batch_size",
        str(args.batch_size),
        "--predict_batch_size",
        "64",
        "--learning_rate",
        str(args.learning_rate),
        "--num_train_epochs",
        str(args.epochs),
        "--warmup_proportion",
        "0.1",
        "--seed",
        str(args.seed),
        "--group_by_length",
        "--log_freq",
        "20",
        "--cache_dir",
        str(out_dir / "cache"),
    ]
    if precision == "bf16":
        run_argv.append("--bf16")
    started = time.time()
    summary = run_squad.main(run_argv)
    wall = time.time() - started

    gold = squad.read_gold_answers(eval_file)
    baseline = squad_metrics.evaluate_v1(gold, first_sentence_baseline(eval_file))
    official = json.loads((out_dir / "run" / "eval_results.json").read_text())["eval_script"]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bench.squad_acceptance", *sys.argv[1:]]),
        "run_squad_argv": run_argv,
        "torch_threads": torch.get_num_threads(),
        "precision": precision,
        "precision_speeds_seq_per_s": speeds,
        "train_questions": len(squad.read_gold_answers(train_file)),
        "eval_questions": len(gold),
        "exact_match": summary["exact_match"],
        "f1": summary["F1"],
        "official_script": official,
        "first_sentence_baseline": baseline,
        "train_seconds": summary["e2e_train_time"],
        "train_sequences_per_second": summary["training_sequences_per_second"],
        "predict_seconds": summary["e2e_inference_time"],
        "wall_seconds": wall,
        "final_loss": summary["final_loss"],
        "optimizer_steps": summary["global_step"],
    }
    atomic_io.atomic_write_json(out_dir / "acceptance.json", result)
    print("\n| SQuAD v1.1, 40 dev articles -> 8 | EM | F1 |\n|---|---|---|")
    print(
        f"| all-MiniLM-L6-v2 fine-tuned ({args.epochs:g} epoch, {precision}) | {result['exact_match']:.2f} | "
        f"{result['f1']:.2f} |"
    )
    print(f"| first sentence of the context | {baseline['exact_match']:.2f} | {baseline['f1']:.2f} |")
    print(
        f"\ntraining {result['train_seconds'] / 60:.1f} min ({result['train_sequences_per_second']:.2f} seq/s), "
        f"wall {wall / 60:.1f} min; {out_dir / 'acceptance.json'}"
    )
    return result


if __name__ == "__main__":
    main()
