"""Your own WordPiece vocabulary: a text corpus -> vocab.txt in Google's layout, for pre-training a new language or
domain (and a smaller, faster output layer: a small model on CPU spends much of its step in the vocabulary rows).

    python data/create_vocab.py --input corpus_dir/ --output_file vocab.txt --vocab_size 16000           # uncased
    python -m data.create_vocab --input wiki_00.gz --input more.txt --output_file vocab.txt --vocab_size 8000 --cased
    python -m data.bertPrep --action create_vocab --dataset custom --vocab_size 16000    # the pipeline's step

Input (`--input`, repeatable): files or folders (every *.txt, *.gz and WikiExtractor wiki_* file under a folder,
hidden ones skipped). Any UTF-8 text: the pipeline's formatted or sharded text (one article or sentence a line),
plain text, gzip-compressed text (recognised by its magic bytes), or WikiExtractor output, whose `<doc ...>` and
`</doc>` lines are skipped. Line breaks are only whitespace here: the learner sees words.

Output (`--output_file`, written atomically): one token a line, id = line number, exactly `--vocab_size` lines, every
line unique, a drop-in for bert-base-uncased's vocab.txt:
    id 0            [PAD]
    ids 1-99        [unused0] ... [unused98]                 (when --unused_slots >= 99; the default is 99)
    ids 100-103     [UNK] [CLS] [SEP] [MASK]                 (Google's ids)
    next            [unused99] ... (--unused_slots above 99: Google's bert-base vocabularies have 994 in all)
    next            every character of the training text, then "##" + each character that can continue a word
                    (all but punctuation and CJK ideographs, which are always words of their own), by code point
    the rest        the learned pieces, in the order the learner found them (most useful first)
With `--unused_slots` below 99, or by default when --vocab_size is too small for 99 of them, the four specials come
right after [PAD] (ids 1-4) and the unused slots after them; the log says so. A model config for this vocabulary
uses vocab_size = --vocab_size rounded up to a multiple of 8 (NVIDIA pads its embedding the same way: 30522 ->
30528); run_pretraining.py --vocab_file accepts exactly that range (config vocab_size - 8 < lines <= vocab_size).

How it learns: the text is split into words exactly as our tokenization.BasicTokenizer splits it (control characters
dropped, whitespace, punctuation and CJK ideographs split, and with --do_lower_case, the default, lower-cased and
stripped of accents, which follows lower-casing as in Google's tokenizer), by `PreSplitter`: the same character
classes applied to whole chunks of text with str/re operations, which is 2-3x faster than the per-word Python loop and
equal to it (tests/test_create_vocab.py checks every code point and real text). The pre-split words feed the
`tokenizers` WordPiece trainer (BPE merges with "##" continuations) through a whitespace-only pre-tokenizer and no
normalizer of its own, so every learned piece is one our tokenizer can produce. Words over 100 characters, which our
tokenizer turns into [UNK] whole, are not learned from. Every character of the training text is in the vocabulary,
alone and as a "##" continuation, so no word made of the training text's characters becomes [UNK].

Fewer characters (`--limit_alphabet N`): only the N most frequent characters are kept (bert-base-uncased has
about 1,000; Wikipedia's quotations of other scripts bring thousands, each taking one or two entries): a word
holding another character becomes [UNK], and the learner skips such characters inside the words it learns from.

Determinism: the learner breaks ties between equally frequent pairs by token id, and `tokenizers` numbers the
"##" characters in hash-map order, which changes from run to run. The alphabet is therefore read first (a cheap pass
over the raw text) and handed to the trainer as its first, fixed ids; the same text and flags then give a byte-
identical vocab.txt. That pass also lets an impossible --vocab_size be refused before the learning pass.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gzip
import io
import json
import os
import re
import shutil
import time
import unicodedata
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Sequence

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open, atomic_write_text
from bert_recipe.io.cli import InputError, check_output_path, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.engine import EngineConfig, ProcessEngine
from bert_recipe.prep.manifest import Manifest, sha256_file
from bert_recipe.prep.sharding import plan_chunks

SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD = "[PAD]"
# [unused0]..[unused98] between [PAD] and [UNK] put the specials at Google's ids 100-103.
GOOGLE_UNUSED_BEFORE_UNK = 99
MAX_WORD_CHARS = 100  # tokenization.WordpieceTokenizer's max_input_chars_per_word: longer words are [UNK] whole
CHUNK_CHARS = 1 << 20  # text handed to the pre-splitter and the learner at a time
FOLDER_PATTERNS = ("*.txt", "*.gz", "wiki_*")
GZIP_MAGIC = b"\x1f\x8b"


def _input_error(message: str) -> Exception:

    return InputError(message)


# ---------------------------------------------------------------------------------------------------------------
# Reading the corpus


def list_input_files(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files named directly, plus every *.txt / *.gz / wiki_* file under named folders (recursive, sorted, hidden
    files and folders skipped). Each is checked to be readable UTF-8 text (after gunzip) before any work."""
    if not inputs:
        raise _input_error("--input: name at least one text file or folder")
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(
                {
                    p
                    for pattern in FOLDER_PATTERNS
                    for p in item.rglob(pattern)
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(item).parts)
                }
            )
            if not found:
                raise _input_error(
                    f"--input {item} is a folder without text files (*.txt, *.gz, wiki_*): name the "
                    "files, or a folder that holds them"
                )
            files.extend(found)
        elif item.is_file():
            files.append(item)
        else:
            raise _input_error(f"--input {item} does not exist: name a text file or a folder of them")
    for path in files:
        check_text(path)
    return files


