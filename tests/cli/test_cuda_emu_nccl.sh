#!/usr/bin/env bash
# NCCL between GPUs (DESIGN.md §3, lib/comm/nccl_communicator.cpp), on the emulation: ft_emu
# links the emulated NCCL (tests/cuda_emu/nccl_emu.cpp, a test tool: the NCCL calls ft makes,
# over MPI, on the emulated device memory, summing in rank order) and runs under mpirun with one
# emulated GPU per rank and runtime.communicator=nccl:
#  - the header says NCCL carries device memory, and no call goes through host staging (data,
#    tensor and pipeline groups and the tied-embedding holders all on NCCL);
#  - the layouts (data 2 under ZeRO 0-3, data 4 under ZeRO 2, tensor 2, pipeline 2 and 3, fp32
#    and bf16) against the one-process CPU run, within test_cuda_emu_ranks.sh's bounds;
#  - the same layout twice gives the same bits (metrics), and NCCL against MPI with host staging
#    gives per-step losses within 1e-6 (fp32; they sum in different orders);
#  - parallel.overlap_comm on and off give the same bits at ZeRO 0-3 (small buckets, two
#    micro-batches per rank); ZeRO-3's parallel.prefetch_blocks 0, 1 and 2 too;
#    parallel.overlap_update (AdamW under the next forward) at data 2, tensor 2 and pipeline 2;
#  - parallel.reduce_dtype bf16 at ZeRO 0 and 2 within bf16 bounds of the CPU, refused over MPI;
#  - ft plan's bytes per rank equal what the emulated NCCL counted over a step (4 layouts);
#  - runtime.communicator=nccl on the CPU device is refused, naming why; auto on the CPU uses MPI.
#   bash tests/cli/test_cuda_emu_nccl.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 64 \
  --samples 24 --seq-len 8 --seed 7

cat > "$tmp/r.yaml" <<YAML
run: {name: r, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64,
        max_seq_len: 8, tie_embeddings: true}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 8, shuffle: true}
training: {steps: 4, micro_batch_size: 1, global_batch_size: 4, eval_every_steps: 2,
           eval_batches: 1, grad_clip: 0.5}
optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

compare() {
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --min-entries 10 \
    --loss-rel "$3" --norm-rel "$4"
}
for p in fp32 bf16; do
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/cpu_$p" runtime.device=cpu \
    training.precision=$p > "$tmp/cpu_$p.log" 2>&1 \
    || fail "one-process CPU run, $p: $(tail -3 "$tmp/cpu_$p.log")"
done
declare -A loss_rel=([fp32]=1e-5 [bf16]=2e-2) norm_rel=([fp32]=1e-4 [bf16]=2e-1)

# ranks NAME NP COMMUNICATOR OVERRIDES...: NP ranks of ft_emu, each on its own emulated GPU.
ranks() {
  local name=$1 np=$2 how=$3
  shift 3
  FT_CUDA_EMU_DEVICES=$np mpirun "${mpirun_args[@]}" -np "$np" -x FT_CUDA_EMU_DEVICES \
    ${FT_NCCL_EMU_TALLY:+-x FT_NCCL_EMU_TALLY} "$emu" \
    train "$tmp/r.yaml" run.output_dir="$tmp/$name" runtime.device=cuda \
    runtime.communicator="$how" "$@" > "$tmp/$name.log" 2>&1
}
# staged_calls LOG: rank 0's count of calls staged through host memory.
staged_calls() {
  sed -n 's/^ft: \([0-9]*\) communication calls staged through host memory.*/\1/p' "$1" | head -1
}

layouts=("dp2_z0 2 fp32 parallel.zero_stage=0" "dp2_z1 2 fp32 parallel.zero_stage=1"
         "dp2_z2 2 fp32 parallel.zero_stage=2" "dp2_z3 2 fp32 parallel.zero_stage=3"
         "dp4_z2 4 fp32 parallel.zero_stage=2" "tp2 2 fp32 parallel.tensor=2"
         "pp2 2 fp32 parallel.pipeline=2"
         "dp2_pp2 4 fp32 parallel.pipeline=2" "dp2_z3 2 bf16 parallel.zero_stage=3"
         "pp2 2 bf16 parallel.pipeline=2"
         "tp2 2 bf16 parallel.tensor=2")
