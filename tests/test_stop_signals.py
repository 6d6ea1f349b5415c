"""Every way of stopping a pre-training run through scripts/run_pretraining.sh: SIGTERM to the whole process group
(GNU `timeout`, `kill -- -PGID`, a test harness), to the launcher alone, or to run_pretraining.py alone. Each must
write the preemption checkpoint (the log goes through `tee` and there is a DataLoader worker, as in the CPU demo),
end the launcher with status 75 and one line saying how to resume, never start phase 2, and leave no process of
the run alive. A phase cut short by --steps_this_run does not start phase 2 either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PRED, SEQ, make_shards, read_log, write_config

REPO = Path(__file__).resolve().parent.parent
RUN_SH = REPO / "scripts" / "run_pretraining.sh"
EXIT_STOPPED = 75


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop")
    return make_shards(root / "shards", n_shards=2, n=64), write_config(root / "bert_config.json", hidden=32)


def launch(tmp_path: Path, setup, phase1_steps: int, extra: str = "") -> tuple[subprocess.Popen, Path, Path]:
    shards, config = setup
    results = tmp_path / "results"
    # batch lr precision gpus warmup steps save resume logfile accumulate accum seed job allreduce allreduce16
    # batch2 lr2 warmup2 steps2 accum2 data1 data2 codedir init config
    args = [
        "8",
        "1e-2",
        "fp32",
        "1",
        "0.1",
        str(phase1_steps),
        "1000",
        "false",
        "true",
        "false",
        "1",
        "1",
        "t",
        "false",
        "false",
        "8",
        "1e-2",
        "0.1",
        "3",
        "1",
        str(shards),
        str(shards),
        str(REPO),
        "None",
        str(config),
    ]
    env = {
        **os.environ,
        "RESULTS_DIR": str(results),
        "CHECKPOINTS_DIR": str(tmp_path / "ckpt"),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "MAX_SEQ_LENGTH_PHASE1": str(SEQ),
        "MAX_SEQ_LENGTH_PHASE2": str(SEQ),
        "MAX_PRED_PHASE1": str(PRED),
        "MAX_PRED_PHASE2": str(PRED),
        "EXTRA_ARGS": f"--num_workers 1 --log_freq 1 {extra}",
    }
    out, err = (open(tmp_path / name, "w") for name in ("stdout", "stderr"))
    proc = subprocess.Popen(["bash", str(RUN_SH), *args], env=env, stdout=out, stderr=err, start_new_session=True)
    return proc, results, tmp_path / "ckpt"


def session_processes(sid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of session `sid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            state, session = stat.rsplit(")", 1)[1].split()[0], int(stat.rsplit(")", 1)[1].split()[4])
            if session == sid and state != "Z":
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return found


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def wait_for_steps(results: Path, proc: subprocess.Popen, n: int) -> None:
    deadline = time.time() + 120
    log = results / "t.phase1.json"
    while True:
        assert proc.poll() is None, "the run ended before it could be stopped"
        assert time.time() < deadline, "no progress"
        if log.exists() and sum(isinstance(r["step"], int) for r in read_log(log) if r["step"] != "FINAL") >= n:
            return
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("target", ["process group", "launcher", "run_pretraining.py"])
def test_sigterm_checkpoints_stops_the_launcher_and_leaves_nothing_behind(tmp_path, setup, target):
    proc, results, ckpt = launch(tmp_path, setup, phase1_steps=100_000)
    wait_for_steps(results, proc, 3)
    if target == "process group":
        os.killpg(proc.pid, signal.SIGTERM)
    elif target == "launcher":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        python = [p for p in children(proc.pid) if b"run_pretraining.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(python) == 1
        os.kill(python[0], signal.SIGTERM)
    status = proc.wait(timeout=90)
    stderr = (tmp_path / "stderr").read_text()
    assert status == EXIT_STOPPED, stderr[-3000:]
    finals = [r["data"] for r in read_log(results / "t.phase1.json") if r["step"] == "FINAL"]
    assert finals, f"no FINAL record; the run's stderr ends:\n{stderr[-3000:]}"
    step = finals[-1]["step"]
    final = finals[-1]
    assert final["stopped_by_signal"] == "SIGTERM" and 3 <= step < 100_000
    assert (ckpt / f"ckpt_{step}.pt").is_file()  # the preemption checkpoint
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"run_pretraining.sh: phase 1 stopped at step {step} by SIGTERM: run the same command with "
        "argument 8 (resume_training) set to true to resume"
    )
    assert not (results / "t.phase2.json").exists()  # phase 2 never started
    assert not list(results.glob("*phase2*.log"))
    tee_log = next(results.glob("*phase1*.log")).read_text()  # `tee` outlived the signal and kept the last lines
    assert f"run_pretraining.py: phase 1 stopped at step {step} by SIGTERM" in tee_log
    deadline = time.time() + 15
    while session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert session_processes(proc.pid) == []  # no worker, no tee, no Python left


def test_a_phase_cut_short_does_not_start_phase_2(tmp_path, setup):
    proc, results, ckpt = launch(tmp_path, setup, phase1_steps=10, extra="--steps_this_run 2")
    assert proc.wait(timeout=90) == EXIT_STOPPED
    assert (
        (tmp_path / "stderr")
        .read_text()
        .strip()
        .splitlines()[-1]
        .startswith("run_pretraining.sh: phase 1 ended at step 2 of 10: the next phase needs it complete")
    )
    assert not (results / "t.phase2.json").exists() and (ckpt / "ckpt_2.pt").is_file()


def test_a_complete_run_goes_on_to_phase_2_and_exits_0(tmp_path, setup):
    proc, results, ckpt = launch(tmp_path, setup, phase1_steps=2)
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert (ckpt / "ckpt_2.pt").is_file() and (ckpt / "ckpt_5.pt").is_file()  # phase 2 numbers on from phase 1
