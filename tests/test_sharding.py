"""bert_recipe/prep/sharding.py on real text: WikiText-2 valid (../shared/data), one article per line ->
sentence-per-line shards.

References are independent of the code under test: the input articles themselves (every one must come back exactly
once, whole), blingfire called directly for the sentence boundaries, the LPT bound written out (any two shards
differ by at most the largest document), and byte-for-byte comparisons between runs.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_text_formatting import corpus_text

import create_pretraining_data
from bert_recipe.io.cli import InputError
from bert_recipe.prep import sharding
from bert_recipe.prep.sharding import ShardingConfig, assign_shards, balanced_assignment, shard_corpus, shard_name
from bert_recipe.pretraining import data_stream
from data import bertPrep


def wikitext_articles(path: Path) -> list[str]:
    """WikiText-2 -> articles: a ' = Title = ' line starts one; its paragraphs joined with a space."""
    articles, current = [], None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if re.fullmatch(r" = [^=].* = ", line):
            if current:
                articles.append(" ".join(current))
            current = []
        elif current is not None and line.strip() and not line.startswith(" = "):
            current.append(line.strip())
    if current:
        articles.append(" ".join(current))
    return articles


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> tuple[Path, list[str]]:
    articles = wikitext_articles(shared_data / "wikitext-2" / "valid.txt")
    path = tmp_path_factory.mktemp("corpus") / "wikitext_one_article_per_line.txt"
    path.write_text(
        "".join(a + "\n\n" if i % 7 == 3 else a + "\n" for i, a in enumerate(articles)), encoding="utf-8"
    )  # a few blank lines in the input must not matter
    return path, articles


def read_shard_docs(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n\n"), "every document, the last one too, ends with a blank line"
    return [doc.split("\n") for doc in text[:-2].split("\n\n")]


def run(corpus_path, out_dir, **overrides) -> dict:
    cfg = ShardingConfig(
        **{"n_training_shards": 4, "n_test_shards": 2, "fraction_test_set": 0.2, "num_workers": 1, **overrides}
    )
    return shard_corpus([corpus_path], out_dir / "wiki", cfg, progress=False)


def shard_paths(out_dir: Path, manifest: dict) -> list[Path]:
    return [out_dir / s["file"] for s in manifest["training"] + manifest["test"]]


def test_every_article_once_whole_and_segmented_like_blingfire(corpus, tmp_path):
    import blingfire

    path, articles = corpus
    manifest = run(path, tmp_path)
    normalised = [" ".join(a.split()) for a in articles]
    expected_sentences = {a: [s.strip() for s in blingfire.text_to_sentences(a).split("\n")] for a in normalised}
    got = Counter()
    for shard in shard_paths(tmp_path, manifest):
        for sentences in read_shard_docs(shard):
            assert all(s and s == s.strip() for s in sentences), "no empty or padded sentence lines"
            article = " ".join(sentences)
            got[article] += 1
            assert sentences == expected_sentences[article]
    # No document lost, duplicated or split: the shards hold exactly the input articles (whitespace-normalised).
    assert got == Counter(normalised)
    assert manifest["documents"] == len(articles) > 50


def test_shards_are_balanced_and_test_fraction_respected(corpus, tmp_path):
    path, _ = corpus
    manifest = run(path, tmp_path, n_training_shards=5, n_test_shards=3, fraction_test_set=0.25)
    doc_sizes = [
        len(("\n".join(d) + "\n\n").encode()) for p in shard_paths(tmp_path, manifest) for d in read_shard_docs(p)
    ]
    largest = max(doc_sizes)
    for split in ("training", "test"):
        sizes = [(tmp_path / s["file"]).stat().st_size for s in manifest[split]]
        assert sizes == [s["bytes"] for s in manifest[split]]
        assert max(sizes) - min(sizes) <= largest  # the LPT guarantee
    total = sum(doc_sizes)
    test_bytes = sum(s["bytes"] for s in manifest["test"])
    assert 0.25 * total <= test_bytes <= 0.25 * total + largest
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(
        [f"wiki_training_{i}.txt" for i in range(5)] + [f"wiki_test_{i}.txt" for i in range(3)] + ["wiki_manifest.json"]
    )  # and no temporary folder left behind


def test_lpt_balance_on_random_sizes():
    sizes = np.random.default_rng(1).integers(1, 10_000, size=5_000)
    ids = np.arange(len(sizes))
    shard = balanced_assignment(sizes, ids, 16)
    loads = np.bincount(shard, weights=sizes, minlength=16)
    assert loads.max() - loads.min() <= sizes.max()
    assert loads.sum() == sizes.sum()


def test_same_seed_same_bytes_whatever_workers_or_chunking(corpus, tmp_path):
    path, _ = corpus
    outputs = []
    for i, overrides in enumerate([{}, {"num_workers": 2}, {"num_workers": 2, "chunk_bytes": 50_000}]):
        out = tmp_path / str(i)
        manifest = run(path, out, **overrides)
        outputs.append([p.read_bytes() for p in shard_paths(out, manifest)])
    assert outputs[0] == outputs[1] == outputs[2]
    other = run(path, tmp_path / "seed", seed=999)
    assert [p.read_bytes() for p in shard_paths(tmp_path / "seed", other)] != outputs[0]


def test_chunk_boundaries_split_lines_correctly(tmp_path):
    """Byte ranges cut mid-line and mid-UTF-8 character: each document still read exactly once."""
    docs = [f"Document {i} says h\u00e9llo {'x' * (i % 13)}. It ends here." for i in range(200)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(docs) + "\n", encoding="utf-8")
    sizes = []
    for job_index, (p, start, end) in enumerate(sharding.plan_chunks([src], 97)):
        seg = str(tmp_path / f"seg{job_index}")
        n_docs, _ = sharding._segment_chunk((p, start, end, seg, "blingfire"))
        sizes.append(np.load(seg + ".npy"))
        assert len(sizes[-1]) == n_docs
    segmented = b"".join((tmp_path / f"seg{i}").read_bytes() for i in range(len(sizes))).decode("utf-8")
    assert [" ".join(d.split("\n")) for d in segmented[:-2].split("\n\n")] == docs
    assert int(np.concatenate(sizes).sum()) == len(segmented.encode("utf-8"))


def test_assignment_errors_and_edge_cases(tmp_path):
    sizes = np.array([10, 20, 30])
    with pytest.raises(InputError, match="only 3 documents for 4 shards"):
        assign_shards(sizes, ShardingConfig(n_training_shards=2, n_test_shards=2))
    shard = assign_shards(sizes, ShardingConfig(n_training_shards=3, n_test_shards=0))
    assert sorted(shard.tolist()) == [0, 1, 2]
    with pytest.raises(InputError, match="does not exist"):
        shard_corpus([tmp_path / "missing.txt"], tmp_path / "x", ShardingConfig(), progress=False)
    src = tmp_path / "in.txt"
    src.write_text("One. Two.\nThree.\n")
    with pytest.raises(InputError, match="fraction_test_set > 0"):
        shard_corpus(
            [src],
            tmp_path / "x",
            ShardingConfig(n_training_shards=1, n_test_shards=1, fraction_test_set=0.0),
            progress=False,
        )


def test_pysbd_option(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Dr. Smith arrived at 5 p.m. He sat down.\nShort one.\n", encoding="utf-8")
    cfg = ShardingConfig(n_training_shards=1, n_test_shards=0, segmenter="pysbd")
    shard_corpus([src], tmp_path / "p", cfg, progress=False)
    assert shard_name(tmp_path / "p", "training", 0).read_text() == (
        "Dr. Smith arrived at 5 p.m.\nHe sat down.\n\nShort one.\n\n"
    )


def test_cli_and_bertprep_sharding(corpus, tmp_path):
    path, articles = corpus
    assert (
        sharding.main(
            [
                "--input_files",
                str(path),
                "--output_prefix",
                str(tmp_path / "cli" / "w"),
                "--n_training_shards",
                "3",
                "--n_test_shards",
                "1",
                "--num_workers",
                "2",
                "--no_progress",
            ]
        )
        == 0
    )
    formatted = tmp_path / "formatted_one_article_per_line" / "custom_one_article_per_line.txt"
    formatted.parent.mkdir(parents=True)
    formatted.write_bytes(path.read_bytes())
    bertPrep.main(
        [
            "--action",
            "sharding",
            "--dataset",
            "custom",
            "--working_dir",
            str(tmp_path),
            "--n_training_shards",
            "3",
            "--n_test_shards",
            "1",
            "--fraction_test_set",
            "0.2",
            "--n_processes",
            "2",
            "--no_progress",
        ]
    )
    shard_dir = tmp_path / "sharded_training_shards_3_test_shards_1_fraction_0.2" / "custom"
    assert [p.name for p in bertPrep.list_shards(shard_dir, "custom")] == [
        "custom_training_0.txt",
        "custom_training_1.txt",
        "custom_training_2.txt",
        "custom_test_0.txt",
    ]
    # same flags, same seed: the bertPrep run and the direct CLI run wrote the same shards
    for name in ("training_0", "training_1", "training_2", "test_0"):
        assert (shard_dir / f"custom_{name}.txt").read_bytes() == (tmp_path / "cli" / f"w_{name}.txt").read_bytes()
    with pytest.raises(SystemExit, match="--n_processes"):
        bertPrep.main(
            ["--action", "sharding", "--dataset", "custom", "--working_dir", str(tmp_path), "--n_processes", "0"]
        )


# --------------------------------------------------------------------------------------------------------------
# End to end: WikiExtractor fixture -> formatting -> sharding -> create_hdf5_files (create_pretraining_data.py)


def test_end_to_end_wiki_fixture_to_hdf5(shared_data, uncased_vocab, tmp_path):
    import h5py

    extracted = tmp_path / "extracted" / "AA"
    extracted.mkdir(parents=True)
    (extracted / "wiki_00").write_bytes((shared_data / "hf-test-fixtures" / "wiki_text" / "wiki_00").read_bytes())
    common = [
        "--dataset",
        "wikicorpus_en",
        "--working_dir",
        str(tmp_path / "work"),
        "--n_processes",
        "2",
        "--no_progress",
        "--n_training_shards",
        "1",
        "--n_test_shards",
        "1",
        "--fraction_test_set",
        "0.3",
    ]
    bertPrep.main(["--action", "text_formatting", "--wikiextractor_dir", str(tmp_path / "extracted"), *common])
    bertPrep.main(["--action", "sharding", *common])
    hdf5 = [
        "--action",
        "create_hdf5_files",
        "--vocab_file",
        str(uncased_vocab),
        "--max_seq_length",
        "64",
        "--max_predictions_per_seq",
        "10",
        "--dupe_factor",
        "1",
        *common,
    ]
    bertPrep.main(hdf5)
    out_dir = (
        tmp_path / "work" / "hdf5_lower_case_1_seq_len_64_max_pred_10_masked_lm_prob_0.15_random_seed_12345"
        "_dupe_factor_1" / "wikicorpus_en"
    )
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.glob("*/*.hdf5"))
    assert files == ["test/wikicorpus_en_test_0.hdf5", "training/wikicorpus_en_training_0.hdf5"]
    expected = {
        "input_ids": ("int32", 64),
        "input_mask": ("int8", 64),
        "segment_ids": ("int8", 64),
        "masked_lm_positions": ("int32", 10),
        "masked_lm_ids": ("int32", 10),
        "next_sentence_labels": ("int8", None),
    }
    for name in files:
        with h5py.File(out_dir / name, "r") as f:
            assert set(f.keys()) == set(expected)
            n = f["input_ids"].shape[0]
            assert n > 20
            for key, (dtype, width) in expected.items():
                assert f[key].dtype == dtype and f[key].shape == ((n, width) if width else (n,))
            assert (f["input_ids"][:, 0] == 101).all()  # [CLS] of the uncased vocabulary
    # The per-shard runs (seed random_seed + i) equal one create_pretraining_data.py call over the shard folder.
    shard_dir = tmp_path / "work" / "sharded_training_shards_1_test_shards_1_fraction_0.3" / "wikicorpus_en"
    create_pretraining_data.main(
        [
            "--input_file",
            str(shard_dir),
            "--output_dir",
            str(tmp_path / "direct"),
            "--vocab_file",
            str(uncased_vocab),
            "--max_seq_length",
            "64",
            "--max_predictions_per_seq",
            "10",
            "--dupe_factor",
            "1",
            "--random_seed",
            "12345",
            "--num_workers",
            "1",
            "--no_progress",
        ]
    )
    for name in files:
        with h5py.File(out_dir / name, "r") as a, h5py.File(tmp_path / "direct" / Path(name).name, "r") as b:
            for key in expected:
                assert np.array_equal(a[key][:], b[key][:]), (name, key)
    # A rerun keeps finished files; a missing vocabulary is a clear error.
    mtimes = [(out_dir / n).stat().st_mtime_ns for n in files]
    bertPrep.main(hdf5)
    assert [(out_dir / n).stat().st_mtime_ns for n in files] == mtimes
    with pytest.raises(SystemExit, match="--vocab_file .* does not exist"):
        bertPrep.main([*hdf5[:2], "--vocab_file", str(tmp_path / "none.txt"), *hdf5[4:]])


def test_create_datasets_from_start_script(shared_data, uncased_vocab, tmp_path, repo_root):
    """data/create_datasets_from_start.sh custom DIR: formatting, sharding, phase 1 and phase 2 HDF5 in one call."""
    import os
    import subprocess
    import sys

    import h5py

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "wiki.txt").write_bytes((shared_data / "hf-test-fixtures" / "wiki_text" / "wiki_00").read_bytes())
    env = {
        **os.environ,
        "INPUT_DIR": str(mine),
        "VOCAB_FILE": str(uncased_vocab),
        "N_PROCESSES": "2",
        "N_TRAINING_SHARDS": "1",
        "N_TEST_SHARDS": "1",
        "FRACTION_TEST_SET": "0.3",
        "DUPE_FACTOR": "1",
        "PYTHON": sys.executable,
    }
    work = tmp_path / "work"
    proc = subprocess.run(
        ["bash", str(repo_root / "data" / "create_datasets_from_start.sh"), "custom", str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for seq, pred in ((128, 20), (512, 80)):
        folder = (
            work
            / (f"hdf5_lower_case_1_seq_len_{seq}_max_pred_{pred}_masked_lm_prob_0.15_random_seed_12345_dupe_factor_1")
            / "custom"
        )
        names = sorted(str(p.relative_to(folder)) for p in folder.glob("*/*.hdf5"))
        assert names == ["test/custom_test_0.hdf5", "training/custom_training_0.hdf5"]
        with h5py.File(folder / names[1], "r") as f:
            assert f["input_ids"].shape[1] == seq and f["masked_lm_positions"].shape[1] == pred
    bad = subprocess.run(
        ["bash", str(repo_root / "data" / "create_datasets_from_start.sh"), "wikipedia"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown dataset" in bad.stderr


def test_wikipedia_slice_through_the_documented_command(shared_data, uncased_vocab, tmp_path, repo_root):
    """The issue's corpus command on two files of the real Wikipedia slice (WikiExtractor output, gzipped):
    WIKIEXTRACTOR_DIR=... data/create_datasets_from_start.sh wiki_only DIR. The held-out articles are whole
    articles, in test/ only: none of their text is in a training shard, and the loader reads training/ (and refuses
    a folder that mixes the two)."""
    import os
    import subprocess
    import sys

    import h5py

    extracted = tmp_path / "text" / "AA"
    extracted.mkdir(parents=True)
    for name in ("wiki_00.gz", "wiki_01.gz"):
        (extracted / name).write_bytes((shared_data / "wikipedia-en-slice" / "text" / "AA" / name).read_bytes())
    env = {
        **os.environ,
        "WIKIEXTRACTOR_DIR": str(tmp_path / "text"),
        "VOCAB_FILE": str(uncased_vocab),
        "N_PROCESSES": "2",
        "N_TRAINING_SHARDS": "2",
        "N_TEST_SHARDS": "1",
        "FRACTION_TEST_SET": "0.1",
        "DUPE_FACTOR": "1",
        "PYTHON": sys.executable,
    }
    work = tmp_path / "work"
    proc = subprocess.run(
        ["bash", str(repo_root / "data" / "create_datasets_from_start.sh"), "wiki_only", str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (work / "download").exists()  # nothing was downloaded
    # Whole articles: every test document is one formatted article, and none of them is in a training shard.
    formatted = corpus_text(work / "formatted_one_article_per_line" / "wikicorpus_en_one_article_per_line")
    articles = [" ".join(a.split()) for a in formatted.splitlines()]
    assert len(articles) > 50
    shard_dir = work / "sharded_training_shards_2_test_shards_1_fraction_0.1" / "wikicorpus_en"

    def documents(pattern):
        docs = []
        for path in sorted(shard_dir.glob(pattern)):
            docs += [" ".join(d.split()) for d in path.read_text().split("\n\n") if d.strip()]
        return docs

    training, held_out = documents("*_training_*.txt"), documents("*_test_*.txt")
    assert held_out and set(held_out) <= set(articles) and not set(held_out) & set(training)
    assert len(training) + len(held_out) == len(articles)
    hdf5 = work / "hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_1"
    train_dir, test_dir = hdf5 / "wikicorpus_en" / "training", hdf5 / "wikicorpus_en" / "test"
    assert sorted(p.name for p in train_dir.iterdir()) == [
        "wikicorpus_en_training_0.hdf5",
        "wikicorpus_en_training_1.hdf5",
    ]
    assert sorted(p.name for p in test_dir.iterdir()) == ["wikicorpus_en_test_0.hdf5"]
    spec = data_stream.ShardSpec(128, 20, False)
    shards = data_stream.inspect_shards(data_stream.list_shards(str(train_dir), "--input_dir"), spec, "--input_dir")
    batch = next(iter(data_stream.PretrainingData(shards, 1, 8)))
    assert batch["input_ids"].shape == (8, 128) and (batch["input_ids"][:, 0] == 101).all()
    with h5py.File(test_dir / "wikicorpus_en_test_0.hdf5", "r") as f:
        assert f["input_ids"].shape[0] > 0
    # NVIDIA's old layout kept training and test shards in one folder: the loader refuses to train on that.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in [*train_dir.iterdir(), *test_dir.iterdir()]:
        (mixed / path.name).symlink_to(path)
    with pytest.raises(data_stream.DataError, match="held-out ones .*wikicorpus_en_test_0.hdf5"):
        data_stream.list_shards(str(mixed), "--input_dir")
