#!/usr/bin/env bash
# The collective watchdog (DESIGN.md §4, runtime.collective_timeout_s): a rank that stops
# answering ends the job with exit code 3 and a message that names the step, the collective
# and the silent rank, instead of hanging forever.
#  - The key defaults to 600 s; a negative value is a recipe error (exit 2) naming it.
#  - A checkpoint save that takes one rank 4 s longer than a 2 s timeout does not trip it.
#  - `--nproc 4 parallel.tensor=2` (data 2 x tensor 2), timeout 5 s: `kill -STOP` of rank 2
#    mid-run. The job ends with code 3 no sooner than 5 s and within 20 s of the stop; one
#    message names the step, a collective "... made no progress for 5.0 s", and "rank 2 did not
#    answer" with rank 2's pid; the ranks that answered are listed; no process of the job is
#    left, the stopped one included.
#  - The same under a plain `mpirun -np 2` (rank 1 stopped).
#  - A rank killed with SIGKILL: the job ends non-zero and not 75, and no rank claims a
#    checkpoint it did not save (mpirun sends SIGTERM to the survivors, which ft's stop handler
#    sees).
#   bash tests/cli/test_hang.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
victims=()
cleanup() {
  # A failed check must not leave a stopped rank behind for ever.
  local p
  for p in "${victims[@]}"; do
    kill -CONT "$p" 2> /dev/null || true
    kill -KILL "$p" 2> /dev/null || true
  done
  remove_tmp
}
trap cleanup EXIT
mpi_env
source "$src/tests/cli/mpi_ranks.sh"  # rank_pid PATTERN RANK

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 37 --seq-len 12 --seed 5 --mask 0.8
cat > "$tmp/r.yaml" <<YAML
run: {name: hang, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12, shuffle: true}
training: {steps: 100000, micro_batch_size: 1, global_batch_size: 8}
optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 1, collective_timeout_s: 5}
YAML

# The key: 600 s by default (as NCCL and PyTorch), never negative (exit 2, naming the key).
"$ft" validate "$tmp/r.yaml" runtime.collective_timeout_s=-1 > "$tmp/neg.log" 2>&1 &&
  fail "a negative timeout was accepted"
[[ $? == 2 ]] && grep -q 'runtime.collective_timeout_s: -1 is out of range' "$tmp/neg.log" ||
  fail "a negative timeout: not a recipe error naming the key: $(cat "$tmp/neg.log")"
sed 's/, collective_timeout_s: 5//' "$tmp/r.yaml" > "$tmp/default.yaml"
grep -q '^  collective_timeout_s: 600 ' <("$ft" validate "$tmp/default.yaml" 2> /dev/null) ||
  fail "the default is not 600 s: $("$ft" validate "$tmp/default.yaml" | grep -A3 '^runtime')"

# Starts the job in the background, waits until rank RANK runs and rank 0 has logged a step.
# Sets job, victim, out.
start_job() {  # label rank command...
  local label=$1 rank=$2; shift 2
  out="$tmp/$label"
  "$@" run.output_dir="$out" > "$out.log" 2>&1 &
  job=$!
  victim=""
  for _ in $(seq 150); do
    sleep 0.2
    victim=$(rank_pid "$out" "$rank")
    [[ -n $victim && -s $out/metrics.jsonl ]] && break
  done
  [[ -n $victim && -s $out/metrics.jsonl ]] ||
    fail "$label: rank $rank did not start: $(tail -5 "$out.log")"
  victims+=("$victim")
}

