"""How often a two-process gloo run aborts at its very end, ending the way the entry scripts end: through Python's
finalisation (sys.exit) or through dist_env.exit_script.

    .venv/bin/python -m bench.exit_race [--runs 40] [--numel 1048576] [--out results/exit_race]

Each run is one `torchrun --standalone --nproc_per_node 2` launch of this file's worker, which does what the end of
run_pretraining.py does, and nothing else: DistributedDataParallel built on the default gloo group, one last
all-reduce of --numel floats (the loss or stop vote), then dist_env.end_process_group (barrier, destroy) while
the model is still referenced, as in run_pretraining's `finally`. The worker then leaves with sys.exit(0)
("sys.exit": the group's threads, which torch keeps after destroy_process_group, live on into the interpreter's
finalisation) or with dist_env.exit_script ("exit_script"), alternating run by run. A run fails when torchrun
does not exit 0; "aborts" counts the failed runs whose output holds "terminate called without an active exception",
the message of a gloo thread that could not take the GIL during finalisation; "hung" the launches still running
after --timeout seconds (killed then, with their workers).

Writes <out>/exit_race.json (every run's exit status) and exit_race.md (the table); prints the table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench import study_utils as su
from bert_recipe.training import dist_env

REPO = su.REPO
WAYS = ("sys.exit", "exit_script")
ABORT = "terminate called without an active exception"


def worker(way: str, numel: int) -> None:
    """One process of a run (under torchrun)."""
    import torch  # only the workers need it: the launching process stays light

    env = dist_env.init_distributed(no_cuda=True)
    _model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # held to the end, as a run holds it
    last = torch.ones(numel)
    torch.distributed.all_reduce(last)
    assert env.world_size == 2 and float(last[0]) == 2.0
    dist_env.end_process_group()  # with model and tensor still referenced, as in run_pretraining's `finally`
    if way == "sys.exit":
        sys.exit(0)
    dist_env.exit_script(lambda: 0)


def launch(way: str, numel: int, timeout: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "bench.exit_race",
        "--worker",
        way,
        "--numel",
        str(numel),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # cwd=REPO: `-m` puts the checkout on the workers' sys.path
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )  # its own process group: a hung launch is killed with its workers
    try:
        output, _ = proc.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hung = True
    failed = hung or proc.returncode != 0
    return {
        "way": way,
        "returncode": None if hung else proc.returncode,
        "hung": hung,
        "abort": ABORT in output,
        "seconds": round(time.perf_counter() - start, 2),
        "tail": output[-1500:] if failed else "",
    }


def summarise(runs: list[dict]) -> dict[str, dict]:
    table = {}
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        table[way] = {
            "runs": len(mine),
            "failed": sum(r["returncode"] != 0 for r in mine),
            "aborts": sum(r["returncode"] != 0 and r["abort"] for r in mine),
            "hung": sum(r["hung"] for r in mine),
        }
    return table


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=40, help="launches of each way (they alternate)")
    p.add_argument("--numel", type=int, default=1 << 20, help="floats in the last all-reduce")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a launch counts as hung")
    p.add_argument("--out", default=str(REPO / "results" / "exit_race"))
    p.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)  # one process of a run, under torchrun
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.numel)
        return {}
    if args.runs < 1 or args.numel < 1 or args.timeout <= 0:
        p.error("--runs and --numel must be at least 1, --timeout positive")
    runs = [launch(way, args.numel, args.timeout) for _ in tqdm(range(args.runs), desc="exit_race") for way in WAYS]
    table = summarise(runs)
    cpu, bf16 = su.cpu_description()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cpu_bf16_flags": bf16,
        "cores": os.cpu_count(),
        "command": ["python", "-m", "bench.exit_race", *(argv if argv is not None else sys.argv[1:])],
        "numel": args.numel,
        "summary": table,
        "runs": runs,
    }
    text = (
        f"{report['date']}, {cpu} ({os.cpu_count()} cores), {args.runs} two-process launches each way, "
        f"last all-reduce {args.numel} floats\n\n| ending | runs | failed | aborted (terminate called) | hung |\n"
        "|---|---|---|---|---|\n"
        + "".join(
            f"| {way} | {t['runs']} | {t['failed']} | {t['aborts']} | {t['hung']} |\n" for way, t in table.items()
        )
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    su.write_report(out, "exit_race", report, text)
    return report


if __name__ == "__main__":
    main()
