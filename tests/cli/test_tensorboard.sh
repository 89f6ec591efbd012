#!/usr/bin/env bash
# TensorBoard event files (logging.tensorboard, DESIGN.md §7), read by TensorBoard's own reader
# (tensorboard 2.21.0 from PyPI in $build/tensorboard_venv, common.sh's tensorboard_spec):
#  1. A run with evaluations and checkpoints in fp16 (loss_scale, `skipped` booleans; at an
#     initial loss scale of 2^20 the first steps overflow: a skipped step's null grad_norm),
#     killed (SIGKILL as step 7 begins) and resumed from step 4's checkpoint: one event file per
#     process, named as TensorBoard names them, in name order; each begins with the file
#     version and a session START at the process's first step, and steps 5 and 6 are in both,
#     as in metrics.jsonl. TensorBoard's EventAccumulator over the
#     folder has exactly the series of metrics.jsonl's numeric keys (train/, eval/, checkpoint/)
#     and, for every series and step, exactly its value as float32 (simple_value is a float),
#     the last line of a step counting; each series' steps rise (the START drops the repeats).
#  2. One byte flipped in a record's data, or in a record's length: TensorBoard's record reader
#     raises DataLossError at that record, and its loader returns only the records before it.
#  3. A logging.tensorboard that cannot be created: ft train refuses it before step 1 (exit 1,
#     as checkpoint.dir), ft validate exits 2 with the same message naming the key. Unset: the
#     resolved recipe shows it empty and the run writes no event file.
#   bash tests/cli/test_tensorboard.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }
venv "$build/tensorboard_venv" "${tensorboard_spec[@]}"
PY="$build/tensorboard_venv/bin/python"
t0=$SECONDS

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 97 \
  --samples 24 --seq-len 16 --seed 0 > /dev/null
cat > "$tmp/r.yaml" <<YAML
run: {name: t, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16}
training: {steps: 10, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 3,
           eval_batches: 1, precision: fp16, initial_loss_scale: 1048576}
optimizer: {lr: 0.01}
checkpoint: {every_steps: 4}
logging: {tensorboard: $tmp/out/tb, peak_tflops: 1}  # a peak: step lines have mfu too
runtime: {threads: 2}
YAML

# 1. Killed as step 7 begins (steps 1-6 logged, step_4 saved), then resumed: steps 5-10.
FT_TEST_KILL_AT_STEP=7 run_rc 137 "$ft" train "$tmp/r.yaml"
run_rc 0 "$ft" train "$tmp/r.yaml"
has_err "resumed from $tmp/out/checkpoints/step_00000004 (step 4"
"$PY" - "$tmp/out/tb" "$tmp/out/metrics.jsonl" "$tmp/damaged" <<'PY' || fail "event files"
import json, os, re, shutil, struct, sys
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat import tf
from tensorboard.compat.proto import event_pb2

tb, metrics, damaged = sys.argv[1:]
f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]

# metrics.jsonl: each numeric key's value at each step as float32, the last line of a step
# counting; the series it is drawn as.
def series(key):
    for prefix, name in (("eval_", "eval/"), ("ckpt_", "checkpoint/")):
        if key.startswith(prefix):
            return name + key[len(prefix):]
    return "train/" + key
want, kinds = {}, set()
for j in map(json.loads, open(metrics)):
    for k, v in j.items():
        kinds.add(type(v).__name__)
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
            want.setdefault(series(k), {})[j["step"]] = f32(v)
# What the run was meant to show: booleans and nulls (left out), each kind of line.
assert {"bool", "NoneType"} <= kinds, kinds
for s in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/tflops",
          "train/mfu", "train/mem_peak_bytes", "train/loss_scale", "eval/loss",
          "checkpoint/bytes", "checkpoint/write_s"):
    assert s in want, (s, sorted(want))
assert "train/skipped" not in want and "checkpoint/async" not in want

# Two files, one per process, as TensorBoard names them; in name order, the killed one first.
names = sorted(os.listdir(tb))
assert len(names) == 2, names
for n in names:
    assert re.fullmatch(r"events\.out\.tfevents\.\d{10}\..+\.\d+\.ft", n), n
