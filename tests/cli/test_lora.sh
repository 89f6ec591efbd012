#!/usr/bin/env bash
# LoRA (adapter.type lora, lib/adapt/lora.h; DESIGN.md §5 adapter) on a small random Llama, ft
# against itself (tests/cli/test_lora_peft.sh compares it with PEFT + transformers):
#  1. tensor 2, pipeline 2, data 2 with ZeRO-2 and data 2 × tensor 2 with ZeRO-3 train as one
#     process does (scripts/test_layouts.sh --lora, compare_layouts.py's bounds), with dropout
#     (its masks keyed by sample: lora_dropout_key) and activation checkpointing;
#  2. the base keeps its bits exactly, in fp32, in bf16 (its compute copy only) and under ZeRO-3,
#     while every adapter tensor trains;
#  3. the checkpoint holds the adapter alone (the manifest's frozen groups are every model group,
#     its adapter section the recipe's); a run killed after a checkpoint resumes to the same bits;
#     resuming with another adapter.r is refused; a base from model.from is named by content:
#     moved, it resumes; changed, it is refused;
#  4. ft export of the checkpoint: a PEFT folder whose adapter_config.json and tensors are what
#     PEFT, vLLM's loader (vllm/lora: peft_helper.py, lora_model.py) and llama.cpp's
#     convert_lora_to_gguf.py require, holding the trained A and B exactly (f32; bf16 rounded
#     once), which ft reads back as adapter.from; the warnings for a seeded base and for rsLoRA;
#     --merge: the model folder whose adapted weights are W + s·B·A (numpy in float64, within
#     fp32 rounding) and whose other tensors are the seeded base drawn again, bit for bit;
#     refused: --merge of a checkpoint without an adapter, and of one whose base folder is gone;
#     ft generate: greedy ids from the adapter checkpoint, the --merge folder and the base with
#     --adapter and the PEFT folder alike, the base's alone other; a changed base refused;
#  5. adapter.from: an adapter folder in PEFT's names (made from a trained run's tensors) starts
#     a run with exactly those values; one that lacks a tensor is refused with its name;
#  6. ft plan counts the adapter as trained and the base as frozen;
#  7. on the CUDA backend (ft_emu: the CUDA emulation, a test tool), fp32 and bf16 train as on the
#     CPU, within test_cuda_emu_train.sh's bounds;
#  8. adapter.modules_to_save (issue 28 point 4; tests/cli/test_lora_peft.sh has PEFT's side):
#     tensor 2 × pipeline 2 with [embed_tokens, lm_head] trains as one process (section 1b);
#     [lm_head] trains lm_head and the adapter and keeps every other base tensor's bits, the
#     final norm beside lm_head included (it moves to a frozen group of its own); the checkpoint
#     holds lm_head with its moments; kill and resume give the same bits; another
#     modules_to_save is refused at resume; ft export writes lm_head under PEFT's name with
#     modules_to_save in adapter_config.json (and the warning for vLLM and llama.cpp), which
#     adapter.from reads back; --merge writes the trained lm_head; ft generate of the checkpoint
#     and of the --merge folder agree; ft plan counts lm_head as trained; the CUDA backend
#     (emulated) trains it as the CPU does; tied embeddings: the
#     shared table trains, exported under both names with ensure_weight_tying, and a PEFT
#     folder without ensure_weight_tying is refused as adapter.from.
# About 60 s on 2 cores (sections 1b and 8: about 17 s).
#   bash tests/cli/test_lora.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
echo "--- 1. layouts with a LoRA adapter (dropout 0.1, activation checkpointing)"
bash "$src/scripts/test_layouts.sh" --lora --set adapter.dropout=0.1 \
  --set training.activation_checkpointing=true "$build"
echo "--- 1b. tensor 2 x pipeline 2 with modules_to_save [embed_tokens, lm_head]"
bash "$src/scripts/test_layouts.sh" --lora --only tensor2_pipeline2 \
  --set "adapter.modules_to_save=[embed_tokens,lm_head]" "$build"

