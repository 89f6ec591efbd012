#!/usr/bin/env bash
# parallel.offload_optimizer: cpu (DESIGN.md §3 "Offload"): the fp32 masters, gradients and AdamW
# moments of a rank's ranges in (page-locked) host memory, the update on the host; with
# parallel.offload_params: cpu (ZeRO 3) the compute copy's shards too, streamed there from the
# start, each group's gather beginning with a host-to-device copy. It needs a
# device apart from the host, so it runs on ft_emu (the CUDA backend on the CUDA emulation, a test
# tool: its streams, events and async copies are the runtime API's, run on the CPU; nothing here
# says anything of GPU speed). A tiny GQA Llama, 2 micro-batches a step (so ZeRO 2-3's second
# micro-batch goes through the host staging and is added there), gradient clipping, an
# evaluation after steps 3 and 6 (which meets the update pending from the step before it: the
# update is applied as each group is next used), compared with the losses and norms:
#  1. fp32: offload against none at ZeRO 0 and ZeRO 3: losses and grad norms within 1e-6
#     relative (the host AdamW is the CPU kernel, the device's the CUDA one: the same expression,
#     summed and contracted differently; seen 4e-7 on a norm);
#  2. bf16: offload at ZeRO 3 gives ZeRO 2's bits (the same host arithmetic whatever the cut);
#     against no offload the emulated backend's 16-bit bounds;
#  3. fp16 with a NaN gradient at step 3: the step is skipped with offload as without (the host
#     state is not touched: the runs stay within 1e-3 of each other after it, and the skipped
#     line is there);
#  4. offload_params at ZeRO 3, fp32 and bf16: the same bits as offload_optimizer alone (the same
#     values gathered, from host instead of device memory), also from model.from (an HF folder
#     exported from a checkpoint here: its groups streamed to the host as they are read); its
#     start-up holds one group on the device: ft plan's startup_params_bytes is the largest
#     group's fp32 bytes (a layer: 27776 elements), not the model's; LoRA (an adapter's groups
#     are not streamed: ZeRO takes them from the model) with both offloads against none within
#     1e-6 (LoRA's frozen base holds no host state);
#  5. a run with both offloads and async checkpoints, killed after its step-4 save, resumes bit
#     for bit equal to the uninterrupted run (the state is read from and into host memory);
#  6. data 2 x tensor 2 (4 ranks) and pipeline 2 with tied embeddings (the embedding's gradient
#     summed between its holders on the host path), ZeRO 3 with both offloads, against the
#     one-process CPU run without: losses within 1e-5, grad norms within 1e-4 (the bounds of
#     test_cuda_emu_ranks); ZeRO 1 of two ranks over the emulated NCCL, the gradients landed
#     bucket by bucket as each all-reduce ends (reduced in bf16), against none within 1e-5,
#     step 2 the same bits;
#  7. refusals: ft validate refuses offload with runtime.device cpu, offload_params below ZeRO 3
#     and offload_params without offload_optimizer, each naming the key (exit 2); a host that
#     cannot page-lock the memory (the emulation's limit) stops the run saying how much it
#     asked and how to ask for less; a run whose auto device is the CPU stops before training,
#     saying why.
# ft plan's device peak with offload equals the measured one: test_cuda_emu_plan.sh.
#   bash tests/cli/test_cuda_emu_offload.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" --vocab 96 --samples 40 \
  --seq-len 16 --seed 5

cat > "$tmp/r.yaml" <<YAML
run: {name: o, output_dir: $tmp/out, seed: 3}
model: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 80, vocab_size: 96, max_seq_len: 16}
data: {train: $tmp/train, valid: $tmp/train, seq_len: 16, shuffle: true}
training: {steps: 6, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0.5,
           eval_every_steps: 3, eval_batches: 1}
optimizer: {lr: 0.003}
checkpoint: {every_steps: 4, async: true}
logging: {every_steps: 1}
runtime: {threads: 2, device: cuda}
YAML

# compare DIR_A DIR_B LOSS_REL NORM_REL: per-step losses and grad norms (0: the same bits).
compare() {
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --min-entries 12 \
    --loss-rel "$3" --norm-rel "$4"
}
train() {  # NAME [OVERRIDES...]: one process on the emulated GPU
  local name=$1
  shift
  "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.log")"
}

# 1. fp32 at ZeRO 0 and 3.
for z in 0 3; do
  train f32_z${z} parallel.zero_stage=$z
  train f32_z${z}_off parallel.zero_stage=$z parallel.offload_optimizer=cpu
  grep -q 'cuda:0 (CUDA emulation' "$tmp/f32_z${z}_off.log" || fail "f32_z${z}_off: not on the emulated GPU"
  echo "fp32 ZeRO $z, offload against none:"
  compare "$tmp/f32_z${z}_off" "$tmp/f32_z${z}" 1e-6 1e-6 || fail "fp32 ZeRO $z: offload differs"
