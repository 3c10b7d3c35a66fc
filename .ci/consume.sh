#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs BUILD_DIR into PREFIX, checks the installed libpooler.so (SONAME with
# the ABI version, nothing of CUDA needed at load time, only pooler's symbols
# exported, no empty or relative RUNPATH element, nor in the tools), builds
# tests/consumer against it with find_package(pooler) and with pkg-config, and
# runs both (version and device count; no GPU needed).
#
#   .ci/consume.sh BUILD_DIR PREFIX
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=$1
prefix=$2
say() { printf 'consume: %s\n' "$*"; }

cmake --install "$build" --prefix "$prefix" >/dev/null
library=$(ls "$prefix"/lib*/libpooler.so.*.*.* | head -1)
soname=$(objdump -p "$library" | awk '/SONAME/ {print $2}')
say "installed $(basename "$library"), SONAME $soname"
abi=$(sed -n 's/^#define POOLER_ABI_VERSION \([0-9][0-9]*\)$/\1/p' include/pooler/pooler.h)
[[ $soname == "libpooler.so.$abi" ]] || { say "SONAME $soname is not libpooler.so.$abi (POOLER_ABI_VERSION)" >&2; exit 1; }
if objdump -p "$library" | awk '/NEEDED/ {print $2}' | grep -E 'libcuda|libnvrtc'; then
  say "libpooler.so needs the CUDA driver or NVRTC at load time (both must be dlopen'ed)" >&2
  exit 1
fi
cmake -DNM=nm -DLIBRARY="$library" -DHEADER=include/pooler/pooler.h -P tests/check_c_api_symbols.cmake
# The installed files' RUNPATH: no empty or relative element (the current directory).
cmake -DREADELF=readelf -DLIBRARY="$library" \
  "-DBINARIES=$prefix/bin/pooler-cubin;$prefix/bin/pooler-bench;$prefix/bin/pooler-kernel-bench" \
  -P tests/check_load_dependencies.cmake
ls "$prefix"/include/pooler/pooler.h "$prefix"/include/pooler/pooler.hpp "$prefix"/lib*/cmake/pooler/poolerConfig.cmake \
  "$prefix"/lib*/pkgconfig/pooler.pc "$prefix"/bin/pooler-cubin "$prefix"/bin/pooler-bench >/dev/null

generator=Ninja
command -v ninja >/dev/null || generator="Unix Makefiles"
cmake -S tests/consumer -B "$prefix/consumer" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
say "find_package(pooler) consumer:"
"$prefix/consumer/pooler_consumer"

# As a subproject: configures without GoogleTest (building it would compile the
# library a second time; the configure is what a missing GoogleTest would break).
cmake -S tests/consumer -B "$prefix/subproject" -G "$generator" -DPOOLER_SOURCE_DIR="$PWD" \
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON >/dev/null
say "add_subdirectory(pooler) configures without GoogleTest, with the library alone"

if ! command -v pkg-config >/dev/null; then
  say "no pkg-config here: the pkg-config consumer is not built"
  exit 0
fi
pc_dir=$(dirname "$(ls "$prefix"/lib*/pkgconfig/pooler.pc)")
flags=$(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs pooler)
c++ -std=c++20 tests/consumer/main.cpp $flags -Wl,-rpath,"$(dirname "$library")" -o "$prefix/pooler_consumer_pc"
say "pkg-config consumer ($flags):"
"$prefix/pooler_consumer_pc"