for l in "${layouts[@]}"; do
  read -r layout np p override <<< "$l"
  name=nccl_${layout}_$p
  ranks $name "$np" nccl training.precision=$p "$override" \
    || fail "$name: $(tail -5 "$tmp/$name.log")"
  grep -q '^ft: device memory between ranks: nccl 2\.' "$tmp/$name.log" \
    || fail "$name: the header does not say NCCL: $(grep 'device memory' "$tmp/$name.log")"
  # With NCCL nothing is staged through host memory.
  calls=$(staged_calls "$tmp/$name.log")
  [[ ${calls:-0} == 0 ]] || fail "$name: $calls calls still staged through host memory"
  echo "$layout ($np ranks) $p through the emulated NCCL against the one-process CPU run:"
  compare "$tmp/$name" "$tmp/cpu_$p" ${loss_rel[$p]} ${norm_rel[$p]} \
    || fail "$name differs from the CPU run"
done

# Pipeline 3 (three stages, three layers: its own one-process reference), fp32.
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/cpu_l3" runtime.device=cpu model.n_layers=3 \
  > "$tmp/cpu_l3.log" 2>&1 || fail "one-process CPU run, 3 layers: $(tail -3 "$tmp/cpu_l3.log")"
ranks nccl_pp3 3 nccl parallel.pipeline=3 model.n_layers=3 \
  || fail "nccl_pp3: $(tail -5 "$tmp/nccl_pp3.log")"
calls=$(staged_calls "$tmp/nccl_pp3.log")
[[ ${calls:-0} == 0 ]] || fail "nccl_pp3: $calls calls still staged through host memory"
echo "pp3 (3 ranks) fp32 through the emulated NCCL against the one-process CPU run:"
compare "$tmp/nccl_pp3" "$tmp/cpu_l3" 1e-5 1e-4 || fail "nccl_pp3 differs from the CPU run"

# The same layout again: the same bits (the emulated NCCL sums in rank order, as real NCCL sums
# in an order fixed by its communicator).
ranks nccl_again 2 nccl parallel.zero_stage=2 || fail "again: $(tail -5 "$tmp/nccl_again.log")"
cmp <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/nccl_again/metrics.jsonl") \
    <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/nccl_dp2_z2_fp32/metrics.jsonl") \
  || fail "two NCCL runs of the same layout differ"
# Overlap on (the default) and off give the same bits: the same calls, made during the backward
# or after it; with a 1 KiB bucket every group is reduced in several calls. Two micro-batches per
# rank, so only the second makes a gradient final.
for z in 0 1 2 3; do
  for o in true false; do
    ranks ov_z${z}_$o 2 nccl parallel.zero_stage=$z parallel.overlap_comm=$o \
      parallel.reduce_bucket_mb=0.0009765625 || fail "overlap $o, ZeRO $z: $(tail -5 "$tmp/ov_z${z}_$o.log")"
  done
  cmp <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/ov_z${z}_true/metrics.jsonl") \
      <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/ov_z${z}_false/metrics.jsonl") \
    || fail "ZeRO $z: overlap on and off differ"
  echo "ZeRO $z: overlap on and off give the same losses and grad norms, bit for bit"
done

# The overlapped update (AdamW on the update stream, each group waited for where the next forward
# first uses it; the emulation defers every stream's work until waited for): the same bits.
for l in "dp2_z0 2 fp32 parallel.zero_stage=0" "tp2 2 bf16 parallel.tensor=2" \
         "pp2 2 bf16 parallel.pipeline=2"; do
  read -r layout np p override <<< "$l"
  ranks ou_$layout "$np" nccl training.precision=$p "$override" parallel.overlap_update=true \
    || fail "overlap_update $layout: $(tail -5 "$tmp/ou_$layout.log")"
  compare "$tmp/ou_$layout" "$tmp/nccl_${layout}_$p" 0 0 \
    || fail "$layout: parallel.overlap_update changed the bits"
  echo "$layout $p: parallel.overlap_update gives the same bits"
