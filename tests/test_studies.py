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
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import no_training

from bench import (
    pretrain_study,
    pretrain_sweep,
    pretrain_vs_transformers,
    results_page,
    scaling_study,
    squad_acceptance,
    stability,
    study_utils,
)
from bench import pretrain_sweep as ps
from bench import pretrain_vs_transformers as vs
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.pretraining.validation import SpecialIds
from bert_recipe.tasks import squad, squad_metrics
from bert_recipe.training.dist_env import set_seed
from modeling import BertConfig, BertForPreTraining, BertForSequenceClassification

# MRPC dev: 408 pairs, 279 of them paraphrases, so predicting "paraphrase" everywhere scores F1 2*279/(279+408);
# SST-2 dev: 872 sentences, 444 positive, so always "positive" scores accuracy 444/872.
MRPC_MAJORITY_F1 = 558 / 687
SST2_MAJORITY_ACC = 444 / 872
TINY_CONFIG = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}


# --------------------------------------------------------------------------------------------------------------
# Fakes: what run_pretraining.py and bench.stability write, with numbers chosen here


def log_lines(path, params: dict, losses: dict, evals: dict, final: dict | None):
    records = [{"type": "LOG", "step": "PARAMETER", "data": params}]
    for step in sorted(set(losses) | set(evals)):
        if step in losses:
            records.append({"type": "LOG", "step": step, "data": {"mlm_loss": losses[step], "average_loss": 0.0}})
        if step in evals:
            records.append(
                {
                    "type": "LOG",
                    "step": step,
                    "data": {"eval_mlm_accuracy": evals[step][0], "eval_mlm_loss": evals[step][1]},
                }
            )
    if final is not None:
        records.append({"type": "LOG", "step": "FINAL", "data": final})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def heldout_shard(path):
    """4 samples of 8 tokens ([CLS] 101 first, [SEP] 102 last of the 7 real ones); the prediction slots with a
    position > 0 hold targets 7, 7, 9, 7, 11 and 7, all [MASK] (103) in the input but the second, which kept its 7:
    the commonest target of the [MASK]ed slots, 7, is 3 of their 5 (every slot counted, it would be 4 of 6). The
    5th sample (beyond max_eval_samples 4) would change that if it were counted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    positions = np.array([[1, 2, 0], [3, 0, 0], [1, 4, 5], [2, 0, 0], [1, 2, 3]], dtype=np.int32)
    ids = np.array([[7, 7, 0], [9, 0, 0], [7, 11, 7], [0, 0, 0], [9, 9, 9]], dtype=np.int32)
    positions[3, 0] = 0  # a sample with no masked slot at all
    input_ids = np.full((5, 8), 5, dtype=np.int32)
    input_ids[:, 0], input_ids[:, 6], input_ids[:, 7] = 101, 102, 0
    rows, slots = np.nonzero(positions > 0)
    input_ids[rows, positions[rows, slots]] = 103
    input_ids[0, 2] = 7  # the kept slot
    input_mask = (np.arange(8) < 7).astype(np.int8)[None].repeat(5, 0)
    with h5py.File(path, "w") as f:
        f["masked_lm_positions"], f["masked_lm_ids"] = positions, ids
        f["input_ids"], f["input_mask"] = input_ids, input_mask


def fake_ckpt(path, config: dict, step: int):

    path.parent.mkdir(parents=True, exist_ok=True)
    model = BertForPreTraining(BertConfig.from_dict(config))
    torch.save({"model": model.state_dict(), "config": BertConfig.from_dict(config).to_dict(), "step": step}, path)


def fake_pretrain_run(pretrain_out, finished: bool = True, name: str = "run_260101_000000"):
    """A run_cpu_demo.sh folder: phase 1 20 steps (losses 9.0, 7.5; held-out accuracy 0.10 then 0.25), phase 2
    2 steps (steps 21-22), checkpoints/ckpt_22.pt."""
    run = pretrain_out / name
    (run / "checkpoints").mkdir(parents=True)
    heldout_shard(pretrain_out / "hdf5_heldout128" / "heldout.hdf5")
    base = {
        "train_batch_size": 32,
        "world_size": 1,
        "learning_rate": 0.01,
        "max_seq_length": 128,
        "eval_dir": str(pretrain_out / "hdf5_heldout128"),
        "max_eval_samples": 4,
        "config_file": "tiny.json",
        "parameters": 12345,
        "seed": 42,
        "precision": "fp32",
        "optimizer": "nvlamb",
    }
    log_lines(
        run / "job.phase1.json",
        {**base, "max_steps": 20},
        {10: 9.0, 20: 7.5},
        {10: (0.10, 8.0), 20: (0.25, 7.0)},
        {
            "phase_step": 20,
            "step": 20,
            "stopped_by_signal": None,
            "final_loss": 7.9,
            "e2e_train_time": 40.0,
            "training_sequences_per_second": 16.0,
        },
    )
    log_lines(
        run / "job.phase2.json",
        {**base, "max_steps": 2, "train_batch_size": 8, "max_seq_length": 512},
        {21: 7.2, 22: 7.0},
        {},
        {
            "phase_step": 2,
            "step": 22,
            "stopped_by_signal": None,
            "final_loss": 7.1,
            "e2e_train_time": 5.0,
            "training_sequences_per_second": 3.2,
        }
        if finished
        else None,
    )
    fake_ckpt(run / "checkpoints" / "ckpt_20.pt", TINY_CONFIG, 20)
    if finished:
        fake_ckpt(run / "checkpoints" / "ckpt_22.pt", TINY_CONFIG, 22)
    return run


def fake_stability(
    path,
    task: str,
    scores: list[float],
    seeds: list[int] | None = None,
    lr: float = 2e-4,
    epochs: float = 3.0,
    max_train: int | None = None,
    init: str = "fake",
):
    seeds = seeds or list(range(1, len(scores) + 1))
    runs = []
    for seed, score in zip(seeds, scores):
        cmd = [
            "python",
            "run_glue.py",
            "--task_name",
            task,
            "--output_dir",
            str(path.parent / f"seed_{seed}"),
            "--seed",
            str(seed),
            "--num_train_epochs",
            str(epochs),
            "--train_batch_size",
            "32",
            "--learning_rate",
            str(lr),
            "--max_seq_length",
            "128",
        ]
        if max_train is not None:
            cmd += ["--max_train_examples", str(max_train)]
        runs.append({"seed": seed, "score": score, "seconds": 10.0, "command": cmd})
    summary = {
        "date": "2026-01-01",
        "task": task,
        "metric": "f1" if task == "mrpc" else "acc",
        "init_checkpoint": str(init),
        "runs": runs,
        "aggregate": {},
        "wall_seconds": 10.0 * len(scores),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


# Scores: MRPC pre-trained 0.84 ± 0.02 vs random at the majority F1 on every seed (beats: 0.0278 > 0.02);
# SST-2 pre-trained 0.72 ± 0.02 vs random 0.70 ± 0.04 (does not beat: 0.02 < 0.04).
SCORES = {
    ("pretrained", "mrpc"): [0.84, 0.86, 0.82],
    ("random", "mrpc"): [MRPC_MAJORITY_F1] * 3,
    ("minilm", "mrpc"): [0.88, 0.90, 0.89],
    ("pretrained", "sst-2"): [0.70, 0.74, 0.72],
    ("random", "sst-2"): [0.70, 0.74, 0.66],
    ("minilm", "sst-2"): [0.86, 0.88, 0.87],
}


# --------------------------------------------------------------------------------------------------------------
# bench/pretrain_study.py


def test_scripts_have_help_and_do_nothing_on_import():
    for module in ("bench.pretrain_study", "bench.scaling_study", "bench.results_page"):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys, {module}; print(sorted(m for m in ('torch', 'matplotlib', 'h5py') if m in sys.modules))",
            ],
            capture_output=True,
            text=True,
            cwd=study_utils.REPO,
            check=True,
        )
        assert out.stdout.strip() == "[]", f"{module} imports {out.stdout} at import time"
    for main in (pretrain_study.main, scaling_study.main, results_page.main):
        with pytest.raises(SystemExit) as e:
            main(["--help"])
        assert e.value.code == 0


def test_studies_refuse_to_start_without_matplotlib(tmp_path, monkeypatch):
    """The plots come last; a study without matplotlib must say so in one line before its first minute of work (a
    one-hour pre-training study once lost its report to the missing import at the very end)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    missing = tmp_path / "missing"
    calls = {
        "pretrain_study": (pretrain_study, ["--out", str(tmp_path / "a"), "--pretrain_run", str(missing)]),
        "scaling_study": (scaling_study, ["--out", str(tmp_path / "b"), "--shards", str(missing)]),
        "pretrain_sweep": (
            pretrain_sweep,
            ["--out", str(tmp_path / "c"), "--runs", "adamw:32:1e-3", "--data", str(missing)],
        ),
        "pretrain_vs_transformers": (pretrain_vs_transformers, ["--out", str(tmp_path / "d"), "--data", str(missing)]),
        "results_page": (results_page, ["--out", str(tmp_path / "e" / "RESULTS.md"), "--plots", str(tmp_path / "e")]),
    }
    for name, (module, argv) in calls.items():
        with pytest.raises(SystemExit) as exc:
            module.main(argv)
        said = str(exc.value.code)
        assert said.startswith(name) and "its plots need matplotlib" in said and "setup_cpu.sh --test" in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was started or written


