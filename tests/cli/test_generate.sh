#!/usr/bin/env bash
# ft generate (DESIGN.md §2): tests/ref/generate_parity.py under transformers 4.46.3 — greedy
# ids equal transformers' generate for 32 tokens in fp32 on llama, qwen2 (tied) and mistral
# (qwen3: against llama_ref's greedy loop, transformers 4.46 has no Qwen3; against
# Qwen3ForCausalLM's generate: test_qwen3_transformers.sh), on the CPU and on
# ft_emu (emulated CUDA) when built; EOS and the chat template's end of turn; --chat prompt ids;
# seeded sampling; a checkpoint of ft train as the source. Then the errors of the command line.
#   bash tests/cli/test_generate.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }

venv "$build/hf_venv_tf4" "${hf_tf4_spec[@]}"
run_rc 0 "$build/hf_venv_tf4/bin/python" "$src/tests/ref/generate_parity.py" "$build" "$src" "$tmp"
has_out "generate_parity: all checks passed"
grep "^ok: " "$tmp/out.txt"
# --chat's prompt ids against apply_chat_template under transformers 5 (4.46's needs jinja2).
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
"$build/hf_venv_tf5/bin/python" - "$tmp" <<'EOF' || fail "--chat prompt ids"
import json, sys
from transformers import AutoTokenizer
t = sys.argv[1]
got = json.load(open(f"{t}/chat_prompt_ids.json"))
want = AutoTokenizer.from_pretrained(f"{t}/tok").apply_chat_template(
    [{"role": "user", "content": got["prompt"]}], add_generation_prompt=True, tokenize=True)
want = want["input_ids"] if hasattr(want, "keys") else want
assert got["ids"] == list(want), (got["ids"], want)
print("ok: --chat: prompt ids are apply_chat_template's (transformers 5)")
EOF
[[ -x $emu ]] || echo "test_generate: ft_emu not built, the emulated CUDA runs were skipped"
[[ ! -x $emu ]] || has_out "llama: greedy 32 tokens on ft_emu (emulated CUDA) equal"

# ---- errors: exit 2 and a message naming the problem -----------------------------------------
run_rc 2 "$ft" generate "$tmp/nowhere" -p hi
has_err "$tmp/nowhere: no such file or folder"
mkdir "$tmp/empty"
run_rc 2 "$ft" generate "$tmp/empty" -p hi
has_err "neither a Hugging Face model folder (no config.json) nor an ft checkpoint"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --no-such-flag
has_err "--no-such-flag"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --top-p 1.5
has_err "--top-p"
run_rc 2 "$ft" generate "$tmp/llama"
has_err "--prompt is required"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --system "be brief"
has_err "--system needs --chat"
# A checkpoint keeps its tokenizer folder's chat template (its tokenizer_config.json here); one
# whose folder had none refuses --chat without --tokenizer.
run_rc 0 "$ft" generate "$tmp/run/checkpoints" -p hi --chat --max-new-tokens 2
cp -r "$tmp/run/checkpoints" "$tmp/no_template"
rm "$tmp"/no_template/step_*/tokenizer_config.json
run_rc 2 "$ft" generate "$tmp/no_template" -p hi --chat
has_err "--chat: a checkpoint holds no chat template; give --tokenizer"
run_rc 2 "$ft" generate "$tmp/llama" -p "" --no-bos
has_err "the prompt has no tokens"
# Numeric flags: a documented range each; NaN and infinities refused; a short message quoting the
# value (CLI11's own range check printed DBL_MAX's 309 digits; NaN ran, choosing token 0).
short_err() {  # the message is one short line, not the value's or DBL_MAX's digits
  (( $(head -1 "$tmp/err.txt" | wc -c) < 160 )) || fail "a long message: $(head -c 300 "$tmp/err.txt")"
}
for t in nan NaN inf -inf; do
  run_rc 2 "$ft" generate "$tmp/llama" -p hi --temperature="$t"
  has_err "--temperature: \"$t\" is not a finite number"
  short_err
done
for t in -1 1e999 100.5; do
  run_rc 2 "$ft" generate "$tmp/llama" -p hi --temperature="$t"
  has_err "--temperature: \"$t\" is out of range: must be in [0, 100]"
  short_err
