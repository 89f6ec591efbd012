#!/usr/bin/env bash
# Non-finite gradients never reach the parameters or a checkpoint (DESIGN.md §5, §7, §8).
# A NaN written into one gradient element (FT_TEST_NAN_GRAD_AT_STEP=N[:rank]) or into the loss
# (FT_TEST_NAN_LOSS_AT_STEP) at step 5 of a run that checkpoints every 2 or 4 steps:
#  - exit 1, one message (rank 0's) naming step 5 (the step the progress line would show), the
#    first tensor whose gradient is not finite, and the last good checkpoint step_00000004;
#  - the progress and metrics end at step 4; `latest` names step_00000004, complete, and no
#    newer step folder exists; an async save of step 4 still in flight when step 5 fails
#    commits;
#  - the same command resumes from step_00000004 and ends with losses == a run never broken
#    (so nothing of the broken step reached the saved state).
# A real divergence (optimizer.lr=1e10) stops the same way at step 2.
# Layouts: one process; --nproc 4 data 2 x tensor 2 with the NaN on rank 3; --nproc 4 data 2 x
# pipeline 2 under ZeRO-3 with the NaN on rank 3 (the last stage: rank 0 holds none of it).
#   bash tests/cli/test_nonfinite.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
t_all=$SECONDS
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" --vocab 96 --samples 40 \
  --seq-len 16 --seed 1

cat > "$tmp/r.yaml" <<YAML
run: {name: nf, output_dir: $tmp/out, seed: 5}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 96, max_seq_len: 32}
data: {train: $tmp/train, seq_len: 16, shuffle: true}
training: {steps: 8, micro_batch_size: 1, global_batch_size: 4}
optimizer: {lr: 0.01}
scheduler: {name: cosine, warmup_steps: 2}
checkpoint: {every_steps: 2, keep_last: 10}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# metrics_steps DIR: the "step" of every loss line of DIR/metrics.jsonl, space-separated.
metrics_steps() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
print(" ".join(str(j["step"]) for j in map(json.loads, open(sys.argv[1])) if "loss" in j))
PY
}

# broken NAME HOOK MESSAGE [ARGS...]: a run with HOOK (an env assignment) that must stop at step 5
# with MESSAGE (a grep -E pattern) and leave step_00000004 as its newest checkpoint.
broken() {
  local name=$1 hook=$2 msg=$3 rc=0
  shift 3
  local out="$tmp/$name" ck="$tmp/$name/checkpoints"
  env "$hook" "$ft" train "$tmp/r.yaml" run.output_dir="$out" "$@" > "$out.log" 2> "$out.err" \
    || rc=$?
  [[ $rc == 1 ]] || fail "$name: exit $rc, expected 1: $(tail -5 "$out.err")"
  local want="^ft: error: step 5: $msg; nothing was updated or saved at this step; the last good"
  want+=" checkpoint is $ck/step_00000004 \(the same command resumes from it\); try a lower"
  grep -Eq "$want optimizer.lr" "$out.err" \
    || fail "$name: message: $(cat "$out.err")"
  [[ $(grep -c 'error' "$out.err") == 1 ]] || fail "$name: not one error line: $(cat "$out.err")"
  [[ $(grep '^step ' "$out.log" | tail -1) == "step 4/8 "* ]] \
    || fail "$name: progress does not end at step 4: $(grep '^step ' "$out.log" | tail -2)"
  [[ $(metrics_steps "$out") == "1 2 3 4" ]] || fail "$name: metrics steps $(metrics_steps "$out")"
  [[ $(cat "$ck/latest") == step_00000004 && -f $ck/step_00000004/COMPLETE ]] \
    || fail "$name: latest $(cat "$ck/latest"), folders $(ls "$ck")"
  [[ $(cd "$ck" && ls -d step_* | tail -1) == step_00000004 ]] \
    || fail "$name: a step folder newer than step_4: $(ls "$ck")"
  "$ft" inspect "$ck/step_00000004" > "$out.inspect" 2>&1 || fail "$name: step_4 does not verify"
  if grep -q '^ft: done\|^ft: last checkpoint' "$out.log"; then
    fail "$name: a summary after the failure"
  fi
}

