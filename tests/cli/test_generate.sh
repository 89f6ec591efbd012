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

venv "$build/hf_venv_tf4" "transformers==4.46.3"
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
run_rc 0 "$ft" help
grep -q "^  generate " "$tmp/out.txt" || fail "ft help does not list generate"
run_rc 0 "$ft" help generate
has_out "--max-new-tokens"
echo "ok: missing and empty folders, bad flags, --system without --chat, --chat on checkpoints; ft help"
echo "test_generate: all checks passed"
