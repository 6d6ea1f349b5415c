"""Pre-train BERT (masked LM + next-sentence prediction) with NVLAMB, mixed precision, gradient accumulation and
data parallelism, on NVIDIA's HDF5 shards; resumable to the bit.

Launch (flags as NVIDIA's run_pretraining.py; `--help` lists them all):
    python run_pretraining.py --input_dir shards/ --config_file bert_config.json --output_dir out/ --do_train ...
    torchrun --nproc_per_node 8 run_pretraining.py ...          (one process per GPU; NCCL on GPU, gloo on CPU)
    srun --ntasks-per-node 8 python run_pretraining.py ...      (Slurm's variables are read like torchrun's)

Read top to bottom: the config (every flag, with its meaning) -> the data stream -> the model with parallelism and
precision applied in one place -> checkpoints -> evaluation -> the training loop -> main.

Steps and phases. `step` counts optimizer steps actually taken in the current phase: it drives the LR schedule
and `--max_steps`. An fp16 step whose gradients overflowed is skipped: the weights, optimizer, schedule and `step`
do not move, the loss scale halves, but its micro-batches ARE consumed (the data position moves on, as in NVIDIA's
loop). Phase 1 names its checkpoints ckpt_<step>.pt. Phase 2 (`--phase2 --phase1_end_step N`) starts from the
weights of phase 1's ckpt_N.pt (or `--init_checkpoint`) with a fresh optimizer, grad scaler and the phase-2
schedule over its own `--max_steps`; its checkpoints and log lines continue the global count: ckpt_<N + step>.pt
(NVIDIA's naming). So a folder holds phase 1 as ckpt_1..ckpt_N and phase 2 above N; phase 2 never deletes
phase 1's checkpoints.

Data stream. Every *.hdf5 in --input_dir, sorted by name. Epoch e visits the shards in a permutation drawn from
(seed, e); shard s is read in a permutation drawn from (seed, e, s). That ordered stream of samples is cut into
GLOBAL micro-batches of micro_batch_size * world_size consecutive samples (a shard's remainder smaller than one
global micro-batch is dropped), and rank r trains on the r-th slice of each. So the samples of a global step do not
depend on how they are split across processes: 2 processes x 16 sequences see exactly what 1 process x 32 sees, and
the data position (epoch, shard index, sample offset within the shard's permutation) is one global number that a
checkpoint stores and any number of processes can resume from. Each rank reads a whole shard (the page cache
shares it between the ranks of a node) and keeps its own rows; one shard is held in memory, the next is read in
a background thread. The model gets the shards' masked_lm_positions/masked_lm_ids as they are, P slots a sequence
(BertForPreTraining's fixed-slot head: static shapes, no host sync to find the labelled tokens); position 0 is
[CLS] and never masked, so a 0 in masked_lm_positions marks an unused slot (NVIDIA's loader stops at the first 0
after index 0: the same for its sorted positions). With --dynamic_masking the stored masks are undone and new ones
drawn by create_pretraining_data.dynamic_mask, seeded by (seed, epoch, shard, offset): every epoch differs, a
resumed run draws the same masks.

Packed shards (create_pretraining_data.py --pack_sequences K) are detected by their next_sentence_positions array:
each row holds up to K sequences, each attending only to itself with its own positions and NSP read at its own
[CLS] (modeling.BertForPreTraining); --max_predictions_per_seq stays the per-sequence value (a packed row's slots
are checked against K times it). The stream, resume and checkpoints count rows, so "sequences" in the throughput
are rows. --length_bins N (LDDL-style, for phase 2) instead groups samples of similar real length into the same
micro-batches and cuts each to its bin's upper length (pretraining_data.binned_order): still a fixed permutation
of each shard, so the position and exact resume hold; the order depends on the global micro-batch, which must stay
the same on resume.

Loss. As NVIDIA's: per micro-batch, the mean MLM cross-entropy over its masked positions plus the NSP
cross-entropy, divided by the accumulation steps; DDP averages the ranks. (So 2 processes equal 1 exactly when the
ranks hold equally many masked positions, as in NVIDIA's recipe.)

Checkpoints (ckpt_<step>.pt, torch.load(weights_only=True) safe, written by rank 0 through a temporary file, fsync
and rename): model (Hugging Face names, what checkpoint_io.from_pretrained reads), config, optimizer,
scheduler, grad scaler, every RNG state of every rank, the data position, phase and step. Every
--num_steps_per_checkpoint steps, at the end and on SIGTERM/SIGUSR1/SIGINT (the current step finishes, a checkpoint
is written, exit 75 = EX_TEMPFAIL: "run again to resume"; a second SIGINT stops at once); the newest
--keep_checkpoints of the phase are kept. DataLoader workers ignore those signals and are ended by the training
process; console output whose reader died (a launcher's `tee`) is dropped rather than ending the run.
`--resume_from_checkpoint` continues from
the newest checkpoint of the phase that loads (or starts fresh when there is none, so a requeued job can always
pass it): with the same number of processes the run continues bit for bit as if never interrupted; with another
number the weights, optimizer, schedule and data position continue exactly, and the dropout RNG is re-seeded.

Logging (rank 0): dllogger-style JSON lines (--json-summary): a PARAMETER line, every --log_freq steps step,
average_loss, mlm_loss, nsp_loss, learning_rate, skipped_steps, loss_scale (and mfu on a known GPU, from model
FLOPs of real, non-padding tokens), eval_mlm_accuracy / eval_mlm_loss, and a FINAL line with final_loss,
training_sequences_per_second (rows trained, after --throughput_warmup_steps),
training_real_sequences_per_second and training_real_tokens_per_second (each sequence of a packed row; non-padding
tokens only), mfu and peak_memory_gib on GPUs, and e2e_train_time.
TensorBoard scalars in <output_dir>/tensorboard when the tensorboard package is installed. A tqdm bar.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretraining_data import (DataPosition, Masker, PretrainingData, ShardInfo, ShardSpec, inspect_shards, list_shards,
                              load_eval_set, to_model_inputs)
from precision import Precision
from training import (EXIT_STOPPED, DivergenceWatch, HostMemory, Meter, RunLogger, StopRequest,
                      apply_parallelism_and_precision, forward_backward, optimizer_step, peak_flops, weights_finite)
import utils
from utils import InputError


class ResumeError(InputError):
    """A checkpoint that does not fit this run (another phase, optimizer or data) or an output folder in use."""


class DivergedError(InputError):
    """The loss became inf/NaN, or fp16 overflowed step after step."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder we may not write); the atomic write left the
    previous checkpoints as they were."""

# ---------------------------------------------------------------------------------------------------------------
# Configuration: one typed dataclass; its fields are the command-line flags (help text in the metadata).


def _flag(default: Any, help: str, *aliases: str, required: bool = False, choices: tuple | None = None,
          dest_flag: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "aliases": aliases, "required": required,
                                            "choices": choices, "flag": dest_flag})


@dataclass
class PretrainConfig:
    """Every flag of run_pretraining.py (the field name is the flag, e.g. --train_batch_size; help in metadata)."""

    # --- data and model
    input_dir: str | None = _flag(None, "folder of training shards: every *.hdf5 in it (NVIDIA's layout)")
    config_file: str | None = _flag(None, "the model's bert_config.json", required=True)
    vocab_file: str | None = _flag(None, "vocab.txt: checked against the config's vocab_size; needed by "
                                         "--dynamic_masking")
    output_dir: str | None = _flag(None, "where ckpt_<step>.pt checkpoints are written", required=True)
    init_checkpoint: str | None = _flag(None, "start from these weights: a Hugging Face folder, an NVIDIA .pt, a "
                                              "ckpt_<step>.pt, a state-dict file (optimizer state is not taken)")
    bert_model: str | None = _flag(None, "accepted for compatibility with NVIDIA's scripts and ignored: the "
                                         "model comes from --config_file")
    max_seq_length: int = _flag(512, "sequence length S of the shards (checked)")
    max_predictions_per_seq: int = _flag(80, "masked positions per sequence: the shards' width is checked "
                                             "against it; the cap for --dynamic_masking")
    dynamic_masking: bool = _flag(False, "draw new masks every epoch (for shards written unmasked with "
                                         "create_pretraining_data.py --no_static_masking; masked ones are unmasked "
                                         "first)")
    masked_lm_prob: float = _flag(0.15, "fraction of tokens masked by --dynamic_masking")
    length_bins: int = _flag(0, "LDDL-style length binning (phase 2): group samples of similar real length into "
                                "micro-batches, N bins of max_seq_length / N each, every micro-batch cut to its "
                                "bin's upper length (0: off)")
    num_workers: int = _flag(4, "DataLoader worker processes building micro-batches from the shard in memory "
                                "(0: in the training process)")
    # --- optimisation
    train_batch_size: int = _flag(32, "sequences per process per optimizer step (all micro-batches together)")
    gradient_accumulation_steps: int = _flag(1, "micro-batches per optimizer step: micro-batch = "
                                                "train_batch_size / gradient_accumulation_steps (must divide)")
    optimizer: str = _flag("nvlamb", "nvlamb: NVIDIA's LAMB (per-tensor trust ratio; the recipe for large "
                                     "batches); adamw: decoupled AdamW with bias correction (what transformers, "
                                     "Cramming and ModernBERT pre-train with; measured better at small batches, "
                                     "README). Both clip the global gradient norm at --max_grad_norm",
                           choices=("nvlamb", "adamw"))
    learning_rate: float = _flag(5e-5, "peak learning rate")
    warmup_proportion: float = _flag(0.01, "fraction of --max_steps with a linear warm-up of the learning rate")
    lr_schedule: str = _flag("poly", "learning-rate schedule after warm-up (poly: NVIDIA's (1-progress)^0.5)",
                             choices=("poly", "linear", "cosine", "constant"))
    max_steps: int = _flag(1000, "optimizer steps of this phase in total (the schedule's length)")
    steps_this_run: int = _flag(-1, "stop after this many steps in this invocation (then checkpoint); -1: run "
                                    "to --max_steps")
    weight_decay: float = _flag(0.01, "decoupled weight decay (not for biases and LayerNorm)")
    mlm_bias_init: str = _flag("zero", "the masked-LM output bias of a model trained from scratch: zero (BERT's) or "
                                       "unigram (the log-frequency of each token among the first training shard's "
                                       "masked targets, add-one smoothed: the model starts at the unigram loss "
                                       "instead of learning word frequencies first; measured in README)",
                               choices=("zero", "unigram"))
    no_nsp: bool = _flag(False, "train on the masked-LM loss alone (RoBERTa's choice); the next-sentence loss is "
                                "still computed and logged, its head gets zero gradients (measured in README)")
    max_grad_norm: float = _flag(1.0, "global gradient-norm clip (<= 0: off)")
    use_nvlamb: bool = _flag(False, "apply LAMB's trust ratio also to the no-decay group (NVIDIA's NVLAMB switch; "
                                    "--optimizer nvlamb only)")
    seed: int = _flag(42, "random seed: model init, data order, dropout (rank r uses seed + r for dropout)")
    # --- precision
    precision: str = _flag("auto", "fp16: autocast float16 and a GradScaler (overflow steps are skipped); bf16: "
                                   "autocast bfloat16, no loss scaling. The old --fp16/--amp/--bf16 switches are "
                                   "aliases")
    loss_scale: float = _flag(0.0, "fp16 loss scale: 0 = dynamic (starts at --init_loss_scale, halves on "
                                   "overflow), > 0 = this static scale")
    init_loss_scale: float = _flag(2.0 ** 20, "initial dynamic fp16 loss scale")
    # --- parallelism and memory
    allreduce_post_accumulation: bool = _flag(False, "all-reduce gradients once per optimizer step (DDP no_sync "
                                                     "on the other micro-batches) instead of after every "
                                                     "micro-batch")
    allreduce_post_accumulation_fp16: bool = _flag(False, "all-reduce gradients in fp16 (bf16 with --bf16 on "
                                                          "GPUs): half the bytes")
    checkpoint_activations: bool = _flag(False, "recompute each layer's activations in the backward pass (less "
                                                "memory, about 30%% more compute)")
    compile: bool = _flag(False, "torch.compile the model (the default on a GPU: see --no_compile)")
    no_compile: bool = _flag(False, "eager mode: the default on the CPU, where compiling costs minutes of a short "
                                    "run. On GPUs compiling is the default because it was measured faster (BERT-large "
                                    "on an H100, bf16: phase 1 +30%%, phase 2 +15%%)")
    compile_mode: str = _flag("default", "torch.compile's mode: reduce-overhead adds CUDA graphs (static shapes: "
                                         "the fixed-slot head and the padded path under compile give them)",
                              choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    no_cuda: bool = _flag(False, "train on the CPU even when a GPU is present")
    local_rank: int = _flag(-1, "accepted for torch.distributed.launch compatibility; the LOCAL_RANK "
                                "environment variable is used", "--local-rank")
    # --- checkpoints and phases
    num_steps_per_checkpoint: int = _flag(100, "write ckpt_<step>.pt every this many steps")
    keep_checkpoints: int = _flag(3, "keep the newest this many checkpoints of the phase")
    skip_checkpoint: bool = _flag(False, "write no checkpoints at all")
    resume_from_checkpoint: bool = _flag(False, "continue from the newest complete checkpoint of the phase in "
                                                "--output_dir (start fresh when there is none)")
    resume_step: int = _flag(-1, "with --resume_from_checkpoint: continue from ckpt_<resume_step>.pt instead")
    phase2: bool = _flag(False, "phase 2: start from phase 1's ckpt_<phase1_end_step>.pt with a fresh optimizer")
    phase1_end_step: int = _flag(7038, "the last step of phase 1 (phase 2 checkpoints are numbered after it)")
    do_train: bool = _flag(False, "train (without it, only evaluate on --eval_dir)")
    # --- evaluation
    eval_dir: str | None = _flag(None, "folder of held-out *.hdf5 shards: masked-LM accuracy and loss")
    eval_steps: int = _flag(0, "evaluate every this many steps (0: only at the end)", "--num_steps_per_eval")
    eval_batch_size: int = _flag(0, "sequences per process per evaluation batch (0: the training micro-batch)")
    max_eval_samples: int = _flag(0, "evaluate on the first this many held-out samples (0: all)")
    # --- logging
    json_summary: str = _flag("results/dllogger.json", "dllogger-style JSON lines log (rank 0)", "--json_summary",
                              dest_flag="--json-summary")
    log_freq: int = _flag(1, "log every this many steps")
    throughput_warmup_steps: int = _flag(3, "steps left out of training_sequences_per_second (start-up, "
                                            "compilation)")
    disable_progress_bar: bool = _flag(False, "no tqdm progress bar")
    debug_inject_inf_at_step: int = _flag(-1, "TEST ONLY: put an inf into a gradient on the first attempt at "
                                              "this step (with --precision fp16)")

    @property
    def micro_batch_size(self) -> int:
        return self.train_batch_size // self.gradient_accumulation_steps

    @property
    def shard_spec(self) -> ShardSpec:
        return ShardSpec(self.max_seq_length, self.max_predictions_per_seq, self.dynamic_masking)



# --help lists the flags in these groups; each starts at the named field (fields are in this order above).
FLAG_GROUPS = {"input_dir": "data and model", "train_batch_size": "optimisation", "precision": "precision",
               "allreduce_post_accumulation": "parallelism and memory",
               "num_steps_per_checkpoint": "checkpoints and phases", "eval_dir": "evaluation", "json_summary": "logging"}


class _OneLineParser(argparse.ArgumentParser):
    """Errors as one line ("run_pretraining.py: error: ...") and exit status 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="run_pretraining.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(PretrainConfig)
    group = parser
    for f in dataclasses.fields(PretrainConfig):
        group = parser.add_argument_group(FLAG_GROUPS[f.name]) if f.name in FLAG_GROUPS else group
        meta = f.metadata
        if f.name == "precision":  # --precision auto|fp32|tf32|fp16|bf16 and its aliases, as every entry script
            from precision import add_arguments

            add_arguments(group, meta["help"])
            continue
        names = [meta["flag"] or f"--{f.name}", *meta["aliases"]]
        kind = hints[f.name]
        if kind is bool:
            group.add_argument(*names, dest=f.name, action="store_true", help=meta["help"])
            continue
        if isinstance(kind, types.UnionType):  # "str | None"
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        group.add_argument(*names, dest=f.name, type=kind, default=f.default, help=meta["help"],
                            choices=meta["choices"], required=meta["required"])
    from utils import add_debug_argument

    add_debug_argument(group)  # read by utils.script_errors from the command line, not a PretrainConfig field
    return parser


