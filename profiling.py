"""Where a training step's time goes: torch.profiler over a few optimizer steps, summarised as JSON.

    profiler = StepProfiler(steps=3, device=torch.device("cuda"))
    profiler.start()  ... three optimizer steps ...  summary = profiler.stop()

On a GPU the summary ranks the kernels by their time on the device, sorts them into what a BERT step is made of
(matrix products, attention, the fused element-wise and reduction kernels that torch.compile writes, the optimizer,
copies, collectives) and says how much of the profiled window the GPU was busy: the rest is time it waited for the
host (launch overhead, the data loader, a host sync). On a CPU it ranks the operators by their own time instead.
run_pretraining.py --profile_steps N profiles the N steps after the throughput warm-up (they are not timed) and
writes <output_dir>/profile.json.
"""
from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from typing import Any

import torch

# The first pattern that matches a kernel's name (case-insensitive) names its part of the step.
CATEGORIES = (
    ("attention", r"flash|fmha|attention|sdpa|softmax_bwd|cudnn.*mha"),
    ("matmul", r"gemm|gemv|cutlass|xmma|nvjet|cublas|matmul|sm\d\d_|^triton_tem_"),
    ("fused (compiled)", r"^triton_"),  # torch.compile's kernels (their names list what they fused)
    ("optimizer", r"multi_tensor|lamb|adam|foreach"),
    ("collective", r"nccl"),
    ("copy", r"memcpy|memset|copy|cat_|index|gather|scatter"),
    ("element-wise (eager)", r"elementwise|vectorized|reduce|unrolled|layer_norm|dropout|gelu|fill"),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: time during which at least one kernel ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class StepProfiler:
    """torch.profiler around a window of steps; `stop` returns the summary (see the module's docstring)."""

    def __init__(self, steps: int, device: torch.device, top: int = 25):
        self.steps, self.device, self.top = steps, device, top
        if device.type == "cuda":
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA])
        else:
            # The autograd profiler that torch.profiler.profile wraps, which records the same operators: the wrapper
            # also asks whether torch._inductor is loaded (hasattr, which imports it: 1.5 s on a CPU) for the CUDA
            # graphs of compiled models, which a CPU run has none of.
            self.profile = torch.autograd.profiler.profile(use_cpu=True)
        self._running = contextlib.ExitStack()

    def start(self) -> None:
        self._sync()
        self._running.enter_context(self.profile)

    def stop(self) -> dict[str, Any]:
        self._sync()
        self._running.close()
        if self.device.type == "cuda":
            return self.device_summary(list(self.profile.events()))
        return self.host_summary()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def device_summary(self, events) -> dict[str, Any]:
        """Kernels by device time; the share of the window during which the GPU ran anything."""
        # Device events, less the user annotations that kineto lays over them (a range like "Optimizer.step"
        # spans kernels already counted).
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and not getattr(e, "is_user_annotation", False)
                   and not e.name.startswith(("Optimizer.", "ProfilerStep"))]
        if not kernels:
            return {"steps": self.steps, "device": "cuda", "kernels": [], "note": "no kernel events recorded"}
        window_start = min(e.time_range.start for e in events)
        window_end = max(e.time_range.end for e in events)
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for e in kernels:
            entry = by_name[e.name]
            entry[0] += e.time_range.end - e.time_range.start
            entry[1] += 1
        kernel_us = sum(t for t, _ in by_name.values())
        busy_us = busy_time([(e.time_range.start, e.time_range.end) for e in kernels])
        window_us = window_end - window_start
        parts: dict[str, float] = defaultdict(float)
        for name, (t, _) in by_name.items():
            parts[category(name)] += t
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
        return {
            "steps": self.steps, "device": "cuda",
            "window_ms": window_us / 1e3, "kernel_ms": kernel_us / 1e3, "busy_ms": busy_us / 1e3,
            "busy_share": busy_us / window_us if window_us > 0 else None,
            "idle_ms_per_step": (window_us - busy_us) / 1e3 / max(self.steps, 1),
            "parts": {k: {"ms": v / 1e3, "share": v / kernel_us}
                      for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
            "kernels": [{"name": name[:200], "category": category(name), "ms": t / 1e3, "share": t / kernel_us,
                         "calls": n} for name, (t, n) in ranked[:self.top]],
        }

    def host_summary(self) -> dict[str, Any]:
        """Operators by their own CPU time (a CPU run has no kernels)."""
        rows = sorted(self.profile.key_averages(), key=lambda a: -a.self_cpu_time_total)
        total = sum(a.self_cpu_time_total for a in rows) or 1.0
        return {"steps": self.steps, "device": self.device.type, "self_cpu_ms": total / 1e3,
                "operators": [{"name": a.key, "ms": a.self_cpu_time_total / 1e3,
                               "share": a.self_cpu_time_total / total, "calls": a.count} for a in rows[:self.top]]}
