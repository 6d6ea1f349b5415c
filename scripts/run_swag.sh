#!/usr/bin/env bash
# Fine-tune and evaluate on SWAG (multiple choice) with run_swag.py, in the style of scripts/run_glue.sh:
# positional arguments, defaults for BERT-large on 8 GPUs, presets in scripts/configs/swag_config.sh.
#
#   bash scripts/run_swag.sh                                         # all defaults
#   bash scripts/run_swag.sh $(source scripts/configs/swag_config.sh && dgxa100-80g_8gpu_bf16)
#   bash scripts/run_swag.sh $(source scripts/configs/swag_config.sh && cpu_1gpu_auto)   # MiniLM on a CPU
#   bash scripts/run_swag.sh -h                                      # this text
#
# Positional arguments (an empty string or a missing one takes the default; paths must not contain spaces):
#    1 init_checkpoint           $CODEDIR/checkpoints/bert_uncased.pt   ckpt_<step>.pt, NVIDIA .pt or a Hugging
#                                                                       Face folder
#    2 data_dir                  $BERT_PREP_WORKING_DIR/download/swag/   SWAG's folder (train.csv, val.csv,
#                                                                       test.csv from github.com/rowanz/swagaf)
#    3 vocab_file                $BERT_PREP_WORKING_DIR/download/google_pretrained_weights/
#                                uncased_L-24_H-1024_A-16/vocab.txt (None: the vocab.txt inside a Hugging Face
#                                init_checkpoint folder)
#    4 config_file               $CODEDIR/bert_config.json (BERT-large; None: the config of the checkpoint)
#    5 out_dir                   $CODEDIR/results/SWAG
#    6 num_gpu                   8         processes: torchrun --nproc_per_node (1: plain python; on a machine
#                                          without CUDA, >1 runs CPU processes with gloo)
#    7 batch_size                2         examples (4 sequences each) per process per optimizer step (train), per
#                                          batch (eval)
#    8 gradient_accumulation_steps 1       micro-batches per optimizer step (micro-batch = arg 7 / arg 8)
#    9 learning_rate             2e-5
#   10 warmup_proportion         0.1
#   11 epochs                    3
#   12 max_steps                 -1.0      > 0: stop after this many optimizer steps (overrides epochs)
#   13 precision                 fp16      auto | fp16 | bf16 | tf32 | fp32 (auto: from the hardware, see
#                                          --help of run_swag.py)
#   14 seed                      42
#   15 mode                      "train eval"   any of train, eval, prediction (quote several: "train eval");
#                                               eval alone runs on one process
#
# Environment (optional):
#   DO_LOWER_CASE (true; false for cased vocabularies), MAX_SEQ_LENGTH (128), EXTRA_ARGS (more run_swag.py flags,
#   e.g. "--max_train_examples 2000 --predict_split test"), PYTHON ($CODEDIR/.venv/bin/python if present, else
#   python3), CODEDIR (this repository), DRY_RUN=1 (print the command, one line, shell-quoted, and run nothing),
#   NUMA_BINDING (node | exclusive, or socket | core-complex with torchrun's own option: bind each process to the
#   cores and memory of its GPU's NUMA node; `python -m scripts.bind --help`).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
die() { echo "run_swag.sh: $*" >&2; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CODEDIR=${CODEDIR:-$(dirname "$script_dir")}
prep_dir="${BERT_PREP_WORKING_DIR:-${DATA_DIR:-$CODEDIR/data}}"

init_checkpoint=${1:-$CODEDIR/checkpoints/bert_uncased.pt}
data_dir=${2:-$prep_dir/download/swag/}
vocab_file=${3:-$prep_dir/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt}
config_file=${4:-$CODEDIR/bert_config.json}
out_dir=${5:-$CODEDIR/results/SWAG}
num_gpu=${6:-8}
batch_size=${7:-2}
gradient_accumulation_steps=${8:-1}
learning_rate=${9:-2e-5}
warmup_proportion=${10:-0.1}
epochs=${11:-3}
max_steps=${12:--1.0}
precision=${13:-fp16}
seed=${14:-42}
mode=${15:-train eval}
(( $# <= 15 )) || die "at most 15 positional arguments, got $# (see -h)"

DO_LOWER_CASE=${DO_LOWER_CASE:-true}
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-128}
DRY_RUN=${DRY_RUN:-0}
# shellcheck source=launcher_args.sh
source "$script_dir/launcher_args.sh"
default_python "$CODEDIR"

# ---- validate the arguments (one line each, naming the argument) ---------------------------------------------
require_ints "6 num_gpu $num_gpu" "7 batch_size $batch_size" \
             "8 gradient_accumulation_steps $gradient_accumulation_steps" "14 seed $seed"
require_nums "9 learning_rate $learning_rate" "10 warmup_proportion $warmup_proportion" "11 epochs $epochs" \
             "12 max_steps $max_steps"
(( num_gpu >= 1 )) || die "argument 6 (num_gpu) must be at least 1"
(( batch_size >= 1 )) || die "argument 7 (batch_size) must be at least 1"
(( gradient_accumulation_steps >= 1 && batch_size % gradient_accumulation_steps == 0 )) \
  || die "argument 7 (batch_size $batch_size) must be divisible by argument 8 \
(gradient_accumulation_steps $gradient_accumulation_steps)"
precision_flags 13 "$precision"
parse_mode 15 "$mode"
[[ "$do_train" == true ]] || num_gpu=1  # evaluation and prediction run on one process
[[ "$DO_LOWER_CASE" == true || "$DO_LOWER_CASE" == false ]] || die "DO_LOWER_CASE must be true or false"
if [[ "$DRY_RUN" != 1 ]]; then
  [[ -f "$CODEDIR/run_swag.py" ]] || die "no run_swag.py in CODEDIR $CODEDIR"
  check_model_files
  [[ -d "$data_dir" ]] || die "SWAG folder $data_dir not found (argument 2): the data/ folder of \
github.com/rowanz/swagaf (train.csv, val.csv), or set BERT_PREP_WORKING_DIR"
fi

# ---- build the command ----------------------------------------------------------------------------------------
# torchrun as a module of the same interpreter: one node, or several (NNODES, RDZV_ENDPOINT or MASTER_ADDR), with
# NUMA_BINDING if set (scripts/torchrun_launcher.sh).
source "$script_dir/torchrun_launcher.sh"
torchrun_launcher "$PYTHON" "$num_gpu"
env_prefix=()
[[ "$precision" == fp32 ]] && env_prefix=(env NVIDIA_TF32_OVERRIDE=0)

cmd=("${env_prefix[@]}" "${launcher[@]}" "$CODEDIR/run_swag.py" "--data_dir=$data_dir"
     "--init_checkpoint=$init_checkpoint" "--output_dir=$out_dir" "--max_seq_length=$MAX_SEQ_LENGTH"
     "--seed=$seed" "--json-summary=$out_dir/dllogger.json" "${prec_flags[@]}")
append_finetune_flags
# shellcheck source=signals.sh
source "$script_dir/signals.sh"
launch_job run_swag.sh "$out_dir/logfile" "$num_gpu" "SWAG, precision $precision, $num_gpu process(es)"
if (( JOB_STATUS == 0 )) && [[ -f "$out_dir/results.json" ]]; then
  echo "run_swag.sh: results in $out_dir/results.json" >&2
fi
exit "$JOB_STATUS"
