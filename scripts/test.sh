#!/usr/bin/env bash
# Set up .venv (CPU torch + test requirements) and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_modeling.py -x`.
# Under CI=true a skipped test fails the run (tests/conftest.py): CI has ../shared/data and every requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu.sh --test
# tests/test_slurm.py runs a real one-node Slurm cluster: as root, apt-get the packages when they are missing (as a
# plain user, or when apt fails, those tests skip with the reason, and under CI a skip fails the run).
if [[ "$(id -u)" == 0 ]]; then
  bash scripts/install_slurm.sh || echo "test.sh: Slurm is not installed: tests/test_slurm.py will skip" >&2
fi
# The GPU call scripts' dry runs (tests/test_gpu_study.py, tests/test_stability.py) pack and unpack with xz, which
# minimal images may lack (Debian priority "standard"): as root, apt-get it when it is missing.
if ! command -v xz > /dev/null && [[ "$(id -u)" == 0 ]] && command -v apt-get > /dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xz-utils; } > /dev/null \
    || echo "test.sh: xz is not installed: the GPU call scripts' dry runs will fail" >&2
fi
# The code's layout and lint are ruff's (pyproject.toml [tool.ruff]): a file it would reformat, or a finding of its
# checks (pyflakes, pycodestyle, import order, bugbear), fails the run before any test.
.venv/bin/ruff format --check --quiet . || { echo "test.sh: run .venv/bin/ruff format . (the files above)" >&2; exit 1; }
.venv/bin/ruff check --quiet . || { echo "test.sh: ruff check found the problems above (--fix mends some)" >&2; exit 1; }
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# One worker per core, up to 4 (pytest-xdist; TEST_WORKERS=1 runs in this process): a test file runs whole on one
# worker (--dist loadfile), so its module fixtures are made once; the files go out in tests/file_times.py's order,
# the longest first by the last run's times (--no-loadscope-reorder keeps xdist from sorting them by test count).
workers="${TEST_WORKERS:-$(nproc)}"
(( workers > 4 )) && workers=4
parallel=()
(( workers > 1 )) && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest -ra --durations=20 "${parallel[@]}" "${@:-tests}"
