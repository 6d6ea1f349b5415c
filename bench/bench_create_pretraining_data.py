"""create_pretraining_data.py against a straightforward single-process implementation of the same algorithm.

Peers, each run as its own process on the shared WikiText-2 (valid + test, ~2.4 MB, made one sentence a line and
one article a document by scripts/text_to_documents.py, as the CPU demo makes it), dupe_factor 5, max_seq_length 128, 20
predictions, in rounds with the order alternating:
  * ours         create_pretraining_data.py --num_workers 2 (and once more with 1 worker, for the scaling);
  * base_fast    bench/baseline_create_pretraining_data.py: Google's pipeline in plain Python lists, one line at a
                 time through the same Rust tokenizer (so the comparison is about the pipeline);
  * base_python  the same with the pure-Python WordPiece tokenizer (what the original scripts cost).
Then memory as the corpus grows 10x (the corpus repeated ten times): ours on one 10x file (--output_file) and on
ten shards of it (--output_dir), base_fast on the 10x file (--skip_baseline_x10 to leave it out: minutes), and ours
on the 10x file at max_seq_length 512 / 80 predictions (phase 2), for the projection to full Wikipedia.

Per run: wall seconds, CPU seconds of the whole process tree (from wait4), instances, instances/second, the largest
single-process peak RSS (ru_maxrss from wait4: covers the workers, each on its own), and the peak of the whole tree
sampled every 50 ms from /proc: the sum of RSS (counts shared pages once per process) and the sum of PSS (shares
them out; the honest total). The machine is shared and has 2 cores: the load average is recorded; read the medians.

    .venv/bin/python -m bench.bench_create_pretraining_data            # from the repository root
    .venv/bin/python -m bench.bench_create_pretraining_data --rounds 1 --output results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import h5py

from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from scripts.text_to_documents import write_documents


class RunFailed(Exception):
    """A measured command ended with an error; the message ends with its last lines of stderr."""


REPO_ROOT, SHARED, VOCAB = su.REPO, su.DATA, su.VOCAB
WIKIPEDIA_WORDS = 2.5e9  # English Wikipedia, as in the BERT paper


# --------------------------------------------------------------------------------------------------------------
# Corpus


def make_corpora(work: Path) -> dict:
    """WikiText-2 valid + test made into create_pretraining_data's input by the recipe's own converter (one sentence
    a line, a blank line after each article), then repeated ten times in one file and in ten files."""
    one = work / "wikitext.txt"
    documents, _ = write_documents(
        [SHARED / "wikitext-2" / name for name in ("valid.txt", "test.txt")], one, sentences=True
    )
    body = one.read_text(encoding="utf-8")
    ten = work / "wikitext_x10.txt"
    ten.write_text("\n".join([body] * 10), encoding="utf-8")  # a blank line between the copies
    shards = work / "shards_x10"
    shards.mkdir()
    for i in range(10):
        (shards / f"wikitext_{i}.txt").write_text(body, encoding="utf-8")
    return {
        "x1": one,
        "x10": ten,
        "x10_shards": shards,
        "words": len(body.split()),
        "documents": documents,
        "bytes": one.stat().st_size,
    }


# --------------------------------------------------------------------------------------------------------------
# Measuring one process tree


def _children(pid: int) -> list[int]:
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def _kib(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Peak sum of RSS and of PSS over a process and all its descendants, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss_kib = self.peak_pss_kib = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pids = _tree(self.pid)
            rss = sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in pids)
            pss = sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
            self.peak_rss_kib, self.peak_pss_kib = max(self.peak_rss_kib, rss), max(self.peak_pss_kib, pss)
            self.done.wait(self.interval)


def measure(name: str, cmd: list[str], log_dir: Path) -> dict:
    out_path, err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=err)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child and the descendants it waited for
        wall = time.perf_counter() - start
        sampler.done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = err_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise RunFailed(f"{name} failed ({proc.returncode}): {' | '.join(tail)}")
    summary = json.loads(out_path.read_text().strip().splitlines()[-1])
    return {
        "name": name,
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "instances": summary["instances"],
        "instances_per_s": round(summary["instances"] / wall, 1),
        "max_process_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "tree_rss_mib": round(sampler.peak_rss_kib / 1024, 1),
        "tree_pss_mib": round(sampler.peak_pss_kib / 1024, 1),
        "summary": summary,
    }


def commands(corpora: dict, vocab: Path, out: Path, dupe: int) -> dict[str, list[str]]:
    py = sys.executable
    common = [
        "--vocab_file",
        str(vocab),
        "--dupe_factor",
        str(dupe),
        "--max_seq_length",
        "128",
        "--max_predictions_per_seq",
        "20",
        "--random_seed",
        "12345",
    ]
    ours = [
        py,
        "create_pretraining_data.py",
        "--input_file",
        str(corpora["x1"]),
        "--output_file",
        str(out / "ours.hdf5"),
        "--no_progress",
        *common,
    ]
    base = [
        py,
        "-m",
        "bench.baseline_create_pretraining_data",
        "--input_file",
        str(corpora["x1"]),
        "--output_file",
        str(out / "base.hdf5"),
        *common,
    ]
    return {
        "ours": ours + ["--num_workers", "2"],
        "ours_1worker": ours + ["--num_workers", "1"],
        "base_fast": base,
        "base_python": base + ["--python_tokenizer"],
    }


def shard_stats(path: Path) -> dict:
    """Instance statistics, to see that both implementations make the same kind of data."""
    with h5py.File(path, "r") as f:
        mask, seg = f["input_mask"][:], f["segment_ids"][:]
        positions, nsp = f["masked_lm_positions"][:], f["next_sentence_labels"][:]
    length = mask.sum(1)
    return {
        "mean_tokens": round(float(length.mean()), 2),
        "mean_len_b": round(float(seg.sum(1).mean() - 1), 2),
        "random_next": round(float(nsp.mean()), 4),
        "mean_predictions": round(float((positions > 0).sum(1).mean()), 3),
        "short_fraction": round(float((length < 100).mean()), 4),
    }


# --------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    """Bad input or a failed step: one line on stderr ("bench_create_pretraining_data: error: ..."), exit status 1."""
    with script_errors("bench_create_pretraining_data", argv, expected=(InputError, OSError, ValueError, RunFailed)):
        return run(
            parse(argv),
            " ".join([Path(sys.executable).name, "-m", "bench.bench_create_pretraining_data", *(argv or sys.argv[1:])]),
        )


def parse(argv=None) -> argparse.Namespace:
    """The command line; the shared WikiText-2 and vocabulary checked before anything runs."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three peers")
    p.add_argument("--dupe_factor", type=int, default=5)
    p.add_argument("--output", default=str(REPO_ROOT / "results" / "bench_create_pretraining_data.json"))
    p.add_argument("--skip_python_tokenizer", action="store_true", help="leave out base_python (the slowest)")
    p.add_argument("--skip_baseline_x10", action="store_true", help="leave out base_fast on the 10x corpus (minutes)")
    args = p.parse_args(argv)
    if not VOCAB.is_file():
        raise SystemExit(f"error: {SHARED} (the shared WikiText-2 and vocabulary) is missing")
    return args


