#!/usr/bin/env bash
# Streams a >= 1 GiB synthetic token set through the data loader at seq_len 256 and prints
# samples/s, tokens/s and peak RSS (which must stay at tens of MB: the loader reads only the
# windows it needs).
#
#   scripts/bench_loader.sh [BUILD_DIR] [DATA_DIR]
#   env: TOKENS (default 536870912 = 1 GiB of uint16 tokens), SECONDS_PER_RUN (default 10),
#        SEQ_LEN (256), BATCH (64)
#
# The data is written once by tests/tools/ft_bench_loader (synthetic documents; tokenizing
# real text at this size would take far longer and measure the tokenizer, not the loader)
# and reused by later runs. After writing, the files are usually in the OS page cache, so
# the figures are for a warm cache; on a cold cache, shuffled reads cost one disk read per
# sample.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$SRC/build}"
DATA="${2:-$SRC/data/generated/bench_loader}"
TOKENS="${TOKENS:-536870912}"
SECS="${SECONDS_PER_RUN:-10}"
SEQ_LEN="${SEQ_LEN:-256}"
BATCH="${BATCH:-64}"

if [[ ! -x "$BUILD/tests/ft_bench_loader" ]]; then
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  make -C "$BUILD" -j"$(nproc)" ft_bench_loader >/dev/null
fi
TOOL="$BUILD/tests/ft_bench_loader"

stamp="$DATA/.tokens"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$TOKENS" ]]; then
  rm -rf "$DATA"
  "$TOOL" write "$DATA" "$TOKENS"
  echo "$TOKENS" > "$stamp"
fi
echo "data: $DATA, $(du -sh "$DATA" | cut -f1), $TOKENS tokens"
echo "== shuffled =="
"$TOOL" read "$DATA" "$SEQ_LEN" "$BATCH" "$SECS" shuffle
echo "== in order =="
"$TOOL" read "$DATA" "$SEQ_LEN" "$BATCH" "$SECS" noshuffle
