#!/usr/bin/env bash
# Fine-tune, predict and evaluate on SQuAD with run_squad.py, NVIDIA DeepLearningExamples' interface: the same 13
# positional arguments in the same order, with its defaults (BERT-large, SQuAD v1.1, 8 GPUs, fp16).
#
#   bash scripts/run_squad.sh                                              # all defaults
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgxa100_8gpu_bf16)
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && cpu_1gpu_auto)   # MiniLM on a CPU
#   bash scripts/run_squad.sh -h                                           # this text
#
# Positional arguments (an empty string or a missing one takes the default; paths must not contain spaces):
#    1 init_checkpoint   $CODEDIR/checkpoints/bert_uncased.pt   ckpt_<step>.pt, NVIDIA .pt, model.pt or a Hugging
#                                                               Face folder
#    2 epochs            2.0
#    3 batch_size        3         sequences per process per optimizer step (train), per batch (prediction)
#    4 learning_rate     3e-5
#    5 precision         fp16      auto | fp16 | bf16 | tf32 | fp32 (auto: from the hardware, see --help of run_squad.py)
#    6 num_gpu           8         processes: torchrun --nproc_per_node (1: plain python; on a machine without
#                                  CUDA, >1 runs CPU processes with gloo)
#    7 seed              1
#    8 squad_dir         $BERT_PREP_WORKING_DIR/download/squad/v1.1   holds train-v1.1.json, dev-v1.1.json (and
#                                  evaluate-v1.1.py, run as --eval_script when present); v2.0 names with VERSION_2
#    9 vocab_file        $BERT_PREP_WORKING_DIR/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt
#                        (None: the vocab.txt inside a Hugging Face init_checkpoint folder)
#   10 OUT_DIR           $CODEDIR/results/SQuAD
#   11 mode              "train eval"   train | eval | prediction, or several joined by spaces or commas
#                                       ("train eval", train,eval); eval = predict + score, prediction = predict
#   12 CONFIG_FILE       $CODEDIR/bert_config.json (BERT-large; None: the config of the checkpoint)
#   13 max_steps         -1        > 0: stop after this many optimizer steps (overrides epochs)
#
# Environment (optional):
#   DO_LOWER_CASE (true; false for cased vocabularies), MAX_SEQ_LENGTH (384), DOC_STRIDE (128), VERSION_2 (false;
#   true: train-v2.0.json / dev-v2.0.json / evaluate-v2.0.py and --version_2_with_negative), EXTRA_ARGS (more
#   run_squad.py flags, e.g. "--group_by_length --cache_dir /tmp/squad_cache"), PYTHON ($CODEDIR/.venv/bin/python
#   if present, else python3), CODEDIR (this repository), DRY_RUN=1 (print the command, one line, shell-quoted,
#   and run nothing).
#
# Several nodes (torchrun on each; num_gpu is the processes per node; every node sees the same folders):
#   NNODES (1), RDZV_ENDPOINT (host:port of a c10d rendezvous: torchrun --rdzv_backend=c10d, the nodes numbered by
#   it; RDZV_ID, default $SLURM_JOB_ID or bert, equal everywhere), or else MASTER_ADDR, MASTER_PORT (29500) and
#   NODE_RANK (0..NNODES-1) for torchrun's static rendezvous. E.g. on each of two nodes:
#     NNODES=2 RDZV_ENDPOINT=node1:29400 bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgxa100_8gpu_bf16)
#   NUMA_BINDING=node|exclusive|socket|core-complex binds each local rank to its GPU's cores and memory node
#   (`python -m scripts.bind --help`; scripts/torchrun_launcher.sh).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
die() { echo "run_squad.sh: $*" >&2; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CODEDIR=${CODEDIR:-$(dirname "$script_dir")}
prep_dir="${BERT_PREP_WORKING_DIR:-${DATA_DIR:-$CODEDIR/data}}"

init_checkpoint=${1:-$CODEDIR/checkpoints/bert_uncased.pt}
epochs=${2:-2.0}
batch_size=${3:-3}
learning_rate=${4:-3e-5}
precision=${5:-fp16}
num_gpu=${6:-8}
seed=${7:-1}
squad_dir=${8:-$prep_dir/download/squad/v1.1}
vocab_file=${9:-$prep_dir/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
OUT_DIR=${10:-$CODEDIR/results/SQuAD}
mode=${11:-train eval}
CONFIG_FILE=${12:-$CODEDIR/bert_config.json}
max_steps=${13:--1}
(( $# <= 13 )) || die "at most 13 positional arguments, got $# (see -h)"

DO_LOWER_CASE=${DO_LOWER_CASE:-true}
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-384}
DOC_STRIDE=${DOC_STRIDE:-128}
VERSION_2=${VERSION_2:-false}
DRY_RUN=${DRY_RUN:-0}
# shellcheck source=launcher_args.sh
source "$script_dir/launcher_args.sh"
default_python "$CODEDIR"

# ---- validate the arguments (one line each, naming the argument) ---------------------------------------------
is_int "$batch_size" && (( batch_size >= 1 )) || die "argument 3 (batch_size) must be a positive integer, got '$batch_size'"
is_int "$num_gpu" && (( num_gpu >= 1 )) || die "argument 6 (num_gpu) must be a positive integer, got '$num_gpu'"
is_int "$seed" || die "argument 7 (seed) must be a non-negative integer, got '$seed'"
is_num "$epochs" || die "argument 2 (epochs) must be a number, got '$epochs'"
is_num "$learning_rate" || die "argument 4 (learning_rate) must be a number, got '$learning_rate'"
is_num "$max_steps" || die "argument 13 (max_steps) must be a number, got '$max_steps'"
is_int "$MAX_SEQ_LENGTH" || die "MAX_SEQ_LENGTH must be a positive integer, got '$MAX_SEQ_LENGTH'"
is_int "$DOC_STRIDE" || die "DOC_STRIDE must be a positive integer, got '$DOC_STRIDE'"
precision_flags 5 "$precision"
parse_mode 11 "$mode"
[[ "$do_train" == true ]] || num_gpu=1  # prediction runs on one process
[[ "$DO_LOWER_CASE" == true || "$DO_LOWER_CASE" == false ]] || die "DO_LOWER_CASE must be true or false"
case "$VERSION_2" in
  true) version=v2.0 ;;
  false) version=v1.1 ;;
  *) die "VERSION_2 must be true or false, got '$VERSION_2'" ;;
