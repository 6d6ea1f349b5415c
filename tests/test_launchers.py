"""The launchers: scripts/run_pretraining.sh, the presets of scripts/configs/pretrain_config.sh, run.sub, the
Docker scripts and the CPU demo.

The commands the launchers build (DRY_RUN=1) are checked against run_pretraining.py itself: every flag must appear
in its --help text and the whole command line must pass its own argument parser and checks (parse_args). The
defaults are checked against NVIDIA DeepLearningExamples' run_pretraining.sh, whose values are written out below.
One test runs the launcher for real (both phases, a tiny model, a few steps) to see the phase hand-off, the log
file and the summary.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import help_of

import create_pretraining_data
import run_pretraining
from scripts import cpu_demo as demo
from scripts.text_to_documents import iter_documents, main, write_documents

REPO = Path(__file__).resolve().parent.parent
RUN_SH = REPO / "scripts" / "run_pretraining.sh"
PRESETS_SH = REPO / "scripts" / "configs" / "pretrain_config.sh"
SHELL_SCRIPTS = sorted(REPO.glob("scripts/**/*.sh")) + [REPO / "run.sub"]
PRECISIONS = {"auto", "fp16", "bf16", "tf32", "fp32"}
EXPECTED_PRESETS = {
    "dgx1_8gpu_fp16",
    "dgx1_8gpu_fp32",
    "dgx2_16gpu_fp16",
    "dgx2_16gpu_fp32",
    "dgxa100-40g_8gpu_fp16",
    "dgxa100-40g_8gpu_tf32",
    "dgxa100-80g_8gpu_fp16",
    "dgxa100-80g_8gpu_tf32",
    "dgxa100-80g_8gpu_bf16",
    "dgxh100_8gpu_bf16",
    "cpu",
    "small_1gpu_bf16",
}
SMALL_PRESETS = {"cpu", "small_1gpu_bf16"}  # ours: a small model at a small batch, the 26th argument (optimizer) named
# NVIDIA's run_pretraining.sh (the HDF5-era version with 25 positional arguments): its defaults, arguments 1-20.
NVIDIA_DEFAULTS = [
    "8192",
    "6e-3",
    "fp16",
    "8",
    "0.2843",
    "7038",
    "200",
    "false",
    "true",
    "true",
    "128",
    "12439",
    "bert_lamb_pretraining",
    "true",
    "true",
    "4096",
    "4e-3",
    "0.128",
    "1563",
    "512",
]
INT_ARGS = (1, 4, 6, 7, 11, 12, 16, 19, 20)
FLOAT_ARGS = (2, 5, 17, 18)
BOOL_ARGS = (8, 9, 10, 14, 15)


def bash(script: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=cwd, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def help_text() -> str:
    """run_pretraining.py --help (its parser names its prog), from its own main in this process."""
    return help_of(run_pretraining.main)


@pytest.fixture(scope="module")
def presets() -> dict[str, list[str]]:
    """Every preset function's words, from a real `source` of the file."""
    out = bash(
        f'source {shlex.quote(str(PRESETS_SH))}; for p in "${{PRETRAIN_PRESETS[@]}}"; do '
        f'echo "$p|$($p)"; done; declare -F | awk \'{{print "FN " $3}}\'',
        env={"BERT_PREP_WORKING_DIR": "/workspace/data"},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    functions = {line[3:] for line in lines if line.startswith("FN ") and not line[3:].startswith("_")}
    functions -= {"pretrain_slot"}  # the one helper of the file that scripts call (an argument's index by name)
    result = {name: words.split() for name, words in (line.split("|", 1) for line in lines if "|" in line)}
    assert set(result) == functions, "PRETRAIN_PRESETS must list every preset function"
    return result


def run_pretraining_commands(stdout: str) -> list[list[str]]:
    """The run_pretraining.py flags of every printed command line."""
    commands = []
    for line in stdout.splitlines():
        words = shlex.split(line)
        at = next(i for i, w in enumerate(words) if w.endswith("run_pretraining.py"))
        commands.append(words[at + 1 :])
    return commands


def check_flags_against_run_pretraining(flags: list[str], help_text: str):
    """Every flag is documented in --help, and run_pretraining.py's own parser accepts the command line."""
    for flag in flags:
        name = flag.split("=", 1)[0]
        assert re.search(rf"(^|[\s,\[]){re.escape(name)}([\s,=\]]|$)", help_text, re.M), f"{name} not in --help"
    return run_pretraining.parse_args(flags)


def flag_values(flags: list[str]) -> dict[str, str | bool]:
    return {f.split("=", 1)[0]: (f.split("=", 1)[1] if "=" in f else True) for f in flags}


# ---------------------------------------------------------------------------------------------------------------
# Syntax


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_syntax(path):
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_expected_scripts_exist():
    names = {str(p.relative_to(REPO)) for p in SHELL_SCRIPTS}
    assert {
        "scripts/run_pretraining.sh",
        "scripts/configs/pretrain_config.sh",
        "scripts/docker/build.sh",
        "scripts/docker/launch.sh",
        "scripts/run_cpu_demo.sh",
        "run.sub",
    } <= names


# ---------------------------------------------------------------------------------------------------------------
# Presets


def test_every_expected_preset_is_defined(presets):
    assert set(presets) == EXPECTED_PRESETS


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_arguments_are_valid(presets, name):
    words = presets[name]
    want = 26 if name in SMALL_PRESETS else 25
    assert len(words) == want, f"{name} echoes {len(words)} words, not {want} positional arguments"
    if want == 26:
        assert words[25] in ("nvlamb", "adamw")
    arg = {i + 1: w for i, w in enumerate(words)}
    for i in INT_ARGS:
        assert re.fullmatch(r"[0-9]+", arg[i]), f"argument {i} = {arg[i]!r}"
    for i in FLOAT_ARGS:
        assert float(arg[i]) > 0, f"argument {i} = {arg[i]!r}"
    for i in BOOL_ARGS:
        assert arg[i] in ("true", "false"), f"argument {i} = {arg[i]!r}"
    assert arg[3] in PRECISIONS
    assert 0 < float(arg[5]) < 1 and 0 < float(arg[18]) < 1
    assert int(arg[1]) % int(arg[11]) == 0 and int(arg[16]) % int(arg[20]) == 0, "batch not divisible by accumulation"
    assert arg[21].startswith("/") and arg[22].startswith("/") and arg[25].endswith(".json")
    assert arg[24] == "None" or Path(arg[24]).suffix in (".pt", "")
    if arg[3] in ("fp32", "tf32"):
        assert arg[15] == "false", "half-precision all-reduce in a full-precision preset"


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS - SMALL_PRESETS))
def test_gpu_presets_keep_nvidias_global_batch(presets, name):
    arg = {i + 1: w for i, w in enumerate(presets[name])}
    gpus = int(arg[4])
    assert int(arg[1]) * gpus == 65536 and int(arg[16]) * gpus == 32768
    assert (arg[2], arg[6], arg[17], arg[19]) == ("6e-3", "7038", "4e-3", "1563")
    assert arg[25] == "/workspace/bert/bert_config.json" and arg[23] == "/workspace/bert"
    assert arg[3] == name.rsplit("_", 1)[1] and f"_{gpus}gpu_" in name


