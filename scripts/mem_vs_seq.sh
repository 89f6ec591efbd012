#!/usr/bin/env bash
# Activation memory against sequence length: mem_peak_bytes that `ft train` measures (the device
# allocator's peak, metrics.jsonl) next to `ft plan`'s step total, for a small model at several
# seq_len. With FlashAttention (no (B, H, T, T) buffers) both grow linearly in T. Not a test:
# seconds to a minute per length on 2 cores.
#   scripts/mem_vs_seq.sh [--ft BUILD/ft] [--seq "512 1024 2048 4096"] [KEY=VALUE ...]
# KEY=VALUE are recipe overrides (e.g. training.precision=bf16).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
ft="$src/build/ft"
seqs="512 1024 2048 4096"
overrides=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --ft) ft=$(realpath "$2"); shift 2 ;;
    --seq) seqs=$2; shift 2 ;;
    *) overrides+=("$1"); shift ;;
  esac
done
[[ -x $ft ]] || { echo "mem_vs_seq: no ft binary at $ft (build it, or pass --ft PATH)" >&2
                  exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
max=0
for s in $seqs; do ((s > max)) && max=$s; done

# Random tokens, enough for 2 steps of one sample at the longest length.
/usr/bin/python3 - "$tmp" "$src" "$max" <<'PY'
import os, sys
tmp, src, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, os.path.join(src, "tests", "ref"))
import numpy as np, llama_ref as ref
os.makedirs(f"{tmp}/data")
tokens = np.random.default_rng(0).integers(0, 512, 4 * (T + 1))
ref.write_shard(f"{tmp}/data/shard_00000.h5", tokens, 512)
PY

cat > "$tmp/r.yaml" <<YAML
run: {name: mem_vs_seq, output_dir: $tmp/out, seed: 1}
model: {dim: 256, n_layers: 4, n_heads: 4, n_kv_heads: 2, ffn_dim: 688, vocab_size: 512,
        max_seq_len: $max}
data: {train: $tmp/data, seq_len: 512}
training: {steps: 2, micro_batch_size: 1, global_batch_size: 1}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

printf "%-8s %16s %16s %8s %10s\n" seq_len mem_peak_bytes "ft plan total" "plan/meas" step_time_s
for s in $seqs; do
  ov=(data.seq_len="$s" run.output_dir="$tmp/out_$s" "${overrides[@]}")
  "$ft" train "$tmp/r.yaml" "${ov[@]}" > "$tmp/train_$s.log" 2>&1 \
    || { echo "train at seq $s failed: $(tail -3 "$tmp/train_$s.log")" >&2; exit 1; }
  "$ft" plan "$tmp/r.yaml" "${ov[@]}" --json > "$tmp/plan_$s.json"
  /usr/bin/python3 - "$tmp/out_$s/metrics.jsonl" "$tmp/plan_$s.json" "$s" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][-1]
plan = json.load(open(sys.argv[2]))
role = next(r for r in plan["roles"] if 0 in r["ranks"])
peak, total = m["mem_peak_bytes"], role["total_bytes"]
print(f"{sys.argv[3]:<8} {peak:16,} {total:16,} {total / peak:8.3f} {m['step_time_s']:10.3f}")
PY
done
