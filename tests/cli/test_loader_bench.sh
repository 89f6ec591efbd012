#!/usr/bin/env bash
# Smoke test of scripts/bench_loader.sh and its tool on a small set: it runs, streams samples,
# and the loader's peak RSS stays far below the data size's worth of memory.
#   bash tests/cli/test_loader_bench.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"

# 20M uint16 tokens = 40 MB in 2 shards of 16Mi tokens.
TOKENS=20000000 SECONDS_PER_RUN=1 bash "$src/scripts/bench_loader.sh" "$build" "$tmp/data" \
  > "$tmp/out.txt"
cat "$tmp/out.txt"
[[ $(grep -c '^samples/s: [1-9]' "$tmp/out.txt") == 2 ]] || fail "no throughput figures"
# Peak RSS in MiB of each run; 100 MiB is generous (tens expected) and far below what
# reading the data into memory would take. Under AddressSanitizer freed memory sits in ASan's
# quarantine (256 MiB by default), so RSS says nothing about the loader there: skip the bound.
if sanitizer_build; then
  echo "sanitizer build: peak RSS bound not checked"
  echo "PASS test_loader_bench"
  exit 0
fi
while read -r rss; do
  awk -v r="$rss" 'BEGIN { exit !(r < 100) }' || fail "peak RSS $rss MiB"
done < <(sed -n 's/^peak RSS: \([0-9.]*\) MiB.*/\1/p' "$tmp/out.txt")
echo "PASS test_loader_bench"
