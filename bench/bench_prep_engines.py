"""The data pipeline on both engines, on the whole Wikipedia slice, and a projection to all of Wikipedia on 1, 8
and 32 nodes (issue 44).

    .venv/bin/python -m bench.bench_prep_engines --out bench/results/data/prep_engines

What runs: data/bertPrep.py's text_formatting (the slice's WikiExtractor files), sharding (32 training + 2 test
shards), and the phase 1 and phase 2 HDF5 files (dupe factor 5), as data/README.md's first real-scale run, once
with `--engine processes --n_processes W` and once with `--engine dask` against a scheduler and W single-threaded
workers started apart through a scheduler file (what data/prep.sub starts), alternating for --rounds rounds; every
run's HDF5 files are checked to be the first run's byte for byte. Per stage: wall time (bertPrep's own log), and for
Dask every task's compute time from the scheduler's task stream.

Reported: the Dask engine's wall time over the processes engine's (the issue's goal: at most 1.15x at 2 workers);
peak memory per worker (the processes engine: the largest child process; Dask: each worker process's own peak and
its largest child's, create_pretraining_data.py); words a second per core of the whole command beside LDDL's
published rate (about 20 K words/s per core); the scheduler's cost per task (a burst of empty tasks); and the
projection, with its formula:

    T_stage(N) = U + f * B + max(f * W / (N * c), f * K * o, L)        T(N) = sum over stages
    efficiency(N) = T(1) / (N * T(N))

with f the corpus scale (words of all of Wikipedia / the slice's), U the stage's start-up (the process, its
imports, joining the cluster: it does not grow with the corpus), W the sum of its tasks' compute times, K its tasks,
o the scheduler's and client's time per task (a burst of empty tasks), L its longest task (pieces keep their size
as the corpus grows: K grows with f), N nodes of c cores (one worker a core), and B the client's own work on the
data outside the tasks: the stage's wall time less U, less the tasks' span, less K * o (the sharding's assignment,
joining the formatted parts into one file and hashing it), counted as growing with the corpus, which is an upper
bound for the parts of it that do not (hashing the vocabulary, say). It assumes tasks as many as cores or more
(the stages cut their work by size), compute that scales with the bytes, and a shared filesystem fast enough for
every node. Turning a real dump's wikitext into text is not in the slice (it is WikiExtractor output already); its
measured parser rate gives that stage's line of the projection.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import study_utils as su
from bert_recipe.prep.manifest import sha256_file
from tests.dask_processes import DaskProcesses

REPO, SHARED = su.REPO, su.DATA
SLICE_WORDS = 32_469_939  # wc -w of the slice, <doc> lines removed (its PROVENANCE.txt)
SLICE_MB = 197  # the slice's text, uncompressed (its PROVENANCE.txt)
WIKIPEDIA_WORDS = 4.5e9  # English Wikipedia today (data/README.md: 2.5 B in BERT's paper, about 4.5 B now)
LDDL_WORDS_PER_CORE_S = 20_000
PARSER_MB_PER_CORE_S = (0.2, 0.5)  # wikitext -> text with mwparserfromhell, data/README.md's measurement
WIKITEXT_GB = 90  # today's English wikitext (data/README.md)
STAGES = ("text_formatting", "sharding", "hdf5 phase 1", "hdf5 phase 2")
TASK_PREFIX = {
    "text_formatting": "text files",
    "sharding": ("segmenting", "writing shards"),
    "hdf5 phase 1": "hdf5 shards",
    "hdf5 phase 2": "hdf5 shards",
}


class DaskCluster(DaskProcesses):
    """tests/dask_processes.py's scheduler and workers, with a client of the bench's own: the task stream, the
    workers' peak memory, the scheduler's cost per task."""

    def __init__(self, folder: Path, workers: int):
        super().__init__(
            folder, workers, env={**os.environ, "PYTHONPATH": str(REPO), "DASK_LOGGING__DISTRIBUTED": "error"}
        )
        self.file = self.scheduler_file
        from distributed import Client

        self.client = Client(scheduler_file=str(self.file), timeout=30)
        self.client.wait_for_workers(workers, timeout=60)
        self.client.get_task_stream()  # registers the scheduler's task-stream plugin before the first stage

    def peak_memory_mib(self) -> dict[str, dict[str, float]]:
        """Each worker process's peak resident memory and its largest child's (ru_maxrss), MiB."""

        def peaks():
            import resource

            return {
                "worker": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "largest_child": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            }

        return {address: {k: round(v, 1) for k, v in p.items()} for address, p in self.client.run(peaks).items()}

    def per_task_overhead_s(self, tasks: int = 2000) -> float:
        """The scheduler's time per task: a burst of empty tasks, submitted and gathered, over their number."""
        self.client.gather(self.client.map(lambda i: i, range(50), pure=False))  # warm
        start = time.perf_counter()
        self.client.gather(self.client.map(lambda i: i, range(tasks), pure=False))
        return (time.perf_counter() - start) / tasks

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        super().stop()


