#!/usr/bin/env bash
# Distributed checkpoints (DESIGN.md §4, §8), end to end on the real binary with a tiny model
# (cosine schedule with warmup, weight decay, gradient clipping, shuffled data, evaluation):
#  a. Identical resume: a run killed (SIGKILL, FT_TEST_KILL_AT_STEP) after its step-10 checkpoint
#     and rerun with the default --resume auto has the losses, grad norms and eval losses of the
#     uninterrupted run (==), and a byte-identical final checkpoint (cmp rank_*.bin). One
#     process, and `--nproc 4 parallel.tensor=2` (data 2 x tensor 2) with only rank 1 killed.
#  b. Resharding (--resume PATH of another layout's step_10): losses within 1e-5 relative of the
#     one-process run: data 4 ZeRO-3 -> tensor 2 x pipeline 2 ZeRO-1; one process -> data 2 x
#     tensor 2; data 2 x tensor 2 -> one process; tied embeddings across pipeline stages: tensor
#     2 x pipeline 2 -> data 2 x pipeline 2 ZeRO-3, against a tied one-process run.
#  c. --resume never on a folder with checkpoints: exit 2 naming checkpoint.overwrite, nothing
#     deleted; with checkpoint.overwrite=true a fresh run (old step folders gone). --resume PATH
#     of step_10 while latest is step_20 resumes from step 10. A PATH that is no checkpoint, or a
#     checkpoint.dir holding another model: exit 2.
#  d. keep_last 2, every 5 steps over 20 (data 2): step_15, step_20 and `latest` naming step_20
#     remain; one metrics line per save with ckpt_step, ckpt_bytes (= the rank_*.bin sizes),
#     ckpt_blocking_s and ckpt_write_s.
#  e. checkpoint.async=true writes byte-identical shards and the same pieces as sync saves.
#  f. Damage: a flipped byte or a truncated shard in the newest checkpoint -> --resume auto warns
#     naming the file, falls back to the previous one and still reproduces the uninterrupted
#     losses; --resume PATH of a damaged checkpoint: exit 1 naming the file. A step folder
#     without COMPLETE is never resumed from (auto skips it; PATH refuses it).
#  g. Disk full (ulimit -f; sync and async saves): the save fails with exit 1 naming the shard
#     file and saying the previous checkpoint is untouched; `latest` still names step_10, which `ft inspect` verifies
#     and a rerun resumes from, reproducing the uninterrupted losses.
#   bash tests/cli/test_checkpoint.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
t_all=$SECONDS

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 37 --seq-len 12 --seed 5 --mask 0.8
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/valid" --vocab 64 --samples 8 --seq-len 12 --seed 6 --shards 1

