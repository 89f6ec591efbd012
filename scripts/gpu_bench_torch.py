"""PyTorch on the GPU, the comparison of scripts/gpu_check.py's bench stages: a Llama shape
(by default the ~1B one: dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 5632, vocab 32000, seq
2048; --shape takes another as JSON, --seq and --micro-batch the batch) trained with what a
PyTorch user runs: transformers' LlamaForCausalLM with sdpa attention (or, without
transformers, tests/ref/llama_ref.py with F.scaled_dot_product_attention), fp32 parameters,
torch.autocast bf16, fused AdamW, clipping at 1.0; --compile wraps the model in torch.compile
(default mode; its compilation happens in the warmup steps, which are not timed). Prints one
JSON line: tokens/s (median step after warmup), peak allocated bytes, model name.

--lora R trains a LoRA adapter as a PEFT user does (gpu_check.py's lora_8b stage): the model
built in bf16 (what from_pretrained(torch_dtype=torch.bfloat16) gives), wrapped by PEFT's
get_peft_model with LoraConfig(r=R, lora_alpha=2R, lora_dropout=0, the seven projections),
which makes the adapter's A and B fp32 (autocast_adapter_dtype); autocast bf16, fused AdamW and
clipping on the trainable parameters only. --ac turns on transformers' gradient checkpointing
(use_reentrant=False, enable_input_require_grads, as PEFT's examples do). The GPU image has no
PEFT and no network: --wheels DIR names a folder of wheels (scripts/peft_wheels.sh fetches
them into build/wheels) that fill in what the image lacks, unpacked with zipfile (no pip
needed). When PEFT (or transformers) cannot be imported the JSON line is {"skip": why} and the
exit code 77. --device cpu tries the code out on the CPU (tiny shapes; the figures mean
nothing there, peak_bytes is null).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile

SHAPE = dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=5632, vocab_size=32000)
# PEFT's names of the seven linear layers of a Llama block (its "all-linear" less lm_head).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Skip(Exception):
    """What this run needs is not importable here: the JSON line says why, exit 77."""


def wheel_version(name):
    """(0, 21, 2) from "peft-0.21.2-py3-none-any.whl"; () when the name has no plain version."""
    try:
        return tuple(int(x) for x in name.split("-")[1].split("."))
    except (IndexError, ValueError):
        return ()


def use_wheels(folder):
    """Makes PEFT importable from the wheels in `folder` where the image has none. Each wheel
    (a zip of its site-packages files) is unpacked into a folder of its own under /tmp. The
    others (accelerate, psutil) go at the end of sys.path, so the image's own copies win; the
    PEFT wheels are tried newest first (a newer PEFT may need a newer transformers than the
    image's, an older one may not run on a newer transformers) until one imports. Returns a
    note naming what was used; raises Skip with every import error when none imports."""
    try:
        import peft  # noqa: F401  (the image's own)
        return f"the image's peft {peft.__version__}"
    except ImportError as e:
        first = f"the image's: {e}"
    wheels = sorted(f for f in os.listdir(folder) if f.endswith(".whl")) \
        if folder and os.path.isdir(folder) else []
    if not wheels:
        raise Skip(f"peft is not installed and no wheels were found in {folder!r} "
                   "(scripts/peft_wheels.sh fetches them; carry build/wheels)")
    root = tempfile.mkdtemp(prefix="ft_wheels.")
    pefts = []
    for w in wheels:
        path = os.path.join(root, w[:-4])
        with zipfile.ZipFile(os.path.join(folder, w)) as z:
            z.extractall(path)
        if w.startswith("peft-"):
            pefts.append((wheel_version(w), w, path))
        else:
            sys.path.append(path)
    errors = [first]
    for _, w, path in sorted(pefts, reverse=True):
        sys.path.insert(0, path)
        try:
            import peft
            from peft import LoraConfig, get_peft_model  # noqa: F401
            return f"peft {peft.__version__} from {w}"
        except Exception as e:  # an incompatible transformers raises more than ImportError
            errors.append(f"{w}: {type(e).__name__}: {e}"[:300])
            sys.path.remove(path)
            for m in [m for m in sys.modules if m == "peft" or m.startswith("peft.")]:
                del sys.modules[m]
    raise Skip("no PEFT could be imported: " + " | ".join(errors))


def build(T, shape, device, compile=False):
    import torch
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
                          num_attention_heads=shape["n_heads"],
                          num_key_value_heads=shape["n_kv_heads"],
                          intermediate_size=shape["ffn_dim"], vocab_size=shape["vocab_size"],
                          max_position_embeddings=T, attn_implementation="sdpa",
                          tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg).to(device)
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
        torch.set_default_device(device)
        model = ref.Llama(ref.Config(**shape, max_seq_len=T), seed=0, std=0.02)
        model.sdpa = True
        params = list(model.named().values())

        def loss_fn(ids, targets):
            mask = torch.ones(ids.shape, device=device)
            return model.loss_sum(ids, targets, mask) / ids.numel()
        if compile:
            loss_fn = torch.compile(loss_fn)
        return "tests/ref/llama_ref.py (sdpa; transformers not installed)", params, loss_fn


def build_lora(T, shape, device, r, ac, wheels):
    """transformers' Llama in bf16 on `device` with PEFT's LoRA on the seven projections;
    returns (name, trainable parameters, loss function, facts for the JSON line)."""
    import torch
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise Skip(f"--lora needs transformers: {e}")
    how = use_wheels(wheels)
    from peft import LoraConfig, get_peft_model
    cfg = LlamaConfig(hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
                      num_attention_heads=shape["n_heads"],
                      num_key_value_heads=shape["n_kv_heads"],
                      intermediate_size=shape["ffn_dim"], vocab_size=shape["vocab_size"],
                      max_position_embeddings=T, attn_implementation="sdpa",
                      tie_word_embeddings=False, use_cache=False)
    # Built in bf16 on the device (random weights): the layout from_pretrained(torch_dtype=
    # torch.bfloat16) loads, without drawing 8B-class weights in fp32 on the host first.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    if ac:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                             target_modules=LORA_TARGETS, bias="none",
                                             task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    facts = {"peft": how, "trainable_params": sum(p.numel() for p in params),
             "adapter_dtypes": sorted({str(p.dtype) for p in params}),
             "base_dtypes": sorted({str(p.dtype) for p in model.parameters()
                                    if not p.requires_grad}),
             "gradient_checkpointing": ac}

    def loss_fn(ids, targets):
        logits = model(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    name = f"PEFT LoRA r {r} alpha {2 * r} on transformers LlamaForCausalLM (sdpa, bf16 base)"
    return name, params, loss_fn, facts


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
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="train a PEFT LoRA adapter of rank R (alpha 2R, the seven "
                         "projections) on a frozen bf16 base")
    ap.add_argument("--ac", action="store_true",
                    help="gradient checkpointing (transformers' own, use_reentrant=False); "
                         "with --lora only")
    ap.add_argument("--wheels", default="",
                    help="folder of wheels (peft, accelerate, psutil) for what the image lacks")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a try-out of the code on a tiny shape; the figures mean nothing")
    a = ap.parse_args()
    if a.ac and not a.lora:
        ap.error("--ac is for --lora runs (the full fine-tuning bench runs without it)")
    if a.warmup >= a.steps:
        ap.error(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    import torch
    torch.manual_seed(0)
    facts = {}
    try:
        if a.lora:
            name, params, loss_fn, facts = build_lora(a.seq, a.shape, a.device, a.lora, a.ac,
                                                      a.wheels)
        else:
            name, params, loss_fn = build(a.seq, a.shape, a.device, a.compile)
    except Skip as e:
        print(json.dumps({"skip": str(e)}))
        return 77
    if a.compile:
        name += ", torch.compile"
    cuda = a.device == "cuda"
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=True)
    ids = torch.randint(0, a.shape["vocab_size"], (a.micro_batch, a.seq + 1), device=a.device)

    def sync():
        if cuda:
            torch.cuda.synchronize()
    times = []
    for _ in range(a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = loss_fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[a.warmup:])
    print(json.dumps({"model": name, "torch": torch.__version__, "shape": a.shape, "seq": a.seq,
                      "micro_batch": a.micro_batch,
                      "tokens_per_s": a.micro_batch * a.seq / t, "step_s": t,
                      "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                      "loss": float(loss.detach()), **facts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
