#!/usr/bin/env python3
"""`ft generate` on a GPU against transformers' generate on the same GPU (gpu_check.py's
`generate` stage; issue 18 point 5 on real hardware).

    python3 scripts/gpu_generate_parity.py --ft FT --work DIR [--device cuda]

Uses the GPU image's PyTorch, transformers and tokenizers (nothing downloaded):
1. A byte-level BPE tokenizer trained here (`tokenizers`), saved as tokenizer.json.
2. Random fp32 models (dim 64, 2 layers, 4 heads / 2 kv heads) of each class the installed
   transformers has among LlamaForCausalLM, Qwen2ForCausalLM (tied, biases off zero),
   MistralForCausalLM and Qwen3ForCausalLM (head_dim 32, q/k norms off one), saved with
   save_pretrained beside the tokenizer.
3. Greedy, 32 new tokens, EOS ignored: `ft generate --json --device cuda` (fp32) ids equal
   model.generate(do_sample=False) on the GPU (fp32, TF32 off) token for token; the prompt ids
   equal the tokenizer's.
4. Speed, reported and not checked: a ~0.5B random Llama (dim 1024, 16 layers, vocabulary
   32000) in bf16, 128 new tokens after a 16-token prompt: ft's tokens/s (its stderr line) and
   transformers' (wall clock around generate, after a warm-up call), one sequence each.
Prints one line per check ("ok: ..." / "FAIL: ...") and a last line "generate_parity: N of M
checks held"; exit 0 when all held, 1 otherwise, 77 when PyTorch, transformers or a GPU is
missing.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "ref"))
from tiny_bpe import train_tiny_bpe  # noqa: E402

PROMPT = "the fox said hello to the world"
N = 32


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ft", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda", help="cpu tries the script out without a GPU")
    ap.add_argument("--speed-layers", type=int, default=16,
                    help="layers of the speed model (fewer for a try-out on the CPU)")
    a = ap.parse_args()
    try:
        import torch
        import transformers
        import tokenizers  # noqa: F401
    except ImportError as e:
        print(f"no GPU: PyTorch, transformers or tokenizers missing ({e})")
        return 77
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is false")
        return 77
    if torch.__version__.startswith("1."):
        # Debian's torch 1.13 (a try-out here) cannot import torch.distributed.fsdp under
        # Python 3.11, which generate() asks about; it wraps nothing here.
        import transformers.generation.utils as gen_utils
        gen_utils.is_fsdp_managed_module = lambda module: False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.work, exist_ok=True)
    results = []

    def check(ok, what):
        results.append(ok)
        print(("ok: " if ok else "FAIL: ") + what, flush=True)

    def ft_generate(folder, *args):
        r = subprocess.run([a.ft, "generate", folder, "-p", PROMPT, "--device", dev, *args],
                           capture_output=True)
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8",
                                                                                  "replace")

    # 1. The tokenizer.
    tok = train_tiny_bpe(["<|endoftext|>"])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    prompt_ids = tok.encode(PROMPT).ids

    def save(m, name):
        folder = os.path.join(a.work, name)
        m.save_pretrained(folder, safe_serialization=True)
        tok.save(os.path.join(folder, "tokenizer.json"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": "<|endoftext|>"},
                  open(os.path.join(folder, "tokenizer_config.json"), "w"))
        return folder

    def hf_generate(m, ids, n):
        x = torch.tensor([ids], device=dev)
        with torch.no_grad():
            out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        return out[0, len(ids):].tolist()

    # 2-3. Greedy parity per class.
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.1,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    classes = [("llama", "LlamaForCausalLM", "LlamaConfig", {}),
               ("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
                dict(tie_word_embeddings=True, use_sliding_window=False)),
               ("mistral", "MistralForCausalLM", "MistralConfig",
                dict(sliding_window=None, head_dim=32)),
               ("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
                dict(head_dim=32, use_sliding_window=False, attention_bias=False))]
    for seed, (arch, cls, cfg, extra) in enumerate(classes):
        if not hasattr(transformers, cls):
            print(f"skip: {arch}: transformers {transformers.__version__} has no {cls}")
            continue
        torch.manual_seed(seed + 1)
        m = getattr(transformers, cls)(getattr(transformers, cfg)(**common, **extra)).float()
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith(".bias") or name.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn(p.shape))
        folder = save(m, arch)
        m = m.to(dev).eval()
        rc, out, err = ft_generate(folder, "-n", str(N), "--json", "--ignore-eos")
        if rc:
            check(False, f"{arch}: ft generate exit {rc}: {err.strip()[-400:]}")
            continue
        got = json.loads(out)
        check(got["prompt_ids"] == prompt_ids, f"{arch}: prompt ids are the tokenizer's")
        want = hf_generate(m, got["prompt_ids"], N)
        check(got["ids"] == want, f"{arch}: greedy {N} tokens, fp32 on {dev}, equal "
              f"transformers {transformers.__version__}'s generate on {dev}"
              + ("" if got["ids"] == want else f"\n  ft   {got['ids']}\n  want {want}"))

    # 4. Speed (not checked).
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=a.speed_layers, num_attention_heads=16,
                                   num_key_value_heads=4, max_position_embeddings=512,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    folder = os.path.join(a.work, "speed")
    m.save_pretrained(folder, safe_serialization=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    m = m.to(dev).eval()
    n_speed = 128
    rc, out, err = ft_generate(folder, "-n", str(n_speed), "--dtype", "bf16", "--ignore-eos")
    speed = re.search(r"([\d.]+) tokens/s", err)
    ids = prompt_ids * 2
    hf_generate(m, ids, 8)  # warm-up
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.time()
    hf_generate(m, ids, n_speed)
    if dev == "cuda":
        torch.cuda.synchronize()
    hf_tps = n_speed / (time.time() - t0)
    print(f"speed: Llama dim 1024, {a.speed_layers} layers, vocabulary 32000, bf16, {n_speed} new tokens, one sequence: "
          f"ft generate {speed.group(1) if speed else '?'} tokens/s (exit {rc}"
          f"{'' if speed else ': ' + err.strip()[-200:]}), transformers generate "
          f"{hf_tps:.1f} tokens/s", flush=True)
    print(f"generate_parity: {sum(results)} of {len(results)} checks held")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
