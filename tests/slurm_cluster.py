"""A real one-node Slurm cluster on 127.0.0.1 for the tests: Debian's munged, slurmctld and slurmd with a
slurm.conf generated in a temporary state folder (nothing under /etc is read or written).

    with SlurmCluster.start(tmp_path / "slurm") as cluster:
        job = cluster.sbatch(["run.sub"], env={...})
        cluster.wait(job, {"COMPLETED"})

Every daemon runs from the state folder and is stopped through its pid file when the block ends, whatever
happened inside it; jobs still in the queue are cancelled first, and any process left that was started under this
cluster's SLURM_CONF (batch scripts, tasks, slurmstepd) is killed by its pid. Timings follow
../shared/notes/slurm-on-one-machine.md: short scheduler intervals and credential lifetime, so that a requeued job
runs again within seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bert_recipe.io.processes import pid_alive

BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "sbatch", "scontrol", "squeue")
# Held while a cluster runs, by every test process on this machine, so that two clusters never run at once (each
# node claims every CPU, and their jobs' timed waits would run out), although pytest-xdist runs test files side by
# side and tests/test_slurm.py and tests/test_engines.py each start one: the rule lives where clusters start, with no
# list of files or test order to keep; a worker that waits loses at most the other cluster's life (~40 s on 2 cores).
LOCK = Path(tempfile.gettempdir()) / "bert-recipe-tests-slurm.lock"
LOCK_WAIT = 900  # seconds
KILL_WAIT = 5  # seconds of grace between SIGTERM and SIGKILL when Slurm ends or requeues a job
CRED_EXPIRE = 5  # seconds; a requeued job waits this long (plus 1) before it can start again


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def installed_or_skip(repo: Path) -> None:
    """Install Slurm with scripts/install_slurm.sh when it is missing (as root); skip the test with the reason when
    that fails (CI runs as root and fails on a skip)."""
    import pytest

    if missing_binaries():
        done = subprocess.run(["bash", str(repo / "scripts" / "install_slurm.sh")], capture_output=True, text=True)
        if done.returncode != 0 or missing_binaries():
            pytest.skip(
                f"Slurm is not installed ({', '.join(missing_binaries())} missing): "
                f"{done.stderr.strip() or 'scripts/install_slurm.sh did not install it'}"
            )


_PORTS_GIVEN: set[int] = set()
_PORT_RANDOM = random.SystemRandom()  # the OS's entropy: no test's random.seed() reaches it


def free_port() -> int:
    """A port for a server that starts later (slurmctld, a rendezvous store, MASTER_PORT), free now.

    Chosen below the kernel's ephemeral range: bind(0) and every outgoing connection take their ports from that
    range, so a port from it could be taken by the cluster's own traffic (or a later bind(0)) before our server
    binds it, and a rendezvous whose port was taken waits for its store until the test's timeout (CI saw a
    two-node launch hang). Never the same port twice in one test session. With several pytest-xdist workers, each
    draws from its own slice of the range, with a generator of its own: the tests seed the global `random` (the
    scripts' set_seed runs in-process), so two workers would otherwise draw the same ports in the same order."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.is_file() else 32768
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    width = (low - 10_000) // max(workers, 1)
    first = 10_000 + worker * width
    for _ in range(1000):
        port = _PORT_RANDOM.randrange(first, first + width)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {first}-{first + width}")


def _stop_pid(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class SlurmError(RuntimeError):
    pass


@contextlib.contextmanager
def one_cluster_at_a_time(path: Path = LOCK, timeout: float = LOCK_WAIT):
    """Hold `path`'s exclusive lock for the block, waiting up to `timeout` seconds for another holder to end."""
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SlurmError(f"another Slurm cluster of the tests held {path} for {timeout:.0f} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class SlurmCluster:
    def __init__(self, state: Path):
        self.state = state
        self.conf = state / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]  # run.sub takes MASTER_ADDR from the node list
        # munged wants execute permission for all on every folder above its socket, which pytest's 0700 temporary
        # folders lack (and a socket path must stay under 108 bytes): the socket gets its own short folder.
        self.munge_run = Path(tempfile.mkdtemp(prefix="munge-", dir="/tmp"))
        self.munge_run.chmod(0o755)
        self.munge_socket = self.munge_run / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in list(self.env):  # a cluster inside a job must not inherit the outer job's identity
            if name.startswith("SLURM_") and name != "SLURM_CONF":
                del self.env[name]
        self.pid_files = [state / "slurmd.pid", state / "slurmctld.pid", state / "munged.pid"]

    # ---- start and stop --------------------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def start(cls, state: Path):
        with one_cluster_at_a_time():
            cluster = cls(state)
            try:
                cluster._write_files()
                cluster._start_daemons()
                yield cluster
            finally:
                cluster.stop()

    def _write_files(self) -> None:
        user = pwd.getpwuid(os.getuid()).pw_name
        for sub, mode in (("", 0o755), ("munge-key", 0o700), ("ctld", 0o700), ("d", 0o755)):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
            (self.state / sub).chmod(mode)
        key = self.state / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        s = self.state
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=tests",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    f"SlurmUser={user}",
                    f"SlurmdUser={user}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}",
                    f"StateSaveLocation={s / 'ctld'}",
                    f"SlurmdSpoolDir={s / 'd'}",
                    f"SlurmctldPidFile={s / 'slurmctld.pid'}",
                    f"SlurmdPidFile={s / 'slurmd.pid'}",
                    f"SlurmctldLogFile={s / 'slurmctld.log'}",
                    f"SlurmdLogFile={s / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerParameters=bf_interval=1,sched_interval=2",
                    "DependencyParameters=kill_invalid_depend",
                    "MinJobAge=3600",
                    f"KillWait={KILL_WAIT}",
                    "ReturnToService=2",
                    "MailProg=/bin/true",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={max(mem_mb // 2, 100)} "
                    "State=UNKNOWN",
                    f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _daemon(self, argv: list[str]) -> None:
        # Without SLURM_CONF in their environment (they get -f): what carries it is a job's, see _job_processes.
        env = {k: v for k, v in self.env.items() if k != "SLURM_CONF"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")

    def _start_daemons(self) -> None:
        s = self.state
        try:
            socket.gethostbyname(self.node)
        except OSError as e:
            raise SlurmError(
                f"this machine's name {self.node!r} does not resolve ({e}): run.sub takes the rendezvous "
                f"address from the node name; add it to /etc/hosts"
            ) from None
        self._daemon(
            [
                "/usr/sbin/munged",
                f"--key-file={s / 'munge-key' / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={s / 'munged.pid'}",
                f"--log-file={s / 'munged.log'}",
                f"--seed-file={s / 'munged.seed'}",
            ]
        )
        self._daemon(["/usr/sbin/slurmctld", "-f", str(self.conf)])
        self._daemon(["/usr/sbin/slurmd", "-f", str(self.conf), "-N", self.node])
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            state = out.stdout.strip()
            if out.returncode == 0 and state == "idle":
                return
            time.sleep(0.2)
        raise SlurmError(
            f"node {self.node} not idle after 30 s (sinfo: {state or out.stderr.strip()}); "
            f"see {s / 'slurmctld.log'} and {s / 'slurmd.log'}:\n{self.logs()}"
        )

    def stop(self) -> None:
        """Cancel every job, stop the daemons by their pid files, kill anything else started under this cluster."""
        with contextlib.suppress(Exception):
            if self.conf.is_file() and (self.state / "slurmctld.pid").is_file():
                subprocess.run(
                    ["scancel", "--quiet", f"--user={pwd.getpwuid(os.getuid()).pw_name}"],
                    env=self.env,
                    capture_output=True,
                    timeout=20,
                )
                deadline = time.monotonic() + KILL_WAIT + 10
                while time.monotonic() < deadline and self._job_processes():
                    time.sleep(0.2)
        for pid_file in self.pid_files:
            with contextlib.suppress(OSError, ValueError):
                _stop_pid(int(pid_file.read_text().split()[0]))
        for pid in self._job_processes():
            _stop_pid(pid, timeout=2)
        shutil.rmtree(self.munge_run, ignore_errors=True)

    def _job_processes(self) -> list[int]:
        """Processes whose environment carries this cluster's SLURM_CONF (batch shells, tasks, slurmstepd)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (proc / "environ").read_bytes().split(b"\0") and pid_alive(int(proc.name)):
                    found.append(int(proc.name))
        return found

    def logs(self, tail: int = 30) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.state / name
            if path.is_file():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # ---- jobs ------------------------------------------------------------------------------------------------

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            argv, env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def sbatch(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
        """Submit; returns the job id."""
        return self.run(["sbatch", "--parsable", *argv], env=env, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, RestartCnt, ExitCode, Reason, ...)."""
        out = self.run(["scontrol", "show", "job", "--oneliner", job_id]).stdout
        fields = {}
        for word in out.split():
            if "=" in word:
                key, value = word.split("=", 1)
                fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, states: set[str], timeout: float = 120.0, poll: float = 0.25) -> dict[str, str]:
        """Wait until the job is in one of `states`; SlurmError if it ends in another state or time runs out."""
        final = {
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
        }
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if info.get("JobState") in final:
                raise SlurmError(
                    f"job {job_id} ended {info.get('JobState')} (waiting for {sorted(states)}): {info}"
                    f"\n{job_output(info)}"
                )
            time.sleep(poll)
        raise SlurmError(
            f"job {job_id} still {info.get('JobState')} after {timeout:.0f} s "
            f"(waiting for {sorted(states)}): {info}\n{job_output(info)}\n{self.logs()}"
        )


def job_output(info: dict[str, str], tail: int = 4000) -> str:
    """The end of a job's own output file (its StdOut), so that a failed job's error says why it failed."""
    path = Path(info.get("StdOut", ""))
    if not info.get("StdOut") or not path.is_file():
        return f"--- job output: {info.get('StdOut') or 'no StdOut'} (not a file)"
    return f"--- {path} (last {tail} characters)\n" + path.read_text(errors="replace")[-tail:]
