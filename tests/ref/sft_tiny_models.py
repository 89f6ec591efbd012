"""The tiny twins of recipes/sft_qwen.yaml and recipes/sft_llama3.yaml's model folders, made
here (no download); run by tests/cli/test_sft_recipes.sh under its transformers 4.46.3 venv:
    PYTHON tests/ref/sft_tiny_models.py SOURCE_DIR TMP_DIR

For each family, TMP_DIR/<family>/ gets what a user's Hugging Face folder holds:
  - tokenizer.json: a byte-level BPE tokenizer trained here with `tokenizers` on the words of the
    conversations, with the family's special tokens (Qwen2's pre-tokenizer pattern for both);
    the llama one has Llama 3's TemplateProcessing post-processor (<|begin_of_text|> before
    each text), the qwen one none, as the real files;
  - tokenizer_config.json: bos/eos as the family has them and its chat template (Qwen2.5
    Instruct's, Llama 3.1 Instruct's, committed in tests/data/chat_templates);
  - config.json + model.safetensors: random fp32 weights (dim 128, 2 layers, 2 heads of 64, 1
    kv head) by transformers: Qwen2ForCausalLM with tied embeddings (as Qwen2.5 0.5B-3B),
    LlamaForCausalLM with Llama 3.1's `llama3` RoPE scaling.
And TMP_DIR/train.jsonl, TMP_DIR/valid.jsonl: short conversations ({"messages": ...}) with a
fixed pattern a tiny model can learn in a few steps (system prompts in some, two turns in
some, one in ShareGPT form).
"""

import json
import os
import random
import sys

SRC, TMP = sys.argv[1], sys.argv[2]
rng = random.Random(0)

# ---- the conversations --------------------------------------------------------------------
countries = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
             ("Egypt", "Cairo"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Kenya", "Nairobi")]
colours = ["red", "green", "blue", "yellow"]


def conversation(i):
    country, capital = countries[i % len(countries)]
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": "You are a brief geography assistant."})
    msgs += [{"role": "user", "content": f"What is the capital of {country}?"},
             {"role": "assistant", "content": f"The capital of {country} is {capital}."}]
    if i % 2 == 0:
        c = colours[i % len(colours)]
        msgs += [{"role": "user", "content": f"Say {c} twice."},
                 {"role": "assistant", "content": f"{c} {c}"}]
    return msgs


def write_jsonl(path, convs):
    with open(path, "w") as f:
        for n, msgs in enumerate(convs):
            if n == 1:  # ShareGPT form, which ft tokenize --format chat also reads
                sharegpt = {"system": "system", "user": "human", "assistant": "gpt"}
                rec = {"conversations": [{"from": sharegpt[m["role"]], "value": m["content"]}
                                         for m in msgs]}
            else:
                rec = {"messages": msgs}
            f.write(json.dumps(rec) + "\n")


write_jsonl(os.path.join(TMP, "train.jsonl"), [conversation(i) for i in range(48)])
write_jsonl(os.path.join(TMP, "valid.jsonl"), [conversation(i) for i in range(48, 64)])

# ---- the tokenizers -----------------------------------------------------------------------
from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers,  # noqa: E402
                        processors, trainers)

corpus = [m["content"] for i in range(64) for m in conversation(i)]
corpus += ["system user assistant tool Cutting Knowledge Date December 2023 Today July 2024",
           "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."]
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
families = {
    # name: (template file, bos_token, eos_token, special tokens, BOS added to texts)
    "qwen": ("qwen2_5_instruct.jinja", None, "<|im_end|>",
             ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False),
    "llama": ("llama3_1_instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
              ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], True),
}
vocab = {}
for name, (template, bos, eos, special, add_bos) in families.items():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, show_progress=False, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if add_bos:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    d = os.path.join(TMP, name)
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    text = open(os.path.join(SRC, "tests/data/chat_templates", template), encoding="utf-8").read()
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
               "chat_template": text, "model_max_length": 256},
              open(os.path.join(d, "tokenizer_config.json"), "w"), indent=1)
    vocab[name] = tok.get_vocab_size(with_added_tokens=True)

# ---- the models ---------------------------------------------------------------------------
import torch  # noqa: E402
import transformers  # noqa: E402

# Head dim 64 (128 / 2 heads), as Qwen2.5-0.5B's: on a GPU, packing runs in the fused attention
# kernel, which takes head dim 64 or 128 (DESIGN.md §6 Packing), so the twins run there too.
common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
              rms_norm_eps=1e-6, initializer_range=0.02)
torch.manual_seed(0)
qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
    **common, vocab_size=vocab["qwen"], rope_theta=1000000.0, tie_word_embeddings=True,
    use_sliding_window=False, bos_token_id=None, eos_token_id=None))
llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    **common, vocab_size=vocab["llama"], rope_theta=500000.0, tie_word_embeddings=False,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    bos_token_id=None, eos_token_id=None))
for name, m in (("qwen", qwen), ("llama", llama)):
    m.float().save_pretrained(os.path.join(TMP, name), safe_serialization=True)
print("sft_tiny_models: wrote", ", ".join(f"{n} (vocab {v})" for n, v in vocab.items()))
