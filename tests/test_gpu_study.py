"""bench/gpu_study.py: the GPU run of issue 27 as one command, checked on the CPU with a tiny model.

The step count that fits a wall-time budget is checked against the arithmetic written out; `prepare` makes the device
call's folder from the real Wikipedia slice and bench/gpu_study_call.sh runs on it for real, once for the module
(text shards plain and xz-compressed -> unmasked shards -> probe -> pre-training -> bf16 export -> import ->
fine-tuning); the export is compared with torch's own bf16 rounding of the checkpoint it came from, and `import`
gives the run folder that bench.pretrain_study fine-tunes."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
import torch

import create_pretraining_data
from bench import gpu_study, results_page
from bench.pretrain_study import run_state
from modeling import BertConfig


def test_steps_that_fit_the_budget_as_written_out():
    # An H200 probe (bench/STUDIES.md): 300 steps, 38 s of wall time, 63.48 steps/s side by side, budget 300 s.
    # Start-up = 38 - 300 / 63.48 = 33.274 s; (300 - 33.274) * 63.48 = 16,932 steps -> 16,900.
    assert gpu_study.steps_that_fit(300, 300, 38.0, 63.48, 30000) == 16900
    assert gpu_study.steps_that_fit(300, 300, 38.0, 200.0, 30000) == 30000  # the cap
    assert gpu_study.steps_that_fit(10, 300, 38.0, 63.48, 30000) == 100  # never fewer than 100
    assert gpu_study.steps_that_fit(10, 300, 38.0, 63.48, 20) == 20  # the cap last (tests, smoke runs)
    assert gpu_study.steps_that_fit(60, 10, 5.0, 10.0, 30000) == 500  # start-up 4 s: 56 * 10 = 560 -> 500


def test_runs_are_parsed_and_bad_ones_refused():
    assert gpu_study.parse_runs("adamw:1e-3,nvlamb:2.83e-2") == [
        ("adamw_1e-3", "adamw", "1e-3"),
        ("nvlamb_2.83e-2", "nvlamb", "2.83e-2"),
    ]
    for bad in ("sgd:1e-3", "adamw", "adamw:fast"):
        with pytest.raises(ValueError):
            gpu_study.parse_runs(bad)


@pytest.fixture(scope="module")
def device_call(tmp_path_factory, shared_data):
    """`gpu_study prepare` on one file of the real Wikipedia slice (it still shards into two training shards and one
    held-out shard of more than 64 sequences, and yields all 3,000 vocabulary entries), then bench/gpu_study_call.sh
    (the device call) on what it made, at the tiniest size: made once, checked by the two tests below (each stage, a
    process that starts torch, runs once for both: the call's `run` is the whole command that the export test checks).

    The call's TEXT (the script's own override of $GPU_DATA/text) holds the prepared shards as both kinds `run`
    reads: the first plain, the second as `prepare` left it (xz), beside a file that is not text; CKPTS=4 brings the
    weights after 5, 10 and 15 of the 20 steps back too. GLUE comes from the first 40 rows of each file (the
    fine-tuning reads 16 of them): `prepare` packs whatever --glue_root holds, so xz need not pack all of SST-2."""
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    tmp = tmp_path_factory.mktemp("gpu_study_call")
    slice_dir = tmp / "slice" / "AA"
    slice_dir.mkdir(parents=True)
    shutil.copyfile(shared_data / "wikipedia-en-slice" / "text" / "AA" / "wiki_00.gz", slice_dir / "wiki_00.gz")
    glue = tmp / "glue"
    for task in ("glue-mrpc", "glue-sst2"):
        (glue / task).mkdir(parents=True)
        shutil.copyfile(shared_data / task / "PROVENANCE.txt", glue / task / "PROVENANCE.txt")
        for split in ("train", "dev"):
            lines = (shared_data / task / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:41]
            (glue / task / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data, work = tmp / "gpu_data", tmp / "prep"
    report = gpu_study.main(
        [
            "prepare",
            "--out",
            str(data),
            "--slice",
            str(tmp / "slice"),
            "--work",
            str(work),
            "--n_training_shards",
            "2",
            "--n_test_shards",
            "1",
            "--fraction_test_set",
            "0.1",
            "--vocab_size",
            "3000",
            "--limit_alphabet",
            "300",
            "--eval_samples",
            "64",
            "--workers",
            "2",
            "--glue_root",
            str(glue),
        ]
    )

    text = tmp / "text"
    text.mkdir()
    (text / "wikicorpus_en_training_0.txt").write_bytes(
        lzma.decompress((data / "text" / "wikicorpus_en_training_0.txt.xz").read_bytes())
    )
    shutil.copyfile(data / "text" / "wikicorpus_en_training_1.txt.xz", text / "wikicorpus_en_training_1.txt.xz")
    (text / "ignored.json").write_text("{}")
    config = tmp / "model" / "config.json"
    config.parent.mkdir()
    BertConfig(
        vocab_size=3000,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    ).to_json_file(config)
    out = tmp / "out"
    out.mkdir()
    env = {
        **os.environ,
        "OUT": str(out),
        "GPU_DATA": str(data),
        "TEXT": str(text),
        "CONFIG": str(config),
        "BUDGET": "120",
        "PROBE": "3",
        "CAP": "20",
        "EVAL_SAMPLES": "64",
        "BATCH": "4",
        "SEEDS": "1",
        "DEADLINE": "900",
        "CKPTS": "4",
        "WORK": str(tmp / "gs_work"),
        "TMP_ROOT": str(tmp / "gs"),
        "OMP_NUM_THREADS": "1",
        "FT_EXTRA": "--max_train_examples 16 --max_eval_examples 16",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    done = subprocess.run(
        ["bash", str(gpu_study.REPO / "bench" / "gpu_study_call.sh")],
        cwd=gpu_study.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    # run: the call's `gpu_study run --out` (every export, whole); pretrain: its checkpoints.
    return SimpleNamespace(
        tmp=tmp,
        slice=tmp / "slice",
        data=data,
        work=work,
        report=report,
        out=out,
        done=done,
        run=tmp / "gs" / "gs",
        pretrain=tmp / "gs_work" / "pretrain" / "adamw_1e-3",
    )


def test_gpu_study_runs_on_cpu_and_its_export_imports_for_fine_tuning(device_call, tmp_path):

    out, log = device_call.run, (device_call.out / "call.log").read_text()
    assert "stage pretrain done" in log, log[-3000:]  # the call's later stages are the other test's
    report = json.loads((out / "gpu_study.json").read_text())
    assert report["data"]["text_shards"] == 2 and report["steps"] == 20  # one plain, one xz; not the .json
    run = report["runs"]["adamw_1e-3"]
    assert run["returncode"] == 0 and run["checkpoint_step"] == 20 and run["final"]["step"] == 20
    assert 0 < run["eval"]["eval_unigram_entropy"] and run["eval"]["eval_mask_slots"] > 0
    assert json.loads((device_call.out / "gpu_study.json").read_text()) == report  # the call brings it back

    # The export is the checkpoint's weights rounded to bf16 by torch, with the config in the file's metadata.
    from safetensors import safe_open
    from safetensors.torch import load_file

    # CKPTS=4: the weights after 5, 10 and 15 of the 20 steps come out too, each the same way.
    assert run["earlier_steps"] == [5, 10, 15]
    for step, file in (
        (20, "adamw_1e-3.bf16.safetensors"),
        *((s, f"adamw_1e-3.step{s}.bf16.safetensors") for s in (5, 10, 15)),
    ):
        ckpt = torch.load(device_call.pretrain / "checkpoints" / f"ckpt_{step}.pt", weights_only=True)
        exported = load_file(str(out / file))
        assert exported.keys() == ckpt["model"].keys() and ckpt["step"] == step
        for name, tensor in ckpt["model"].items():
            want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
            assert exported[name].dtype == want.dtype and torch.equal(exported[name], want), (step, name)
        with safe_open(str(out / file), "pt") as f:
            assert json.loads(f.metadata()["config"]) == ckpt["config"]
    early = load_file(str(out / "adamw_1e-3.step5.bf16.safetensors"))
    exported = load_file(str(out / "adamw_1e-3.bf16.safetensors"))  # the final weights, as the import below reads
    assert not all(torch.equal(early[k], exported[k]) for k in exported)  # they are not the same weights

    # The results page's section: the run's row carries its call's model config and its log's last held-out
    # evaluation; the plot is drawn.

    page = results_page.main(
        [
            "--studies",
            str(tmp_path / "none"),
            "--gpu_study",
            str(out / "gpu_study.json"),
            "--out",
            str(tmp_path / "page" / "RESULTS.md"),
        ]
    )
    last = [
        json.loads(line)["data"]
        for line in (out / "adamw_1e-3.log.json").read_text().splitlines()
        if "eval_mlm_loss" in line
    ][-1]
    row = next(line for line in page.splitlines() if "| adamw_1e-3 |" in line)
    assert "| config.json | adamw_1e-3 | 20 |" in row and f"| {last['eval_mlm_loss']:.3f} |" in row
    assert row.endswith("| finished |")
    assert (tmp_path / "page" / "results" / "gpu_study.png").is_file()

    # import: a finished run folder whose newest ckpt_<step>.pt (the final weights) pretrain_study fine-tunes; the
    # earlier ones beside it (one left out, as when it did not come back from the device machine: said, skipped).
    # On a copy of the run's folder: the call's own import read it whole.
    source = tmp_path / "from"
    shutil.copytree(out, source)
    (source / "adamw_1e-3.step10.bf16.safetensors").unlink()
    made = gpu_study.main(["import", "--from", str(source), "--to", str(tmp_path / "runs")])
    assert made == [tmp_path / "runs" / "adamw_1e-3"]
    state = run_state(made[0])
    assert state["finished"], state["state"]
    assert sorted(p.name for p in (made[0] / "checkpoints").iterdir()) == ["ckpt_15.pt", "ckpt_20.pt", "ckpt_5.pt"]
    imported = torch.load(state["checkpoint"], weights_only=True)
    assert imported["config"] == ckpt["config"] and imported["step"] == 20
    for name, tensor in exported.items():
        assert torch.equal(imported["model"][name], tensor.float() if tensor.is_floating_point() else tensor), name
    imported = torch.load(made[0] / "checkpoints" / "ckpt_5.pt", weights_only=True)
    assert imported["step"] == 5 and all(
        torch.equal(imported["model"][k], t.float() if t.is_floating_point() else t) for k, t in early.items()
    )


def test_gpu_study_refuses_a_missing_input_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--text_dir .* does not exist"):
        gpu_study.main(
            [
                "run",
                "--text_dir",
                str(tmp_path / "nope"),
                "--eval_dir",
                str(tmp_path),
                "--vocab",
                str(tmp_path),
                "--config",
                str(tmp_path),
                "--out",
                str(tmp_path / "out"),
            ]
        )


def test_prepare_makes_the_device_calls_folder_and_the_call_runs_on_a_cpu(device_call):
    """What `prepare` made (device_call): the text shards travel byte for byte, the learned vocabulary has exactly
    --vocab_size entries, the configs are Turc et al.'s shapes for it, and the held-out summary equals what
    run_pretraining.py's own evaluation of the same sequences logs; every fine-tuning group of the call finishes."""
    import tarfile

    data, work, report, out = device_call.data, device_call.work, device_call.report, device_call.out
    assert not (device_call.tmp / "gpu_data.part").exists()
    assert json.loads((data / "PREPARED.json").read_text()) == report
    shards = next(work.glob("sharded_*")) / "wikicorpus_en"
    for i in range(2):
        packed = lzma.decompress((data / "text" / f"wikicorpus_en_training_{i}.txt.xz").read_bytes())
        assert packed == (shards / f"wikicorpus_en_training_{i}.txt").read_bytes()
    assert sorted(p.name for p in (data / "text").iterdir()) == [f"wikicorpus_en_training_{i}.txt.xz" for i in (0, 1)]
    assert [p.name for p in (data / "eval").iterdir()] == ["wikicorpus_en_test_0.hdf5"]
    assert report["heldout"]["sequences"] == 64  # one file of the slice holds all of --eval_samples
    entries = (data / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(entries) == 3000 == report["vocab_entries"] and entries[103] == "[MASK]"
    mini = json.loads((data / "bert-mini-3k.json").read_text())
    small = json.loads((data / "bert-small-3k.json").read_text())
    assert (mini["hidden_size"], mini["num_attention_heads"], mini["intermediate_size"]) == (256, 4, 1024)
    assert (small["hidden_size"], small["num_attention_heads"], small["intermediate_size"]) == (512, 8, 2048)
    for config in (mini, small):
        assert config["vocab_size"] == 3000 and config["num_hidden_layers"] == 4
        assert config["hidden_dropout_prob"] == config["attention_probs_dropout_prob"] == 0.1
    with tarfile.open(data / "glue.tar.xz") as tar:
        names = set(tar.getnames())
    assert {f"glue-{t}/{s}.tsv" for t in ("mrpc", "sst2") for s in ("train", "dev")} <= names
    with pytest.raises(SystemExit, match="--out .* is not empty"):
        gpu_study.main(["prepare", "--out", str(data), "--slice", str(device_call.slice)])
    with pytest.raises(SystemExit, match="--work .* was not made by `prepare`"):  # never empties a user's folder
        gpu_study.main(
            [
                "prepare",
                "--out",
                str(device_call.tmp / "new"),
                "--slice",
                str(device_call.slice),
                "--work",
                str(device_call.slice),
            ]
        )
    assert (device_call.slice / "AA" / "wiki_00.gz").is_file()

    # The device call, as it runs on the GPU machine, at the tiniest size.
    log = (out / "call.log").read_text()
    assert device_call.done.returncode == 0 and "call done" in log, log[-3000:]
    for step in (5, 10, 15):  # CKPTS=4: the earlier weights came back too, each as `run` wrote it
        name = f"adamw_1e-3.step{step}.bf16.safetensors"
        assert (out / name).read_bytes() == (device_call.run / name).read_bytes()
    weights = b"".join(p.read_bytes() for p in sorted(out.glob("weights.part*")))  # the final weights, split
    assert weights == (device_call.run / "adamw_1e-3.bf16.safetensors").read_bytes()
    groups = ["mrpc_1e-4", "sst2_full_1e-4_pre", "sst2_full_1e-4_rand", "mrpc_2e-4"]
    assert all(f"stage finetune {g} ended (exit 0)" in log for g in groups), log[-3000:]

    # run_pretraining.py's evaluation of the same held-out sequences counts what PREPARED.json says.
    evaluated = [
        json.loads(line)["data"]
        for line in (out / "adamw_1e-3.log.json").read_text().splitlines()
        if "eval_mlm_loss" in line
    ][-1]
    assert evaluated["eval_masked_positions"] == report["heldout"]["prediction_slots"]
    assert evaluated["eval_mask_slots"] == report["heldout"]["mask_slots"]
    assert evaluated["eval_unigram_entropy"] == pytest.approx(report["heldout"]["unigram_entropy"], abs=1e-6)

    # SST-2 was fine-tuned for one epoch on every training sentence the run was given, each model alone; only the
    # first MRPC group ran the context probe, the others started beside it without one.
    with tarfile.open(out / "ft.tar.xz") as tar:
        for group in groups:
            report_json = json.load(tar.extractfile(f"ft/{group}/pretrain_study.json"))
            assert ("context_probe" in report_json["pretraining"]) == (group == "mrpc_1e-4"), group
        for group, model in (("sst2_full_1e-4_pre", "pretrained"), ("sst2_full_1e-4_rand", "random")):
            member = next(
                n for n in tar.getnames() if n.startswith(f"ft/{group}/") and n.endswith("stability_sst-2.json")
            )
            summary = json.load(tar.extractfile(member))
            cmd = summary["runs"][0]["command"]
            assert cmd[cmd.index("--num_train_epochs") + 1] in ("1", "1.0")
            assert cmd[cmd.index("--learning_rate") + 1] == "0.0001"
            assert (model == "random") == ("random_init" in cmd[cmd.index("--init_checkpoint") + 1])


def test_shards_that_fit_and_the_first_sequences_of_a_shard(tmp_path, shared_data, uncased_vocab):
    assert gpu_study.shards_that_fit([10, 20, 30], 60) == 3
    assert gpu_study.shards_that_fit([10, 20, 30], 59) == 2  # 10 + 20 + 30 = 60 > 59
    assert gpu_study.shards_that_fit([10, 20, 30], 9) == 0
    import h5py

    shard = tmp_path / "full.hdf5"
    create_pretraining_data.main(
        [
            "--input_file",
            str(shared_data / "bert-sample-text" / "sample_text.txt"),
            "--output_file",
            str(shard),
            "--vocab_file",
            str(uncased_vocab),
            "--do_lower_case",
            "--max_seq_length",
            "64",
            "--max_predictions_per_seq",
            "10",
            "--dupe_factor",
            "2",
            "--no_progress",
        ]
    )
    assert gpu_study.first_sequences(shard, tmp_path / "first.hdf5", 7) == 7
    with h5py.File(shard, "r") as full, h5py.File(tmp_path / "first.hdf5", "r") as first:
        assert set(first) == set(full) and len(full["input_ids"]) > 7 and dict(first.attrs) == dict(full.attrs)
        for key in full:
            assert first[key].dtype == full[key].dtype and (first[key][:] == full[key][:7]).all(), key
