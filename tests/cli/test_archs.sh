#!/usr/bin/env bash
# Qwen2, Qwen3 and Mistral (model.arch, DESIGN.md §5): tests/ref/arch_parity.py under
# transformers 4.46.3 (Debian's torch 1.13 runs its modeling code) — models built by
# transformers (qwen2 tied and untied, mistral) or by llama_ref (qwen3: transformers 4.46 has
# none, and transformers 5 runs no model on torch 1.13; test_qwen3_transformers.sh runs qwen3
# against Qwen3ForCausalLM on torch 2 from PyPI), ft's loss and every gradient of one batch, 10
# training steps against torch.optim.AdamW, and ft export loaded back as the same class.
# Then what import refuses: sliding windows that bind (Mistral's, Qwen's use_sliding_window),
# an odd head_dim (and Qwen3Config's default head_dim 128 read when the key is absent), a
# model.arch that disagrees with config.json, model_type and architectures of different families. The
# layouts of these architectures: tests/cli/test_layouts_archs.sh.
#   bash tests/cli/test_archs.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }

venv "$build/hf_venv_tf4" "${hf_tf4_spec[@]}"
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
run_rc 0 "$build/hf_venv_tf4/bin/python" "$src/tests/ref/arch_parity.py" "$build" "$src" "$tmp" \
  "$build/hf_venv_tf5/bin/python"
has_out "arch_parity: all checks passed"
grep -E "step 1 loss|10 steps|logits of the export" "$tmp/out.txt"
# ft reads its exports back as the same model (model.from).
for c in qwen2_tied:qwen2:16 qwen2:qwen2:16 qwen3:qwen3:32 mistral:mistral:32; do
  IFS=: read -r name arch hd <<< "$c"
  run_rc 0 "$ft" inspect "$tmp/$name/export"
  has_out "architecture: $arch, dim 64, 2 layers, 4 heads, 2 kv heads, head_dim $hd, ffn 96"
  has_out "compatible with ft: yes"
done
grep -q "tied embeddings" <("$ft" inspect "$tmp/qwen2_tied/export") || fail "qwen2_tied export is not tied"
echo "ok: parity of qwen2 (tied, untied), qwen3 and mistral; exports load as their classes"

# ---- what import refuses -----------------------------------------------------------------
# variant NAME FROM JSON_EDITS: a copy of folder FROM with config.json updated by JSON_EDITS.
variant() {
  cp -r "$tmp/$2/hf" "$tmp/$1"
  /usr/bin/python3 - "$tmp/$1/config.json" "$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k, v in json.loads(sys.argv[2]).items():
    if v == "DELETE":
        j.pop(k, None)
    else:
        j[k] = v
json.dump(j, open(sys.argv[1], "w"))
PY
}
validate() {  # WANT_RC FOLDER [KEY=VALUE...]
  local want=$1 folder=$2; shift 2
  cat > "$tmp/v.yaml" <<YAML
model: {from: $tmp/$folder}
data: {train: $tmp/mistral/data, seq_len: 16}
training: {steps: 1, micro_batch_size: 2, global_batch_size: 4}
YAML
  run_rc "$want" "$ft" validate "$tmp/v.yaml" "$@"
}
variant m_window mistral '{"sliding_window": 16}'
validate 2 m_window
has_err "config.json: sliding_window is 16, below max_position_embeddings 64: sliding-window attention is not implemented"
variant m_default mistral '{"sliding_window": "DELETE"}'  # MistralConfig's default: 4096
validate 0 m_default
variant m_window_short mistral '{"sliding_window": 32, "max_position_embeddings": 32}'
validate 0 m_window_short  # a window as long as any sequence never binds
variant q_window qwen2 '{"use_sliding_window": true, "sliding_window": 8}'
validate 2 q_window
has_err "use_sliding_window is true (sliding_window 8): sliding-window attention is not implemented"
variant q_layers qwen2 '{"layer_types": ["full_attention", "sliding_attention"]}'
validate 2 q_layers
has_err "layer_types has \"sliding_attention\"; only \"full_attention\" is implemented"
# Qwen3Config's head_dim when the key is absent is 128, not 64 / 4: the tensors then do not fit.
variant q3_head qwen3 '{"head_dim": "DELETE"}'
run_rc 1 "$ft" inspect "$tmp/q3_head"
has_out "architecture: qwen3, dim 64, 2 layers, 4 heads, 2 kv heads, head_dim 128, ffn 96"
has_out "compatible with ft: no"
variant q3_odd qwen3 '{"head_dim": 15}'
validate 2 q3_odd
has_err "head_dim must be an even whole number from 2 to 2^20, got 15"
variant q3_bias qwen3 '{"attention_bias": true}'
validate 2 q3_bias
has_err "attention_bias is true; ft's qwen3 has no biases"
validate 2 qwen2/hf model.arch=llama
has_err "model.arch = llama but $tmp/qwen2/hf/config.json has architectures qwen2"
variant mixed qwen2 '{"model_type": "mistral"}'
validate 2 mixed
has_err "model_type \"mistral\" and architectures [\"Qwen2ForCausalLM\"] name different families"
variant gemma qwen2 '{"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}'
validate 2 gemma
has_err "model_type is \"gemma\"; implemented: LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2)"
validate 0 qwen3/hf
validate 0 qwen2/hf model.head_dim=16  # hidden_size / num_attention_heads, as the file implies
validate 2 qwen2/hf model.head_dim=32
has_err "model.head_dim = 32 but $tmp/qwen2/hf/config.json has no head_dim (transformers' default 16)"
echo "ok: binding sliding windows, odd head_dim, mismatched families refused"
echo "test_archs: all checks passed"
