#!/usr/bin/env bash
# Install Debian's Slurm and MUNGE packages (slurmctld slurmd slurm-client munge) when they are missing: what
# tests/test_slurm.py needs to start its own one-node cluster on 127.0.0.1 (it starts and stops the daemons itself,
# from a temporary folder; nothing here starts a daemon or touches /etc). Needs root and apt-get.
#
#   bash scripts/install_slurm.sh      # quiet; one line on stderr and a non-zero exit when it cannot install
set -euo pipefail

die() { echo "install_slurm.sh: $*" >&2; exit 1; }

packages=(slurmctld slurmd slurm-client munge)
missing=0
for binary in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/sbatch /usr/bin/scontrol; do
  [[ -x "$binary" ]] || missing=1
done
(( missing )) || exit 0
command -v apt-get > /dev/null || die "apt-get not found: install ${packages[*]} with this system's package manager"
(( EUID == 0 )) || die "${packages[*]} are not installed and installing them needs root: sudo bash $0"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}"; } \
    > "$log" 2>&1; then
  die "apt-get install ${packages[*]} failed: $(grep -v '^\s*$' "$log" | tail -n 1)"
fi
echo "install_slurm.sh: installed ${packages[*]}" >&2
