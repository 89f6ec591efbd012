"""PyTorch on the GPU, the comparison of scripts/gpu_check.py's bench stages: a Llama shape
(by default the ~1B one: dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 5632, vocab 32000, seq
2048; --shape takes another as JSON, --seq and --micro-batch the batch) trained with what a
PyTorch user runs: transformers' LlamaForCausalLM with sdpa attention (or, without
transformers, tests/ref/llama_ref.py with F.scaled_dot_product_attention), fp32 parameters,
torch.autocast bf16, fused AdamW, clipping at 1.0; --compile wraps the model in torch.compile
(default mode; its compilation happens in the warmup steps, which are not timed). Prints one
JSON line: tokens/s (median step after warmup), peak allocated bytes, model name.
"""

import argparse
import json
import os
import statistics
import sys
import time

SHAPE = dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=5632, vocab_size=32000)


def build(T, shape, compile=False):
    import torch
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
                          num_attention_heads=shape["n_heads"],
                          num_key_value_heads=shape["n_kv_heads"],
                          intermediate_size=shape["ffn_dim"], vocab_size=shape["vocab_size"],
                          max_position_embeddings=T, attn_implementation="sdpa",
                          tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg).cuda()
        fwd = torch.compile(model) if compile else model

        def loss_fn(ids, targets):
            logits = fwd(input_ids=ids).logits
            return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                     targets.flatten())
        return "transformers LlamaForCausalLM (sdpa)", list(model.parameters()), loss_fn
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests", "ref"))
        import llama_ref as ref
        torch.set_default_device("cuda")
        model = ref.Llama(ref.Config(**shape, max_seq_len=T), seed=0, std=0.02)
        model.sdpa = True
        params = list(model.named().values())

        def loss_fn(ids, targets):
            mask = torch.ones(ids.shape, device="cuda")
            return model.loss_sum(ids, targets, mask) / ids.numel()
        if compile:
            loss_fn = torch.compile(loss_fn)
        return "tests/ref/llama_ref.py (sdpa; transformers not installed)", params, loss_fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shape", type=json.loads, default=SHAPE,
                    help="the model as JSON: dim, n_layers, n_heads, n_kv_heads, ffn_dim, "
                         "vocab_size")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = ap.parse_args()
    import torch
    torch.manual_seed(0)
    name, params, loss_fn = build(a.seq, a.shape, a.compile)
    if a.compile:
        name += ", torch.compile"
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=True)
    ids = torch.randint(0, a.shape["vocab_size"], (a.micro_batch, a.seq + 1), device="cuda")
    times = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[a.warmup:])
    print(json.dumps({"model": name, "torch": torch.__version__, "shape": a.shape, "seq": a.seq,
                      "micro_batch": a.micro_batch,
                      "tokens_per_s": a.micro_batch * a.seq / t, "step_s": t,
                      "peak_bytes": torch.cuda.max_memory_allocated(),
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