def x10_commands(corpora: dict, out: Path, dupe: int, skip_baseline: bool) -> dict[str, list[str]]:
    """The single runs on the 10x corpus: ours on one file, on ten shards and at sequence 512 (phase 2), and
    base_fast on one file unless `skip_baseline`."""
    py = sys.executable
    common = [
        "--vocab_file",
        str(VOCAB),
        "--dupe_factor",
        str(dupe),
        "--num_workers",
        "2",
        "--no_progress",
        "--random_seed",
        "12345",
    ]
    extra = {
        "ours_x10_one_file": [
            py,
            "create_pretraining_data.py",
            "--input_file",
            str(corpora["x10"]),
            "--output_file",
            str(out / "x10.hdf5"),
            *common,
        ],
        "ours_x10_ten_shards": [
            py,
            "create_pretraining_data.py",
            "--input_file",
            str(corpora["x10_shards"]),
            "--output_dir",
            str(out / "x10_shards"),
            *common,
        ],
        "ours_x10_seq512": [
            py,
            "create_pretraining_data.py",
            "--input_file",
            str(corpora["x10"]),
            "--output_file",
            str(out / "seq512.hdf5"),
            "--max_seq_length",
            "512",
            "--max_predictions_per_seq",
            "80",
            *common,
        ],
    }
    if not skip_baseline:
        extra["base_fast_x10_one_file"] = [
            py,
            "-m",
            "bench.baseline_create_pretraining_data",
            "--input_file",
            str(corpora["x10"]),
            "--output_file",
            str(out / "b10.hdf5"),
            "--vocab_file",
            str(VOCAB),
            "--dupe_factor",
            str(dupe),
            "--random_seed",
            "12345",
        ]
    return extra


