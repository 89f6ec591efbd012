"""Qwen2 (tied and untied embeddings), Qwen3 and Mistral in ft against transformers and the
PyTorch reference; run by tests/cli/test_archs.sh under its transformers 4.46.3 venv (Debian's
torch 1.13 and transformers' modeling code), and for qwen3 against transformers' own
Qwen3ForCausalLM by tests/cli/test_qwen3_transformers.sh (FT_QWEN3_TRANSFORMERS=1, in a venv with
torch 2 from PyPI and transformers 5):
    PYTHON tests/ref/arch_parity.py BUILD_DIR SOURCE_DIR TMP_DIR TF5_PYTHON
FT_ARCH_CASES=a,b runs only those cases (qwen2_tied, qwen2, qwen3, mistral; qwen3_tied only when
named).

Per architecture, on a small random model (dim 64, 2 layers, 4 heads / 2 kv heads, vocab 256;
qwen3 and mistral with head_dim 32, not dim / heads = 16, as Qwen3-0.6B and Mistral Nemo):
1. The model folder. qwen2 and mistral (and qwen3 with FT_QWEN3_TRANSFORMERS=1): built by
   transformers itself (Qwen2ForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, eager
   attention, fp32), biases and norm weights moved off their initial zeros and ones so that they
   act and their gradients matter, saved with save_pretrained; the reference for 2 and 3 is that
   transformers model, and llama_ref's forward on the same weights is checked against it first
   (logits within 1e-5 relative). qwen3 otherwise: transformers 4.46 has no Qwen3 and
   transformers >= 4.52 needs torch >= 2.1 to run a model (Debian has 1.13), so the folder is
   written by llama_ref (Qwen3Attention's math: q_norm/k_norm over each head before RoPE), the
   reference is llama_ref, and its config.json is read by transformers 5's AutoConfig as a
   Qwen3Config.
2. ft_gradcheck: the loss of one global batch (two micro-batches, a loss mask) within 1e-5
   relative and every parameter gradient within 1e-4 (max-norm relative), the bounds of
   test_llama_numerics.py. Asserted too: the loss without the biases (qwen2) or the q/k norms
   (qwen3) differs by far more than the bound, so a model that ignored them would fail.
3. `ft train`, 10 steps (AdamW with weight decay on matrices only, warmup then cosine, clipping
   active), against the reference's torch.optim.AdamW steps (test_llama_numerics.torch_step):
   step 1's loss and gradient norm within 1e-5 relative, every step within 1e-4.
4. `ft export` of the trained checkpoint: config.json names the class; transformers'
   AutoModelForCausalLM loads the folder as that class (qwen3 under transformers 4.46:
   transformers 5's AutoConfig gives a Qwen3Config, and the tensors carry Qwen3's names); the
   exported tensors are ft's trained parameters bit for bit (FT_TEST_DUMP_PARAMS), and the loaded
   model's logits (qwen3 under 4.46: llama_ref's on the export) are llama_ref's on those
   parameters within 1e-5 of the largest logit.
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402
import test_llama_numerics as num  # noqa: E402  (its BUILD and SOURCE are argv 1 and 2 here too)

TMP, TF5 = sys.argv[3], sys.argv[4]
check = num.check
SIZES = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=256,
             max_seq_len=64, norm_eps=1e-6)
CLASSES = ref.Config.CLASSES
# qwen3 built and run by transformers' Qwen3ForCausalLM (needs transformers >= 4.51 on torch >= 2).
QWEN3_TF = os.environ.get("FT_QWEN3_TRANSFORMERS") == "1"


class HfModel:
    """A transformers model with llama_ref.Llama's interface (p, named, loss_sum)."""

    def __init__(self, model):
        self.model = model
        self.p = dict(model.named_parameters())  # a tied lm_head is not listed twice

    def named(self):
        return dict(self.p)

    def logits(self, ids):
        return self.model(input_ids=ids).logits

    def loss_sum(self, ids, targets, mask):
        logits = self.logits(ids)
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        return (ce * mask.reshape(-1).float()).sum()


def ref_logits(model, ids):
    return model.forward(ids)


