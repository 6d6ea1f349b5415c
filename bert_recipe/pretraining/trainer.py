"""The pre-training Trainer: BERT's masked LM + next-sentence prediction, step by step, resumable to the bit.

    parts = TrainingParts(model, raw_model, optimizer, scheduler, precision)
    trainer = Trainer(cfg, env, parts, data, logger=logger, stop=stop, validator=validator)
    if resume is not None:
        trainer.load_state_dict(resume)      # last: it restores the RNG states too
    summary = trainer.fit()

run_pretraining.py builds the parts from its flags (pretraining/config.py) and calls this. What fine-tuning shares
with it lives in modules named after it: the optimizer step (train_step.StepRule), the meter and logger (meter.py),
checkpoint files (checkpoint_io.CheckpointManager), stop signals (stop_signals.py); validation.Validator evaluates
beside the trainer.

Steps and phases. `step` counts optimizer steps actually taken in the current phase: it drives the LR schedule
and --max_steps. An fp16 step whose gradients overflowed is skipped: the weights, optimizer, schedule and `step`
do not move, the loss scale halves, but its micro-batches ARE consumed (the data position moves on, as in NVIDIA's
loop). Phase 1 names its checkpoints ckpt_<step>.pt. Phase 2 (--phase2 --phase1_end_step N) starts from the
weights of phase 1's ckpt_N.pt (or --init_checkpoint) with a fresh optimizer, grad scaler and the phase-2
schedule over its own --max_steps; its checkpoints and log lines continue the global count: ckpt_<N + step>.pt
(NVIDIA's naming). So a folder holds phase 1 as ckpt_1..ckpt_N and phase 2 above N; phase 2 never deletes
phase 1's checkpoints.

Loss. As NVIDIA's: per micro-batch, the mean MLM cross-entropy over its masked positions plus the NSP
cross-entropy, divided by the accumulation steps; DDP averages the ranks. (So 2 processes equal 1 exactly when the
ranks hold equally many masked positions, as in NVIDIA's recipe.)

Checkpoints (ckpt_<step>.pt, torch.load(weights_only=True) safe, written by rank 0 through a temporary file, fsync
and rename): `Trainer.state_dict()` is the payload: model (Hugging Face names, what checkpoint_io.from_pretrained
reads), config, optimizer, scheduler, grad scaler, every RNG state of every rank, the data position, phase and
step. Every --num_steps_per_checkpoint steps, at the end, and when a stop signal ended the loop early; the newest
--keep_checkpoints of the phase are kept. `load_state_dict` continues from one: with the same number of processes
the run continues bit for bit as if never interrupted; with another number the weights, optimizer, schedule and
data position continue exactly, and the dropout RNG is re-seeded.

Logging (rank 0), every --log_freq steps: average_loss, mlm_loss, nsp_loss, learning_rate, skipped_steps,
loss_scale, phase (and mfu on a known GPU, from model FLOPs of real, non-padding tokens); the validator's numbers
every --eval_steps and at the end; `fit` returns the FINAL line's numbers.

Errors are typed (ResumeError, DivergedError: cli.InputError; CheckpointWriteError: OSError); the entry script's
main() turns them into its one line.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from bert_padding import host_unpad_info, packed_layout
from bert_recipe.io import cli
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.checkpoint_io import REDUNDANT_KEYS, CheckpointManager, load_checkpoint_state
from bert_recipe.pretraining.config import PretrainConfig
from bert_recipe.pretraining.data_stream import PretrainingData, ResumeError
from bert_recipe.pretraining.shard_format import PACKED_KEY
from bert_recipe.pretraining.validation import describe
from bert_recipe.training import dist_env
from bert_recipe.training.cuda_graphs import fixed_rows, graph_report, sequence_slots, without_graphs
from bert_recipe.training.meter import HostMemory, Meter, RunLogger, peak_flops
from bert_recipe.training.parallelize import compiled
from bert_recipe.training.precision_policy import Precision
from bert_recipe.training.profiling import StepProfiler
from bert_recipe.training.stop_signals import StopRequest
from bert_recipe.training.train_step import DivergedError, DivergenceWatch, StepRule, to_device, weights_finite
from modeling import flops_per_sequence
from optimization import load_state_keeping_hyperparameters


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder we may not write); the atomic write left the
    previous checkpoints as they were."""


# ---------------------------------------------------------------------------------------------------------------
# The loss and what a micro-batch is worth


