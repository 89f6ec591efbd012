#!/usr/bin/env bash
# ft tokenize --format chat / alpaca (lib/data/chat.cpp, lib/data/jinja*.cpp) against
# transformers' apply_chat_template, on the chat templates of Llama 3 and 3.1 Instruct, Qwen2.5
# Instruct, Qwen3 and Mistral Instruct v0.3 committed in tests/data/chat_templates (no download).
#   a. A byte-level BPE tokenizer trained here with `tokenizers` (the families' special tokens
#      added as special tokens, <think> and </think> as plain added tokens), written into one HF
#      folder per template: tokenizer.json (with an NFC normalizer for the Qwen families, as
#      Qwen2.5's own has) + tokenizer_config.json (bos/eos as each family has them; Mistral's as
#      {"content": ...} objects, Qwen3's template as chat_template.jinja).
#   b. Multi-turn conversations (system prompts, empty turns, whitespace at the edges, unicode,
#      text NFC changes in system, user and assistant turns and at a content's edges, a think
#      block, ShareGPT form, 30 random ones of awkward pieces; tool turns for the templates that
#      take them) through ft tokenize --format chat, and instruction records through --format
#      alpaca: every document's tokens equal apply_chat_template(tokenize=True) and its
#      loss_mask equals the mask rule of DESIGN.md §6 computed from transformers' renderings
#      (tokenize=False) and tokens with their offsets (return_offsets_mapping, characters to
#      bytes); --train-on-prompt writes the same tokens and no loss_mask; invalid UTF-8 in a
#      record is U+FFFD; plain text through the Qwen2.5 folder (no EOS in its tokenizer.json)
#      ends each document with tokenizer_config.json's eos_token; 3 training steps on the chat
#      shards.
#   c. Input errors (exit 2): not JSON, no messages, an unknown role, a non-string content,
#      tool_calls (file:line and the key), a template that raises, a template outside the
#      subset (the construct), an unclosed block (its line), no chat template, a template that
#      is a FIFO, a SentencePiece tokenizer, files with no assistant content to train on (and
#      --allow-no-trainable, which keeps them with a warning).
#   bash tests/cli/test_chat_data.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
PY="$build/hf_venv_tf5/bin/python"
templates="$src/tests/data/chat_templates"
families=(llama3 llama3_1 qwen2_5 qwen3 mistral)

# ---- a: the tokenizer folders, and the data --------------------------------------------------
"$PY" - "$tmp" "$templates" <<'EOF'
import json, os, random, sys
from tokenizers import (Tokenizer, AddedToken, Regex, decoders, models, normalizers,
                        pre_tokenizers, trainers)
t, templates = sys.argv[1], sys.argv[2]
rng = random.Random(0)
words = ["the", "fox", "said", "hello", "answer", "question", "brief", "assistant", "user",
         "system", "think", "world", "café", "日本語", "😀", "naïve"]
text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(2000)]
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "[INST]",
           "[/INST]"]
tok.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=600, show_progress=False, special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.add_tokens([AddedToken("<think>", normalized=False, special=False),
                AddedToken("</think>", normalized=False, special=False)])
open(f"{t}/vocab_size", "w").write(str(tok.get_vocab_size(with_added_tokens=True)))
configs = {
    "llama3": ("llama3_instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("llama3_1_instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("qwen2_5_instruct.jinja", None, "<|im_end|>"),
    "qwen3": ("qwen3.jinja", None, "<|im_end|>"),
    "mistral": ("mistral_instruct_v0_3.jinja", "<s>", "</s>"),
}
for name, (file, bos, eos) in configs.items():
    d = f"{t}/{name}"
    os.makedirs(d)
    # Qwen2.5's and Qwen3's own tokenizer.json normalize to NFC; Llama 3's and this Mistral's
    # have no normalizer.
    tok.normalizer = normalizers.NFC() if name.startswith("qwen") else None
    tok.save(f"{d}/tokenizer.json")
    template = open(f"{templates}/{file}", encoding="utf-8").read()
    obj = (lambda s: {"__type": "AddedToken", "content": s, "lstrip": False, "rstrip": False,
                      "normalized": False, "single_word": False, "special": True}
           ) if name == "mistral" else (lambda s: s)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": obj(bos) if bos else None,
           "eos_token": obj(eos), "model_max_length": 1 << 20}
    if name == "qwen3":
        open(f"{d}/chat_template.jinja", "w", encoding="utf-8").write(template)
    else:
        cfg["chat_template"] = template
    json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"), ensure_ascii=False, indent=1)

