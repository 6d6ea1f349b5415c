"""Two helpers with no better home: loading a triton/ script as a module, and asking whether a process is alive.

What utils.py held before is in modules named after their concept: cli.py (InputError, the one-line error contract
of the entry scripts, --debug, the console that may die), dist_env.py (DistEnv, init_distributed, barrier,
end_process_group, seeds and RNG states) and atomic_io.py (atomic writes, the JSON-lines log).
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


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