done

# 2. bf16: ZeRO 2 and 3 with offload, the same bits.
train bf16 training.precision=bf16
for z in 2 3; do
  train bf16_z${z}_off training.precision=bf16 parallel.zero_stage=$z parallel.offload_optimizer=cpu
done
compare "$tmp/bf16_z3_off" "$tmp/bf16_z2_off" 0 0 > /dev/null \
  || fail "bf16: offload at ZeRO 3 is not bit-identical to ZeRO 2"
echo "bf16 with offload: ZeRO 3 gives ZeRO 2's bits; against none:"
compare "$tmp/bf16_z2_off" "$tmp/bf16" 5e-3 5e-2 || fail "bf16: offload differs from none"

# 3. fp16, a NaN gradient at step 3: skipped with offload too.
for o in none cpu; do
  FT_TEST_NAN_GRAD_AT_STEP=3 train fp16_$o training.precision=fp16 parallel.zero_stage=2 \
    parallel.offload_optimizer=$o
  grep '"step":3,' "$tmp/fp16_$o/metrics.jsonl" | grep -q '"skipped":true' \
    || fail "fp16 $o: step 3 was not skipped: $(grep '"step":3,' "$tmp/fp16_$o/metrics.jsonl")"
done
echo "fp16 with a NaN gradient at step 3, offload against none (both skipped it):"
/usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/fp16_cpu" "$tmp/fp16_none" \
  --min-entries 11 --loss-rel 1e-3 --norm-rel 1e-2 || fail "fp16: offload differs after the skip"

# 4. offload_params: the same bits as the optimizer's offload alone; LoRA.
both=(parallel.zero_stage=3 parallel.offload_optimizer=cpu parallel.offload_params=cpu)
train f32_z3_both "${both[@]}"
compare "$tmp/f32_z3_both" "$tmp/f32_z3_off" 0 0 > /dev/null \
  || fail "fp32: offload_params differs from offload_optimizer alone"
train bf16_z3_both training.precision=bf16 "${both[@]}"
compare "$tmp/bf16_z3_both" "$tmp/bf16_z3_off" 0 0 > /dev/null \
  || fail "bf16: offload_params differs from offload_optimizer alone"
"$ft" export "$tmp/f32_z3/checkpoints" --output "$tmp/hf" > "$tmp/export.log" 2>&1 \
  || fail "export: $(tail -3 "$tmp/export.log")"
train hf_off training.precision=bf16 model.from="$tmp/hf" parallel.zero_stage=3 \
  parallel.offload_optimizer=cpu
train hf_both training.precision=bf16 model.from="$tmp/hf" "${both[@]}"
compare "$tmp/hf_both" "$tmp/hf_off" 0 0 > /dev/null \
  || fail "model.from: offload_params differs from offload_optimizer alone"
echo "offload_params at ZeRO 3, fp32 and bf16, and from model.from: the bits of offload_optimizer alone"
"$ft" plan "$tmp/r.yaml" "${both[@]}" --json > "$tmp/plan.json" || fail "plan with both offloads"
/usr/bin/python3 - "$tmp/plan.json" <<'PY' || fail "offload_params: start-up holds more than a group"
import json, sys
role = json.load(open(sys.argv[1]))["roles"][0]
layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 80 + 2 * 64  # q, o; k, v; gate, up, down; 2 norms
assert role["startup_params_bytes"] == 4 * layer, (role["startup_params_bytes"], 4 * layer)
assert role["params_bytes"] == 0, role["params_bytes"]
print(f"offload_params: start-up's parameter peak {role['startup_params_bytes']} B, one layer in "
      f"fp32, of a {4 * role['param_elems']}-byte model")
PY
train lora adapter.type=lora adapter.r=4
train lora_both adapter.type=lora adapter.r=4 "${both[@]}"
echo "LoRA r 4 with both offloads against none:"
compare "$tmp/lora_both" "$tmp/lora" 1e-6 1e-6 || fail "LoRA: offload differs"

# 5. Killed as step 6 begins (step_4 saved, asynchronously), resumed: the same bits.
off=(training.precision=bf16 "${both[@]}")
rc=0
(FT_TEST_KILL_AT_STEP=6 exec "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/resumed" "${off[@]}") \
  > "$tmp/resumed.1.log" 2>&1 || rc=$?
[[ $rc == 137 ]] || fail "resume part 1: exit $rc, expected 137: $(tail -3 "$tmp/resumed.1.log")"
train resumed "${off[@]}"
grep -q 'resumed from .*step_00000004' "$tmp/resumed.log" \
  || fail "did not resume from step 4: $(grep -m1 resum "$tmp/resumed.log")"
echo "bf16 ZeRO 3 with both offloads, killed and resumed from step 4:"
compare "$tmp/resumed" "$tmp/bf16_z3_both" 0 0 || fail "the resumed run differs"

