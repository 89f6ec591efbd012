#!/usr/bin/env bash
# `ft validate` as a user runs it: exit codes, what goes to stdout and stderr, and that the
# resolved recipe it prints is itself a valid recipe giving the same output.
# Usage: test_validate.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
cd "$tmp"  # relative paths in recipes resolve against the current directory
# Shards every recipe below can train on: ft validate checks them as ft train does.
/usr/bin/python3 "$src/tests/ref/make_shards.py" shards --vocab 256 --samples 16 --seq-len 64 \
  --seed 1 > /dev/null
fail() { fail_showing_output "$@"; }
run_ft() { run_rc "$1" "$ft" "${@:2}"; }  # WANT_RC ARGS...: stdout, stderr in out.txt, err.txt

cat >good.yaml <<'EOF'
run:
  name: cli
model:
  dim: 64
  n_layers: 2
  n_heads: 4
  ffn_dim: 172
  vocab_size: 256
data:
  train: shards
  seq_len: 32
training:
  steps: 10
  micro_batch_size: 2
  global_batch_size: 4
optimizer:
  betas: [0.9, 0.95]
EOF

# 1. A good recipe: resolved YAML on stdout, "recipe OK" on stderr, exit 0.
run_ft 0 validate good.yaml
has_err "recipe OK"
has_out "steps: 10"
has_out "betas: [0.9, 0.95]"
has_out "output_dir: runs/cli"
has_out "dir: runs/cli/checkpoints"
has_out "metrics: runs/cli/metrics.jsonl"
[[ $(wc -l <err.txt) -eq 1 ]] || fail "a valid recipe should print only 'recipe OK' on stderr"

# 2. Overrides apply on top of the file.
run_ft 0 validate good.yaml training.steps=20 'optimizer.betas=[0.8,0.99]' run.name=other
has_out "steps: 20"
has_out "betas: [0.8, 0.99]"
has_out "output_dir: runs/other"

# 3. The printed recipe is a recipe: validating it prints the same thing again.
run_ft 0 validate good.yaml training.steps=20
grep -v '^# resolved from' out.txt >resolved.yaml
cp out.txt first.txt
run_ft 0 validate resolved.yaml
diff <(grep -v '^# resolved from' first.txt) <(grep -v '^# resolved from' out.txt) \
  || fail "resolved recipe does not reproduce itself"

# 4. Every problem at once, each as FILE:LINE:COL: KEY: MESSAGE (hint: ...), then a count; exit 2.
cat >bad.yaml <<'EOF'
run:
  name: cli
model:
  dim: 64
  n_layers: 2
  n_heads: 5
  ffn_dim: 172
  vocab_size: 256
  arch: gpt2
data:
  train: no_such_dir
training:
  stpes: 10
  micro_batch_size: 2.5
  precision: fp16
optimizer:
  lr: 0
scheduler:
  name: cosin
EOF
run_ft 2 validate bad.yaml training.bogus=1 nonsense
[[ ! -s out.txt ]] || fail "nothing should be printed on stdout for a bad recipe"
has_err "bad.yaml:6:12: model.n_heads: model.dim 64 is not divisible by model.n_heads 5"
has_err "bad.yaml:9:9: model.arch: gpt2 is not implemented yet (hint: use llama, qwen2, qwen3 or mistral)"
has_err 'bad.yaml:11:10: data.train: "no_such_dir" does not exist'
has_err "bad.yaml:13:3: training.stpes: unknown key (hint: did you mean training.steps?)"
has_err "bad.yaml:14:21: training.micro_batch_size: expected an integer, got the number 2.5"
has_err "bad.yaml:17:7: optimizer.lr: 0 is out of range: must be in (0, 10000000000]"
has_err "bad.yaml:19:9: scheduler.name: \"cosin\" is not one of constant, linear, cosine (hint: did you mean cosine?)"
has_err "<command line>: training.bogus: unknown key in override"
has_err "<command line>: nonsense: not a KEY=VALUE override"
has_err "ft validate: 9 problems in bad.yaml"
[[ $(wc -l <err.txt) -eq 10 ]] || fail "expected 9 issue lines and a count line"

# 5. A YAML syntax error is one issue with its position.
printf 'run:\n  name: x\noptimizer:\n  betas: [0.9, 0.95\n  lr: 0.1\n' >syntax.yaml
run_ft 2 validate syntax.yaml
has_err "syntax.yaml:5:5: YAML syntax error"
has_err "ft validate: 1 problem in syntax.yaml"

# 6. model.from: sizes come from config.json; a disagreeing recipe value is refused.
mkdir hf
cat >hf/config.json <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "intermediate_size": 344, "vocab_size": 300, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-06}
EOF
touch hf/model.safetensors  # validation checks that the weights are there, not their contents
printf 'model:\n  from: hf\ndata:\n  train: shards\n  seq_len: 64\n' >from.yaml
run_ft 0 validate from.yaml
has_out "dim: 128"
has_out "n_kv_heads: 2"
has_out "norm_eps: 1e-06"
run_ft 2 validate from.yaml model.dim=512
has_err "<command line>: model.dim: model.dim = 512 but hf/config.json has hidden_size 128 (hint: remove model.dim or make it match)"

# 7. A recipe file that does not exist is a usage error too.
run_ft 2 validate no_such_recipe.yaml