done

# ZeRO-3's prefetch (parallel.prefetch_blocks: 0 gathers each group when acquired, 1 and 2 that
# many ahead) moves the same bits: the losses are identical, and the prefetching run holds
# more gathered parameters at its peak.
for pf in 0 2; do
  ranks pf$pf 2 nccl parallel.zero_stage=3 parallel.prefetch_blocks=$pf \
    || fail "prefetch $pf: $(tail -5 "$tmp/pf$pf.log")"
  cmp <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/pf$pf/metrics.jsonl") \
      <(grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$tmp/ov_z3_true/metrics.jsonl") \
    || fail "ZeRO-3 with prefetch_blocks $pf differs from 1"
done
peak() { grep -o '"mem_peak_bytes":[0-9]*' "$1/metrics.jsonl" | tail -1 | cut -d: -f2; }
(( $(peak "$tmp/pf2") > $(peak "$tmp/pf0") )) \
  || fail "prefetching 2 groups does not raise the peak: $(peak "$tmp/pf2") vs $(peak "$tmp/pf0")"
echo "ZeRO-3 prefetch 0, 1, 2: the same bits; peak $(peak "$tmp/pf0") B without, $(peak "$tmp/pf2") B with 2"

# parallel.reduce_dtype bf16 (FSDP's reduce_dtype): the gradient reductions move and sum bf16,
# at ZeRO 0 (all-reduce) and 2 (reduce-scatter), fp32 training: within the bf16 bounds of the
# CPU run, and not the fp32 reduction's bits (so the setting took effect); MPI refuses it.
for z in 0 2; do
  ranks rbf16_z$z 2 nccl parallel.zero_stage=$z parallel.reduce_dtype=bf16 \
    || fail "reduce_dtype bf16, ZeRO $z: $(tail -5 "$tmp/rbf16_z$z.log")"
  echo "ZeRO $z, gradients reduced in bf16, against the one-process fp32 CPU run:"
  compare "$tmp/rbf16_z$z" "$tmp/cpu_fp32" 2e-2 2e-1 || fail "reduce_dtype bf16 ZeRO $z differs"
  if cmp -s <(grep -o '"grad_norm":[^,]*' "$tmp/rbf16_z$z/metrics.jsonl") \
            <(grep -o '"grad_norm":[^,]*' "$tmp/nccl_dp2_z${z}_fp32/metrics.jsonl"); then
    fail "reduce_dtype bf16 gave the fp32 reduction's grad norms: not applied"
  fi
done
ranks rbf16_mpi 2 mpi parallel.reduce_dtype=bf16 && fail "reduce_dtype bf16 over MPI was accepted"
grep -q 'parallel.reduce_dtype: bf16 sums gradients through NCCL' "$tmp/rbf16_mpi.log" \
  || fail "reduce_dtype bf16 over MPI: $(grep -m1 rror "$tmp/rbf16_mpi.log")"

# ft plan's bytes are what the emulated NCCL counted (FT_NCCL_EMU_TALLY: bytes each rank sent,
# by the same ring formulas) over one step, per rank, for each kind of layout: the plan's data,
# tensor and pipeline groups less the step's host scalars, which go over MPI (the token count
# and the loss, 8 B each in a group of 2, on the data group; the loss on the pipeline group).
for l in "dz2 parallel.zero_stage=2 16" "dz3 parallel.zero_stage=3 16" "tp parallel.tensor=2 0" \
         "pp parallel.pipeline=2 8"; do
  read -r name override host <<< "$l"
  FT_NCCL_EMU_TALLY="$tmp/tally_$name" ranks tally_$name 2 nccl "$override" training.steps=1 \
    training.eval_every_steps=0 || fail "tally $name: $(tail -5 "$tmp/tally_$name.log")"
  "$emu" plan "$tmp/r.yaml" --world 2 runtime.device=cuda runtime.communicator=nccl \
    "$override" --json > "$tmp/tally_$name.json" || fail "plan $name"
  /usr/bin/python3 - "$tmp" "$name" "$host" <<'PY' || fail "plan $name: bytes differ from NCCL's"
