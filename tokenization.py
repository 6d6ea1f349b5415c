"""WordPiece tokenization exactly as Google's BERT does it, plus a fast path with identical output.

The algorithm (Google's tokenization.py, re-implemented):
  1. clean: drop NUL, U+FFFD and control characters; every whitespace character becomes a space;
  2. put spaces around CJK ideographs, so each becomes a word of its own;
  3. split on whitespace; when uncased, lower-case and strip accents (NFD, drop non-spacing marks);
  4. split every punctuation character (ASCII symbol ranges and Unicode P* categories) into its own word;
  5. WordPiece each word: greedy longest-match-first against the vocabulary, continuations prefixed with "##";
     a word longer than 100 characters, or with any piece not in the vocabulary, becomes "[UNK]".

`BertTokenizer` runs steps 1-5 in pure Python (`use_fast=False`) or through the Rust `tokenizers` package
configured to give the same tokens and ids (the default when it is installed). Bulk callers (pre-training data,
fine-tuning features) use `tokenize_batch` / `encode_batch`, which hand whole lists to Rust in one call.
"""

from __future__ import annotations

import collections
import os
import re
import unicodedata
from typing import Iterable, Sequence

UNK, CLS, SEP, MASK, PAD = "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]"


def load_vocab(vocab_file: str | os.PathLike) -> "collections.OrderedDict[str, int]":
    """Token -> id, in file order: one token per line, id = line number (Google's convention)."""
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"vocabulary file {vocab_file} not found: pass --vocab_file with a BERT vocab.txt")
    vocab: collections.OrderedDict[str, int] = collections.OrderedDict()
    try:
        with open(vocab_file, encoding="utf-8") as f:
            for index, line in enumerate(f):
                vocab[line.strip()] = index
    except UnicodeDecodeError as e:
        raise ValueError(
            f"vocabulary file {vocab_file} is not UTF-8 text (byte {e.start}): pass a BERT vocab.txt, "
            "one token per line"
        ) from None
    if not vocab:
        raise ValueError(f"vocabulary file {vocab_file} is empty: pass a BERT vocab.txt, one token per line")
    return vocab


def vocab_fits_config(vocab_tokens: int, config_vocab_size: int) -> bool:
    """Whether a model config's vocab_size fits a vocabulary of `vocab_tokens` entries: the same number, or padded up
    by fewer than 8 rows (NVIDIA pads 30522 to 30528 for tensor-core shapes); never smaller."""
    return config_vocab_size - 8 < vocab_tokens <= config_vocab_size


def vocab_is_uncased(vocab: dict[str, int]) -> bool:
    """No token with an ASCII capital letter (special tokens such as [CLS] aside): an uncased vocabulary. ASCII
    only: bert-base-uncased's vocabulary keeps a few capitals of other scripts (lower-casing leaves them alone)."""
    return not any(any("A" <= c <= "Z" for c in token) for token in vocab if not token.startswith("["))


def casing_warning(vocab: dict[str, int], vocab_file: str, do_lower_case: bool) -> str | None:
    """A one-line warning when an uncased vocabulary meets input that is not lower-cased (every capitalised word
    would become [UNK]), else None."""
    if vocab_is_uncased(vocab) and not do_lower_case:
        return (
            f"{vocab_file} is an uncased vocabulary but --do_lower_case is not set; capitalised words will become [UNK]"
        )
    return None


def whitespace_tokenize(text: str) -> list[str]:
    return text.strip().split()


# ---------------------------------------------------------------------------------------------------------------
# Character classes, as Google defines them (not exactly Python's str.isspace / unicodedata categories).


