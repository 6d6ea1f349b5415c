#!/usr/bin/env bash
# Build the training image from the repository's Dockerfile.
#   bash scripts/docker/build.sh [TAG]            TAG defaults to bert:latest
#   FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.03-py3 bash scripts/docker/build.sh    another NGC base
# For Slurm with pyxis/enroot, push TAG to a registry, or make a squashfs: enroot import dockerd://bert:latest
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
fi
tag=${1:-bert:latest}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v docker > /dev/null || { echo "build.sh: docker is not installed on this machine" >&2; exit 1; }
build_args=()
[[ -n "${FROM_IMAGE_NAME:-}" ]] && build_args=(--build-arg "FROM_IMAGE_NAME=$FROM_IMAGE_NAME")
docker build "${build_args[@]}" -t "$tag" .
