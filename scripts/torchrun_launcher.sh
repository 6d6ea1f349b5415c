# Sourced by scripts/run_pretraining.sh, run_squad.sh, run_glue.sh and run_swag.sh (it runs nothing itself):
# the command that starts one node's processes, from their number and the multi-node settings in the environment.
#
#   torchrun_launcher PYTHON NPROC      fills the array `launcher`; errors go through the caller's die()
#
# One node (NNODES unset or 1, no RDZV_ENDPOINT): NPROC 1 is plain PYTHON, NPROC > 1 is
# `PYTHON -m torch.distributed.run --standalone --nproc_per_node=NPROC`, as before.
# Several nodes: start the same launcher on every node, with the same settings but NODE_RANK:
#   NNODES          number of nodes [1]
#   RDZV_ENDPOINT   host:port of a c10d rendezvous, e.g. the first node's address and a free port: torchrun
#                   --rdzv_backend=c10d (the rendezvous numbers the nodes itself; NODE_RANK is not needed);
#                   RDZV_ID [$SLURM_JOB_ID, else bert] names the run and must be equal on every node
#   MASTER_ADDR, MASTER_PORT [29500], NODE_RANK   without RDZV_ENDPOINT: torchrun's static rendezvous on node 0
#                   at MASTER_ADDR:MASTER_PORT; NODE_RANK (0 there, 1..NNODES-1 elsewhere) is then required
# On a GPU node the processes use NCCL, on a CPU node gloo (dist_env.init_distributed picks it from the device).
#   NUMA_BINDING    node | exclusive | socket | core-complex: bind each local rank to the cores and memory node
#                   closest to its GPU (scripts/bind.py prints the mapping; torchrun's own --numa-binding where
#                   the installed PyTorch has it, else numactl); unset: no binding

torchrun_launcher() {
  _torchrun_command "$@"
  if [[ -n "${NUMA_BINDING:-}" ]]; then
    mapfile -t launcher < <("$1" "$(dirname "${BASH_SOURCE[0]}")/bind.py" --mode "$NUMA_BINDING" --nproc "$2" \
      --launcher -- "${launcher[@]}") && (( ${#launcher[@]} )) || die "NUMA_BINDING=$NUMA_BINDING: see the line above"
  fi
  return 0
}

_torchrun_command() {
  local python=$1 nproc=$2 nnodes=${NNODES:-1}
  [[ "$nnodes" =~ ^[0-9]+$ ]] && (( nnodes >= 1 )) || die "NNODES must be a positive integer, got '$nnodes'"
  if (( nnodes == 1 )) && [[ -z "${RDZV_ENDPOINT:-}" ]]; then
    launcher=("$python")
    if (( nproc > 1 )); then
      launcher=("$python" -m torch.distributed.run --standalone "--nproc_per_node=$nproc")
    fi
    return 0
  fi
  launcher=("$python" -m torch.distributed.run "--nnodes=$nnodes" "--nproc_per_node=$nproc")
  if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
    [[ "$RDZV_ENDPOINT" =~ ^[^:[:space:]]+:[0-9]+$ ]] || die "RDZV_ENDPOINT must be host:port (a c10d rendezvous \
on one of the nodes), got '$RDZV_ENDPOINT'"
    launcher+=(--rdzv_backend=c10d "--rdzv_endpoint=$RDZV_ENDPOINT" "--rdzv_id=${RDZV_ID:-${SLURM_JOB_ID:-bert}}")
    return 0
  fi
  [[ -n "${MASTER_ADDR:-}" ]] || die "NNODES=$nnodes needs MASTER_ADDR (node 0's address) or RDZV_ENDPOINT \
(host:port of a c10d rendezvous)"
  [[ -n "${NODE_RANK:-}" ]] || die "NNODES=$nnodes with MASTER_ADDR needs NODE_RANK (0..$(( nnodes - 1 )), 0 on \
$MASTER_ADDR)"
  [[ "$NODE_RANK" =~ ^[0-9]+$ ]] && (( NODE_RANK < nnodes )) || die "NODE_RANK must be 0..$(( nnodes - 1 )) \
(NNODES=$nnodes), got '$NODE_RANK'"
  local port=${MASTER_PORT:-29500}
  [[ "$port" =~ ^[0-9]+$ ]] || die "MASTER_PORT must be a port number, got '$port'"
  launcher+=("--node_rank=$NODE_RANK" "--master_addr=$MASTER_ADDR" "--master_port=$port")
}