# 6. Several ranks on emulated GPUs (MPI, host-staged), against the one-process CPU run.
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/cpu" runtime.device=cpu > "$tmp/cpu.log" 2>&1 \
  || fail "cpu: $(tail -3 "$tmp/cpu.log")"
ranks() {  # NAME N REFERENCE OVERRIDES...
  local name=$1 n=$2 ref=$3
  shift 3
  FT_CUDA_EMU_DEVICES=$n mpirun "${mpirun_args[@]}" -np "$n" -x FT_CUDA_EMU_DEVICES "$emu" train \
    "$tmp/r.yaml" run.output_dir="$tmp/$name" runtime.communicator=mpi "${both[@]}" "$@" \
    > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -5 "$tmp/$name.log")"
  echo "$name with both offloads against the one-process CPU run:"
  compare "$tmp/$name" "$tmp/$ref" 1e-5 1e-4 || fail "$name differs from the CPU run"
}
ranks dp2_tp2 4 cpu parallel.tensor=2
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/cpu_tied" runtime.device=cpu \
  model.tie_embeddings=true > "$tmp/cpu_tied.log" 2>&1 || fail "cpu_tied: $(tail -3 "$tmp/cpu_tied.log")"
ranks pp2_tied 2 cpu_tied parallel.pipeline=2 model.tie_embeddings=true
# ZeRO 1 of two ranks over the emulated NCCL, whose reductions run on a stream of their own: each
# bucket's part of the rank's range goes to the host after its all-reduce, on the copy stream
# (buckets of 4 KiB, so that they cross the ranks' ranges), reduced in bf16 (converted back on
# the copy stream too; fp32 lands the same way, without the conversion): against the same
# layout without offload.
for rd in bf16; do
  for o in none cpu; do
    FT_CUDA_EMU_DEVICES=2 mpirun "${mpirun_args[@]}" -np 2 -x FT_CUDA_EMU_DEVICES "$emu" train \
      "$tmp/r.yaml" run.output_dir="$tmp/z1_${rd}_$o" runtime.communicator=nccl \
      parallel.zero_stage=1 parallel.reduce_dtype=$rd parallel.reduce_bucket_mb=0.004 \
      parallel.offload_optimizer=$o > "$tmp/z1_${rd}_$o.log" 2>&1 \
      || fail "z1_${rd}_$o: $(tail -5 "$tmp/z1_${rd}_$o.log")"
  done
  echo "ZeRO 1, data 2 over NCCL, reduced in $rd, bucket by bucket to the host, against none:"
  # Reduced in bf16, the two backends' AdamW roundings (~1e-9 of a weight) move a gradient
  # element across a bf16 rounding now and then, and the runs drift apart a little faster.
  compare "$tmp/z1_${rd}_cpu" "$tmp/z1_${rd}_none" $([[ $rd == fp32 ]] && echo 1e-6 1e-6 || echo 1e-5 1e-5) \
    || fail "ZeRO 1 $rd offload differs"
  # The first update's gradients are the same bits: step 2's loss and norm are.
  step2() { grep '"step":2,' "$1/metrics.jsonl" | grep -o '"grad_norm":[^,]*,"loss":[^,]*'; }
  [[ $(step2 "$tmp/z1_${rd}_cpu") == "$(step2 "$tmp/z1_${rd}_none")" && -n $(step2 "$tmp/z1_${rd}_cpu") ]] \
    || fail "ZeRO 1 $rd offload: step 2 differs: $(step2 "$tmp/z1_${rd}_cpu") vs $(step2 "$tmp/z1_${rd}_none")"
done

# 7. Refusals.
run_rc 2 "$ft" validate "$tmp/r.yaml" runtime.device=cpu parallel.offload_optimizer=cpu
has_err "parallel.offload_optimizer"
has_err "runtime.device is cpu"
run_rc 2 "$ft" validate "$tmp/r.yaml" parallel.zero_stage=2 parallel.offload_optimizer=cpu \
  parallel.offload_params=cpu
has_err "parallel.offload_params"
has_err "below stage 3"
run_rc 2 "$ft" validate "$tmp/r.yaml" parallel.zero_stage=3 parallel.offload_params=cpu
has_err "offload the optimizer first"
# A host that cannot page-lock the state (the emulation's FT_CUDA_EMU_PINNED_MIB, as ulimit -l):
# the error says how much was asked and how to ask for less.
FT_CUDA_EMU_PINNED_MIB=0 run_rc 1 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/pinned" \
  parallel.zero_stage=2 parallel.offload_optimizer=cpu
has_err "cannot allocate"
has_err "of page-locked host memory"
has_err "parallel.offload_params: none"
has_err "ulimit -l"
run_rc 1 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/auto" runtime.device=auto \
  parallel.offload_optimizer=cpu
has_err "this run's device is the CPU"
echo "test_cuda_emu_offload: OK"