def fail(message: str) -> typing.NoReturn:
    """A one-line error for bad input (exit status 1)."""
    raise SystemExit(f"run_pretraining.py: error: {message}")


def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    flags = vars(build_parser().parse_args(argv))
    flags.pop("debug")
    cfg = PretrainConfig(**flags)
    checks = [
        (cfg.train_batch_size < 1, f"--train_batch_size {cfg.train_batch_size} must be at least 1"),
        (cfg.gradient_accumulation_steps < 1,
         f"--gradient_accumulation_steps {cfg.gradient_accumulation_steps} must be at least 1"),
        (cfg.train_batch_size % max(cfg.gradient_accumulation_steps, 1) != 0,
         f"--train_batch_size {cfg.train_batch_size} is not divisible by --gradient_accumulation_steps "
         f"{cfg.gradient_accumulation_steps}"),
        (cfg.max_steps < 1, f"--max_steps {cfg.max_steps} must be at least 1"),
        (cfg.steps_this_run == 0 or cfg.steps_this_run < -1, "--steps_this_run must be positive (or -1: all)"),
        (not 0.0 <= cfg.warmup_proportion <= 1.0, f"--warmup_proportion {cfg.warmup_proportion} must be in [0, 1]"),
        (cfg.learning_rate < 0, f"--learning_rate {cfg.learning_rate} must not be negative"),
        (cfg.loss_scale < 0, f"--loss_scale {cfg.loss_scale} must be 0 (dynamic) or positive (static)"),
        (cfg.seed < 0, f"--seed {cfg.seed} must be a non-negative integer"),
        (cfg.log_freq < 1, f"--log_freq {cfg.log_freq} must be at least 1"),
        (cfg.num_steps_per_checkpoint < 1, f"--num_steps_per_checkpoint {cfg.num_steps_per_checkpoint} must be >= 1"),
        (cfg.keep_checkpoints < 1, f"--keep_checkpoints {cfg.keep_checkpoints} must be at least 1"),
        (cfg.num_workers < 0, f"--num_workers {cfg.num_workers} must not be negative"),
        (cfg.eval_steps < 0 or cfg.eval_batch_size < 0 or cfg.max_eval_samples < 0,
         "--eval_steps, --eval_batch_size and --max_eval_samples must not be negative"),
        (cfg.compile and cfg.no_compile, "--compile and --no_compile contradict each other: pass one"),
        (cfg.use_nvlamb and cfg.optimizer != "nvlamb", "--use_nvlamb is a switch of --optimizer nvlamb: drop it "
                                                       "with --optimizer adamw"),
        (cfg.resume_step != -1 and not cfg.resume_from_checkpoint,
         "--resume_step needs --resume_from_checkpoint"),
        (cfg.phase2 and cfg.phase1_end_step < 0, f"--phase1_end_step {cfg.phase1_end_step} must not be negative"),
        (cfg.debug_inject_inf_at_step > 0 and cfg.precision != "fp16",
         "--debug_inject_inf_at_step is for --precision fp16 runs only"),
        (cfg.dynamic_masking and not cfg.vocab_file, "--dynamic_masking needs --vocab_file (the [MASK] id and "
                                                     "the vocabulary size)"),
        (not 0.0 < cfg.masked_lm_prob <= 1.0, f"--masked_lm_prob {cfg.masked_lm_prob} must be in (0, 1]"),
        (not 0 <= cfg.length_bins <= cfg.max_seq_length,
         f"--length_bins {cfg.length_bins} must be in [0, max_seq_length={cfg.max_seq_length}] (0: off)"),
        (not cfg.do_train and not cfg.eval_dir, "nothing to do: pass --do_train (and/or --eval_dir to evaluate)"),
        (cfg.do_train and not cfg.input_dir, "--do_train needs --input_dir (a folder of .hdf5 shards)"),
        (Path(cfg.output_dir).exists() and not Path(cfg.output_dir).is_dir(),
         f"--output_dir {cfg.output_dir} is a file: name a folder for the checkpoints"),
        (Path(cfg.json_summary).is_dir(), f"--json-summary {cfg.json_summary} is a folder: name the log file"),
        (cfg.init_checkpoint is not None and not Path(cfg.init_checkpoint).exists(),
         f"--init_checkpoint {cfg.init_checkpoint} not found: give a ckpt_<step>.pt, an NVIDIA .pt or a Hugging "
         "Face folder"),
    ]
    for bad, message in checks:
        if bad:
            fail(message)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# Test hooks


