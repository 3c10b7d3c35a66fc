#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI: the libFuzzer harnesses of tests/fuzz (the cache entry parser, the cubin
# ELF reader) built with clang, ASan and UBSan, each run for a bounded time
# from the seed corpus in tests/fuzz/corpus (copied: the repository's corpus is
# never written). Installs clang and its libFuzzer runtime when missing and
# root; skips with a message, exit 0, when they cannot be had.
#
#   .ci/fuzz.sh [SECONDS_PER_HARNESS]      (default 30)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}
build=build-fuzz

have_libfuzzer() {
  command -v clang++ >/dev/null 2>&1 || return 1
  local probe
  probe=$(mktemp -d)
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' \
    >"$probe/probe.cpp"
  clang++ -fsanitize=fuzzer "$probe/probe.cpp" -o "$probe/probe" >/dev/null 2>&1
  local status=$?
  rm -rf "$probe"
  return $status
}

if ! have_libfuzzer; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing clang and libclang-rt-14-dev"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev >/dev/null; } ||
      echo "fuzz: apt-get could not install them"
  fi
fi
if ! have_libfuzzer; then
  echo "fuzz: SKIPPED: clang with libFuzzer (-fsanitize=fuzzer) is not available and could not be installed"
  exit 0
fi

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPOOLER_FUZZ=ON -DPOOLER_WERROR=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_cache_entry fuzz_cubin_elf

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for harness in cache_entry cubin_elf; do
  mkdir -p "$work/$harness"
  cp tests/fuzz/corpus/$harness/* "$work/$harness/"
  echo "fuzz: $harness for ${seconds} s"
  # -max_len covers the seeds; the crash reproducer (if any) lands in $build.
  "$build/tests/fuzz/fuzz_$harness" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-$harness-" "$work/$harness" 2>&1 | tail -n 15
  status=${PIPESTATUS[0]}
  if [[ $status -ne 0 ]]; then
    echo "fuzz: $harness FAILED (exit $status); reproducer: $build/fuzz-$harness-*" >&2
    exit 1
  fi
done
echo "fuzz: both harnesses ran ${seconds} s each without a finding"
