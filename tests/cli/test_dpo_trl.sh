#!/usr/bin/env bash
# DPO (issue 30 point 4) from data ft tokenize made, against the float64 reference and against
# TRL, in the torch 2 venv (hf_torch2_spec: transformers 5, and TRL 1.16 from PyPI):
#  1. pairs written as strings and as message lists (the Qwen2.5 Instruct template of
#     tests/data/chat_templates), tokenized by `ft tokenize --format preference` with a
#     byte-level BPE tokenizer trained here; a random Llama trained 3 steps of 4 pairs on each
#     (sigmoid, beta 0.5, AdamW, no clipping): every step's loss within 1e-5 relative and
#     gradient norm within 1e-4 of tests/ref/dpo_ref.py's float64 DPO on the same shards (read
#     back with h5py), step 1's loss ln 2;
#  2. TRL: the model after ft's step 1 (ft export of its checkpoint) as the policy, the initial
#     model as the reference, both loaded by transformers: TRL's DPOTrainer loss
#     (`_compute_loss`, on the log-probabilities transformers gives, its completion_mask ft's
#     loss_mask) of step 2's batch equals ft's step-2 loss within 1e-5 relative, and its
#     rewards/chosen, rewards/rejected and rewards/accuracies ft's metrics, for sigmoid (both
#     data forms), ipo and hinge.
# FT_TEST_TORCH2=0 skips it, as it skips the other torch 2 tests; the sanitizer build skips it.
# About 40 s on 2 cores once the venv exists.
#   bash tests/cli/test_dpo_trl.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }
if sanitizer_build; then
  echo "$test_name: skipped in the sanitizer build (the Release pass runs it)"
  exit 0
fi
if [[ ${FT_TEST_TORCH2:-1} == 0 ]]; then
  echo "$test_name: skipped, FT_TEST_TORCH2=0 (no torch 2 venv: DPO is not compared with TRL)"
  exit 0
fi
venv "$build/hf_venv_torch2" "${hf_torch2_spec[@]}"
PY="$build/hf_venv_torch2/bin/python"

# ---- the tokenizer folder and the pairs, in both forms -----------------------------------------
run_rc 0 "$PY" - "$tmp" "$src/tests/data/chat_templates/qwen2_5_instruct.jinja" <<'EOF'
import json, os, random, sys
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
t, template = sys.argv[1], sys.argv[2]
rng = random.Random(1)
words = ["the", "fox", "said", "hello", "answer", "question", "good", "bad", "world", "brief"]
sentence = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(r"\s?\p{L}+|\s?\p{N}|\s?[^\s\p{L}\p{N}]+|\s+"),
                         behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([sentence(3, 10) for _ in range(300)], trainers.BpeTrainer(
    vocab_size=300, show_progress=False, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                          "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
d = f"{t}/tok"
os.makedirs(d)
tok.save(f"{d}/tokenizer.json")
json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "tokenizer_class": "PreTrainedTokenizerFast",
           "chat_template": open(template).read()}, open(f"{d}/tokenizer_config.json", "w"))
with open(f"{t}/strings.jsonl", "w") as s, open(f"{t}/messages.jsonl", "w") as m:
    for _ in range(10):
        p, c, r = sentence(2, 6), sentence(1, 5), sentence(1, 5)
        s.write(json.dumps({"prompt": p, "chosen": " " + c, "rejected": " " + r}) + "\n")
        m.write(json.dumps({"prompt": [{"role": "user", "content": p}],
                            "chosen": [{"role": "assistant", "content": c}],
                            "rejected": [{"role": "assistant", "content": r}]}) + "\n")
print(tok.get_vocab_size())
EOF
vocab=$(tail -1 "$tmp/out.txt")
for form in strings messages; do
  run_rc 0 "$ft" tokenize --tokenizer "$tmp/tok" --format preference \
    --input "$tmp/$form.jsonl" --output "$tmp/data_$form"
done

# ---- 1. ft against the float64 reference; the runs TRL checks ----------------------------------
runs=("strings sigmoid" "messages sigmoid" "strings ipo" "strings hinge")
run_rc 0 /usr/bin/python3 - "$tmp" "$src" "$ft" "$vocab" "${runs[@]}" <<'EOF'
import json, math, os, subprocess, sys
import h5py, torch
t, src, ft, vocab = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, f"{src}/tests/ref")
import llama_ref as ref
from dpo_ref import reference_run, rows_of_sequences
torch.set_num_threads(2)
T, steps = 128, 3  # the Qwen2.5 template's default system prompt: ~100 tokens here
cfg = ref.Config(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=vocab,
                 max_seq_len=T)
