#!/usr/bin/env bash
# Smoke test of scripts/bench_loader.sh and its tool on a small set: it runs, streams samples,
# and the loader's peak RSS stays far below the data size's worth of memory.
#   bash tests/cli/test_loader_bench.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD="$1"
SRC="$2"
T="$(mktemp -d "${TMPDIR:-/tmp}/ft_test_loader_bench.XXXXXX")"
trap 'rm -rf "$T"' EXIT

# 20M uint16 tokens = 40 MB in 2 shards of 16Mi tokens.
TOKENS=20000000 SECONDS_PER_RUN=1 bash "$SRC/scripts/bench_loader.sh" "$BUILD" "$T/data" > "$T/out.txt"
cat "$T/out.txt"
[[ $(grep -c '^samples/s: [1-9]' "$T/out.txt") == 2 ]] || { echo "FAIL: no throughput figures"; exit 1; }
# Peak RSS in MiB of each run; 100 MiB is generous (tens expected) and far below what
# reading the data into memory would take. Under AddressSanitizer freed memory sits in ASan's
# quarantine (256 MiB by default), so RSS says nothing about the loader there: skip the bound.
if grep -q '^FT_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "sanitizer build: peak RSS bound not checked"
  echo "PASS test_loader_bench"
  exit 0
fi
while read -r rss; do
  awk -v r="$rss" 'BEGIN { exit !(r < 100) }' || { echo "FAIL: peak RSS $rss MiB"; exit 1; }
done < <(sed -n 's/^peak RSS: \([0-9.]*\) MiB.*/\1/p' "$T/out.txt")
echo "PASS test_loader_bench"
