"""Pre-training data: NVIDIA's HDF5 shards -> the global stream of samples -> this rank's micro-batches.

Shards (create_pretraining_data.py writes them): input_ids, input_mask, segment_ids [N, S]; masked_lm_positions,
masked_lm_ids [N, P] (a 0 position marks an unused slot: position 0 is [CLS], never masked); next_sentence_labels
[N]. Shards written with --no_static_masking carry attrs masking=dynamic and empty masked_lm_* arrays.

The stream. Every *.hdf5 in the folder, sorted by name. Epoch e visits the shards in a permutation drawn from
(seed, e); shard s is read in a permutation drawn from (seed, e, s). That ordered stream is cut into GLOBAL
micro-batches of micro_batch * world_size consecutive samples (a shard's remainder smaller than one is dropped),
and rank r trains on the r-th slice of each: what a global step sees does not depend on how it is split across
processes, and the data position (epoch, shard index, sample offset) is one number a checkpoint stores and any
number of processes can resume from. One shard is held in memory, the next is read in a background thread;
DataLoader workers cut the micro-batches. With dynamic masking the stored masks are undone and new ones drawn by
create_pretraining_data.dynamic_mask, seeded by (seed, epoch, shard, offset): a resumed run draws the same masks.

Read top to bottom: shard checks -> orders -> masks -> micro-batches -> the stream -> the held-out set.
Errors are DataError (one line, naming the flag and the file); run_pretraining.py's main prints them.
"""
from __future__ import annotations

import errno
import math
import signal
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from utils import InputError


class DataError(InputError):
    """A shard folder, shard or vocabulary that does not fit the run (the message names the flag and the file)."""


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


@dataclass(frozen=True)
class ShardSpec:
    """What a run expects of every shard (the run_pretraining.py flags of the same names)."""

    max_seq_length: int
    max_predictions_per_seq: int
    dynamic_masking: bool = False


def list_shards(folder: str, flag: str) -> list[Path]:
    path = Path(folder)
    if not path.is_dir():
        raise DataError(f"{flag} {folder} is not a folder: pass the folder of .hdf5 shards")
    shards = sorted(p for p in path.iterdir() if p.suffix == ".hdf5" and p.is_file())
    if not shards:
        raise DataError(f"{flag} {folder} holds no .hdf5 shards (make them with create_pretraining_data.py)")
    return shards


def inspect_shards(paths: list[Path], spec: ShardSpec, flag: str) -> list[ShardInfo]:
    """Open every shard's metadata once: sizes, and a one-line error for a shard that does not fit the flags."""
    import h5py

    infos = []
    for path in paths:
        try:
            with h5py.File(path, "r") as f:
                missing = [k for k in SHARD_KEYS if k not in f]
                if missing:
                    raise DataError(f"{flag}: shard {path} lacks {missing}: not a pre-training shard in NVIDIA's "
                                    "layout (write it with create_pretraining_data.py)")
                check_shard_shapes(f, path, flag)
                n, seq = f["input_ids"].shape
                width = f["masked_lm_positions"].shape[1]
                unmasked = f.attrs.get("masking", "static") == "dynamic"
                not_integer = [k for k in SHARD_KEYS if f[k].dtype.kind not in "iub"]
                if not_integer:
                    raise DataError(f"{flag}: shard {path} holds {not_integer} as "
                                    f"{[str(f[k].dtype) for k in not_integer]}: token ids, masks and labels must be "
                                    "integers (write it with create_pretraining_data.py)")
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DataError(f"{flag}: shard {path} cannot be read (permission denied): check its permissions") \
                    from None
            raise DataError(f"{flag}: shard {path} cannot be read as HDF5 ({e}): write it again with "
                            "create_pretraining_data.py, or move it out of the folder") from None
        if seq != spec.max_seq_length:
            raise DataError(f"{flag}: shard {path} has sequences of length {seq} but --max_seq_length is "
                            f"{spec.max_seq_length}: pass the shards' length, or shards of this length")
        if width > spec.max_predictions_per_seq:
            raise DataError(f"{flag}: shard {path} has {width} masked positions per sequence but "
                            f"--max_predictions_per_seq is {spec.max_predictions_per_seq}: pass at least {width}")
        if unmasked and not spec.dynamic_masking:
            raise DataError(f"{flag}: shard {path} was written without masks (--no_static_masking): pass "
                            "--dynamic_masking")
        infos.append(ShardInfo(path, int(n), bool(unmasked)))
    return infos