def _open_binary(path: Path):
    """(raw file, decompressed binary stream): gzip recognised by its magic bytes, whatever the file's name."""
    raw = open(path, "rb")
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return raw, gzip.GzipFile(fileobj=raw)
    raw.seek(0)
    return raw, raw


def check_text(path: Path, probe: int = 1 << 16) -> None:
    """Refuse, in one line, a file that cannot be read, a damaged gzip file, or one that is not text: NUL bytes in
    its first 64 KiB (decompressed), or more than 1% of them not UTF-8 (create_pretraining_data.py's rule)."""
    try:
        raw, stream = _open_binary(path)
        with raw:
            head = stream.read(probe)
    except OSError as e:  # permissions, a folder, gzip.BadGzipFile (a damaged header)
        raise _input_error(
            f"--input {path} cannot be read ({getattr(e, 'strerror', None) or e}): check the file and its permissions"
        ) from None
    except EOFError:  # the gzip stream ends before its end marker: a download or copy that stopped early
        raise _input_error(f"--input {path} is a truncated gzip file: check the file") from None
    if b"\0" in head:
        raise _input_error(f"--input {path} is not text (it holds NUL bytes): give UTF-8 text files")
    bad = head.decode("utf-8", errors="replace").count("\ufffd")
    if bad > len(head) // 100:
        raise _input_error(
            f"--input {path} is not UTF-8 text ({bad} undecodable bytes in its first {len(head)}): convert it to UTF-8"
        )


def _is_markup(line: str) -> bool:
    # WikiExtractor's article brackets: <doc id=".." url=".." title=".."> and </doc>.
    return line == "</doc>" or (line.startswith("<doc ") and line.endswith(">"))


def iter_chunks(
    files: Sequence[Path], chunk_chars: int = CHUNK_CHARS, on_bytes: Callable[[int], None] | None = None
) -> Iterator[str]:
    """The corpus's text lines (stripped; blank and WikiExtractor markup lines dropped) joined by "\\n" into chunks
    of about `chunk_chars` characters; a chunk never spans two files. `on_bytes(n)` is told the (compressed) bytes
    read, for a progress bar. Undecodable bytes become U+FFFD, which the tokenizer drops anyway."""
    for path in files:
        try:
            raw, stream = _open_binary(path)
            with raw, io.TextIOWrapper(stream, encoding="utf-8", errors="replace") as text:
                lines: list[str] = []
                size, seen = 0, 0
                for line in text:
                    line = line.strip()
                    if not line or _is_markup(line):
                        continue
                    lines.append(line)
                    size += len(line)
                    if size >= chunk_chars:
                        yield "\n".join(lines)
                        lines, size = [], 0
                        if on_bytes is not None:
                            position = raw.tell()
                            on_bytes(position - seen)
                            seen = position
                if lines:
                    yield "\n".join(lines)
                if on_bytes is not None:
                    on_bytes(os.path.getsize(path) - seen)
        except EOFError:
            raise _input_error(f"--input {path} is a truncated gzip file: check the file") from None


# ---------------------------------------------------------------------------------------------------------------
# Pre-splitting: tokenization.BasicTokenizer's words, for whole chunks of text at once


def _char_class(chars: frozenset[str]) -> str:
    """The body of a regular-expression character class matching `chars`: runs of code points as ranges."""
    runs: list[list[int]] = []
    for cp in sorted(map(ord, chars)):
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in runs)


