#!/usr/bin/env bash
# ft validate = ft train (DESIGN.md §4): for each case below, a recipe that is valid on its own
# but that ft train refuses before its first step (the machine, the layout's world, the run's
# folders, its checkpoints, its data) is run through both:
#  - ft train (one process, or --nproc 2) exits with the case's code (2 bad input, 1 the machine
#    cannot) before step 1, its message one line, from rank 0 only, no MPI abort banner;
#  - ft validate with the same world (--nproc 2 where train had it) exits 2 and prints that very
#    message (the `ft: error:` line of train equals one of validate's).
# A recipe problem of the recipe itself (a key's range) is compared the same way.
#   bash tests/cli/test_validate_train.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
t_all=$SECONDS
cd "$tmp"

/usr/bin/python3 "$src/tests/ref/make_shards.py" data --vocab 128 --samples 16 --seq-len 16 \
  --seed 2 > /dev/null
cat > r.yaml << YAML
run: {name: vt, output_dir: $tmp/out, seed: 5}
model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 64, vocab_size: 128, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 16}
training: {steps: 2, micro_batch_size: 1, global_batch_size: 2}
checkpoint: {every_steps: 1}
runtime: {threads: 1}
YAML
# A checkpoint of this model, and one of another (model.dim 64).
"$ft" train r.yaml run.output_dir="$tmp/saved" > saved.log 2>&1 || fail "saving: $(tail -3 saved.log)"
"$ft" train r.yaml run.output_dir="$tmp/other" model.dim=64 > other.log 2>&1 ||
  fail "saving the other model: $(tail -3 other.log)"
# A damaged shard: a copy of the data with one shard cut short.
cp -r data damaged && truncate -s 1000 damaged/shard_00001.h5
touch a_file

cases=0
# same_refusal LABEL WANT_RC [--nproc 2] [ARGS...]: ft train r.yaml ARGS exits WANT_RC with one
# `ft: error:` message; ft validate r.yaml ARGS (--nproc 2 as given) exits 2 printing it.
same_refusal() {
  local label=$1 want=$2 rc=0
  shift 2
  local launch=() args=("$@")
  if [[ ${1:-} == --nproc ]]; then
    launch=(--nproc "$2")
    args=("${@:3}")
  fi
  "$ft" train r.yaml "${args[@]}" "${launch[@]}" > "$label.train.out" 2> "$label.train.err" || rc=$?
  [[ $rc == "$want" ]] ||
    fail "$label: ft train exited $rc, expected $want: $(tail -5 "$label.train.err")"
  grep -q '^step 1/' "$label.train.out" && fail "$label: ft train ran a step before refusing"
  local msg
  msg=$(grep '^ft: error: ' "$label.train.err" | grep -v '^ft: error: the job ended' || true)
  [[ $(grep -c . <<< "$msg") == 1 ]] ||
    fail "$label: ft train printed $(grep -c . <<< "$msg") error lines: $(cat "$label.train.err")"
  if grep -q 'MPI_ABORT\|mpirun has exited due to\|stopping after this step' "$label.train.err"; then
    fail "$label: ft train aborted the job instead of refusing: $(cat "$label.train.err")"
  fi
  rc=0
  "$ft" validate r.yaml "${args[@]}" "${launch[@]}" > "$label.validate.out" \
    2> "$label.validate.err" || rc=$?
  [[ $rc == 2 ]] || fail "$label: ft validate exited $rc, expected 2: $(cat "$label.validate.err")"
  # Recipe issues print as FILE:LINE:COL: ... in validate, inside train's one error. The memory
  # available is measured by each process, a moment apart: its figure is left out.
  local avail='s/only [0-9.]+ [KMGT]?i?B of memory/only N of memory/'
  msg=$(sed -E "$avail" <<< "$msg")
  sed -Ei "$avail" "$label.validate.err"
  local body=${msg#ft: error: }
  if ! grep -qxF -- "$msg" "$label.validate.err" &&
    ! grep -qF -- "$body" < <(sed 's/^/ft: error: /' "$label.validate.err"); then
    fail "$label: ft validate did not say what ft train said:
  train:    $msg
  validate: $(cat "$label.validate.err")"
  fi
  cases=$((cases + 1))
  echo "$label: ft train exit $want, ft validate exit 2, same message: ${body:0:110}..."
}

same_refusal range 2 parallel.reduce_bucket_mb=1e-9
same_refusal nccl_on_cpu 2 runtime.communicator=nccl
same_refusal nccl_on_cpu_nproc 2 --nproc 2 runtime.communicator=nccl
same_refusal bf16_reduce_over_mpi 2 --nproc 2 parallel.reduce_dtype=bf16
same_refusal cuda_without_gpu 1 runtime.device=cuda
same_refusal memory 1 model.n_layers=100000 model.ffn_dim=1000000
same_refusal memory_nproc 1 --nproc 2 model.n_layers=100000 model.ffn_dim=1000000
same_refusal resume_never 2 run.output_dir="$tmp/saved" --resume never
same_refusal resume_path 2 --resume "$tmp/data"
same_refusal other_model 2 run.output_dir="$tmp/other"
same_refusal damaged_shard 1 data.train="$tmp/damaged"
same_refusal damaged_shard_nproc 1 --nproc 2 data.train="$tmp/damaged"
same_refusal checkpoint_dir_file 1 checkpoint.dir="$tmp/a_file"
same_refusal checkpoint_dir_under_file 1 checkpoint.dir="$tmp/a_file/ck"
same_refusal output_dir_file 1 run.output_dir="$tmp/a_file"

echo "time: whole test: $((SECONDS - t_all)) s"
echo "test_validate_train: $cases cases, ft validate refused each as ft train did"
