"""WordPiece: hand-written tiny-vocabulary cases in the style of Google's tests, then identical tokens and ids to
Hugging Face's tokenizers on all of WikiText-2 and on hard strings, with the real cased and uncased vocabularies."""

from __future__ import annotations

import pytest
from transformers import BertTokenizer as HFBertTokenizer
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

import tokenization
from tokenization import (
    BasicTokenizer,
    BertTokenizer,
    FullTokenizer,
    WordpieceTokenizer,
    casing_warning,
    load_vocab,
    vocab_is_uncased,
)

TINY_VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "want",
    "##want",
    "##ed",
    "wa",
    "un",
    "runn",
    "##ing",
    ",",
    "low",
    "lowest",
]


@pytest.fixture
def tiny_vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in TINY_VOCAB), encoding="utf-8")
    return path


@pytest.mark.parametrize("use_fast", [False, True])
def test_full_tokenizer_on_tiny_vocab(tiny_vocab_file, use_fast):
    tokenizer = FullTokenizer(tiny_vocab_file, do_lower_case=True, use_fast=use_fast)
    tokens = tokenizer.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tokenizer.convert_tokens_to_ids(tokens) == [9, 6, 7, 12, 10, 11]
    assert tokenizer.convert_ids_to_tokens([9, 6, 7]) == ["un", "##want", "##ed"]
    assert list(tokenizer.vocab) == TINY_VOCAB  # file order
    assert tokenizer.encode_batch(["unwanted running", "lowest"]) == [[9, 6, 7, 10, 11], [14]]


def test_wordpiece_greedy_longest_match_and_unknown():
    vocab = {t: i for i, t in enumerate(TINY_VOCAB)}
    wordpiece = WordpieceTokenizer(vocab)
    assert wordpiece.tokenize("") == []
    assert wordpiece.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert wordpiece.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]  # one bad piece: whole word UNK
    assert wordpiece.tokenize("lowest") == ["lowest"]  # longest match first, not "low" + ...
    assert WordpieceTokenizer(vocab, max_input_chars_per_word=5).tokenize("wanted want") == ["[UNK]", "want"]


def test_basic_tokenizer_rules():
    lower = BasicTokenizer(do_lower_case=True)
    assert lower.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert lower.tokenize("H\u00e9llo") == ["hello"]  # NFD accent stripping
    assert lower.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]  # CJK split per character
    cased = BasicTokenizer(do_lower_case=False)
    assert cased.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["HeLLo", "!", "how", "Are", "yoU", "?"]
    assert cased.tokenize("H\u00e9llo") == ["H\u00e9llo"]  # cased keeps accents
    assert lower.tokenize("a\x00b\ufffdc\x07d") == ["abcd"]  # NUL, U+FFFD, control characters dropped
    assert lower.tokenize("$5^`") == ["$", "5", "^", "`"]  # ASCII symbols count as punctuation


def test_character_classes():
    assert (
        tokenization._is_whitespace(" ") and tokenization._is_whitespace("\t") and tokenization._is_whitespace("\u00a0")
    )
    assert not tokenization._is_whitespace("A") and not tokenization._is_whitespace("-")
    assert (
        tokenization._is_control("\u0005") and not tokenization._is_control("\t") and not tokenization._is_control("\r")
    )
    assert tokenization._is_punctuation("-") and tokenization._is_punctuation("$") and tokenization._is_punctuation("`")
    assert (
        tokenization._is_punctuation(".")
        and not tokenization._is_punctuation("A")
        and not tokenization._is_punctuation(" ")
    )


HARD_STRINGS = [
    "Héllo Wörld naïve café résumé Ångström",
    "日本語のテキストと中文字符，還有한국어",
    "emoji 😀👍🏽 and symbols ©®™ ½ ① →",
    "ctrl\x00a\x07b\u200bc\ufffd d\u0085e",
    "a" * 101 + " short " + "b" * 100,
    "...!!!???---((()))[[]]{{}}''\"\"``",
    "İstanbul ΣΊΣΥΦΟΣ ΟΔΟΣ straße ǅemal ﬁne",
    "\t tab\nnew\r\nline\u3000wide\u00a0nbsp\u2028sep",
    "don't stop-believing e.g. U.S.A. 3.14 1,000,000 $5 @user #tag",
    "x\u0301\u0301y combining ᾼ ǅ Ǆ 𝐀𝐁 𝔘𝔫𝔦",
    "मराठी हिन्दी ภาษาไทย עברית العربية",
    "",
]


def _wikitext_lines(shared_data) -> list[str]:
    lines = []
    for name in ("valid.txt", "test.txt"):
        lines += (shared_data / "wikitext-2" / name).read_text(encoding="utf-8").splitlines()
    return lines


