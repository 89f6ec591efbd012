#!/usr/bin/env bash
# ft train end to end on the real binary: a tiny model on generated shards.
# Checks the metrics contract (DESIGN.md §7), the saved resolved recipe, the closing summary,
# plain progress lines off a terminal and a live bar on one, evaluation lines, activation
# checkpointing giving the same losses, clear refusals, one step numbering (from 1: progress,
# metrics, evaluations and checkpoints agree, DESIGN.md §7), rounded times, and `ft help`.
#   bash tests/cli/test_train.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:3" "$tmp/valid:1" --vocab 97 \
  --samples 40 --seq-len 16 --seed 0

cat > "$tmp/r.yaml" <<YAML
run: {name: t, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16, shuffle: true}
training: {steps: 12, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 5, eval_batches: 2}
optimizer: {lr: 0.01}
scheduler: {name: linear, warmup_steps: 2}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML

# 1. Off a terminal: plain lines, summary, metrics, saved recipe.
"$ft" train "$tmp/r.yaml" > "$tmp/out.txt" 2> "$tmp/err.txt" || fail "ft train exited $? : $(cat "$tmp/err.txt")"
grep -q '^step 12/12 loss ' "$tmp/out.txt" || fail "no plain progress line for the last step"
# The startup line names the instruction set of ft's CPU kernels (kernels.h's cpu_isa()), the
# BLAS kernels and the ISA oneDNN dispatches bf16/f16 GEMMs to.
grep -Eq 'CPU kernels (baseline|avx2|avx512|avx512_bf16|amx), BLAS kernels [A-Za-z0-9]+, oneDNN ISA (avx|sse)[a-z0-9_]*$' "$tmp/out.txt" \
  || fail "startup line without the CPU kernels' and the GEMM ISA: $(grep '^ft: data' "$tmp/out.txt")"
if grep -q $'\r' "$tmp/out.txt"; then fail "carriage returns in non-terminal output"; fi
grep -q '^ft: done: 12 steps, 768 tokens' "$tmp/out.txt" || fail "summary line missing: $(tail -3 "$tmp/out.txt")"
# The progress and the metrics name the same steps; evaluations are printed with the step after
# which they ran; the wall time is rounded (0.015 s, 2.19 s, 1 min 05 s), never 0.0147033 s.
[[ $(grep -c '^step [0-9]*/12 loss ' "$tmp/out.txt") == 12 ]] && grep -q '^step 1/12 loss ' "$tmp/out.txt" \
  || fail "progress lines not steps 1..12: $(grep '^step ' "$tmp/out.txt" | head -2)"
[[ $(grep '^eval at step' "$tmp/out.txt" | cut -d: -f1 | tr '\n' ' ') == "eval at step 5 eval at step 10 eval at step 12 " ]] \
  || fail "eval lines: $(grep '^eval' "$tmp/out.txt")"
grep -Eq '^ft: done: 12 steps, 768 tokens in ([0-9]\.[0-9]{3}|[0-9]\.[0-9]{2}|[0-9]{2}\.[0-9]|[0-9]+ min [0-9]{2}) s \(' \
  "$tmp/out.txt" || fail "summary time not rounded: $(grep '^ft: done' "$tmp/out.txt")"
grep -q 'peak memory: .* device allocator, .* process RSS' "$tmp/out.txt" || fail "peak memory not in summary"
grep -q "outputs: $tmp/out" "$tmp/out.txt" || fail "output location not in summary"
grep -Eq '^ft: first step began [0-9].* s after the process started' "$tmp/out.txt" \
  || fail "time to the first step not in summary: $(tail -4 "$tmp/out.txt")"
test -s "$tmp/out/recipe.yaml" || fail "resolved recipe not saved"
"$ft" validate "$tmp/out/recipe.yaml" > /dev/null 2>&1 || fail "saved recipe does not validate"

