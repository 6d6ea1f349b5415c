"""The issue-14 study scripts (bench/pretrain_study.py, bench/scaling_study.py, bench/results_page.py).

Aggregation is checked against numbers written out here: fake pre-training logs, fake checkpoints and fake
bench.stability JSONs with known scores are given to the scripts, which then only read, reuse and aggregate (no
training). The real pipelines run once each at the tiniest size (a few pre-training steps of a 1-layer model on
a slice of WikiText-2, 2 seeds x 1 fine-tuning step on 16 MRPC examples), and a second call reuses every output.
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from bench import pretrain_study, results_page, scaling_study, study_utils

# MRPC dev: 408 pairs, 279 of them paraphrases, so predicting "paraphrase" everywhere scores F1 2*279/(279+408);
# SST-2 dev: 872 sentences, 444 positive, so always "positive" scores accuracy 444/872.
MRPC_MAJORITY_F1 = 558 / 687
SST2_MAJORITY_ACC = 444 / 872
TINY_CONFIG = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "intermediate_size": 64, "max_position_embeddings": 512}


# --------------------------------------------------------------------------------------------------------------
# Fakes: what run_pretraining.py and bench.stability write, with numbers chosen here


def log_lines(path, params: dict, losses: dict, evals: dict, final: dict | None):
    records = [{"type": "LOG", "step": "PARAMETER", "data": params}]
    for step in sorted(set(losses) | set(evals)):
        if step in losses:
            records.append({"type": "LOG", "step": step, "data": {"mlm_loss": losses[step], "average_loss": 0.0}})
        if step in evals:
            records.append({"type": "LOG", "step": step, "data": {"eval_mlm_accuracy": evals[step][0],
                                                                   "eval_mlm_loss": evals[step][1]}})
    if final is not None:
        records.append({"type": "LOG", "step": "FINAL", "data": final})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def heldout_shard(path):
    """4 samples; the masked slots with a position > 0 hold tokens 7, 7, 9, 7, 11 and 7: the most frequent token,
    7, is 4 of 6 targets. The 5th sample (beyond max_eval_samples 4) would change that if it were counted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    positions = np.array([[1, 2, 0], [3, 0, 0], [1, 4, 5], [2, 0, 0], [1, 2, 3]], dtype=np.int32)
    ids = np.array([[7, 7, 0], [9, 0, 0], [7, 11, 7], [0, 0, 0], [9, 9, 9]], dtype=np.int32)
    positions[3, 0] = 0  # a sample with no masked slot at all
    with h5py.File(path, "w") as f:
        f["masked_lm_positions"], f["masked_lm_ids"] = positions, ids


def fake_ckpt(path, config: dict, step: int):
    from modeling import BertConfig, BertForPreTraining

    path.parent.mkdir(parents=True, exist_ok=True)
    model = BertForPreTraining(BertConfig.from_dict(config))
    torch.save({"model": model.state_dict(), "config": BertConfig.from_dict(config).to_dict(), "step": step}, path)


def fake_pretrain_run(pretrain_out, finished: bool = True, name: str = "run_260101_000000"):
    """A run_cpu_demo.sh folder: phase 1 20 steps (losses 9.0, 7.5; held-out accuracy 0.10 then 0.25), phase 2
    2 steps (steps 21-22), checkpoints/ckpt_22.pt."""
    run = pretrain_out / name
    (run / "checkpoints").mkdir(parents=True)
    heldout_shard(pretrain_out / "hdf5_heldout128" / "heldout.hdf5")
    base = {"train_batch_size": 32, "world_size": 1, "learning_rate": 0.01, "max_seq_length": 128,
            "eval_dir": str(pretrain_out / "hdf5_heldout128"), "max_eval_samples": 4, "config_file": "tiny.json",
            "parameters": 12345, "seed": 42, "precision": "fp32"}
    log_lines(run / "job.phase1.json", {**base, "max_steps": 20}, {10: 9.0, 20: 7.5},
              {10: (0.10, 8.0), 20: (0.25, 7.0)},
              {"phase_step": 20, "step": 20, "stopped_by_signal": None, "final_loss": 7.9, "e2e_train_time": 40.0,
               "training_sequences_per_second": 16.0})
    log_lines(run / "job.phase2.json", {**base, "max_steps": 2, "train_batch_size": 8, "max_seq_length": 512},
              {21: 7.2, 22: 7.0}, {},
              {"phase_step": 2, "step": 22, "stopped_by_signal": None, "final_loss": 7.1, "e2e_train_time": 5.0,
               "training_sequences_per_second": 3.2} if finished else None)
    fake_ckpt(run / "checkpoints" / "ckpt_20.pt", TINY_CONFIG, 20)
    if finished:
        fake_ckpt(run / "checkpoints" / "ckpt_22.pt", TINY_CONFIG, 22)
    return run


