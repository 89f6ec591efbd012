#!/usr/bin/env bash
# Each rank builds only its share of the model (DESIGN.md §2 "Parameter init", train/setup.cpp):
#  a. model.from under tensor 2, pipeline 2 and tensor 2 × pipeline 2: every rank reads only its
#     slices and stages' tensors from a sharded BF16 folder, and holds exactly the file's values
#     (bit for bit, FT_TEST_DUMP_PARAMS); step 1's loss is one process's (bit for bit under
#     pipeline 2, which keeps the summation order; within 1e-5 relative with tensor ranks, the
#     bound of tests/ref/compare_layouts.py).
#  b. ft plan, which runs each rank's real setup on a counting device (and equals the measured
#     peaks, cli_test_plan): the most parameter memory live at once while the setup is built is
#     the rank's own share, about half of one process's under tensor 2 or pipeline 2, where it
#     used to be the whole model plus the share.
#   bash tests/cli/test_rank_share.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 9 --seq-len 12 \
  --seed 11 > /dev/null
# An untied Llama folder in two BF16 shards with an index; no value is 0, so that the tiny
# learning rate below leaves every bit as loaded (p − lr·u rounds back to p).
/usr/bin/python3 - "$tmp/hf" <<'PY'
import json, math, os, struct, sys
d = sys.argv[1]
os.makedirs(d)
C, L, H, K, F, V = 32, 4, 4, 2, 40, 64
D = C // H
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": K,
           "intermediate_size": F, "vocab_size": V, "max_position_embeddings": 16,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False},
          open(f"{d}/config.json", "w"))
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [C], p + "self_attn.q_proj.weight": [H * D, C],
                   p + "self_attn.k_proj.weight": [K * D, C], p + "self_attn.v_proj.weight": [K * D, C],
                   p + "self_attn.o_proj.weight": [C, H * D], p + "post_attention_layernorm.weight": [C],
                   p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                   p + "mlp.down_proj.weight": [C, F]})
def bf16(x):  # truncation is a valid BF16 value; ft widens it exactly
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
shards, weight_map = ({}, {}), {}
for k, (name, shape) in enumerate(sorted(shapes.items())):
    n = math.prod(shape)
    norm = len(shape) == 1
    vals = [(1.0 if norm else 0.0) + (0.03 + 0.05 * abs(math.sin(k * 977 + i * 1.3))) *
            (1 if (k + i) % 3 else -1) for i in range(n)]
    shards[k % 2][name] = (shape, struct.pack(f"<{n}H", *map(bf16, vals)))
    weight_map[name] = f"model-0000{k % 2 + 1}-of-00002.safetensors"
for s, tensors in enumerate(shards):
    header, data = {}, b""
    for name, (shape, raw) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(f"{d}/model-0000{s + 1}-of-00002.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
json.dump({"weight_map": weight_map}, open(f"{d}/model.safetensors.index.json", "w"))
PY

cat > "$tmp/r.yaml" <<YAML
run: {name: share, seed: 3}
model: {from: $tmp/hf}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 1, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 1.0e-30, weight_decay: 0.0}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

names=()
for run in one:1: tensor2:2:parallel.tensor=2 pipe2:2:parallel.pipeline=2 \
           tensor2_pipe2:4:"parallel.tensor=2 parallel.pipeline=2"; do
  IFS=: read -r name n overrides <<< "$run"; read -r -a ov <<< "$overrides"
  np=()
  ((n == 1)) || np=(--nproc "$n")
  FT_TEST_DUMP_PARAMS="$tmp/$name.params" "$ft" train "$tmp/r.yaml" ${ov[@]+"${ov[@]}"} \
    run.output_dir="$tmp/$name" ${np[@]+"${np[@]}"} > "$tmp/$name.log" 2>&1 \
    || fail "train $name: $(tail -5 "$tmp/$name.log")"
  names+=("$name")
done

/usr/bin/python3 - "$tmp" "${names[@]}" <<'PY' || fail "a layout did not load the folder's weights"
import glob, json, struct, sys
tmp, names = sys.argv[1], sys.argv[2:]

