#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI: every C, C++ and CUDA source is formatted as .clang-format says
# (clang-format --dry-run --Werror). Installs clang-format when missing and root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v clang-format >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "format: installing clang-format"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang-format >/dev/null
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.c' '*.cu' '*.cuh')
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files as .clang-format says ($(clang-format --version | head -1))"
