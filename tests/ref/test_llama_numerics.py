"""ft against a PyTorch reference (DESIGN.md §5-§7 semantics), run by ctest:
    /usr/bin/python3 tests/ref/test_llama_numerics.py BUILD_DIR SOURCE_DIR

1. Loss and every parameter gradient of one global batch (two micro-batches accumulated,
   token-weighted) for several shapes: GQA with untied embeddings; head_dim not a power of two
   with one layer; seq_len 1; tied embeddings loaded from bf16; a loss mask. RoPE scaling
   (rope_cases): llama3 with frequencies in each of its three bands, linear (stated with the
   old "type" key), and transformers 5's rope_parameters with theta 500000, default and llama3;
   each asserted to be far from the loss of the RoPE ft would compute if it ignored the scaling
   or the theta. The reference computes inv_freq with transformers' formulas in the same fp32
   torch ops, so the same tolerances hold.
   Tolerances (fp32 on both sides, different summation orders): loss relative error <= 1e-5;
   each gradient tensor max|g_ft - g_pt| / max|g_pt| <= 1e-4.
2. The epoch permutation: llama_ref.sample_order, a Python transcription of ft's (Feistel
   network, splitmix64 round keys, cycle walking), gives the values that
   tests/unit/test_data_loader.cpp pins, and is a permutation (identity without shuffle).
3. 20 optimizer steps of `ft train` against torch.optim.AdamW + clip_grad_norm_, twice: with
   data.shuffle false and with data.shuffle true (order from llama_ref.sample_order seeded by
   run.seed and the epoch). Covered: warmup then cosine decay, clipping active on some steps and
   not others, weight decay on matrices only, accumulation of two micro-batches, shards of
   unequal size (one with a tail too short for a sample), 26 samples per epoch over 80 stream
   positions (epochs 0-3; asserted: some global batches straddle two epochs; with shuffle,
   asserted: the epoch orders differ from the identity and from each other).
   Per-step losses and grad norms within 1e-4 relative (Adam's normalisation amplifies rounding
   differences a little each step, so this is looser than the single-step check).
   Evaluation: data.valid (other random tokens, with a loss mask, two shards), eval_every_steps
   10, eval_batches 2: ft must log eval_loss after steps 9 and 19 only (after that step's
   update), equal to torch's token-weighted mean loss (no grad) over the first 2 global batches
   of data.valid in order, within 1e-5 relative (fp32, forward only).
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


def recipe_yaml(path, hf_dir, data_dir, T, micro, glob, extra="", optimizer="optimizer: {lr: 0.001}",
                seed=1, shuffle=False, valid=None, training_extra=""):
    valid_key = f", valid: {valid}" if valid else ""
    with open(path, "w") as f:
        f.write(f"""run: {{name: ref, output_dir: {os.path.dirname(path)}/run, seed: {seed}}}
model: {{from: {hf_dir}}}
data: {{train: {data_dir}{valid_key}, seq_len: {T}, shuffle: {str(shuffle).lower()}}}
training: {{steps: 1, micro_batch_size: {micro}, global_batch_size: {glob}, grad_clip: 0{training_extra}}}
{optimizer}
runtime: {{threads: 2}}
{extra}""")


def make_data(tmp, name, vocab, n_tokens_per_shard, n_shards, seed, with_mask=False):
    """n_tokens_per_shard: one count for every shard, or a list with one count per shard."""
    rng = np.random.default_rng(seed)
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    sizes = n_tokens_per_shard
    if not isinstance(sizes, list):
        sizes = [sizes] * n_shards
    shards = []
    for i, n in enumerate(sizes):
        toks = rng.integers(0, vocab, n)
        mask = (rng.random(n) < 0.7).astype(np.uint8) if with_mask else None
        ref.write_shard(os.path.join(d, f"shard_{i:05d}.h5"), toks, vocab, loss_mask=mask)
        shards.append((toks, mask))
    return d, shards


def grad_case(tmp, label, cfg, T, micro, glob, weights_dtype="F32", with_mask=False,
              differs_from=()):
    """differs_from: other configs (same sizes, other RoPE) whose loss on the same weights and
    batch must differ from cfg's by far more than the tolerance, so that the case would fail
    if ft computed that RoPE instead of cfg's."""
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
    for other in differs_from:
        alt = ref.Llama(other, seed=sum(map(ord, label)))
        for k, v in model.p.items():
            alt.p[k].data.copy_(v.data)
        with torch.no_grad():
            alt_loss = (alt.loss_sum(ids, tgt, msk) / count).item()
        gap = abs(alt_loss - total) / abs(total)
        check(gap > 1e-3, f"{label}: the loss with {other.rope_scaling or 'no'} scaling, "
                          f"theta {other.rope_theta} ({alt_loss:.6f}) is {gap:.1e} away, "
                          "beyond tolerance")
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


