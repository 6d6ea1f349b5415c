# Sourced by the launchers (scripts/run_pretraining.sh, run_squad.sh, run_glue.sh, run_swag.sh): checks of their
# positional arguments, each failure one line naming the argument (through the caller's die()).
#
#   default_python CODEDIR          PYTHON unless set: CODEDIR/.venv/bin/python if present, else python3
#   require_ints "N name value" ... each value a non-negative integer
#   require_nums "N name value" ... each value a number (1e-3, -1, 0.5)
#   precision_flags N VALUE         fills the array prec_flags (--precision=VALUE) or dies
#   parse_mode N MODE               sets do_train, do_eval, do_predict from words of MODE (train eval prediction)

is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_num() { [[ "$1" =~ ^-?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]]; }

default_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    [[ -x "$1/.venv/bin/python" ]] && PYTHON="$1/.venv/bin/python"
  fi
  return 0
}

require_ints() {
  local pair
  for pair in "$@"; do
    set -- $pair
    is_int "$3" || die "argument $1 ($2) must be a non-negative integer, got '$3'"
  done
}

require_nums() {
  local pair
  for pair in "$@"; do
    set -- $pair
    is_num "$3" || die "argument $1 ($2) must be a number, got '$3'"
  done
}

precision_flags() {  # fp32 also sets NVIDIA_TF32_OVERRIDE=0 in the launchers
  case "$2" in
    auto|fp16|bf16|tf32|fp32) prec_flags=("--precision=$2") ;;
    *) die "argument $1 (precision) must be auto, fp16, bf16, tf32 or fp32, got '$2'" ;;
  esac
}

parse_mode() {
  local word
  do_train=false do_eval=false do_predict=false
  for word in ${2//,/ }; do
    case "$word" in
      train) do_train=true ;;
      eval) do_eval=true ;;
      prediction|predict) do_predict=true ;;
      *) die "argument $1 (mode) must list words among train, eval and prediction, got '$2'" ;;
    esac
  done
  [[ "$do_train" == true || "$do_eval" == true || "$do_predict" == true ]] || die "argument $1 (mode) is empty"
}

# check_model_files: arguments 1 (init_checkpoint), 3 (vocab_file) and 4 (config_file) of the GLUE and SWAG
# launchers exist (None: taken from the checkpoint's folder).
check_model_files() {
  [[ -e "$init_checkpoint" ]] || die "init_checkpoint $init_checkpoint not found (argument 1)"
  [[ "$vocab_file" == None || -f "$vocab_file" ]] || die "vocab_file $vocab_file not found (argument 3; None: the \
checkpoint folder's vocab.txt)"
  [[ "$config_file" == None || -f "$config_file" ]] || die "config_file $config_file not found (argument 4; None: \
the checkpoint's config)"
}

# append_finetune_flags: the training / evaluation / prediction flags of run_glue.py and run_swag.py, appended to
# the caller's cmd array from its variables (parse_mode's do_train/do_eval/do_predict, the positional arguments).
append_finetune_flags() {
  [[ "$do_train" == true ]] && cmd+=(--do_train "--train_batch_size=$batch_size"
    "--gradient_accumulation_steps=$gradient_accumulation_steps" "--learning_rate=$learning_rate"
    "--warmup_proportion=$warmup_proportion" "--num_train_epochs=$epochs" "--max_steps=$max_steps")
  [[ "$do_eval" == true ]] && cmd+=(--do_eval)
  [[ "$do_predict" == true ]] && cmd+=(--do_predict)
  [[ "$do_eval" == true || "$do_predict" == true ]] && cmd+=("--eval_batch_size=$batch_size")
  [[ "$DO_LOWER_CASE" == true ]] && cmd+=(--do_lower_case)
  [[ "$vocab_file" != None ]] && cmd+=("--vocab_file=$vocab_file")
  [[ "$config_file" != None ]] && cmd+=("--config_file=$config_file")
  return 0
}
