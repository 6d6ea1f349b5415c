#!/usr/bin/env bash
# Start a real Triton Inference Server on 127.0.0.1 (free ports) for a model repository and wait until the models
# are ready. The server keeps running in the background; stop it with triton/scripts/stop_server.sh STATE_DIR.
#
# usage: triton/scripts/launch_server.sh REPOSITORY [MODELS] [STATE_DIR] [TIMEOUT_S]
#   REPOSITORY  model repository written by triton/model_repository.py
#   MODELS      comma-separated models that must be ready (default: bert_qa)
#   STATE_DIR   where server.json (pid, ports), server.log and backends/ go (default: results/triton_server)
#   TIMEOUT_S   seconds to wait for readiness (default: 180)
# Prints one JSON line: pid, http_url, grpc_url, ports, log. Set PYTHON to choose the interpreter (default: the
# project's .venv when present) and TRITONSERVER to choose the server binary.
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    [[ $# -lt 1 ]] && exit 2 || exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REPOSITORY="$1"
MODELS="${2:-bert_qa}"
STATE_DIR="${3:-$ROOT/results/triton_server}"
TIMEOUT_S="${4:-180}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

IFS=',' read -r -a MODEL_LIST <<< "$MODELS"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" "$ROOT/triton/server.py" start \
    --repository "$REPOSITORY" --models "${MODEL_LIST[@]}" --state_dir "$STATE_DIR" --timeout "$TIMEOUT_S"