def rope_cases(tmp):
    """RoPE scaling as Llama checkpoints state it. head_dim 16, theta 10000: wavelengths
    2π/inv_freq are 6.3, 19.9, 62.8, 199, ... so with llama3's original max positions 64 and low/high
    frequency factors 1/4 (band edges 64 and 16) the first frequency is kept, the next two are
    blended and the other five divided by the factor (asserted). T = 40 reaches angles where the
    three rope types give visibly different losses (asserted through differs_from)."""
    sizes = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=101)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    linear = {"type": "linear", "factor": 4.0}  # the key before transformers 4.43
    plain = ref.Config(**sizes)
    c_llama3 = ref.Config(**sizes, rope_scaling=llama3)
    c_linear = ref.Config(**sizes, rope_scaling=linear)
    bands = ref.rope_bands(c_llama3)
    check(all(b > 0 for b in bands), f"rope: llama3 bands kept/blended/divided = {bands}")
    grad_case(tmp, "rope_llama3", c_llama3, T=40, micro=2, glob=4, differs_from=(plain, c_linear))
    grad_case(tmp, "rope_linear_v4_type", c_linear, T=40, micro=2, glob=4, differs_from=(plain,))
    # transformers 5's format: everything inside rope_parameters, theta 500000 (the value that
    # ft once ignored, training with 10000 instead).
    c5 = ref.Config(**sizes, rope_theta=500000.0, rope_format="v5",
                    rope_scaling=dict(llama3, factor=32.0))
    check(all(b > 0 for b in ref.rope_bands(c5)), f"rope: v5 llama3 bands {ref.rope_bands(c5)}")
    grad_case(tmp, "rope_llama3_v5_theta500000", c5, T=40, micro=2, glob=4,
              differs_from=(ref.Config(**sizes, rope_scaling=dict(llama3, factor=32.0)),
                            ref.Config(**sizes, rope_theta=500000.0)))
    grad_case(tmp, "rope_default_v5_theta500000",
              ref.Config(**sizes, rope_theta=500000.0, rope_format="v5"), T=40, micro=2, glob=4,
              differs_from=(plain,))


def sample_order_case():
    """The Python transcription of ft's epoch permutation against the values that
    tests/unit/test_data_loader.cpp pins for the C++ one, plus its basic properties."""
    got0 = [ref.sample_order(i, 10, True, 1234, 0) for i in range(10)]
    got1 = [ref.sample_order(i, 10, True, 1234, 1) for i in range(10)]
    big, ones = (1 << 40) + 3, (1 << 64) - 1
    pinned = (got0 == [1, 8, 9, 2, 0, 5, 4, 3, 7, 6] and got1 == [5, 4, 8, 6, 1, 9, 3, 2, 7, 0]
              and ref.sample_order(999, 1000, True, 42, 7) == 244
              and ref.sample_order(5, big, True, ones, 123456) == 202106758956
              and ref.sample_order(big - 1, big, True, ones, 123456) == 996158138026)
    check(pinned, "sample_order: Python transcription gives the values test_data_loader.cpp pins")
    perm = all(sorted(ref.sample_order(i, n, True, 5, e) for i in range(n)) == list(range(n))
               and [ref.sample_order(i, n, False, 5, e) for i in range(n)] == list(range(n))
               for n in range(1, 40) for e in range(3))
    check(perm, "sample_order: a permutation with shuffle, the identity without, n = 1..39")


def ft_train(label, rpath, metrics, *overrides):
    """Runs `ft train rpath overrides...`; returns the metrics lines (parsed JSON), or None
    after recording a failed check."""
    res = subprocess.run([FT, "train", rpath, *overrides], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft train failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        return None
    return [json.loads(l) for l in open(metrics)]


def cosine_lr(s, lr, warm, steps, min_lr):
    """The learning rate of step s (counted from 0): linear warmup over `warm` steps, then cosine
    decay to min_lr at step `steps` (DESIGN.md §5)."""
    if s < warm:
        return lr * (s + 1) / warm
    p = (s - warm) / (steps - warm)
    return min_lr + 0.5 * (lr - min_lr) * (1 + np.cos(np.pi * p))


def torch_adamw(params, lr, betas, eps, wd):
    """torch.optim.AdamW as ft's optimizer applies it: weight decay on matrices only.
    params: dict name -> parameter."""
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)


