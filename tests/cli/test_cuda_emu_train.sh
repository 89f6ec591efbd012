#!/usr/bin/env bash
# The whole CUDA backend, executed without a GPU: ft_emu is ft with lib/runtime/cuda/ (device,
# caching allocator, ops, cuBLASLt calls) and kernels/cuda/ compiled by g++ against the CUDA
# emulation (tests/cuda_emu/, a test tool: CUDA threads as fibers, the runtime API on host
# memory, a cuBLASLt whose GEMM reads the layout descriptors as cuBLASLt defines them). It says
# nothing about GPU speed. A tiny GQA Llama trains with runtime.device=cuda on it and with the
# CPU backend (the reference), with accumulation, evaluation, clipping and checkpoints:
#  - fp32: at step 1 (before any update) losses within 1e-6 relative and grad norms within
#    1e-5; over 12 steps losses within 1e-4 (the GPU check's bound) and grad norms within 1e-3
#    (the two backends sum in different orders, ~1e-7 per op, and Adam at lr 0.01 amplifies
#    that: seen 1.4e-5 on an eval loss, 5.7e-5 on a grad norm);
#  - bf16 and fp16 (loss scaling): losses within 2e-2 relative and grad norms within 0.2 over
#    12 steps (each op rounds its output to 8 or 11 mantissa bits, at different points in the
#    sums, and this tiny model at lr 0.01 amplifies that: seen 3e-3 and 0.12 in fp16; 2e-2 is
#    the tolerance ref_test_bf16_autocast holds PyTorch to), and at step 1, before any update,
#    within 1e-3 and 1e-2;
#  - ZeRO 3 and activation checkpointing on the CUDA backend: the same bits as ZeRO 0 without it;
#  - determinism: two emulated runs under different schedule seeds give the same bits (in the
#    Release build; the sanitizer pass runs each configuration once);
#  - the fused attention kernel (the default where it applies: bf16/f16 at head dims 64 and 128;
#    the model above has head dim 16 and takes the chunked GEMMs) on the model widened to head
#    dim 64 (GQA 2), bf16: against the CPU within the 16-bit bounds above, the same bits under
#    another schedule seed (Release build), and not the bits of FT_CUDA_ATTENTION=gemm (so it
#    did run); its forward and backward by the Hopper kernels (FT_CUDA_ATTENTION_SM90=1) likewise
#    against the CPU, those kernels seen launched;
#  - a run killed at step 9 resumes from its step-8 checkpoint on the other backend (CUDA to CPU
#    and CPU to CUDA) and on its own (CUDA to CUDA: bit-identical to the uninterrupted run);
#  - runtime.gemm_algos: measure: within fp32's bounds of the CPU, and resumed bit-identically
#    with the choices its record kept;
#  - parallel.overlap_update (AdamW on the update stream under the next forward): the same bits
#    and checkpoint bytes as the update on the compute stream, fp32 and bf16 (seen: without the
#    forward's wait for a group's update, the deferred streams make the bits differ); refused
#    above ZeRO stage 0 and with offload;
#  - checkpoint.async: the checkpoints' bytes those of the synchronous saves. The emulation defers
#    each stream's work until something waits for it (FT_CUDA_EMU_STREAMS, cuda_emu.cpp), so a
#    copy stream that read the parameters without waiting for the update would save older ones
#    (seen: the wait in lib/ckpt/writer.cpp removed, these bytes differ).
#   bash tests/cli/test_cuda_emu_train.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 97 \
  --samples 40 --seq-len 16 --seed 5

cat > "$tmp/r.yaml" <<YAML
run: {name: e, output_dir: $tmp/out, seed: 3}
model: {dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 80, vocab_size: 97, max_seq_len: 16}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16, shuffle: true}
training: {steps: 12, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 6, eval_batches: 2,
           grad_clip: 0.5}
optimizer: {lr: 0.003}
checkpoint: {every_steps: 4}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

