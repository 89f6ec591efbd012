"""ft against a PyTorch reference (DESIGN.md §5 semantics), run by ctest:
    /usr/bin/python3 tests/ref/test_llama_numerics.py BUILD_DIR SOURCE_DIR

1. Loss and every parameter gradient of one global batch (two micro-batches accumulated,
   token-weighted) for several shapes: GQA with untied embeddings; head_dim not a power of two
   with one layer; seq_len 1; tied embeddings loaded from bf16; a loss mask.
   Tolerances (fp32 on both sides, different summation orders): loss relative error <= 1e-5;
   each gradient tensor max|g_ft - g_pt| / max|g_pt| <= 1e-4.
2. 20 optimizer steps of `ft train` (warmup, cosine decay, clipping that is active, weight decay,
   accumulation, batches straddling epochs) against torch.optim.AdamW + clip_grad_norm_:
   per-step losses within 1e-4 relative (Adam's normalisation amplifies rounding differences a
   little each step, so this is looser than the single-step check).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402

BUILD, SOURCE = sys.argv[1], sys.argv[2]
FT = os.path.join(BUILD, "ft")
GRADCHECK = os.path.join(BUILD, "tests", "ft_gradcheck")
torch.set_num_threads(2)
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def recipe_yaml(path, hf_dir, data_dir, T, micro, glob, extra="", optimizer="optimizer: {lr: 0.001}"):
    with open(path, "w") as f:
        f.write(f"""run: {{name: ref, output_dir: {os.path.dirname(path)}/run, seed: 1}}