def test_pretrain_study_aggregates_given_outputs(tmp_path, shared_data, monkeypatch, capsys):
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    pretrain_out = tmp_path / "pretrain_mini"
    fake_pretrain_run(pretrain_out)
    flags = []
    inits = {
        "pretrained": pretrain_out / "run_260101_000000" / "checkpoints" / "ckpt_22.pt",
        "random": tmp_path / "study" / "random_init" / "ckpt_0.pt",
        "minilm": "minilm",
    }
    for (model, task), scores in SCORES.items():
        path = fake_stability(
            tmp_path / "given" / f"{model}_{task}" / f"stability_{task}.json",
            task,
            scores,
            epochs=1.0 if task == "sst-2" else 3.0,
            max_train=10000 if task == "sst-2" else None,
            lr=1e-4 if model == "minilm" else 2e-4,
            init=inits[model],
        )
        flags += (
            ["--minilm_mrpc_json" if task == "mrpc" else "--minilm_sst2_json", str(path)]
            if model == "minilm"
            else ["--stability_json", f"{model}:{task}={path}"]
        )
    argv = ["--out", str(tmp_path / "study"), "--pretrain_out", str(pretrain_out), "--seeds", "1,2,3", *flags]
    # this run's log names no vocabulary (runs from before run_cpu_demo.sh passed its own): --vocab is asked for
    with pytest.raises(SystemExit, match="names no vocabulary that exists .None.: give --vocab"):
        pretrain_study.main(argv)
    report = pretrain_study.main([*argv, "--vocab", str(study_utils.VOCAB)])
    # Pre-training, read back from the logs
    pre = report["pretraining"]
    assert report["pretraining_reused"] is True
    mini = study_utils.REPO / "configs" / "bert-mini.json"
    assert report["pretraining_warnings"] == [
        "phase 1 steps 20 (flag: 1500)",
        "phase 2 steps 2 (flag: 30)",
        f"config tiny.json (flag: {mini})",
    ]
    assert pre["checkpoint"] == str(pretrain_out / "run_260101_000000" / "checkpoints" / "ckpt_22.pt")
    assert pre["heldout"]["accuracy"] == 0.25 and pre["heldout"]["step"] == 20
    assert pre["heldout"]["baseline"] == pytest.approx(3 / 5)
    assert pre["phase1"]["first_mlm_loss"] == 9.0 and pre["phase1"]["final_mlm_loss"] == 7.5
    assert pre["phase2"]["batch"] == 8 and pre["phase2"]["final_mlm_loss"] == 7.0
    assert pre["curves"] == {"phase1": [[10, 9.0], [20, 7.5]], "phase2": [[21, 7.2], [22, 7.0]]}
    # Downstream statistics, against hand-computed values
    res = report["finetuning"]["results"]
    assert res["mrpc"]["pretrained"]["mean"] == pytest.approx(0.84)
    assert res["mrpc"]["pretrained"]["std"] == pytest.approx(0.02)
    assert res["sst-2"]["random"]["mean"] == pytest.approx(0.70)
    assert res["sst-2"]["random"]["std"] == pytest.approx(0.04)
    assert res["sst-2"]["minilm"]["min"] == 0.86 and res["sst-2"]["minilm"]["max"] == 0.88
    assert report["finetuning"]["baselines"] == pytest.approx({"mrpc": MRPC_MAJORITY_F1, "sst-2": SST2_MAJORITY_ACC})
    v = report["verdicts"]
    assert v["mrpc"]["difference"] == pytest.approx(0.84 - MRPC_MAJORITY_F1)
    assert v["mrpc"]["spread"] == pytest.approx(0.02)
    assert v["mrpc"]["beats"] is True
    assert v["sst-2"]["difference"] == pytest.approx(0.02) and v["sst-2"]["spread"] == pytest.approx(0.04)
    assert v["sst-2"]["beats"] is False
    assert any("every seed of random scores exactly the majority-class" in n for n in report["notes"])
    assert all(s["reused"] and not s["warnings"] for s in report["finetuning"]["sources"].values())
    # The random initialisation: modeling.py's own init, seed 42, loadable as a ckpt_<step>.pt with vocab beside it
    random_dir = tmp_path / "study" / "random_init"
    assert {p.name for p in random_dir.iterdir()} == {"ckpt_0.pt", "bert_config.json", "vocab.txt"}

    set_seed(42)
    expected = BertForPreTraining(BertConfig.from_dict(TINY_CONFIG)).state_dict()
    saved = torch.load(random_dir / "ckpt_0.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], expected[k]) for k in saved)
    model = from_pretrained(BertForSequenceClassification, random_dir / "ckpt_0.pt", log=None, num_labels=2)
    assert torch.equal(
        model.bert.encoder.layer[0].output.dense.weight, expected["bert.encoder.layer.0.output.dense.weight"]
    )
    # Files
    study = tmp_path / "study"
    assert json.loads((study / "pretrain_study.json").read_text())["verdicts"] == json.loads(json.dumps(v))
    md = (study / "pretrain_study.md").read_text()
    assert "| mrpc (f1) | 0.8122 | 0.8400 ± 0.0200 [0.8200, 0.8600] (3 seeds)" in md
    assert "- sst-2: pre-trained does NOT beat random initialisation" in md
    assert "**0.2500**" in md and "0.6000" in md
    for png in ("pretrain_loss.png", "pretrain_seeds.png"):
        assert (study / png).read_bytes()[:4] == b"\x89PNG"


def test_reused_run_config_is_compared_by_content_not_by_name(tmp_path):
    """run_cpu_demo.sh writes <out>/bert_config.json from --config with the vocabulary's size: that is the same
    model, so no warning; another shape is named key by key; an unreadable config falls back to the file name."""
    flag = tmp_path / "bert-mini.json"
    flag.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 30522}))
    same = tmp_path / "run" / "bert_config.json"
    same.parent.mkdir()
    same.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 8000}))
    assert pretrain_study.config_differences(str(same), flag) == []
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**TINY_CONFIG, "hidden_size": 64, "vocab_size": 8000}))
    assert pretrain_study.config_differences(str(other), flag) == [
        f"config {other}: hidden_size 64 (flag bert-mini.json: 32)"
    ]
    assert pretrain_study.config_differences(str(tmp_path / "gone" / "bert-mini.json"), flag) == []
    assert pretrain_study.config_differences("tiny.json", flag) == [f"config tiny.json (flag: {flag})"]


