#!/usr/bin/env bash
# The collective watchdog over NCCL (DESIGN.md §4, runtime.collective_timeout_s), on the emulated
# NCCL (tests/cuda_emu/nccl_emu.cpp) under ft_emu, runtime.communicator=nccl, tensor 2 (two ranks
# that all-reduce through NCCL in every layer): a rank stops (SIGSTOP, which the emulation raises
# itself at its first NCCL call of step 3, FT_NCCL_EMU_STOP=RANK:3, so that its peers wait in
# NCCL calls and not in one of the host's MPI calls). Timeout 3 s. Then:
#  - the job ends with exit code 3, no sooner than 3 s and within 20 s of the stop;
#  - one message (one rank reports) names the step, the phase and the NCCL collective ("step 3
#    (PHASE): all_reduce_sum #K on the tensor group (ranks 0,1) through NCCL made no progress for
#    3.0 s on rank 0"), and "rank R did not answer" with the stopped rank's pid;
#  - no process of the job is left, the stopped one included;
# under a plain `mpirun -np 2` (rank 1 stopped), and under `ft_emu train --nproc 4` (data 2 x
# tensor 2, rank 2 stopped), where the message also lists where the ranks that answered wait,
# and the supervising ft's last line restates the cause: "ft: error: the job ended (exit 3):
# ... made no progress for 3.0 s ..."; and with FT_CUDA_GRAPHS=1 over two data ranks, where the
# step's all-reduces are inside the micro-batch's graph and the message names its launch.
#   bash tests/cli/test_cuda_emu_nccl_hang.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
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

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 24 --seq-len 8 \
  --seed 5
cat > "$tmp/r.yaml" <<YAML
run: {name: hang, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 8}
data: {train: $tmp/data, seq_len: 8, shuffle: true}
training: {steps: 50, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 1, collective_timeout_s: 3, device: cuda, communicator: nccl}
parallel: {tensor: 2}
YAML

# hang LABEL RANK COMMAND...: runs the job with rank RANK stopping itself; checks what it did.
hang() {
  local label=$1 rank=$2; shift 2
  local out="$tmp/$label"
  FT_NCCL_EMU_STOP=$rank:3 "$@" run.output_dir="$out" > "$out.log" 2>&1 &
  local job=$! victim="" t0="" rc=0
  # The rank stops itself: the clock starts when it is seen stopped.
  for _ in $(seq 600); do
    sleep 0.1
    [[ -n $victim ]] || victim=$(rank_pid "$out" "$rank")
    if [[ -n $victim && $(ps -o stat= -p "$victim" || true) == T* ]]; then
      t0=$(date +%s.%N)
      break
    fi
    kill -0 $job 2> /dev/null || break
  done
  [[ -n $victim ]] && victims+=("$victim")
  [[ -n $t0 ]] || fail "$label: rank $rank did not stop in step 3: $(tail -5 "$out.log")"
  timeout 40 tail --pid=$job -f /dev/null ||
    fail "$label: job still running 40 s after rank $rank stopped: $(tail -3 "$out.log")"
  wait $job || rc=$?
  local took
  took=$(/usr/bin/python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  [[ $rc == 3 ]] || fail "$label: exit code $rc, expected 3 (the watchdog's): $(tail -5 "$out.log")"
  /usr/bin/python3 -c "import sys; sys.exit(not (3.0 <= $took <= 20.0))" ||
    fail "$label: the job ended $took s after the stop, expected between 3 and 20 s"
  local msg
  msg=$(grep -v '^ft: error: the job ended' "$out.log" | grep 'made no progress for' || true)
  [[ -n $msg ]] || fail "$label: no watchdog message: $(tail -5 "$out.log")"
  [[ $(wc -l <<< "$msg") == 1 ]] || fail "$label: more than one rank reported the hang: $msg"
  [[ $msg =~ step\ 3\ \(([a-z /]+)\):\ ([a-z_]+\ \#[0-9]+\ on\ the\ [a-z]+\ group\ \(ranks\ [0-9,]+\)\ through\ NCCL)\ made\ no\ progress\ for\ 3\.0\ s\ on\ rank\ [0-9] ]] ||
    fail "$label: the message does not name step 3, the phase and the NCCL collective: $msg"
  local what=${BASH_REMATCH[2]}
  [[ $msg == *"rank $rank did not answer (rank $rank pid $victim on "* ]] ||
    fail "$label: the stopped rank $rank (pid $victim) is not named: $msg"
  [[ $msg == *"runtime.collective_timeout_s"* ]] || fail "$label: no hint: $msg"
  if grep -q 'checkpoint.*saved\|saving a checkpoint' "$out.log"; then
    fail "$label: a checkpoint is claimed: $(grep 'checkpoint' "$out.log")"
  fi
  sleep 1
  local left state
  left=$(pgrep -f -- "$out" || true)
  [[ -z $left ]] ||
    fail "$label: processes left after the job ended: $(ps -o pid,stat,args -p "${left//$'\n'/,}")"
  state=$(ps -o stat= -p "$victim" || true)
  [[ -z $state || $state == Z* ]] || fail "$label: the stopped rank (pid $victim) is left: $state"
  echo "$label: rank $rank stopped at its first NCCL call of step 3; job ended with $rc after $took s: $what"
  last_log="$out.log"
  last_msg=$msg
}

hang mpirun 1 mpirun "${mpirun_args[@]}" -np 2 -x FT_NCCL_EMU_STOP "$emu" train "$tmp/r.yaml" \
  training.global_batch_size=1
# FT_CUDA_GRAPHS=1 with two data ranks, a micro-batch a step: its all-reduces are recorded into
# its graph at step 2, so rank 1 stops inside its step-3 launch and rank 0 waits in its own,
# which the watchdog watches as one call (Communicator::watched_launch).
FT_CUDA_GRAPHS=1 hang graphs 1 mpirun "${mpirun_args[@]}" -np 2 -x FT_NCCL_EMU_STOP \
  -x FT_CUDA_GRAPHS "$emu" train "$tmp/r.yaml" parallel.tensor=1
[[ $last_msg == *"micro_batch_graph #"*" on the data group (ranks 0,1) through NCCL"* ]] ||
  fail "graphs: the message does not name the micro-batch graph's launch: $last_msg"
hang nproc4 2 "$emu" train "$tmp/r.yaml" --nproc 4
# The ranks that answered are listed, where they wait.
grep -Eq 'ranks? [0-9,]+ (is|are) at step 3 \([a-z /]+\) in [a-z_]+ #[0-9]+ on the [a-z]+ group' \
  <<< "$last_msg" || fail "nproc4: the answering ranks are not listed: $last_msg"
last_line=$(tail -1 "$last_log")
[[ $last_line == "ft: error: the job ended (exit 3): "*"through NCCL made no progress for 3.0 s"* ]] ||
  fail "nproc4: the last line does not restate the hang: $last_line"
echo "test_cuda_emu_nccl_hang: all checks passed"
