"""--precision auto: chosen from the hardware (the CPU's own flags, injected here), the same flag in every entry
script, the old --fp16/--amp/--bf16 switches as aliases, and the reason logged."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import utils

AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # an AMD EPYC / laptop CPU without native bf16
WITH_AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
WITH_AMX = AVX2_ONLY | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert utils.cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert utils.cpu_flags(tmp_path / "absent") is None


@pytest.mark.parametrize("flags, expected", [(AVX2_ONLY, "fp32"), (WITH_AVX512_BF16, "bf16"), (WITH_AMX, "bf16"),
                                             (set(), "fp32")])
def test_auto_on_cpu_follows_the_flags(flags, expected):
    choice = utils.resolve_precision("auto", torch.device("cpu"), flags=flags)
    assert choice.name == expected and choice.warning is None
    assert ("amx_bf16" in choice.reason or "avx512_bf16" in choice.reason) and choice.reason.startswith("auto:")


def test_auto_on_this_cpu_matches_its_proc_cpuinfo():
    """Independent of utils: grep the flags as the README says, and compare."""
    text = open("/proc/cpuinfo").read() if sys.platform == "linux" else ""
    native = "avx512_bf16" in text or "amx_bf16" in text
    assert utils.resolve_precision("auto", "cpu").name == ("bf16" if native else "fp32")


def test_explicit_bf16_on_a_cpu_without_it_runs_but_warns_in_one_line():
    choice = utils.resolve_precision("bf16", torch.device("cpu"), flags=AVX2_ONLY)
    assert choice.name == "bf16" and choice.warning and "\n" not in choice.warning
    assert "slower" in choice.warning and "--precision auto" in choice.warning
    assert utils.resolve_precision("bf16", torch.device("cpu"), flags=WITH_AMX).warning is None


def test_explicit_choices_are_kept():
    cpu = torch.device("cpu")
    assert [utils.resolve_precision(p, cpu, flags=WITH_AMX).name for p in ("fp32", "fp16", "bf16")] == \
        ["fp32", "fp16", "bf16"]
    assert utils.resolve_precision("tf32", cpu, flags=AVX2_ONLY).name == "fp32"  # TF32 is a GPU format
    with pytest.raises(ValueError, match="precision must be one of"):
        utils.resolve_precision("fp8", cpu)


@pytest.mark.parametrize("argv, expected", [([], "auto"), (["--precision", "tf32"], "tf32"), (["--fp16"], "fp16"),
                                            (["--amp"], "fp16"), (["--bf16"], "bf16")])
def test_aliases_set_the_one_precision(argv, expected):
    import argparse

    parser = argparse.ArgumentParser()
    utils.add_precision_arguments(parser)
    assert parser.parse_args(argv).precision == expected


@pytest.mark.parametrize("script", ["run_pretraining.py", "run_squad.py", "run_glue.py", "inference.py"])
def test_every_entry_script_has_the_precision_flag(repo_root, script):
    out = subprocess.run([sys.executable, str(repo_root / script), "--help"], capture_output=True, text=True,
                         cwd=repo_root, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "--precision {auto,fp32,tf32,fp16,bf16}" in text and "--bf16" in text and "--fp16" in text


def test_pretraining_logs_the_choice_and_its_reason(tmp_path, monkeypatch, capsys):
    """A run in auto on an (injected) AVX2-only CPU trains in fp32 and says why, in the console and the JSON log."""
    import h5py
    import numpy as np

    import run_pretraining as rp

    monkeypatch.setattr(utils, "cpu_flags", lambda *a, **k: set(AVX2_ONLY))
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    n, seq, pred = 16, 16, 3
    with h5py.File(shards / "a.hdf5", "w") as f:
        f["input_ids"] = rng.integers(5, 60, (n, seq)).astype(np.int32)
        f["input_mask"] = np.ones((n, seq), np.int8)
        f["segment_ids"] = np.zeros((n, seq), np.int8)
        f["masked_lm_positions"] = np.tile(np.arange(1, pred + 1), (n, 1)).astype(np.int32)
        f["masked_lm_ids"] = rng.integers(5, 60, (n, pred)).astype(np.int32)
        f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int8)
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32,
                                  "type_vocab_size": 2}))
    log = tmp_path / "log.json"
    assert rp.main(["--input_dir", str(shards), "--config_file", str(config), "--output_dir", str(tmp_path / "out"),
                    "--do_train", "--max_seq_length", str(seq), "--max_predictions_per_seq", str(pred),
                    "--train_batch_size", "4", "--max_steps", "2", "--num_workers", "0", "--skip_checkpoint",
                    "--disable_progress_bar", "--no_cuda", "--json-summary", str(log)]) == 0
    assert "precision fp32 (auto: the CPU has neither amx_bf16 nor avx512_bf16" in capsys.readouterr().out
    params = next(json.loads(line)["data"] for line in log.read_text().splitlines() if '"PARAMETER"' in line)
    assert params["precision"] == "fp32" and params["precision_requested"] == "auto"
    assert "avx512_bf16" in params["precision_reason"]
