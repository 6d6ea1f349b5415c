"""Pre-training examples (masked LM + next sentence) from plain text, written as NVIDIA's HDF5 shards.

Input: one sentence per line, a blank line between documents. `--input_file` is a file, a comma-separated list,
a glob, or a folder of .txt files. With `--output_file` every input file goes into ONE corpus and one HDF5 file
(Google's behaviour: the random "next sentence" may come from any of them). With `--output_dir` every input file is
a shard of its own, written to `<output_dir>/<stem>.hdf5` with seed `--random_seed + i` (i = the shard's index in
sorted order), exactly what `data/bertPrep.py --action create_hdf5_files` does with one call per shard. The start of
a file always starts a new document (Google would glue the last document of one file to the first of the next).

Google's algorithm (create_pretraining_data.py of google-research/bert, re-implemented on token ids):
  * documents are shuffled; `dupe_factor` passes are made over them;
  * per document, target = max_seq_length - 3, or with probability short_seq_prob a random length in [2, target];
  * sentences are gathered into a chunk until it reaches the target (or the document ends); segment A is a random
    number of leading sentences of the chunk; B is the rest of the chunk, or (always when the chunk has one sentence,
    otherwise with probability 0.5) a span of sentences from a random other document starting at a random sentence,
    long enough for the target, and the chunk's unused sentences are put back for the next chunk;
  * the pair is truncated to max_seq_length - 3 by trimming the longer side (B on a tie), each token from the front
    or the back with probability 0.5 (drawn here as one binomial count per side: the same distribution);
  * `[CLS] A [SEP] B [SEP]`, segment ids 0 up to and including the first [SEP], 1 after;
  * num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob))) positions (Python's
    round: half to even; numpy's rint is the same on the same float) drawn uniformly from every position but
    [CLS]/[SEP]; each is replaced by [MASK] 80%, kept 10%, a random vocabulary id 10% (uniform over ids
    0..vocab_size-1, i.e. over the vocabulary file in id order, as Google's vocab_words list); positions ascending.
    `--do_whole_word_mask`: "##" pieces join the preceding candidate (Google's rule, even across a [SEP]) and words are
    taken in random order while they fit in num_to_predict;
  * all instances of a corpus are shuffled before writing.

Speed, determinism, memory: files are tokenized in byte chunks by `--num_workers` processes, each distinct
space-separated piece of text once (exact: see _encode_lines) through the Rust tokenizer's encode_batch. Instances
are made in work units of (dupe pass, block of documents), each with its own numpy SeedSequence child of
`--random_seed`, so the arrays are identical for any worker count and start method. The token ids of one corpus
(2 bytes a token for a BERT vocabulary) go to a work folder beside the output, which the workers memory-map; the
finished instances go there too, into random buckets of ~8 MB that are shuffled one at a time when writing (a
uniform shuffle of the whole list, as Google's). The main process keeps ~16 bytes a sentence. So memory does not
grow with dupe_factor or the number of instances; what grows with one corpus (all inputs with --output_file, one
shard with --output_dir) is the token map the workers touch and the sentence offsets.

Output: NVIDIA's layout, zero-padded; gzip (--gzip_level, default 1, with HDF5's shuffle filter: h5py reads it
like any NVIDIA shard) unless --compression none. N instances, S = max_seq_length, P = max_predictions_per_seq:
    input_ids [N,S] int32, input_mask [N,S] int8, segment_ids [N,S] int8,
    masked_lm_positions [N,P] int32, masked_lm_ids [N,P] int32 (unused slots 0; position 0 is [CLS], never masked),
    next_sentence_labels [N] int8 (1 = B is a random next).
With --no_static_masking the input_ids are left unmasked and masked_lm_positions/masked_lm_ids are all zeros; the
file attribute `masking` is "dynamic" (else "static") and the loader draws masks per epoch with `dynamic_mask`.

Sequence packing (--pack_sequences K, K >= 2): after the shuffle, every window of PACK_WINDOW (8,192) consecutive
instances is packed first-fit-decreasing (longest first, each into the first row with room and fewer than K
sequences) into rows of max_seq_length, the sequences back to back and the padding after the last one. Each
sequence keeps its own tokens, token types ([CLS] A [SEP] 0s, B [SEP] 1s) and masked positions (moved by its
start); run_pretraining.py gives each its own attention block, positions from 0 and NSP from its own [CLS]. A packed
shard (N rows, K sequences at most a row, P_row = min(K*P, floor(S*masked_lm_prob) + K) masked slots a row,
enough for any K sequences of together S tokens) holds
    input_ids [N,S] int32, input_mask [N,S] int8 (1 at every real token), segment_ids [N,S] int8,
    masked_lm_positions [N,P_row] int32 (ascending over the row, 0 = unused), masked_lm_ids [N,P_row] int32,
    next_sentence_labels [N,K] int8 (-1 = unused slot), next_sentence_positions [N,K] int32 (each sequence's [CLS]
    column; slot 0 is always used, at 0; a later slot at 0 is unused),
and the attributes packing="first_fit_decreasing", max_sequences_per_row=K, packed_sequences (instances),
max_predictions_per_row=P_row. The summary line reports instances and packed_rows.
Why offline (here) and not in the loader: the shards keep static shapes (B rows of S, P_row and K slots: one
compiled graph, CUDA graphs), the resumable data position stays a row count in a fixed file (exact resume and the
process-split independence are unchanged), and the packing work is done once per dataset, not per epoch and rank
(MLPerf's BERT packs offline too). The cost: a packed dataset is packed the same way every epoch.

Example:
    python create_pretraining_data.py --input_file shard_0.txt --output_file shard_0.hdf5 \\
        --vocab_file vocab.txt --do_lower_case --max_seq_length 128 --max_predictions_per_seq 20 \\
        --masked_lm_prob 0.15 --short_seq_prob 0.1 --dupe_factor 5 --random_seed 12345 --num_workers 8
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import glob
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

# Work-unit sizes. They shape the random streams, so they are constants: changing one changes the output arrays.
CHUNK_BYTES = 1 << 18  # text per tokenization task
UNIT_TOKENS = 1 << 17  # corpus tokens per instance-making unit (one dupe pass over a block of documents)
BUCKET_BYTES = 1 << 23  # instances per shuffle bucket on disk: the memory of the final shuffle
PACK_WINDOW = 1 << 13  # consecutive shuffled instances packed together (--pack_sequences): rows never mix windows

# SeedSequence spawn keys: one independent stream per purpose.
_KEY_DOC_SHUFFLE, _KEY_UNIT, _KEY_INSTANCE_SHUFFLE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    """Everything a work unit needs besides the corpus (picklable: it travels to the worker processes)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_whole_word_mask: bool = False
    static_masking: bool = True
    pack_sequences: int = 0  # K >= 2: pack up to K instances a row when writing (0: one a row)
    vocab_size: int = 30522
    cls_id: int = 101
    sep_id: int = 102
    mask_id: int = 103


