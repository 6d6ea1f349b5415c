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
a background thread. Masked-LM labels come from masked_lm_positions/masked_lm_ids: -1 everywhere else; position 0
is [CLS] and never masked, so a 0 in masked_lm_positions marks an unused slot (NVIDIA's loader stops at the first 0
after index 0: the same for its sorted positions). With --dynamic_masking the stored masks are undone and new ones
drawn by create_pretraining_data.dynamic_mask, seeded by (seed, epoch, shard, offset): every epoch differs, a
resumed run draws the same masks.

Loss. As NVIDIA's: per micro-batch, the mean MLM cross-entropy over its masked positions plus the NSP
cross-entropy, divided by the accumulation steps; DDP averages the ranks. (So 2 processes equal 1 exactly when the
ranks hold equally many masked positions, as in NVIDIA's recipe.)

Checkpoints (ckpt_<step>.pt, torch.load(weights_only=True) safe, written by rank 0 through a temporary file, fsync
and rename): model (Hugging Face names, what BertForPreTraining.from_pretrained reads), config, optimizer,
scheduler, grad scaler, every RNG state of every rank, the data position, phase and step. Every
--num_steps_per_checkpoint steps, at the end and on SIGTERM/SIGUSR1/SIGINT (the current step finishes, a checkpoint
is written, exit 75 = EX_TEMPFAIL: "run again to resume"; a second SIGINT stops at once); the newest
--keep_checkpoints of the phase are kept. DataLoader workers ignore those signals and are ended by the training
process; console output whose reader died (a launcher's `tee`) is dropped rather than ending the run. `--resume_from_checkpoint` continues from
the newest checkpoint of the phase that loads (or starts fresh when there is none, so a requeued job can always
pass it): with the same number of processes the run continues bit for bit as if never interrupted; with another
number the weights, optimizer, schedule and data position continue exactly, and the dropout RNG is re-seeded.

Logging (rank 0): dllogger-style JSON lines (--json-summary): a PARAMETER line, every --log_freq steps step,
average_loss, mlm_loss, nsp_loss, learning_rate, skipped_steps, loss_scale (and mfu on a known GPU, from model
FLOPs of real, non-padding tokens), eval_mlm_accuracy / eval_mlm_loss, and a FINAL line with final_loss,
training_sequences_per_second (sequences trained, after --throughput_warmup_steps) and e2e_train_time.
TensorBoard scalars in <output_dir>/tensorboard when the tensorboard package is installed. A tqdm bar.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import re
import signal
import sys
import time
import types
import typing
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

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
    num_workers: int = _flag(4, "DataLoader worker processes building micro-batches from the shard in memory "
                                "(0: in the training process)")
    # --- optimisation
    train_batch_size: int = _flag(32, "sequences per process per optimizer step (all micro-batches together)")
    gradient_accumulation_steps: int = _flag(1, "micro-batches per optimizer step: micro-batch = "
                                                "train_batch_size / gradient_accumulation_steps (must divide)")
    learning_rate: float = _flag(5e-5, "peak learning rate of NVLAMB")
    warmup_proportion: float = _flag(0.01, "fraction of --max_steps with a linear warm-up of the learning rate")
    lr_schedule: str = _flag("poly", "learning-rate schedule after warm-up (poly: NVIDIA's (1-progress)^0.5)",
                             choices=("poly", "linear", "cosine", "constant"))
    max_steps: int = _flag(1000, "optimizer steps of this phase in total (the schedule's length)")
    steps_this_run: int = _flag(-1, "stop after this many steps in this invocation (then checkpoint); -1: run "
                                    "to --max_steps")
    weight_decay: float = _flag(0.01, "decoupled weight decay (not for biases and LayerNorm)")
    max_grad_norm: float = _flag(1.0, "global gradient-norm clip of NVLAMB")
    use_nvlamb: bool = _flag(False, "apply LAMB's trust ratio also to the no-decay group (NVIDIA's NVLAMB switch)")
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
    compile: bool = _flag(False, "torch.compile the model")
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
            from utils import add_precision_arguments

            add_precision_arguments(group, meta["help"])
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
    return parser


def fail(message: str) -> typing.NoReturn:
    """A one-line error for bad input (exit status 1)."""
    raise SystemExit(f"run_pretraining.py: error: {message}")


def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    cfg = PretrainConfig(**vars(build_parser().parse_args(argv)))
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
        (cfg.resume_step != -1 and not cfg.resume_from_checkpoint,
         "--resume_step needs --resume_from_checkpoint"),
        (cfg.phase2 and cfg.phase1_end_step < 0, f"--phase1_end_step {cfg.phase1_end_step} must not be negative"),
        (cfg.debug_inject_inf_at_step > 0 and cfg.precision != "fp16",
         "--debug_inject_inf_at_step is for --precision fp16 runs only"),
        (cfg.dynamic_masking and not cfg.vocab_file, "--dynamic_masking needs --vocab_file (the [MASK] id and "
                                                     "the vocabulary size)"),
        (not 0.0 < cfg.masked_lm_prob <= 1.0, f"--masked_lm_prob {cfg.masked_lm_prob} must be in (0, 1]"),
        (not cfg.do_train and not cfg.eval_dir, "nothing to do: pass --do_train (and/or --eval_dir to evaluate)"),
        (cfg.do_train and not cfg.input_dir, "--do_train needs --input_dir (a folder of .hdf5 shards)"),
    ]
    for bad, message in checks:
        if bad:
            fail(message)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# Data: the global stream of samples (see the module docstring), this rank's micro-batches of it.

SHARD_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
              "next_sentence_labels")


