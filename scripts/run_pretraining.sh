#!/usr/bin/env bash
# Two-phase BERT pre-training (sequence 128, then 512) with NVLAMB, NVIDIA DeepLearningExamples' interface:
# the same 25 positional arguments in the same order, with its DGX-1 (8 GPUs) defaults, and a 26th of ours.
#
#   bash scripts/run_pretraining.sh                                  # all defaults
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && dgxa100-80g_8gpu_bf16)
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && cpu)   # the CPU demo preset
#   bash scripts/run_pretraining.sh -h                               # this text
#
# Positional arguments (an empty string or a missing one takes the default; paths must not contain spaces):
#    1 train_batch_size          8192      sequences per GPU per optimizer step, phase 1 (all micro-batches)
#    2 learning_rate             6e-3      peak learning rate, phase 1
#    3 precision                 fp16      auto | fp16 | bf16 | tf32 | fp32 (auto: from the hardware, see --help of run_pretraining.py)
#    4 num_gpus                  8         processes on this node: torchrun --nproc_per_node (1: plain python;
#                                          on a machine without CUDA, >1 runs CPU processes with gloo)
#    5 warmup_proportion         0.2843    fraction of phase 1 spent warming the learning rate up
#    6 train_steps               7038      optimizer steps of phase 1
#    7 save_checkpoint_steps     200       a checkpoint every this many steps (both phases)
#    8 resume_training           false     true: continue phase 1 from the newest checkpoint in the output folder
#    9 create_logfile            true      true: tee each phase's output into results/<job_name>.<tag>.<date>.log
#   10 accumulate_gradients      true      false: no gradient accumulation (arguments 11 and 20 ignored)
#   11 gradient_accumulation_steps 128     micro-batches per step, phase 1 (micro-batch = arg 1 / arg 11)
#   12 seed                      12439
#   13 job_name                  bert_lamb_pretraining
#   14 allreduce_post_accumulation true    all-reduce once per optimizer step (DDP no_sync during accumulation)
#   15 allreduce_post_accumulation_fp16 true  all-reduce in half precision
#   16 train_batch_size_phase2   4096
#   17 learning_rate_phase2      4e-3
#   18 warmup_proportion_phase2  0.128
#   19 train_steps_phase2        1563
#   20 gradient_accumulation_steps_phase2 512
#   21 DATA_DIR_PHASE1           $BERT_PREP_WORKING_DIR/hdf5_lower_case_1_seq_len_128_max_pred_20_..._dupe_factor_5/wikicorpus_en/training/
#   22 DATA_DIR_PHASE2           $BERT_PREP_WORKING_DIR/hdf5_lower_case_1_seq_len_512_max_pred_80_..._dupe_factor_5/wikicorpus_en/training/
#   23 CODEDIR                   this repository (the original: /workspace/bert, where the Dockerfile puts it)
#   24 init_checkpoint           None      weights to start phase 1 from (NVIDIA .pt, Hugging Face folder, ckpt_<step>.pt)
#   25 BERT_CONFIG               $CODEDIR/bert_config.json (BERT-large)
#   26 optimizer                 nvlamb    nvlamb | adamw (ours; both phases: run_pretraining.py --optimizer)
#
# Environment (optional):
#   RESULTS_DIR ($CODEDIR/results), CHECKPOINTS_DIR ($RESULTS_DIR/checkpoints), VOCAB_FILE (passed as --vocab_file),
#   PHASES ("1 2"; "1" or "2" to run one phase), MAX_SEQ_LENGTH_PHASE1/2 (128/512), MAX_PRED_PHASE1/2 (20/80),
#   EVAL_DIR_PHASE1/2 (held-out shards: --eval_dir), EXTRA_ARGS (more run_pretraining.py flags, both phases),
#   PYTHON ($CODEDIR/.venv/bin/python if present, else python3),
#   DRY_RUN=1 (print each command, one line, shell-quoted, and run nothing).
#
# Exit status: 0 when every phase ran to its last step; 75 when a phase was stopped by a signal (SIGTERM, SIGINT or
# SIGUSR1 to this script, to run_pretraining.py or to the whole process group: the step in progress finishes, a
# checkpoint is written, the next phase is NOT started, and one line says how to resume) or ended early
# (--steps_this_run); a phase's own non-zero status when it failed.
#
# Several nodes (torchrun on each; argument 4 is the processes per node; every node sees the same folders):
#   NNODES (1), RDZV_ENDPOINT (host:port of a c10d rendezvous: torchrun --rdzv_backend=c10d, the nodes numbered by
#   it; RDZV_ID, default $SLURM_JOB_ID or bert, equal everywhere), or else MASTER_ADDR, MASTER_PORT (29500) and
#   NODE_RANK (0..NNODES-1) for torchrun's static rendezvous. E.g. two nodes, on each of them:
#     NNODES=2 RDZV_ENDPOINT=node1:29400 bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && dgxa100-80g_8gpu_bf16)
#   (scripts/torchrun_launcher.sh builds the command; on a Slurm cluster run.sub starts the tasks with srun instead.)
#   NUMA_BINDING=node|exclusive|socket|core-complex binds each local rank to its GPU's cores and memory node
#   (`python -m scripts.bind --help`; scripts/torchrun_launcher.sh).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
die() { echo "run_pretraining.sh: $*" >&2; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dataset_phase1="hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training"
dataset_phase2="hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training"
prep_dir="${BERT_PREP_WORKING_DIR:-${DATA_DIR:-$(dirname "$script_dir")/data}}"

train_batch_size=${1:-8192}
learning_rate=${2:-6e-3}
precision=${3:-fp16}
num_gpus=${4:-8}
warmup_proportion=${5:-0.2843}
train_steps=${6:-7038}
save_checkpoint_steps=${7:-200}
resume_training=${8:-false}
create_logfile=${9:-true}
accumulate_gradients=${10:-true}
gradient_accumulation_steps=${11:-128}
seed=${12:-12439}
job_name=${13:-bert_lamb_pretraining}
allreduce_post_accumulation=${14:-true}
allreduce_post_accumulation_fp16=${15:-true}
train_batch_size_phase2=${16:-4096}
learning_rate_phase2=${17:-4e-3}
warmup_proportion_phase2=${18:-0.128}
train_steps_phase2=${19:-1563}
gradient_accumulation_steps_phase2=${20:-512}
DATA_DIR_PHASE1=${21:-$prep_dir/$dataset_phase1/}
DATA_DIR_PHASE2=${22:-$prep_dir/$dataset_phase2/}
CODEDIR=${23:-$(dirname "$script_dir")}
init_checkpoint=${24:-None}
BERT_CONFIG=${25:-$CODEDIR/bert_config.json}
optimizer=${26:-nvlamb}
(( $# <= 26 )) || die "at most 26 positional arguments, got $# (see -h)"
[[ "$optimizer" == nvlamb || "$optimizer" == adamw ]] || die "argument 26 (optimizer) must be nvlamb or adamw, got '$optimizer'"

RESULTS_DIR=${RESULTS_DIR:-$CODEDIR/results}
CHECKPOINTS_DIR=${CHECKPOINTS_DIR:-$RESULTS_DIR/checkpoints}
PHASES=${PHASES:-1 2}
DRY_RUN=${DRY_RUN:-0}
# shellcheck source=launcher_args.sh
source "$script_dir/launcher_args.sh"
default_python "$CODEDIR"

# ---- validate the arguments (one line each, naming the argument) ---------------------------------------------
is_bool() { [[ "$1" == true || "$1" == false ]]; }
require_ints "1 train_batch_size $train_batch_size" \
             "4 num_gpus $num_gpus" \
             "6 train_steps $train_steps" \
             "7 save_checkpoint_steps $save_checkpoint_steps" \
             "11 gradient_accumulation_steps $gradient_accumulation_steps" \
             "12 seed $seed" \
             "16 train_batch_size_phase2 $train_batch_size_phase2" \
             "19 train_steps_phase2 $train_steps_phase2" \
             "20 gradient_accumulation_steps_phase2 $gradient_accumulation_steps_phase2"
require_nums "2 learning_rate $learning_rate" \
             "5 warmup_proportion $warmup_proportion" \
             "17 learning_rate_phase2 $learning_rate_phase2" \
             "18 warmup_proportion_phase2 $warmup_proportion_phase2"
for pair in "8 resume_training $resume_training" "9 create_logfile $create_logfile" \
            "10 accumulate_gradients $accumulate_gradients" "14 allreduce_post_accumulation $allreduce_post_accumulation" \
            "15 allreduce_post_accumulation_fp16 $allreduce_post_accumulation_fp16"; do
  set -- $pair
  is_bool "$3" || die "argument $1 ($2) must be true or false, got '$3'"
done
(( num_gpus >= 1 )) || die "argument 4 (num_gpus) must be at least 1"
precision_flags 3 "$precision"
for phase in $PHASES; do
  [[ "$phase" == 1 || "$phase" == 2 ]] || die "PHASES must list 1 and/or 2, got '$PHASES'"
done
if [[ "$DRY_RUN" != 1 ]]; then
  [[ -f "$CODEDIR/run_pretraining.py" ]] || die "no run_pretraining.py in CODEDIR $CODEDIR (argument 23)"
  [[ -f "$BERT_CONFIG" ]] || die "BERT config $BERT_CONFIG not found (argument 25)"
  for phase in $PHASES; do
    dir_var="DATA_DIR_PHASE$phase"
    [[ -d "${!dir_var}" ]] || die "phase $phase data folder ${!dir_var} not found: pass it as argument \
$((20 + phase)) or set BERT_PREP_WORKING_DIR (data/bertPrep.py writes the HDF5 shards there)"
  done
fi

# ---- build one phase's command --------------------------------------------------------------------------------
# torchrun as a module of the same interpreter: one node, or several (NNODES, RDZV_ENDPOINT or MASTER_ADDR).
source "$script_dir/torchrun_launcher.sh"
torchrun_launcher "$PYTHON" "$num_gpus"
env_prefix=()
[[ "$precision" == fp32 ]] && env_prefix=(env NVIDIA_TF32_OVERRIDE=0)

phase_command() {  # phase -> fills the global array `cmd`
  local phase=$1 batch lr warmup steps accum data seqlen maxpred
  if [[ "$phase" == 1 ]]; then
    batch=$train_batch_size lr=$learning_rate warmup=$warmup_proportion steps=$train_steps
    accum=$gradient_accumulation_steps data=$DATA_DIR_PHASE1
    seqlen=${MAX_SEQ_LENGTH_PHASE1:-128} maxpred=${MAX_PRED_PHASE1:-20}
  else
    batch=$train_batch_size_phase2 lr=$learning_rate_phase2 warmup=$warmup_proportion_phase2
    steps=$train_steps_phase2 accum=$gradient_accumulation_steps_phase2 data=$DATA_DIR_PHASE2
    seqlen=${MAX_SEQ_LENGTH_PHASE2:-512} maxpred=${MAX_PRED_PHASE2:-80}
  fi
  [[ "$accumulate_gradients" == true ]] || accum=1
  (( accum >= 1 && batch % accum == 0 )) || die "phase $phase: train_batch_size $batch is not divisible by \
gradient_accumulation_steps $accum"
  cmd=("${env_prefix[@]}" "${launcher[@]}" "$CODEDIR/run_pretraining.py"
       "--input_dir=$data" "--output_dir=$CHECKPOINTS_DIR" "--config_file=$BERT_CONFIG" --do_train
       "--train_batch_size=$batch" "--gradient_accumulation_steps=$accum"
       "--max_seq_length=$seqlen" "--max_predictions_per_seq=$maxpred"
       "--max_steps=$steps" "--warmup_proportion=$warmup" "--learning_rate=$lr"
       "--num_steps_per_checkpoint=$save_checkpoint_steps" "--seed=$seed"
       "--json-summary=$RESULTS_DIR/$job_name.phase$phase.json" "--optimizer=$optimizer" "${prec_flags[@]}")
  [[ "$allreduce_post_accumulation" == true ]] && cmd+=(--allreduce_post_accumulation)
  [[ "$allreduce_post_accumulation_fp16" == true ]] && cmd+=(--allreduce_post_accumulation_fp16)
  [[ -n "${VOCAB_FILE:-}" ]] && cmd+=("--vocab_file=$VOCAB_FILE")
  local eval_var="EVAL_DIR_PHASE$phase"
  [[ -n "${!eval_var:-}" ]] && cmd+=("--eval_dir=${!eval_var}")
  if [[ "$phase" == 1 ]]; then
    [[ "$resume_training" == true ]] && cmd+=(--resume_from_checkpoint)
    [[ "$init_checkpoint" != None ]] && cmd+=("--init_checkpoint=$init_checkpoint")
  else
    # Phase 2 starts from phase 1's ckpt_<train_steps>.pt in the same folder, or resumes its own checkpoints.
    cmd+=(--phase2 "--phase1_end_step=$train_steps" --resume_from_checkpoint)
  fi
  if [[ -n "${EXTRA_ARGS:-}" ]]; then
    local extra
    read -r -a extra <<< "$EXTRA_ARGS"
    cmd+=("${extra[@]}")
  fi
  return 0
}

# ---- run ------------------------------------------------------------------------------------------------------
if [[ "$DRY_RUN" != 1 ]]; then
  mkdir -p "$RESULTS_DIR" "$CHECKPOINTS_DIR"
  echo "run_pretraining.sh: precision $precision, $num_gpus process(es), checkpoints in $CHECKPOINTS_DIR" >&2
fi
if (( num_gpus > 1 )) && [[ -z "${OMP_NUM_THREADS:-}" ]] && ! command -v nvidia-smi > /dev/null; then
  # CPU processes: torchrun would give each one thread; share the cores instead.
  export OMP_NUM_THREADS=$(( $(nproc) / num_gpus > 0 ? $(nproc) / num_gpus : 1 ))
fi

# shellcheck source=signals.sh
source "$script_dir/signals.sh"
EXIT_STOPPED=75  # run_pretraining.py's code for "stopped by a signal after its checkpoint" (EX_TEMPFAIL)

# final_field PHASE KEY: a field of the newest FINAL record of that phase's JSON log ('' when there is none)
final_field() {
  "$PYTHON" - "$RESULTS_DIR/$job_name.phase$1.json" "$2" <<'PY' 2> /dev/null || true
import json, sys
from pathlib import Path

path, key = Path(sys.argv[1]), sys.argv[2]
lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
finals = [json.loads(line) for line in lines if '"FINAL"' in line]
value = finals[-1]["data"].get(key) if finals else None
print("" if value is None else value)
PY
}

# resume_hint PHASE: what to run to continue
resume_hint() {
  if [[ "$resume_training" == true ]]; then
    echo "run the same command again to resume"
  elif [[ "$1" == 1 ]]; then
    echo "run the same command with argument 8 (resume_training) set to true to resume"
  else
    echo "run the same command with PHASES=2 to resume phase 2"
  fi
}

for phase in $PHASES; do
  phase_command "$phase"
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "${cmd[@]}" | sed 's/ $//'
    echo
    continue
  fi
  if [[ -n "$STOP_SIGNAL" ]]; then  # stopped between phases
    echo "run_pretraining.sh: stopped by $STOP_SIGNAL before phase $phase started: $(resume_hint "$phase")" >&2
    exit $EXIT_STOPPED
  fi
  logfile=""
  if [[ "$create_logfile" == true ]]; then
    if [[ "$phase" == 1 ]]; then batch=$train_batch_size; else batch=$train_batch_size_phase2; fi
    logfile="$RESULTS_DIR/$job_name.pyt_bert_pretraining_phase${phase}_${precision}_gbs$(( batch * num_gpus * ${NNODES:-1} )).$(date +%y%m%d%H%M%S).log"
    echo "run_pretraining.sh: phase $phase log: $logfile" >&2
    { printf '%q ' "${cmd[@]}"; echo; } > "$logfile"
  fi
  run_forwarding_signals "$logfile" "${cmd[@]}"
  if [[ "$phase" == 1 ]]; then steps=$train_steps; else steps=$train_steps_phase2; fi
  reached=$(final_field "$phase" phase_step)
  global=$(final_field "$phase" step)
  # Stopped: the job said so (75), or a stop signal came and the job ended cleanly or died of a signal. A job that
  # failed otherwise after a stop signal (a traceback while stopping) is reported as the failure it is, below.
  if [[ $JOB_STATUS == "$EXIT_STOPPED" ]] || { [[ -n "$STOP_SIGNAL" ]] && (( JOB_STATUS == 0 || JOB_STATUS > 128 )); }; then
    by=$(final_field "$phase" stopped_by_signal)
    [[ -n "$by" ]] || by=${STOP_SIGNAL:-a signal}
    echo "run_pretraining.sh: phase $phase stopped at step ${global:-?} by $by: $(resume_hint "$phase")" >&2
    exit $EXIT_STOPPED
  fi
  if (( JOB_STATUS != 0 )); then
    # Repeat the job's own one-line error (run_pretraining.py: error: ...) last, where a reader looks first.
    why=""
    [[ -n "$logfile" ]] && why=$(grep -a ': error: ' "$logfile" | tail -n 1 || true)
    if [[ -n "$why" ]]; then
      echo "run_pretraining.sh: phase $phase failed (exit $JOB_STATUS): $why" >&2
    else
      echo "run_pretraining.sh: phase $phase failed (exit $JOB_STATUS; its last lines are above)" >&2
    fi
    exit "$JOB_STATUS"
  fi
  if [[ "$reached" != "$steps" ]]; then  # e.g. --steps_this_run in EXTRA_ARGS: the phase is not over
    echo "run_pretraining.sh: phase $phase ended at step ${reached:-?} of $steps: the next phase needs it \
complete; $(resume_hint "$phase")" >&2
    exit $EXIT_STOPPED
  fi
  echo "run_pretraining.sh: phase $phase finished: $(grep '"FINAL"' "$RESULTS_DIR/$job_name.phase$phase.json" | tail -n 1)" >&2
done
