#!/usr/bin/env bash
# Data and tensor parallelism over MPI: every layout and ZeRO stage trains the same model as
# one process (DESIGN.md §3: the layout changes how a step is computed, never what).
#  - tensor 2, data 2 × tensor 2 (ZeRO 1, and ZeRO 3 over TCP), tensor 2 with tied embeddings
#    and activation checkpointing: per-step losses and grad norms within 1e-5 relative.
#  - single process vs `--nproc 2` (ft starts mpirun itself) vs `mpirun -np 4 --mca btl tcp,self`
#    (TCP only, standing in for separate nodes), each with ZeRO stages 0–3: per-step losses
#    within 1e-5 relative (float sums in a different order: ~1e-7 seen). Also tied embeddings
#    with activation checkpointing under ZeRO-3 (parameters gathered twice per layer).
#  - Resident bytes per rank match the ZeRO formulas within 5% plus padding: stage 1 optimizer
#    state ÷ N, stage 2 also gradients ÷ N, stage 3 also parameters ÷ N.
#  - Only rank 0 writes metrics and prints progress.
#  - A rank killed with SIGKILL ends the whole job, non-zero, within 60 s, naming the rank.
#   bash tests/cli/test_data_parallel.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 37 --seq-len 12 --seed 5 --mask 0.8

cat > "$tmp/r.yaml" <<YAML
run: {name: dp, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12, shuffle: true}
training: {steps: 10, micro_batch_size: 1, global_batch_size: 8, grad_clip: 0.3}
optimizer: {lr: 0.01, weight_decay: 0.1}
scheduler: {name: cosine, warmup_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/single" > /dev/null 2>&1 || fail "single-process run"
for z in 0 1 2 3; do
  "$ft" train "$tmp/r.yaml" parallel.zero_stage=$z run.output_dir="$tmp/nproc2_z$z" --nproc 2 \
    > "$tmp/nproc2_z$z.log" 2>&1 || fail "--nproc 2 zero $z: $(tail -5 "$tmp/nproc2_z$z.log")"
  mpirun "${mpirun_args[@]}" -np 4 --mca btl tcp,self "$ft" train "$tmp/r.yaml" \
    parallel.zero_stage=$z run.output_dir="$tmp/tcp4_z$z" > "$tmp/tcp4_z$z.log" 2>&1 \
    || fail "mpirun -np 4 tcp zero $z: $(tail -5 "$tmp/tcp4_z$z.log")"
done
[[ $(grep -c '^step 10/10' "$tmp/tcp4_z0.log") == 1 ]] || fail "progress printed by more than rank 0"
# Tensor parallelism, alone and with data parallelism.
"$ft" train "$tmp/r.yaml" parallel.tensor=2 run.output_dir="$tmp/t2" --nproc 2 > "$tmp/t2.log" 2>&1 \
  || fail "tensor 2: $(tail -5 "$tmp/t2.log")"
"$ft" train "$tmp/r.yaml" parallel.tensor=2 parallel.zero_stage=1 run.output_dir="$tmp/d2t2_z1" \
  --nproc 4 > "$tmp/d2t2.log" 2>&1 || fail "data 2 x tensor 2: $(tail -5 "$tmp/d2t2.log")"
mpirun "${mpirun_args[@]}" -np 4 --mca btl tcp,self "$ft" train "$tmp/r.yaml" parallel.tensor=2 \
  parallel.zero_stage=3 run.output_dir="$tmp/d2t2_z3_tcp" > "$tmp/d2t2_tcp.log" 2>&1 \
  || fail "data 2 x tensor 2 zero 3 tcp: $(tail -5 "$tmp/d2t2_tcp.log")"
tied=(model.tie_embeddings=true training.activation_checkpointing=true)
"$ft" train "$tmp/r.yaml" "${tied[@]}" parallel.tensor=2 run.output_dir="$tmp/tied_t2" --nproc 2 \
  > "$tmp/tied_t2.log" 2>&1 || fail "tied tensor 2: $(tail -5 "$tmp/tied_t2.log")"
"$ft" train "$tmp/r.yaml" "${tied[@]}" run.output_dir="$tmp/tied_single" > /dev/null 2>&1 || fail "tied single"
"$ft" train "$tmp/r.yaml" "${tied[@]}" parallel.zero_stage=3 run.output_dir="$tmp/tied_nproc2_z3" \
  --nproc 2 > "$tmp/tied.log" 2>&1 || fail "tied zero 3: $(tail -5 "$tmp/tied.log")"

/usr/bin/python3 - "$tmp" <<'PY' || fail "layouts disagree"
import json, sys
tmp = sys.argv[1]
def metrics(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
def compare(name, ref_name, norm_tol=1e-5):
    ref, got = metrics(ref_name), metrics(name)
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref))
    norm = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(got, ref))
    assert len(ref) == 10 and len(got) == 10 and worst <= 1e-5 and norm <= norm_tol, (
        name, worst, norm)
    return ref[0], got[0], worst

