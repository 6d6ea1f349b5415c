"""run.sub against a real Slurm controller, and the launchers across two "nodes".

Two run_pretraining.sh launchers started as two nodes (torchrun --nnodes 2, c10d rendezvous on 127.0.0.1, one
process each) end with the weights of one process that takes the whole global batch; their flags are the Slurm
jobs', so their checkpoint is also the uninterrupted reference below.

A one-node cluster (Debian's slurmctld, slurmd and munge, started by tests/slurm_cluster.py from a temporary folder
on 127.0.0.1) runs `sbatch run.sub` without a container, 2 CPU tasks (gloo) per job, a tiny BERT:
  - phase 1, with phase 2 submitted beside it with --dependency=afterok; phase 1 is stopped twice and resumed:
    once by a signal to the tasks only (`scancel --signal=TERM`, what `#SBATCH --signal=TERM@N` sends before the
    time limit: Slurm does not requeue then, run.sub does), once by `scontrol requeue` (Slurm requeues). It ends
    with the weights, optimizer state and data position of the uninterrupted 2-process run, and phase 2 waits
    through the requeues, then starts from phase 1's last checkpoint;
  - jobs that fail (a missing data folder; a folder without shards) end FAILED with one clear line and are never
    requeued, and a job depending on them is cancelled.
Without the packages (and no root to apt-get them: scripts/install_slurm.sh) the Slurm tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import documented_commands as docs
import pytest
import torch
from helpers import make_shards, max_diff, read_log, subprocess_env, weights, write_config
from slurm_cluster import SlurmCluster, free_port, installed_or_skip

import run_pretraining as rp

REPO = Path(__file__).resolve().parent.parent
STEPS1, STEPS2 = 100, 3  # phase 1 long enough (2-4 s) to be struck twice mid-run, phase 2 a few steps
SEQ1, PRED1, SEQ2, PRED2 = 32, 5, 64, 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    installed_or_skip(REPO)
    with SlurmCluster.start(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    return {
        "p1": make_shards(root / "p1", n_shards=2, n=48, seq=SEQ1, pred=PRED1),
        "p2": make_shards(root / "p2", n_shards=1, n=24, seq=SEQ2, pred=PRED2, seed=1),
        # dropout off: ranks draw their own dropout masks, and the runs here are compared with one process
        "config": write_config(root / "bert_config.json", dropout=0.0),
    }


def job_env(inputs: dict[str, Path], checkpoints: Path, phase: int = 1, **extra: str) -> dict[str, str]:
    """run.sub's environment for a tiny fp32 run: 2 tasks x batch 4 (2 micro-batches of 2), no container."""
    seq, pred, steps = (SEQ1, PRED1, STEPS1) if phase == 1 else (SEQ2, PRED2, STEPS2)
    return {
        "PHASE": str(phase),
        "DATADIR_PHASE1": str(inputs["p1"]),
        "DATADIR_PHASE2": str(inputs["p2"]),
        "CHECKPOINTDIR": str(checkpoints),
        "CONFIG": str(inputs["config"]),
        "PRECISION": "fp32",
        "BATCHSIZE": "4",
        "GRADIENT_STEPS": "2",
        "STEPS": str(steps),
        "PHASE1_STEPS": str(STEPS1),
        "LR": "1e-2",
        "WARMUP": "0.1",
        "SEED": "7",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(free_port()),  # run.sub's default follows the job id: another cluster may use it
        "EXTRA_ARGS": f"--max_seq_length {seq} --max_predictions_per_seq {pred} --num_workers 0 --log_freq 1",
        **extra,
    }


def submit(cluster: SlurmCluster, env: dict[str, str], output: Path, *sbatch_args: str, tasks: int = 2) -> str:
    """sbatch run.sub from the checkout: 2 CPU tasks (the header's --gpus-per-node=8 overridden)."""
    return cluster.sbatch(
        [f"--ntasks-per-node={tasks}", "--gpus-per-node=0", f"--output={output}", *sbatch_args, str(REPO / "run.sub")],
        env=env,
        cwd=REPO,
    )


def steps_logged(log: Path) -> list[dict]:
    return [r for r in read_log(log) if isinstance(r["step"], int)] if log.is_file() else []


def starts_logged(log: Path) -> int:
    return sum(r["step"] == "PARAMETER" for r in read_log(log)) if log.is_file() else 0


