"""The shared training core of pre-training (trainer.py) and the fine-tuning recipe (finetuning.py).

Read top to bottom:
- precision and parallelism: `apply_parallelism_and_precision`, the one ordered function that turns a bare model
  into what the loop trains (TF32, activation checkpointing, device, DDP, its comm hook, torch.compile) and decides
  how its maths runs (precision.py's `Precision`: autocast, and a GradScaler for fp16);
- one optimizer step: `grad_sync` (DDP's no_sync during accumulation), `forward_backward` over one micro-batch,
  `optimizer_step` with the one fp16-overflow rule (unscale; a non-finite gradient skips the step), and `StepRule`,
  the step of both loops built from them (accumulate, watch the loss, step or skip, schedule);
- bookkeeping: `Meter` keeps the losses on the device until a log step (no host sync per micro-batch) and measures
  throughput and MFU; `RunLogger` writes dllogger-keyed JSON lines, TensorBoard scalars and the tqdm bar (rank 0);
- `CheckpointManager`: ckpt_<step>.pt files written atomically, the newest N kept, the newest readable one found
  on resume (falling back past a damaged file), interrupted writes cleaned up;
- `StopRequest`: SIGTERM / SIGUSR1 / SIGINT finish the step, write a checkpoint and exit EXIT_STOPPED;
- `DivergenceWatch` and `DivergedError`: a non-finite loss stops training with one line instead of going on with
  NaN weights;
- `fit`: the fine-tuning loop (epochs of micro-batches in accumulation groups, optimizer and schedule, logging),
  which the fine-tuning recipe (finetuning.py) calls with a task's batches and loss; pre-training has its own loop
  (steps, phases, exact resume) built from the same parts: trainer.Trainer.
The fine-tuning scripts' shared flags, model-file checks and prediction loop are finetuning.py's.
"""
from __future__ import annotations

import contextlib
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

import atomic_io
import cli
import dist_env
from precision import Precision, configure_tf32, resolve

