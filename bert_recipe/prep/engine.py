"""Where the data pipeline's tasks run: worker processes on this machine (`processes`, the default) or a Dask
cluster (`dask`): a local one this command starts and stops, or a running one it joins through a scheduler file (as
`data/prep.sub` starts one across the nodes of a Slurm job).

    with open_engine(EngineConfig("dask", n_workers=4)) as engine:
        for index, result in engine.map(segment_chunk, jobs, desc="segmenting"):
            ...

A task is a pure function of its job (an input piece, the settings, a seed, an output index): it writes its own
output atomically (a temporary file, fsync, rename) and returns a small summary. So the outputs do not depend on
the engine, on the number of workers or nodes, or on the order in which tasks finish; a task that runs twice (its
worker was lost, Dask ran it again elsewhere) writes the same bytes twice. `map` yields (job index, result) as tasks
finish, with a tqdm bar over finished tasks; the stage puts results back in job order where order matters.

The Dask engine checks before any work that the workers (and the scheduler, which unpickles the task graph) can
import the project, and waits for a scheduler file at most `connect_timeout` seconds: a missing file, a scheduler
that never answers and workers started outside the checkout are each one line (cli.InputError), not a hang.
Workers started by hand or by srun import the project when they run from the checkout with
PYTHONPATH=<checkout> (data/prep.sub sets it), or from an environment where it is installed.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bert_recipe.io.cli import InputError

ENGINES = ("processes", "dask")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """How a stage runs its tasks (data/bertPrep.py --engine, --n_processes, --dask_scheduler_file)."""

    name: str = "processes"
    """processes: a pool of worker processes here; dask: a Dask cluster"""
    n_workers: int = 1
    """worker processes (processes), or the local cluster's workers (dask without a scheduler file)"""
    scheduler_file: str | None = None
    """dask: join the running cluster this scheduler file names instead of starting a local one"""
    connect_timeout: float = 30.0
    """dask: seconds to wait for the scheduler file to appear and for the scheduler to answer"""
    progress: bool = True
    """a tqdm bar over finished tasks"""


class TaskError(InputError):
    """A task failed: the message names the job (its input piece) and the task's own one-line error."""


def _call(fn: Callable, job: Any) -> Any:
    """Runs on a worker: fn(job), with an error that names the job. Module-level, so Dask and multiprocessing
    pickle it by reference."""
    try:
        return fn(job)
    except Exception as e:  # any: re-raised with the job named, so the client prints one line
        raise TaskError(f"{describe_job(job)}: {type(e).__name__}: {e}") from None


def describe_job(job: Any) -> str:
    """A job in a few words: its first element when it is a tuple (every stage puts its input piece first)."""
    first = job[0] if isinstance(job, (tuple, list)) and job else job
    return str(first)[:200]


class ProcessEngine:
    """A pool of `n_workers` processes on this machine (threads=True in `map`: a thread pool, for tasks that only
    wait on a subprocess of their own)."""

    name = "processes"

    def __init__(self, config: EngineConfig):
        self.config = config

    def map(
        self, fn: Callable, jobs: Sequence, desc: str = "tasks", threads: bool = False
    ) -> Iterator[tuple[int, Any]]:
        from tqdm.auto import tqdm

        jobs = list(jobs)
        work = [(fn, job, i) for i, job in enumerate(jobs)]
        bar = tqdm(total=len(jobs), desc=desc, disable=not self.config.progress)
        try:
            if self.config.n_workers <= 1 or len(jobs) <= 1:
                for item in work:
                    yield _indexed(item)
                    bar.update(1)
                return
            pool_type = ThreadPool if threads else multiprocessing.Pool
            with pool_type(min(self.config.n_workers, len(jobs))) as pool:
                for result in pool.imap_unordered(_indexed, work):
                    yield result
                    bar.update(1)
        finally:
            bar.close()

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": self.config.n_workers}


def _indexed(item: tuple[Callable, Any, int]) -> tuple[int, Any]:
    fn, job, index = item
    return index, _call(fn, job)