mpi_env -x FT_TEST_DUMP_PARAMS
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 33 --seq-len 12 \
  --seed 3 > /dev/null
cat > "$tmp/r.yaml" <<YAML
model: {dim: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.5}
optimizer: {lr: 0.01, weight_decay: 0.1}
checkpoint: {every_steps: 3}
runtime: {threads: 1}
adapter: {type: lora, r: 4, alpha: 8, target_modules: [q_proj, v_proj, o_proj, down_proj]}
YAML
grep -v "^adapter:" "$tmp/r.yaml" > "$tmp/plain.yaml"  # the same model without the adapter
train() {  # name, ft train arguments...
  local name=$1
  shift
  FT_TEST_DUMP_PARAMS="$tmp/$name/params" "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" \
    "$@" > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"
}
# base_kept INIT TRAINED: the base tensors equal, bit for bit; every adapter tensor has moved.
base_kept() {
  /usr/bin/python3 - "$tmp/$1/params/rank_0.safetensors" "$tmp/$2/params/rank_0.safetensors" \
    "$src/tests/ref" <<'PY' || fail "$2: base tensors changed, or adapter tensors did not train"
import sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
a, b = ref.read_safetensors(sys.argv[1]), ref.read_safetensors(sys.argv[2])
assert sorted(a) == sorted(b)
adapter = [n for n in a if n.startswith("base_model.model.")]
assert len(adapter) == 3 * 4 * 2, adapter  # 3 blocks, 4 projections, A and B
for n in a:
    same = bool((a[n] == b[n]).all())
    assert same == (n not in adapter), (n, "unchanged" if same else "changed")
print(f"  {len(a) - len(adapter)} base tensors unchanged, {len(adapter)} adapter tensors trained")
PY
}

echo "--- 2. the base keeps its bits"
for p in fp32 bf16; do
  train "init_$p" training.steps=0 training.precision=$p
  train "full_$p" training.precision=$p
  base_kept "init_$p" "full_$p"
done
FT_TEST_DUMP_PARAMS="$tmp/z3/params" mpirun "${mpirun_args[@]}" -np 2 "$ft" train "$tmp/r.yaml" \
  run.output_dir="$tmp/z3" parallel.zero_stage=3 training.precision=bf16 > "$tmp/z3.log" 2>&1 ||
  fail "z3: $(tail -3 "$tmp/z3.log")"
base_kept init_bf16 z3
grep -q "ft: adapter lora r 4, alpha 8 (scale 2) on q_proj, v_proj, o_proj, down_proj" \
  "$tmp/full_fp32.log" || fail "ft train does not say which adapter it trains"

echo "--- 3. checkpoints of the adapter alone; kill and resume"
m="$tmp/full_fp32/checkpoints/step_00000008/manifest.json"
/usr/bin/python3 - "$m" <<'PY' || fail "$m: the adapter recorded wrongly"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["frozen"]["groups"] == [0, 1, 2, 3, 4], j["frozen"]
a = j["adapter"]
assert (a["type"], a["r"], a["alpha"], a["use_rslora"]) == ("lora", 4, 8, False), a
assert a["target_modules"] == ["q_proj", "v_proj", "o_proj", "down_proj"], a
held = sorted({p["group"] for p in j["pieces"]})
assert held == [5, 6, 7], held  # lora.layers.0-2
names = [t["name"] for t in j["tensors"] if t["group"] == 5]
assert names[0] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", names
PY
(FT_TEST_KILL_AT_STEP=6 exec "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/killed" \
  > "$tmp/killed.log" 2>&1) && fail "killed: not killed"
train killed  # --resume auto: from step_3
grep -q "resum.*step_00000003" "$tmp/killed.log" || fail "killed: did not resume from step 3"
cmp "$tmp/killed/params/rank_0.safetensors" "$tmp/full_fp32/params/rank_0.safetensors" ||
  fail "killed and resumed: other parameters than the run without a stop"
run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/killed" training.steps=9 adapter.r=8
has_err "adapter.r 4 in the checkpoint, 8 in the recipe"

