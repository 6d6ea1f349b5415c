"""create_pretraining_data.py on shards made from the real WikiText-2 (../shared/data/wikitext-2/valid.txt).

Independent references: the corpus is re-tokenized here with the pure-Python (Google-exact) tokenizer, one
sentence at a time, and every segment of every instance is searched for in those ids; Google's formulas (the
prediction count with Python's round, truncation of the longer side, the 80/10/10 rule, whole-word groups) are
written out in the tests; nothing is compared with output captured from the code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

import create_pretraining_data as cpd
from bert_recipe.pretraining import shard_format
from bert_recipe.pretraining import shard_writer as writer
from tokenization import BertTokenizer

CLS, SEP, MASK, PAD = 101, 102, 103, 0  # bert-base-uncased ids (checked against the vocabulary below)
SEQ, PRED, PROB = 128, 20, 0.15
KEYS = {
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_labels": np.int8,
}


# --------------------------------------------------------------------------------------------------------------
# Corpus: WikiText paragraphs -> one sentence per line, one article per document.


def wikitext_documents(lines: list[str]) -> list[list[str]]:
    """Articles (` = Title = ` headings, single '=') become documents; paragraphs are split on ' . ' into sentences;
    section headings (` = = X = = `) are dropped."""
    documents, current = [], []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if re.fullmatch(r"= [^=].* =", line):
            if current:
                documents.append(current)
            current = []
            continue
        if line.startswith("= ="):
            continue
        current.extend(part.strip() for part in line.split(" . ") if part.strip())
    if current:
        documents.append(current)
    return documents


def write_corpus(path: Path, documents: list[list[str]]) -> Path:
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    return path


def run(tmp_path: Path, name: str, input_file, vocab, *extra: str, capsys=None) -> dict[str, np.ndarray]:
    out = tmp_path / f"{name}.hdf5"
    argv = [
        "--input_file",
        str(input_file),
        "--output_file",
        str(out),
        "--vocab_file",
        str(vocab),
        "--max_seq_length",
        str(SEQ),
        "--max_predictions_per_seq",
        str(PRED),
        "--masked_lm_prob",
        str(PROB),
        "--no_progress",
        *extra,
    ]
    assert cpd.main(argv) == 0
    with h5py.File(out, "r") as f:
        arrays = {k: f[k][:] for k in f}
        arrays["_attrs"] = dict(f.attrs)
    return arrays


@pytest.fixture(scope="module")
def valid_lines(shared_data) -> list[str]:
    return (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def corpus(valid_lines, tmp_path_factory) -> tuple[Path, list[list[str]]]:
    documents = wikitext_documents(valid_lines[:1200])  # 22 articles, ~58k words
    return write_corpus(tmp_path_factory.mktemp("corpus") / "wiki.txt", documents), documents


@pytest.fixture(scope="module")
def small_corpus(valid_lines, tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("small") / "small.txt", wikitext_documents(valid_lines[:400]))


@pytest.fixture(scope="module")
def reference_ids(corpus, uncased_vocab) -> bytes:
    """Every document's ids from the pure-Python tokenizer, one sentence at a time, as bytes (int32 little-endian)
    with a separator no segment contains, so a search cannot run across documents."""
    tokenizer = BertTokenizer(uncased_vocab, use_fast=False)
    assert [tokenizer.vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")] == [CLS, SEP, MASK, PAD]
    separator = np.array([-1], dtype="<i4").tobytes()
    docs = [np.array([i for s in doc for i in tokenizer.encode(s)], dtype="<i4").tobytes() for doc in corpus[1]]
    return separator + separator.join(docs) + separator


@pytest.fixture(scope="module")
def shard(corpus, uncased_vocab, tmp_path_factory) -> dict[str, np.ndarray]:
    """Default settings, 4 passes: ~2,600 instances, ~45,000 predictions."""
    return run(
        tmp_path_factory.mktemp("shard"),
        "shard",
        corpus[0],
        uncased_vocab,
        "--dupe_factor",
        "4",
        "--random_seed",
        "7",
        "--num_workers",
        "1",
    )


def unmasked(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """input_ids with the original ids put back at the masked positions."""
    ids = arrays["input_ids"].copy()
    rows, slots = np.nonzero(arrays["masked_lm_positions"])
    ids[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][rows, slots]
    return ids


def segment_bounds(ids: np.ndarray) -> tuple[int, int]:
    seps = np.flatnonzero(ids == SEP)
    assert len(seps) == 2, f"expected exactly two [SEP], got {seps}"
    return int(seps[0]), int(seps[1])


def find(haystack: bytes, segment: np.ndarray, start: int = 0, end: int | None = None) -> int:
    """Byte offset of the first run of whole int32 ids equal to `segment` in haystack[start:end], or -1."""
    needle = segment.astype("<i4").tobytes()
    end = len(haystack) if end is None else end
    at = haystack.find(needle, start, end)
    while at != -1 and at % 4:
        at = haystack.find(needle, at + 1, end)
    return at


def occurs(haystack: bytes, segment: np.ndarray) -> bool:
    return find(haystack, segment) != -1


def b_follows_a(haystack: bytes, a: np.ndarray, b: np.ndarray) -> int:
    """The smallest gap (in ids) at which B follows an occurrence of A in the same document, or -1."""
    separator = np.array([-1], dtype="<i4").tobytes()
    best, at = -1, find(haystack, a)
    while at != -1:
        a_end = at + 4 * len(a)
        doc_end = haystack.find(separator, a_end)
        b_at = find(haystack, b, a_end, doc_end)
        if b_at != -1 and (best == -1 or (b_at - a_end) // 4 < best):
            best = (b_at - a_end) // 4
        at = find(haystack, a, at + 4)
    return best


def google_count(length: int) -> int:
    return min(PRED, max(1, round(length * PROB)))  # Python's round, as in Google's script


# --------------------------------------------------------------------------------------------------------------
# Layout and structure


def test_layout_dtypes_and_summary(corpus, uncased_vocab, tmp_path, capsys):
    arrays = run(tmp_path, "s", corpus[0], uncased_vocab, "--dupe_factor", "1", "--num_workers", "1")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    n = len(arrays["next_sentence_labels"])
    assert summary["instances"] == n > 500 and summary["seconds"] > 0
    for key, dtype in KEYS.items():
        assert arrays[key].dtype == dtype, key
    assert arrays["input_ids"].shape == arrays["input_mask"].shape == arrays["segment_ids"].shape == (n, SEQ)
    assert arrays["masked_lm_positions"].shape == arrays["masked_lm_ids"].shape == (n, PRED)
    assert arrays["_attrs"]["masking"] == "static"
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file of the atomic write was left behind"


def test_cls_sep_segments_mask_and_padding(shard):
    ids = unmasked(shard)
    assert (shard["input_ids"][:, 0] == CLS).all()
    for row in range(len(ids)):
        first, second = segment_bounds(ids[row])
        assert 2 <= first and first + 2 <= second < SEQ  # A and B both non-empty
        expected_segments = np.r_[np.zeros(first + 1), np.ones(second - first), np.zeros(SEQ - second - 1)]
        np.testing.assert_array_equal(shard["segment_ids"][row], expected_segments)
        expected_mask = np.r_[np.ones(second + 1), np.zeros(SEQ - second - 1)]
        np.testing.assert_array_equal(shard["input_mask"][row], expected_mask)
        assert (ids[row, second + 1 :] == PAD).all() and (shard["input_ids"][row, second + 1 :] == PAD).all()
        assert CLS not in ids[row, 1:]


def test_prediction_count_positions_and_labels(shard):
    ids = unmasked(shard)
    lengths = shard["input_mask"].sum(1)
    for row in range(len(ids)):
        positions = shard["masked_lm_positions"][row]
        count = int((positions > 0).sum())
        assert count == google_count(int(lengths[row])), (row, lengths[row], count)
        chosen = positions[:count]
        assert (positions[count:] == 0).all() and (shard["masked_lm_ids"][row, count:] == 0).all()
        assert (np.diff(chosen) > 0).all()  # ascending, hence unique
        assert (chosen < lengths[row]).all()  # never padding
        assert not np.isin(ids[row, chosen], [CLS, SEP]).any()
        np.testing.assert_array_equal(shard["masked_lm_ids"][row, :count], ids[row, chosen])


def test_prediction_cap_and_other_probability(small_corpus, uncased_vocab, tmp_path):
    """min(P, max(1, round(L * p))) where the cap P binds (P = 12, p = 0.2: rows of 63+ tokens hit it)."""
    arrays = run(
        tmp_path,
        "cap",
        small_corpus,
        uncased_vocab,
        "--dupe_factor",
        "1",
        "--num_workers",
        "1",
        "--max_predictions_per_seq",
        "12",
        "--masked_lm_prob",
        "0.2",
    )
    assert arrays["masked_lm_positions"].shape[1] == 12
    lengths = arrays["input_mask"].sum(1)
    counts = (arrays["masked_lm_positions"] > 0).sum(1)
    expected = [min(12, max(1, round(int(n) * 0.2))) for n in lengths]
    np.testing.assert_array_equal(counts, expected)
    assert (counts == 12).mean() > 0.5 and (counts < 12).any()


def test_help_and_import_have_no_side_effects(repo_root):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "create_pretraining_data.py", "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--no_static_masking" in done.stdout and "--output_dir" in done.stdout
    done = subprocess.run(
        [sys.executable, "-c", "import create_pretraining_data"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


def test_80_10_10(shard):
    rows, slots = np.nonzero(shard["masked_lm_positions"])
    assert len(rows) >= 10_000
    now = shard["input_ids"][rows, shard["masked_lm_positions"][rows, slots]]
    label = shard["masked_lm_ids"][rows, slots]
    masked = now == MASK
    kept = ~masked & (now == label)
    replaced = ~masked & ~kept
    assert abs(masked.mean() - 0.8) < 0.02 and abs(kept.mean() - 0.1) < 0.02 and abs(replaced.mean() - 0.1) < 0.02
    # Random words are uniform over the vocabulary's ids (30,522 of them): mean near 15,260, both ends reached.
    vocab_size = 30522
    assert abs(now[replaced].mean() - (vocab_size - 1) / 2) < 6 * vocab_size / np.sqrt(12 * replaced.sum())
    assert now[replaced].min() < 1000 and now[replaced].max() > vocab_size - 1000


def test_random_next_fraction(shard):
    # Above 0.5 by the chunks of a single sentence, which are always random next (Google's rule).
    fraction = shard["next_sentence_labels"].mean()
    assert len(shard["next_sentence_labels"]) > 2000 and 0.5 - 0.05 < fraction < 0.5 + 0.05


def test_segments_are_contiguous_runs_of_the_corpus(shard, reference_ids):
    ids = unmasked(shard)
    contiguous = 0
    for row in range(len(ids)):
        first, second = segment_bounds(ids[row])
        a, b = ids[row, 1:first], ids[row, first + 1 : second]
        assert occurs(reference_ids, a), f"row {row}: segment A is not a run of the corpus"
        assert occurs(reference_ids, b), f"row {row}: segment B is not a run of the corpus"
        if shard["next_sentence_labels"][row] == 0:
            # A true next pair is contiguous text of one document, unless truncation trimmed the back of A or the
            # front of B, which only happens when the pair was cut to exactly max_seq_length - 3 tokens.
            gap = b_follows_a(reference_ids, a, b)
            assert gap == 0 or (gap > 0 and len(a) + len(b) == SEQ - 3), f"row {row}: B does not follow A"
            contiguous += gap == 0
    assert contiguous > 100  # both cases occur: untrimmed pairs are exactly contiguous


def test_truncation_trims_the_longer_side():
    """Token counts removed per side match Google's loop; the front/back split is about half and half."""
    rng = np.random.default_rng(0)
    spans = []
    for _ in range(2000):
        la, lb = rng.integers(1, 200, size=2)
        a0, b0 = rng.integers(0, 10_000, size=2)
        spans.append((a0, a0 + la, b0, b0 + lb))
    spans = np.array(spans)
    out = writer._truncate(spans, 125, np.random.default_rng(1))
    front = removed = 0
    for (a0, a1, b0, b1), (c0, c1, d0, d1) in zip(spans, out):
        la, lb = a1 - a0, b1 - b0
        while la + lb > 125:  # Google's truncate_seq_pair, one token at a time: the longer side, B on a tie
            if la > lb:
                la -= 1
            else:
                lb -= 1
        assert (c1 - c0, d1 - d0) == (la, lb)
        assert a0 <= c0 <= c1 <= a1 and b0 <= d0 <= d1 <= b1  # a sub-run of the original span
        front += (c0 - a0) + (d0 - b0)
        removed += (a1 - a0 - la) + (b1 - b0 - lb)
    assert removed > 10_000 and abs(front / removed - 0.5) < 0.02