# ---------------------------------------------------------------------------------------------------------------
# Masking, shared by the static path (here) and dynamic masking (the pre-training loader).


def _masked_count(lengths: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    """min(P, max(1, round(L * p))) per row; np.rint rounds half to even exactly like Python's round."""
    return np.minimum(max_predictions, np.maximum(1, np.rint(lengths * masked_lm_prob))).astype(np.int64)


def _choose_positions(cand: np.ndarray, counts: np.ndarray, max_predictions: int, rng: np.random.Generator):
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


def _choose_whole_words(ids: np.ndarray, cand: np.ndarray, counts: np.ndarray, max_predictions: int,
                        is_subword: np.ndarray, rng: np.random.Generator):
    """Google's whole-word selection: "##" pieces join the previous candidate's word; shuffled words are taken
    while they fit in the row's count (a word that would overflow is skipped). Same outputs as _choose_positions.
    """
    n = ids.shape[0]
    positions = np.zeros((n, max_predictions), dtype=np.int64)
    valid = np.zeros((n, max_predictions), dtype=bool)
    for row in range(n):
        chosen = _whole_words_of_row(ids[row], cand[row], int(counts[row]), is_subword, rng)
        positions[row, : len(chosen)] = chosen
        valid[row, : len(chosen)] = True
    return positions, valid


def _whole_words_of_row(ids: np.ndarray, cand: np.ndarray, count: int, is_subword: np.ndarray,
                        rng: np.random.Generator) -> np.ndarray:
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


def _replace(ids: np.ndarray, positions: np.ndarray, valid: np.ndarray, vocab_size: int, mask_id: int,
             rng: np.random.Generator):
    """80% [MASK], 10% unchanged, 10% a uniform random id in [0, vocab_size). Returns (masked ids, labels [n,P])."""
    labels = np.where(valid, np.take_along_axis(ids, positions, 1), 0)
    u = rng.random(positions.shape)
    random_ids = rng.integers(0, vocab_size, positions.shape)
    new = np.where(u < 0.8, mask_id, np.where(u < 0.9, labels, random_ids))
    out = ids.copy()
    rows, slots = np.nonzero(valid)
    out[rows, positions[rows, slots]] = new[rows, slots]
    return out, labels


def dynamic_mask(input_ids, input_mask, vocab_size: int, special_ids: Iterable[int], rng,
                 masked_lm_prob: float = 0.15, max_predictions_per_seq: int = 20, mask_token_id: int = 103):
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
    mask = input_mask.detach().cpu().numpy() if type(input_mask).__module__.split(".")[0] == "torch" \
        else np.asarray(input_mask)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids and input_mask must both be [N, S]; got {ids.shape} and {mask.shape}")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    real = mask.astype(bool)
    cand = real & ~np.isin(ids, np.fromiter(special_ids, dtype=np.int64))
    counts = _masked_count(real.sum(1), masked_lm_prob, max_predictions_per_seq)
    positions, valid = _choose_positions(cand, counts, max_predictions_per_seq, rng)
    masked, labels = _replace(ids, positions, valid, vocab_size, mask_token_id, rng)
    labels = labels.astype(np.int64)
    if as_torch:
        import torch

        return (torch.from_numpy(masked).to(device), torch.from_numpy(positions).to(device),
                torch.from_numpy(labels).to(device))
    return masked, positions, labels


# ---------------------------------------------------------------------------------------------------------------
# Sequence packing (--pack_sequences K): several finished instances share one row of max_seq_length. Offline, here,
# not in the loader: see the module docstring.


def packed_predictions(max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float,
                       max_sequences_per_row: int) -> int:
    """The masked-LM slots of a packed row: enough for any K sequences of together at most S tokens.

    A sequence of L tokens gets min(P, max(1, round(L p))) <= L p + 1 predictions, so K of them with sum L <= S get
    at most floor(S p) + K; never more than K P (each sequence at most P). For S 128, P 20, p 0.15, K 3: 22 slots."""
    bound = math.floor(max_seq_length * masked_lm_prob + 1e-6) + max_sequences_per_row
    return int(min(max_sequences_per_row * max_predictions_per_seq, bound))


def first_fit_decreasing(lengths: np.ndarray, capacity: int, max_per_row: int
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

    out = {name: np.zeros((rows, seq), dtype=arrays[name].dtype) for name in ("input_ids", "input_mask",
                                                                            "segment_ids")}
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
        raise ValueError(f"pack_sequences: a packed row holds {rank.max() + 1} masked positions, more than "
                         f"max_predictions {max_predictions}")
    out["masked_lm_positions"] = np.zeros((rows, max_predictions), dtype=positions.dtype)
    out["masked_lm_ids"] = np.zeros((rows, max_predictions), dtype=masked_ids.dtype)
    out["masked_lm_positions"][target_row, rank] = target_pos
    out["masked_lm_ids"][target_row, rank] = masked_ids[src_seq, src_slot][order]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Stage 1: tokenization. A task is a byte range of one file that starts and ends at line starts.


def byte_chunks(path: str, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[str, int, int]]:
    """(path, start, end) ranges of about chunk_bytes, each ending just after a newline (or at the end of file)."""
    size = os.path.getsize(path)
    chunks, start = [], 0
    with open(path, "rb") as f:
        while start < size:
            end = start + chunk_bytes
            if end < size:
                f.seek(end)
                f.readline()
                end = f.tell()
            end = min(end, size)
            chunks.append((path, start, end))
            start = end
    return chunks


_TOKENIZER = None  # the worker's (or the single process's) BertTokenizer
WORD_CACHE_MAX = 1 << 19  # distinct pieces remembered per process (~60 MB at most), then it starts afresh


class _PieceTable:
    """Token ids of every distinct space-separated piece of text seen so far: piece -> index -> ids."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.tokens = np.zeros(0, np.int32)  # all pieces' ids, back to back
        self.start = np.zeros(0, np.int64)  # [pieces] offset of each piece's ids in `tokens`
        self.length = np.zeros(0, np.int64)  # [pieces] number of ids of each piece

    def add(self, pieces: list[str], encoded: list[list[int]]) -> None:
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        self.index.update(zip(pieces, range(len(self.index), len(self.index) + len(pieces))))
        self.start = np.concatenate([self.start, len(self.tokens) + np.cumsum(lengths) - lengths])
        self.length = np.concatenate([self.length, lengths])
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
        self.tokens = np.concatenate([self.tokens, flat])


_PIECES = _PieceTable()


def _init_worker(vocab_file: str, do_lower_case: bool, threads_off: bool) -> None:
    global _TOKENIZER, _PIECES
    if threads_off:  # one Rust thread per worker process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenization import BertTokenizer

    _TOKENIZER = BertTokenizer(vocab_file, do_lower_case=do_lower_case)
    _PIECES = _PieceTable()  # the piece cache belongs to this tokenizer


def _tokenize_chunk(task: tuple[str, int, int]):
    """Token ids of the sentences (non-blank lines) of one byte range.

    Returns (ids [T] int32, sentence lengths [n] int32, new_document [n] bool, trailing_break bool): new_document
    marks a sentence preceded by a blank line inside the chunk; trailing_break says blank lines came after the last
    sentence (or, for a chunk without sentences, that it had one). Lines that tokenize to nothing are dropped.
    """
    path, start, end = task
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", errors="replace")  # U+FFFD is dropped by BERT's text cleaning
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the text after the final newline is not a line
    sentences, breaks, pending = [], [], False
    for line in lines:
        line = line.strip()
        if not line:
            pending = True
            continue
        sentences.append(line)
        breaks.append(pending)
        pending = False
    ids, lengths = _encode_lines(sentences)
    new_doc, carry = [], False
    for brk, length in zip(breaks, lengths.tolist()):
        carry = carry or brk  # a break before a line that tokenizes to nothing moves to the next kept sentence
        if length:
            new_doc.append(carry)
            carry = False
    return ids, lengths[lengths > 0].astype(np.int32), np.asarray(new_doc, dtype=bool), carry or pending


def _encode_lines(lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ids of tokenizer.encode(line) for every line, concatenated [T] int32, and each line's length [n].

    Each distinct space-separated piece of text is tokenized once. Exact, not an approximation: BERT's cleaning
    and CJK spacing work character by character and a space always separates words before lower-casing, accent
    stripping, punctuation splitting and WordPiece, which all work within a word; so the ids of a line are the
    concatenated ids of its pieces. Text is Zipfian: a chunk holds few pieces not seen before, and those go to
    the Rust tokenizer in one encode_batch call.
    """
    global _PIECES
    words_per_line = [line.split(" ") for line in lines]
    words = list(itertools.chain.from_iterable(words_per_line))
    missing = set(words).difference(_PIECES.index)
    if len(_PIECES.index) + len(missing) > WORD_CACHE_MAX:  # bound the memory: start afresh
        _PIECES = _PieceTable()
        missing = set(words)
    if missing:
        missing_list = list(missing)
        _PIECES.add(missing_list, _TOKENIZER.encode_batch(missing_list))
    piece = np.fromiter(map(_PIECES.index.__getitem__, words), dtype=np.int64, count=len(words))
    lengths, starts = _PIECES.length[piece], _PIECES.start[piece]
    total = int(lengths.sum())
    # Gather every piece's run of ids: position k of the output reads tokens[start of its piece + offset in it].
    out_start = np.cumsum(lengths) - lengths
    ids = _PIECES.tokens[np.repeat(starts - out_start, lengths) + np.arange(total)]
    words_in_line = np.fromiter(map(len, words_per_line), dtype=np.int64, count=len(lines))
    line_end = np.cumsum(words_in_line)
    token_end = np.concatenate([[0], np.cumsum(lengths)])[line_end]
    line_lengths = np.diff(np.concatenate([[0], token_end]))
    return ids, line_lengths


@dataclasses.dataclass
class Corpus:
    """Token ids of one corpus: tokens [T], sentence token offsets [n_sent+1], document sentence offsets [n_doc+1].

    The arrays are memory-mapped from a work folder: the main process and every worker share one copy.
    """

    tokens: np.ndarray
    sent_start: np.ndarray
    doc_start: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.doc_start) - 1

    @classmethod
    def load(cls, folder: str) -> "Corpus":
        # Plain ndarray views of the maps: indexing an np.memmap object costs ~10x more per call.
        sent_start = np.load(os.path.join(folder, "sent_start.npy"), mmap_mode="r").view(np.ndarray)
        doc_start = np.load(os.path.join(folder, "doc_start.npy"), mmap_mode="r").view(np.ndarray)
        (name,) = [f for f in os.listdir(folder) if f.startswith("tokens.")]
        dtype = np.dtype(name.split(".")[1])
        count = int(sent_start[-1])
        tokens = np.memmap(os.path.join(folder, name), dtype=dtype, mode="r", shape=(count,)).view(np.ndarray) \
            if count else np.zeros(0, dtype)
        return cls(tokens, sent_start, doc_start)


class CorpusBuilder:
    """Joins the tokenized chunks, in file and byte order, into a Corpus in `folder`.

    The ids go straight to disk (uint16 for vocabularies up to 65,536 ids); only the sentence lengths and document
    breaks (5 bytes a sentence) stay in memory.
    """

    def __init__(self, folder: str, vocab_size: int):
        self.folder = folder
        self.dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)
        self.file = open(os.path.join(folder, f"tokens.{self.dtype.name}.bin"), "wb")
        self.lengths: list[np.ndarray] = []
        self.new_doc: list[np.ndarray] = []
        self.pending = True  # the first sentence starts a document

    def add(self, piece: tuple, starts_file: bool = False) -> None:
        ids, lengths, new_doc, trailing = piece
        self.pending = self.pending or starts_file  # a file never continues the previous file's document
        if len(lengths):
            new_doc = new_doc.copy()
            new_doc[0] |= self.pending
            self.pending = trailing
        else:
            self.pending = self.pending or trailing
        self.file.write(ids.astype(self.dtype).tobytes())
        self.lengths.append(lengths)
        self.new_doc.append(new_doc)

    def finish(self) -> Corpus:
        self.file.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int32)
        new_doc = np.concatenate(self.new_doc) if self.new_doc else np.zeros(0, bool)
        sent_start = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=sent_start[1:])
        doc_start = np.append(np.flatnonzero(new_doc), len(lengths)).astype(np.int64)
        np.save(os.path.join(self.folder, "sent_start.npy"), sent_start)
        np.save(os.path.join(self.folder, "doc_start.npy"), doc_start)
        return Corpus.load(self.folder)


