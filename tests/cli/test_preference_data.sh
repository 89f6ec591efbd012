#!/usr/bin/env bash
# ft tokenize --format preference and ft inspect on its shards (lib/data/preference.cpp), against
# a reference written here from transformers (DESIGN.md §6 "Preference data"), with the Llama 3
# and Qwen2.5 Instruct templates of tests/data/chat_templates.
#   a. A byte-level BPE tokenizer trained here with `tokenizers`, in two HF folders: llama3 (a
#      TemplateProcessing post-processor that adds <|begin_of_text|>, as Llama 3's has; EOS
#      <|eot_id|> from tokenizer_config.json) and qwen2_5 (no BOS; NFC; EOS <|im_end|> from
#      tokenizer_config.json, as Qwen2.5's).
#   b. Records of the three forms (strings; a prompt list with one-message completions, ShareGPT
#      lists and assistant turns in the prompt among them; whole conversations with the prompt
#      implicit) in two files, through ft tokenize with small shards and two threads: ft's
#      shards are ft-preference, no pair spans two shards, and every pair's tokens and masks
#      equal the reference's: strings as BOS (what the tokenizer adds to a text) + the prompt's
#      ids, then each completion's ids + EOS, mask 1 on the completion; message lists as
#      apply_chat_template(prompt + [completion], tokenize=True) with the chat mask rule for the
#      last message alone; implicit prompts as their longest common prefix of messages. ft
#      inspect reports the pairs and the prompts' and completions' lengths, and with --seq-len
#      the pairs the DPO loader would cut and drop (the rule of lib/data/loader.h).
#   c. Input errors (exit 2, file:line and the key, no output left behind): a missing key, mixed
#      forms, a non-string content, an empty or two-message completion, a non-assistant
#      completion, implicit prompts that leave no single assistant message or none at all,
#      strings without a prompt, a prompt of another type, --train-on-prompt; a tokenizer without
#      EOS for strings, and a folder without a chat template for message lists.
#   bash tests/cli/test_preference_data.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
PY="$build/hf_venv_tf5/bin/python"
templates="$src/tests/data/chat_templates"
families=(llama3 qwen2_5)

# ---- a: the tokenizer folders, and the data --------------------------------------------------
"$PY" - "$tmp" "$templates" <<'EOF'
import json, os, random, sys
from tokenizers import (Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)
t, templates = sys.argv[1], sys.argv[2]
rng = random.Random(0)
words = ["the", "fox", "said", "hello", "answer", "question", "good", "bad", "café", "日本語",
         "😀", "naïve"]
text = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(300)]
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
tok.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=400, show_progress=False, special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
configs = {
    "llama3": ("llama3_instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("qwen2_5_instruct.jinja", None, "<|im_end|>"),
}
for name, (file, bos, eos) in configs.items():
    d = f"{t}/{name}"
    os.makedirs(d)
    tok.normalizer = normalizers.NFC() if name.startswith("qwen") else None
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tok.token_to_id(bos))]) if bos else None
    tok.save(f"{d}/tokenizer.json")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "model_max_length": 1 << 20,
           "chat_template": open(f"{templates}/{file}", encoding="utf-8").read()}
    json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"), ensure_ascii=False, indent=1)
# A folder with no EOS anywhere (no post-processor, no tokenizer_config.json) and so no template.
os.makedirs(f"{t}/no_eos")
tok.normalizer, tok.post_processor = None, None
tok.save(f"{t}/no_eos/tokenizer.json")