# compare DIR_A DIR_B LOSS_REL NORM_REL [STEP1_LOSS_REL STEP1_NORM_REL]: per-step losses, grad
# norms and eval losses of two runs (a bound of 0: the same bits), optionally tighter at step 1
# (before any update has amplified a difference); at least a loss and a grad norm a step.
compare() {
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --min-entries 24 \
    --loss-rel "$3" --norm-rel "$4" --step1-loss-rel "${5:-$3}" --step1-norm-rel "${6:-$4}"
}

train() {  # BINARY NAME [OVERRIDES...]
  local bin=$1 name=$2
  shift 2
  "$bin" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.log")"
}

train "$emu" f32 runtime.device=cuda
grep -q 'cuda:0 (CUDA emulation (test tool)' "$tmp/f32.log" || fail "f32 did not run on the emulated CUDA device: $(grep -m1 'ft: data' "$tmp/f32.log")"
train "$ft" f32_cpu runtime.device=cpu
echo "fp32, emulated CUDA backend against the CPU:"
compare "$tmp/f32" "$tmp/f32_cpu" 1e-4 1e-3 1e-6 1e-5 || fail "fp32: the CUDA backend and the CPU differ"

# Asynchronous saves copy on their own stream, after the compute stream's update: the same bytes.
train "$emu" f32_async runtime.device=cuda checkpoint.async=true
for f in "$tmp"/f32/checkpoints/step_*/rank_*.bin; do
  cmp -s "$f" "$tmp/f32_async/checkpoints/${f#"$tmp"/f32/checkpoints/}" \
    || fail "checkpoint.async saved other bytes than the synchronous save: ${f#"$tmp"/}"
done
echo "checkpoint.async on the emulated GPU: the same checkpoint bytes as synchronous saves"

# The SIMT attention kernels (the tensor-core path's plain twin) train the same way.
FT_CUDA_ATTENTION=simt train "$emu" f32_simt runtime.device=cuda
echo "fp32, emulated CUDA backend with SIMT attention against the CPU:"
compare "$tmp/f32_simt" "$tmp/f32_cpu" 1e-4 1e-3 1e-6 1e-5 || fail "fp32 simt: the CUDA backend and the CPU differ"

# 16-bit: the first step starts from the same weights (bf16 rounds P and dS in attention on tensor
# cores, the CPU keeps them fp32: 2e-4 seen); later steps drift as roundings compound through
# AdamW (1.5% seen in grad_norm at lr 0.003, which keeps this tiny run out of the loss spikes
# where a 16-bit trajectory separates from any other by tens of percent).
for p in bf16 fp16; do
  train "$emu" $p runtime.device=cuda training.precision=$p
  train "$ft" ${p}_cpu runtime.device=cpu training.precision=$p
  echo "$p, emulated CUDA backend against the CPU:"
  compare "$tmp/$p" "$tmp/${p}_cpu" 5e-3 5e-2 1e-4 2e-3 || fail "$p: the CUDA backend and the CPU differ"
done

train "$emu" bf16_z3_ac runtime.device=cuda training.precision=bf16 parallel.zero_stage=3 \
  training.activation_checkpointing=true
compare "$tmp/bf16_z3_ac" "$tmp/bf16" 0 0 || fail "bf16: ZeRO 3 + activation checkpointing differ"
echo "bf16 ZeRO 3 with activation checkpointing: the same bits as ZeRO 0 without"

# The overlapped update: the same kernels on the same values, in another order.
for p in f32 bf16; do
  precision=(); [[ $p == bf16 ]] && precision=(training.precision=bf16)
  train "$emu" ${p}_ou runtime.device=cuda "${precision[@]}" parallel.overlap_update=true
  compare "$tmp/${p}_ou" "$tmp/$p" 0 0 || fail "$p: parallel.overlap_update changed the bits"
  for f in "$tmp/$p"/checkpoints/step_*/rank_*.bin; do
    cmp -s "$f" "$tmp/${p}_ou/checkpoints/${f#"$tmp/$p"/checkpoints/}" \
      || fail "$p: parallel.overlap_update saved other bytes: ${f#"$tmp"/}"
  done
  echo "$p with parallel.overlap_update: the same bits and checkpoint bytes"
