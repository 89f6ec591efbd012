#!/usr/bin/env bash
# Time of `ft tokenize --format chat` on one long conversation per file, for each committed chat
# template (tests/data/chat_templates), with masks (the rule of DESIGN.md §6 "Chat data") and
# with --train-on-prompt (one rendering, no masks) beside it. A benchmark that prints seconds, not
# a test: machines are shared and noisy (the deterministic bound is the unit test "render_varied's
# work on a 10000-turn conversation").
#   scripts/bench_chat_mask.sh [TURNS...]        # default: 1000 3000 10000
# A turn is one message (user and assistant alternate after a system prompt), ~80 bytes each;
# every fifth answer holds a think block (Qwen3 strips them from earlier turns, so the template
# decides on those contents: their masks are rendered in full).
# Environment: BUILD_DIR (default build), FT (the ft binary to time, default $BUILD_DIR/ft: an
# older build, say), THREADS (default 1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"
ft="${FT:-$build/ft}"
threads="${THREADS:-1}"
turns=("$@")
((${#turns[@]})) || turns=(1000 3000 10000)
tmp=$(mktemp -d /tmp/ft_bench_chat_mask.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# A byte-level BPE tokenizer.json (256 bytes, NFC, the templates' special tokens) and one folder
# per template, then the conversations.
/usr/bin/python3 - "$tmp" "${turns[@]}" <<'PY'
import json, os, random, sys
t, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
def byte_level(b):
    printable = lambda c: 0x21 <= c <= 0x7E or 0xA1 <= c <= 0xAC or c >= 0xAE
    if printable(b): return chr(b)
    return chr(256 + sum(1 for c in range(b) if not printable(c)))
vocab = {byte_level(b): b for b in range(256)}
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "[INST]",
           "[/INST]"]
added = [{"id": 256 + i, "content": s, "special": True, "lstrip": False, "rstrip": False,
          "single_word": False, "normalized": False} for i, s in enumerate(special)]
added += [{"id": 256 + len(special) + i, "content": s, "special": False, "lstrip": False,
           "rstrip": False, "single_word": False, "normalized": False}
          for i, s in enumerate(["<think>", "</think>"])]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
       "normalizer": {"type": "NFC"},
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                         "use_regex": True},
       "post_processor": None, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                 "ignore_merges": False, "vocab": vocab, "merges": []}}
for name in ["llama3_instruct", "llama3_1_instruct", "qwen2_5_instruct", "qwen3",
             "mistral_instruct_v0_3"]:
    d = f"{t}/{name}"
    os.makedirs(d)
    json.dump(tok, open(f"{d}/tokenizer.json", "w"))
    template = open(f"tests/data/chat_templates/{name}.jinja", encoding="utf-8").read()
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template},
              open(f"{d}/tokenizer_config.json", "w"))
rng = random.Random(0)
words = "the a model answer question data token mask turn rule linear time of each".split()
for n in sizes:
    msgs = [{"role": "system", "content": "You are brief."}]
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(12))
        if i % 2 == 0:
            msgs.append({"role": "user", "content": f"Question {i}: {text}?"})
        else:
            think = "<think>\nfirst this, then that\n</think>\n\n" if i % 10 == 9 else ""
            msgs.append({"role": "assistant", "content": think + f"Answer {i}: {text}."})
    with open(f"{t}/conv_{n}.jsonl", "w") as f:
        f.write(json.dumps({"messages": msgs}) + "\n")
PY

# Seconds: ft's own "tokenizing" time (reading, rendering, masks, encoding, writing; not the
# process start or the loading of the tokenizer and template; a build from before this summary
# prints one time, loading included, which is taken instead).
seconds() {
  "$ft" tokenize --tokenizer "$tmp/$1" --input "$2" --format chat --threads "$threads" "${@:3}" \
    --output "$tmp/out" 2>/dev/null |
    sed -n -e 's/.*tokenizing \([0-9.]*\) s.*/\1/p' -e 's/.* (\([0-9.]*\) s, [0-9]* tokens\/s)$/\1/p'
  rm -rf "$tmp/out"
}
printf '%-24s %7s %8s %10s %18s\n' template turns KB masks_s train_on_prompt_s
for name in llama3_instruct llama3_1_instruct qwen2_5_instruct qwen3 mistral_instruct_v0_3; do
  for n in "${turns[@]}"; do
    in="$tmp/conv_$n.jsonl"
    masks=$(seconds "$name" "$in")
    [[ -n $masks ]] || { echo "$name $n: ft tokenize failed" >&2; exit 1; }
    printf '%-24s %7d %8d %10s %18s\n' "$name" "$n" $(($(stat -c %s "$in") / 1024)) "$masks" \
      "$(seconds "$name" "$in" --train-on-prompt)"
  done
done
