#!/usr/bin/env bash
# Build the training image from the repository's Dockerfile.
# usage: scripts/docker/build.sh [TAG]           TAG defaults to bert:latest; DRY_RUN=1 prints the docker command
#   bash scripts/docker/build.sh
#   FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:26.02-py3 bash scripts/docker/build.sh    # another NGC base
# For Slurm with pyxis/enroot, push TAG to a registry, or make a squashfs: enroot import dockerd://bert:latest
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
fi
tag=${1:-bert:latest}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build_args=()
[[ -n "${FROM_IMAGE_NAME:-}" ]] && build_args=(--build-arg "FROM_IMAGE_NAME=$FROM_IMAGE_NAME")
build=(docker build "${build_args[@]}" -t "$tag" .)
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${build[@]}" | sed 's/ $//'
  echo
  exit 0
fi
command -v docker > /dev/null || { echo "build.sh: docker is not installed on this machine" >&2; exit 1; }
"${build[@]}"
