#!/usr/bin/env bash
# ft export read by transformers itself (DESIGN.md §8): AutoTokenizer on the exported folder gives
# exactly the ids ft tokenize wrote, and generate stops at EOS.
#   a. A SentencePiece model trained here (scripts/make_corpus.py); documents with the awkward
#      cases (leading, trailing and repeated spaces, newlines, tabs, CRLF, digits, accents, CJK,
#      emoji, NFKC forms, control characters, empty documents, the special tokens' text) plus
#      generated stories, as JSONL and as text; ft tokenize; a short training on short documents
#      that end in EOS; ft export.
#   b. tests/ref/hf_tokenizer_check.py under transformers 5 (tokenizer only: it needs torch ≥ 2.6,
#      Debian has 1.13) and transformers 4.46 (the last line that runs Debian's torch 1.13):
#      every document's ids equal the shards'; greedy generate from two prompts ends with EOS.
#   c. The check can fail: without eos_token_id generate runs to max_new_tokens, and with
#      transformers' own LlamaTokenizer conversion the awkward documents differ.
#   d. A tokenizer.json (Qwen2.5-like) model folder: ft inspect says chat data works with it, and
#      its export keeps the original's bos_token_id (config.json) and pad_token
#      (tokenizer_config.json), which AutoTokenizer reads.
# The two virtual environments are made under BUILD_DIR once (pip from PyPI; --system-site-packages
# for Debian's torch, numpy, h5py and sentencepiece) and reused; without PyPI this test fails.
#   bash tests/cli/test_export_transformers.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
PY=/usr/bin/python3  # Debian's, with numpy, h5py, torch and sentencepiece (DESIGN.md §9)
check="$src/tests/ref/hf_tokenizer_check.py"
fail() { fail_showing_output "$@"; }

# protobuf: for part c, where transformers 5 converts tokenizer.model itself.
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
venv "$build/hf_venv_tf4" "${hf_tf4_spec[@]}"

# ---- a. tokenizer, documents, shards, a short training, the export --------------------------
"$PY" "$src/scripts/make_corpus.py" --out "$tmp/corpus.txt" --size-mb 0.3 \
  --tokenizer "$tmp/tok.model" --vocab-size 512 >/dev/null
"$PY" "$src/scripts/make_corpus.py" --out "$tmp/valid.txt" --size-mb 0.03 --seed 7 >/dev/null
"$PY" - "$tmp" <<'EOF'
import json, random, sys
t = sys.argv[1]
awkward = [
    "Hello world.", " leading space", "trailing space ", "two  spaces", "   three lead",
    "line one\nline two", "para\n\nbreak", "tab\there", "a\r\nb", "end with newline\n",
    "digits 12345 and 3.14", "ümlaut café naïve", "日本語のテキスト", "emoji 😀 ok",
    "ﬁ ligature ＡＢＣ fullwidth", "nbsp\u00a0here", "zero\u200bwidth", "ctrl\x07bell",
    "", " ", "\n", "<unk> <s> </s>", "x", "  many    spaces   inside  ",
    "The fox said, \"Hi!\" (quietly)",
]
stories = open(f"{t}/corpus.txt").read().split("\n\n")[:100]
# Short documents that end with a full stop: after a short training the model closes them with
# EOS, which is what generate must stop at.
rng = random.Random(0)
names = ["Tom", "Mia", "Sam", "Lily", "Ben", "Anna"]
verbs = ["saw a fox", "ate an apple", "ran home", "found a key", "liked the park"]
short = [f"{rng.choice(names)} {rng.choice(verbs)}." for _ in range(3000)]
with open(f"{t}/train.jsonl", "w") as f:
    for d in awkward + stories + short:
        f.write(json.dumps({"text": d}) + "\n")
EOF
run_rc 0 "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/train.jsonl" \
  --output "$tmp/train"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/valid.txt" --output "$tmp/valid"
cat > "$tmp/r.yaml" <<YAML
run: {name: tf, output_dir: $tmp/run, seed: 0}
model: {arch: llama, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 160,
        vocab_size: 512, max_seq_len: 64}
