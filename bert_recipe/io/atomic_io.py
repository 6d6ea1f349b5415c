"""Files that are either whole or absent: atomic writes (a temporary file in the destination folder, fsync, then
rename) for text, JSON and torch.save, and the JSON-lines log with dllogger's keys (written by JsonLogger, read back by
read_json_lines). torch is imported inside the
functions that need it, so the data scripts that only write files start fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

# --------------------------------------------------------------------------------------------------------------
# Atomic writes: a temporary file in the destination folder, fsync, then rename. A reader (or a resumed job) sees
# either the previous complete file or the new complete file, never a half-written one.


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file's path beside `path`, for a writer that opens files by name (h5py, safetensors, ...); on a
    clean exit the file is fsynced and renamed onto `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    with _temporary_beside(path) as (fd, tmp):
        os.close(fd)
        yield tmp


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[io.IOBase]:
    """Open a temporary file beside `path`; on a clean exit fsync it and rename it onto `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    with _temporary_beside(path) as (fd, tmp), os.fdopen(fd, mode, **kwargs) as f:
        yield f


@contextlib.contextmanager
def _temporary_beside(path: str | os.PathLike) -> Iterator[tuple[int, Path]]:
    """The one temporary file + fsync + rename: yields the open descriptor and the path of `.<name>.<random>.tmp`
    beside `path` (the caller closes the descriptor); publishes it when the block ends without an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions of a new file
        yield fd, tmp
        durable_replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:  # name the file meant
            e.filename = str(path)
        raise


def durable_replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """fsync the finished file `src`, rename it onto `dst` (same folder) and fsync the folder: after a power cut
    `dst` is the old file or the whole new one. For a file kept between attempts (a resumable download's .part);
    anything written in one go goes through atomic_open / atomic_path."""
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    _fsync_dir(Path(dst).parent)


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


def read_json_lines(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines log that JsonLogger wrote, in file order (none when the file is absent); a line
    that does not parse, such as the last one of a run still writing or one that was killed, is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


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