import json, sys
tmp, name, host = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = json.load(open(f"{tmp}/tally_{name}.json"))
for role in plan["roles"]:
    planned = (role["sent_data_bytes"] + role["sent_tensor_bytes"] + role["sent_pipeline_bytes"]
               - host)
    for r in role["ranks"]:
        kinds = dict(l.split() for l in open(f"{tmp}/tally_{name}.{r}"))
        counted = sum(int(v) for v in kinds.values())
        assert counted == planned, (name, r, counted, planned, kinds)
        print(f"{name} rank {r}: ft plan {planned} B = emulated NCCL {counted} B ({kinds})")
PY
done

# MPI with host staging, the same layout: the same losses up to the order of the sums.
ranks mpi_dp2_z2 2 mpi parallel.zero_stage=2 || fail "mpi: $(tail -5 "$tmp/mpi_dp2_z2.log")"
grep -q 'staged through host memory$' "$tmp/mpi_dp2_z2.log" \
  || fail "runtime.communicator=mpi: the header does not say host staging"
compare "$tmp/mpi_dp2_z2" "$tmp/nccl_dp2_z2_fp32" 1e-6 1e-5 || fail "NCCL and MPI differ"

# NCCL needs GPUs: asked for on the CPU it is refused by name, by the recipe's validation
# (runtime.device=cpu, exit 2) and when auto chose the CPU (ft here, with no GPU: exit 2, every
# rank agreeing before any work, rank 0's one message, no MPI abort: train/preflight.h); auto
# falls back to MPI.
FT_CUDA_EMU_DEVICES=2 mpirun "${mpirun_args[@]}" -np 2 "$emu" train "$tmp/r.yaml" \
  run.output_dir="$tmp/cpu_nccl" runtime.device=cpu runtime.communicator=nccl \
  > "$tmp/cpu_nccl.log" 2>&1 && fail "runtime.communicator=nccl on the CPU was not refused"
grep -q 'runtime.communicator.*nccl moves GPU memory, and runtime.device is cpu' \
  "$tmp/cpu_nccl.log" || fail "the refusal does not say why: $(grep -m2 rror "$tmp/cpu_nccl.log")"
if [[ ! -e /dev/nvidia0 ]]; then
  mpirun "${mpirun_args[@]}" -np 2 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/auto_nccl" \
    runtime.communicator=nccl > "$tmp/auto_nccl.log" 2>&1 \
    && fail "runtime.communicator=nccl without a GPU was not refused"
  grep -q 'MPI_ABORT' "$tmp/auto_nccl.log" && fail "the refusal aborted the job: $(cat "$tmp/auto_nccl.log")"
  grep -q 'runtime.communicator: nccl: the device is cpu, not a GPU' "$tmp/auto_nccl.log" \
    || fail "the refusal does not say why: $(grep -m2 rror "$tmp/auto_nccl.log")"
fi
mpirun "${mpirun_args[@]}" -np 2 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/cpu_auto" \
  runtime.device=cpu training.steps=1 > "$tmp/cpu_auto.log" 2>&1 \
  || fail "auto on the CPU: $(tail -3 "$tmp/cpu_auto.log")"
grep -q '^ft: device memory between ranks: mpi world 2$' "$tmp/cpu_auto.log" \
  || fail "auto on the CPU: $(grep 'device memory' "$tmp/cpu_auto.log")"
echo "test_cuda_emu_nccl: OK"