def pretraining_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor], nsp: bool = True) -> torch.Tensor:
    """[3]: the loss to minimise (MLM + NSP, or MLM alone with nsp=False), the MLM loss and the NSP loss of one
    micro-batch."""
    out = model(**batch)  # modeling.PreTrainingOutputWithLoss
    # Without NSP the head still takes part with a zero weight: every parameter gets a gradient (zeros), so DDP's
    # reducer, which expects one for each, needs no find_unused_parameters.
    loss = out.loss if nsp else out.mlm_loss + 0.0 * out.nsp_loss
    return torch.stack([loss, out.mlm_loss, out.nsp_loss])


def batch_flops(config, batch: dict[str, torch.Tensor]) -> float:
    """Model FLOPs of one micro-batch of this rank, counting only real (non-padding) tokens (for MFU). Packed rows
    count per sequence (attention is within each one): the same FLOPs as those sequences unpacked."""
    masked = (batch["masked_lm_positions"] > 0).sum(1).double()  # [B]
    if "next_sentence_positions" not in batch:
        lengths = batch["attention_mask"].sum(1).double()  # [B]
        return float(flops_per_sequence(config, lengths, masked).sum())

    starts = batch["next_sentence_positions"]
    lengths = packed_layout(batch["attention_mask"], starts, block_mask=False).lengths.double()  # [B, K]
    encoders = torch.where(lengths > 0, flops_per_sequence(config, lengths, 0), 0.0).sum()  # each sequence's own
    heads = flops_per_sequence(config, 0, masked) - flops_per_sequence(config, 0, 0)  # [B]: the row's MLM slots
    return float(encoders + heads.sum())


