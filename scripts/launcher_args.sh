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