# ---------------------------------------------------------------------------------------------------------------
# Stage 2: instances. A unit is one dupe pass over a block of (shuffled) documents, with its own random streams.


class _Uniforms:
    """Python floats in [0,1) drawn from a numpy Generator a block at a time (scalar numpy calls are slow)."""

    def __init__(self, gen: np.random.Generator, block: int = 4096):
        self.gen, self.block, self.buf, self.i = gen, block, [], 0

    def random(self) -> float:
        if self.i == len(self.buf):
            self.buf, self.i = self.gen.random(self.block).tolist(), 0
        self.i += 1
        return self.buf[self.i - 1]

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi], both inclusive (Python's random.randint)."""
        return lo + int(self.random() * (hi - lo + 1))


def make_units(corpus: Corpus, cfg: InstanceConfig) -> list[tuple[int, int, np.ndarray]]:
    """(dupe pass, block index, document indices) for every unit, in output order; depends on the data only."""
    order = np.random.default_rng(np.random.SeedSequence(cfg.random_seed, spawn_key=(_KEY_DOC_SHUFFLE,)))
    docs = order.permutation(corpus.num_documents)
    doc_tokens = np.diff(corpus.sent_start[corpus.doc_start])[docs]
    block_of = np.cumsum(doc_tokens) // UNIT_TOKENS  # document d goes to block floor(tokens before its end / U)
    bounds = np.flatnonzero(np.diff(block_of)) + 1
    blocks = np.split(docs, bounds)
    return [(p, b, block) for p in range(cfg.dupe_factor) for b, block in enumerate(blocks)]


def _document_pairs(corpus: Corpus, doc: int, cfg: InstanceConfig, u: _Uniforms, out: list) -> None:
    """Google's chunking of one document into (A, B) token ranges; appends (a_lo, a_hi, b_lo, b_hi, random_next)."""
    sent_start, doc_start = corpus.sent_start, corpus.doc_start
    s0, s1 = int(doc_start[doc]), int(doc_start[doc + 1])
    starts = sent_start[s0: s1 + 1].tolist()  # token offsets of this document's sentences, and its end
    n, n_docs = s1 - s0, corpus.num_documents
    max_num_tokens = cfg.max_seq_length - 3
    target = max_num_tokens
    if u.random() < cfg.short_seq_prob:
        target = u.randint(2, max_num_tokens)
    i, chunk_lo = 0, 0
    while i < n:
        if i == n - 1 or starts[i + 1] - starts[chunk_lo] >= target:
            size = i - chunk_lo + 1
            a_end = chunk_lo + (u.randint(1, size - 1) if size >= 2 else 1)
            a_lo, a_hi = starts[chunk_lo], starts[a_end]
            if size == 1 or u.random() < 0.5:
                b_lo, b_hi = _random_next(corpus, doc, n_docs, target - (a_hi - a_lo), u)
                out.append((a_lo, a_hi, b_lo, b_hi, 1))
                i = a_end - 1  # put the chunk's unused sentences back
            else:
                out.append((a_lo, a_hi, a_hi, starts[i + 1], 0))
            chunk_lo = i + 1
        i += 1


def _random_next(corpus: Corpus, doc: int, n_docs: int, target_b: int, u: _Uniforms) -> tuple[int, int]:
    """Token range of sentences from a random other document, from a random sentence until target_b is reached."""
    for _ in range(10):  # Google's ten tries at a document other than this one
        other = u.randint(0, n_docs - 1)
        if other != doc:
            break
    r0, r1 = int(corpus.doc_start[other]), int(corpus.doc_start[other + 1])
    first = u.randint(r0, r1 - 1)
    b_lo = int(corpus.sent_start[first])
    # Sentences from `first` on, up to the first whose end reaches b_lo + target_b, or to the document's end.
    ends = corpus.sent_start[first + 1: r1 + 1]
    k = int(ends.searchsorted(b_lo + target_b))
    return b_lo, int(ends[min(k, len(ends) - 1)])


def _truncate(spans: np.ndarray, max_num_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Google's truncate_seq_pair on [n,4] (a_lo, a_hi, b_lo, b_hi) ranges, vectorized.

    Tokens are removed one at a time from the longer side (B on a tie), from the front or back with p=0.5 each.
    Which side loses how many is determined by the lengths; the front/back split is Binomial(count, 0.5).
    """
    la, lb = spans[:, 1] - spans[:, 0], spans[:, 3] - spans[:, 2]
    excess = np.maximum(la + lb - max_num_tokens, 0)
    first = np.minimum(excess, np.abs(la - lb))  # taken from the longer side until both are equal
    rest = excess - first  # then alternately, B first
    cut_a = np.where(la > lb, first, 0) + rest // 2
    cut_b = np.where(la > lb, 0, first) + rest - rest // 2
    front_a, front_b = rng.binomial(cut_a, 0.5), rng.binomial(cut_b, 0.5)
    return np.stack([spans[:, 0] + front_a, spans[:, 1] - (cut_a - front_a),
                     spans[:, 2] + front_b, spans[:, 3] - (cut_b - front_b)], axis=1)


def make_unit_instances(corpus: Corpus, unit: tuple[int, int, np.ndarray], cfg: InstanceConfig,
                        is_subword: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """All instances of one unit, compactly: input_ids [n,S] (masked unless cfg.static_masking is off), len_a [n],
    len_b [n], masked_lm_positions [n,P], masked_lm_ids [n,P], next_sentence_labels [n]."""
    pass_index, block_index, docs = unit
    seed = np.random.SeedSequence(cfg.random_seed, spawn_key=(_KEY_UNIT, pass_index, block_index))
    pair_seed, mask_seed = seed.spawn(2)
    u = _Uniforms(np.random.default_rng(pair_seed))
    rng = np.random.default_rng(mask_seed)
    pairs: list = []
    for doc in docs.tolist():
        _document_pairs(corpus, doc, cfg, u, pairs)
    pairs_arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 5)
    spans = _truncate(pairs_arr[:, :4], cfg.max_seq_length - 3, rng)
    la, lb = spans[:, 1] - spans[:, 0], spans[:, 3] - spans[:, 2]

    seq, col = cfg.max_seq_length, np.arange(cfg.max_seq_length)[None, :]
    la_, lb_ = la[:, None], lb[:, None]
    in_a = (col >= 1) & (col <= la_)
    in_b = (col >= la_ + 2) & (col <= la_ + lb_ + 1)
    src = np.where(in_a, spans[:, :1] + col - 1, np.where(in_b, spans[:, 2:3] + col - la_ - 2, 0))
    ids = np.where(in_a | in_b, np.asarray(corpus.tokens[src]), 0).astype(np.int32)
    rows = np.arange(len(ids))
    ids[:, 0] = cfg.cls_id
    ids[rows, la + 1] = cfg.sep_id
    ids[rows, la + lb + 2] = cfg.sep_id

    p = cfg.max_predictions_per_seq
    if cfg.static_masking:
        counts = _masked_count(la + lb + 3, cfg.masked_lm_prob, p)
        cand = in_a | in_b
        if cfg.do_whole_word_mask:
            positions, valid = _choose_whole_words(ids, cand, counts, p, is_subword, rng)
        else:
            positions, valid = _choose_positions(cand, counts, p, rng)
        ids, labels = _replace(ids, positions, valid, cfg.vocab_size, cfg.mask_id, rng)
    else:
        positions = labels = np.zeros((len(ids), p), dtype=np.int64)
    token_dtype = corpus.tokens.dtype
    pos_dtype = np.int16 if seq < 1 << 15 else np.int32
    return {"input_ids": ids.astype(token_dtype), "len_a": la.astype(np.int32), "len_b": lb.astype(np.int32),
            "masked_lm_positions": positions.astype(pos_dtype), "masked_lm_ids": labels.astype(token_dtype),
            "next_sentence_labels": pairs_arr[:, 4].astype(np.int8)}


# Worker-side state for stage 2: the memory-mapped corpus of the current shard.
_CORPUS_CACHE: dict[str, Corpus] = {}


def _unit_task(args: tuple[str, tuple, InstanceConfig, np.ndarray | None]) -> dict[str, np.ndarray]:
    folder, unit, cfg, is_subword = args
    if folder not in _CORPUS_CACHE:
        _CORPUS_CACHE.clear()  # one shard at a time
        _CORPUS_CACHE[folder] = Corpus.load(folder)
    return make_unit_instances(_CORPUS_CACHE[folder], unit, cfg, is_subword)


class InstanceSpill:
    """The instances, spilled to disk in random buckets: Google's shuffle of the whole list without holding it.

    Every instance gets a uniform random bucket as it arrives (in unit order); at the end each bucket is read back
    whole, shuffled, and emitted in turn. A uniform bucket and then a uniform order inside it is a uniform
    permutation of all the instances (it sorts them by the i.i.d. keys bucket + u), with sequential I/O and one
    bucket in memory.
    """

    def __init__(self, folder: str, buckets: int, rng: np.random.Generator):
        self.folder, self.buckets, self.rng, self.n = folder, buckets, rng, 0
        self.dtype: np.dtype | None = None  # one record per instance, all fields side by side
        self.files: list = []

    def _path(self, bucket: int) -> str:
        return os.path.join(self.folder, f"bucket_{bucket}.bin")

    def add(self, result: dict[str, np.ndarray]) -> None:
        if self.dtype is None:
            self.dtype = np.dtype([(name, a.dtype, a.shape[1:]) for name, a in result.items()])
            self.files = [open(self._path(b), "wb") for b in range(self.buckets)]
        n = len(result["len_a"])
        records = np.empty(n, self.dtype)
        for name, array in result.items():
            records[name] = array
        bucket = self.rng.integers(0, self.buckets, n)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.buckets + 1))
        records = records[order]
        for b in range(self.buckets):
            if bounds[b] < bounds[b + 1]:
                self.files[b].write(records[bounds[b]: bounds[b + 1]].tobytes())
        self.n += n

    def close(self) -> None:
        for f in self.files:
            f.close()

    def blocks(self, rows: int):
        """The shuffled instances in consecutive blocks of `rows` (the last one shorter), each a dict of fields."""
        carry = np.empty(0, self.dtype)
        for b in range(self.buckets):
            stored = np.fromfile(self._path(b), dtype=self.dtype)
            os.remove(self._path(b))
            records = np.empty(len(carry) + len(stored), self.dtype)
            records[: len(carry)] = carry
            np.take(stored, self.rng.permutation(len(stored)), out=records[len(carry):])
            del stored, carry
            full = len(records) // rows * rows
            for lo in range(0, full, rows):  # copies: a block in flight must not pin the whole bucket
                yield {name: records[name][lo: lo + rows].copy() for name in self.dtype.names}
            carry = records[full:].copy()
            del records
        if len(carry):
            yield {name: carry[name] for name in self.dtype.names}


# ---------------------------------------------------------------------------------------------------------------
# Output


_LAYOUT = (("input_ids", "i4"), ("input_mask", "i1"), ("segment_ids", "i1"), ("masked_lm_positions", "i4"),
           ("masked_lm_ids", "i4"), ("next_sentence_labels", "i1"))


def _nvidia_rows(rows: dict[str, np.ndarray], seq: int) -> dict[str, np.ndarray]:
    """NVIDIA's arrays from the stored fields; input_mask and segment_ids are rebuilt from the segment lengths."""
    col = np.arange(seq)[None, :]
    la, lb = rows["len_a"][:, None], rows["len_b"][:, None]
    end = la + lb + 3
    return {"input_ids": rows["input_ids"].astype(np.int32),
            "input_mask": (col < end).astype(np.int8),
            "segment_ids": ((col >= la + 2) & (col < end)).astype(np.int8),
            "masked_lm_positions": rows["masked_lm_positions"].astype(np.int32),
            "masked_lm_ids": rows["masked_lm_ids"].astype(np.int32),
            "next_sentence_labels": rows["next_sentence_labels"].astype(np.int8)}


def _compress_chunk(array: np.ndarray, rows: int, level: int) -> bytes:
    """One whole HDF5 chunk through the shuffle and deflate filters, as HDF5 itself would store it.

    A direct chunk is always full: the last block is padded with zero rows. The shuffle filter stores byte k of
    every element together (byte planes): small ids then compress better and faster (on WikiText input_ids, level
    1 + shuffle is 7% smaller than NVIDIA's level 4 without it, in less than half the time).
    """
    padded = np.pad(array, [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1))
    planes = padded.reshape(-1).view(np.uint8).reshape(-1, padded.itemsize).T
    return zlib.compress(np.ascontiguousarray(planes).tobytes(), level)


def _bounded_map(executor: ThreadPoolExecutor, fn, items, window: int):
    """executor.map with at most `window` results in flight, so finished blocks cannot pile up in memory."""
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _packed_blocks(spill: InstanceSpill, cfg: InstanceConfig, width: int, rows: int):
    """The shuffled instances packed (--pack_sequences), PACK_WINDOW instances at a time, in NVIDIA's arrays plus
    next_sentence_positions, re-cut into blocks of `rows` packed rows (the last one shorter)."""
    carry: dict[str, np.ndarray] | None = None
    for fields in spill.blocks(PACK_WINDOW):
        packed = pack_sequences(_nvidia_rows(fields, cfg.max_seq_length), cfg.pack_sequences, width)
        carry = packed if carry is None else {k: np.concatenate([carry[k], packed[k]]) for k in packed}
        while len(carry["input_ids"]) >= rows:
            yield {k: v[:rows] for k, v in carry.items()}
            carry = {k: v[rows:] for k, v in carry.items()}
    if carry is not None and len(carry["input_ids"]):
        yield carry


def write_hdf5(path: Path, spill: InstanceSpill, cfg: InstanceConfig, compression: str | None,
               attrs: dict[str, Any], threads: int = 1, gzip_level: int = 1) -> int:
    """Write the spilled instances, shuffled, in NVIDIA's layout, atomically (see shard_file). Returns N (rows
    written: packed rows with --pack_sequences).

    With gzip (plus HDF5's shuffle filter; h5py readers undo both transparently), blocks of rows are compressed
    by `threads` threads (zlib lets go of the GIL) and stored as finished chunks (write_direct_chunk): the bytes
    HDF5's own filters would write, without a single-threaded tail. Packed rows are not counted before they are
    made, so their datasets grow as blocks arrive (chunked, unlimited rows).
    """
    n, seq, p, k = spill.n, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.pack_sequences
    rows = max(64, (1 << 19) // (4 * seq))  # 512 KiB chunks of input_ids
    if not k:
        rows = min(n, rows)  # HDF5: a fixed-size dataset's chunks hold no more than its N rows
    else:
        p = packed_predictions(seq, p, cfg.masked_lm_prob, k)
    shapes = {"input_ids": (seq,), "input_mask": (seq,), "segment_ids": (seq,), "masked_lm_positions": (p,),
              "masked_lm_ids": (p,), "next_sentence_labels": (k,) if k else ()}
    layout_dtypes = _LAYOUT
    if k:
        shapes["next_sentence_positions"] = (k,)
        layout_dtypes = _LAYOUT + (("next_sentence_positions", "i4"),)

    def block(fields: dict[str, np.ndarray]) -> tuple[int, dict[str, Any]]:
        if k:  # packed blocks come in NVIDIA's arrays already, in the instances' dtypes
            arrays = {name: fields[name].astype(dtype, copy=False) for name, dtype in layout_dtypes}
        else:
            arrays = _nvidia_rows(fields, seq)
        count = len(arrays["input_ids"])
        if not compression:
            return count, arrays
        return count, {name: _compress_chunk(a, rows, gzip_level) for name, a in arrays.items()}

    # Packed: at most n rows (one sequence each), so n rows bound the file's size either way.
    raw_bytes = n * sum(np.dtype(dtype).itemsize * math.prod(shapes[name]) for name, dtype in layout_dtypes)
    with shard_file(path, raw_bytes) as f, ThreadPoolExecutor(threads) as executor:
        out = {}
        for name, dtype in layout_dtypes:
            layout = {"chunks": (rows,) + shapes[name], "compression": compression,
                      "compression_opts": gzip_level, "shuffle": True} if compression else {}
            if k:  # packed: the row count is known at the end; grow as blocks arrive
                layout.update(chunks=(rows,) + shapes[name], maxshape=(None,) + shapes[name])
            out[name] = f.create_dataset(name, (0 if k else n,) + shapes[name], dtype=dtype, **layout)
        f.attrs.update(attrs)
        if k:
            f.attrs.update({"packing": "first_fit_decreasing", "max_sequences_per_row": k,
                            "packed_sequences": n, "max_predictions_per_row": p})
        source = _packed_blocks(spill, cfg, p, rows) if k else spill.blocks(rows)
        starts = itertools.count(0, rows)
        written = 0
        for lo, (count, data) in zip(starts, _bounded_map(executor, block, source, window=2 * threads)):
            for name, value in data.items():
                if k:  # packed: grow the dataset to hold this block
                    out[name].resize(lo + count, axis=0)
                if compression:
                    out[name].id.write_direct_chunk((lo,) + (0,) * len(shapes[name]), value)
                else:
                    out[name][lo: lo + count] = value
            written = lo + count
    return written


DISK_MARGIN = 1 << 16  # bytes left free beyond a file's own size (file-system metadata)
IN_MEMORY_MAX_BYTES = 1 << 30  # shards up to this many bytes of uncompressed arrays are built in memory


@contextlib.contextmanager
def shard_file(path: Path, raw_bytes: int):
    """An open h5py.File for the shard; when the block ends without an error, the finished file is at `path`
    (atomically: never a partial file under that name), else nothing is.

    HDF5 that meets a full disk while writing a file raises and then crashes the interpreter (exit 139, measured
    with h5py 3.16). So a shard of up to IN_MEMORY_MAX_BYTES of arrays (`raw_bytes`, before compression; NVIDIA's
    recipe makes shards of tens to hundreds of MB) is built in memory (HDF5's core driver, no backing store) and
    its bytes written by write_file_image: a full disk is then a plain OSError, checked before the write and
    caught during it. The cost is memory: about 1.4x the shard's size on disk at the peak (measured: +3.5 MB for
    a 4.4 MB gzip shard, +90 MB for a 63 MB uncompressed one). A larger shard is written by HDF5 to a temporary
    file beside `path` after a check that the folder has room for the uncompressed arrays (an upper bound of the
    file), which keeps memory flat; only another writer filling the disk meanwhile can still crash that path.
    """
    import h5py

    if raw_bytes <= IN_MEMORY_MAX_BYTES:
        with h5py.File(f"{path.name}.in-memory", "w", driver="core", backing_store=False) as f:
            yield f
            f.flush()
            image = f.id.get_file_image()
        write_file_image(path, image)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path, raw_bytes)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; the shard should read like any other file
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # make the rename itself durable
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_free_space(path: Path, size: int) -> None:
    """An OSError naming `path` unless its folder has `size` bytes free (plus DISK_MARGIN)."""
    free = shutil.disk_usage(path.parent).free
    if free < size + DISK_MARGIN:
        raise OSError(f"{path}: the file needs {_mib(size + DISK_MARGIN)} but {path.parent} has {_mib(free)} free: "
                      "free some space or write elsewhere, then run again")


def write_file_image(path: Path, image: bytes) -> None:
    """Write a finished file's bytes atomically (utils.atomic_open: a temporary file, fsync, rename), after
    checking that the folder has room for them: a full disk is one line (an OSError naming the file and the free
    space), before anything is written, and a disk that fills during the write still leaves no partial file and
    no file under the final name."""
    from utils import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path, len(image))
    with atomic_open(path, "wb") as f:
        view = memoryview(image)
        for lo in range(0, len(view), 1 << 24):  # 16 MiB at a time: no second copy of the image
            f.write(view[lo: lo + (1 << 24)])


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# ---------------------------------------------------------------------------------------------------------------
# Driver


class _InProcess:
    """The Pool interface, run in this process (num_workers == 1): no start-up cost, same work units."""

    def imap(self, fn, tasks, chunksize=1):
        return map(fn, tasks)


def _spill_buckets(cfg: InstanceConfig, tokens: int, token_bytes: int) -> int:
    """Enough shuffle buckets for ~BUCKET_BYTES each, from the expected instance count (depends on the data only)."""
    record = (cfg.max_seq_length + cfg.max_predictions_per_seq) * token_bytes + cfg.max_predictions_per_seq * 4 + 9
    expected = 1.25 * cfg.dupe_factor * tokens / (cfg.max_seq_length - 3) + 1
    return max(1, math.ceil(expected * record / BUCKET_BYTES))


def _progress(iterable, enabled: bool, **kwargs):
    if not enabled:  # tqdm is not even imported
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, **kwargs)