def test_cpu_preset_takes_the_rate_measured_for_the_demo(presets):
    """The cpu preset (the README's main job): AdamW 1e-3 at batch 32 for 4,000 steps, the run that left the
    word-frequency plateau on the demo's Wikipedia shards (bench/STUDIES.md, "The README's main job"); phase 2
    takes half of it."""
    arg = {i + 1: w for i, w in enumerate(presets["cpu"])}
    assert (arg[1], arg[4], arg[6], arg[26]) == ("32", "1", "4000", "adamw")
    assert float(arg[2]) == 1e-3 and float(arg[17]) == 5e-4
    assert arg[21].endswith("/hdf5_phase1/") and arg[22].endswith("/hdf5_seq512/")


def test_small_gpu_preset_takes_the_rate_measured_on_a_gpu(presets):
    """small_1gpu_bf16: batch 256 on one GPU, where the CPU rule's extrapolation (NVLAMB 2.83e-2) diverged and
    AdamW 1e-3 learned best (bench/gpu_study.py on an H200, bench/STUDIES.md): AdamW, 1e-3, phase 2 half of it."""
    arg = {i + 1: w for i, w in enumerate(presets["small_1gpu_bf16"])}
    assert (arg[1], arg[4], arg[26]) == ("256", "1", "adamw")
    assert float(arg[2]) == 1e-3 and float(arg[17]) == 5e-4


