"""Pre-training data: NVIDIA's HDF5 shards -> the global stream of samples -> this rank's micro-batches.

Shards: the layout of pretraining/shard_format.py (SHARD_KEYS, and PACKED_KEY in packed shards, which the batches then
carry so that the model attends within each packed sequence); a folder's shards must all be packed alike.

The stream. Every *.hdf5 in the folder, sorted by name. Epoch e visits the shards in a permutation drawn from
(seed, e), in groups of `mix_shards` consecutive shards of that order (--mix_shards K; 1, NVIDIA's way, by
default); a group's samples, its shards' rows one after the other, are read in a permutation drawn from
(seed, e, s), s its first shard. Why mix: a shard holds a few hundred articles, each dupe_factor times, and a
small batch trains for thousands of steps on one shard, chasing its words (the training loss jumps at every shard
change); K shards shuffled together make the stream K times closer to the corpus. That ordered stream is cut into
GLOBAL micro-batches of micro_batch * world_size consecutive samples (a group's remainder smaller than one is
dropped), and rank r trains on the r-th slice of each: what a global step sees does not depend on how it is split
across processes, and the data position (epoch, group index, sample offset) is one number a checkpoint stores and
any number of processes can resume from. One group is held in memory, the next is read in a background thread;
DataLoader workers cut the micro-batches. With dynamic masking the stored masks are undone and new ones drawn by
shard_format.dynamic_mask, seeded by (seed, epoch, shard, offset): a resumed run draws the same masks.

Length binning (LDDL's idea, for phase 2; length_bins N > 0): sample i of a shard falls in bin floor((L_i - 1) N / S)
by its real length L_i. The shard's permutation is regrouped, each bin keeping its samples in the permutation's
order, into global micro-batches of one bin; the leftovers of every bin, in bin order, make the mixed micro-batches
after them, and the micro-batches are shuffled (seeded by seed, epoch, shard). The result is again a fixed
permutation of the shard, so the data position and exact resume work as without bins, and each micro-batch is cut
to the upper end of its longest sample's bin (N shapes, so each compiles once): short batches skip the padding. The
order depends on the global micro-batch (micro-batch x processes), which a checkpoint records.

Read top to bottom: shard checks -> orders -> masks -> micro-batches -> the stream -> the held-out set.
Errors are DataError (one line, naming the flag and the file); run_pretraining.py's main prints them.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from bert_recipe.io.cli import InputError

# the shard layout, and reading it back, are the format module's alone
from bert_recipe.pretraining.shard_format import PACKED_KEY, SHARD_KEYS, dynamic_mask, read_samples, shard_keys
from bert_recipe.training.dist_env import DistEnv
from bert_recipe.training.stop_signals import STOP_SIGNALS
from tokenization import load_vocab


class DataError(InputError):
    """A shard folder, shard or vocabulary that does not fit the run (the message names the flag and the file)."""


class ResumeError(InputError):
    """A checkpoint that does not fit this run (another phase, optimizer or data) or an output folder in use."""


@dataclass
class DataPosition:
    """Where the global sample stream stands: after `sample_offset` samples of the `shard_index`-th group of
    epoch `epoch`'s shard order (the shard itself without --mix_shards). The same on every rank."""

    epoch: int = 0
    shard_index: int = 0
    sample_offset: int = 0