def read(path):  # name -> (shape, list of floats) of a safetensors file (F32 or BF16)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                    for h in struct.unpack(f"<{len(raw) // 2}H", raw)]
        else:
            assert t["dtype"] == "F32", t
            vals = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        out[name] = (t["shape"], vals)
    return out, meta

want = {}
for path in glob.glob(f"{tmp}/hf/*.safetensors"):
    want.update(read(path)[0])

def slices(name, shape, vals, size):  # tensor rank t's slice, by how ft splits the tensor
    rows, cols = (shape + [1])[:2]
    if size == 1 or name.endswith("norm.weight"):
        return [vals] * size
    if name.endswith(("o_proj.weight", "down_proj.weight")):  # row-parallel: columns split
        c = cols // size
        return [[v for r in range(rows) for v in vals[r * cols + t * c:r * cols + (t + 1) * c]]
                for t in range(size)]
    n = len(vals) // size  # column-parallel and vocabulary-parallel: rows split
    return [vals[t * n:(t + 1) * n] for t in range(size)]

loss = {}
for name in names:
    m = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
    assert len(m) == 1, (name, "metrics of one step", m)
    loss[name] = m[0]["loss"]
    seen = set()
    dumps = sorted(glob.glob(f"{tmp}/{name}.params/rank_*.safetensors"))
    assert dumps, (name, "no FT_TEST_DUMP_PARAMS files")
    for path in dumps:
        got, meta = read(path)
        t, size = int(meta["tensor_rank"]), int(meta["tensor_size"])
        for tname, (shape, vals) in got.items():
            assert vals == slices(tname, *want[tname], size)[t], (name, path, tname)
            seen.add(tname)
    assert seen == set(want), (name, "tensors nobody holds", set(want) - seen)
    print(f"{name}: every rank holds the folder's values of its slices ({len(dumps)} ranks)")
assert loss["pipe2"] == loss["one"], ("pipeline 2 step-1 loss", loss)
for name in names:
    rel = abs(loss[name] - loss["one"]) / abs(loss["one"])
    assert rel <= 1e-5, (name, "step-1 loss", loss[name], "one process", loss["one"], rel)
    print(f"{name}: step-1 loss {loss[name]!r} (one process {loss['one']!r}, {rel:.1e} relative)")
PY

# b. The parameter memory each rank's setup holds at most: plan the same recipe without the
# folder (the same sizes), one process against tensor 2 and pipeline 2.
cat > "$tmp/p.yaml" <<YAML
model: {dim: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 1, micro_batch_size: 1, global_batch_size: 4}
YAML
"$ft" plan "$tmp/p.yaml" --world 1 --json > "$tmp/one.plan.json" || fail "plan one process"
"$ft" plan "$tmp/p.yaml" parallel.tensor=2 --world 2 --json > "$tmp/tensor2.plan.json" \
  || fail "plan tensor 2"
"$ft" plan "$tmp/p.yaml" parallel.pipeline=2 --world 2 --json > "$tmp/pipe2.plan.json" \
  || fail "plan pipeline 2"
/usr/bin/python3 - "$tmp" <<'PY' || fail "a rank's setup holds more parameters than its share"
import json, sys
tmp = sys.argv[1]
one = json.load(open(f"{tmp}/one.plan.json"))["roles"][0]
whole = one["param_elems"] * 4  # fp32
assert one["startup_params_bytes"] == whole, ("one process", one)
for name in ("tensor2", "pipe2"):
    for role in json.load(open(f"{tmp}/{name}.plan.json"))["roles"]:
        share = role["param_elems"] * 4
        peak = role["startup_params_bytes"]
        # Its own share, nothing else: before, a whole model was built next to it (1.5x).
        assert peak == share, (name, role["ranks"], "parameter peak", peak, "share", share)
        assert peak <= 0.55 * whole, (name, role["ranks"], peak, whole)
        print(f"{name} ranks {role['ranks']}: setup parameter peak {peak} B "
              f"= {peak / whole:.2f} of one process's {whole} B")
PY
echo "test_rank_share: all checks passed"