U, A, S = "user", "assistant", "system"
def msgs(*turns): return [{"role": r, "content": c} for r, c in turns]
strings = [
    {"prompt": "What is the fox?", "chosen": " A fox is an animal.", "rejected": " fox fox"},
    {"prompt": "", "chosen": "empty prompt", "rejected": ""},
    {"prompt": "日本語 and e\u0301 café ", "chosen": "naïve 😀", "rejected": "\nnewline first"},
    {"prompt": "text that spells <|eot_id|> and <|im_end|>", "chosen": "<|endoftext|>",
     "rejected": "the answer<|eot_id|>"},
]
explicit = [
    {"prompt": msgs((U, "Hello there")), "chosen": msgs((A, "Hi! How can I help?")),
     "rejected": msgs((A, "go away"))},
    # Assistant turns in the prompt are not trained on; a system prompt; an empty completion.
    {"prompt": msgs((S, "You are brief."), (U, "2+2?"), (A, "4."), (U, "And 3+3?")),
     "chosen": msgs((A, "6.")), "rejected": msgs((A, ""))},
    {"prompt": msgs((U, "Cafe\u0301 e\u0301te\u0301 ")), "chosen": msgs((A, " Re\u0301ponse ")),
     "rejected": msgs((A, "日本語\n\n😀"))},
    # ShareGPT lists, in one key or all.
    {"prompt": [{"from": "human", "value": "a ShareGPT question"}],
     "chosen": [{"from": "gpt", "value": "a good answer"}],
     "rejected": msgs((A, "a bad answer"))},
]
implicit = [
    {"chosen": msgs((U, "Which is better?"), (A, "the good one")),
     "rejected": msgs((U, "Which is better?"), (A, "the bad one"))},
    {"chosen": msgs((S, "sys"), (U, "q1"), (A, "a1"), (U, "q2"), (A, "the chosen a2")),
     "rejected": msgs((S, "sys"), (U, "q1"), (A, "a1"), (U, "q2"), (A, "rejected"))},
    # No message alike: the prompt is empty.
    {"chosen": msgs((A, "alone")), "rejected": msgs((A, "also alone"))},
    {"chosen": [{"from": "human", "value": "sharegpt"}, {"from": "gpt", "value": "yes"}],
     "rejected": msgs((U, "sharegpt"), (A, "no"))},
]
with open(f"{t}/pairs1.jsonl", "w") as f:
    for r in strings + explicit[:2]: f.write(json.dumps(r, ensure_ascii=False) + "\n")
    f.write("\n")  # a blank line is skipped
with open(f"{t}/pairs2.jsonl", "w") as f:
    for r in explicit[2:] + implicit: f.write(json.dumps(r, ensure_ascii=False) + "\n")
EOF
[[ -f "$tmp/pairs2.jsonl" ]] || fail "the test's setup (above) failed"

# ---- b: ft against the reference -------------------------------------------------------------
for f in "${families[@]}"; do
  run_rc 0 "$ft" tokenize --tokenizer "$tmp/$f" --input "$tmp/pairs1.jsonl" "$tmp/pairs2.jsonl" \
    --format preference --output "$tmp/pref_$f" --shard-tokens 100 --threads 2
  has_out "12 pairs (24 documents)"
  run_rc 0 "$ft" inspect "$tmp/pref_$f"
  cp "$tmp/out.txt" "$tmp/inspect_$f.txt"
  # What DPO training's loader keeps, cuts and drops at a data.seq_len that cuts and drops some.
  run_rc 0 "$ft" inspect "$tmp/pref_$f" --seq-len 20
  cp "$tmp/out.txt" "$tmp/inspect_20_$f.txt"
done
"$PY" - "$tmp" "$src/tests/cli" <<'EOF' || fail "ft's preference pairs differ from the reference (above)"
import glob, json, re, sys
import h5py
from transformers import AutoTokenizer
t = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from chat_reference import reference

def messages(lst):
    roles = {"human": "user", "gpt": "assistant"}
    return [m if "role" in m else {"role": roles[m["from"]], "content": m["value"]} for m in lst]