# A base from model.from: the checkpoint names it by content (frozen.from_fingerprint): the same
# weights in another folder resume; other weights in the same folder are refused.
"$ft" train "$tmp/plain.yaml" run.output_dir="$tmp/fp_base" training.steps=0 > /dev/null 2>&1 ||
  fail "base: could not make a base model"
"$ft" export "$tmp/fp_base/checkpoints" -o "$tmp/fp_hf" > /dev/null || fail "base: export failed"
train fp_run training.steps=3 model.from="$tmp/fp_hf"
grep -q '"from_fingerprint"' "$tmp/fp_run/checkpoints/step_00000003/manifest.json" ||
  fail "the manifest does not fingerprint model.from"
cp -r "$tmp/fp_hf" "$tmp/fp_moved"
train fp_run training.steps=4 model.from="$tmp/fp_moved"
grep -q "resum.*step_00000003" "$tmp/fp_run.log" || fail "a moved base did not resume"
/usr/bin/python3 - "$tmp/fp_moved/model.safetensors" "$src/tests/ref" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
t = ref.read_safetensors(sys.argv[1])
t["model.norm.weight"] = t["model.norm.weight"] * 1.5
ref.write_safetensors(sys.argv[1], t)
PY
run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/fp_run" training.steps=5 \
  model.from="$tmp/fp_moved"
has_err "holds other weights than the base the checkpoint's frozen parameters came from"
run_rc 2 "$ft" export "$tmp/fp_run/checkpoints" -o "$tmp/fp_merged" --merge
has_err "holds other weights than the run trained on"

echo "--- 4. ft export: the PEFT folder, --merge, refusals"
run_rc 0 "$ft" export "$tmp/full_fp32/checkpoints" -o "$tmp/adapter"
has_out "the adapter as a PEFT folder (lora r 4, alpha 8 (scale 2) on q_proj, v_proj, o_proj"
has_out "wrote adapter_model.safetensors"
has_out "wrote adapter_config.json (base_model_name_or_path null)"
has_out "ft export: done: 24 adapter tensors"
has_err "adapter_config.json's base_model_name_or_path is null"
run_rc 0 "$ft" export "$tmp/full_fp32/checkpoints" -o "$tmp/adapter_bf16" --dtype bf16
run_rc 0 "$ft" export "$tmp/full_fp32/checkpoints" -o "$tmp/merged" --merge
has_out "merged into its base, the seeded initialisation (run.seed 0, model.init_std 0.02)"
has_out "the adapter merged into 12 weights"
/usr/bin/python3 - "$tmp" "$src/tests/ref" <<'PY' || fail "ft export of the adapter checkpoint"
import json, os, struct, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
tmp = sys.argv[1]
def header(path):
    with open(path, "rb") as f:
        return json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
trained = ref.read_safetensors(os.path.join(tmp, "full_fp32/params/rank_0.safetensors"))
folder = os.path.join(tmp, "adapter")
assert sorted(os.listdir(folder)) == ["adapter_config.json", "adapter_model.safetensors"], \
    os.listdir(folder)
c = json.load(open(os.path.join(folder, "adapter_config.json")))
want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
        "lora_dropout": 0.0, "use_rslora": False, "use_dora": False, "bias": "none",
        "modules_to_save": None, "base_model_name_or_path": None, "init_lora_weights": True,
        "fan_in_fan_out": False, "inference_mode": True,
        "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]}
