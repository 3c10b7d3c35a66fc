#!/usr/bin/env bash
# CI for the Python package (python/): a fresh virtual environment, `pip install ./python`
# (scikit-build-core drives the project's CMake and builds libpooler.so), then pytest.
# Without a GPU the GPU tests skip with their reason; everything else runs.
#
#   POOLER_CI_TORCH=0        skip installing torch (its tests then skip; the rest runs)
#   POOLER_PREBUILT_LIBRARY  bundle this libpooler.so instead of building one (e.g. build/libpooler.so)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q pytest
if [[ ${POOLER_CI_TORCH:-1} != 0 ]]; then
  # PyPI's Linux wheel is the CUDA build (about 5 GB with its nvidia-* wheels); the CPU tests
  # use it without a GPU.
  started=$SECONDS
  "${pip[@]}" install -q torch
  echo "python.sh: torch installed in $((SECONDS - started)) s"
fi
started=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "${pip[@]}" install -q ./python
echo "python.sh: pooler installed in $((SECONDS - started)) s"
# From outside the source tree, so that the installed package is the one imported.
cd "$work"
"$work/venv/bin/python" -c "import pooler; print('pooler', pooler.__version__, pooler.library_path())"
status=0
"$work/venv/bin/python" -m pytest -ra "$OLDPWD/python/tests" || status=$?
if [[ $status -eq 5 ]]; then
  echo "python.sh: pytest collected no tests from python/tests" >&2
  exit 1
fi
exit $status