def _inject_inf(model: torch.nn.Module) -> None:
    """TEST ONLY (--debug_inject_inf_at_step): an inf in the first gradient, as an fp16 overflow would leave."""
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    grad.view(-1)[0] = float("inf")


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints

def checkpoint_manager(cfg: PretrainConfig, log=lambda msg: None):
    """The manager of --output_dir's checkpoints that belong to this phase: steps up to --max_steps in phase 1,
    steps after --phase1_end_step in phase 2 (so re-running phase 1 with --resume_from_checkpoint after phase 2
    began finds phase 1's last one, and phase 2 never rotates phase 1's away)."""
    from training import CheckpointManager

    owns = (lambda step: step > cfg.phase1_end_step) if cfg.phase2 else (lambda step: step <= cfg.max_steps)
    return CheckpointManager(cfg.output_dir, cfg.keep_checkpoints, owns, log)


def list_checkpoints(folder: str | Path) -> dict[int, Path]:
    """step -> path of every ckpt_<step>.pt in `folder`."""
    from training import CheckpointManager

    return CheckpointManager(folder).all()


def find_resume_checkpoint(cfg: PretrainConfig, log) -> dict[str, Any] | None:
    """The checkpoint to continue from (--resume_step's, or the newest that loads), or None to start fresh."""
    manager = checkpoint_manager(cfg, log)
    if cfg.resume_step != -1:
        found = manager.mine()
        if cfg.resume_step not in found:
            raise ResumeError(f"--resume_step {cfg.resume_step}: {cfg.output_dir}/ckpt_{cfg.resume_step}.pt is not "
                              f"a checkpoint of this phase (found steps {list(found) or 'none'})")
        return manager.read(found[cfg.resume_step])
    found = manager.mine()
    ckpt = manager.newest_readable({"model", "optimizer", "data", "step"})
    if ckpt is None and found:  # never a silent fresh start over a run's damaged checkpoints
        raise ResumeError(f"--resume_from_checkpoint: none of this phase's checkpoints in {cfg.output_dir} can be "
                          f"read ({', '.join(p.name for p in found.values())}): restore a good one, or move them "
                          "away to start afresh")
    return ckpt