# --------------------------------------------------------------------------------------------------------------
# Determinism


def test_same_seed_same_arrays_for_any_worker_count(small_corpus, uncased_vocab, tmp_path):
    common = ("--dupe_factor", "2", "--random_seed", "3")
    one = run(tmp_path, "w1", small_corpus, uncased_vocab, *common, "--num_workers", "1")
    two = run(tmp_path, "w2", small_corpus, uncased_vocab, *common, "--num_workers", "2")
    spawned = run(
        tmp_path,
        "w2s",
        small_corpus,
        uncased_vocab,
        *common,
        "--num_workers",
        "2",
        "--mp_start_method",
        "spawn",
        "--compression",
        "none",
    )
    again = run(tmp_path, "again", small_corpus, uncased_vocab, *common, "--num_workers", "1")
    other = run(
        tmp_path, "other", small_corpus, uncased_vocab, "--dupe_factor", "2", "--random_seed", "4", "--num_workers", "1"
    )
    for key in KEYS:
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)
        np.testing.assert_array_equal(one[key], spawned[key], err_msg=key)
        np.testing.assert_array_equal(one[key], again[key], err_msg=key)
    assert one["input_ids"].shape != other["input_ids"].shape or not np.array_equal(
        one["input_ids"], other["input_ids"]
    )