@dataclass
class DataPosition:
    """Where the global sample stream stands: after `sample_offset` samples of the `shard_index`-th shard of
    epoch `epoch`'s shard order. The same on every rank."""

    epoch: int = 0
    shard_index: int = 0
    sample_offset: int = 0


@dataclass
class ShardInfo:
    path: Path
    num_samples: int
    unmasked: bool  # written with --no_static_masking: masked_lm_* are empty


def list_shards(folder: str, flag: str) -> list[Path]:
    path = Path(folder)
    if not path.is_dir():
        fail(f"{flag} {folder} is not a folder")
    shards = sorted(p for p in path.iterdir() if p.suffix == ".hdf5" and p.is_file())
    if not shards:
        fail(f"{flag} {folder} holds no .hdf5 shards (make them with create_pretraining_data.py)")
    return shards


def inspect_shards(paths: list[Path], cfg: PretrainConfig, flag: str) -> list[ShardInfo]:
    """Open every shard's metadata once: sizes, and a one-line error for a shard that does not fit the flags."""
    import h5py

    infos = []
    for path in paths:
        try:
            with h5py.File(path, "r") as f:
                missing = [k for k in SHARD_KEYS if k not in f]
                if missing:
                    fail(f"{flag}: shard {path} lacks {missing}: not a pre-training shard in NVIDIA's layout")
                n, seq = f["input_ids"].shape
                width = f["masked_lm_positions"].shape[1]
                unmasked = f.attrs.get("masking", "static") == "dynamic"
        except OSError as e:
            fail(f"{flag}: shard {path} cannot be read as HDF5 ({e})")
        if seq != cfg.max_seq_length:
            fail(f"{flag}: shard {path} has sequences of length {seq} but --max_seq_length is {cfg.max_seq_length}")
        if width > cfg.max_predictions_per_seq:
            fail(f"{flag}: shard {path} has {width} masked positions per sequence but --max_predictions_per_seq "
                 f"is {cfg.max_predictions_per_seq}")
        if unmasked and not cfg.dynamic_masking:
            fail(f"{flag}: shard {path} was written without masks (--no_static_masking): pass --dynamic_masking")
        infos.append(ShardInfo(path, int(n), bool(unmasked)))
    return infos


def epoch_shard_order(seed: int, epoch: int, num_shards: int) -> np.ndarray:
    """The order in which epoch `epoch` visits the (sorted) shards."""
    return np.random.default_rng([seed, epoch]).permutation(num_shards)


def shard_sample_order(seed: int, epoch: int, shard: int, num_samples: int) -> np.ndarray:
    """The order in which epoch `epoch` reads the samples of shard `shard` (its index in sorted order)."""
    return np.random.default_rng([seed, epoch, shard, 1]).permutation(num_samples)


def mlm_labels(positions: np.ndarray, ids: np.ndarray, seq_len: int) -> np.ndarray:
    """Masked-LM labels [B,S] int64 from masked_lm_positions/masked_lm_ids [B,P]: the original token id at every
    masked position, -1 elsewhere. Position 0 is [CLS], never masked, so a 0 marks an unused slot."""
    labels = np.full((positions.shape[0], seq_len), -1, dtype=np.int64)
    used = positions > 0
    rows = np.nonzero(used)[0]
    labels[rows, positions[used]] = ids[used]
    return labels