done
run_rc 2 "$ft" generate "$tmp/llama" -p hi --temperature "$(printf 'x%.0s' {1..5000})"
has_err "is not a number"
short_err
run_rc 2 "$ft" generate "$tmp/llama" -p hi --top-p nan
has_err "--top-p: \"nan\" is not a finite number"
for p in 0 1.5; do
  run_rc 2 "$ft" generate "$tmp/llama" -p hi --top-p "$p"
  has_err "--top-p: \"$p\" is out of range: must be in (0, 1]"
done
run_rc 2 "$ft" generate "$tmp/llama" -p hi --max-new-tokens 0
has_err "--max-new-tokens: \"0\" is out of range: must be in [1, 16777216]"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --max-new-tokens 1e3
has_err "--max-new-tokens: \"1e3\" is not a whole number"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --seed=-1
has_err "--seed: \"-1\" is out of range: must be in [0, 18446744073709551615]"
run_rc 2 "$ft" generate "$tmp/llama" -p hi --dtype "$(printf 'y%.0s' {1..5000})"
has_err "is not one of f32, bf16, f16"
short_err
run_rc 0 "$ft" help generate
has_out "--temperature FLOAT:NUMBER in [0, 100]"
echo "ok: numeric flags: ranges, NaN and infinities refused, short messages"

# A checkpoint dir whose `latest` names a step folder that is gone: said so, with what to give.
cp -r "$tmp/run/checkpoints" "$tmp/stale"
echo step_00000099 > "$tmp/stale/latest"
run_rc 2 "$ft" generate "$tmp/stale" -p hi
has_err "$tmp/stale/latest names step_00000099, which is not there"
has_err "give a step folder instead: $tmp/stale/step_"
grep -q -i tokenizer "$tmp/err.txt" && fail "a missing step folder reported as a tokenizer problem"
rm "$tmp/stale/latest"
mkfifo "$tmp/stale/latest"
run_rc 2 timeout 20 "$ft" generate "$tmp/stale" -p hi
has_err "$tmp/stale/latest: is a FIFO (named pipe), not a regular file"
echo "ok: latest naming a missing step folder; latest a FIFO"

# --device: generate's own words (make_device spoke of runtime.device and training).
rc=0
"$ft" generate "$tmp/llama" -p hi -n 2 --device cuda > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
if [[ $rc != 0 ]]; then
  [[ $rc == 1 || $rc == 2 ]] || fail "--device cuda without a GPU exited $rc"
  has_err "--device cuda: "
  has_err "use --device cpu (or auto)"
fi
run_rc 0 "$ft" generate "$tmp/llama" -p hi -n 2
for words in runtime.device "to train" "training on"; do
  grep -qF "$words" "$tmp/err.txt" && fail "generate's messages speak of $words"
done
# A cache that cannot be allocated: generate's words (the allocator's spoke of micro_batch_size).
if ! sanitizer_build; then  # ASan reserves terabytes of address space: no ulimit -v there
  rm -rf "$tmp/long"; cp -r "$tmp/llama" "$tmp/long"
  /usr/bin/python3 -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['max_position_embeddings'] = 2147483647; json.dump(c, open(p, 'w'))" \
    "$tmp/long"
  rc=0
  (ulimit -v 2000000; exec "$ft" generate "$tmp/long" -p hi -n 16000000) \
    > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
  [[ $rc == 1 ]] || fail "a 16M-position cache under a 2 GB limit exited $rc"
  has_err "cannot hold the KV cache and activations of 1600000"
  has_err "; give a smaller --max-new-tokens"
  grep -qF micro_batch_size "$tmp/err.txt" && fail "generate's message speaks of micro_batch_size"
fi
echo "ok: --device messages in generate's words"

# Files checked before they are read: a FIFO or /dev/zero is refused at once (exit 2), a broken
# file in words (no library code).
for f in config.json generation_config.json model.safetensors; do
  for kind in fifo zero; do
    rm -rf "$tmp/bad"; cp -r "$tmp/llama" "$tmp/bad"; rm -f "$tmp/bad/$f"
    if [[ $kind == fifo ]]; then mkfifo "$tmp/bad/$f"; else ln -s /dev/zero "$tmp/bad/$f"; fi
    run_rc 2 timeout 20 "$ft" generate "$tmp/bad" -p hi -n 2
    has_err "$tmp/bad/$f"
    has_err "$([[ $kind == fifo ]] && echo "is a FIFO (named pipe)" || echo "is a character device"), not a regular file"
  done