def events(path):
    return list(event_file_loader.EventFileLoader(path).Load())
firsts = []
for n in names:
    ev = events(os.path.join(tb, n))
    assert ev[0].file_version == "brain.Event:2", ev[0]
    assert ev[1].session_log.status == event_pb2.SessionLog.START, ev[1]
    firsts.append(ev[1].step)
    steps = sorted({e.step for e in ev[2:] if e.summary.value[0].tag == "train/loss"})
    print(f"{n}: START at step {ev[1].step}, train/loss at steps {steps}")
assert firsts == [1, 5], firsts
loss_steps = [sorted({e.step for e in events(os.path.join(tb, n))[2:]
                      if e.summary.value[0].tag == "train/loss"}) for n in names]
assert loss_steps == [[1, 2, 3, 4, 5, 6], [5, 6, 7, 8, 9, 10]], loss_steps

# TensorBoard's reader over the folder: every series, every step, exactly metrics.jsonl's value.
acc = EventAccumulator(tb, size_guidance={"scalars": 0})  # 0: keep every value
acc.Reload()
tags = set(acc.Tags()["scalars"])
assert tags == set(want), (sorted(tags ^ set(want)))
for tag in sorted(tags):
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    steps = [s for s, _ in got]
    assert steps == sorted(set(steps)), (tag, steps)  # rising: no step twice
    assert dict(got) == want[tag], (tag, got, want[tag])
print(f"EventAccumulator: {len(tags)} series equal to metrics.jsonl's values")

# 2. Damage: one byte of a record flipped, in its data and then in its length. TensorBoard's
# record reader checks both CRCs and raises DataLossError; its loader (which takes a failed
# record for one still being written) returns the records before it and nothing past it.
src = os.path.join(tb, names[1])
data = open(src, "rb").read()
def record_at(k):  # offset of record k
    at = 0
    for _ in range(k):
        at += 16 + struct.unpack("<Q", data[at:at + 8])[0]
    return at
os.makedirs(damaged)
for where, offset, why in (("data", record_at(5) + 12 + 3, "failed event crc32 check"),
                           ("length", record_at(5) + 1, "failed header crc32 check")):
    path = os.path.join(damaged, names[1])
    bad = bytearray(data)
    bad[offset] ^= 0x01
    open(path, "wb").write(bytes(bad))
    reader = tf.pywrap_tensorflow.PyRecordReader_New(path.encode())
    read = 0
    try:
        while True:
            reader.GetNext()
            read += 1
    except tf.errors.DataLossError as e:
        assert why in str(e), e
    except tf.errors.OutOfRangeError:
        raise AssertionError(f"flipped {where} byte: read to the end without a DataLossError")
    assert read == 5, read
    assert len(events(path)) == 5
    print(f"a flipped byte in record 5's {where}: DataLossError ({why}) after 5 good records")
PY

# 3. A folder that cannot be created: refused before step 1 as checkpoint.dir is, naming the key.
touch "$tmp/a_file"
refused=(run.output_dir="$tmp/refused" logging.tensorboard="$tmp/a_file/tb")
run_rc 1 "$ft" train "$tmp/r.yaml" "${refused[@]}"
has_err "logging.tensorboard $tmp/a_file/tb cannot be created: Not a directory"
lacks_out "step 1/"
train_msg=$(grep '^ft: error: ' "$tmp/err.txt")
run_rc 2 "$ft" validate "$tmp/r.yaml" "${refused[@]}"
has_err "${train_msg#ft: error: }"
# Unset (the default): shown empty in the resolved recipe, and no event file anywhere.
run_rc 0 "$ft" validate "$tmp/r.yaml" logging.tensorboard=
has_out 'tensorboard: ""'
run_rc 0 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/off" logging.tensorboard= training.steps=2
[[ -z $(find "$tmp/off" -name 'events.out.tfevents.*') ]] ||
  fail "event files written with logging.tensorboard unset"
echo "test_tensorboard: ok ($((SECONDS - t0)) s)"