def unmask(input_ids: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Put the original tokens back at the masked positions (to re-mask statically masked shards dynamically)."""
    out = input_ids.copy()
    used = positions > 0
    rows = np.nonzero(used)[0]
    out[rows, positions[used]] = ids[used]
    return out


@dataclass
class Masker:
    """Dynamic masking with create_pretraining_data.dynamic_mask; special ids are never masked."""

    vocab_size: int
    special_ids: tuple[int, ...]
    mask_id: int
    masked_lm_prob: float
    max_predictions: int

    @classmethod
    def from_vocab(cls, vocab_file: str, cfg: PretrainConfig) -> "Masker":
        from tokenization import load_vocab

        vocab = load_vocab(vocab_file)
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if t not in vocab]
        if missing:
            fail(f"--vocab_file {vocab_file} lacks {missing}: is it a BERT vocab.txt?")
        special = tuple(vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
        return cls(len(vocab), special, vocab["[MASK]"], cfg.masked_lm_prob, cfg.max_predictions_per_seq)

    def __call__(self, input_ids: np.ndarray, input_mask: np.ndarray, seed: list[int]):
        from create_pretraining_data import dynamic_mask

        return dynamic_mask(input_ids, input_mask, self.vocab_size, self.special_ids, np.random.default_rng(seed),
                            self.masked_lm_prob, self.max_predictions, self.mask_id)


def to_model_inputs(arrays: dict[str, np.ndarray], rows: slice, masker: Masker | None = None,
                    mask_seed: list[int] | None = None) -> dict[str, torch.Tensor]:
    """One micro-batch as BertForPreTraining's keyword arguments: input_ids, token_type_ids, attention_mask,
    masked_lm_labels [B,S] (int64) and next_sentence_labels [B] (int64)."""
    input_ids = arrays["input_ids"][rows]
    input_mask = arrays["input_mask"][rows]
    positions, ids = arrays["masked_lm_positions"][rows], arrays["masked_lm_ids"][rows]
    if masker is not None:
        original = unmask(input_ids, positions, ids)
        input_ids, positions, ids = masker(original, input_mask, mask_seed)
    return {
        "input_ids": torch.from_numpy(input_ids.astype(np.int64)),
        "token_type_ids": torch.from_numpy(arrays["segment_ids"][rows].astype(np.int64)),
        "attention_mask": torch.from_numpy(input_mask.astype(np.int64)),
        "masked_lm_labels": torch.from_numpy(mlm_labels(positions, ids, input_ids.shape[1])),
        "next_sentence_labels": torch.from_numpy(arrays["next_sentence_labels"][rows].astype(np.int64)),
    }


def read_rows(path: Path, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The given rows of a shard, in that order. The whole shard is read (sequential reads are fast, and the
    page cache serves the other ranks of the node), then only these rows are kept."""
    import h5py

    with h5py.File(path, "r") as f:
        return {key: f[key][()][rows] for key in SHARD_KEYS}


class ShardBatches(torch.utils.data.Dataset):
    """This rank's micro-batches of one loaded shard: item k is rows [k*B, (k+1)*B) of `arrays`, which hold the
    rank's slices of consecutive global micro-batches. `offsets[k]` is the global sample offset of item k within
    the shard's permutation (it seeds dynamic masking)."""

    def __init__(self, arrays: dict[str, np.ndarray], micro_batch: int, offsets: np.ndarray,
                 mask_key: list[int], masker: Masker | None):
        self.arrays, self.micro_batch, self.offsets = arrays, micro_batch, offsets
        self.mask_key, self.masker = mask_key, masker

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        rows = slice(k * self.micro_batch, (k + 1) * self.micro_batch)
        return to_model_inputs(self.arrays, rows, self.masker, [*self.mask_key, int(self.offsets[k])])


class PretrainingData:
    """The infinite stream of this rank's micro-batches, from `position` on.

    Iterating yields dicts of CPU tensors (see to_model_inputs); after each one, `position` is the data position
    just after the global micro-batch it belongs to, which is what a checkpoint stores.
    """

    def __init__(self, shards: list[ShardInfo], seed: int, micro_batch: int, rank: int, world_size: int,
                 num_workers: int = 0, pin_memory: bool = False, masker: Masker | None = None,
                 position: DataPosition | None = None):
        self.shards, self.seed, self.micro_batch = shards, seed, micro_batch
        self.rank, self.world_size = rank, world_size
        self.global_batch = micro_batch * world_size
        self.num_workers, self.pin_memory, self.masker = num_workers, pin_memory, masker
        self.position = position or DataPosition()
        if max(s.num_samples for s in shards) < self.global_batch:
            fail(f"every shard holds fewer samples than one global micro-batch ({self.global_batch} = micro-batch "
                 f"{micro_batch} x {world_size} processes): use a smaller batch or bigger shards")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self._stream: Iterator | None = None

    def shard_order(self, epoch: int) -> np.ndarray:
        return epoch_shard_order(self.seed, epoch, len(self.shards))

    def _usable(self, pos: DataPosition) -> DataPosition:
        """The first position at or after `pos` with a whole global micro-batch left in its shard."""
        while True:
            if pos.shard_index >= len(self.shards):
                pos = DataPosition(pos.epoch + 1, 0, 0)
            shard = self.shards[self.shard_order(pos.epoch)[pos.shard_index]]
            if pos.sample_offset + self.global_batch <= shard.num_samples:
                return pos
            pos = DataPosition(pos.epoch, pos.shard_index + 1, 0)

    def _load(self, pos: DataPosition) -> tuple[DataPosition, ShardBatches]:
        """Read this rank's rows of the shard at `pos` (runs in the prefetch thread)."""
        shard_id = int(self.shard_order(pos.epoch)[pos.shard_index])
        shard = self.shards[shard_id]
        order = shard_sample_order(self.seed, pos.epoch, shard_id, shard.num_samples)
        n_batches = (shard.num_samples - pos.sample_offset) // self.global_batch
        blocks = order[pos.sample_offset: pos.sample_offset + n_batches * self.global_batch]
        blocks = blocks.reshape(n_batches, self.world_size, self.micro_batch)[:, self.rank]  # [K, B]
        offsets = pos.sample_offset + self.global_batch * np.arange(n_batches)
        arrays = read_rows(shard.path, blocks.reshape(-1))
        mask_key = [self.seed, pos.epoch, shard_id, 2]
        return pos, ShardBatches(arrays, self.micro_batch, offsets, mask_key, self.masker)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._stream = self._batches()
        return self._stream

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        pos = self._usable(self.position)
        pending: Future = self._pool.submit(self._load, pos)
        while True:
            pos, batches = pending.result()
            following = self._usable(DataPosition(pos.epoch, pos.shard_index + 1, 0))
            pending = self._pool.submit(self._load, following)  # read the next shard while this one trains
            # An explicit generator keeps the DataLoader off the global torch RNG (dropout's), so that a resumed
            # run draws the same dropout masks as an uninterrupted one.
            loader = torch.utils.data.DataLoader(
                batches, batch_size=None, shuffle=False, num_workers=self.num_workers, pin_memory=self.pin_memory,
                generator=torch.Generator().manual_seed(self.seed), worker_init_fn=_ignore_stop_signals)
            stream = iter(loader)
            try:
                for k, batch in enumerate(stream):
                    self.position = DataPosition(pos.epoch, pos.shard_index,
                                                 int(batches.offsets[k]) + self.global_batch)
                    yield batch
            finally:  # also on close(): the workers ignore SIGTERM, so they must be told to go, now
                getattr(stream, "_shutdown_workers", lambda: None)()
            pos = following

    def close(self) -> None:
        """End the stream and its DataLoader workers (on every way out of main, errors included: a worker left
        behind would keep the interpreter's exit waiting for it forever) and the prefetch thread."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers ignore SIGTERM/SIGUSR1/SIGINT: Slurm, `timeout` and Ctrl-C signal every process of the
    job, and a worker dying of it would crash the training process before it can write its checkpoint. The
    training process ends them (PretrainingData.close); if it dies, they notice and exit on their own."""
    for sig in StopRequest.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def load_eval_set(cfg: PretrainConfig, rank: int, world_size: int) -> dict[str, np.ndarray]:
    """The held-out samples (all --eval_dir shards in sorted order, the first --max_eval_samples); rank r keeps
    samples r, r + W, ..."""
    import h5py

    parts: list[dict[str, np.ndarray]] = []
    remaining = cfg.max_eval_samples or math.inf
    for info in inspect_shards(list_shards(cfg.eval_dir, "--eval_dir"), cfg, "--eval_dir"):
        take = int(min(info.num_samples, remaining))
        with h5py.File(info.path, "r") as f:
            parts.append({key: f[key][:take] for key in SHARD_KEYS})
        remaining -= take
        if remaining <= 0:
            break
    return {key: np.concatenate([p[key] for p in parts])[rank::world_size] for key in SHARD_KEYS}


# ---------------------------------------------------------------------------------------------------------------
# The model: parallelism and precision applied in one place.


@dataclass
class Precision:
    """How the maths runs: `name` fp32/tf32/fp16/bf16, autocast for the forward pass, a GradScaler for fp16."""

    name: str
    device: torch.device
    scaler: torch.amp.GradScaler
    static_loss_scale: float | None = None  # fp16 with --loss_scale > 0
    reason: str = ""  # why this precision (what --precision auto saw), logged with the parameters
    warning: str | None = None  # one line when the hardware only emulates the precision asked for

    def autocast(self) -> contextlib.AbstractContextManager:
        from utils import autocast

        return autocast(self.name, self.device)

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0


def apply_parallelism_and_precision(model: torch.nn.Module, cfg: PretrainConfig, env,
                                    ) -> tuple[torch.nn.Module, Precision]:
    """Turn the bare BertForPreTraining into the module the loop trains, and decide how its maths runs.
    The order matters; each step says why it comes where it does. Returns (model to call, Precision)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from utils import configure_tf32, resolve_precision

    cuda = env.device.type == "cuda"
    # 0. Which precision runs: --precision auto follows the hardware (bf16 only where it is native).
    choice = resolve_precision(cfg.precision, env.device)
    fp16 = choice.name == "fp16"
    # 1. TF32: fp32 matmuls (the tf32 run, and what autocast leaves in fp32) on tensor cores, on GPUs that have
    #    them, unless fp32 was asked for by name; a no-op on CPU.
    configure_tf32(cuda and choice.name != "fp32")
    # 2. Activation checkpointing is a property of the bare encoder: set it before anything wraps the module.
    model.bert.encoder.checkpoint_activations = cfg.checkpoint_activations
    # 3. Weights to the device, and they stay fp32: autocast casts per op, the optimizer updates fp32 weights.
    model.to(env.device)
    # 4. DDP: broadcasts rank 0's weights now, and averages gradients over ranks in buckets during backward.
    #    Gradients are views into the buckets (no copy); no buffers need broadcasting in BERT.
    if env.distributed:
        model = DDP(model, device_ids=[env.local_rank] if cuda else None, broadcast_buffers=False,
                    gradient_as_bucket_view=True)
        # 5. The comm hook compresses each bucket to 16 bits for the all-reduce (and back): half the traffic.
        #    bf16 (fp32's range) with --bf16 on GPUs; PyTorch's bf16 hook needs NCCL, so gloo (CPU) uses fp16.
        if cfg.allreduce_post_accumulation_fp16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.bf16_compress_hook if choice.name == "bf16" and cuda \
                else default_hooks.fp16_compress_hook
            model.register_comm_hook(None, hook)
    # 6. torch.compile goes around DDP, so that its DDPOptimizer splits the graph at bucket boundaries and the
    #    all-reduces still overlap the backward pass.
    if cfg.compile:
        model = torch.compile(model)
    # 7. Precision. fp16 needs loss scaling (its range is narrow); bf16 has fp32's range and needs none.
    static = cfg.loss_scale if fp16 and cfg.loss_scale > 0 else None
    scaler = torch.amp.GradScaler(env.device.type, init_scale=static or cfg.init_loss_scale, enabled=fp16)
    return model, Precision(choice.name, env.device, scaler, static, choice.reason, choice.warning)


def grad_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() (gradients accumulate locally, no all-reduce) unless `sync` or the model is not DDP."""
    inner = getattr(model, "_orig_mod", model)  # under torch.compile
    if sync or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


def forward_backward(model: torch.nn.Module, batch: dict[str, torch.Tensor], precision: Precision, accum: int,
                     sync: bool) -> torch.Tensor:
    """Forward and backward of one micro-batch; gradients accumulate in .grad (all-reduced unless not `sync`).
    Returns the detached (total, mlm, nsp) losses divided by `accum`, [3] float64."""
    with grad_sync(model, sync):  # no_sync must cover the forward and the backward
        with precision.autocast():  # autocast for the forward only, as PyTorch recommends
            total, mlm, nsp = model(**batch)[:3]
        precision.scaler.scale(total / accum).backward()  # the scaler is a no-op unless fp16
    return torch.stack([total, mlm, nsp]).detach().double() / accum


def optimizer_step(optimizer: torch.optim.Optimizer, precision: Precision) -> bool:
    """Take the optimizer step unless fp16 gradients overflowed. Returns True when the step was taken.

    fp16: unscale the gradients; if any is inf/NaN skip the step (the GradScaler then halves a dynamic scale; a
    static one stays). fp32/bf16: always step.
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


def _inject_inf(model: torch.nn.Module) -> None:
    """TEST ONLY (--debug_inject_inf_at_step): an inf in the first gradient, as an fp16 overflow would leave."""
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    grad.view(-1)[0] = float("inf")


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints

_CKPT_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def list_checkpoints(folder: str | Path) -> dict[int, Path]:
    """step -> path of every ckpt_<step>.pt in `folder` (temporary files of interrupted writes are not listed)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    found = {}
    for p in folder.iterdir():
        m = _CKPT_NAME.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def phase_checkpoints(cfg: PretrainConfig) -> dict[int, Path]:
    """This phase's checkpoints: steps up to --max_steps in phase 1, steps after --phase1_end_step in phase 2 (so
    re-running phase 1 with --resume_from_checkpoint after phase 2 began finds phase 1's last one)."""
    found = list_checkpoints(cfg.output_dir).items()
    if cfg.phase2:
        return {s: p for s, p in found if s > cfg.phase1_end_step}
    return {s: p for s, p in found if s <= cfg.max_steps}


def read_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def find_resume_checkpoint(cfg: PretrainConfig, log) -> dict[str, Any] | None:
    """The checkpoint to continue from (--resume_step's, or the newest that loads), or None to start fresh."""
    found = phase_checkpoints(cfg)
    if cfg.resume_step != -1:
        if cfg.resume_step not in found:
            fail(f"--resume_step {cfg.resume_step}: {cfg.output_dir}/ckpt_{cfg.resume_step}.pt is not a checkpoint "
                 f"of this phase (found steps {list(found) or 'none'})")
        return read_checkpoint(found[cfg.resume_step])
    for step in reversed(found):
        try:
            ckpt = read_checkpoint(found[step])
        except Exception as e:  # truncated or corrupted by something outside our atomic writes: fall back
            log(f"checkpoint {found[step]} cannot be read ({str(e).splitlines()[0]}); trying an older one")
            continue
        if {"model", "optimizer", "data", "step"} <= set(ckpt):
            return ckpt
        log(f"checkpoint {found[step]} is incomplete (no training state); trying an older one")
    return None


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
    oldest checkpoints of the phase beyond --keep_checkpoints."""
    from modeling import REDUNDANT_KEYS
    from utils import atomic_torch_save, rng_state

    rngs = gather_objects(rng_state(), env)
    if not env.is_main:
        return
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
                 "files": [s.path.name for s in data.shards]},
        "phase": state.phase,
        "step": state.global_step,
        "phase_step": state.step,
        "phase1_end_step": state.step_offset,
        "skipped_steps": state.skipped_steps,
        "world_size": env.world_size,
        "args": dataclasses.asdict(cfg),
    }
    path = Path(cfg.output_dir) / f"ckpt_{state.global_step}.pt"
    atomic_torch_save(ckpt, path)
    for old in list(phase_checkpoints(cfg).values())[:-cfg.keep_checkpoints]:
        old.unlink(missing_ok=True)
    log(f"saved {path}")


def restore_training_state(ckpt: dict[str, Any], cfg: PretrainConfig, env, raw_model, optimizer, scheduler,
                           precision: Precision, shards: list[ShardInfo], log) -> tuple[TrainState, DataPosition]:
    """Load a checkpoint of this phase into the freshly built objects; returns the step counters and the data
    position to continue from. RNG states are restored last, by the caller."""
    from modeling import load_checkpoint_state

    if ckpt["phase"] != (2 if cfg.phase2 else 1):
        fail(f"the checkpoint of step {ckpt['step']} is from phase {ckpt['phase']}, but this run is phase "
             f"{2 if cfg.phase2 else 1} (--phase2 / --phase1_end_step)")
    if ckpt.get("optimizer_class") != type(optimizer).__name__:
        fail(f"the checkpoint's optimizer is {ckpt.get('optimizer_class')}, this run's {type(optimizer).__name__}: "
             f"resume with the same set-up")
    load_checkpoint_state(raw_model, ckpt["model"], source=f"ckpt_{ckpt['step']}.pt")
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if precision.scaler.is_enabled() and ckpt["grad_scaler"] is not None:
        precision.scaler.load_state_dict(ckpt["grad_scaler"])
    files = [s.path.name for s in shards]
    d = ckpt["data"]
    if d["files"] != files:
        fail(f"--input_dir {cfg.input_dir} does not hold the shards the checkpoint was trained on "
             f"({len(d['files'])} then, {len(files)} now): resume with the same data")
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
    found = phase_checkpoints(cfg)
    if found and not cfg.resume_from_checkpoint:
        names = ", ".join(p.name for p in list(found.values())[-3:])
        fail(f"--output_dir {cfg.output_dir} already holds checkpoints ({names}): pass --resume_from_checkpoint "
             f"to continue that run, or choose an empty folder")


def remove_interrupted_writes(folder: str) -> None:
    """Temporary files left by a checkpoint write that was killed (utils.atomic_open names them .<name>.*.tmp)."""
    for p in Path(folder).glob(".ckpt_*.pt.*.tmp"):
        p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(model: torch.nn.Module, eval_set: dict[str, np.ndarray], batch_size: int, precision: Precision,
             env) -> dict[str, float]:
    """Masked-LM accuracy and mean cross-entropy over every masked position of the held-out set (all ranks)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # correct, predicted positions, loss sum
    for start in range(0, len(eval_set["input_ids"]), batch_size):
        batch = {k: v.to(env.device) for k, v in to_model_inputs(eval_set, slice(start, start + batch_size)).items()}
        with precision.autocast():
            scores = model(**batch)[3].float()  # [M, V] at the masked positions, in row-major order
        labels = batch["masked_lm_labels"].view(-1)
        labels = labels[labels >= 0]
        sums += torch.stack([(scores.argmax(-1) == labels).sum().double(), torch.tensor(labels.numel(),
                             dtype=torch.float64, device=env.device),
                             torch.nn.functional.cross_entropy(scores, labels, reduction="sum").double()])
    if env.distributed:
        torch.distributed.all_reduce(sums)
    model.train(was_training)
    correct, count, loss = sums.tolist()
    return {"eval_mlm_accuracy": correct / max(count, 1), "eval_mlm_loss": loss / max(count, 1),
            "eval_masked_positions": int(count)}


# ---------------------------------------------------------------------------------------------------------------
# Logging helpers


EXIT_STOPPED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after its checkpoint; run again to resume


class StopRequest:
    """SIGTERM (Slurm preemption, `scancel`, `timeout`), SIGUSR1 (`sbatch --signal`) or SIGINT (Ctrl-C) sets a
    flag; the loop checks it between optimizer steps, writes a checkpoint, and main() exits EXIT_STOPPED. A second
    SIGINT interrupts at once (KeyboardInterrupt), for a user who does not want to wait for the step."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.signal_name: str | None = None  # the first stop signal received
        self._previous: dict[int, Any] = {}

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

    def agreed(self, env) -> bool:
        """True when any rank was signalled: every rank stops after the same step."""
        if not env.distributed:
            return self.requested
        flag = torch.tensor([int(self.requested)], device=env.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())


class RunLogger:
    """utils.JsonLogger (dllogger-style JSON lines), plus TensorBoard scalars when the tensorboard package is
    installed (optional); rank 0 only."""

    def __init__(self, json_path: str, output_dir: str, enabled: bool):
        from utils import JsonLogger

        self.json = JsonLogger(json_path, enabled=enabled)
        self.tensorboard = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is not a requirement
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tensorboard = SummaryWriter(str(Path(output_dir) / "tensorboard"))

    def log(self, step: Any, data: dict[str, Any]) -> None:
        self.json.log(step, data)
        if self.tensorboard is None or not isinstance(step, int):
            return
        for key, value in data.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tensorboard.add_scalar(key, value, step)

    def close(self) -> None:
        self.json.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


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


class Meter:
    """What the log lines report: losses summed on the device between two log lines (no host sync per step), and
    throughput (sequences and model FLOPs) over the steps after the first --throughput_warmup_steps of this run
    (start-up, compilation and cache warm-up are left out)."""

    def __init__(self, env, warmup_steps: int, sequences_per_step: int, peak_flops: float | None):
        self.env, self.warmup_steps, self.sequences_per_step, self.peak = env, warmup_steps, sequences_per_step, \
            peak_flops
        self.losses = torch.zeros(3, dtype=torch.float64, device=env.device)  # total, mlm, nsp
        self.attempts = 0  # optimizer steps attempted since the last flush (skipped ones included)
        self.steps = 0  # optimizer steps taken in this run
        self.run_start = self.start = time.perf_counter()
        self.sequences, self.flops = 0, 0.0

    def add_batch(self, config, batch: dict[str, torch.Tensor]) -> None:
        """Model FLOPs of one micro-batch of this rank, counting only real (non-padding) tokens (for MFU)."""
        if self.peak:
            from modeling import flops_per_sequence

            lengths = batch["attention_mask"].sum(1).double()
            masked = (batch["masked_lm_labels"] >= 0).sum(1).double()
            self.flops += float(flops_per_sequence(config, lengths, masked).sum())

    def add_attempt(self, losses: torch.Tensor) -> None:
        self.losses += losses
        self.attempts += 1

    def step_taken(self) -> None:
        self.steps += 1
        if self.steps <= self.warmup_steps:  # still warming up: restart the clock
            self._sync()
            self.start, self.sequences, self.flops = time.perf_counter(), 0, 0.0
        else:
            self.sequences += self.sequences_per_step

    def _sync(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize()

    def mean_losses(self) -> list[float]:
        """Mean (total, mlm, nsp) loss per attempted step since the last call, over every rank."""
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

    def sequences_per_second(self) -> float:
        """Sequences trained (all ranks) per second after the warm-up; a run no longer than the warm-up is
        timed whole, start-up included."""
        self._sync()
        if self.sequences == 0:
            return self.steps * self.sequences_per_step / max(time.perf_counter() - self.run_start, 1e-9)
        return self.sequences / max(time.perf_counter() - self.start, 1e-9)


# ---------------------------------------------------------------------------------------------------------------
# The training loop


def train(cfg: PretrainConfig, env, model, raw_model, precision: Precision, optimizer, scheduler,
          data: PretrainingData, state: TrainState, logger, eval_fn, checkpoint_fn, stop: StopRequest) -> dict:
    """Optimizer steps until --max_steps (or --steps_this_run, or a stop signal). Returns the final summary."""
    from tqdm import tqdm

    accum = cfg.gradient_accumulation_steps
    last_step = cfg.max_steps if cfg.steps_this_run < 0 else min(cfg.max_steps, state.step + cfg.steps_this_run)
    meter = Meter(env, cfg.throughput_warmup_steps, cfg.train_batch_size * env.world_size,
                  peak_flops(env.device, precision.name))
    bar = tqdm(total=last_step, initial=state.step, unit="step", dynamic_ncols=True,
               disable=cfg.disable_progress_bar or not env.is_main)
    batches = iter(data)
    saved_at, last_loss, inject, consecutive_skips = -1, None, cfg.debug_inject_inf_at_step, 0
    model.train()

    while state.step < last_step and not stop.agreed(env):
        # Forward and backward over the micro-batches; gradients accumulate, and are all-reduced after every
        # micro-batch, or only after the last one with --allreduce_post_accumulation.
        losses = torch.zeros(3, dtype=torch.float64, device=env.device)
        for micro_step in range(accum):
            batch = next(batches)
            meter.add_batch(raw_model.config, batch)
            batch = {k: v.to(env.device, non_blocking=True) for k, v in batch.items()}
            sync = micro_step == accum - 1 or not cfg.allreduce_post_accumulation
            losses += forward_backward(model, batch, precision, accum, sync)
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
                fail(f"50 fp16 overflows in a row at step {state.global_step}: the loss diverged (lower "
                     f"--learning_rate, or use --precision bf16)")
            continue
        consecutive_skips = 0
        scheduler.step()
        state.step += 1
        meter.step_taken()
        bar.update(1)
        done = state.step == last_step

        if state.step % cfg.log_freq == 0 or done:
            average, mlm_loss, nsp_loss = meter.mean_losses()
            if not math.isfinite(average):
                fail(f"the loss is {average} at step {state.global_step}: training diverged (lower "
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
            checkpoint_fn(state)
            saved_at = state.step

    stopped = state.step < last_step
    if stopped and not cfg.skip_checkpoint and meter.steps and saved_at != state.step:
        checkpoint_fn(state)  # preempted: save where we are, so that the requeued job continues from here
    bar.close()
    return {"final_loss": last_loss, "training_sequences_per_second": meter.sequences_per_second(),
            "step": state.global_step, "phase_step": state.step, "skipped_steps": state.skipped_steps,
            "stopped_by_signal": (stop.signal_name or "a signal on another rank") if stopped else None}


# ---------------------------------------------------------------------------------------------------------------
# main


def report_stop(cfg: PretrainConfig, summary: dict, state: TrainState, env) -> int:
    """One line on stderr for a run stopped by a signal (what a launcher and a person need), and EXIT_STOPPED."""
    saved = "" if cfg.skip_checkpoint or not state.step else f" (checkpoint ckpt_{state.global_step}.pt)"
    again = "run the same command again to resume" if cfg.resume_from_checkpoint else \
        "run the same command with --resume_from_checkpoint to resume"
    if env.is_main:
        print(f"run_pretraining.py: phase {state.phase} stopped at step {state.global_step} by "
              f"{summary['stopped_by_signal']}{saved}: {again}", file=sys.stderr, flush=True)
    return EXIT_STOPPED


def build_model(cfg: PretrainConfig, resume: dict[str, Any] | None, log):
    """BertForPreTraining from --config_file, with its starting weights: random (seeded identically on every
    rank), or --init_checkpoint / phase 1's checkpoint when not resuming (the resume checkpoint's weights are
    loaded later, with the rest of its state)."""
    from modeling import BertConfig, BertForPreTraining, CheckpointError, load_checkpoint_state, read_state_dict
    from utils import set_seed

    try:
        config = BertConfig.from_json_file(cfg.config_file)
    except (OSError, ValueError) as e:
        fail(f"--config_file: {e}")
    if cfg.vocab_file:
        from tokenization import load_vocab

        vocab_size = len(load_vocab(cfg.vocab_file))
        if vocab_size > config.vocab_size:
            fail(f"--vocab_file {cfg.vocab_file} has {vocab_size} tokens but the config's vocab_size is "
                 f"{config.vocab_size}")
    set_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = BertForPreTraining(config)
    start = None
    if resume is None and cfg.phase2:
        start = cfg.init_checkpoint or Path(cfg.output_dir) / f"ckpt_{cfg.phase1_end_step}.pt"
        if not Path(start).exists():
            fail(f"phase 2 starts from phase 1's checkpoint, but {start} does not exist: pass --init_checkpoint "
                 f"or the right --phase1_end_step / --output_dir")
    elif resume is None and cfg.init_checkpoint:
        start = cfg.init_checkpoint
    if start is not None:
        try:
            state, _ = read_state_dict(start)
            for line in load_checkpoint_state(model, state, source=str(start)):
                log(line)
        except (OSError, CheckpointError) as e:
            fail(f"cannot start from {start}: {e}")
        log(f"weights from {start}")
    return model


def main(argv: list[str] | None = None) -> int:
    """0: the phase ran to its --max_steps (or --steps_this_run); EXIT_STOPPED (75): stopped by a signal after its
    checkpoint, run again to resume; 1 (a one-line message): bad input or a failure."""
    from utils import survive_broken_pipes

    with survive_broken_pipes():  # a launcher's dead `tee` must not cost the preemption checkpoint
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    e2e_start = time.perf_counter()
    cfg = parse_args(argv)

    from modeling import count_parameters, load_checkpoint_state
    from optimization import make_lamb, param_groups_for_bert
    from schedulers import get_scheduler
    from utils import init_distributed, set_seed

    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    env = init_distributed(no_cuda=cfg.no_cuda)
    log = (lambda msg: print(f"run_pretraining: {msg}", flush=True)) if env.is_main else (lambda msg: None)
    logger = RunLogger(cfg.json_summary, cfg.output_dir, enabled=env.is_main)
    stop = StopRequest().install()  # from the start: a preemption during set-up ends the run before its 1st step
    data = None
    try:
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        if env.is_main:
            remove_interrupted_writes(cfg.output_dir)
        shards = inspect_shards(list_shards(cfg.input_dir, "--input_dir"), cfg, "--input_dir") if cfg.do_train \
            else []
        if cfg.do_train:  # evaluating alone writes nothing there
            refuse_used_output_dir(cfg)
        resume = find_resume_checkpoint(cfg, log) if cfg.resume_from_checkpoint else None
        raw_model = build_model(cfg, resume, log)
        model, precision = apply_parallelism_and_precision(raw_model, cfg, env)
        log(f"precision {precision.name} ({precision.reason})")
        if precision.warning:
            log(f"warning: {precision.warning}")
        optimizer = make_lamb(param_groups_for_bert(raw_model, cfg.weight_decay), lr=cfg.learning_rate,
                              weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                              use_nvlamb=cfg.use_nvlamb, prefer_fused=env.device.type == "cuda")
        scheduler = get_scheduler(cfg.lr_schedule, optimizer, cfg.warmup_proportion, cfg.max_steps)
        state = TrainState(phase=2 if cfg.phase2 else 1, step_offset=cfg.phase1_end_step if cfg.phase2 else 0)
        position = DataPosition()
        if resume is not None and not cfg.do_train:  # evaluation only: the weights are all we need
            load_checkpoint_state(raw_model, resume["model"], source=f"ckpt_{resume['step']}.pt")
        elif resume is not None:
            state, position = restore_training_state(resume, cfg, env, raw_model, optimizer, scheduler, precision,
                                                     shards, log)
        eval_set = load_eval_set(cfg, env.rank, env.world_size) if cfg.eval_dir else None
        eval_batch = cfg.eval_batch_size or cfg.micro_batch_size
        eval_fn = (lambda: evaluate(raw_model, eval_set, eval_batch, precision, env)) if eval_set else None
        logger.log("PARAMETER", {**dataclasses.asdict(cfg), "world_size": env.world_size, "device": str(env.device),
                                 "precision_requested": cfg.precision, "precision": precision.name,
                                 "precision_reason": precision.reason,
                                 "parameters": count_parameters(raw_model),
                                 "start_step": state.global_step})
        if not cfg.do_train:
            logger.log(state.global_step, eval_fn())
            return 0

        masker = Masker.from_vocab(cfg.vocab_file, cfg) if cfg.dynamic_masking else None
        data = PretrainingData(shards, cfg.seed, cfg.micro_batch_size, env.rank, env.world_size,
                               num_workers=cfg.num_workers, pin_memory=env.device.type == "cuda", masker=masker,
                               position=position)
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
            f"{summary['training_sequences_per_second']:.1f} sequences/s")
        return 0
    finally:
        stop.restore()
        if data is not None:
            data.close()
        logger.close()
        if owns_process_group and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
