#!/usr/bin/env bash
# Prepares the quickstart data with nothing downloaded (called by scripts/setup.sh):
#   data/generated/quickstart/corpus.txt      generated English stories (seed 1234, 3 MB)
#   data/generated/quickstart/valid.txt       held-out stories (another seed)
#   data/generated/quickstart/tokenizer.model SentencePiece BPE, vocab 2048, trained on corpus.txt
#   data/generated/quickstart/{train,valid}/  token shards written by ft tokenize
# Skips every step whose output already exists.
#   scripts/quickstart_data.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir="${1:-build}"
out=data/generated/quickstart
py=/usr/bin/python3   # Debian's python, which has sentencepiece (DESIGN.md §9)

if [[ ! -s $out/corpus.txt || ! -s $out/tokenizer.model ]]; then
  echo "quickstart data: generating corpus and training the tokenizer"
  $py scripts/make_corpus.py --out "$out/corpus.txt" --tokenizer "$out/tokenizer.model"
fi
if [[ ! -s $out/valid.txt ]]; then
  $py scripts/make_corpus.py --out "$out/valid.txt" --size-mb 0.2 --seed 98765
fi
for split in train valid; do
  src=$out/corpus.txt
  [[ $split == valid ]] && src=$out/valid.txt
  if ! compgen -G "$out/$split/*.h5" > /dev/null; then
    rm -rf "$out/$split"
    "$build_dir/ft" tokenize --tokenizer "$out/tokenizer.model" --input "$src" --output "$out/$split"
  fi
done
echo "quickstart data: ready in $out"
