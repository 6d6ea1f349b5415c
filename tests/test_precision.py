"""--precision auto: chosen from the hardware (the CPU's own flags, injected here, or $BERT_CPU_BF16) for training,
fp32 for commands that only read a model; the same flag in every entry script, the old --fp16/--amp/--bf16 switches
as aliases, and the reason logged."""

from __future__ import annotations

import importlib
import json
import math
import platform
import sys
from dataclasses import dataclass, field

import pytest
import torch
from helpers import help_of

import run_pretraining as rp
from bert_recipe.io import flags
from bert_recipe.training import precision_policy

AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # an AMD EPYC / laptop CPU without native bf16
WITH_AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
WITH_AMX = AVX2_ONLY | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n"
    )
    assert precision_policy.cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert precision_policy.cpu_flags(tmp_path / "absent") is None
    assert precision_policy.cpu_model(cpuinfo) == "AMD EPYC"
    assert precision_policy.cpu_model(tmp_path / "absent") == (platform.processor() or platform.machine() or "unknown")


@pytest.mark.parametrize(
    "flags, expected", [(AVX2_ONLY, "fp32"), (WITH_AVX512_BF16, "bf16"), (WITH_AMX, "bf16"), (set(), "fp32")]
)
def test_auto_on_cpu_follows_the_flags(flags, expected, monkeypatch):
    monkeypatch.delenv("BERT_CPU_BF16")
    choice = precision_policy.resolve("auto", torch.device("cpu"), flags=flags)
    assert choice.name == expected and choice.warning is None
    assert ("amx_bf16" in choice.reason or "avx512_bf16" in choice.reason) and choice.reason.startswith("auto:")


def test_auto_on_this_cpu_matches_its_proc_cpuinfo(monkeypatch):
    """Independent of precision_policy.py: grep the flags as the README says, and compare."""
    monkeypatch.delenv("BERT_CPU_BF16")
    text = open("/proc/cpuinfo").read() if sys.platform == "linux" else ""
    native = "avx512_bf16" in text or "amx_bf16" in text
    assert precision_policy.resolve("auto", "cpu").name == ("bf16" if native else "fp32")


def test_explicit_bf16_on_a_cpu_without_it_runs_but_warns_in_one_line(monkeypatch):
    monkeypatch.delenv("BERT_CPU_BF16")
    choice = precision_policy.resolve("bf16", torch.device("cpu"), flags=AVX2_ONLY)
    assert choice.name == "bf16" and choice.warning and "\n" not in choice.warning
    assert "slower" in choice.warning and "--precision auto" in choice.warning
    assert precision_policy.resolve("bf16", torch.device("cpu"), flags=WITH_AMX).warning is None


def test_explicit_choices_are_kept():
    cpu = torch.device("cpu")
    assert [precision_policy.resolve(p, cpu, flags=WITH_AMX).name for p in ("fp32", "fp16", "bf16")] == [
        "fp32",
        "fp16",
        "bf16",
    ]
    assert precision_policy.resolve("tf32", cpu, flags=AVX2_ONLY).name == "fp32"  # TF32 is a GPU format
    with pytest.raises(ValueError, match="precision must be one of"):
        precision_policy.resolve("fp8", cpu)


@pytest.mark.parametrize(
    "argv, expected",
    [([], "auto"), (["--precision", "tf32"], "tf32"), (["--fp16"], "fp16"), (["--amp"], "fp16"), (["--bf16"], "bf16")],
)
def test_aliases_set_the_one_precision(argv, expected):
    assert flags.parse(OnlyPrecision, "prog", "A command.", argv).precision.precision == expected


