#!/usr/bin/env bash
# Stop the Triton server that launch_server.sh started: SIGTERM to its process group (the server and its
# Python-backend stubs), SIGKILL after TIMEOUT_S.
#
# usage: triton/scripts/stop_server.sh [STATE_DIR] [TIMEOUT_S]
#   STATE_DIR  the launch's state folder (default: results/triton_server)
#   TIMEOUT_S  seconds before SIGKILL (default: 30)
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${1:-$ROOT/results/triton_server}"
TIMEOUT_S="${2:-30}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" "$ROOT/triton/server.py" stop \
    --state_dir "$STATE_DIR" --timeout "$TIMEOUT_S"
