"""NVLAMB (optimization.py) step time against torch-optimizer's Lamb on the BERT-base parameter set.

Run from the repository root:

    .venv/bin/python -m bench.bench_lamb [--iters 10] [--warmup 2] [--out results/bench_lamb.json]

Every optimizer gets the same BERT-base parameter shapes (206 tensors, 110M values: embeddings, 12 encoder layers,
pooler, MLM head, NSP head; the MLM decoder is tied to the word embeddings, as in BERT), the same two weight-decay
groups (0.01; 0 for biases and LayerNorm) and its own copy of the same random gradients (NVLAMB clips p.grad in
place). Timed: NVLAMB (default, torch's fused Adam kernel for the Adam part), torch_optimizer.Lamb, and NVLAMB with
fused=False (foreach ops only) for reference. The runs alternate in one process (who goes first rotates every
iteration); warm-up iterations are excluded; the median wall time and the median process CPU time of
`optimizer.step()` are reported (CPU time is less disturbed by other jobs on a shared host).

The two are not the same algorithm, which the output says too: torch-optimizer's Lamb (0.3.0) has no gradient
clipping, no bias correction by default, clamps ||p|| at 10 in its trust ratio and applies the ratio to every
group, while NVLAMB clips the global gradient norm over all groups, bias-corrects and, without use_nvlamb, takes
plain Adam steps for the weight_decay=0 group. The per-element work is comparable (the same moments, norms and
update), so the timing compares implementations.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.study_utils import REPO
from bert_recipe.io.atomic_io import atomic_write_json
from modeling import BertConfig, BertForPreTraining
from optimization import NVLAMB, _no_decay

NOTE = (
    "torch_optimizer.Lamb differs mathematically: no gradient clipping, no bias correction (debias=False), "
    "trust ratio with ||p|| clamped to 10 and applied to every group; NVLAMB clips the global grad norm over "
    "all groups, bias-corrects, and uses r=1 for the weight_decay=0 group (use_nvlamb=False). Same per-element "
    "work otherwise; timings compare implementations, not identical maths."
)


def bert_base_shapes() -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of modeling.py's BertForPreTraining with configs/bert-base.json (built on the meta
    device: no memory); the MLM decoder, tied to the word embeddings, is listed once."""
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig.from_json_file(REPO / "configs" / "bert-base.json"))
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def build_groups(
    shapes: dict[str, tuple[int, ...]], grads: dict[str, torch.Tensor], device: torch.device, seed: int
) -> list[dict]:
    """Fresh parameters (same values for the same seed) in two weight-decay groups, with copies of `grads`.

    Each optimizer gets its own gradient copies: NVLAMB clips p.grad in place.
    """
    gen = torch.Generator().manual_seed(seed)
    decay, no_decay = [], []
    for name, shape in shapes.items():
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = grads[name].clone()
        (no_decay if _no_decay(name) else decay).append(p)
    return [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]


def time_step(opt: torch.optim.Optimizer, device: torch.device) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one opt.step(). CPU time is less sensitive to other jobs on a shared host."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (at least one timed step)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Run from the repository root as: python -m bench.bench_lamb"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed steps per optimizer (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per optimizer first (default 2)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no_foreach_variant", action="store_true", help="skip timing NVLAMB(fused=False) as a third optimizer"
    )
    parser.add_argument("--out", default="results/bench_lamb.json", help="JSON result file")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    return args


def make_optimizers(
    args: argparse.Namespace, shapes: dict[str, tuple[int, ...]], device: torch.device
) -> tuple[dict[str, torch.optim.Optimizer], int]:
    """The optimizers to time (NVLAMB, torch_optimizer.Lamb, and NVLAMB fused=False unless --no_foreach_variant),
    each over its own copy of the same parameters and gradients (seeds --seed and --seed + 1); and how many values
    the gradients hold."""
    import torch_optimizer  # a test requirement, checked in run(): --help works without it

    gen = torch.Generator().manual_seed(args.seed + 1)
    grads = {name: (torch.randn(shape, generator=gen) * 1e-3).to(device) for name, shape in shapes.items()}
    n_params = sum(g.numel() for g in grads.values())
    optimizers = {
        "nvlamb": NVLAMB(build_groups(shapes, grads, device, args.seed), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0),
        "torch_optimizer_lamb": torch_optimizer.Lamb(
            build_groups(shapes, grads, device, args.seed), lr=1e-3, weight_decay=0.01
        ),
    }
    if not args.no_foreach_variant:  # NVLAMB without torch's fused Adam kernel, for reference
        optimizers["nvlamb_foreach"] = NVLAMB(
            build_groups(shapes, grads, device, args.seed), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0, fused=False
        )
    return optimizers, n_params  # the gradients' originals are freed here: each optimizer holds its copies


