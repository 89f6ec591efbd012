#!/usr/bin/env bash
# The quickstart path a new user takes: set-up's data step (generated corpus, SentencePiece model,
# ft tokenize) and the quickstart recipe, shortened to 100 steps for the suite (the README's
# command runs all 300). The loss must fall clearly: below half its first value.
#   bash tests/cli/test_quickstart.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
cd "$src"
scripts/quickstart_data.sh "$build" > "$tmp/data.log"
"$ft" train recipes/quickstart.yaml training.steps=100 training.eval_every_steps=50 \
  run.output_dir="$tmp/run" > "$tmp/train.log"
/usr/bin/python3 - "$tmp/run/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
loss = [l["loss"] for l in lines if "loss" in l]
ev = [l["eval_loss"] for l in lines if "eval_loss" in l]
print(f"quickstart: loss {loss[0]:.3f} -> {loss[-1]:.3f}, eval {ev}")
assert loss[-1] < 0.5 * loss[0], "loss did not fall clearly"
assert len(ev) == 2 and ev[-1] < ev[0], "validation loss did not fall"
PY
grep -q "^ft: done: 100 steps" "$tmp/train.log"
# Its checkpoint verifies, and exports to a Hugging Face folder.
"$build/ft" inspect "$tmp/run/checkpoints" > "$tmp/inspect.log"
"$build/ft" export "$tmp/run/checkpoints" --output "$tmp/hf" > "$tmp/export.log"
for f in config.json model.safetensors tokenizer.model; do
  [[ -s $tmp/hf/$f ]] || { echo "FAIL: export wrote no $f" >&2; exit 1; }
done
# Running the same command again resumes from it: nothing left to train at step 100.
"$ft" train recipes/quickstart.yaml training.steps=100 training.eval_every_steps=50 \
  run.output_dir="$tmp/run" > "$tmp/again.log"
grep -q "nothing to train" "$tmp/again.log" || { echo "FAIL: rerun did not resume" >&2; exit 1; }