def _one_of(chars: frozenset[str], template: str) -> re.Pattern:
    """`template` with {} replaced by a class of `chars`; while there are none, a pattern that never matches (with
    the template's groups, so that a replacement naming them stays valid)."""
    return re.compile(template.format(f"[{_char_class(chars)}]" if chars else "(?!)"))


# BasicTokenizer's character classes, in the order PreSplitter.split applies them: dropped by cleaning, turned into
# " " (str.isspace() too: U+2028 and U+2029 survive cleaning but str.split() splits on them later, so they may become
# " " here already), CJK ideographs spaced, non-spacing marks stripped (lower-casing only), punctuation spaced.
_TEMPLATES = ("{}+", "{}", "({})", "{}+", None)


@dataclasses.dataclass(frozen=True)
class _CharTables:
    """What each character met so far is to tokenization.BasicTokenizer, from tokenization's own predicates (so a
    change there changes this too): the classes, as regular expressions, and punctuation as a str.translate table.
    Characters are classified when first met (`grown`), so a corpus costs its own alphabet, a few thousand characters,
    instead of every one of the 1.1 million code points (3.5 s a process). Immutable: a PreSplitter swaps in the
    grown tables whole, so a thread never sees a character as known before its classes are."""

    known: frozenset[str] = frozenset()
    classes: tuple[frozenset[str], ...] = (frozenset(),) * 5  # dropped, space, cjk, mark, punctuation
    patterns: tuple[re.Pattern, ...] = tuple(_one_of(frozenset(), t) for t in _TEMPLATES[:4])
    punctuation: dict[int, str] = dataclasses.field(default_factory=dict)

    def grown(self, chars: set[str]) -> "_CharTables":
        """These tables with `chars` classified too (self when they are all known)."""
        new = chars - self.known
        if not new:
            return self
        # tokenization loads only once characters are classified: importing the learner (--help) stays light
        from tokenization import _is_chinese_char, _is_control, _is_punctuation, _is_whitespace

        def dropped(c: str) -> bool:  # BasicTokenizer._clean_text drops these
            return c in ("\0", "\ufffd") or _is_control(c)

        predicates = (
            dropped,
            lambda c: not dropped(c) and (_is_whitespace(c) or c.isspace()),
            lambda c: _is_chinese_char(ord(c)),
            lambda c: unicodedata.category(c) == "Mn",
            _is_punctuation,
        )
        classes = tuple(old | {c for c in new if keep(c)} for old, keep in zip(self.classes, predicates))
        patterns = tuple(
            p if len(c) == len(old) else _one_of(c, t)
            for p, c, old, t in zip(self.patterns, classes, self.classes, _TEMPLATES)
        )
        punctuation = {**self.punctuation, **{ord(c): f" {c} " for c in classes[4] - self.classes[4]}}
        return _CharTables(self.known | new, classes, patterns, punctuation)


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_WORD_CHARS + 1))
_ASCII = frozenset(map(chr, range(128)))


class PreSplitter:
    """Text -> BasicTokenizer(do_lower_case)'s words, joined by single-character spaces.

    `split(text).split() == tokenization.BasicTokenizer(do_lower_case).tokenize(text)` for every str. The steps are
    BasicTokenizer's, in its order, each applied to the whole text instead of word by word; they agree because every
    step is local to a word: cleaning, CJK spacing and punctuation splitting map single characters; str.lower() looks
    across characters only for a final capital sigma, whose context ends at a space as it ends at a word's edge; NFD
    reorders combining marks only up to the next starter, and a space is one.
    """

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case
        self._tables = _CharTables().grown(set(_ASCII))

    def _tables_for(self, text: str) -> _CharTables:
        """The tables, grown by the characters of `text` not met before (past ASCII, known from the start)."""
        if text.isascii():
            return self._tables
        self._tables = tables = self._tables.grown(set("".join(_NON_ASCII.findall(text))))
        return tables

    def split(self, text: str) -> str:
        tables = self._tables_for(text)
        clean, spaces, cjk, _ = tables.patterns
        text = clean.sub("", text)
        text = spaces.sub(" ", text)
        text = cjk.sub(r" \1 ", text)
        if self.do_lower_case:
            text = unicodedata.normalize("NFD", text.lower())
            tables = self._tables_for(text)  # lower-casing and NFD make characters of their own (the marks)
            marks = tables.patterns[3]
            # Accent stripping drops non-spacing marks; only non-ASCII runs can hold one (and are rare).
            text = _NON_ASCII.sub(lambda m: marks.sub("", m.group()), text)
        return text.translate(tables.punctuation)

    def words(self, text: str) -> list[str]:
        return self.split(text).split()

    def alphabet(self, raw_counts: dict[str, int]) -> dict[str, int]:
        """The characters of the words of a text whose characters occur `raw_counts` times, with their counts: each
        character pre-split alone (every step maps a character to characters whatever its neighbours), plus the
        final sigma "ς" that a capital sigma becomes at the end of a word when lower-casing (counted as often as the
        capital: an upper bound)."""
        counts: dict[str, int] = collections.Counter()
        for c, n in raw_counts.items():
            for d in self.split(c):
                if d != " ":
                    counts[d] += n
        if self.do_lower_case and "\u03a3" in raw_counts:
            counts["\u03c2"] += raw_counts["\u03a3"]
        return counts