assert {k: c.get(k) for k in want} == want, c
assert type(c["r"]) is int and type(c["lora_alpha"]) is int, c
# vLLM (vllm/lora/peft_helper.py): r, lora_alpha and target_modules required; modules_to_save,
# DoRA and a bias other than none refused.
assert all(k in c for k in ("r", "lora_alpha", "target_modules")) and not c["modules_to_save"]
h = header(os.path.join(folder, "adapter_model.safetensors"))
assert h.pop("__metadata__") == {"format": "pt"}, "metadata"
got = ref.read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
adapter = {n: v for n, v in trained.items() if n.startswith("base_model.model.")}
assert sorted(got) == sorted(adapter) and all(e["dtype"] == "F32" for e in h.values())
merged_names = header(os.path.join(tmp, "merged/model.safetensors"))
# vLLM's lora_model.py: after an optional base_model.model., each name ends .lora_A.weight or
# .lora_B.weight and its module is one the model supports (Llama's packed qkv_proj and
# gate_up_proj stand for their parts). llama.cpp's convert_lora_to_gguf.py: every tensor is a
# lora_A or lora_B (any other stops it); the name less base_model.model. and .lora_X is a tensor
# of the base, whose (out, in) fits A (r, in) and B (out, r).
vllm_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
for n, e in h.items():
    assert n.startswith("base_model.model.") and n.endswith((".lora_A.weight", ".lora_B.weight")), n
    module = n[len("base_model.model."):].rsplit(".", 2)[0]
    assert module.rsplit(".", 1)[1] in vllm_modules, n
    base = n.replace("base_model.model.", "").replace(".lora_A.weight", ".weight") \
        .replace(".lora_B.weight", ".weight")
    out, inp = merged_names[base]["shape"]
    assert e["shape"] == ([4, inp] if ".lora_A." in n else [out, 4]), (n, e["shape"])
    assert torch.equal(got[n], adapter[n]), n
# --dtype bf16: each value rounded once, to nearest even.
half = ref.read_safetensors(os.path.join(tmp, "adapter_bf16/adapter_model.safetensors"))
assert all(e["dtype"] == "BF16" for n, e in header(os.path.join(
    tmp, "adapter_bf16/adapter_model.safetensors")).items() if n != "__metadata__")
assert all(torch.equal(half[n], adapter[n].to(torch.bfloat16).float()) for n in adapter)
# --merge: W + s·B·A with s = alpha / r = 2, against float64 within fp32 rounding (a few ulp of
# the largest term: one sgemm of 4 products, then the sum); the rest is the seeded base the run
# trained on, bit for bit.
merged = ref.read_safetensors(os.path.join(tmp, "merged/model.safetensors"))
assert sorted(merged) == sorted(n for n in trained if not n.startswith("base_model.")), \
    sorted(merged)
adapted, worst = 0, 0.0
for n, w in merged.items():
    a = "base_model.model." + n[:-len(".weight")] + ".lora_A.weight"
    if a not in adapter:
        assert torch.equal(w, trained[n]), n
        continue
    A = adapter[a].double().numpy()
    B = adapter[a.replace("lora_A", "lora_B")].double().numpy()
    W = trained[n].double().numpy()
    exact = W + 2.0 * (B @ A)
    scale = np.abs(W).max() + 2.0 * np.abs(B).max() * np.abs(A).max() * 4
    err = np.abs(w.double().numpy() - exact).max() / scale
    worst = max(worst, err)
    assert err < 4 * 2.0**-24, (n, err)
    adapted += 1
assert adapted == 12, adapted
print(f"  the PEFT folder's 24 tensors are the trained A and B (bf16: rounded once); names, "
      f"shapes and keys as vLLM and llama.cpp need; --merge: 12 weights W + s·B·A within "
      f"{worst:.1e} of float64, {len(merged) - adapted} base tensors as drawn")
PY
train from_export training.steps=0 adapter.from="$tmp/adapter"
p="params/rank_0.safetensors"
/usr/bin/python3 - "$tmp/from_export/$p" "$tmp/full_fp32/$p" "$src/tests/ref" <<'PY' \
  || fail "ft export's PEFT folder does not start a run with the trained adapter"
import sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
got, trained = ref.read_safetensors(sys.argv[1]), ref.read_safetensors(sys.argv[2])
assert all((got[n] == trained[n]).all() for n in got), "differ"
print(f"  the export read back as adapter.from: {len(got)} tensors as trained")
PY
train rs training.steps=0 adapter.use_rslora=true
run_rc 0 "$ft" export "$tmp/rs/checkpoints" -o "$tmp/rs_adapter"
has_err "llama.cpp's convert_lora_to_gguf.py ignores use_rslora and scales it by lora_alpha / r, 2 times too weakly"
grep -q '"use_rslora": true' "$tmp/rs_adapter/adapter_config.json" || fail "rsLoRA not recorded"
# Refusals: --merge without an adapter; --merge of an adapter whose base folder (model.from) is
# gone; a plain export of that checkpoint needs no base.
grep -v "^adapter:" "$tmp/r.yaml" > "$tmp/plain.yaml"
"$ft" train "$tmp/plain.yaml" run.output_dir="$tmp/plain" training.steps=0 > "$tmp/plain.log" 2>&1 ||
  fail "plain: $(tail -3 "$tmp/plain.log")"