@dataclass
class TrainState:
    phase: int
    step: int = 0  # optimizer steps taken in this phase (drives the schedule and --max_steps)
    step_offset: int = 0  # 0 in phase 1, phase1_end_step in phase 2: names and logs use step_offset + step
    skipped_steps: int = 0  # fp16 overflow steps skipped in this phase

    @property
    def global_step(self) -> int:
        return self.step_offset + self.step


def gather_objects(obj: Any, env) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (a collective: every rank must call it)."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def save_checkpoint(cfg: PretrainConfig, env, state: TrainState, raw_model, optimizer, scheduler,
                    precision: Precision, data: PretrainingData, log) -> None:
    """Every rank contributes its RNG states; rank 0 writes ckpt_<global step>.pt atomically and drops the
    oldest checkpoints of the phase beyond --keep_checkpoints; every rank returns when the file is complete."""
    from utils import barrier, rng_state

    rngs = gather_objects(rng_state(), env)
    try:
        if env.is_main:
            _write_checkpoint(cfg, env, state, raw_model, optimizer, scheduler, precision, data, rngs, log)
    except OSError as e:  # a full disk: one line (utils.atomic_torch_save raises the OSError, not torch's wrapper)
        from utils import describe_error

        raise CheckpointWriteError(f"cannot write the checkpoint of step {state.global_step}: {describe_error(e)}; "
                                   "the checkpoints written before are intact") from e
    finally:  # every rank leaves once the file is complete: a rank that exits first (after a stop signal)
        barrier(env)  # could otherwise make the launcher (srun, torchrun) kill rank 0 in the middle of the write


