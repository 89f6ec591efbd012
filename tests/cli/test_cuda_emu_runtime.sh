#!/usr/bin/env bash
# The CUDA device's runtime services, executed on ft_emu (ft with lib/runtime/cuda/ built
# against the CUDA emulation, a test tool: nothing here runs on a GPU, and the emulation runs
# every stream to completion at each call, so it cannot show overlap or a missing wait):
#  - the memory check: a recipe whose `ft plan` peak exceeds the emulated GPU's free memory
#    (FT_CUDA_EMU_MEMORY_MIB) exits 1 before the model is allocated, naming the GPU, its free
#    memory and ft plan; FT_SKIP_MEMORY_CHECK=1 starts anyway and then meets the allocator's
#    out-of-memory error instead; the small recipe passes the check; a checkpoint.async staging
#    larger than the host's available memory exits 1 the same way, naming the host memory and
#    what lowers it; a locked-memory limit (ulimit -l) below it is a warning;
#  - FT_PROFILE on the CUDA device: the op table (times from events around each op on the
#    stream) with the same families and call counts as the CPU's table for the same run, and
#    the same losses as the unprofiled run (the wrapper only forwards).
#   bash tests/cli/test_cuda_emu_runtime.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd)
ft="$build/ft"
emu="$build/tests/cuda_emu/ft_emu"
if [[ ! -x $emu ]]; then
  echo "test_cuda_emu_runtime: skipped, this build has no ft_emu (FT_CUDA_EMU off: no CUDA headers)"
  exit 0
fi
tmp=$(mktemp -d); trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"

/usr/bin/python3 - "$tmp" "$src" <<'PY'
import sys, os
tmp, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests", "ref"))
import numpy as np, llama_ref as ref
os.makedirs(f"{tmp}/train")
ref.write_shard(f"{tmp}/train/shard_00000.h5", np.random.default_rng(1).integers(0, 96, 2000), 96)
PY
cat > "$tmp/r.yaml" <<YAML
run: {name: rt, output_dir: $tmp/out, seed: 5}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 96,
        max_seq_len: 16}
data: {train: $tmp/train, seq_len: 16, shuffle: false}
training: {steps: 2, micro_batch_size: 2, global_batch_size: 2, grad_clip: 1.0}
optimizer: {weight_decay: 0.1}
logging: {every_steps: 1}
runtime: {threads: 1, device: cuda}
YAML

# The memory check. 64 MiB of emulated GPU: the 32 MiB cuBLASLt workspace (allocated with the
# device) fits, 1000 layers of this model (7.7 M parameters, ~16 bytes each for weights,
# gradients and moments: ~160 MiB by ft plan) do not.
big="model.n_layers=1000 run.output_dir=$tmp/big"
rc=0
FT_CUDA_EMU_MEMORY_MIB=64 "$emu" train "$tmp/r.yaml" $big > "$tmp/big.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "too big for the GPU: exit $rc, expected 1: $(tail -3 "$tmp/big.log")"
grep -q "is free on cuda:0" "$tmp/big.log" || fail "the error names no GPU: $(cat "$tmp/big.log")"
grep -q "nothing was allocated. Run \`ft plan" "$tmp/big.log" \
  || fail "the error gives no hint: $(cat "$tmp/big.log")"
! grep -q "out of memory on" "$tmp/big.log" || fail "the check came after an allocation failed"
echo "too big for the emulated GPU: $(grep -o 'this run needs.*is free on cuda:0' "$tmp/big.log")"
rc=0
FT_SKIP_MEMORY_CHECK=1 FT_CUDA_EMU_MEMORY_MIB=64 "$emu" train "$tmp/r.yaml" $big \
  > "$tmp/big_skip.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "FT_SKIP_MEMORY_CHECK: exit $rc, expected 1: $(tail -3 "$tmp/big_skip.log")"
grep -q "out of memory on cuda:0" "$tmp/big_skip.log" \
  || fail "FT_SKIP_MEMORY_CHECK: no allocator error: $(tail -3 "$tmp/big_skip.log")"
! grep -q "is free on cuda:0" "$tmp/big_skip.log" || fail "FT_SKIP_MEMORY_CHECK did not skip"
echo "FT_SKIP_MEMORY_CHECK=1: the allocator's out-of-memory error instead"