def time_alternating(
    optimizers: dict[str, torch.optim.Optimizer], device: torch.device, warmup: int, iters: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall ms, CPU ms) of every timed step() per optimizer: warmup + iters rounds, every optimizer once a round,
    who goes first rotating every round; the warm-up rounds are not kept."""
    wall: dict[str, list[float]] = {name: [] for name in optimizers}
    cpu: dict[str, list[float]] = {name: [] for name in optimizers}
    order = list(optimizers)
    for it in range(warmup + iters):
        for name in order[it % len(order) :] + order[: it % len(order)]:  # rotate who goes first
            w, c = time_step(optimizers[name], device)
            if it >= warmup:
                wall[name].append(w)
                cpu[name].append(c)
    return wall, cpu


def result_of(
    args: argparse.Namespace,
    device: torch.device,
    shapes: dict[str, tuple[int, ...]],
    n_params: int,
    times: tuple[dict[str, list[float]], dict[str, list[float]]],
    command: str,
) -> dict:
    """The JSON result: the setting, the medians and every step's times, NVLAMB's speed-up over
    torch_optimizer.Lamb (wall and CPU time), the note on how the two differ."""
    import torch_optimizer  # a test requirement, checked in run()

    wall, cpu = times
    med = {name: statistics.median(t) for name, t in wall.items()}
    med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    return {
        "benchmark": "optimizer step time, BERT-base parameter set",
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "torch_optimizer": getattr(torch_optimizer, "__version__", "unknown"),
        "threads": torch.get_num_threads(),
        "n_tensors": len(shapes),
        "n_params": n_params,
        "warmup_iters": args.warmup,
        "timed_iters": args.iters,
        "median_ms": med,
        "median_cpu_ms": med_cpu,
        "all_ms": wall,
        "all_cpu_ms": cpu,
        "speedup_nvlamb_vs_torch_optimizer": med["torch_optimizer_lamb"] / med["nvlamb"],
        "speedup_nvlamb_vs_torch_optimizer_cpu_time": med_cpu["torch_optimizer_lamb"] / med_cpu["nvlamb"],
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "goal_speedup": 3.0,
        "note": NOTE,
        "command": command,
    }


def print_report(result: dict, out: str) -> None:
    """The setting, a Markdown table of the medians and speed-ups against torch_optimizer.Lamb, the goal, the note."""
    med, med_cpu = result["median_ms"], result["median_cpu_ms"]
    speedup, speedup_cpu = (
        result["speedup_nvlamb_vs_torch_optimizer"],
        result["speedup_nvlamb_vs_torch_optimizer_cpu_time"],
    )
    print(
        f"BERT-base parameter set: {result['n_tensors']} tensors, {result['n_params'] / 1e6:.1f}M values, device "
        f"{result['device']}, {result['threads']} threads, median of {result['timed_iters']} steps after "
        f"{result['warmup_iters']} warm-up"
    )
    print()
    labels = {
        "nvlamb": "NVLAMB (optimization.py, default: fused Adam kernel + foreach)",
        "nvlamb_foreach": "NVLAMB fused=False (foreach only)",
        "torch_optimizer_lamb": "torch_optimizer.Lamb 0.3.0",
    }
    base, base_cpu = med["torch_optimizer_lamb"], med_cpu["torch_optimizer_lamb"]
    print("| optimizer | median wall ms/step | speed-up (wall) | median CPU ms/step | speed-up (CPU time) |")
    print("|---|---:|---:|---:|---:|")
    for name in med:
        print(
            f"| {labels[name]} | {med[name]:.1f} | {base / med[name]:.2f}x | {med_cpu[name]:.1f} | "
            f"{base_cpu / med_cpu[name]:.2f}x |"
        )
    print(f"Goal: NVLAMB >= 3x torch_optimizer.Lamb; measured {speedup:.2f}x (wall), {speedup_cpu:.2f}x (CPU time)")
    print()
    print("Note: " + NOTE)
    print(f"Wrote {out}")


def run(args: argparse.Namespace, command: str) -> int:
    """Time the optimizers on the BERT-base parameter set, write the JSON (--out), print the table."""
    try:
        import torch_optimizer  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench_lamb: torch-optimizer is missing; pip install torch-optimizer==0.3.0 (requirements-test.txt)"
        ) from None
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = bert_base_shapes()
    optimizers, n_params = make_optimizers(args, shapes, device)
    times = time_alternating(optimizers, device, args.warmup, args.iters)
    result = result_of(args, device, shapes, n_params, times, command)
    atomic_write_json(Path(args.out), result)
    print_report(result, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """python -m bench.bench_lamb: parse the command line, then time the optimizers."""
    return run(parse(argv), "python -m bench.bench_lamb " + " ".join(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
