"""Start and stop a real Triton Inference Server (`tritonserver`) on 127.0.0.1 for a model repository.

    PYTHONPATH=. .venv/bin/python triton/server.py start --repository results/triton_repo --models bert_qa \
        --state_dir results/triton_server [--timeout 180]
    PYTHONPATH=. .venv/bin/python triton/server.py stop --state_dir results/triton_server

(triton/scripts/launch_server.sh and stop_server.sh wrap these.) `start` picks three free loopback ports, starts
the server in its own process group (so that stopping it also ends the Python-backend stub processes), waits until
the server and every named model report ready, prints one JSON line (pid, urls, ports, log) and writes the same to
<state_dir>/server.json. It fails with the log's tail if the server exits or the wait times out.

Where the binary comes from, first match wins: --tritonserver, $TRITONSERVER, `tritonserver` on PATH (the NGC
container's /opt/tritonserver/bin), /opt/tritonserver/bin/tritonserver, then the nvidia-pytriton wheel. The wheel
ships the server, the Python backend and one backend stub per Python version in a separate folder; `start` builds
<state_dir>/backends/python with the stub for this interpreter's version, and puts the wheel's bundled libraries on
LD_LIBRARY_PATH (see ../shared/notes/triton-server-on-cpu.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.cli import InputError
from bert_recipe.io.flags import flag
from bert_recipe.io.processes import pid_alive

NGC_SERVER = Path("/opt/tritonserver/bin/tritonserver")


class ServerError(Exception):
    """No server binary, or a server that did not become ready; the message says why (with its log's tail)."""


@dataclass
class ServerInfo:
    pid: int
    http_port: int
    grpc_port: int
    metrics_port: int
    repository: str
    models: list[str]
    log: str

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass
class Installation:
    binary: Path
    backends: Path | None  # None: the binary's default backend directory
    libraries: Path | None  # prepended to LD_LIBRARY_PATH
    stub: Path | None  # the Python-backend stub to place beside libtriton_python.so


def find_installation(explicit: str | None = None) -> Installation:
    """The server binary and what it needs; ServerError, saying what to install, if there is none."""
    candidates = [explicit, os.environ.get("TRITONSERVER"), shutil.which("tritonserver"), str(NGC_SERVER)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Installation(Path(candidate), None, None, None)
    spec = importlib.util.find_spec("pytriton")
    if spec and spec.submodule_search_locations:
        package = Path(list(spec.submodule_search_locations)[0])
        binary = package / "tritonserver" / "bin" / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = package / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
        if binary.is_file():
            return Installation(
                binary,
                package / "tritonserver" / "backends",
                package.parent / "nvidia_pytriton.libs",
                stub if stub.is_file() else None,
            )
    raise ServerError(
        "no tritonserver binary found: pip install nvidia-pytriton==0.7.0 (requirements-test.txt), "
        "run inside an NGC Triton container, or pass --tritonserver / set $TRITONSERVER"
    )


def prepare_backends(install: Installation, state_dir: Path) -> Path | None:
    """The wheel keeps the Python-backend stub apart from the backend; Triton looks for it beside
    libtriton_python.so. Build <state_dir>/backends/python from links to the wheel's files plus the stub."""
    if install.backends is None or install.stub is None:
        return install.backends
    target = state_dir / "backends"
    for backend in install.backends.iterdir():
        if not backend.is_dir():
            continue
        folder = target / backend.name
        folder.mkdir(parents=True, exist_ok=True)
        for item in backend.iterdir():
            if item.is_file() and not (folder / item.name).exists():
                (folder / item.name).symlink_to(item)
    stub = target / "python" / install.stub.name
    if not stub.exists():
        shutil.copy2(install.stub, stub)
    return target


def free_ports(count: int = 3) -> list[int]:
    """Ports the kernel hands out as free on 127.0.0.1 (all held open at once so they differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: str | Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    return ""


def start(
    repository: str | Path,
    models: list[str],
    state_dir: str | Path,
    timeout: float = 180.0,
    tritonserver: str | None = None,
    extra_args: list[str] | None = None,
    log_verbose: int = 0,
) -> ServerInfo:
    """Start tritonserver on free loopback ports and wait until it and `models` are ready."""
    repository = Path(repository).resolve()
    if not repository.is_dir():
        raise InputError(f"--repository {repository} is not a folder: write one with triton/model_repository.py")
    for model in models:
        if not (repository / model / "config.pbtxt").is_file():
            raise InputError(f"model {model!r} has no config.pbtxt in {repository}: name a model of the repository")
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    install = find_installation(tritonserver)
    backends = prepare_backends(install, state_dir)
    env = dict(os.environ)
    if install.libraries is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(install.libraries), env.get("LD_LIBRARY_PATH")) if p)
    last_error = ""
    for _ in range(3):  # a port taken between free_ports() and the server's bind: try new ports
        http, grpc, metrics = free_ports(3)
        log = state_dir / "server.log"
        cmd = [
            str(install.binary),
            f"--model-repository={repository}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--log-verbose={log_verbose}",
            "--exit-on-error=true",
            "--strict-readiness=true",
        ]
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
        cmd += list(extra_args or [])
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                cmd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        info = ServerInfo(proc.pid, http, grpc, metrics, str(repository), list(models), str(log))
        deadline = time.monotonic() + timeout
        urls = [f"http://{info.http_url}/v2/health/ready"] + [
            f"http://{info.http_url}/v2/models/{m}/ready" for m in models
        ]
        while time.monotonic() < deadline and proc.poll() is None:
            if all(_ready(u) for u in urls):
                atomic_write_json(state_dir / "server.json", asdict(info))
                return info
            time.sleep(0.5)
        last_error = log_tail(log)
        if proc.poll() is None:  # timed out: end it, do not leave it behind
            _stop_group(proc.pid, 10.0)
            raise ServerError(f"tritonserver not ready after {timeout:.0f} s (log {log}):\n{last_error}")
        if "address already in use" not in last_error.lower():
            break
    raise ServerError(f"tritonserver exited before becoming ready (log {state_dir / 'server.log'}):\n{last_error}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(
        pid_alive(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid_of(int(p.name)) == pgid
    )


def _pgid_of(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[2])
    return None


def _stop_group(pgid: int, timeout: float) -> bool:
    """SIGTERM the server's process group (the server and its stubs), SIGKILL what is left after `timeout`.
    Returns True when a SIGKILL was needed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return False
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    return True


def stop(state_dir: str | Path, timeout: float = 30.0) -> dict:
    """Stop the server recorded in <state_dir>/server.json (the pid leads its own process group)."""
    state = Path(state_dir) / "server.json"
    if not state.is_file():
        raise InputError(f"--state_dir {state_dir} has no server.json: no server started there (or already stopped)")
    info = json.loads(state.read_text(encoding="utf-8"))
    pid = int(info["pid"])
    killed = False
    if _pgid_of(pid) == pid or _group_alive(pid):
        killed = _stop_group(pid, timeout)
    state.unlink(missing_ok=True)
    return {"stopped": pid, "forced": killed}


@dataclass(frozen=True)
class StartFlags:
    """Which repository and models, where the server's files go, how long to wait."""

    repository: str | None = flag(None, required=True)
    """the model repository to serve (model_repository.py's output)"""
    models: list[str] | None = flag(None, required=True)
    """models that must be ready"""
    state_dir: str | None = flag(None, required=True)
    """where server.json, server.log and backends/ go"""
    timeout: float = 180.0
    """seconds to wait for readiness"""
    tritonserver: str | None = None
    """path of the server binary"""
    log_verbose: int = 0
    """the server's --log-verbose level (0: quiet)"""


@dataclass(frozen=True)
class StopFlags:
    """Which server, and how long it may take to stop."""

    state_dir: str | None = flag(None, required=True)
    """the --state_dir it was started with"""
    timeout: float = 30.0
    """seconds before SIGKILL"""


@dataclass(frozen=True)
class StartConfig(flags.Config):
    """start the server in the background and wait until the models are ready"""

    start: StartFlags = field(default_factory=StartFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("start",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter


@dataclass(frozen=True)
class StopConfig(flags.Config):
    """stop the server started with --state_dir"""

    stop: StopFlags = field(default_factory=StopFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("stop",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter


@dataclass(frozen=True)
class ServerConfig(flags.Config):
    """The two sub-commands, start and stop; no flag of their own."""

    commands: ClassVar[dict[str, type[flags.Config]]] = {"start": StartConfig, "stop": StopConfig}
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter


def main(argv=None) -> int:
    """0 when the server is up (or stopped); bad input or a server that does not start: its message on stderr
    (a failed start with its log's last lines) and exit status 1."""
    _, command, cfg = flags.parse_command(ServerConfig, "server.py", __doc__, argv)
    try:
        if command == "start":
            a = cfg.start
            info = start(a.repository, a.models, a.state_dir, a.timeout, a.tritonserver, log_verbose=a.log_verbose)
            print(json.dumps({**asdict(info), "http_url": info.http_url, "grpc_url": info.grpc_url}), flush=True)
        else:
            print(json.dumps(stop(cfg.stop.state_dir, cfg.stop.timeout)), flush=True)
    except (InputError, ServerError) as e:
        raise SystemExit(f"server.py: error: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
