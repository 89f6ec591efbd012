#!/usr/bin/env bash
# ft's byte-level BPE (lib/data/bpe_*.cpp) against Hugging Face `tokenizers` itself.
#   a. Three small byte-level BPE tokenizers trained here with `tokenizers` on text written here
#      (no download), one per pre-tokenizer pattern as the families' tokenizer.json files have
#      them: GPT-2 (ByteLevel's own regex, merges written as "a b" strings), Llama 3 (Split
#      regex, ignore_merges, a BOS template) and Qwen2 (Split regex, NFC normalizer); each with
#      special tokens and added tokens with lstrip / rstrip / single_word / normalized set.
#   b. ft tokenize on an awkward corpus (CJK, emoji and ZWJ sequences, combining marks, runs of
#      digits, spaces and newlines, tabs, CRLF, special-token text inside prose; and 400 random
#      strings of such pieces): every
#      document's ids in the shards equal `tokenizers`' encode, and decode gives the text back.
#   c. An HF folder as --tokenizer and as tokenizer.path (validate, a 2-step train whose
#      checkpoint keeps tokenizer.json, the hash check against other shards); invalid UTF-8 (replaced by U+FFFD, as documented); the
#      refusals: another model type, a normalizer ft lacks, a tiktoken rank file, tekken.json.
# The venv is test_export_transformers' (common.sh: venv, hf_tf5_spec), made once under BUILD_DIR.
#   bash tests/cli/test_tokenizer_json.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
PY="$build/hf_venv_tf5/bin/python"

# ---- a + b: train, tokenize with ft, compare -----------------------------------------------
"$PY" - "$tmp" <<'EOF'
import json, random, sys
from tokenizers import Tokenizer, AddedToken, Regex, models, pre_tokenizers, trainers, normalizers
t = sys.argv[1]
rng = random.Random(0)

# The awkward documents (also part of the training text, so that merges reach into them).
awkward = [
    "Hello world. It's 2026; they'll say we've done it, I'd think, you're sure, I'm not.",
    "IT'S LOUD, WE'LL SEE",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣ heart ❤️‍🔥",
    "e\u0301 combining a\u0300\u0316 cafe\u0301 vs café, Å vs A\u030a",  # NFC changes these
    "digits 1234567890 and 3.14159 and 000000000000001",
    "spaces:  two,   three,          ten, trailing   ",
    "   leading spaces",
    "tabs\tand\t\ttabs\t",
    "windows\r\nline\r\nends\r\n\r\n",
    "unix\nlines\n\n\nand blank ones\n",
    "mixed \t \n \r\n  whitespace",
    "special <|endoftext|> inside prose<|im_start|>user\nhi<|im_end|>",
    "glued<|endoftext|><|endoftext|>twice and <|im_start|><|im_end|>",
    "partial <|endof text|> and <|im_start and |>",
    "mask tokens: a <mask> b  <mask>c <mask>",
    "single word: wow, wowzer, (wow) 'wow' _wow wow",
    "nbsp\u00a0here, thin\u2009space, ideographic\u3000space, nel\u0085char",
    "zero\u200bwidth joiner\u200d and bom\ufeff",
    "mongolian\u180e's vowel separator: a space to PCRE2, not to Oniguruma",
    "symbols: !!! ??? ... --- *** ### $$$ %%% ^^^ &&& ||| ~~~ ``` ''' \"\"\"",
    "ﬁ ligature ＡＢＣ fullwidth ①②③ ²³",
    "Ελληνικά, Русский, العربية, עברית, हिन्दी, ไทย",
    "x", " ", "", "a" * 300, " " * 50 + "end", "7" * 40,
]
words = ["the", "fox", "said", "quietly", "running", "jumped", "over", "lazy", "dog", "world",
         "token", "izer", "merge", "byte", "level", "pattern", "unicode", "space"]
train_text = []
for _ in range(3000):
    n = rng.randint(3, 12)
    s = " ".join(rng.choice(words) for _ in range(n))
    if rng.random() < 0.3: s = s.capitalize() + "."
    if rng.random() < 0.2: s += " " + str(rng.randint(0, 10**6))
    train_text.append(s)
train_text += awkward * 20

GPT2 = None  # ByteLevel(use_regex=True): the pattern is built in
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

