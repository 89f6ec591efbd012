#!/usr/bin/env bash
# ft under a real one-node SLURM (DESIGN.md §9): brings the local cluster up
# (scripts/slurm/local_cluster.sh: installs slurm-wlm and munge if missing; needs root), then
# trains one tiny recipe three ways, each as 4 MPI ranks:
#  - `mpirun -np 4 ft train` (the reference),
#  - `srun -n 4 ft train` (ranks started by slurmd over PMIx),
#  - `sbatch --wait scripts/slurm/ft.sbatch` (the example batch script users copy),
# and checks that the per-step losses of both SLURM runs match the mpirun run within 1e-5
# relative and that only rank 0 printed progress. It also checks the batch script's signal and
# exit handling with a stand-in for ft: USR1 sent to the batch shell reaches every rank, exit 75
# requeues the job once, another failure fails the job with that exit code.
# Prints how long the bring-up and each run took. Not part of ctest (it starts daemons as root);
# scripts/test.sh runs it when FT_TEST_SLURM=1.
#   bash tests/slurm/test_slurm.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd)
ft="$build/ft"
[[ -x $ft ]] || { echo "FAIL: no $ft" >&2; exit 1; }
tmp=$(mktemp -d)
name="ft_test_slurm_$$"
cleanup() {
  scancel --name="$name" 2> /dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 2> /dev/null || true
  exit 1
}
t_all=$SECONDS
now() { echo "$EPOCHREALTIME"; }
took() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
timings=()

t=$(now)
"$src/scripts/slurm/local_cluster.sh" start || fail "local cluster did not come up"
timings+=("bring-up (local_cluster.sh start): $(took "$t") s")

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 61 --samples 37 --seq-len 12 --seed 5 --mask 0.8

cat > "$tmp/r.yaml" <<YAML
run: {name: slurm, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 61, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12, shuffle: true}
training: {steps: 10, micro_batch_size: 1, global_batch_size: 8, grad_clip: 0.3}
optimizer: {lr: 0.01, weight_decay: 0.1}
scheduler: {name: cosine, warmup_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# The local node claims 8 CPUs on what may be 2 cores, so Open MPI under srun does not know it is
# oversubscribed and its ranks busy-poll, starving each other (~40x slower here; same losses).
# mpirun --oversubscribe yields by itself; ask the SLURM-started ranks to yield too.
export OMPI_MCA_mpi_yield_when_idle=1
mpirun_args=(--oversubscribe)
[[ $(id -u) == 0 ]] && mpirun_args+=(--allow-run-as-root)

t=$(now)
timeout 300 mpirun "${mpirun_args[@]}" -np 4 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/mpirun" \
  > "$tmp/mpirun.log" 2>&1 || fail "mpirun -np 4: $(tail -5 "$tmp/mpirun.log")"
timings+=("mpirun -np 4 ft train: $(took "$t") s")

t=$(now)
timeout 300 srun --job-name="$name" --time=5 -n 4 "$ft" train "$tmp/r.yaml" \
  run.output_dir="$tmp/srun" > "$tmp/srun.log" 2>&1 || fail "srun -n 4: $(tail -5 "$tmp/srun.log")"
timings+=("srun -n 4 ft train: $(took "$t") s")

t=$(now)
FT="$ft" timeout 300 sbatch --wait --quiet --job-name="$name" --time=5 --chdir="$tmp" \
  --output="$tmp/sbatch.out" "$src/scripts/slurm/ft.sbatch" "$tmp/r.yaml" \
  run.output_dir="$tmp/sbatch" || fail "sbatch --wait ft.sbatch: $(tail -5 "$tmp/sbatch.out" 2>&1)"
timings+=("sbatch --wait ft.sbatch: $(took "$t") s")

for run in srun.log sbatch.out; do
  grep -q 'mpi world 4' "$tmp/$run" || fail "$run: not 4 MPI ranks: $(head -3 "$tmp/$run")"
  [[ $(grep -c '^step 10/10' "$tmp/$run") == 1 ]] || fail "$run: progress not from rank 0 only"
done

/usr/bin/python3 - "$tmp" <<'PY' || fail "SLURM runs disagree with mpirun"
import json, sys
tmp = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
ref = losses("mpirun")
assert len(ref) == 10, ref
for name in ("srun", "sbatch"):
    got = losses(name)
    assert len(got) == 10, (name, got)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    assert worst <= 1e-5, (name, worst, got, ref)
    print(f"{name}: 10 losses match mpirun (worst rel {worst:.1e})")
PY

# Waits for job $1 to end (its JobState then in $state, `scontrol show job` in $info). SLURM
# holds a requeued job back (BeginTime, about 2 min): let it start again at once.
wait_job() {
  state=""
  for _ in $(seq 600); do
    info=$(scontrol show job "$1" -o 2> /dev/null || true)
    state=$(grep -o 'JobState=[A-Z_]*' <<< "$info" | cut -d= -f2)
    [[ $state == PENDING && $info == *Reason=BeginTime* ]] && scontrol update JobId="$1" StartTime=now
    [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED* || $state == TIMEOUT ]] && return
    sleep 0.2
  done
}