def test_given_json_with_other_settings_is_used_with_warnings(tmp_path, shared_data, monkeypatch):
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    given = fake_stability(tmp_path / "m" / "stability_mrpc.json", "mrpc", [0.9, 0.8], seeds=[1, 2], lr=3e-5)
    report = pretrain_study.main(
        [
            "--out",
            str(tmp_path / "study"),
            "--models",
            "minilm",
            "--tasks",
            "mrpc",
            "--seeds",
            "1,2,3",
            "--minilm_mrpc_json",
            str(given),
        ]
    )
    warnings = report["finetuning"]["sources"]["minilm_mrpc"]["warnings"]
    assert warnings == ["seeds [1, 2] instead of [1, 2, 3]", "--learning_rate 3e-05 instead of 0.0001"]
    assert report["finetuning"]["results"]["mrpc"]["minilm"]["mean"] == pytest.approx(0.85)
    assert report["pretraining"] is None and report["verdicts"] == {}


def test_unfinished_pretraining_is_refused(tmp_path, shared_data, monkeypatch):  # the default --vocab is shared
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    fake_pretrain_run(tmp_path / "pre", finished=False)
    with pytest.raises(
        SystemExit,
        match=r"run_260101_000000, is not finished \(phase 1 finished, phase 2 at step "
        r"22 of 2, no FINAL record yet\)",
    ):
        pretrain_study.main(["--out", str(tmp_path / "study"), "--pretrain_out", str(tmp_path / "pre")])


# --------------------------------------------------------------------------------------------------------------
# bench/pretrain_study.py for real, at the tiniest size, then again reusing everything


def tiny_corpus(path):
    """The first 8 articles of WikiText-2 valid (7 to train on, 1 held out): ~200 sequences of 128 tokens."""
    text = (study_utils.DATA / "wikitext-2" / "valid.txt").read_text()
    starts = [
        i
        for i, line in enumerate(text.splitlines(keepends=True))
        if line.startswith(" = ") and not line.startswith(" = = ")
    ]
    path.write_text("".join(text.splitlines(keepends=True)[: starts[8]]))
    return path


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, shared_data):
    """pretrain_study end to end: run_cpu_demo.sh (3 + 1 steps of a 1-layer model), the random init, MRPC on 16
    examples for 1 step, seed 1, pre-trained and random; MiniLM from a given JSON."""
    root = tmp_path_factory.mktemp("tiny_study")
    (root / "tiny.json").write_text(json.dumps(TINY_CONFIG))
    minilm = fake_stability(root / "minilm" / "stability_mrpc.json", "mrpc", [0.75], init="minilm")
    argv = [
        "--out",
        str(root / "study"),
        "--config",
        str(root / "tiny.json"),
        "--corpus",
        str(tiny_corpus(root / "corpus.txt")),
        "--phase1_steps",
        "3",
        "--phase2_steps",
        "1",
        "--dupe_factor",
        "1",
        "--batch",
        "4",
        "--optimizer",
        "adamw",
        "--lr",
        "1e-3",
        "--vocab_size",
        "1000",
        "--tasks",
        "mrpc",
        "--seeds",
        "1",
        "--max_train_examples",
        "16",
        "--max_eval_examples",
        "16",
        "--max_steps",
        "1",
        "--max_seq_length",
        "32",
        "--small_batch",
        "8",
        "--minilm_mrpc_json",
        str(minilm),
    ]
    return root, argv, pretrain_study.main(argv)