def measure_rounds(cmds: dict[str, list[str]], rounds: int, log_dir: Path) -> dict[str, list[dict]]:
    """Every peer once a round, the order alternating round by round; a line per run as it ends."""
    runs: dict[str, list[dict]] = {name: [] for name in cmds}
    names = list(cmds)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]  # alternate, so drifting load hits all peers alike
        for name in order:
            result = measure(f"{name}_{r}", cmds[name], log_dir)
            runs[name].append(result)
            print(
                f"round {r} {name:13s} {result['wall_s']:7.2f} s  {result['instances_per_s']:8.0f} inst/s  "
                f"cpu {result['cpu_s']:6.2f} s  tree PSS {result['tree_pss_mib']:6.0f} MiB",
                flush=True,
            )
    return runs


def measure_once(cmds: dict[str, list[str]], log_dir: Path) -> dict[str, dict]:
    """Each command run once, in order; a line per run as it ends."""
    single = {}
    for name, cmd in cmds.items():
        single[name] = measure(name, cmd, log_dir)
        print(
            f"{name:20s} {single[name]['wall_s']:7.2f} s  tree PSS {single[name]['tree_pss_mib']:6.0f} MiB  "
            f"max process RSS {single[name]['max_process_rss_mib']:6.0f} MiB",
            flush=True,
        )
    return single


@dataclass(frozen=True)
class Measured:
    """What one call measured: the corpora (make_corpora), the peers' runs round by round, the instance statistics
    of ours and base, the single 10x runs, and the load average before and after."""

    corpora: dict
    runs: dict[str, list[dict]]
    stats: dict[str, dict]
    single: dict[str, dict]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def measure_all(args: argparse.Namespace) -> Measured:
    """In a scratch folder: the corpora, the peers in alternating rounds, then the single runs on the 10x corpus."""
    with tempfile.TemporaryDirectory(prefix="bench_cpd_") as tmp:
        work = Path(tmp)
        (work / "out").mkdir()
        (work / "logs").mkdir()
        corpora = make_corpora(work)
        cmds = commands(corpora, VOCAB, work / "out", args.dupe_factor)
        if args.skip_python_tokenizer:
            cmds.pop("base_python")
        load_before = os.getloadavg()
        runs = measure_rounds(cmds, args.rounds, work / "logs")
        stats = {"ours": shard_stats(work / "out" / "ours.hdf5"), "base": shard_stats(work / "out" / "base.hdf5")}
        single = measure_once(
            x10_commands(corpora, work / "out", args.dupe_factor, args.skip_baseline_x10), work / "logs"
        )
        return Measured(corpora, runs, stats, single, load_before, os.getloadavg())


