#!/usr/bin/env bash
# The layouts of scripts/test_layouts.sh for the architectures with tensors of their own
# (DESIGN.md §3, §5): qwen2 (q/k/v biases, split with their weights' rows under tensor
# parallelism) and qwen3 (per-head q/k norms, replicated, their gradient summed over the tensor
# group; with head_dim 16, not dim / n_heads = 8): tensor 2, pipeline 2 and data 2 with ZeRO-3
# against one process, with compare_layouts.py's bounds. mistral is Llama's math in the model
# code (only import differs): one process trains it to the same bits as llama, so
# tests/cli/test_layouts.sh's matrix covers it. About 20 s on 2 cores.
#   bash tests/cli/test_layouts_archs.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
echo "--- model.arch qwen2"
bash "$2/scripts/test_layouts.sh" --arch qwen2 "$1"
echo "--- model.arch qwen3, head_dim 16"
bash "$2/scripts/test_layouts.sh" --arch qwen3 --set model.head_dim=16 "$1"

echo "--- model.arch mistral against llama, one process"
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 17 --seq-len 12 \
  --seed 11 > /dev/null
cat > "$tmp/r.yaml" <<YAML
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 5, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.3}
optimizer: {lr: 0.01, weight_decay: 0.1}
runtime: {threads: 1}
YAML
for arch in llama mistral; do
  "$ft" train "$tmp/r.yaml" model.arch=$arch run.output_dir="$tmp/$arch" > "$tmp/$arch.log" 2>&1 ||
    fail "$arch: $(tail -3 "$tmp/$arch.log")"
done
/usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/mistral" "$tmp/llama" --min-entries 10 \
  --loss-rel 0 --norm-rel 0 || fail "mistral and llama train differently"
echo "test_layouts_archs: all checks passed"
