#!/usr/bin/env bash
# ft export and ft inspect on checkpoints, end to end on the real binary.
#   a. HF folder → model.from → training.steps=0 checkpoint → ft export: every tensor bit-identical
#      to the input (f32 untied; bf16 tied exported with --dtype bf16), config.json round-trips,
#      the checkpoint's tokenizer.model is copied; f32 → bf16/f16 rounds as torch does.
#   b. A model trained under data 2 × tensor 2 with ZeRO-3 (--nproc 4), exported as several
#      shards with an index: the PyTorch reference on the exported folder gives ft's final
#      eval_loss (tests/ref/export_check.py).
#   c. ft inspect on the checkpoint root and step folder; a flipped byte and a truncated shard
#      are reported naming the file (exit 1), and export of a corrupt checkpoint fails naming it.
#   d. Refusals: an existing non-empty output without --overwrite (exit 2), a folder that is
#      not a checkpoint, an incomplete step folder.
#   bash tests/cli/test_export.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
PY=/usr/bin/python3  # Debian's, with torch, numpy and h5py (DESIGN.md §9)
fail() { fail_showing_output "$@"; }

# ---- inputs: HF folders, shards whose tokenizer_sha256 is that of a tokenizer file -----------
# ft only hashes tokenizer.path (the shards must carry the same hash) and copies it into each
# checkpoint, so any file will do as the tokenizer here.
"$PY" - "$tmp" "$src/tests/ref" <<'EOF'
import hashlib, os, sys
sys.path.insert(0, sys.argv[2])
import h5py, numpy as np, llama_ref as ref
t = sys.argv[1]
open(f"{t}/tok.model", "wb").write(np.random.default_rng(1).bytes(1000))
sha = hashlib.sha256(open(f"{t}/tok.model", "rb").read()).hexdigest()
# Untied, F32, GQA, with a rope_theta and norm_eps away from the defaults.
m = ref.Llama(ref.Config(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=97,
                         max_seq_len=32, rope_theta=500000.0, norm_eps=1e-6))
ref.save_hf_folder(m, f"{t}/hf_f32")
# Tied, BF16.
m = ref.Llama(ref.Config(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=24, vocab_size=97,
                         max_seq_len=16, tie_embeddings=True), seed=1)
ref.save_hf_folder(m, f"{t}/hf_bf16", "BF16")
rng = np.random.default_rng(0)
for name, n, mask in (("train", 2, False), ("valid", 1, True)):
    os.makedirs(f"{t}/{name}")
    for i in range(n):
        toks = rng.integers(0, 97, 24 * 16 + 1)
        # A loss mask on the validation set, so that the loss is token-weighted for real.
        lm = (rng.random(toks.size) < 0.7).astype(np.uint8) if mask else None
        path = f"{t}/{name}/shard_{i:05d}.h5"
        ref.write_shard(path, toks, 97, loss_mask=lm)
        with h5py.File(path, "a") as f:
            f.attrs["tokenizer_sha256"] = sha
EOF

common="optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 1}"

# ---- a. import → checkpoint at step 0 → export: bit-identical -----------------------------
for kind in f32 bf16; do
  if [[ $kind == f32 ]]; then tok="tokenizer: {path: $tmp/tok.model}"; else tok=""; fi
  cat > "$tmp/$kind.yaml" <<YAML