def batch_tensors(batch):
    """(ids, targets, mask) tensors, each (len(batch), T), of samples from samples_no_shuffle."""
    return tuple(torch.tensor(np.stack([b[k] for b in batch])) for k in range(3))


def torch_step(model, opt, batch, micro, clip, autocast_dtype=None):
    """One optimizer step of the reference, as ft takes it: the global batch (ids, targets,
    mask) in micro-batches of `micro` samples, each loss weighted by 1 / (the batch's masked
    token count) and its gradients accumulated, clip_grad_norm_, opt.step. autocast_dtype: None
    (fp32), or the dtype torch.autocast runs forward and loss in, as a PyTorch AMP user writes
    it. Returns (loss, gradient norm before clipping)."""
    ids, tgt, msk = batch
    count = msk.sum().item()
    total = 0.0
    opt.zero_grad()
    for m in range(len(ids) // micro):
        sl = slice(m * micro, (m + 1) * micro)
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            loss = model.loss_sum(ids[sl], tgt[sl], msk[sl]) / count
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(list(model.p.values()), clip).item()
    opt.step()
    return total, norm


def training_case(tmp, label, shuffle, seed):
    """`ft train` for 20 steps against torch, with evaluation after steps 9 and 19."""
    case = os.path.join(tmp, label)
    os.makedirs(case)
    cfg = ref.Config(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=80, vocab_size=67)
    model = ref.Llama(cfg, seed=3, std=0.05)
    hf = os.path.join(case, "hf")
    ref.save_hf_folder(model, hf)
    T, micro, glob, steps = 8, 2, 4, 20
    # Shards of 12 and 14 samples (the first with 5 tokens too few for a 13th, which must go
    # unused) -> N = 26 samples per epoch. 20 steps x 4 = 80 stream positions: epochs 0..3,
    # and since 26 is not a multiple of 4, some global batches straddle two epochs (asserted).
    data, shards = make_data(case, "data", cfg.vocab_size, [12 * T + 1 + 5, 14 * T + 1], 2, 11)
    # Validation: other random tokens, with a loss mask (so the token weighting matters), in
    # shards of 5 and 4 samples; eval_batches x G = 8 of its 9 samples are evaluated.
    eval_every, eval_batches = 10, 2
    valid, vshards = make_data(case, "valid", cfg.vocab_size, [5 * T + 1, 4 * T + 1], 2, 12,
                               with_mask=True)
    metrics = os.path.join(case, "metrics.jsonl")
    lr, wd, clip, warm, min_lr = 3e-3, 0.1, 2.5, 3, 3e-4
    optimizer = f"optimizer: {{lr: {lr}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {wd}}}"
    extra = (f"scheduler: {{name: cosine, warmup_steps: {warm}, min_lr: {min_lr}}}\n"
             f"logging: {{every_steps: 1, metrics: {metrics}}}\n")
    rpath = os.path.join(case, "recipe.yaml")
    recipe_yaml(rpath, hf, data, T, micro, glob, extra, optimizer, seed=seed, shuffle=shuffle,
                valid=valid,
                training_extra=f", eval_every_steps: {eval_every}, eval_batches: {eval_batches}")
    lines = ft_train(label, rpath, metrics, f"training.steps={steps}", f"training.grad_clip={clip}")
    if lines is None:
        return
    # The metrics number steps from 1 (DESIGN.md §7); s below counts from 0 as §5's formulas do.
    ft_loss = {l["step"] - 1: l["loss"] for l in lines if "loss" in l}
    ft_norm = {l["step"] - 1: l["grad_norm"] for l in lines if "grad_norm" in l}
    ft_eval = {l["step"] - 1: l["eval_loss"] for l in lines if "eval_loss" in l}

    # The reference's sample stream: position j -> sample order(j mod N) of epoch j div N.
    samples = ref.samples_no_shuffle(shards, T)
    N = len(samples)
    stream = [ref.stream_sample(j, N, shuffle, seed) for j in range(steps * glob)]
    straddling = [s for s in range(steps)
                  if len({e for e, _ in stream[s * glob:(s + 1) * glob]}) > 1]
    epochs = stream[-1][0] + 1
    check(N == 26 and epochs == 4 and len(straddling) > 0,
          f"{label}: N {N}, {steps} steps cover {epochs} epochs; "
          f"steps {straddling} straddle two epochs")
    if shuffle:  # otherwise the shuffled run would prove nothing the plain one does not
        orders = [[i for e, i in stream[k * N:(k + 1) * N]] for k in range(3)]
        check(orders[0] != list(range(N)) and orders[0] != orders[1] != orders[2],
              f"{label}: shuffled epoch orders differ from the identity and from each other")

    vsamples = ref.samples_no_shuffle(vshards, T)[:eval_batches * glob]  # in order, no shuffle
    v_ids, v_tgt, v_msk = batch_tensors(vsamples)

    params = model.named()
    opt = torch_adamw(params, lr, (0.9, 0.95), 1e-8, wd)
    clipped = 0
    worst = 0.0
    evals = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(s, lr, warm, steps, min_lr)
        batch = batch_tensors([samples[i] for _, i in stream[s * glob:(s + 1) * glob]])
        total, norm = torch_step(model, opt, batch, micro, clip)
        clipped += norm > clip
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
        if (s + 1) % eval_every == 0 or s + 1 == steps:  # after this step's update
            with torch.no_grad():
                ev = (model.loss_sum(v_ids, v_tgt, v_msk) / v_msk.sum()).item()
            evals.append(s)
            if s not in ft_eval:
                check(False, f"{label}: ft metrics lack an eval_loss at step {s}")
                continue
            erel = abs(ft_eval[s] - ev) / abs(ev)
            check(erel <= 1e-5, f"{label}: eval_loss after step {s}: ft {ft_eval[s]:.7f} "
                                f"torch {ev:.7f} rel {erel:.2e}")
    check(sorted(ft_eval) == evals,
          f"{label}: ft evaluated after steps {sorted(ft_eval)}, expected {evals}")
    check(0 < clipped < steps, f"{label}: clipping was active on {clipped} of {steps} steps (both branches)")
    check(worst <= 1e-4, f"{label}: {steps} per-step losses match, worst rel {worst:.2e}")
    # Throughput (DESIGN.md §7): tflops · step_time_s is the formula's FLOPs, 6·N + 12·L·T·C a
    # token (N the matmul weights, lm_head included) over the global batch's tokens; no mfu on
    # the CPU without logging.peak_tflops.
    C, L, hd = cfg.dim, cfg.n_layers, cfg.head_dim
    n = L * (C * cfg.n_heads * hd * 2 + 2 * C * cfg.n_kv_heads * hd + 3 * C * cfg.ffn_dim)
    n += cfg.vocab_size * C
    want = (6 * n + 12 * L * T * C) * glob * T
    steps_lines = [l for l in lines if "loss" in l]
    bad = [l["step"] for l in steps_lines
           if abs(l["tflops"] * l["step_time_s"] * 1e12 - want) > 1e-9 * want or "mfu" in l]
    check(not bad, f"{label}: tflops is the formula's {want:.6g} FLOPs a step over the step's "
                   f"time, no mfu (steps {bad} differ)")


def main():
    with tempfile.TemporaryDirectory(prefix="ft_ref_") as tmp:
        grad_case(tmp, "gqa_untied", ref.Config(64, 2, 4, 2, 96, 101), T=16, micro=2, glob=4)
        grad_case(tmp, "odd_headdim_1layer", ref.Config(72, 1, 4, 1, 100, 53), T=7, micro=1, glob=3)
        grad_case(tmp, "seq1", ref.Config(32, 2, 2, 2, 40, 29), T=1, micro=2, glob=4)
        grad_case(tmp, "tied_bf16", ref.Config(40, 2, 4, 4, 64, 37, tie_embeddings=True),
                  T=9, micro=2, glob=2, weights_dtype="BF16")
        grad_case(tmp, "loss_mask", ref.Config(32, 2, 2, 1, 48, 31), T=12, micro=2, glob=4,
                  with_mask=True)
        rope_cases(tmp)
        sample_order_case()
        training_case(tmp, "train20", shuffle=False, seed=1)
        training_case(tmp, "train20_shuffle", shuffle=True, seed=20240611)
    print(f"numerics: {len(failures)} failed check(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