def build(case, arch, tie, seed):
    """The model folder and the reference model (section 1)."""
    hf = os.path.join(case, "hf")
    head_dim = 32 if arch in ("qwen3", "mistral") else None
    cfg = ref.Config(**SIZES, arch=arch, tie_embeddings=tie, head_dim=head_dim)
    if arch == "qwen3" and not QWEN3_TF:
        model = ref.Llama(cfg, seed=seed, std=0.1)
        ref.save_hf_folder(model, hf)
        return hf, model, cfg
    import transformers
    common = dict(vocab_size=SIZES["vocab_size"], hidden_size=SIZES["dim"],
                  intermediate_size=SIZES["ffn_dim"], num_hidden_layers=SIZES["n_layers"],
                  num_attention_heads=SIZES["n_heads"], num_key_value_heads=SIZES["n_kv_heads"],
                  max_position_embeddings=SIZES["max_seq_len"], rms_norm_eps=SIZES["norm_eps"],
                  rope_theta=10000.0, tie_word_embeddings=tie, initializer_range=0.1,
                  attn_implementation="eager")
    if arch == "qwen2":
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**common, head_dim=head_dim, use_sliding_window=False,
                                          sliding_window=None, attention_bias=False)
        cls = transformers.Qwen3ForCausalLM
    else:
        config = transformers.MistralConfig(**common, sliding_window=None, head_dim=head_dim)
        cls = transformers.MistralForCausalLM
    torch.manual_seed(seed)
    m = cls(config).float()
    check(m.config._attn_implementation == "eager",
          f"{arch}: {cls.__name__} runs eager attention ({m.config._attn_implementation})")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias") or name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape))
    m.save_pretrained(hf, safe_serialization=True)
    model = HfModel(m)
    # llama_ref's forward on the same weights (its qwen2 biases, its Llama math for mistral)
    mirror = ref.Llama(cfg)
    for k, v in ref.read_safetensors(os.path.join(hf, "model.safetensors")).items():
        mirror.p[k].data.copy_(v)
    ids = torch.tensor(np.random.default_rng(seed).integers(0, SIZES["vocab_size"], (2, 24)))
    with torch.no_grad():
        a, b = model.logits(ids), mirror.forward(ids)
    err = ((a - b).abs().max() / a.abs().max()).item()
    check(err <= 1e-5, f"{arch}{'_tied' if tie else ''}: llama_ref's logits against "
                       f"{cls.__name__}'s, max rel {err:.1e}")
    return hf, model, cfg


