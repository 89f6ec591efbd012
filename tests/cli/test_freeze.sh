#!/usr/bin/env bash
# Frozen parameter groups: the seam adapters stand on (model/converter.h, lib/adapt/freeze.h,
# reached here through the test hook FT_TEST_FREEZE; DESIGN.md §3 "The parameter set"). With the
# embedding and one block frozen:
#  1. tensor 2, pipeline 2, data 2 with ZeRO-2 and data 2 × tensor 2 with ZeRO-3 train as one
#     process does (scripts/test_layouts.sh --freeze, compare_layouts.py's bounds);
#  2. the frozen tensors keep their initial bits exactly, in fp32 and in bf16 (where a frozen
#     group has no fp32 master, only its compute copy) and under ZeRO-3, while every other tensor
#     trains;
#  3. the checkpoint holds no state of the frozen groups (the manifest names them), a run killed
#     after a checkpoint resumes to the same bits, and resuming with other groups frozen, or
#     exporting such a checkpoint, is refused.
# About 40 s on 2 cores.
#   bash tests/cli/test_freeze.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
groups=embed,layers.1
echo "--- 1. layouts with $groups frozen"
bash "$src/scripts/test_layouts.sh" --freeze "$groups" "$build"

export FT_TEST_FREEZE=$groups
mpi_env -x FT_TEST_FREEZE -x FT_TEST_DUMP_PARAMS
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 33 --seq-len 12 \
  --seed 3 > /dev/null
cat > "$tmp/r.yaml" <<YAML
model: {dim: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.5}
optimizer: {lr: 0.01, weight_decay: 0.1}
checkpoint: {every_steps: 3}
runtime: {threads: 1}
YAML
train() {  # name, ft train arguments...
  local name=$1
  shift
  FT_TEST_DUMP_PARAMS="$tmp/$name/params" "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" \
    "$@" > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"
}
# frozen_kept INIT TRAINED: the frozen tensors equal, bit for bit; every other one has moved.
frozen_kept() {
  /usr/bin/python3 - "$tmp/$1/params/rank_0.safetensors" "$tmp/$2/params/rank_0.safetensors" \
    "$src/tests/ref" <<'PY' || fail "$2: frozen tensors changed, or others did not train"
import sys
sys.path.insert(0, sys.argv[3])
import llama_ref as ref
a, b = ref.read_safetensors(sys.argv[1]), ref.read_safetensors(sys.argv[2])
assert sorted(a) == sorted(b)
frozen = [n for n in a if n.startswith(("model.embed_tokens.", "model.layers.1."))]
assert len(frozen) == 10, frozen
for n in a:
    same = bool((a[n] == b[n]).all())
    assert same == (n in frozen), (n, "unchanged" if same else "changed")
print(f"  {len(frozen)} frozen tensors unchanged, {len(a) - len(frozen)} trained")
PY
}

echo "--- 2. frozen tensors keep their bits"
for p in fp32 bf16; do
  train "init_$p" training.steps=0 training.precision=$p
  train "full_$p" training.precision=$p
  frozen_kept "init_$p" "full_$p"
done
FT_TEST_DUMP_PARAMS="$tmp/z3/params" mpirun "${mpirun_args[@]}" -np 2 "$ft" train "$tmp/r.yaml" \
  run.output_dir="$tmp/z3" parallel.zero_stage=3 training.precision=bf16 > "$tmp/z3.log" 2>&1 ||
  fail "z3: $(tail -3 "$tmp/z3.log")"
frozen_kept init_bf16 z3

echo "--- ft plan counts what the run allocates: no gradient, moments or checkpoint share"
FT_TEST_FREEZE= "$ft" plan "$tmp/r.yaml" --world 1 --json training.precision=bf16 > "$tmp/all.json"
"$ft" plan "$tmp/r.yaml" --world 1 --json training.precision=bf16 > "$tmp/frozen.json"
/usr/bin/python3 - "$tmp/all.json" "$tmp/frozen.json" <<'PY' || fail "ft plan: frozen groups counted wrongly"
import json, sys
a, f = (json.load(open(p))["roles"][0] for p in sys.argv[1:])
assert a["trained_elems"] == a["param_elems"] > f["trained_elems"] > 0, (a, f)
frozen = a["param_elems"] - f["trained_elems"]
assert a["grads_bytes"] - f["grads_bytes"] == 4 * frozen, (a["grads_bytes"], f["grads_bytes"])
assert a["optim_bytes"] - f["optim_bytes"] == 8 * frozen
assert a["params_bytes"] - f["params_bytes"] == 4 * frozen  # no fp32 master, the bf16 copy kept
print(f"  {frozen} frozen elements: 16 B each less than trained ones (grads, moments, master)")
PY

echo "--- 3. checkpoints without the frozen groups; kill and resume"
m="$tmp/full_fp32/checkpoints/step_00000008/manifest.json"
/usr/bin/python3 - "$m" <<'PY' || fail "$m: frozen groups recorded wrongly"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["frozen"]["groups"] == [0, 2], j["frozen"]
held = sorted({p["group"] for p in j["pieces"]})
assert held == [1, 3, 4], held  # layers.0, layers.2, head
PY
(FT_TEST_KILL_AT_STEP=6 exec "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/killed" \
  > "$tmp/killed.log" 2>&1) && fail "killed: not killed"
train killed  # --resume auto: from step_3
grep -q "resum.*step_00000003" "$tmp/killed.log" || fail "killed: did not resume from step 3"
cmp "$tmp/killed/params/rank_0.safetensors" "$tmp/full_fp32/params/rank_0.safetensors" ||
  fail "killed and resumed: other parameters than the run without a stop"
FT_TEST_FREEZE=embed run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/killed" \
  training.steps=9
has_err "frozen parameter groups embed,layers.1 in the checkpoint, embed in this run"
run_rc 2 "$ft" export "$tmp/full_fp32/checkpoints" -o "$tmp/hf"
has_err "was frozen in this run, and a checkpoint holds no frozen parameters"
echo "test_freeze: all checks passed"
