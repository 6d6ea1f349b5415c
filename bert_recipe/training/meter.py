"""Bookkeeping of a training run: `Meter` keeps the losses on the device until a log step (no host sync per
micro-batch) and measures throughput and MFU against `PEAK_FLOPS`; `HostMemory` watches and trims the host's
memory; `RunLogger` writes dllogger-keyed JSON lines, TensorBoard scalars and the tqdm bar (rank 0).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from bert_recipe.io import atomic_io
from bert_recipe.training import dist_env

# Dense peak FLOP/s per GPU (tensor cores, no sparsity) by precision, for MFU.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12},  # SXM; the PCIe card is lower
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12},
    "V100": {"fp16": 125e12, "tf32": 15.7e12},
}


def peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, table in PEAK_FLOPS.items():
        if key in name:
            return table.get(precision)
    return None


class HostMemory:
    """Gives freed host memory back to the system, at most every `every_s` seconds, and reports the peak.

    Why: a CPU training step allocates and frees tensors of sizes that change with every batch (unpadded tokens,
    masked positions). glibc keeps the freed heap memory for reuse, and the fragments never fit again: measured
    on BERT-mini at batch 64 (2-core EPYC), the resident memory grew from 2 to 6.5 GB in 10 minutes. malloc_trim
    returns it: the same run stayed at about 2.2 GB, at the same speed (59 sequences/s). A no-op without glibc."""

    def __init__(self, every_s: float = 10.0):
        import ctypes
        import ctypes.util

        self.every_s, self.last = every_s, time.perf_counter()
        try:
            self._trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
            self._trim = None

    def maybe_trim(self) -> None:
        if self._trim is not None and time.perf_counter() - self.last >= self.every_s:
            self._trim(0)
            self.last = time.perf_counter()

    @staticmethod
    def peak_gib() -> float:
        """This process's peak resident memory so far, GiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
        import resource
        import sys

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


class Meter:
    """What the log lines report: losses summed on the device between two log lines (no host sync per step), and
    throughput (sequences and model FLOPs) over the steps after the first `warmup_steps` of this run (start-up,
    compilation and cache warm-up are left out)."""

    def __init__(
        self, env: dist_env.DistEnv, warmup_steps: int = 0, peak_flops: float | None = None, num_losses: int = 1
    ):
        self.env, self.warmup_steps, self.peak = env, warmup_steps, peak_flops
        self.losses = torch.zeros(num_losses, dtype=torch.float64, device=env.device)
        self.attempts = 0  # optimizer steps attempted since the last flush (skipped ones included)
        self.steps = 0  # optimizer steps taken in this run
        self.run_start = self.start = time.perf_counter()
        self.sequences, self.run_sequences, self.flops = 0, 0, 0.0
        self.real = [0, 0]  # this rank's real (packed: each one) sequences and non-padding tokens, after warm-up
        self.run_real = [0, 0]  # the same over the whole run

    def add_flops(self, flops: float) -> None:
        """Model FLOPs of a micro-batch of this rank (for MFU, counting real tokens only)."""
        self.flops += flops

    def add_attempt(self, losses: torch.Tensor) -> None:
        self.losses += losses
        self.attempts += 1

    def step_taken(self, sequences: int, real: tuple[int, int] = (0, 0)) -> None:
        """One optimizer step of `sequences` rows (all ranks) was taken; `real`: the real sequences and tokens of
        this rank in it (a packed row holds several sequences; padding is not a token)."""
        self.steps += 1
        self.run_sequences += sequences
        self.run_real = [self.run_real[0] + real[0], self.run_real[1] + real[1]]
        if self.steps <= self.warmup_steps:  # still warming up: restart the clock
            self.restart_clock()
        else:
            self.sequences += sequences
            self.real = [self.real[0] + real[0], self.real[1] + real[1]]

    def restart_clock(self) -> None:
        """Time from now on (what ran since the warm-up was not training: a profile being summarised)."""
        self._sync()
        self.start, self.sequences, self.flops, self.real = time.perf_counter(), 0, 0.0, [0, 0]

    def _sync(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize()

    def mean_losses(self) -> list[float]:
        """Mean losses per attempted step since the last call, over every rank (the one host sync of a log step)."""
        losses = self.losses / max(self.attempts, 1)
        if self.env.distributed:
            torch.distributed.all_reduce(losses)
            losses /= self.env.world_size
        self.losses.zero_()
        self.attempts = 0
        return losses.tolist()

    def mfu(self) -> float | None:
        """Model FLOPs utilisation of this rank since the warm-up, where the device's peak is known."""
        if not (self.peak and self.sequences):
            return None
        return self.flops / (time.perf_counter() - self.start) / self.peak

    def elapsed(self) -> float:
        """Seconds since the run started (device synchronised)."""
        self._sync()
        return time.perf_counter() - self.run_start

    def real_rates(self) -> dict[str, float]:
        """Real sequences and tokens (all ranks) per second after the warm-up: with packing a row is several
        sequences, and padding is no work done; a run no longer than the warm-up is timed whole, as in
        sequences_per_second. One all-reduce in a distributed run: call it once, at the end."""
        whole = self.sequences == 0
        counts = torch.tensor(self.run_real if whole else self.real, dtype=torch.float64)
        if self.env.distributed:
            counts = counts.to(self.env.device)
            torch.distributed.all_reduce(counts)
        self._sync()
        seconds = max(time.perf_counter() - (self.run_start if whole else self.start), 1e-9)
        sequences, tokens = counts.tolist()
        return {
            "training_real_sequences_per_second": sequences / seconds,
            "training_real_tokens_per_second": tokens / seconds,
        }

    def sequences_per_second(self) -> float:
        """Sequences trained (all ranks) per second after the warm-up; a run no longer than the warm-up is
        timed whole, start-up included."""
        self._sync()
        if self.sequences == 0:
            return self.run_sequences / max(time.perf_counter() - self.run_start, 1e-9)
        return self.sequences / max(time.perf_counter() - self.start, 1e-9)


class RunLogger:
    """dllogger-style JSON lines (atomic_io.JsonLogger), TensorBoard scalars when the tensorboard package is installed
    (optional), and the tqdm progress bar; rank 0 only (`enabled`)."""

    def __init__(self, json_path: str | Path, tensorboard_dir: str | Path | None, enabled: bool, progress: bool = True):
        self.enabled, self.show_progress = enabled, progress and enabled
        self.json = atomic_io.JsonLogger(json_path, enabled=enabled)
        self.tensorboard = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is not a requirement
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tensorboard = SummaryWriter(str(tensorboard_dir))

    def log(self, step: Any, data: dict[str, Any]) -> None:
        self.json.log(step, data)
        if self.tensorboard is None or not isinstance(step, int):
            return
        for key, value in data.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tensorboard.add_scalar(key, value, step)

    def progress(self, total: int, initial: int = 0, desc: str | None = None, unit: str = "step"):
        """A tqdm bar (a disabled one off rank 0 or with the progress bar turned off)."""
        from tqdm import tqdm

        return tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            dynamic_ncols=True,
            mininterval=1,
            disable=not self.show_progress,
        )

    def close(self) -> None:
        self.json.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
