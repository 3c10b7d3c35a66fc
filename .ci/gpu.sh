#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The checks a developer runs on the GPU host before resolving an issue, in one command (a lent GPU
# machine is held by the minute, and it reaches no package registry):
#   1. the README's two commands, from this tree without a build folder:
#      tools/setup.sh && build/tools/pooler-bench, then ctest;
#   2. with WHEEL (a wheel .ci/python.sh repaired here and carried over): installed into a folder of
#      its own with the host's torch, its pytest (GPU tests included) and examples/pooler_torch.py,
#      run from outside the tree so that they import the installed package.
# Every step runs, a failure does not stop the next; each step's whole output goes to LOGS/STEP.log and
# its summary lines to stdout. Exits 1 if any step failed. NCCL_NVLS_ENABLE=0 throughout.
#
#   .ci/gpu.sh [WHEEL]        LOGS: $OUT when set (the device tool's folder), else gpu-logs/
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
logs=${OUT:-$root/gpu-logs}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
wheel=${1:-}
if [[ -n $wheel && ! -f $wheel ]]; then
  echo "gpu.sh: no wheel at $wheel" >&2
  exit 2
fi
failed=()

# step NAME SUMMARY COMMAND...: runs COMMAND into LOGS/NAME.log; prints its time, status and the lines
# matching the regex SUMMARY (SUMMARY "tail": its last 15 lines but the build's progress; the last 30
# lines when it failed).
step() {
  local name=$1 summary=$2 started=$SECONDS status=0
  shift 2
  "$@" >"$logs/$name.log" 2>&1 || status=$?
  echo "== $name: rc $status, $((SECONDS - started)) s"
  if [[ $status -ne 0 ]]; then
    failed+=("$name")
    tail -n 30 "$logs/$name.log"
  elif [[ $summary == tail ]]; then
    grep -v '^\[[0-9]*/[0-9]*\]' "$logs/$name.log" | tail -n 15  # the output, not the build's progress
  else
    grep -E "$summary" "$logs/$name.log" | tail -n 20
  fi
}

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
else
  echo "gpu: no nvidia-smi (the GPU tests will skip)"
fi
rm -rf build
step bench tail bash -c 'tools/setup.sh && build/tools/pooler-bench'
step ctest 'tests passed|tests failed|\(Failed\)|\(Timeout\)' ctest --test-dir build --output-on-failure -j "$(nproc)"

if [[ -n $wheel ]]; then
  site=$(mktemp -d)
  away=$(mktemp -d)
  trap 'rm -rf "$site" "$away"' EXIT
  step wheel 'Successfully' python3 -m pip install --no-deps --no-index --target "$site" "$(realpath "$wheel")"
  step pytest 'passed|failed|error' bash -c "cd '$away' && PYTHONPATH='$site' python3 -m pytest -q -p no:cacheprovider '$root/python/tests'"
  step example '.' bash -c "cd '$away' && PYTHONPATH='$site' python3 '$root/examples/pooler_torch.py'"
fi

if [[ ${#failed[@]} -ne 0 ]]; then
  echo "gpu.sh: FAILED: ${failed[*]} (logs in $logs)"
  exit 1
fi
echo "gpu.sh: every step passed (logs in $logs)"
