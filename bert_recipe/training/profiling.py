"""Where a training step's time goes: torch.profiler over a few optimizer steps, summarised as JSON.

    profiler = StepProfiler(steps=3, device=torch.device("cuda"))
    profiler.start()  ... three optimizer steps ...  summary = profiler.stop()

On a GPU the summary ranks the kernels by their time on the device, sorts them into what a BERT step is made of
(matrix products, attention, the fused element-wise and reduction kernels that torch.compile writes, the optimizer,
copies, collectives) and says how much of the profiled window the GPU was busy: the rest is time it waited for the
host (launch overhead, the data loader, a host sync), and the summary says under which of the host's ranges that
waiting happened and where the host's own time went. On a CPU it ranks the operators by their own time instead.
run_pretraining.py --profile_steps N profiles the N steps after the throughput warm-up (they are not timed) and
writes <output_dir>/profile.json.
"""

from __future__ import annotations

import bisect
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
    ("optimizer", r"multi_tensor|lamb(?!da)|adam|foreach"),  # not "lambda", in many templated kernel names
    ("collective", r"nccl"),
    ("copy", r"memcpy|memset|copy|cat_|index|gather|scatter"),
    ("element-wise (eager)", r"elementwise|vectorized|reduce|unrolled|layer_norm|dropout|gelu|fill"),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as disjoint intervals in time order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: time during which at least one kernel ran."""
    return sum(end - start for start, end in merged(intervals))


def idle_intervals(busy: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end) that no busy interval covers (where the GPU ran nothing), in time order."""
    gaps, reach = [], start
    for s, e in merged(busy):
        if s > reach:
            gaps.append((reach, min(s, end)))
        reach = max(reach, e)
    if reach < end:
        gaps.append((reach, end))
    return [(s, e) for s, e in gaps if e > s]


def overlap(disjoint: list[tuple[float, float]], start: float, end: float) -> float:
    """How much of [start, end) the disjoint, time-ordered intervals cover."""
    i = bisect.bisect_right(disjoint, (start, float("inf"))) - 1  # the last interval starting at or before start
    total = 0.0
    for s, e in disjoint[max(i, 0) :]:
        if s >= end:
            break
        total += max(0.0, min(e, end) - max(s, start))
    return total


def idle_by_host(
    idle: list[tuple[float, float]], host: list[tuple[str, float, float]]
) -> tuple[dict[str, float], float]:
    """Where the host was while the GPU waited: for each name of the host's outermost ranges (name, start, end; on
    any thread, so one moment can count under two names), how much of the idle intervals it overlapped; and the idle
    time that no range covered (the host in Python between recorded operators)."""
    by_name: dict[str, float] = defaultdict(float)
    for name, start, end in host:
        by_name[name] += overlap(idle, start, end)
    covered = sum(overlap(idle, s, e) for s, e in merged([(s, e) for _, s, e in host]))
    return dict(by_name), sum(e - s for s, e in idle) - covered


class StepProfiler:
    """torch.profiler around a window of steps; `stop` returns the summary (see the module's docstring)."""

    def __init__(self, steps: int, device: torch.device, top: int = 25):
        self.steps, self.device, self.top = steps, device, top
        if device.type == "cuda":
            self.profile = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
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
        kernels = [
            e
            for e in events
            if e.device_type == torch.autograd.DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False)
            and not e.name.startswith(("Optimizer.", "ProfilerStep"))
        ]
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
        # Where no kernel ran: the busy time is the rest of the window, and the host's ranges are laid over these gaps
        idle = idle_intervals([(e.time_range.start, e.time_range.end) for e in kernels], window_start, window_end)
        window_us = window_end - window_start
        busy_us = window_us - sum(end - start for start, end in idle)
        parts: dict[str, float] = defaultdict(float)
        for name, (t, _) in by_name.items():
            parts[category(name)] += t
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
        steps = max(self.steps, 1)
        per_step = 1e3 * steps  # microseconds over the window -> milliseconds a step
        return {
            "steps": self.steps,
            "device": "cuda",
            "window_ms": window_us / 1e3,
            "kernel_ms": kernel_us / 1e3,
            "busy_ms": busy_us / 1e3,
            "busy_share": busy_us / window_us if window_us > 0 else None,
            "idle_ms_per_step": (window_us - busy_us) / per_step,
            "kernels_per_step": len(kernels) / steps,
            **launches_per_step(events, steps),
            "idle_gaps_per_step": len(idle) / steps,
            "parts": {
                k: {"ms": v / 1e3, "share": v / kernel_us} for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
            },
            "kernels": [
                {"name": name[:200], "category": category(name), "ms": t / 1e3, "share": t / kernel_us, "calls": n}
                for name, (t, n) in ranked[: self.top]
            ],
            **self.host_while_idle(events, idle, per_step),
        }

    def host_while_idle(self, *args) -> dict[str, Any]:
        """_host_while_idle, or what stopped it: a diagnostic of the host must not end the training run it watches
        (it reads kineto's events, whose fields vary between torch versions)."""
        try:
            return self._host_while_idle(*args)
        except Exception as exc:  # any: reported in the summary instead
            return {"host_while_idle_error": f"{type(exc).__name__}: {exc}"}

    def _host_while_idle(self, events, idle: list[tuple[float, float]], per_step: float) -> dict[str, Any]:
        """What the host did in the gaps where the GPU waited for it (`idle`): `idle_by_host` (ms a step of GPU
        idle time under each of the host's outermost ranges: a compiled region, the data loader's __next__, the
        optimizer step, an aten op called from Python, on any thread), `idle_uncovered_ms_per_step` (idle under no
        recorded range: Python between operators), and `host_ops` (the host's own time by operator or runtime call,
        ms a step: where its time goes when it is the limit)."""
        host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
        outermost = [(e.name, e.time_range.start, e.time_range.end) for e in host if e.cpu_parent is None]
        by_name, uncovered = idle_by_host(idle, outermost)
        own: dict[str, float] = defaultdict(float)
        for e in host:
            own[e.name] += e.self_cpu_time_total
        top = lambda d: {k: v / per_step for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:10]}  # noqa: E731
        return {"idle_by_host": top(by_name), "idle_uncovered_ms_per_step": uncovered / per_step, "host_ops": top(own)}

    def host_summary(self) -> dict[str, Any]:
        """Operators by their own CPU time (a CPU run has no kernels)."""
        rows = sorted(self.profile.key_averages(), key=lambda a: -a.self_cpu_time_total)
        total = sum(a.self_cpu_time_total for a in rows) or 1.0
        return {
            "steps": self.steps,
            "device": self.device.type,
            "self_cpu_ms": total / 1e3,
            "operators": [
                {
                    "name": a.key,
                    "ms": a.self_cpu_time_total / 1e3,
                    "share": a.self_cpu_time_total / total,
                    "calls": a.count,
                }
                for a in rows[: self.top]
            ],
        }


GRAPH_LAUNCH = "cudaGraphLaunch"
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def launches_per_step(events, steps: int) -> dict[str, float]:
    """How the host started the GPU's work, a step: `graph_launches` (cudaGraphLaunch: a replayed CUDA graph) and
    `kernel_launches` (one kernel each). Steps replayed as graphs show graph launches and few kernel launches."""
    names = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    steps = max(steps, 1)
    return {
        "graph_launches_per_step": sum(n == GRAPH_LAUNCH for n in names) / steps,
        "kernel_launches_per_step": sum(n in KERNEL_LAUNCHES for n in names) / steps,
    }