def real_counts(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Real sequences (each one of a packed row) and non-padding tokens of a micro-batch, read on the host before
    it moves to the device: counting them costs no sync."""
    labels = batch["next_sentence_labels"]
    sequences = int((labels >= 0).sum()) if labels.dim() == 2 else len(labels)  # packed: -1 in unused slots
    return sequences, int(batch["attention_mask"].sum())


# ---------------------------------------------------------------------------------------------------------------
# The phase's checkpoints, and which one a run resumes from


def checkpoint_manager(cfg: PretrainConfig, log: Callable[[str], None] = lambda msg: None) -> CheckpointManager:
    """The manager of --output_dir's checkpoints that belong to this phase: steps up to --max_steps in phase 1,
    steps after --phase1_end_step in phase 2 (so re-running phase 1 with --resume_from_checkpoint after phase 2
    began finds phase 1's last one, and phase 2 never rotates phase 1's away)."""
    c = cfg.checkpoint
    owns = (lambda step: step > c.phase1_end_step) if c.phase2 else (lambda step: step <= cfg.training.max_steps)
    return CheckpointManager(c.output_dir, c.keep_checkpoints, owns, log)


def list_checkpoints(folder: str | Path) -> dict[int, Path]:
    """step -> path of every ckpt_<step>.pt in `folder`."""
    return CheckpointManager(folder).all()


def find_resume_checkpoint(cfg: PretrainConfig, log) -> dict[str, Any] | None:
    """The checkpoint to continue from (--resume_step's, or the newest that loads), or None to start fresh."""
    c = cfg.checkpoint
    manager = checkpoint_manager(cfg, log)
    found = manager.mine()
    if c.resume_step != -1:
        if c.resume_step not in found:
            raise ResumeError(
                f"--resume_step {c.resume_step}: {c.output_dir}/ckpt_{c.resume_step}.pt is not "
                f"a checkpoint of this phase (found steps {list(found) or 'none'})"
            )
        return manager.read(found[c.resume_step])
    ckpt = manager.newest_readable({"model", "optimizer", "data", "step"})
    if ckpt is None and found:  # never a silent fresh start over a run's damaged checkpoints
        raise ResumeError(
            f"--resume_from_checkpoint: none of this phase's checkpoints in {c.output_dir} can be "
            f"read ({', '.join(p.name for p in found.values())}): restore a good one, or move them "
            "away to start afresh"
        )
    return ckpt


def refuse_used_output_dir(cfg: PretrainConfig) -> None:
    """A training run without --resume_from_checkpoint must not mix its checkpoints into another run's."""
    found = checkpoint_manager(cfg).mine()
    if found and not cfg.checkpoint.resume_from_checkpoint:
        names = ", ".join(p.name for p in list(found.values())[-3:])
        raise ResumeError(
            f"--output_dir {cfg.checkpoint.output_dir} already holds checkpoints ({names}): pass "
            "--resume_from_checkpoint to continue that run, or choose an empty folder"
        )


def gather_objects(obj: Any, env: dist_env.DistEnv) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (a collective: every rank must call it)."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The trainer


@dataclass
class TrainState:
    phase: int
    step: int = 0  # optimizer steps taken in this phase (drives the schedule and --max_steps)
    step_offset: int = 0  # 0 in phase 1, phase1_end_step in phase 2: names and logs use step_offset + step
    skipped_steps: int = 0  # fp16 overflow steps skipped in this phase

    @property
    def global_step(self) -> int:
        return self.step_offset + self.step


def pretraining_watch(device: torch.device) -> DivergenceWatch:
    """A pre-training run whose loss is no longer finite ends with this line; no checkpoint holds its weights."""
    return DivergenceWatch(device, "step", "lower --learning_rate", "no checkpoint was written from that step on")


@dataclass
class TrainingParts:
    """What a pre-training run trains and how (run_pretraining.py builds them from its flags)."""

    model: torch.nn.Module
    """the module the steps call: `raw_model` wrapped by DDP / torch.compile (apply_parallelism_and_precision)"""
    raw_model: torch.nn.Module
    """the bare BertForPreTraining: saved and evaluated"""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    """the learning-rate schedule (schedulers.py), stepped once per optimizer step taken"""
    precision: Precision


Hook = Callable[["Trainer"], None]


class Trainer:
    """Holds what a pre-training run trains and how: the model (`raw_model` bare, for saving and evaluating;
    `model` wrapped by DDP / torch.compile, for the steps), optimizer, schedule, precision, the data stream (whose
    position the checkpoints store), the meter, the logger, the stop request and the validator.

    `hooks` run after the backward pass of every optimizer step, before the step is taken: the place to inspect or
    break gradients from outside the loop (run_pretraining.py installs --debug_inject_inf_at_step there)."""

    def __init__(
        self,
        cfg: PretrainConfig,
        env: dist_env.DistEnv,
        parts: TrainingParts,
        data: PretrainingData,
        *,
        logger: RunLogger,
        stop: StopRequest,
        validator=None,
        log: Callable[[str], None] = lambda msg: None,
    ):
        self.cfg, self.env, self.log = cfg, env, log
        self.model, self.raw_model = parts.model, parts.raw_model
        self.optimizer, self.scheduler, self.precision = parts.optimizer, parts.scheduler, parts.precision
        # Steps replayed as CUDA graphs (--compile_mode reduce-overhead, compiled) need stable gradient buffers and
        # evaluation without graphs (cuda_graphs.py); on a CPU the mode compiles without graphs, and the same rules
        # hold (the suite tests them there).
        self.graph_steps = cfg.parallelism.compile_mode == "reduce-overhead" and compiled(parts.model) is not None
        self.cuda_graphs = self.graph_steps and env.device.type == "cuda"
        # fp16 overflows are the GradScaler's (their steps are skipped); other non-finite losses stop the run.
        self.rule = StepRule(
            parts.model,
            functools.partial(pretraining_losses, nsp=not cfg.model.no_nsp),
            parts.optimizer,
            parts.scheduler,
            parts.precision,
            pretraining_watch(env.device),
            # Gradients are all-reduced after every micro-batch, or with
            # --allreduce_post_accumulation only after the last one (DDP's no_sync on the others).
            sync_every_micro_batch=not cfg.parallelism.allreduce_post_accumulation,
            stable_grads=self.graph_steps,
        )
        self.data, self._batches = data, None  # the stream starts at the first step, from the resumed position
        self.logger, self.stop, self.validator = logger, stop, validator
        self.state = TrainState(cfg.checkpoint.phase, step_offset=cfg.checkpoint.step_offset)
        # Profiled steps (--profile_steps) come right after the warm-up and are not timed either.
        self.meter = Meter(
            env,
            cfg.logging.throughput_warmup_steps + cfg.logging.profile_steps,
            peak_flops(env.device, parts.precision.name),
            num_losses=3,
        )
        self.profiler = (
            StepProfiler(cfg.logging.profile_steps, env.device)
            if cfg.logging.profile_steps > 0 and env.rank == 0
            else None
        )
        self.host = HostMemory()
        self.checkpoints = checkpoint_manager(cfg, log)
        self.hooks: list[Hook] = []
        # The model unpads a batch when told always, or auto outside a whole-model graph (which keeps the padded path
        # unless the host hands it a static layout: --static_token_granule); regional compilation leaves the choice
        # in eager code. Where it will unpad, the host describes the layout (host_unpad_info): no device sync.
        self.granule = cfg.parallelism.static_token_granule
        unpad = parts.raw_model.bert.unpad
        self.host_unpad = unpad == "always" or (unpad == "auto" and (compiled(parts.model) != "model" or self.granule))
        self.last_loss: float | None = None

    # --- the loop

    def fit(self) -> dict[str, Any]:
        """Optimizer steps until --max_steps (or --steps_this_run, or a stop signal); logs, evaluates and writes
        checkpoints on the way. Returns the FINAL line's numbers."""
        cfg, state = self.cfg, self.state
        last = cfg.training.max_steps
        if cfg.training.steps_this_run > 0:
            last = min(last, state.step + cfg.training.steps_this_run)
        saving = not cfg.checkpoint.skip_checkpoint
        bar = self.logger.progress(total=last, initial=state.step)
        saved_at = -1
        self.model.train()
        while state.step < last and not self.stop.agreed(self.env):
            if not self.step():
                continue  # fp16 overflow: nothing moved but the data position and the loss scale
            bar.update(1)
            self.profile()
            done = state.step == last
            if self.due(cfg.logging.log_freq) or done:
                self.log_losses(bar)
            if self.validator is not None and (self.due(cfg.evaluation.eval_steps) or done):
                self.evaluate()
            if saving and (self.due(cfg.checkpoint.num_steps_per_checkpoint) or done):
                self.save_checkpoint()
                saved_at = state.step
        stopped = state.step < last
        if stopped and saving and self.meter.steps and saved_at != state.step:
            self.save_checkpoint()  # preempted: save where we are, so that the requeued job continues from here
        bar.close()
        return self.summary(stopped)

    def profile(self) -> None:
        """--profile_steps: start the profiler once the warm-up steps are taken, stop it N steps later and write
        <output_dir>/profile.json (rank 0)."""
        if self.profiler is None:
            return
        warmup = self.cfg.logging.throughput_warmup_steps
        if self.meter.steps == warmup:
            self.profiler.start()
        elif self.meter.steps == warmup + self.profiler.steps:
            summary = self.profiler.stop()
            self.profiler = None
            path = Path(self.cfg.checkpoint.output_dir) / "profile.json"
            atomic_write_json(path, summary)
            self.log(f"profile of {summary['steps']} steps written to {path}")
            self.meter.restart_clock()  # summarising the profile took seconds of the host: not training time

    def due(self, interval: int) -> bool:
        """Whether the step just taken is a multiple of `interval` (0: never)."""
        return interval > 0 and self.state.step % interval == 0

    def step(self) -> bool:
        """One optimizer step over --gradient_accumulation_steps micro-batches (train_step.StepRule). Returns whether
        it was taken: an fp16 step whose gradients overflowed is skipped (its micro-batches are consumed all the
        same)."""
        accum = self.cfg.training.gradient_accumulation_steps
        real = [0, 0]  # this step's real sequences and tokens on this rank

        def micro_batches():
            for _ in range(accum):
                batch = self.next_batch()
                if self.meter.peak:
                    self.meter.add_flops(batch_flops(self.raw_model.config, batch))
                real[:] = [a + b for a, b in zip(real, real_counts(batch))]
                if self.cuda_graphs:  # the last replay's outputs are no longer read: its memory may be reused
                    torch.compiler.cudagraph_mark_step_begin()
                yield self.to_device(batch)

        taken, losses = self.rule(
            micro_batches(),
            accum,
            self.state.global_step + 1,
            before_update=lambda: [hook(self) for hook in self.hooks],
        )
        self.meter.add_attempt(losses)
        if not taken:
            self.state.skipped_steps += 1
            return False
        self.state.step += 1
        self.meter.step_taken(self.cfg.training.train_batch_size * self.env.world_size, tuple(real))
        self.host.maybe_trim()
        return True

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The micro-batch on the device; where the model will run on the real tokens only, with the description of
        where they are (bert_padding.host_unpad_info) made here on the host, so the device never waits for it."""
        moved = to_device(batch, self.env.device)
        if self.host_unpad:
            starts = batch.get(PACKED_KEY)
            info = host_unpad_info(batch["attention_mask"], starts)
            if info is not None and self.granule:
                info = fixed_rows(info, self.granule, sequence_slots(batch["attention_mask"], starts))
            if info is not None:
                moved["unpadded"] = info.to(self.env.device, non_blocking=True)
        return moved

    def next_batch(self) -> dict[str, torch.Tensor]:
        if self._batches is None:  # started here, not in __init__: load_state_dict may move the position first
            self._batches = iter(self.data)
        return next(self._batches)

    # --- what the loop reports

    def log_losses(self, bar) -> None:
        """The mean losses since the last log line (one host sync), on rank 0's log and progress bar."""
        self.check_diverged()
        average, mlm_loss, nsp_loss = self.meter.mean_losses()
        if not math.isfinite(average):  # an fp16 run whose every step overflowed since the last log
            raise DivergedError(
                f"the loss is {average} at step {self.state.global_step}: training diverged (lower --learning_rate)"
            )
        record = {
            "average_loss": average,
            "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss,
            "learning_rate": self.rule.lr,
            "skipped_steps": self.state.skipped_steps,
            "loss_scale": self.precision.loss_scale,
            "phase": self.state.phase,
        }
        if self.meter.mfu() is not None:
            record["mfu"] = self.meter.mfu()
        self.logger.log(self.state.global_step, record)
        bar.set_postfix(loss=f"{average:.4f}", lr=f"{self.rule.lr:.2e}")
        self.last_loss = average

    def evaluate(self) -> dict[str, float]:
        """The validator's held-out numbers for the current weights: one line for a person, one JSON record."""
        with without_graphs() if self.graph_steps else contextlib.nullcontext():
            result = validate_and_describe(self.validator, self.raw_model, self.log)
        self.logger.log(self.state.global_step, result)
        return result

    def summary(self, stopped: bool) -> dict[str, Any]:
        """The FINAL line's numbers (the throughput ones are all-reduced: every rank calls this)."""
        mfu = self.meter.mfu()
        extra = {"mfu": mfu} if mfu is not None else {}
        if self.env.device.type == "cuda":
            extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.env.device) / 2**30
        extra["peak_host_memory_gib"] = self.host.peak_gib()
        if self.graph_steps:
            extra.update(graph_report())
        return {
            "final_loss": self.last_loss,
            "training_sequences_per_second": self.meter.sequences_per_second(),
            **self.meter.real_rates(),
            **extra,
            "step": self.state.global_step,
            "phase_step": self.state.step,
            "skipped_steps": self.state.skipped_steps,
            "stopped_by_signal": (self.stop.signal_name or "a signal on another rank") if stopped else None,
        }

    def check_diverged(self) -> None:
        self.rule.watch.check()

    # --- checkpoints

    def save_checkpoint(self) -> None:
        """ckpt_<global step>.pt, never of non-finite weights (whatever --log_freq is). Every rank calls it (the
        RNG states are gathered); rank 0 writes it atomically and drops the phase's oldest beyond
        --keep_checkpoints; every rank returns when the file is complete."""
        self.check_diverged()
        if not weights_finite(self.raw_model):
            raise DivergedError(
                f"the weights are not finite after step {self.state.global_step}: training diverged "
                "(lower --learning_rate); no checkpoint was written from them"
            )
        payload = self.state_dict()
        try:
            if payload is not None:
                self.checkpoints.save(self.state.global_step, payload)
        except OSError as e:  # a full disk: one line (atomic_io.atomic_torch_save raises the OSError, not torch's)
            raise CheckpointWriteError(
                f"cannot write the checkpoint of step {self.state.global_step}: "
                f"{cli.describe_error(e)}; the checkpoints written before are intact"
            ) from e
        finally:  # every rank leaves once the file is complete: a rank that exits first (after a stop signal) could
            dist_env.barrier(self.env)  # make the launcher (srun, torchrun) kill rank 0 in the middle of the write

    def state_dict(self) -> dict[str, Any] | None:
        """The checkpoint payload on rank 0 (the writer), None on the other ranks. A collective: every rank's RNG
        states go into it, so every rank calls it; only rank 0 copies the tensors."""
        rngs = gather_objects(dist_env.rng_state(), self.env)
        if not self.env.is_main:
            return None
        state = self.state
        return {
            # The full trained tensors (the padded vocabulary rows too, for an exact resume), Hugging Face names.
            "model": {
                k: v.detach().cpu() for k, v in self.raw_model.state_dict().items() if not REDUNDANT_KEYS.match(k)
            },
            "config": self.raw_model.config.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_class": type(self.optimizer).__name__,
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.precision.scaler.state_dict() if self.precision.scaler.is_enabled() else None,
            "rng": rngs,
            "data": self.data.state_dict(),
            "phase": state.phase,
            "step": state.global_step,
            "phase_step": state.step,
            "phase1_end_step": state.step_offset,
            "skipped_steps": state.skipped_steps,
            "world_size": self.env.world_size,
            "args": self.cfg.flags(),
        }

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        """Continue from a checkpoint of this phase: it is checked against this run first (ResumeError), then the
        weights, optimizer, schedule, grad scaler, step counters and data position are loaded, and last each rank's
        RNG states: call it after everything that draws from the global RNGs."""
        self.check_fits(ckpt)
        load_checkpoint_state(self.raw_model, ckpt["model"], source=f"ckpt_{ckpt['step']}.pt")
        # The checkpoint gives the optimizer's state (moments, step counts) and the schedule's step; the
        # hyper-parameters stay this command's: a run resumed with a larger --max_steps or another --learning_rate /
        # --weight_decay follows what it was told, and the log says what changed.
        changed = {
            **load_state_keeping_hyperparameters(self.optimizer, ckpt["optimizer"]),
            **self.scheduler.changes(ckpt["scheduler"]),
        }
        self.scheduler.load_state_dict(ckpt["scheduler"])
        if changed:
            self.log(
                f"resumed with this run's hyper-parameters, not ckpt_{ckpt['step']}.pt's: "
                + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in sorted(changed.items()))
            )
        if self.precision.scaler.is_enabled() and ckpt["grad_scaler"] is not None:
            self.precision.scaler.load_state_dict(ckpt["grad_scaler"])
        self.state = TrainState(ckpt["phase"], ckpt["phase_step"], ckpt["phase1_end_step"], ckpt["skipped_steps"])
        self.data.load_state_dict(ckpt["data"])
        pos = self.data.position
        self.log(
            f"resumed from ckpt_{ckpt['step']}.pt: phase {self.state.phase} step {self.state.step}, data epoch "
            f"{pos.epoch} shard {pos.shard_index} offset {pos.sample_offset}"
        )
        self.restore_rng(ckpt)

    def check_fits(self, ckpt: dict[str, Any]) -> None:
        """ResumeError unless the checkpoint is of this phase and optimizer, and its data position one in this
        run's stream: everything is checked before anything is loaded."""
        phase = self.cfg.checkpoint.phase
        if ckpt["phase"] != phase:
            raise ResumeError(
                f"the checkpoint of step {ckpt['step']} is from phase {ckpt['phase']}, but this run is "
                f"phase {phase} (--phase2 / --phase1_end_step)"
            )
        if ckpt.get("optimizer_class") != type(self.optimizer).__name__:
            raise ResumeError(
                f"the checkpoint's optimizer is {ckpt.get('optimizer_class')}, this run's "
                f"{type(self.optimizer).__name__}: resume with the same set-up"
            )
        self.data.check_state(ckpt["data"])  # the same shards, groups and order (the stream says)

    def restore_rng(self, ckpt: dict[str, Any]) -> None:
        """Each rank's RNG states from the checkpoint; with a different number of processes, fresh per-rank seeds
        (the weights and data resume exactly; the dropout masks cannot)."""
        if len(ckpt["rng"]) == self.env.world_size:
            dist_env.set_rng_state(ckpt["rng"][self.env.rank])
            return
        self.log(
            f"the checkpoint was written by {len(ckpt['rng'])} processes, this run has {self.env.world_size}: "
            "dropout RNG re-seeded"
        )
        dist_env.set_seed(self.cfg.training.seed + self.env.rank + 1_000_003 * ckpt["phase_step"])


def validate_and_describe(validator, raw_model: torch.nn.Module, log: Callable[[str], None]) -> dict[str, float]:
    """validation.Validator's numbers for `raw_model`, and their one line for a person."""
    result = validator(raw_model)
    log(describe(result))
    return result