U, A, S = "user", "assistant", "system"
def conv(*turns): return {"messages": [{"role": r, "content": c} for r, c in turns]}
chats = [
    conv((U, "Hello there"), (A, "Hi! How can I help?")),
    conv((S, "You are brief."), (U, "What is 2+2?"), (A, "4."), (U, "And 3+3?"), (A, "6.")),
    conv((S, "  Spaces around the system prompt  "), (U, " leading space"), (A, " Sure. "),
         (U, "trailing newline\n"), (A, "\nnewline first\n\nand a blank line")),
    conv((U, ""), (A, "An empty question gets this."), (U, "and an empty answer:"), (A, "")),
    conv((U, "日本語のテキスト、😀👍🏽 and e\u0301 café"), (A, "Réponse: naïve 中文 🇫🇷 ok")),
    conv((U, "think first"), (A, "<think>\nsome reasoning\n</think>\n\nthe answer"),
         (U, "again"), (A, "<think>more</think>final")),
    # Text NFC changes ("e" + U+0301 -> "é") in every role, and at the edges of the contents.
    conv((S, "Cafe\u0301 system"), (U, "Cafe\u0301?"), (A, "Re\u0301ponse: e\u0301te\u0301 cafe\u0301")),
    conv((U, "e\u0301"), (A, "\u0301 starts with a combining mark"), (U, "A\u030a"),
         (A, "ends with e\u0301"), (U, "x"), (A, "e\u0301")),
    {"conversations": [{"from": "system", "value": "ShareGPT system"},
                       {"from": "human", "value": "a ShareGPT question"},
                       {"from": "gpt", "value": "a ShareGPT answer"},
                       {"from": "human", "value": "second"}, {"from": "gpt", "value": "two"}]},
]
# And random conversations of awkward pieces (special-token text inside contents included),
# alternating user/assistant after an optional system prompt, as every template accepts.
pieces = ["a", " ", "  ", "\n", "\n\n", "\t", "word", " word", "日本", "😀", "e\u0301", "é",
          "<think>", "</think>", "<|im_end|>", "<|eot_id|>", "</s>", "[INST]", "{{ x }}", "'",
          '"', "\\", "\u00a0", "\u3000", "1", "234"]
def text(): return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
for _ in range(30):
    turns = [(S, text())] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        turns += [(U, text()), (A, text())]
    chats.append(conv(*turns))
with open(f"{t}/chat.jsonl", "w") as f:
    for c in chats: f.write(json.dumps(c, ensure_ascii=False) + "\n")
    f.write("\n")  # a blank line is skipped
tools = [
    conv((U, "What is the weather?"), (A, "Let me look."), ("tool", '{"temp": 21}'),
         (A, "It is 21 degrees.")),
    conv((S, "sys"), (U, "q"), (A, "calling"), ("tool", "result one"), ("tool", "result two"),
         (A, "done"), (U, "thanks"), (A, "welcome")),
]
with open(f"{t}/tool.jsonl", "w") as f:
    for c in tools: f.write(json.dumps(c, ensure_ascii=False) + "\n")
alpaca = [{"instruction": "Translate to French", "input": "good morning", "output": "bonjour"},
          {"instruction": "Say hi", "input": "", "output": "hi 😀"},
          {"instruction": "No input key", "output": " spaced "}]
with open(f"{t}/alpaca.jsonl", "w") as f:
    for a in alpaca: f.write(json.dumps(a, ensure_ascii=False) + "\n")
EOF
[[ -f "$tmp/chat.jsonl" ]] || fail "the test's setup (above) failed"