def test_pretrain_study_runs_end_to_end(tiny_study):
    root, _, report = tiny_study
    study = root / "study"
    pre = report["pretraining"]
    assert report["pretraining_reused"] is False and pre["checkpoint"].endswith("checkpoints/ckpt_4.pt")
    assert report["pretraining_command"][:2] == ["bash", str(study_utils.REPO / "scripts" / "run_cpu_demo.sh")]
    run = next(p for p in (study / "pretrain").glob("run_*") if p.is_dir())
    phase1 = [json.loads(line) for line in (run / "bert_cpu_demo.phase1.json").read_text().splitlines()]
    last_eval = [r for r in phase1 if "eval_mlm_accuracy" in r["data"]][-1]
    assert pre["heldout"]["accuracy"] == last_eval["data"]["eval_mlm_accuracy"] and pre["heldout"]["step"] == 3
    # our baseline and the one run_cpu_demo.sh's own summary printed (3 decimals) agree
    printed = (study / "pretrain" / "cpu_demo_output.log").read_text().split("most frequent masked token scores ")[1]
    assert f"{pre['heldout']['baseline']:.3f}" == printed.split()[0]
    assert pre["phase1"]["steps"] == 3 and pre["phase2"]["steps"] == 1 and pre["phase2"]["max_seq_length"] == 512
    # --optimizer and --lr reach run_pretraining.py through run_cpu_demo.sh (the preset's own is NVLAMB 1e-2)
    params = next(r["data"] for r in phase1 if r["step"] == "PARAMETER")
    assert (params["optimizer"], params["learning_rate"]) == ("adamw", 1e-3)
    # each seed's score is its own results.json's F1; the random model started from ckpt_0.pt beside its vocab
    for model in ("pretrained", "random"):
        results = json.loads((study / f"{model}_mrpc" / "seed_1" / "results.json").read_text())
        assert report["finetuning"]["results"]["mrpc"][model]["scores"] == [results["eval"]["dev"]["f1"]]
        assert report["finetuning"]["per_seed"]["mrpc"][model][0]["dev"]["acc"] == results["eval"]["dev"]["acc"]
    assert results["init_checkpoint"] == str(study / "random_init" / "ckpt_0.pt")
    # no --vocab: the demo learned a 1,000-piece vocabulary, and the random model and fine-tuning use that one
    learned = (study / "pretrain" / "vocab.txt").read_text(encoding="utf-8")
    assert len(learned.splitlines()) == 1000 and (study / "random_init" / "vocab.txt").read_text() == learned
    assert report["finetuning"]["results"]["mrpc"]["minilm"]["mean"] == 0.75
    assert set(report["verdicts"]) == {"mrpc"}
    assert (study / "pretrain_loss.png").is_file() and (study / "pretrain_study.md").is_file()


def test_pretrain_study_second_call_reuses_everything(tiny_study, monkeypatch):
    root, argv, first = tiny_study
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    again = pretrain_study.main(argv)
    assert again["pretraining_reused"] is True and again["pretraining"] == first["pretraining"]
    assert again["finetuning"]["results"] == first["finetuning"]["results"]
    assert all(s["reused"] for s in again["finetuning"]["sources"].values())
    # a reused pre-training made with another optimizer than the flag's is named in a warning
    other = pretrain_study.main([*argv, "--optimizer", "nvlamb"])
    assert "optimizer adamw (flag: nvlamb)" in other["pretraining_warnings"]
    # other fine-tuning settings are not reused: bench.stability is asked to run (and refused here)
    with pytest.raises(AssertionError, match="nothing should run here"):
        pretrain_study.main([*argv, "--small_lr", "1e-3"])
    with pytest.raises(AssertionError, match="nothing should run here"):  # nor another fine-tuning dropout
        pretrain_study.main([*argv, "--finetune_dropout", "0.1"])


def test_pretrain_study_fine_tunes_with_the_dropout_asked_for(tiny_study, tmp_path):
    """--finetune_dropout 0.25: the pre-trained and random models fine-tune through a copy of the checkpoint's
    config in which only the two dropouts are 0.25, given to every run_glue.py command as --config_file; a second
    call with the same flag reuses those runs. The fine-tunings run in this process (--glue_in_process: the same
    commands, results files and stability JSONs; tiny_study runs them as child processes)."""
    root, argv, first = tiny_study
    argv = [a.replace(str(root / "study"), str(tmp_path / "study")) for a in argv]
    argv += [
        "--pretrain_run",
        str(next(p for p in (root / "study" / "pretrain").glob("run_*") if p.is_dir())),
        "--vocab",
        str(root / "study" / "pretrain" / "vocab.txt"),
        "--finetune_dropout",
        "0.25",
        "--glue_in_process",
    ]
    report = pretrain_study.main(argv)
    config = tmp_path / "study" / "finetune_config_dropout0.25.json"
    written = json.loads(config.read_text())
    inside = torch.load(first["pretraining"]["checkpoint"], weights_only=True)["config"]
    assert inside["hidden_dropout_prob"] != 0.25 and inside["attention_probs_dropout_prob"] != 0.25
    assert written == {**inside, "hidden_dropout_prob": 0.25, "attention_probs_dropout_prob": 0.25}
    for model in ("pretrained", "random"):
        summary = json.loads((tmp_path / "study" / f"{model}_mrpc" / "stability_mrpc.json").read_text())
        command = summary["runs"][0]["command"]
        assert command[command.index("--config_file") + 1] == str(config)
        assert report["finetuning"]["model_settings"][model]["config_file"] == str(config)
    assert report["finetuning"]["dropout"] == 0.25
    assert "; dropout 0.25 in fine-tuning" in (tmp_path / "study" / "pretrain_study.md").read_text()
    again = pretrain_study.main(argv)
    assert all(s["reused"] for s in again["finetuning"]["sources"].values())


# --------------------------------------------------------------------------------------------------------------
# bench/scaling_study.py