def process_corpus(files: list[str], output: Path, cfg: InstanceConfig, pool, progress: bool,
                   compression: str | None, desc: str, is_subword: np.ndarray | None, threads: int = 1,
                   gzip_level: int = 1) -> dict:
    """Tokenize `files` as one corpus, make its instances, write `output`. Returns a summary dict.

    The token ids and the finished instances go to a work folder beside the output (removed at the end), so
    memory does not grow with the corpus: the workers map the ids, the writer reads the instances back by rows.
    """
    start = time.time()
    output.parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f".{output.name}.work.", dir=output.parent)
    try:
        tasks, file_starts = [], set()
        for path in files:
            file_starts.add(len(tasks))
            tasks.extend(byte_chunks(path))
        builder = CorpusBuilder(folder, cfg.vocab_size)
        pieces = pool.imap(_tokenize_chunk, tasks)
        for k, piece in enumerate(_progress(pieces, progress, total=len(tasks), desc=f"{desc} tokenize",
                                            unit="chunk")):
            builder.add(piece, starts_file=k in file_starts)
        corpus = builder.finish()
        tokenized = time.time()
        if corpus.num_documents == 0:
            raise SystemExit(f"error: no text in {', '.join(files)}: the input must be one sentence per line")
        if len(corpus.sent_start) < 3:  # one sentence: segment B could only repeat segment A
            raise SystemExit(f"error: {', '.join(files)} holds a single sentence: next-sentence pairs need at least "
                             "two (one sentence per line, a blank line between documents)")
        if corpus.num_documents == 1:
            print(f"warning: {', '.join(files)} holds a single document, so every 'random next' segment B comes "
                  "from that same document; separate documents with a blank line", file=sys.stderr, flush=True)
        units = make_units(corpus, cfg)
        spill = InstanceSpill(folder, _spill_buckets(cfg, len(corpus.tokens), corpus.tokens.dtype.itemsize),
                              np.random.default_rng(np.random.SeedSequence(cfg.random_seed,
                                                                           spawn_key=(_KEY_INSTANCE_SHUFFLE,))))
        results = pool.imap(_unit_task, [(folder, unit, cfg, is_subword) for unit in units])
        for result in _progress(results, progress, total=len(units), desc=f"{desc} instances", unit="unit"):
            spill.add(result)
        spill.close()
        made = time.time()
        attrs = {"masking": "static" if cfg.static_masking else "dynamic", "max_seq_length": cfg.max_seq_length,
                 "max_predictions_per_seq": cfg.max_predictions_per_seq, "masked_lm_prob": cfg.masked_lm_prob,
                 "short_seq_prob": cfg.short_seq_prob, "dupe_factor": cfg.dupe_factor,
                 "random_seed": cfg.random_seed, "do_whole_word_mask": cfg.do_whole_word_mask}
        n = write_hdf5(output, spill, cfg, compression, attrs, threads=threads, gzip_level=gzip_level)
        summary = {"output": str(output), "instances": spill.n, "documents": corpus.num_documents,
                   "sentences": len(corpus.sent_start) - 1, "tokens": len(corpus.tokens),
                   "tokenize_s": round(tokenized - start, 3), "instances_s": round(made - tokenized, 3),
                   "write_s": round(time.time() - made, 3), "seconds": round(time.time() - start, 3)}
        if cfg.pack_sequences:
            summary["packed_rows"] = n
    except OSError as e:
        if e.errno is not None and e.filename is None:  # a write to the work folder (a full disk): say where
            e.filename = folder
        raise
    finally:
        _CORPUS_CACHE.clear()  # in-process runs: unmap before the folder goes
        shutil.rmtree(folder, ignore_errors=True)
    return summary


