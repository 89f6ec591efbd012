#!/usr/bin/env bash
# The collective watchdog's other cause (DESIGN.md §4): an asynchronous NCCL error. On the
# emulated NCCL (tests/cuda_emu/nccl_emu.cpp) under ft_emu, runtime.communicator=nccl, tensor 2
# (two ranks that all-reduce through NCCL in every layer), checkpoints every 2 steps: at a rank's
# first NCCL call of step 5 its communicator reports ncclRemoteError (FT_NCCL_EMU_ASYNC_ERROR=
# RANK:5, what real NCCL reports when a peer died or a network operation failed) and the call
# never completes, its peer waiting in the matching call. Collective timeout 10 s: a hang report
# would come only then. Then:
#  - the job ends with exit code 1 (not the hang's 3) within 8 s of step 4's end, before
#    the timeout;
#  - one message, from the erroring rank, names the asynchronous error, that rank and NCCL's
#    error string ("NCCL reported an asynchronous error on rank R: remote process exited or
#    there was a network error"); no hang is reported;
#  - no process of the job is left;
# under a plain `mpirun -np 2` (rank 1 errs) and under `ft_emu train --nproc 2` (rank 0 errs,
# which prints without a rank prefix), where the supervising ft's last line restates the cause:
# "ft: error: the job ended (exit 1): NCCL reported an asynchronous error on rank 0: ...". And
# after the second one:
#  - the checkpoints are step_2 and step_4 (none begun after the error); step_4, the last before
#    the error, is complete, `latest` names it and `ft inspect` verifies it (checksums);
#  - the same command without the hook resumes from step_4 and finishes, and its steps 5 and 6
#    have the losses and gradient norms of a run never interrupted, to the bit.
#   bash tests/cli/test_cuda_emu_nccl_async_error.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 24 --seq-len 8 \
  --seed 5
cat > "$tmp/r.yaml" <<YAML
run: {name: asyncerr, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 8}
data: {train: $tmp/data, seq_len: 8, shuffle: true}
training: {steps: 6, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 0.01}
checkpoint: {every_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 1, collective_timeout_s: 10, device: cuda, communicator: nccl}
parallel: {tensor: 2}
YAML