def run_pipeline(work: Path, args, engine: list[str], cluster: DaskCluster | None) -> dict:
    """The four stages through bertPrep (each its own process, as create_datasets_from_start.sh runs them)."""
    base = [
        sys.executable,
        "-m",
        "data.bertPrep",
        "--dataset",
        "wikicorpus_en",
        "--working_dir",
        str(work),
        "--no_progress",
        "--n_training_shards",
        "32",
        "--n_test_shards",
        "2",
        "--fraction_test_set",
        "0.02",
        *engine,
    ]
    steps = {
        "text_formatting": ["--action", "text_formatting", "--wikiextractor_dir", str(args.slice)],
        "sharding": ["--action", "sharding"],
        "hdf5 phase 1": ["--action", "create_hdf5_files", "--phase", "1", "--vocab_file", str(args.vocab)],
        "hdf5 phase 2": ["--action", "create_hdf5_files", "--phase", "2", "--vocab_file", str(args.vocab)],
    }
    stages, started = {}, time.time()
    for name, extra in steps.items():
        t0 = time.time()
        done = subprocess.run([*base, *extra], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_prep_engines: {name} failed: {done.stderr.strip().splitlines()[-1:]}")
        stage = {"wall_s": round(time.time() - t0, 2), "t0": t0}
        if cluster is not None:
            stage.update(task_stream(cluster, TASK_PREFIX[name], t0))
        stages[name] = stage
    log = [json.loads(line) for line in (work / "bertPrep_log.jsonl").read_text().splitlines()]
    done_records = [r["data"] for r in log if r["step"] == "action_done"]
    engine_at = [r["timestamp"] for r in log if r["step"] == "engine"]  # logged once the engine is ready
    for stage, record, ready in zip(stages.values(), done_records, engine_at):
        stage.update(
            action_s=record["elapsed_s"],
            peak_rss_mib=record["peak_rss_mib"],
            peak_child_rss_mib=record["peak_child_rss_mib"],
            startup_s=round(ready - stage["t0"], 2),
        )
        del stage["t0"]
    return {"stages": stages, "wall_s": round(time.time() - started, 2)}


def task_stream(cluster: DaskCluster, prefixes, since: float) -> dict:
    """The stage's tasks from the scheduler's task stream: their number, summed compute time, span and longest."""
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    records = [
        r
        for r in cluster.client.get_task_stream(start=since)
        if str(r["key"]).startswith(tuple(f"{p}-" for p in prefixes))
    ]
    computes = [s for r in records for s in r["startstops"] if s["action"] == "compute"]
    if not computes:
        return {"tasks": 0, "task_s": 0.0, "span_s": 0.0, "longest_task_s": 0.0}
    return {
        "tasks": len(computes),
        "task_s": round(sum(s["stop"] - s["start"] for s in computes), 3),
        "span_s": round(max(s["stop"] for s in computes) - min(s["start"] for s in computes), 3),
        "longest_task_s": round(max(s["stop"] - s["start"] for s in computes), 3),
    }


def hdf5_digests(work: Path) -> dict[str, str]:
    return {str(p.relative_to(work)): sha256_file(p) for p in sorted(work.glob("hdf5_*/**/*.hdf5"))}


def projection(dask_run: dict, overhead_s: float, cores_per_node: int, f: float, scale_b: bool = True) -> dict:
    """T(N) per stage and in all, and the efficiency, for N = 1, 8, 32 nodes (see the module docstring).
    scale_b=False: the client's work B taken as constant instead (the other bound)."""
    out = {}
    for n in (1, 8, 32):
        per_stage = {}
        for name, s in dask_run["stages"].items():
            data_work = max(0.0, s["wall_s"] - s["startup_s"] - s["span_s"] - s["tasks"] * overhead_s)  # B
            compute = f * s["task_s"] / (n * cores_per_node)
            per_stage[name] = round(
                s["startup_s"]
                + (f if scale_b else 1.0) * data_work
                + max(compute, f * s["tasks"] * overhead_s, s["longest_task_s"]),
                1,
            )
        out[n] = {"stages_s": per_stage, "total_s": round(sum(per_stage.values()), 1)}
    for n in out:
        out[n]["efficiency"] = round(out[1]["total_s"] / (n * out[n]["total_s"]), 3)
    out["terms"] = {
        name: {
            "U": s["startup_s"],
            "B": round(max(0.0, s["wall_s"] - s["startup_s"] - s["span_s"] - s["tasks"] * overhead_s), 3),
            "W": s["task_s"],
            "K": s["tasks"],
            "L": s["longest_task_s"],
        }
        for name, s in dask_run["stages"].items()
    }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=su.HelpFormatter)
    p.add_argument("--slice", type=Path, default=SHARED / "wikipedia-en-slice" / "text")
    p.add_argument("--vocab", type=Path, default=SHARED / "bert-vocab" / "bert-base-uncased-vocab.txt")
    p.add_argument("--workers", type=int, default=2, help="processes of the processes engine, Dask workers")
    p.add_argument("--rounds", type=int, default=2, help="processes then dask, this many times")
    p.add_argument("--cores_per_node", type=int, default=64, help="the projection's cores (workers) per node")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "results" / "prep_engines",
        help="folder for prep_engines.json and prep_engines.md",
    )
    args = p.parse_args(argv)
    scratch = Path(args.work or tempfile.mkdtemp(prefix="prep_engines_"))
    scratch.mkdir(parents=True, exist_ok=True)
    cluster = DaskCluster(scratch / "dask", args.workers)
    runs, reference = [], None
    try:
        overhead = cluster.per_task_overhead_s()
        for round_ in range(args.rounds):
            for engine in ("processes", "dask"):
                work = scratch / f"{engine}_{round_}"
                shutil.rmtree(work, ignore_errors=True)
                flags = (
                    ["--n_processes", str(args.workers)]
                    if engine == "processes"
                    else ["--engine", "dask", "--dask_scheduler_file", str(cluster.file)]
                )
                result = run_pipeline(work, args, flags, cluster if engine == "dask" else None)
                digests = hdf5_digests(work)
                reference = reference or digests
                result.update(
                    engine=engine, round=round_, same_hdf5_as_first_run=digests == reference, hdf5_files=len(digests)
                )
                stages = ", ".join(f"{k} {v['wall_s']:.1f}" for k, v in result["stages"].items())
                print(f"round {round_} {engine}: {result['wall_s']:.1f} s ({stages})", flush=True)
                runs.append(result)
                shutil.rmtree(work, ignore_errors=True)
        worker_memory = cluster.peak_memory_mib()
    finally:
        cluster.stop()
        if args.work is None:
            shutil.rmtree(scratch, ignore_errors=True)
    best = {e: min((r for r in runs if r["engine"] == e), key=lambda r: r["wall_s"]) for e in ("processes", "dask")}
    f = WIKIPEDIA_WORDS / SLICE_WORDS
    report = {
        "command": "python -m bench.bench_prep_engines " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": su.cpu_description()[0],
        "cores": os.cpu_count(),
        "workers": args.workers,
        "runs": runs,
        "dask_over_processes": round(best["dask"]["wall_s"] / best["processes"]["wall_s"], 3),
        "words_per_core_s": {e: round(SLICE_WORDS / (best[e]["wall_s"] * args.workers)) for e in best},
        "lddl_words_per_core_s": LDDL_WORDS_PER_CORE_S,
        "peak_memory_mib": {
            "processes_largest_child": max(
                s["peak_child_rss_mib"] for r in runs if r["engine"] == "processes" for s in r["stages"].values()
            ),
            "dask_workers": worker_memory,
        },
        "scheduler_s_per_task": round(overhead, 6),
        "projection": {
            "corpus_scale": round(f, 1),
            "cores_per_node": args.cores_per_node,
            "nodes": projection(best["dask"], overhead, args.cores_per_node, f),
            "nodes_if_client_work_constant": projection(best["dask"], overhead, args.cores_per_node, f, scale_b=False),
            "wikitext_parsing_hours_per_node": {
                str(n): [
                    round(WIKITEXT_GB * 1000 / (rate * args.cores_per_node * n) / 3600, 2)
                    for rate in PARSER_MB_PER_CORE_S
                ]
                for n in (1, 8, 32)
            },
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    su.write_report(args.out, "prep_engines", report, markdown(report) + "\n")
    return report


def markdown(report: dict) -> str:
    mb = {e: SLICE_MB * w / SLICE_WORDS for e, w in report["words_per_core_s"].items()}
    memory = report["peak_memory_mib"]
    workers = ", ".join(
        f"{m['worker']:.0f} MiB (its create_pretraining_data.py {m['largest_child']:.0f} MiB)"
        for m in memory["dask_workers"].values()
    )
    lines = [
        f"Prep engines on the whole Wikipedia slice ({report['date']}, {report['cpu']}, {report['workers']} "
        f"workers): Dask / processes wall time **{report['dask_over_processes']:.2f}x** (best of each); per "
        f"core, words/s {report['words_per_core_s']} (LDDL: about {report['lddl_words_per_core_s']:,}) and "
        f"MB/s {', '.join(f'{e} {v:.2f}' for e, v in mb.items())}; scheduler "
        f"{1000 * report['scheduler_s_per_task']:.2f} ms a task; peak memory: processes engine's largest "
        f"child {memory['processes_largest_child']:.0f} MiB, Dask workers {workers}.",
        "",
        "| engine | round | " + " | ".join(STAGES) + " | total s | same HDF5 |",
        "|---|---|" + "---|" * len(STAGES) + "---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['engine']} | {r['round']} | "
            + " | ".join(f"{r['stages'][s]['wall_s']:.1f}" for s in STAGES)
            + f" | {r['wall_s']:.1f} | {'yes' if r['same_hdf5_as_first_run'] else 'NO'} |"
        )
    proj = report["projection"]
    lines += [
        "",
        f"Projection to all of English Wikipedia (x{proj['corpus_scale']} the slice), "
        f"{proj['cores_per_node']} cores a node, by T_stage(N) = U + f B + max(f W / (N c), f K o, L), "
        "efficiency(N) = T(1) / (N T(N)) (bench/bench_prep_engines.py says what each term is); B, the "
        "client's own work outside the tasks, counted as growing with the corpus (an upper bound):",
        "",
        "| nodes | " + " | ".join(STAGES) + " | total | efficiency | efficiency if B stays constant |",
        "|---|" + "---|" * len(STAGES) + "---|---|---|",
    ]
    constant = proj.get("nodes_if_client_work_constant", {})
    for n, row in proj["nodes"].items():
        if n == "terms":
            continue
        other = constant.get(n) or constant.get(str(n))
        lines.append(
            f"| {n} | "
            + " | ".join(f"{row['stages_s'][s]:.0f} s" for s in STAGES)
            + f" | {row['total_s'] / 60:.1f} min | {100 * row['efficiency']:.0f}% | "
            + (f"{100 * other['efficiency']:.0f}% |" if other else "n/a |")
        )
    terms = proj["nodes"].get("terms", {})
    if terms:
        lines += [
            "",
            "Measured terms of the formula (the best Dask run), seconds: "
            + "; ".join(
                f"{name}: U {t['U']}, B {t['B']}, W {t['W']}, K {t['K']}, L {t['L']}" for name, t in terms.items()
            )
            + f"; o {report['scheduler_s_per_task']}.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
