#!/usr/bin/env bash
# Errors that speak to users (DESIGN.md §4 "Errors"): every case below is a bad input a user
# can give (a wrong path, a device or FIFO where a file goes, a broken file, an out-of-range or
# NaN number, a malformed override) to each command. For each:
#  - the exit code is the README's (2 bad input; 1 what the machine cannot do);
#  - stderr says what failed in the user's terms: the case's key words (file, key, value);
#  - it never shows what only a developer could use: a source file and line, a check
#    expression, "internal error", a library's error code ([json.exception.parse_error.101],
#    sentencepiece_processor.cc(1101)), an uncaught exception, an MPI abort, DBL_MAX's digits;
#  - no line is longer than 2000 bytes (a message quotes at most a short excerpt of the input),
#    and stderr is valid UTF-8 without control characters but tab and newline.
# A case is one line of the table: NAME|WANT_RC|KEY WORDS|COMMAND... (the command after `ft`).
#   bash tests/cli/test_error_messages.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
cd "$tmp"

/usr/bin/python3 "$src/tests/ref/make_shards.py" data --vocab 128 --samples 8 --seq-len 16 \
  --seed 2 > /dev/null
cat > r.yaml << YAML
run: {name: em, output_dir: $tmp/out}
model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 64, vocab_size: 128, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 16}
training: {steps: 1, micro_batch_size: 1, global_batch_size: 1}
runtime: {threads: 1}
YAML
printf 'model: {dim: 32\n  n_layers: [\n' > syntax.yaml
mkdir folder bad_hf
printf '{"model_type": "llama", "hidden_size": 32,, }' > bad_hf/config.json
touch bad_hf/model.safetensors
mkdir bad_adapter
printf '{"peft_type": "LORA", "r": 8,, }' > bad_adapter/adapter_config.json
touch bad_adapter/adapter_model.safetensors
mkfifo fifo
printf 'not a checkpoint' > not_ckpt
mkdir ckdir && printf 'step_00000007\n' > ckdir/latest
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": [tru\n' > bad.jsonl
printf '{"text": "w1x7 w2x1"}\n{"text": tru\n' > bad_text.jsonl
head -c 300000 /dev/zero | tr '\0' 'x' | sed 's/^/{"text": /' > long.jsonl

/usr/bin/python3 - << 'PY'
import sentencepiece as spm
words = [f"w{i}x{i * 7 % 13}" for i in range(600)]
open("corpus.txt", "w").write("\n".join(" ".join(words[i:i + 12]) for i in range(0, 600, 12)))
spm.SentencePieceTrainer.train(input="corpus.txt", model_prefix="tok", vocab_size=96,
                               model_type="bpe", minloglevel=2)
PY