def continues_words(char: str) -> bool:
    """Whether `char` can follow another character inside one of BasicTokenizer's words: all but punctuation and
    CJK ideographs, which are always words of their own (so "##" + them would never be looked up)."""
    from tokenization import _is_chinese_char, _is_punctuation  # loaded when first needed, as in _CharTables

    return not (_is_punctuation(char) or _is_chinese_char(ord(char)))


# ---------------------------------------------------------------------------------------------------------------
# Layout


def config_vocab_size(vocab_lines: int) -> int:
    """The vocab_size a model config should use: the vocabulary padded to a multiple of 8, as NVIDIA's recipe pads
    its embedding (30522 -> 30528) for tensor-core friendly shapes."""
    return -(-vocab_lines // 8) * 8


def plan_layout(vocab_size: int, required: int, unused_slots: int | None) -> int:
    """How many [unused] slots the vocabulary gets: `unused_slots`, or by default 99 (specials at Google's ids
    100-103) when the size leaves room for them beside the `required` alphabet entries, else 0. Raises InputError
    when [PAD], the four specials, the slots and the alphabet do not fit in `vocab_size`."""
    floor = 1 + len(SPECIALS) + required
    if unused_slots is None:
        unused_slots = GOOGLE_UNUSED_BEFORE_UNK if vocab_size >= floor + GOOGLE_UNUSED_BEFORE_UNK else 0
    if vocab_size < floor + unused_slots:
        slots = f" + {unused_slots} [unused] slots" if unused_slots else ""
        raise _input_error(
            f"--vocab_size {vocab_size} is too small for this corpus: [PAD] and the 4 specials{slots} + its "
            f"{required} alphabet entries (every character, and '##' + those that continue words) need "
            f"{floor + unused_slots}: raise --vocab_size" + (" or lower --unused_slots" if unused_slots else "")
        )
    return unused_slots


def google_layout(learned: Sequence[str], unused_slots: int) -> list[str]:
    """[PAD]; [unused0..98] when there are at least 99 slots, so that [UNK] [CLS] [SEP] [MASK] are ids 100-103;
    the specials; the remaining slots; then `learned` (alphabet first). A learned piece never looks like a special
    or an [unused] slot: "[" and "]" are punctuation, always words of their own."""
    unused = [f"[unused{i}]" for i in range(unused_slots)]
    before = GOOGLE_UNUSED_BEFORE_UNK if unused_slots >= GOOGLE_UNUSED_BEFORE_UNK else 0
    return [PAD, *unused[:before], *SPECIALS, *unused[before:], *learned]


# ---------------------------------------------------------------------------------------------------------------
# Learning


@dataclasses.dataclass(frozen=True)
class VocabSettings:
    """The vocabulary asked for: the flags --vocab_size, --do_lower_case / --cased, --unused_slots, --limit_alphabet,
    a section of create_vocab.py's configuration."""

    vocab_size: int = flag(required=True)
    """lines of vocab.txt, specials and [unused] slots included (8000-16000 for a small model, 30522 as
    bert-base-uncased)"""
    do_lower_case: bool = flag(
        True,
        exclusive="case",
        switches=[
            flags.Switch(
                ("--cased",),
                False,
                "keep case and accents (a cased vocabulary: use --no-do_lower_case downstream)",
                default=True,
            )
        ],
    )
    """lower-case and strip accents (an uncased vocabulary; the default)"""
    unused_slots: int | None = None
    """[unused] entries to reserve (default: 99, which puts [UNK] [CLS] [SEP] [MASK] at Google's ids 100-103, or 0
    when --vocab_size has no room for them; 994 gives bert-base's exact layout)"""
    limit_alphabet: int | None = flag(None, metavar="N")
    """keep only the N most frequent characters (default: every character of the text, so no word made of them
    becomes [UNK]; bert-base-uncased has about 1,000). A word holding a character left out becomes [UNK]; left-out
    characters are skipped while learning"""


@dataclasses.dataclass
class VocabResult:
    tokens: list[str]  # the vocab.txt lines: token i has id i
    do_lower_case: bool
    unused_slots: int
    alphabet: int  # distinct characters of the training text's words
    alphabet_entries: int  # those characters plus their "##" continuations
    learned: int  # multi-character pieces the learner added
    files: int
    words: int  # words the learner saw (BasicTokenizer's, punctuation included; over-long ones excluded)
    long_words: int  # words over 100 characters, not learned from (our tokenizer makes them [UNK] whole)
    seconds: dict

    @property
    def special_ids(self) -> dict[str, int]:
        return {t: self.tokens.index(t) for t in (PAD, *SPECIALS)}

    @property
    def config_vocab_size(self) -> int:
        return config_vocab_size(len(self.tokens))

    def summary(self) -> dict:
        return {
            "vocab_size": len(self.tokens),
            "config_vocab_size": self.config_vocab_size,
            "do_lower_case": self.do_lower_case,
            "special_ids": self.special_ids,
            "unused_slots": self.unused_slots,
            "alphabet": self.alphabet,
            "alphabet_entries": self.alphabet_entries,
            "learned": self.learned,
            "files": self.files,
            "words": self.words,
            "long_words": self.long_words,
            "seconds": self.seconds,
        }


def check_sizes(settings: VocabSettings) -> None:
    """The size flags on their own (the corpus is checked against them after its first pass)."""
    vocab_size, unused_slots, limit_alphabet = settings.vocab_size, settings.unused_slots, settings.limit_alphabet
    if vocab_size < 1 + len(SPECIALS) + 1:
        raise _input_error(f"--vocab_size {vocab_size} must be at least 6 ([PAD], 4 specials and one character)")
    if unused_slots is not None and unused_slots < 0:
        raise _input_error(f"--unused_slots {unused_slots} must be 0 or more")
    if limit_alphabet is not None and limit_alphabet < 1:
        raise _input_error(
            f"--limit_alphabet {limit_alphabet} must be at least 1 (leave it out to keep every character)"
        )


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def _count_characters(chunk: str, counts: dict[str, int], exact: bool) -> None:
    """Add the characters of `chunk` to `counts`: their counts when `exact` (str.count per distinct character: 10x
    faster than a Counter over the text when there are few of them, as in most scripts), else 1 each (the set)."""
    chars = set(chunk)
    if exact and len(chars) > 512:  # an ideographic text: thousands of distinct characters
        counts.update(collections.Counter(chunk))
    else:
        for c in chars:
            counts[c] += chunk.count(c) if exact else 1


# ---------------------------------------------------------------------------------------------------------------
# The counting pass, in pieces: each piece of the corpus (a line-aligned byte range of a plain file, or a whole gzip
# file) is a task on the engine (bert_recipe/prep/engine.py) that counts its characters and pre-splits its words into a
# part file.

PIECE_BYTES = 32 << 20


def plan_pieces(files: Sequence[Path], piece_bytes: int = PIECE_BYTES) -> list[tuple[str, int, int]]:
    """(file, first byte, end byte) pieces in corpus order; a gzip file is one piece (end -1: to its end)."""
    pieces = []
    for path in files:
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
        pieces.extend([(str(path), 0, -1)] if gz else plan_chunks([path], piece_bytes))
    return pieces


def iter_piece_lines(path: str, start: int, end: int) -> Iterator[str]:
    """The text lines of one piece (stripped; blank and WikiExtractor markup lines dropped), as iter_chunks reads
    them: a line belongs to the piece its first byte is in."""
    try:
        if end == -1:
            raw, stream = _open_binary(Path(path))
            with raw, io.TextIOWrapper(stream, encoding="utf-8", errors="replace") as text:
                for line in text:
                    line = line.strip()
                    if line and not _is_markup(line):
                        yield line
            return
        from bert_recipe.prep.sharding import range_lines

        with open(path, "rb") as f:
            for raw_line in range_lines(f, start, end):
                line = raw_line.decode("utf-8", errors="replace").strip()
                if line and not _is_markup(line):
                    yield line
    except EOFError:
        raise _input_error(f"--input {path} is a truncated gzip file: check the file") from None


_SPLITTERS: dict[bool, "PreSplitter"] = {}  # one per worker process: the characters it met stay classified


def _presplit_piece(job: tuple[str, int, int, bool, bool, str]) -> tuple[dict, int, int, int, str]:
    """Task: one piece -> its characters' counts (exact, or 1 each) and a part file of its pre-split words, one
    chunk of about CHUNK_CHARS characters a line, written atomically. Returns (counts, words, words over 100
    characters left out, chunks, the part's sha256)."""
    path, start, end, do_lower_case, exact, part = job
    splitter = _SPLITTERS.get(do_lower_case) or _SPLITTERS.setdefault(do_lower_case, PreSplitter(do_lower_case))
    counts: dict[str, int] = collections.Counter()
    words = long_words = chunks = 0
    with atomic_open(part, "w", encoding="utf-8") as out:
        for chunk in _chunked(iter_piece_lines(path, start, end)):
            _count_characters(chunk, counts, exact)
            text = splitter.split(chunk)
            long = len(_LONG_WORD.findall(text))  # rare: the substitution below is only done when needed
            if long:
                text = _LONG_WORD.sub(" ", text)
                long_words += long
            words += len(text.split())
            out.write(text.replace("\n", " ") + "\n")
            chunks += 1
    return dict(counts), words, long_words, chunks, sha256_file(part)


def _chunked(lines: Iterator[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Lines joined by "\\n" into chunks of about `chunk_chars` characters."""
    batch: list[str] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= chunk_chars:
            yield "\n".join(batch)
            batch, size = [], 0
    if batch:
        yield "\n".join(batch)


@dataclasses.dataclass
class Counted:
    """What the counting pass found: the characters' counts, the pre-split part files in corpus order, the words."""

    counts: dict[str, int]
    parts: list[Path]
    words: int
    long_words: int
    chunks: int


def count_pieces(
    files: Sequence[Path],
    do_lower_case: bool,
    exact: bool,
    work_dir: Path,
    engine=None,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> Counted:
    """The counting pass on `engine` (None: one process here), part files in `work_dir` (reused on a rerun: its
    parts.json lists each with its sha256 and the settings)."""
    engine = engine or ProcessEngine(EngineConfig("processes", 1, progress=progress))
    work_dir.mkdir(parents=True, exist_ok=True)
    pieces = plan_pieces(files)
    ledger = Manifest.open(
        work_dir / "parts.json",
        {
            "do_lower_case": do_lower_case,
            "exact": exact,
            "pieces": [list(p) for p in pieces],
            "sizes": [os.path.getsize(p) for p in files],
        },
    )
    jobs = [(*piece, do_lower_case, exact, str(work_dir / f"{i:08d}.txt")) for i, piece in enumerate(pieces)]
    todo = [i for i, job in enumerate(jobs) if not ledger.reusable(Path(job[-1]).name)]
    try:
        for k, (counts, words, long_words, chunks, digest) in engine.map(
            _presplit_piece, [jobs[i] for i in todo], desc="counting"
        ):
            ledger.record(
                Path(jobs[todo[k]][-1]).name, chunks, digest, counts=counts, words=words, long_words=long_words
            )
    finally:
        ledger.save()
    ledger.report("create_vocab (counting)", log)
    total: dict[str, int] = collections.Counter()
    words = long_words = chunks = 0
    for job in jobs:  # in corpus order, so the counts are summed the same way whatever the engine
        entry = ledger.outputs[Path(job[-1]).name]
        for c, n in entry["counts"].items():
            total[c] = total[c] + n if exact else 1  # without --limit_alphabet only the set of characters counts
        words, long_words, chunks = words + entry["words"], long_words + entry["long_words"], chunks + entry["rows"]
    return Counted(dict(total), [Path(job[-1]) for job in jobs], words, long_words, chunks)


def read_alphabet(
    counted: Counted,
    splitter: PreSplitter,
    files: Sequence[Path],
    limit_alphabet: int | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> list[str]:
    """The characters of the corpus's words, sorted by code point; `limit_alphabet`: only that many, the most
    frequent (ties by code point)."""
    counts = splitter.alphabet(counted.counts)
    if not counts:
        names = ", ".join(str(p) for p in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise _input_error(
            f"--input {names}: no text to learn from (only blank lines, markup or control "
            "characters): give text files, one sentence or paragraph a line"
        )
    alphabet = sorted(counts)
    if limit_alphabet is not None and len(alphabet) > limit_alphabet:
        kept = set(sorted(alphabet, key=lambda c: (-counts[c], c))[:limit_alphabet])
        log(
            f"--limit_alphabet {limit_alphabet}: {len(alphabet) - limit_alphabet} of {len(alphabet)} characters "
            f"left out (each seen {max(counts[c] for c in alphabet if c not in kept)} times or fewer); words that "
            "hold one become [UNK]"
        )
        alphabet = sorted(kept)
    return alphabet


def learn_pieces(
    counted: Counted,
    pinned: list[str],
    merges: int,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> list[str]:
    """The pre-split words of the part files -> the `tokenizers` WordPiece trainer, which counts them (in Rust, on
    every core) and learns up to `merges` pieces beyond the `pinned` alphabet entries. Returns the pieces in the
    order learned."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bar = _progress(sum(os.path.getsize(p) for p in counted.parts), "learning", progress)

    def feed() -> Iterator[str]:
        for part in counted.parts:
            with open(part, encoding="utf-8") as f:
                for line in f:
                    if bar:
                        bar.update(len(line.encode("utf-8")))
                    yield line
        if bar:
            bar.close()
        log(f"{counted.words:,} words counted; merging pieces")  # the trainer's last step, with no progress of its own

    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIALS[0], max_input_chars_per_word=MAX_WORD_CHARS))
    # The words are split already: the trainer only splits them apart (a space is the only whitespace left), with no
    # normalizer of its own, so it sees exactly our tokenizer's words.
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # The alphabet goes in as the trainer's "special tokens", which take the first ids in our sorted order: its ties
    # are broken by id, so this makes its output the same on every run. limit_alphabet=0: it adds no character of
    # its own (one left out by --limit_alphabet is skipped inside the words it occurs in). min_frequency 0: a small
    # corpus still fills the requested size when it can.
    trainer = trainers.WordPieceTrainer(
        vocab_size=len(pinned) + merges,
        min_frequency=0,
        show_progress=False,
        special_tokens=pinned,
        limit_alphabet=0,
        continuing_subword_prefix="##",
    )
    tokenizer.train_from_iterator(feed(), trainer=trainer, length=counted.chunks or None)
    trained = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(trained, key=trained.__getitem__)
    if by_id[: len(pinned)] != pinned:  # a change in tokenizers: a bug of ours to fix, not the user's
        raise AssertionError("the tokenizers trainer did not keep the alphabet at its first ids")
    return by_id[len(pinned) :]


def learn_vocab(
    files: Sequence[Path],
    settings: VocabSettings,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
    engine=None,
    work_dir: Path | None = None,
) -> VocabResult:
    """Learn a WordPiece vocabulary of exactly `settings.vocab_size` entries (Google's layout, see the module
    docstring) from `files` (checked text: list_input_files). `settings.limit_alphabet`: keep only that many
    characters, the most frequent (default: every one). The counting pass runs on `engine` (bert_recipe.prep.engine;
    None: here), its part files in `work_dir` (None: a temporary folder). Raises InputError for a corpus without words
    or a size too small for its alphabet (both after the counting pass), or a corpus too small for the size (after
    learning)."""
    import tempfile

    check_sizes(settings)
    vocab_size, do_lower_case, limit_alphabet = settings.vocab_size, settings.do_lower_case, settings.limit_alphabet
    splitter = PreSplitter(do_lower_case)
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="create_vocab_")))
        start = time.time()
        counted = count_pieces(files, do_lower_case, limit_alphabet is not None, work_dir, engine, progress, log)
        alphabet = read_alphabet(counted, splitter, files, limit_alphabet, log)
        pinned = alphabet + ["##" + c for c in alphabet if continues_words(c)]
        unused = plan_layout(vocab_size, len(pinned), settings.unused_slots)
        merges = vocab_size - 1 - len(SPECIALS) - unused - len(pinned)
        alphabet_s = time.time() - start
        if unused < GOOGLE_UNUSED_BEFORE_UNK:
            log(
                f"--vocab_size {vocab_size} with {unused} [unused] slots: [UNK] [CLS] [SEP] [MASK] are ids 1-4, right "
                "after [PAD] (Google's layout, ids 100-103, needs 99 slots)"
            )
        log(
            f"{len(files)} file(s), {sum(os.path.getsize(p) for p in files) / 2**20:.1f} MiB; alphabet of "
            f"{len(alphabet)} characters ({len(pinned)} entries with their '##' continuations); learning {merges} "
            "pieces"
        )
        start = time.time()
        pieces = learn_pieces(counted, pinned, merges, progress, log) if merges else []
    words, long_words = (counted.words, counted.long_words) if merges else (0, 0)
    if len(pieces) < merges:
        raise _input_error(
            f"--vocab_size {vocab_size} is too large for this corpus: after {len(pieces)} pieces no "
            f"pair of pieces is left to merge ({words} words): give more text, or --vocab_size "
            f"{vocab_size - (merges - len(pieces))} or less"
        )
    tokens = google_layout([*pinned, *pieces[:merges]], unused)
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size, "layout arithmetic"  # our own invariant
    if long_words:
        log(f"{long_words} word(s) over {MAX_WORD_CHARS} characters not learned from (our tokenizer makes them [UNK])")
    return VocabResult(
        tokens=tokens,
        do_lower_case=do_lower_case,
        unused_slots=unused,
        alphabet=len(alphabet),
        alphabet_entries=len(pinned),
        learned=merges,
        files=len(files),
        words=words,
        long_words=long_words,
        seconds={"alphabet": round(alphabet_s, 2), "learn": round(time.time() - start, 2)},
    )


def write_vocab(path: str | os.PathLike, tokens: Sequence[str]) -> None:
    """vocab.txt: one token a line, UTF-8, "\\n" line ends, written atomically."""
    atomic_write_text(path, "".join(f"{t}\n" for t in tokens))


def create_vocab(
    inputs: Sequence[str | os.PathLike],
    output_file: str | os.PathLike,
    settings: VocabSettings,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
    output_flag: str = "--output_file",
    engine=None,
) -> VocabResult:
    """Check the flags, the output and the inputs, learn, write `output_file`. The library entry (bertPrep's
    create_vocab action, which names its output flag `output_flag`); InputError for anything the user can fix,
    before the learning pass wherever it can be known there."""
    check_sizes(settings)
    check_output_path(output_file, output_flag)
    files = list_input_files(inputs)
    # The counting pass's parts sit beside the output (a folder every node of a cluster sees), until it is written.
    work_dir = Path(output_file).parent / f".{Path(output_file).name}.counting"
    result = learn_vocab(files, settings, progress, log, engine, work_dir)
    write_vocab(output_file, result.tokens)
    shutil.rmtree(work_dir, ignore_errors=True)
    padded, vocab_size = result.config_vocab_size, settings.vocab_size
    log(
        f"wrote {output_file}: {vocab_size} entries, [UNK] [CLS] [SEP] [MASK] at ids "
        f"{result.special_ids['[UNK]']}-{result.special_ids['[MASK]']}; a model config for it: vocab_size {padded} "
        + (
            "(a multiple of 8 already)"
            if padded == vocab_size
            else f"(padded to a multiple of 8, as NVIDIA pads 30522 to 30528; {vocab_size} works too)"
        )
    )
    return result


# ---------------------------------------------------------------------------------------------------------------
# CLI


@dataclasses.dataclass(frozen=True)
class VocabFiles:
    """The text to learn from and the vocab.txt to write."""

    input: list[str] = flag(required=True, action="append", metavar="FILE_OR_FOLDER")
    """text to learn from, repeatable: files (.txt, .gz, WikiExtractor output) or folders of them"""
    output_file: str = flag(required=True)
    """the vocab.txt to write"""


@dataclasses.dataclass(frozen=True)
class VocabRun:
    """How the command shows its work."""

    no_progress: bool = False
    """no progress bars"""


@dataclasses.dataclass(frozen=True)
class VocabConfig(flags.Config):
    """Every flag of create_vocab.py."""

    files: VocabFiles = dataclasses.field(default_factory=VocabFiles)
    settings: VocabSettings = dataclasses.field(default_factory=VocabSettings)
    run: VocabRun = dataclasses.field(default_factory=VocabRun)

    ungrouped: ClassVar[tuple[str, ...]] = ("files", "settings", "run")
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"


def main(argv: Sequence[str] | None = None) -> int:
    """0 when vocab.txt was written (a JSON summary on stdout's last line); bad input: one line on stderr, exit 1
    (--debug: the traceback)."""
    with script_errors("create_vocab.py", argv):
        cfg = flags.parse(VocabConfig, "create_vocab.py", __doc__, argv)
        result = create_vocab(
            cfg.files.input,
            cfg.files.output_file,
            cfg.settings,
            progress=not cfg.run.no_progress,
            log=lambda m: print(f"create_vocab.py: {m}", flush=True),
        )
        print(json.dumps({"output": str(cfg.files.output_file), **result.summary()}), flush=True)
    return 0