def pair_reference(tok, rec):
    """The pair's (ids, mask) for chosen and rejected, by DESIGN.md §6's rules."""
    if isinstance(rec["chosen"], str):
        # BOS where the tokenizer adds one (what it adds to a text), the prompt without EOS; each
        # completion alone, without BOS, then EOS.
        prompt = tok("", add_special_tokens=True)["input_ids"] + \
            tok(rec["prompt"], add_special_tokens=False)["input_ids"]
        out = []
        for key in ("chosen", "rejected"):
            c = tok(rec[key], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out.append((prompt + c, [0] * len(prompt) + [1] * len(c)))
        return out
    chosen, rejected = messages(rec["chosen"]), messages(rec["rejected"])
    if "prompt" in rec:
        prompt = messages(rec["prompt"])
        chosen, rejected = prompt + chosen, prompt + rejected
    return [reference(tok, conv, masked={len(conv) - 1}) for conv in (chosen, rejected)]

recs = [json.loads(l) for n in (1, 2) for l in open(f"{t}/pairs{n}.jsonl") if l.strip()]
bad = 0
for fam in ["llama3", "qwen2_5"]:
    tok = AutoTokenizer.from_pretrained(f"{t}/{fam}")
    docs = []
    shards = sorted(glob.glob(f"{t}/pref_{fam}/*.h5"))
    assert len(shards) > 2, ("expected the pairs spread over several shards", shards)
    for path in shards:
        with h5py.File(path) as f:
            assert f.attrs["format"] == "ft-preference", f.attrs["format"]
            tokens, lm = f["tokens"][:].tolist(), f["loss_mask"][:].tolist()
            offs = f["doc_offsets"][:].tolist()
            assert len(offs) % 2 == 0, (path, "a pair spans two shards")
            ends = offs[1:] + [len(tokens)]
            docs += [(tokens[b:e], lm[b:e]) for b, e in zip(offs, ends)]
    assert len(docs) == 2 * len(recs), (fam, len(docs))
    lengths = {"prompt": [], "chosen completion": [], "rejected completion": []}
    for k, rec in enumerate(recs):
        want = pair_reference(tok, rec)
        for j, key in enumerate(("chosen", "rejected")):
            if list(docs[2 * k + j]) != list(want[j]):
                bad += 1
                print(f"{fam} pair {k} {key}:\n ids  ft {docs[2 * k + j][0]}\n     ref {want[j][0]}\n"
                      f" mask ft {docs[2 * k + j][1]}\n     ref {want[j][1]}")
            mask = want[j][1]
            prompt = mask.index(1)
            if j == 0: lengths["prompt"].append(prompt)
            lengths[f"{key} completion"].append(len(mask) - prompt)
    # ft inspect: the pairs and the lengths (min, mean, max).
    text = open(f"{t}/inspect_{fam}.txt").read()
    assert "(preference pairs, format ft-preference)" in text, text
    assert re.search(rf"pairs: +{len(recs)} ", text), text
    for name, ls in lengths.items():
        row = f"{name} {min(ls)} {sum(ls) / len(ls):.1f} {max(ls)}"
        if row not in " ".join(text.split()):
            bad += 1
            print(f"{fam}: ft inspect lacks the row '{row}':\n{text}")
    # --seq-len T: a sequence of n tokens is cut when n - 1 > T; a pair is dropped when a
    # sequence has fewer than 2 tokens, or is cut with no trained target among its first T.
    T, cut, dropped = 20, 0, 0
    for k in range(len(recs)):
        seqs = [docs[2 * k + j] for j in range(2)]
        if any(len(ids) < 2 or (len(ids) - 1 > T and 1 not in mask[1:T + 1])
               for ids, mask in seqs):
            dropped += 1
        elif any(len(ids) - 1 > T for ids, _ in seqs):
            cut += 1
    assert 0 < cut and 0 < dropped, (fam, cut, dropped)  # T is chosen to show both
    text = " ".join(open(f"{t}/inspect_20_{fam}.txt").read().split())
    for want in (f"kept: {len(recs) - dropped} of {len(recs)}", f"cut: {cut} (",
                 f"dropped: {dropped} ("):
        if want not in text:
            bad += 1
            print(f"{fam}: ft inspect --seq-len {T} lacks '{want}':\n{text}")
    print(f"{fam}: {len(recs)} pairs checked")
sys.exit(1 if bad else 0)
EOF

# ---- c: errors -------------------------------------------------------------------------------
good='{"prompt": "p", "chosen": "c", "rejected": "r"}'
# refuse LINE TEXT...: the record LINE after a good one and a blank line (so line 3) is refused,
# exit 2, with file:line and each TEXT, and nothing is left behind.
refuse() {
  local record=$1
  shift
  printf '%s\n\n%s\n' "$good" "$record" > "$tmp/bad.jsonl"
  run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/bad.jsonl" \
    --format preference --output "$tmp/bad_out"
  has_err "bad.jsonl:3: "
  local want
  for want in "$@"; do has_err "$want"; done
  [[ ! -e "$tmp/bad_out" ]] || fail "a refused run left its output folder"
}
A='[{"role": "assistant", "content": "a"}]'
U='[{"role": "user", "content": "u"}]'
refuse '{"prompt": "p", "rejected": "r"}' 'no "chosen"' '{"prompt", "chosen", "rejected"}'
refuse '{"prompt": "p", "chosen": "c"}' 'no "rejected"'
refuse "{\"prompt\": \"p\", \"chosen\": $A, \"rejected\": \"r\"}" \
  '"chosen" is a list of messages but "prompt" is a string' 'one form for the whole record'
refuse "{\"prompt\": $U, \"chosen\": $A, \"rejected\": \"r\"}" \
  '"rejected" is a string but "prompt" is a list of messages'
refuse "{\"chosen\": $A, \"rejected\": \"r\"}" '"rejected" is a string but "chosen" is a list'
refuse '{"prompt": 5, "chosen": "c", "rejected": "r"}' \
  '"prompt" is a number, expected a string or a list of messages'
refuse "{\"prompt\": [{\"role\": \"user\", \"content\": 5}], \"chosen\": $A, \"rejected\": $A}" \
  '"prompt[0].content" is a number, expected a string'
refuse "{\"prompt\": [{\"role\": \"narrator\", \"content\": \"x\"}], \"chosen\": $A, \"rejected\": $A}" \
  '"prompt[0].role" is "narrator"'
refuse "{\"prompt\": $U, \"chosen\": [], \"rejected\": $A}" '"chosen" is an empty list' \
  'a completion is a list of one assistant message'
refuse "{\"prompt\": $U, \"chosen\": $A, \"rejected\": $U}" \
  '"rejected[0]" is a user message, expected an assistant message'
refuse "{\"prompt\": $U, \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}], \"rejected\": $A}" \
  '"chosen" has 2 messages; a completion is a list of one assistant message'
refuse "{\"chosen\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"other\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}" \
  '"chosen" has 2 messages after the 0 messages that "chosen" and "rejected" both start with'