def medians(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per peer, the median of each measure over its rounds, and its instances."""
    med = {
        name: {
            key: statistics.median(r[key] for r in rs)
            for key in ("wall_s", "cpu_s", "instances_per_s", "max_process_rss_mib", "tree_rss_mib", "tree_pss_mib")
        }
        for name, rs in runs.items()
    }
    for name, rs in runs.items():
        med[name]["instances"] = rs[0]["instances"]
    return med


def projection(m: Measured) -> dict:
    """Hours for full English Wikipedia, projected from the 10x runs (a projection, and labelled one)."""
    corpora, single = m.corpora, m.single
    tokens = m.runs["ours"][0]["summary"]["tokens"]
    # From the 10x runs: start-up (interpreter, imports, vocabulary, worker processes) is amortised there as it
    # is on a real shard; ours on 2 workers, scaled linearly to 16; the baseline is one process whatever the cores.
    hours = {
        name: WIKIPEDIA_WORDS / (10 * corpora["words"] / single[name]["wall_s"]) / 3600
        for name in single
        if "x10" in name
    }
    out = {
        "assumption": "PROJECTION, not a measurement: time proportional to words (rates of the 10x WikiText runs "
        "on this loaded 2-core machine) and, for ours, linear in workers from 2 to 16; WikiText's "
        "<unk> and @-@ markup make its tokens/word ratio differ from real Wikipedia's",
        "wikitext_words": corpora["words"],
        "wikitext_tokens": tokens,
        "tokens_per_word": round(tokens / corpora["words"], 3),
        "phase1_ours_2workers_hours": round(hours["ours_x10_one_file"], 2),
        "phase1_ours_16workers_hours": round(hours["ours_x10_one_file"] * 2 / 16, 2),
        "phase2_ours_16workers_hours": round(hours["ours_x10_seq512"] * 2 / 16, 2),
    }
    if "base_fast_x10_one_file" in hours:
        out["phase1_base_fast_1process_hours"] = round(hours["base_fast_x10_one_file"], 1)
    return out


def speedups(med: dict[str, dict], single: dict[str, dict]) -> tuple[dict[str, float], dict[str, float]]:
    """(ours' instances/s over each baseline's, from the medians; the same from CPU seconds per instance, the 10x
    runs included)."""
    speedup = {
        f"ours_vs_{b}": round(med["ours"]["instances_per_s"] / med[b]["instances_per_s"], 2)
        for b in med
        if b.startswith("base")
    }
    # CPU seconds per instance, a measure the other jobs on a shared machine disturb less than wall time.
    cpu_per_instance = {name: m["cpu_s"] / m["instances"] for name, m in med.items()}
    cpu_per_instance.update({name: r["cpu_s"] / r["instances"] for name, r in single.items()})
    speedup_cpu = {
        f"{a}_vs_{b}": round(cpu_per_instance[b] / cpu_per_instance[a], 2)
        for a, b in (
            ("ours", "base_fast"),
            ("ours_1worker", "base_fast"),
            ("ours", "base_python"),
            ("ours_x10_one_file", "base_fast_x10_one_file"),
        )
        if a in cpu_per_instance and b in cpu_per_instance
    }
    return speedup, speedup_cpu


def report_of(args: argparse.Namespace, command: str, m: Measured) -> dict:
    """The JSON report: the machine, the corpus, medians, speed-ups, instance statistics, every run, the projection."""
    med = medians(m.runs)
    speedup, speedup_cpu = speedups(med, m.single)
    corpora = m.corpora
    return {
        "benchmark": "create_pretraining_data",
        "command": command,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": m.load_before,
            "load_average_after": m.load_after,
        },
        "corpus": {
            "source": "WikiText-2 valid+test",
            "bytes": corpora["bytes"],
            "words": corpora["words"],
            "documents": corpora["documents"],
            "dupe_factor": args.dupe_factor,
            "max_seq_length": 128,
            "max_predictions_per_seq": 20,
        },
        "median": med,
        "speedup": speedup,
        "speedup_cpu_per_instance": speedup_cpu,
        "instance_stats": m.stats,
        "single_runs": m.single,
        "runs": m.runs,
        "projection_full_wikipedia": projection(m),
    }


def print_report(report: dict, rounds: int, output: str) -> None:
    """The medians and single runs as a Markdown table, then the speed-ups, statistics, projection and load."""
    machine = report["machine"]
    print(
        f"\n| run (median of {rounds}) | wall s | instances/s | CPU s | max process RSS MiB | tree PSS MiB |"
        " tree RSS MiB |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for name, m in report["median"].items():
        print(
            f"| {name} | {m['wall_s']:.2f} | {m['instances_per_s']:.0f} | {m['cpu_s']:.2f} | "
            f"{m['max_process_rss_mib']:.0f} | {m['tree_pss_mib']:.0f} | {m['tree_rss_mib']:.0f} |"
        )
    for name, m in report["single_runs"].items():
        print(
            f"| {name} (1 run) | {m['wall_s']:.2f} | {m['instances_per_s']:.0f} | {m['cpu_s']:.2f} | "
            f"{m['max_process_rss_mib']:.0f} | {m['tree_pss_mib']:.0f} | {m['tree_rss_mib']:.0f} |"
        )
    print("\nspeed-up (instances/s, wall):", ", ".join(f"{k} {v}x" for k, v in report["speedup"].items()))
    print(
        "speed-up (CPU seconds per instance):",
        ", ".join(f"{k} {v}x" for k, v in report["speedup_cpu_per_instance"].items()),
    )
    print("instance statistics:", json.dumps(report["instance_stats"]))
    print("projection (full English Wikipedia, 2.5e9 words):", json.dumps(report["projection_full_wikipedia"]))
    print(
        f"load average before {machine['load_average_before']}, after {machine['load_average_after']}; "
        f"results in {output}"
    )


def run(args: argparse.Namespace, command: str) -> int:
    """Measure every peer and the 10x runs, write the JSON report (--output, atomically), print the tables."""
    report = report_of(args, command, measure_all(args))
    atomic_write_text(args.output, json.dumps(report, indent=2) + "\n")  # mkdir -p, a temporary file, rename
    print_report(report, args.rounds, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
