#!/usr/bin/env bash
# Progress on long work (DESIGN.md §7 "Progress on long work", core/progress.h), each stage on a
# terminal (a pseudo-terminal from script(1); FT_PROGRESS_EVERY_S=0 draws every update, so a
# tiny model shows its intermediate states) and in a log (stderr to a file):
#  - ft tokenize: a live line with the percentage of the inputs' bytes, the file (k of N), the
#    documents, tokens and tokens/s, an ETA; in a log none of it, only the summary line;
#  - ft train resuming: "reading step_N" live, and in a log exactly one line when it is read;
#  - ft export: a live line of the tensor bytes written; in a log only the files it wrote;
#  - ft train from a Hugging Face folder: "loading weights" live by group, in a log one line.
#   bash tests/cli/test_progress.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
PY=/usr/bin/python3
unset FT_PROGRESS

# on_tty LOG CMD...: runs CMD under a pseudo-terminal, its output (both streams) into LOG.
on_tty() {
  local log=$1 cmd="" a
  shift
  for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done
  FT_PROGRESS_EVERY_S=0 script -qec "$cmd" /dev/null > "$log" 2>&1 || fail "$cmd: $(tail -3 "$log")"
}
# lines LOG PATTERN: how many lines of LOG (carriage returns end lines too) match PATTERN.
lines() { tr '\r' '\n' < "$1" | grep -cE -- "$2" || true; }

# ---- ft tokenize ------------------------------------------------------------------------------
"$PY" "$src/scripts/make_corpus.py" --out "$tmp/corpus.txt" --size-mb 0.2 \
  --tokenizer "$tmp/tok.model" --vocab-size 512 > /dev/null
head -c 100000 "$tmp/corpus.txt" > "$tmp/a.txt"
tail -c +100001 "$tmp/corpus.txt" > "$tmp/b.txt"
tokenize=("$ft" tokenize --tokenizer "$tmp/tok.model" --input "$tmp/a.txt" "$tmp/b.txt" --threads 1)
on_tty "$tmp/tok_tty.txt" "${tokenize[@]}" --output "$tmp/shards_tty"
for k in 1 2; do
  (($(lines "$tmp/tok_tty.txt" "^ft: tokenize: [0-9]+% [0-9.]+ KiB of [0-9.]+ KiB, [0-9.]+ [KM]iB/s, (ETA [0-9]+:[0-9]{2}, )?file $k of 2 .*/[ab]\.txt, [0-9.k]+ documents, [0-9.kM]+ tokens, [0-9.kM]+ tokens/s") > 0)) ||
    fail "tokenize on a terminal: no live line for file $k: $(tr '\r' '\n' < "$tmp/tok_tty.txt" | head -5)"
done
(($(lines "$tmp/tok_tty.txt" "^ft: tokenize: [0-9]+% .*, ETA [0-9]+:[0-9]{2}, file 1 of 2") > 0)) ||
  fail "tokenize on a terminal: no ETA while the first file is read"
grep -q $'\r\033\[Ktokenized 2 files' "$tmp/tok_tty.txt" ||
  fail "tokenize on a terminal: the live line is not cleared before the summary"
"${tokenize[@]}" --output "$tmp/shards" > "$tmp/tok.out" 2> "$tmp/tok.err"
[[ ! -s $tmp/tok.err ]] || fail "tokenize in a log: progress lines on stderr: $(head -3 "$tmp/tok.err")"
grep -q '^tokenized 2 files' "$tmp/tok.out" || fail "tokenize: no summary: $(cat "$tmp/tok.out")"
echo "tokenize: live line with percent, file k of 2, tokens/s, ETA; nothing but the summary in a log"