def fake_stability(path, task: str, scores: list[float], seeds: list[int] | None = None, lr: float = 2e-4,
                   epochs: float = 3.0, max_train: int | None = None, init: str = "fake"):
    seeds = seeds or list(range(1, len(scores) + 1))
    runs = []
    for seed, score in zip(seeds, scores):
        cmd = ["python", "run_glue.py", "--task_name", task, "--output_dir", str(path.parent / f"seed_{seed}"),
               "--seed", str(seed), "--num_train_epochs", str(epochs), "--train_batch_size", "32",
               "--learning_rate", str(lr), "--max_seq_length", "128"]
        if max_train is not None:
            cmd += ["--max_train_examples", str(max_train)]
        runs.append({"seed": seed, "score": score, "seconds": 10.0, "command": cmd})
    summary = {"date": "2026-01-01", "task": task, "metric": "f1" if task == "mrpc" else "acc",
               "init_checkpoint": str(init), "runs": runs, "aggregate": {}, "wall_seconds": 10.0 * len(scores)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


# Scores: MRPC pre-trained 0.84 ± 0.02 vs random at the majority F1 on every seed (beats: 0.0278 > 0.02);
# SST-2 pre-trained 0.72 ± 0.02 vs random 0.70 ± 0.04 (does not beat: 0.02 < 0.04).
SCORES = {("pretrained", "mrpc"): [0.84, 0.86, 0.82], ("random", "mrpc"): [MRPC_MAJORITY_F1] * 3,
          ("minilm", "mrpc"): [0.88, 0.90, 0.89], ("pretrained", "sst-2"): [0.70, 0.74, 0.72],
          ("random", "sst-2"): [0.70, 0.74, 0.66], ("minilm", "sst-2"): [0.86, 0.88, 0.87]}


def no_training(monkeypatch):
    """Any attempt to train (the studies' launcher subprocesses, bench.stability's seeds) fails the test."""
    import types

    from bench import stability

    def refuse(*a, **k):
        raise AssertionError(f"nothing should run here: {a} {k}")

    for module in (pretrain_study, scaling_study):
        monkeypatch.setattr(module, "subprocess", types.SimpleNamespace(run=refuse, Popen=refuse))
    monkeypatch.setattr(stability, "run_seeds", refuse)


# --------------------------------------------------------------------------------------------------------------
# bench/pretrain_study.py


def test_scripts_have_help_and_do_nothing_on_import():
    for module in ("bench.pretrain_study", "bench.scaling_study", "bench.results_page"):
        out = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                              "print(sorted(m for m in ('torch', 'matplotlib', 'h5py') if m in sys.modules))"],
                             capture_output=True, text=True, cwd=study_utils.REPO, check=True)
        assert out.stdout.strip() == "[]", f"{module} imports {out.stdout} at import time"
    for main in (pretrain_study.main, scaling_study.main, results_page.main):
        with pytest.raises(SystemExit) as e:
            main(["--help"])
        assert e.value.code == 0


