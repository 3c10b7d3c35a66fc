#!/usr/bin/env bash
# Sets a fresh Debian/Ubuntu machine up for pooler and builds it into build/:
# installs the Debian packages it needs (when run as root and any is missing),
# checks for the CUDA toolkit (NVRTC and NCCL headers and libraries), then
# configures and builds with CMake and Ninja.
#
#   tools/setup.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${1:-$here/build}
shift || true

packages=(cmake ninja-build g++ libspdlog-dev libfmt-dev libssl-dev libgtest-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: not root: install these packages first: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda=${CUDA_HOME:-/usr/local/cuda}
for needed in include/nvrtc.h include/cuda.h include/nccl.h; do
  if [[ ! -e $cuda/$needed ]]; then
    echo "setup: the CUDA toolkit is missing $cuda/$needed: install CUDA 13 with NVRTC and NCCL 2.28 (or set CUDA_HOME)" >&2
    exit 1
  fi
done

cores=$(nproc)
echo "setup: configuring $build_dir"
cmake -S "$here" -B "$build_dir" -G Ninja -DCUDAToolkit_ROOT="$cuda" "$@" >/dev/null
echo "setup: building with $cores jobs"
cmake --build "$build_dir" -j "$cores"
echo "setup: done; tests: ctest --test-dir $build_dir --output-on-failure"
