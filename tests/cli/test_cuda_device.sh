#!/usr/bin/env bash
# The device choice of a CUDA build on a machine where no GPU can be used (CI, this machine):
#  - runtime.device: auto trains on the CPU and says why in one line on stderr;
#  - runtime.device: cuda exits 1 before any work (no output folder, no checkpoint), naming the
#    cause (no driver, no device, or a driver older than the runtime);
#  - runtime.device: cpu says nothing about GPUs.
# Skips (exit 0) in a build without the CUDA backend, and on a machine where a GPU is usable
# (there "auto" rightly picks it; scripts/gpu_check.sh covers that case).
#   bash tests/cli/test_cuda_device.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"

"$ft" --version | grep -q 'backends: cpu, cuda' || {
  echo "SKIP: this build has no CUDA backend ($("$ft" --version))"; exit 0; }
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIP: a GPU is present here; this test is about machines without one"; exit 0
fi

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:1" --vocab 97 --samples 40 \
  --seq-len 16 --seed 0

recipe() {  # DEVICE OUT
  cat <<YAML
run: {name: d, output_dir: $2, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97,
        max_seq_len: 32}
data: {train: $tmp/train, seq_len: 16}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 2}
optimizer: {lr: 0.01}
checkpoint: {dir: $2/ckpt, every_steps: 1}
runtime: {threads: 2, device: $1}
YAML
}

# 1. auto: the CPU, and one line saying why not the GPU.
recipe auto "$tmp/auto" > "$tmp/auto.yaml"
"$ft" train "$tmp/auto.yaml" > "$tmp/auto.out" 2> "$tmp/auto.err" ||
  fail "auto did not train on the CPU: $(cat "$tmp/auto.err")"
grep -q '^ft: done: 3 steps' "$tmp/auto.out" || fail "auto: no summary: $(cat "$tmp/auto.out")"
[[ $(grep -c 'GPU' "$tmp/auto.err") == 1 ]] ||
  fail "auto: expected one line about the GPU on stderr, got: $(cat "$tmp/auto.err")"
grep -q '^ft: runtime.device: auto: training on the CPU, no usable GPU (.\+)$' "$tmp/auto.err" ||
  fail "auto: the line does not say why: $(cat "$tmp/auto.err")"
# The cause is one of the three the device names.
grep -q -e 'no NVIDIA driver' -e 'no CUDA device is visible' -e 'older than the CUDA' \
  "$tmp/auto.err" || fail "auto: unknown cause: $(cat "$tmp/auto.err")"

# 2. cuda: exit 1 before any work, with the same cause and a hint.
recipe cuda "$tmp/cuda" > "$tmp/cuda.yaml"
set +e
"$ft" train "$tmp/cuda.yaml" > "$tmp/cuda.out" 2> "$tmp/cuda.err"
rc=$?
set -e
[[ $rc == 1 ]] || fail "cuda: exit $rc, expected 1: $(cat "$tmp/cuda.err")"
grep -q 'runtime.device: cuda requested, but' "$tmp/cuda.err" ||
  fail "cuda: the error does not name the device: $(cat "$tmp/cuda.err")"
grep -q -e 'no NVIDIA driver' -e 'no CUDA device is visible' -e 'older than the CUDA' \
  "$tmp/cuda.err" || fail "cuda: the error does not name the cause: $(cat "$tmp/cuda.err")"
grep -q 'runtime.device: cpu' "$tmp/cuda.err" || fail "cuda: no hint: $(cat "$tmp/cuda.err")"
[[ ! -e "$tmp/cuda" ]] || fail "cuda: wrote $(ls -R "$tmp/cuda" | head -5) before failing"
! grep -q '^step ' "$tmp/cuda.out" || fail "cuda: trained before failing"

# 3. cpu: nothing about GPUs.
recipe cpu "$tmp/cpu" > "$tmp/cpu.yaml"
"$ft" train "$tmp/cpu.yaml" > "$tmp/cpu.out" 2> "$tmp/cpu.err" || fail "cpu: $(cat "$tmp/cpu.err")"
! grep -q 'GPU' "$tmp/cpu.err" || fail "cpu: talks about GPUs: $(cat "$tmp/cpu.err")"
echo "ok: auto trains on the CPU with one line why; cuda exits 1 naming the cause"
