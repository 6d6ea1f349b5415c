"""data/create_vocab.py: a WordPiece vocabulary learned from real Wikipedia text, in Google's layout.

References: tokenization.BasicTokenizer (the pre-splitting must equal it, on every code point and on real text),
bert-base-uncased's own vocab.txt (the layout of its first lines), transformers' pure-Python BERT tokenizer (the
tokens our tokenizer gives with the learned vocabulary), the training text itself (every character covered), and
the pipeline's own scripts (create_pretraining_data.py, run_pretraining.py, bertPrep, the data script).
"""

from __future__ import annotations

import gzip
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import REPO_ROOT, args_for, read_log, subprocess_env, weights

import run_pretraining
import tokenization
from bert_recipe.prep import vocab as cv
from data import bertPrep
from modeling import BertConfig
from tokenization import BasicTokenizer, BertTokenizer, WordpieceTokenizer

SLICE = Path("wikipedia-en-slice") / "text"
TRAIN_FILE = SLICE / "AA" / "wiki_00.gz"  # WikiExtractor output, gzipped: the learner reads it as it is
HELD_OUT_FILE = SLICE / "AB" / "wiki_99.gz"  # another file of the same slice: text the vocabulary never saw
SIZE = 2000

HARD_STRINGS = [
    "Héllo Wörld naïve café résumé Ångström \u212b\u212a",  # precomposed, and the Angstrom / Kelvin signs
    "He\u0301llo decomposed x\u0301\u0301y \u0301leading mark",
    "日本語のテキストと中文字符，還有한국어 \uf900\ufa0e compatibility ideographs",
    "ΟΔΟΣ ΟΔΟΣ. ΣΑ ΑΣΑ Σ ΣΙΣΥΦΟΣ) final sigma everywhere",
    "\u1fef\u1fed\u037e\u0387 canonical singletons that become punctuation",
    "ctrl\x00a\x07b\u200bc\ufffd d\u0085e\ufeff f\u200dg",
    "\t tab\nnew\r\nline\u3000wide\u00a0nbsp\u2028line\u2029para\x1c\x1dsep",
    "İstanbul straße ǅemal ﬁne 𝐀𝐁 𝔘𝔫𝔦 ᾼ",
    "emoji 😀👍🏽 and symbols ©®™ ½ ① → $5^` don't e.g. U.S.A. 3.14",
    "a" * 101 + " short " + "b" * 100,
    "मराठी हिन्दी ภาษาไทย עברית العربية \U000e0001tag",
    "",
]
# Kept by Google's cleaning (it drops Cc and Cf only) and so by ours, dropped by transformers' port (it drops every
# C* category): for the pre-splitting tests only.
PRIVATE_USE = "\ue000private \U0010fffd use \u0378unassigned"


