#!/usr/bin/env bash
# Preemption (DESIGN.md §4, §8): SIGTERM or SIGUSR1 to any one rank stops the whole run at the end
# of the step in progress, with a checkpoint of the steps done and exit code 75; running the same
# command again (default --resume auto) finishes the run with the losses of a run never stopped.
#  - `--nproc 4 parallel.tensor=2` (data 2 x tensor 2): SIGTERM to rank 1, SIGUSR1 to rank 3
#    (with async checkpoints every 4 steps, so a save may be in flight), SIGTERM to the
#    `ft --nproc` launcher itself (it passes the stop on to every rank); one process: SIGTERM.
#  - Each stopped run: exit 75; `latest` names step_K, complete and the newest checkpoint (the
#    only one without periodic checkpoints), where K is the last step in metrics.jsonl and
#    0 < K < training.steps (stopped mid-run);
#    the output says it stopped on a signal after step K and saved step_K.
#  - The rerun: exit 0, "resumed from .../step_K", metrics.jsonl then holds every step once, and
#    every loss and grad norm is == the unsignalled run's of the same layout (resume restores
#    everything, DESIGN.md §8: no tolerance).
# The run is signalled once metrics.jsonl shows progress; the model is sized so that a run lasts a
# few seconds (steps of ~20 ms) and the stop lands mid-run, which the test checks.
#   bash tests/cli/test_preempt.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
ft_exe=$(readlink -f "$ft")
running=""  # a run in the background, stopped (with mpirun and its ranks) if the test fails
kill_tree() {
  local c
  for c in $(pgrep -P "$1" || true); do kill_tree "$c"; done
  kill -KILL "$1" 2> /dev/null || true
}
cleanup() {
  [[ -z $running ]] || { kill_tree "$running"; wait "$running" 2> /dev/null || true; }
  remove_tmp
}
trap cleanup EXIT
mpi_env
t_all=$SECONDS

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 256 --samples 64 --seq-len 32 --seed 3 --mask 0.9

steps=150
cat > "$tmp/r.yaml" <<YAML
run: {name: preempt, output_dir: $tmp/out, seed: 11}
model: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 176, vocab_size: 256, max_seq_len: 32}
data: {train: $tmp/data, seq_len: 32, shuffle: true}
training: {steps: $steps, micro_batch_size: 2, global_batch_size: 8, grad_clip: 1.0}
optimizer: {lr: 0.003, weight_decay: 0.1}
scheduler: {name: cosine, warmup_steps: 5}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# Steps (the "step" of each loss line) in a metrics.jsonl; never fails (0 lines when absent).
loss_lines() { grep -c '"loss"' "$1" 2> /dev/null || true; }

source "$src/tests/cli/mpi_ranks.sh"  # rank_pid PATTERN RANK

# Unsignalled references, one per layout.
nproc4=(parallel.tensor=2 --nproc 4)
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref4" "${nproc4[@]}" > "$tmp/ref4.log" 2>&1 \
  || fail "reference, 4 ranks: $(tail -5 "$tmp/ref4.log")"
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref1" > "$tmp/ref1.log" 2>&1 \
  || fail "reference, one process: $(tail -5 "$tmp/ref1.log")"
echo "references trained ($((SECONDS - t_all)) s)"

