#!/usr/bin/env bash
# One job per run, no orphans, and signals as documented (DESIGN.md §4 "One job per run",
# "Signals"), on a tiny model whose runs never end by themselves (training.steps 1000000):
#  1. The lock. While `ft train` (one process, then --nproc 2) trains, the same recipe again is
#     refused with exit 2 before any work, naming the holder's host and pid, by `ft train` and by
#     `ft validate` alike; after the holder is killed with SIGKILL (no clean-up of its own) the
#     folder is free at once: the next run takes it and resumes.
#  2. No orphans. SIGKILL to the `ft train --nproc 2` launcher: mpirun and both ranks end within
#     10 s. SIGKILL to mpirun: both ranks end, saying their launcher ended, and so does ft.
#  3. Signals. One process: SIGINT -> a checkpoint after the step, exit 75; SIGINT twice -> exit
#     130 at once; SIGTERM twice -> 143; a SIGINT during the start-up (a test hook raises it
#     after the handlers are in place) -> exit 75 before step 1, nothing saved. --nproc 2:
#     SIGINT to the launcher's process group (what a terminal's Ctrl-C does) -> every rank saves,
#     exit 75 from ft; SIGINT twice -> 130 and nothing left running; SIGTERM twice -> 143.
# After each case: no process of the test's runs is left (the recipe path is in every command
# line: pgrep -f).
#   bash tests/cli/test_signals.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
source "$src/tests/cli/mpi_ranks.sh"  # rank_pid PATTERN RANK
t_all=$SECONDS
# The runs sleep 20 ms before each step (a test hook): the background runs this test keeps
# training would otherwise take both cores of a 2-core host from the processes it checks (ft
# validate beside two --nproc ranks took 20 s to start under ctest -j2).
export FT_TEST_STEP_SLEEP_MS=20
cleanup() {
  pkill -KILL -f -- "$tmp/r.yaml" 2> /dev/null || true
  remove_tmp
}
trap cleanup EXIT

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 256 --samples 64 \
  --seq-len 32 --seed 3