# ---- b: ft against transformers ------------------------------------------------------------
for f in "${families[@]}"; do
  "$ft" tokenize --tokenizer "$tmp/$f" --input "$tmp/chat.jsonl" --format chat \
    --output "$tmp/chat_$f" --threads 2 > /dev/null || fail "ft tokenize --format chat, $f"
  "$ft" tokenize --tokenizer "$tmp/$f/tokenizer.json" --input "$tmp/alpaca.jsonl" \
    --format alpaca --output "$tmp/alpaca_$f" --threads 1 > /dev/null ||
    fail "ft tokenize --format alpaca, $f"
  [[ $f == mistral ]] && continue  # its template takes tool results only with tool-call ids
  "$ft" tokenize --tokenizer "$tmp/$f" --input "$tmp/tool.jsonl" --format chat \
    --output "$tmp/tool_$f" > /dev/null || fail "ft tokenize --format chat, tool turns, $f"
done
"$ft" tokenize --tokenizer "$tmp/qwen3" --input "$tmp/chat.jsonl" --format chat \
  --train-on-prompt --output "$tmp/all_qwen3" > /dev/null || fail "--train-on-prompt"
# Invalid UTF-8 in a record (its contents): each maximal invalid subpart is U+FFFD, the same
# tokens and mask as the record with U+FFFD written out.
printf '{"messages": [{"role": "user", "content": "caf\xc3 q"}, {"role": "assistant", "content": "a\xe2\x82 \xff\xfe b"}]}\n' \
  > "$tmp/invalid.jsonl"
printf '{"messages": [{"role": "user", "content": "caf\xef\xbf\xbd q"}, {"role": "assistant", "content": "a\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd b"}]}\n' \
  > "$tmp/replaced.jsonl"
for f in invalid replaced; do
  "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/$f.jsonl" --format chat \
    --output "$tmp/utf8_$f" > /dev/null || fail "ft tokenize --format chat, $f.jsonl"
done
"$PY" - "$tmp" <<'EOF' || fail "invalid UTF-8 in a chat record should tokenize as U+FFFD"
import sys, h5py
t = sys.argv[1]
a, b = (h5py.File(f"{t}/utf8_{n}/shard_00000.h5") for n in ("invalid", "replaced"))
assert a["tokens"][:].tolist() == b["tokens"][:].tolist()
assert a["loss_mask"][:].tolist() == b["loss_mask"][:].tolist() and sum(a["loss_mask"][:]) > 0
EOF
# Plain text through a folder whose tokenizer.json has no EOS (Qwen2's) ends each document with
# tokenizer_config.json's eos_token.
printf '%s\n' '{"text": "plain text"}' > "$tmp/plain.jsonl"
"$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/plain.jsonl" --output "$tmp/plain_qwen" \
  > /dev/null || fail "ft tokenize of text with the qwen2_5 folder"

"$PY" - "$tmp" "$src/tests/cli" <<'EOF' || fail "ft's chat tokens or masks differ from transformers' (above)"
import json, sys
import h5py
from transformers import AutoTokenizer
t = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from chat_reference import reference  # the mask rule of DESIGN.md §6 from transformers

def messages_of(rec, alpaca):
    if alpaca:
        inp = rec.get("input") or ""
        user = rec["instruction"] + ("\n\n" + inp if inp else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}]
    if "messages" in rec: return rec["messages"]
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    return [{"role": roles[m["from"]], "content": m["value"]} for m in rec["conversations"]]

chats = [json.loads(l) for l in open(f"{t}/chat.jsonl") if l.strip()]
alpacas = [json.loads(l) for l in open(f"{t}/alpaca.jsonl") if l.strip()]
tools = [json.loads(l) for l in open(f"{t}/tool.jsonl") if l.strip()]
bad, checked, masked, total = 0, 0, 0, 0
for fam in ["llama3", "llama3_1", "qwen2_5", "qwen3", "mistral"]:
    tok = AutoTokenizer.from_pretrained(f"{t}/{fam}")
    kinds = [("chat", chats), ("alpaca", alpacas)] + ([("tool", tools)] if fam != "mistral" else [])
    for kind, recs in kinds:
        with h5py.File(f"{t}/{kind}_{fam}/shard_00000.h5") as f:
            tokens, offs, lm = f["tokens"][:], list(f["doc_offsets"][:]), f["loss_mask"][:]
            bos, eos = int(f.attrs["bos_id"]), int(f.attrs["eos_id"])
        assert len(offs) == len(recs), (fam, kind, len(offs))
        ends = offs[1:] + [len(tokens)]
        for n, rec in enumerate(recs):
            ids, mask = reference(tok, messages_of(rec, kind == "alpaca"))
            got_ids = [int(x) for x in tokens[offs[n]:ends[n]]]
            got_mask = [int(x) for x in lm[offs[n]:ends[n]]]
            checked += 1
            masked += sum(mask)
            total += len(ids)
            if got_ids != ids or got_mask != mask:
                bad += 1
                print(f"{fam} {kind} record {n}:\n ids  ft {got_ids}\n     ref {ids}\n"
                      f" mask ft {got_mask}\n     ref {mask}")
                print(" text", repr(tok.apply_chat_template(messages_of(rec, kind == "alpaca"),
                                                           tokenize=False)))
