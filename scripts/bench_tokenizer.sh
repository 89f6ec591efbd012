#!/usr/bin/env bash
# Single-thread tokenization speed of ft's byte-level BPE against Hugging Face `tokenizers` on
# the same file and tokenizer.json (a benchmark that prints numbers, not a test).
#   scripts/bench_tokenizer.sh [TOKENIZER_JSON [TEXT_FILE]]
# Without arguments: a GPT-2-style byte-level BPE (8k vocabulary) is trained with `tokenizers`
# on ~5 MB of scripts/make_corpus.py text, which is also the file tokenized.
# ft:  `ft tokenize --threads 1 --format text` end to end (read, encode, write shards), its own
#      tokens/s line (BOS/EOS included when the tokenizer has them).
# HF:  `Tokenizer.encode_batch` on the same documents (blank-line separated, as ft reads them),
#      RAYON_NUM_THREADS=1, timing the encode only.
# Environment: BUILD_DIR (default build; its hf_venv_tf5, made by the tests, brings tokenizers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"
py="$build/hf_venv_tf5/bin/python"
[[ -x $py ]] || { echo "no $py: run tests/cli/test_tokenizer_json.sh once (it makes it)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/ft_bench_tokenizer.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

tok="${1:-}"
text="${2:-}"
if [[ -z $text ]]; then
  text="$tmp/corpus.txt"
  /usr/bin/python3 scripts/make_corpus.py --out "$text" --size-mb 5 >/dev/null
fi
if [[ -z $tok ]]; then
  tok="$tmp/tokenizer.json"
  "$py" - "$text" "$tok" <<'EOF'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
t.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=8192, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         special_tokens=["<|endoftext|>"])
t.train([sys.argv[1]], tr)
t.save(sys.argv[2])
EOF
fi
echo "file: $text ($(du -h "$text" | cut -f1)), tokenizer: $tok"

"$build/ft" tokenize --tokenizer "$tok" --input "$text" --format text --threads 1 \
  --output "$tmp/shards" | sed 's/^/ft (1 thread):  /'

RAYON_NUM_THREADS=1 "$py" - "$text" "$tok" <<'EOF'
import sys, time
from tokenizers import Tokenizer
docs, cur = [], []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    line = line.rstrip("\n").rstrip("\r")
    if line.strip(" \t\r\f\v") == "":
        if cur: docs.append("\n".join(cur)); cur = []
    else:
        cur.append(line)
if cur: docs.append("\n".join(cur))
tok = Tokenizer.from_file(sys.argv[2])
t0 = time.perf_counter()
enc = tok.encode_batch(docs, add_special_tokens=True)
dt = time.perf_counter() - t0
n = sum(len(e.ids) for e in enc)
print(f"HF tokenizers (RAYON_NUM_THREADS=1): {len(docs)} documents, {n} tokens in {dt:.2f} s, "
      f"{n / dt:.0f} tokens/s")
EOF