run_rc 2 "$ft" export "$tmp/plain/checkpoints" -o "$tmp/plain_merged" --merge
has_err "--merge merges an adapter into its base, and this checkpoint is of a run that trained no adapter"
[[ ! -e $tmp/plain_merged ]] || fail "a refused --merge left $tmp/plain_merged"
cp -r "$tmp/merged" "$tmp/base_hf"
train on_hf training.steps=1 model.from="$tmp/base_hf"
mv "$tmp/base_hf" "$tmp/base_moved"
run_rc 2 "$ft" export "$tmp/on_hf/checkpoints" -o "$tmp/on_hf_merged" --merge
has_err "the adapter's base, frozen.from '$tmp/base_hf' (the run's model.from), is missing"
run_rc 0 "$ft" export "$tmp/on_hf/checkpoints" -o "$tmp/on_hf_adapter"
has_out "wrote adapter_config.json (base_model_name_or_path $tmp/base_hf)"

echo "--- 4b. ft generate with the adapter: the checkpoint, the merged folder, --adapter"
# Greedy ids from the adapter checkpoint (its base drawn again), from the ft export --merge folder
# and from the base's folder with --adapter and the PEFT export: all the same; the base alone
# differs (the adapter acts). The tokenizer: a byte-level BPE of 27 ids (a-z, space), no merges.
/usr/bin/python3 - "$tmp/tok.json" <<'PY'
import json, sys
vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
vocab["\u0120"] = 26  # the byte map's space
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None, "pre_tokenizer": bl, "post_processor": None, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                     "byte_fallback": False, "vocab": vocab, "merges": []}},
          open(sys.argv[1], "w"))
PY
gen() {  # name, source, ft generate arguments...: the greedy ids into $tmp/gen_NAME
  local name=$1
  shift
  "$ft" generate "$@" -p "hi" --tokenizer "$tmp/tok.json" --json -n 12 --ignore-eos --device cpu \
    > "$tmp/gen.out" 2> "$tmp/gen.err" || fail "ft generate $*: $(tail -3 "$tmp/gen.err")"
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ids"])' \
    "$tmp/gen.out" > "$tmp/gen_$name"
}
gen ckpt "$tmp/full_fp32/checkpoints"
gen merged "$tmp/merged"
gen adapter "$tmp/fp_hf" --adapter "$tmp/adapter"
gen base "$tmp/fp_hf"
cmp -s "$tmp/gen_ckpt" "$tmp/gen_merged" || fail "generate: the checkpoint and --merge differ"
cmp -s "$tmp/gen_ckpt" "$tmp/gen_adapter" ||
  fail "generate: the checkpoint and the base with --adapter differ"
! cmp -s "$tmp/gen_ckpt" "$tmp/gen_base" || fail "generate: the adapter changes nothing"
echo "  greedy ids $(cat "$tmp/gen_ckpt"): the checkpoint, --merge and --adapter alike; the" \
  "base's differ"
# A base from model.from (frozen.from): step 3 of fp_run, whose base fp_hf is unchanged.
"$ft" export "$tmp/fp_run/checkpoints/step_00000003" -o "$tmp/fp3_merged" --merge > /dev/null ||
  fail "fp_run step 3: --merge failed"
gen fp3 "$tmp/fp_run/checkpoints/step_00000003"
gen fp3_merged "$tmp/fp3_merged"
cmp -s "$tmp/gen_fp3" "$tmp/gen_fp3_merged" ||
  fail "generate: a checkpoint on model.from and its --merge differ"