@pytest.mark.parametrize(
    "vocab_name,lower", [("bert-base-uncased-vocab.txt", True), ("bert-base-cased-vocab.txt", False)]
)
def test_identical_to_transformers_on_wikitext_and_hard_strings(shared_data, vocab_name, lower):
    vocab_file = shared_data / "bert-vocab" / vocab_name
    ours_fast = BertTokenizer(vocab_file, do_lower_case=lower)
    ours_python = BertTokenizer(vocab_file, do_lower_case=lower, use_fast=False)
    assert ours_fast.is_fast and not ours_python.is_fast
    legacy = BertTokenizerLegacy(str(vocab_file), do_lower_case=lower)  # transformers' pure-Python port of Google's
    rust = HFBertTokenizer(str(vocab_file), do_lower_case=lower)  # transformers' default (Rust) tokenizer

    lines = _wikitext_lines(shared_data)
    assert len(lines) > 8000
    for texts in (lines, HARD_STRINGS):
        ids_fast = ours_fast.encode_batch(texts)
        tokens_fast = ours_fast.tokenize_batch(texts)
        assert ours_python.tokenize_batch(texts) == tokens_fast
        for text, tokens, ids in zip(texts, tokens_fast, ids_fast):
            assert legacy.tokenize(text) == tokens, text
            assert legacy.convert_tokens_to_ids(tokens) == ids, text
            if "Σ" not in text or not lower:
                assert rust.tokenize(text) == tokens, text
    # The one documented difference from transformers' Rust tokenizer: Google (and Python) lower-case a final
    # capital sigma to "ς"; Rust lower-cases it to "σ". We follow Google, as the pre-trained vocabularies did.
    if lower:
        assert ours_fast.tokenize("ΟΔΟΣ") == legacy.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ος"]


@pytest.mark.parametrize(
    "vocab_name,lower", [("bert-base-uncased-vocab.txt", True), ("bert-base-cased-vocab.txt", False)]
)
def test_fast_path_agrees_on_every_code_point_it_takes(shared_data, vocab_name, lower):
    """Each code point routed to Rust gives the Python path's tokens, alone and inside words."""
    vocab_file = shared_data / "bert-vocab" / vocab_name
    ours_fast = BertTokenizer(vocab_file, do_lower_case=lower)
    ours_python = BertTokenizer(vocab_file, do_lower_case=lower, use_fast=False)
    chars = [chr(c) for lo, hi in tokenization._FAST_PATH_RANGES for c in range(lo, hi + 1)]
    texts = [f"x{c}y {c} A{c}" for c in chars]
    assert all(tokenization.fast_path_agrees(t) for t in texts)
    assert ours_fast._fast is not None
    rust_tokens = [e.tokens for e in ours_fast._fast.encode_batch(texts, add_special_tokens=False)]
    python_tokens = ours_python.tokenize_batch(texts)
    disagreements = [t for t, a, b in zip(texts, rust_tokens, python_tokens) if a != b]
    assert disagreements == []
    # And characters outside the ranges are routed to Python, whose output is Google's.
    for text in ("\u03a3\u03a3", "a\ue000b", "\u08ca", "\u166d"):
        assert not tokenization.fast_path_agrees(text)
        assert ours_fast.tokenize(text) == ours_python.tokenize(text)


def test_bad_vocabulary_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        BertTokenizer(tmp_path / "nope.txt")
    (tmp_path / "v.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"lacks the special tokens"):
        BertTokenizer(tmp_path / "v.txt")


def test_casing_is_read_from_the_vocabulary(uncased_vocab, cased_vocab):
    """One rule for every script: the real uncased vocabulary (which keeps a few non-ASCII capitals) is uncased,
    the cased one is not, and only uncased-without-lower-casing warns."""
    uncased, cased = load_vocab(uncased_vocab), load_vocab(cased_vocab)
    assert any(c.isupper() for token in uncased for c in token if not token.startswith("["))  # why ASCII only
    assert vocab_is_uncased(uncased) and not vocab_is_uncased(cased)
    assert "--do_lower_case" in casing_warning(uncased, "v.txt", do_lower_case=False)
    assert casing_warning(uncased, "v.txt", True) is None and casing_warning(cased, "v.txt", False) is None


def test_vocab_fits_config_allows_padding_below_eight_rows_only():
    vocab_fits_config = tokenization.vocab_fits_config
    assert vocab_fits_config(30522, 30522) and vocab_fits_config(30522, 30528)  # NVIDIA's padding of uncased
    assert vocab_fits_config(1234, 1240) and vocab_fits_config(1233, 1240)  # 7 rows of padding: fits
    assert not vocab_fits_config(1232, 1240)  # 8 rows over: another vocabulary
    assert not vocab_fits_config(30529, 30528)  # a config smaller than the vocabulary never fits
