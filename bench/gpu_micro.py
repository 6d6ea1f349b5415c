"""Two 30-60 s GPU microbenchmarks in place of whole training rows, for paths whose win is small or unknown
(bench/STUDIES.md, "The next GPU call"): each prints and writes one JSON (gpu_micro_<name>.json).

    python -m bench.gpu_micro ffn --out <folder>     # FC1 + GELU + FC2, forward and backward, at a fixed token count
    python -m bench.gpu_micro layer --out <folder>   # one encoder layer, torch's dropout against 1-bit masks

`ffn`: BERT-large's feed-forward block (T tokens x 1024 -> 4096, GELU, -> 1024) compiled twice with static shapes,
Inductor's default (cuBLAS products, GELU a separate kernel) and max-autotune-no-cudagraphs (Triton GEMM templates
timed against cuBLAS per shape, the bias and GELU fused into a winning template's epilogue), each timed forward +
backward with CUDA events; which kernels ran in each (a profile's kernel names: `triton_tem` is a template, the rest
cuBLAS) is Inductor's choice per shape. `layer`: one modeling.BertLayer on the unpadded [T, H] layout, compiled,
forward + backward with hidden dropout 0.1, nn.Dropout against bit_dropout.BitMaskDropout (time and peak memory).
On a CPU both run small with --backend aot_eager (the tests' rehearsal); the timings mean nothing there.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path


def timed(fn, steps: int, device) -> float:
    """Milliseconds a call of fn, the median of `steps` after two warm-up calls (CUDA events on a GPU)."""
    import statistics

    import torch

    for _ in range(2):
        fn()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def kernels(fn, device) -> list[str]:
    """The names of the GPU kernels one call of fn runs (on a CPU: its operators)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
    wanted = torch.autograd.DeviceType.CUDA if device.type == "cuda" else torch.autograd.DeviceType.CPU
    return sorted({e.name[:120] for e in prof.events() if e.device_type == wanted})


def compile_with(args, fn, mode: str, **kwargs):
    """torch.compile in `mode` with Inductor, or with --backend (the tests' aot_eager, which takes no mode)."""
    import torch

    if args.backend != "inductor":
        return torch.compile(fn, backend=args.backend, **kwargs)
    return torch.compile(fn, mode=None if mode == "default" else mode, **kwargs)


def ffn(args, device, dtype) -> dict:
    import torch
    import torch.nn.functional as F

    T, H, I = args.tokens, args.hidden, 4 * args.hidden  # noqa: E741 - the intermediate width, as modeling.py
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    w1, w2 = (torch.randn(o, i, device=device, dtype=dtype) * 0.02 for o, i in ((I, H), (H, I)))
    b1, b2 = torch.zeros(I, device=device, dtype=dtype), torch.zeros(H, device=device, dtype=dtype)
    for t in (w1, w2, b1, b2):
        t.requires_grad_()
    grad = torch.randn(T, H, device=device, dtype=dtype)

    def block(x):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)  # [T, H] -> [T, I] -> [T, H]

    result = {}
    for mode in ("default", args.mode):
        compiled = compile_with(args, block, mode, dynamic=False)
        step = functools.partial(lambda f: f(x).backward(grad), compiled)
        began = time.perf_counter()
        step()
        compile_s = time.perf_counter() - began
        names = kernels(step, device)
        result[mode] = {
            "ms": timed(step, args.steps, device),
            "compile_s": compile_s,
            "templates": [n for n in names if "triton_tem" in n],
            "kernels": names,
        }
    return result


def layer(args, device, dtype) -> dict:
    import torch

    from bert_padding import unpad_info
    from bert_recipe.training import bit_dropout
    from modeling import BertConfig, BertLayer

    config = BertConfig(
        hidden_size=args.hidden, num_attention_heads=args.hidden // 64, intermediate_size=4 * args.hidden
    )
    S = 128
    mask = torch.ones(args.tokens // S, S, dtype=torch.long, device=device)
    info = unpad_info(mask)  # [T] rows, T = tokens rounded down to whole sequences
    x = torch.randn(info.tokens, args.hidden, device=device, dtype=dtype, requires_grad=True)
    result = {}
    for name in ("torch_dropout", "bit_masks"):
        torch.manual_seed(0)
        module = BertLayer(config).to(device=device, dtype=dtype).train()
        if name == "bit_masks":
            bit_dropout.convert(module)
        compiled = compile_with(args, module, args.mode)
        step = functools.partial(lambda f: f(x, info).sum().backward(), compiled)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ms = timed(step, args.steps, device)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        result[name] = {"ms": ms, "peak_memory_gib": peak}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_micro", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=["ffn", "layer"])
    parser.add_argument("--out", required=True, help="where gpu_micro_<bench>.json goes")
    parser.add_argument("--tokens", type=int, default=30720, help="T: phase 1's real tokens of a micro-batch")
    parser.add_argument("--hidden", type=int, default=1024, help="H (BERT-large)")
    parser.add_argument("--steps", type=int, default=20, help="timed calls (the median is reported)")
    parser.add_argument("--mode", default="max-autotune-no-cudagraphs", help="the compile mode set against default")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (the tests: aot_eager)")
    parser.add_argument("--cpu", action="store_true", help="on the CPU even when a GPU is present (the tests)")
    args = parser.parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {
        "bench": args.bench,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "bench")},
        **(ffn if args.bench == "ffn" else layer)(args, device, dtype),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu_micro_{args.bench}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=2)[:4000])
    return result


if __name__ == "__main__":
    main()