# Refused: a base whose weights changed (fp_run's latest, on fp_moved); --adapter on a
# checkpoint; an adapter folder asking for DoRA.
run_rc 2 "$ft" generate "$tmp/fp_run/checkpoints" -p hi --tokenizer "$tmp/tok.json"
has_err "holds other weights than the run trained on"
run_rc 2 "$ft" generate "$tmp/full_fp32/checkpoints" --adapter "$tmp/adapter" -p hi \
  --tokenizer "$tmp/tok.json"
has_err "is an ft checkpoint, which brings its own adapter"
cp -r "$tmp/adapter" "$tmp/dora"
sed -i 's/"use_dora": false/"use_dora": true/' "$tmp/dora/adapter_config.json"
run_rc 2 "$ft" generate "$tmp/fp_hf" --adapter "$tmp/dora" -p hi --tokenizer "$tmp/tok.json"
has_err "use_dora is true; DoRA is not built in this ft"

echo "--- 5. adapter.from: a PEFT adapter folder"
/usr/bin/python3 - "$tmp/full_fp32/params/rank_0.safetensors" "$tmp/peft" "$src/tests/ref" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
t = {n: v for n, v in ref.read_safetensors(sys.argv[1]).items() if n.startswith("base_model.")}
for name, sub in (("peft", t), ("peft_short", {n: v for n, v in t.items() if "layers.2.mlp" not in n})):
    d = os.path.join(os.path.dirname(sys.argv[2]), name)
    os.makedirs(d)
    ref.write_safetensors(os.path.join(d, "adapter_model.safetensors"), sub)
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
               "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"], "bias": "none",
               "use_rslora": False, "use_dora": False, "lora_dropout": 0.0},
              open(os.path.join(d, "adapter_config.json"), "w"))
PY
train from training.steps=0 adapter.from="$tmp/peft"
/usr/bin/python3 - "$tmp/from/params/rank_0.safetensors" "$tmp/full_fp32/params/rank_0.safetensors" \
  "$tmp/init_fp32/params/rank_0.safetensors" "$src/tests/ref" <<'PY' || fail "adapter.from: other values"
import sys
sys.path.insert(0, sys.argv[4])
import llama_ref as ref
got, trained, init = (ref.read_safetensors(p) for p in sys.argv[1:4])
for n in got:
    want = trained[n] if n.startswith("base_model.") else init[n]
    assert (got[n] == want).all(), n
print(f"  {len(got)} tensors: the adapter's from the folder, the base's as initialised")
PY
run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/short" adapter.from="$tmp/peft_short"
has_err "missing 2 tensor(s): base_model.model.model.layers.2.mlp.down_proj.lora_A.weight"

echo "--- 6. ft plan: the adapter trains, the base is frozen"
"$ft" plan "$tmp/plain.yaml" --world 1 --json > "$tmp/all.json"
"$ft" plan "$tmp/r.yaml" --world 1 --json > "$tmp/lora.json"
/usr/bin/python3 - "$tmp/all.json" "$tmp/lora.json" <<'PY' || fail "ft plan: the adapter counted wrongly"
import json, sys
a, l = (json.load(open(p))["roles"][0] for p in sys.argv[1:])
adapter = 3 * 4 * ((32 + 32) + (32 + 16) + (32 + 32) + (40 + 32))  # r (in + out), per block
assert l["trained_elems"] == adapter, (l["trained_elems"], adapter)
assert l["param_elems"] == a["param_elems"] + adapter, (l["param_elems"], a["param_elems"])
# AdamW's m and v of the adapter, and its step constants (two kernels::AdamwArgs of 28 bytes).
assert l["grads_bytes"] == 4 * adapter and l["optim_bytes"] == 8 * adapter + 56, l
print(f"  {adapter} adapter elements trained; the base's {a['param_elems']} frozen")
PY
echo "--- 7. the CUDA backend (on the CUDA emulation, a test tool) against the CPU"
if [[ -x $emu ]]; then
  for p in fp32 bf16; do
    "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/emu_$p" runtime.device=cuda \
      training.precision=$p > "$tmp/emu_$p.log" 2>&1 || fail "emu_$p: $(tail -3 "$tmp/emu_$p.log")"
  done
  grep -q 'CUDA emulation (test tool)' "$tmp/emu_fp32.log" || fail "emu_fp32 did not run on CUDA"
  # The bounds of test_cuda_emu_train.sh (fp32 and 16-bit).
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/emu_fp32" "$tmp/full_fp32" \
    --min-entries 16 --loss-rel 1e-4 --norm-rel 1e-3 --step1-loss-rel 1e-6 --step1-norm-rel 1e-5 ||
    fail "fp32: LoRA on the CUDA backend and on the CPU differ"
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/emu_bf16" "$tmp/full_bf16" \
    --min-entries 16 --loss-rel 5e-3 --norm-rel 5e-2 --step1-loss-rel 1e-4 --step1-norm-rel 2e-3 ||
    fail "bf16: LoRA on the CUDA backend and on the CPU differ"
