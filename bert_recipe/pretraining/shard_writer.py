"""Text -> pre-training instances -> an HDF5 shard: the stages of create_pretraining_data.py, apart from its flags.

Read top to bottom: `InstanceConfig` -> stage 1, tokenization (text -> a memory-mapped corpus of token ids) ->
stage 2, instances (Google's pairs, truncation and static masks, in seeded work units) -> stage 3, the shuffle
(instances spilled to disk in random buckets) -> stage 4, the HDF5 file (NVIDIA's layout, optionally packed) ->
`process_corpus`, the stages in order for one corpus, and `worker_pool`, the processes they run in. The layout,
the masking rule and the packer are pretraining/shard_format.py's: the loader (pretraining/data_stream.py) reads by the
same.

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
    Whole-word masking: "##" pieces join the preceding candidate (Google's rule, even across a [SEP]) and words are
    taken in random order while they fit in num_to_predict;
  * all instances of a corpus are shuffled before writing.

Speed, determinism, memory: files are tokenized in byte chunks by worker processes, each distinct space-separated
piece of text once (exact: see _encode_lines) through the Rust tokenizer's encode_batch. Instances are made in work
units of (dupe pass, block of documents), each with its own numpy SeedSequence child of the random seed, so the
arrays are identical for any worker count and start method. The token ids of one corpus (2 bytes a token for a
BERT vocabulary) go to a work folder beside the output, which the workers memory-map; the finished instances go
there too, into random buckets of ~8 MB that are shuffled one at a time when writing (a uniform shuffle of the
whole list, as Google's). The main process keeps ~16 bytes a sentence. So memory does not grow with dupe_factor
or the number of instances; what grows with one corpus is the token map the workers touch and the sentence offsets.

Sequence packing (pack_sequences K >= 2): after the shuffle, every window of PACK_WINDOW (8,192) consecutive
instances is packed first-fit-decreasing (shard_format.pack_sequences) into rows of max_seq_length. Why
offline (here) and not in the loader: the shards keep static shapes (B rows of S, P_row and K slots: one compiled
graph, CUDA graphs), the resumable data position stays a row count in a fixed file (exact resume and the
process-split independence are unchanged), and the packing work is done once per dataset, not per epoch and rank
(MLPerf's BERT packs offline too). The cost: a packed dataset is packed the same way every epoch.

Errors: CorpusError (a cli.InputError) for a corpus that cannot make instances; OSError for a full disk, naming
the file. Nothing here exits: create_pretraining_data.py's main() turns them into one line.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bert_recipe.io.atomic_io import atomic_open, atomic_path
from bert_recipe.io.cli import InputError
from bert_recipe.pretraining.shard_format import (
    LAYOUT,
    PACKED_KEY,
    PACKED_LAYOUT,
    choose_positions,
    choose_whole_words,
    mask_chosen,
    masked_count,
    pack_sequences,
    packed_predictions,
)
from tokenization import BertTokenizer

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


class CorpusError(InputError):
    """A corpus that cannot make pre-training instances: no text, or a single sentence (the message names it)."""


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
        tokens = (
            np.memmap(os.path.join(folder, name), dtype=dtype, mode="r", shape=(count,)).view(np.ndarray)
            if count
            else np.zeros(0, dtype)
        )
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
    starts = sent_start[s0 : s1 + 1].tolist()  # token offsets of this document's sentences, and its end
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
    ends = corpus.sent_start[first + 1 : r1 + 1]
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
    return np.stack(
        [
            spans[:, 0] + front_a,
            spans[:, 1] - (cut_a - front_a),
            spans[:, 2] + front_b,
            spans[:, 3] - (cut_b - front_b),
        ],
        axis=1,
    )


def make_unit_instances(
    corpus: Corpus, unit: tuple[int, int, np.ndarray], cfg: InstanceConfig, is_subword: np.ndarray | None = None
) -> dict[str, np.ndarray]:
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
        counts = masked_count(la + lb + 3, cfg.masked_lm_prob, p)
        cand = in_a | in_b
        if cfg.do_whole_word_mask:
            positions, valid = choose_whole_words(ids, cand, counts, p, is_subword, rng)
        else:
            positions, valid = choose_positions(cand, counts, p, rng)
        ids, labels = mask_chosen(ids, positions, valid, cfg.vocab_size, cfg.mask_id, rng)
    else:
        positions = labels = np.zeros((len(ids), p), dtype=np.int64)
    token_dtype = corpus.tokens.dtype
    pos_dtype = np.int16 if seq < 1 << 15 else np.int32
    return {
        "input_ids": ids.astype(token_dtype),
        "len_a": la.astype(np.int32),
        "len_b": lb.astype(np.int32),
        "masked_lm_positions": positions.astype(pos_dtype),
        "masked_lm_ids": labels.astype(token_dtype),
        "next_sentence_labels": pairs_arr[:, 4].astype(np.int8),
    }


# Worker-side state for stage 2: the memory-mapped corpus of the current shard.
_CORPUS_CACHE: dict[str, Corpus] = {}


def _unit_task(args: tuple[str, tuple, InstanceConfig, np.ndarray | None]) -> dict[str, np.ndarray]:
    folder, unit, cfg, is_subword = args
    if folder not in _CORPUS_CACHE:
        _CORPUS_CACHE.clear()  # one shard at a time
        _CORPUS_CACHE[folder] = Corpus.load(folder)
    return make_unit_instances(_CORPUS_CACHE[folder], unit, cfg, is_subword)


# ---------------------------------------------------------------------------------------------------------------
# Stage 3: the shuffle. Instances go to disk in random buckets as they are made; the writer reads them back shuffled.


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
                self.files[b].write(records[bounds[b] : bounds[b + 1]].tobytes())
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
            np.take(stored, self.rng.permutation(len(stored)), out=records[len(carry) :])
            del stored, carry
            full = len(records) // rows * rows
            for lo in range(0, full, rows):  # copies: a block in flight must not pin the whole bucket
                yield {name: records[name][lo : lo + rows].copy() for name in self.dtype.names}
            carry = records[full:].copy()
            del records
        if len(carry):
            yield {name: carry[name] for name in self.dtype.names}


# ---------------------------------------------------------------------------------------------------------------
# Stage 4: the HDF5 file, in NVIDIA's layout (shard_format.LAYOUT; packed rows add next_sentence_positions)


@dataclasses.dataclass(frozen=True)
class ShardWriting:
    """How the HDF5 file is stored (the flags --compression, --gzip_level; `threads` compress blocks): none of
    them changes the arrays."""

    compression: str | None = None  # "gzip" (with HDF5's shuffle filter) or None
    gzip_level: int = 1
    threads: int = 1


def _nvidia_rows(rows: dict[str, np.ndarray], seq: int) -> dict[str, np.ndarray]:
    """NVIDIA's arrays from the stored fields; input_mask and segment_ids are rebuilt from the segment lengths."""
    col = np.arange(seq)[None, :]
    la, lb = rows["len_a"][:, None], rows["len_b"][:, None]
    end = la + lb + 3
    return {
        "input_ids": rows["input_ids"].astype(np.int32),
        "input_mask": (col < end).astype(np.int8),
        "segment_ids": ((col >= la + 2) & (col < end)).astype(np.int8),
        "masked_lm_positions": rows["masked_lm_positions"].astype(np.int32),
        "masked_lm_ids": rows["masked_lm_ids"].astype(np.int32),
        "next_sentence_labels": rows["next_sentence_labels"].astype(np.int8),
    }


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