def make(name, pattern, nfc=False, vocab=700):
    tok = Tokenizer(models.BPE())
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    if nfc:
        tok.normalizer = normalizers.NFC()
    from tokenizers import decoders
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(train_text, trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False),
                    AddedToken("wow", single_word=True, normalized=True),
                    AddedToken("e\u0301!", normalized=True)])
    tok.save(f"{t}/{name}.json")
    j = json.load(open(f"{t}/{name}.json"))
    if name == "gpt2":  # the older "a b" string form of merges
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    if name == "llama3":
        j["model"]["ignore_merges"] = True
        j["added_tokens"].append({"id": max(a["id"] for a in j["added_tokens"]) + 1,
                                  "content": "<|begin_of_text|>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
        bos = "<|begin_of_text|>"
        bos_id = j["added_tokens"][-1]["id"]
        j["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}]}
    json.dump(j, open(f"{t}/{name}.json", "w"), ensure_ascii=False)

make("gpt2", GPT2)
make("llama3", LLAMA3)
make("qwen2", QWEN2, nfc=True)
# And random strings of awkward pieces (how the U+180E difference was found).
pieces = ["a", "Z", "é", "ß", "ſ", "K", "İ", "日", "😀", "👍🏽", "\u200d", "\u0301", "1", "٣", "²",
          " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u0085", "\u2028", "\u3000", "\u180e",
          "\u200b", "\ufeff", "\x0b", "\x1c", "'s", "'S", "'t", "'re", "'LL", "'d", "'m", "'ve",
          "'", ".", "!!", "_", "<|endoftext|>", "<|im_start|>", "<mask>", "wow", "<|endof",
          "e\u0301!", "\x00", "\x7f", "\U0001F1EB\U0001F1F7", "ﬁ", "Ａ", "①"]
random_docs = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
               for _ in range(400)]
with open(f"{t}/docs.jsonl", "w") as f:
    for d in awkward + random_docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF

for name in gpt2 llama3 qwen2; do
  run_rc 0 "$ft" tokenize --tokenizer "$tmp/$name.json" --input "$tmp/docs.jsonl" \
    --output "$tmp/shards_$name" --threads 2
done
"$PY" - "$tmp" <<'EOF' || fail "ft's ids differ from tokenizers' (above)"
import hashlib, json, sys
import h5py
from tokenizers import Tokenizer
t = sys.argv[1]
docs = [json.loads(l)["text"] for l in open(f"{t}/docs.jsonl")]
bad = 0
for name in ["gpt2", "llama3", "qwen2"]:
    tok = Tokenizer.from_file(f"{t}/{name}.json")
    with h5py.File(f"{t}/shards_{name}/shard_00000.h5") as f:
        tokens, offs = f["tokens"][:], f["doc_offsets"][:]
        sha = f.attrs["tokenizer_sha256"]
        sha = sha.decode() if isinstance(sha, bytes) else str(sha)
        assert sha == hashlib.sha256(open(f"{t}/{name}.json", "rb").read()).hexdigest(), sha
        assert int(f.attrs["vocab_size"]) == tok.get_vocab_size(with_added_tokens=True), name
    assert len(offs) == len(docs), (name, len(offs))  # doc_offsets: where each one starts
    ends = list(offs[1:]) + [len(tokens)]
    for i, d in enumerate(docs):
        got = [int(x) for x in tokens[offs[i]:ends[i]]]
        # llama3's template adds BOS (add_special_tokens=True); the others add nothing.
        want = tok.encode(d, add_special_tokens=(name == "llama3")).ids
        if got != want:
            bad += 1
            print(f"{name} doc {i} {d!r}:\n  ft  {got}\n  hf  {want}\n"
                  f"  ft  {[tok.id_to_token(x) for x in got]}\n"
                  f"  hf  {[tok.id_to_token(x) for x in want]}", file=sys.stderr)
    print(f"{name}: {len(docs)} documents, {len(tokens)} tokens, identical" if not bad else name)
sys.exit(1 if bad else 0)
EOF

# Decode: ft's own decode is checked in the unit tests (test_bpe_tokenizer.cpp); here, the ids
# ft wrote decode under tokenizers to the text (NFC-normalized where the tokenizer asks).
"$PY" - "$tmp" <<'EOF' || fail "decode of ft's ids is not the text"
import json, re, sys, unicodedata
import h5py
from tokenizers import Tokenizer
t = sys.argv[1]
docs = [json.loads(l)["text"] for l in open(f"{t}/docs.jsonl")]
WHITE_SPACE = "[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
for name in ["gpt2", "qwen2"]:
    tok = Tokenizer.from_file(f"{t}/{name}.json")
    with h5py.File(f"{t}/shards_{name}/shard_00000.h5") as f:
        tokens, offs = f["tokens"][:], f["doc_offsets"][:]
    ends = list(offs[1:]) + [len(tokens)]
    for i, d in enumerate(docs):
        ids = [int(x) for x in tokens[offs[i]:ends[i]]]
        # tokenizers' ByteLevel decoder garbles an added token whose content lies outside the
        # byte map ("e\u0301!" decodes to "\ufffd!"); such documents are not checked here.
        if tok.token_to_id("e\u0301!") in ids:
            continue
        got = tok.decode(ids, skip_special_tokens=False)
        # <mask> has lstrip: the White_Space before it is taken into the token, not given back.
        want = re.sub(WHITE_SPACE + "+<mask>", "<mask>", d)
        if name == "qwen2":  # NFC normalizer
            got, want = unicodedata.normalize("NFC", got), unicodedata.normalize("NFC", want)
        assert got == want, (name, i, got, want)
EOF

# ---- c. a folder, invalid UTF-8, refusals ---------------------------------------------------
mkdir -p "$tmp/hf_folder"
cp "$tmp/qwen2.json" "$tmp/hf_folder/tokenizer.json"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/hf_folder" --input "$tmp/docs.jsonl" \
  --output "$tmp/shards_folder"
"$PY" - "$tmp" <<'EOF' || fail "a folder tokenizes differently from its tokenizer.json"
import sys
import h5py
t = sys.argv[1]
a = h5py.File(f"{t}/shards_folder/shard_00000.h5")["tokens"][:]
b = h5py.File(f"{t}/shards_qwen2/shard_00000.h5")["tokens"][:]
sys.exit(0 if len(a) == len(b) and (a == b).all() else 1)
EOF

# tokenizer.path as the folder: ft validate takes it; ft train checks the shards' hash against
# the file it resolves to and keeps that file, as tokenizer.json, in the checkpoint.
recipe() {  # VOCAB_SIZE
  cat <<YAML
run: {name: bpe, output_dir: $tmp/run, seed: 0}
model: {arch: llama, dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 64,
        vocab_size: $1, max_seq_len: 16}
tokenizer: {path: $tmp/hf_folder}
data: {train: $tmp/shards_folder, seq_len: 16, shuffle: false}
training: {steps: 2, micro_batch_size: 2, global_batch_size: 2}
optimizer: {name: adamw, lr: 1.0e-3}
checkpoint: {dir: $tmp/ckpt, every_steps: 2}
YAML
}
recipe 702 > "$tmp/r.yaml"
run_rc 0 "$ft" validate "$tmp/r.yaml"
run_rc 0 "$ft" train "$tmp/r.yaml"
[[ -f $tmp/ckpt/step_00000002/tokenizer.json ]] || fail "the checkpoint lacks tokenizer.json"
cmp -s "$tmp/ckpt/step_00000002/tokenizer.json" "$tmp/hf_folder/tokenizer.json" ||
  fail "the checkpoint's tokenizer.json differs from the recipe's"
run_rc 0 "$ft" export "$tmp/ckpt" --output "$tmp/exported"
has_out "copied tokenizer.json"
has_out "wrote tokenizer_config.json"
cmp -s "$tmp/exported/tokenizer.json" "$tmp/hf_folder/tokenizer.json" ||
  fail "the exported tokenizer.json differs from the recipe's"
# transformers' AutoTokenizer on the exported folder gives the ids in the shards.
"$PY" - "$tmp" <<'EOF' || fail "AutoTokenizer on the export differs from the shards"
import json, sys
import h5py
from transformers import AutoTokenizer
t = sys.argv[1]
tok = AutoTokenizer.from_pretrained(f"{t}/exported")
docs = [json.loads(l)["text"] for l in open(f"{t}/docs.jsonl")]
with h5py.File(f"{t}/shards_folder/shard_00000.h5") as f:
    tokens, offs = f["tokens"][:], f["doc_offsets"][:]
ends = list(offs[1:]) + [len(tokens)]
for i, d in enumerate(docs):
    got = tok(d)["input_ids"]
    want = [int(x) for x in tokens[offs[i]:ends[i]]]
    assert got == want, (i, d, got, want)
print(f"AutoTokenizer ({type(tok).__name__}) on the export: {len(docs)} documents, identical")
EOF
recipe 600 > "$tmp/r_small.yaml"
run_rc 2 "$ft" validate "$tmp/r_small.yaml"
has_err "pieces of tokenizer $tmp/hf_folder"
# A tokenizer.json other than the shards': the loader refuses by hash.
recipe 702 | sed "s|path: $tmp/hf_folder|path: $tmp/gpt2.json|; s|dir: $tmp/ckpt|dir: $tmp/ckpt2|" \
  > "$tmp/r_other.yaml"
run_rc 1 "$ft" train "$tmp/r_other.yaml"
has_err "differs from the sha256 of the recipe's tokenizer"

# Invalid UTF-8: each maximal invalid subpart becomes U+FFFD, as Python's errors="replace".
printf 'ok \xff\xfe then \xe2\x82 cut and \xed\xa0\x80 surrogate \xc3\n' > "$tmp/bad.txt"
run_rc 0 "$ft" tokenize --tokenizer "$tmp/gpt2.json" --input "$tmp/bad.txt" --format text \
  --output "$tmp/shards_bad"
"$PY" - "$tmp" <<'EOF' || fail "invalid UTF-8 is not replaced as documented"
import sys
import h5py
from tokenizers import Tokenizer
t = sys.argv[1]
tok = Tokenizer.from_file(f"{t}/gpt2.json")
text = open(f"{t}/bad.txt", "rb").read().rstrip(b"\n").decode("utf-8", errors="replace")
got = [int(x) for x in h5py.File(f"{t}/shards_bad/shard_00000.h5")["tokens"][:]]
want = tok.encode(text, add_special_tokens=False).ids
assert got == want, (got, want, text)
EOF

expect_refusal() {  # NAME FILE TEXT: ft tokenize with FILE fails and names TEXT
  if "$ft" tokenize --tokenizer "$2" --input "$tmp/docs.jsonl" --output "$tmp/refused" \
    >"$tmp/out.txt" 2>"$tmp/err.txt"; then fail "$1: exited 0"; fi
  grep -qF -- "$3" "$tmp/err.txt" || fail_showing_output "$1: stderr lacks: $3"
  echo "ok: refuses $1"
}
"$PY" - "$tmp" <<'EOF'
import json, sys
t = sys.argv[1]
j = json.load(open(f"{t}/gpt2.json"))
def variant(name, edit):
    k = json.loads(json.dumps(j)); edit(k); json.dump(k, open(f"{t}/{name}.json", "w"))
variant("wordpiece", lambda k: k["model"].update(type="WordPiece"))
variant("lowercase", lambda k: k.update(normalizer={"type": "Lowercase"}))
variant("fallback", lambda k: k["model"].update(byte_fallback=True))
variant("digits", lambda k: k.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, {"type": "ByteLevel"}]}))
json.dump({"config": {"pattern": "x"}, "vocab": []}, open(f"{t}/tekken.json", "w"))
open(f"{t}/tiktoken.model", "w").write("IQ== 0\nIg== 1\n")
EOF
expect_refusal "WordPiece" "$tmp/wordpiece.json" 'model.type: "WordPiece" is not supported'
expect_refusal "Lowercase" "$tmp/lowercase.json" 'normalizer.type: "Lowercase" is not supported'
expect_refusal "byte_fallback" "$tmp/fallback.json" "model.byte_fallback: true is not supported"
expect_refusal "Digits" "$tmp/digits.json" 'pretokenizers[0].type: "Digits" is not supported'
expect_refusal "tekken.json" "$tmp/tekken.json" "tekken.json"
expect_refusal "tiktoken" "$tmp/tiktoken.model" "a tiktoken rank file"
mkdir -p "$tmp/mistral" && cp "$tmp/tekken.json" "$tmp/mistral/"
expect_refusal "a folder with tekken.json" "$tmp/mistral" "holds tekken.json"
echo "PASS: $test_name"
