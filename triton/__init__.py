"""This folder is the Triton Inference Server deployment (see triton/README.md), not OpenAI's Triton compiler.

It sits at the repository root, so `import triton` in a script run from here finds this folder before any
installed package. PyTorch probes `import triton` to decide whether it can compile GPU kernels; a bare folder
would pass for a broken OpenAI Triton and break torch.compile (and transformers) on machines without it. So
importing this folder under the name `triton` hands over to the real OpenAI Triton when one is installed
elsewhere on the path (the NGC containers), and otherwise fails exactly as if nothing were there.
The deployment's own scripts are run as files (`python triton/export_model.py ...`), never imported as `triton`.
"""

import importlib.machinery
import importlib.util
import os
import sys

_repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_elsewhere = [p for p in sys.path if os.path.abspath(p or os.curdir) != _repo_root]
_spec = importlib.machinery.PathFinder.find_spec(__name__, _elsewhere)
if _spec is None or _spec.loader is None:
    raise ImportError(
        "OpenAI Triton is not installed (the repository's triton/ folder is the Triton "
        "Inference Server deployment, not that package)"
    )
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