else
  echo "  skipped: no ft_emu in this build"
fi
echo "--- 8. modules_to_save: lm_head trained whole, the final norm kept"
train mts adapter.modules_to_save=[lm_head]
grep -q "on q_proj, v_proj, o_proj, down_proj, and lm_head trained whole: .* the rest of the base frozen" \
  "$tmp/mts.log" || fail "ft train does not say that lm_head trains whole"
(FT_TEST_KILL_AT_STEP=6 exec "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/mts_killed" \
  adapter.modules_to_save=[lm_head] > "$tmp/mts_killed.log" 2>&1) && fail "mts_killed: not killed"
train mts_killed adapter.modules_to_save=[lm_head]
cmp "$tmp/mts_killed/params/rank_0.safetensors" "$tmp/mts/params/rank_0.safetensors" ||
  fail "modules_to_save: killed and resumed, other parameters than the run without a stop"
run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/mts" training.steps=9
has_err "adapter.modules_to_save [lm_head] in the checkpoint, [] in the recipe"
run_rc 0 "$ft" export "$tmp/mts/checkpoints" -o "$tmp/mts_adapter"
has_out "on q_proj, v_proj, o_proj, down_proj, and lm_head trained whole"
has_err "vLLM refuses modules_to_save"
run_rc 0 "$ft" export "$tmp/mts/checkpoints" -o "$tmp/mts_merged" --merge
train mts_from training.steps=0 adapter.modules_to_save=[lm_head] adapter.from="$tmp/mts_adapter"
"$ft" plan "$tmp/r.yaml" --world 1 --json adapter.modules_to_save=[lm_head] > "$tmp/mts_plan.json"
/usr/bin/python3 - "$tmp" "$src/tests/ref" <<'PY' || fail "modules_to_save [lm_head]"
import json, os, sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
tmp = sys.argv[1]
p = "params/rank_0.safetensors"
init, trained, again = (ref.read_safetensors(os.path.join(tmp, d, p))
                        for d in ("init_fp32", "mts", "mts_from"))
moved = sorted(n for n in init if not (init[n] == trained[n]).all())
adapter = [n for n in init if n.startswith("base_model.")]
assert moved == sorted(adapter + ["lm_head.weight"]), moved  # model.norm.weight kept
# The checkpoint: lm_head's group (the head, now lm_head alone) with its moments; the final norm
# in a frozen group of its own after the model's, the adapter's after it.
j = json.load(open(os.path.join(tmp, "mts/checkpoints/step_00000008/manifest.json")))
assert j["frozen"]["groups"] == [0, 1, 2, 3, 5], j["frozen"]
assert j["adapter"]["modules_to_save"] == ["lm_head"], j["adapter"]
held = sorted({(q["group"], q["state"]) for q in j["pieces"]})
assert held == [(g, s) for g in (4, 6, 7, 8) for s in ("exp_avg", "exp_avg_sq", "param")], held
groups = {t["name"]: t["group"] for t in j["tensors"]}
assert groups["lm_head.weight"] == 4 and groups["model.norm.weight"] == 5, groups
# The PEFT folder: lm_head as PEFT saves a module trained whole; read back by adapter.from.
d = os.path.join(tmp, "mts_adapter")
c = json.load(open(os.path.join(d, "adapter_config.json")))
assert c["modules_to_save"] == ["lm_head"] and "ensure_weight_tying" not in c, c
got = ref.read_safetensors(os.path.join(d, "adapter_model.safetensors"))
assert sorted(got) == sorted(adapter + ["base_model.model.lm_head.weight"]), sorted(got)
assert (got["base_model.model.lm_head.weight"] == trained["lm_head.weight"]).all()
assert all((again[n] == trained[n]).all() for n in adapter + ["lm_head.weight"])
# --merge: the trained lm_head, the base's norm and embedding.
merged = ref.read_safetensors(os.path.join(tmp, "mts_merged/model.safetensors"))
for n in ("lm_head.weight", "model.norm.weight", "model.embed_tokens.weight"):
    assert (merged[n] == trained[n]).all(), n
