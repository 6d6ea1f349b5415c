"""bench/stability.py, the multi-seed fine-tuning runner: its statistics against numbers written out here, and a
tiny real run (2 seeds, MRPC, MiniLM) whose summary agrees with each run's own results.json, and which a second call
reuses instead of running again."""
from __future__ import annotations

import json

import pytest

from bench import stability


def test_aggregate_is_mean_sample_std_min_max():
    stats = stability.aggregate([0.80, 0.90, 0.70])
    assert stats["mean"] == pytest.approx(0.80) and stats["std"] == pytest.approx(0.10)  # sqrt(0.02 / 2)
    assert (stats["min"], stats["max"], stats["seeds"]) == (0.70, 0.90, 3)
    assert stability.aggregate([0.5])["std"] == 0.0


def test_two_seeds_of_mrpc_run_and_aggregate(tmp_path, shared_data, minilm_dir, monkeypatch):
    common = ["--task", "mrpc", "--init_checkpoint", str(minilm_dir), "--data_dir", str(shared_data / "glue-mrpc"),
              "--max_steps", "2", "--batch_size", "8", "--max_train_examples", "32", "--max_eval_examples", "32",
              "--max_seq_length", "64", "--threads", "1", "--out", str(tmp_path)]
    summary = stability.main([*common, "--seeds", "3,4"])
    # Independently: each seed's F1 from its own results.json
    scores = [json.loads((tmp_path / f"seed_{s}" / "results.json").read_text())["eval"]["dev"]["f1"] for s in (3, 4)]
    assert [r["score"] for r in summary["runs"]] == scores
    assert summary["aggregate"]["mean"] == pytest.approx(sum(scores) / 2)
    assert all("--seed" in r["command"] and str(r["seed"]) in r["command"] for r in summary["runs"])
    saved = json.loads((tmp_path / "stability_mrpc.json").read_text())
    assert saved["aggregate"] == summary["aggregate"] and saved["metric"] == "f1"
    rows = (tmp_path / "stability_mrpc.md").read_text().splitlines()
    assert rows[0].startswith("| task | metric | seeds | seed 3 | seed 4 | mean") and len(rows) == 3
    # Asking again reuses the finished seeds (no run starts); other arguments run them again.
    launches = []

    def tripwire(cmd, **kwargs):
        launches.append(cmd)
        raise RuntimeError("a run started")

    monkeypatch.setattr(stability.subprocess, "Popen", tripwire)
    again = stability.main([*common, "--seeds", "4,3"])
    assert [r["score"] for r in again["runs"]] == scores[::-1] and launches == []
    with pytest.raises(RuntimeError, match="a run started"):
        stability.main([*common, "--seeds", "3,4", "--learning_rate", "2e-4"])
    assert len(launches) == 1 and "0.0002" in launches[0]