def test_output_dir_matches_one_call_per_shard(valid_lines, uncased_vocab, tmp_path):
    """A folder of shards -> one file each, shard i with seed + i: what bertPrep's per-shard calls produce."""
    shards = tmp_path / "shards"
    shards.mkdir()
    documents = wikitext_documents(valid_lines[:500])
    write_corpus(shards / "part_0.txt", documents[: len(documents) // 2])
    write_corpus(shards / "part_1.txt", documents[len(documents) // 2 :])
    (shards / "notes.md").write_text("not a shard")
    common = ["--vocab_file", str(uncased_vocab), "--dupe_factor", "1", "--no_progress", "--num_workers", "2"]
    assert (
        cpd.main(["--input_file", str(shards), "--output_dir", str(tmp_path / "out"), "--random_seed", "10", *common])
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part_0.hdf5", "part_1.hdf5"]
    assert (
        cpd.main(
            [
                "--input_file",
                str(shards / "part_1.txt"),
                "--output_file",
                str(tmp_path / "single.hdf5"),
                "--random_seed",
                "11",
                *common,
            ]
        )
        == 0
    )
    with h5py.File(tmp_path / "out" / "part_1.hdf5") as a, h5py.File(tmp_path / "single.hdf5") as b:
        for key in KEYS:
            np.testing.assert_array_equal(a[key][:], b[key][:], err_msg=key)


# --------------------------------------------------------------------------------------------------------------
# Options


def test_whole_word_mask(small_corpus, uncased_vocab, tmp_path):
    arrays = run(
        tmp_path, "wwm", small_corpus, uncased_vocab, "--dupe_factor", "2", "--num_workers", "1", "--do_whole_word_mask"
    )
    vocab = BertTokenizer(uncased_vocab, use_fast=False).ids_to_tokens
    ids = unmasked(arrays)
    lengths = arrays["input_mask"].sum(1)
    saw_multi_piece_word = 0
    for row in range(len(ids)):
        positions = arrays["masked_lm_positions"][row]
        chosen = set(positions[positions > 0].tolist())
        assert 1 <= len(chosen) <= google_count(int(lengths[row]))
        # Google's words: a "##" piece joins the previous candidate (positions other than [CLS]/[SEP]).
        words: list[list[int]] = []
        for i in range(int(lengths[row])):
            if ids[row, i] in (CLS, SEP):
                continue
            if words and vocab[int(ids[row, i])].startswith("##"):
                words[-1].append(i)
            else:
                words.append([i])
        for word in words:
            hit = [i in chosen for i in word]
            assert all(hit) or not any(hit), f"row {row}: word {word} partly masked"
            saw_multi_piece_word += all(hit) and len(word) > 1
    assert saw_multi_piece_word > 20


def test_no_static_masking_then_dynamic_mask(small_corpus, uncased_vocab, tmp_path):
    arrays = run(
        tmp_path, "dyn", small_corpus, uncased_vocab, "--dupe_factor", "6", "--num_workers", "1", "--no_static_masking"
    )
    assert arrays["_attrs"]["masking"] == "dynamic"
    assert not arrays["masked_lm_positions"].any() and not arrays["masked_lm_ids"].any()
    ids, mask = arrays["input_ids"], arrays["input_mask"]
    assert MASK not in ids
    for row in range(0, len(ids), 7):
        segment_bounds(ids[row])

    specials = [CLS, SEP, PAD, MASK]
    masked, positions, labels = shard_format.dynamic_mask(
        ids, mask, 30522, specials, np.random.default_rng(0), masked_lm_prob=PROB, max_predictions_per_seq=PRED
    )
    assert masked.shape == ids.shape and masked.dtype == ids.dtype
    assert positions.shape == labels.shape == (len(ids), PRED)
    counts = (positions > 0).sum(1)
    expected = [google_count(int(n)) for n in mask.sum(1)]
    np.testing.assert_array_equal(counts, expected)
    rows, slots = np.nonzero(positions)
    at = positions[rows, slots]
    assert len(at) >= 10_000
    assert not np.isin(ids[rows, at], specials).any() and mask[rows, at].all()  # never special, never padding
    np.testing.assert_array_equal(labels[rows, slots], ids[rows, at])
    for row in range(len(ids)):
        assert (np.diff(positions[row, : counts[row]]) > 0).all()
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows, at] = False
    np.testing.assert_array_equal(masked[untouched], ids[untouched])
    now = masked[rows, at]
    is_mask = now == MASK
    kept = ~is_mask & (now == ids[rows, at])
    assert (
        abs(is_mask.mean() - 0.8) < 0.02
        and abs(kept.mean() - 0.1) < 0.02
        and abs(1 - is_mask.mean() - kept.mean() - 0.1) < 0.02
    )
    # New masks each call (epoch), and torch tensors in -> torch tensors out, the same draws for the same seed.
    again = shard_format.dynamic_mask(ids, mask, 30522, specials, np.random.default_rng(1), PROB, PRED)[1]
    assert not np.array_equal(again, positions)
    torch = pytest.importorskip("torch")
    t_masked, t_positions, t_labels = shard_format.dynamic_mask(
        torch.from_numpy(ids), torch.from_numpy(mask), 30522, specials, np.random.default_rng(0), PROB, PRED
    )
    assert isinstance(t_masked, torch.Tensor) and t_positions.dtype == torch.int64
    np.testing.assert_array_equal(t_masked.numpy(), masked)
    np.testing.assert_array_equal(t_positions.numpy(), positions)


def test_piece_cache_tokenizes_like_the_python_tokenizer(uncased_vocab, cased_vocab):
    """Tokenizing each space-separated piece once is exact, also on accents, final sigma, CJK, controls, tabs."""
    lines = [
        "Héllo  wörld\tTAB ΣΑΣ ΟΔΥΣΣΕΥΣ end.",
        "x\u2028y  \u200bz 中文字 mixed中文 ",
        "a" * 150 + " b",
        "\x1c\x85 ok",
        "don't stop-me (now)!",
        "The <unk> of 1 @,@ 000 km²",
        "naïve café Ångström",
    ]
    for vocab, lower in ((uncased_vocab, True), (cased_vocab, False)):
        writer._init_worker(str(vocab), lower, threads_off=False)
        writer._PIECES = writer._PieceTable()
        ids, lengths = writer._encode_lines(lines)
        reference = [BertTokenizer(vocab, do_lower_case=lower, use_fast=False).encode(line) for line in lines]
        assert lengths.tolist() == [len(r) for r in reference]
        assert ids.tolist() == [i for r in reference for i in r]


def test_document_boundaries_and_blank_lines(uncased_vocab, tmp_path):
    """Blank lines (several, or with spaces) separate documents; a file start does too; empty docs vanish."""
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("\n\n first sentence one .\nsecond one .\n \n\n\nthird , in doc two .\n\x1c\n", encoding="utf-8")
    b.write_text("fourth in doc three .\r\nfifth too .\r\n", encoding="utf-8")
    writer._init_worker(str(uncased_vocab), True, threads_off=False)
    builder = writer.CorpusBuilder(str(tmp_path), 30522)
    for path, size in ((a, 7), (b, 5)):  # tiny chunks: breaks and lines cross chunk boundaries
        for k, task in enumerate(writer.byte_chunks(str(path), size)):
            builder.add(writer._tokenize_chunk(task), starts_file=k == 0)
    corpus = builder.finish()
    assert corpus.num_documents == 3
    assert np.diff(corpus.doc_start).tolist() == [2, 1, 2]
    tok = BertTokenizer(uncased_vocab, use_fast=False)
    sentences = ["first sentence one .", "second one .", "third , in doc two .", "fourth in doc three .", "fifth too ."]
    assert corpus.tokens.tolist() == [i for s in sentences for i in tok.encode(s)]


def test_bad_input_gives_a_clear_error(uncased_vocab, tmp_path, small_corpus):
    out = str(tmp_path / "o.hdf5")
    base = ["--output_file", out, "--vocab_file", str(uncased_vocab), "--no_progress"]
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\n")
    binary = tmp_path / "archive.txt"
    binary.write_bytes(bytes(range(256)) * 64)  # what a compressed or HDF5 file looks like: NULs and all bytes
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e. " * 200).encode("latin-1"))
    cases = [
        (["--input_file", str(tmp_path / "missing.txt"), *base], "missing.txt does not exist"),
        (["--input_file", str(empty_dir), *base], "folder without .txt"),
        (["--input_file", str(blank), *base], "no text in"),
        (
            ["--input_file", str(small_corpus), "--output_file", out, "--vocab_file", str(tmp_path / "v.txt")],
            "--vocab_file .*v.txt does not exist",
        ),
        (["--input_file", str(small_corpus), *base, "--max_seq_length", "4"], "--max_seq_length 4"),
        (["--input_file", str(small_corpus), *base, "--masked_lm_prob", "1.5"], "--masked_lm_prob 1.5"),
        (["--input_file", str(small_corpus), *base, "--max_predictions_per_seq", "0"], "--max_predictions_per_seq"),
        (["--input_file", str(small_corpus), *base, "--dupe_factor", "0"], "--dupe_factor 0"),
        (["--input_file", str(small_corpus), *base, "--num_workers", "0"], "--num_workers 0"),
        (["--input_file", str(binary), *base], "is not text"),
        (["--input_file", str(latin), *base], "is not UTF-8 text"),
        (
            [
                "--input_file",
                str(small_corpus),
                "--output_file",
                str(empty_dir),
                "--vocab_file",
                str(uncased_vocab),
                "--no_progress",
            ],
            "is a folder: name the file to write",
        ),
        (
            [
                "--input_file",
                str(small_corpus),
                "--output_file",
                str(blank / "sub" / "o.hdf5"),
                "--vocab_file",
                str(uncased_vocab),
                "--no_progress",
            ],
            "cannot create the folder",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            cpd.main(argv)
    assert not Path(out).exists()
    with pytest.raises(SystemExit) as exc:  # argparse: a missing required flag is a usage error (exit code 2)
        cpd.main(["--input_file", str(small_corpus)])
    assert exc.value.code == 2
