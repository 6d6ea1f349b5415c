"""Learning-rate and batch sweep of pre-training on the CPU: which optimizer, learning rate and batch make a small
BERT learn in a fixed budget of sequences, measured on held-out text (issue 27).

    .venv/bin/python -m bench.pretrain_sweep --data DIR --out results/studies/sweep \\
        --runs adamw:64:5e-4,1e-3,2e-3 nvlamb:64:3e-3,1e-2 [--sequences 32000] [--config configs/bert-mini.json] \\
        [--warmup 0.1] [--schedule linear] [--evals 4] [--max_eval_samples 1024] [--parallel 2]

--data is a folder with training/ and test/ HDF5 shards (data/bertPrep.py's layout; static masks, sequence 128).
Each run is one `run_pretraining.py` process on the same shards and held-out set, from the same initial weights
(--seed), for --sequences sequences (steps = sequences / batch, so every batch size sees the same data), with a
linear warm-up over --warmup of the steps. A run spec is OPTIMIZER:BATCH:LR[,LR...]. Runs go --parallel at a time,
each with cores / parallel threads (the cores this process may use: $OMP_NUM_THREADS when it is set, else all).
A run folder that already holds a finished run with the same command is reused.

Report (<out>/sweep.json, sweep.md, sweep.png): per run the held-out masked-LM loss at the end against the unigram
entropy of the held-out targets, the context gain (accuracy on [MASK]ed slots with the context minus without it,
validation.py), the throughput; the best learning rate per optimizer and batch; and, where an optimizer ran at two
or more batch sizes, the exponent a of the rule lr_best proportional to batch^a between them (a = 0.5: the
square-root rule; 1: linear).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text

REPO = su.REPO


def parse_runs(specs: list[str]) -> list[tuple[str, int, float]]:
    """["adamw:64:1e-3,2e-3", ...] -> [("adamw", 64, 0.001), ("adamw", 64, 0.002), ...]."""
    runs = []
    for spec in specs:
        try:
            optimizer, batch, lrs = spec.split(":")
            runs += [(optimizer, int(batch), float(lr)) for lr in lrs.split(",")]
        except ValueError:
            raise SystemExit(f"--runs: {spec!r} is not OPTIMIZER:BATCH:LR[,LR...]") from None
        if optimizer not in ("adamw", "nvlamb"):
            raise SystemExit(f"--runs: unknown optimizer {optimizer!r} (adamw or nvlamb)")
    return runs


def run_name(optimizer: str, batch: int, lr: float, tag: str = "") -> str:
    return f"{optimizer}_b{batch}_lr{lr:g}{'_' + tag if tag else ''}"


def command(args, optimizer: str, batch: int, lr: float, out: Path) -> list[str]:
    steps = max(1, args.sequences // batch)
    eval_steps = max(1, steps // args.evals)
    return [
        sys.executable,
        str(REPO / "run_pretraining.py"),
        "--input_dir",
        str(args.train_dir),
        "--eval_dir",
        str(args.eval_dir),
        "--max_eval_samples",
        str(args.max_eval_samples),
        "--eval_steps",
        str(eval_steps),
        "--config_file",
        str(args.config),
        "--vocab_file",
        str(args.vocab),
        "--output_dir",
        str(out),
        "--do_train",
        "--max_seq_length",
        str(args.max_seq_length),
        "--max_predictions_per_seq",
        str(args.max_predictions_per_seq),
        "--train_batch_size",
        str(batch),
        "--max_steps",
        str(steps),
        "--learning_rate",
        str(lr),
        "--optimizer",
        optimizer,
        "--warmup_proportion",
        str(args.warmup),
        "--lr_schedule",
        args.schedule,
        "--seed",
        str(args.seed),
        "--precision",
        args.precision,
        "--skip_checkpoint",
        "--log_freq",
        str(max(1, steps // 50)),
        "--num_workers",
        "1",
        "--disable_progress_bar",
        "--json-summary",
        str(out / "log.json"),
        *args.extra,
    ]


def summarise(out: Path, optimizer: str, batch: int, lr: float) -> dict:
    """One run's numbers from its log: the held-out evaluations, the last one, the training curve, throughput."""
    run = su.run_log(out / "log.json")
    params, final, losses = run["params"], run["final"], run["losses"]
    evals = [{"step": e["step"], "sequences": e["step"] * batch, **e} for e in run["evals"]]
    last = evals[-1] if evals else {}
    return {
        "optimizer": optimizer,
        "batch": batch,
        "learning_rate": lr,
        "steps": params.get("max_steps"),
        "precision": params.get("precision"),
        "finished": bool(final) and not final.get("stopped_by_signal"),
        "heldout_loss": last.get("eval_mlm_loss"),
        "unigram_entropy": last.get("eval_unigram_entropy"),
        "below_entropy": (last["eval_unigram_entropy"] - last["eval_mlm_loss"]) if last else None,
        "context_gain": last.get("eval_context_gain"),
        "mask_accuracy": last.get("eval_mask_accuracy"),
        "sequences_per_second": (final or {}).get("training_sequences_per_second"),
        "seconds": (final or {}).get("e2e_train_time"),
        "evals": evals,
        "losses": losses,
        "diverged": not final and any(not math.isfinite(x) for _, x in losses),
    }