# --------------------------------------------------------------------------------------------------------------
# Precision and parallelism, applied in one place


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's switch for "no buffer broadcast before each forward": `forward_sync_buffers` since torch 2.13, which
    deprecates `broadcast_buffers` (still the only name in older torch, e.g. an NGC container's). The new switch
    still syncs buffers once at wrap time: harmless, BERT's buffers (position ids) are equal on every rank."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def apply_parallelism_and_precision(model: torch.nn.Module, env: dist_env.DistEnv, precision: str = "auto", *,
                                    loss_scale: float = 0.0, init_loss_scale: float = 2.0 ** 16,
                                    checkpoint_activations: bool = False, allreduce_fp16: bool = False,
                                    compile: bool | None = False, compile_mode: str = "default",
                                    compile_scope: str = "layers") -> tuple[torch.nn.Module, Precision]:
    """Turn a bare model into the module the loop trains, and decide how its maths runs. The order matters; each
    step says why it comes where it does. Returns (the model to call, Precision); keep the bare model for saving.

    precision: --precision (auto picks from the hardware, see precision.resolve); loss_scale > 0: a static
    fp16 loss scale, else dynamic from init_loss_scale; allreduce_fp16: all-reduce gradients in 16 bits;
    compile: True/False, or None for "on a GPU only"; compile_mode: torch.compile's mode ("reduce-overhead": CUDA
    graphs); compile_scope: "layers" compiles each region of modeling.COMPILE_REGIONS in place (regional
    compilation), "model" wraps the whole model (it then has `_orig_mod`). `compiled(model)` tells either.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if compile_scope not in COMPILE_SCOPES:
        raise ValueError(f"compile_scope {compile_scope!r} is not one of {COMPILE_SCOPES}")
    cuda = env.device.type == "cuda"
    if compile is None:  # on GPUs, where it was measured faster; not on CPUs, where compiling costs minutes
        compile = cuda
    kwargs = {} if compile_mode == "default" else {"mode": compile_mode}
    # 0. Which precision runs: auto follows the hardware (bf16 only where it is native; precision.resolve).
    choice = resolve(precision, env.device)
    # 1. TF32: fp32 matmuls (the tf32 run, and what autocast leaves in fp32) on tensor cores, on GPUs that have
    #    them, unless fp32 was asked for by name; a no-op on CPU.
    configure_tf32(cuda and choice.name != "fp32")
    # 2. Activation checkpointing is a property of the bare encoder: set it before anything wraps the module.
    if checkpoint_activations:
        model.bert.encoder.checkpoint_activations = True
    # 3. Regional compilation: each encoder layer (and the embeddings and the masked-LM head) is compiled in place,
    #    before DDP sees the module. The 24 layers of BERT-large share one graph, so compiling costs one layer's
    #    time instead of the whole model's (on this 2-core CPU: 44 s against 134 s for BERT-large), and the
    #    data-dependent work between regions (unpadding's nonzero, the sequences' lengths) stays in eager mode, so
    #    the unpadded path compiles too (its layers see [T, H]: recompiled once with T symbolic). In place, the
    #    state dict keeps its names.
    if compile and compile_scope == "layers":
        from modeling import COMPILE_REGIONS

        for module in model.modules():
            if isinstance(module, COMPILE_REGIONS):
                module.compile(**kwargs)
    # 4. Weights to the device, and they stay fp32: autocast casts per op, the optimizer updates fp32 weights.
    model.to(env.device)
    # 5. DDP: broadcasts rank 0's weights now, and averages gradients over ranks in buckets during backward.
    #    Gradients are views into the buckets (no copy); no buffers need broadcasting in BERT at each forward.
    if env.distributed:
        model = DDP(model, device_ids=[env.local_rank] if cuda else None, gradient_as_bucket_view=True,
                    **_no_forward_buffer_sync())
        # 6. The comm hook compresses each bucket to 16 bits for the all-reduce (and back): half the traffic.
        #    bf16 (fp32's range) when training in bf16 on GPUs; PyTorch's bf16 hook needs NCCL, so gloo uses fp16.
        if allreduce_fp16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.bf16_compress_hook if choice.name == "bf16" and cuda \
                else default_hooks.fp16_compress_hook
            model.register_comm_hook(None, hook)
    # 7. Whole-model compilation (compile_scope "model") goes around DDP, so that its DDPOptimizer splits the graph
    #    at bucket boundaries and the all-reduces still overlap the backward pass. Unpad "auto" then keeps the
    #    padded path: static shapes, one graph.
    if compile and compile_scope == "model":
        model = torch.compile(model, **kwargs)
    # 8. Loss scaling for fp16 only (its range is narrow); bf16 has fp32's range and needs none.
    return model, Precision.for_training(choice, env.device, loss_scale, init_loss_scale)


COMPILE_SCOPES = ("layers", "model")


def compiled(model: torch.nn.Module) -> str | None:
    """How `model` (as apply_parallelism_and_precision returned it) is compiled: "model", "layers" or None."""
    if hasattr(model, "_orig_mod"):
        return "model"
    if any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()):
        return "layers"
    return None


# --------------------------------------------------------------------------------------------------------------
# One optimizer step


def grad_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() (gradients accumulate locally, no all-reduce) unless `sync` or the model is not DDP."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if sync or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def forward_backward(model: torch.nn.Module, batch: dict[str, torch.Tensor], loss_fn: LossFn,
                     precision: Precision, accum: int, sync: bool) -> torch.Tensor:
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

    def __init__(self, device: torch.device, where: str = "step", advice: str = "lower --learning_rate",
                 consequence: str = "no checkpoint was written from that step on"):
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.every_step = device.type != "cuda"
        self.where, self.advice, self.consequence = where, advice, consequence

    def record(self, loss: torch.Tensor, step: int) -> None:
        bad = ~torch.isfinite(loss)
        self.first_bad = torch.where((self.first_bad < 0) & bad, torch.full_like(self.first_bad, step),
                                     self.first_bad)

    def first(self) -> int | None:
        """The step (one host sync), or None while every loss was finite."""
        step = int(self.first_bad)
        return None if step < 0 else step

    def check(self) -> None:
        """Raise DivergedError once a loss was non-finite: "the loss became non-finite at <where> <step>: training
        diverged (<advice>); <consequence>" (one host sync)."""
        bad = self.first()
        if bad is not None:
            raise DivergedError(f"the loss became non-finite at {self.where} {bad}: training diverged "
                                f"({self.advice}); {self.consequence}")


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
    """

    MAX_CONSECUTIVE_OVERFLOWS = 50

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, optimizer: torch.optim.Optimizer, scheduler,
                 precision: Precision, watch: DivergenceWatch, *, sync_every_micro_batch: bool = False):
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.precision, self.watch, self.sync_every_micro_batch = precision, watch, sync_every_micro_batch
        self.taken = 0  # optimizer steps taken through this rule
        self.consecutive_skips = 0
        self.lr = optimizer.param_groups[0]["lr"]  # the rate the last step used

    def __call__(self, micro_batches: Iterable[dict[str, Any]], accum: int, number: int,
                 before_update: Callable[[], None] = lambda: None) -> tuple[bool, torch.Tensor]:
        """One optimizer step over `accum` micro-batches (on the device, read lazily: the next one may still be
        loading while this one runs); `number` names the step in a divergence error. Returns (taken, the group's
        mean losses [L], float64 on the device)."""
        losses = None
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
        self.optimizer.zero_grad(set_to_none=True)
        if not taken:
            self.consecutive_skips += 1
            if self.consecutive_skips > self.MAX_CONSECUTIVE_OVERFLOWS:
                raise DivergedError(f"{self.MAX_CONSECUTIVE_OVERFLOWS} fp16 overflows in a row at step {number}: the "
                                    "loss diverged (lower --learning_rate, or use --precision bf16)")
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


# --------------------------------------------------------------------------------------------------------------
# Bookkeeping: losses, throughput, logs

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

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2 ** 30 if sys.platform == "darwin" else 2 ** 20)


class Meter:
    """What the log lines report: losses summed on the device between two log lines (no host sync per step), and
    throughput (sequences and model FLOPs) over the steps after the first `warmup_steps` of this run (start-up,
    compilation and cache warm-up are left out)."""

    def __init__(self, env: dist_env.DistEnv, warmup_steps: int = 0, peak_flops: float | None = None,
                 num_losses: int = 1):
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
        return {"training_real_sequences_per_second": sequences / seconds,
                "training_real_tokens_per_second": tokens / seconds}

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

    def __init__(self, json_path: str | Path, tensorboard_dir: str | Path | None, enabled: bool,
                 progress: bool = True):
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

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, mininterval=1,
                    disable=not self.show_progress)

    def close(self) -> None:
        self.json.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: ckpt_<step>.pt


class CheckpointManager:
    """The ckpt_<step>.pt files of one folder. `owns(step)` says which of them belong to this run (pre-training:
    the current phase's), the ones rotation and resume look at. Writes are atomic (atomic_io.atomic_torch_save: a
    temporary file, fsync, rename), reads use torch.load(weights_only=True), so a damaged or hostile file can
    neither run code nor be mistaken for a complete one."""

    NAME = re.compile(r"^ckpt_(\d+)\.pt$")

    def __init__(self, folder: str | Path, keep: int = 3, owns: Callable[[int], bool] = lambda step: True,
                 log: Callable[[str], None] = lambda msg: None):
        self.folder, self.keep, self.owns, self.log = Path(folder), keep, owns, log

    def all(self) -> dict[int, Path]:
        """step -> path of every ckpt_<step>.pt in the folder, by step (interrupted writes are not listed)."""
        if not self.folder.is_dir():
            return {}
        found = {int(m.group(1)): p for p in self.folder.iterdir() if (m := self.NAME.match(p.name))}
        return dict(sorted(found.items()))

    def mine(self) -> dict[int, Path]:
        return {s: p for s, p in self.all().items() if self.owns(s)}

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        from checkpoint_io import load_pt

        return load_pt(path)

    def newest_readable(self, required: set[str]) -> dict[str, Any] | None:
        """The newest of this run's checkpoints that loads and holds the `required` keys (older ones are tried
        when the newest is damaged, with a message for each), or None when there is none."""
        found = self.mine()
        for step in reversed(found):
            try:
                ckpt = self.read(found[step])
            except Exception as e:  # truncated or corrupted by something outside our atomic writes: fall back
                self.log(f"{cli.describe_error(e)}; trying an older one")
                continue
            if required <= set(ckpt):
                return ckpt
            self.log(f"checkpoint {found[step]} is incomplete (no training state); trying an older one")
        return None

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        """Write ckpt_<step>.pt atomically, then drop this run's oldest beyond `keep` (never the new one)."""
        path = self.folder / f"ckpt_{step}.pt"
        atomic_io.atomic_torch_save(payload, path)
        others = [p for s, p in self.mine().items() if s != step]
        for old in others[:max(len(others) - (self.keep - 1), 0)]:
            old.unlink(missing_ok=True)
        self.log(f"saved {path}")
        return path

    def remove_interrupted_writes(self) -> None:
        """Temporary files left by a write that was killed (atomic_io.atomic_open names them .<name>.*.tmp)."""
        for p in self.folder.glob(".ckpt_*.pt.*.tmp"):
            p.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# Stopping on a signal

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