class DaskEngine:
    """A Dask distributed client: on a local cluster of `n_workers` single-threaded worker processes started here,
    or on the cluster of `scheduler_file`."""

    name = "dask"

    def __init__(self, config: EngineConfig):
        self.config = config
        self.cluster = None
        self._probed: set[str] = set()
        self.client = self._connect()
        try:
            self.workers = self._check_workers()
        except BaseException:
            self.close()
            raise

    def _connect(self):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError(
                "--engine dask needs the dask[distributed] package: pip install -r requirements.txt"
            ) from None
        cfg = self.config
        if cfg.scheduler_file is None:
            self.cluster = LocalCluster(
                n_workers=cfg.n_workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                silence_logs=logging.ERROR,
            )
            return Client(self.cluster)
        path = Path(cfg.scheduler_file)
        deadline = time.monotonic() + cfg.connect_timeout
        while not path.is_file():  # Client(scheduler_file=...) would wait for it forever
            if time.monotonic() > deadline:
                raise InputError(
                    f"--dask_scheduler_file {path} does not exist (waited {cfg.connect_timeout:.0f} s): "
                    "start the scheduler first (dask scheduler --scheduler-file FILE), or leave the flag "
                    "out for a local cluster"
                )
            time.sleep(0.2)
        try:
            return Client(scheduler_file=str(path), timeout=cfg.connect_timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise InputError(
                f"--dask_scheduler_file {path}: the scheduler it names does not answer within "
                f"{cfg.connect_timeout:.0f} s ({type(e).__name__}: {str(e).splitlines()[0][:160]}): is it "
                "still running?"
            ) from None

    def _check_workers(self) -> int:
        """Wait for a worker, then check that one imports the package (and the scheduler unpickles its tasks)."""
        client, timeout = self.client, self.config.connect_timeout
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (TimeoutError, OSError):
            raise InputError(
                f"no Dask worker joined the scheduler within {timeout:.0f} s: start workers with "
                "`dask worker --scheduler-file FILE` from the checkout"
            ) from None
        self._probe(__name__)
        return len(client.scheduler_info().get("workers", {}))

    def _probe(self, module: str) -> None:
        """A worker imports `module` (a stage's task function lives there), once per module: a worker whose
        environment cannot is named before any task of the stage runs."""
        if module in self._probed:
            return
        try:
            # the builtin exec imports it there: a function of ours would fail to unpickle, unnamed
            self.client.submit(exec, f"import {module}", pure=False).result(timeout=self.config.connect_timeout)
        except Exception as e:  # any: a ModuleNotFoundError on a worker, or the scheduler's own
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise InputError(
                f"the Dask workers cannot run the pipeline's tasks ({type(e).__name__}: {first}): start "
                f"the scheduler and workers with PYTHONPATH={Path(__file__).resolve().parents[2]} "
                "(the checkout), or install the project in their environment"
            ) from None
        self._probed.add(module)

    @property
    def dashboard_link(self) -> str:
        return self.client.dashboard_link

    def map(
        self, fn: Callable, jobs: Sequence, desc: str = "tasks", threads: bool = False
    ) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed
        from tqdm.auto import tqdm

        jobs = list(jobs)
        self._probe(fn.__module__)
        # pure=False: every job runs (Dask would merge equal keys); one key per job, named after the stage.
        futures = self.client.map(
            _call, [fn] * len(jobs), jobs, pure=False, key=[f"{desc}-{i}-{time.time_ns()}" for i in range(len(jobs))]
        )
        index = {f.key: i for i, f in enumerate(futures)}
        bar = tqdm(total=len(jobs), desc=desc, disable=not self.config.progress)
        try:
            for future in as_completed(futures):
                if future.status == "error":
                    error = future.exception()
                    raise (
                        error
                        if isinstance(error, InputError)
                        else TaskError(f"{describe_job(jobs[index[future.key]])}: {type(error).__name__}: {error}")
                    )
                result = future.result()
                future.release()
                yield index[future.key], result
                bar.update(1)
        finally:
            bar.close()
            self.client.cancel([f for f in futures if not f.done()])

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "workers": self.workers,
            "dashboard": self.dashboard_link,
            "scheduler": self.client.scheduler.address,
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close()


def local_engine(engine, n_workers: int = 1, progress: bool = True):
    """`engine` itself, or (None) a ProcessEngine of `n_workers` processes here: what a stage called from a plain
    function (no --engine) runs on."""
    return engine or ProcessEngine(EngineConfig("processes", n_workers, progress=progress))


@contextlib.contextmanager
def open_engine(config: EngineConfig, log_fn: Callable[[str], None] = print) -> Iterator[ProcessEngine | DaskEngine]:
    """The engine `config` names, closed (a local cluster stopped) however the block ends."""
    if config.name not in ENGINES:
        raise InputError(f"--engine {config.name!r} is not one of {ENGINES}")
    if config.n_workers < 1:
        raise InputError(f"--n_processes {config.n_workers} must be at least 1")
    engine = DaskEngine(config) if config.name == "dask" else ProcessEngine(config)
    try:
        if engine.name == "dask":
            log_fn(
                f"dask: {engine.workers} worker(s) at {engine.client.scheduler.address}; dashboard "
                f"{engine.dashboard_link}"
            )
        yield engine
    finally:
        engine.close()
