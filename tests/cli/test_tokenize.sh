#!/usr/bin/env bash
# ft tokenize + ft inspect end to end: a small corpus from scripts/make_corpus.py, tokenized
# from text and JSONL; the shards checked independently with h5py + python sentencepiece
# + hashlib (tokens, doc_offsets, attributes, sha256); then the error cases: each exits 2 (input)
# with a bounded message and leaves no output folder (a folder that existed is left as it was);
# invalid UTF-8 in JSONL is U+FFFD; tokenizer files that are not regular files are refused
# without being read; SIGINT and SIGTERM mid-run remove everything the run wrote (130, 143).
#   bash tests/cli/test_tokenize.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
PY=/usr/bin/python3  # Debian's, with h5py and sentencepiece (DESIGN.md §9)

# expect_fail NAME PATTERN CMD...: CMD must exit non-zero and print PATTERN on stderr.
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  if "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"; then fail "$name: exited 0"; fi
  grep -qF -- "$pattern" "$tmp/err.txt" || { cat "$tmp/err.txt" >&2; fail "$name: stderr lacks '$pattern'"; }
  echo "ok: $name"
}

# ---- corpus and tokenizer ------------------------------------------------------------------
"$PY" "$src/scripts/make_corpus.py" --out "$tmp/corpus.txt" --size-mb 0.25 \
  --jsonl "$tmp/corpus.jsonl" --tokenizer "$tmp/tok.model" --vocab-size 1024 >/dev/null
# A hand-written file for the document rule: several blank lines, a whitespace-only line,
# CRLF line ends, a multi-line document, no final newline.
printf 'First document, one line.\n\n\n   \nSecond document\nhas two lines.\r\n\r\nThird\tdocument.' > "$tmp/edge.txt"

# ---- tokenize: text, several files, shards small enough to split the corpus ----------------
"$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/edge.txt" \
  --output "$tmp/text" --shard-tokens 20000 --threads 2 >"$tmp/summary.txt"
grep -q "tokenized 2 files" "$tmp/summary.txt" || fail "summary: $(cat "$tmp/summary.txt")"
[[ -f "$tmp/text/shard_00000.h5" && -f "$tmp/text/shard_00001.h5" ]] \
  || fail "expected several shards"
ls "$tmp/text" | grep -qv '\.h5$' && fail "stray files in the output: $(ls "$tmp/text")"

# Same inputs on one thread: byte-identical shards (output order is input order).
"$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/edge.txt" \
  --output "$tmp/text1" --shard-tokens 20000 --threads 1 >/dev/null
