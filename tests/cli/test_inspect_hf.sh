#!/usr/bin/env bash
# ft inspect on Hugging Face folders written by the PyTorch reference (tests/ref/llama_ref.py):
# a BF16 single file, a two-shard folder with an index (mixed dtypes, a RoPE buffer), a tied
# one; then folders ft cannot use (missing tensor, wrong shapes, lm_head against tie) and
# malformed files (safetensors header, config.json, index), with their exit codes.
#   bash tests/cli/test_inspect_hf.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
PY=/usr/bin/python3  # Debian's, with torch and numpy (DESIGN.md §9)
fail() { fail_showing_output "$@"; }
inspect() { run_rc "$1" "$ft" inspect "$2"; }  # WANT_RC DIR

# ---- folders -------------------------------------------------------------------------------
# Each folder's expected parameter and byte counts are written beside it, counted by PyTorch.
"$PY" - "$tmp" "$src/tests/ref" <<'EOF'
import json, os, sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref

t = sys.argv[1]

def params(model, bytes_per_param=4):
    n = sum(p.numel() for p in model.named().values())
    base = f"{t}/{os.path.basename(folder)}"
    open(base + ".params", "w").write(f"{n:,}\n")
    open(base + ".bytes", "w").write(f"{n * bytes_per_param:,}\n")

# BF16, GQA, 4 layers: the table folds layers 1-3.
folder = f"{t}/bf16"
m = ref.Llama(ref.Config(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=172,
                         vocab_size=256, max_seq_len=128, rope_theta=500000.0))
ref.save_hf_folder(m, folder, "BF16")
params(m, 2)

# Two shards with an index, BF16 and F32, plus an old-style RoPE buffer that ft ignores.
folder = f"{t}/sharded"
m = ref.Llama(ref.Config(dim=32, n_layers=3, n_heads=2, n_kv_heads=2, ffn_dim=48, vocab_size=50))
ref.save_hf_folder(m, folder)
os.remove(f"{folder}/model.safetensors")
named = m.named()
names = list(named)
first, second = names[:10], names[10:]
import torch
ref.write_safetensors(f"{folder}/model-00001-of-00002.safetensors",
                      {n: named[n] for n in first}, "BF16")
extra = {n: named[n] for n in second}
extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
ref.write_safetensors(f"{folder}/model-00002-of-00002.safetensors", extra)
weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
weight_map.update({n: "model-00002-of-00002.safetensors" for n in extra})
json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
          open(f"{folder}/model.safetensors.index.json", "w"), indent=2)
params(m)

# Tied embeddings: no lm_head.weight.
folder = f"{t}/tied"
m = ref.Llama(ref.Config(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=12, vocab_size=11,
                         tie_embeddings=True))
ref.save_hf_folder(m, folder, "BF16")
params(m)

# A tensor missing from layer 1 of 3.
folder = f"{t}/missing"
m = ref.Llama(ref.Config(dim=8, n_layers=3, n_heads=2, n_kv_heads=1, ffn_dim=12, vocab_size=11))
ref.save_hf_folder(m, folder)
named = m.named()
del named["model.layers.1.mlp.up_proj.weight"]
ref.write_safetensors(f"{folder}/model.safetensors", named)
EOF

# ---- BF16, one file ------------------------------------------------------------------------
inspect 0 "$tmp/bf16"
has_out "Hugging Face folder $tmp/bf16"
has_out "architecture: llama, dim 64, 4 layers, 4 heads, 2 kv heads, head_dim 16, ffn 172, vocab 256, max_seq_len 128, rope_theta 500000, untied embeddings"
has_out "files:        1 ("
has_out "model.safetensors"
has_out "parameters:   214.59K ($(cat "$tmp/bf16.params"))"
has_out "of tensor data ($(cat "$tmp/bf16.bytes") bytes)"
has_out "dtypes:       BF16 (39 tensors)"
has_out "tensors:      39"
grep -Eq '^ +model\.layers\.0\.self_attn\.k_proj\.weight +BF16 +\[32, 64\]$' "$tmp/out.txt" ||
  fail "no k_proj row for layer 0"
grep -Eq '^ +lm_head\.weight +BF16 +\[256, 64\]$' "$tmp/out.txt" || fail "no lm_head row"
lacks_out "model.layers.1."
has_out "... 3 more layers with the same tensors (layers 1-3)"
has_out "compatible with ft: yes"
[[ ! -s "$tmp/err.txt" ]] || fail "stderr not empty"
grep -q ' $' "$tmp/out.txt" && fail "trailing blanks in the output"
echo "ok: bf16 single file"

