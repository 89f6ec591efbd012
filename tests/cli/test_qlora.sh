#!/usr/bin/env bash
# QLoRA (adapter.type qlora: LoRA on a base whose blocks' matrices are held in NF4; DESIGN.md §5
# adapter, FlatParams::quantized) on a small random Llama, ft against itself (the NF4 format
# against its definition: tests/unit/test_nf4.cpp; QLoRA against LoRA on the dequantized base:
# tests/unit/test_lora.cpp):
#  1. pipeline 2 and data 2 with ZeRO-2 train as one process does (scripts/test_layouts.sh
#     --qlora, compare_layouts.py's bounds), with dropout and activation checkpointing;
#  2. the base (its dequantized blocks) keeps its bits in fp32 and bf16 while every adapter
#     tensor trains, and the run says it is QLoRA;
#  3. a run killed after a checkpoint resumes to the same bits (the base quantized again);
#  4. tensor parallelism and ZeRO-3 are refused, naming the key;
#  5. ft plan: the blocks at NF4's bytes, well under LoRA's bf16 base;
#  6. ft export of the checkpoint is a PEFT LoRA folder; ft generate runs on the checkpoint;
#  7. on the CUDA backend (ft_emu: the CUDA emulation, a test tool), fp32 and bf16 train as on
#     the CPU, within test_cuda_emu_train.sh's bounds.
#   bash tests/cli/test_qlora.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
echo "--- 1. layouts with a QLoRA adapter (dropout 0.1, activation checkpointing)"
bash "$src/scripts/test_layouts.sh" --qlora --set adapter.dropout=0.1 \
  --set training.activation_checkpointing=true "$build"

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 33 --seq-len 12 \
  --seed 3 > /dev/null
cat > "$tmp/r.yaml" <<YAML
model: {dim: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.5}
optimizer: {lr: 0.01, weight_decay: 0.1}
checkpoint: {every_steps: 3}
runtime: {threads: 1}
adapter: {type: qlora, r: 4, alpha: 8, target_modules: [q_proj, v_proj, o_proj, down_proj]}
YAML
train() {  # name, ft train arguments...
  local name=$1
  shift
  FT_TEST_DUMP_PARAMS="$tmp/$name/params" "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" \
    "$@" > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"
}

echo "--- 2. the base keeps its bits"
for p in fp32 bf16; do
  train "init_$p" training.steps=0 training.precision=$p
  train "full_$p" training.precision=$p
  /usr/bin/python3 - "$tmp/init_$p/params/rank_0.safetensors" \
    "$tmp/full_$p/params/rank_0.safetensors" "$src/tests/ref" <<'PY' ||
import sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
a, b = ref.read_safetensors(sys.argv[1]), ref.read_safetensors(sys.argv[2])
assert sorted(a) == sorted(b)
adapter = [n for n in a if n.startswith("base_model.model.")]
assert len(adapter) == 3 * 4 * 2, adapter
for n in a:
    same = bool((a[n] == b[n]).all())
    assert same == (n not in adapter), (n, "unchanged" if same else "changed")
# NF4: a block of 64 takes at most 16 distinct values (times its absmax).
w = a["model.layers.0.mlp.down_proj.weight"].flatten()
assert all(len(set(w[i:i + 64].tolist())) <= 16 for i in range(0, len(w), 64))
print(f"  {len(a) - len(adapter)} base tensors unchanged, {len(adapter)} adapter tensors trained")
PY
    fail "$p: base tensors changed, or adapter tensors did not train"
done
grep -q "ft: adapter qlora r 4, alpha 8 (scale 2) on q_proj, v_proj, o_proj, down_proj" \
  "$tmp/full_fp32.log" || fail "ft train does not say which adapter it trains"
grep -q "the base frozen (its blocks' matrices in NF4)" "$tmp/full_fp32.log" ||
  fail "ft train does not say the base is in NF4"

echo "--- 3. kill and resume"
(FT_TEST_KILL_AT_STEP=6 exec "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/killed" \
  training.precision=bf16 > "$tmp/killed.log" 2>&1) && fail "killed: not killed"
train killed training.precision=bf16  # --resume auto: from step_3
grep -q "resum.*step_00000003" "$tmp/killed.log" || fail "killed: did not resume from step 3"
cmp "$tmp/killed/params/rank_0.safetensors" "$tmp/full_bf16/params/rank_0.safetensors" ||
  fail "killed and resumed: other parameters than the run without a stop"
grep -q '"type": "qlora"' "$tmp/full_fp32/checkpoints/step_00000008/manifest.json" ||
  fail "the manifest does not record qlora"

