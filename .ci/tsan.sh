#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI: ThreadSanitizer over the CPU tests that use the kernel cache and the disk
# cache from many threads (KernelCache::get from several threads, get_all's
# pool, the driver opened from several threads), in a build of their own
# (POOLER_SANITIZE=thread). NVRTC and the driver are not instrumented; what NVRTC
# does inside itself is ignored (tsan.supp), the races TSan reports are pooler's.
#
#   .ci/tsan.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build-tsan
targets=(test_kernel_cache test_cache_trust test_failing_driver test_form test_fake_nccl)
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOOLER_SANITIZE=thread "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" fake_gpu_driver
echo "tsan: built in $((SECONDS - start)) s"
# halt_on_error: the first race fails the run. Forked children (the tests use
# fork to run a cache in a process of its own) report too.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/.ci/tsan.supp ${TSAN_OPTIONS:-}"
export POOLER_LOG_LEVEL=warn
for test in "${targets[@]}"; do
  echo "tsan: $test"
  "$build/tests/$test" --gtest_brief=1
done
echo "tsan: ${#targets[@]} test programs clean in $((SECONDS - start)) s"
