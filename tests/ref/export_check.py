"""Checks a folder written by `ft export` against the PyTorch reference (llama_ref.py).

    /usr/bin/python3 tests/ref/export_check.py HF_DIR --valid SHARD_DIR --seq-len T \
        --global-batch G --eval-batches N --metrics METRICS_JSONL [--min-shards K]

1. The folder: config.json keys of a LlamaForCausalLM, every safetensors file listed by the
   index (when sharded) and every tensor in exactly one file, with total_size its data bytes.
2. The model: loads the tensors into llama_ref.Llama and computes the token-weighted mean loss
   over the batches ft evaluates (lib/train/trainer.cpp, evaluate): the first
   min(N, samples // G) global batches of the validation stream, shuffle off, at least one.
   That loss must match the last eval_loss in ft's metrics within 1e-5 relative.
"""

import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402


def load_folder(d, min_shards):
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama", cfg
    assert cfg["hidden_act"] == "silu" and cfg["attention_bias"] is False and cfg["mlp_bias"] is False
    index_path = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index_path):
        index = json.load(open(index_path))
        files = sorted(set(index["weight_map"].values()))
        n = len(files)
        assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)], files
        assert not os.path.exists(os.path.join(d, "model.safetensors"))
    else:
        index, files = None, ["model.safetensors"]
    assert len(files) >= min_shards, f"{len(files)} safetensors files, expected >= {min_shards}"
    on_disk = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    assert on_disk == sorted(files), (on_disk, files)
    tensors, where, total = {}, {}, 0
    for f in files:
        for name, t in ref.read_safetensors(os.path.join(d, f)).items():
            assert name not in tensors, f"{name} in two files"
            tensors[name] = t
            where[name] = f
            total += t.numel() * 4  # these exports are F32
    if index is not None:
        # Every tensor exactly once, in the file the index names; total_size is the data bytes.
        assert index["weight_map"] == where, "index weight_map differs from the files' contents"
        assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return cfg, tensors


def valid_samples(folder, T):
    shards = []
    for f in sorted(os.listdir(folder)):
        if f.endswith(".h5"):
            with h5py.File(os.path.join(folder, f)) as h:
                mask = h["loss_mask"][:] if "loss_mask" in h else None
                shards.append((h["tokens"][:], mask))
    return ref.samples_no_shuffle(shards, T)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--valid", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--eval-batches", type=int, required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--min-shards", type=int, default=1)
    a = ap.parse_args()

    cfg, tensors = load_folder(a.hf_dir, a.min_shards)
    c = ref.Config(cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                   cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"],
                   cfg["max_position_embeddings"], cfg["rope_theta"], cfg["rms_norm_eps"],
                   cfg["tie_word_embeddings"])
    model = ref.Llama(c)
    assert set(model.p) == set(tensors), set(model.p) ^ set(tensors)
    for name, t in tensors.items():
        assert tuple(model.p[name].shape) == tuple(t.shape), (name, model.p[name].shape, t.shape)
        # Float64 for the reference, so that its own rounding is far below the tolerance.
        model.p[name] = t.double()

    samples = valid_samples(a.valid, a.seq_len)
    G = a.global_batch
    batches = max(min(a.eval_batches, len(samples) // G), 1)
    used = samples[:batches * G]
    ids = torch.from_numpy(np.stack([s[0] for s in used]))
    targets = torch.from_numpy(np.stack([s[1] for s in used]))
    mask = torch.from_numpy(np.stack([s[2] for s in used]))
    with torch.no_grad():
        loss = (model.loss_sum(ids, targets, mask) / mask.sum()).item()

    evals = [json.loads(l) for l in open(a.metrics) if '"eval_loss"' in l]
    assert evals, "no eval_loss in " + a.metrics
    ft_loss = evals[-1]["eval_loss"]
    # 1e-5 relative: ft computes in f32 (a few ulps of ~4.6 per op, summed over a 2-layer
    # model and hundreds of tokens), the reference in f64 from the same exported weights. A
    # wrong tensor, a transposed or mis-gathered tensor-parallel slice moves the loss by far more.
    rel = abs(loss - ft_loss) / abs(ft_loss)
    print(f"export_check: reference eval loss {loss:.8f}, ft {ft_loss:.8f}, rel diff {rel:.2e}, "
          f"{batches} batches, {len(tensors)} tensors")
    assert rel < 1e-5, f"reference loss {loss} vs ft eval_loss {ft_loss} (rel {rel:.2e})"


if __name__ == "__main__":
    main()