def test_pretrain_study_aggregates_given_outputs(tmp_path, shared_data, monkeypatch, capsys):
    no_training(monkeypatch)
    pretrain_out = tmp_path / "pretrain_mini"
    fake_pretrain_run(pretrain_out)
    flags = []
    inits = {"pretrained": pretrain_out / "run_260101_000000" / "checkpoints" / "ckpt_22.pt",
             "random": tmp_path / "study" / "random_init" / "ckpt_0.pt", "minilm": "minilm"}
    for (model, task), scores in SCORES.items():
        path = fake_stability(tmp_path / "given" / f"{model}_{task}" / f"stability_{task}.json", task, scores,
                              epochs=1.0 if task == "sst-2" else 3.0, max_train=10000 if task == "sst-2" else None,
                              lr=1e-4 if model == "minilm" else 2e-4, init=inits[model])
        flags += ["--minilm_mrpc_json" if task == "mrpc" else "--minilm_sst2_json", str(path)] if model == "minilm" \
            else ["--stability_json", f"{model}:{task}={path}"]
    report = pretrain_study.main(["--out", str(tmp_path / "study"), "--pretrain_out", str(pretrain_out),
                                  "--seeds", "1,2,3", *flags])
    # Pre-training, read back from the logs
    pre = report["pretraining"]
    assert report["pretraining_reused"] is True
    assert pre["checkpoint"] == str(pretrain_out / "run_260101_000000" / "checkpoints" / "ckpt_22.pt")
    assert pre["heldout"]["accuracy"] == 0.25 and pre["heldout"]["step"] == 20
    assert pre["heldout"]["baseline"] == pytest.approx(4 / 6)
    assert pre["phase1"]["first_mlm_loss"] == 9.0 and pre["phase1"]["final_mlm_loss"] == 7.5
    assert pre["phase2"]["batch"] == 8 and pre["phase2"]["final_mlm_loss"] == 7.0
    assert pre["curves"] == {"phase1": [[10, 9.0], [20, 7.5]], "phase2": [[21, 7.2], [22, 7.0]]}
    # Downstream statistics, against hand-computed values
    res = report["finetuning"]["results"]
    assert res["mrpc"]["pretrained"]["mean"] == pytest.approx(0.84)
    assert res["mrpc"]["pretrained"]["std"] == pytest.approx(0.02)
    assert res["sst-2"]["random"]["mean"] == pytest.approx(0.70) and res["sst-2"]["random"]["std"] == pytest.approx(0.04)
    assert res["sst-2"]["minilm"]["min"] == 0.86 and res["sst-2"]["minilm"]["max"] == 0.88
    assert report["finetuning"]["baselines"] == pytest.approx({"mrpc": MRPC_MAJORITY_F1, "sst-2": SST2_MAJORITY_ACC})
    v = report["verdicts"]
    assert v["mrpc"]["difference"] == pytest.approx(0.84 - MRPC_MAJORITY_F1) and v["mrpc"]["spread"] == pytest.approx(0.02)
    assert v["mrpc"]["beats"] is True
    assert v["sst-2"]["difference"] == pytest.approx(0.02) and v["sst-2"]["spread"] == pytest.approx(0.04)
    assert v["sst-2"]["beats"] is False
    assert any("every seed of random scores exactly the majority-class" in n for n in report["notes"])
    assert all(s["reused"] and not s["warnings"] for s in report["finetuning"]["sources"].values())
    # The random initialisation: modeling.py's own init, seed 42, loadable as a ckpt_<step>.pt with vocab beside it
    random_dir = tmp_path / "study" / "random_init"
    assert {p.name for p in random_dir.iterdir()} == {"ckpt_0.pt", "bert_config.json", "vocab.txt"}
    from checkpoint_io import from_pretrained
    from modeling import BertConfig, BertForPreTraining, BertForSequenceClassification
    from utils import set_seed

    set_seed(42)
    expected = BertForPreTraining(BertConfig.from_dict(TINY_CONFIG)).state_dict()
    saved = torch.load(random_dir / "ckpt_0.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], expected[k]) for k in saved)
    model = from_pretrained(BertForSequenceClassification, random_dir / "ckpt_0.pt", log=None, num_labels=2)
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight,
                       expected["bert.encoder.layer.0.output.dense.weight"])
    # Files
    study = tmp_path / "study"
    assert json.loads((study / "pretrain_study.json").read_text())["verdicts"] == json.loads(json.dumps(v))
    md = (study / "pretrain_study.md").read_text()
    assert "| mrpc (f1) | 0.8122 | 0.8400 ± 0.0200 [0.8200, 0.8600] (3 seeds)" in md
    assert "- sst-2: pre-trained does NOT beat random initialisation" in md
    assert "**0.2500**" in md and "0.6667" in md
    for png in ("pretrain_loss.png", "pretrain_seeds.png"):
        assert (study / png).read_bytes()[:4] == b"\x89PNG"


def test_given_json_with_other_settings_is_used_with_warnings(tmp_path, shared_data, monkeypatch):
    no_training(monkeypatch)
    given = fake_stability(tmp_path / "m" / "stability_mrpc.json", "mrpc", [0.9, 0.8], seeds=[1, 2], lr=3e-5)
    report = pretrain_study.main(["--out", str(tmp_path / "study"), "--models", "minilm", "--tasks", "mrpc",
                                  "--seeds", "1,2,3", "--minilm_mrpc_json", str(given)])
    warnings = report["finetuning"]["sources"]["minilm_mrpc"]["warnings"]
    assert warnings == ["seeds [1, 2] instead of [1, 2, 3]", "--learning_rate 3e-05 instead of 0.0001"]
    assert report["finetuning"]["results"]["mrpc"]["minilm"]["mean"] == pytest.approx(0.85)
    assert report["pretraining"] is None and report["verdicts"] == {}


def test_unfinished_pretraining_is_refused(tmp_path, monkeypatch):
    no_training(monkeypatch)
    fake_pretrain_run(tmp_path / "pre", finished=False)
    with pytest.raises(SystemExit, match=r"run_260101_000000, is not finished \(phase 1 finished, phase 2 at step "
                                         r"22 of 2, no FINAL record yet\)"):
        pretrain_study.main(["--out", str(tmp_path / "study"), "--pretrain_out", str(tmp_path / "pre")])