def test_cpu_preset_uses_this_repository(presets):
    arg = {i + 1: w for i, w in enumerate(presets["cpu"])}
    assert arg[4] == "1" and arg[3] == "auto"  # bf16 only where the CPU has it natively
    assert Path(arg[23]) == REPO and Path(arg[25]) == REPO / "configs" / "bert-small-cpu.json"


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_makes_valid_run_pretraining_commands(presets, help_text, name, tmp_path):
    words = presets[name]
    out = bash(
        f"bash {shlex.quote(str(RUN_SH))} {' '.join(map(shlex.quote, words))}",
        env={"DRY_RUN": "1", "RESULTS_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    commands = run_pretraining_commands(out.stdout)
    assert len(commands) == 2, out.stdout
    arg = {i + 1: w for i, w in enumerate(words)}
    phase1, phase2 = (check_flags_against_run_pretraining(c, help_text) for c in commands)
    assert (phase1.training.train_batch_size, phase1.training.max_steps, phase1.data.max_seq_length) == (
        int(arg[1]),
        int(arg[6]),
        128,
    )
    assert phase1.training.gradient_accumulation_steps == (int(arg[11]) if arg[10] == "true" else 1)
    assert (phase2.training.train_batch_size, phase2.training.max_steps, phase2.data.max_seq_length) == (
        int(arg[16]),
        int(arg[19]),
        512,
    )
    assert phase2.checkpoint.phase2 and phase2.checkpoint.phase1_end_step == int(arg[6])
    assert phase2.checkpoint.resume_from_checkpoint
    assert not phase1.checkpoint.phase2 and phase1.checkpoint.resume_from_checkpoint == (arg[8] == "true")
    assert phase1.optimizer.learning_rate == float(arg[2]) and phase2.optimizer.learning_rate == float(arg[17])
    assert phase1.training.seed == phase2.training.seed == int(arg[12])
    assert phase1.precision.precision == phase2.precision.precision == arg[3]
    assert phase1.data.input_dir == arg[21] and phase2.data.input_dir == arg[22]
    assert phase1.model.config_file == arg[25]
    assert phase1.checkpoint.output_dir == phase2.checkpoint.output_dir  # phase 2 finds phase 1's checkpoint there
    assert phase1.parallelism.allreduce_post_accumulation_fp16 == (arg[15] == "true")
    launcher = out.stdout.splitlines()[0]
    if int(arg[4]) > 1:
        assert f"-m torch.distributed.run --standalone --nproc_per_node={arg[4]} " in launcher
    else:
        assert "torch.distributed.run" not in launcher
    assert launcher.startswith("env NVIDIA_TF32_OVERRIDE=0 ") == (arg[3] == "fp32")


# ---------------------------------------------------------------------------------------------------------------
# run_pretraining.sh on its own


def test_defaults_are_nvidias(help_text, tmp_path):
    out = bash(
        "bash " + shlex.quote(str(RUN_SH)),
        env={"DRY_RUN": "1", "RESULTS_DIR": str(tmp_path), "BERT_PREP_WORKING_DIR": "/prep"},
    )
    assert out.returncode == 0, out.stderr
    phase1, phase2 = (flag_values(c) for c in run_pretraining_commands(out.stdout))
    d = NVIDIA_DEFAULTS
    assert (
        phase1["--train_batch_size"] == d[0] and phase1["--learning_rate"] == d[1] and phase1["--precision"] == "fp16"
    )
    assert phase1["--warmup_proportion"] == d[4] and phase1["--max_steps"] == d[5]
    assert phase1["--num_steps_per_checkpoint"] == d[6] and "--resume_from_checkpoint" not in phase1
    assert phase1["--gradient_accumulation_steps"] == d[10] and phase1["--seed"] == d[11]
    assert "--allreduce_post_accumulation" in phase1 and "--allreduce_post_accumulation_fp16" in phase1
    assert (
        phase2["--train_batch_size"],
        phase2["--learning_rate"],
        phase2["--warmup_proportion"],
        phase2["--max_steps"],
        phase2["--gradient_accumulation_steps"],
    ) == tuple(d[15:20])
    assert phase1["--max_predictions_per_seq"] == "20" and phase2["--max_predictions_per_seq"] == "80"
    assert phase1["--input_dir"].startswith("/prep/hdf5_lower_case_1_seq_len_128_max_pred_20_")
    assert phase2["--input_dir"].startswith("/prep/hdf5_lower_case_1_seq_len_512_max_pred_80_")
    assert phase1["--config_file"] == str(REPO / "bert_config.json")
    assert "--nproc_per_node=8" in out.stdout.splitlines()[0]


def test_help_lists_all_25_arguments():
    out = bash(f"bash {shlex.quote(str(RUN_SH))} -h")
    assert out.returncode == 0
    for i, name in enumerate(
        [
            "train_batch_size",
            "learning_rate",
            "precision",
            "num_gpus",
            "warmup_proportion",
            "train_steps",
            "save_checkpoint_steps",
            "resume_training",
            "create_logfile",
            "accumulate_gradients",
            "gradient_accumulation_steps",
            "seed",
            "job_name",
            "allreduce_post_accumulation",
            "allreduce_post_accumulation_fp16",
            "train_batch_size_phase2",
            "learning_rate_phase2",
            "warmup_proportion_phase2",
            "train_steps_phase2",
            "gradient_accumulation_steps_phase2",
            "DATA_DIR_PHASE1",
            "DATA_DIR_PHASE2",
            "CODEDIR",
            "init_checkpoint",
            "BERT_CONFIG",
        ],
        start=1,
    ):
        assert re.search(rf"^\s*{i} {name}\s", out.stdout, re.M), f"argument {i} {name} missing from -h"


@pytest.mark.parametrize(
    "args, message",
    [
        (["64", "1e-3", "fp8"], "argument 3 (precision)"),
        (["6x4"], "argument 1 (train_batch_size)"),
        (["64", "fast"], "argument 2 (learning_rate)"),
        (["64", "1e-3", "fp32", "1", "0.1", "10", "5", "maybe"], "argument 8 (resume_training)"),
        (["64", "1e-3", "fp32", "1", "0.1", "10", "5", "false", "false", "true", "3"], "not divisible"),
    ],
)
def test_bad_arguments_fail_in_one_line(args, message, tmp_path):
    out = bash(" ".join(["bash", shlex.quote(str(RUN_SH))] + args), env={"DRY_RUN": "1", "RESULTS_DIR": str(tmp_path)})
    assert out.returncode == 1 and out.stdout == ""
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_missing_data_folder_is_an_error(tmp_path):
    out = bash(
        f"bash {shlex.quote(str(RUN_SH))} 8 1e-3 fp32 1 0.1 2 1 false false false 1 1 job false false 8 1e-3 0.1 1 1 "
        f"{tmp_path}/nowhere {tmp_path}/nowhere2",
        env={"RESULTS_DIR": str(tmp_path)},
    )
    assert out.returncode == 1 and "phase 1 data folder" in out.stderr and "argument 21" in out.stderr


def test_phases_extra_args_and_cpu_processes(help_text, tmp_path):
    out = bash(
        f"bash {shlex.quote(str(RUN_SH))} 64 1e-3 bf16 2",
        env={
            "DRY_RUN": "1",
            "RESULTS_DIR": str(tmp_path),
            "PHASES": "2",
            "EXTRA_ARGS": "--log_freq=5 --num_workers 1",
            "VOCAB_FILE": "/v/vocab.txt",
            "EVAL_DIR_PHASE2": "/eval",
            "MAX_SEQ_LENGTH_PHASE2": "256",
            "MAX_PRED_PHASE2": "40",
        },
    )
    assert out.returncode == 0, out.stderr
    (flags,) = run_pretraining_commands(out.stdout)
    cfg = check_flags_against_run_pretraining(flags, help_text)
    assert cfg.checkpoint.phase2 and cfg.logging.log_freq == 5 and cfg.data.num_workers == 1
    assert cfg.data.vocab_file == "/v/vocab.txt" and cfg.evaluation.eval_dir == "/eval"
    assert (
        cfg.data.max_seq_length == 256 and cfg.data.max_predictions_per_seq == 40 and cfg.precision.precision == "bf16"
    )


# ---------------------------------------------------------------------------------------------------------------
# run.sub


def run_sub(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    return subprocess.run(
        ["bash", str(REPO / "run.sub")], capture_output=True, text=True, cwd=REPO, timeout=60, env={**clean, **env}
    )


@pytest.mark.parametrize("phase, nodes", [("1", "1"), ("2", "4")])
def test_run_sub_builds_one_task_per_gpu(help_text, phase, nodes):
    out = run_sub(
        {
            "DRY_RUN": "1",
            "CONT": "registry/bert:latest",
            "DATADIR_PHASE1": "/lustre/p1",
            "DATADIR_PHASE2": "/lustre/p2",
            "CHECKPOINTDIR": "/lustre/ckpt",
            "PHASE": phase,
            "SLURM_JOB_NUM_NODES": nodes,
            "SLURM_NTASKS_PER_NODE": "8",
            "SLURM_JOB_ID": "1234",
        }
    )
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    at = next(i for i, w in enumerate(words) if w.endswith("run_pretraining.py"))
    srun = flag_values([w for w in words[:at] if w.startswith("--")])
    assert words[0] == "srun" and srun["--ntasks-per-node"] == "8" and srun["--nodes"] == nodes
    assert srun["--container-image"] == "registry/bert:latest"
    mounts = dict(m.split(":") for m in srun["--container-mounts"].split(","))
    assert mounts[f"/lustre/p{phase}"] == "/data" and mounts["/lustre/ckpt"] == "/checkpoints"
    cfg = check_flags_against_run_pretraining(words[at + 1 :], help_text)
    world = int(nodes) * 8
    assert cfg.data.input_dir == "/data" and cfg.checkpoint.output_dir == "/checkpoints"
    assert cfg.checkpoint.resume_from_checkpoint
    assert cfg.precision.precision == "bf16" and cfg.parallelism.allreduce_post_accumulation
    if phase == "1":
        assert cfg.training.train_batch_size * world == 65536 and cfg.training.micro_batch_size == 256
        assert cfg.data.max_seq_length == 128
        assert not cfg.checkpoint.phase2
    else:
        assert cfg.training.train_batch_size * world == 32768 and cfg.training.micro_batch_size == 32
        assert cfg.data.max_seq_length == 512
        assert cfg.checkpoint.phase2 and cfg.checkpoint.phase1_end_step == 7038


def test_run_sub_takes_batch_lr_and_accumulation_from_the_environment(help_text):
    out = run_sub(
        {
            "DRY_RUN": "1",
            "CONT": "c",
            "DATADIR": "/d",
            "CHECKPOINTDIR": "/c",
            "BATCHSIZE": "96",
            "LR": "1e-3",
            "GRADIENT_STEPS": "3",
            "PRECISION": "fp16",
        }
    )
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    at = next(i for i, w in enumerate(words) if w.endswith("run_pretraining.py"))
    cfg = check_flags_against_run_pretraining(words[at + 1 :], help_text)
    assert (
        cfg.training.train_batch_size,
        cfg.optimizer.learning_rate,
        cfg.training.gradient_accumulation_steps,
        cfg.precision.precision,
    ) == (96, 1e-3, 3, "fp16")


@pytest.mark.parametrize("container", ["c", ""], ids=["container", "no_container"])
@pytest.mark.parametrize("missing", ["CHECKPOINTDIR", "DATADIR"])
def test_run_sub_requires_its_folders(missing, container):
    env = {"CONT": container, "DATADIR": "/d", "CHECKPOINTDIR": "/c", "DRY_RUN": "1"}
    del env[missing]
    out = run_sub(env)
    assert out.returncode == 1 and missing in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_run_sub_without_a_container_runs_the_checkout(help_text):
    """No CONT: srun starts the checkout's run_pretraining.py with its .venv (or PYTHON), on the host's paths."""
    env = {
        "DRY_RUN": "1",
        "DATADIR_PHASE1": "/lustre/p1",
        "CHECKPOINTDIR": "/lustre/ckpt",
        "PRECISION": "fp32",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS_PER_NODE": "4",
    }
    out = run_sub(env)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    at = next(i for i, w in enumerate(words) if w.endswith("run_pretraining.py"))
    srun = flag_values([w for w in words[: at - 2] if w.startswith("--")])
    assert words[0] == "srun" and srun == {
        "--nodes": "2",
        "--ntasks-per-node": "4",
        "--kill-on-bad-exit": "0",
        "--wait": "120",
        "--chdir": str(REPO),
    }
    venv = REPO / ".venv" / "bin" / "python"
    assert words[at - 2 : at + 1] == [str(venv) if venv.exists() else "python3", "-u", str(REPO / "run_pretraining.py")]
    cfg = check_flags_against_run_pretraining(words[at + 1 :], help_text)
    assert (cfg.data.input_dir, cfg.checkpoint.output_dir, cfg.model.config_file) == (
        "/lustre/p1",
        "/lustre/ckpt",
        str(REPO / "bert_config.json"),
    )
    assert cfg.logging.json_summary == "/lustre/ckpt/results/phase1.json" and cfg.checkpoint.resume_from_checkpoint
    assert cfg.precision.precision == "fp32"  # named: run_pretraining.py's own default (auto) could pick bf16 on a CPU
    assert cfg.training.train_batch_size * 8 == 65536

    out = run_sub({**env, "PYTHON": "/opt/py/bin/python3", "CONFIG": "/cfg/tiny.json"})
    words = shlex.split(out.stdout)
    assert words[words.index(str(REPO / "run_pretraining.py")) - 2] == "/opt/py/bin/python3"
    assert "--config_file=/cfg/tiny.json" in words


def test_run_sub_finds_the_checkout_from_the_submit_folder(tmp_path):
    """sbatch runs a copy of the script from its spool folder: the checkout is then the folder sbatch ran in."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "slurm_script").write_text((REPO / "run.sub").read_text())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))},
        "DRY_RUN": "1",
        "DATADIR": "/d",
        "CHECKPOINTDIR": "/c",
    }
    out = subprocess.run(
        ["bash", str(spool / "slurm_script")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "SLURM_SUBMIT_DIR": str(REPO)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f" {REPO / 'run_pretraining.py'} " in out.stdout and f"--chdir={REPO} " in out.stdout
    out = subprocess.run(
        ["bash", str(spool / "slurm_script")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "SLURM_SUBMIT_DIR": str(tmp_path)},
        timeout=60,
    )
    assert out.returncode == 1 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert "set CODEDIR to the checkout" in out.stderr and "or set CONT" in out.stderr
    out = subprocess.run(
        ["bash", str(REPO / "run.sub")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "CODEDIR": str(tmp_path)},
    )
    assert out.returncode == 1 and f"no run_pretraining.py in CODEDIR {tmp_path}" in out.stderr


def test_run_sub_missing_data_folder_fails_before_srun(tmp_path):
    out = run_sub({"DATADIR_PHASE1": str(tmp_path / "nowhere"), "CHECKPOINTDIR": str(tmp_path / "c")})
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        f"run.sub: DATADIR_PHASE1 folder {tmp_path / 'nowhere'} not found: point it at "
        "the phase 1 HDF5 shards (data/create_datasets_from_start.sh writes them)"
    )


# ---------------------------------------------------------------------------------------------------------------
# Multi-node torchrun settings of the launchers (scripts/torchrun_launcher.sh)


LAUNCHERS = {"run_pretraining.sh": "run_pretraining.py", "run_squad.sh": "run_squad.py", "run_glue.sh": "run_glue.py"}


def launcher_words(script: str, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The words before the entry script in the first command the launcher prints (DRY_RUN)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NNODES", "NODE_RANK", "RDZV_ENDPOINT", "RDZV_ID", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith("SLURM_")
    }
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**clean, "DRY_RUN": "1", "PYTHON": "py", **env},
    )
    if out.returncode != 0:
        return out, []
    words = shlex.split(out.stdout.splitlines()[0])
    return out, words[: next(i for i, w in enumerate(words) if w.endswith(LAUNCHERS[script]))]


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_launchers_take_multi_node_settings_from_the_environment(script):
    torchrun = ["py", "-m", "torch.distributed.run"]
    out, words = launcher_words(script, {})  # defaults: 8 processes on this node, as before
    assert words == [*torchrun, "--standalone", "--nproc_per_node=8"], out.stderr
    out, words = launcher_words(script, {"MASTER_ADDR": "10.0.0.1", "NNODES": "1"})  # one node: unchanged
    assert words == [*torchrun, "--standalone", "--nproc_per_node=8"], out.stderr
    # c10d rendezvous: the same command on every node
    out, words = launcher_words(
        script, {"NNODES": "4", "RDZV_ENDPOINT": "node1:29400", "RDZV_ID": "run7", "NODE_RANK": "3"}
    )
    assert words == [
        *torchrun,
        "--nnodes=4",
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=node1:29400",
        "--rdzv_id=run7",
    ], out.stderr
    out, words = launcher_words(script, {"NNODES": "2", "RDZV_ENDPOINT": "node1:29400", "SLURM_JOB_ID": "55"})
    assert words[-1] == "--rdzv_id=55", out.stderr  # in a Slurm job the job id names the rendezvous
    # static rendezvous on node 0
    out, words = launcher_words(
        script, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"}
    )
    assert words == [
        *torchrun,
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=1",
        "--master_addr=10.0.0.1",
        "--master_port=6000",
    ], out.stderr


def test_multi_node_with_one_process_per_node_still_uses_torchrun():
    out, words = launcher_words(
        "run_pretraining.sh", {"NNODES": "2", "RDZV_ENDPOINT": "127.0.0.1:29400"}, "256", "1e-3", "tf32", "1"
    )
    assert words[1:5] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"], out.stderr
    out, words = launcher_words("run_pretraining.sh", {}, "256", "1e-3", "tf32", "1")
    assert words == ["py"], out.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"NNODES": "two"}, "NNODES must be a positive integer, got 'two'"),
        ({"NNODES": "2"}, "NNODES=2 needs MASTER_ADDR (node 0's address) or RDZV_ENDPOINT"),
        ({"NNODES": "2", "MASTER_ADDR": "n1"}, "NNODES=2 with MASTER_ADDR needs NODE_RANK (0..1, 0 on n1)"),
        ({"NNODES": "2", "MASTER_ADDR": "n1", "NODE_RANK": "2"}, "NODE_RANK must be 0..1 (NNODES=2), got '2'"),
        ({"NNODES": "2", "MASTER_ADDR": "n1", "NODE_RANK": "0", "MASTER_PORT": "x"}, "MASTER_PORT must be a port"),
        ({"NNODES": "2", "RDZV_ENDPOINT": "node1"}, "RDZV_ENDPOINT must be host:port"),
    ],
)
@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_bad_multi_node_settings_fail_in_one_line(script, env, message):
    out, _ = launcher_words(script, env)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.startswith(f"{script}: ") and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------------
# Docker, the CPU demo


def test_dockerfile_uses_an_ngc_pytorch_image_and_the_requirements():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"nvcr\.io/nvidia/pytorch:2[5-9]\.\d\d-py3", text)
    assert "pip install --no-cache-dir -r requirements.txt" in text
    assert "torch" not in (REPO / "requirements.txt").read_text().split("#")[-1].split()  # the image brings torch
    assert re.search(r"^\.venv$", (REPO / ".dockerignore").read_text(), re.M)


def test_launch_sh_mounts_the_folders(tmp_path):
    """The docker command launch.sh builds (DRY_RUN=1): every GPU, the three folders at their fixed places."""
    folders = [tmp_path / name for name in ("data", "ckpt", "results")]
    out = bash("bash scripts/docker/launch.sh " + " ".join(map(str, folders)) + " -- nvidia-smi", env={"DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert words[:3] == ["docker", "run", "--rm"] and "--gpus" in words and words[-2:] == ["bert:latest", "nvidia-smi"]
    mounts = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
    assert mounts == [
        f"{folders[0]}:/workspace/data",
        f"{folders[1]}:/workspace/bert/checkpoints",
        f"{folders[2]}:/workspace/bert/results",
    ]
    assert not any(f.exists() for f in folders)  # a dry run makes nothing


def test_cpu_demo_without_data_fails_in_one_line(tmp_path):
    # A copy of the repository's scripts in a folder with no ../shared/data beside it.
    repo = tmp_path / "checkout"
    (repo / "scripts" / "configs").mkdir(parents=True)
    for name in ("scripts/run_cpu_demo.sh", "scripts/configs/pretrain_config.sh"):
        (repo / name).write_text((REPO / name).read_text())
    out = bash(f"bash {repo}/scripts/run_cpu_demo.sh --out {tmp_path}/out")
    assert out.returncode == 1 and "--corpus" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------------
# For real: both phases through the launcher, a tiny model, a few steps.


def test_two_phases_for_real(shared_data, tmp_path):

    text = shared_data / "bert-sample-text" / "sample_text.txt"
    vocab = shared_data / "bert-vocab" / "bert-base-uncased-vocab.txt"
    for seq, pred, folder in ((32, 5, "p1"), (64, 10, "p2")):
        create_pretraining_data.main(
            [
                "--input_file",
                str(text),
                "--output_file",
                str(tmp_path / folder / "s.hdf5"),
                "--vocab_file",
                str(vocab),
                "--max_seq_length",
                str(seq),
                "--max_predictions_per_seq",
                str(pred),
                "--dupe_factor",
                "1",
                "--num_workers",
                "1",
                "--no_progress",
            ]
        )
    config = tmp_path / "tiny.json"
    config.write_text(
        '{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
        '"intermediate_size": 64, "max_position_embeddings": 64}'
    )
    args = [
        "8",
        "1e-3",
        "fp32",
        "1",
        "0.5",
        "3",
        "2",
        "false",
        "true",
        "true",
        "2",
        "7",
        "tiny",
        "false",
        "false",
        "4",
        "1e-3",
        "0.5",
        "2",
        "1",
        str(tmp_path / "p1"),
        str(tmp_path / "p2"),
        str(REPO),
        "None",
        str(config),
    ]
    results = tmp_path / "results"
    out = bash(
        " ".join(["bash", shlex.quote(str(RUN_SH))] + args),
        env={
            "RESULTS_DIR": str(results),
            "PYTHON": sys.executable,
            "MAX_SEQ_LENGTH_PHASE1": "32",
            "MAX_PRED_PHASE1": "5",
            "MAX_SEQ_LENGTH_PHASE2": "64",
            "MAX_PRED_PHASE2": "10",
            "EXTRA_ARGS": "--num_workers 0 --disable_progress_bar --log_freq 1",
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    checkpoints = sorted(p.name for p in (results / "checkpoints").glob("ckpt_*.pt"))
    assert checkpoints == ["ckpt_2.pt", "ckpt_3.pt", "ckpt_5.pt"]  # phase 2 numbers its steps after phase 1's 3
    logs = sorted(results.glob("tiny.pyt_bert_pretraining_phase*_fp32_gbs*.log"))
    assert [p.name.split(".")[1] for p in logs] == [
        "pyt_bert_pretraining_phase1_fp32_gbs8",
        "pyt_bert_pretraining_phase2_fp32_gbs4",
    ]
    assert "--phase2" in logs[1].read_text().splitlines()[0]  # the command heads the log
    assert "phase 2 finished" in out.stderr and '"FINAL"' in out.stderr
    assert (results / "tiny.phase1.json").is_file() and (results / "tiny.phase2.json").is_file()


TINY_DEMO_CONFIG = (
    '{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
    '"intermediate_size": 64, "max_position_embeddings": 512}'
)


@pytest.fixture(scope="module")
def demo_run(shared_data, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The README's main job on one Wikipedia file, 2 + 1 steps of a 1-layer model with a vocabulary of 1234
    learned from the text: its --out folder and the finished command. Run once for the two tests that need exactly
    this command (what it writes; the run that --init_checkpoint continues), instead of once each."""
    folder = tmp_path_factory.mktemp("demo")
    config = folder / "tiny.json"
    config.write_text(TINY_DEMO_CONFIG)
    out = folder / "demo"
    corpus = shared_data / "wikipedia-en-slice" / "text" / "AA" / "wiki_00.gz"
    run = bash(
        f"bash {REPO}/scripts/run_cpu_demo.sh --corpus {corpus} --vocab_size 1234 --config {config} "
        f"--phase1_steps 2 --phase2_steps 1 --out {out}",
        env={"PYTHON": sys.executable},
    )
    return out, run


def test_cpu_demo_learns_its_vocabulary_and_writes_the_measured_shards(demo_run):
    """The README's main job on one Wikipedia file, 2 + 1 steps of a 1-layer model: the vocabulary is learned from
    the training text, the config takes its size (1234 lines -> 1240, the next multiple of 8), phase 1 trains on
    sequence-64 shards with 30% masked (20 slots), held out at 15% (10 slots), with AdamW 1e-3 held constant."""
    import h5py

    out, run = demo_run
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1234 and lines[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert json.loads((out / "bert_config.json").read_text())["vocab_size"] == 1240
    with h5py.File(out / "hdf5_phase1" / "train.hdf5", "r") as f:
        ids, positions = f["input_ids"][:], f["masked_lm_positions"][:]
    assert ids.shape[1] == 64 and positions.shape[1] == 20
    full = (ids > 0).sum(1) == 64  # Google's rule: round(masked_lm_prob x the sequence's tokens, [CLS] and [SEP] too)
    assert full.any() and ((positions[full] > 0).sum(1) == round(0.3 * 64)).all()
    with h5py.File(out / "hdf5_heldout" / "heldout.hdf5", "r") as f:
        assert f["input_ids"].shape[1] == 64 and f["masked_lm_positions"].shape[1] == 10
        held = f["input_ids"][:]
        assert ((f["masked_lm_positions"][:][(held > 0).sum(1) == 64] > 0).sum(1) == round(0.15 * 64)).all()
    phase1 = next(out.glob("run_*/bert_cpu_demo.phase1.json")).read_text().splitlines()
    params = next(r["data"] for r in map(json.loads, phase1) if r["step"] == "PARAMETER")
    assert (params["optimizer"], params["learning_rate"], params["lr_schedule"]) == ("adamw", 1e-3, "constant")
    assert (params["max_seq_length"], params["max_predictions_per_seq"]) == (64, 20)
    assert Path(params["vocab_file"]) == out / "vocab.txt"
    assert "learned? phase 1, step 2: context gain" in run.stdout


def test_cpu_demo_continues_pre_training_from_a_checkpoint(shared_data, demo_run, tmp_path):
    """--init_checkpoint: a second run on other text starts from the first run's weights (the module's demo run).
    With --lr 0 AdamW moves nothing (lr x update and lr x weight decay are both 0), so the second run's phase-1
    checkpoint must hold the first run's weights exactly; a run that started from its own initialisation (seed 42,
    output bias at the log word frequencies) would not."""
    import torch

    text = shared_data / "wikipedia-en-slice" / "text" / "AA"
    first, run = demo_run
    second = tmp_path / "second"
    assert run.returncode == 0, run.stderr[-3000:]
    start = next(first.glob("run_*/checkpoints/ckpt_3.pt"))
    run = bash(
        f"bash {REPO}/scripts/run_cpu_demo.sh --corpus {text / 'wiki_01.gz'} --init_checkpoint {start} "
        f"--vocab {first / 'vocab.txt'} --config {first / 'bert_config.json'} --lr 0 --phase1_steps 1 "
        f"--phase2_steps 1 --out {second}",
        env={"PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    phase1 = next(second.glob("run_*/bert_cpu_demo.phase1.json")).read_text().splitlines()
    params = next(r["data"] for r in map(json.loads, phase1) if r["step"] == "PARAMETER")
    assert Path(params["init_checkpoint"]) == start
    before = torch.load(start, map_location="cpu", weights_only=True)["model"]
    after = torch.load(next(second.glob("run_*/checkpoints/ckpt_1.pt")), map_location="cpu", weights_only=True)["model"]
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0, msg=name)
    # Without the model's own vocabulary or config the run is refused before any work (one line, exit 1).
    for missing in ("--vocab", "--config"):
        flags = {"--vocab": f"--vocab {first / 'vocab.txt'}", "--config": f"--config {first / 'bert_config.json'}"}
        flags.pop(missing)
        run = bash(
            f"bash {REPO}/scripts/run_cpu_demo.sh --corpus {text / 'wiki_01.gz'} --init_checkpoint {start} "
            f"{' '.join(flags.values())} --out {tmp_path / 'refused'}",
            env={"PYTHON": sys.executable},
        )
        assert run.returncode == 1 and f"--init_checkpoint needs {missing}" in run.stderr, run.stderr
        assert not (tmp_path / "refused").exists()


# ---------------------------------------------------------------------------------------------------------------
# scripts/text_to_documents.py, the CPU demo's text step


WIKITEXT_SAMPLE = """ 
 = First Article = 
 
 The rock is 1 @,@ 000 m high , a well @-@ known <unk> . It was 2 @.@ 5 km away ! Then it fell . 
 
 = = History = = 
 
 Second paragraph here . 
 
 = Second Article = 
 
 Only one line . 
"""


def test_wikitext_becomes_documents_and_sentences(tmp_path):

    source = tmp_path / "wiki.txt"
    source.write_text(WIKITEXT_SAMPLE)
    assert main(["--input", str(source), "--output", str(tmp_path / "docs.txt")]) == 0
    assert (tmp_path / "docs.txt").read_text().splitlines() == [
        "The rock is 1,000 m high , a well-known . It was 2.5 km away ! Then it fell . Second paragraph here .",
        "Only one line .",
    ]
    assert (
        main(
            [
                "--input",
                str(source),
                "--output",
                str(tmp_path / "train.txt"),
                "--sentences",
                "--test_fraction",
                "0.5",
                "--test_output",
                str(tmp_path / "test.txt"),
            ]
        )
        == 0
    )
    train = (tmp_path / "train.txt").read_text().split("\n\n")
    assert train[0].splitlines() == [
        "The rock is 1,000 m high , a well-known .",
        "It was 2.5 km away !",
        "Then it fell .",
        "Second paragraph here .",
    ]
    assert (tmp_path / "test.txt").read_text() == "Only one line .\n\n"


def test_plain_text_documents_are_blank_line_separated(tmp_path):

    source = tmp_path / "mine.txt"
    source.write_text("First doc, line one.\nLine two.\n\n\nSecond doc.\n")
    assert list(iter_documents(source)) == [["First doc, line one.", "Line two."], ["Second doc."]]


def test_wikiextractor_files_become_documents(shared_data, tmp_path):
    """The CPU demo's default corpus: the Wikipedia slice's gzipped WikiExtractor files, read through a folder."""
    import gzip

    source = shared_data / "wikipedia-en-slice" / "text" / "AA" / "wiki_00.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("<doc ")]
    # the reference, written out: a <doc> line, the title line, then the paragraphs (non-empty lines, stripped) up
    # to </doc>
    first = [line.strip() for line in lines[starts[0] + 2 : lines.index("</doc>")] if line.strip()]
    docs = list(iter_documents(source))
    assert len(docs) == len(starts) == 38 and docs[0] == first  # PROVENANCE: article 12, "Anarchism", comes first
    assert docs[0][0].startswith("Anarchism is a political philosophy")
    folder = tmp_path / "text" / "AA"  # a folder of wiki_* files without a suffix, as WikiExtractor writes them
    folder.mkdir(parents=True)
    (folder / "wiki_00").write_text("\n".join(lines[: lines.index("</doc>") + 1]) + "\n", encoding="utf-8")
    (folder / "notes.md").write_text("not a corpus file\n")
    assert write_documents([tmp_path / "text"], tmp_path / "docs.txt") == (1, 0)
    assert (tmp_path / "docs.txt").read_text(encoding="utf-8") == " ".join(first) + "\n"


def test_real_wikitext_article_count(shared_data, tmp_path):

    valid = shared_data / "wikitext-2" / "valid.txt"
    headings = [line for line in valid.read_text().splitlines() if re.fullmatch(r" = [^=].* = ", line)]
    n_train, n_test = write_documents([valid], tmp_path / "docs.txt")
    assert (n_train, n_test) == (len(headings), 0) and len(headings) == 60  # PROVENANCE.txt: 60 articles
    assert "<unk>" not in (tmp_path / "docs.txt").read_text() and " @-@ " not in (tmp_path / "docs.txt").read_text()


def test_preset_arguments_are_named_as_run_pretraining_sh_names_them():
    """pretrain_config.sh's PRETRAIN_ARG_NAMES (what the demo and other scripts change a preset's arguments by) is
    the order of run_pretraining.sh's own `name=${N:-default}` lines, and pretrain_slot refuses an unknown name."""
    positional = re.findall(r"^(\w+)=\$\{(\d+):-", (REPO / "scripts" / "run_pretraining.sh").read_text(), re.M)
    expected = [name for name, n in sorted(positional, key=lambda p: int(p[1]))]
    assert [int(n) for _, n in sorted(positional, key=lambda p: int(p[1]))] == list(range(1, 27))
    out = bash(
        f'source {REPO}/scripts/configs/pretrain_config.sh && echo "${{PRETRAIN_ARG_NAMES[*]}}" '
        f"&& pretrain_slot train_steps_phase2 && pretrain_slot nonsense"
    )
    names, slot = out.stdout.split("\n")[:2]
    assert names.split() == expected and int(slot) == expected.index("train_steps_phase2") == 18
    assert out.returncode == 1 and "no argument named 'nonsense'" in out.stderr


def test_demo_config_takes_the_vocabularys_size_or_refuses_a_bad_config(tmp_path, uncased_vocab):
    """scripts.cpu_demo config (the demo's step between the vocabulary and the shards): bert-base-uncased's 30,522
    lines keep a config of 30522 (run_pretraining.py accepts it), a 1,234-line vocabulary gets 1240 (the next multiple
    of 8); a config without vocab_size is one line and exit 1, and nothing is written."""
    source = tmp_path / "c.json"
    source.write_text('{"vocab_size": 30522, "hidden_size": 32}')
    assert demo.main(["config", str(source), str(uncased_vocab), str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text()) == {"vocab_size": 30522, "hidden_size": 32}
    small = tmp_path / "vocab.txt"
    small.write_text("".join(f"t{i}\n" for i in range(1234)))
    demo.main(["config", str(source), str(small), str(tmp_path / "b.json")])
    assert json.loads((tmp_path / "b.json").read_text())["vocab_size"] == 1240
    source.write_text('{"hidden_size": 32}')
    with pytest.raises(SystemExit, match="is not a BERT config JSON with a vocab_size"):
        demo.main(["config", str(source), str(small), str(tmp_path / "c_out.json")])
    assert not (tmp_path / "c_out.json").exists()


ENTRY_SCRIPTS = (
    "run_pretraining.py",
    "run_squad.py",
    "run_glue.py",
    "run_swag.py",
    "inference.py",
    "extract_features.py",
    "create_pretraining_data.py",
)


def test_entry_scripts_run_as_files(tmp_path):
    """Each entry script's `if __name__ == "__main__"` block, as `python <script> --help` runs it, from another
    folder: one interpreter runs every file as __main__ in turn (one torch start instead of seven); each must print
    its usage and exit 0. The help texts themselves are checked in process (tests/test_precision.py)."""
    probe = (
        "import runpy, sys\n"
        "for script in sys.argv[1:]:\n"
        "    sys.argv = [script, '--help']\n"
        "    try:\n"
        "        runpy.run_path(script, run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), (script, e.code)\n"
        "    else:\n"
        "        raise AssertionError(f'{script} --help did not exit')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *(str(REPO / s) for s in ENTRY_SCRIPTS)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("usage:") == len(ENTRY_SCRIPTS), done.stdout[:2000]


@pytest.mark.parametrize("script", ["data/bertPrep.py", "data/create_vocab.py"])
def test_data_scripts_run_as_files_from_anywhere(script, tmp_path):
    """NVIDIA's way (`python data/bertPrep.py --action ...`): the set-up installs the project in editable mode
    (pyproject.toml), so the scripts under data/ find the project's modules from any folder, with no sys.path edit."""
    done = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
    assert not re.search(r"sys\.path\.(insert|append)|sys\.path\s*[+]?=", (REPO / script).read_text())