run: {name: $kind, output_dir: $tmp/run_$kind, seed: 1}
model: {from: $tmp/hf_$kind}
$tok
data: {train: $tmp/train, seq_len: 16, shuffle: true}
$common
training: {steps: 0, micro_batch_size: 2, global_batch_size: 2}
checkpoint: {every_steps: 1}
YAML
  run_rc 0 "$ft" train "$tmp/$kind.yaml"
  step="$tmp/run_$kind/checkpoints/step_00000000"
  [[ -f "$step/COMPLETE" ]] || fail "$kind: no complete checkpoint at $step"
  run_rc 0 "$ft" export "$step" --output "$tmp/out_$kind" --dtype "$kind"
  has_out "wrote model.safetensors"
  # tok.model is random bytes: the weights export, the tokenizer files are skipped out loud.
  if [[ $kind == f32 ]]; then
    has_err "warning: the checkpoint's tokenizer is not a SentencePiece model ($step/tokenizer.model"
    has_err "wrote no tokenizer files and no special token ids"
  fi
  has_out "wrote config.json (torch_dtype $([[ $kind == f32 ]] && echo float32 || echo bfloat16))"
  "$PY" - "$tmp/hf_$kind" "$tmp/out_$kind" "$kind" "$tmp/tok.model" "$src/tests/ref" <<'EOF' || fail "$kind export differs from its input"
import json, os, struct, sys
src, out, kind, tok = sys.argv[1:5]
def raw(path):
    # name -> (dtype, shape, bytes): compares the stored bits, not values after a conversion.
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n])
    meta = h.pop("__metadata__", {})
    return {k: (e["dtype"], e["shape"], data[8 + n + e["data_offsets"][0]: 8 + n + e["data_offsets"][1]])
            for k, e in h.items()}, meta
a, _ = raw(f"{src}/model.safetensors")
b, meta = raw(f"{out}/model.safetensors")
assert meta.get("format") == "pt", meta
assert list(a) == list(b), (list(a), list(b))  # same names, in layout order
for k in a:
    assert a[k][0] == b[k][0] and a[k][1] == b[k][1], (k, a[k][:2], b[k][:2])
    assert a[k][2] == b[k][2], f"{k}: bytes differ"
if kind == "bf16":
    assert "lm_head.weight" not in b
ca, cb = json.load(open(f"{src}/config.json")), json.load(open(f"{out}/config.json"))
for key in ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings",
            "rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act"):
    assert ca[key] == cb[key], (key, ca[key], cb[key])
assert cb["torch_dtype"] == {"f32": "float32", "bf16": "bfloat16"}[kind], cb["torch_dtype"]
assert cb["attention_bias"] is False and cb["mlp_bias"] is False
names = sorted(os.listdir(out))
if kind == "f32":
    assert names == ["config.json", "model.safetensors", "tokenizer.model"], names
    assert open(f"{out}/tokenizer.model", "rb").read() == open(tok, "rb").read()
else:
    assert names == ["config.json", "model.safetensors"], names
EOF
  # What ft reads back: the exported folder is a valid model.from.
  run_rc 0 "$ft" inspect "$tmp/out_$kind"
  has_out "compatible with ft: yes"
  echo "ok: a. $kind import → checkpoint → export is bit-identical"
done
# The f32 checkpoint to bf16 and f16: the same bits as torch's rounding (nearest even).
for dt in bf16 f16; do
  run_rc 0 "$ft" export "$tmp/run_f32/checkpoints" --output "$tmp/out_f32_$dt" --dtype "$dt"
done
"$PY" - "$tmp" <<'EOF2' || fail "bf16/f16 conversion differs from torch's"
import json, struct, sys
import numpy as np, torch
t = sys.argv[1]
def raw(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n]); h.pop("__metadata__", None)
    return {k: (e["dtype"], data[8 + n + e["data_offsets"][0]: 8 + n + e["data_offsets"][1]])
            for k, e in h.items()}
src = raw(f"{t}/hf_f32/model.safetensors")
for dt, tdt, name in (("bf16", torch.bfloat16, "BF16"), ("f16", torch.float16, "F16")):
    out = raw(f"{t}/out_f32_{dt}/model.safetensors")
    assert list(out) == list(src)
    for k, (d, b) in out.items():
        want = torch.from_numpy(np.frombuffer(src[k][1], dtype=np.float32).copy()).to(tdt)
        assert d == name and b == want.view(torch.int16).numpy().tobytes(), f"{dt} {k}"
EOF2
if ls "$tmp" | grep -q '\.tmp-'; then fail "temporary export folder left behind"; fi

