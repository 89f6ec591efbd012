#!/usr/bin/env bash
# Checkpoint speed (DESIGN.md §8) on a model whose training state — parameters and both AdamW
# moments in f32, 12 bytes a parameter — is over 1 GiB: dim 1024, 6 layers, ffn 2816, vocab
# 32000 (136M parameters, 1.6 GB of state; `ft plan` shows the sizes). Trains with a checkpoint
# every EVERY steps (default 4: more training time between saves than one save takes, as in a
# real run), once synchronous and once asynchronous, then resumes from the last checkpoint to
# time the load. Prints, from metrics.jsonl's checkpoint lines (ckpt_*) and
# the "resumed from ... in X s" line:
#   - the state bytes (all ranks' shard files of one checkpoint),
#   - the synchronous save: time from save() to the commit, and GB/s,
#   - how long each mode stalled training (ckpt_blocking_s), and async / sync; an async save
#     waits for the previous one, so when a save takes longer than the steps between saves
#     (try EVERY=1) the later async saves stall too: the first one shows the staging copy alone,
#   - the load: time and GB/s (the files were just written, so mostly read from the page cache).
# Not part of the test suite; builds nothing. Its data and checkpoints (~2 checkpoints on disk at
# a time) go to a temporary folder under /tmp, removed at the end.
#   scripts/bench_ckpt.sh [BUILD_DIR]     # default: build
#   NPROC=2 scripts/bench_ckpt.sh         # 2 data-parallel ranks (each writes half the state)
#   EVERY=4 STEPS=12 scripts/bench_ckpt.sh  # checkpoint every EVERY steps, STEPS per mode (defaults)
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
ft="$build/ft"
[[ -x $ft ]] || { echo "bench_ckpt: no $ft; build first (cmake --build $build)" >&2; exit 1; }
nproc=${NPROC:-1}
every=${EVERY:-4}
steps=${STEPS:-$((3 * every))}
tmp=$(mktemp -d /tmp/ft_bench_ckpt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 32000 --samples 32 --seq-len 64 --shards 1 --seed 1
# threads: 0 (every core) for one process; one each when ranks share the cores.
threads=0
((nproc > 1)) && threads=1
cat > "$tmp/r.yaml" <<YAML
run: {name: bench_ckpt, output_dir: $tmp/out, seed: 1}
model: {dim: 1024, n_layers: 6, n_heads: 16, n_kv_heads: 8, ffn_dim: 2816, vocab_size: 32000, max_seq_len: 64}
data: {train: $tmp/data, seq_len: 64, shuffle: true}
training: {steps: $steps, micro_batch_size: 1, global_batch_size: $nproc}
optimizer: {lr: 1.0e-4}
checkpoint: {every_steps: $every, keep_last: 1}
logging: {every_steps: 1}
runtime: {threads: $threads}
YAML
launch=()
((nproc > 1)) && launch=(--nproc "$nproc")

"$ft" plan "$tmp/r.yaml" --world "$nproc" | grep -E '^  (parameters|optimizer state) +[0-9]' || true
for mode in sync async; do
  async=false
  [[ $mode == async ]] && async=true
  echo "bench_ckpt: $steps steps, checkpoint.every_steps=$every, checkpoint.async=$async, $nproc process(es)"
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$mode" checkpoint.async=$async "${launch[@]}" \
    > "$tmp/$mode.log" 2>&1 || { tail -20 "$tmp/$mode.log" >&2; exit 1; }
done
# Load: the same command again resumes from the last checkpoint (nothing left to train).
"$ft" train "$tmp/r.yaml" run.output_dir="$tmp/async" checkpoint.async=true "${launch[@]}" \
  > "$tmp/resume.log" 2>&1 || { tail -20 "$tmp/resume.log" >&2; exit 1; }

/usr/bin/python3 - "$tmp" <<'PY'
import json, re, statistics, sys
tmp = sys.argv[1]
def saves(mode):
    return [m for m in map(json.loads, open(f"{tmp}/{mode}/metrics.jsonl")) if "ckpt_step" in m]
def steps(mode):
    return [m["step_time_s"] for m in map(json.loads, open(f"{tmp}/{mode}/metrics.jsonl")) if "loss" in m]
sync, asyn = saves("sync"), saves("async")
assert sync and asyn, "no checkpoint lines in metrics.jsonl"
nbytes = sync[0]["ckpt_bytes"]
gb = nbytes / 1e9
mean = statistics.mean
print(f"state: {nbytes} bytes ({nbytes / 2**30:.2f} GiB) per checkpoint; "
      f"a training step {mean(steps('sync')):.2f} s")
for name, rows in (("sync", sync), ("async", asyn)):
    for m in rows:
        print(f"  {name:5} step {m['ckpt_step']}: written+committed in {m['ckpt_write_s']:.3f} s "
              f"({gb / m['ckpt_write_s']:.2f} GB/s), training stalled {m['ckpt_blocking_s']:.3f} s")
w_sync = mean(m["ckpt_write_s"] for m in sync)
stall_sync = mean(m["ckpt_blocking_s"] for m in sync)
stall_async = mean(m["ckpt_blocking_s"] for m in asyn)
w_async = mean(m["ckpt_write_s"] for m in asyn)
print(f"sync save:   {w_sync:.3f} s mean, {gb / w_sync:.2f} GB/s")
print(f"async save:  {w_async:.3f} s mean from save() to commit ({gb / w_async:.2f} GB/s), "
      "overlapping the next step")
print(f"stall:       sync {stall_sync:.3f} s, async {stall_async:.3f} s: async/sync = "
      f"{stall_async / stall_sync:.3f} (mean over every save)")
# An async save first waits for the one before it: when saves come faster than they are
# written, later saves stall on that wait. The first save has nothing to wait for: its stall is
# the copy into the staging buffer alone.
first = asyn[0]["ckpt_blocking_s"]
print(f"             first async save (no save in flight): {first:.3f} s = "
      f"{first / stall_sync:.3f} of the sync stall ({gb / first:.1f} GB/s staging copy)")
log = open(f"{tmp}/resume.log").read()
m = re.search(r"resumed from (\S+) \(step (\d+),.* in ([0-9.e+-]+) s", log)
assert m, "no 'resumed from ... in X s' line in the resumed run's output"
load = float(m.group(3))
print(f"load:        {load:.3f} s, {gb / load:.2f} GB/s ({m.group(1).rsplit('/', 1)[-1]}, "
      "just written: mostly from the page cache)")
PY