def run_one(args, spec: tuple[str, int, float], log) -> dict:
    optimizer, batch, lr = spec
    out = args.out / run_name(optimizer, batch, lr, args.tag)
    cmd = command(args, optimizer, batch, lr, out)
    done = out / "command.json"
    if done.is_file() and json.loads(done.read_text()) == cmd[1:]:
        summary = summarise(out, optimizer, batch, lr)
        if summary["finished"]:
            log(f"pretrain_sweep: reusing {out.name}")
            return summary
    out.mkdir(parents=True, exist_ok=True)
    (out / "log.json").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    log(f"pretrain_sweep: {out.name}: {args.sequences // batch} steps")
    with open(out / "output.txt", "w") as console:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT).returncode
    atomic_write_text(done, json.dumps(cmd[1:]))  # the marker a second call trusts: never half-written
    summary = summarise(out, optimizer, batch, lr)
    summary["returncode"] = code
    if code:
        tail = (out / "output.txt").read_text(errors="replace").strip().splitlines()[-1:]
        log(f"pretrain_sweep: {out.name} ended with status {code}: {' '.join(tail)}")
    else:
        log(
            f"pretrain_sweep: {out.name}: held-out loss {summary['heldout_loss']:.3f} (entropy "
            f"{summary['unigram_entropy']:.3f}), context gain {100 * summary['context_gain']:+.1f} points, "
            f"{summary['sequences_per_second']:.1f} sequences/s"
        )
    return summary


def best_by_batch(runs: list[dict]) -> dict[str, dict[int, dict]]:
    """optimizer -> batch -> the finished run with the lowest held-out loss."""
    best: dict[str, dict[int, dict]] = {}
    for r in runs:
        if r.get("heldout_loss") is None or not r["finished"] or not math.isfinite(r["heldout_loss"]):
            continue
        current = best.setdefault(r["optimizer"], {}).get(r["batch"])
        if current is None or r["heldout_loss"] < current["heldout_loss"]:
            best[r["optimizer"]][r["batch"]] = r
    return best


def scaling_exponents(best: dict[str, dict[int, dict]]) -> dict[str, float]:
    """optimizer -> a in lr_best ~ batch^a, the least-squares slope of log lr_best on log batch (2+ batches)."""
    exponents = {}
    for optimizer, by_batch in best.items():
        if len(by_batch) < 2:
            continue
        xs = [math.log(b) for b in by_batch]
        ys = [math.log(r["learning_rate"]) for r in by_batch.values()]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        exponents[optimizer] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return exponents


def bf16_flags_text(report: dict) -> str:
    """The CPU's bf16 flags as recorded in a report (precision_policy.py's decision rests on them)."""
    return ", ".join(report["bf16_flags"]) or "no avx512_bf16/amx_bf16"


