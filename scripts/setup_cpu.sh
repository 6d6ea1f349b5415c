#!/usr/bin/env bash
# Create .venv with the CPU build of PyTorch and the project's requirements.
#   bash scripts/setup_cpu.sh          # runtime requirements only
#   bash scripts/setup_cpu.sh --test   # plus the test and benchmark requirements
# torch is pinned to 2.13.0: an unpinned `torch` would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
req=requirements.txt
[ "${1:-}" = "--test" ] && req=requirements-test.txt
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
# One resolver call so that nothing in the requirements can replace the pinned CPU torch.
.venv/bin/python -m pip install -q torch==2.13.0 -r "$req" 2>&1 | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -c "import torch, numpy, h5py, tokenizers" \
  || { echo "setup_cpu.sh: installing the requirements failed (see pip's output above)" >&2; exit 1; }
# The project itself, editable (pyproject.toml): its package imports from anywhere, so data/*.py run as files too.
.venv/bin/python -m pip install -q --no-deps -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
(repo=$PWD && cd / && "$repo/.venv/bin/python" -c "import bert_recipe.prep.engine, modeling") \
  || { echo "setup_cpu.sh: the editable install of the project failed (see pip's output above)" >&2; exit 1; }
