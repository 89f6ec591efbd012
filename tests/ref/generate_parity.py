"""`ft generate` against transformers' generate; run by tests/cli/test_generate.sh under its
transformers 4.46.3 venv (Debian's torch 1.13):
    PYTHON tests/ref/generate_parity.py BUILD_DIR SOURCE_DIR TMP_DIR
With FT_QWEN3_TRANSFORMERS=1 (tests/cli/test_qwen3_transformers.sh, torch 2 from PyPI and
transformers 5) only qwen3 runs (sections 1 to 3), built by transformers' Qwen3ForCausalLM and
compared with its generate and with llama_ref's greedy loop on the same weights.

1. A byte-level BPE tokenizer trained here (`tokenizers`, no download) with the Qwen2.5 chat
   template (tests/data/chat_templates) in tokenizer_config.json, <|endoftext|> as eos_token.
2. Random fp32 models (dim 64, 2 layers, 4 heads / 2 kv heads, the tokenizer's vocabulary):
   llama, qwen2 (tied, biases moved off zero) and mistral built by transformers and saved with
   save_pretrained; qwen3 written by llama_ref (transformers 4.46 has no Qwen3), whose
   reference is llama_ref's forward run greedily on the whole sequence each step (no cache),
   or with FT_QWEN3_TRANSFORMERS=1 built by Qwen3ForCausalLM; its vocabulary is padded 64 ids
   past the tokenizer's, and the ids there have no text.
   No eos_token_id in their configs: the parity runs are 32 tokens long.
3. Greedy, 32 new tokens: `ft generate --json` ids equal model.generate(do_sample=False)'s
   token for token, on the CPU and (when built) on ft_emu, the emulated CUDA device.
4. EOS: a copy of the llama folder whose generation_config.json names the 6th generated token
   as eos_token_id stops there (the token included), as transformers does.
5. --chat (its prompt ids, written to chat_prompt_ids.json, are compared with transformers 5's
   apply_chat_template(add_generation_prompt=True) by test_generate.sh); with the lm_head row
   of <|im_end|> set to 1.01 times the row of a token chosen at step 3 or later, generation
   stops at <|im_end|> (stop "end_of_turn"), after more than one token, exactly where
   transformers' generate with that eos does.
6. Sampling: the same --seed gives the same ids, another seed others; --temperature 0 is greedy.
7. A checkpoint of a 2-step `ft train` (model.from the llama folder) as the source: its ids equal
   transformers' generate on the checkpoint's `ft export`.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

BUILD, SRC, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
import llama_ref as ref  # noqa: E402
from tiny_bpe import train_tiny_bpe  # noqa: E402

FT = os.path.join(BUILD, "ft")
EMU = os.path.join(BUILD, "tests", "cuda_emu", "ft_emu")
failures = []
PROMPT = "the fox said hello to the world"
N = 32
QWEN3_TF = os.environ.get("FT_QWEN3_TRANSFORMERS") == "1"


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def ft(*args, exe=FT, want=0):
    # stdout as bytes: a random model's text need not be valid UTF-8 (ft prints the bytes).
    r = subprocess.run([exe, "generate", *args], capture_output=True)
    r.stdout, r.stderr = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    if r.returncode != want:
        sys.exit(f"ft generate {' '.join(args)} exited {r.returncode}, expected {want}\n"
                 f"{r.stdout}\n{r.stderr}")
    return r


def ft_json(*args, exe=FT):
    return json.loads(ft(*args, "--json", exe=exe).stdout)


def make_tokenizer():
    tok = train_tiny_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    d = os.path.join(TMP, "tok")
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    template = open(os.path.join(SRC, "tests/data/chat_templates/qwen2_5_instruct.jinja")).read()
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
               "eos_token": "<|endoftext|>", "chat_template": template,
               "model_max_length": 1 << 20}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return d, tok.get_vocab_size(with_added_tokens=True)


def add_tokenizer(folder, tok_dir):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), folder)


def build(arch, vocab, tok_dir, seed):
    """(folder, transformers model or None, llama_ref model or None)"""
    folder = os.path.join(TMP, arch)
    # qwen3's vocabulary padded past the tokenizer's by 64 rows, as Qwen's are.
    qwen3_cfg = ref.Config(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                           vocab_size=vocab + 64,
                           max_seq_len=128, norm_eps=1e-6, arch="qwen3", head_dim=32)
    if arch == "qwen3" and not QWEN3_TF:
        model = ref.Llama(qwen3_cfg, seed=seed, std=0.1)
        ref.save_hf_folder(model, folder)
        add_tokenizer(folder, tok_dir)
        return folder, None, model
    import transformers
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.1,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **common, tie_word_embeddings=True, use_sliding_window=False))
    elif arch == "qwen3":
        m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            **dict(common, vocab_size=vocab + 64), head_dim=32, use_sliding_window=False,
            sliding_window=None, attention_bias=False))
    else:
        m = transformers.MistralForCausalLM(transformers.MistralConfig(
            **common, sliding_window=None, head_dim=32))
    torch.manual_seed(seed)
    m = type(m)(m.config).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias") or name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape))
    m.save_pretrained(folder, safe_serialization=True)
    add_tokenizer(folder, tok_dir)
    if arch != "qwen3":
        return folder, m, None
    # llama_ref on the same weights, a second reference.
    mirror = ref.Llama(qwen3_cfg)
    for k, v in ref.read_safetensors(os.path.join(folder, "model.safetensors")).items():
        mirror.p[k].data.copy_(v)
    return folder, m, mirror


def hf_generate(model, prompt_ids, eos=None, n=N):
    # generate() asks whether FSDP wraps the model, importing torch.distributed.fsdp, which
    # Debian's torch 1.13 cannot import under Python 3.11 (a dataclass error): it does not.
    import transformers.generation.utils as gen_utils
    gen_utils.is_fsdp_managed_module = lambda module: False
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def ref_generate(model, prompt_ids, n=N):
    seq = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model.forward(torch.tensor([seq]))
            seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt_ids):]


def main():
    torch.set_num_threads(2)
    tok_dir, vocab = make_tokenizer()
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    emu = os.path.exists(EMU)
    models = {}
    for seed, arch in enumerate(["llama", "qwen2", "mistral", "qwen3"]):
        if QWEN3_TF and arch != "qwen3":
            continue
        folder, m, r = build(arch, vocab, tok_dir, seed + 1)
        models[arch] = (folder, m)
        got = ft_json(folder, "-p", PROMPT, "-n", str(N), "--device", "cpu", "--ignore-eos")
        check(got["prompt_ids"] == hf_tok(PROMPT)["input_ids"],
              f"{arch}: prompt ids are the tokenizer's")
        want = hf_generate(m, got["prompt_ids"]) if m is not None else \
            ref_generate(r, got["prompt_ids"])
        against = "transformers' generate" if m is not None else "llama_ref, greedy without cache"
        check(len(want) == N and got["ids"] == want and got["stop"] == "length",
              f"{arch}: greedy {N} tokens on the CPU equal {against}"
              + ("" if got["ids"] == want else f"\n  ft   {got['ids']}\n  want {want}"))
        if emu:
            e = ft_json(folder, "-p", PROMPT, "-n", str(N), "--device", "cuda", "--ignore-eos",
                        exe=EMU)
            check(e["ids"] == want, f"{arch}: greedy {N} tokens on ft_emu (emulated CUDA) equal "
                  f"{against}" + ("" if e["ids"] == want else f"\n  emu  {e['ids']}"))
        if m is not None and r is not None:
            also = ref_generate(r, got["prompt_ids"])
            check(also == want, f"{arch}: llama_ref's greedy loop on the same weights equals "
                  f"{against}" + ("" if also == want else f"\n  ref  {also}"))
        if arch == "llama":
            llama_ids = got["ids"]
        if arch == "qwen3" and not QWEN3_TF:  # (transformers' init seldom picks those ids)
            past = [i for i in got["ids"] if i >= vocab]
            plain = ft(folder, "-p", PROMPT, "-n", str(N), "--device", "cpu", "--ignore-eos")
            check(past and plain.stdout == hf_tok.decode([i for i in got["ids"] if i < vocab]) +
                  "\n" and f"{len(past)} generated ids past the tokenizer's vocabulary" in
                  plain.stderr, f"qwen3 (vocabulary padded by 64): {len(past)} ids past the "
                  "tokenizer's have no text")

    if QWEN3_TF:  # the rest (llama's) runs under test_generate.sh
        return finish()

    # 4. EOS from generation_config.json: the first token at index >= 5 not seen before it.
    folder, m = models["llama"]
    k = next(i for i in range(5, N) if llama_ids[i] not in llama_ids[:i])
    eos_dir = os.path.join(TMP, "llama_eos")
    shutil.copytree(folder, eos_dir)
    json.dump({"eos_token_id": llama_ids[k]}, open(os.path.join(eos_dir, "generation_config.json"), "w"))
    got = ft_json(eos_dir, "-p", PROMPT, "-n", str(N), "--device", "cpu")
    want = hf_generate(m, got["prompt_ids"], eos=llama_ids[k])
    check(got["ids"] == llama_ids[:k + 1] == want and got["stop"] == "eos",
          f"EOS: stops at generation_config.json's eos_token_id after {k + 1} tokens, as "
          "transformers")
    plain = ft(eos_dir, "-p", PROMPT, "-n", str(N), "--device", "cpu")
    check(plain.stdout == hf_tok.decode(llama_ids[:k]) + "\n" and "stopped: eos" in plain.stderr,
          "EOS: the text printed is the tokens before the EOS")

    # 5. --chat
    # (transformers 4.46 renders templates with jinja2, which this venv lacks: test_generate.sh
    # compares these ids with apply_chat_template's under transformers 5.)
    got = ft_json(folder, "-p", PROMPT, "--chat", "-n", str(N), "--device", "cpu", "--ignore-eos")
    chat_prompt = got["prompt_ids"]
    json.dump({"prompt": PROMPT, "ids": chat_prompt},
              open(os.path.join(TMP, "chat_prompt_ids.json"), "w"))
    im_end = hf_tok.convert_tokens_to_ids("<|im_end|>")
    turn_dir = os.path.join(TMP, "llama_turn")
    tm = type(m)(m.config).float().eval()
    tm.load_state_dict(m.state_dict())
    # The first token chosen at step 3 or later that was not chosen before: <|im_end|> takes its
    # row, 1% larger, so it wins where that token would (and, rarely, where it nearly would).
    k = next(i for i in range(3, N) if got["ids"][i] not in got["ids"][:i])
    with torch.no_grad():
        tm.lm_head.weight[im_end] = 1.01 * tm.lm_head.weight[got["ids"][k]]
    tm.save_pretrained(turn_dir, safe_serialization=True)
    add_tokenizer(turn_dir, tok_dir)
    got = ft_json(turn_dir, "-p", PROMPT, "--chat", "-n", str(N), "--device", "cpu")
    want = hf_generate(tm, chat_prompt, eos=im_end)
    check(got["ids"] == want and got["ids"][-1] == im_end and got["stop"] == "end_of_turn"
          and 2 <= len(want) <= k + 1, f"--chat: stops at the template's end of turn <|im_end|> after "
          f"{len(got['ids'])} tokens, as transformers' generate")

    # 6. sampling
    s = ["-p", PROMPT, "-n", str(N), "--device", "cpu", "--ignore-eos", "--temperature", "1.5",
         "--top-p", "0.95"]
    a, b = ft_json(folder, *s, "--seed", "7"), ft_json(folder, *s, "--seed", "7")
    c = ft_json(folder, *s, "--seed", "8")
    check(a["ids"] == b["ids"] and a["text"] == b["text"], "sampling: the same seed, the same text")
    check(a["ids"] != c["ids"], "sampling: another seed, other tokens")
    check(a["ids"] != llama_ids, "sampling: not the greedy tokens")
    g = ft_json(folder, "-p", PROMPT, "-n", str(N), "--device", "cpu", "--ignore-eos",
                "--temperature", "0", "--seed", "9")
    check(g["ids"] == llama_ids, "--temperature 0 is greedy whatever the seed")

    # 7. a checkpoint of ft train
    open(os.path.join(TMP, "train.txt"), "w").write(
        "\n\n".join(f"the fox said hello {i} to the world" for i in range(200)))
    subprocess.run([FT, "tokenize", "--tokenizer", tok_dir, "--input",
                    os.path.join(TMP, "train.txt"), "--output", os.path.join(TMP, "shards")],
                   check=True, capture_output=True)
    recipe = os.path.join(TMP, "r.yaml")
    open(recipe, "w").write(f"""run: {{name: g, output_dir: {TMP}/run, seed: 0}}
