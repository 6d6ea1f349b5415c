"""Learning-rate schedules with a linear warm-up, as `torch.optim.lr_scheduler.LRScheduler` subclasses.

Every schedule is a closed-form function of the step, so a resumed run continues exactly:

    k         = scheduler.last_epoch = optimizer steps taken so far (call scheduler.step() after each
                optimizer step that was actually taken; a step skipped by the fp16 GradScaler is not counted)
    progress  = k / total_steps
    warm-up   : lr = base * progress / warmup                     while progress < warmup
    then      : lr = base * decay(progress)                       (per schedule, below)
    past end  : lr = 0                                            for k >= total_steps (never negative or NaN)

`warmup` is a proportion of total_steps in [0, 1] (NVIDIA's --warmup_proportion). The optimizer step number k
(0-based) uses the LR f(k): with warm-up the very first step has LR 0, as in Hugging Face's schedules. NVIDIA's
run_pretraining.py stepped its scheduler *before* the optimizer, so its step k used f(k + 1): the same curve shifted
by one step (its last step got LR 0 instead of its first).

Resume: `state_dict()` holds the step and the schedule's parameters (plain Python numbers, fine for
torch.load(weights_only=True)). `load_state_dict()` takes only the step from it: the schedule's parameters (base LR,
warm-up, total_steps, degree) stay this scheduler's own, i.e. the resumed command's, as in Hugging Face's Trainer
and torchtitan, so a run extended with a larger --max_steps continues along the new curve instead of sitting at
the old schedule's end (LR 0); `changes()` names what differs, for the log. It also writes the LR for the current
step into the optimizer, so the order in which optimizer and scheduler are restored does not matter.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

__all__ = [
    "PolyWarmUpScheduler",
    "LinearWarmUpScheduler",
    "ConstantWarmUpScheduler",
    "CosineWarmUpScheduler",
    "SCHEDULERS",
    "get_scheduler",
]


class _WarmUpScheduler(LRScheduler):
    """Linear warm-up over `warmup` * total_steps steps, then `_decay(progress)`; 0 from total_steps on."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int, last_epoch: int = -1):
        if not 0.0 <= warmup <= 1.0:
            raise ValueError(f"warmup is a proportion of total_steps in [0, 1], got {warmup}")
        if int(total_steps) != total_steps or total_steps < 1:
            raise ValueError(f"total_steps must be a positive integer, got {total_steps}")
        self.warmup = float(warmup)
        self.total_steps = int(total_steps)
        super().__init__(optimizer, last_epoch)

    def _decay(self, progress: float) -> float:
        """Multiplier of the base LR after warm-up, for warmup <= progress < 1."""
        raise NotImplementedError

    def lr_factor(self, step: int) -> float:
        """The multiplier of the base LR used by optimizer step `step` (0-based)."""
        progress = step / self.total_steps
        if progress >= 1.0:
            return 0.0
        if progress < self.warmup:
            return progress / self.warmup
        return self._decay(progress)

    def get_lr(self) -> list[float]:
        factor = self.lr_factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    _get_closed_form_lr = get_lr

    def changes(self, state_dict: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """{parameter: (the saved schedule's value, this one's)} for each schedule parameter that differs."""
        ours = {k: v for k, v in self.state_dict().items() if not k.startswith("_") and k != "last_epoch"}
        return {k: (state_dict[k], v) for k, v in ours.items() if k in state_dict and state_dict[k] != v}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from the saved step (last_epoch) on this scheduler's own schedule (see the module docstring)."""
        own = {k: v for k, v in self.__dict__.items() if k != "optimizer"}
        super().load_state_dict(state_dict)
        own["last_epoch"], own["_step_count"] = self.last_epoch, self._step_count
        self.__dict__.update(own)
        # Re-apply the LR of the restored step, whatever the optimizer was loaded with or reset to.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class PolyWarmUpScheduler(_WarmUpScheduler):
    """BERT pre-training (NVIDIA's schedule): warm-up, then lr = base * (1 - progress)^degree.

    As in NVIDIA's original, `progress` runs over the whole run (k / total_steps), not over the decay phase alone.
    So the LR does not reach `base` at the end of warm-up: it jumps from just below base down to
    base * (1 - warmup)^degree (e.g. 0.846 * base for phase 1's warmup 0.2843), then decays to 0 at total_steps.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup: float,
        total_steps: int,
        degree: float = 0.5,
        last_epoch: int = -1,
    ):
        self.degree = float(degree)
        super().__init__(optimizer, warmup, total_steps, last_epoch)

    def _decay(self, progress: float) -> float:
        return (1.0 - progress) ** self.degree


class LinearWarmUpScheduler(_WarmUpScheduler):
    """Fine-tuning: warm-up, then linear from base at the end of warm-up down to 0 at total_steps."""

    def _decay(self, progress: float) -> float:
        return (1.0 - progress) / (1.0 - self.warmup)  # warmup < progress < 1 here, so no division by 0


class ConstantWarmUpScheduler(_WarmUpScheduler):
    """Warm-up, then the base LR until total_steps (warmup=0: a plain constant LR)."""

    def _decay(self, progress: float) -> float:
        return 1.0


class CosineWarmUpScheduler(_WarmUpScheduler):
    """Warm-up, then a half cosine from base at the end of warm-up to 0 at total_steps:

        lr = base * 0.5 * (1 + cos(pi * (progress - warmup) / (1 - warmup)))

    so it is 0.5 * base half-way through the decay phase. NVIDIA's original computed
    `0.5 * (1 + torch.cos(math.pi + progress))`: `pi + progress` instead of `pi * progress` gives a tiny rising
    curve starting near 0 rather than a decay from base (and torch.cos of a Python float raises a TypeError).
    """

    def _decay(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * (progress - self.warmup) / (1.0 - self.warmup)))


SCHEDULERS: dict[str, type[_WarmUpScheduler]] = {
    "poly": PolyWarmUpScheduler,
    "linear": LinearWarmUpScheduler,
    "constant": ConstantWarmUpScheduler,
    "cosine": CosineWarmUpScheduler,
}


def get_scheduler(
    name: str, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int, **kwargs: Any
) -> LRScheduler:
    """Build a schedule by name ("poly", "linear", "constant", "cosine"); kwargs go to it (e.g. degree=)."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](optimizer, warmup, total_steps, **kwargs)
