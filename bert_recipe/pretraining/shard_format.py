"""The pre-training shard format, and the masking and packing that make its rows: the one library module that the
writer (create_pretraining_data.py, through pretraining/shard_writer.py) and the loader (pretraining/data_stream.py)
both import, so that a shard is written and read by the same rule.

Read top to bottom: the layout -> masking -> packing -> the unigram prior of a shard's targets.

The layout: NVIDIA's HDF5 arrays, zero-padded. N instances, S = max_seq_length, P = max_predictions_per_seq:
    input_ids [N,S] int32, input_mask [N,S] int8, segment_ids [N,S] int8,
    masked_lm_positions [N,P] int32, masked_lm_ids [N,P] int32 (unused slots 0; position 0 is [CLS], never masked),
    next_sentence_labels [N] int8 (1 = B is a random next).
A shard written without static masks (create_pretraining_data.py --no_static_masking) keeps its input_ids unmasked
and masked_lm_positions/masked_lm_ids all zeros; the file attribute `masking` says "dynamic" (else "static"), and
the loader draws masks per epoch with `dynamic_mask`.

A packed shard (--pack_sequences K, K >= 2) holds up to K sequences back to back in each of its N rows, the padding
after the last one. Each sequence keeps its own tokens, token types ([CLS] A [SEP] 0s, B [SEP] 1s) and masked
positions (moved by its start); run_pretraining.py gives each its own attention block, positions from 0 and NSP
from its own [CLS]. With P_row = min(K*P, floor(S*masked_lm_prob) + K) masked slots a row (`packed_predictions`:
enough for any K sequences of together S tokens):
    input_ids [N,S] int32, input_mask [N,S] int8 (1 at every real token), segment_ids [N,S] int8,
    masked_lm_positions [N,P_row] int32 (ascending over the row, 0 = unused), masked_lm_ids [N,P_row] int32,
    next_sentence_labels [N,K] int8 (-1 = unused slot), next_sentence_positions [N,K] int32 (each sequence's [CLS]
    column; slot 0 is always used, at 0; a later slot at 0 is unused),
and the attributes packing="first_fit_decreasing", max_sequences_per_row=K, packed_sequences (instances),
max_predictions_per_row=P_row. A loader recognises a packed shard by its next_sentence_positions array.

Masking is Google's rule: num_to_predict = min(P, max(1, round(L * masked_lm_prob))) positions (Python's round: half
to even; numpy's rint is the same on the same float), drawn uniformly from the real tokens but [CLS]/[SEP] (whole-word
masking: "##" pieces join the preceding candidate's word, and words are taken in random order while they fit);
each is replaced by [MASK] 80%, kept 10%, a uniform random vocabulary id 10%; positions ascending.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np

# --------------------------------------------------------------------------------------------------------------
# The layout

LAYOUT = (
    ("input_ids", "i4"),
    ("input_mask", "i1"),
    ("segment_ids", "i1"),
    ("masked_lm_positions", "i4"),
    ("masked_lm_ids", "i4"),
    ("next_sentence_labels", "i1"),
)  # (array, dtype) of every shard, in file order
PACKED_KEY = "next_sentence_positions"  # [N, K] int32, in packed shards only
PACKED_LAYOUT = LAYOUT + ((PACKED_KEY, "i4"),)
SHARD_KEYS = tuple(name for name, _ in LAYOUT)


def shard_keys(f) -> tuple[str, ...]:
    """The arrays of an open shard (h5py.File): NVIDIA's, and next_sentence_positions when it is packed."""
    return SHARD_KEYS + ((PACKED_KEY,) if PACKED_KEY in f else ())