def test_scaling_runs_are_the_same_but_for_processes_and_lr(tmp_path):
    ns = type(
        "Args",
        (),
        {
            "processes": 4,
            "lr": 1e-2,
            "batch": 32,
            "runs": ["A", "B", "C"],
            "precision": "auto",
            "warmup": 0.05,
            "steps": 300,
            "seed": 42,
            "config": tmp_path / "c.json",
        },
    )()
    specs = scaling_study.run_specs(ns)
    assert [(s["processes"], s["lr"], s["global_batch"]) for s in specs.values()] == [
        (1, 1e-2, 32),
        (4, 1e-2, 128),
        (4, 2e-2, 128),
    ]
    commands = {k: scaling_study.launcher_command(ns, s, tmp_path) for k, s in specs.items()}
    positional = {k: c[2:] for k, c in commands.items()}
    assert all(len(p) == 25 for p in positional.values())
    assert [(p[0], p[1], p[3], p[5]) for p in positional.values()] == [
        ("32", "0.01", "1", "300"),
        ("32", "0.01", "4", "300"),
        ("32", "0.02", "4", "300"),
    ]
    differing = {i for i in range(25) if len({p[i] for p in positional.values()}) > 1}
    assert differing == {1, 3}  # learning rate and process count: nothing else


def fake_scaling(out, config, shards):
    """Finished runs A (1 x 32, lr 0.01), B (4 x 32, lr 0.01), C (4 x 32, lr 0.02), 20 steps, and their SST-2
    stability JSONs: A 0.81 ± 0.01, B 0.815 ± 0.01 (+0.005: outside 0.1 point, inside the spread),
    C 0.84 ± 0.01 (+0.03: outside both)."""
    heldout_shard(shards / "hdf5_heldout128" / "heldout.hdf5")
    (shards / "hdf5_seq128").mkdir(parents=True)
    with h5py.File(shards / "hdf5_seq128" / "train.hdf5", "w") as f:  # 1280 training sequences
        f["input_ids"] = np.zeros((1280, 4), dtype=np.int32)
    scores = {"A": [0.80, 0.82, 0.81], "B": [0.815, 0.825, 0.805], "C": [0.83, 0.85, 0.84]}
    for label, procs, lr, acc in (("A", 1, 0.01, 0.20), ("B", 4, 0.01, 0.22), ("C", 4, 0.02, 0.24)):
        run = out / f"run_{label}"
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "ckpt_20.pt").write_bytes(b"")
        log_lines(
            run / "scaling.phase1.json",
            {
                "train_batch_size": 32,
                "world_size": procs,
                "max_steps": 20,
                "seed": 42,
                "warmup_proportion": 0.05,
                "learning_rate": lr,
                "config_file": str(config),
            },
            {10: 8.0, 20: 7.0 - procs / 10},
            {20: (acc, 6.0)},
            {
                "phase_step": 20,
                "step": 20,
                "stopped_by_signal": None,
                "final_loss": 7.5,
                "e2e_train_time": 10.0 * procs,
                "training_sequences_per_second": 64.0,
            },
        )
        (run / "wall.json").write_text(json.dumps({"wall_seconds": 11.0 * procs}))
        fake_stability(
            out / f"glue_{label}" / "stability_sst-2.json",
            "sst-2",
            scores[label],
            epochs=1.0,
            max_train=10000,
            init=run / "checkpoints" / "ckpt_20.pt",
        )


def test_scaling_study_aggregates_existing_runs(tmp_path, shared_data, monkeypatch):
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    config = tmp_path / "small.json"
    config.write_text(json.dumps(TINY_CONFIG))
    fake_scaling(tmp_path / "out", config, tmp_path / "shards")
    report = scaling_study.main(
        [
            "--out",
            str(tmp_path / "out"),
            "--shards",
            str(tmp_path / "shards"),
            "--config",
            str(config),
            "--steps",
            "20",
            "--max_eval_samples",
            "4",
        ]
    )
    runs = report["runs"]
    assert all(r["reused"] for r in runs.values())
    assert [runs[k]["heldout_accuracy"] for k in "ABC"] == [0.20, 0.22, 0.24]
    assert [runs[k]["final_mlm_loss"] for k in "ABC"] == pytest.approx([6.9, 6.6, 6.6])
    assert [runs[k]["wall_seconds"] for k in "ABC"] == [11.0, 44.0, 44.0]
    assert [runs[k]["epochs"] for k in "ABC"] == [0.5, 2.0, 2.0]  # 20 steps x 32 or 128 over 1280 sequences
    assert report["heldout_baseline"] == pytest.approx(3 / 5)
    assert report["majority_baseline"] == pytest.approx(SST2_MAJORITY_ACC)
    assert runs["B"]["downstream"]["mean"] == pytest.approx(0.815)
    assert runs["B"]["downstream"]["std"] == pytest.approx(0.01)
    b, c = report["comparisons"]["B vs A"], report["comparisons"]["C vs A"]
    assert b["difference"] == pytest.approx(0.005) and b["spread"] == pytest.approx(0.01)
    assert (b["within_0.1_point"], b["within_seed_spread"]) == (False, True)
    assert c["difference"] == pytest.approx(0.03) and (c["within_0.1_point"], c["within_seed_spread"]) == (False, False)
    md = (tmp_path / "out" / "scaling_study.md").read_text()
    assert (
        "| B (4 processes, same learning rate) | 4 x 32 = 128 | 0.01 | 2560 (2.00) | 6.600 | 0.2200 | "
        "0.8150 ± 0.0100 | 44 |"
    ) in md
    assert (tmp_path / "out" / "scaling_loss.png").is_file()
    # a run folder with other settings is never silently reused or replaced
    with pytest.raises(SystemExit, match="not reusable .*learning_rate 0.01 instead of 0.03"):
        scaling_study.main(
            [
                "--out",
                str(tmp_path / "out"),
                "--shards",
                str(tmp_path / "shards"),
                "--config",
                str(config),
                "--steps",
                "20",
                "--lr",
                "0.03",
                "--runs",
                "A",
            ]
        )