model: {{from: {hf_dir}}}
data: {{train: {data_dir}, seq_len: {T}, shuffle: false}}
training: {{steps: 1, micro_batch_size: {micro}, global_batch_size: {glob}, grad_clip: 0}}
{optimizer}
runtime: {{threads: 2}}
{extra}""")


def make_data(tmp, name, vocab, n_tokens_per_shard, n_shards, seed, with_mask=False):
    rng = np.random.default_rng(seed)
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    shards = []
    for i in range(n_shards):
        toks = rng.integers(0, vocab, n_tokens_per_shard)
        mask = (rng.random(n_tokens_per_shard) < 0.7).astype(np.uint8) if with_mask else None
        ref.write_shard(os.path.join(d, f"shard_{i:05d}.h5"), toks, vocab, loss_mask=mask)
        shards.append((toks, mask))
    return d, shards


def grad_case(tmp, label, cfg, T, micro, glob, weights_dtype="F32", with_mask=False):
    case = os.path.join(tmp, label)
    os.makedirs(case)
    model = ref.Llama(cfg, seed=sum(map(ord, label)))
    hf = os.path.join(case, "hf")
    ref.save_hf_folder(model, hf, weights_dtype)
    if weights_dtype != "F32":  # the reference uses exactly the rounded weights ft loads
        for k, v in ref.read_safetensors(os.path.join(hf, "model.safetensors")).items():
            model.p[k].data.copy_(v)
    data, shards = make_data(case, "data", cfg.vocab_size, (glob + 1) * T + 1, 2, 7, with_mask)
    rpath = os.path.join(case, "recipe.yaml")
    recipe_yaml(rpath, hf, data, T, micro, glob)
    out = os.path.join(case, "grads.safetensors")
    res = subprocess.run([GRADCHECK, rpath, out], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft_gradcheck failed: {res.stderr.strip()}")
        return
    got = ref.read_safetensors(out)

    samples = ref.samples_no_shuffle(shards, T)[:glob]
    ids = torch.tensor(np.stack([s[0] for s in samples]))
    tgt = torch.tensor(np.stack([s[1] for s in samples]))
    msk = torch.tensor(np.stack([s[2] for s in samples]))
    count = msk.sum().item()
    total = 0.0
    for m in range(glob // micro):
        sl = slice(m * micro, (m + 1) * micro)
        loss = model.loss_sum(ids[sl], tgt[sl], msk[sl]) / count
        loss.backward()
        total += loss.item()
    rel = abs(got["loss"].item() - total) / abs(total)
    check(rel <= 1e-5, f"{label}: loss ft {got['loss'].item():.8f} torch {total:.8f} rel {rel:.2e}")
    worst = (0.0, "")
    for name, p in model.named().items():
        g_ft = got.get(name)
        if g_ft is None:
            check(False, f"{label}: ft did not report gradient {name}")
            continue
        err = (g_ft - p.grad).abs().max().item() / max(p.grad.abs().max().item(), 1e-30)
        worst = max(worst, (err, name))
        if err > 1e-4:
            check(False, f"{label}: gradient {name} max-norm rel error {err:.2e}")
    check(worst[0] <= 1e-4, f"{label}: all {len(model.p)} gradients, worst {worst[1]} {worst[0]:.2e}")


def training_case(tmp):
    label = "train20"
    case = os.path.join(tmp, label)
    os.makedirs(case)
    cfg = ref.Config(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=80, vocab_size=67)
    model = ref.Llama(cfg, seed=3, std=0.05)
    hf = os.path.join(case, "hf")
    ref.save_hf_folder(model, hf)
    T, micro, glob, steps = 8, 2, 4, 20
    # 2 shards of 14*8+1 tokens -> 28 samples per epoch: 20 steps x 4 samples roll over twice,
    # and step 7's batch straddles epochs 0 and 1.
    data, shards = make_data(case, "data", cfg.vocab_size, 14 * T + 1, 2, 11)
    metrics = os.path.join(case, "metrics.jsonl")
    lr, wd, clip, warm, min_lr = 3e-3, 0.1, 2.5, 3, 3e-4
    optimizer = f"optimizer: {{lr: {lr}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {wd}}}"
    extra = (f"scheduler: {{name: cosine, warmup_steps: {warm}, min_lr: {min_lr}}}\n"
             f"logging: {{every_steps: 1, metrics: {metrics}}}\n")
    rpath = os.path.join(case, "recipe.yaml")
    recipe_yaml(rpath, hf, data, T, micro, glob, extra, optimizer)
    res = subprocess.run([FT, "train", rpath, f"training.steps={steps}", f"training.grad_clip={clip}"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft train failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        return
    lines = [json.loads(l) for l in open(metrics)]
    ft_loss = {l["step"]: l["loss"] for l in lines if "loss" in l}
    ft_norm = {l["step"]: l["grad_norm"] for l in lines if "grad_norm" in l}

    params = model.named()
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    samples = ref.samples_no_shuffle(shards, T)
    N = len(samples)
    clipped = 0
    worst = 0.0
    for s in range(steps):
        if s < warm:
            lr_s = lr * (s + 1) / warm
        else:
            p = (s - warm) / (steps - warm)
            lr_s = min_lr + 0.5 * (lr - min_lr) * (1 + np.cos(np.pi * p))
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.zero_grad()
        batch = [samples[(s * glob + j) % N] for j in range(glob)]
        ids = torch.tensor(np.stack([b[0] for b in batch]))
        tgt = torch.tensor(np.stack([b[1] for b in batch]))
        msk = torch.tensor(np.stack([b[2] for b in batch]))
        count = msk.sum().item()
        total = 0.0
        for m in range(glob // micro):
            sl = slice(m * micro, (m + 1) * micro)
            loss = model.loss_sum(ids[sl], tgt[sl], msk[sl]) / count
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), clip).item()
        clipped += norm > clip
        opt.step()
        if s not in ft_loss:
            check(False, f"{label}: ft metrics lack step {s}")
            return
        rel = abs(ft_loss[s] - total) / abs(total)
        worst = max(worst, rel)
        if rel > 1e-4:
            check(False, f"{label}: step {s} loss ft {ft_loss[s]:.7f} torch {total:.7f} rel {rel:.2e}")
        nrel = abs(ft_norm[s] - norm) / norm
        if nrel > 1e-4:
            check(False, f"{label}: step {s} grad_norm ft {ft_norm[s]:.6f} torch {norm:.6f}")
    check(0 < clipped < steps, f"{label}: clipping was active on {clipped} of {steps} steps (both branches)")
    check(worst <= 1e-4, f"{label}: {steps} per-step losses match, worst rel {worst:.2e}")


def main():
    with tempfile.TemporaryDirectory(prefix="ft_ref_") as tmp:
        grad_case(tmp, "gqa_untied", ref.Config(64, 2, 4, 2, 96, 101), T=16, micro=2, glob=4)
        grad_case(tmp, "odd_headdim_1layer", ref.Config(72, 1, 4, 1, 100, 53), T=7, micro=1, glob=3)
        grad_case(tmp, "seq1", ref.Config(32, 2, 2, 2, 40, 29), T=1, micro=2, glob=4)
        grad_case(tmp, "tied_bf16", ref.Config(40, 2, 4, 4, 64, 37, tie_embeddings=True),
                  T=9, micro=2, glob=2, weights_dtype="BF16")
        grad_case(tmp, "loss_mask", ref.Config(32, 2, 2, 1, 48, 31), T=12, micro=2, glob=4,
                  with_mask=True)
        training_case(tmp)
    print(f"numerics: {len(failures)} failed check(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