tokenizer: {path: $tmp/tok.model}
data: {train: $tmp/train, seq_len: 32, shuffle: true}
training: {steps: 150, micro_batch_size: 16, global_batch_size: 16, grad_clip: 1.0}
optimizer: {name: adamw, lr: 1.0e-2, weight_decay: 0.0}
scheduler: {name: cosine, warmup_steps: 10, min_lr: 1.0e-3}
checkpoint: {every_steps: 150}
logging: {every_steps: 50}
runtime: {threads: 2}
YAML
run_rc 0 "$ft" train "$tmp/r.yaml"
run_rc 0 "$ft" export "$tmp/run/checkpoints" --output "$tmp/out"
has_out "wrote config.json (torch_dtype float32, bos_token_id 1, eos_token_id 2)"
has_out "wrote generation_config.json"
has_out "wrote tokenizer.json, tokenizer_config.json, special_tokens_map.json"
"$PY" - "$tmp/out" <<'EOF' || fail "exported tokenizer files"
import json, os, sys
d = sys.argv[1]
names = sorted(os.listdir(d))
assert names == ["config.json", "generation_config.json", "model.safetensors",
                 "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                 "tokenizer_config.json"], names
c = json.load(open(f"{d}/config.json"))
assert (c["bos_token_id"], c["eos_token_id"]) == (1, 2) and "pad_token_id" not in c, c
g = json.load(open(f"{d}/generation_config.json"))
assert g == {"bos_token_id": 1, "eos_token_id": 2}, g
s = json.load(open(f"{d}/special_tokens_map.json"))
assert s == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, s
tc = json.load(open(f"{d}/tokenizer_config.json"))
assert tc["tokenizer_class"] == "PreTrainedTokenizerFast" and tc["add_bos_token"] is True
assert tc["add_eos_token"] is False and tc["split_special_tokens"] is True, tc
EOF
# The extra files do not upset ft's own reading of the folder (model.from).
run_rc 0 "$ft" inspect "$tmp/out"
has_out "compatible with ft: yes"
echo "ok: a. export writes the tokenizer files and the special ids"

# ---- b. transformers 5 and 4 read it as ft does ----------------------------------------------
tf5="$build/hf_venv_tf5/bin/python" tf4="$build/hf_venv_tf4/bin/python"
run_rc 0 "$tf5" "$check" "$tmp/out" --shards "$tmp/train" --docs "$tmp/train.jsonl"
has_out "transformers 5.23.0"
has_out "gives ft's ids for all 3125 documents"
run_rc 0 "$tf5" "$check" "$tmp/out" --shards "$tmp/valid" --docs "$tmp/valid.txt"
has_out "gives ft's ids for all"
run_rc 0 "$tf4" "$check" "$tmp/out" --shards "$tmp/train" --docs "$tmp/train.jsonl" \
  --prompt "Tom ran" --prompt "Mia" --max-new-tokens 20 --require-generate
has_out "transformers 4.46.3"
has_out "gives ft's ids for all 3125 documents"
grep -Eq "^ok: generate 'Tom ran' -> 'Tom [a-z ]+\\.', stopped at EOS after [0-9]+ tokens$" \
  "$tmp/out.txt" || fail "generate from 'Tom ran' did not end a sentence with EOS"
has_out "ok: generate 'Mia'"
cat "$tmp/out.txt" | grep '^ok: generate'
echo "ok: b. transformers 5.23.0 and 4.46.3 tokenize as ft; generate stops at EOS"

# ---- c. the check fails where it should ------------------------------------------------------
cp -r "$tmp/out" "$tmp/no_eos"
"$PY" - "$tmp/no_eos" <<'EOF'
import json, sys
for name in ("config.json", "generation_config.json"):
    p = f"{sys.argv[1]}/{name}"
    j = json.load(open(p)); j.pop("eos_token_id"); json.dump(j, open(p, "w"))
EOF
# config.json without eos_token_id is refused first; with it back, generate runs on.
run_rc 1 "$tf4" "$check" "$tmp/no_eos" --shards "$tmp/train" --docs "$tmp/train.jsonl"
grep -qF "config.json eos_token_id None" "$tmp/err.txt" "$tmp/out.txt" || fail "no eos refusal"
cp "$tmp/out/config.json" "$tmp/no_eos/config.json"
run_rc 1 "$tf4" "$check" "$tmp/no_eos" --shards "$tmp/train" --docs "$tmp/train.jsonl" \
  --prompt "Tom ran" --max-new-tokens 20 --require-generate
grep -qF "did not stop at EOS" "$tmp/err.txt" "$tmp/out.txt" || \
  grep -qF "generation_config eos_token_id None" "$tmp/err.txt" "$tmp/out.txt" || \
  fail "generate without eos_token_id was not caught"
# transformers' own conversion of tokenizer.model (LlamaTokenizer, no tokenizer.json) drops
# SentencePiece's normalization: the awkward documents come out differently.
cp -r "$tmp/out" "$tmp/llama_tok"
rm "$tmp/llama_tok/tokenizer.json"
"$PY" - "$tmp/llama_tok/tokenizer_config.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1])); j["tokenizer_class"] = "LlamaTokenizer"; j["legacy"] = False
json.dump(j, open(sys.argv[1], "w"))
EOF
# The pure-Python protobuf: Debian's sentencepiece_model_pb2 predates the protobuf 4+ C runtime.
run_rc 1 env PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \
  "$tf5" "$check" "$tmp/llama_tok" --shards "$tmp/train" --docs "$tmp/train.jsonl"
grep -qF "FAIL: document" "$tmp/err.txt" "$tmp/out.txt" ||
  fail "LlamaTokenizer conversion not caught"
echo "ok: c. missing eos_token_id and transformers' own conversion are caught"

# ---- d. a tokenizer.json model keeps the original's special tokens -------------------------
# A Qwen2.5-like folder: a byte-level BPE tokenizer.json that adds no BOS, tokenizer_config.json
# with the Qwen2.5 chat template, eos_token <|im_end|> and pad_token <|endoftext|>, config.json
# with bos_token_id <|endoftext|> (as Qwen2.5's 151643) and generation_config.json. ft inspect
# says chat data works with it; model.from it, export, and the export's config.json has the
# original's bos_token_id and its tokenizer_config.json the original's pad_token (both were lost).
"$tf5" - "$src" "$tmp/qwen" <<'EOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests", "ref"))
from tiny_bpe import train_tiny_bpe
import llama_ref as ref
tok = train_tiny_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
os.makedirs(out)
tok.save(os.path.join(out, "tokenizer.json"))
template = open(os.path.join(src, "tests/data/chat_templates/qwen2_5_instruct.jinja")).read()
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template},
          open(os.path.join(out, "tokenizer_config.json"), "w"))