# ---- sharded, mixed dtypes -----------------------------------------------------------------
inspect 0 "$tmp/sharded"
has_out "architecture: llama, dim 32, 3 layers, 2 heads, 2 kv heads, head_dim 16, ffn 48, vocab 50, max_seq_len 64, rope_theta 10000, untied embeddings"
has_out "files:        2 ("
grep -Eq '^ +model-00001-of-00002\.safetensors +[0-9.]+ KiB +10 tensors$' "$tmp/out.txt" ||
  fail "shard 1 line"
grep -Eq '^ +model-00002-of-00002\.safetensors +[0-9.]+ KiB +21 tensors$' "$tmp/out.txt" ||
  fail "shard 2 line"
# The RoPE buffer is not a parameter.
has_out "($(cat "$tmp/sharded.params"))"
has_out "dtypes:       F32 (21 tensors), BF16 (10 tensors)"
# Shard 1 holds layer 0 in BF16 (with the RoPE buffer), shard 2 the other layers in F32: layer 1
# differs from layer 0 and is printed, layer 2 is folded into it.
grep -Eq '^ +name +dtype +shape +file$' "$tmp/out.txt" || fail "no file column"
grep -Eq '^ +model\.embed_tokens\.weight +BF16 +\[50, 32\] +model-00001-of-00002\.safetensors$' \
  "$tmp/out.txt" || fail "embed row with its file"
grep -Eq '^ +model\.layers\.0\.self_attn\.rotary_emb\.inv_freq +F32 +\[8\] ' "$tmp/out.txt" ||
  fail "no RoPE buffer row"
grep -Eq '^ +model\.layers\.1\.mlp\.down_proj\.weight +F32 +\[32, 48\] ' "$tmp/out.txt" ||
  fail "no layer 1 row"
lacks_out "model.layers.2."
has_out "... 1 more layer with the same tensors (layer 2)"
has_out "note: 1 rotary_emb.inv_freq buffer is ignored"
has_out "compatible with ft: yes"
echo "ok: sharded"

# ---- tied ----------------------------------------------------------------------------------
inspect 0 "$tmp/tied"
has_out "1 kv head, head_dim 4"
has_out "tied embeddings"
has_out "($(cat "$tmp/tied.params"))"
lacks_out "lm_head.weight"
has_out "... 1 more layer with the same tensors (layer 1)"
has_out "compatible with ft: yes"
echo "ok: tied"

# ---- folders ft cannot use: summary, the problems, exit 1 ----------------------------------
inspect 1 "$tmp/missing"
has_out "tensors:      29"
# Layer 1 differs from layer 0, so it is printed in full; layer 2 differs from layer 1, the
# layer printed before it, so it is printed too.
has_out "model.layers.1.mlp.gate_proj.weight"
has_out "model.layers.2.mlp.up_proj.weight"
has_out "compatible with ft: no"
has_out "missing: model.layers.1.mlp.up_proj.weight"
has_out "hint: is this a LlamaForCausalLM checkpoint"
has_err "$tmp/missing: not usable by ft as model.from"
echo "ok: missing tensor"

# config.json says 4 KV heads where the weights have 2: wrong shapes, listed together.
cp -r "$tmp/bf16" "$tmp/shape"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['num_key_value_heads'] = 4; json.dump(c, open(p, 'w'))" "$tmp/shape"
inspect 1 "$tmp/shape"
has_out "4 heads, 4 kv heads"
has_out "compatible with ft: no"
has_out "tensor 'model.layers.0.self_attn.k_proj.weight' in '$tmp/shape/model.safetensors' has shape [32, 64], expected [64, 64]"
has_out "tensor 'model.layers.3.self_attn.v_proj.weight' in '$tmp/shape/model.safetensors' has shape [32, 64], expected [64, 64]"
echo "ok: wrong shapes"

# The weights have lm_head.weight, config.json says tied: unexpected, with the hint.
cp -r "$tmp/bf16" "$tmp/untie"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['tie_word_embeddings'] = True; json.dump(c, open(p, 'w'))" "$tmp/untie"
# Its lm_head.weight has the embedding's shape but other values: refused with the largest
# difference (ft would train one matrix for both).
inspect 1 "$tmp/untie"
has_out "compatible with ft: no"
has_out "tensor 'lm_head.weight' in '$tmp/untie/model.safetensors' differs from 'model.embed_tokens.weight' in "
has_out "max |difference| "
has_out "set tie_word_embeddings to false in config.json"
echo "ok: lm_head against tie_word_embeddings"

