"""bench/stability.py, the multi-seed fine-tuning runner: its statistics against numbers written out here, and a
tiny real run (2 seeds, MRPC, MiniLM) whose summary agrees with each run's own results.json, and which a second call
reuses instead of running again."""

from __future__ import annotations

import json

import pytest

from bench import stability, study_utils
from modeling import BertConfig, BertForPreTraining


def test_aggregate_is_mean_sample_std_min_max():
    stats = study_utils.aggregate([0.80, 0.90, 0.70])
    assert stats["mean"] == pytest.approx(0.80) and stats["std"] == pytest.approx(0.10)  # sqrt(0.02 / 2)
    assert (stats["min"], stats["max"], stats["seeds"]) == (0.70, 0.90, 3)
    assert study_utils.aggregate([0.5])["std"] == 0.0


def test_two_seeds_of_mrpc_run_and_aggregate(tmp_path, shared_data, minilm_dir, monkeypatch):
    # Sequences of 32 tokens: MiniLM's steps and evaluation were half of each seed's time at 64; the two seeds' F1
    # still differ (0.53 and 0 here), so the reuse check below can still tell them apart.
    common = [
        "--task",
        "mrpc",
        "--init_checkpoint",
        str(minilm_dir),
        "--data_dir",
        str(shared_data / "glue-mrpc"),
        "--max_steps",
        "2",
        "--batch_size",
        "8",
        "--max_train_examples",
        "32",
        "--max_eval_examples",
        "32",
        "--max_seq_length",
        "32",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    ]
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


def test_a_failed_seed_stops_the_seeds_running_beside_it(tmp_path, monkeypatch):
    """Seed 1 fails at once while seed 2 would run for a minute: the study ends with SeedFailed naming seed 1's log,
    and seed 2's process is ended, not left running behind it (a diverged fine-tuning now fails its seed)."""
    import subprocess
    import sys
    import time

    started = {}
    real_popen = subprocess.Popen

    def popen(cmd, **kwargs):
        seed = int(cmd[cmd.index("--seed") + 1])
        code = "import sys; sys.exit(3)" if seed == 1 else "import time; time.sleep(60)"
        started[seed] = real_popen([sys.executable, "-c", code], **kwargs)
        return started[seed]

    monkeypatch.setattr(stability.subprocess, "Popen", popen)
    t0 = time.time()
    with pytest.raises(stability.SeedFailed, match=r"seed 1 failed \(exit 3\): see .*seed_1\.log"):
        stability._main(
            [
                "--task",
                "mrpc",
                "--seeds",
                "2,1",
                "--parallel",
                "2",
                "--init_checkpoint",
                str(tmp_path),
                "--data_dir",
                str(tmp_path),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert started[2].poll() is not None and time.time() - t0 < 30


def test_gpu_finetune_call_runs_every_group_on_a_cpu(tmp_path, shared_data, uncased_vocab):
    """bench/gpu_finetune_call.sh, the device call's script, run here at the tiniest size (1 seed, 40 sentences a
    task, a 1-layer model): every group finishes, each through bench.stability with the checkpoint and dropout
    config its name says, and ft.tar.xz holds every group's summary for the trip back."""
    import subprocess
    import sys
    import tarfile

    import torch

    ft = tmp_path / "ft"
    for task in ("sst2", "mrpc"):
        (ft / f"glue-{task}").mkdir(parents=True)
        for split in ("train", "dev"):
            lines = (shared_data / f"glue-{task}" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:41]
            (ft / f"glue-{task}" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    for name, seed in (("pre", 1), ("rand", 2)):
        torch.manual_seed(seed)
        torch.save({"model": BertForPreTraining(config).state_dict(), "config": config.to_dict()}, ft / f"{name}.pt")
    for name, p in (("drop01", 0.1), ("drop0", 0.0)):
        (ft / f"{name}.json").write_text(
            json.dumps({**config.to_dict(), "hidden_dropout_prob": p, "attention_probs_dropout_prob": p})
        )
    (ft / "vocab.txt").write_bytes(uncased_vocab.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    env = {
        "OUT": str(out),
        "FT": str(ft),
        "SEEDS": "1",
        "DEADLINE": "400",
        "PY": sys.executable,
        "WORK": str(tmp_path / "work"),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
    }
    repo = study_utils.REPO
    done = subprocess.run(
        ["bash", str(repo / "bench" / "gpu_finetune_call.sh")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = (out / "call.log").read_text()
    groups = [
        "sst2_pre_d01",
        "sst2_rand_d01",
        "sst2_pre_d0",
        "sst2_rand_d0",
        "sst2_pre_d01_1e-4",
        "sst2_rand_d01_1e-4",
        "mrpc_pre_d01_1e-4",
        "mrpc_rand_d01_1e-4",
        "mrpc_pre_d01_2e-4",
        "mrpc_rand_d01_2e-4",
    ]
    assert all(f"end {g} (exit 0)" in log for g in groups) and "call done" in log
    with tarfile.open(out / "ft.tar.xz") as tar:
        for group in groups:
            task = "sst-2" if group.startswith("sst2") else "mrpc"
            summary = json.load(tar.extractfile(f"./{group}/stability_{task}.json"))
            cmd = summary["runs"][0]["command"]
            model, dropout = group.split("_")[1], group.split("_")[2]
            assert cmd[cmd.index("--init_checkpoint") + 1] == f"{ft}/{model}.pt"
            assert cmd[cmd.index("--config_file") + 1] == f"{ft}/{'drop01' if dropout == 'd01' else 'drop0'}.json"
            assert cmd[cmd.index("--learning_rate") + 1] == ("0.0001" if group.endswith("1e-4") else "0.0002")
