#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets a machine up for pooler and builds it into build/ (or BUILD_DIR).
#
#   tools/setup.sh [BUILD_DIR] [extra cmake arguments...]
#
# It looks for each tool and library itself, wherever it comes from (Debian
# packages, CMake and Ninja from pip, a CUDA toolkit, NCCL from libnccl-dev,
# the toolkit or the nvidia-nccl wheel), installs only what is missing with
# apt-get when that works (as root, with a reachable mirror), and otherwise
# names what is missing and how to get it, and stops. Environment:
#   CUDA_HOME  the CUDA toolkit (default /usr/local/cuda)
#   CXX        the C++ compiler (default c++, then g++, then clang++)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${1:-$here/build}
shift || true
cuda=${CUDA_HOME:-/usr/local/cuda}
min_cmake=3.25

say() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }
version_at_least() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]; }

# ---- what is there ---------------------------------------------------------------
# Each check prints nothing and returns 0 when the thing is usable.
find_cxx() {
  local candidate
  for candidate in ${CXX:-} c++ g++ clang++; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    # C++20 with the library parts pooler uses (span, concepts, format-free).
    if printf '#include <span>\n#include <concepts>\nint main(){std::span<int> s; return static_cast<int>(s.size());}\n' |
      "$candidate" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
      cxx=$(command -v "$candidate")
      return 0
    fi
  done
  return 1
}
header() { printf '#include <%s>\n' "$1" | "$cxx" -std=c++20 -x c++ -E -I"$cuda/include" ${nccl_root:+-I"$nccl_root/include"} - >/dev/null 2>&1; }
# (grep without -q: an early exit would fail the pipeline under pipefail)
library() { [[ $("$cxx" -print-file-name="$1") == /* ]] || ldconfig -p 2>/dev/null | grep "/$1\$" >/dev/null; }
check_cmake() { command -v cmake >/dev/null && version_at_least "$(cmake --version | head -1 | awk '{print $3}')" "$min_cmake"; }
check_generator() { command -v ninja >/dev/null || command -v make >/dev/null; }
check_cxx() { find_cxx; }
check_spdlog() { header spdlog/spdlog.h; }
check_fmt() { header fmt/format.h; }
check_json() { header nlohmann/json.hpp; }
check_cli11() { header CLI/CLI.hpp; }
check_gtest() { header gtest/gtest.h && { library libgtest.a || library libgtest.so; }; }
check_openssl() { header openssl/sha.h && { library libcrypto.so || library libcrypto.a; }; }
check_cuda() { [[ -e $cuda/include/cuda.h && -e $cuda/include/nvrtc.h ]]; }
find_nccl() {
  # The toolkit's or the system's copy, else the nvidia-nccl wheel of a Python on PATH.
  nccl_root=""
  if header nccl.h && { library libnccl.so || library libnccl.so.2 || ls "$cuda"/lib64/libnccl.so* >/dev/null 2>&1; }; then
    return 0
  fi
  local python wheel
  for python in python3 python; do
    command -v "$python" >/dev/null || continue
    wheel=$("$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null) || continue
    if [[ -e $wheel/include/nccl.h && -e $wheel/lib/libnccl.so.2 ]]; then
      nccl_root=$wheel
      return 0
    fi
  done
  return 1
}

# name | check | Debian package | how to get it otherwise
requirements=(
  "CMake >= $min_cmake|check_cmake|cmake|pip install cmake (puts cmake on PATH)"
  "Ninja or Make|check_generator|ninja-build|pip install ninja"
  "a C++20 compiler|check_cxx|g++|install GCC >= 11 or Clang >= 14 and set CXX"
  "spdlog headers|check_spdlog|libspdlog-dev|install spdlog >= 1.10 headers (libspdlog-dev)"
  "fmt headers|check_fmt|libfmt-dev|install fmt >= 9 headers (libfmt-dev)"
  "nlohmann/json headers (the benchmark reports)|check_json|nlohmann-json3-dev|install nlohmann/json >= 3.10 headers (nlohmann-json3-dev)"
  "CLI11 headers (the tools' command lines)|check_cli11|libcli11-dev|install CLI11 >= 2.1 headers (libcli11-dev), or configure with -DPOOLER_BUILD_TOOLS=OFF -DPOOLER_BUILD_TESTS=OFF"
  "GoogleTest|check_gtest|libgtest-dev|install GoogleTest (libgtest-dev), or configure with -DPOOLER_BUILD_TESTS=OFF"
  "OpenSSL libcrypto|check_openssl|libssl-dev|install OpenSSL 3 headers and libcrypto (libssl-dev)"
  "CUDA 13 toolkit headers (cuda.h, nvrtc.h)|check_cuda||install the CUDA 13 toolkit (with NVRTC) and set CUDA_HOME (now $cuda)"
  "NCCL >= 2.28 (nccl.h, libnccl)|find_nccl|libnccl-dev|install libnccl-dev, or pip install nvidia-nccl-cu13"
)

missing_packages=()
run_checks() {
  missing=()
  missing_packages=()
  cxx=${cxx:-$(command -v c++ || command -v g++ || true)}
  local entry name check package
  for entry in "${requirements[@]}"; do
    IFS='|' read -r name check package _ <<<"$entry"
    if ! "$check"; then
      missing+=("$entry")
      [[ -n $package ]] && missing_packages+=("$package")
    fi
  done
}

run_checks
if ((${#missing[@]})) && ((${#missing_packages[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing with apt-get: ${missing_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq >/dev/null 2>&1 &&
      apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null 2>&1; then
      run_checks
    else
      say "apt-get could not install them (no reachable mirror, or no such package here)"
    fi
  fi
fi
if ((${#missing[@]})); then
  for entry in "${missing[@]}"; do
    IFS='|' read -r name _ package how <<<"$entry"
    printf 'setup: missing: %s: %s\n' "$name" "$how" >&2
  done
  fail "stopped: install the above (as root, with a Debian mirror, setup installs the Debian packages itself)"
fi

# ---- what was found (a few lines) ---------------------------------------------------
generator=Ninja
command -v ninja >/dev/null || generator="Unix Makefiles"
preprocessed=$(printf '#include <nccl.h>\n' | "$cxx" -x c++ -E -I"$cuda/include" ${nccl_root:+-I"$nccl_root/include"} - 2>/dev/null)
nccl_header=$(grep -m1 -o '"[^"]*nccl.h"' <<<"$preprocessed" | tr -d '"')
nccl_version=unknown
[[ -n $nccl_header ]] && nccl_version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) / {printf "%s%s", sep, $3; sep="."}' "$nccl_header")
say "cmake $(cmake --version | head -1 | awk '{print $3}') ($(command -v cmake)); generator $generator"
say "compiler $("$cxx" --version | head -1) ($cxx)"
say "CUDA $(awk '/#define CUDA_VERSION/ {print int($3/1000) "." ($3%1000)/10}' "$cuda/include/cuda.h") at $cuda; NVRTC header $cuda/include/nvrtc.h"
say "NCCL $nccl_version ($nccl_header${nccl_root:+, wheel $nccl_root})"

# ---- configure and build ---------------------------------------------------------------
cores=$(nproc)
arguments=(-S "$here" -B "$build_dir" -G "$generator" -DCUDAToolkit_ROOT="$cuda" -DCMAKE_CXX_COMPILER="$cxx")
[[ -n $nccl_root ]] && arguments+=(-DPOOLER_NCCL_ROOT="$nccl_root")
if [[ -e $build_dir/CMakeCache.txt ]]; then
  arguments=(-S "$here" -B "$build_dir")  # keep the generator and compiler it was made with
fi
say "configuring $build_dir"
mkdir -p "$build_dir"
cmake "${arguments[@]}" "$@" >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log" >&2
  fail "cmake configure failed (log above, also in $build_dir/configure.log)"
}
say "building with $cores jobs"
cmake --build "$build_dir" -j "$cores"
say "done; tests: ctest --test-dir $build_dir --output-on-failure -j $cores"