with h5py.File(f"{t}/all_qwen3/shard_00000.h5") as f, \
        h5py.File(f"{t}/chat_qwen3/shard_00000.h5") as g:
    assert "loss_mask" not in f, "--train-on-prompt wrote a loss_mask"
    assert (f["tokens"][:] == g["tokens"][:]).all(), "--train-on-prompt changed the tokens"
assert 0 < masked < total, (masked, total)  # the rule marks some tokens, not all
tok = AutoTokenizer.from_pretrained(f"{t}/qwen2_5")
im_end = tok.convert_tokens_to_ids("<|im_end|>")
with h5py.File(f"{t}/plain_qwen/shard_00000.h5") as f:
    want = tok("plain text", add_special_tokens=False)["input_ids"] + [im_end]
    assert list(f["tokens"][:]) == want and int(f.attrs["eos_id"]) == im_end, \
        ("text documents should end with tokenizer_config's eos_token", list(f["tokens"][:]), want)
print(f"{checked} conversations checked: {total} tokens, {masked} trained, {bad} differ")
sys.exit(1 if bad else 0)
EOF

# The shards train: the loader takes the loss_mask (3 steps of a tiny model, 16-token windows).
cat > "$tmp/r.yaml" <<YAML
run: {name: chat, output_dir: $tmp/run, seed: 0}
model: {arch: llama, dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 64,
        vocab_size: $(cat "$tmp/vocab_size"), max_seq_len: 16}
tokenizer: {path: $tmp/qwen2_5}
data: {train: $tmp/chat_qwen2_5, seq_len: 16, shuffle: false}
training: {steps: 3, micro_batch_size: 4, global_batch_size: 8}
optimizer: {name: adamw, lr: 1.0e-3}
YAML
run_rc 0 "$ft" train "$tmp/r.yaml"
# The losses are of the assistant's tokens only: positive where a batch holds some (a batch of
# prompt tokens only is reported as 0).
"$PY" - "$tmp/run/metrics.jsonl" <<'EOF' || fail "no step trained on an assistant token"
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
print("losses", losses)
sys.exit(0 if len(losses) == 3 and max(losses) > 0 else 1)
EOF

# ---- c: errors -------------------------------------------------------------------------------
printf '%s\n' '{"messages": [{"role": "user", "content": "ok"}]}' 'not json' > "$tmp/bad1.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad1.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad1.jsonl:2: not valid JSON"
printf '%s\n' '{"text": "no messages"}' > "$tmp/bad2.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad2.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad2.jsonl:1: no \"messages\""
has_err "--format alpaca"
printf '%s\n' '{"messages": [{"role": "narrator", "content": "x"}]}' > "$tmp/bad3.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad3.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad3.jsonl:1: \"messages[0].role\" is \"narrator\""
printf '%s\n' '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}' > "$tmp/bad4.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad4.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad4.jsonl:1: \"messages[0].content\" is an array, expected a string"
printf '%s\n' '{"messages": [{"role": "assistant", "content": "", "tool_calls": []}]}' \
  > "$tmp/bad7.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad7.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad7.jsonl:1: \"messages[0].tool_calls\" is not supported"