/usr/bin/python3 - "$tmp/out/metrics.jsonl" <<'PY' || fail "metrics check"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "loss" in l]
evals = [l for l in lines if "eval_loss" in l]
need = {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s", "mem_peak_bytes"}
assert [l["step"] for l in steps] == list(range(1, 13)), [l["step"] for l in steps]  # from 1
for l in steps:
    assert need <= set(l), need - set(l)
    assert math.isfinite(l["loss"]) and l["loss"] > 0 and l["grad_norm"] > 0
    assert l["mem_peak_bytes"] > 0 and l["tokens_per_s"] > 0
assert [l["tokens"] for l in steps] == [64 * (i + 1) for i in range(12)]
# The process's first step line, and only it, says when that step began (DESIGN.md §7).
t0 = steps[0].get("time_to_first_step_s")
assert t0 is not None and 0 < t0 < 600, steps[0]
assert all("time_to_first_step_s" not in l for l in steps[1:])
# linear schedule with 2 warmup steps: lr_0 = lr/2, lr_1 = lr, then decaying to 0
assert abs(steps[0]["lr"] - 0.005) < 1e-12 and abs(steps[1]["lr"] - 0.01) < 1e-12
assert abs(steps[11]["lr"] - 0.01 * (1 - 9 / 10)) < 1e-12, steps[11]["lr"]
# eval_every_steps 5 over 12 steps: after steps 5 and 10, and at the end, after step 12
assert [e["step"] for e in evals] == [5, 10, 12], evals
assert all(math.isfinite(e["eval_loss"]) for e in evals)
print("metrics ok")
PY

# 2. Activation checkpointing recomputes, so the losses are the same numbers.
"$ft" train "$tmp/r.yaml" training.activation_checkpointing=true run.output_dir="$tmp/ckpt" > /dev/null 2>&1 \
  || fail "activation checkpointing run failed"
/usr/bin/python3 - "$tmp/out/metrics.jsonl" "$tmp/ckpt/metrics.jsonl" <<'PY' || fail "activation checkpointing changed the losses"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert a == b, (a, b)
PY

# logging.every_steps 5: steps 5 and 10 (beside the evaluations and checkpoints of those steps),
# plus the first and the last step.
"$ft" train "$tmp/r.yaml" logging.every_steps=5 training.eval_every_steps=0 run.output_dir="$tmp/log5" \
  > "$tmp/log5.txt" 2>&1 || fail "logging.every_steps=5 run failed: $(tail -3 "$tmp/log5.txt")"
/usr/bin/python3 - "$tmp/log5/metrics.jsonl" <<'PY' || fail "logging.every_steps=5: logged steps"
import json, sys
steps = [j["step"] for j in map(json.loads, open(sys.argv[1])) if "loss" in j]
assert steps == [1, 5, 10, 12], steps
PY
[[ $(grep '^step ' "$tmp/log5.txt" | cut -d' ' -f2 | tr '\n' ' ') == "1/12 5/12 10/12 12/12 " ]] \
  || fail "logging.every_steps=5: progress lines $(grep '^step ' "$tmp/log5.txt")"

# 3. On a terminal: a live bar redrawn with carriage returns.
script -qec "\"$ft\" train \"$tmp/r.yaml\" run.output_dir=\"$tmp/tty\"" /dev/null > "$tmp/tty.txt" 2>&1 \
  || fail "ft train under a pseudo-terminal failed: $(tail -5 "$tmp/tty.txt")"
grep -q $'\r.*step 12/12 \[=*\] loss' "$tmp/tty.txt" || fail "no live progress bar on a terminal"
grep -q 'ETA' "$tmp/tty.txt" || fail "no ETA on the live bar"

# 4. Clear refusals, exit code 2, before any work.
rc=0; "$ft" train "$tmp/r.yaml" checkpoint.keep_last=0 > /dev/null 2> "$tmp/e1.txt" || rc=$?
[[ $rc == 2 ]] || fail "checkpoint.keep_last=0 should exit 2, got $rc"
grep -q 'checkpoint.keep_last' "$tmp/e1.txt" || fail "checkpoint.keep_last=0 message: $(cat "$tmp/e1.txt")"
rc=0; "$ft" train "$tmp/r.yaml" parallel.pipeline=2 > /dev/null 2> "$tmp/e3.txt" || rc=$?
[[ $rc == 2 ]] || fail "pipeline 2 in one process should exit 2, got $rc"
grep -q 'launch a multiple of 2 ranks' "$tmp/e3.txt" || fail "pipeline 2 message: $(cat "$tmp/e3.txt")"
rc=0; "$ft" train "$tmp/r.yaml" model.n_heads=5 data.train="$tmp/nowhere" run.output_dir="$tmp/out2" \
  > /dev/null 2> "$tmp/e2.txt" || rc=$?
[[ $rc == 2 ]] || fail "bad recipe should exit 2, got $rc"
grep -q 'model.n_heads' "$tmp/e2.txt" && grep -q 'data.train' "$tmp/e2.txt" \
  || fail "not every problem reported: $(cat "$tmp/e2.txt")"
if test -e "$tmp/out2"; then fail "work started despite a bad recipe"; fi

# 5. Time-based checkpoints: checkpoint.every_minutes=0.0005 (30 ms) over a run of 400 steps
# (well over 30 ms) gives saves before the last step, each complete, plus the final one.
"$ft" train "$tmp/r.yaml" training.steps=400 training.eval_every_steps=0 checkpoint.every_minutes=0.0005 \
  checkpoint.keep_last=100 run.output_dir="$tmp/minutes" > "$tmp/minutes.txt" 2>&1 \
  || fail "every_minutes run failed: $(tail -3 "$tmp/minutes.txt")"
/usr/bin/python3 - "$tmp/minutes" <<'PY' || fail "time-based checkpoints"
import json, os, sys
d = sys.argv[1]
saves = [json.loads(l)["ckpt_step"] for l in open(f"{d}/metrics.jsonl") if "ckpt_step" in l]
assert len(saves) >= 2 and saves[-1] == 400 and saves == sorted(saves), saves
# keep_last 100: on a loaded machine (a slower run, more 30 ms periods) older ones are deleted.
for s in saves[-100:]:
    assert os.path.exists(f"{d}/checkpoints/step_{s:08d}/COMPLETE"), s
# Each save is reported on the line of the step after which it was taken (or a later one).
for j in map(json.loads, open(f"{d}/metrics.jsonl")):
    if "ckpt_step" in j:
        assert j["step"] >= j["ckpt_step"], j
print(f"every_minutes: {len(saves)} saves at steps {saves[:5]}...")
PY
# Checkpoint notes round their times: "in 0.004 s, training stalled 0.003 s".
grep -Eq '^checkpoint step_00000400: .* in [0-9]+\.[0-9]{1,3} s, training stalled [0-9]+\.[0-9]{1,3} s$' \
  "$tmp/minutes.txt" || fail "checkpoint note: $(grep '^checkpoint ' "$tmp/minutes.txt" | tail -1)"
if grep -Eq '[0-9]\.[0-9]{4,} s' "$tmp/minutes.txt"; then
  fail "an unrounded time: $(grep -E '[0-9]\.[0-9]{4,} s' "$tmp/minutes.txt" | head -2)"
fi

# 6. ft help: with no argument the command list (as ft --help), exit 0; an unknown command
# exits 2 with the list.
"$ft" help > "$tmp/help.txt" 2>&1 || fail "ft help exited $?"
for c in train validate tokenize plan export inspect; do
  grep -q "^  $c " "$tmp/help.txt" || fail "ft help does not list $c: $(cat "$tmp/help.txt")"
done
"$ft" --help > "$tmp/help2.txt" 2>&1 || fail "ft --help exited $?"
cmp -s "$tmp/help.txt" "$tmp/help2.txt" || fail "ft help and ft --help differ"
"$ft" help train | grep -q 'Recipe sections' || fail "ft help train"
rc=0; "$ft" help NOPE > "$tmp/help3.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "ft help NOPE: exit $rc, expected 2"
grep -q "no command 'NOPE'" "$tmp/help3.txt" && grep -q '^  train ' "$tmp/help3.txt" \
  || fail "ft help NOPE: $(cat "$tmp/help3.txt")"

# 7. Every target masked out (loss_mask all 0): each step warns in words true of AdamW (its
# momentum still moves the parameters), and the summary claims no final loss of 0.
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/masked" --vocab 97 --samples 20 \
  --seq-len 16 --seed 4 --mask 0 > /dev/null
"$ft" train "$tmp/r.yaml" data.train="$tmp/masked" training.eval_every_steps=0 training.steps=2 \
  run.output_dir="$tmp/masked_run" > "$tmp/masked.txt" 2>&1 || fail "all masked: $(tail -3 "$tmp/masked.txt")"
grep -q 'step 2: every target of the global batch is masked out (loss_mask): nothing to learn from, so the loss is reported as 0 and every gradient is 0, but AdamW still moves the parameters' \
  "$tmp/masked.txt" || fail "all masked: the warning: $(grep -m1 masked "$tmp/masked.txt")"
grep -q '^ft: done: 2 steps, .*; no final loss (every step.s targets were masked out)$' \
  "$tmp/masked.txt" || fail "all masked: the summary: $(grep '^ft: done' "$tmp/masked.txt")"
if grep -q 'only weight decay\|final loss 0.0000' "$tmp/masked.txt"; then
  fail "all masked: an untrue line: $(grep 'only weight decay\|final loss 0.0000' "$tmp/masked.txt")"
fi

echo "test_train: all checks passed"
