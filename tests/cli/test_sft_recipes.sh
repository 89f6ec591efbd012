#!/usr/bin/env bash
# recipes/sft_qwen.yaml and recipes/sft_llama3.yaml run as README "Fine-tune on chat data" says
# (and recipes/lora_qwen.yaml and recipes/qlora_llama3_70b.yaml as README "Fine-tune with LoRA" does, at the end of step 3,
# and recipes/dpo_qwen.yaml after lora_qwen.yaml, as README "Align with preferences (DPO)"),
# each on its tiny twin: a Hugging Face folder made here by tests/ref/sft_tiny_models.py (random
# Qwen2 / Llama 3.1-style models by transformers 4.46.3, byte-level BPE tokenizers trained here,
# the Qwen2.5 and Llama 3.1 Instruct chat templates of tests/data/chat_templates) and JSONL
# conversations with a pattern a tiny model learns in a few steps. For each recipe:
#   1. ft tokenize --format chat of train.jsonl and valid.jsonl with the folder;
#   2. ft validate and ft train of the recipe file as it is, overridden only in its paths, its
#      sizes (seq_len 256, 60 steps of 8 windows) and its learning rate (3e-3, warmup 5: a random
#      128-wide model at the recipe's 1e-5, 30 warmup steps, goes from 6.11 to 5.70 in 60 steps,
#      too little to see what the mask teaches); bf16, packing, ZeRO-3, activation checkpointing, clipping,
#      cosine and evaluation stay the recipe's. The packing line is printed; the loss falls from
#      ln(vocab) ~ 6 to below 0.5 (seen 0.165 and 0.166), and so does the eval loss;
#   3. `ft generate CHECKPOINT --chat` (the checkpoint keeps the folder's chat template) answers
#      "What is the capital of France?" as the data's assistant does, "The capital of France is
#      Paris." (learnt from the assistant's tokens only: the users' turns never say it), and
#      stops at the template's end of turn; ft export, and `ft generate EXPORT --chat` gives the
#      same text;
#   3b. lora_qwen.yaml's start-up check of the template's end of turn (issue 28 point 4): the
#      twin's <|im_end|> row is drawn as every row is, and ft train says nothing of it; in a copy
#      of the folder whose row is zero, ft train warns, naming the token, its id and
#      adapter.modules_to_save, and with modules_to_save: [embed_tokens, lm_head] it does not;
#   4. transformers 4.46.3 loads the export as its class, and its greedy generate from ft's
#      prompt ids, stopping at the export's generation_config eos (the end of turn), gives ft's
#      ids token for token (fp32), which its tokenizer decodes to ft's text; transformers 5's
#      apply_chat_template on the export gives ft's prompt ids.
#   bash tests/cli/test_sft_recipes.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }

venv "$build/hf_venv_tf4" "${hf_tf4_spec[@]}"
PY="$build/hf_venv_tf4/bin/python"
run_rc 0 "$PY" "$src/tests/ref/sft_tiny_models.py" "$src" "$tmp"
cat "$tmp/out.txt"

for family in qwen:sft_qwen llama:sft_llama3; do
  IFS=: read -r f recipe <<< "$family"
  # 1. The shards, with the folder's own template and tokens.
  for split in train valid; do
    run_rc 0 "$ft" tokenize --tokenizer "$tmp/$f" --format chat --input "$tmp/$split.jsonl" \
      --output "$tmp/${f}_$split"
  done
  # 2. Train the recipe.
  args=("model.from=$tmp/$f" "tokenizer.path=$tmp/$f" "data.train=$tmp/${f}_train"
        "data.valid=$tmp/${f}_valid" "run.output_dir=$tmp/run_$f"
        data.seq_len=256 training.steps=60 training.micro_batch_size=4
        training.global_batch_size=8 optimizer.lr=3.0e-3 scheduler.warmup_steps=5
        scheduler.min_lr=3.0e-4)
  run_rc 0 "$ft" validate "$src/recipes/$recipe.yaml" "${args[@]}"
  for kv in "pack: true" "precision: bf16" "grad_clip: 1" "weight_decay: 0" "name: cosine" \
            "zero_stage: 3" "activation_checkpointing: true"; do
    grep -q "^ *$kv" "$tmp/out.txt" || fail "$recipe.yaml: the resolved recipe lacks $kv"
  done
  run_rc 0 "$ft" train "$src/recipes/$recipe.yaml" "${args[@]}"
  has_out "ft: data.pack: 48 documents in 48 pieces"
  has_out "eval at step 60: loss"
  /usr/bin/python3 - "$tmp/run_$f/metrics.jsonl" "$recipe" <<'EOF' || fail "$recipe: the loss"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
