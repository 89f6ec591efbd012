#!/usr/bin/env bash
# FT_PROFILE=1 (DESIGN.md §7): rank 0 prints one table at the end of the run, with the op
# families a training step runs, their call counts (per step: the GEMMs of every linear layer,
# once forward, once dx, once dW; one AdamW call per run of adjacent tensors with the same
# weight decay), and the same losses as without it
# (the wrapper only forwards). Without FT_PROFILE there is no table. Times are not checked.
# One process, and --nproc 2 (data 2, ZeRO 3, bf16): still one table (rank 0's).
#   bash tests/cli/test_profile.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:1" --vocab 96 --tokens 2000 --seed 1
cat > "$tmp/r.yaml" <<YAML
run: {name: prof, output_dir: $tmp/out, seed: 5}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 96,
        max_seq_len: 16}
data: {train: $tmp/train, seq_len: 16, shuffle: false}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 2, grad_clip: 1.0}
optimizer: {weight_decay: 0.1}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

losses() { grep -o '"loss":[^,]*' "$1"; }
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/plain" > "$tmp/plain.txt" 2>&1 \
  || fail "plain run: $(cat "$tmp/plain.txt")"
! grep -q "FT_PROFILE" "$tmp/plain.txt" || fail "a table without FT_PROFILE"
FT_PROFILE=1 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/prof" > "$tmp/prof.txt" 2>&1 \
  || fail "profiled run: $(cat "$tmp/prof.txt")"
[[ "$(losses "$tmp/plain/metrics.jsonl")" == "$(losses "$tmp/prof/metrics.jsonl")" ]] \
  || fail "FT_PROFILE changed the losses"
grep -q "ft: FT_PROFILE, rank 0: 2 steps" "$tmp/prof.txt" || fail "no table: $(cat "$tmp/prof.txt")"
calls() { awk -v f="$1" 'index($0, "  " f " ") == 1 { print $NF }' "$tmp/prof.txt"; }
# 2 layers x 7 linear layers + the LM head = 15 GEMMs per step and direction, over the 2 steps
# after the first (left out as a warm-up).
for fam in "GEMM forward" "GEMM backward dx" "GEMM backward dW"; do
  [[ "$(calls "$fam")" == 30 ]] \
    || fail "$fam: $(calls "$fam") calls, expected 30: $(cat "$tmp/prof.txt")"
done
# AdamW: one call per run of adjacent tensors with the same weight decay (decay on matrices,
# none on norms): the embedding; per layer input norm | q, k, v, o | post-attention norm |
# gate, up, down; the final norm | the LM head: 1 + 2 x 4 + 2 = 11 per step (21 tensors).
[[ "$(calls adamw)" == 22 ]] || fail "adamw: $(calls adamw) calls, expected 22"
[[ "$(calls "attention forward")" == 4 ]] || fail "attention forward: $(calls "attention forward")"
# RMSNorm: 2 per layer + the final one, forward and backward: 10 per step. The norms' backward
# adds its dx into the residual gradient itself (accumulate_dx), so one process runs no add at
# all (it was 2 per layer and step: 12); the table leaves out families that never ran.
[[ "$(calls rmsnorm)" == 20 ]] || fail "rmsnorm: $(calls rmsnorm) calls, expected 20"
[[ -z "$(calls add)" ]] || fail "add: $(calls add) calls, expected none (fused into rmsnorm)"
grep -q "other (comm, loader, host)" "$tmp/prof.txt" || fail "no 'other' row"

FT_PROFILE=1 "$ft" train "$tmp/r.yaml" --nproc 2 training.precision=bf16 parallel.zero_stage=3 \
  training.global_batch_size=4 run.output_dir="$tmp/dp" > "$tmp/dp.txt" 2>&1 \
  || fail "--nproc 2: $(cat "$tmp/dp.txt")"
[[ $(grep -c "ft: FT_PROFILE" "$tmp/dp.txt") == 1 ]] || fail "--nproc 2: not one table"
echo "ok"