def _write_checkpoint(cfg: PretrainConfig, env, state: TrainState, raw_model, optimizer, scheduler,
                      precision: Precision, data: PretrainingData, rngs: list, log) -> None:
    from checkpoint_io import REDUNDANT_KEYS

    pos = data.position
    ckpt = {
        # The full trained tensors (the padded vocabulary rows too, for an exact resume), Hugging Face names.
        "model": {k: v.detach().cpu() for k, v in raw_model.state_dict().items() if not REDUNDANT_KEYS.match(k)},
        "config": raw_model.config.to_dict(),
        "optimizer": optimizer.state_dict(),
        "optimizer_class": type(optimizer).__name__,
        "scheduler": scheduler.state_dict(),
        "grad_scaler": precision.scaler.state_dict() if precision.scaler.is_enabled() else None,
        "rng": rngs,
        "data": {"epoch": pos.epoch, "shard_index": pos.shard_index, "sample_offset": pos.sample_offset,
                 "shard_order": [data.shards[i].path.name for i in data.shard_order(pos.epoch)],
                 "files": [s.path.name for s in data.shards],
                 # binned orders depend on the global micro-batch: recorded so a resume can check it
                 **({"length_bins": data.length_bins, "global_micro_batch": data.global_batch}
                    if data.length_bins else {})},
        "phase": state.phase,
        "step": state.global_step,
        "phase_step": state.step,
        "phase1_end_step": state.step_offset,
        "skipped_steps": state.skipped_steps,
        "world_size": env.world_size,
        "args": dataclasses.asdict(cfg),
    }
    checkpoint_manager(cfg, log).save(state.global_step, ckpt)


def restore_training_state(ckpt: dict[str, Any], cfg: PretrainConfig, env, raw_model, optimizer, scheduler,
                           precision: Precision, shards: list[ShardInfo], log) -> tuple[TrainState, DataPosition]:
    """Load a checkpoint of this phase into the freshly built objects; returns the step counters and the data
    position to continue from. RNG states are restored last, by the caller."""
    from checkpoint_io import load_checkpoint_state

    if ckpt["phase"] != (2 if cfg.phase2 else 1):
        raise ResumeError(f"the checkpoint of step {ckpt['step']} is from phase {ckpt['phase']}, but this run is phase "
                          f"{2 if cfg.phase2 else 1} (--phase2 / --phase1_end_step)")
    if ckpt.get("optimizer_class") != type(optimizer).__name__:
        raise ResumeError(f"the checkpoint's optimizer is {ckpt.get('optimizer_class')}, this run's "
                          f"{type(optimizer).__name__}: "
                          f"resume with the same set-up")
    load_checkpoint_state(raw_model, ckpt["model"], source=f"ckpt_{ckpt['step']}.pt")
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if precision.scaler.is_enabled() and ckpt["grad_scaler"] is not None:
        precision.scaler.load_state_dict(ckpt["grad_scaler"])
    files = [s.path.name for s in shards]
    d = ckpt["data"]
    if d["files"] != files:
        raise ResumeError(f"--input_dir {cfg.input_dir} does not hold the shards the checkpoint was trained on "
                          f"({len(d['files'])} then, {len(files)} now): resume with the same data")
    global_batch = cfg.micro_batch_size * env.world_size
    then = (d.get("length_bins", 0), d.get("global_micro_batch", global_batch))
    if then != (cfg.length_bins, global_batch if cfg.length_bins else then[1]):
        raise ResumeError(f"the checkpoint ordered its samples with --length_bins {then[0]} and a global "
                          f"micro-batch of {then[1]}, this run with {cfg.length_bins} and {global_batch}: binned "
                          "orders differ, so resume with the same --length_bins, batch and processes")
    state = TrainState(ckpt["phase"], ckpt["phase_step"], ckpt["phase1_end_step"], ckpt["skipped_steps"])
    log(f"resumed from ckpt_{ckpt['step']}.pt: phase {state.phase} step {state.step}, data epoch {d['epoch']} "
        f"shard {d['shard_index']} offset {d['sample_offset']}")
    return state, DataPosition(d["epoch"], d["shard_index"], d["sample_offset"])


def restore_rng(ckpt: dict[str, Any] | None, cfg: PretrainConfig, env, log) -> None:
    """Each rank's RNG states from the checkpoint; with a different number of processes, fresh per-rank seeds
    (the weights and data resume exactly; the dropout masks cannot)."""
    from utils import set_rng_state, set_seed

    if ckpt is None:
        return
    if len(ckpt["rng"]) == env.world_size:
        set_rng_state(ckpt["rng"][env.rank])
        return
    log(f"the checkpoint was written by {len(ckpt['rng'])} processes, this run has {env.world_size}: dropout "
        f"RNG re-seeded")
    set_seed(cfg.seed + env.rank + 1_000_003 * ckpt["phase_step"])


def refuse_used_output_dir(cfg: PretrainConfig) -> None:
    found = checkpoint_manager(cfg).mine()
    if found and not cfg.resume_from_checkpoint:
        names = ", ".join(p.name for p in list(found.values())[-3:])
        raise ResumeError(f"--output_dir {cfg.output_dir} already holds checkpoints ({names}): pass "
                          "--resume_from_checkpoint "
                          f"to continue that run, or choose an empty folder")


