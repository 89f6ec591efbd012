#!/usr/bin/env bash
# One dispatch point (DESIGN.md §2): model, ZeRO, pipeline, optimizer and checkpoint code reach
# device memory only through the Device's ops and copies. Under FT_TEST_GUARD_DEVICE=1 every
# device allocation is PROT_NONE outside those (lib/runtime/guard_device.h), so a host read or
# write anywhere else kills the run (SIGSEGV, or EFAULT from a system call). Runs, one process
# (under MPI the guard device goes through host staging: tests/cli/test_cuda_emu_ranks.sh):
#  - fp32, bf16 and fp16, ZeRO 0-3, evaluation, checkpoints every 4 steps, a resume from step 8,
#    HF weights loaded with model.from: every run completes and its losses and grad norms are
#    identical to the same run on the plain CPU device.
# A negative control that the guard bites is in tests/unit/test_guard_device.cpp.
#   bash tests/cli/test_guard_device.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"

/usr/bin/python3 - "$tmp" "$src" <<'PY'
import sys, os
tmp, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests", "ref"))
import numpy as np, llama_ref as ref
rng = np.random.default_rng(2)
for name, n in (("train", 2), ("valid", 1)):
    os.makedirs(f"{tmp}/{name}")
    for i in range(n):
        ref.write_shard(f"{tmp}/{name}/shard_{i:05d}.h5", rng.integers(0, 97, 40 * 16 + 1), 97)
cfg = ref.Config(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=97,
                 max_seq_len=32)
ref.save_hf_folder(ref.Llama(cfg, seed=3), f"{tmp}/hf")
PY

cat > "$tmp/r.yaml" <<YAML
run: {name: g, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16, shuffle: true}
training: {steps: 12, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 6, eval_batches: 2,
           grad_clip: 0.5}
optimizer: {lr: 0.01}
checkpoint: {every_steps: 4}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

same() {  # DIR_A DIR_B: identical losses, grad norms, eval losses, loss scales (each step's last)
  /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$1" "$2" --loss-rel 0 --norm-rel 0 \
    --keys loss,grad_norm,eval_loss,loss_scale --min-entries 12 > /dev/null
}

run() {  # NAME [OVERRIDES...]: guarded and plain, same results
  local name=$1
  shift
  FT_TEST_GUARD_DEVICE=1 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name.g" "$@" \
    > "$tmp/$name.g.log" 2>&1 || fail "$name under the guard device: $(tail -3 "$tmp/$name.g.log")"
  grep -q 'cpu (guarded: FT_TEST_GUARD_DEVICE)' "$tmp/$name.g.log" \
    || fail "$name: the run did not use the guard device"
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name.p" "$@" > "$tmp/$name.p.log" 2>&1 \
    || fail "$name: $(tail -3 "$tmp/$name.p.log")"
  same "$tmp/$name.g" "$tmp/$name.p" || fail "$name: guarded and plain runs differ"
  echo "$name: guarded run complete, identical to the plain one"
}

for p in fp32 bf16 fp16; do
  for z in 0 1 2 3; do run "${p}_z$z" training.precision=$p parallel.zero_stage=$z; done
done
run hf_bf16 training.precision=bf16 model.from="$tmp/hf"
run ckpt_bf16 training.precision=bf16 training.activation_checkpointing=true

# Resume: killed as step 9 begins (FT_TEST_KILL_AT_STEP; step_8 is saved), then the same
# command again, both under the guard.
rc=0
(FT_TEST_GUARD_DEVICE=1 FT_TEST_KILL_AT_STEP=9 exec "$ft" train "$tmp/r.yaml" \
  run.output_dir="$tmp/res" training.precision=bf16) > "$tmp/res1.log" 2>&1 || rc=$?
[[ $rc == 137 ]] || fail "resume part 1: exit $rc, expected 137 (SIGKILL): $(tail -3 "$tmp/res1.log")"
FT_TEST_GUARD_DEVICE=1 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/res" training.precision=bf16 \
  > "$tmp/res2.log" 2>&1 || fail "resume part 2: $(tail -3 "$tmp/res2.log")"
grep -q 'resumed from' "$tmp/res2.log" || fail "part 2 did not resume"
same "$tmp/res" "$tmp/bf16_z0.p" || fail "the guarded resume differs from the plain run"
echo "resume under the guard: identical"
echo "test_guard_device: OK"