def test_scaling_study_runs_for_real(tiny_study, monkeypatch):
    """Runs A (1 process) and C (2 gloo processes, lr x sqrt 2) for 2 steps on shards the study builds from the
    tiny study's corpus; the fine-tuning is a stand-in that checks each checkpoint exists and returns scores chosen
    here."""
    root, _, _ = tiny_study
    scores = {"run_A": [0.70, 0.72], "run_C": [0.7005, 0.7205]}

    def fake_seeds(args):
        run = args.init_checkpoint.parent.parent.name
        assert args.init_checkpoint.is_file() and args.init_checkpoint.name == "ckpt_2.pt"
        return [
            {
                "seed": s,
                "score": scores[run][i],
                "seconds": 0.0,
                "command": stability.glue_command(args, s, args.out / f"seed_{s}"),
            }
            for i, s in enumerate(args.seeds)
        ]

    monkeypatch.setattr(stability, "run_seeds", fake_seeds)
    argv = [
        "--out",
        str(root / "scaling"),
        "--corpus",
        str(root / "corpus.txt"),
        "--dupe_factor",
        "1",
        "--config",
        str(root / "tiny.json"),
        "--batch",
        "4",
        "--steps",
        "2",
        "--processes",
        "2",
        "--runs",
        "A,C",
        "--eval_steps",
        "1",
        "--max_eval_samples",
        "8",
        "--log_freq",
        "1",
        "--glue_task",
        "mrpc",
        "--glue_seeds",
        "1,2",
    ]
    report = scaling_study.main(argv)
    a, c = report["runs"]["A"], report["runs"]["C"]
    params = {
        k: study_utils.phase_summary(root / "scaling" / f"run_{k}" / "scaling.phase1.json")["params"] for k in "AC"
    }
    assert (params["A"]["world_size"], params["C"]["world_size"]) == (1, 2)
    assert params["C"]["learning_rate"] == pytest.approx(1e-2 * math.sqrt(2)) and params["A"]["learning_rate"] == 1e-2
    assert a["heldout_accuracy"] is not None and len(a["losses"]) == 2 and [e[0] for e in c["evals"]] == [1, 2]
    cmp = report["comparisons"]["C vs A"]
    assert cmp["difference"] == pytest.approx(0.0005) and cmp["within_0.1_point"] and cmp["within_seed_spread"]
    assert cmp["spread"] == pytest.approx(statistics.stdev([0.70, 0.72]))
    # again: both runs and both fine-tunings are reused
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    again = scaling_study.main(argv)
    assert all(r["reused"] for r in again["runs"].values()) and again["comparisons"] == report["comparisons"]
    assert again["runs"]["C"]["wall_seconds"] == c["wall_seconds"]


# --------------------------------------------------------------------------------------------------------------
# bench/results_page.py


def test_results_page_says_not_run_for_absent_studies(tmp_path):
    text = results_page.main(["--studies", str(tmp_path / "none"), "--out", str(tmp_path / "RESULTS.md")])
    assert text.count("Not run: no `") == 6 and text.count("| not run |") == 6
    assert (tmp_path / "RESULTS.md").read_text() == text


def test_results_page_renders_linear_probes(tmp_path):
    """Each --linear_probe report becomes its own table: every checkpoint's two dev accuracies and chosen Cs, the
    majority class, the layer and the command, in the file's order."""
    reports = []
    for layer, acc in ((0, 0.664), (-1, 0.633)):
        report = {
            "date": "2026-11-27 12:00",
            "command": ["python", "-m", "bench.linear_probe", "--checkpoint", "pretrained=p.pt", "--layer", str(layer)],
            "task": "sst-2",
            "layer": layer,
            "train_examples": 20000,
            "dev_examples": 872,
            "majority": 0.5092,
            "results": {
                "pretrained": {"cls": {"dev_accuracy": acc, "C": 0.1}, "mean": {"dev_accuracy": 0.6445, "C": 0.01}}
            },
            "wall_seconds": 12.5,
        }
        reports.append(tmp_path / f"probe{layer}.json")
        reports[-1].write_text(json.dumps(report))
    text = results_page.main(
        [
            "--studies",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "RESULTS.md"),
            "--linear_probe",
            str(reports[0]),
            "--linear_probe",
            str(reports[1]),
        ]
    )
    section = text.split("## Frozen-feature linear probes (bench.linear_probe)")[1]
    assert section.index("| pretrained | 0.6640 | 0.6445 | 0.1, 0.01 |") < section.index(
        "| pretrained | 0.6330 | 0.6445 | 0.1, 0.01 |"
    )
    assert section.count("| majority class | 0.5092 | 0.5092 | |") == 2
    assert "SST-2, layer 0, 20000 training and 872 dev sentences" in section and "SST-2, layer -1," in section
    assert "`python -m bench.linear_probe --checkpoint pretrained=p.pt --layer 0`" in section


def test_results_page_renders_the_studies(tmp_path, shared_data, monkeypatch):
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    studies = tmp_path / "studies"
    fake_stability(
        studies / "minilm_mrpc" / "stability_mrpc.json", "mrpc", [0.88, 0.90, 0.89], seeds=[1, 2, 3], lr=1e-4
    )
    fake_pretrain_run(tmp_path / "pretrain_mini")
    flags = []
    for (model, task), scores in SCORES.items():
        if task == "mrpc":
            path = fake_stability(tmp_path / "given" / model / "stability_mrpc.json", task, scores)
            flags += ["--stability_json", f"{model}:mrpc={path}"]
    pretrain_study.main(
        [
            "--out",
            str(studies / "pretrain"),
            "--pretrain_out",
            str(tmp_path / "pretrain_mini"),
            "--tasks",
            "mrpc",
            "--seeds",
            "1,2,3",
            "--vocab",
            str(study_utils.VOCAB),
            *flags,
        ]
    )
    config = tmp_path / "small.json"
    config.write_text(json.dumps(TINY_CONFIG))
    fake_scaling(studies / "scaling", config, tmp_path / "shards")
    scaling_study.main(
        [
            "--out",
            str(studies / "scaling"),
            "--shards",
            str(tmp_path / "shards"),
            "--config",
            str(config),
            "--steps",
            "20",
            "--max_eval_samples",
            "4",
        ]
    )
    page = tmp_path / "bench" / "RESULTS.md"
    text = results_page.main(["--studies", str(studies), "--out", str(page)])
    # NVIDIA's format: each seed, then mean and std, in percent
    assert "| Model (F1, %) | seed #1 | seed #2 | seed #3 | mean | std |" in text
    assert "| all-MiniLM-L6-v2, MRPC | 88.00 | 90.00 | 89.00 | 89.00 | 1.00 |" in text
    assert "| pretrained | 84.00 | 86.00 | 82.00 | 84.00 | 2.00 |" in text
    assert "| run C | 83.00 | 85.00 | 84.00 | 84.00 | 1.00 |" in text
    assert text.count("Not run: no `") == 3 and "minilm_sst2/stability_sst-2.json" in text  # SST-2 MiniLM absent
    assert "- mrpc: pre-trained beats random initialisation by more than the seed spread" in text
    assert "- B vs A: downstream difference +0.0050 (NOT within 0.1 point; within the seed spread 0.0100)" in text
    for png in ("stability_minilm.png", "pretrain_loss.png", "pretrain_seeds.png", "scaling_loss.png"):
        assert (page.parent / "results" / png).read_bytes()[:4] == b"\x89PNG" and f"](results/{png})" in text
    # Two pre-training studies (two budgets): a section each, with plots of their own.
    study = studies / "pretrain" / "pretrain_study.json"
    both = results_page.main(
        ["--studies", str(studies), "--out", str(page), "--pretrain", str(study), "--pretrain", str(study)]
    )
    assert both.count("## Pre-train, then fine-tune") == 2 and both.count(f"From `{study}`") == 2
    for png in ("pretrain_loss.png", "pretrain2_loss.png", "pretrain2_seeds.png"):
        assert (page.parent / "results" / png).read_bytes()[:4] == b"\x89PNG" and f"](results/{png})" in both