# stop_and_resume LABEL SIGNAL RANK REF [ARGS...]: starts `ft train r.yaml ARGS`, sends SIGNAL to
# world rank RANK (RANK "-": the process started, a single process or the --nproc launcher) once metrics.jsonl has 3 steps, checks the stop,
# reruns the same command and compares with the reference run REF.
stop_and_resume() {
  local label=$1 sig=$2 rank=$3 ref=$4
  shift 4
  local out="$tmp/$label" victim="" rc=0 t0=$SECONDS
  local cmd=("$ft" train "$tmp/r.yaml" run.output_dir="$out" "$@")
  "${cmd[@]}" > "$out.log" 2>&1 &
  local job=$!
  running=$job
  for _ in $(seq 600); do
    if [[ $rank == - ]]; then  # bash runs a backgrounded simple command as that process itself
      [[ $(readlink "/proc/$job/exe" || true) == "$ft_exe" ]] && victim=$job
    else
      [[ -n $victim ]] || victim=$(rank_pid "$out" "$rank")
    fi
    [[ -n $victim && $(loss_lines "$out/metrics.jsonl") -ge ${wait_lines:-3} ]] && break
    sleep 0.05
  done
  [[ -n $victim && $(loss_lines "$out/metrics.jsonl") -ge ${wait_lines:-3} ]] ||
    fail "$label: no progress to signal (rank ${rank} pid '${victim}'): $(tail -5 "$out.log")"
  kill -s "$sig" "$victim"
  timeout 60 tail --pid="$job" -f /dev/null || fail "$label: still running 60 s after SIG$sig"
  wait "$job" || rc=$?
  running=""
  [[ $rc == 75 ]] || fail "$label: SIG$sig: exit code $rc, expected 75: $(tail -5 "$out.log")"

  local ckdir="$out/checkpoints" latest last k
  latest=$(cat "$ckdir/latest" 2> /dev/null || true)
  [[ $latest =~ ^step_[0-9]{8}$ ]] || fail "$label: latest names '$latest', not a step folder"
  [[ -f $ckdir/$latest/COMPLETE && -f $ckdir/$latest/manifest.json ]] ||
    fail "$label: $latest is not complete: $(ls "$ckdir/$latest")"
  # The stop's checkpoint is the newest; without periodic checkpoints, the only one.
  [[ $(find "$ckdir" -maxdepth 1 -name 'step_*' -printf '%f\n' | sort | tail -1) == "$latest" ]] ||
    fail "$label: latest ($latest) is not the newest checkpoint: $(ls "$ckdir")"
  [[ "$*" == *checkpoint.every_steps* || $(find "$ckdir" -maxdepth 1 -name 'step_*' | wc -l) == 1 ]] ||
    fail "$label: expected only the stop's checkpoint: $(ls "$ckdir")"
  local saved
  saved=$(cd "$ckdir" && echo step_*)
  k=$((10#${latest#step_}))
  last=$(grep '"loss"' "$out/metrics.jsonl" | tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
  [[ $k == "$last" ]] || fail "$label: checkpoint $latest, but the last step logged is $last"
  ((k > 0 && k < steps)) || fail "$label: stopped at step $k of $steps, not mid-run (too fast?)"
  grep -Eq "SIG$sig: (stopping after this step|the ranks stop after this step)" "$out.log" ||
    fail "$label: the signalled process said nothing"
  grep -q "stopped by a signal after step $k of $steps; checkpoint $latest saved: exiting with code 75" \
    "$out.log" || fail "$label: no stop message for step $k: $(tail -5 "$out.log")"
  grep -q '^ft: stopped early: ' "$out.log" || fail "$label: summary does not say 'stopped early'"
  grep -q "^ft: last checkpoint: $ckdir/$latest (run the same command again to continue)" \
    "$out.log" || fail "$label: summary does not name $latest: $(tail -3 "$out.log")"

  # The same command again: resumes from step_K and finishes.
  "${cmd[@]}" > "$out.resume.log" 2>&1 || fail "$label: rerun failed: $(tail -5 "$out.resume.log")"
  grep -q "resumed from $ckdir/$latest (step $k," "$out.resume.log" ||
    fail "$label: rerun did not resume from $latest: $(head -20 "$out.resume.log")"
  grep -q '^ft: done: ' "$out.resume.log" || fail "$label: rerun summary does not say done"
  /usr/bin/python3 - "$out/metrics.jsonl" "$tmp/$ref/metrics.jsonl" "$steps" <<'PY' ||
import json, sys
got_path, ref_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def lines(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l]
got, ref = lines(got_path), lines(ref_path)
every = list(range(1, steps + 1))  # steps are numbered from 1 (DESIGN.md §7)
assert [m["step"] for m in ref] == every, "reference steps"
assert [m["step"] for m in got] == every, ("steps logged", [m["step"] for m in got])
for a, b in zip(got, ref):
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], (a, b)
PY
    fail "$label: stopped + resumed run differs from the unsignalled one"
  local whom="rank $rank"
  [[ $rank == - ]] && whom="the process started"
  echo "$label: SIG$sig to $whom -> exit 75 at step $k of $steps (saved: $saved);" \
       "rerun resumed," \
       "$steps losses == unsignalled ($((SECONDS - t0)) s)"
}

stop_and_resume term4 TERM 1 ref4 "${nproc4[@]}"
# With asynchronous checkpoints every 4 steps, signalled after step 6: step_4 saved before the
# stop's, and the stop's save may find one in flight.
wait_lines=6 stop_and_resume usr4_async USR1 3 ref4 "${nproc4[@]}" checkpoint.every_steps=4 checkpoint.async=true
stop_and_resume term4_launcher TERM - ref4 "${nproc4[@]}"
stop_and_resume term1 TERM - ref1
echo "time: whole test: $((SECONDS - t_all)) s"
echo "test_preempt: all checks passed"