cat > "$tmp/r.yaml" <<YAML
run: {name: ckpt, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, valid: $tmp/valid, seq_len: 12, shuffle: true}
training: {steps: 20, micro_batch_size: 2, global_batch_size: 8, grad_clip: 0.3, eval_every_steps: 5, eval_batches: 2}
optimizer: {lr: 0.01, weight_decay: 0.1}
scheduler: {name: cosine, warmup_steps: 3}
checkpoint: {every_steps: 10}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# train NAME ARGS...: a run into $tmp/NAME (log $tmp/NAME.log) that must succeed.
train() {
  local name=$1; shift
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 \
    || fail "$name: exit $?: $(tail -5 "$tmp/$name.log")"
}
# train_rc RC NAME LOG ARGS...: a run into $tmp/NAME, output to $tmp/LOG.log, that must exit RC
# (or, for RC "nonzero", anything but 0).
train_rc() {
  local want=$1 name=$2 log=$3 rc=0; shift 3
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$log.log" 2>&1 || rc=$?
  [[ $rc == "$want" || ($want == nonzero && $rc != 0) ]] \
    || fail "$log: exit $rc, expected $want: $(tail -5 "$tmp/$log.log")"
}
ckpts() { echo "$tmp/$1/checkpoints"; }
# same_losses A B FROM: loss, grad_norm and eval_loss of steps FROM+1..20 (the steps after the
# checkpoint step_FROM; metrics number steps from 1) are == (the last line of
# each step counts: a resumed run appends to metrics.jsonl).
same_losses() {
  /usr/bin/python3 "$tmp/metrics.py" same "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" \
    || fail "$1 vs $2: losses differ"
}
# close_losses A B FROM: losses of steps FROM+1..20 within 1e-5 relative.
close_losses() {
  /usr/bin/python3 "$tmp/metrics.py" close "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" \
    || fail "$1 vs $2: losses differ by more than 1e-5 relative"
}
# same_shards A B STEP: every rank_*.bin of step STEP of runs A and B byte-identical.
same_shards() {
  local a b n=0
  a="$(ckpts "$1")/$3"; b="$(ckpts "$2")/$3"
  for f in "$a"/rank_*.bin; do
    cmp -s "$f" "$b/${f##*/}" || fail "$1 vs $2: $3/${f##*/} differs"
    n=$((n + 1))
  done
  [[ $n -gt 0 && $n == $(ls "$b"/rank_*.bin | wc -l) ]] || fail "$1 vs $2: $3 has $n shards"
}
resumed_from() {  # LOG FOLDER [LAYOUT]: the log says the run resumed from that step folder
  grep -q "resumed from $2 (step [0-9]*, saved by ${3:-}" "$tmp/$1.log" \
    || fail "$1: did not resume from $2 ${3:-}: $(grep -i 'resum\|warn' "$tmp/$1.log" | grep -v '^ ')"
}
latest_is() {  # NAME STEP_FOLDER
  [[ $(cat "$(ckpts "$1")/latest") == "$2" ]] || fail "$1: latest names $(cat "$(ckpts "$1")/latest"), not $2"
}
has() {  # LOG REGEX: the log has a line matching it
  grep -q -- "$2" "$tmp/$1.log" || fail "$1: no line matching '$2': $(tail -5 "$tmp/$1.log")"
}
flip_byte() {  # FILE: flips one byte in the middle
  /usr/bin/python3 - "$1" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(0, 2); n = f.tell(); f.seek(n // 2); b = f.read(1); f.seek(n // 2)
    f.write(bytes([b[0] ^ 0x10]))
PY
}

cat > "$tmp/metrics.py" <<'PY'
import json, sys
mode, a, b, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def last_per_step(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in j:
                out[(j["step"], key)] = j[key]
    return out
A, B = last_per_step(a), last_per_step(b)
keys = [k for k in sorted(B) if k[0] > first and (mode == "same" or k[1] == "loss")]
assert [k for k in keys if k[1] == "loss"] == [(s, "loss") for s in range(first + 1, 21)], keys
worst = 0.0
for k in keys:
    assert k in A, f"{a} lacks {k}"
    if mode == "same":
        assert A[k] == B[k], (k, A[k], B[k])
    else:
        worst = max(worst, abs(A[k] - B[k]) / abs(B[k]))
        assert worst <= 1e-5, (k, A[k], B[k])  # float sums in another order: ~1e-7 seen
print(f"  steps {first + 1}..20 {'identical' if mode == 'same' else f'within {worst:.1e} relative'}")
PY

# ---------------------------------------------------------------- a. identical resume
t0=$SECONDS
train ref
FT_TEST_KILL_AT_STEP=13 train_rc 137 killed killed_1  # SIGKILL as step 13 begins, 12 done
latest_is killed step_00000010
[[ ! -e $(ckpts killed)/step_00000020 ]] || fail "killed: a step_20 folder before step 20"
[[ $(grep -c '"loss"' "$tmp/killed/metrics.jsonl") == 12 ]] || fail "killed: did not run to step 12"
cp -a "$tmp/killed" "$tmp/dfull"  # for g.
train killed  # --resume auto (the default)
resumed_from killed "$(ckpts killed)/step_00000010"
same_losses killed ref 10
same_shards killed ref step_00000010
same_shards killed ref step_00000020
echo "a. one process: killed as step 13 began, resumed from step 10: identical ($((SECONDS - t0)) s)"

t0=$SECONDS
d2t2=(parallel.tensor=2 --nproc 4)
train d2t2 "${d2t2[@]}"
close_losses d2t2 ref 0
FT_TEST_KILL_AT_STEP=13:1 train_rc nonzero d2t2_killed d2t2_killed_1 "${d2t2[@]}"  # rank 1 only
latest_is d2t2_killed step_00000010
train d2t2_killed "${d2t2[@]}"
resumed_from d2t2_killed "$(ckpts d2t2_killed)/step_00000010" "2 data x 1 pipeline x 2 tensor ranks"
same_losses d2t2_killed d2t2 10
same_shards d2t2_killed d2t2 step_00000010
same_shards d2t2_killed d2t2 step_00000020
echo "a. data 2 x tensor 2: rank 1 killed as step 13 began, resumed from step 10: identical ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- b. resharding
t0=$SECONDS
train d4z3 parallel.zero_stage=3 training.micro_batch_size=1 --nproc 4
close_losses d4z3 ref 0
train d4z3_to_t2p2 parallel.tensor=2 parallel.pipeline=2 parallel.zero_stage=1 --nproc 4 \
  --resume "$(ckpts d4z3)/step_00000010"
resumed_from d4z3_to_t2p2 "$(ckpts d4z3)/step_00000010" "4 data x 1 pipeline x 1 tensor ranks, ZeRO 3"
close_losses d4z3_to_t2p2 ref 10
train one_to_d2t2 "${d2t2[@]}" --resume "$(ckpts ref)/step_00000010"
resumed_from one_to_d2t2 "$(ckpts ref)/step_00000010" "1 data x 1 pipeline x 1 tensor ranks"
close_losses one_to_d2t2 ref 10
train d2t2_to_one --resume "$(ckpts d2t2)/step_00000010"
resumed_from d2t2_to_one "$(ckpts d2t2)/step_00000010" "2 data x 1 pipeline x 2 tensor ranks"
close_losses d2t2_to_one ref 10
tied=(model.tie_embeddings=true)
train tied_ref "${tied[@]}"
train tied_t2p2 "${tied[@]}" parallel.tensor=2 parallel.pipeline=2 --nproc 4
close_losses tied_t2p2 tied_ref 0
train tied_t2p2_to_d2p2 "${tied[@]}" parallel.pipeline=2 parallel.zero_stage=3 --nproc 4 \
  --resume "$(ckpts tied_t2p2)/step_00000010"
resumed_from tied_t2p2_to_d2p2 "$(ckpts tied_t2p2)/step_00000010" "1 data x 2 pipeline x 2 tensor ranks"
close_losses tied_t2p2_to_d2p2 tied_ref 10
echo "b. resharding: data 4 ZeRO-3 -> tensor 2 x pipeline 2, one -> data 2 x tensor 2 -> one," \
  "tied tensor 2 x pipeline 2 -> data 2 x pipeline 2 ZeRO-3 ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- c. --resume never / PATH
t0=$SECONDS
cp -a "$tmp/ref" "$tmp/never"
train_rc 2 never never_1 --resume never
has never_1 "checkpoint.overwrite"
[[ -d $(ckpts never)/step_00000010 && -d $(ckpts never)/step_00000020 ]] || fail "never: refused, yet deleted"
train_rc 0 never never_2 --resume never checkpoint.overwrite=true training.steps=5
[[ $(ls "$(ckpts never)" | grep -vx ft.lock | tr '\n' ' ') == "latest step_00000005 " ]] \
  || fail "overwrite: checkpoints left: $(ls "$(ckpts never)")"
/usr/bin/python3 - "$tmp/never/metrics.jsonl" "$tmp/ref/metrics.jsonl" <<'PY' || fail "overwrite: not a fresh run"
import json, sys
new = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
ref = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
assert [l["step"] for l in new] == [1, 2, 3, 4, 5], [l["step"] for l in new]  # truncated, not appended
assert new[0]["loss"] == ref[0]["loss"]  # the same initial weights: started afresh
PY
cp -a "$tmp/ref" "$tmp/path"  # step_10 and step_20, latest step_20
train_rc 0 path path_1 --resume "$(ckpts path)/step_00000010"
resumed_from path_1 "$(ckpts path)/step_00000010"
same_losses path ref 10
same_shards path ref step_00000020
train_rc 2 path path_2 --resume "$tmp/data"
has path_2 "not a checkpoint"
train_rc 2 path path_3 --resume "$tmp/no_such_folder"
# Another model in checkpoint.dir: a usage error naming the difference, never a silent restart.
train_rc 2 path path_4 model.ffn_dim=48
has path_4 "holds another model: model.ffn_dim"
echo "c. --resume never refused (exit 2) / overwrite starts afresh; --resume PATH of step_10;" \
  "PATH not a checkpoint: exit 2 ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- d, e. keep_last, async
t0=$SECONDS
keep=(checkpoint.every_steps=5 checkpoint.keep_last=2 --nproc 2)
train keep "${keep[@]}"
train keep_async "${keep[@]}" checkpoint.async=true
for run in keep keep_async; do
  [[ $(ls "$(ckpts $run)" | grep -vx ft.lock | tr '\n' ' ') == "latest step_00000015 step_00000020 " ]] \
    || fail "$run: keep_last 2 left $(ls "$(ckpts $run)")"
  latest_is $run step_00000020
  /usr/bin/python3 - "$tmp/$run/metrics.jsonl" "$(ckpts $run)/step_00000020" <<'PY' || fail "$run: checkpoint metrics"
import glob, json, os, sys
saves = [json.loads(l) for l in open(sys.argv[1]) if "ckpt_step" in l]
assert [s["ckpt_step"] for s in saves] == [5, 10, 15, 20], saves
shards = glob.glob(os.path.join(sys.argv[2], "rank_*.bin"))
assert len(shards) == 2, shards
size = sum(os.path.getsize(f) for f in shards)
for s in saves:
    assert s["ckpt_bytes"] == size, (s["ckpt_bytes"], size)
    assert 0 <= s["ckpt_blocking_s"] <= s["ckpt_write_s"] < 60, s
PY
done
same_losses keep_async keep 0
for step in step_00000015 step_00000020; do
  same_shards keep_async keep $step
  /usr/bin/python3 - "$(ckpts keep)/$step/manifest.json" "$(ckpts keep_async)/$step/manifest.json" <<'PY' \
    || fail "async and sync manifests of $step differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for key in ("step", "layout", "model", "tensors", "optimizer", "scheduler", "data", "shards", "pieces"):
    assert a[key] == b[key], key
PY
done
echo "d. keep_last 2 of every 5 steps: step_15, step_20, latest; metrics per save ($((SECONDS - t0)) s)"
echo "e. async checkpoints byte-identical to sync ones"

# ---------------------------------------------------------------- f. damage
t0=$SECONDS
cp -a "$tmp/ref" "$tmp/flip"
flip_byte "$(ckpts flip)/step_00000020/rank_00000.bin"
train flip
has flip "cannot resume from $(ckpts flip)/step_00000020: $(ckpts flip)/step_00000020/rank_00000.bin: checksum mismatch"
has flip "falling back to the previous complete checkpoint, $(ckpts flip)/step_00000010"
resumed_from flip "$(ckpts flip)/step_00000010"
same_losses flip ref 10
same_shards flip ref step_00000020
cp -a "$tmp/ref" "$tmp/trunc"
truncate -s -100 "$(ckpts trunc)/step_00000020/rank_00000.bin"
train trunc
has trunc "cannot resume from .*: $(ckpts trunc)/step_00000020/rank_00000.bin: .*truncated"
resumed_from trunc "$(ckpts trunc)/step_00000010"
same_losses trunc ref 10
cp -a "$tmp/ref" "$tmp/dmgpath"
flip_byte "$(ckpts dmgpath)/step_00000020/rank_00000.bin"
train_rc 1 dmgpath dmgpath_1 --resume "$(ckpts dmgpath)/step_00000020" training.steps=30
has dmgpath_1 "$(ckpts dmgpath)/step_00000020/rank_00000.bin: checksum mismatch"
if grep -q "resumed from" "$tmp/dmgpath_1.log"; then fail "dmgpath: resumed from a damaged checkpoint"; fi
cp -a "$tmp/ref" "$tmp/incomplete"
rm "$(ckpts incomplete)/step_00000020/COMPLETE"
train_rc 1 incomplete incomplete_1 --resume "$(ckpts incomplete)/step_00000020"
has incomplete_1 "no COMPLETE"
train incomplete
has incomplete "latest names step_00000020, which is not the newest complete checkpoint"
resumed_from incomplete "$(ckpts incomplete)/step_00000010"
same_losses incomplete ref 10
echo "f. damage: flipped byte and truncation fall back to step 10 with identical losses;" \
  "--resume PATH of a damaged or incomplete checkpoint: exit 1 ($((SECONDS - t0)) s)"

# ---------------------------------------------------------------- g. disk full
t0=$SECONDS
# dfull: the killed run, with step_10. A file-size limit (ulimit -f, 1024-byte blocks) of half a
# shard: the step-20 save cannot write its shard (write() fails with EFBIG, or the process gets
# SIGXFSZ if ft did not ignore it: exit 153).
# Single-process only: under a file-size limit Open MPI's own shared-memory files fail too.
# Once with async saves (the writer thread's error ends the run at the next save or poll).
shard=$(stat -c %s "$(ckpts dfull)/step_00000010/rank_00000.bin")
cp -a "$tmp/dfull" "$tmp/dfull_async"
for run in dfull dfull_async; do
  rc=0
  (ulimit -f $((shard / 2048)); exec "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$run" \
    checkpoint.async=$([[ $run == dfull_async ]] && echo true || echo false)) > "$tmp/${run}_1.log" 2>&1 || rc=$?
  [[ $rc == 1 ]] || fail "$run: disk full: exit $rc, expected 1: $(tail -5 "$tmp/${run}_1.log")"
  has ${run}_1 "$(ckpts $run)/step_00000020/rank_00000.bin: File too large.*the previous complete checkpoint is untouched"
  latest_is $run step_00000010
done
"$ft" inspect "$(ckpts dfull)" > "$tmp/dfull_inspect.log" 2>&1 || fail "disk full: ft inspect: $(tail -5 "$tmp/dfull_inspect.log")"
has dfull_inspect step_00000010
train dfull
resumed_from dfull "$(ckpts dfull)/step_00000010"
same_losses dfull ref 10
same_shards dfull ref step_00000020
echo "g. disk full: exit 1 naming the shard, step_10 kept, verified and resumed ($((SECONDS - t0)) s)"

echo "test_checkpoint: all checks passed in $((SECONDS - t_all)) s"