refuse "{\"chosen\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": $U}" \
  '"rejected" has no message after the 1 message that "chosen" and "rejected" both start with'
refuse "{\"chosen\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"user\", \"content\": \"a\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}" \
  '"chosen[1]" is a user message, expected an assistant message'
refuse "{\"chosen\": $A, \"rejected\": $A}" '"chosen" and "rejected" are the same conversation'
refuse '{"chosen": "c", "rejected": "r"}' 'no "prompt"; string completions need the prompt'
refuse 'not json' 'not valid JSON'
printf '%s\n' "$good" > "$tmp/good.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/qwen2_5" --input "$tmp/good.jsonl" \
  --format preference --train-on-prompt --output "$tmp/bad_out"
has_err "--train-on-prompt does not apply to --format preference"
# Strings need an EOS, message lists a chat template: refused at the first record of that form.
printf '%s\n' "{\"prompt\": $U, \"chosen\": $A, \"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}" \
  "$good" > "$tmp/forms.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/no_eos" --input "$tmp/forms.jsonl" \
  --format preference --output "$tmp/bad_out"
has_err "forms.jsonl:1: message lists are rendered with the chat template"
has_err "no chat template"
tail -n 1 "$tmp/forms.jsonl" > "$tmp/strings.jsonl"
run_rc 2 "$ft" tokenize --tokenizer "$tmp/no_eos" --input "$tmp/strings.jsonl" \
  --format preference --output "$tmp/bad_out"
has_err "strings.jsonl:1: string completions end with the tokenizer's EOS, and $tmp/no_eos/tokenizer.json has none"
[[ ! -e "$tmp/bad_out" ]] || fail "a refused run left its output folder"
echo "PASS"