# Waits for the job (at most LIMIT s); sets rc and took (seconds, with tenths).
wait_job() {  # label limit t0
  local label=$1 limit=$2 t0=$3
  rc=0
  timeout "$limit" tail --pid=$job -f /dev/null ||
    fail "$label: job still running ${limit} s after the rank was stopped: $(tail -3 "$out.log")"
  wait $job || rc=$?
  took=$(/usr/bin/python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
}

# No process of the job may outlive it: mpirun's abort must kill the stopped rank too.
no_leftovers() {  # label
  sleep 1
  local left
  left=$(pgrep -f -- "$out" || true)
  [[ -z $left ]] ||
    fail "$1: processes left after the job ended: $(ps -o pid,stat,args -p "${left//$'\n'/,}")"
}

stop_rank() {  # label rank command...
  local label=$1 rank=$2; shift 2
  start_job "$label" "$rank" "$@"
  local last t0
  last=$(tail -1 "$out/metrics.jsonl" |
           /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
  t0=$(date +%s.%N)
  kill -STOP "$victim"
  wait_job "$label" 40 "$t0"
  [[ $rc == 3 ]] || fail "$label: exit code $rc, expected 3 (the watchdog's): $(tail -5 "$out.log")"
  # The timeout is 5 s and the status request's grace period 3 s; 20 s leaves room for a loaded
  # machine and mpirun's teardown, and is far from "forever".
  /usr/bin/python3 -c "import sys; sys.exit(not (5.0 <= $took <= 20.0))" ||
    fail "$label: the job ended $took s after the stop, expected between 5 and 20 s"
  local msg
  msg=$(grep 'made no progress for' "$out.log" | head -1)
  [[ -n $msg ]] || fail "$label: no watchdog message: $(tail -5 "$out.log")"
  [[ $msg =~ step\ ([0-9]+)\ \(([a-z /]+)\):\ ([a-z_]+)\ \#[0-9]+\ on\ the\ ([a-z]+) ]] ||
    fail "$label: the message does not name the step, the phase and the collective: $msg"
  local step=${BASH_REMATCH[1]} what="${BASH_REMATCH[3]} on the ${BASH_REMATCH[4]}"
  # Metrics count steps from 0, the message from 1 (as printed): the hang is after the last step
  # logged when the rank was stopped. (No upper bound: rank 0's metrics file may lag behind.)
  ((step >= last + 1)) ||
    fail "$label: the message names step $step, but the last step logged was $last: $msg"
  [[ $msg == *"made no progress for 5.0 s"* ]] || fail "$label: timeout not reported as 5.0 s: $msg"
  [[ $msg == *"rank $rank did not answer (rank $rank pid $victim on "* ]] ||
    fail "$label: the stopped rank $rank (pid $victim) is not named: $msg"
  [[ $msg == *"runtime.collective_timeout_s"* ]] || fail "$label: no hint: $msg"
  # (the supervising ft of --nproc restates it as its last line: not a second report)
  [[ $(grep -v '^ft: error: the job ended' "$out.log" | grep -c 'made no progress for') == 1 ]] ||
    fail "$label: more than one rank reported the hang: $(grep 'made no progress' "$out.log")"
  if grep -q 'checkpoint.*saved\|saving a checkpoint' "$out.log"; then
    fail "$label: a checkpoint is claimed: $(grep 'checkpoint' "$out.log")"
  fi
  no_leftovers "$label"
  # Gone, or a zombie that nobody reaps (a container's init may not): not running, not stopped.
  local state
  state=$(ps -o stat= -p "$victim" || true)
  [[ -z $state || $state == Z* ]] || fail "$label: the stopped rank (pid $victim) is left: $state"
  echo "$label: rank $rank stopped at step $((last + 1)); job ended with $rc after $took s: $what"
}

# Legitimately long phases do not trip it: with a 2 s timeout, rank 1 takes 4 s longer than the
# others over each checkpoint save (saves get the long allowance, the ranks meet after them).
rc=0
FT_TEST_SLOW_SAVE=1:4 timeout 120 "$ft" train "$tmp/r.yaml" training.steps=6 \
  checkpoint.every_steps=3 runtime.collective_timeout_s=2 run.output_dir="$tmp/slow" --nproc 2 \
  > "$tmp/slow.log" 2>&1 || rc=$?
[[ $rc == 0 ]] ||
  fail "slow saves: exit $rc, expected 0: $(grep -m1 'no progress' "$tmp/slow.log" ||
                                                tail -3 "$tmp/slow.log")"
[[ -f $tmp/slow/checkpoints/step_00000006/COMPLETE ]] || fail "slow saves: no final checkpoint"
# Not even the watchdog's "slow, but completed" warning: the saves are outside the step timeout.
if grep -q 'runtime.collective_timeout_s' "$tmp/slow.log"; then
  fail "slow saves: the watchdog fired: $(grep 'collective_timeout_s' "$tmp/slow.log")"
fi
echo "slow saves: 2 checkpoints 4 s slower on rank 1 than the 2 s timeout: run done, exit 0"

stop_rank nproc4 2 "$ft" train "$tmp/r.yaml" parallel.tensor=2 --nproc 4
# The message lists where the ranks that answered were.
grep 'made no progress' "$tmp/nproc4.log" | grep -Eq 'ranks? [0-9,]+ (is|are) at step' ||
  fail "nproc4: the answering ranks are not listed: $(grep 'made no progress' "$tmp/nproc4.log")"
# The supervising ft's last line restates the cause, after mpirun's banner and the other ranks'
# "mpirun is ending the job" (its SIGTERM).
last_line=$(tail -1 "$tmp/nproc4.log")
[[ $last_line == "ft: error: the job ended (exit 3): "*"made no progress for 5.0 s"* ]] ||
  fail "nproc4: the last line does not restate the hang: $last_line"
stop_rank mpirun 1 mpirun "${mpirun_args[@]}" -np 2 "$ft" train "$tmp/r.yaml"

# A rank killed outright: mpirun ends the job (non-zero; the killed rank's 128 + 9 passed on);
# the survivors get SIGTERM and must not claim a checkpoint, nor the job exit 75.
start_job killed 1 "$ft" train "$tmp/r.yaml" parallel.tensor=2 --nproc 4
t0=$(date +%s.%N)
kill -KILL "$victim"
wait_job killed 60 "$t0"
[[ $rc != 0 && $rc != 75 && $rc != 3 ]] || fail "killed: exit code $rc after a rank was killed"
if grep -qi 'saving a checkpoint\|checkpoint.*saved\|exiting with code 75' "$out.log"; then
  fail "killed: a surviving rank claims a checkpoint: $(grep -i 'checkpoint\|code 75' "$out.log")"
fi
no_leftovers killed
echo "killed: rank 1 killed; job ended with $rc after $took s, no checkpoint claimed"
echo "test_hang: all checks passed"
