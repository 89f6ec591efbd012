#!/usr/bin/env bash
# Checks that every C++ and CUDA file of ours is as .clang-format (Google-based, 100 columns)
# writes it: prints each file clang-format would change and exits 1, or exits 0. A formatting
# change goes in a commit of its own (clang-format -i on the files this lists).
#   scripts/check_format.sh [SOURCE_DIR]
# Needs clang-format 14 (Debian 12's): other versions format some constructs differently, so
# with another version, or none, it says so and exits 77 (skipped).
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"
if ! command -v clang-format > /dev/null; then
  echo "check_format: skipped, clang-format is not installed"
  exit 77
fi
version=$(clang-format --version | grep -o 'version [0-9]*' | grep -o '[0-9]*')
if [[ $version != 14 ]]; then
  echo "check_format: skipped, clang-format $version is not the 14 the tree is formatted with"
  exit 77
fi
mapfile -t files < <(git ls-files 'lib/**' 'kernels/**' 'apps/**' 'tests/**' 'dev/**' |
                     grep -E '\.(h|hpp|cpp|cu|cuh)$')
# One run over every file; each difference is reported as FILE:LINE:COL: error: ...
mapfile -t bad < <(clang-format --style=file --dry-run --Werror "${files[@]}" 2>&1 |
                   grep -oE '^[^:]+:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u)
if ((${#bad[@]})); then
  printf '%s\n' "${bad[@]}"
  echo "check_format: ${#bad[@]} file(s) differ from .clang-format's output" \
    "(clang-format -i FILE)" >&2
  exit 1
fi
echo "check_format: every C++ and CUDA file (${#files[@]}) is formatted"