def wait_until(
    condition, what: str, cluster: SlurmCluster, output: Path, job: str | None = None, timeout: float = 120.0
):
    """Poll `condition` every 50 ms; with `job`, fail at once if that job ends first (a signal that came too late)."""
    deadline = time.monotonic() + timeout
    polls = 0
    while time.monotonic() < deadline:
        if condition():
            return
        polls += 1
        if job and polls % 20 == 0 and cluster.job(job)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"):
            if condition():
                return
            break
        time.sleep(0.05)
    state = f"job {job} is {cluster.job(job)['JobState']}, " if job else ""
    text = output.read_text()[-3000:] if output.is_file() else "(no output file)"
    raise AssertionError(f"{state}still waiting for {what}\n{text}\n{cluster.logs()}")


# ---------------------------------------------------------------------------------------------------------------
# Two "nodes" on one machine: run_pretraining.sh x 2 with torchrun --nnodes 2 and a c10d rendezvous. Its flags are
# the Slurm jobs', so its result is also their uninterrupted reference. It runs in the background while the Slurm
# jobs below wait for the scheduler (a requeued job waits ~6 s before it runs again).


class TwoNodes:
    def __init__(self, inputs: dict[str, Path], results: Path):
        # Positional arguments: what run.sub gets from job_env (per-process batch 4 in 2 micro-batches, seed 7, ...).
        args = [
            "4",
            "1e-2",
            "fp32",
            "1",
            "0.1",
            str(STEPS1),
            "200",
            "false",
            "false",
            "true",
            "2",
            "7",
            "two_nodes",
            "true",
            "false",
            "4",
            "1e-2",
            "0.1",
            "1",
            "1",
            str(inputs["p1"]),
            str(inputs["p2"]),
            str(REPO),
            "None",
            str(inputs["config"]),
        ]
        env = {
            **subprocess_env(),
            "PHASES": "1",
            "PYTHON": sys.executable,
            "RESULTS_DIR": str(results),
            "MAX_SEQ_LENGTH_PHASE1": str(SEQ1),
            "MAX_PRED_PHASE1": str(PRED1),
            "NNODES": "2",
            "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
            "RDZV_ID": "two_nodes",
            "EXTRA_ARGS": "--num_workers 0 --disable_progress_bar --log_freq 1",
        }
        self.results = results
        self.logs = [results / f"node{rank}.log" for rank in (0, 1)]
        self.nodes = []
        for rank, log in enumerate(self.logs):
            with open(log, "w") as out:
                self.nodes.append(
                    subprocess.Popen(
                        ["bash", str(REPO / "scripts" / "run_pretraining.sh"), *args],
                        env={**env, "NODE_RANK": str(rank)},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def checkpoints(self) -> Path:
        """Wait for both launchers; their checkpoint folder."""
        deadline = time.monotonic() + 240
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert [node.returncode for node in self.nodes] == [0, 0], (
            "launchers' exit statuses (None: still running after 240 s): "
            f"{[node.returncode for node in self.nodes]}\n"
            + "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs)
        )
        return self.results / "checkpoints"

    def stop(self) -> None:
        for node in self.nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


@pytest.fixture(scope="module")
def two_nodes_started(inputs, tmp_path_factory):
    launch = TwoNodes(inputs, tmp_path_factory.mktemp("two_nodes"))
    yield launch
    launch.stop()


@pytest.fixture(scope="module")
def two_nodes(two_nodes_started) -> Path:
    return two_nodes_started.checkpoints()


# ---------------------------------------------------------------------------------------------------------------
# Slurm: phase 1 struck twice and resumed, phase 2 behind it with afterok


@pytest.fixture(scope="module")
def preempted(two_nodes_started, cluster, inputs, tmp_path_factory) -> dict:
    """Phase 1, and phase 2 submitted at once behind it with --dependency=afterok. Phase 1 is stopped twice:
    1. SIGTERM to the tasks only, as `#SBATCH --signal=TERM@N` sends it before the time limit: Slurm would let the
       job end there; run.sub sees exit 75 and requeues the job itself;
    2. `scontrol requeue` (what preemption does): the whole job is signalled and Slurm requeues it."""
    root = tmp_path_factory.mktemp("preempted")
    checkpoints = root / "checkpoints"
    log = checkpoints / "results" / "phase1.json"
    output = root / "phase1.out"
    # Phase 1 as README.md and run.sub's header show it for CPU nodes, on the one node here (-N 1).
    env = {k: v for k, v in job_env(inputs, checkpoints).items() if k not in ("PYTHON", "PRECISION")}
    job1 = docs.submit(
        docs.distinct(docs.commands_for("preempted")),
        slurm_conf=cluster.conf,
        output=output,
        replace={"-N 2": "-N 1"},
        env=env,
    )
    job2 = submit(cluster, job_env(inputs, checkpoints, phase=2), root / "phase2.out", f"--dependency=afterok:{job1}")
    waiting = [cluster.job(job2)]

    wait_until(lambda: len(steps_logged(log)) >= 1, "the first step", cluster, output, job1)
    cluster.run(["scancel", "--signal=TERM", job1])
    wait_until(lambda: starts_logged(log) >= 2, "the restart after the time-limit signal", cluster, output, job1)
    waiting.append(cluster.job(job2))
    first_stop = [r for r in read_log(log) if r["step"] == "FINAL"][0]["data"]["step"]
    wait_until(
        lambda: steps_logged(log)[-1]["step"] > first_stop, "a step after the first restart", cluster, output, job1
    )
    cluster.run(["scontrol", "requeue", job1])
    info1 = cluster.wait(job1, {"COMPLETED"}, timeout=150)
    info2 = cluster.wait(job2, {"COMPLETED"}, timeout=150)
    print(output.read_text())
    return {
        "root": root,
        "checkpoints": checkpoints,
        "job1": job1,
        "info1": info1,
        "info2": info2,
        "waiting": waiting,
        "output": output.read_text(),
    }


def test_signalled_and_requeued_job_resumes_to_the_uninterrupted_weights(preempted, two_nodes):
    log = read_log(preempted["checkpoints"] / "results" / "phase1.json")
    finals = [r["data"] for r in log if r["step"] == "FINAL"]
    assert [f["stopped_by_signal"] for f in finals] == ["SIGTERM", "SIGTERM", None], finals
    stops = [f["step"] for f in finals]
    assert 0 < stops[0] < stops[1] < STEPS1 and stops[2] == STEPS1, f"stops at {stops}: a signal came too late"
    assert [r["data"]["start_step"] for r in log if r["step"] == "PARAMETER"] == [0, *stops[:2]]
    params = next(r["data"] for r in log if r["step"] == "PARAMETER")
    assert (params["world_size"], params["device"], params["precision"]) == (2, "cpu", "fp32")

    text, job = preempted["output"], preempted["job1"]
    assert preempted["info1"]["Restarts"] == "2" and preempted["info1"]["ExitCode"] == "0:0"
    assert text.count(f"requeueing job {job} to resume") == 1  # run.sub's own requeue, after the time-limit signal
    assert text.count("SIGTERM to the whole job") == 1  # scontrol requeue: Slurm's own, run.sub leaves it alone
    assert f"restart 1 of job {job}" in text and f"restart 2 of job {job}" in text and "no container" in text
    assert text.count("run_pretraining.py: phase 1 stopped at step") == 2
    assert text.rstrip().splitlines()[-1].startswith("run.sub: phase 1 done")

    # The end equals the uninterrupted run's with the same flags and 2 gloo processes (the two launchers above).
    resumed = torch.load(preempted["checkpoints"] / f"ckpt_{STEPS1}.pt", weights_only=True)
    reference = torch.load(two_nodes / f"ckpt_{STEPS1}.pt", weights_only=True)
    diff = max_diff(resumed["model"], reference["model"])
    print(f"stopped at steps {stops[:2]}; max |w_resumed - w_uninterrupted| = {diff}")
    assert diff <= 1e-6
    assert resumed["data"] == reference["data"] and resumed["world_size"] == 2
    assert resumed["scheduler"]["last_epoch"] == reference["scheduler"]["last_epoch"] == STEPS1
    torch.testing.assert_close(resumed["optimizer"], reference["optimizer"], rtol=0, atol=1e-6)


def test_phase2_waits_for_phase1_through_its_requeues(preempted):
    assert all(w["JobState"] == "PENDING" and w["Reason"] == "Dependency" for w in preempted["waiting"]), preempted[
        "waiting"
    ]
    assert preempted["info2"]["ExitCode"] == "0:0" and preempted["info2"]["Restarts"] == "0"
    ckpts = preempted["checkpoints"]
    log2 = read_log(ckpts / "results" / "phase2.json")
    params = next(r["data"] for r in log2 if r["step"] == "PARAMETER")
    assert params["max_seq_length"] == SEQ2 and params["start_step"] == STEPS1  # from phase 1's last checkpoint
    final2 = [r["data"] for r in log2 if r["step"] == "FINAL"][-1]
    assert final2["step"] == STEPS1 + STEPS2 and not final2["stopped_by_signal"]
    assert (ckpts / f"ckpt_{STEPS1 + STEPS2}.pt").is_file()
    assert (preempted["root"] / "phase2.out").read_text().rstrip().splitlines()[-1].startswith("run.sub: phase 2 done")


# ---------------------------------------------------------------------------------------------------------------
# Two "nodes" against one process


def test_two_nodes_match_one_process(inputs, two_nodes, tmp_path, one_thread):

    two = torch.load(two_nodes / f"ckpt_{STEPS1}.pt", weights_only=True)
    assert two["world_size"] == 2 and len(two["rng"]) == 2  # one process group across the two launchers
    reference = tmp_path / "one_process"  # the same global batch (8) in this process
    assert (
        rp.main(
            [
                "--input_dir",
                str(inputs["p1"]),
                "--config_file",
                str(inputs["config"]),
                "--output_dir",
                str(reference),
                "--do_train",
                "--max_seq_length",
                str(SEQ1),
                "--max_predictions_per_seq",
                str(PRED1),
                "--train_batch_size",
                "8",
                "--gradient_accumulation_steps",
                "2",
                "--learning_rate",
                "1e-2",
                "--warmup_proportion",
                "0.1",
                "--max_steps",
                str(STEPS1),
                "--seed",
                "7",
                "--precision",
                "fp32",
                "--num_workers",
                "0",
                "--disable_progress_bar",
            ]
        )
        == 0
    )
    diff = max_diff(two["model"], weights(reference / f"ckpt_{STEPS1}.pt"))
    print(f"max |w_2nodes - w_1process| after {STEPS1} steps: {diff}")
    assert diff <= 1e-5
    assert two["data"] == torch.load(reference / f"ckpt_{STEPS1}.pt", weights_only=True)["data"]


# ---------------------------------------------------------------------------------------------------------------
# Failures: one line, FAILED, never requeued


def test_failing_jobs_end_failed_in_one_line_and_are_not_requeued(cluster, inputs, tmp_path):
    missing = tmp_path / "no_such_folder"
    empty = tmp_path / "empty"
    empty.mkdir()
    job_missing = submit(cluster, job_env(inputs, tmp_path / "c1", DATADIR_PHASE1=str(missing)), tmp_path / "m.out")
    dependent = submit(
        cluster, job_env(inputs, tmp_path / "c1", phase=2), tmp_path / "d.out", f"--dependency=afterok:{job_missing}"
    )
    job_empty = submit(
        cluster, job_env(inputs, tmp_path / "c2", DATADIR_PHASE1=str(empty)), tmp_path / "e.out", tasks=1
    )

    info = cluster.wait(job_missing, {"FAILED"})
    assert info["ExitCode"] == "1:0" and info["Restarts"] == "0"
    lines = (tmp_path / "m.out").read_text().strip().splitlines()
    assert lines == [
        f"run.sub: DATADIR_PHASE1 folder {missing} not found: point it at the phase 1 HDF5 shards "
        "(data/create_datasets_from_start.sh writes them)"
    ]
    # kill_invalid_depend: phase 2 behind a failed phase 1 is cancelled instead of pending forever.
    info = cluster.wait(dependent, {"CANCELLED"})
    assert info["Reason"] == "DependencyNeverSatisfied" and not (tmp_path / "d.out").exists()

    # Training itself fails (no shards): not exit 75, so no requeue loop; run.sub's verdict is the last line.
    info = cluster.wait(job_empty, {"FAILED"})
    assert info["Restarts"] == "0" and info["ExitCode"] != "0:0"
    text = (tmp_path / "e.out").read_text()
    assert "holds no .hdf5 shards" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("run.sub: phase 1 failed: srun exited with") and last.endswith("not requeued")