# ---------------------------------------------------------------------------------------------------------------
# Evaluation: validation.Validator (held-out loss against the unigram entropy, and the context gain)


def make_validator(cfg: PretrainConfig, eval_set: dict[str, np.ndarray], precision: Precision, env):
    """The held-out set's validator; the special ids from --vocab_file, or read off the held-out shards."""
    from validation import SpecialIds, Validator

    if cfg.vocab_file:
        from tokenization import load_vocab

        special = SpecialIds.from_vocab(load_vocab(cfg.vocab_file))
    else:
        special = SpecialIds.from_shards(eval_set)
    try:
        return Validator(eval_set, special, cfg.eval_batch_size or cfg.micro_batch_size, precision.autocast, env)
    except ValueError as e:
        raise InputError(f"--eval_dir {cfg.eval_dir}: {e}") from None


# ---------------------------------------------------------------------------------------------------------------
# The training loop


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
    from modeling import flops_per_sequence

    masked = (batch["masked_lm_positions"] > 0).sum(1).double()  # [B]
    if "next_sentence_positions" not in batch:
        lengths = batch["attention_mask"].sum(1).double()  # [B]
        return float(flops_per_sequence(config, lengths, masked).sum())
    from bert_padding import packed_layout

    lengths = packed_layout(batch["attention_mask"], batch["next_sentence_positions"]).lengths.double()  # [B, K]
    encoders = torch.where(lengths > 0, flops_per_sequence(config, lengths, 0), 0.0).sum()  # each sequence's own
    heads = flops_per_sequence(config, 0, masked) - flops_per_sequence(config, 0, 0)  # [B]: the row's MLM slots
    return float(encoders + heads.sum())


