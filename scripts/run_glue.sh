#!/usr/bin/env bash
# Fine-tune and evaluate on a GLUE task with run_glue.py, NVIDIA DeepLearningExamples' interface: the same 16
# positional arguments in the same order, with its defaults (BERT-large, MRPC, 8 GPUs, fp16).
#
#   bash scripts/run_glue.sh                                         # all defaults
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_dgxa100-80g_8gpu_bf16)
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_cpu_1gpu_auto)  # MiniLM on a CPU
#   bash scripts/run_glue.sh -h                                      # this text
#
# Positional arguments (an empty string or a missing one takes the default; paths must not contain spaces):
#    1 init_checkpoint           $CODEDIR/checkpoints/bert_uncased.pt   ckpt_<step>.pt, NVIDIA .pt or a Hugging
#                                                                       Face folder
#    2 data_dir                  $BERT_PREP_WORKING_DIR/download/glue/MRPC/   the task's GLUE folder
#    3 vocab_file                $BERT_PREP_WORKING_DIR/download/google_pretrained_weights/
#                                uncased_L-24_H-1024_A-16/vocab.txt (None: the vocab.txt inside a Hugging Face
#                                init_checkpoint folder)
#    4 config_file               $CODEDIR/bert_config.json (BERT-large; None: the config of the checkpoint)
#    5 out_dir                   $CODEDIR/results/MRPC
#    6 task_name                 mrpc      cola | sst-2 | mrpc | sts-b | qqp | mnli | qnli | rte | wnli
#    7 num_gpu                   8         processes: torchrun --nproc_per_node (1: plain python; on a machine
#                                          without CUDA, >1 runs CPU processes with gloo)
#    8 batch_size                16        sequences per process per optimizer step (train), per batch (eval)
#    9 gradient_accumulation_steps 1       micro-batches per optimizer step (micro-batch = arg 8 / arg 9)
#   10 learning_rate             2.4e-5
#   11 warmup_proportion         0.1
#   12 epochs                    3
#   13 max_steps                 -1.0      > 0: stop after this many optimizer steps (overrides epochs)
#   14 precision                 fp16      auto | fp16 | bf16 | tf32 | fp32 (auto: from the hardware, see --help of run_glue.py)
#   15 seed                      2
#   16 mode                      "train eval"   any of train, eval, prediction (quote several: "train eval");
#                                               eval alone runs on one process, as the original
#
# Environment (optional):
#   DO_LOWER_CASE (true; false for cased vocabularies), MAX_SEQ_LENGTH (128), EXTRA_ARGS (more run_glue.py flags,
#   e.g. "--max_train_examples 2000 --num_workers 4"), PYTHON ($CODEDIR/.venv/bin/python if present, else
#   python3), CODEDIR (this repository), DRY_RUN=1 (print the command, one line, shell-quoted, and run nothing).
#
# Several nodes (torchrun on each; num_gpu is the processes per node; every node sees the same folders):
#   NNODES (1), RDZV_ENDPOINT (host:port of a c10d rendezvous: torchrun --rdzv_backend=c10d, the nodes numbered by
#   it; RDZV_ID, default $SLURM_JOB_ID or bert, equal everywhere), or else MASTER_ADDR, MASTER_PORT (29500) and
#   NODE_RANK (0..NNODES-1) for torchrun's static rendezvous. E.g. on each of two nodes:
#     NNODES=2 RDZV_ENDPOINT=node1:29400 bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_dgxa100-80g_8gpu_bf16)
#   NUMA_BINDING=node|exclusive|socket|core-complex binds each local rank to its GPU's cores and memory node
#   (`python -m scripts.bind --help`; scripts/torchrun_launcher.sh).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
die() { echo "run_glue.sh: $*" >&2; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CODEDIR=${CODEDIR:-$(dirname "$script_dir")}
prep_dir="${BERT_PREP_WORKING_DIR:-${DATA_DIR:-$CODEDIR/data}}"

init_checkpoint=${1:-$CODEDIR/checkpoints/bert_uncased.pt}
data_dir=${2:-$prep_dir/download/glue/MRPC/}
vocab_file=${3:-$prep_dir/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
config_file=${4:-$CODEDIR/bert_config.json}
out_dir=${5:-$CODEDIR/results/MRPC}
task_name=${6:-mrpc}
num_gpu=${7:-8}
batch_size=${8:-16}
gradient_accumulation_steps=${9:-1}
learning_rate=${10:-2.4e-5}
warmup_proportion=${11:-0.1}
epochs=${12:-3}
max_steps=${13:--1.0}
precision=${14:-fp16}
seed=${15:-2}
mode=${16:-train eval}
(( $# <= 16 )) || die "at most 16 positional arguments, got $# (see -h)"

DO_LOWER_CASE=${DO_LOWER_CASE:-true}
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-128}
DRY_RUN=${DRY_RUN:-0}
# shellcheck source=launcher_args.sh
source "$script_dir/launcher_args.sh"
default_python "$CODEDIR"

# ---- validate the arguments (one line each, naming the argument) ---------------------------------------------
require_ints "7 num_gpu $num_gpu" "8 batch_size $batch_size" \
             "9 gradient_accumulation_steps $gradient_accumulation_steps" "15 seed $seed"
require_nums "10 learning_rate $learning_rate" "11 warmup_proportion $warmup_proportion" "12 epochs $epochs" \
             "13 max_steps $max_steps"
(( num_gpu >= 1 )) || die "argument 7 (num_gpu) must be at least 1"
(( gradient_accumulation_steps >= 1 && batch_size % gradient_accumulation_steps == 0 )) \
  || die "argument 8 (batch_size $batch_size) must be divisible by argument 9 \
(gradient_accumulation_steps $gradient_accumulation_steps)"
precision_flags 14 "$precision"
parse_mode 16 "$mode"
[[ "$do_train" == true ]] || num_gpu=1  # evaluation and prediction run on one process, as in the original
[[ "$DO_LOWER_CASE" == true || "$DO_LOWER_CASE" == false ]] || die "DO_LOWER_CASE must be true or false"
if [[ "$DRY_RUN" != 1 ]]; then
  [[ -f "$CODEDIR/run_glue.py" ]] || die "no run_glue.py in CODEDIR $CODEDIR"
  check_model_files
  [[ -d "$data_dir" ]] || die "GLUE folder $data_dir not found (argument 2): the task's folder from GLUE's \
download_glue_data.py, or set BERT_PREP_WORKING_DIR"
fi

# ---- build the command ----------------------------------------------------------------------------------------
# torchrun as a module of the same interpreter: one node, or several (NNODES, RDZV_ENDPOINT or MASTER_ADDR).
source "$script_dir/torchrun_launcher.sh"
torchrun_launcher "$PYTHON" "$num_gpu"
env_prefix=()
[[ "$precision" == fp32 ]] && env_prefix=(env NVIDIA_TF32_OVERRIDE=0)

cmd=("${env_prefix[@]}" "${launcher[@]}" "$CODEDIR/run_glue.py" "--task_name=$task_name" "--data_dir=$data_dir"
     "--init_checkpoint=$init_checkpoint" "--output_dir=$out_dir" "--max_seq_length=$MAX_SEQ_LENGTH"
     "--seed=$seed" "--json-summary=$out_dir/dllogger.json" "${prec_flags[@]}")
append_finetune_flags
# shellcheck source=signals.sh
source "$script_dir/signals.sh"
launch_job run_glue.sh "$out_dir/logfile" "$num_gpu" "$task_name, precision $precision, $num_gpu process(es)"
if (( JOB_STATUS == 0 )) && [[ -f "$out_dir/results.json" ]]; then
  echo "run_glue.sh: results in $out_dir/results.json" >&2
fi
exit "$JOB_STATUS"