# resumed NAME REF [ARGS...]: the same command resumes from step_00000004 and ends with the losses
# and grad norms of the unbroken run REF (steps 5..8 retrained; == since resume is exact).
resumed() {
  local name=$1 ref=$2
  shift 2
  local out="$tmp/$name"
  "$ft" train "$tmp/r.yaml" run.output_dir="$out" "$@" > "$out.resume.log" 2>&1 \
    || fail "$name: resume failed: $(tail -5 "$out.resume.log")"
  grep -q "resumed from $out/checkpoints/step_00000004 (step 4," "$out.resume.log" \
    || fail "$name: did not resume from step 4: $(grep -i resum "$out.resume.log")"
  /usr/bin/python3 - "$out/metrics.jsonl" "$tmp/$ref/metrics.jsonl" <<'PY' \
    || fail "$name: resumed losses differ from $ref"
import json, sys
def last(p):
    return {j["step"]: (j["loss"], j["grad_norm"]) for j in map(json.loads, open(p)) if "loss" in j}
got, ref = last(sys.argv[1]), last(sys.argv[2])
assert sorted(got) == list(range(1, 9)) and got == ref, (got, ref)
PY
}

# One process. The NaN goes into the first element of the first group: the embedding.
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref1" > "$tmp/ref1.log" 2>&1 \
  || fail "reference: $(tail -3 "$tmp/ref1.log")"
[[ $(metrics_steps "$tmp/ref1") == "1 2 3 4 5 6 7 8" ]] \
  || fail "reference steps $(metrics_steps "$tmp/ref1")"
broken grad1 FT_TEST_NAN_GRAD_AT_STEP=5 \
  'the gradient norm is nan \(first non-finite gradient: model.embed_tokens.weight in embed\)'
resumed grad1 ref1
echo "one process, NaN gradient: exit 1 at step 5, step_4 kept, resumed == unbroken" \
  "($((SECONDS - t_all)) s)"

# A NaN loss (finite gradients) stops the same way.
broken loss1 FT_TEST_NAN_LOSS_AT_STEP=5 'the loss is nan \(every gradient element is finite\)'
echo "one process, NaN loss: exit 1 at step 5, step_4 kept"

# bf16 (the precision policy): the same stop, and the resume is exact there too.
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref_bf16" training.precision=bf16 \
  > "$tmp/ref_bf16.log" 2>&1 || fail "bf16 reference: $(tail -3 "$tmp/ref_bf16.log")"
broken grad_bf16 FT_TEST_NAN_GRAD_AT_STEP=5 \
  'the gradient norm is nan \(first non-finite gradient: model.embed_tokens.weight in embed\)' \
  training.precision=bf16
resumed grad_bf16 ref_bf16 training.precision=bf16
echo "bf16, NaN gradient: exit 1 at step 5, step_4 kept, resumed == unbroken"

# fp16: an overflow skips the step instead (nothing updated; the run goes on), and
# training.max_skipped_steps consecutive skips stop the run like a non-finite step: a static
# scale of 2^32 overflows fp16 in every backward, so steps 1-3 are skipped and step 3 stops it.
rc=0
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/fp16" training.precision=fp16 \
  training.loss_scale=4294967296 training.max_skipped_steps=3 checkpoint.every_steps=1 \
  > "$tmp/fp16.log" 2> "$tmp/fp16.err" || rc=$?
[[ $rc == 1 ]] || fail "fp16 skips: exit $rc: $(tail -3 "$tmp/fp16.err")"
[[ $(grep -c 'step skipped' "$tmp/fp16.err") == 2 ]] || fail "fp16: two skip warnings expected: $(cat "$tmp/fp16.err")"
want="^ft: error: step 3: 3 consecutive steps skipped for gradient overflow (training.max_skipped_steps 3)"
grep -q "$want" "$tmp/fp16.err" || fail "fp16 skips: message: $(cat "$tmp/fp16.err")"
grep -q "the last good checkpoint is $tmp/fp16/checkpoints/step_00000002 " "$tmp/fp16.err" \
  || fail "fp16 skips: last good checkpoint: $(cat "$tmp/fp16.err")"
/usr/bin/python3 - "$tmp/fp16/metrics.jsonl" <<'PY' || fail "fp16 skips: metrics"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert [l["step"] for l in lines] == [1, 2], lines
assert all(l["skipped"] and l["grad_norm"] is None and l["loss_scale"] == 2.0**32 for l in lines), lines
PY
# Nothing was applied: the step_2 checkpoint's weights are the initial ones (step_1's too).
cmp -s "$tmp/fp16/checkpoints/step_00000001/rank_00000.bin" \
  "$tmp/fp16/checkpoints/step_00000002/rank_00000.bin" \
  || fail "fp16 skips: a skipped step changed the saved state"