def write_hdf5(
    path: Path, spill: InstanceSpill, cfg: InstanceConfig, attrs: dict[str, Any], writing: ShardWriting = ShardWriting()
) -> int:
    """Write the spilled instances, shuffled, in NVIDIA's layout, atomically (see shard_file). Returns N (rows
    written: packed rows with --pack_sequences).

    With gzip (plus HDF5's shuffle filter; h5py readers undo both transparently), blocks of rows are compressed
    by `writing.threads` threads (zlib lets go of the GIL) and stored as finished chunks (write_direct_chunk): the
    bytes HDF5's own filters would write, without a single-threaded tail. Packed rows are not counted before they are
    made, so their datasets grow as blocks arrive (chunked, unlimited rows).
    """
    n, seq, p, k = spill.n, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.pack_sequences
    compression, gzip_level, threads = writing.compression, writing.gzip_level, writing.threads
    rows = max(64, (1 << 19) // (4 * seq))  # 512 KiB chunks of input_ids
    if not k:
        rows = min(n, rows)  # HDF5: a fixed-size dataset's chunks hold no more than its N rows
    else:
        p = packed_predictions(seq, p, cfg.masked_lm_prob, k)
    shapes = {
        "input_ids": (seq,),
        "input_mask": (seq,),
        "segment_ids": (seq,),
        "masked_lm_positions": (p,),
        "masked_lm_ids": (p,),
        "next_sentence_labels": (k,) if k else (),
    }
    layout_dtypes = LAYOUT
    if k:
        shapes[PACKED_KEY] = (k,)
        layout_dtypes = PACKED_LAYOUT

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
            layout = (
                {
                    "chunks": (rows,) + shapes[name],
                    "compression": compression,
                    "compression_opts": gzip_level,
                    "shuffle": True,
                }
                if compression
                else {}
            )
            if k:  # packed: the row count is known at the end; grow as blocks arrive
                layout.update(chunks=(rows,) + shapes[name], maxshape=(None,) + shapes[name])
            out[name] = f.create_dataset(name, (0 if k else n,) + shapes[name], dtype=dtype, **layout)
        f.attrs.update(attrs)
        if k:
            f.attrs.update(
                {
                    "packing": "first_fit_decreasing",
                    "max_sequences_per_row": k,
                    "packed_sequences": n,
                    "max_predictions_per_row": p,
                }
            )
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
                    out[name][lo : lo + count] = value
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
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        yield f


def check_free_space(path: Path, size: int) -> None:
    """An OSError naming `path` unless its folder has `size` bytes free (plus DISK_MARGIN)."""
    free = shutil.disk_usage(path.parent).free
    if free < size + DISK_MARGIN:
        raise OSError(
            f"{path}: the file needs {_mib(size + DISK_MARGIN)} but {path.parent} has {_mib(free)} free: "
            "free some space or write elsewhere, then run again"
        )


def write_file_image(path: Path, image: bytes) -> None:
    """Write a finished file's bytes atomically (atomic_io.atomic_open: a temporary file, fsync, rename), after
    checking that the folder has room for them: a full disk is one line (an OSError naming the file and the free
    space), before anything is written, and a disk that fills during the write still leaves no partial file and
    no file under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(path, len(image))
    with atomic_open(path, "wb") as f:
        view = memoryview(image)
        for lo in range(0, len(view), 1 << 24):  # 16 MiB at a time: no second copy of the image
            f.write(view[lo : lo + (1 << 24)])


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# ---------------------------------------------------------------------------------------------------------------
# The stages in order: one corpus -> one HDF5 file


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


def process_corpus(
    files: list[str],
    output: Path,
    cfg: InstanceConfig,
    pool,
    progress: bool,
    desc: str,
    is_subword: np.ndarray | None,
    writing: ShardWriting = ShardWriting(),
) -> dict:
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
        for k, piece in enumerate(_progress(pieces, progress, total=len(tasks), desc=f"{desc} tokenize", unit="chunk")):
            builder.add(piece, starts_file=k in file_starts)
        corpus = builder.finish()
        tokenized = time.time()
        if corpus.num_documents == 0:
            raise CorpusError(f"no text in {', '.join(files)}: the input must be one sentence per line")
        if len(corpus.sent_start) < 3:  # one sentence: segment B could only repeat segment A
            raise CorpusError(
                f"{', '.join(files)} holds a single sentence: next-sentence pairs need at least two "
                "(one sentence per line, a blank line between documents)"
            )
        if corpus.num_documents == 1:
            print(
                f"warning: {', '.join(files)} holds a single document, so every 'random next' segment B comes "
                "from that same document; separate documents with a blank line",
                file=sys.stderr,
                flush=True,
            )
        units = make_units(corpus, cfg)
        spill = InstanceSpill(
            folder,
            _spill_buckets(cfg, len(corpus.tokens), corpus.tokens.dtype.itemsize),
            np.random.default_rng(np.random.SeedSequence(cfg.random_seed, spawn_key=(_KEY_INSTANCE_SHUFFLE,))),
        )
        results = pool.imap(_unit_task, [(folder, unit, cfg, is_subword) for unit in units])
        for result in _progress(results, progress, total=len(units), desc=f"{desc} instances", unit="unit"):
            spill.add(result)
        spill.close()
        made = time.time()
        attrs = {
            "masking": "static" if cfg.static_masking else "dynamic",
            "max_seq_length": cfg.max_seq_length,
            "max_predictions_per_seq": cfg.max_predictions_per_seq,
            "masked_lm_prob": cfg.masked_lm_prob,
            "short_seq_prob": cfg.short_seq_prob,
            "dupe_factor": cfg.dupe_factor,
            "random_seed": cfg.random_seed,
            "do_whole_word_mask": cfg.do_whole_word_mask,
        }
        n = write_hdf5(output, spill, cfg, attrs, writing)
        summary = {
            "output": str(output),
            "instances": spill.n,
            "documents": corpus.num_documents,
            "sentences": len(corpus.sent_start) - 1,
            "tokens": len(corpus.tokens),
            "tokenize_s": round(tokenized - start, 3),
            "instances_s": round(made - tokenized, 3),
            "write_s": round(time.time() - made, 3),
            "seconds": round(time.time() - start, 3),
        }
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


def start_method(requested: str) -> str:
    """How worker processes start: `requested`, or for "auto" fork on Linux when this process runs no other thread
    (cheap: no re-import in every worker; fork copies only the calling thread), else spawn (safe everywhere)."""
    if requested != "auto":
        return requested
    import threading

    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


@contextlib.contextmanager
def worker_pool(num_workers: int, vocab_file: str, do_lower_case: bool, requested_start: str = "auto"):
    """The processes the stages run in, each with its own tokenizer: a multiprocessing Pool, or for one worker
    this process itself (no start-up cost, the same work units and so the same arrays)."""
    if num_workers == 1:
        _init_worker(vocab_file, do_lower_case, threads_off=False)
        yield _InProcess()
        return
    import multiprocessing

    ctx = multiprocessing.get_context(start_method(requested_start))
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(vocab_file, do_lower_case, True)) as pool:
        yield pool