# --------------------------------------------------------------------------------------------------------------
# The context probe: does the pre-trained model read the context?

CLS, SEP, MASK = 101, 102, 103  # bert-base-uncased's ids


def probe_shards(root):
    """Hand-made shards (S = 6). Training, original tokens: [CLS] a b a b [SEP] (the slot at 2, b, masked) and
    [CLS] a c d [SEP]. Unigram over ordinary tokens: a (3 of 7). Bigram (the token after): [CLS] -> a, a -> b (2
    against c 1), b -> a, c -> d. Previous+next -> between: ([CLS], b) -> a, (a, a) -> b, (b, b) -> a, (a, [SEP])
    -> b, ([CLS], c) -> a, (a, d) -> c, (c, [SEP]) -> d.
    Held-out [MASK]ed slots, targets a, d, b, c:
      [CLS] M c M b [SEP]: a between [CLS] and c (unigram, bigram, previous+next right); d between c and b
                           (bigram right; (c, b) unseen: previous+next backs off to the bigram, right)
      [CLS] a M [SEP]:     b between a and [SEP] (bigram, previous+next right)
      [CLS] a M d [SEP]:   c between a and d (bigram says b: wrong; previous+next right)
    So unigram 1/4, bigram 3/4, previous+next 4/4. A last slot holds a random token (not [MASK]): not scored."""
    a, b, c, d = 2000, 2001, 2002, 2003

    def shard(path, input_ids, input_mask, positions, ids):
        path.parent.mkdir(parents=True, exist_ok=True)
        n = len(input_ids)
        with h5py.File(path, "w") as f:
            f["input_ids"], f["input_mask"] = np.array(input_ids, np.int32), np.array(input_mask, np.int8)
            f["segment_ids"] = np.zeros((n, 6), np.int8)
            f["masked_lm_positions"], f["masked_lm_ids"] = np.array(positions, np.int32), np.array(ids, np.int32)
            f["next_sentence_labels"] = np.zeros(n, np.int8)

    shard(
        root / "train" / "t.hdf5",
        [[CLS, a, MASK, a, b, SEP], [CLS, a, c, d, SEP, 0]],
        [[1] * 6, [1, 1, 1, 1, 1, 0]],
        [[2, 0, 0], [0, 0, 0]],
        [[b, 0, 0], [0, 0, 0]],
    )
    shard(
        root / "heldout" / "h.hdf5",
        [[CLS, MASK, c, MASK, b, SEP], [CLS, a, MASK, SEP, 0, 0], [CLS, a, MASK, d, SEP, 0], [CLS, d, a, SEP, 0, 0]],
        [[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]],
        [[1, 3, 0], [2, 0, 0], [2, 0, 0], [1, 0, 0]],
        [[a, d, 0], [b, 0, 0], [c, 0, 0], [b, 0, 0]],
    )
    return root / "train", root / "heldout"


def test_count_models_score_the_heldout_mask_slots_as_written_out(tmp_path):

    train, heldout = probe_shards(tmp_path)
    got = pretrain_study.count_model_accuracies(
        study_utils.read_shards(train), study_utils.read_shards(heldout), SpecialIds(CLS, SEP, MASK)
    )
    assert got == {"unigram": pytest.approx(1 / 4), "bigram": pytest.approx(3 / 4), "previous_next": 1.0, "slots": 4}


def test_context_probe_runs_a_checkpoint(tmp_path, uncased_vocab):
    train, heldout = probe_shards(tmp_path)
    fake_ckpt(tmp_path / "ckpt_1.pt", TINY_CONFIG, 1)
    (tmp_path / "tiny.json").write_text(json.dumps(TINY_CONFIG))
    got = pretrain_study.context_probe(
        tmp_path / "ckpt_1.pt", tmp_path / "tiny.json", uncased_vocab, str(train), str(heldout), 0
    )
    assert got["previous_next"] == 1.0 and got["slots"] == 4
    quarters = (0.0, 0.25, 0.5, 0.75, 1.0)
    assert got["model"] in quarters and got["model_without_context"] in quarters
    assert got["context_gain"] == pytest.approx(got["model"] - got["model_without_context"])


def test_reused_run_is_compared_by_its_global_batch(tmp_path):
    """A run of 2 processes x 16 matches --batch 16 --processes 2, not --batch 16 alone."""
    params = {
        "max_steps": 20,
        "train_batch_size": 16,
        "world_size": 2,
        "learning_rate": 0.003,
        "config_file": "bert-mini.json",
        "optimizer": "nvlamb",
    }
    state = {"phase1": {"params": params}, "phase2": {"params": {"max_steps": 2}}}
    args = type(
        "Args",
        (),
        {
            "phase1_steps": 20,
            "phase2_steps": 2,
            "batch": 16,
            "processes": 2,
            "lr": "3e-3",
            "optimizer": "nvlamb",
            "config": Path("configs/bert-mini.json"),
        },
    )
    assert pretrain_study.reuse_differences(state, args) == []
    args.processes = 1
    assert pretrain_study.reuse_differences(state, args) == ["phase 1 global batch 32 (flag: 16)"]
    args.processes, args.optimizer = 2, "adamw"
    assert pretrain_study.reuse_differences(state, args) == ["optimizer nvlamb (flag: adamw)"]


# --------------------------------------------------------------------------------------------------------------
# The pre-training sweep and the side-by-side with transformers (issue 27), on tiny shards