def real_counts(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Real sequences (each one of a packed row) and non-padding tokens of a micro-batch, read on the host before
    it moves to the device: counting them costs no sync."""
    labels = batch["next_sentence_labels"]
    sequences = int((labels >= 0).sum()) if labels.dim() == 2 else len(labels)  # packed: -1 in unused slots
    return sequences, int(batch["attention_mask"].sum())


def train(cfg: PretrainConfig, env, model, raw_model, precision: Precision, optimizer, scheduler,
          data: PretrainingData, state: TrainState, logger, eval_fn, checkpoint_fn, stop: StopRequest) -> dict:
    """Optimizer steps until --max_steps (or --steps_this_run, or a stop signal). Returns the final summary."""
    accum = cfg.gradient_accumulation_steps
    last_step = cfg.max_steps if cfg.steps_this_run < 0 else min(cfg.max_steps, state.step + cfg.steps_this_run)
    meter = Meter(env, cfg.throughput_warmup_steps, peak_flops(env.device, precision.name), num_losses=3)
    loss_fn = functools.partial(pretraining_losses, nsp=not cfg.no_nsp)
    bar = logger.progress(total=last_step, initial=state.step)
    batches = iter(data)
    saved_at, last_loss, inject, consecutive_skips = -1, None, cfg.debug_inject_inf_at_step, 0
    watch = DivergenceWatch(env.device)  # fp16 overflows are the GradScaler's: those steps are skipped instead
    host = HostMemory()

    def check_diverged() -> None:
        bad = watch.first()
        if bad is not None:
            raise DivergedError(f"the loss became non-finite at step {bad}: training diverged (lower "
                                f"--learning_rate); no checkpoint was written from that step on")

    def save_checked() -> None:  # never a checkpoint of non-finite weights, whatever --log_freq is
        check_diverged()
        if not weights_finite(raw_model):
            raise DivergedError(f"the weights are not finite after step {state.global_step}: training diverged "
                                "(lower --learning_rate); no checkpoint was written from them")
        checkpoint_fn(state)

    model.train()

    while state.step < last_step and not stop.agreed(env):
        # Forward and backward over the micro-batches; gradients accumulate, and are all-reduced after every
        # micro-batch, or only after the last one with --allreduce_post_accumulation.
        losses = torch.zeros(3, dtype=torch.float64, device=env.device)
        real = (0, 0)  # this step's real sequences and tokens on this rank
        for micro_step in range(accum):
            batch = next(batches)
            if meter.peak:
                meter.add_flops(batch_flops(raw_model.config, batch))
            real = tuple(a + b for a, b in zip(real, real_counts(batch)))
            batch = {k: v.to(env.device, non_blocking=True) for k, v in batch.items()}
            sync = micro_step == accum - 1 or not cfg.allreduce_post_accumulation
            losses += forward_backward(model, batch, loss_fn, precision, accum, sync)
        if not precision.scaler.is_enabled():
            watch.record(losses[0], state.global_step + 1)
            if watch.every_step:
                check_diverged()
        if state.step + 1 == inject:
            _inject_inf(model)
            inject = -1
        lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
        taken = optimizer_step(optimizer, precision)
        optimizer.zero_grad(set_to_none=True)
        meter.add_attempt(losses)
        if not taken:  # fp16 overflow: nothing moved but the data position and the loss scale
            state.skipped_steps += 1
            consecutive_skips += 1
            if consecutive_skips > 50:
                raise DivergedError(f"50 fp16 overflows in a row at step {state.global_step}: the loss diverged (lower "
                                    f"--learning_rate, or use --precision bf16)")
            continue
        consecutive_skips = 0
        scheduler.step()
        state.step += 1
        meter.step_taken(cfg.train_batch_size * env.world_size, real)
        host.maybe_trim()
        bar.update(1)
        done = state.step == last_step

        if state.step % cfg.log_freq == 0 or done:
            check_diverged()
            average, mlm_loss, nsp_loss = meter.mean_losses()
            if not math.isfinite(average):  # an fp16 run whose every step overflowed since the last log
                raise DivergedError(f"the loss is {average} at step {state.global_step}: training diverged (lower "
                                    f"--learning_rate)")
            record = {"average_loss": average, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss, "learning_rate": lr,
                      "skipped_steps": state.skipped_steps, "loss_scale": precision.loss_scale, "phase": state.phase}
            if meter.mfu() is not None:
                record["mfu"] = meter.mfu()
            logger.log(state.global_step, record)
            bar.set_postfix(loss=f"{average:.4f}", lr=f"{lr:.2e}")
            last_loss = average
        if eval_fn is not None and ((cfg.eval_steps and state.step % cfg.eval_steps == 0) or done):
            logger.log(state.global_step, eval_fn())
        if not cfg.skip_checkpoint and (state.step % cfg.num_steps_per_checkpoint == 0 or done):
            save_checked()
            saved_at = state.step

    stopped = state.step < last_step
    if stopped and not cfg.skip_checkpoint and meter.steps and saved_at != state.step:
        save_checked()  # preempted: save where we are, so that the requeued job continues from here
    bar.close()
    mfu = meter.mfu()
    extra = {"mfu": mfu} if mfu is not None else {}
    if env.device.type == "cuda":
        extra["peak_memory_gib"] = torch.cuda.max_memory_allocated(env.device) / 2 ** 30
    extra["peak_host_memory_gib"] = host.peak_gib()
    return {"final_loss": last_loss, "training_sequences_per_second": meter.sequences_per_second(),
            **meter.real_rates(), **extra, "step": state.global_step, "phase_step": state.step, "skipped_steps": state.skipped_steps,
            "stopped_by_signal": (stop.signal_name or "a signal on another rank") if stopped else None}


# ---------------------------------------------------------------------------------------------------------------
# main


def _evaluated(result: dict[str, float], log) -> dict[str, float]:
    from validation import describe

    log(describe(result))
    return result


def report_stop(cfg: PretrainConfig, summary: dict, state: TrainState, env) -> int:
    """One line on stderr for a run stopped by a signal (what a launcher and a person need), and EXIT_STOPPED."""
    saved = "" if cfg.skip_checkpoint or not state.step else f" (checkpoint ckpt_{state.global_step}.pt)"
    again = "run the same command again to resume" if cfg.resume_from_checkpoint else \
        "run the same command with --resume_from_checkpoint to resume"
    if env.is_main:
        print(f"run_pretraining.py: phase {state.phase} stopped at step {state.global_step} by "
              f"{summary['stopped_by_signal']}{saved}: {again}", file=sys.stderr, flush=True)
    return EXIT_STOPPED


def _masked_slots(cfg: PretrainConfig, packed: int) -> int:
    """--dynamic_masking's prediction slots: max_predictions_per_seq, or for rows of up to `packed` sequences the
    slots create_pretraining_data.py gives a packed row (enough for any K sequences of together S tokens)."""
    if not packed:
        return cfg.max_predictions_per_seq
    from pretraining_format import packed_predictions

    return packed_predictions(cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.masked_lm_prob, packed)


def build_model(cfg: PretrainConfig, resume: dict[str, Any] | None, log):
    """BertForPreTraining from --config_file, with its starting weights: random (seeded identically on every
    rank), or --init_checkpoint / phase 1's checkpoint when not resuming (the resume checkpoint's weights are
    loaded later, with the rest of its state)."""
    from checkpoint_io import CheckpointError, load_checkpoint_state, read_state_dict
    from modeling import BertConfig, BertForPreTraining
    from utils import set_seed

    from utils import describe_error

    try:
        config = BertConfig.from_json_file(cfg.config_file)
    except (OSError, ValueError) as e:
        raise InputError(f"--config_file: {describe_error(e)}") from e
    if cfg.vocab_file:
        from tokenization import load_vocab

        try:
            vocab_size = len(load_vocab(cfg.vocab_file))
        except (OSError, ValueError) as e:
            raise InputError(f"--vocab_file {cfg.vocab_file}: {describe_error(e)}") from e
        # The config may pad the vocabulary up to a multiple of 8 (NVIDIA: 30522 -> 30528), never more
        if not config.vocab_size - 8 < vocab_size <= config.vocab_size:
            raise InputError(f"--vocab_file {cfg.vocab_file} has {vocab_size} tokens but the config's vocab_size is "
                             f"{config.vocab_size}: the vocabulary the shards were written with must match the "
                             "config (up to padding to a multiple of 8)")
    if cfg.max_seq_length > config.max_position_embeddings:
        raise InputError(f"--max_seq_length {cfg.max_seq_length} exceeds the config's max_position_embeddings "
                         f"{config.max_position_embeddings} ({cfg.config_file}): use shorter shards or a config with "
                         "more positions")
    set_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = BertForPreTraining(config)
    start = None
    if resume is None and cfg.phase2:
        start = cfg.init_checkpoint or Path(cfg.output_dir) / f"ckpt_{cfg.phase1_end_step}.pt"
        if not Path(start).exists():
            raise InputError(f"phase 2 starts from phase 1's checkpoint, but {start} does not exist: pass "
                             "--init_checkpoint "
                             f"or the right --phase1_end_step / --output_dir")
    elif resume is None and cfg.init_checkpoint:
        start = cfg.init_checkpoint
    elif resume is None and cfg.mlm_bias_init == "unigram" and cfg.do_train:
        from pretraining_data import unigram_log_prior

        first = sorted(Path(cfg.input_dir).glob("*.hdf5"))[0]
        with torch.no_grad():
            model.cls.predictions.bias.copy_(unigram_log_prior(first, model.cls.predictions.bias.numel()))
        log(f"masked-LM output bias: log unigram frequencies of the masked targets of {first.name}")
    if start is not None:
        try:
            state, _ = read_state_dict(start)
            for line in load_checkpoint_state(model, state, source=str(start)):
                log(line)
        except (OSError, CheckpointError) as e:
            raise InputError(f"cannot start from {start}: {describe_error(e)}") from e
        log(f"weights from {start}")
    return model


def main(argv: list[str] | None = None) -> int:
    """0: the phase ran to its --max_steps (or --steps_this_run); EXIT_STOPPED (75): stopped by a signal after its
    checkpoint, run again to resume; 1 (a one-line message): bad input or a failure."""
    from utils import script_errors, survive_broken_pipes

    with survive_broken_pipes():  # a launcher's dead `tee` must not cost the preemption checkpoint
        with script_errors("run_pretraining.py", argv):  # bad input, a checkpoint that does not fit, a diverged
            return _main(argv)  # run, a full disk: one line (--debug: the traceback)


def _main(argv: list[str] | None) -> int:
    e2e_start = time.perf_counter()
    cfg = parse_args(argv)

    from checkpoint_io import load_checkpoint_state
    from modeling import count_parameters
    from optimization import make_optimizer, param_groups_for_bert
    from schedulers import get_scheduler
    from utils import init_distributed, set_seed

    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    env = init_distributed(no_cuda=cfg.no_cuda)
    log = (lambda msg: print(f"run_pretraining: {msg}", flush=True)) if env.is_main else (lambda msg: None)
    logger = RunLogger(cfg.json_summary, Path(cfg.output_dir) / "tensorboard", enabled=env.is_main,
                       progress=not cfg.disable_progress_bar)
    stop = StopRequest().install()  # from the start: a preemption during set-up ends the run before its 1st step
    data = None
    try:
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        if env.is_main:
            checkpoint_manager(cfg).remove_interrupted_writes()
        shards = inspect_shards(list_shards(cfg.input_dir, "--input_dir"), cfg.shard_spec, "--input_dir") \
            if cfg.do_train else []
        if cfg.eval_dir:  # its shards are checked now, before the model is built, and read later
            inspect_shards(list_shards(cfg.eval_dir, "--eval_dir"), cfg.shard_spec, "--eval_dir")
        if cfg.do_train:  # evaluating alone writes nothing there
            refuse_used_output_dir(cfg)
        resume = find_resume_checkpoint(cfg, log) if cfg.resume_from_checkpoint else None
        raw_model = build_model(cfg, resume, log)
        model, precision = apply_parallelism_and_precision(
            raw_model, env, cfg.precision, loss_scale=cfg.loss_scale, init_loss_scale=cfg.init_loss_scale,
            checkpoint_activations=cfg.checkpoint_activations, allreduce_fp16=cfg.allreduce_post_accumulation_fp16,
            compile=True if cfg.compile else False if cfg.no_compile else None, compile_mode=cfg.compile_mode)
        log(f"precision {precision.name} ({precision.reason}); "
            f"{'torch.compile, mode ' + cfg.compile_mode if hasattr(model, '_orig_mod') else 'eager mode'}"
            f"{'' if cfg.compile or cfg.no_compile else ' (the default on a ' + env.device.type.upper() + ')'}")
        if precision.warning:
            log(f"warning: {precision.warning}")
        optimizer = make_optimizer(cfg.optimizer, param_groups_for_bert(raw_model, cfg.weight_decay),
                                   lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                   max_grad_norm=cfg.max_grad_norm if cfg.max_grad_norm > 0 else None,
                                   use_nvlamb=cfg.use_nvlamb, prefer_fused=env.device.type == "cuda")
        scheduler = get_scheduler(cfg.lr_schedule, optimizer, cfg.warmup_proportion, cfg.max_steps)
        state = TrainState(phase=2 if cfg.phase2 else 1, step_offset=cfg.phase1_end_step if cfg.phase2 else 0)
        position = DataPosition()
        if resume is not None and not cfg.do_train:  # evaluation only: the weights are all we need
            load_checkpoint_state(raw_model, resume["model"], source=f"ckpt_{resume['step']}.pt")
        elif resume is not None:
            state, position = restore_training_state(resume, cfg, env, raw_model, optimizer, scheduler, precision,
                                                     shards, log)
        eval_set = load_eval_set(cfg.eval_dir, cfg.shard_spec, cfg.max_eval_samples, env.rank, env.world_size) \
            if cfg.eval_dir else None
        validator = make_validator(cfg, eval_set, precision, env) if eval_set else None
        eval_fn = (lambda: _evaluated(validator(raw_model), log)) if validator else None
        logger.log("PARAMETER", {**dataclasses.asdict(cfg), "world_size": env.world_size, "device": str(env.device),
                                 "precision_requested": cfg.precision, "precision": precision.name,
                                 "precision_reason": precision.reason,
                                 "parameters": count_parameters(raw_model),
                                 "start_step": state.global_step})
        if not cfg.do_train:
            logger.log(state.global_step, eval_fn())
            return 0

        packed = shards[0].packed  # inspect_shards checked that every shard is packed alike
        if packed:
            log(f"packed shards: up to {packed} sequences a row, {shards[0].width} masked slots a row")
        masker = Masker.from_vocab(cfg.vocab_file, cfg.masked_lm_prob, _masked_slots(cfg, packed)) \
            if cfg.dynamic_masking else None
        data = PretrainingData(shards, cfg.seed, cfg.micro_batch_size, env.rank, env.world_size,
                               num_workers=cfg.num_workers, pin_memory=env.device.type == "cuda", masker=masker,
                               position=position, length_bins=cfg.length_bins)
        set_seed(cfg.seed + env.rank)  # dropout differs between ranks
        restore_rng(resume, cfg, env, log)  # last: nothing after this may draw from the global RNGs
        checkpoint_fn = lambda st: save_checkpoint(cfg, env, st, raw_model, optimizer, scheduler, precision,  # noqa: E731
                                                   data, log)
        summary = train(cfg, env, model, raw_model, precision, optimizer, scheduler, data, state, logger, eval_fn,
                        checkpoint_fn, stop)
        summary["e2e_train_time"] = time.perf_counter() - e2e_start
        logger.log("FINAL", summary)
        if summary["stopped_by_signal"]:
            return report_stop(cfg, summary, state, env)
        log(f"done: step {summary['step']}, final loss {summary['final_loss']}, "
            f"{summary['training_sequences_per_second']:.1f} rows/s ({summary['training_real_sequences_per_second']:.1f} "
            f"sequences/s, {summary['training_real_tokens_per_second']:.0f} real tokens/s)")
        return 0
    finally:
        stop.restore()
        if data is not None:
            data.close()
        logger.close()
        if owns_process_group:
            utils.end_process_group(clean=sys.exc_info()[0] is None)  # no barrier while an error propagates


if __name__ == "__main__":
    sys.exit(main())