# --------------------------------------------------------------------------------------------------------------
# The fine-tuning loop


@dataclass
class FitResult:
    steps: int  # optimizer steps taken (an fp16 overflow's skipped step is not one)
    loss: float  # mean training loss over the last log window
    seconds: float
    sequences: int  # sequences trained, all processes


def fine_tuning_watch(device: torch.device) -> DivergenceWatch:
    """Fine-tuning with a non-finite loss ends with this line, before its NaN weights are evaluated or saved as a
    result."""
    return DivergenceWatch(device, "fine-tuning step", "lower --learning_rate, or try --precision fp32",
                           "nothing was evaluated or saved")


def fit(rule: StepRule, epoch_batches: Callable[[int], Iterable[dict[str, torch.Tensor]]], env: dist_env.DistEnv,
        logger: RunLogger, *, total_steps: int, accumulation: int, log_freq: int) -> FitResult:
    """Train `rule.model` (the DDP-wrapped one when distributed) until `total_steps` optimizer steps are taken.

    epoch_batches(epoch) yields this process's micro-batches of one epoch (CPU tensors); groups of `accumulation`
    of them make one optimizer step (StepRule: gradients all-reduced on the group's last micro-batch only; an fp16
    overflow skips the step and the schedule and is not counted). The loss stays on the device until a log step:
    one host sync every `log_freq` steps. A non-finite loss (fp32/bf16) raises DivergedError naming its step
    (fine_tuning_watch): on a CPU before that step's optimizer update, on a GPU at the next log step.
    """
    meter, watch = Meter(env), rule.watch
    bar = logger.progress(total_steps, desc="train")
    epoch, last_loss = 0, float("nan")
    rule.model.train()
    while rule.taken < total_steps:
        for group in accumulation_groups(epoch_batches(epoch), accumulation):
            taken, losses = rule((to_device(b, env.device) for b in group), len(group), rule.taken + 1)
            meter.add_attempt(losses[:1])
            if not taken:
                continue  # fp16 overflow: the loss scale halved, nothing else moved
            meter.step_taken(sum(len(b["input_ids"]) for b in group) * env.world_size)
            step = rule.taken
            bar.update(1)
            if step % log_freq == 0 or step == total_steps:
                watch.check()  # on a GPU, read at log steps only: no host sync per step
                last_loss = meter.mean_losses()[0]
                logger.log(step, {"loss": last_loss, "learning_rate": rule.lr, "epoch": epoch,
                                  "loss_scale": rule.precision.loss_scale,
                                  "sequences_per_second": meter.run_sequences / max(meter.elapsed(), 1e-9)})
                bar.set_postfix(loss=f"{last_loss:.4f}")
            if step >= total_steps:
                break
        epoch += 1
    bar.close()
    return FitResult(steps=rule.taken, loss=last_loss, seconds=meter.elapsed(), sequences=meter.run_sequences)
