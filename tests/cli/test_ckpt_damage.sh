#!/usr/bin/env bash
# Damaged checkpoint manifests (DESIGN.md §8): a damaged checkpoint is never a reason to delete
# another, and a damaged folder is set aside, never deleted. A one-process run saves step_10 and
# step_20; then, for each damage of step_20's manifest.json — step -7, step 1e30, step 12.5, a
# piece past its tensor's end, a tensor shape of 0 or 2^62 elements, the manifest of another
# step (step_10's copied into step_20) —
#  - --resume auto warns naming manifest.json and the key, falls back to step_10, renames
#    step_20 to step_00000020.damaged (byte-identical to the damaged folder) with a warning, and
#    reproduces the uninterrupted run's losses; step_10 is byte-identical afterwards;
#  - a second damage of the new step_20 is set aside as step_00000020.damaged.1;
#  - --resume PATH of the damaged folder: exit 1 naming the key; nothing renamed or changed;
#  - every complete checkpoint damaged: exit 1, nothing renamed or changed;
#  - ft inspect of the folder labels the .damaged ones and verifies the rest (exit 0); of a
#    damaged step folder, exit 1 naming the key.
#   bash tests/cli/test_ckpt_damage.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
mpi_env
t_all=$SECONDS

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data" --vocab 64 --samples 37 --seq-len 12 --seed 5
cat > "$tmp/r.yaml" <<YAML
run: {name: damage, output_dir: $tmp/out, seed: 7}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64, max_seq_len: 16}
data: {train: $tmp/data, seq_len: 12, shuffle: true}
training: {steps: 20, micro_batch_size: 2, global_batch_size: 8}
optimizer: {lr: 0.01, weight_decay: 0.1}
checkpoint: {every_steps: 10}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# run RC NAME LOG ARGS...: a run into $tmp/NAME, output to $tmp/LOG.log, that must exit RC.
run() {
  local want=$1 name=$2 log=$3 rc=0; shift 3
  "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/$name" "$@" > "$tmp/$log.log" 2>&1 || rc=$?
  [[ $rc == "$want" ]] || fail "$log: exit $rc, expected $want: $(tail -5 "$tmp/$log.log")"
}
ck() { echo "$tmp/$1/checkpoints"; }
has() {  # LOG TEXT: the log has a line containing TEXT (fixed string)
  grep -qF -- "$2" "$tmp/$1.log" || fail "$1: no line with '$2': $(grep -i 'warn\|error' "$tmp/$1.log" | tail -5)"
}
same_tree() {  # A B: the same files with the same bytes (but ft.lock, which names its holder)
  diff -r -x ft.lock "$1" "$2" > /dev/null ||
    fail "$1 and $2 differ: $(diff -rq -x ft.lock "$1" "$2" | head -3)"
}
# damage FILE KIND: rewrites one manifest.json.
damage() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
j = json.load(open(path))
if kind == "step_-7":
    j["step"] = -7
elif kind == "step_1e30":
    j["step"] = 1e30  # written as 1e+30
elif kind == "step_12.5":
    j["step"] = 12.5
elif kind == "piece_past_end":
    p = j["pieces"][0]
    p["end"] = p["end"] + 1000
elif kind == "shape_0":
    j["tensors"][1]["shape"][0] = 0
elif kind == "shape_2^62":
    j["tensors"][1]["shape"] = [2**31, 2**31]
else:
    raise SystemExit("unknown damage " + kind)
open(path, "w").write(json.dumps(j))
PY
}
same_losses() {  # A B: the losses of steps 10..19 are ==
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'PY' || fail "$1 vs $2: losses differ"
import json, sys
def last(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if "loss" in j}
a, b = last(sys.argv[1]), last(sys.argv[2])
assert all(a[s] == b[s] for s in range(10, 20)), [(s, a.get(s), b[s]) for s in range(10, 20)]
PY
}

run 0 ref ref
cp -a "$(ck ref)/step_00000010" "$tmp/good_10"