def check_shard_shapes(f, path: Path, flag: str) -> None:
    """A one-line DataError unless the open shard `f` holds one row per sample in every array, with the widths
    NVIDIA's layout has (input_ids, input_mask, segment_ids [N, S]; masked_lm_positions, masked_lm_ids [N, P];
    next_sentence_labels [N]) and at least one sample."""
    shapes = {k: tuple(f[k].shape) for k in SHARD_KEYS}
    ndim = {k: 1 if k == "next_sentence_labels" else 2 for k in SHARD_KEYS}
    consistent = (all(len(shapes[k]) == ndim[k] for k in SHARD_KEYS)
                  and len({shapes[k][0] for k in SHARD_KEYS}) == 1
                  and len({shapes[k][1] for k in ("input_ids", "input_mask", "segment_ids")}) == 1
                  and shapes["masked_lm_positions"][1] == shapes["masked_lm_ids"][1])
    if not consistent:
        found = ", ".join(f"{k} {list(shapes[k])}" for k in SHARD_KEYS)
        raise DataError(f"{flag}: shard {path} has arrays of mismatched shapes ({found}); expected input_ids, "
                        "input_mask, segment_ids [N, S], masked_lm_positions, masked_lm_ids [N, P] and "
                        "next_sentence_labels [N]: write it again with create_pretraining_data.py")
    if shapes["input_ids"][0] == 0:
        raise DataError(f"{flag}: shard {path} holds no samples (0 rows): remove it, or write it again with "
                        "create_pretraining_data.py")


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
    def from_vocab(cls, vocab_file: str, masked_lm_prob: float, max_predictions: int) -> "Masker":
        from tokenization import load_vocab

        vocab = load_vocab(vocab_file)
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if t not in vocab]
        if missing:
            raise DataError(f"--vocab_file {vocab_file} lacks {missing}: is it a BERT vocab.txt?")
        special = tuple(vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
        return cls(len(vocab), special, vocab["[MASK]"], masked_lm_prob, max_predictions)

    def __call__(self, input_ids: np.ndarray, input_mask: np.ndarray, seed: list[int]):
        from create_pretraining_data import dynamic_mask

        return dynamic_mask(input_ids, input_mask, self.vocab_size, self.special_ids, np.random.default_rng(seed),
                            self.masked_lm_prob, self.max_predictions, self.mask_id)


def to_model_inputs(arrays: dict[str, np.ndarray], rows: slice, masker: Masker | None = None,
                    mask_seed: list[int] | None = None) -> dict[str, torch.Tensor]:
    """One micro-batch as BertForPreTraining's keyword arguments for its fixed-slot head: input_ids,
    token_type_ids, attention_mask [B,S], masked_lm_positions and masked_lm_ids [B,P] (0: an unused slot) and
    next_sentence_labels [B], all int64. Static shapes: the step needs no host sync to find the labelled tokens."""
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
        "masked_lm_positions": torch.from_numpy(positions.astype(np.int64)),
        "masked_lm_ids": torch.from_numpy(ids.astype(np.int64)),
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
            raise DataError(f"every shard holds fewer samples than one global micro-batch ({self.global_batch} = "
                            f"micro-batch {micro_batch} x {world_size} processes): use a smaller batch or bigger "
                            "shards")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self._stream: weakref.ref | None = None

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
        stream = self._batches()
        # A weak reference: the stream's frame refers to self, and a cycle would keep an abandoned stream (and its
        # workers, which ignore SIGTERM) alive until interpreter exit, where multiprocessing waits for them forever.
        self._stream = weakref.ref(stream)
        return stream

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
        stream = self._stream() if self._stream is not None else None
        if stream is not None:
            stream.close()
        self._stream = None
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers ignore SIGTERM/SIGUSR1/SIGINT: Slurm, `timeout` and Ctrl-C signal every process of the
    job, and a worker dying of it would crash the training process before it can write its checkpoint. The
    training process ends them (PretrainingData.close); if it dies, they notice and exit on their own."""
    from training import STOP_SIGNALS

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def load_eval_set(folder: str, spec: ShardSpec, max_samples: int, rank: int, world_size: int,
                  ) -> dict[str, np.ndarray]:
    """The held-out samples (all --eval_dir shards in sorted order, the first `max_samples`, 0: all); rank r keeps
    samples r, r + W, ..."""
    import h5py

    parts: list[dict[str, np.ndarray]] = []
    remaining = max_samples or math.inf
    for info in inspect_shards(list_shards(folder, "--eval_dir"), spec, "--eval_dir"):
        take = int(min(info.num_samples, remaining))
        with h5py.File(info.path, "r") as f:
            parts.append({key: f[key][:take] for key in SHARD_KEYS})
        remaining -= take
        if remaining <= 0:
            break
    return {key: np.concatenate([p[key] for p in parts])[rank::world_size] for key in SHARD_KEYS}
