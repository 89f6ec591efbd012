#!/usr/bin/env bash
# Bounded inputs (issue 7, point 8): what a mistyped path or value must not do to a machine.
#   - a recipe that is a device or a huge file is refused by size (exit 2), without reading it all;
#   - runtime.threads is bounded (exit 2 naming the key), not a crash;
#   - a value that is not UTF-8 is refused when the recipe is read, naming the key and line;
#   - a model whose `ft plan` peak exceeds the memory left is refused before anything is
#     allocated (exit 1, the plan's figure), quickly and with a small RSS;
#   - a checkpoint.dir that cannot be created or written is found before step 1 (exit 1).
#   bash tests/cli/test_bounds.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }
run_ft() { run_rc "$1" "$ft" "${@:2}"; }  # WANT_RC ARGS...

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:1" --vocab 97 --samples 20 \
  --seq-len 16 --seed 0
cat > "$tmp/r.yaml" <<YAML
run: {name: t, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, seq_len: 16}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 2}
checkpoint: {every_steps: 2}
runtime: {threads: 1}
YAML

# 1. Recipes by size: a device that never ends and a 2 MiB file.
run_ft 2 validate /dev/zero
has_err "/dev/zero: this is a character device, not a recipe file"
# A FIFO with no writer: refused at once, never waited on.
mkfifo "$tmp/fifo.yaml"
timeout 20 "$ft" validate "$tmp/fifo.yaml" > "$tmp/out.txt" 2> "$tmp/err.txt" && fail "a FIFO recipe passed"
has_err "fifo.yaml: this is a FIFO (named pipe), not a recipe file"
head -c $((2 << 20)) /dev/zero | tr '\0' '#' > "$tmp/huge.yaml"
run_ft 2 train "$tmp/huge.yaml"
has_err "larger than 1 MiB"
run_ft 2 validate "$tmp"
has_err "is actually a directory"

# 2. runtime.threads: 100000 crashed OpenMP before; now a recipe error naming the key.
run_ft 2 validate "$tmp/r.yaml" runtime.threads=100000
has_err "runtime.threads: 100000 is out of range: must be in [0, 1024]"

# 3. Not UTF-8: a Latin-1 é in run.name, in the file (line 1) and on the command line.
printf 'run: {name: caf\xe9}\n' > "$tmp/latin1.yaml"
sed 1d "$tmp/r.yaml" >> "$tmp/latin1.yaml"
run_ft 2 validate "$tmp/latin1.yaml"
has_err "latin1.yaml:1:"
has_err "run.name: expected UTF-8 text"
run_ft 2 validate "$tmp/r.yaml" "checkpoint.dir=$tmp/ck$(printf '\xc3\x28')"
has_err "checkpoint.dir: expected UTF-8 text"
run_ft 0 validate "$tmp/r.yaml" "run.name=café-ü-日本"

# 4. A model far larger than memory: refused by the plan before any allocation, in well under a
#    second of work and without growing (the old path allocated until the OS killed it).
# (10^5 layers of a 10^6-wide MLP: 10^13 parameters, within every key's range.)
/usr/bin/time -f '%M' -o "$tmp/rss.txt" "$ft" train "$tmp/r.yaml" model.n_layers=100000 \
  model.ffn_dim=1000000 > "$tmp/out.txt" 2> "$tmp/err.txt" && fail "a 10^13-parameter model was not refused"
has_err "by \`ft plan\`"
has_err "of memory is available here; nothing was allocated"
rss_kb=$(tail -1 "$tmp/rss.txt")
(( rss_kb < 500000 )) || fail "refusing the model used ${rss_kb} KiB of memory"
[[ ! -e "$tmp/out/metrics.jsonl" ]] || fail "metrics written for a refused model"

# 5. checkpoint.dir that cannot be created (a file is in the way) or written: exit 1 before step 1.
touch "$tmp/a_file"
run_ft 1 train "$tmp/r.yaml" "checkpoint.dir=$tmp/a_file/ck"
has_err "checkpoint.dir $tmp/a_file/ck cannot be created: Not a directory"
[[ ! -s "$tmp/out/metrics.jsonl" ]] || fail "steps ran before the checkpoint.dir check"
if [[ $(id -u) != 0 ]]; then  # root writes through permission bits; the check above covers it
  mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
  run_ft 1 train "$tmp/r.yaml" "checkpoint.dir=$tmp/ro"
  has_err "is not writable on rank 0"
fi
# The same recipe with a usable folder trains and saves.
run_ft 0 train "$tmp/r.yaml" "checkpoint.dir=$tmp/ck"
[[ -f "$tmp/ck/latest" ]] || fail "no checkpoint saved into a writable checkpoint.dir"
ls -A "$tmp/ck" | grep -q '^\.ft_write_test' && fail "the write probe was left behind"
echo "test_bounds: ok"