# async_error LABEL RANK COMMAND...: runs the job with rank RANK's NCCL erring at step 5; checks
# how it ended.
async_error() {
  local label=$1 rank=$2; shift 2
  local out="$tmp/$label"
  FT_NCCL_EMU_ASYNC_ERROR=$rank:5 "$@" run.output_dir="$out" > "$out.log" 2>&1 &
  local job=$! t0="" rc=0
  # The clock starts when step 4's metrics are written (its checkpoint is saved before step 5).
  for _ in $(seq 600); do
    sleep 0.1
    if grep -q '"step":4,' "$out/metrics.jsonl" 2> /dev/null; then
      t0=$(date +%s.%N)
      break
    fi
    kill -0 $job 2> /dev/null || break
  done
  [[ -n $t0 ]] || fail "$label: the job did not reach step 4: $(tail -5 "$out.log")"
  timeout 30 tail --pid=$job -f /dev/null ||
    fail "$label: job still running 30 s after step 4: $(tail -3 "$out.log")"
  wait $job || rc=$?
  local took
  took=$(/usr/bin/python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  [[ $rc == 1 ]] || fail "$label: exit code $rc, expected 1 (an asynchronous error's): $(tail -5 "$out.log")"
  /usr/bin/python3 -c "import sys; sys.exit(not $took <= 8.0)" ||
    fail "$label: the job ended $took s after step 4, expected within 8 s (timeout 10 s)"
  if grep -q 'made no progress' "$out.log"; then
    fail "$label: a hang was reported: $(grep 'made no progress' "$out.log")"
  fi
  local msg prefix=""
  [[ $rank == 0 ]] || prefix="\[rank $rank [^]]*\] "
  msg=$(grep -v '^ft: error: the job ended' "$out.log" | grep 'asynchronous error' || true)
  [[ -n $msg ]] || fail "$label: no asynchronous error message: $(tail -5 "$out.log")"
  [[ $(wc -l <<< "$msg") == 1 ]] || fail "$label: more than one message: $msg"
  [[ $msg =~ ^${prefix}error:\ NCCL\ reported\ an\ asynchronous\ error\ on\ rank\ $rank:\ remote\ process\ exited\ or\ there\ was\ a\ network\ error\ \(.*NCCL_DEBUG=WARN ]] ||
    fail "$label: the message does not name the error, rank $rank and NCCL's string: $msg"
  local left  # none, or none within 2 s (a rank mpirun killed may take a moment to go)
  for _ in $(seq 10); do
    left=$(pgrep -f -- "$out" || true)
    [[ -n $left ]] || break
    sleep 0.2
  done
  [[ -z $left ]] ||
    fail "$label: processes left after the job ended: $(ps -o pid,stat,args -p "${left//$'\n'/,}")"
  echo "$label: rank $rank's NCCL erred at step 5; job ended with $rc $took s after step 4"
  last_log="$out.log"
}

async_error mpirun 1 mpirun "${mpirun_args[@]}" -np 2 -x FT_NCCL_EMU_ASYNC_ERROR "$emu" train \
  "$tmp/r.yaml"
async_error nproc2 0 "$emu" train "$tmp/r.yaml" --nproc 2
last_line=$(tail -1 "$last_log")
[[ $last_line == "ft: error: the job ended (exit 1): NCCL reported an asynchronous error on rank 0: "* ]] ||
  fail "nproc2: the last line does not restate the error: $last_line"

# The checkpoint before the error, and a resume from it.
ck="$tmp/nproc2/checkpoints"
[[ $(ls "$ck" | grep -vx ft.lock | tr '\n' ' ') == "latest step_00000002 step_00000004 " ]] ||
  fail "the checkpoints are not step_2 and step_4 (and latest): $(ls "$ck")"
[[ -f $ck/step_00000004/COMPLETE ]] || fail "step_4 has no COMPLETE"
[[ $(cat "$ck/latest") == step_00000004 ]] || fail "latest names $(cat "$ck/latest"), not step_4"
"$emu" inspect "$ck/step_00000004" > "$tmp/inspect.log" 2>&1 ||
  fail "step_4 does not verify: $(tail -3 "$tmp/inspect.log")"
"$emu" train "$tmp/r.yaml" --nproc 2 run.output_dir="$tmp/nproc2" > "$tmp/resume.log" 2>&1 ||
  fail "the resume failed: $(tail -5 "$tmp/resume.log")"
grep -q "resumed from $ck/step_00000004 (step 4" "$tmp/resume.log" ||
  fail "the resume did not start from step_4: $(grep -m1 'resumed' "$tmp/resume.log" || tail -3 "$tmp/resume.log")"
"$emu" train "$tmp/r.yaml" --nproc 2 run.output_dir="$tmp/whole" > "$tmp/whole.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -5 "$tmp/whole.log")"
# Steps 5 and 6: step, loss and gradient norm as logged (the shortest repr of the double).
steps56() {
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("step") in (5, 6) and "loss" in m:
        print(m["step"], repr(m["loss"]), repr(m["grad_norm"]))' "$1/metrics.jsonl"
}
[[ $(steps56 "$tmp/nproc2" | wc -l) == 2 ]] ||
  fail "the resumed run did not log steps 5 and 6 once each: $(steps56 "$tmp/nproc2")"
[[ $(steps56 "$tmp/nproc2") == "$(steps56 "$tmp/whole")" ]] ||
  fail "steps 5-6 after the resume differ from the uninterrupted run's: $(steps56 "$tmp/nproc2") vs $(steps56 "$tmp/whole")"
echo "resumed from step_4 (complete, verified): steps 5-6 equal the uninterrupted run's"
echo "test_cuda_emu_nccl_async_error: all checks passed"