@dataclass
class ShardInfo:
    path: Path
    num_samples: int
    unmasked: bool  # written with --no_static_masking: masked_lm_* are empty
    packed: int = 0  # K: up to K sequences a row (create_pretraining_data.py --pack_sequences); 0: one a row
    width: int = 0  # masked_lm_positions slots a row (P; packed: P_row)


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
    held_out = [p.name for p in shards if "_test_" in p.name]
    if held_out and len(held_out) < len(shards) and any("_training_" in p.name for p in shards):
        # data/bertPrep.py's names (NVIDIA's layout once kept both in one folder): never train on held-out text
        raise DataError(
            f"{flag} {folder} holds training shards and held-out ones ({held_out[0]}, ...): move the "
            "*_test_*.hdf5 shards to a folder of their own (data/bertPrep.py writes training/ and "
            "test/) and pass that one as --eval_dir"
        )
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
                    raise DataError(
                        f"{flag}: shard {path} lacks {missing}: not a pre-training shard in NVIDIA's "
                        "layout (write it with create_pretraining_data.py)"
                    )
                check_shard_shapes(f, path, flag)
                n, seq = f["input_ids"].shape
                width = f["masked_lm_positions"].shape[1]
                unmasked = f.attrs.get("masking", "static") == "dynamic"
                packed = f[PACKED_KEY].shape[1] if PACKED_KEY in f else 0
                if f["next_sentence_labels"].shape != ((n, packed) if packed else (n,)):
                    raise DataError(
                        f"{flag}: shard {path} has next_sentence_labels of shape "
                        f"{f['next_sentence_labels'].shape}, expected {(n, packed) if packed else (n,)}"
                        f"{' (packed: one label per slot)' if packed else ''}"
                    )
                not_integer = [k for k in SHARD_KEYS if f[k].dtype.kind not in "iub"]
                if not_integer:
                    raise DataError(
                        f"{flag}: shard {path} holds {not_integer} as "
                        f"{[str(f[k].dtype) for k in not_integer]}: token ids, masks and labels must be "
                        "integers (write it with create_pretraining_data.py)"
                    )
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DataError(
                    f"{flag}: shard {path} cannot be read (permission denied): check its permissions"
                ) from None
            raise DataError(
                f"{flag}: shard {path} cannot be read as HDF5 ({e}): write it again with "
                "create_pretraining_data.py, or move it out of the folder"
            ) from None
        if seq != spec.max_seq_length:
            raise DataError(
                f"{flag}: shard {path} has sequences of length {seq} but --max_seq_length is "
                f"{spec.max_seq_length}: pass the shards' length, or shards of this length"
            )
        # A packed row's slots serve up to K sequences: max_predictions_per_seq scales with K.
        if width > spec.max_predictions_per_seq * max(packed, 1):
            raise DataError(
                f"{flag}: shard {path} has {width} masked positions per "
                f"{f'row of up to {packed} sequences' if packed else 'sequence'} but "
                f"--max_predictions_per_seq is {spec.max_predictions_per_seq}: pass at least "
                f"{-(-width // max(packed, 1))}"
            )
        if unmasked and not spec.dynamic_masking:
            raise DataError(
                f"{flag}: shard {path} was written without masks (--no_static_masking): pass --dynamic_masking"
            )
        infos.append(ShardInfo(path, int(n), bool(unmasked), int(packed), int(width)))
    kinds = sorted(
        {f"{i.packed} sequences and {i.width} masked slots a row" if i.packed else "unpacked" for i in infos}
    )
    if len(kinds) > 1:  # one NSP layout and one batch shape for the whole run
        raise DataError(
            f"{flag}: the shards are not packed alike ({'; '.join(kinds)}): write them with one "
            "create_pretraining_data.py --pack_sequences setting"
        )
    return infos