cat > "$tmp/r.yaml" << YAML
run: {name: signals, output_dir: $tmp/out, seed: 5}
model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn_dim: 64, vocab_size: 256, max_seq_len: 32}
data: {train: $tmp/data, seq_len: 32}
training: {steps: 1000000, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 0.001}
checkpoint: {every_steps: 1000000}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# Processes of this test's runs (ft, mpirun, ranks): their command lines hold the recipe path.
count_left() { pgrep -c -f -- "$tmp/r.yaml" || true; }
# no_process_left LABEL [SECONDS]: waits up to SECONDS (default 10) for them all to end.
no_process_left() {
  local label=$1 limit=${2:-10} t0=$SECONDS
  while (($(count_left) > 0)); do
    ((SECONDS - t0 < limit)) || {
      ps -o pid,ppid,pgid,stat,args -p "$(pgrep -d, -f -- "$tmp/r.yaml")" >&2 || true
      fail "$label: $(count_left) processes still running $limit s later"
    }
    sleep 0.1
  done
}
loss_lines() {
  local n
  n=$(grep -c '"loss"' "$1" 2> /dev/null) || true
  echo "${n:-0}"
}
# start LABEL OUT [ARGS...]: `ft train r.yaml run.output_dir=OUT ARGS` in the background, in a
# process group of its own (as a terminal's foreground job); sets job (its pid = its group).
start() {
  local label=$1 out=$2
  shift 2
  setsid "$ft" train "$tmp/r.yaml" run.output_dir="$out" "$@" > "$tmp/$label.log" 2>&1 &
  job=$!
}
# training LABEL OUT: waits until OUT/metrics.jsonl shows 2 steps.
training() {
  local t0=$SECONDS
  until (($(loss_lines "$2/metrics.jsonl") >= 2)); do
    ((SECONDS - t0 < 120)) || fail "$1: no progress in 120 s: $(tail -5 "$tmp/$1.log")"
    kill -0 "$job" 2> /dev/null || fail "$1: ended early: $(tail -5 "$tmp/$1.log")"
    sleep 0.1
  done
}
# ended LABEL WANT_RC [SECONDS]: waits for $job (at most SECONDS, default 60), checks its code.
ended() {
  local rc=0
  timeout "${3:-60}" tail --pid="$job" -f /dev/null || fail "$1: still running ${3:-60} s later"
  wait "$job" || rc=$?
  [[ $rc == "$2" ]] || fail "$1: exit code $rc, expected $2: $(tail -8 "$tmp/$1.log")"
}
log_has() { grep -qF -- "$2" "$tmp/$1.log" || fail "$1: log lacks '$2': $(tail -8 "$tmp/$1.log")"; }
# saved_at OUT: the step `latest` names (fails unless complete).
saved_at() {
  local latest
  latest=$(cat "$1/checkpoints/latest" 2> /dev/null || true)
  [[ $latest =~ ^step_[0-9]{8}$ && -f $1/checkpoints/$latest/COMPLETE ]] ||
    fail "no complete checkpoint in $1/checkpoints: $(ls "$1/checkpoints" 2>&1)"
  echo $((10#${latest#step_}))
}

# ---- 1. The lock ---------------------------------------------------------------------------
for mode in one nproc; do
  args=()
  [[ $mode == nproc ]] && args=(--nproc 2)
  start "lock_$mode" "$tmp/lock_$mode" "${args[@]}"
  holder=$job
  training "lock_$mode" "$tmp/lock_$mode"
  # The lock's holder: the process itself, or rank 0 under --nproc.
  holder_pid=$holder
  [[ $mode == nproc ]] && holder_pid=$(rank_pid "$tmp/r.yaml" 0)
  run_rc 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/lock_$mode"
  has_err "run.output_dir $tmp/lock_$mode is in use by another ft train: \"host $(hostname)"
  has_err "pid $holder_pid, since "
  lacks_out "ft: model"  # refused before any work: no model built
  run_rc 2 "$ft" validate "$tmp/r.yaml" run.output_dir="$tmp/lock_$mode"
  has_err "run.output_dir $tmp/lock_$mode is in use by another ft train: \"host $(hostname)"
  # The holder goes on undisturbed; killed with SIGKILL, it releases the folder at once.
  kill -0 "$holder" || fail "lock_$mode: the holder ended when refused twice"
  kill -KILL "$holder"
  [[ $mode == one ]] || no_process_left "lock_$mode: SIGKILL to ft --nproc"
  wait "$holder" 2> /dev/null || true
  no_process_left "lock_$mode"
  run_rc 0 "$ft" validate "$tmp/r.yaml" run.output_dir="$tmp/lock_$mode"
  run_rc 0 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/lock_$mode" training.steps=3 \
    "${args[@]}"
  echo "lock ($mode): the second job and ft validate refused, naming pid $holder_pid;" \
    "free again after SIGKILL"
done

# ---- 2. No orphans -------------------------------------------------------------------------
start orphan_mpirun "$tmp/orphan_mpirun" --nproc 2
training orphan_mpirun "$tmp/orphan_mpirun"
mpirun_pid=$(pgrep -P "$job" -x mpirun || true)
[[ -n $mpirun_pid ]] || fail "orphan_mpirun: no mpirun under ft --nproc ($job)"
kill -KILL "$mpirun_pid"
no_process_left "SIGKILL to mpirun"
wait "$job" 2> /dev/null || true
# (The ranks say why they stop, but their stderr went through mpirun, which is gone.)
echo "orphans: SIGKILL to mpirun: both ranks and ft ended"

# (SIGKILL to the ft --nproc launcher itself: case 1, nproc.)

# ---- 3. Signals ----------------------------------------------------------------------------
# One process, SIGINT: the step ends, a checkpoint of it, exit 75; the same command continues.
start int1 "$tmp/int1"
training int1 "$tmp/int1"
kill -INT "$job"
ended int1 75
k=$(saved_at "$tmp/int1")
log_has int1 "SIGINT: stopping after this step, with a checkpoint"
log_has int1 "stopped by a signal after step $k of 1000000; checkpoint step_"
no_process_left int1
echo "one process, SIGINT: exit 75, step_$k saved"

# Twice: at once, exit 130 (SIGTERM: 143). The stop's save is followed by a 30 s wait
# (FT_TEST_SLOW_SAVE), so the second signal finds the stop still in progress: the process must
# end within 20 s, not after the wait.
for sig in INT TERM; do
  FT_TEST_SLOW_SAVE=0:30 start "twice_$sig" "$tmp/twice_$sig"
  training "twice_$sig" "$tmp/twice_$sig"
  kill -$sig "$job"
  sleep 0.5
  kill -$sig "$job"
  want=130
  [[ $sig == TERM ]] && want=143
  ended "twice_$sig" $want 20
  log_has "twice_$sig" "SIG$sig again: stopping now, without a checkpoint"
  no_process_left "twice_$sig"
  echo "one process, SIG$sig twice: exit $want"
done

# A stop during the start-up: before step 1, nothing to save, exit 75.
FT_TEST_SIGNAL_AT_STARTUP=INT start startup "$tmp/startup"
ended startup 75
log_has startup "stopped by a signal before step 1 of 1000000: nothing trained since the start"
[[ ! -e $tmp/startup/checkpoints/latest ]] || fail "startup: a checkpoint was saved"
no_process_left startup
echo "one process, SIGINT during the start-up: exit 75 before step 1, nothing saved"

# --nproc 2: Ctrl-C as a terminal sends it, to the launcher's whole process group.
start nproc_int "$tmp/nproc_int" --nproc 2
training nproc_int "$tmp/nproc_int"
kill -INT -- "-$job"
ended nproc_int 75
k=$(saved_at "$tmp/nproc_int")
log_has nproc_int "ft: SIGINT: the ranks stop after this step, with a checkpoint"
log_has nproc_int "stopped by a signal after step $k of 1000000; checkpoint step_"
no_process_left nproc_int
echo "--nproc 2, SIGINT to the process group: exit 75, step_$k saved"

for sig in INT TERM; do
  FT_TEST_SLOW_SAVE=0:30 start "nproc_twice_$sig" "$tmp/nproc_twice_$sig" --nproc 2
  training "nproc_twice_$sig" "$tmp/nproc_twice_$sig"
  kill -$sig -- "-$job"
  sleep 0.5
  kill -$sig -- "-$job"
  want=130
  [[ $sig == TERM ]] && want=143
  ended "nproc_twice_$sig" $want 30
  log_has "nproc_twice_$sig" "a second stop signal: stopping the ranks now, without a checkpoint"
  no_process_left "nproc_twice_$sig"
  echo "--nproc 2, SIG$sig twice: exit $want, nothing left running"
done

echo "time: whole test: $((SECONDS - t_all)) s"
echo "test_signals: all checks passed"
