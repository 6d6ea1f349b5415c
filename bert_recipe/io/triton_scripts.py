"""The scripts of triton/ as modules: the folder cannot be imported as `triton` (its __init__.py hands that name over
to OpenAI's Triton compiler, which PyTorch probes for), so the tests, the benchmarks and perf.py load them by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TRITON_DIR = Path(__file__).resolve().parents[2] / "triton"


def load_triton_script(name: str):
    """triton/<name>.py as a module, named bert_triton_<name> (perf.py shares client.py's connection helpers)."""
    path = TRITON_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bert_triton_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