for f in "$tmp"/text/*.h5; do
  cmp -s "$f" "$tmp/text1/$(basename "$f")" || fail "threads 1 vs 2 differ: $f"
done
echo "ok: deterministic across thread counts"

# JSONL (format from the extension) with the default field, and another field name.
"$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/corpus.jsonl" --output "$tmp/jsonl" \
  --shard-tokens 20000 >/dev/null
"$PY" -c "
import json, sys
with open('$tmp/corpus.jsonl') as f, open('$tmp/body.data', 'w') as out:
    for line in f:
        out.write(json.dumps({'id': 1, 'body': json.loads(line)['text']}) + '\n')
"
"$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/body.data" --format jsonl --field body \
  --output "$tmp/body" --shard-tokens 1000000 >/dev/null

# ---- independent check of the shards -------------------------------------------------------
"$PY" - "$tmp" <<'EOF'
import glob, hashlib, os, sys
import h5py, numpy as np, sentencepiece as spm

t = sys.argv[1]
sp = spm.SentencePieceProcessor(model_file=f"{t}/tok.model")
sha = hashlib.sha256(open(f"{t}/tok.model", "rb").read()).hexdigest()
bos, eos = sp.bos_id(), sp.eos_id()
assert (bos, eos) == (1, 2), (bos, eos)

def text_docs(path):
    # The rule of lib/data/tokenize.h: blank (whitespace-only) lines separate documents;
    # lines lose one trailing \r and are joined with \n.
    docs, cur = [], []
    for line in open(path, encoding="utf-8", newline="").read().split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if line.strip(" \t\r\f\v") == "":
            if cur:
                docs.append("\n".join(cur)); cur = []
        else:
            cur.append(line)
    if cur:
        docs.append("\n".join(cur))
    return docs

def load(folder, shard_tokens):
    files = sorted(glob.glob(f"{folder}/*.h5"))
    assert files and [os.path.basename(f) for f in files] == [f"shard_{i:05d}.h5" for i in range(len(files))], files
    tokens, starts = [], []
    for path in files:
        with h5py.File(path, "r") as f:
            a = f.attrs
            assert a["format"] == "ft-tokens" and int(a["version"]) == 1, dict(a)
            assert int(a["vocab_size"]) == sp.get_piece_size() == 1024
            assert int(a["bos_id"]) == bos and int(a["eos_id"]) == eos
            assert a["tokenizer_sha256"] == sha, (a["tokenizer_sha256"], sha)
            assert f["tokens"].dtype == np.uint16 and f["doc_offsets"].dtype == np.uint64
            assert "loss_mask" not in f
            assert f["tokens"].chunks is not None, "tokens must be chunked"
            tok = f["tokens"][:].astype(np.int64)
            off = f["doc_offsets"][:].astype(np.int64)
        # Documents never span shards: the shard starts a document, and each document ends
        # with EOS right before the next offset (or the shard end).
        assert off[0] == 0 and np.all(np.diff(off) > 0) and off[-1] < len(tok)
        ends = list(off[1:]) + [len(tok)]
        assert all(tok[o] == bos for o in off) and all(tok[e - 1] == eos for e in ends)
        # A shard goes past shard_tokens only when it is a single document.
        assert len(tok) <= shard_tokens or len(off) == 1, (path, len(tok))
        starts += [len(tokens) + int(o) for o in off]
        tokens += tok.tolist()
    return tokens, starts

def expected(docs):
    tokens, starts = [], []
    for ids in sp.encode(docs):
        starts.append(len(tokens))
        tokens += [bos] + ids + [eos]
    return tokens, starts

docs = text_docs(f"{t}/corpus.txt")
edge = text_docs(f"{t}/edge.txt")
assert edge == ["First document, one line.", "Second document\nhas two lines.", "Third\tdocument."], edge
want = expected(docs + edge)
got = load(f"{t}/text", 20000)
assert got[1] == want[1], "doc_offsets differ from python's"
assert got[0] == want[0], "tokens differ from python sentencepiece's"
assert load(f"{t}/jsonl", 20000) == expected(docs), "JSONL shards differ"
assert load(f"{t}/body", 10**6) == expected(docs), "--field body shards differ"
print(f"ok: shards match python ({len(docs) + len(edge)} documents, {len(want[0])} tokens)")
open(f"{t}/expect.txt", "w").write(f"{len(want[0])} {len(want[1])} {sha}\n")
EOF

# ---- ft inspect ----------------------------------------------------------------------------
read -r ntok ndoc sha < "$tmp/expect.txt"
nfiles=$(ls "$tmp"/text/*.h5 | wc -l)
"$ft" inspect "$tmp/text" > "$tmp/inspect.txt"
for want in "files: *$nfiles\$" "tokens: *$ntok\$" "documents: *$ndoc\$" "vocab_size: *1024\$" \
            "token dtype: *uint16\$" "bos_id: *1\$" "eos_id: *2\$" "tokenizer_sha256: *$sha\$" \
            "loss_mask: *no\$" "shard_00000.h5"; do
  grep -Eq "^ *$want" "$tmp/inspect.txt" \
    || { cat "$tmp/inspect.txt"; fail "inspect lacks /$want/"; }
done
echo "ok: inspect"

# ---- errors --------------------------------------------------------------------------------
# no_leftovers NAME: a failed run left no output folder and no staging folder beside it.
no_leftovers() {
  [[ ! -e "$tmp/$1" ]] || fail "a failed tokenize left $tmp/$1: $(ls -A "$tmp/$1")"
  if compgen -G "$tmp/.$1.tmp-*" > /dev/null; then fail "a failed tokenize left a staging folder"; fi
}
grep -q "(loading [0-9.]* s, tokenizing [0-9.]* s: [0-9]* tokens/s)" "$tmp/summary.txt" \
  || fail "the summary should give the loading time apart from the rate: $(cat "$tmp/summary.txt")"
expect_fail "missing input" "$tmp/nope.txt" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/nope.txt" --output "$tmp/e1"
no_leftovers e1
printf '{"text": "fine"}\n{"text": "also fine"}\nnot json\n' > "$tmp/bad.jsonl"
expect_fail "bad JSONL line" "$tmp/bad.jsonl:3: not valid JSON (column 2: syntax error while parsing value - invalid literal; last read: \"no\")" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/bad.jsonl" --output "$tmp/e2"
grep -q "json.exception" "$tmp/err.txt" && fail "nlohmann's code reached the user: $(cat "$tmp/err.txt")"
no_leftovers e2
# A failure also removes the folders above --output that the run created, and leaves one that
# existed as it was.
expect_fail "bad JSONL line, nested output" "$tmp/bad.jsonl:3" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/bad.jsonl" --output "$tmp/e5/a/b"
no_leftovers e5
mkdir "$tmp/e6" && echo keep > "$tmp/e6/notes.txt"
expect_fail "bad JSONL line, existing output" "$tmp/bad.jsonl:3" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/bad.jsonl" --output "$tmp/e6"
[[ "$(ls -A "$tmp/e6")" == notes.txt ]] || fail "an existing --output changed: $(ls -A "$tmp/e6")"
# ... and a successful run into it puts the shards beside what was there.
"$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/edge.txt" --output "$tmp/e6" >/dev/null
[[ "$(ls -A "$tmp/e6" | tr '\n' ' ')" == "notes.txt shard_00000.h5 " ]] \
  || fail "shards into an existing folder: $(ls -A "$tmp/e6")"
# A JSONL line past kMaxJsonlLineBytes (64 MiB) is refused by its length, in a short message.
"$PY" -c "
import sys
with open('$tmp/long.jsonl', 'w') as f:
    f.write('{\"text\": \"ok\"}\n{\"text\": \"' + 'x' * (65 << 20) + '\"}\n')
"
expect_fail "a 65 MiB line" "$tmp/long.jsonl:2: a line longer than 64 MiB" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/long.jsonl" --output "$tmp/e7"
(( $(wc -c < "$tmp/err.txt") < 400 )) || fail "the error quotes the line: $(head -c 400 "$tmp/err.txt")"
no_leftovers e7
rm "$tmp/long.jsonl"
printf '{"text": "a%s"}\n' "$(printf 'x%.0s' {1..5000})" > "$tmp/long_bad.jsonl"
printf '{"text": "unterminated %s\n' "$(printf 'y%.0s' {1..5000})" >> "$tmp/long_bad.jsonl"
expect_fail "a long bad line" "$tmp/long_bad.jsonl:2: not valid JSON (column 5024: syntax error while parsing value - invalid string: missing closing quote" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/long_bad.jsonl" --output "$tmp/e8"
(( $(wc -c < "$tmp/err.txt") < 400 )) || fail "the error quotes the line: $(head -c 400 "$tmp/err.txt")"
# Invalid UTF-8 in JSONL: each maximal invalid subpart is U+FFFD (as Python's
# errors="replace"), the same tokens as the text with U+FFFD written out.
printf '{"text": "caf\xc3 \xe2\x82x \xff\xfe ok"}\n' > "$tmp/invalid.jsonl"
printf '{"text": "caf\xef\xbf\xbd \xef\xbf\xbdx \xef\xbf\xbd\xef\xbf\xbd ok"}\n' > "$tmp/replaced.jsonl"
for f in invalid replaced; do
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/$f.jsonl" --output "$tmp/$f" \
    >/dev/null || fail "tokenize $f.jsonl"
done
"$PY" -c "
import h5py, sys
a, b = (h5py.File('$tmp/' + n + '/shard_00000.h5')['tokens'][:].tolist() for n in ('invalid', 'replaced'))
sys.exit(0 if a == b else 'invalid UTF-8 tokens %s differ from U+FFFD ones %s' % (a, b))
" || fail "invalid UTF-8 in JSONL"
echo "ok: invalid UTF-8 in JSONL is U+FFFD"
# Tokenizer files that are not regular files: refused by what they are, without reading
# (/dev/zero would be read for ever, a FIFO would block); a broken one is bad input too (2).
for bad in /dev/zero "$tmp/fifo.model"; do
  [[ $bad == /dev/zero ]] || mkfifo "$bad"
  rc=0
  timeout 20 "$ft" tokenize --tokenizer "$bad" --input "$tmp/edge.txt" --output "$tmp/e9" \
    >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
  [[ $rc == 2 ]] || fail "tokenizer $bad: exit $rc, expected 2: $(cat "$tmp/err.txt")"
  grep -Eq "tokenizer $bad: is a (character device|FIFO)" "$tmp/err.txt" \
    || fail "tokenizer $bad: $(cat "$tmp/err.txt")"
  no_leftovers e9
done
head -c 3000 "$tmp/tok.model" > "$tmp/broken.model"
rc=0
"$ft" tokenize --tokenizer "$tmp/broken.model" --input "$tmp/edge.txt" --output "$tmp/e9" \
  >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
[[ $rc == 2 ]] || fail "a broken tokenizer exited $rc, expected 2"
grep -q "broken.model: not a SentencePiece model" "$tmp/err.txt" || fail "$(cat "$tmp/err.txt")"
grep -q "\.cc(" "$tmp/err.txt" && fail "SentencePiece's source location reached the user"
echo "ok: tokenizer files"
printf '{"text": "fine"}\n{"other": "x"}\n' > "$tmp/nofield.jsonl"
expect_fail "JSONL without the field" "$tmp/nofield.jsonl:2: no field \"text\"" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/nofield.jsonl" --output "$tmp/e3"
expect_fail "output already holds shards" "already holds shards" \
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/edge.txt" --output "$tmp/text"
expect_fail "not a tokenizer" "$tmp/edge.txt" \
  "$ft" tokenize --tokenizer "$tmp/edge.txt" --input "$tmp/edge.txt" --output "$tmp/e4"

# SIGINT or SIGTERM mid-run: exit 130 / 143, and nothing left: no output folder, no staging
# folder, no .tmp file (the run is large enough to be still writing shards when signalled, and
# the signal is sent once the first shard is complete).
for i in $(seq 40); do cat "$tmp/corpus.txt"; done > "$tmp/big.txt"
for sig in INT TERM; do
  "$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/big.txt" --output "$tmp/sig/out" \
    --shard-tokens 5000 --threads 1 >"$tmp/out.txt" 2>"$tmp/err.txt" &
  pid=$!
  for _ in $(seq 600); do
    compgen -G "$tmp/sig/.out.tmp-$pid/shard_00000.h5" > /dev/null && break
    sleep 0.05
  done
  compgen -G "$tmp/sig/.out.tmp-$pid/shard_00000.h5" > /dev/null \
    || fail "SIG$sig: no shard written before the run ended"
  kill -"$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  want=$([[ $sig == INT ]] && echo 130 || echo 143)
  [[ $rc == "$want" ]] || fail "SIG$sig: exit $rc, expected $want: $(cat "$tmp/err.txt")"
  grep -q "stopped by SIG$sig" "$tmp/err.txt" || fail "SIG$sig: $(cat "$tmp/err.txt")"
  [[ ! -e "$tmp/sig" ]] || fail "SIG$sig left files: $(find "$tmp/sig")"
done
rm "$tmp/big.txt"
echo "ok: SIGINT and SIGTERM remove what the run wrote"

cp -r "$tmp/text" "$tmp/corrupt"
head -c 3000 "$tmp/text/shard_00001.h5" > "$tmp/corrupt/shard_00001.h5"  # truncated
expect_fail "inspect truncated shard" "$tmp/corrupt/shard_00001.h5" "$ft" inspect "$tmp/corrupt"
echo "garbage" > "$tmp/corrupt/shard_00001.h5"
expect_fail "inspect corrupt shard" "$tmp/corrupt/shard_00001.h5" "$ft" inspect "$tmp/corrupt"
mkdir "$tmp/empty"
expect_fail "inspect other folder" "not a shard folder, checkpoint or Hugging Face folder" \
  "$ft" inspect "$tmp/empty"
expect_fail "inspect missing path" "$tmp/missing" "$ft" inspect "$tmp/missing"
echo "PASS test_tokenize"
