#!/usr/bin/env bash
# The tensors qwen2 and qwen3 add (DESIGN.md §5 model.arch) on the CUDA backend, executed by the
# CUDA emulation (ft_emu; tests/cli/test_cuda_emu_train.sh says what it is): qwen2's q/k/v
# biases (bias_add, bias_grad) and qwen3's per-head q/k norms (rmsnorm over (N·heads, head_dim)
# rows), head_dim 32 (twice dim / n_heads), train on the emulated GPU as on the CPU within
# test_cuda_emu_train.sh's fp32 bounds: 1e-6 (loss) and 1e-5 (grad norm) at step 1, 1e-4 and
# 1e-3 over 8 steps; activation checkpointing gives the same bits as without. qwen3 also: ZeRO-3
# with the same step-1 loss and a grad norm within 1e-9 (ZeRO sums the norm's squares by shard,
# in another order: 3e-11 seen, for llama too), later steps within compare_layouts.py's fp32
# bounds (1e-5, 5e-4) as clipping and Adam carry that on; bf16 at head dim 64 (the fused
# attention kernel) within 1e-4 / 2e-3 at step 1 and 5e-3 / 5e-2 over the steps.
#   bash tests/cli/test_cuda_emu_archs.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" --vocab 97 --samples 24 \
  --seq-len 16 --seed 5

cat > "$tmp/r.yaml" <<YAML
run: {name: e, output_dir: $tmp/out, seed: 3}
model: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 80, vocab_size: 97, max_seq_len: 16}
data: {train: $tmp/train, seq_len: 16, shuffle: true}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.5}
optimizer: {lr: 0.003}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

compare() {  # DIR_A DIR_B LOSS_REL NORM_REL [STEP1_LOSS_REL STEP1_NORM_REL]
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --min-entries 16 \
    --loss-rel "$3" --norm-rel "$4" --step1-loss-rel "${5:-$3}" --step1-norm-rel "${6:-$4}"
}
train() {  # BINARY NAME [OVERRIDES...]
  local bin=$1 name=$2
  shift 2
  "$bin" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.log")"
}

for arch in qwen2 qwen3; do
  m=(model.arch=$arch model.head_dim=32)
  train "$emu" $arch runtime.device=cuda "${m[@]}"
  grep -q 'cuda:0 (CUDA emulation (test tool)' "$tmp/$arch.log" || fail "$arch did not run on the emulated device"
  train "$ft" ${arch}_cpu runtime.device=cpu "${m[@]}"
  echo "$arch fp32, emulated CUDA backend against the CPU:"
  compare "$tmp/$arch" "$tmp/${arch}_cpu" 1e-4 1e-3 1e-6 1e-5 || fail "$arch fp32: CUDA and CPU differ"
  train "$emu" ${arch}_ac runtime.device=cuda "${m[@]}" training.activation_checkpointing=true
  compare "$tmp/${arch}_ac" "$tmp/$arch" 0 0 || fail "$arch: activation checkpointing changed bits"
done
# qwen3 only, to keep the test short (bias_add and bias_grad in bf16 are cases of the ops
# conformance test on the emulation); and not in the sanitizer pass, where test_cuda_emu_train
# runs ZeRO-3 and the fused bf16 kernels, and the new ops ran above.
if sanitizer_build; then
  echo "test_cuda_emu_archs: all checks passed (ZeRO-3 and bf16: the Release pass's)"
  exit 0
fi
train "$emu" qwen3_z3 runtime.device=cuda model.arch=qwen3 model.head_dim=32 parallel.zero_stage=3
compare "$tmp/qwen3_z3" "$tmp/qwen3" 1e-5 5e-4 0 1e-9 || fail "qwen3: ZeRO 3 differs"
m=(model.arch=qwen3 model.head_dim=64 training.precision=bf16)
train "$emu" qwen3_bf16 runtime.device=cuda "${m[@]}"
train "$ft" qwen3_bf16_cpu runtime.device=cpu "${m[@]}"
echo "qwen3 bf16 at head dim 64 (fused attention), emulated CUDA backend against the CPU:"
compare "$tmp/qwen3_bf16" "$tmp/qwen3_bf16_cpu" 5e-3 5e-2 1e-4 2e-3 || fail "qwen3 bf16: CUDA and CPU differ"
echo "test_cuda_emu_archs: all checks passed"