# ---- b. data 2 × tensor 2, ZeRO-3; export sharded; reference loss = ft's eval_loss ----------
cat > "$tmp/tp.yaml" <<YAML
run: {name: tp, output_dir: $tmp/run_tp, seed: 5}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 98, max_seq_len: 16, init_std: 0.1}
tokenizer: {path: $tmp/tok.model}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16, shuffle: true}
$common
training: {steps: 3, micro_batch_size: 1, global_batch_size: 4, eval_every_steps: 3, eval_batches: 3}
parallel: {tensor: 2, zero_stage: 3}
checkpoint: {every_steps: 2}
YAML
run_rc 0 "$ft" train "$tmp/tp.yaml" --nproc 4
ckdir="$tmp/run_tp/checkpoints"
[[ -f "$ckdir/step_00000003/COMPLETE" ]] || fail "no final checkpoint step_00000003: $(ls "$ckdir")"
# The checkpoint dir: export follows `latest`. 4 KiB shards split this ~60 KB model in several.
run_rc 0 "$ft" export "$ckdir" --output "$tmp/out_tp" --max-shard-size 4KiB
has_out "step_00000003"
has_out "wrote model.safetensors.index.json"
has_out "copied tokenizer.model"
"$PY" "$src/tests/ref/export_check.py" "$tmp/out_tp" --valid "$tmp/valid" --seq-len 16 \
  --global-batch 4 --eval-batches 3 --metrics "$tmp/run_tp/metrics.jsonl" --min-shards 2 \
  || fail "exported model does not reproduce ft's eval_loss"
cmp "$tmp/out_tp/tokenizer.model" "$tmp/tok.model" || fail "tokenizer.model not copied byte for byte"
echo "ok: b. data 2 x tensor 2 ZeRO-3 export, sharded, matches ft's eval_loss"

# ---- c. inspect: sound, then a flipped byte, then a truncated shard -------------------------
run_rc 0 "$ft" inspect "$ckdir"
has_out "step_00000002  complete"
has_out "step_00000003  complete  <- latest"
has_out "layout:       world 4 = data 2 × pipeline 1 × tensor 2, ZeRO stage 3"
has_out "checksums:    all "
run_rc 0 "$ft" inspect "$ckdir/step_00000003"
has_out "step:         3 "
has_out "status:       complete"
has_out "model.layers.0.self_attn.q_proj.weight"
has_out "... 1 more layer with the same tensors (layer 1)"
has_out "rank_00003.bin"
grep -Eq '^  checksums: +all [0-9]+ pieces in 4 files verified$' "$tmp/out.txt" || fail "checksum line"
grep -Eq '^ +lm_head\.weight +f32 +\[98, 32\] +rows$' "$tmp/out.txt" || fail "lm_head row"
echo "ok: c. inspect a sound checkpoint"

# Flip one byte in the middle of a parameter piece of rank 1's file.
cp -r "$ckdir/step_00000003" "$tmp/flipped"
"$PY" - "$tmp/flipped" <<'EOF'
import json, sys
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
p = next(p for p in m["pieces"] if p["file"] == "rank_00001.bin" and p["state"] == "param"
         and p["end"] > p["begin"])