# The batch script's signal and exit handling, with a stand-in for ft that needs no training.
# First attempt: the ranks wait for USR1 (what `#SBATCH --signal=B:USR1@120` sends the batch
# shell; here `scancel --batch --signal=USR1`), which the script passes on through srun, and exit
# 75 -> the script requeues the job; the second attempt succeeds.
cat > "$tmp/fake_ft.sh" <<'EOF'
#!/usr/bin/env bash
echo "fake ft rank ${PMIX_RANK:-?} attempt ${SLURM_RESTART_COUNT:-0}: $*"
[[ ${FAKE_RC:-} ]] && exit "$FAKE_RC"
[[ ${SLURM_RESTART_COUNT:-0} == 0 ]] || exit 0
trap 'echo "fake ft rank $PMIX_RANK: USR1"; exit 75' USR1
for _ in $(seq 600); do sleep 0.1; done
exit 1
EOF
chmod +x "$tmp/fake_ft.sh"
t=$(now)
job=$(FT="$tmp/fake_ft.sh" sbatch --parsable --job-name="$name" --time=5 --chdir="$tmp" \
  --output="$tmp/requeue.out" "$src/scripts/slurm/ft.sbatch" "$tmp/r.yaml" x=1) || fail "sbatch"
job=${job%%;*}
for _ in $(seq 300); do
  [[ $(grep -c 'attempt 0' "$tmp/requeue.out" 2> /dev/null) == 4 ]] && break
  sleep 0.1
done
[[ $(grep -c 'attempt 0' "$tmp/requeue.out" 2> /dev/null) == 4 ]] || fail "fake ranks did not start"
scancel --batch --signal=USR1 "$job"
wait_job "$job"
[[ $state == COMPLETED && $info == *Restarts=1* ]] ||
  fail "USR1, exit 75: expected one requeue then success, got ${state:-nothing}: $(cat "$tmp/requeue.out")"
[[ $(grep -c 'USR1$' "$tmp/requeue.out") == 4 ]] || fail "USR1 did not reach the 4 ranks"
grep -q 'requeueing job' "$tmp/requeue.out" || fail "exit 75: no requeue message"
[[ $(grep -c 'attempt 1: train .*r.yaml x=1' "$tmp/requeue.out") == 4 ]] ||
  fail "exit 75: second attempt did not run 4 ranks: $(cat "$tmp/requeue.out")"
timings+=("batch script USR1 -> exit 75 -> requeue: $(took "$t") s"); t=$(now)
job=$(FT="$tmp/fake_ft.sh" FAKE_RC=3 sbatch --parsable --job-name="$name" --time=5 --chdir="$tmp" \
  --output="$tmp/fail.out" "$src/scripts/slurm/ft.sbatch" "$tmp/r.yaml") || fail "sbatch"
wait_job "${job%%;*}"
[[ $state == FAILED && $info == *ExitCode=3:0* && $info == *Restarts=0* ]] ||
  fail "ft exit 3: expected a failed job with exit code 3: $info $(cat "$tmp/fail.out")"
grep -q 'requeueing' "$tmp/fail.out" && fail "ft exit 3: the job was requeued"
timings+=("batch script exit 3: $(took "$t") s")

for line in "${timings[@]}"; do echo "time: $line"; done
echo "time: whole test: $((SECONDS - t_all)) s"
echo "test_slurm: all checks passed"