checked=0
check_case() {
  local name=$1 want=$2 words=$3
  shift 3
  local rc=0
  timeout 60 "$ft" "$@" > "$name.out" 2> "$name.err" < /dev/null || rc=$?
  [[ $rc == "$want" ]] || fail "$name: \`ft $*\` exited $rc, expected $want: $(head -c 600 "$name.err")"
  local IFS=';'
  for w in $words; do
    grep -qF -- "$w" "$name.err" || fail "$name: stderr lacks '$w': $(head -c 600 "$name.err")"
  done
  unset IFS
  local bad
  bad=$(grep -nE '\.(cpp|cc|h|hpp|cu)[:(][0-9]|check `|internal error|json\.exception|sentencepiece_processor|terminate called|what\(\):|MPI_ABORT|1\.79769e\+?308|179769313486231' \
    "$name.err" || true)
  [[ -z $bad ]] || fail "$name: a message for developers reached the user: $bad"
  (($(awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }' "$name.err") <= 2000)) ||
    fail "$name: a line of stderr is over 2000 bytes"
  iconv -f UTF-8 -t UTF-8 "$name.err" > /dev/null 2>&1 || fail "$name: stderr is not valid UTF-8"
  if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$name.err"; then
    fail "$name: stderr holds control characters"
  fi
  checked=$((checked + 1))
}

while IFS='|' read -r name want words cmd; do
  [[ -z $name || $name == \#* ]] && continue
  eval "args=($cmd)"
  check_case "$name" "$want" "$words" "${args[@]}"
done << 'CASES'
# train and validate: the recipe file
recipe_missing|2|no_such.yaml|validate no_such.yaml
recipe_folder|2|is actually a directory: folder|validate folder
recipe_device|2|/dev/zero: this is a character device|train /dev/zero
recipe_fifo|2|fifo: this is a FIFO (named pipe)|validate fifo
recipe_syntax|2|syntax.yaml:2:11: YAML syntax error|validate syntax.yaml
# the recipe's values
unknown_key|2|training.stepz;did you mean|validate r.yaml training.stepz=3
override_form|2|nonsense: not a KEY=VALUE override|validate r.yaml nonsense
lr_nan|2|optimizer.lr|train r.yaml optimizer.lr=nan
lr_inf|2|optimizer.lr|validate r.yaml optimizer.lr=inf
bucket_tiny|2|parallel.reduce_bucket_mb: 1e-9 is out of range|train r.yaml parallel.reduce_bucket_mb=1e-9
bucket_huge|2|parallel.reduce_bucket_mb: 1e300 is out of range|validate r.yaml parallel.reduce_bucket_mb=1e300
steps_negative|2|training.steps: -1 is out of range|train r.yaml training.steps=-1
threads_huge|2|runtime.threads: 100000 is out of range|validate r.yaml runtime.threads=100000
data_missing|2|data.train|validate r.yaml data.train=nowhere
long_choice|2|runtime.device: "xxxxxxxxxx|validate r.yaml runtime.device=$(head -c 100000 /dev/zero | tr '\0' x)
long_key|2|unknown key in override|validate r.yaml training.$(head -c 100000 /dev/zero | tr '\0' y)=1
long_number|2|training.steps|validate r.yaml training.steps=1$(head -c 5000 /dev/zero | tr '\0' 0)
model_from_bad_json|2|bad_hf/config.json;not valid JSON|validate r.yaml model.from=bad_hf
adapter_from_bad_json|2|adapter.from;bad_adapter/adapter_config.json;not valid JSON|validate r.yaml adapter.type=lora adapter.from=bad_adapter
long_target_module|2|adapter.target_modules: "xxxxxxxxxx|validate r.yaml adapter.type=lora adapter.target_modules=[$(head -c 100000 /dev/zero | tr '\0' x)]
# the command line
nproc_zero|2|--nproc|train r.yaml --nproc 0
resume_not_ckpt|2|--resume;not a checkpoint|train r.yaml --resume not_ckpt
resume_latest_gone|2|ckdir/latest names "step_00000007", which is not in|train r.yaml --resume ckdir
plan_world_zero|2|--world|plan r.yaml --world 0
plan_latency_negative|2|--latency-us|plan r.yaml --latency-us -1
generate_temperature_nan|2|--temperature|generate saved --prompt hi --temperature nan
generate_temperature_negative|2|--temperature|generate saved --prompt hi --temperature -1
generate_top_p|2|--top-p|generate saved --prompt hi --top-p 2
generate_source_missing|2|no_such_model|generate no_such_model --prompt hi
generate_latest_gone|2|ckdir/latest names|generate ckdir --prompt hi
export_missing|2|no_such_ckpt|export no_such_ckpt --output out_hf
export_shard_size|2|--max-shard-size|export ckdir --output out_hf --max-shard-size 5XB
inspect_device|2|/dev/zero|inspect /dev/zero
inspect_missing|2|no_such_thing|inspect no_such_thing
tokenize_tokenizer_device|2|/dev/zero: is a character device|tokenize --tokenizer /dev/zero --input corpus.txt --output t1
tokenize_input_device|2|/dev/zero|tokenize --tokenizer tok.model --input /dev/zero --output t2
tokenize_input_fifo|2|fifo|tokenize --tokenizer tok.model --input fifo --output t3
tokenize_bad_jsonl|2|bad_text.jsonl:2;not valid JSON|tokenize --tokenizer tok.model --input bad_text.jsonl --output t4
tokenize_field_type|2|bad.jsonl:1: field "messages" is an array, expected a string|tokenize --tokenizer tok.model --input bad.jsonl --field messages --output t7
tokenize_field_chat|2|--field body applies to JSONL documents;--format chat reads records with fixed keys|tokenize --tokenizer tok.model --input bad.jsonl --format chat --field body --output t8
tokenize_long_line|2|long.jsonl:1|tokenize --tokenizer tok.model --input long.jsonl --output t5
tokenize_threads|2|--threads;100000|tokenize --tokenizer tok.model --input corpus.txt --output t8 --threads 100000
tokenize_chat_spm|2|tok.model|tokenize --tokenizer tok.model --input bad.jsonl --format chat --output t6
plot_missing|2|no_such_run;does not exist|plot no_such_run --output p.svg
plot_device|2|/dev/zero: is a character device|plot /dev/zero --output p.svg
plot_fifo|2|fifo|plot fifo --output p.svg
plot_no_step|2|bad_text.jsonl:1: "step" is missing|plot bad_text.jsonl --output p.svg
plot_extension|2|--output "p.gif";.svg or .png|plot bad_text.jsonl --output p.gif
plot_smooth_nan|2|--smooth|plot bad_text.jsonl --output p.svg --smooth nan
plot_width|2|--width;100000|plot bad_text.jsonl --output p.svg --width 100000
help_unknown|2|no command 'NOPE'|help NOPE
CASES

# An environment variable case (the table runs `ft ARGS` only).
FT_CPU_ISA=bogus check_case cpu_isa 1 "FT_CPU_ISA=bogus is not an instruction set" train r.yaml
FT_GEMM16=bogus check_case gemm16 1 "FT_GEMM16=bogus is not a 16-bit GEMM path;onednn, packed or widen" \
  train r.yaml training.precision=bf16

echo "test_error_messages: $checked cases, each with its exit code, its words, no developer text"