# ---- ft train resuming, ft export, ft train from the exported folder --------------------------
cat > "$tmp/r.yaml" << YAML
run: {name: progress, output_dir: $tmp/run, seed: 1}
model: {dim: 32, n_layers: 3, n_heads: 2, n_kv_heads: 2, ffn_dim: 64, vocab_size: 512, max_seq_len: 32}
data: {train: $tmp/shards, seq_len: 32}
training: {steps: 2, micro_batch_size: 2, global_batch_size: 2}
optimizer: {lr: 0.001}
checkpoint: {every_steps: 2}
runtime: {threads: 1}
YAML
"$ft" train "$tmp/r.yaml" > "$tmp/t1.log" 2>&1 || fail "train: $(tail -3 "$tmp/t1.log")"
[[ $(lines "$tmp/t1.log" '^ft: loading weights') == 0 ]] ||
  fail "a random init reports loading weights: $(grep 'loading weights' "$tmp/t1.log")"
"$ft" train "$tmp/r.yaml" training.steps=3 > "$tmp/t2.log" 2>&1 || fail "resume: $(tail -3 "$tmp/t2.log")"
[[ $(lines "$tmp/t2.log" '^ft: reading step_00000002') == 1 ]] &&
  grep -qE '^ft: reading step_00000002: [0-9.]+ KiB of [0-9.]+ KiB in [0-9.]+ m?s \([0-9.]+ [KMG]iB/s\)$' "$tmp/t2.log" ||
  fail "resume in a log: not one line for reading the checkpoint: $(grep 'reading' "$tmp/t2.log")"
rm -rf "$tmp/run/checkpoints/step_00000003"
echo step_00000002 > "$tmp/run/checkpoints/latest"
on_tty "$tmp/t3.txt" "$ft" train "$tmp/r.yaml" training.steps=3 run.output_dir="$tmp/run"
(($(lines "$tmp/t3.txt" '^ft: reading step_00000002: [0-9]+% .*, layers\.[0-9]') > 0)) ||
  fail "resume on a terminal: no live line by group: $(tr '\r' '\n' < "$tmp/t3.txt" | grep reading)"
echo "resume: reading step_00000002 live by group, one line in a log"

"$ft" export "$tmp/run/checkpoints/step_00000002" --output "$tmp/hf" > "$tmp/e1.out" 2> "$tmp/e1.err" ||
  fail "export: $(cat "$tmp/e1.err")"
[[ ! -s $tmp/e1.err ]] || fail "export in a log: progress on stderr: $(head -3 "$tmp/e1.err")"
on_tty "$tmp/e2.txt" "$ft" export "$tmp/run/checkpoints/step_00000002" --output "$tmp/hf2"
(($(lines "$tmp/e2.txt" '^ft: export: [0-9]+% [0-9.]+ KiB of [0-9.]+ KiB, .*, layers\.1') > 0)) ||
  fail "export on a terminal: no live line: $(tr '\r' '\n' < "$tmp/e2.txt" | head -5)"
grep -q $'\r\033\[K  wrote model.safetensors' "$tmp/e2.txt" ||
  fail "export on a terminal: the live line is not cleared before 'wrote'"
echo "export: live line of the tensor bytes, cleared before each file's line"

"$ft" train "$tmp/r.yaml" model.from="$tmp/hf" run.output_dir="$tmp/from" training.steps=1 \
  checkpoint.every_steps=0 > "$tmp/f1.log" 2>&1 || fail "train from HF: $(tail -3 "$tmp/f1.log")"
[[ $(lines "$tmp/f1.log" '^ft: loading weights:') == 1 ]] &&
  grep -qE '^ft: loading weights: [0-9.k]+/[0-9.k]+ parameters in ' "$tmp/f1.log" ||
  fail "loading weights in a log: not one line: $(grep 'loading weights' "$tmp/f1.log")"
on_tty "$tmp/f2.txt" "$ft" train "$tmp/r.yaml" model.from="$tmp/hf" run.output_dir="$tmp/from2" \
  training.steps=1 checkpoint.every_steps=0
(($(lines "$tmp/f2.txt" '^ft: loading weights: [0-9]+% .* parameters/s, ETA .*, layers\.[0-9]') > 0)) ||
  fail "loading weights on a terminal: no live line: $(tr '\r' '\n' < "$tmp/f2.txt" | grep weights)"
echo "loading weights: live by group, one line in a log"
echo "test_progress: all checks passed"
