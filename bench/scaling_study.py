"""Batch-size scaling study (issue 14; seed 001's claim: 1 GPU at batch 100 and 4 GPUs at batch 400, same learning
rate and steps, end within 0.1% downstream), on this CPU with gloo processes in place of GPUs.

    .venv/bin/python -m bench.scaling_study --out results/studies/scaling \\
        [--shards DIR] [--config configs/bert-small-cpu.json] [--batch 32] [--lr 1e-2] [--steps 800] \\
        [--processes 4] [--runs A,B,C] [--glue_seeds 1,2,3] [--glue_task sst-2]

Three phase-1 pre-trainings of the same model from the same initial weights (seed) on the same shards, for the
same number of optimizer steps with the same warm-up and schedule, each through scripts/run_pretraining.sh (the
`cpu` preset's arguments, PHASES=1):
    A  1 process at --batch b per step, learning rate --lr
    B  --processes P processes (gloo) at b each, P x b a step, the same learning rate
    C  as B with LAMB's square-root scaling: learning rate --lr x sqrt(P)
Each run evaluates held-out masked-LM accuracy during training (--eval_steps), and its last checkpoint is
fine-tuned with bench.stability (--glue_task, default SST-2, its first 10,000 training sentences, 1 epoch,
--glue_seeds). Reported (<out>/scaling_study.json and .md, <out>/scaling_loss.png): per run the final masked-LM
loss, held-out masked-LM accuracy (and the most-frequent-token baseline), downstream mean and standard deviation,
wall time, sequences per second; and for B and C against A the downstream difference, whether it is within
0.1 point (|mean - mean(A)| <= 0.001: the claim's "within 0.1%" read as an absolute 0.1 percentage point) and
whether it is within the seed spread (|difference| <= max of the two standard deviations).

Shards are built once (<out>/shards: scripts/text_to_documents.py then create_pretraining_data.py at sequence 128
for training, dupe factor --dupe_factor, and for the held-out 5% of the documents) and shared by the three runs;
--shards DIR takes an existing folder with hdf5_seq128/ and hdf5_heldout128/ instead (sequence 128, 20 slots:
an earlier study's <out>/shards; the CPU demo's shards are sequence 64 now and do not fit). A run whose folder
already holds a finished log with the same settings is reused (its wall time too); one that is unfinished or
differs is refused (--restart runs it again). On this CPU every process gets --threads OpenMP threads (default 1),
so B and C put P processes on the cores: their wall time measures this machine, not what P GPUs would take.

On GPUs it is the same command: scripts/run_pretraining.sh starts one process per GPU with torchrun
(--nproc_per_node P) and NCCL when CUDA is present, e.g. seed 001's setting on a 4-GPU machine:
    python -m bench.scaling_study --processes 4 --batch 100 --config configs/bert-base.json --precision bf16 \\
        --steps 1000 --shards /data/hdf5 --out results/studies/scaling_gpu
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import create_pretraining_data
from bench import stability
from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from scripts import text_to_documents


class RunFailed(Exception):
    """A pre-training run of the study failed or ended unfinished; the message names its folder."""


REPO = su.REPO
JOB = "scaling"
WITHIN = 0.001  # the claim's "within 0.1%": an absolute 0.1 percentage point of the downstream metric


def build_shards(args, log) -> Path:
    """<out>/shards with hdf5_seq128/ and hdf5_heldout128/ (kept: a second call reuses them)."""
    shards = args.out / "shards"
    train, heldout = shards / "hdf5_seq128" / "train.hdf5", shards / "hdf5_heldout128" / "heldout.hdf5"
    if train.is_file() and heldout.is_file():
        log(f"scaling_study: reusing the shards in {shards}")
        return shards
    corpus = args.corpus or [su.DATA / "wikitext-2" / "valid.txt", su.DATA / "wikitext-2" / "test.txt"]
    log(f"scaling_study: shards from {' '.join(map(str, corpus))} -> {shards}")
    text_to_documents.main(
        [
            "--input",
            *map(str, corpus),
            "--sentences",
            "--test_fraction",
            "0.05",
            "--output",
            str(shards / "text" / "train.txt"),
            "--test_output",
            str(shards / "text" / "heldout.txt"),
        ]
    )
    for source, target, dupe in (
        (shards / "text" / "train.txt", train, args.dupe_factor),
        (shards / "text" / "heldout.txt", heldout, 1),
    ):
        create_pretraining_data.main(
            [
                "--input_file",
                str(source),
                "--output_file",
                str(target),
                "--vocab_file",
                str(args.vocab),
                "--do_lower_case",
                "--max_seq_length",
                "128",
                "--max_predictions_per_seq",
                "20",
                "--masked_lm_prob",
                "0.15",
                "--dupe_factor",
                str(dupe),
                "--random_seed",
                "12345",
                "--num_workers",
                "1",
                "--no_progress",
            ]
        )
    return shards


def run_specs(args) -> dict[str, dict]:
    p = args.processes
    specs = {
        "A": {"processes": 1, "lr": args.lr, "what": "1 process"},
        "B": {"processes": p, "lr": args.lr, "what": f"{p} processes, same learning rate"},
        "C": {"processes": p, "lr": args.lr * math.sqrt(p), "what": f"{p} processes, learning rate x sqrt({p})"},
    }
    return {
        k: {**v, "batch_per_process": args.batch, "global_batch": args.batch * v["processes"]}
        for k, v in specs.items()
        if k in args.runs
    }


def launcher_command(args, spec: dict, shards: Path) -> list[str]:
    """scripts/run_pretraining.sh with its 25 positional arguments: the `cpu` preset's, phase 1 only."""
    data = f"{shards / 'hdf5_seq128'}/"
    positional = [
        args.batch,
        f"{spec['lr']:.10g}",
        args.precision,
        spec["processes"],
        args.warmup,
        args.steps,
        args.steps,
        "false",
        "true",
        "false",
        1,
        args.seed,
        JOB,
        "false",
        "false",
        8,
        "5e-3",
        0.1,
        1,
        1,
        data,
        data,
        REPO,
        "None",
        args.config,
    ]
    return ["bash", str(REPO / "scripts" / "run_pretraining.sh"), *map(str, positional)]


