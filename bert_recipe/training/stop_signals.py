"""Stopping on a signal: SIGTERM (Slurm preemption, `scancel`, `timeout`), SIGUSR1 (`sbatch --signal`) or SIGINT
finish the optimizer step, write a checkpoint, and the entry script exits EXIT_STOPPED; every rank stops after the
same step (`StopRequest.agreed`).
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import torch

from bert_recipe.training import dist_env

EXIT_STOPPED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after its checkpoint; run again to resume
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopRequest:
    """SIGTERM (Slurm preemption, `scancel`, `timeout`), SIGUSR1 (`sbatch --signal`) or SIGINT (Ctrl-C) sets a
    flag; the loop checks it between optimizer steps, writes a checkpoint, and main() exits EXIT_STOPPED. A second
    SIGINT interrupts at once (KeyboardInterrupt), for a user who does not want to wait for the step."""

    SIGNALS = STOP_SIGNALS

    def __init__(self):
        self.requested = False
        self.signal_name: str | None = None  # the first stop signal received
        self._previous: dict[int, Any] = {}
        self._group = None  # the gloo process group of agreed()

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = self.signal_name or signal.Signals(signum).name

    def install(self) -> "StopRequest":
        with contextlib.suppress(ValueError):  # signal handlers can only be set from the main thread
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def agreed(self, env: dist_env.DistEnv) -> bool:
        """True when any rank was signalled: every rank stops after the same step.

        The vote is a MAX all-reduce of a CPU tensor over a gloo group (the default group on CPU; on GPUs a gloo
        group made at the first call, which every rank makes at the same point of the loop). Voting with a CUDA
        tensor over NCCL would need `.item()`, a host sync that drains the GPU's queue every step; the CPU vote
        only waits for the other ranks' CPUs, which run ahead of their GPUs anyway.
        """
        if not env.distributed:
            return self.requested
        if self._group is None:
            cpu = torch.distributed.get_backend() == "gloo"
            self._group = torch.distributed.group.WORLD if cpu else torch.distributed.new_group(backend="gloo")
        flag = torch.tensor([int(self.requested)])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return bool(flag.item())