ref.save_hf_folder(ref.Llama(cfg, seed=4, std=0.08), f"{t}/hf")
failed = []
for run in sys.argv[5:]:
    form, kind = run.split()
    name = f"{form}_{kind}"
    r = f"{t}/{name}.yaml"
    open(r, "w").write(f"""run: {{output_dir: {t}/{name}, seed: 1}}
model: {{from: {t}/hf}}
tokenizer: {{path: {t}/tok}}
data: {{train: {t}/data_{form}, seq_len: {T}, shuffle: false}}
training: {{objective: dpo, steps: {steps}, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0}}
dpo: {{beta: 0.5, loss: {kind}}}
optimizer: {{lr: 0.01, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}}
scheduler: {{name: constant}}
checkpoint: {{every_steps: 1, keep_last: 3}}
runtime: {{threads: 2}}
""")
    subprocess.run([ft, "train", r], check=True, capture_output=True)
    lines = {l["step"]: l for l in map(json.loads, open(f"{t}/{name}/metrics.jsonl")) if "loss" in l}
    # The pairs as ft tokenize wrote them, in shard and pair order.
    pairs = []
    for f in sorted(os.listdir(f"{t}/data_{form}")):
        with h5py.File(f"{t}/data_{form}/{f}") as h:
            tok, off, msk = h["tokens"][:].tolist(), h["doc_offsets"][:].tolist() + [None], h["loss_mask"][:].tolist()
            seqs = [(tok[off[i]:off[i + 1]], msk[off[i]:off[i + 1]]) for i in range(len(off) - 1)]
            pairs += [seqs[i:i + 2] for i in range(0, len(seqs), 2)]
    kept = [rows_of_sequences(p, T) for p in pairs]
    assert all(k is not None for k in kept) and len(kept) == 10, name
    want, _ = reference_run(ref.Llama(cfg, seed=4, std=0.08), kept, [], steps, kind, 0.5, 0.0)
    for s, (loss, norm, m, _) in enumerate(want, start=1):
        got = lines[s]
        ok = (abs(got["loss"] - loss) <= 1e-5 * abs(loss) and
              abs(got["grad_norm"] - norm) <= 1e-4 * norm)
        print(f"{'ok  ' if ok else 'FAIL'} {name} step {s}: loss ft {got['loss']:.8f} float64 "
              f"{loss:.8f}, grad_norm ft {got['grad_norm']:.6f} float64 {norm:.6f}")
        if not ok:
            failed.append((name, s))
    if abs(lines[1]["loss"] - math.log(2)) > 1e-12 and kind == "sigmoid":
        failed.append((name, "step 1 not ln 2"))
    # Step 2's batch for TRL: pairs 4..7, their sequences as ft's rows hold them.
    json.dump({"pairs": [pairs[i] for i in range(4, 8)], "step2": lines[2]},
              open(f"{t}/{name}.batch.json", "w"))
sys.exit(1 if failed else 0)
EOF
cat "$tmp/out.txt"
for run in "${runs[@]}"; do
  name=${run/ /_}
  run_rc 0 "$ft" export "$tmp/$name/checkpoints/step_00000001" --output "$tmp/$name.policy"
done

# ---- 2. TRL's loss on ft's step-2 batch ----------------------------------------------------------
run_rc 0 "$PY" - "$tmp" "${runs[@]}" <<'EOF'
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer
t = sys.argv[1]
torch.set_num_threads(2)
tokenizer = PreTrainedTokenizerFast.from_pretrained(f"{t}/tok")
dummy = Dataset.from_list([{"prompt": "hello", "chosen": " good", "rejected": " bad"}] * 4)
failed = []
for run in sys.argv[2:]:
    form, kind = run.split()
    name = f"{form}_{kind}"
    batch = json.load(open(f"{t}/{name}.batch.json"))
    policy = AutoModelForCausalLM.from_pretrained(f"{t}/{name}.policy", dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(f"{t}/hf", dtype=torch.float32)
    args = DPOConfig(output_dir=f"{t}/trl_{name}", beta=0.5, loss_type=[kind], report_to="none",
                     per_device_train_batch_size=4, use_cpu=True, bf16=False, fp16=False)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=dummy,
                         processing_class=tokenizer)
    # TRL's batch: every chosen sequence, then every rejected one, right-padded; the completion
    # mask is ft's loss_mask (what counts), the attention mask the real tokens.
    seqs = [p[0] for p in batch["pairs"]] + [p[1] for p in batch["pairs"]]
    L = max(len(s[0]) for s in seqs)
    ids = torch.tensor([s[0] + [0] * (L - len(s[0])) for s in seqs])
    att = torch.tensor([[1] * len(s[0]) + [0] * (L - len(s[0])) for s in seqs])
    cm = torch.tensor([s[1] + [0] * (L - len(s[1])) for s in seqs])
    trainer.model.train()
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, {"input_ids": ids, "attention_mask": att,
                                                     "completion_mask": cm}, False).item()
    m = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    got = batch["step2"]
    checks = [("loss", got["loss"], loss, 1e-5),
              ("rewards_chosen", got["rewards_chosen"], m["rewards/chosen"], 1e-4),
              ("rewards_rejected", got["rewards_rejected"], m["rewards/rejected"], 1e-4),
              ("reward_accuracy", got["reward_accuracy"], m["rewards/accuracies"], 0)]
    for what, a, b, tol in checks:
        ok = abs(a - b) <= tol * max(abs(b), 1e-2)
        print(f"{'ok  ' if ok else 'FAIL'} {name} step 2 {what}: ft {a:.8f} TRL {b:.8f}")
        if not ok:
            failed.append((name, what))
sys.exit(1 if failed else 0)
EOF
cat "$tmp/out.txt"
echo "PASS"