# ft plan: lm_head (64 x 32) trains beside the adapter.
plan = json.load(open(os.path.join(tmp, "mts_plan.json")))["roles"][0]
lora = 3 * 4 * ((32 + 32) + (32 + 16) + (32 + 32) + (40 + 32))
assert plan["trained_elems"] == lora + 64 * 32, plan["trained_elems"]
print(f"  lm_head and {len(adapter)} adapter tensors trained, the other "
      f"{len(init) - len(moved)} kept (model.norm.weight among them); the checkpoint, the "
      "PEFT folder (read back), --merge and ft plan hold lm_head")
PY
gen mts "$tmp/mts/checkpoints"
gen mts_merged "$tmp/mts_merged"
cmp -s "$tmp/gen_mts" "$tmp/gen_mts_merged" ||
  fail "generate: a modules_to_save checkpoint and its --merge differ"
if [[ -x $emu ]]; then  # the CUDA backend (emulated) trains lm_head as the CPU does (section 7)
  "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/emu_mts" runtime.device=cuda \
    adapter.modules_to_save=[lm_head] > "$tmp/emu_mts.log" 2>&1 ||
    fail "emu_mts: $(tail -3 "$tmp/emu_mts.log")"
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/emu_mts" "$tmp/mts" \
    --min-entries 16 --loss-rel 1e-4 --norm-rel 1e-3 --step1-loss-rel 1e-6 --step1-norm-rel 1e-5 ||
    fail "modules_to_save: the CUDA backend and the CPU differ"
fi
# Tied embeddings: either name trains the one table, exported under both names as PEFT's
# ensure_weight_tying saves it; a PEFT folder that untied it is refused.
train tied training.steps=2 model.tie_embeddings=true adapter.modules_to_save=[lm_head]
run_rc 0 "$ft" export "$tmp/tied/checkpoints" -o "$tmp/tied_adapter"
has_err "ensure_weight_tying: true, which PEFT before it had the key (0.13 among them) refuses"
/usr/bin/python3 - "$tmp/tied_adapter" "$tmp/tied/params/rank_0.safetensors" "$src/tests/ref" <<'PY' \
  || fail "tied embeddings: the export of the shared table"
import json, os, sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
c = json.load(open(os.path.join(sys.argv[1], "adapter_config.json")))
assert c["modules_to_save"] == ["embed_tokens", "lm_head"] and c["ensure_weight_tying"] is True, c
got = ref.read_safetensors(os.path.join(sys.argv[1], "adapter_model.safetensors"))
table = ref.read_safetensors(sys.argv[2])["model.embed_tokens.weight"]
for n in ("base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"):
    assert (got[n] == table).all(), n
print("  tied: the trained table under both names, ensure_weight_tying: true")
PY
/usr/bin/python3 - "$tmp/tied_adapter/adapter_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["ensure_weight_tying"]
json.dump(c, open(sys.argv[1], "w"))
PY
run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/untied" model.tie_embeddings=true \
  adapter.modules_to_save=[lm_head] adapter.from="$tmp/tied_adapter"
has_err "without ensure_weight_tying: true, so PEFT trained a copy of the module apart from the table"
echo "test_lora: all checks passed"
