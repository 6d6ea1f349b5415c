#!/usr/bin/env bash
# Start the training container with every GPU and the recipe's folders mounted.
# usage: scripts/docker/launch.sh [DATA_DIR] [CHECKPOINT_DIR] [RESULTS_DIR] [-- COMMAND...]
#     DATA_DIR        -> /workspace/data          (BERT_PREP_WORKING_DIR: raw text, shards, HDF5)  [./data]
#     CHECKPOINT_DIR  -> /workspace/bert/checkpoints  (pre-trained weights to start from)           [./checkpoints]
#     RESULTS_DIR     -> /workspace/bert/results  (logs, ckpt_<step>.pt of pre-training runs)      [./results]
#   IMAGE (bert:latest) picks the image; without a COMMAND, an interactive bash; DRY_RUN=1 prints the docker command.
#   bash scripts/docker/launch.sh /raid/bert /raid/ckpt ./results -- bash -c \
#     'source scripts/configs/pretrain_config.sh && bash scripts/run_pretraining.sh $(dgxh100_8gpu_bf16)'
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dirs=()
while (( $# )) && [[ "$1" != "--" ]]; do
  dirs+=("$1")
  shift
done
[[ "${1:-}" == "--" ]] && shift
(( ${#dirs[@]} <= 3 )) || { echo "launch.sh: at most 3 folders before --, got ${#dirs[@]}" >&2; exit 1; }
data_dir=$(realpath -m "${dirs[0]:-$repo/data}")
checkpoint_dir=$(realpath -m "${dirs[1]:-$repo/checkpoints}")
results_dir=$(realpath -m "${dirs[2]:-$repo/results}")
command=("$@")
(( ${#command[@]} )) || command=(bash)
tty=()
[[ -t 0 && -t 1 ]] && tty=(-it)
# Data goes to /workspace/data, not /workspace/bert/data: that would hide the image's data/ package (bertPrep.py).
run=(docker run --rm "${tty[@]}" --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864
     -e BERT_PREP_WORKING_DIR=/workspace/data
     -v "$data_dir":/workspace/data
     -v "$checkpoint_dir":/workspace/bert/checkpoints
     -v "$results_dir":/workspace/bert/results
     "${IMAGE:-bert:latest}" "${command[@]}")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${run[@]}" | sed 's/ $//'
  echo
  exit 0
fi
mkdir -p "$data_dir" "$checkpoint_dir" "$results_dir"
command -v docker > /dev/null || { echo "launch.sh: docker is not installed on this machine" >&2; exit 1; }
exec "${run[@]}"
