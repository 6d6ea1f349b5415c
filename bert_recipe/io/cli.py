"""The contract of every entry script with its user: bad input is one line "<prog>: error: <what to do>" and exit
status 1 (or the traceback with --debug), never a traceback for a mistake the user can fix.

Library code raises InputError (or a subclass, or OSError / ValueError) with a message naming the flag or file;
only an entry script's main() turns it into the line, through `script_errors`. Also here: the console that may die
under a launcher (`survive_broken_pipes`) and the early check of an output path (`check_output_path`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence


class InputError(Exception):
    """Bad input a user can fix (a file, a flag, a shard): library code raises it (or a subclass) with a one-line
    message naming the flag or file; only an entry script's main() turns it into that line and a non-zero exit."""


# --------------------------------------------------------------------------------------------------------------
# Errors of an entry script: one line, or the whole traceback with --debug.
#
#     def main(argv=None):
#         with cli.script_errors("run_glue.py", argv):
#             cfg = flags.parse(GlueConfig, "run_glue.py", __doc__, argv)   # flags adds --debug
#             return run(cfg)
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
    parser.add_argument(
        "--debug", action="store_true", help="on an error, show the full Python traceback instead of a one-line message"
    )


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
            text = text[len(prefix) :].lstrip()
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
        raise InputError(
            f"{flag} {path}: cannot create the folder {target} ({e.strerror}): name a path in a folder you can write"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as e:
        raise InputError(
            f"{flag} {path}: cannot write in {target} ({e.strerror}): check its permissions, or write elsewhere"
        ) from None


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """Whether --debug is on the command line (`argv`, or sys.argv[1:] when None); read before argparse runs, so
    that errors raised while the arguments are checked follow it too."""
    args = sys.argv[1:] if argv is None else list(argv)
    return "--debug" in args[: args.index("--")] if "--" in args else "--debug" in args


@contextlib.contextmanager
def script_errors(
    prog: str, argv: Sequence[str] | None = None, expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS
) -> Iterator[None]:
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