m = ref.Llama(ref.Config(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                         vocab_size=tok.get_vocab_size(), max_seq_len=128, arch="qwen2"))
ref.save_hf_folder(m, out)
c = json.load(open(os.path.join(out, "config.json")))
c.update(bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|im_end|>"))
json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=1)
json.dump({"bos_token_id": c["bos_token_id"], "pad_token_id": c["bos_token_id"],
           "eos_token_id": [c["eos_token_id"], c["bos_token_id"]]},
          open(os.path.join(out, "generation_config.json"), "w"))
with open(os.path.join(os.path.dirname(out), "chat.jsonl"), "w") as f:
    for i in range(16):
        f.write(json.dumps({"messages": [{"role": "user", "content": "the fox said hello"},
                                         {"role": "assistant", "content": "hello world"}]}) + "\n")
EOF
run_rc 0 "$ft" inspect "$tmp/qwen"
has_out "tokenizer:     tokenizer.json (byte-level BPE), 300 ids, BOS none, EOS none"
has_out "chat template: tokenizer_config.json's chat_template: ft's Jinja subset renders it; end of turn \"<|im_end|>\" (id 2)"
has_out "chat data:     yes: ft tokenize --format chat --tokenizer $tmp/qwen"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/qwen" --format chat --input "$tmp/chat.jsonl" \
  --output "$tmp/qwen_shards"
cat > "$tmp/q.yaml" <<YAML
run: {name: q, output_dir: $tmp/run_q, seed: 0}
model: {from: $tmp/qwen}
tokenizer: {path: $tmp/qwen}
data: {train: $tmp/qwen_shards, seq_len: 32}
training: {steps: 0, micro_batch_size: 2, global_batch_size: 2}
checkpoint: {every_steps: 1}
runtime: {threads: 2}
YAML
run_rc 0 "$ft" train "$tmp/q.yaml"
run_rc 0 "$ft" export "$tmp/run_q/checkpoints" --output "$tmp/qwen_out"
has_out "wrote config.json (torch_dtype float32, bos_token_id 0, eos_token_id 2, pad_token_id 0)"
run_rc 0 "$tf5" - "$tmp/qwen" "$tmp/qwen_out" <<'EOF'
import json, sys
from transformers import AutoTokenizer
orig, out = sys.argv[1], sys.argv[2]
co, ce = (json.load(open(f"{d}/config.json")) for d in (orig, out))
to, te = (json.load(open(f"{d}/tokenizer_config.json")) for d in (orig, out))
assert ce["bos_token_id"] == co["bos_token_id"], (ce.get("bos_token_id"), co["bos_token_id"])
assert ce["eos_token_id"] == co["eos_token_id"], (ce.get("eos_token_id"), co["eos_token_id"])
assert te.get("pad_token") == to["pad_token"], (te.get("pad_token"), to["pad_token"])
assert te["bos_token"] is None and te["eos_token"] == to["eos_token"], te
tok = AutoTokenizer.from_pretrained(out)
assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == co["bos_token_id"], tok
assert tok.bos_token is None and tok.eos_token == "<|im_end|>", tok
print("ok: the export keeps the original's bos_token_id", ce["bos_token_id"], "and pad_token",
      te["pad_token"], "(AutoTokenizer agrees)")
EOF
cat "$tmp/out.txt"
# A checkpoint whose tokenizer_config.json is a FIFO: damaged (exit 1), refused at once.
cp -r "$tmp/run_q/checkpoints" "$tmp/q_fifo"
rm "$tmp/q_fifo/step_00000000/tokenizer_config.json"
mkfifo "$tmp/q_fifo/step_00000000/tokenizer_config.json"
run_rc 1 timeout 20 "$ft" export "$tmp/q_fifo" --output "$tmp/q_fifo_out"
has_err "tokenizer_config.json: is a FIFO (named pipe), not a regular file; the checkpoint is damaged"
echo "ok: d. a tokenizer.json model keeps the original's bos_token_id and pad_token"

echo "test_export_transformers: all checks passed"