def check_shard_shapes(f, path: Path, flag: str) -> None:
    """A one-line DataError unless the open shard `f` holds one row per sample in every array, with the widths
    NVIDIA's layout has (input_ids, input_mask, segment_ids [N, S]; masked_lm_positions, masked_lm_ids [N, P];
    next_sentence_labels [N]; a packed shard: next_sentence_labels and next_sentence_positions [N, K]) and at
    least one sample."""
    packed = PACKED_KEY in f
    keys = shard_keys(f)
    shapes = {k: tuple(f[k].shape) for k in keys}
    ndim = {k: 1 if k == "next_sentence_labels" and not packed else 2 for k in keys}
    consistent = (
        all(len(shapes[k]) == ndim[k] for k in keys)
        and len({shapes[k][0] for k in keys}) == 1
        and len({shapes[k][1] for k in ("input_ids", "input_mask", "segment_ids")}) == 1
        and shapes["masked_lm_positions"][1] == shapes["masked_lm_ids"][1]
        and (not packed or shapes["next_sentence_labels"][1] == shapes["next_sentence_positions"][1])
    )
    if not consistent:
        found = ", ".join(f"{k} {list(shapes[k])}" for k in keys)
        raise DataError(
            f"{flag}: shard {path} has arrays of mismatched shapes ({found}); expected input_ids, "
            "input_mask, segment_ids [N, S], masked_lm_positions, masked_lm_ids [N, P] and "
            "next_sentence_labels [N] (packed: next_sentence_labels, next_sentence_positions [N, K]): "
            "write it again with create_pretraining_data.py"
        )
    if shapes["input_ids"][0] == 0:
        raise DataError(
            f"{flag}: shard {path} holds no samples (0 rows): remove it, or write it again with "
            "create_pretraining_data.py"
        )


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
    """Dynamic masking with shard_format.dynamic_mask; special ids are never masked."""

    vocab_size: int
    special_ids: tuple[int, ...]
    mask_id: int
    masked_lm_prob: float
    max_predictions: int

    @classmethod
    def from_vocab(cls, vocab_file: str, masked_lm_prob: float, max_predictions: int) -> "Masker":

        vocab = load_vocab(vocab_file)
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if t not in vocab]
        if missing:
            raise DataError(f"--vocab_file {vocab_file} lacks {missing}: is it a BERT vocab.txt?")
        special = tuple(vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
        return cls(len(vocab), special, vocab["[MASK]"], masked_lm_prob, max_predictions)

    def __call__(self, input_ids: np.ndarray, input_mask: np.ndarray, seed: list[int]):

        return dynamic_mask(
            input_ids,
            input_mask,
            self.vocab_size,
            self.special_ids,
            np.random.default_rng(seed),
            self.masked_lm_prob,
            self.max_predictions,
            self.mask_id,
        )


def to_model_inputs(
    arrays: dict[str, np.ndarray],
    rows: slice,
    masker: Masker | None = None,
    mask_seed: list[int] | None = None,
    width: int | None = None,
) -> dict[str, torch.Tensor]:
    """One micro-batch as BertForPreTraining's keyword arguments for its fixed-slot head: input_ids,
    token_type_ids, attention_mask [B,S], masked_lm_positions and masked_lm_ids [B,P] (0: an unused slot) and
    next_sentence_labels [B], all int64. Static shapes: the step needs no host sync to find the labelled tokens.
    Packed shards: next_sentence_labels and next_sentence_positions [B,K] (-1 / 0 in unused slots). `width` cuts
    the sequences to their first `width` columns (length binning; no real token lies beyond it)."""
    columns = slice(None, width)
    input_ids = arrays["input_ids"][rows, columns]
    input_mask = arrays["input_mask"][rows, columns]
    positions, ids = arrays["masked_lm_positions"][rows], arrays["masked_lm_ids"][rows]
    if masker is not None:
        original = unmask(input_ids, positions, ids)
        input_ids, positions, ids = masker(original, input_mask, mask_seed)
    batch = {
        "input_ids": torch.from_numpy(input_ids.astype(np.int64)),
        "token_type_ids": torch.from_numpy(arrays["segment_ids"][rows, columns].astype(np.int64)),
        "attention_mask": torch.from_numpy(input_mask.astype(np.int64)),
        "masked_lm_positions": torch.from_numpy(positions.astype(np.int64)),
        "masked_lm_ids": torch.from_numpy(ids.astype(np.int64)),
        "next_sentence_labels": torch.from_numpy(arrays["next_sentence_labels"][rows].astype(np.int64)),
    }
    if PACKED_KEY in arrays:
        batch[PACKED_KEY] = torch.from_numpy(arrays[PACKED_KEY][rows].astype(np.int64))
    return batch


def read_rows(path: Path, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The given rows of a shard, in that order. The whole shard is read (sequential reads are fast, and the
    page cache serves the other ranks of the node), then only these rows are kept."""
    import h5py

    with h5py.File(path, "r") as f:
        return {key: f[key][()][rows] for key in shard_keys(f)}


def read_group_rows(paths: list[Path], sizes: list[int], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The given rows of shards read as one (row i of the group: the shards' rows one after the other), in that
    order. Masked-slot arrays of different widths are padded with 0, the unused slot."""
    if len(paths) == 1:
        return read_rows(paths[0], rows)
    starts = np.cumsum([0, *sizes])  # [K + 1]
    which = np.searchsorted(starts, rows, side="right") - 1  # [R] the shard of each row
    parts = [read_rows(p, rows[which == k] - starts[k]) for k, p in enumerate(paths)]
    out = {}
    for key in parts[0]:
        width = max(part[key].shape[1:] for part in parts)
        padded = [
            np.pad(part[key], [(0, 0)] + [(0, w - v) for w, v in zip(width, part[key].shape[1:])]) for part in parts
        ]
        merged = np.empty((len(rows), *width), dtype=np.result_type(*padded))
        for k, part in enumerate(padded):
            merged[which == k] = part  # each shard's rows back in the requested order
        out[key] = merged
    return out


def real_lengths(path: Path) -> tuple[np.ndarray, int]:
    """[N] real tokens of every row of a shard, and its sequence length S (length binning)."""
    import h5py

    with h5py.File(path, "r") as f:
        mask = f["input_mask"][()]  # [N, S]
    return mask.astype(bool).sum(1), mask.shape[1]


def bin_width(length: np.ndarray | int, bins: int, seq_len: int) -> np.ndarray:
    """The upper end of the length bin of `length`: bin floor((L - 1) N / S) covers lengths up to
    ceil((bin + 1) S / N)."""
    b = (np.asarray(length) - 1) * bins // seq_len
    return -(-(b + 1) * seq_len // bins)


def binned_order(
    order: np.ndarray, lengths: np.ndarray, bins: int, seq_len: int, global_batch: int, rng: np.random.Generator
) -> np.ndarray:
    """The shard permutation `order` regrouped into global micro-batches of similar lengths (see the module
    docstring): full micro-batches of one bin, then the bins' leftovers in bin order, the micro-batches shuffled
    by `rng`; the final remainder (< global_batch, dropped by the stream as any shard remainder) stays last.
    Another permutation of the shard."""
    bin_of = np.clip((lengths[order] - 1) * bins // seq_len, 0, bins - 1)  # [N] in the permutation's order
    grouped = order[np.argsort(bin_of, kind="stable")]  # by bin; within a bin, the permutation's order
    counts = np.bincount(bin_of, minlength=bins)
    ends = np.cumsum(counts)
    full, leftover = [], []
    for b in range(bins):
        members = grouped[ends[b] - counts[b] : ends[b]]
        cut = len(members) // global_batch * global_batch
        full.append(members[:cut])
        leftover.append(members[cut:])
    full_batches = np.concatenate(full).reshape(-1, global_batch)  # [F, G]
    rest = np.concatenate(leftover)  # neighbouring bins side by side
    cut = len(rest) // global_batch * global_batch
    batches = np.concatenate([full_batches, rest[:cut].reshape(-1, global_batch)])  # [F + M, G]
    batches = batches[rng.permutation(len(batches))]
    return np.concatenate([batches.reshape(-1), rest[cut:]])


class ShardBatches(torch.utils.data.Dataset):
    """This rank's micro-batches of one loaded shard: item k is rows [k*B, (k+1)*B) of `arrays`, which hold the
    rank's slices of consecutive global micro-batches. `offsets[k]` is the global sample offset of item k within
    the shard's permutation (it seeds dynamic masking); `widths[k]` (length binning) the columns item k keeps."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        micro_batch: int,
        offsets: np.ndarray,
        mask_key: list[int],
        masker: Masker | None,
        widths: np.ndarray | None = None,
    ):
        self.arrays, self.micro_batch, self.offsets = arrays, micro_batch, offsets
        self.mask_key, self.masker, self.widths = mask_key, masker, widths

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        rows = slice(k * self.micro_batch, (k + 1) * self.micro_batch)
        width = None if self.widths is None else int(self.widths[k])
        return to_model_inputs(self.arrays, rows, self.masker, [*self.mask_key, int(self.offsets[k])], width)


class PretrainingData:
    """The infinite stream of this rank's micro-batches, from `position` on.

    Iterating yields dicts of CPU tensors (see to_model_inputs); after each one, `position` is the data position
    just after the global micro-batch it belongs to, which is what a checkpoint stores.
    """

    def __init__(
        self,
        shards: list[ShardInfo],
        seed: int,
        micro_batch: int,
        env: DistEnv | None = None,
        *,
        masker: Masker | None = None,
        num_workers: int = 0,
        length_bins: int = 0,
        mix_shards: int = 1,
    ):
        env = env or DistEnv()  # one process on the CPU
        self.shards, self.seed, self.micro_batch = shards, seed, micro_batch
        self.mix_shards = max(1, min(mix_shards, len(shards)))
        self.rank, self.world_size = env.rank, env.world_size
        self.global_batch = micro_batch * env.world_size
        self.num_workers, self.masker = num_workers, masker
        self.pin_memory = env.device.type == "cuda"  # page-locked host rows copy to the GPU without a staging copy
        self.position = DataPosition()  # load_state_dict moves it to a checkpoint's
        self.length_bins = length_bins
        if max(s.num_samples for s in shards) * self.mix_shards < self.global_batch:
            raise DataError(
                f"every shard holds fewer samples than one global micro-batch ({self.global_batch} = "
                f"micro-batch {micro_batch} x {self.world_size} processes): use a smaller batch, bigger "
                "shards or a larger --mix_shards"
            )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self._stream: weakref.ref | None = None

    # --- the resume state: where the stream stands, and what that place means

    def state_dict(self) -> dict:
        """The data position and what it is a position in: the shard files, the epoch's shard order and, where
        they shape the order, --length_bins with the global micro-batch and --mix_shards. Plain values only (a
        checkpoint loads with weights_only=True)."""
        pos = self.position
        return {
            "epoch": pos.epoch,
            "shard_index": pos.shard_index,
            "sample_offset": pos.sample_offset,
            "shard_order": [self.shards[i].path.name for i in self.shard_order(pos.epoch)],
            "files": [s.path.name for s in self.shards],
            # binned orders depend on the global micro-batch: recorded so a resume can check it
            **({"length_bins": self.length_bins, "global_micro_batch": self.global_batch} if self.length_bins else {}),
            **({"mix_shards": self.mix_shards} if self.mix_shards > 1 else {}),
        }

    def check_state(self, state: dict) -> None:
        """ResumeError unless `state` (a state_dict()) is a position in this stream: the same shard files, shard
        groups and (with --length_bins) binned order."""
        files = [s.path.name for s in self.shards]
        if state["files"] != files:
            raise ResumeError(
                f"--input_dir {self.shards[0].path.parent} does not hold the shards the checkpoint was "
                f"trained on ({len(state['files'])} then, {len(files)} now): resume with the same data"
            )
        if state.get("mix_shards", 1) != self.mix_shards:
            raise ResumeError(
                f"the checkpoint read its shards in groups of {state.get('mix_shards', 1)} "
                f"(--mix_shards), this run in groups of {self.mix_shards}: its data position means "
                "another place in the stream, so resume with the same --mix_shards"
            )
        bins, global_batch = self.length_bins, self.global_batch
        then = (state.get("length_bins", 0), state.get("global_micro_batch", global_batch))
        if then != (bins, global_batch if bins else then[1]):
            raise ResumeError(
                f"the checkpoint ordered its samples with --length_bins {then[0]} and a global "
                f"micro-batch of {then[1]}, this run with {bins} and {global_batch}: binned "
                "orders differ, so resume with the same --length_bins, batch and processes"
            )

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (checked first: ResumeError). Call it before iterating."""
        self.check_state(state)
        self.position = DataPosition(state["epoch"], state["shard_index"], state["sample_offset"])

    # --- the order

    def shard_order(self, epoch: int) -> np.ndarray:
        return epoch_shard_order(self.seed, epoch, len(self.shards))

    def group(self, epoch: int, index: int) -> list[int]:
        """The shards (indices in sorted order) of the `index`-th group of epoch `epoch`."""
        return [int(i) for i in self.shard_order(epoch)[index * self.mix_shards : (index + 1) * self.mix_shards]]

    def _usable(self, pos: DataPosition) -> DataPosition:
        """The first position at or after `pos` with a whole global micro-batch left in its group."""
        while True:
            if pos.shard_index * self.mix_shards >= len(self.shards):
                pos = DataPosition(pos.epoch + 1, 0, 0)
            if pos.sample_offset + self.global_batch <= sum(
                self.shards[i].num_samples for i in self.group(pos.epoch, pos.shard_index)
            ):
                return pos
            pos = DataPosition(pos.epoch, pos.shard_index + 1, 0)

    def _load(self, pos: DataPosition) -> tuple[DataPosition, ShardBatches]:
        """Read this rank's rows of the group at `pos` (runs in the prefetch thread)."""
        group = [self.shards[i] for i in self.group(pos.epoch, pos.shard_index)]
        shard_id = self.group(pos.epoch, pos.shard_index)[0]  # seeds the group's orders and masks
        num_samples = sum(s.num_samples for s in group)
        order = shard_sample_order(self.seed, pos.epoch, shard_id, num_samples)
        widths = None
        if self.length_bins:
            lengths, seq_len = zip(*(real_lengths(s.path) for s in group))  # [N_k], S
            lengths, seq_len = np.concatenate(lengths), seq_len[0]
            order = binned_order(
                order,
                lengths,
                self.length_bins,
                seq_len,
                self.global_batch,
                np.random.default_rng([self.seed, pos.epoch, shard_id, 3]),
            )
        n_batches = (num_samples - pos.sample_offset) // self.global_batch
        global_blocks = order[pos.sample_offset : pos.sample_offset + n_batches * self.global_batch]
        global_blocks = global_blocks.reshape(n_batches, self.global_batch)  # [K, G]
        if self.length_bins:  # one width per global micro-batch: every rank's slice gets the same shape
            widths = bin_width(lengths[global_blocks].max(1), self.length_bins, seq_len)  # [K]
        blocks = global_blocks.reshape(n_batches, self.world_size, self.micro_batch)[:, self.rank]  # [K, B]
        offsets = pos.sample_offset + self.global_batch * np.arange(n_batches)
        arrays = read_group_rows([s.path for s in group], [s.num_samples for s in group], blocks.reshape(-1))
        mask_key = [self.seed, pos.epoch, shard_id, 2]
        return pos, ShardBatches(arrays, self.micro_batch, offsets, mask_key, self.masker, widths)

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
                batches,
                batch_size=None,
                shuffle=False,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                generator=torch.Generator().manual_seed(self.seed),
                worker_init_fn=_ignore_stop_signals,
            )
            with _stop_signals_blocked():  # the workers start here: see _ignore_stop_signals
                stream = iter(loader)
            try:
                for k, batch in enumerate(stream):
                    self.position = DataPosition(
                        pos.epoch, pos.shard_index, int(batches.offsets[k]) + self.global_batch
                    )
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
    training process ends them (PretrainingData.close); if it dies, they notice and exit on their own.

    A worker starts with these signals blocked (_stop_signals_blocked, inherited through fork): before this runs,
    torch's worker loop installs a SIGTERM handler that dies of any SIGTERM not sent by the parent, and a new
    DataLoader starts at every shard, so a preemption landing in that window crashed the run (exit 1, not 75).
    A signal that arrived meanwhile is pending; SIG_IGN discards it, then the worker unblocks."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Block the stop signals in this thread while DataLoader workers fork (they inherit the mask); a signal that
    arrives meanwhile is delivered on leaving (or to another thread at once), so the training process still stops."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def load_eval_set(folder: str, spec: ShardSpec, max_samples: int, rank: int, world_size: int) -> dict[str, np.ndarray]:
    """The held-out samples (all --eval_dir shards in sorted order, the first `max_samples`, 0: all); rank r keeps
    samples r, r + W, ..."""
    arrays = read_samples(
        [info.path for info in inspect_shards(list_shards(folder, "--eval_dir"), spec, "--eval_dir")], max_samples
    )
    return {key: array[rank::world_size] for key, array in arrays.items()}
