# Sourced by the launchers (bash): run a command in the background and wait for it, passing on the stop signals.
#
# A script that runs its job in the foreground dies of SIGTERM at once and orphans the job (bash runs no trap
# while a foreground command is running), and a `tee` in the job's pipeline dies of a group-wide SIGTERM before the
# job has written its preemption checkpoint. So: the job runs in the background, SIGTERM/SIGINT/SIGUSR1 to this
# script are forwarded to it, `tee` ignores them and ends when the job's output ends, and the script waits until
# the job has really gone.
#
#   source scripts/signals.sh
#   run_forwarding_signals LOGFILE CMD...   # LOGFILE '' for no log; sets JOB_STATUS and STOP_SIGNAL (or '')

STOP_SIGNAL=""
JOB_STATUS=0
_job_pid=""

_forward_signal() {  # a stop signal for this script: remember it and pass it on to the job
  STOP_SIGNAL=${STOP_SIGNAL:-SIG$1}
  [[ -n "$_job_pid" ]] && kill -s "$1" "$_job_pid" 2> /dev/null
  return 0
}
trap '_forward_signal TERM' TERM
trap '_forward_signal INT' INT
trap '_forward_signal USR1' USR1

run_forwarding_signals() {
  local logfile=$1
  shift
  if [[ -n "$logfile" ]]; then
    "$@" > >(trap '' TERM INT USR1; exec tee -a "$logfile") 2>&1 &
  else
    "$@" &
  fi
  _job_pid=$!
  # `wait` returns early (status > 128) when a trapped signal arrives: wait again while the job lives; then ask
  # once more for its status (bash keeps the status of a child it has reaped, so this is the job's real one).
  while kill -0 "$_job_pid" 2> /dev/null; do
    wait "$_job_pid" 2> /dev/null || true
  done
  JOB_STATUS=0
  wait "$_job_pid" 2> /dev/null || JOB_STATUS=$?
  _job_pid=""
  [[ -z "$logfile" ]] || wait 2> /dev/null || true  # let `tee` write the last lines before we print ours
  return 0
}

# launch_job NAME LOGFILE NPROC DESCRIPTION: the tail the fine-tuning launchers share. EXTRA_ARGS (more flags) are
# appended to the array `cmd`; DRY_RUN=1 prints it (one line, shell-quoted) and exits 0; CPU processes share the
# cores (torchrun would give each one thread); the job runs with its output also written to LOGFILE and the stop
# signals forwarded; JOB_STATUS is its exit status.
launch_job() {
  local name=$1 logfile=$2 procs=$3 description=$4 extra cores
  if [[ -n "${EXTRA_ARGS:-}" ]]; then
    read -r -a extra <<< "$EXTRA_ARGS"
    cmd+=("${extra[@]}")
  fi
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}" | sed 's/ $//'
    echo
    exit 0
  fi
  if (( procs > 1 )) && [[ -z "${OMP_NUM_THREADS:-}" ]] && ! command -v nvidia-smi > /dev/null; then
    cores=$(nproc)
    export OMP_NUM_THREADS=$(( cores / procs > 0 ? cores / procs : 1 ))
  fi
  mkdir -p "$(dirname "$logfile")"
  { printf '%q ' "${cmd[@]}"; echo; } > "$logfile"
  echo "$name: $description, log $logfile" >&2
  run_forwarding_signals "$logfile" "${cmd[@]}"
}