echo "--- 4. layouts that would split the NF4 blocks are refused"
run_rc 2 "$ft" validate "$tmp/r.yaml" parallel.tensor=2 --world 2
has_err "parallel.tensor: qlora holds each block's NF4 weights whole on its rank"
run_rc 2 "$ft" validate "$tmp/r.yaml" parallel.zero_stage=3 --world 2
has_err "parallel.zero_stage: qlora holds each block's NF4 weights whole on every data rank"

echo "--- 5. ft plan: NF4 blocks"
sed 's/type: qlora/type: lora/' "$tmp/r.yaml" > "$tmp/lora.yaml"
"$ft" plan "$tmp/lora.yaml" --world 1 --json training.precision=bf16 > "$tmp/lora.json"
"$ft" plan "$tmp/r.yaml" --world 1 --json training.precision=bf16 > "$tmp/qlora.json"
run_rc 0 "$ft" plan "$tmp/r.yaml" --world 1 training.precision=bf16
has_out "the base frozen (its blocks' matrices in NF4, the rest bf16)"
/usr/bin/python3 - "$tmp/lora.json" "$tmp/qlora.json" <<'PY' || fail "ft plan: NF4 counted wrongly"
import json, sys
l, q = (json.load(open(p))["roles"][0] for p in sys.argv[1:])
assert q["trained_elems"] == l["trained_elems"] and q["grads_bytes"] == l["grads_bytes"], (l, q)
# A block: dim 32, 4 heads of 8, 2 kv heads, ffn 40: q, o 32×32; k, v 16×32; gate, up, down 40×32.
mats = [1024, 512, 512, 1024, 1280, 1280, 1280]
nf4 = sum((n + 1) // 2 + (n + 63) // 64 + 4 * (((n + 63) // 64 + 255) // 256) for n in mats)
block = sum(mats) + 2 * 32
# LoRA: 3 blocks in bf16; QLoRA: their matrices in NF4, their norms in bf16, and one block
# dequantized in bf16.
want = l["params_bytes"] - 3 * 2 * sum(mats) + 3 * nf4 + 2 * block
assert q["params_bytes"] == want, (q["params_bytes"], want, l["params_bytes"])
print(f"  parameters: LoRA {l['params_bytes']} B, QLoRA {q['params_bytes']} B")
PY

echo "--- 6. ft export and ft generate"
run_rc 0 "$ft" export "$tmp/full_fp32/checkpoints" -o "$tmp/adapter"
[[ -f $tmp/adapter/adapter_model.safetensors && -f $tmp/adapter/adapter_config.json ]] ||
  fail "the export is not a PEFT folder"
grep -q '"peft_type": "LORA"' "$tmp/adapter/adapter_config.json" || fail "not a LoRA adapter"
# A byte-level BPE of 27 ids (a-z, space), no merges, as test_lora.sh's.
/usr/bin/python3 - "$tmp/tok.json" <<'PY'
import json, sys
vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
vocab["\u0120"] = 26
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None, "pre_tokenizer": bl, "post_processor": None, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                     "byte_fallback": False, "vocab": vocab, "merges": []}},
          open(sys.argv[1], "w"))
PY
run_rc 0 "$ft" generate "$tmp/full_fp32/checkpoints" -p "hi" --tokenizer "$tmp/tok.json" --json \
  -n 6 --ignore-eos --device cpu
/usr/bin/python3 -c 'import json, sys; assert len(json.load(open(sys.argv[1]))["ids"]) >= 6' \
  "$tmp/out.txt" || fail "ft generate on the QLoRA checkpoint"

echo "--- 7. the CUDA backend (on the CUDA emulation, a test tool) against the CPU"
if [[ -x $emu ]]; then
  for p in fp32 bf16; do
    "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/emu_$p" runtime.device=cuda \
      training.precision=$p > "$tmp/emu_$p.log" 2>&1 || fail "emu_$p: $(tail -3 "$tmp/emu_$p.log")"
  done
  grep -q 'CUDA emulation (test tool)' "$tmp/emu_fp32.log" || fail "emu_fp32 did not run on CUDA"
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/emu_fp32" "$tmp/full_fp32" \
    --min-entries 16 --loss-rel 1e-4 --norm-rel 1e-3 --step1-loss-rel 1e-6 --step1-norm-rel 1e-5 ||
    fail "fp32: QLoRA on the CUDA backend and on the CPU differ"
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/emu_bf16" "$tmp/full_bf16" \
    --min-entries 16 --loss-rel 5e-3 --norm-rel 5e-2 --step1-loss-rel 1e-4 --step1-norm-rel 2e-3 ||
    fail "bf16: QLoRA on the CUDA backend and on the CPU differ"
else
  echo "  skipped: no ft_emu in this build"
fi
echo "test_qlora: all checks passed"