esac
train_file=$squad_dir/train-$version.json
predict_file=$squad_dir/dev-$version.json
eval_script=$squad_dir/evaluate-$version.py
if [[ "$DRY_RUN" != 1 ]]; then
  [[ -f "$CODEDIR/run_squad.py" ]] || die "no run_squad.py in CODEDIR $CODEDIR"
  [[ -e "$init_checkpoint" ]] || die "init_checkpoint $init_checkpoint not found (argument 1)"
  [[ "$do_train" == false || -f "$train_file" ]] || die "$train_file not found (argument 8, squad_dir): download \
SQuAD with data/bertPrep.py or set BERT_PREP_WORKING_DIR"
  [[ "$do_eval$do_predict" == falsefalse || -f "$predict_file" ]] || die "$predict_file not found (argument 8, squad_dir)"
  [[ "$vocab_file" == None || -f "$vocab_file" ]] || die "vocab_file $vocab_file not found (argument 9; None: the \
checkpoint folder's vocab.txt)"
  [[ "$CONFIG_FILE" == None || -f "$CONFIG_FILE" ]] || die "CONFIG_FILE $CONFIG_FILE not found (argument 12; None: \
the checkpoint's config)"
fi

# ---- build the command ----------------------------------------------------------------------------------------
# torchrun as a module of the same interpreter: one node, or several (NNODES, RDZV_ENDPOINT or MASTER_ADDR).
source "$script_dir/torchrun_launcher.sh"
torchrun_launcher "$PYTHON" "$num_gpu"
env_prefix=()
[[ "$precision" == fp32 ]] && env_prefix=(env NVIDIA_TF32_OVERRIDE=0)

cmd=("${env_prefix[@]}" "${launcher[@]}" "$CODEDIR/run_squad.py" "--init_checkpoint=$init_checkpoint"
     "--output_dir=$OUT_DIR" "--max_seq_length=$MAX_SEQ_LENGTH" "--doc_stride=$DOC_STRIDE" "--seed=$seed"
     "--json-summary=$OUT_DIR/dllogger.json" "${prec_flags[@]}")
[[ "$do_train" == true ]] && cmd+=(--do_train "--train_file=$train_file" "--train_batch_size=$batch_size"
  "--learning_rate=$learning_rate" "--num_train_epochs=$epochs" "--max_steps=$max_steps")
if [[ "$do_eval" == true || "$do_predict" == true ]]; then
  cmd+=(--do_predict "--predict_file=$predict_file" "--predict_batch_size=$batch_size")
fi
if [[ "$do_eval" == true ]]; then
  cmd+=(--do_eval)
  [[ -f "$eval_script" ]] && cmd+=("--eval_script=$eval_script")
fi
[[ "$VERSION_2" == true ]] && cmd+=(--version_2_with_negative)
[[ "$DO_LOWER_CASE" == true ]] && cmd+=(--do_lower_case)
[[ "$vocab_file" != None ]] && cmd+=("--vocab_file=$vocab_file")
[[ "$CONFIG_FILE" != None ]] && cmd+=("--config_file=$CONFIG_FILE")
# shellcheck source=signals.sh
source "$script_dir/signals.sh"
launch_job run_squad.sh "$OUT_DIR/logfile.txt" "$num_gpu" "SQuAD $version, precision $precision, $num_gpu process(es)"
if (( JOB_STATUS == 0 )) && [[ -f "$OUT_DIR/eval_results.json" ]]; then
  echo "run_squad.sh: scores in $OUT_DIR/eval_results.json" >&2
fi
exit "$JOB_STATUS"