# The host memory check (DESIGN.md §2 "Memory check"): checkpoint.async's page-locked staging,
# 12 B per parameter, of a model sized to twice this machine's available memory is refused
# before anything is allocated (exit 1), saying how much, what holds it and what lowers it; the
# emulated GPU (100 TB) has room for the rest. dim 1024, 8 heads and kv heads, ffn 4096: a
# layer is 4·1024² + 3·1024·4096 + 2·1024 = 16,779,264 elements.
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
layers=$(( avail_kib * 1024 * 2 / 12 / 16779264 + 1 ))
host="model.dim=1024 model.n_heads=8 model.n_kv_heads=8 model.ffn_dim=4096 model.n_layers=$layers
      checkpoint.every_steps=1 checkpoint.async=true run.output_dir=$tmp/host"
rc=0
FT_CUDA_EMU_MEMORY_MIB=100000000 "$emu" train "$tmp/r.yaml" $host > "$tmp/host.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "too big for the host: exit $rc, expected 1: $(tail -3 "$tmp/host.log")"
for want in "of host memory on rank 0 (page-locked" "checkpoint.async's staging" \
            "of memory is available here; nothing was allocated" "checkpoint.async: false"; do
  grep -qF "$want" "$tmp/host.log" || fail "host refusal lacks '$want': $(cat "$tmp/host.log")"
done
echo "too big for the host: $(grep -o 'this run needs.*of host memory on rank 0' "$tmp/host.log")"
# A locked-memory limit (ulimit -l) below the staging is a warning: whether the CUDA driver
# applies it to cudaMallocHost is not certain, and the run goes on.
(ulimit -S -l 64 && FT_CUDA_EMU_MEMORY_MIB=64 "$emu" train "$tmp/r.yaml" checkpoint.every_steps=1 \
  checkpoint.async=true run.output_dir="$tmp/memlock" > "$tmp/memlock.log" 2>&1) \
  || fail "under ulimit -l 64: $(tail -3 "$tmp/memlock.log")"
grep -q "above this process's locked-memory limit (ulimit -l: 64.0 KiB)" "$tmp/memlock.log" \
  || fail "no locked-memory warning: $(cat "$tmp/memlock.log")"

# FT_PROFILE on the emulated CUDA device against the CPU's table.
FT_CUDA_EMU_MEMORY_MIB=64 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/plain" \
  > "$tmp/plain.txt" 2>&1 || fail "small run on 64 MiB: $(tail -3 "$tmp/plain.txt")"
FT_PROFILE=1 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/prof" > "$tmp/prof.txt" 2>&1 \
  || fail "profiled run: $(tail -3 "$tmp/prof.txt")"
FT_PROFILE=1 "$ft" train "$tmp/r.yaml" runtime.device=cpu run.output_dir="$tmp/cpu" \
  > "$tmp/cpu.txt" 2>&1 || fail "profiled CPU run: $(tail -3 "$tmp/cpu.txt")"
losses() { grep -o '"loss":[^,]*' "$1"; }
[[ "$(losses "$tmp/plain/metrics.jsonl")" == "$(losses "$tmp/prof/metrics.jsonl")" ]] \
  || fail "FT_PROFILE changed the losses on the CUDA device"
# 2 steps: the first, a warm-up, is left out of the table.
grep -q "ft: FT_PROFILE, rank 0: 1 step " "$tmp/prof.txt" || fail "no table: $(cat "$tmp/prof.txt")"
# The ops' rows (family and calls), without copies and memsets, which differ by backend.
ops() {
  awk '/^  op family/ { on = 1; next } /^  other/ { on = 0 }
       on && !/copy|memset/ { print $0 }' "$1" | sed -E 's/ +[0-9.]+ +[0-9.]+% +/ /'
}
[[ -n "$(ops "$tmp/prof.txt")" ]] || fail "no op rows: $(cat "$tmp/prof.txt")"
[[ "$(ops "$tmp/prof.txt")" == "$(ops "$tmp/cpu.txt")" ]] \
  || fail "op families or calls differ from the CPU's: $(ops "$tmp/prof.txt")" \
          "vs $(ops "$tmp/cpu.txt")"
grep -q "GEMM forward .* 15$" "$tmp/prof.txt" || fail "GEMM forward: $(cat "$tmp/prof.txt")"
echo "FT_PROFILE on the emulated CUDA device: the CPU's op families and calls"
echo "test_cuda_emu_runtime: OK"