done
for bad in parallel.zero_stage=1 parallel.offload_optimizer=cpu; do
  "$emu" validate "$tmp/r.yaml" runtime.device=cuda parallel.overlap_update=true $bad \
    > "$tmp/ou_bad.log" 2>&1 && fail "parallel.overlap_update with $bad was accepted"
  grep -q "parallel.overlap_update" "$tmp/ou_bad.log" \
    || fail "the refusal of overlap_update with $bad does not name it: $(cat "$tmp/ou_bad.log")"
done

# Another schedule seed (the Release pass only: it repeats code run above, to compare bits).
if ! sanitizer_build; then
  FT_CUDA_EMU_SEED=20261123 train "$emu" bf16_seed runtime.device=cuda training.precision=bf16
  compare "$tmp/bf16_seed" "$tmp/bf16" 0 0 || fail "bf16: another schedule seed changed the bits"
  echo "bf16 under another schedule seed: the same bits"
fi

# The fused attention kernel: head dim 64 (dim 128, 2 query heads, 1 kv head), bf16.
hd64=(model.dim=128 model.n_heads=2 model.n_kv_heads=1 training.precision=bf16)
train "$emu" bf16_fused runtime.device=cuda "${hd64[@]}"
train "$ft" bf16_fused_cpu runtime.device=cpu "${hd64[@]}"
echo "bf16 at head dim 64 (fused attention), emulated CUDA backend against the CPU:"
compare "$tmp/bf16_fused" "$tmp/bf16_fused_cpu" 5e-3 5e-2 1e-4 2e-3 \
  || fail "bf16 fused: the CUDA backend and the CPU differ"
if ! sanitizer_build; then
  FT_CUDA_EMU_SEED=20261123 train "$emu" bf16_fused_seed runtime.device=cuda "${hd64[@]}"
  compare "$tmp/bf16_fused_seed" "$tmp/bf16_fused" 0 0 \
    || fail "bf16 fused: another schedule seed changed the bits"
  echo "bf16 fused attention under another schedule seed: the same bits"
fi
FT_CUDA_ATTENTION=gemm train "$emu" bf16_gemm runtime.device=cuda "${hd64[@]}"
if compare "$tmp/bf16_gemm" "$tmp/bf16_fused" 0 0 > /dev/null 2>&1; then
  fail "bf16 at head dim 64: FT_CUDA_ATTENTION=gemm gave the default's bits: the fused kernel did not run"
fi
echo "bf16 at head dim 64: the default differs from FT_CUDA_ATTENTION=gemm (the fused kernel ran)"
# The Hopper forward and backward (FT_CUDA_ATTENTION_SM90=1; the emulated device is sm_90):
# against the CPU within the same bounds, their kernels launched (the emulator's launch
# counts). On the emulation they give FlashAttention-2's bits (the same 64-row and 64-key
# tiles, each sum in k order, dK and dV over the query tiles in the same order), so the bits
# cannot tell.
FT_CUDA_EMU_LAUNCHES=1 FT_CUDA_ATTENTION_SM90=1 train "$emu" bf16_sm90 runtime.device=cuda "${hd64[@]}"
for kernel in forward dkdv dq; do
  grep -q "ft_emu launches: (attention_sm90_${kernel}_kernel" "$tmp/bf16_sm90.log" \
    || fail "bf16 sm90: no attention_sm90_${kernel}_kernel launch: $(grep 'ft_emu launches' "$tmp/bf16_sm90.log" | head -3)"
done
echo "bf16 at head dim 64 with the Hopper forward and backward, emulated CUDA backend against the CPU:"
compare "$tmp/bf16_sm90" "$tmp/bf16_fused_cpu" 5e-3 5e-2 1e-4 2e-3 \
  || fail "bf16 sm90: the CUDA backend and the CPU differ"