def gradcheck(label, case, hf, model, cfg, ablate):
    """Section 2. ablate: assert that the loss of a plain Llama on the same weights differs."""
    T, micro, glob = 16, 2, 4
    data, shards = num.make_data(case, "gdata", cfg.vocab_size, (glob + 1) * T + 1, 2, 7,
                                 with_mask=True)
    rpath = os.path.join(case, "grad.yaml")
    num.recipe_yaml(rpath, hf, data, T, micro, glob)
    out = os.path.join(case, "grads.safetensors")
    res = subprocess.run([num.GRADCHECK, rpath, out], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft_gradcheck failed: {res.stderr.strip()[-2000:]}")
        return
    got = ref.read_safetensors(out)
    ids, tgt, msk = num.batch_tensors(ref.samples_no_shuffle(shards, T)[:glob])
    count = msk.sum().item()
    total = 0.0
    for m in range(glob // micro):
        sl = slice(m * micro, (m + 1) * micro)
        loss = model.loss_sum(ids[sl], tgt[sl], msk[sl]) / count
        loss.backward()
        total += loss.item()
    rel = abs(got["loss"].item() - total) / abs(total)
    check(rel <= 1e-5, f"{label}: loss ft {got['loss'].item():.8f} reference {total:.8f} "
                       f"rel {rel:.2e}")
    worst, names = (0.0, ""), set(model.named())
    for name, p in model.named().items():
        if name not in got:
            check(False, f"{label}: ft did not report gradient {name}")
            continue
        err = (got[name] - p.grad).abs().max().item() / max(p.grad.abs().max().item(), 1e-30)
        worst = max(worst, (err, name))
    extra = sorted(set(got) - names - {"loss"})
    check(not extra, f"{label}: ft has no gradients the reference lacks {extra[:3]}")
    check(worst[0] <= 1e-4, f"{label}: all {len(names)} gradients within 1e-4, worst "
                            f"{worst[1]} {worst[0]:.2e}")
    if ablate:  # the same weights in a plain Llama: no biases, no q/k norms
        plain = ref.Llama(ref.Config(**SIZES, tie_embeddings=cfg.tie_embeddings,
                                     head_dim=cfg.head_dim))
        dropped = 0
        with torch.no_grad():
            for name, v in model.named().items():
                if name in plain.p:
                    plain.p[name].copy_(v)
                else:
                    dropped += 1
            alt = (plain.loss_sum(ids, tgt, msk) / count).item()
        gap = abs(alt - total) / abs(total)
        check(dropped > 0 and gap > 1e-3,
              f"{label}: as a Llama (without its {dropped} bias/q-k norm tensors) the loss "
              f"moves by {gap:.1e}, far beyond the bound")
    for p in model.p.values():
        p.grad = None


def training(label, case, hf, model, cfg):
    """Section 3; returns the run folder, or None."""
    T, micro, glob, steps = 16, 2, 4, 10
    data, shards = num.make_data(case, "data", cfg.vocab_size, 12 * T + 1, 2, 11)
    metrics = os.path.join(case, "metrics.jsonl")
    lr, wd, clip, warm, min_lr = 1e-3, 0.1, 3.3, 3, 1e-4
    optimizer = f"optimizer: {{lr: {lr}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {wd}}}"
    extra = (f"scheduler: {{name: cosine, warmup_steps: {warm}, min_lr: {min_lr}}}\n"
             f"logging: {{every_steps: 1, metrics: {metrics}}}\n"
             f"checkpoint: {{dir: {case}/ckpt, every_steps: {steps}}}\n")
    rpath = os.path.join(case, "train.yaml")
    num.recipe_yaml(rpath, hf, data, T, micro, glob, extra, optimizer)
    # FT_TEST_DUMP_PARAMS (lib/train/trainer.cpp): the parameters after the last step, which
    # section 4 holds the export to.
    os.environ["FT_TEST_DUMP_PARAMS"] = os.path.join(case, "params")
    lines = num.ft_train(label, rpath, metrics, f"training.steps={steps}",
                         f"training.grad_clip={clip}")
    del os.environ["FT_TEST_DUMP_PARAMS"]
    if lines is None:
        return None
    ft_loss = {l["step"] - 1: l["loss"] for l in lines if "loss" in l}
    ft_norm = {l["step"] - 1: l["grad_norm"] for l in lines if "grad_norm" in l}
    samples = ref.samples_no_shuffle(shards, T)
    opt = num.torch_adamw(model.named(), lr, (0.9, 0.95), 1e-8, wd)
    worst_loss = worst_norm = 0.0
    clipped = 0
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = num.cosine_lr(s, lr, warm, steps, min_lr)
        batch = num.batch_tensors([samples[(s * glob + i) % len(samples)] for i in range(glob)])
        total, norm = num.torch_step(model, opt, batch, micro, clip)
        clipped += norm > clip
        if s not in ft_loss:
            check(False, f"{label}: ft metrics lack step {s + 1}")
            return None
        rel, nrel = abs(ft_loss[s] - total) / abs(total), abs(ft_norm[s] - norm) / norm
        if s == 0:
            check(rel <= 1e-5 and nrel <= 1e-5,
                  f"{label}: step 1 loss ft {ft_loss[s]:.8f} torch {total:.8f} rel {rel:.1e}, "
                  f"grad_norm ft {ft_norm[s]:.7f} torch {norm:.7f} rel {nrel:.1e}")
        worst_loss, worst_norm = max(worst_loss, rel), max(worst_norm, nrel)
    check(worst_loss <= 1e-4 and worst_norm <= 1e-4 and 0 < clipped < steps,
          f"{label}: {steps} steps, loss within {worst_loss:.1e}, grad_norm within "
          f"{worst_norm:.1e} (bound 1e-4); clipping active on {clipped} of {steps}")
    return os.path.join(case, "ckpt")


def export(label, case, ckpt, model, cfg, arch):
    """Section 4."""
    out = os.path.join(case, "export")
    res = subprocess.run([num.FT, "export", ckpt, "--output", out], capture_output=True,
                         text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft export failed: {res.stderr.strip()[-2000:]}")
        return
    c = json.load(open(os.path.join(out, "config.json")))
    check(c["architectures"] == [CLASSES[arch]] and c["model_type"] == arch,
          f"{label}: exported config.json says {c['architectures']} / {c['model_type']}")
    tensors = ref.read_safetensors(os.path.join(out, "model.safetensors"))
    check(set(tensors) == set(model.named()),
          f"{label}: the exported tensors are the reference's {len(tensors)} names "
          f"(differ: {sorted(set(tensors) ^ set(model.named()))[:3]})")
    trained = ref.read_safetensors(os.path.join(case, "params", "rank_0.safetensors"))
    same = set(trained) == set(tensors) and all(torch.equal(trained[k], tensors[k])
                                                for k in tensors)
    check(same, f"{label}: the exported tensors are the trained parameters, bit for bit")
    # The logits of the folder as loaded, against llama_ref's on the trained parameters.
    ids = torch.tensor(np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 24)))
    mirror = ref.Llama(cfg)
    for k, v in trained.items():
        mirror.p[k].data.copy_(v)
    with torch.no_grad():
        want = mirror.forward(ids)
    if arch == "qwen3" and not QWEN3_TF:
        res = subprocess.run([TF5, "-c", "import sys, transformers as t\n"
                              "c = t.AutoConfig.from_pretrained(sys.argv[1])\n"
                              "print(type(c).__name__, c.architectures, c.head_dim)", out],
                             capture_output=True, text=True)
        said = res.stdout.strip()
        check(said == f"Qwen3Config ['Qwen3ForCausalLM'] {cfg.head_dim}",
              f"{label}: transformers 5 reads the export as: {said or res.stderr[-500:]}")
        back = ref.Llama(cfg)
        for k, v in tensors.items():
            back.p[k].data.copy_(v)
        with torch.no_grad():
            got = back.forward(ids)
        loaded = "llama_ref"  # transformers 5 runs no model here (torch 1.13)
    else:
        import transformers
        m = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
        check(type(m).__name__ == CLASSES[arch],
              f"{label}: AutoModelForCausalLM loads the export as {type(m).__name__}")
        with torch.no_grad():
            got = m(input_ids=ids).logits
        loaded = type(m).__name__
    err = ((got - want).abs().max() / want.abs().max()).item()
    check(err <= 1e-5, f"{label}: {loaded}'s logits of the export against llama_ref's on the "
                       f"trained parameters, max rel {err:.1e}")


def main():
    torch.set_num_threads(2)
    cases = [("qwen2_tied", "qwen2", True), ("qwen2", "qwen2", False),
             ("qwen3", "qwen3", False), ("mistral", "mistral", False),
             ("qwen3_tied", "qwen3", True)]
    only = os.environ.get("FT_ARCH_CASES")
    if only:
        unknown = set(only.split(",")) - {c[0] for c in cases}
        check(not unknown, f"FT_ARCH_CASES names known cases (unknown: {sorted(unknown)})")
    for seed, (label, arch, tie) in enumerate(cases):
        if (only and label not in only.split(",")) or (not only and label == "qwen3_tied"):
            continue
        case = os.path.join(TMP, label)
        os.makedirs(case)
        hf, model, cfg = build(case, arch, tie, seed + 1)
        gradcheck(label, case, hf, model, cfg, ablate=arch in ("qwen2", "qwen3"))
        ckpt = training(label, case, hf, model, cfg)
        if ckpt:
            export(label, case, ckpt, model, cfg, arch)
    if num.failures:
        print(f"{len(num.failures)} failed", file=sys.stderr)
        sys.exit(1)
    print("arch_parity: all checks passed")


if __name__ == "__main__":
    main()