done
mkfifo "$tmp/tok_fifo"
for t in /dev/zero "$tmp/tok_fifo"; do  # the tokenizer libraries would block or read for ever
  run_rc 2 timeout 20 "$ft" generate "$tmp/llama" -p hi -n 2 --tokenizer "$t"
  has_err "tokenizer $t: is a"
done
rm -rf "$tmp/bad"; cp -r "$tmp/llama" "$tmp/bad"
rm "$tmp/bad/tokenizer_config.json"; mkfifo "$tmp/bad/tokenizer_config.json"
run_rc 2 timeout 20 "$ft" generate "$tmp/bad" -p hi -n 2 --chat
has_err "tokenizer config $tmp/bad/tokenizer_config.json: is a FIFO (named pipe)"
rm -rf "$tmp/bad"; cp -r "$tmp/llama" "$tmp/bad"
printf '{"eos_token_id": [1, ' > "$tmp/bad/generation_config.json"
run_rc 2 "$ft" generate "$tmp/bad" -p hi -n 2
has_err "$tmp/bad/generation_config.json: not valid JSON (parse error at line 1, column"
grep -qF "json.exception" "$tmp/err.txt" && fail "a library's error code in the message"
echo '{"eos_token_id": "two"}' > "$tmp/bad/generation_config.json"
run_rc 2 "$ft" generate "$tmp/bad" -p hi -n 2
has_err "eos_token_id: expected a token id"
echo "ok: config.json, generation_config.json, model.safetensors: FIFO, /dev/zero, broken JSON"

# NaN weights: refused as they are read, naming the tensor and the file (exit 2), not generated
# from (every choice was token 0).
rm -rf "$tmp/nan"; cp -r "$tmp/llama" "$tmp/nan"
/usr/bin/python3 - "$tmp/nan/model.safetensors" "$src/tests/ref" <<'EOF2'
import sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
t = ref.read_safetensors(sys.argv[1])
t["model.layers.1.mlp.down_proj.weight"][7, 3] = float("nan")
ref.write_safetensors(sys.argv[1], t)
EOF2
run_rc 2 "$ft" generate "$tmp/nan" -p hi -n 2
has_err "tensor 'model.layers.1.mlp.down_proj.weight' in '$tmp/nan/model.safetensors' holds NaN at [7, 3]"
echo "ok: NaN weights refused naming the tensor"

# Hints in the folder's family: Qwen2 weights under a Llama config; a Mistral folder that lacks a
# tensor is called a Mistral checkpoint, not a Llama one.
rm -rf "$tmp/relabelled"; cp -r "$tmp/qwen2" "$tmp/relabelled"
/usr/bin/python3 -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p)); c['model_type'] = 'llama'; c['architectures'] = ['LlamaForCausalLM']
json.dump(c, open(p, 'w'))" "$tmp/relabelled"
run_rc 2 "$ft" generate "$tmp/relabelled" -p hi -n 2
has_err "hint: the weights have q/k/v biases, as Qwen2's have, but config.json says llama"
rm -rf "$tmp/mistral_cut"; cp -r "$tmp/mistral" "$tmp/mistral_cut"
/usr/bin/python3 - "$tmp/mistral_cut/model.safetensors" "$src/tests/ref" <<'EOF2'
import sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
t = ref.read_safetensors(sys.argv[1])
del t["model.layers.0.mlp.up_proj.weight"]
ref.write_safetensors(sys.argv[1], t)
EOF2
run_rc 2 "$ft" generate "$tmp/mistral_cut" -p hi -n 2
has_err "missing 1 tensor(s): model.layers.0.mlp.up_proj.weight"
has_err "is this a MistralForCausalLM checkpoint (config.json: model_type \"mistral\")"
grep -qF "LlamaForCausalLM" "$tmp/err.txt" && fail "a Llama hint on a Mistral folder"
echo "ok: hints in the folder's family"

run_rc 0 "$ft" help
grep -q "^  generate " "$tmp/out.txt" || fail "ft help does not list generate"
run_rc 0 "$ft" help generate
has_out "--max-new-tokens"
echo "ok: missing and empty folders, bad flags, --system without --chat, --chat on checkpoints; ft help"
echo "test_generate: all checks passed"
