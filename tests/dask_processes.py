"""A Dask scheduler and workers started as separate processes on 127.0.0.1 through a scheduler file, each in a
session of its own, as `srun` starts them on the nodes of a job: a test fixture (tests/test_engines.py), which
bench/bench_prep_engines.py borrows.

    cluster = DaskProcesses(folder, workers=2)      # folder/scheduler.json, folder/<name>.log
    ... --engine dask --dask_scheduler_file cluster.scheduler_file ...
    cluster.kill(cluster.workers[0])                 # -9 to a worker's process group: a node lost
    cluster.stop(); assert cluster.alive() == []
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bert_recipe.io.processes import pid_alive

REPO = Path(__file__).resolve().parent.parent


class DaskProcesses:
    """The scheduler and `workers` single-threaded workers; env: their environment (default: this one with
    PYTHONPATH set to the checkout, so that they import the pipeline's tasks), cwd: where they start."""

    def __init__(
        self, folder: Path, workers: int, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 60.0
    ):
        self.folder, self.scheduler_file = Path(folder), Path(folder) / "scheduler.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}
        self.cwd, self.groups = cwd, []
        scheduler = self._start(
            "scheduler",
            [
                "distributed.cli.dask_scheduler",
                "--scheduler-file",
                str(self.scheduler_file),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
            ],
        )
        deadline = time.monotonic() + timeout
        while not self.scheduler_file.is_file():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Dask scheduler did not start: {(self.folder / 'scheduler.log').read_text()}")
            time.sleep(0.1)
        self.workers = [self._start_worker(i, f"worker{i}") for i in range(workers)]
        self.wait_for_workers(workers, max(deadline - time.monotonic(), 1.0))

    def _start_worker(self, index: int, name: str) -> subprocess.Popen:
        return self._start(
            name,
            [
                "distributed.cli.dask_worker",
                "--scheduler-file",
                str(self.scheduler_file),
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--host",
                "127.0.0.1",
                "--local-directory",
                str(self.folder / f"w{index}"),
            ],
        )

    def replace_worker(self, index: int) -> None:
        """A new worker in place of workers[index] (killed: a node back after a failure), with a log of its own; it
        joins the scheduler in the background (wait_for_workers)."""
        self.workers[index] = self._start_worker(index, f"worker{index}-replacement")

    def wait_for_workers(self, n: int, timeout: float) -> None:
        """Return once `n` workers have joined the scheduler (a loaded machine starts them seconds apart), so that
        what runs next sees them all."""
        from distributed import Client

        with Client(scheduler_file=str(self.scheduler_file), timeout=timeout) as client:
            try:
                client.wait_for_workers(n, timeout=timeout)
            except TimeoutError:
                self.stop()
                raise RuntimeError(
                    f"{n} Dask workers did not join within {timeout:.0f} s: see {self.folder}/worker*.log"
                ) from None

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.folder / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv],
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        """-9 to a process group: the nanny, its worker and whatever the worker started (a node gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.groups:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill(proc)
                proc.wait()

    def alive(self, wait: float = 10.0) -> list[int]:
        """Processes of these groups still running (zombies waiting to be reaped count as gone), after waiting up
        to `wait` seconds for them to end (a nanny stops its worker first)."""
        groups = {g.pid for g in self.groups}
        deadline = time.monotonic() + wait
        while True:
            left = [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and _pgid(int(p.name)) in groups and pid_alive(int(p.name))
            ]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def _pgid(pid: int) -> int | None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        return os.getpgid(pid)
    return None