def slice_lines(path: Path, limit: int | None = None) -> list[str]:
    """The text lines of a WikiExtractor .gz file (markup and blank lines left out), read here independently."""
    lines = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if line and not line.startswith("<doc ") and line != "</doc>":
                lines.append(line)
    return lines[:limit]


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    """A folder holding the first articles (about 1,500 lines, 350 KB of text) of a real WikiExtractor file of the
    slice, gzipped with their <doc> markup, as the slice ships them."""
    raw = gzip.open(shared_data / TRAIN_FILE, "rt", encoding="utf-8").read().splitlines()
    end = raw.index("</doc>", 1500) + 1
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "AA").mkdir()
    with gzip.open(folder / "AA" / "wiki_00.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(raw[:end]) + "\n")
    return folder


@pytest.fixture(scope="module")
def held_out(shared_data) -> list[str]:
    """Held-out lines: every line with a non-ASCII character among the first 700 of another file, and 100 more."""
    lines = slice_lines(shared_data / HELD_OUT_FILE, 700)
    return [line for line in lines if not line.isascii()] + [line for line in lines if line.isascii()][:100]


@pytest.fixture(scope="module")
def train_words(corpus) -> dict[bool, list[str]]:
    """do_lower_case -> BasicTokenizer's words of the training text."""
    lines = slice_lines(corpus / "AA" / "wiki_00.gz")
    return {lower: [w for line in lines for w in BasicTokenizer(lower).tokenize(line)] for lower in (True, False)}


@pytest.fixture(scope="module")
def learned(corpus, tmp_path_factory) -> dict[bool, tuple[Path, cv.VocabResult, list[str]]]:
    """do_lower_case -> (vocab.txt, the result, the log lines), learned once for the module by the CLI's library
    entry."""
    out = {}
    folder = tmp_path_factory.mktemp("vocab")
    for lower in (True, False):
        log: list[str] = []
        path = folder / f"vocab_{'uncased' if lower else 'cased'}.txt"
        result = cv.create_vocab([corpus], path, cv.VocabSettings(SIZE, do_lower_case=lower), log=log.append)
        out[lower] = (path, result, log)
    return out


def read_vocab(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and "\r" not in text
    return text[:-1].split("\n")


# ---------------------------------------------------------------------------------------------------------------
# Pre-splitting: BasicTokenizer's words, fast


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_presplitter_equals_basic_tokenizer_on_every_code_point(lower):
    """Every assigned code point, and every 97th of those that behave alike by the thousand (CJK ideographs, Hangul
    syllables, unassigned, private-use, surrogates), inside a word, at its edges, beside a capital sigma and
    punctuation, one line of 64 code points at a time."""
    splitter, basic = cv.PreSplitter(lower), BasicTokenizer(lower)

    def alike(cp: int) -> bool:
        return (
            unicodedata.category(chr(cp)) in ("Cn", "Co", "Cs")
            or tokenization._is_chinese_char(cp)
            or 0xAC00 <= cp <= 0xD7A3
        )

    points = [cp for cp in range(0x110000) if not alike(cp) or cp % 97 == 0]
    assert len(points) > 60_000
    lines = []
    for i in range(0, len(points), 64):
        lines.append("".join(f"a{chr(cp)}b " if cp % 2 else f"{chr(cp)}Σ.{chr(cp)} " for cp in points[i : i + 64]))
    differing = [line for line in lines if splitter.words(line) != basic.tokenize(line)]
    assert differing == []
    # Whole chunks at once, as the learner feeds them, give the lines' words one after the other, whether the
    # splitter has met their characters before (classified line by line above) or meets them all at once.
    chunk, expected = "\n".join(lines[:2000]), [w for line in lines[:2000] for w in basic.tokenize(line)]
    assert splitter.words(chunk) == expected and cv.PreSplitter(lower).words(chunk) == expected


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_presplitter_equals_basic_tokenizer_on_real_text(shared_data, held_out, lower):
    splitter, basic = cv.PreSplitter(lower), BasicTokenizer(lower)
    wikitext = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()[:600]
    for lines in (held_out, wikitext, [*HARD_STRINGS, PRIVATE_USE]):
        assert [splitter.words(line) for line in lines] == [basic.tokenize(line) for line in lines]
        assert splitter.words("\n".join(lines)) == [w for line in lines for w in basic.tokenize(line)]
    assert sum(not line.isascii() for line in held_out) > 100
    split = splitter.split(" ".join(HARD_STRINGS))
    assert not any(c.isspace() for c in split.replace(" ", "")), "a space is the only whitespace left"


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_alphabet_from_the_raw_characters_is_the_words_alphabet(held_out, lower):
    """Pass 1 reads only the raw characters; they must give exactly the characters of the words and their counts
    (the sigmas aside: a capital sigma may or may not end a word)."""
    lines = held_out + HARD_STRINGS
    text = "\n".join(lines)
    predicted = cv.PreSplitter(lower).alphabet({c: text.count(c) for c in set(text)})
    words = "".join(w for line in lines for w in BasicTokenizer(lower).tokenize(line))
    # Lower-casing, a capital sigma's count goes to both sigmas: its place in a word decides which it becomes.
    sigmas = ("σ", "ς") if lower else ()
    assert {c: n for c, n in predicted.items() if c not in sigmas} == {
        c: words.count(c) for c in set(words) if c not in sigmas
    }
    assert all(predicted[c] >= words.count(c) > 0 for c in sigmas)


def test_reader_skips_wikiextractor_markup_reads_gzip_by_its_bytes_and_plain_text(shared_data, tmp_path):
    source = shared_data / TRAIN_FILE
    raw_lines = gzip.open(source, "rt", encoding="utf-8").read().splitlines()
    docs = sum(line.startswith("<doc ") for line in raw_lines)
    assert docs > 10 and docs == raw_lines.count("</doc>")
    gz_named_oddly = tmp_path / "wiki_00"  # WikiExtractor's own name: no suffix, gzip bytes
    gz_named_oddly.write_bytes(source.read_bytes())
    plain = tmp_path / "plain.txt"
    plain.write_text("\n".join(raw_lines), encoding="utf-8")
    for path in (gz_named_oddly, plain):
        lines = "\n".join(cv.iter_chunks([path], chunk_chars=10_000)).split("\n")
        assert lines == [
            line.strip() for line in raw_lines if line.strip() and not line.startswith("<doc ") and line != "</doc>"
        ]
        assert len(lines) == sum(1 for line in raw_lines if line.strip()) - 2 * docs
    sizes = []
    list(cv.iter_chunks([gz_named_oddly, plain], on_bytes=sizes.append))
    assert sum(sizes) == gz_named_oddly.stat().st_size + plain.stat().st_size
    assert cv.list_input_files([tmp_path]) == [plain, gz_named_oddly]  # wiki_* and *.txt from a folder, sorted


# ---------------------------------------------------------------------------------------------------------------
# The layout


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_google_layout_exact_size_unique_lines(learned, uncased_vocab, lower):
    path, result, log = learned[lower]
    tokens = read_vocab(path)
    assert tokens == result.tokens and len(tokens) == SIZE == len(set(tokens))
    google = read_vocab(uncased_vocab)
    assert tokens[:104] == google[:104]  # [PAD], [unused0..98], [UNK] [CLS] [SEP] [MASK] at 100-103
    assert [google.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    assert not any(t.startswith("[") and len(t) > 1 for t in tokens[104:])
    assert all(t and not any(c.isspace() for c in t) for t in tokens)
    assert result.config_vocab_size == 2000 and cv.config_vocab_size(30522) == 30528
    assert any("vocab_size 2000" in line for line in log)
    assert tokenization.vocab_is_uncased(dict.fromkeys(tokens)) == lower
    # Our tokenizer loads it, with the specials where Google's are.
    tokenizer = BertTokenizer(path, do_lower_case=lower)
    assert [tokenizer.token_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_every_entry_is_a_piece_our_tokenizer_can_produce(train_words, learned, lower):
    path, result, _ = learned[lower]
    tokens = read_vocab(path)
    learned_entries = tokens[104:]
    basic = BasicTokenizer(lower)
    for token in learned_entries:
        body = token[2:] if token.startswith("##") else token
        assert body and basic.tokenize(body) == [body], token  # one word, already normalised
        if token.startswith("##"):
            assert cv.continues_words(body[0]), token  # never "##" + punctuation or an ideograph
    # Alphabet first, by code point, then "##" + each, then the learned pieces (most useful first).
    alphabet = sorted(set("".join(train_words[lower])))
    assert learned_entries[: len(alphabet)] == alphabet
    continuations = ["##" + c for c in alphabet if cv.continues_words(c)]
    assert learned_entries[len(alphabet) : result.alphabet_entries] == continuations
    assert result.alphabet == len(alphabet) and result.learned == SIZE - 104 - result.alphabet_entries
    if lower:
        assert "é" not in alphabet and all(t == t.lower() for t in learned_entries)
    else:
        assert "é" in alphabet and {"The", "In", "##s"} <= set(learned_entries)


def test_unused_slots_994_is_bert_base_uncased_layout(corpus, uncased_vocab, tmp_path):
    tokens = cv.create_vocab([corpus], tmp_path / "v.txt", cv.VocabSettings(2000, unused_slots=994)).tokens
    google = read_vocab(uncased_vocab)
    assert tokens[:999] == google[:999] and google[999] == "!" and tokens[999] == "!"


def test_small_size_puts_the_specials_right_after_pad(learned, corpus, tmp_path):
    log: list[str] = []
    size = learned[True][1].alphabet_entries + 5 + 50  # too small for Google's ids 100-103: the fallback
    result = cv.create_vocab([corpus], tmp_path / "small.txt", cv.VocabSettings(size), log=log.append)
    tokens = read_vocab(tmp_path / "small.txt")
    assert len(tokens) == size == len(set(tokens)) and result.learned == 50
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and not any("unused" in t for t in tokens)
    assert any("ids 1-4, right after [PAD]" in line for line in log), log
    assert BertTokenizer(tmp_path / "small.txt").token_id("[MASK]") == 4
    # Fewer slots than 99, asked for: the specials still come first, the slots after them.
    tokens = cv.create_vocab([corpus], tmp_path / "ten.txt", cv.VocabSettings(1000, unused_slots=10)).tokens
    assert tokens[:15] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"[unused{i}]" for i in range(10)]]
    # Exactly big enough for the alphabet: no learned piece, still a valid vocabulary.
    floor = 5 + result.alphabet_entries
    assert cv.create_vocab([corpus], tmp_path / "floor.txt", cv.VocabSettings(floor)).learned == 0


def test_same_text_same_bytes_in_separate_processes_and_a_smaller_size_is_a_prefix(corpus, tmp_path):
    """The learner's ties are broken by token id; the pinned alphabet makes the output the same on every run (the
    trainer's hash maps are seeded anew in every process). Both ways of running the script."""
    runs = [[sys.executable, str(REPO_ROOT / "data" / "create_vocab.py")], [sys.executable, "-m", "data.create_vocab"]]
    outputs = []
    for i, command in enumerate(runs):
        done = subprocess.run(
            [
                *command,
                "--input",
                str(corpus),
                "--output_file",
                str(tmp_path / f"{i}.txt"),
                "--vocab_size",
                "1500",
                "--no_progress",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=300,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert '"vocab_size": 1500' in done.stdout.splitlines()[-1]  # the JSON summary
        outputs.append((tmp_path / f"{i}.txt").read_bytes())
    assert outputs[0] == outputs[1]
    small = read_vocab(tmp_path / "0.txt")
    large = cv.create_vocab([corpus], tmp_path / "l.txt", cv.VocabSettings(2500)).tokens
    assert large[:1500] == small  # the learner's order is its merge order: a smaller vocabulary is a prefix


def test_help_and_nothing_at_import():
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "data" / "create_vocab.py"), "--help"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert done.returncode == 0 and "--vocab_size" in done.stdout and "--cased" in done.stdout
    probe = (
        "import sys; import bert_recipe.prep.vocab as m; "
        "assert 'tokenization' not in sys.modules and 'tokenizers' not in sys.modules"
    )  # nothing classified
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=subprocess_env(), timeout=60)
    assert done.returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# Tokenizing with the learned vocabulary


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_our_tokenizer_equals_transformers_pure_python_one_on_held_out_text(learned, held_out, lower):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    path = learned[lower][0]
    reference = BertTokenizerLegacy(str(path), do_lower_case=lower)  # transformers' pure-Python port of Google's
    fast, python = BertTokenizer(path, do_lower_case=lower), BertTokenizer(path, do_lower_case=lower, use_fast=False)
    assert fast.is_fast and not python.is_fast
    # transformers puts the text in NFC first, Google does not (nor do we): cased, that differs on text that is not
    # in NFC (the Angstrom sign, decomposed accents), so those hard strings are left out of the cased comparison.
    texts = held_out + [h for h in HARD_STRINGS if lower or unicodedata.is_normalized("NFC", h)]
    tokens = fast.tokenize_batch(texts)
    assert python.tokenize_batch(texts) == tokens
    assert [reference.tokenize(t) for t in texts] == tokens
    assert fast.encode_batch(texts) == [reference.convert_tokens_to_ids(t) for t in tokens]
    pieces = sum(map(len, tokens))
    assert pieces > 25_000 and sum(t.startswith("##") for line in tokens for t in line) > 0.1 * pieces


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_every_character_of_the_training_text_is_covered(train_words, learned, held_out, lower):
    """No [UNK] for any word (of at most 100 characters) made of characters that occur in the training text: the
    training words, the held-out words made of them, and random strings of them."""
    path = learned[lower][0]
    wordpiece = WordpieceTokenizer(tokenization.load_vocab(path))
    words = set(train_words[lower])
    alphabet = {c for w in words for c in w}
    basic = BasicTokenizer(lower)
    held_out_words = {w for line in held_out for w in basic.tokenize(line)}
    covered = {w for w in held_out_words if set(w) <= alphabet}
    assert len(covered) > 0.95 * len(held_out_words) > 3000
    rng = random.Random(0)
    letters = sorted(c for c in alphabet if cv.continues_words(c))
    random_words = {"".join(rng.choice(letters) for _ in range(rng.randint(1, 12))) for _ in range(3000)}
    for word in sorted(words | covered | random_words):
        if len(word) <= 100:
            assert "[UNK]" not in wordpiece.tokenize(word), word
    # A character the training text lacks makes its word [UNK] (the reference check is not vacuous).
    assert wordpiece.tokenize("a\u0b95") == ["[UNK]"] and "\u0b95" not in alphabet


def test_limit_alphabet_keeps_the_most_frequent_characters(train_words, corpus, tmp_path):
    log: list[str] = []
    result = cv.create_vocab([corpus], tmp_path / "v.txt", cv.VocabSettings(1000, limit_alphabet=60), log=log.append)
    counts: dict[str, int] = {}
    for w in train_words[True]:
        for c in w:
            counts[c] = counts.get(c, 0) + 1
    top = sorted(counts, key=lambda c: (-counts[c], c))[:60]
    assert result.tokens[104:164] == sorted(top) and result.alphabet == 60
    assert any("--limit_alphabet 60" in line for line in log)
    rare = min(counts, key=counts.get)
    assert rare not in result.tokens
    assert WordpieceTokenizer(dict.fromkeys(result.tokens)).tokenize("a" + rare) == ["[UNK]"]


# ---------------------------------------------------------------------------------------------------------------
# The pipeline: data script with VOCAB_SIZE -> shards -> run_pretraining with a matching config


def test_pipeline_end_to_end_with_a_learned_vocabulary(shared_data, tmp_path, capsys):

    mine = tmp_path / "mine"
    mine.mkdir()
    # 1,200 real lines as a plain-text book: one document per blank-line-separated block of 40 lines.
    lines = slice_lines(shared_data / TRAIN_FILE, 1200)
    (mine / "book.txt").write_text(
        "\n\n".join("\n".join(lines[i : i + 40]) for i in range(0, 1200, 40)) + "\n", encoding="utf-8"
    )
    work = tmp_path / "work"
    env = {
        **subprocess_env(),
        "INPUT_DIR": str(mine),
        "DOC_BOUNDARY": "blank_line",
        "VOCAB_SIZE": "1003",
        "N_PROCESSES": "1",
        "N_TRAINING_SHARDS": "1",
        "N_TEST_SHARDS": "1",
        "FRACTION_TEST_SET": "0.2",
        "DUPE_FACTOR": "1",
        "PYTHON": sys.executable,
    }
    script = str(REPO_ROOT / "data" / "create_datasets_from_start.sh")
    done = subprocess.run(["bash", script, "custom", str(work)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    vocab = work / "vocab.txt"
    tokens = read_vocab(vocab)
    assert len(tokens) == 1003 == len(set(tokens)) and tokens[101] == "[CLS]"
    assert "vocab_size 1008" in done.stdout  # the config size, logged
    assert "create_vocab" in (work / "bertPrep_log.jsonl").read_text()
    phase1 = (
        work
        / ("hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_1")
        / "custom"
    )
    # Training and held-out shards in folders of their own (run_pretraining reads every file of --input_dir).
    assert sorted(str(p.relative_to(phase1)) for p in phase1.glob("*/*.hdf5")) == [
        "test/custom_test_0.hdf5",
        "training/custom_training_0.hdf5",
    ]
    with h5py.File(phase1 / "training" / "custom_training_0.hdf5") as f:
        ids = f["input_ids"][:]
        assert (ids[:, 0] == 101).all() and ids.max() < 1003 and len(ids) > 50
        # The shards' text is the learned vocabulary's tokens: few pieces are [UNK].
        assert (ids == 100).sum() < 0.001 * (ids > 0).sum()
    # run_pretraining with a config whose vocab_size is the vocabulary's, padded to a multiple of 8, trains.
    config = tmp_path / "config_1008.json"
    BertConfig(
        vocab_size=1008,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    ).to_json_file(config)
    train_dir = phase1 / "training"
    out = tmp_path / "run"
    argv = args_for(
        train_dir, config, out, "--max_steps", "3", "--precision", "fp32", "--vocab_file", str(vocab), seq=128, pred=20
    )
    assert run_pretraining.main(argv) == 0
    final = [r for r in read_log(out / "log.json") if r["step"] == "FINAL"][-1]["data"]
    assert final["step"] == 3 and np.isfinite(final["final_loss"])
    assert weights(out / "ckpt_3.pt")["bert.embeddings.word_embeddings.weight"].shape[0] == 1008
    # A config whose vocab_size does not match the vocabulary is refused in one line, before any step.
    for size in (1016, 1000, 30522):
        config_other = tmp_path / f"config_{size}.json"
        BertConfig(
            vocab_size=size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        ).to_json_file(config_other)
        other = tmp_path / f"run_{size}"
        capsys.readouterr()
        with pytest.raises(SystemExit) as refused:
            run_pretraining.main(
                args_for(
                    train_dir,
                    config_other,
                    other,
                    "--max_steps",
                    "3",
                    "--precision",
                    "fp32",
                    "--vocab_file",
                    str(vocab),
                    seq=128,
                    pred=20,
                )
            )
        message = str(refused.value.code)
        assert message.startswith("run_pretraining.py: error: --vocab_file") and "\n" not in message
        assert "1003 tokens" in message and f"vocab_size is {size}" in message
        assert not list(other.glob("ckpt_*.pt"))
    # A rerun learns the same vocab.txt again and keeps the finished HDF5 files; a rerun with another size learns
    # another one: the kept HDF5 files of the old one are refused, not mixed with new ones.
    made = {p: p.stat().st_mtime_ns for p in work.glob("hdf5_*/custom/*/*.hdf5")}
    same = subprocess.run(["bash", script, "custom", str(work)], env=env, capture_output=True, text=True, timeout=600)
    assert same.returncode == 0, same.stderr[-3000:]
    assert read_vocab(vocab) == tokens and {p: p.stat().st_mtime_ns for p in made} == made and len(made) == 4
    env["VOCAB_SIZE"] = "1100"
    rerun = subprocess.run(["bash", script, "custom", str(work)], env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode != 0 and len(read_vocab(vocab)) == 1100
    last = rerun.stderr.strip().splitlines()[-1]
    assert last.startswith("bertPrep.py: error:") and "another vocabulary" in last and "--overwrite" in last
    # VOCAB_SIZE and VOCAB_FILE together are refused before anything runs.
    both = subprocess.run(
        ["bash", script, "custom", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env={**env, "VOCAB_FILE": str(vocab)},
        timeout=60,
    )
    assert both.returncode == 2 and "not both" in both.stderr and not (tmp_path / "none").exists()


def test_bertprep_create_vocab_action(corpus, tmp_path):

    formatted = tmp_path / "work" / "formatted_one_article_per_line"
    formatted.mkdir(parents=True)
    lines = slice_lines(corpus / "AA" / "wiki_00.gz", 600)
    (formatted / "custom_one_article_per_line.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--dataset", "custom", "--working_dir", str(tmp_path / "work"), "--no_progress"]
    assert bertPrep.main(["--action", "create_vocab", "--vocab_size", "900", "--do_lower_case", "0", *common]) == 0
    tokens = read_vocab(tmp_path / "work" / "vocab.txt")
    direct = cv.create_vocab(
        [formatted / "custom_one_article_per_line.txt"],
        tmp_path / "direct.txt",
        cv.VocabSettings(900, do_lower_case=False),
    ).tokens
    assert tokens == direct and len(tokens) == 900 and not tokenization.vocab_is_uncased(dict.fromkeys(tokens))
    with pytest.raises(SystemExit, match="needs --vocab_size"):
        bertPrep.main(["--action", "create_vocab", *common])
    with pytest.raises(SystemExit, match="run --action text_formatting"):
        bertPrep.main(["--action", "create_vocab", "--vocab_size", "900", *common[:3], str(tmp_path / "empty")])
