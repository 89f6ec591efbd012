#!/usr/bin/env bash
# RoPE scaling end to end on the real binary (issue 7, points 1-2):
#  a. A llama3 model written in the recipe (model.rope_* keys) trains 2 steps and checkpoints;
#     the manifest records its RoPE; resuming with another rope_factor or rope_type is refused
#     (exit 2, naming both values); resuming with the same RoPE continues to step 4.
#  b. ft export of that checkpoint writes rope_theta + rope_scaling (transformers 4) and
#     rope_parameters (5) saying the same; ft inspect and ft validate read it back as llama3.
#  c. A model.from whose config.json asks for yarn: ft train refuses it by name with exit 2
#     before any work (no output folder is created).
#   bash tests/cli/test_rope.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
PY=/usr/bin/python3  # Debian's, with torch, numpy and h5py (DESIGN.md §9)
has() { grep -qF -- "$2" "$1" || fail "$1 lacks: $2 ($(tail -3 "$1"))"; }

"$PY" "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 16 --seq-len 12 --seed 5

# head_dim 8, theta 10000: wavelengths 2π/inv_freq are 6.3, 63, 628 and 6283; original max
# positions 200 with low/high frequency factors 1/4 put the band edges at 50 and 200, so the
# first frequency is kept, the second blended and the last two divided by the factor.
cat > "$tmp/r.yaml" <<YAML
run: {name: rope, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64,
        max_seq_len: 16, rope_theta: 10000, rope_type: llama3, rope_factor: 8,
        rope_low_freq_factor: 1, rope_high_freq_factor: 4, rope_original_max_seq_len: 200}
data: {train: $tmp/data, seq_len: 12}
training: {steps: 2, micro_batch_size: 2, global_batch_size: 4}
checkpoint: {every_steps: 2}
runtime: {threads: 1}
YAML

# ---- a. train, checkpoint, resume ------------------------------------------------------------
"$ft" train "$tmp/r.yaml" >"$tmp/a.log" 2>&1 || fail "train: $(tail -5 "$tmp/a.log")"
step2="$tmp/out/checkpoints/step_00000002"
"$PY" - "$step2/manifest.json" <<'PYEOF' || fail "manifest lacks the RoPE scaling"
import json, sys
m = json.load(open(sys.argv[1]))["model"]
assert m["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_seq_len": 200}, m
PYEOF
rc=0; "$ft" train "$tmp/r.yaml" training.steps=4 model.rope_factor=4 >"$tmp/b.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "resume with another rope_factor exited $rc, expected 2"
has "$tmp/b.log" "model.rope_factor 8 in the checkpoint, 4 in the recipe"
rc=0; "$ft" train "$tmp/r.yaml" training.steps=4 model.rope_type=linear \
  model.rope_low_freq_factor=1 model.rope_high_freq_factor=4 model.rope_original_max_seq_len=8192 \
  >"$tmp/c.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "resume with another rope_type exited $rc, expected 2"
has "$tmp/c.log" "model.rope_type llama3 in the checkpoint, linear in the recipe"
"$ft" train "$tmp/r.yaml" training.steps=4 >"$tmp/d.log" 2>&1 || fail "resume: $(tail -5 "$tmp/d.log")"
[[ -f "$tmp/out/checkpoints/step_00000004/COMPLETE" ]] || fail "the resumed run did not reach step 4"
echo "ok: llama3 trains, checkpoints and resumes only with the same RoPE"

# ---- b. export, inspect, validate -------------------------------------------------------------
"$ft" export "$tmp/out/checkpoints/step_00000004" --output "$tmp/hf" >"$tmp/e.log" 2>&1 ||
  fail "export: $(tail -5 "$tmp/e.log")"
"$PY" - "$tmp/hf/config.json" <<'PYEOF' || fail "exported config.json"
import json, sys
c = json.load(open(sys.argv[1]))
scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 200}
assert c["rope_theta"] == 10000.0, c
assert c["rope_scaling"] == scaling, c["rope_scaling"]
assert c["rope_parameters"] == dict(scaling, rope_theta=10000.0), c["rope_parameters"]
PYEOF
"$ft" inspect "$tmp/hf" >"$tmp/i.log" 2>&1 || fail "inspect: $(tail -5 "$tmp/i.log")"
has "$tmp/i.log" "rope_theta 10000, rope llama3 (factor 8, low/high frequency factors 1/4, original max positions 200)"
has "$tmp/i.log" "compatible with ft: yes"
printf 'model: {from: %s}\ndata: {train: %s, seq_len: 12}\n' "$tmp/hf" "$tmp/data" >"$tmp/from.yaml"
"$ft" validate "$tmp/from.yaml" >"$tmp/v.log" 2>&1 || fail "validate: $(tail -5 "$tmp/v.log")"
has "$tmp/v.log" "rope_type: llama3"
has "$tmp/v.log" "rope_original_max_seq_len: 200"
echo "ok: export writes both formats; inspect and validate read llama3 back"

# ---- c. a rope type ft does not implement: refused before any work -------------------------
cp -r "$tmp/hf" "$tmp/yarn"
"$PY" - "$tmp/yarn/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 40}
c["rope_parameters"] = dict(c["rope_scaling"], rope_theta=10000.0)
json.dump(c, open(sys.argv[1], "w"))
PYEOF
rc=0
"$ft" train "$tmp/from.yaml" model.from="$tmp/yarn" run.output_dir="$tmp/yarn_out" \
  >"$tmp/y.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "train on a yarn model exited $rc, expected 2"
has "$tmp/y.log" "rope type \"yarn\" (rope_parameters.rope_type) is not implemented; ft implements default, linear, llama3"
[[ ! -e "$tmp/yarn_out" ]] || fail "ft train created its output folder before refusing"
echo "ok: yarn refused before any work"
echo "PASS test_rope"