model: {{from: {folder}}}
tokenizer: {{path: {tok_dir}/tokenizer.json}}
data: {{train: {TMP}/shards, seq_len: 16}}
training: {{steps: 2, micro_batch_size: 2, global_batch_size: 2}}
optimizer: {{name: adamw, lr: 5.0e-2}}
checkpoint: {{every_steps: 2}}
runtime: {{device: cpu, threads: 2}}
""")
    r = subprocess.run([FT, "train", recipe], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ft train failed\n{r.stdout}\n{r.stderr}")
    ckpt = os.path.join(TMP, "run", "checkpoints")
    got = ft_json(ckpt, "-p", PROMPT, "-n", str(N), "--device", "cpu", "--ignore-eos")
    subprocess.run([FT, "export", ckpt, "-o", os.path.join(TMP, "export")], check=True,
                   capture_output=True)
    import transformers
    em = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(TMP, "export")).float()
    want = hf_generate(em.eval(), got["prompt_ids"])
    check(got["ids"] == want and got["ids"] != llama_ids,
          "checkpoint: ids equal transformers' generate on its export (and differ from the "
          "untrained model's)")

    finish()


def finish():
    if failures:
        print(f"{len(failures)} failed", file=sys.stderr)
        sys.exit(1)
    print("generate_parity: all checks passed")


if __name__ == "__main__":
    main()