# Killed as step 9 begins (FT_TEST_KILL_AT_STEP; step_8 is saved), then resumed from that
# checkpoint by BINARY_2 on DEVICE_2.
resume() {  # NAME BINARY_1 DEVICE_1 BINARY_2 DEVICE_2 REFERENCE LOSS_REL NORM_REL
  local name=$1 rc=0
  (FT_TEST_KILL_AT_STEP=9 exec "$2" train "$tmp/r.yaml" run.output_dir="$tmp/$name" \
    runtime.device=$3) > "$tmp/$name.1.log" 2>&1 || rc=$?
  [[ $rc == 137 ]] || fail "$name part 1: exit $rc, expected 137 (SIGKILL): $(tail -3 "$tmp/$name.1.log")"
  "$4" train "$tmp/r.yaml" run.output_dir="$tmp/$name" runtime.device=$5 > "$tmp/$name.2.log" 2>&1 \
    || fail "$name part 2: $(tail -3 "$tmp/$name.2.log")"
  grep -q 'resumed from' "$tmp/$name.2.log" || fail "$name: part 2 did not resume"
  echo "$name:"
  compare "$tmp/$name" "$tmp/$6" "$7" "$8" || fail "$name: the resumed run differs from $6"
}
resume cuda_to_cuda "$emu" cuda "$emu" cuda f32 0 0
resume cuda_to_cpu "$emu" cuda "$ft" cpu f32 1e-5 1e-4
resume cpu_to_cuda "$ft" cpu "$emu" cuda f32_cpu 1e-5 1e-4

# runtime.gemm_algos: measure times each GEMM's algorithm among the emulated cuBLASLt's
# candidates (which round differently: tests/cuda_emu/cublaslt_emu.h) and records the choices in
# output_dir/gemm_algos/. A measured run killed at step 9; a second run in a folder holding a
# copy of its record makes the same choices without measuring (the record unchanged), within
# fp32's bounds of the CPU; the first, resumed, takes every choice from its record too (two
# fresh measured runs would differ in bits) and gives that second run's bits.
record=gemm_algos/rank_00000.txt
rc=0
(FT_TEST_KILL_AT_STEP=9 exec "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/measure_resume" \
  runtime.device=cuda runtime.gemm_algos=measure) > "$tmp/measure_resume.1.log" 2>&1 || rc=$?
[[ $rc == 137 ]] || fail "measure part 1: exit $rc: $(tail -3 "$tmp/measure_resume.1.log")"
n=$(wc -l < "$tmp/measure_resume/$record") || fail "measure: no record $record"
(( n > 10 )) || fail "measure: $n lines in $record"
before=$(md5sum < "$tmp/measure_resume/$record")
mkdir -p "$tmp/measure_again/gemm_algos"
cp "$tmp/measure_resume/$record" "$tmp/measure_again/$record"
train "$emu" measure_again runtime.device=cuda runtime.gemm_algos=measure
[[ $(md5sum < "$tmp/measure_again/$record") == "$before" ]] \
  || fail "measure: a run given the record measured again instead of taking it"
echo "fp32 with measured GEMM algorithms ($((n - 2)) recorded), against the CPU:"
compare "$tmp/measure_again" "$tmp/f32_cpu" 1e-4 1e-3 1e-6 1e-5 || fail "measure: differs from the CPU"
"$emu" train "$tmp/r.yaml" run.output_dir="$tmp/measure_resume" runtime.device=cuda \
  runtime.gemm_algos=measure > "$tmp/measure_resume.2.log" 2>&1 \
  || fail "measure part 2: $(tail -3 "$tmp/measure_resume.2.log")"
grep -q 'resumed from' "$tmp/measure_resume.2.log" || fail "measure: part 2 did not resume"
[[ $(md5sum < "$tmp/measure_resume/$record") == "$before" ]] \
  || fail "measure: the resumed part measured again instead of taking its record"
echo "measure, killed at step 9 and resumed with the recorded choices:"
compare "$tmp/measure_resume" "$tmp/measure_again" 0 0 || fail "measure: the resumed run's bits differ"
echo "test_cuda_emu_train: OK"