printf '%s\n' '{"instruction": "x"}' > "$tmp/bad5.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad5.jsonl" --format alpaca \
  --output "$tmp/bad_out"
has_err "bad5.jsonl:1: no \"output\""
# Mistral's template raises on roles that do not alternate: the error names the record.
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}' \
  > "$tmp/bad6.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/mistral" --input "$tmp/bad6.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "bad6.jsonl:1:"
has_err "conversation roles must alternate"
[[ ! -e "$tmp/bad_out" ]] || fail "a failed run left its output folder: $(ls -A "$tmp/bad_out")"
# A file with nothing to train on (no assistant message, or only empty ones) is refused, naming
# every such file, unless --allow-no-trainable; the others are fine beside it.
printf '%s\n' '{"messages": [{"role": "user", "content": "a prompt only"}]}' > "$tmp/prompts.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}' \
  '{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}]}' \
  > "$tmp/empty_answers.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/chat.jsonl" "$tmp/prompts.jsonl" \
  "$tmp/empty_answers.jsonl" --format chat --output "$tmp/bad_out"
has_err "no token to train on in $tmp/prompts.jsonl (1 conversation), $tmp/empty_answers.jsonl (2 conversations)"
has_err "--allow-no-trainable"
grep -qF "$tmp/chat.jsonl" "$tmp/err.txt" && fail "a file with assistant content was named"
[[ ! -e "$tmp/bad_out" ]] || fail "a refused run left its output folder"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/prompts.jsonl" --format chat \
  --output "$tmp/prompts_out" --allow-no-trainable
has_err "warning: tokenize: no token to train on in $tmp/prompts.jsonl"
[[ -f "$tmp/prompts_out/shard_00000.h5" ]] || fail "--allow-no-trainable wrote no shard"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/prompts.jsonl" --format chat \
  --output "$tmp/prompts_all" --train-on-prompt  # every token is trained on: nothing to say
# A SentencePiece tokenizer (its folder has a chat template) is refused for chat data.
mkdir "$tmp/spm"
cp "$tmp/qwen2_5/tokenizer_config.json" "$tmp/spm/"
(cd "$tmp/spm" && "$PY" - <<'EOF') || fail "training a SentencePiece model failed"
import sentencepiece as spm
open("corpus.txt", "w").write("\n".join(f"w{i} x{i * 7 % 13} y" for i in range(2000)))
spm.SentencePieceTrainer.train(input="corpus.txt", model_prefix="tokenizer", vocab_size=100,
                               model_type="bpe", minloglevel=2)
EOF
run_rc 2 "$ft" tokenize --tokenizer "$tmp/spm" --input "$tmp/chat.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "needs a Hugging Face tokenizer.json with a byte-level BPE model"
# A template outside the subset, and a folder without one.
mkdir "$tmp/macro"
cp "$tmp/qwen2_5/tokenizer.json" "$tmp/macro/"
printf '%s' '{% macro turn(m) %}{{ m.content }}{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}' \
  > "$tmp/macro/chat_template.jinja"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/macro" --input "$tmp/chat.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "chat_template.jinja:1: the statement {% macro %} is outside the Jinja subset"
# An unclosed block: named with the line it opens at, not as a construct outside the subset.
printf '%s\n' '{% for m in messages %}' '{% if m.role == "user" %}{{ m.content }}' '{% endfor %}' \
  > "$tmp/macro/chat_template.jinja"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/macro" --input "$tmp/chat.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "chat_template.jinja:3: {% endfor %} where {% endif %} was expected: the {% if %} opened at line 2 is not closed yet"
# A template that is a FIFO is refused by what it is, not waited on.
rm "$tmp/macro/chat_template.jinja"
mkfifo "$tmp/macro/chat_template.jinja"
run_rc 2 timeout 20 "$ft" tokenize --tokenizer "$tmp/macro" --input "$tmp/chat.jsonl" \
  --format chat --output "$tmp/bad_out"
has_err "chat template $tmp/macro/chat_template.jinja: is a FIFO (named pipe), not a regular file"
rm "$tmp/macro/chat_template.jinja"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/macro" --input "$tmp/chat.jsonl" --format chat \
  --output "$tmp/bad_out"
has_err "no chat template"
echo "PASS"