def test_two_precision_flags_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse(OnlyPrecision, "prog", "A command.", ["--fp16", "--bf16"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "prog: error: argument --bf16: not allowed with argument --fp16/--amp (see --help)"
    ]


@dataclass(frozen=True)
class PrecisionSection:
    """A section holding the precision field alone."""

    precision: str = precision_policy.flag()
    """the format"""


@dataclass(frozen=True)
class OnlyPrecision(flags.Config):
    """A configuration of the precision flag alone."""

    precision: PrecisionSection = field(default_factory=PrecisionSection)
    """precision"""


def help_text(script: str) -> str:
    """`python <script> --help`'s text, whitespace collapsed (helpers.help_of)."""
    return " ".join(help_of(importlib.import_module(script.removesuffix(".py")).main).split())


@pytest.mark.parametrize("script", ["run_pretraining.py", "run_squad.py", "run_glue.py", "inference.py"])
def test_every_entry_script_has_the_precision_flag(script):
    text = help_text(script)
    assert "--precision {auto,fp32,tf32,fp16,bf16}" in text and "--bf16" in text and "--fp16" in text


def test_pretraining_logs_the_choice_and_its_reason(tmp_path, monkeypatch, capsys):
    """A run in auto on an (injected) AVX2-only CPU trains in fp32 and says why, in the console and the JSON log."""
    import h5py
    import numpy as np

    monkeypatch.delenv("BERT_CPU_BF16")
    monkeypatch.setattr(precision_policy, "cpu_flags", lambda *a, **k: set(AVX2_ONLY))
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
    config.write_text(
        json.dumps(
            {
                "vocab_size": 64,
                "hidden_size": 16,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 32,
                "max_position_embeddings": 32,
                "type_vocab_size": 2,
            }
        )
    )
    log = tmp_path / "log.json"
    assert (
        rp.main(
            [
                "--input_dir",
                str(shards),
                "--config_file",
                str(config),
                "--output_dir",
                str(tmp_path / "out"),
                "--do_train",
                "--max_seq_length",
                str(seq),
                "--max_predictions_per_seq",
                str(pred),
                "--train_batch_size",
                "4",
                "--max_steps",
                "2",
                "--num_workers",
                "0",
                "--skip_checkpoint",
                "--disable_progress_bar",
                "--no_cuda",
                "--json-summary",
                str(log),
            ]
        )
        == 0
    )
    assert "precision fp32 (auto: the CPU has neither amx_bf16 nor avx512_bf16" in capsys.readouterr().out
    params = next(json.loads(line)["data"] for line in log.read_text().splitlines() if '"PARAMETER"' in line)
    assert params["precision"] == "fp32" and params["precision_requested"] == "auto"
    assert "avx512_bf16" in params["precision_reason"]


# ---------------------------------------------------------------------------------------------------------------
# $BERT_CPU_BF16: make auto decide as if the CPU had (1) or had not (0) native bf16, whatever its flags say


@pytest.mark.parametrize(
    "value, flags, expected",
    [
        ("1", AVX2_ONLY, "bf16"),
        ("0", WITH_AMX, "fp32"),
        ("native", AVX2_ONLY, "bf16"),
        ("no", WITH_AVX512_BF16, "fp32"),
    ],
)
def test_the_environment_variable_overrides_the_flags(monkeypatch, value, flags, expected):
    monkeypatch.setenv("BERT_CPU_BF16", value)
    choice = precision_policy.resolve("auto", "cpu", flags=flags)
    assert choice.name == expected and f"BERT_CPU_BF16={value}" in choice.reason
    # An explicit bf16 warns exactly when the variable says bf16 would be emulated.
    assert (precision_policy.resolve("bf16", "cpu", flags=flags).warning is None) == (expected == "bf16")


def test_an_unset_or_empty_variable_reads_the_flags_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("BERT_CPU_BF16", "")
    assert precision_policy.resolve("auto", "cpu", flags=WITH_AMX).name == "bf16"
    monkeypatch.setenv("BERT_CPU_BF16", "maybe")
    with pytest.raises(ValueError, match=r"BERT_CPU_BF16='maybe' .*set it to 1 .* or 0") as e:
        precision_policy.resolve("auto", "cpu", flags=WITH_AMX)
    assert "\n" not in str(e.value)
    assert precision_policy.resolve("fp32", "cpu").name == "fp32"  # a named precision does not read it


def test_a_bad_variable_is_one_line_from_an_entry_script(monkeypatch, tmp_path):
    from helpers import args_for, make_shards, write_config

    monkeypatch.setenv("BERT_CPU_BF16", "maybe")
    argv = args_for(
        make_shards(tmp_path / "data", n_shards=1),
        write_config(tmp_path / "config.json"),
        tmp_path / "out",
        "--max_steps",
        "1",
        "--no_cuda",
    )
    with pytest.raises(SystemExit) as e:
        rp.main(argv)
    message = e.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith("run_pretraining.py: error: BERT_CPU_BF16='maybe'") and "unset it" in message
    assert not list((tmp_path / "out").glob("ckpt_*.pt"))


# ---------------------------------------------------------------------------------------------------------------
# Commands that only read a model: auto is fp32 on every machine


@pytest.mark.parametrize("flags", [AVX2_ONLY, WITH_AMX], ids=["avx2", "amx"])
def test_auto_for_a_command_that_only_reads_a_model_is_fp32(flags, cpu_bf16):
    read = precision_policy.resolve("auto", "cpu", precision_policy.READ, flags=flags)
    assert read.name == "fp32" and "only reads a model" in read.reason and read.warning is None
    # Named precisions are kept for reading too; training follows the decision.
    assert precision_policy.resolve("bf16", "cpu", precision_policy.READ, flags=flags).name == "bf16"
    assert precision_policy.resolve("auto", "cpu", precision_policy.TRAIN).name == cpu_bf16


@pytest.mark.parametrize("do_train, expected", [(True, precision_policy.TRAIN), (False, precision_policy.READ)])
def test_fine_tuning_reads_or_trains_by_do_train(do_train, expected):
    import argparse

    assert precision_policy.purpose_of(argparse.Namespace(do_train=do_train, do_eval=True)) == expected
    assert precision_policy.purpose_of(argparse.Namespace(do_predict=True)) == precision_policy.READ


@pytest.mark.parametrize(
    "script, rule",
    [
        ("extract_features.py", "only reads a model"),
        ("inference.py", "only reads a model"),
        ("run_glue.py", "without --do_train"),
        ("run_squad.py", "without --do_train"),
        ("run_swag.py", "without --do_train"),
        ("run_pretraining.py", "fastest precision the hardware runs natively"),
    ],
)
def test_help_states_the_rule_for_auto(script, rule):
    assert rule in help_text(script)


def test_pretraining_trains_in_what_auto_decides_on_either_cpu(tmp_path, cpu_bf16):
    """run_pretraining.py with --precision auto, as a CPU with (bf16) and without (fp32) native bf16 decides: the
    run takes that precision, logs it with its reason, and learns (the masked-LM loss falls)."""
    from helpers import args_for, make_shards, read_log, write_config

    out = tmp_path / "out"
    argv = args_for(
        make_shards(tmp_path / "data", n_shards=1, n=64, vocab=30),
        write_config(tmp_path / "c.json", dropout=0.0, vocab=30),
        out,
        "--max_steps",
        "30",
        "--log_freq",
        "1",
        "--skip_checkpoint",
        "--no_cuda",
    )
    assert rp.main(argv) == 0
    records = read_log(out / "log.json")
    params = next(r["data"] for r in records if r["step"] == "PARAMETER")
    assert params["precision"] == cpu_bf16 and params["precision_requested"] == "auto"
    assert "BERT_CPU_BF16=" in params["precision_reason"]
    losses = [r["data"]["mlm_loss"] for r in records if isinstance(r["step"], int) and "mlm_loss" in r["data"]]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1, losses