def resolve_inputs(spec: str) -> list[str]:
    """A file, a folder of .txt files, or a comma-separated list of files/folders/globs, in sorted order."""
    files: list[str] = []
    for part in (s.strip() for s in spec.split(",")):
        if not part:
            continue
        if os.path.isdir(part):
            found = sorted(str(p) for p in Path(part).glob("*.txt") if p.is_file())
            if not found:
                raise SystemExit(f"error: --input_file {part} is a folder without .txt files")
            files.extend(found)
        elif os.path.isfile(part):
            files.append(part)
        elif any(c in part for c in "*?[") and glob.glob(part):
            files.extend(sorted(p for p in glob.glob(part) if os.path.isfile(p)))
        else:
            raise SystemExit(f"error: --input_file {part} does not exist (a text file, a folder of .txt files, "
                             f"or a comma-separated list)")
    if not files:
        raise SystemExit("error: --input_file names no files")
    for path in files:
        _check_text(path)
    return files


def _check_text(path: str) -> None:
    """Refuse a corpus file that is not text (data.text_formatting.check_text_file), naming --input_file."""
    from data.text_formatting import check_text_file

    check_text_file(path, what="--input_file", expected=", one sentence per line")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="create_pretraining_data.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_file", required=True,
                   help="a text file, a folder of .txt files, or a comma-separated list (one sentence per line, "
                        "blank line between documents)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--output_file", help="one HDF5 file from all inputs together")
    out.add_argument("--output_dir", help="one <stem>.hdf5 per input file, shard i with seed random_seed + i")
    p.add_argument("--vocab_file", required=True, help="BERT vocab.txt")
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=True,
                   help="lower-case and strip accents (uncased vocabularies; the default, as in Google's and "
                        "NVIDIA's scripts); --no-do_lower_case / --no_do_lower_case for cased ones")
    p.add_argument("--no_do_lower_case", dest="do_lower_case", action="store_false", help=argparse.SUPPRESS)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--masked_lm_prob", type=float, default=0.15)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--dupe_factor", type=int, default=10, help="passes over the data, each with new masks/pairs")
    p.add_argument("--random_seed", type=int, default=12345,
                   help="master seed: the same seed gives identical arrays for any --num_workers")
    p.add_argument("--num_workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="worker processes (default: the CPUs available); 1 runs in this process")
    p.add_argument("--do_whole_word_mask", action="store_true", help="mask whole words (all their ## pieces)")
    p.add_argument("--no_static_masking", action="store_true",
                   help="write unmasked input_ids and all-zero masked_lm_positions/ids (attribute masking="
                        "'dynamic') for a loader that masks per epoch with dynamic_mask()")
    p.add_argument("--pack_sequences", type=int, default=0, metavar="K",
                   help="sequence packing: put up to K (>= 2) instances into each row of max_seq_length, first-fit-"
                        "decreasing over windows of 8,192 shuffled instances; adds next_sentence_positions [N,K] "
                        "int32, makes next_sentence_labels [N,K] int8 (-1: unused slot) and masked_lm_* [N,P_row] "
                        "(P_row = min(K*P, floor(S*masked_lm_prob) + K)); run_pretraining.py detects packed shards "
                        "(default 0: one instance a row)")
    p.add_argument("--compression", choices=("gzip", "none"), default="gzip", help="HDF5 compression (NVIDIA: gzip)")
    p.add_argument("--gzip_level", type=int, default=1, choices=range(1, 10), metavar="{1..9}",
                   help="zlib level (default 1: with the shuffle filter, smaller than NVIDIA's level-4 files and "
                        "twice as fast to write)")
    p.add_argument("--mp_start_method", choices=("auto", "spawn", "forkserver", "fork"), default="auto",
                   help="how worker processes start; auto: fork on Linux when this process runs no other thread "
                        "(cheap), else spawn (safe everywhere)")
    p.add_argument("--no_progress", action="store_true", help="no tqdm progress bars")
    from utils import add_debug_argument

    add_debug_argument(p)
    return p


def _check_args(args) -> None:
    s, p = args.max_seq_length, args.max_predictions_per_seq
    problems = [
        (s < 5, f"--max_seq_length {s} must be at least 5 ([CLS] A [SEP] B [SEP])"),
        (p < 1 or p > s, f"--max_predictions_per_seq {p} must be in [1, max_seq_length={s}]"),
        (not 0.0 < args.masked_lm_prob <= 1.0, f"--masked_lm_prob {args.masked_lm_prob} must be in (0, 1]"),
        (not 0.0 <= args.short_seq_prob <= 1.0, f"--short_seq_prob {args.short_seq_prob} must be in [0, 1]"),
        (args.dupe_factor < 1, f"--dupe_factor {args.dupe_factor} must be at least 1"),
        (args.random_seed < 0, f"--random_seed {args.random_seed} must be a non-negative integer"),
        (args.num_workers < 1, f"--num_workers {args.num_workers} must be at least 1"),
        (args.pack_sequences == 1 or args.pack_sequences < 0,
         f"--pack_sequences {args.pack_sequences} must be 0 (no packing) or at least 2 (sequences a row)"),
        (os.path.isdir(args.vocab_file), f"--vocab_file {args.vocab_file} is a folder: name the vocab.txt in it"),
        (not os.path.exists(args.vocab_file), f"--vocab_file {args.vocab_file} does not exist: give a BERT vocab.txt"),
    ]
    for bad, message in problems:
        if bad:
            raise SystemExit(f"error: {message}")


def _start_method(requested: str) -> str:
    if requested != "auto":
        return requested
    import threading

    # fork copies only the calling thread: safe when there is no other, and it skips re-importing in every worker.
    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


def _check_writable(output: Path, flag: str) -> None:
    """One line now, rather than a failed rename after all the work: the output must be a file in a folder we
    can create and write."""
    if output.is_dir():
        raise SystemExit(f"error: {flag} {output} is a folder: name the .hdf5 file to write")
    folder = output.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: {flag} {output}: cannot create its folder ({e.strerror}): name a file in a folder "
                         "you can write") from None
    try:
        with tempfile.TemporaryFile(dir=folder):  # a real write: permissions, a read-only disk, root all count
            pass
    except OSError as e:
        raise SystemExit(f"error: {flag} {output}: the folder {folder} is not writable ({e.strerror}): check its "
                         "permissions, or write elsewhere") from None