def same_settings(params: dict, args, spec: dict) -> list[str]:
    want = {
        "train_batch_size": args.batch,
        "world_size": spec["processes"],
        "max_steps": args.steps,
        "seed": args.seed,
        "warmup_proportion": args.warmup,
    }
    diff = [f"{k} {params.get(k)} instead of {v}" for k, v in want.items() if params.get(k) != v]
    if not math.isclose(params.get("learning_rate") or 0.0, spec["lr"], rel_tol=1e-6):
        diff.append(f"learning_rate {params.get('learning_rate')} instead of {spec['lr']:.6g}")
    if params.get("config_file") and Path(params["config_file"]).resolve() != args.config:
        diff.append(f"config_file {params.get('config_file')} instead of {args.config}")
    return diff


def pretrain(label: str, spec: dict, args, shards: Path, log) -> dict:
    """Run (or reuse) one pre-training; returns its phase_summary plus reused, wall_seconds and the command."""
    run_dir = args.out / f"run_{label}"
    log_path = run_dir / f"{JOB}.phase1.json"
    cmd = launcher_command(args, spec, shards)
    if run_dir.exists():
        summary = su.phase_summary(log_path)
        diff = same_settings(summary["params"], args, spec) if summary["params"] else ["no log"]
        if summary["finished"] and not diff and not args.restart:
            wall = json.loads((run_dir / "wall.json").read_text()) if (run_dir / "wall.json").is_file() else {}
            log(f"scaling_study: run {label}: reusing {run_dir}")
            return {**summary, "reused": True, "wall_seconds": wall.get("wall_seconds"), "command": cmd}
        if not args.restart:
            why = summary["state"] if not diff else "; ".join(diff)
            raise InputError(
                f"{run_dir} holds a run that is not reusable ({why}): --restart runs it again (its folder is replaced)"
            )
        shutil.rmtree(run_dir)
    extra = (
        f"--log_freq {args.log_freq} --num_workers 1 --eval_steps {args.eval_steps} "
        f"--max_eval_samples {args.max_eval_samples} --disable_progress_bar"
    )
    env = {
        **os.environ,
        "RESULTS_DIR": str(run_dir),
        "CHECKPOINTS_DIR": str(run_dir / "checkpoints"),
        "EVAL_DIR_PHASE1": str(shards / "hdf5_heldout128"),
        "PHASES": "1",
        "EXTRA_ARGS": extra,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHON": sys.executable,
        "VOCAB_FILE": str(args.vocab),
    }
    log(
        f"scaling_study: run {label} ({spec['what']}): RESULTS_DIR={run_dir} PHASES=1 EVAL_DIR_PHASE1="
        f"{env['EVAL_DIR_PHASE1']} OMP_NUM_THREADS={args.threads} EXTRA_ARGS='{extra}' {' '.join(cmd)}"
    )
    started = time.time()
    result = subprocess.run(cmd, env=env, cwd=REPO)
    wall = round(time.time() - started, 1)
    if result.returncode != 0:
        raise RunFailed(f"run {label} failed (exit {result.returncode}); see {run_dir}")
    summary = su.phase_summary(log_path)
    if not summary["finished"]:
        raise RunFailed(f"run {label} ended unfinished ({summary['state']}); see {run_dir}")
    atomic_write_text(run_dir / "wall.json", json.dumps({"wall_seconds": wall, "command": cmd}) + "\n")
    return {**summary, "reused": False, "wall_seconds": wall, "command": cmd}