for ranks, launch in ((2, "nproc2"), (4, "tcp4")):
    for z in range(4):
        name = f"{launch}_z{z}"
        ref, got, worst = compare(name, "single")
        # ZeRO formulas: which of (params, grads, optimizer state) are divided by N at stage z.
        pad = 4 * 4 * ranks * 2  # at most one padding float per rank per group (4 groups here), x2 moments
        for key, divided in (("mem_params_bytes", z >= 3), ("mem_grads_bytes", z >= 2),
                             ("mem_optim_bytes", z >= 1)):
            expect = ref[key] / ranks if divided else ref[key]
            assert abs(got[key] - expect) <= 0.05 * expect + pad, (name, key, got[key], expect)
        print(f"{name}: losses match (worst rel {worst:.1e}); bytes/rank params "
              f"{got['mem_params_bytes']} grads {got['mem_grads_bytes']} optim {got['mem_optim_bytes']}")
for name in ("t2", "d2t2_z1", "d2t2_z3_tcp"):
    _, _, worst = compare(name, "single")
    print(f"{name}: losses and grad norms match (worst rel {worst:.1e})")
# The grad norms of tied embeddings + activation checkpointing on 2 tensor ranks drift furthest
# from one process's: the tensor all-reduces sum in another order, and ten steps at lr 0.01
# amplify it, to 8.7e-6 at step 5 in the Release build and 1.06e-5 in the sanitizer build (its
# instrumented kernels vectorise their sums differently) on an AMX Xeon, before and after the
# layering of issue 15 alike. 2e-5 holds both; a wrong split moves them by far more (tried:
# leaving the lm_head's input gradient unreduced gives 0.04 to 0.3 from step 1).
_, _, worst = compare("tied_t2", "tied_single", norm_tol=2e-5)
print(f"tied embeddings + activation checkpointing, tensor 2: losses match (worst rel {worst:.1e})")
_, _, worst = compare("tied_nproc2_z3", "tied_single")
print(f"tied embeddings + activation checkpointing, ZeRO-3 on 2 ranks: losses match (worst rel {worst:.1e})")
PY

# A rank killed mid-run: the job ends, non-zero, within 60 s, and the failed rank is named.
# Once under `--nproc 2`, once under a plain mpirun.
source "$src/tests/cli/mpi_ranks.sh"  # rank_pid PATTERN RANK
kill_rank_1() {  # label, command...
  local label=$1; shift
  local out="$tmp/killed_$label"
  local start=$(date +%s) victim="" rc=0
  "$@" training.steps=100000 run.output_dir="$out" > "$out.log" 2>&1 &
  local job=$!
  for _ in $(seq 150); do
    sleep 0.2
    victim=$(rank_pid "$out" 1)
    [[ -n $victim && -s $out/metrics.jsonl ]] && break
  done
  [[ -n $victim ]] || fail "$label: could not find rank 1"
  kill -9 "$victim"
  timeout 60 tail --pid=$job -f /dev/null || fail "$label: job still running 60 s after rank 1 was killed"
  wait $job || rc=$?
  [[ $rc != 0 ]] || fail "$label: job exited 0 after a rank was killed"
  grep -q -i 'rank 1' "$out.log" || fail "$label: failed rank not named: $(tail -5 "$out.log")"
  echo "$label: rank 1 killed, job ended with $rc after $(( $(date +%s) - start )) s"
}
kill_rank_1 nproc "$ft" train "$tmp/r.yaml" --nproc 2

# A rank that fails with an error (injected at step 3 on rank 1): every rank stops, non-zero,
# and the message names the rank and its mesh coordinates.
rc=0
FT_TEST_FAIL_RANK=1 timeout 60 "$ft" train "$tmp/r.yaml" parallel.tensor=2 training.steps=1000 \
  run.output_dir="$tmp/failed" --nproc 4 > "$tmp/failed.log" 2>&1 || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "a failing rank: job exited $rc (124: still running after 60 s)"
grep -q '\[rank 1 d0 p0 t1\] error: injected failure' "$tmp/failed.log" \
  || fail "failing rank not named with its mesh coordinates: $(tail -5 "$tmp/failed.log")"
echo "failing rank 1: job ended with $rc"
kill_rank_1 mpirun mpirun "${mpirun_args[@]}" -np 2 "$ft" train "$tmp/r.yaml"
echo "test_data_parallel: all checks passed"