def markdown(report: dict) -> str:
    setting = (
        f"{report['config']}, {report['sequences']:,} sequences a run (steps = sequences / batch), "
        f"{report['schedule']} schedule, warm-up {report['warmup']}, precision {report['precision']}"
    )
    lines = [
        f"# Pre-training sweep ({report['date']})",
        "",
        f"{setting}; held-out: {report['max_eval_samples']} sequences of {report['eval_dir']}. Machine: "
        f"{report['cpu']}, {report['cores']} cores, flags: {bf16_flags_text(report)}; "
        f"{report['parallel']} run(s) at a time, {report['threads']} thread(s) each.",
        "",
        f"Command: `{report['command']}`",
        "",
        "| optimizer | batch | lr | steps | held-out loss | unigram entropy | below it | context gain | "
        "[MASK] accuracy | sequences/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = {(b["optimizer"], b["batch"], b["learning_rate"]) for by in report["best"].values() for b in by.values()}
    for r in sorted(report["runs"], key=lambda r: (r["optimizer"], r["batch"], r["learning_rate"])):
        mark = "**" if (r["optimizer"], r["batch"], r["learning_rate"]) in best else ""
        if r.get("heldout_loss") is None:
            lines.append(
                f"| {r['optimizer']} | {r['batch']} | {r['learning_rate']:g} | {r['steps']} | "
                f"{'diverged' if r.get('diverged') else 'failed'} | | | | | |"
            )
            continue
        lines.append(
            f"| {r['optimizer']} | {r['batch']} | {r['learning_rate']:g} | {r['steps']} | "
            f"{mark}{r['heldout_loss']:.3f}{mark} | {r['unigram_entropy']:.3f} | {r['below_entropy']:+.3f} | "
            f"{100 * r['context_gain']:+.1f} | {r['mask_accuracy']:.3f} | "
            f"{(r['sequences_per_second'] or 0):.1f} |"
        )
    lines += [
        "",
        "Best learning rate (lowest held-out loss, in bold above): "
        + "; ".join(
            f"{opt} batch {b}: {r['learning_rate']:g}"
            for opt, by in report["best"].items()
            for b, r in sorted(by.items())
        ),
    ]
    for opt, a in report["scaling_exponents"].items():
        lines.append(f"{opt}: lr_best grows as batch^{a:.2f} over the batches swept.")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path:
    """Left: held-out loss against sequences seen, per run. Right: final held-out loss against the learning rate,
    one line per optimizer and batch (the unigram entropy dashed)."""
    plt = su._pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in report["runs"]:
        if r.get("evals"):
            left.plot(
                [e["sequences"] for e in r["evals"]],
                [e["eval_mlm_loss"] for e in r["evals"]],
                "o-",
                markersize=2,
                label=run_name(r["optimizer"], r["batch"], r["learning_rate"]),
            )
        if r.get("heldout_loss") is not None:
            groups.setdefault((r["optimizer"], r["batch"]), []).append(r)
    entropy = next((r["unigram_entropy"] for r in report["runs"] if r.get("unigram_entropy")), None)
    for (optimizer, batch), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["learning_rate"])
        right.plot(
            [r["learning_rate"] for r in rs], [r["heldout_loss"] for r in rs], "o-", label=f"{optimizer}, batch {batch}"
        )
    for ax in (left, right):
        if entropy:
            ax.axhline(entropy, color="tab:gray", linestyle="--", label="unigram entropy")
        ax.set_ylabel("held-out masked-LM loss (nats)")
        ax.legend(fontsize=7)
    left.set_xlabel("sequences seen")
    right.set_xlabel("peak learning rate")
    right.set_xscale("log")
    fig.suptitle(f"pre-training sweep: {Path(report['config']).name}, {report['sequences']:,} sequences a run")
    fig.tight_layout()
    return su.save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=su.HelpFormatter)
    p.add_argument("--data", type=Path, help="a folder with training/ and test/ HDF5 shards (bertPrep's layout)")
    p.add_argument("--train_dir", type=Path, help="the training shards (default: DATA/training)")
    p.add_argument("--eval_dir", type=Path, help="the held-out shards (default: DATA/test)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--runs", nargs="+", required=True, help="OPTIMIZER:BATCH:LR[,LR...] specs")
    p.add_argument("--sequences", type=int, default=32000, help="training sequences per run")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "bert-mini.json")
    p.add_argument("--vocab", type=Path, default=su.VOCAB)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--schedule", default="linear", choices=("poly", "linear", "cosine", "constant"))
    p.add_argument("--precision", default="auto")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--evals", type=int, default=4, help="held-out evaluations per run")
    p.add_argument("--max_eval_samples", type=int, default=1024)
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument("--tag", default="", help="appended to run folder names (e.g. a config variant)")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more run_pretraining.py flags (last)")
    args = p.parse_args(argv)
    su.require_matplotlib("pretrain_sweep")
    if args.data:
        args.train_dir = args.train_dir or args.data / "training"
        args.eval_dir = args.eval_dir or args.data / "test"
    if not (args.train_dir and args.train_dir.is_dir() and args.eval_dir and args.eval_dir.is_dir()):
        raise SystemExit("pretrain_sweep: give --data (with training/ and test/) or --train_dir and --eval_dir")
    runs = parse_runs(args.runs)
    args.threads = max(1, su.available_cores() // args.parallel)  # $OMP_NUM_THREADS, when set, is our share
    args.out.mkdir(parents=True, exist_ok=True)
    cpu, flags = su.cpu_description()
    report = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "bf16_flags": flags,
        "cores": os.cpu_count(),
        "config": str(args.config),
        "sequences": args.sequences,
        "warmup": args.warmup,
        "schedule": args.schedule,
        "precision": args.precision,
        "eval_dir": str(args.eval_dir),
        "max_eval_samples": args.max_eval_samples,
        "parallel": args.parallel,
        "threads": args.threads,
        "command": "python -m bench.pretrain_sweep " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    previous = args.out / "sweep.json"
    kept = json.loads(previous.read_text())["runs"] if previous.is_file() else []
    started = time.time()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda spec: run_one(args, spec, print), runs))
    # Runs of earlier invocations into the same folder stay in the report, unless re-run now.
    done = {(r["optimizer"], r["batch"], r["learning_rate"]) for r in results}
    report["runs"] = [r for r in kept if (r["optimizer"], r["batch"], r["learning_rate"]) not in done] + results
    report["wall_seconds"] = round(time.time() - started, 1)
    best = best_by_batch(report["runs"])
    report["best"] = {opt: {str(b): r for b, r in by.items()} for opt, by in best.items()}
    report["scaling_exponents"] = scaling_exponents(best)
    text = markdown({**report, "best": best})
    report["plot"] = str(plot(report, args.out / "sweep.png"))
    su.write_report(args.out, "sweep", report, text)
    return report


if __name__ == "__main__":
    main()