# A tied model that also stores lm_head.weight equal to the embedding (here F32 beside a BF16
# embedding: equal after conversion) loads as transformers loads it; counted once.
cp -r "$tmp/tied" "$tmp/tied_copy"
"$PY" - "$tmp/tied_copy" "$src/tests/ref" <<'EOF2'
import sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
p = sys.argv[1] + "/model.safetensors"
t = ref.read_safetensors(p)
t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
ref.write_safetensors(p, t)
EOF2
inspect 0 "$tmp/tied_copy"
has_out "($(cat "$tmp/tied.params"))"
has_out "note: lm_head.weight equals model.embed_tokens.weight (tied embeddings); ft loads it once"
has_out "compatible with ft: yes"
echo "ok: tied lm_head copy"

# A config ft's model cannot run: 4 query heads over 3 KV heads.
cp -r "$tmp/tied" "$tmp/gqa"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['num_key_value_heads'] = 3; json.dump(c, open(p, 'w'))" "$tmp/gqa"
inspect 1 "$tmp/gqa"
has_out "config.json: num_attention_heads 2 is not divisible by num_key_value_heads 3"
echo "ok: config sizes"

# ---- RoPE as config.json states it -----------------------------------------------------------
# transformers 5: rope_parameters only, llama3 with theta 500000.
cp -r "$tmp/bf16" "$tmp/llama3"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); del c['rope_theta']
c['rope_parameters'] = {'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 8.0,
                        'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
                        'original_max_position_embeddings': 8192}
c['attention_dropout'] = 0.1
json.dump(c, open(p, 'w'))" "$tmp/llama3"
inspect 0 "$tmp/llama3"
has_out "max_seq_len 128, rope_theta 500000, rope llama3 (factor 8, low/high frequency factors 1/4, original max positions 8192), untied embeddings"
has_out "warning: $tmp/llama3/config.json: attention_dropout is 0.1; ft has no dropout and trains this model without it"
has_out "compatible with ft: yes"
echo "ok: llama3 rope_parameters"

# A rope type ft does not implement: the summary, then not compatible with the reason.
cp -r "$tmp/bf16" "$tmp/yarn"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p))
c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32}
json.dump(c, open(p, 'w'))" "$tmp/yarn"
inspect 1 "$tmp/yarn"
has_out "rope_theta 500000, rope yarn, untied"
has_out "compatible with ft: no"
has_out "config.json: rope type \"yarn\" (rope_scaling.rope_type) is not implemented; ft implements default, linear, llama3"
has_err "$tmp/yarn: not usable by ft as model.from"
echo "ok: yarn not compatible"

# ---- malformed files: an error naming the file, exit 1 -------------------------------------
cp -r "$tmp/tied" "$tmp/garbage"
echo "garbage" >"$tmp/garbage/model.safetensors"
inspect 1 "$tmp/garbage"
has_err "$tmp/garbage/model.safetensors"
[[ ! -s "$tmp/out.txt" ]] || fail "a summary was printed for a corrupt file"
echo "ok: safetensors too short"

