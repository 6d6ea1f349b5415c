"""GLUE acceptance runs on a CPU from the real all-MiniLM-L6-v2 weights: MRPC (goal >= 85 F1 on dev), SST-2 on a
training subset (goal >= 85% dev accuracy) and CoLA (Matthews correlation reported; no goal).

    .venv/bin/python -m bench.glue_acceptance                       # all three, as recorded in bench/STUDIES.md
    .venv/bin/python -m bench.glue_acceptance --tasks mrpc --threads 2
    .venv/bin/python -m bench.glue_acceptance --dry_run             # print the commands only
    .venv/bin/python -m bench.glue_acceptance --padding             # dynamic padding vs padding to 128 only

Each task runs run_glue.py in its own process (the exact command line is printed and recorded) and writes
<out>/<TASK>/results.json; the summary (date, command, dev metrics, baseline, goal, train time) goes to
<out>/glue_acceptance.json and is printed as a Markdown table. The majority-class baseline is computed here from
the dev labels: MRPC 68.4% accuracy / 81.2 F1, SST-2 50.9%, CoLA MCC 0.

--padding measures what run_glue.py's dynamic padding buys: forward throughput over the MRPC and SST-2 dev sets
with batches padded to their longest sequence (length-sorted, as run_glue.py evaluates) against the same model on
the file-order batches padded to max_seq_length 128 (the original's fixed-shape tensors); full passes of the two
alternate over several rounds so that a shared machine's load hits both alike, and the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.cli import script_errors
from bert_recipe.prediction import predict
from bert_recipe.tasks.glue import encode_examples, get_dev_examples, get_task
from bert_recipe.training.precision_policy import resolve
from tokenization import BertTokenizer

REPO = su.REPO


@dataclass
class Run:
    task: str
    folder: str  # under ../shared/data
    metric: str  # the headline metric key in results.json
    goal: float | None  # minimum headline value, None: report only
    flags: list[str] = field(default_factory=list)


# Hyper-parameters for a 22M-parameter MiniLM (a larger learning rate than BERT-large's 2e-5 suits small models).
RUNS = {
    "mrpc": Run(
        "mrpc",
        "glue-mrpc",
        "f1",
        0.85,
        [
            "--num_train_epochs",
            "3",
            "--train_batch_size",
            "32",
            "--learning_rate",
            "1e-4",
            "--warmup_proportion",
            "0.1",
        ],
    ),
    "sst-2": Run(
        "sst-2",
        "glue-sst2",
        "acc",
        0.85,
        [
            "--max_train_examples",
            "10000",
            "--num_train_epochs",
            "1",
            "--train_batch_size",
            "32",
            "--learning_rate",
            "1e-4",
            "--warmup_proportion",
            "0.1",
        ],
    ),
    "cola": Run(
        "cola",
        "glue-cola",
        "mcc",
        None,
        [  # batch 32 / 1e-4 gave MCC 0.224, 5 epochs of it 0.270
            "--num_train_epochs",
            "3",
            "--train_batch_size",
            "16",
            "--learning_rate",
            "5e-5",
            "--warmup_proportion",
            "0.1",
        ],
    ),
}


def command(run: Run, args, out_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "run_glue.py"),
        "--task_name",
        run.task,
        "--data_dir",
        str(args.data / run.folder),
        "--init_checkpoint",
        str(args.init_checkpoint),
        "--do_lower_case",
        "--output_dir",
        str(out_dir),
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_seq_length",
        "128",
        "--eval_batch_size",
        "64",
        "--seed",
        str(args.seed),
        f"--precision={args.precision}",
        "--disable_progress_bar",
        *run.flags,
    ]


def bench_padding(args) -> dict:
    """Sequences/s of evaluation with dynamic padding (length-sorted batches) vs fixed padding to 128."""
    import torch  # here, not at the head: the acceptance runs themselves are run_glue.py processes

    import run_glue
    from bert_recipe.finetuning import recipe
    from bert_recipe.io.checkpoint_io import from_pretrained
    from modeling import BertForSequenceClassification

    model = from_pretrained(BertForSequenceClassification, args.init_checkpoint, num_labels=2, log=None).eval()
    tokenizer = BertTokenizer(Path(args.init_checkpoint) / "vocab.txt", do_lower_case=True)
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    out = {}
    for name, folder in (("mrpc", "glue-mrpc"), ("sst-2", "glue-sst2")):
        task = get_task(name)
        encoded = encode_examples(get_dev_examples(args.data / folder, task)["dev"], tokenizer, 128, task)
        dataset = recipe.EncodedDataset(encoded)
        batch_size = 32
        dynamic = [
            run_glue.collate([dataset[i] for i in b])
            for b in predict.length_sorted_batches(encoded.lengths, batch_size)
        ]
        fixed = []
        for start in range(0, len(dataset), batch_size):
            batch = run_glue.collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
            pad = 128 - batch["input_ids"].shape[1]
            fixed.append({k: torch.nn.functional.pad(v, (0, pad)) if v.dim() == 2 else v for k, v in batch.items()})
        seconds = {"dynamic": [], "fixed_128": []}
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            for _ in range(args.rounds):
                for kind, batches in (("dynamic", dynamic), ("fixed_128", fixed)):
                    start = time.perf_counter()
                    for b in batches:
                        model(b["input_ids"], b["token_type_ids"], b["attention_mask"])
                    seconds[kind].append(time.perf_counter() - start)
        rate = {k: len(dataset) / float(np.median(v)) for k, v in seconds.items()}
        out[name] = {
            "sequences": len(dataset),
            "mean_tokens": float(encoded.lengths.mean()),
            "batch_size": batch_size,
            "rounds": args.rounds,
            "dynamic_seq_per_s": rate["dynamic"],
            "fixed_128_seq_per_s": rate["fixed_128"],
            "speedup": rate["dynamic"] / rate["fixed_128"],
        }
    print(f"\nEvaluation throughput, all-MiniLM-L6-v2, {args.precision}, batch 32, median of {args.rounds} rounds\n")
    print("| dev set | sequences | mean tokens | padded to 128 (seq/s) | dynamic padding (seq/s) | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, r in out.items():
        print(
            f"| {name} | {r['sequences']} | {r['mean_tokens']:.1f} | {r['fixed_128_seq_per_s']:.1f} | "
            f"{r['dynamic_seq_per_s']:.1f} | {r['speedup']:.2f}x |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Bad input or a failed step: one line on stderr ("glue_acceptance: error: ..."), exit status 1."""
    with script_errors("glue_acceptance", argv):
        return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="mrpc,sst-2,cola", help="comma-separated, from " + ", ".join(RUNS))
    p.add_argument("--data", type=Path, default=su.DATA, help="the shared data folder")
    p.add_argument("--init_checkpoint", type=Path, default=None, help="default: the MiniLM-L6 package's folder")
    p.add_argument("--out", type=Path, default=REPO / "results" / "glue_acceptance", help="output folder")
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="auto: bf16 where the CPU has it natively, else fp32 (precision_policy.resolve, as a training run)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for the runs (1 is fastest on a CPU shared with other jobs)",
    )
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--padding", action="store_true", help="only measure dynamic padding against padding to 128")
    p.add_argument("--rounds", type=int, default=3, help="--padding: timed passes over each dev set")
    args = p.parse_args(argv)
    args.precision = resolve(args.precision, "cpu").name  # one concrete name for every run and the table
    tasks = [t.strip().lower() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in RUNS]
    if unknown:
        raise SystemExit(f"--tasks: unknown {unknown}; choose from {', '.join(RUNS)}")
    if args.init_checkpoint is None:
        args.init_checkpoint = su.minilm_dir("--init_checkpoint")
    if args.padding:
        if args.threads:
            import torch  # only --padding runs the model in this process

            torch.set_num_threads(args.threads)
        result = bench_padding(args)
        atomic_write_json(
            args.out / "padding.json",
            {
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "precision": args.precision,
                "threads": args.threads,
                "results": result,
            },
        )
        return 0

    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host_cpus": os.cpu_count(),
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "runs": {},
    }
    summary_path = args.out / "glue_acceptance.json"
    if summary_path.is_file() and not args.dry_run:  # keep the tasks of an earlier invocation
        summary["runs"] = json.loads(summary_path.read_text()).get("runs", {})
    for name in tasks:
        run = RUNS[name]
        out_dir = args.out / get_task(run.task).display_name
        cmd = command(run, args, out_dir)
        line = shlex.join(cmd)
        prefix = f"OMP_NUM_THREADS={args.threads} " if args.threads else ""
        print(f"[{run.task}] {prefix}{line}", flush=True)
        if args.dry_run:
            continue
        start = time.time()
        subprocess.run(cmd, cwd=REPO, env=env, check=True)
        results = json.loads((out_dir / "results.json").read_text())
        dev = results["eval"]["dev"]
        value = dev[run.metric]
        summary["runs"][run.task] = {
            "command": prefix + line,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "wall_seconds": time.time() - start,
            "train_examples": results["train"]["examples"],
            "train_steps": results["train"]["steps"],
            "train_seconds": results["train"]["seconds"],
            "dev": dev,
            "majority_baseline": su.glue_majority_metrics(run.task, args.data / run.folder),
            "metric": run.metric,
            "value": value,
            "goal": run.goal,
            "passed": None if run.goal is None else value >= run.goal,
            "inference": results["inference"],
        }
        atomic_write_json(summary_path, summary)
    if not args.dry_run:
        print_table(summary)
    failed = [t for t, r in summary["runs"].items() if r["passed"] is False]
    return 1 if failed else 0


def print_table(summary: dict) -> None:
    print(
        f"\nGLUE acceptance, {summary['date']}, all-MiniLM-L6-v2, CPU ({summary['host_cpus']} cores, "
        f"OMP_NUM_THREADS={summary['omp_num_threads']})\n"
    )
    print("| task | train examples | steps | train time | dev metrics | majority class | goal |")
    print("|---|---|---|---|---|---|---|")
    for task, r in summary["runs"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in r["dev"].items() if isinstance(v, float) and k != "loss")
        base = ", ".join(f"{k} {v:.4f}" for k, v in r["majority_baseline"].items() if isinstance(v, float))
        goal = "-" if r["goal"] is None else f"{r['metric']} >= {r['goal']}: {'pass' if r['passed'] else 'FAIL'}"
        print(
            f"| {task} | {r['train_examples']} | {r['train_steps']} | {r['train_seconds'] / 60:.1f} min | {shown} "
            f"| {base} | {goal} |"
        )


if __name__ == "__main__":
    sys.exit(main())