def read_samples(paths: Iterable, max_samples: int = 0, keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The first `max_samples` samples (0: all) of the shards `paths` read in that order, as one array per key
    (`keys`; None: each shard's own, shard_keys). The held-out set of an evaluation is read this way."""
    import h5py

    parts: list[dict[str, np.ndarray]] = []
    remaining = max_samples or math.inf
    for path in paths:
        with h5py.File(path, "r") as f:
            names = keys or shard_keys(f)
            take = int(min(len(f[names[0]]), remaining))
            parts.append({key: f[key][:take] for key in names})
        remaining -= take
        if remaining <= 0:
            break
    if not parts:
        raise ValueError("read_samples: no shard given")
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


# --------------------------------------------------------------------------------------------------------------
# Masking: static masks when a shard is written (shard_writer.make_unit_instances), dynamic ones per epoch
# when it is read (dynamic_mask)


def masked_count(lengths: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    """min(P, max(1, round(L * p))) per row; np.rint rounds half to even exactly like Python's round."""
    return np.minimum(max_predictions, np.maximum(1, np.rint(lengths * masked_lm_prob))).astype(np.int64)


def choose_positions(cand: np.ndarray, counts: np.ndarray, max_predictions: int, rng: np.random.Generator):
    """A uniformly random subset of min(counts, #candidates) candidate positions per row, ascending.

    cand: [n,S] bool, counts: [n]. Returns positions [n,P] int64 (0 in unused slots) and valid [n,P] bool.
    Sorting i.i.d. uniform keys gives a uniform random order of the candidates, as Google's shuffle does.
    """
    n, seq = cand.shape
    keys = rng.random((n, seq))
    keys[~cand] = 2.0  # non-candidates sort last
    width = min(max_predictions, seq)
    if width < seq:
        first = np.argpartition(keys, width - 1, axis=1)[:, :width]
        order = np.take_along_axis(first, np.argsort(np.take_along_axis(keys, first, 1), axis=1), 1)
    else:
        order = np.argsort(keys, axis=1)
    take = np.minimum(counts, cand.sum(1))
    valid = np.arange(width)[None, :] < take[:, None]
    positions = np.sort(np.where(valid, order, seq), axis=1)  # chosen ones ascending, sentinel S after them
    positions = np.where(valid, positions, 0)
    if width < max_predictions:  # P > S: pad the unused slots
        pad = max_predictions - width
        positions = np.pad(positions, ((0, 0), (0, pad)))
        valid = np.pad(valid, ((0, 0), (0, pad)))
    return positions, valid


def choose_whole_words(
    ids: np.ndarray,
    cand: np.ndarray,
    counts: np.ndarray,
    max_predictions: int,
    is_subword: np.ndarray,
    rng: np.random.Generator,
):
    """Google's whole-word selection: "##" pieces join the previous candidate's word; shuffled words are taken
    while they fit in the row's count (a word that would overflow is skipped). Same outputs as choose_positions.
    """
    n = ids.shape[0]
    positions = np.zeros((n, max_predictions), dtype=np.int64)
    valid = np.zeros((n, max_predictions), dtype=bool)
    for row in range(n):
        chosen = _whole_words_of_row(ids[row], cand[row], int(counts[row]), is_subword, rng)
        positions[row, : len(chosen)] = chosen
        valid[row, : len(chosen)] = True
    return positions, valid


def _whole_words_of_row(
    ids: np.ndarray, cand: np.ndarray, count: int, is_subword: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    cpos = np.flatnonzero(cand)
    starts = ~is_subword[ids[cpos]]
    if len(starts):
        starts[0] = True
    word = np.cumsum(starts) - 1
    sizes = np.bincount(word).tolist()
    taken, total = [], 0
    for w in np.argsort(rng.random(len(sizes))).tolist():
        if total >= count:
            break
        if total + sizes[w] > count:
            continue
        taken.append(w)
        total += sizes[w]
    return np.sort(cpos[np.isin(word, taken)])


def mask_chosen(
    ids: np.ndarray, positions: np.ndarray, valid: np.ndarray, vocab_size: int, mask_id: int, rng: np.random.Generator
):
    """80% [MASK], 10% unchanged, 10% a uniform random id in [0, vocab_size). Returns (masked ids, labels [n,P])."""
    labels = np.where(valid, np.take_along_axis(ids, positions, 1), 0)
    u = rng.random(positions.shape)
    random_ids = rng.integers(0, vocab_size, positions.shape)
    new = np.where(u < 0.8, mask_id, np.where(u < 0.9, labels, random_ids))
    out = ids.copy()
    rows, slots = np.nonzero(valid)
    out[rows, positions[rows, slots]] = new[rows, slots]
    return out, labels


def dynamic_mask(
    input_ids,
    input_mask,
    vocab_size: int,
    special_ids: Iterable[int],
    rng,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    mask_token_id: int = 103,
):
    """Draw masked-LM predictions for unmasked rows (shards written with --no_static_masking), e.g. per epoch.

    The rule is the static one: num_to_predict = min(P, max(1, round(L * masked_lm_prob))) with L = input_mask.sum()
    (the real tokens, [CLS]/[SEP] included), positions uniform over the real tokens whose id is not in
    `special_ids` (padding never), each replaced by [MASK] 80%, kept 10%, a uniform random id 10%.

    Args:
        input_ids: [N, S] integer numpy array or torch tensor, unmasked.
        input_mask: [N, S], 1 for real tokens, 0 for padding.
        vocab_size: random replacements are drawn uniformly from ids 0..vocab_size-1.
        special_ids: ids never masked, e.g. [CLS], [SEP], [PAD] (and [MASK]).
        rng: a numpy Generator (or an int seed / None for np.random.default_rng).
        mask_token_id: the [MASK] id (103 in both of Google's English vocabularies).
    Returns:
        masked_input_ids [N, S] (same type and dtype as input_ids),
        masked_lm_positions [N, P] int64, ascending, 0 in unused slots (position 0 is [CLS], never chosen),
        masked_lm_ids [N, P] int64, the original ids at those positions, 0 in unused slots.
        torch tensors in, torch tensors out (on the input's device).
    """
    as_torch = type(input_ids).__module__.split(".")[0] == "torch"
    device = input_ids.device if as_torch else None
    ids = input_ids.detach().cpu().numpy() if as_torch else np.asarray(input_ids)
    mask = (
        input_mask.detach().cpu().numpy()
        if type(input_mask).__module__.split(".")[0] == "torch"
        else np.asarray(input_mask)
    )
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids and input_mask must both be [N, S]; got {ids.shape} and {mask.shape}")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    real = mask.astype(bool)
    cand = real & ~np.isin(ids, np.fromiter(special_ids, dtype=np.int64))
    counts = masked_count(real.sum(1), masked_lm_prob, max_predictions_per_seq)
    positions, valid = choose_positions(cand, counts, max_predictions_per_seq, rng)
    masked, labels = mask_chosen(ids, positions, valid, vocab_size, mask_token_id, rng)
    labels = labels.astype(np.int64)
    if as_torch:
        import torch

        return (
            torch.from_numpy(masked).to(device),
            torch.from_numpy(positions).to(device),
            torch.from_numpy(labels).to(device),
        )
    return masked, positions, labels


# --------------------------------------------------------------------------------------------------------------
# Sequence packing (create_pretraining_data.py --pack_sequences K): several finished instances share one row of
# max_seq_length. Offline, when the shard is written, not in the loader: see pretraining/shard_writer.py.


def packed_predictions(
    max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float, max_sequences_per_row: int
) -> int:
    """The masked-LM slots of a packed row: enough for any K sequences of together at most S tokens.

    A sequence of L tokens gets min(P, max(1, round(L p))) <= L p + 1 predictions, so K of them with sum L <= S get
    at most floor(S p) + K; never more than K P (each sequence at most P). For S 128, P 20, p 0.15, K 3: 22 slots."""
    bound = math.floor(max_seq_length * masked_lm_prob + 1e-6) + max_sequences_per_row
    return int(min(max_sequences_per_row * max_predictions_per_seq, bound))


def first_fit_decreasing(
    lengths: np.ndarray, capacity: int, max_per_row: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack sequences of `lengths` [n] into rows of `capacity` tokens, at most `max_per_row` sequences a row:
    longest first (ties in input order), each into the first row, in opening order, with room for it and fewer
    than max_per_row sequences, else into a new row.

    Returns row [n] (rows numbered in opening order), slot [n] (the sequence's place in its row: 0, 1, ... in
    placement order) and start [n] (its first token's column: the lengths of the row's earlier slots)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or (lengths < 1).any() or (lengths > capacity).any():
        raise ValueError(f"first_fit_decreasing: lengths must be a 1-D array in [1, {capacity}]")
    if max_per_row < 1:
        raise ValueError(f"first_fit_decreasing: max_per_row must be at least 1, got {max_per_row}")
    n = len(lengths)
    room = np.full(n, -1, dtype=np.int64)  # free tokens of each opened row; -1: full (or not opened)
    count = np.zeros(n, dtype=np.int64)  # sequences in each row
    row, slot, start = (np.zeros(n, dtype=np.int64) for _ in range(3))
    opened = 0
    for i in np.argsort(-lengths, kind="stable").tolist():
        length = int(lengths[i])
        fits = room[:opened] >= length  # one vectorised scan per sequence: rows <= n, windows of a few thousand
        r = int(fits.argmax()) if fits.any() else opened
        if r == opened:
            room[r] = capacity
            opened += 1
        row[i], slot[i], start[i] = r, count[r], capacity - room[r]
        count[r] += 1
        room[r] = room[r] - length if count[r] < max_per_row else -1  # a row with K sequences takes no more
    return row, slot, start


def pack_sequences(arrays: dict[str, np.ndarray], max_per_row: int, max_predictions: int) -> dict[str, np.ndarray]:
    """Pack NVIDIA-layout instances (input_ids, input_mask, segment_ids [n,S], masked_lm_positions/ids [n,P],
    next_sentence_labels [n]; real tokens left-aligned) into rows by first_fit_decreasing.

    Returns the packed rows, R of them: input_ids, input_mask, segment_ids [R,S] (each sequence's own tokens and
    token types, back to back), masked_lm_positions/ids [R,max_predictions] (the row's masked positions, ascending,
    0 in unused slots), next_sentence_labels [R,K] (-1 in unused slots) and next_sentence_positions [R,K] (each
    sequence's [CLS] column; 0 in unused slots, slot 0 is always used at 0), in the input dtypes (int32 for the
    positions). A sequence's masked positions move with it: position p becomes start + p."""
    ids, mask = arrays["input_ids"], arrays["input_mask"]
    n, seq = ids.shape
    lengths = mask.astype(bool).sum(1)  # [n]
    if not np.array_equal(mask.astype(bool), np.arange(seq)[None, :] < lengths[:, None]):
        raise ValueError("pack_sequences: every instance's real tokens must come first (zero padding after them)")
    row, slot, start = first_fit_decreasing(lengths, seq, max_per_row)
    rows = int(row.max()) + 1 if n else 0

    out = {name: np.zeros((rows, seq), dtype=arrays[name].dtype) for name in ("input_ids", "input_mask", "segment_ids")}
    src_seq, src_col = np.nonzero(mask)  # every real token
    dst_row, dst_col = row[src_seq], start[src_seq] + src_col  # its place in the packed row
    for name in out:
        out[name][dst_row, dst_col] = arrays[name][src_seq, src_col]

    labels = np.full((rows, max_per_row), -1, dtype=arrays["next_sentence_labels"].dtype)
    labels[row, slot] = arrays["next_sentence_labels"].reshape(-1)
    cls_positions = np.zeros((rows, max_per_row), dtype=np.int32)
    cls_positions[row, slot] = start
    out["next_sentence_labels"], out["next_sentence_positions"] = labels, cls_positions

    # Masked positions: every used slot (p > 0) of every sequence, moved by its start, sorted within each row.
    positions, masked_ids = arrays["masked_lm_positions"], arrays["masked_lm_ids"]
    src_seq, src_slot = np.nonzero(positions > 0)
    target_row = row[src_seq]
    target_pos = start[src_seq] + positions[src_seq, src_slot]
    order = np.lexsort((target_pos, target_row))  # by row, then position
    target_row, target_pos = target_row[order], target_pos[order]
    rank = np.arange(len(order)) - np.searchsorted(target_row, target_row)  # [M]: the slot within its row
    if len(rank) and rank.max() >= max_predictions:
        raise ValueError(
            f"pack_sequences: a packed row holds {rank.max() + 1} masked positions, more than "
            f"max_predictions {max_predictions}"
        )
    out["masked_lm_positions"] = np.zeros((rows, max_predictions), dtype=positions.dtype)
    out["masked_lm_ids"] = np.zeros((rows, max_predictions), dtype=masked_ids.dtype)
    out["masked_lm_positions"][target_row, rank] = target_pos
    out["masked_lm_ids"][target_row, rank] = masked_ids[src_seq, src_slot][order]
    return out


def unigram_log_prior(shard: Path, vocab_size: int, max_rows: int = 100_000) -> np.ndarray:
    """[V] float32: ln p(token) over the masked targets of a shard's first `max_rows` rows (of every real token when
    the shard was written unmasked), add-one smoothed so that every id has a finite value: a masked-LM output bias
    under which an untrained model predicts the unigram distribution (run_pretraining.py --mlm_bias_init
    unigram), and the demo's context-free reference. numpy, so that a reader need not start torch."""
    import h5py

    with h5py.File(shard, "r") as f:
        positions, ids = f["masked_lm_positions"][:max_rows], f["masked_lm_ids"][:max_rows]
        targets = ids[positions > 0]
        if not len(targets):  # written unmasked (dynamic masking): every real token instead
            targets = f["input_ids"][:max_rows][f["input_mask"][:max_rows] > 0]
    counts = np.bincount(targets.astype(np.int64), minlength=vocab_size)[:vocab_size] + 1.0
    return np.log(counts / counts.sum()).astype(np.float32)