def _is_whitespace(char: str) -> bool:
    # \t, \n and \r are control characters in Unicode but whitespace for BERT.
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    # Every non-letter/number/space ASCII character counts ("^", "$", "`" are not Unicode P*, but BERT splits them).
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    # The CJK Unified Ideographs blocks only: Hangul, Hiragana and Katakana are written with spaces and stay whole.
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class BasicTokenizer:
    """Steps 1-4: cleaning, CJK splitting, lower-casing/accent stripping, punctuation splitting."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        split_tokens: list[str] = []
        for token in whitespace_tokenize(text):
            if self.do_lower_case:
                token = self._strip_accents(token.lower())
            split_tokens.extend(self._split_on_punctuation(token))
        return whitespace_tokenize(" ".join(split_tokens))

    @staticmethod
    def _strip_accents(text: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")

    @staticmethod
    def _split_on_punctuation(text: str) -> list[str]:
        words: list[list[str]] = []
        start_new_word = True
        for char in text:
            if _is_punctuation(char):
                words.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    words.append([])
                start_new_word = False
                words[-1].append(char)
        return ["".join(w) for w in words]

    @staticmethod
    def _tokenize_chinese_chars(text: str) -> str:
        return "".join(f" {c} " if _is_chinese_char(ord(c)) else c for c in text)

    @staticmethod
    def _clean_text(text: str) -> str:
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            output.append(" " if _is_whitespace(char) else char)
        return "".join(output)


class WordpieceTokenizer:
    """Step 5: greedy longest-match-first WordPiece over one whitespace-free word at a time."""

    def __init__(self, vocab: dict[str, int], unk_token: str = UNK, max_input_chars_per_word: int = 100):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text: str) -> list[str]:
        output_tokens: list[str] = []
        for token in whitespace_tokenize(text):
            output_tokens.extend(self._tokenize_word(token))
        return output_tokens

    def _tokenize_word(self, word: str) -> list[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces: list[str] = []
        start = 0
        while start < len(word):
            # Shrink the candidate from the right until it is in the vocabulary.
            end = len(word)
            piece = None
            while start < end:
                candidate = word[start:end] if start == 0 else "##" + word[start:end]
                if candidate in self.vocab:
                    piece = candidate
                    break
                end -= 1
            if piece is None:  # one unmatchable piece makes the whole word unknown
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces


# Code points on which the Rust normalizer and Python 3.11's unicodedata agree, checked one by one in
# tests/test_tokenization.py. They differ elsewhere: newer Unicode tables in Rust (recently assigned marks and
# punctuation), private-use characters, and the final sigma (Python lower-cases a word-final capital sigma to
# "ς", Rust to "σ"). A text with any character outside these ranges goes through the Python path instead.
_FAST_PATH_RANGES = (
    (0x0000, 0x03A2),
    (0x03A4, 0x061C),
    (0x061E, 0x07FC),
    (0x07FE, 0x07FF),
    (0x0900, 0x097F),
    (0x0E00, 0x0E7F),
    (0x1E00, 0x1FFF),
    (0x2000, 0x206F),
    (0x20A0, 0x20CF),
    (0x2100, 0x214F),
    (0x2190, 0x22FF),
    (0x2500, 0x25FF),
    (0x3000, 0x30FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0xFF00, 0xFFEF),
    (0x1F300, 0x1F64F),
)
_OUTSIDE_FAST_PATH = re.compile(
    "[^" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in _FAST_PATH_RANGES) + "]"
)


def fast_path_agrees(text: str) -> bool:
    """True when every character of `text` lies where the Rust and Python paths are known to agree."""
    return text.isascii() or _OUTSIDE_FAST_PATH.search(text) is None


def _build_fast_tokenizer(vocab: dict[str, int], do_lower_case: bool, max_input_chars_per_word: int):
    """A `tokenizers.Tokenizer` that reproduces BasicTokenizer + WordpieceTokenizer, or None if not installed."""
    try:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    except ImportError:
        return None
    tokenizer = Tokenizer(
        models.WordPiece(vocab=dict(vocab), unk_token=UNK, max_input_chars_per_word=max_input_chars_per_word)
    )
    # strip_accents must follow do_lower_case explicitly: Google's cased models keep their accents.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


class BertTokenizer:
    """Google's BERT tokenizer: `tokenize`, `convert_tokens_to_ids`, `convert_ids_to_tokens`, `vocab`.

    Args:
        vocab_file: a BERT vocab.txt (one token per line).
        do_lower_case: lower-case and strip accents (uncased models).
        use_fast: run through the Rust `tokenizers` package when it is installed (same output, much faster).
    """

    def __init__(
        self,
        vocab_file: str | os.PathLike,
        do_lower_case: bool = True,
        max_input_chars_per_word: int = 100,
        use_fast: bool = True,
    ):
        self.vocab_file = str(vocab_file)
        self.vocab = load_vocab(vocab_file)
        self.ids_to_tokens = {index: token for token, index in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, UNK, max_input_chars_per_word)
        missing = [t for t in (UNK, CLS, SEP, MASK, PAD) if t not in self.vocab]
        if missing:  # before the Rust tokenizer is built: it fails on a vocabulary without [UNK] in its own words
            raise ValueError(
                f"vocabulary file {vocab_file} lacks the special tokens {missing}: is it a BERT vocab.txt?"
            )
        self._fast = _build_fast_tokenizer(self.vocab, do_lower_case, max_input_chars_per_word) if use_fast else None

    @property
    def is_fast(self) -> bool:
        return self._fast is not None

    def __len__(self) -> int:
        return len(self.vocab)

    # Single texts -------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        if self._fast is not None and fast_path_agrees(text):
            return self._fast.encode(text, add_special_tokens=False).tokens
        return self._tokenize_python(text)

    def _tokenize_python(self, text: str) -> list[str]:
        return [
            piece for word in self.basic_tokenizer.tokenize(text) for piece in self.wordpiece_tokenizer.tokenize(word)
        ]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without [CLS]/[SEP]."""
        if self._fast is not None and fast_path_agrees(text):
            return self._fast.encode(text, add_special_tokens=False).ids
        return self.convert_tokens_to_ids(self._tokenize_python(text))

    # Bulk ---------------------------------------------------------------------------------------------------
    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        return self._batch(texts, lambda encoding: encoding.tokens, self._tokenize_python)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens); one call into Rust for the whole list on the fast path."""
        return self._batch(
            texts, lambda encoding: encoding.ids, lambda t: self.convert_tokens_to_ids(self._tokenize_python(t))
        )

    def _batch(self, texts: Sequence[str], from_encoding, python_path) -> list:
        if self._fast is None:
            return [python_path(t) for t in texts]
        out: list = [None] * len(texts)
        fast_index = []
        for i, text in enumerate(texts):
            if fast_path_agrees(text):
                fast_index.append(i)
            else:
                out[i] = python_path(text)
        encodings = self._fast.encode_batch([texts[i] for i in fast_index], add_special_tokens=False)
        for i, encoding in zip(fast_index, encodings):
            out[i] = from_encoding(encoding)
        return out

    # Ids ----------------------------------------------------------------------------------------------------
    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        unk = self.vocab[UNK]
        return [self.vocab.get(token, unk) for token in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.ids_to_tokens[int(i)] for i in ids]

    def token_id(self, token: str) -> int:
        """The id of one special or ordinary token; a KeyError names the vocabulary file."""
        try:
            return self.vocab[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in {self.vocab_file}") from None


# Google's name for the same class.
FullTokenizer = BertTokenizer
