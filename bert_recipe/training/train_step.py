"""One optimizer step, the same in pre-training (trainer.Trainer) and fine-tuning (recipe.fit).

Read top to bottom: `grad_sync` (DDP's no_sync during accumulation), `forward_backward` over one micro-batch,
`optimizer_step` with the one fp16-overflow rule (unscale; a non-finite gradient skips the step), the
`DivergenceWatch` that stops a run whose loss is no longer finite (DivergedError: one line instead of NaN weights),
and `StepRule`, the step both loops take, built from them (accumulate, watch the loss, step or skip, schedule).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import torch

from bert_recipe.io import cli
from bert_recipe.training.cuda_graphs import allocate_grads
from bert_recipe.training.precision_policy import Precision


def grad_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() (gradients accumulate locally, no all-reduce) unless `sync` or the model is not DDP."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if sync or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def forward_backward(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    loss_fn: LossFn,
    precision: Precision,
    accum: int,
    sync: bool,
) -> torch.Tensor:
    """Forward and backward of one micro-batch; gradients accumulate in .grad (all-reduced unless not `sync`).

    loss_fn(model, batch) returns the loss to minimise, or a 1-D tensor whose element 0 is that loss and whose
    others are logged beside it (pre-training: total, MLM, NSP). Returns them detached, float64, divided by
    `accum` (so the group's sum is its mean), still on the device.
    """
    with grad_sync(model, sync):  # no_sync must cover the forward and the backward
        with precision.autocast():  # autocast for the forward only, as PyTorch recommends
            losses = loss_fn(model, batch).reshape(-1)
        precision.scaler.scale(losses[0] / accum).backward()  # the scaler is a no-op unless fp16
    return losses.detach().double() / accum


def optimizer_step(optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
    """Take the optimizer step unless fp16 gradients overflowed. Returns True when the step was taken.

    The one overflow rule: fp16 unscales the gradients; if any is inf/NaN the step is skipped (the GradScaler
    then halves a dynamic scale; a static one stays). fp32/bf16 always step.
    """
    scaler = precision.scaler
    if not scaler.is_enabled():
        optimizer.step()
        return True
    scaler.unscale_(optimizer)  # also records found-inf for scaler.update()
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    finite = bool(torch.stack(torch._foreach_norm(grads)).isfinite().all())  # one host sync
    if finite:
        optimizer.step()
    scaler.update(precision.static_loss_scale)
    return finite


class DivergedError(cli.InputError):
    """The loss became inf/NaN, or fp16 overflowed step after step."""


class DivergenceWatch:
    """The first optimizer step whose loss was not finite, kept on the device: recording it costs no host sync.
    `every_step` (CPU, where a sync costs nothing) says the loop should read it at once, before the optimizer step
    lets NaN gradients into the weights; on GPUs the loop reads it at log steps and before every checkpoint write,
    and the step it names is still the one where the loss went bad."""

    def __init__(self, device: torch.device, where: str, advice: str, consequence: str):
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.every_step = device.type != "cuda"
        self.where, self.advice, self.consequence = where, advice, consequence

    def record(self, loss: torch.Tensor, step: int) -> None:
        bad = ~torch.isfinite(loss)
        self.first_bad = torch.where((self.first_bad < 0) & bad, torch.full_like(self.first_bad, step), self.first_bad)

    def first(self) -> int | None:
        """The step (one host sync), or None while every loss was finite."""
        step = int(self.first_bad)
        return None if step < 0 else step

    def check(self) -> None:
        """Raise DivergedError once a loss was non-finite: "the loss became non-finite at <where> <step>: training
        diverged (<advice>); <consequence>" (one host sync)."""
        bad = self.first()
        if bad is not None:
            raise DivergedError(
                f"the loss became non-finite at {self.where} {bad}: training diverged "
                f"({self.advice}); {self.consequence}"
            )


def weights_finite(model: torch.nn.Module) -> bool:
    """Every parameter finite (one host sync): checked before a checkpoint is written."""
    norms = torch._foreach_norm([p.detach() for p in model.parameters()])
    return bool(torch.stack(norms).isfinite().all())


class StepRule:
    """The one optimizer-step rule of pre-training (trainer.Trainer) and fine-tuning (`fit`).

    One call takes a group of micro-batches to one optimizer step: each micro-batch's forward and backward
    (gradients all-reduced on the group's last one, or on every one with `sync_every_micro_batch`), the divergence
    watch on the group's loss, the hooks, then the update unless fp16 gradients overflowed. The schedule steps only
    with the optimizer, so `taken` (what --max_steps counts in every script) is the schedule's step count; a
    skipped step's micro-batches are consumed all the same (as NVIDIA's loop). More than MAX_CONSECUTIVE_OVERFLOWS
    skipped steps in a row mean the loss diverged: DivergedError.

    `stable_grads` (steps replayed as CUDA graphs, cuda_graphs.py): every parameter has a zero `.grad` before the
    first micro-batch, and the gradients are zeroed in place after each step instead of freed, so that no `.grad`
    is ever a graph's output that the next replay overwrites. The sums are the same numbers: 0 + g = g exactly.
    """

    MAX_CONSECUTIVE_OVERFLOWS = 50

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        scheduler,
        precision: Precision,
        watch: DivergenceWatch,
        *,
        sync_every_micro_batch: bool = False,
        stable_grads: bool = False,
    ):
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.precision, self.watch, self.sync_every_micro_batch = precision, watch, sync_every_micro_batch
        self.stable_grads = stable_grads
        self.taken = 0  # optimizer steps taken through this rule
        self.consecutive_skips = 0
        self.lr = optimizer.param_groups[0]["lr"]  # the rate the last step used

    def __call__(
        self,
        micro_batches: Iterable[dict[str, Any]],
        accum: int,
        number: int,
        before_update: Callable[[], None] = lambda: None,
    ) -> tuple[bool, torch.Tensor]:
        """One optimizer step over `accum` micro-batches (on the device, read lazily: the next one may still be
        loading while this one runs); `number` names the step in a divergence error. Returns (taken, the group's
        mean losses [L], float64 on the device)."""
        losses = None
        if self.stable_grads:
            allocate_grads(self.model)  # once: afterwards every .grad exists and is zeroed in place
        for i, batch in enumerate(micro_batches):
            sync = i == accum - 1 or self.sync_every_micro_batch
            micro = forward_backward(self.model, batch, self.loss_fn, self.precision, accum, sync)
            losses = micro if losses is None else losses + micro
        if not self.precision.scaler.is_enabled():  # fp16 overflows are the GradScaler's: those steps are skipped
            self.watch.record(losses[0], number)
            if self.watch.every_step:  # on a CPU, before NaN gradients reach the weights
                self.watch.check()
        before_update()
        self.lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses
        taken = optimizer_step(self.optimizer, self.precision)
        self.optimizer.zero_grad(set_to_none=not self.stable_grads)
        if not taken:
            self.consecutive_skips += 1
            if self.consecutive_skips > self.MAX_CONSECUTIVE_OVERFLOWS:
                raise DivergedError(
                    f"{self.MAX_CONSECUTIVE_OVERFLOWS} fp16 overflows in a row at step {number}: the "
                    "loss diverged (lower --learning_rate, or use --precision bf16)"
                )
            return False, losses
        self.consecutive_skips = 0
        self.scheduler.step()
        self.taken += 1
        return True, losses


def accumulation_groups(batches: Iterable[dict], accumulation: int) -> Iterator[list[dict]]:
    """Consecutive micro-batches in groups of `accumulation` (the last group of an epoch may be shorter)."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == accumulation:
            yield group
            group = []
    if group:
        yield group


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every value (tensors, bert_padding.Unpadded) moved with non_blocking copies."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
