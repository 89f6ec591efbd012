"""The setup test_bf16_autocast.py and test_fp16_scaler.py share (not a test itself: ctest runs
tests/ref/test_*.py): test_llama_numerics' training case with gqa_untied's shape, and ft's side
of a run of it (train, then export the master weights of the last step's checkpoint)."""

import os
import subprocess
import types

import llama_ref as ref
import test_llama_numerics as num  # (reads BUILD_DIR SOURCE_DIR from argv)


def setup(tmp, seed):
    """Weights (saved as an HF folder), data and hyperparameters: dim 64, 2 layers, 4 heads over
    2 KV heads, untied head; seq 32, 2 micro-batches of 2 accumulated; shards of 12 and 14
    samples (batches straddle epochs) with a loss mask; AdamW betas 0.9/0.95, weight decay 0.1,
    warmup 3 then cosine to min_lr, clipping at 2.0 (active on some steps, not on others)."""
    s = types.SimpleNamespace()
    s.tmp = tmp
    s.cfg = ref.Config(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=101)
    s.model = ref.Llama(s.cfg, seed=seed, std=0.05)
    s.init = {k: p.detach().clone() for k, p in s.model.p.items()}
    s.hf = os.path.join(tmp, "hf")
    ref.save_hf_folder(s.model, s.hf)
    s.T, s.micro, s.glob = 32, 2, 4
    s.data, s.shards = num.make_data(tmp, "data", s.cfg.vocab_size,
                                     [12 * s.T + 1 + 5, 14 * s.T + 1], 2, 11, with_mask=True)
    s.lr, s.wd, s.clip, s.warm, s.min_lr = 3e-3, 0.1, 2.0, 3, 3e-4
    return s


def torch_adamw(s, model):
    """The reference optimizer over `model`'s parameters, with the setup's hyperparameters."""
    return num.torch_adamw(model.named(), s.lr, (0.9, 0.95), 1e-8, s.wd)


def batches(s, steps):
    """The global batches of steps 0..steps-1 as ft reads them (no shuffling)."""
    samples = ref.samples_no_shuffle(s.shards, s.T)
    stream = [ref.stream_sample(j, len(samples), False, 1) for j in range(steps * s.glob)]
    return [num.batch_tensors([samples[i] for _, i in stream[k * s.glob:(k + 1) * s.glob]])
            for k in range(steps)]


def ft_run(s, name, steps, training_extra):
    """`ft train` of the setup in tmp/NAME with `training_extra` appended to the training keys,
    one checkpoint after the last step, exported in fp32. Returns (metrics lines, exported
    parameters), or None after recording a failed check."""
    d = os.path.join(s.tmp, name)
    os.makedirs(d)
    metrics = os.path.join(d, "metrics.jsonl")
    ckpt = os.path.join(d, "ckpt")  # one checkpoint, after the last step: the master weights
    extra = (f"scheduler: {{name: cosine, warmup_steps: {s.warm}, min_lr: {s.min_lr}}}\n"
             f"logging: {{every_steps: 1, metrics: {metrics}}}\n"
             f"checkpoint: {{dir: {ckpt}, every_steps: {steps}}}\n")
    optimizer = (f"optimizer: {{lr: {s.lr}, betas: [0.9, 0.95], eps: 1.0e-8, "
                 f"weight_decay: {s.wd}}}")
    rpath = os.path.join(d, "recipe.yaml")
    num.recipe_yaml(rpath, s.hf, s.data, s.T, s.micro, s.glob, extra, optimizer,
                    training_extra=training_extra)
    lines = num.ft_train(f"ft {name}", rpath, metrics, f"training.steps={steps}",
                         f"training.grad_clip={s.clip}")
    if lines is None:
        return None
    out = os.path.join(d, "export")
    res = subprocess.run([num.FT, "export", ckpt, "--output", out, "--dtype", "f32"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        num.check(False, f"ft export {ckpt} failed: {res.stderr.strip()[-2000:]}")
        return None
    return lines, ref.read_safetensors(os.path.join(out, "model.safetensors"))
