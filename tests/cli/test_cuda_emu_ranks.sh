#!/usr/bin/env bash
# Multi-rank training on the CUDA backend (DESIGN.md §3, "Communication of device memory") with
# runtime.communicator=mpi (NCCL's runs: test_cuda_emu_nccl.sh): Open MPI here is not
# CUDA-aware, so the model, ZeRO and the pipeline hand device memory to their groups through
# host staging (lib/comm/host_staging.h). ft_emu (the CUDA backend on the
# emulation, tests/cuda_emu/; it says nothing about GPU speed) runs under mpirun with two
# emulated GPUs (FT_CUDA_EMU_DEVICES=2), each rank taking its node-local rank's:
#  - every rank names its GPU: cuda:0 in rank 0's header, cuda:1 in rank 1's start line;
#  - data parallel 2 under ZeRO 0 and ZeRO 3, tensor parallel 2 and pipeline 2 against the
#    one-process CPU run: per-step losses and eval losses within 1e-5 relative, grad norms within
#    1e-4 (fp32; the emulated backend sums in another order than the CPU (~1e-7 per op) and a
#    layout in another order again; Adam amplifies that over the steps, as in
#    test_cuda_emu_train.sh and tests/ref/compare_layouts.py, which hold the same bounds);
#  - in bf16, data parallel 2 under ZeRO 1 and pipeline 2 (2-byte elements staged) against the
#    one-process CPU bf16 run: losses within 2e-2, grad norms within 0.2 (each op rounds to 8
#    mantissa bits at other points of its sums: the bounds of test_cuda_emu_train.sh);
#  - every rank's closing line says how many calls went through host staging (none on the CPU).
# The guard device (FT_TEST_GUARD_DEVICE=1, lib/runtime/guard_device.h: device memory PROT_NONE
# outside the Device's own ops and copies, as a GPU's is to MPI) runs the same four layouts:
# handed to MPI unstaged its memory kills the run, staged it gives the CPU run's losses.
#   bash tests/cli/test_cuda_emu_ranks.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env -np 2
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 64 \
  --samples 24 --seq-len 8 --seed 7

# Tied embeddings, so that pipeline 2 also sums the embedding's gradient between its holders.
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

# compare DIR_A DIR_B LOSS_REL NORM_REL: per-step losses, grad norms and eval losses; at least
# a loss and a grad norm for each of the 4 steps and the 2 evaluations.
compare() {
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --min-entries 10 \
    --loss-rel "$3" --norm-rel "$4"
}

for p in fp32 bf16; do
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/cpu_$p" runtime.device=cpu \
    training.precision=$p > "$tmp/cpu_$p.log" 2>&1 \
    || fail "one-process CPU run, $p: $(tail -3 "$tmp/cpu_$p.log")"
  grep -q 'staged through host memory' "$tmp/cpu_$p.log" && fail "the CPU run staged communication"
done
# Relative bounds on losses and grad norms per precision (see the top of this file).
declare -A loss_rel=([fp32]=1e-5 [bf16]=2e-2) norm_rel=([fp32]=1e-4 [bf16]=2e-1)

# NAME PRECISION OVERRIDE. bf16: ZeRO 1 all-gathers the 2-byte compute copy, and the pipeline
# sends 2-byte activations and gradients.
layouts=("dp2_z0 fp32 parallel.zero_stage=0" "dp2_z3 fp32 parallel.zero_stage=3"
         "tp2 fp32 parallel.tensor=2" "pp2 fp32 parallel.pipeline=2"
         "dp2_z1 bf16 parallel.zero_stage=1" "pp2 bf16 parallel.pipeline=2")
# ranks NAME BINARY ENV_NAME OVERRIDES...: two ranks, ENV_NAME passed on; fails unless both
# finish.
ranks() {
  local name=$1 bin=$2 env_name=$3
  shift 3
  mpirun "${mpirun_args[@]}" -x "$env_name" "$bin" train "$tmp/r.yaml" \
    run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1
}
for l in "${layouts[@]}"; do
  read -r layout p override <<< "$l"
  name=cuda_${layout}_$p
  FT_CUDA_EMU_DEVICES=2 ranks $name "$emu" FT_CUDA_EMU_DEVICES runtime.device=cuda \
    runtime.communicator=mpi training.precision=$p "$override" \
    || fail "$name: $(tail -5 "$tmp/$name.log")"
  grep -q 'cuda:0 (CUDA emulation (test tool)' "$tmp/$name.log" \
    || fail "$name: rank 0 is not on cuda:0: $(grep -m1 'ft: data' "$tmp/$name.log")"
  grep -q '^\[rank 1 .*\] ft: device cuda:1 (CUDA emulation' "$tmp/$name.log" \
    || fail "$name: rank 1 is not on cuda:1: $(grep 'ft: device' "$tmp/$name.log")"
  for r in 0 1; do
    prefix='^'; [[ $r == 1 ]] && prefix='^\[rank 1 .*\] '
    grep -q "${prefix}ft: [0-9]* communication calls staged through host memory" \
      "$tmp/$name.log" || fail "$name: rank $r did not stage through host memory"
  done
  echo "$layout $p on two emulated GPUs (cuda:0, cuda:1) against the one-process CPU run:"
  compare "$tmp/$name" "$tmp/cpu_$p" ${loss_rel[$p]} ${norm_rel[$p]} \
    || fail "$name differs from the CPU run"
done

for l in "${layouts[@]}"; do
  read -r layout p override <<< "$l"
  [[ $p == fp32 ]] || continue
  name=guard_$layout
  FT_TEST_GUARD_DEVICE=1 ranks $name "$ft" FT_TEST_GUARD_DEVICE runtime.device=cpu \
    "$override" || fail "$name: $(tail -5 "$tmp/$name.log")"
  grep -q 'communication calls staged through host memory' "$tmp/$name.log" \
    || fail "$name: did not stage through host memory"
  echo "$layout on the guard device against the one-process CPU run:"
  compare "$tmp/$name" "$tmp/cpu_fp32" 1e-5 1e-4 || fail "$name differs from the CPU run"
done
echo "test_cuda_emu_ranks: OK"