def main(argv: Sequence[str] | None = None) -> int:
    """0 when every output was written; a one-line error (exit 1) for bad input or a full disk (--debug: the
    traceback)."""
    from utils import script_errors

    with script_errors("create_pretraining_data.py", argv):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    files = resolve_inputs(args.input_file)
    from tokenization import load_vocab
    from utils import InputError, describe_error

    try:
        vocab = load_vocab(args.vocab_file)
    except (ValueError, OSError) as e:
        raise InputError(f"--vocab_file {args.vocab_file}: {describe_error(e)}") from e
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise SystemExit(f"error: --vocab_file {args.vocab_file} lacks {missing}: is it a BERT vocab.txt?")
    vocab_size = max(vocab.values()) + 1  # ids are line numbers of the vocabulary file
    cfg = InstanceConfig(
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor,
        random_seed=args.random_seed, do_whole_word_mask=args.do_whole_word_mask,
        static_masking=not args.no_static_masking, pack_sequences=args.pack_sequences, vocab_size=vocab_size,
        cls_id=vocab["[CLS]"],
        sep_id=vocab["[SEP]"], mask_id=vocab["[MASK]"])
    is_subword = None  # "##" pieces by id, for whole-word masking
    if args.do_whole_word_mask:
        is_subword = np.zeros(vocab_size, dtype=bool)
        is_subword[[i for t, i in vocab.items() if t.startswith("##")]] = True
    if args.output_file:
        jobs = [(files, Path(args.output_file), cfg)]
    else:
        jobs = [([f], Path(args.output_dir) / f"{Path(f).stem}.hdf5",
                 dataclasses.replace(cfg, random_seed=cfg.random_seed + i)) for i, f in enumerate(files)]
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise SystemExit(f"error: --output_dir {args.output_dir} is a file: name a folder for the shards")
    for _, output, _ in jobs:  # before the work, not at the final rename
        _check_writable(output, "--output_file" if args.output_file else "--output_dir")
    compression = None if args.compression == "none" else args.compression
    progress = not args.no_progress
    start = time.time()
    summaries = []
    with contextlib.ExitStack() as stack:
        if args.num_workers == 1:
            _init_worker(args.vocab_file, args.do_lower_case, threads_off=False)
            pool = _InProcess()
        else:
            import multiprocessing

            ctx = multiprocessing.get_context(_start_method(args.mp_start_method))
            pool = stack.enter_context(ctx.Pool(args.num_workers, initializer=_init_worker,
                                                initargs=(args.vocab_file, args.do_lower_case, True)))
        for k, (inputs, output, job_cfg) in enumerate(jobs):
            desc = f"[{k + 1}/{len(jobs)}] {output.name}"
            summaries.append(process_corpus(inputs, output, job_cfg, pool, progress, compression, desc, is_subword,
                                            threads=args.num_workers, gzip_level=args.gzip_level))
    total = {"instances": sum(s["instances"] for s in summaries), "tokens": sum(s["tokens"] for s in summaries),
             "documents": sum(s["documents"] for s in summaries), "outputs": len(summaries),
             "num_workers": args.num_workers, "seconds": round(time.time() - start, 3)}
    if args.pack_sequences:
        total["packed_rows"] = sum(s["packed_rows"] for s in summaries)
    if len(summaries) == 1:
        total.update({k: summaries[0][k] for k in ("output", "tokenize_s", "instances_s", "write_s")})
    print(json.dumps(total), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