def tiny_bertprep_layout(root: Path) -> tuple[Path, Path, Path]:
    """training/ and test/ shards as data/bertPrep.py lays them out (conftest's tiny random shards, ids < 100),
    a 100-token vocabulary whose [CLS]/[SEP]/[MASK] are conftest's, and a 2-layer config without dropout."""
    from helpers import make_shards, write_config

    make_shards(root / "data" / "training", n_shards=2, n=40)
    make_shards(root / "data" / "test", n_shards=1, n=24, seed=7)
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]) + "\n")
    return root / "data", vocab, write_config(root / "config.json", dropout=0.0)


def test_sweep_best_rate_and_scaling_exponent_as_written_out():

    runs = [
        {"optimizer": "adamw", "batch": 64, "learning_rate": lr, "heldout_loss": loss, "finished": True}
        for lr, loss in ((1e-3, 6.5), (2e-3, 6.1), (4e-3, 6.3))
    ]
    runs += [
        {"optimizer": "adamw", "batch": 256, "learning_rate": lr, "heldout_loss": loss, "finished": True}
        for lr, loss in ((2e-3, 6.2), (4e-3, 5.9), (8e-3, float("nan")))
    ]
    best = ps.best_by_batch(runs)
    assert {b: r["learning_rate"] for b, r in best["adamw"].items()} == {64: 2e-3, 256: 4e-3}
    # lr doubles when the batch grows 4x: lr ~ batch^(ln 2 / ln 4) = batch^0.5
    assert ps.scaling_exponents(best) == {"adamw": pytest.approx(0.5)}
    assert ps.parse_runs(["nvlamb:32:1e-2,2e-2"]) == [("nvlamb", 32, 1e-2), ("nvlamb", 32, 2e-2)]
    with pytest.raises(SystemExit, match="OPTIMIZER:BATCH:LR"):
        ps.parse_runs(["adamw:1e-3"])


def test_sweep_runs_for_real_and_reuses_finished_runs(tmp_path, capsys):

    data, vocab, config = tiny_bertprep_layout(tmp_path)
    argv = [
        "--data",
        str(data),
        "--out",
        str(tmp_path / "sweep"),
        "--config",
        str(config),
        "--vocab",
        str(vocab),
        "--max_seq_length",
        "32",
        "--max_predictions_per_seq",
        "5",
        "--sequences",
        "64",
        "--evals",
        "2",
        "--max_eval_samples",
        "16",
        "--precision",
        "fp32",
        "--runs",
        "adamw:8:1e-3,1e-2",
        "nvlamb:16:1e-2",
    ]
    report = ps.main(argv)
    assert [(r["optimizer"], r["batch"], r["steps"]) for r in report["runs"]] == [
        ("adamw", 8, 8),
        ("adamw", 8, 8),
        ("nvlamb", 16, 4),
    ]
    assert all(r["finished"] and len(r["evals"]) == 2 for r in report["runs"])
    for r in report["runs"]:
        assert r["below_entropy"] == pytest.approx(r["unigram_entropy"] - r["heldout_loss"])
    text = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| adamw | 8 | 0.001 | 8 |" in text and "Best learning rate" in text
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    again = ps.main(argv)  # nothing runs twice
    assert capsys.readouterr().out.count("reusing") == 3
    assert [r["heldout_loss"] for r in again["runs"]] == [r["heldout_loss"] for r in report["runs"]]
    # On the results page: the sweep's table and its plot, drawn again from the JSON.
    page = tmp_path / "bench" / "RESULTS.md"
    text = results_page.main(
        ["--studies", str(tmp_path / "none"), "--out", str(page), "--sweep", str(tmp_path / "sweep" / "sweep.json")]
    )
    assert "## Pre-training sweep" in text and "| adamw | 8 | 0.001 | 8 |" in text and "](results/sweep.png)" in text
    assert (page.parent / "results" / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_ours_and_transformers_start_equal_and_are_compared_step_by_step(tmp_path):

    data, vocab, config = tiny_bertprep_layout(tmp_path)
    report = vs.main(
        [
            "--data",
            str(data),
            "--out",
            str(tmp_path / "vs"),
            "--config",
            str(config),
            "--vocab",
            str(vocab),
            "--max_seq_length",
            "32",
            "--max_predictions_per_seq",
            "5",
            "--steps",
            "4",
            "--batch",
            "8",
            "--lr",
            "1e-3",
            "--eval_every",
            "2",
            "--max_eval_samples",
            "16",
            "--precision",
            "fp32",
        ]
    )
    assert [r["step"] for r in report["rows"]] == [0, 2, 4]
    # Step 0: the same weights, evaluated by two implementations (ours: validation.Validator on modeling.py;
    # theirs: transformers' BertForPreTraining and the evaluation written in the bench script).
    zero = report["rows"][0]
    assert abs(zero["difference"]) < 1e-5 and zero["ours_context_gain"] == zero["reference_context_gain"]
    assert report["holds"] == all(r["difference"] <= vs.TOLERANCE for r in report["rows"])
    assert "| 0 |" in (tmp_path / "vs" / "vs_transformers.md").read_text()
    page = tmp_path / "bench" / "RESULTS.md"
    text = results_page.main(
        [
            "--studies",
            str(tmp_path / "none"),
            "--out",
            str(page),
            "--vs_transformers",
            str(tmp_path / "vs" / "vs_transformers.json"),
        ]
    )
    assert "## Ours against transformers" in text and "| 0 |" in text and "](results/vs_transformers.png)" in text


def test_squad_acceptances_first_sentence_baseline_is_scored_like_any_prediction(shared_data):
    """bench.squad_acceptance's floor (the first sentence of each context) is scored by the official metric, far
    below a model."""
    with open(shared_data / "squad-v1.1-dev" / "dev-v1.1.json", encoding="utf-8") as f:
        data = {"version": "1.1", "data": json.load(f)["data"][:1]}
    predictions = squad_acceptance.first_sentence_baseline(data)
    context = data["data"][0]["paragraphs"][0]["context"]
    first_qid = data["data"][0]["paragraphs"][0]["qas"][0]["id"]
    assert context.startswith(predictions[first_qid]) and predictions[first_qid].endswith(".")
    scores = squad_metrics.evaluate_v1(squad.read_gold_answers(data), predictions)
    assert scores["exact_match"] < 5 and scores["f1"] < 30
