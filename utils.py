"""Small helpers shared by the entry scripts: atomic writes, JSON-lines logging, distributed set-up, seeding
(precision lives in precision.py). Nothing here runs at import time and nothing here knows about BERT. torch is
imported inside the functions that need it, so the data scripts that only write files start in milliseconds.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

# --------------------------------------------------------------------------------------------------------------
# Atomic writes: a temporary file in the destination folder, fsync, then rename. A reader (or a resumed job) sees
# either the previous complete file or the new complete file, never a half-written one.


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[io.IOBase]:
    """Open a temporary file beside `path`; on a clean exit fsync it and rename it onto `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions of a new file
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:  # name the file meant
            e.filename = str(path)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    # The rename itself lives in the directory entry: fsync the folder so it survives a power cut.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save through a temporary file: a kill at any moment leaves the previous file usable."""
    import torch

    with atomic_open(path, "wb") as f:
        recorder = _WriteErrorRecorder(f)
        try:
            torch.save(obj, recorder)
        except RuntimeError:
            # torch's zip writer turns a failed write (ENOSPC, EIO) into "RuntimeError: [enforce fail at
            # inline_container.cc] unexpected pos ..." chained to the OSError: raise the OSError itself, alone.
            if recorder.error is not None:
                raise recorder.error from None
            raise


class _WriteErrorRecorder:
    """A binary file for torch.save that remembers the first OSError a write raised (and raises it)."""

    def __init__(self, f):
        self._f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        try:
            self._f.flush()
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


# --------------------------------------------------------------------------------------------------------------
# JSON-lines logging with dllogger-compatible keys: {"timestamp", "type": "LOG", "step", "data": {...}}.


class JsonLogger:
    """Appends one JSON object per event to a file (rank 0 only); optionally echoes to stdout.

    `step` follows dllogger: an int, a tuple such as (epoch, step), or a string like "PARAMETER" / "FINAL".
    """

    def __init__(self, path: str | os.PathLike | None, enabled: bool = True, echo: bool = False):
        self.enabled = enabled
        self.echo = echo
        self._file = None
        if enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def log(self, step: Any, data: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"timestamp": time.time(), "type": "LOG", "step": step, "data": _jsonable(data)}
        line = json.dumps(record, ensure_ascii=False)
        if self._file:
            self._file.write(line + "\n")
            self._file.flush()
        if self.echo:
            print(line, flush=True)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    torch = sys.modules.get("torch")  # a tensor can only be here if torch was imported
    out = {}
    for key, value in data.items():
        if torch is not None and isinstance(value, torch.Tensor):
            value = value.item() if value.numel() == 1 else value.tolist()
        elif isinstance(value, (np.generic,)):
            value = value.item()
        elif isinstance(value, Path):
            value = str(value)
        out[key] = value
    return out


# --------------------------------------------------------------------------------------------------------------
# Distributed set-up: torchrun's environment, or Slurm's (srun with one task per GPU), or a single process.


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: Any = field(default_factory=lambda: __import__("torch").device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _slurm_to_torchrun_env() -> None:
    """Translate Slurm's variables into the ones torch.distributed reads, when torchrun did not set them."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST", ""))
        first = socket.gethostname()
        if nodelist:
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                first = subprocess.check_output(["scontrol", "show", "hostnames", nodelist], text=True).split()[0]
        os.environ["MASTER_ADDR"] = first
    os.environ.setdefault("MASTER_PORT", "29500")


def init_distributed(no_cuda: bool = False) -> DistEnv:
    """Initialise torch.distributed from torchrun's or Slurm's environment; NCCL on GPU, gloo on CPU.

    A plain `python script.py` gives a single-process DistEnv without touching torch.distributed.
    """
    import torch

    _slurm_to_torchrun_env()
    use_cuda = torch.cuda.is_available() and not no_cuda
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def barrier(env: DistEnv) -> None:
    import torch

    if env.distributed:
        torch.distributed.barrier()


def end_process_group(clean: bool = True) -> None:
    """Leave the default process group, if one is open. After a clean run every rank first meets the others at a
    barrier: a rank that tears gloo down while a peer is still finishing its last collective can make that peer abort
    ("terminate called without an active exception", seen once in CI on a 2-process run whose results were all
    written). After a failure there is no barrier: the peers may be gone, and waiting for them would hang."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if clean:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------
# Seeding and RNG state.


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG state a resumed run needs, as tensors and plain Python objects (loadable with weights_only)."""
    import torch

    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        # numpy's state holds an ndarray, which weights_only=True refuses: store the keys as a tensor.
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(_as_python_state(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(state):
    # After a save/load round trip the nested tuples of random.getstate() may come back as lists.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


# --------------------------------------------------------------------------------------------------------------
# A console that may die. A launcher pipes the run through `tee`; a signal to the whole process group kills `tee`
# first, and the next print or progress-bar update would raise BrokenPipeError in the middle of the step, before
# the preemption checkpoint is written. Console output is a courtesy: the JSON log and the checkpoints are the
# record, so a broken console is dropped, once, and the run goes on.


class _SurvivingStream:
    """Wraps sys.stdout / sys.stderr: writes after the reader went away (EPIPE, a closed stream) are dropped."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def _guard(self, method: str, *args):
        if self.broken:
            return None
        try:
            return getattr(self._stream, method)(*args)
        except (BrokenPipeError, ConnectionResetError, ValueError):  # ValueError: I/O on a closed file
            self.broken = True
            with contextlib.suppress(OSError):  # let the interpreter's final flush find nothing left to write
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
            return None

    def write(self, text: str):
        return self._guard("write", text)

    def flush(self):
        return self._guard("flush")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def survive_broken_pipes() -> Iterator[None]:
    """For the duration: stdout and stderr drop output once their reader has gone, instead of raising."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SurvivingStream(sys.stdout), _SurvivingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


class InputError(Exception):
    """Bad input a user can fix (a file, a flag, a shard): library code raises it (or a subclass) with a one-line
    message naming the flag or file; only an entry script's main() turns it into that line and a non-zero exit."""


# --------------------------------------------------------------------------------------------------------------
# Errors of an entry script: one line, or the whole traceback with --debug.
#
#     def main(argv=None):
#         with utils.script_errors("run_glue.py", argv):
#             args = parse_args(argv)          # the parser has utils.add_debug_argument(parser)
#             return run(args)
#
# Inside the block, an expected error (EXPECTED_ERRORS: InputError and its subclasses, OSError: a missing,
# unreadable or full-disk file, ValueError: CheckpointError, a JSON or UTF-8 decoding error, a malformed file)
# leaves as SystemExit("<prog>: error: <what>"): Python prints that one line on stderr and exits 1. A SystemExit
# with a message raised inside (a script's own check) is put in the same form. With --debug on the command line
# the exception propagates unchanged, so Python prints its traceback. Any other exception (a bug) always shows
# its traceback.

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (InputError, OSError, ValueError)

# What to do about an OSError without a message of our own, by errno name.
_OS_ERROR_ADVICE = {
    "ENOSPC": "free some space or write elsewhere, then run again",
    "EDQUOT": "the disk quota is used up: free some space or write elsewhere, then run again",
    "EACCES": "check its permissions and its folders'",
    "EPERM": "check its permissions and its folders'",
    "EROFS": "the file system is read-only: write elsewhere",
    "ENOENT": "check the path",
    "EISDIR": "it is a folder: name a file",
    "ENOTDIR": "a part of the path is a file, not a folder",
    "EEXIST": "move it away or choose another name",
    "ELOOP": "a symbolic link in the path points back to itself",
    "EIO": "the device reported an I/O error: check the disk",
}


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """--debug: an error shows Python's full traceback instead of the one-line message (see script_errors)."""
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full Python traceback instead of a one-line message")


def describe_error(e: BaseException) -> str:
    """An exception as one line: its message with the lines joined; for an OSError that carries only errno,
    strerror and file names (Python's own), '<file>: <strerror> (<what to do>)'."""
    import errno

    if isinstance(e, OSError) and e.strerror and e.args == (e.errno, e.strerror):
        name = errno.errorcode.get(e.errno, "")
        files = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        advice = _OS_ERROR_ADVICE.get(name)
        text = f"{files}: {e.strerror}" if files else e.strerror
        return f"{text} ({advice})" if advice else text
    text = str(e).strip()
    if isinstance(e, KeyError) and len(e.args) == 1:
        text = str(e.args[0])
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text or type(e).__name__


def _one_line_exit(prog: str, message: str) -> str:
    """'<prog>: error: <message>' from a message that may already start with '<prog>:' and/or 'error:'."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    for prefix in (f"{prog}:", "error:"):
        if text.startswith(prefix):
            text = text[len(prefix):].lstrip()
    return f"{prog}: error: {text}"


def check_output_path(path: str | os.PathLike, flag: str, folder: bool = False) -> None:
    """Refuse now, in one line (InputError), an output that could only fail after the work: `path` must be a
    file (or with folder=True a folder) whose folder can be created and written in (tried with a temporary file,
    so permissions, a read-only file system and root's privileges all count as they will for the real write)."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path} is a file: name a folder")
    if not folder and path.is_dir():
        raise InputError(f"{flag} {path} is a folder: name the file to write")
    target = path if folder else path.parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot create the folder {target} ({e.strerror}): name a path in a "
                         "folder you can write") from None
    try:
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write in {target} ({e.strerror}): check its permissions, or "
                         "write elsewhere") from None


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """Whether --debug is on the command line (`argv`, or sys.argv[1:] when None); read before argparse runs, so
    that errors raised while the arguments are checked follow it too."""
    args = sys.argv[1:] if argv is None else list(argv)
    return "--debug" in args[:args.index("--")] if "--" in args else "--debug" in args


@contextlib.contextmanager
def script_errors(prog: str, argv: Sequence[str] | None = None,
                  expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS) -> Iterator[None]:
    """Wrap an entry script's main(): expected errors become SystemExit('<prog>: error: <what>') (one line on
    stderr, exit status 1), unless --debug is in `argv` (default sys.argv[1:]), which lets them propagate with
    their traceback. `prog` is the script's file name as the user typed it (e.g. "run_glue.py")."""
    try:
        yield
    except SystemExit as e:
        if isinstance(e.code, str):  # a script's own check: same form, one line
            raise SystemExit(_one_line_exit(prog, e.code)) from None
        raise
    except expected as e:
        if debug_requested(argv):
            raise
        raise SystemExit(_one_line_exit(prog, describe_error(e))) from None


# --------------------------------------------------------------------------------------------------------------
# The triton/ scripts as modules


def load_triton_script(name: str):
    """triton/<name>.py as a module (named bert_triton_<name>), for the tests, the benchmarks and perf.py (which
    shares client.py's connection helpers). The folder cannot be imported as `triton`: its __init__.py hands
    that name over to OpenAI's Triton compiler, which PyTorch probes for (see triton/__init__.py)."""
    import importlib.util

    path = Path(__file__).resolve().parent / "triton" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bert_triton_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