losses = [l["loss"] for l in lines if "loss" in l]
evals = [l["eval_loss"] for l in lines if "eval_loss" in l]
print(f"{sys.argv[2]}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, eval loss {evals[-1]:.3f}")
# Step 1 of a random model: about ln(400) = 5.99. After 60 steps on the repeated conversations
# (15 epochs) the assistant's tokens are mostly predictable: seen 0.165 (qwen), 0.166 (llama);
# the bound leaves room for other CPUs' rounding of the bf16 run.
assert len(losses) == 60 and losses[0] > 5.0, losses[:3]
assert losses[-1] < 0.5 and evals[-1] < 0.5, (losses[-1], evals)
EOF
  # 3. Generate from the checkpoint (it keeps the folder's chat template beside its
  #    tokenizer.json), export, and generate from the export alone.
  run_rc 0 "$ft" generate "$tmp/run_$f/checkpoints" --chat \
    --prompt "What is the capital of France?" --max-new-tokens 24
  echo "$f: ft generate --chat: $(cat "$tmp/out.txt")"
  [[ $(cat "$tmp/out.txt") == "The capital of France is Paris." ]] ||
    fail "$recipe: ft generate --chat does not answer as the training data's assistant does"
  has_err "stopped: end_of_turn"
  cp "$tmp/out.txt" "$tmp/${f}_checkpoint.txt"
  run_rc 0 "$ft" export "$tmp/run_$f/checkpoints" --output "$tmp/${f}_hf"
  run_rc 0 "$ft" generate "$tmp/${f}_hf" --chat --prompt "What is the capital of France?" \
    --max-new-tokens 24 --json
  cp "$tmp/out.txt" "$tmp/${f}_generate.json"
  # (the streamed text ends with a newline, --json's text without)
  same_text='import json, sys
sys.exit(json.load(open(sys.argv[1]))["text"] + "\n" != open(sys.argv[2]).read())'
  "$PY" -c "$same_text" "$tmp/${f}_generate.json" "$tmp/${f}_checkpoint.txt" ||
    fail "$recipe: the export generates another text than the checkpoint"
done

# recipes/lora_qwen.yaml on the same tiny Qwen2 folder and shards: LoRA with its frozen random
# base cannot fit the data as full training does (the frozen head and norms bound what the
# adapter can reach: 6.11 falls to 5.22 and stays, seen), so the twin checks that the recipe runs
# as written (adapter, bf16, packing, activation checkpointing, evaluation), that the loss falls,
# and that the adapter exports as a PEFT folder and merged.
args=("model.from=$tmp/qwen" "tokenizer.path=$tmp/qwen" "data.train=$tmp/qwen_train"
      "data.valid=$tmp/qwen_valid" "run.output_dir=$tmp/run_lora" data.seq_len=256
      training.steps=20 training.micro_batch_size=4 training.global_batch_size=8
      training.eval_every_steps=20 optimizer.lr=3.0e-2 scheduler.warmup_steps=5
      scheduler.min_lr=3.0e-3)
run_rc 0 "$ft" train "$src/recipes/lora_qwen.yaml" "${args[@]}"
cp "$tmp/err.txt" "$tmp/lora_train.err"
for kv in "type: lora" "r: 16" "alpha: 32" "target_modules: \\[all-linear\\]" "pack: true" \
          "precision: bf16" "activation_checkpointing: true"; do
  grep -q "^ *$kv" "$tmp/out.txt" || fail "lora_qwen.yaml: the resolved recipe lacks $kv"