echo "fp16, every step overflowing: steps skipped, nothing applied, exit 1 at max_skipped_steps"

# A real divergence, no hook: lr 1e10 makes step 1's update overflow the forward of step 2.
rc=0
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/lr" optimizer.lr=1e10 scheduler.warmup_steps=0 \
  checkpoint.every_steps=1 > "$tmp/lr.log" 2> "$tmp/lr.err" || rc=$?
[[ $rc == 1 ]] || fail "lr 1e10: exit $rc: $(tail -3 "$tmp/lr.err")"
want="^ft: error: step 2: the loss is nan and the gradient norm is nan (first non-finite gradient:"
want+=" .*); nothing was updated or saved at this step; the last good checkpoint is"
grep -q "$want $tmp/lr/checkpoints/step_00000001 " "$tmp/lr.err" || fail "lr 1e10: message: $(cat "$tmp/lr.err")"
[[ $(cat "$tmp/lr/checkpoints/latest") == step_00000001 && ! -e $tmp/lr/checkpoints/step_00000002 ]] \
  || fail "lr 1e10: checkpoints $(ls "$tmp/lr/checkpoints")"
echo "one process, lr 1e10: exit 1 at step 2 (loss and gradient norm nan), step_1 kept"

# Async saves every 4 steps, each slowed to ~0.5 s (FT_TEST_CKPT_DELAY_MS per piece): step 5
# fails while step 4's save is in flight; that save holds step 4's state and commits.
t0=$SECONDS
FT_TEST_CKPT_DELAY_MS=40 broken async1 FT_TEST_NAN_GRAD_AT_STEP=5 'the gradient norm is nan .*' \
  checkpoint.every_steps=4 checkpoint.async=true
ck="$tmp/async1/checkpoints"
/usr/bin/python3 - "$tmp/async1/metrics.jsonl" <<'PY' || fail "async: commit of step 4 not reported"
import json, sys
saves = [j for j in map(json.loads, open(sys.argv[1])) if "ckpt_step" in j]
assert [s["ckpt_step"] for s in saves] == [4], saves
PY
echo "one process, async save in flight: it committed step_4, nothing newer ($((SECONDS - t0)) s)"

# --nproc 4, data 2 x tensor 2: the NaN on rank 3 (data 1, tensor 1) only; every rank stops,
# rank 0 alone reports it.
t0=$SECONDS
d2t2=(parallel.tensor=2 --nproc 4)
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref_d2t2" "${d2t2[@]}" > "$tmp/ref_d2t2.log" 2>&1 \
  || fail "reference d2t2: $(tail -3 "$tmp/ref_d2t2.log")"
broken grad_d2t2 FT_TEST_NAN_GRAD_AT_STEP=5:3 \
  'the gradient norm is nan \(first non-finite gradient: model.embed_tokens.weight in embed\)' \
  "${d2t2[@]}"
resumed grad_d2t2 ref_d2t2 "${d2t2[@]}"
echo "data 2 x tensor 2, NaN on rank 3: exit 1 at step 5, step_4 kept, resumed == unbroken" \
  "($((SECONDS - t0)) s)"

# --nproc 4, data 2 x pipeline 2, ZeRO-3: rank 3 is the last stage's second data rank; its NaN
# is in the second half of layers.1's flat buffer, a group rank 0 does not hold.
t0=$SECONDS
d2p2=(parallel.pipeline=2 parallel.zero_stage=3 --nproc 4)
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/ref_d2p2" "${d2p2[@]}" > "$tmp/ref_d2p2.log" 2>&1 \
  || fail "reference d2p2: $(tail -3 "$tmp/ref_d2p2.log")"
broken grad_d2p2 FT_TEST_NAN_GRAD_AT_STEP=5:3 \
  'the gradient norm is nan \(first non-finite gradient: model.layers.1.[a-z_.]+ in layers.1\)' \
  "${d2p2[@]}"
resumed grad_d2p2 ref_d2p2 "${d2p2[@]}"
echo "data 2 x pipeline 2 ZeRO-3, NaN on rank 3: exit 1 at step 5 naming layers.1," \
  "resumed == unbroken ($((SECONDS - t0)) s)"

echo "time: whole test: $((SECONDS - t_all)) s"
echo "test_nonfinite: all checks passed"