def compare(a: dict, b: dict) -> dict:
    difference, spread = b["mean"] - a["mean"], max(a["std"], b["std"])
    return {
        "difference": difference,
        "spread": spread,
        "within_0.1_point": abs(difference) <= WITHIN + 1e-12,
        "within_seed_spread": abs(difference) <= spread,
    }


def markdown(report: dict, image: str | None = "scaling_loss.png", heading: str = "#") -> str:
    """The study's Markdown; `image`: the loss-curve plot's link (None: none)."""
    s = report["settings"]
    lines = [
        f"{heading} Batch-size scaling study ({report['date']})",
        "",
        f"Model `{s['config']}`, {s['steps']} optimizer steps of phase 1 (sequence 128, warm-up {s['warmup']}, "
        f"seed {s['seed']}), shards `{s['shards']}`; {s['threads']} OpenMP thread(s) per process. Downstream: "
        f"{s['glue_task']} ({s['glue_max_train_examples'] or 'all'} training examples, {s['glue_epochs']} "
        f"epoch(s), lr {s['glue_lr']}, seeds {s['glue_seeds']}).",
        "",
        "| run | processes x batch = global | lr | sequences seen (epochs) | final masked-LM loss | "
        "held-out MLM acc | "
        f"{s['glue_task']} mean ± std | wall (s) | sequences/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in report["runs"].items():
        d = r.get("downstream")
        lines.append(
            f"| {label} ({r['what']}) | {r['processes']} x {r['batch_per_process']} = {r['global_batch']} | "
            f"{r['lr']:.4g} | {r['global_batch'] * r['steps']} ({su.fmt(r.get('epochs'), 2)}) | "
            f"{su.fmt(r['final_mlm_loss'], 3)} | "
            f"{su.fmt(r['heldout_accuracy'])} | "
            + (f"{d['mean']:.4f} ± {d['std']:.4f}" if d else "not run")
            + f" | {su.fmt(r['wall_seconds'], 0)} | {su.fmt(r['sequences_per_second'], 1)} |"
        )
    lines += ["", f"Held-out baseline (always the most frequent masked token): {su.fmt(report['heldout_baseline'])}."]
    if report["majority_baseline"] is not None:
        lines.append(f"{s['glue_task']} majority class: {report['majority_baseline']:.4f}.")
    lines.append("")
    for name, c in report["comparisons"].items():
        lines.append(
            f"- {name}: downstream difference {c['difference']:+.4f} "
            f"({'within' if c['within_0.1_point'] else 'NOT within'} 0.1 point; "
            f"{'within' if c['within_seed_spread'] else 'outside'} the seed spread {c['spread']:.4f})."
        )
    if image:
        lines += ["", f"![loss curves]({image})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    """Bad input or a failed step: one line on stderr ("scaling_study: error: ..."), exit status 1."""
    with script_errors("scaling_study", argv, expected=(InputError, OSError, ValueError, RunFailed)):
        return run(parse(argv))


def build_parser() -> argparse.ArgumentParser:
    """The study's command line; --help shows the module's text and every default."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2], formatter_class=su.HelpFormatter
    )
    p.add_argument("--out", type=Path, default=REPO / "results" / "studies" / "scaling")
    g = p.add_argument_group("pre-training")
    g.add_argument(
        "--shards",
        type=Path,
        default=None,
        help="a folder with hdf5_seq128/ and hdf5_heldout128/ (None: built once into <out>/shards)",
    )
    g.add_argument("--corpus", action="append", type=Path, help="text for the shards (None: WikiText-2 valid + test)")
    g.add_argument("--vocab", type=Path, default=su.VOCAB)
    g.add_argument("--dupe_factor", type=int, default=5)
    g.add_argument("--config", type=Path, default=REPO / "configs" / "bert-small-cpu.json")
    g.add_argument("--batch", type=int, default=32, help="sequences per step per process (b)")
    g.add_argument("--lr", type=float, default=1e-2, help="peak learning rate of A and B (LAMB)")
    g.add_argument(
        "--steps",
        type=int,
        default=800,
        help="optimizer steps of every run (800: about 40 min for A, B and C with the default model on 2 free cores)",
    )
    g.add_argument("--warmup", type=float, default=0.05, help="warm-up proportion")
    g.add_argument("--processes", type=int, default=4, help="processes of B and C (P)")
    g.add_argument("--runs", default="A,B,C", help="which runs")
    g.add_argument("--seed", type=int, default=42, help="pre-training seed (the same initial weights in every run)")
    g.add_argument("--precision", default="auto")
    g.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    g.add_argument("--eval_steps", type=int, default=50)
    g.add_argument("--max_eval_samples", type=int, default=2000)
    g.add_argument("--log_freq", type=int, default=10)
    g.add_argument("--restart", action="store_true", help="run again a run whose folder is not reusable")
    g = p.add_argument_group("downstream (bench.stability)")
    g.add_argument("--glue_task", default="sst-2")
    g.add_argument("--glue_seeds", default="1,2,3")
    g.add_argument("--glue_lr", type=float, default=2e-4)
    g.add_argument("--glue_batch", type=int, default=32)
    g.add_argument("--glue_epochs", type=float, default=1.0)
    g.add_argument("--glue_max_train_examples", type=int, default=10000)
    g.add_argument("--max_eval_examples", type=int, default=None)
    g.add_argument("--max_steps", type=int, default=-1, help="fine-tuning steps (quick runs)")
    g.add_argument("--max_seq_length", type=int, default=128)
    g.add_argument("--glue_threads", type=int, default=1)
    g.add_argument("--parallel", type=int, default=1, help="fine-tuning runs at a time")
    g.add_argument("--data_root", type=Path, default=su.DATA)
    g.add_argument("--no_glue", action="store_true", help="pre-training only")
    return p


@dataclass(frozen=True)
class Plan:
    """The checked command line: the flags (paths absolute, --runs a list of labels), the seeds --glue_seeds names,
    and the command for the report."""

    args: argparse.Namespace
    glue_seeds: list[int]
    command: list[str]


def parse(argv: list[str] | None = None) -> Plan:
    """The command line, checked before anything starts or is written (matplotlib too: the plot comes last)."""
    args = build_parser().parse_args(argv)
    su.require_matplotlib("scaling_study")
    args.out, args.config, args.vocab = args.out.resolve(), args.config.resolve(), args.vocab.resolve()
    args.corpus = [c.resolve() for c in args.corpus] if args.corpus else None
    args.runs = [r.strip().upper() for r in args.runs.split(",") if r.strip()]
    if not args.runs or any(r not in "ABC" or len(r) != 1 for r in args.runs):
        raise SystemExit(f"--runs: some of A,B,C (got {','.join(args.runs)})")
    if args.processes < 2:
        raise SystemExit("--processes must be at least 2 (B and C against the 1 process of A)")
    if not args.config.is_file():
        raise SystemExit(f"--config {args.config} not found")
    glue_seeds = su.parse_seeds(args.glue_seeds, "--glue_seeds")
    return Plan(
        args, glue_seeds, [sys.executable, "-m", "bench.scaling_study", *(argv if argv is not None else sys.argv[1:])]
    )


def the_shards(args: argparse.Namespace) -> Path:
    """--shards, or <out>/shards built (or reused) by build_shards; either must hold both shard folders."""
    shards = args.shards.resolve() if args.shards else build_shards(args, su.log)
    for sub in ("hdf5_seq128", "hdf5_heldout128"):
        if not (shards / sub).is_dir():
            raise SystemExit(
                f"--shards {shards} has no {sub}/ (give an earlier scaling study's <out>/shards, "
                "or leave --shards out to build them)"
            )
    return shards


def pretrain_all(args: argparse.Namespace, shards: Path) -> dict[str, dict]:
    """Every run of --runs pre-trained (or reused), in order: label -> the report's row (settings, wall time,
    throughput, final losses, held-out accuracy, curves, the command)."""
    runs = {}
    for label, spec in run_specs(args).items():
        summary = pretrain(label, spec, args, shards, su.log)
        final, losses, evals = summary["final"] or {}, summary["losses"], summary["evals"]
        runs[label] = {
            **spec,
            "steps": args.steps,
            "run_dir": str(args.out / f"run_{label}"),
            "checkpoint": str(args.out / f"run_{label}" / "checkpoints" / f"ckpt_{args.steps}.pt"),
            "reused": summary["reused"],
            "wall_seconds": summary["wall_seconds"],
            "train_seconds": final.get("e2e_train_time"),
            "sequences_per_second": final.get("training_sequences_per_second"),
            "final_mlm_loss": losses[-1][1] if losses else None,
            "final_loss": final.get("final_loss"),
            "heldout_accuracy": evals[-1][1] if evals else None,
            "heldout_loss": evals[-1][2] if evals else None,
            "losses": losses,
            "evals": evals,
            "command": summary["command"],
        }
    return runs


def downstream(plan: Plan, runs: dict[str, dict]) -> tuple[float, dict]:
    """Each run's last checkpoint fine-tuned on --glue_task by bench.stability (or its JSON reused):
    each row's "downstream" set; returns (the task's majority-class score, label -> where its summary came from)."""
    args, sources = plan.args, {}
    data_dir = args.data_root / {"sst-2": "glue-sst2", "mrpc": "glue-mrpc"}.get(
        args.glue_task, f"glue-{args.glue_task}"
    )
    majority = su.glue_majority_baseline(args.glue_task, data_dir, args.max_eval_examples)
    settings = su.StabilitySettings(
        epochs=args.glue_epochs,
        batch=args.glue_batch,
        lr=args.glue_lr,
        seq=args.max_seq_length,
        max_train=args.glue_max_train_examples,
        max_eval=args.max_eval_examples,
        max_steps=args.max_steps,
        threads=args.glue_threads,
        parallel=args.parallel,
        vocab=args.vocab,
        data_dir=data_dir,
    )
    for label, row in runs.items():
        argv_s = su.stability_argv(
            args.glue_task, row["checkpoint"], plan.glue_seeds, args.out / f"glue_{label}", settings
        )
        summary, sources[label] = su.run_or_reuse_stability(f"glue_{label}", argv_s, None, stability.main, su.log)
        row["downstream"] = su.stats_of(summary)
    return majority, sources


def comparisons(runs: dict[str, dict]) -> dict[str, dict]:
    """ "B vs A" and "C vs A" (compare()) where both were fine-tuned."""
    out = {}
    if "A" in runs and runs["A"].get("downstream"):
        for label in ("B", "C"):
            if label in runs and runs[label].get("downstream"):
                out[f"{label} vs A"] = compare(runs["A"]["downstream"], runs[label]["downstream"])
    return out


def shared_settings(plan: Plan, shards: Path) -> dict:
    """The report's "settings": what every run and fine-tuning shares."""
    args = plan.args
    return {
        "config": str(args.config),
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "batch_per_process": args.batch,
        "lr": args.lr,
        "processes": args.processes,
        "threads": args.threads,
        "shards": str(shards),
        "precision": args.precision,
        "glue_task": args.glue_task,
        "glue_seeds": plan.glue_seeds,
        "glue_lr": args.glue_lr,
        "glue_batch": args.glue_batch,
        "glue_epochs": args.glue_epochs,
        "glue_max_train_examples": args.glue_max_train_examples,
    }


def run(plan: Plan) -> dict:
    """The study of the module's text: shards, the pre-training runs, their baselines and epochs, the fine-tunings,
    the comparisons; writes <out>/scaling_study.json and .md and the loss plot, and returns the report."""
    args = plan.args
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    shards = the_shards(args)
    runs = pretrain_all(args, shards)
    baseline = su.heldout_baseline(shards / "hdf5_heldout128", args.max_eval_samples)
    shard_samples = su.count_samples(shards / "hdf5_seq128")
    for r in runs.values():
        r["epochs"] = r["global_batch"] * r["steps"] / shard_samples if shard_samples else None
    majority, sources = downstream(plan, runs) if not args.no_glue else (None, {})
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": plan.command,
        "settings": shared_settings(plan, shards),
        "runs": runs,
        "shard_samples": shard_samples,
        "heldout_baseline": baseline,
        "majority_baseline": majority,
        "comparisons": comparisons(runs),
        "rule": f"within 0.1 point: |mean(X) - mean(A)| <= {WITHIN}; within the seed spread: |mean(X) - "
        "mean(A)| <= max(std(X), std(A))",
        "sources": sources,
        "wall_seconds": round(time.time() - started, 1),
    }
    # The report before the plot: see pretrain_study.write_outputs.
    su.write_report(args.out, "scaling_study", report, markdown(report))
    su.plot_runs(
        {f"{k}: {v['processes']}x{v['batch_per_process']}, lr {v['lr']:.3g}": v for k, v in runs.items()},
        args.out / "scaling_loss.png",
        title=f"scaling study, {Path(args.config).name}",
        baseline=baseline,
    )
    return report


if __name__ == "__main__":
    main()