done
has_out "ft: adapter lora r 16, alpha 32 (scale 2) on q_proj, k_proj, v_proj, o_proj, gate_proj"
has_out "eval at step 20: loss"
/usr/bin/python3 - "$tmp/run_lora/metrics.jsonl" <<'EOF' || fail "lora_qwen: the loss"
import json, sys
losses = [l["loss"] for l in map(json.loads, open(sys.argv[1])) if "loss" in l]
print(f"lora_qwen: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
assert len(losses) == 20 and losses[0] > 5.8 and losses[-1] < losses[0] - 0.5, losses
EOF
run_rc 0 "$ft" export "$tmp/run_lora/checkpoints" --output "$tmp/lora_adapter"
[[ -f $tmp/lora_adapter/adapter_model.safetensors && -f $tmp/lora_adapter/adapter_config.json ]] ||
  fail "lora_qwen: the export is not a PEFT folder"
run_rc 0 "$ft" export "$tmp/run_lora/checkpoints" --output "$tmp/lora_merged" --merge --dtype bf16
[[ -f $tmp/lora_merged/config.json ]] || fail "lora_qwen: the merged export has no config.json"

# recipes/dpo_qwen.yaml after lora_qwen.yaml, as its comments say: preference pairs (message
# lists: the question, the right capital chosen, a wrong one rejected) tokenized with the merged
# export of the LoRA run, then DPO with a new adapter on that model, the reference the model with
# the adapter off. The recipe runs as written (adapter, reference base, bf16, activation
# checkpointing, evaluation): step 1's loss is ln 2 (the policy is the reference), every step and
# the evaluation carry the DPO figures, and the adapter exports as a PEFT folder. What it learns
# is not asserted here: this twin's random base barely ties a capital to its country (seen: the
# held-out margin stays near 1e-5 whatever the rate); tests/ref/test_dpo.py's toy set shows DPO
# learning, with full fine-tuning and with LoRA.
/usr/bin/python3 - "$tmp" <<'EOF'
import json, os, sys
countries = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
             ("Egypt", "Cairo"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Kenya", "Nairobi")]
for split, lo, hi in (("train", 0, 48), ("valid", 48, 64)):
    with open(os.path.join(sys.argv[1], f"pairs_{split}.jsonl"), "w") as f:
        for i in range(lo, hi):
            country, capital = countries[i % 8]
            wrong = countries[(i + 1 + (i // 8) % 7) % 8][1]  # never the right one
            f.write(json.dumps({
                "prompt": [{"role": "user", "content": f"What is the capital of {country}?"}],
                "chosen": [{"role": "assistant", "content": f"The capital of {country} is {capital}."}],
                "rejected": [{"role": "assistant", "content": f"The capital of {country} is {wrong}."}]}) + "\n")
EOF
for split in train valid; do
  run_rc 0 "$ft" tokenize --tokenizer "$tmp/lora_merged" --format preference \
    --input "$tmp/pairs_$split.jsonl" --output "$tmp/dpo_$split"
done
args=("model.from=$tmp/lora_merged" "tokenizer.path=$tmp/lora_merged" "data.train=$tmp/dpo_train"
      "data.valid=$tmp/dpo_valid" "run.output_dir=$tmp/run_dpo" data.seq_len=64
      training.steps=20 training.micro_batch_size=4 training.global_batch_size=8
      training.eval_every_steps=20 optimizer.lr=3.0e-3 scheduler.warmup_steps=3
      scheduler.min_lr=3.0e-4)
run_rc 0 "$ft" train "$src/recipes/dpo_qwen.yaml" "${args[@]}"
for kv in "objective: dpo" "reference: base" "type: lora" "precision: bf16" \
          "activation_checkpointing: true"; do
  grep -q "^ *$kv" "$tmp/out.txt" || fail "dpo_qwen.yaml: the resolved recipe lacks $kv"
done
has_out "ft: dpo: 48 preference pairs"
/usr/bin/python3 - "$tmp/run_dpo/metrics.jsonl" <<'EOF' || fail "dpo_qwen: the loss"
import json, math, sys
lines = list(map(json.loads, open(sys.argv[1])))
losses = [l["loss"] for l in lines if "loss" in l]
ev = [l for l in lines if "eval_reward_accuracy" in l]
print(f"dpo_qwen: loss {losses[0]:.3f} -> {losses[-1]:.3f}, held-out reward accuracy "
      f"{ev[-1]['eval_reward_accuracy']:.2f}, margin {ev[-1]['eval_reward_margin']:.3f}")
assert len(losses) == 20 and abs(losses[0] - math.log(2)) < 1e-9, losses
assert all(math.isfinite(x) for x in losses) and len(ev) == 1, (losses, ev)
keys = ["rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy", "logps_chosen",
        "logps_rejected"]
assert all(k in l for l in lines if "loss" in l for k in keys), lines[0]
assert all("eval_" + k in ev[0] for k in keys), ev
EOF
run_rc 0 "$ft" export "$tmp/run_dpo/checkpoints" --output "$tmp/dpo_adapter"
[[ -f $tmp/dpo_adapter/adapter_model.safetensors ]] || fail "dpo_qwen: the export is not a PEFT folder"

# 3b. The end-of-turn token's row: trained-looking in the twin (its run above said nothing of it),
# zero in a copy.
grep -q "looks untrained" "$tmp/lora_train.err" && fail "lora_qwen: warned of a trained-looking row"
cp -r "$tmp/qwen" "$tmp/qwen_zero"
im_end=$(/usr/bin/python3 - "$tmp/qwen_zero" "$src/tests/ref" <<'EOF'
import json, os, sys
sys.path.insert(0, sys.argv[2])
import llama_ref as ref
d = sys.argv[1]
tok = json.load(open(os.path.join(d, "tokenizer.json")))
i = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|im_end|>")
w = ref.read_safetensors(os.path.join(d, "model.safetensors"))
w["model.embed_tokens.weight"][i] = 0  # as a base model ships a token it never trained
ref.write_safetensors(os.path.join(d, "model.safetensors"), w)
print(i)
EOF
)
args=("model.from=$tmp/qwen_zero" "tokenizer.path=$tmp/qwen_zero" "data.train=$tmp/qwen_train"
      "data.valid=$tmp/qwen_valid" data.seq_len=256 training.steps=0 scheduler.warmup_steps=0)
run_rc 0 "$ft" train "$src/recipes/lora_qwen.yaml" "${args[@]}" "run.output_dir=$tmp/run_zero"
has_err "warning: the chat template's end-of-turn token <|im_end|> (id $im_end) looks untrained in model.from (model.embed_tokens.weight: norm 0, 0 of the median row's"
has_err "train its rows with adapter.modules_to_save: [embed_tokens, lm_head]"
run_rc 0 "$ft" train "$src/recipes/lora_qwen.yaml" "${args[@]}" "run.output_dir=$tmp/run_saved" \
  "adapter.modules_to_save=[embed_tokens, lm_head]"
grep -q "looks untrained" "$tmp/err.txt" && fail "lora_qwen: warned with the rows trained whole"
has_out "and embed_tokens, lm_head trained whole (tied: the one shared table)"
echo "lora_qwen: <|im_end|> (id $im_end) zeroed: warned; trained whole: not"

# recipes/qlora_llama3_70b.yaml on the tiny Llama folder and shards, as the LoRA twin: the recipe
# runs as written (qlora: the blocks in NF4, bf16, packing, activation checkpointing,
# evaluation), the loss falls, the adapter exports as a PEFT folder.
args=("model.from=$tmp/llama" "tokenizer.path=$tmp/llama" "data.train=$tmp/llama_train"
      "data.valid=$tmp/llama_valid" "run.output_dir=$tmp/run_qlora" data.seq_len=256
      training.steps=12 training.micro_batch_size=4 training.global_batch_size=8
      training.eval_every_steps=12 optimizer.lr=3.0e-2 scheduler.warmup_steps=3
      scheduler.min_lr=3.0e-3)
run_rc 0 "$ft" train "$src/recipes/qlora_llama3_70b.yaml" "${args[@]}"
for kv in "type: qlora" "r: 16" "alpha: 32" "target_modules: \\[all-linear\\]" "pack: true" \
          "precision: bf16" "activation_checkpointing: true"; do
  grep -q "^ *$kv" "$tmp/out.txt" || fail "qlora_llama3_70b.yaml: the resolved recipe lacks $kv"
done
has_out "ft: adapter qlora r 16, alpha 32 (scale 2) on q_proj, k_proj, v_proj, o_proj, gate_proj"
has_out "the base frozen (its blocks' matrices in NF4)"
has_out "eval at step 12: loss"
/usr/bin/python3 - "$tmp/run_qlora/metrics.jsonl" <<'EOF' || fail "qlora_llama3_70b: the loss"
import json, sys
losses = [l["loss"] for l in map(json.loads, open(sys.argv[1])) if "loss" in l]
print(f"qlora_llama3_70b: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
assert len(losses) == 12 and losses[0] > 5.8 and losses[-1] < losses[0] - 0.3, losses
EOF
run_rc 0 "$ft" export "$tmp/run_qlora/checkpoints" --output "$tmp/qlora_adapter"
[[ -f $tmp/qlora_adapter/adapter_model.safetensors ]] ||
  fail "qlora_llama3_70b: the export is not a PEFT folder"

# 4. The exports in transformers.
run_rc 0 "$PY" - "$tmp" <<'EOF'
import json, sys
import torch
import transformers
import transformers.generation.utils as gen_utils
# generate() asks whether FSDP wraps the model, importing torch.distributed.fsdp, which Debian's
# torch 1.13 cannot import under Python 3.11: it does not (as tests/ref/generate_parity.py).
gen_utils.is_fsdp_managed_module = lambda module: False
t = sys.argv[1]
for f, cls in (("qwen", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")):
    model = transformers.AutoModelForCausalLM.from_pretrained(f"{t}/{f}_hf").float().eval()
    assert type(model).__name__ == cls, (f, type(model).__name__)
    got = json.load(open(f"{t}/{f}_generate.json"))
    assert got["stop"] == "end_of_turn", got
    # The export's generation_config.json stops at the end of an assistant's turn.
    assert model.generation_config.eos_token_id == got["ids"][-1], model.generation_config
    prompt = torch.tensor([got["prompt_ids"]])
    with torch.no_grad():  # (an explicit mask: generate would infer one from a pad id)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=24, pad_token_id=got["ids"][-1])
    want = out[0, len(got["prompt_ids"]):].tolist()
    assert want == got["ids"], (f, want, got["ids"])
    tok = transformers.AutoTokenizer.from_pretrained(f"{t}/{f}_hf")
    assert tok.decode(got["ids"][:-1]) == got["text"], (tok.decode(got["ids"][:-1]), got["text"])
    print(f"{f}: transformers loads the export as {cls}; its greedy ids are ft's "
          f"({len(want)} tokens): {got['text']!r}")
EOF
cat "$tmp/out.txt"
# transformers 5 (jinja2: 4.46's apply_chat_template needs it) renders the export's chat template
# into ft's prompt ids.
venv "$build/hf_venv_tf5" "${hf_tf5_spec[@]}"
run_rc 0 "$build/hf_venv_tf5/bin/python" - "$tmp" <<'EOF'
import json, sys
from transformers import AutoTokenizer
t = sys.argv[1]
for f in ("qwen", "llama"):
    got = json.load(open(f"{t}/{f}_generate.json"))
    want = AutoTokenizer.from_pretrained(f"{t}/{f}_hf").apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert list(want) == got["prompt_ids"], (f, list(want), got["prompt_ids"])
    print(f"{f}: the export's apply_chat_template gives ft generate --chat's prompt ids")
EOF
cat "$tmp/out.txt"
echo "test_sft_recipes: all checks passed"