# 8. RoPE as transformers 5 writes it (rope_parameters); the recipe's rope_theta error quotes it.
SIZES='"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "intermediate_size": 344, "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-06'
hf_folder() {  # hf_folder DIR EXTRA_JSON: a config.json and an (empty) model.safetensors
  mkdir -p "$1"
  printf '{%s, %s}\n' "$SIZES" "$2" >"$1/config.json"
  touch "$1/model.safetensors"
}
from_recipe() { printf 'model:\n  from: %s\ndata:\n  train: %s\n  seq_len: 64\n' "$1" "${2:-shards}"; }
hf_folder v5 '"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}'
from_recipe v5 >v5.yaml
run_ft 0 validate v5.yaml
has_out "rope_theta: 500000"
has_out "rope_type: llama3"
has_out "rope_factor: 8"
has_out "rope_original_max_seq_len: 8192"
run_ft 2 validate v5.yaml model.rope_theta=10000
has_err "model.rope_theta: model.rope_theta = 10000 but v5/config.json has rope_parameters.rope_theta = 500000"
# The resolved recipe of a llama3 model is itself a valid recipe.
run_ft 0 validate v5.yaml
grep -v '^# resolved from' out.txt >v5_resolved.yaml
run_ft 0 validate v5_resolved.yaml
has_out "rope_type: llama3"
# Both formats that disagree: refused naming both places.
hf_folder both '"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}'
from_recipe both >both.yaml
run_ft 2 validate both.yaml
has_err "rope_parameters.rope_theta = 500000 but rope_theta = 10000"
echo "ok: rope formats"

# 9. Rope types ft does not implement are refused by name, before any work.
hf_folder yarn '"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}'
from_recipe yarn >yarn.yaml
run_ft 2 validate yarn.yaml
has_err 'rope type "yarn" (rope_scaling.rope_type) is not implemented; ft implements default, linear, llama3'
echo "ok: yarn refused"

# 10. attention_dropout > 0: trained without dropout, said in one line; still valid.
hf_folder dropout '"attention_dropout": 0.1'
from_recipe dropout >dropout.yaml
run_ft 0 validate dropout.yaml
has_err "warning: dropout/config.json: attention_dropout is 0.1; ft has no dropout and trains this model without it"
[[ $(grep -c attention_dropout err.txt) -eq 1 ]] || fail "the dropout warning is not one line"
echo "ok: attention_dropout warning"

# 11. What ft train refuses about model.from, ft validate refuses too, with exit code 2:
# PyTorch .bin weights only ...
mkdir bin
cp hf/config.json bin/
touch bin/pytorch_model.bin
from_recipe bin >bin.yaml
run_ft 2 validate bin.yaml
has_err "model.from: bin has no model.safetensors or model.safetensors.index.json (it holds pytorch_model.bin)"
# ... shards tokenized with a larger vocabulary than the model's (their vocab_size attribute) ...
PY=/usr/bin/python3  # Debian's, with h5py and sentencepiece (DESIGN.md §9)
mkdir big_shards
"$PY" - "$src/tests/ref" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import llama_ref as ref
ref.write_shard("big_shards/shard_00000.h5", np.arange(200) % 290, 400)
import sentencepiece as spm
words = [f"w{i}x{i * 7 % 13}" for i in range(3000)]
open("corpus.txt", "w").write("\n".join(" ".join(words[i:i + 12]) for i in range(0, 3000, 12)))
spm.SentencePieceTrainer.train(input="corpus.txt", model_prefix="tok", vocab_size=320,
                               model_type="bpe", minloglevel=2)
PYEOF
from_recipe hf big_shards >big.yaml
run_ft 2 validate big.yaml
has_err "model.vocab_size 300 (vocab_size in hf/config.json) is smaller than vocab_size 400 of the shards in big_shards (big_shards/shard_00000.h5)"
# ... and a tokenizer with more pieces than the model has rows (also without model.from).
printf 'tokenizer:\n  path: tok.model\n' >>from.yaml
run_ft 2 validate from.yaml
has_err "model.vocab_size 300 (vocab_size in hf/config.json) is smaller than the 320 pieces of tokenizer tok.model"
run_ft 2 validate good.yaml tokenizer.path=tok.model
has_err "model.vocab_size 256 is smaller than the 320 pieces of tokenizer tok.model"
# The shards must come from that tokenizer (their tokenizer_sha256), as ft train checks ...
run_ft 2 validate good.yaml tokenizer.path=tok.model model.vocab_size=320
has_err "shards/shard_00000.h5: tokenizer_sha256 0000000000000000000000000000000000000000000000000000000000000000 differs from the sha256 of the recipe's tokenizer"
# ... and with shards it wrote, the recipe is good.
"$ft" tokenize --tokenizer tok.model --input corpus.txt --output tok_shards > /dev/null 2>&1 ||
  fail "ft tokenize of corpus.txt failed"
run_ft 0 validate good.yaml tokenizer.path=tok.model model.vocab_size=320 data.train=tok_shards
echo "ok: model.from refusals"

# 12. The adapter section: printed only with an adapter, lists in flow style, read back the same;
# a refusal points at the name in the list.
run_ft 0 validate good.yaml
lacks_out "adapter:"
cp good.yaml lora.yaml
printf 'adapter:\n  type: lora\n  r: 16\n  target_modules: [q_proj, v_proj, lm_head]\n' >>lora.yaml
run_ft 2 validate lora.yaml
has_err "lora.yaml:21:36: adapter.target_modules: LoRA on lm_head is not supported (hint: use adapter.modules_to_save: [lm_head] to train it whole)"
run_ft 0 validate lora.yaml adapter.target_modules=all-linear
has_out "target_modules: [all-linear]"
has_out "modules_to_save: []"
grep -v '^# resolved from' out.txt >lora_resolved.yaml
run_ft 0 validate lora_resolved.yaml
diff lora_resolved.yaml <(grep -v '^# resolved from' out.txt) ||
  fail "the resolved recipe with an adapter does not reproduce itself"
echo "ok: adapter"

echo "test_validate: OK"