# (damage, the key path the error names)
cases=("step_-7 step" "step_1e30 step" "step_12.5 step" "piece_past_end pieces[0].end"
       "shape_0 tensors[1].shape[0]" "shape_2^62 tensors[1].shape" "another_step step")
for c in "${cases[@]}"; do
  read -r kind key <<< "$c"
  t0=$SECONDS
  name=auto_${kind//[^a-z0-9_]/}
  cp -a "$tmp/ref" "$tmp/$name"
  s20="$(ck $name)/step_00000020"
  if [[ $kind == another_step ]]; then
    cp "$(ck $name)/step_00000010/manifest.json" "$s20/manifest.json"
    why="step: 10, but the folder's name says step 20"
  else
    damage "$s20/manifest.json" "$kind"
    why="$s20/manifest.json: $key"
  fi
  cp -a "$s20" "$tmp/${name}_damaged"
  run 0 "$name" "$name"
  has "$name" "cannot resume from $s20: "
  has "$name" "$why"
  has "$name" "falling back to the previous complete checkpoint, $(ck $name)/step_00000010"
  has "$name" "set the damaged checkpoint $s20 aside as $s20.damaged ("
  has "$name" "resumed from $(ck $name)/step_00000010 (step 10"
  same_tree "$(ck $name)/step_00000010" "$tmp/good_10"
  same_tree "$s20.damaged" "$tmp/${name}_damaged"
  cmp -s "$s20/rank_00000.bin" "$(ck ref)/step_00000020/rank_00000.bin" \
    || fail "$name: the new step_20 differs from the uninterrupted run's"
  same_losses "$name" ref
  echo "auto, $kind: fell back to step_10, step_20 set aside ($((SECONDS - t0)) s)"
done

# A second damaged step_20: .damaged.1 beside .damaged. Then ft inspect.
name=auto_step_7
damage "$(ck $name)/step_00000020/manifest.json" step_12.5
run 0 $name ${name}_2
has ${name}_2 "aside as $(ck $name)/step_00000020.damaged.1 ("
[[ -d $(ck $name)/step_00000020.damaged ]] || fail "$name: the first .damaged folder is gone"
"$ft" inspect "$(ck $name)" > "$tmp/inspect.log" 2>&1 || fail "inspect: exit $?: $(tail -3 "$tmp/inspect.log")"
has inspect "step_00000020.damaged  damaged: set aside by --resume auto"
has inspect "step_00000020.damaged.1  damaged: set aside"
has inspect "checksums:    all"
rc=0; "$ft" inspect "$(ck $name)/step_00000020.damaged" > "$tmp/inspect_damaged.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "inspect of a damaged folder: exit $rc, expected 1"
has inspect_damaged "manifest.json: step: expected an integer from 0"
echo "a second damage: step_00000020.damaged.1; ft inspect labels both"

# --resume PATH of a damaged folder, and every complete checkpoint damaged: exit 1, nothing
# renamed, changed or deleted.
cp -a "$tmp/ref" "$tmp/path"
damage "$(ck path)/step_00000020/manifest.json" step_-7
cp -a "$tmp/path" "$tmp/path_before"
run 1 path path_1 --resume "$(ck path)/step_00000020"
has path_1 "manifest.json: step: expected an integer from 0"
same_tree "$(ck path)" "$(ck path_before)"
cp -a "$tmp/ref" "$tmp/all"
damage "$(ck all)/step_00000020/manifest.json" step_1e30
cp "$(ck all)/step_00000020/manifest.json" "$(ck all)/step_00000010/manifest.json"
cp -a "$tmp/all" "$tmp/all_before"
run 1 all all_1
has all_1 "no usable checkpoint in $(ck all)"
same_tree "$(ck all)" "$(ck all_before)"
echo "--resume PATH of a damaged folder, every checkpoint damaged: exit 1, nothing changed"

echo "test_ckpt_damage: all checks passed in $((SECONDS - t_all)) s"