at = p["offset"] + 4 * ((p["end"] - p["begin"]) // 2) + 1
with open(f"{d}/rank_00001.bin", "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x10]))
EOF
run_rc 1 "$ft" inspect "$tmp/flipped"
grep -Eq '^  checksums: +[0-9]+ problems?$' "$tmp/out.txt" || fail "no problem count"
sed -n '/^  checksums:/,$p' "$tmp/out.txt" | grep -q "rank_00001.bin" || fail "problem lacks the file"
has_err "rank_00001.bin"
run_rc 1 "$ft" export "$tmp/flipped" --output "$tmp/out_flipped"
has_err "rank_00001.bin"
[[ ! -e "$tmp/out_flipped" ]] || fail "export of a corrupt checkpoint left an output folder"
if ls "$tmp" | grep -q '\.tmp-'; then fail "temporary export folder left behind"; fi
echo "ok: c. flipped byte reported by inspect and export"

cp -r "$ckdir/step_00000003" "$tmp/truncated"
truncate -s -100 "$tmp/truncated/rank_00002.bin"
run_rc 1 "$ft" inspect "$tmp/truncated"
sed -n '/^  checksums:/,$p' "$tmp/out.txt" | grep -q "rank_00002.bin" || fail "problem lacks the file"
has_err "rank_00002.bin"
run_rc 1 "$ft" export "$tmp/truncated" --output "$tmp/out_truncated"
has_err "rank_00002.bin"
echo "ok: c. truncated shard reported by inspect and export"

# ---- d. refusals ----------------------------------------------------------------------------
run_rc 2 "$ft" export "$ckdir" --output "$tmp/out_tp"
has_err "exists and is not empty"
has_err "--overwrite"
run_rc 0 "$ft" export "$ckdir/step_00000002" --output "$tmp/out_tp" --overwrite --dtype f16
"$PY" -c "
import json, sys
c = json.load(open(sys.argv[1] + '/config.json'))
assert c['torch_dtype'] == 'float16', c
" "$tmp/out_tp" || fail "--overwrite did not replace the folder"
[[ ! -e "$tmp/out_tp/model.safetensors.index.json" ]] || fail "old index left after --overwrite"
run_rc 2 "$ft" export "$tmp/train" --output "$tmp/out_x"
has_err "not a checkpoint"
run_rc 2 "$ft" export "$ckdir" --output "$tmp/out_x" --max-shard-size lots
has_err "--max-shard-size"
cp -r "$ckdir/step_00000003" "$tmp/incomplete"
rm "$tmp/incomplete/COMPLETE"
run_rc 1 "$ft" inspect "$tmp/incomplete"
has_out "incomplete: COMPLETE is missing; never resumed from"
run_rc 1 "$ft" export "$tmp/incomplete" --output "$tmp/out_x"
has_err "COMPLETE"
[[ ! -e "$tmp/out_x" ]] || fail "refused export left an output folder"
# A checkpoint dir without `latest` (a stop between COMPLETE and `latest`): the newest complete
# step folder, as --resume auto; with only an incomplete one, inspect says so and exits 1.
mkdir "$tmp/nolatest"
cp -r "$ckdir/step_00000002" "$tmp/incomplete" "$tmp/nolatest/"
mv "$tmp/nolatest/incomplete" "$tmp/nolatest/step_00000009"
run_rc 0 "$ft" inspect "$tmp/nolatest"
has_out "step_00000009  incomplete (no COMPLETE)"
has_out "checkpoint $tmp/nolatest/step_00000002"
run_rc 0 "$ft" export "$tmp/nolatest" --output "$tmp/out_nolatest"
has_out "(step 2)"
rm -r "$tmp/nolatest/step_00000002"
run_rc 1 "$ft" inspect "$tmp/nolatest"
has_out "no step folder is complete"
run_rc 1 "$ft" export "$tmp/nolatest" --output "$tmp/out_x"
has_err "none is complete"
echo "ok: d. refusals"

# ---- e. bounds and words (issue 27) ----------------------------------------------------------
# --max-shard-size: from 1 byte to 1000TB, a byte count or a number with a unit; the value quoted
# briefly.
for bad in '0:"0": less than 1 byte' '0.5:"0.5": less than 1 byte' \
           '1e300:"1e300": unknown unit "e300"' '5XB:"5XB": unknown unit "XB"' \
           '2000TB:"2000TB": more than 1000TB' 'lots:"lots": not a size'; do
  run_rc 2 "$ft" export "$ckdir" --output "$tmp/out_x" --max-shard-size "${bad%%:*}"
  has_err "--max-shard-size: ${bad#*:}; give a byte count, or a number with KB, MB, GB, TB"
done
run_rc 2 "$ft" export "$ckdir" --output "$tmp/out_x" --max-shard-size "$(printf '9%.0s' {1..3000})"
(( $(wc -c < "$tmp/err.txt") < 400 )) || fail "a 3000-digit size quoted whole"
run_rc 2 "$ft" export "$ckdir" --output "$tmp/out_x" --dtype "$(printf 'z%.0s' {1..3000})"
(( $(wc -c < "$tmp/err.txt") < 200 )) || fail "a 3000-character dtype quoted whole"
# --output: why it cannot be created, before the checkpoint is read.
touch "$tmp/a_file"
run_rc 2 "$ft" export "$ckdir" --output "$tmp/a_file"
has_err "$tmp/a_file: exists and is a regular file, not a folder; choose another --output"
run_rc 2 "$ft" export "$ckdir" --output "$tmp/a_file/sub/out"
has_err "$tmp/a_file/sub/out: cannot be created: $tmp/a_file is a regular file, not a folder"
lacks_out "ft export: checkpoint"
run_rc 2 "$ft" export "$ckdir" --output ""
has_err "--output is empty"
if [[ $(id -u) != 0 ]]; then  # root writes anywhere
  mkdir "$tmp/read_only" && chmod 555 "$tmp/read_only"
  run_rc 2 "$ft" export "$ckdir" --output "$tmp/read_only/out"
  has_err "cannot be created in $tmp/read_only (Permission denied)"
fi
# `latest` naming a step folder that is gone; a manifest that is a FIFO (refused at once).
cp -r "$ckdir" "$tmp/stale"
echo step_00000077 > "$tmp/stale/latest"
run_rc 2 "$ft" export "$tmp/stale" --output "$tmp/out_x"
has_err "$tmp/stale/latest names step_00000077, which is not there"
has_err "give a step folder instead: $tmp/stale/step_00000003 is the newest complete one"
rm "$tmp/stale/step_00000003/manifest.json"
mkfifo "$tmp/stale/step_00000003/manifest.json"
run_rc 1 timeout 20 "$ft" export "$tmp/stale/step_00000003" --output "$tmp/out_x"
has_err "manifest.json: is a FIFO (named pipe), not a regular file"
run_rc 1 timeout 20 "$ft" inspect "$tmp/stale/step_00000003"
has_err "is a FIFO (named pipe)"
# The help says what export writes (it said tokenizer.model and LlamaForCausalLM only).
run_rc 0 "$ft" help export
has_out "Qwen2ForCausalLM"
has_out "tokenizer.json"
lacks_out "loads as LlamaForCausalLM and ft takes"
# model.from with an infinity: refused as it is read, naming tensor and file, before step 1
# (exit 2), not left to show as a NaN loss blamed on the learning rate.
cp -r "$tmp/hf_f32" "$tmp/hf_nan"
"$PY" - "$tmp/hf_nan/model.safetensors" "$src/tests/ref" <<'EOF'
import sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
t = ref.read_safetensors(sys.argv[1])
t["model.layers.0.self_attn.q_proj.weight"][2, 5] = float("inf")
ref.write_safetensors(sys.argv[1], t)
EOF
sed "s#$tmp/hf_f32#$tmp/hf_nan#; s#$tmp/run_f32#$tmp/run_nan#; s#steps: 0#steps: 2#" \
  "$tmp/f32.yaml" > "$tmp/nan.yaml"
run_rc 2 "$ft" train "$tmp/nan.yaml"
has_err "tensor 'model.layers.0.self_attn.q_proj.weight' in '$tmp/hf_nan/model.safetensors' holds infinity at [2, 5]"
if grep -q '"loss"' "$tmp/run_nan/metrics.jsonl" 2>/dev/null; then
  fail "a step ran on non-finite weights"
fi
echo "ok: e. --max-shard-size, --output, latest, a FIFO manifest, the help, non-finite weights"

echo "test_export: all checks passed"