cp -r "$tmp/tied" "$tmp/header"
"$PY" -c "
import struct, sys
h = b'{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [8], '
with open(sys.argv[1] + '/model.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(h))); f.write(h)" "$tmp/header"
inspect 1 "$tmp/header"
has_err "safetensors file '$tmp/header/model.safetensors': header is not valid JSON"
echo "ok: corrupt safetensors header"

cp -r "$tmp/sharded" "$tmp/shard_header"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$tmp/shard_header/model-00002-of-00002.safetensors"
inspect 1 "$tmp/shard_header"
has_err "$tmp/shard_header/model-00002-of-00002.safetensors"
echo "ok: corrupt shard header"

cp -r "$tmp/sharded" "$tmp/lost_shard"
rm "$tmp/lost_shard/model-00002-of-00002.safetensors"
inspect 1 "$tmp/lost_shard"
has_err "lists shard 'model-00002-of-00002.safetensors'"
echo "ok: index names a missing shard"

cp -r "$tmp/tied" "$tmp/bad_config"
echo '{"hidden_size": 8,' >"$tmp/bad_config/config.json"
inspect 1 "$tmp/bad_config"
has_err "$tmp/bad_config/config.json: not valid JSON"
echo "ok: malformed config.json"

cp -r "$tmp/tied" "$tmp/gemma"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['model_type'] = 'gemma'; json.dump(c, open(p, 'w'))" "$tmp/gemma"
inspect 1 "$tmp/gemma"
has_err "$tmp/gemma/config.json: model_type is \"gemma\"; implemented: LlamaForCausalLM (llama)"
echo "ok: another architecture"

mkdir "$tmp/no_weights"
cp "$tmp/tied/config.json" "$tmp/no_weights/"
inspect 1 "$tmp/no_weights"
has_err "no model.safetensors or model.safetensors.index.json in '$tmp/no_weights'"
echo "ok: config.json without weights"

# ---- what ft can do with the folder: tokenizer and chat template -----------------------------
# Weights alone: usable as model.from, not for chat data; the summary says what is missing and
# what works without it (it used to say "compatible with ft: yes" and nothing more).
inspect 0 "$tmp/bf16"
has_out "tokenizer:     none (no tokenizer.json or tokenizer.model)"
has_out "chat template: none (no chat_template.jinja, and no chat_template in tokenizer_config.json)"
has_out "compatible with ft: yes, as model.from (config.json, and the tensors' names, shapes and dtypes"
has_out "chat data:     no (no tokenizer, no chat template). Without a tokenizer ft still trains the model (model.from) on token shards of at most 256 ids"
# A SentencePiece tokenizer (made here with spm_train, 200 pieces), no chat template.
"$PY" "$src/scripts/make_corpus.py" --out "$tmp/corpus.txt" --size-mb 0.05 \
  --tokenizer "$tmp/sp.model" --vocab-size 200 >/dev/null
cp -r "$tmp/bf16" "$tmp/sp"
cp "$tmp/sp.model" "$tmp/sp/tokenizer.model"
inspect 0 "$tmp/sp"
has_out "tokenizer:     tokenizer.model (SentencePiece), 200 ids, BOS id 1, EOS id 2"
has_out "chat data:     no (no chat template). This folder's tokenizer serves ft tokenize of text and JSONL"
# With a chat template ft's Jinja subset renders, but a SentencePiece tokenizer, whose tokens do
# not spell the rendered text: the loss mask cannot find the assistant's tokens, so no chat data
# (a byte-level BPE folder with a template says "chat data: yes": test_export_transformers.sh).
cp -r "$tmp/sp" "$tmp/sp_chat"
cp "$src/tests/data/chat_templates/qwen2_5_instruct.jinja" "$tmp/sp_chat/chat_template.jinja"
inspect 0 "$tmp/sp_chat"
has_out "chat template: chat_template.jinja: ft's Jinja subset renders it"
has_out "chat tokens:   ft cannot mark the assistant's tokens: "
has_out "chat data:     no (the tokenizer cannot mark the assistant's tokens). This folder's tokenizer serves ft tokenize of text and JSONL and ft generate without --chat; chat data (ft tokenize --format chat or alpaca, ft generate --chat) needs a tokenizer whose tokens spell the rendered text"
# A template without a tokenizer; a template outside ft's subset; a tokenizer of more ids than
# the model has; a tokenizer.json ft cannot read.
cp -r "$tmp/bf16" "$tmp/tmpl_only"
cp "$tmp/sp_chat/chat_template.jinja" "$tmp/tmpl_only/"
inspect 0 "$tmp/tmpl_only"
has_out "chat template: chat_template.jinja: ft's Jinja subset renders it"
has_out "chat data:     no (no tokenizer)."
cp -r "$tmp/sp" "$tmp/bad_tmpl"
echo '{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}' \
  > "$tmp/bad_tmpl/chat_template.jinja"
inspect 0 "$tmp/bad_tmpl"
has_out "chat template: ft cannot use it: "
has_out "chat data:     no (no chat template ft renders)"
cp -r "$tmp/tied" "$tmp/big_tok"
cp "$tmp/sp.model" "$tmp/big_tok/tokenizer.model"
inspect 0 "$tmp/big_tok"
has_out "200 ids, BOS id 1, EOS id 2: more ids than the model's vocab_size 11, so ft refuses the pair"
has_out "chat data:     no (a tokenizer of more ids than the model has, no chat template)"
cp -r "$tmp/bf16" "$tmp/bad_tok"
echo '{"model": {"type": "WordPiece"}}' > "$tmp/bad_tok/tokenizer.json"
inspect 0 "$tmp/bad_tok"
has_out "tokenizer:     ft cannot read it: "
has_out "chat data:     no (no tokenizer ft reads"
cp -r "$tmp/bf16" "$tmp/zero_tok"
ln -s /dev/zero "$tmp/zero_tok/tokenizer.model"
run_rc 0 timeout 20 "$ft" inspect "$tmp/zero_tok"
has_out "tokenizer:     ft cannot read it: tokenizer $tmp/zero_tok/tokenizer.model: is a character device, not a regular file"
cp -r "$tmp/sp" "$tmp/fifo_config"
mkfifo "$tmp/fifo_config/tokenizer_config.json"
run_rc 0 timeout 20 "$ft" inspect "$tmp/fifo_config"
has_out "chat template: ft cannot use it: tokenizer config $tmp/fifo_config/tokenizer_config.json: is a FIFO (named pipe), not a regular file"
echo "ok: tokenizer and chat template: what is there, what is missing, what works without it"

# ---- flags: a range each, the value quoted briefly --------------------------------------------
run_rc 2 "$ft" inspect "$tmp/bf16" --seq-len 0
has_err "--seq-len: \"0\" is out of range: must be in [1, 1073741824]"
run_rc 2 "$ft" inspect "$tmp/bf16" --seq-len 1e3
has_err "--seq-len: \"1e3\" is not a whole number"
run_rc 2 "$ft" inspect "$tmp/bf16" --pack-overflow "$(printf 'q%.0s' {1..3000})"
has_err "is not one of split, drop"
(( $(wc -c < "$tmp/err.txt") < 200 )) || fail "a 3000-character value quoted whole"
echo "ok: --seq-len and --pack-overflow"

# ---- files checked before reading: a FIFO or /dev/zero refused at once, in words -------------
for f in config.json model.safetensors; do
  for kind in fifo zero; do
    rm -rf "$tmp/special"; cp -r "$tmp/tied" "$tmp/special"; rm -f "$tmp/special/$f"
    if [[ $kind == fifo ]]; then mkfifo "$tmp/special/$f"; else ln -s /dev/zero "$tmp/special/$f"; fi
    run_rc 1 timeout 20 "$ft" inspect "$tmp/special"
    has_err "$tmp/special/$f"
    has_err "$([[ $kind == fifo ]] && echo "is a FIFO (named pipe)" || echo "is a character device"), not a regular file"
  done
done
inspect 1 "$tmp/bad_config"
grep -qF "json.exception" "$tmp/err.txt" && fail "a library's error code in the message"
grep -qF "[" "$tmp/err.txt" && fail "a check expression or code in the message: $(cat "$tmp/err.txt")"
echo "ok: FIFO and /dev/zero in a folder refused at once; JSON errors in words"

# ---- hints in the folder's family; a config of 10^8 layers -----------------------------------
"$PY" - "$tmp" "$src/tests/ref" <<'EOF2'
import json, sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
t = sys.argv[1]
m = ref.Llama(ref.Config(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=24, vocab_size=11,
                         arch="qwen2"))
ref.save_hf_folder(m, f"{t}/qwen_as_llama")
p = f"{t}/qwen_as_llama/config.json"
c = json.load(open(p)); c["model_type"] = "llama"; c["architectures"] = ["LlamaForCausalLM"]
json.dump(c, open(p, "w"))
EOF2
inspect 1 "$tmp/qwen_as_llama"
has_out "unexpected: model.layers.0.self_attn.q_proj.bias"
has_out "hint: the weights have q/k/v biases, as Qwen2's have, but config.json says llama (LlamaForCausalLM); a Qwen2 checkpoint needs model_type \"qwen2\""
cp -r "$tmp/tied" "$tmp/many_layers"
"$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['num_hidden_layers'] = 100000000; json.dump(c, open(p, 'w'))" "$tmp/many_layers"
run_rc 1 timeout 60 "$ft" inspect "$tmp/many_layers"
has_out "config.json: num_hidden_layers is 100000000, but the weights hold layers 0 to 1 only"
echo "ok: hints in the folder's family; 10^8 layers refused from the tensor names"

echo "PASS test_inspect_hf"
