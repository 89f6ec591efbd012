"""A small Llama in PyTorch that follows Hugging Face LlamaForCausalLM's math, written here as
the numeric reference for ft (transformers is not a test dependency). Also, in plain Python:
safetensors reading/writing, token-shard writing and ft's epoch sample order, so the reference
tests need only Debian's python3-torch, python3-numpy and python3-h5py."""

import json
import math
import struct

import numpy as np
import torch


class Config:
    """rope_scaling: None, or transformers' mapping without rope_theta, e.g. {"rope_type":
    "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}. rope_format: how config.json states RoPE, "v4"
    (top-level rope_theta and rope_scaling, as transformers 4 writes it) or "v5" (rope_parameters
    with rope_theta inside, as transformers 5 writes it). arch: "llama", "qwen2" (biases on
    q_proj, k_proj and v_proj, as Qwen2Attention), "qwen3" (q_norm and k_norm, an RMSNorm over
    each head's head_dim channels of q and k after the projections and before RoPE, with
    rms_norm_eps, as Qwen3Attention) or "mistral" (Llama's math; sliding_window null)."""

    CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}

    def __init__(self, dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size,
                 max_seq_len=64, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False,
                 rope_scaling=None, rope_format="v4", arch="llama", head_dim=None):
        self.arch = arch
        self.dim, self.n_layers, self.n_heads, self.n_kv_heads = dim, n_layers, n_heads, n_kv_heads
        self.ffn_dim, self.vocab_size, self.max_seq_len = ffn_dim, vocab_size, max_seq_len
        self.rope_theta, self.norm_eps, self.tie_embeddings = rope_theta, norm_eps, tie_embeddings
        self.rope_scaling, self.rope_format = rope_scaling, rope_format
        self.head_dim = head_dim or dim // n_heads  # q, k, v: heads x head_dim wide

    def hf_json(self):
        j = {
            "architectures": [self.CLASSES[self.arch]], "model_type": self.arch,
            "hidden_size": self.dim, "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.ffn_dim, "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.norm_eps, "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu", "torch_dtype": "float32",
        }
        if self.arch in ("qwen2", "qwen3"):
            j.update(use_sliding_window=False, sliding_window=None)
        if self.arch in ("qwen3", "mistral") or self.head_dim != self.dim // self.n_heads:
            j["head_dim"] = self.head_dim
        if self.arch == "qwen3":
            j["attention_bias"] = False
        if self.arch == "mistral":
            j["sliding_window"] = None
        if self.rope_format == "v5":
            j["rope_parameters"] = dict(self.rope_scaling or {"rope_type": "default"},
                                        rope_theta=self.rope_theta)
        else:
            j["rope_theta"] = self.rope_theta
            if self.rope_scaling:
                j["rope_scaling"] = dict(self.rope_scaling)
        return j


def rope_inv_freq(cfg):
    """(D/2) inverse frequencies, transformers' formulas written out in the same torch ops:
    _compute_default_rope_parameters, then _compute_linear_scaling_rope_parameters or
    _compute_llama3_parameters (modeling_rope_utils.py)."""
    D, base = cfg.head_dim, cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    s = cfg.rope_scaling or {}
    rope_type = s.get("rope_type", s.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    factor = s["factor"]
    if rope_type == "linear":
        return inv_freq / factor
    assert rope_type == "llama3", rope_type
    low_freq_factor, high_freq_factor = s["low_freq_factor"], s["high_freq_factor"]
    old_context_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # longer than low_freq_wavelen: divided by factor; shorter than high_freq_wavelen: kept
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor -
                                                                     low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed, inv_freq_llama)


def rope_bands(cfg):
    """For llama3: how many frequencies fall in each band (kept, blended, divided)."""
    s = cfg.rope_scaling
    D, base = cfg.head_dim, cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    wavelen = 2 * math.pi / inv_freq
    old = s["original_max_position_embeddings"]
    high = int((wavelen < old / s["high_freq_factor"]).sum())
    low = int((wavelen > old / s["low_freq_factor"]).sum())
    return high, len(inv_freq) - high - low, low


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Llama:
    """Parameters in a plain dict keyed by HF name (nn.Module names cannot hold dots)."""

    sdpa = False  # attention through F.scaled_dot_product_attention (PyTorch >= 2.0)

    def __init__(self, cfg, seed=0, std=0.1):
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)
        C, F, V = cfg.dim, cfg.ffn_dim, cfg.vocab_size
        HD, KD = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

        def mat(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        def norm(n=C):  # not all ones, so the norm weights' gradients are exercised
            return torch.nn.Parameter(1.0 + 0.1 * torch.randn(n, generator=g))

        def bias(n):  # not zero (torch's init), so the biases act and get gradients
            return torch.nn.Parameter(torch.randn(n, generator=g) * std)

        self.p = {}
        self.p["model.embed_tokens.weight"] = mat(V, C)
        for i in range(cfg.n_layers):
            pre = f"model.layers.{i}."
            self.p[pre + "input_layernorm.weight"] = norm()
            self.p[pre + "self_attn.q_proj.weight"] = mat(HD, C)
            self.p[pre + "self_attn.k_proj.weight"] = mat(KD, C)
            self.p[pre + "self_attn.v_proj.weight"] = mat(KD, C)
            if cfg.arch == "qwen2":
                for name, n in (("q", HD), ("k", KD), ("v", KD)):
                    self.p[pre + f"self_attn.{name}_proj.bias"] = bias(n)
            self.p[pre + "self_attn.o_proj.weight"] = mat(C, HD)
            if cfg.arch == "qwen3":
                self.p[pre + "self_attn.q_norm.weight"] = norm(cfg.head_dim)
                self.p[pre + "self_attn.k_norm.weight"] = norm(cfg.head_dim)
            self.p[pre + "post_attention_layernorm.weight"] = norm()
            self.p[pre + "mlp.gate_proj.weight"] = mat(F, C)
            self.p[pre + "mlp.up_proj.weight"] = mat(F, C)
            self.p[pre + "mlp.down_proj.weight"] = mat(C, F)
        self.p["model.norm.weight"] = norm()
        if not cfg.tie_embeddings:
            self.p["lm_head.weight"] = mat(V, C)

    def named(self):
        return dict(self.p)

    def forward(self, ids):
        cfg, P = self.cfg, self.p
        B, T = ids.shape
        D, H, K = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        inv_freq = rope_inv_freq(cfg)
        # as LlamaRotaryEmbedding: inv_freq (D/2, 1) @ positions (1, T) in fp32, with autocast
        # off as transformers turns it off (in bf16, angles near 30 rad would be off by up to
        # 0.06 rad); a no-op outside autocast
        with torch.autocast("cpu", enabled=False):
            freqs = (inv_freq[:, None] @ torch.arange(T).float()[None, :]).T
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # (T, D)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = P["model.embed_tokens.weight"][ids]
        for i in range(cfg.n_layers):
            pre = f"model.layers.{i}."
            a = rms_norm(x, P[pre + "input_layernorm.weight"], cfg.norm_eps)
            def proj(name, n):
                y = a @ P[pre + f"self_attn.{name}_proj.weight"].T
                if pre + f"self_attn.{name}_proj.bias" in P:
                    y = y + P[pre + f"self_attn.{name}_proj.bias"]
                y = y.view(B, T, n, D)
                if pre + f"self_attn.{name}_norm.weight" in P:  # over each head's D channels
                    y = rms_norm(y, P[pre + f"self_attn.{name}_norm.weight"], cfg.norm_eps)
                return y.transpose(1, 2)

            q, k, v = proj("q", H), proj("k", K), proj("v", K)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(H // K, dim=1)  # query head h uses kv head h // (H/K)
            v = v.repeat_interleave(H // K, dim=1)
            if self.sdpa:  # scripts/bench.py on PyTorch 2.x: what a user of it would run
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1) @ v
            o = o.transpose(1, 2).reshape(B, T, H * D)
            x = x + o @ P[pre + "self_attn.o_proj.weight"].T
            b = rms_norm(x, P[pre + "post_attention_layernorm.weight"], cfg.norm_eps)
            g = b @ P[pre + "mlp.gate_proj.weight"].T
            u = b @ P[pre + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ P[pre + "mlp.down_proj.weight"].T
        f = rms_norm(x, P["model.norm.weight"], cfg.norm_eps)
        head = P["model.embed_tokens.weight"] if cfg.tie_embeddings else P["lm_head.weight"]
        return f @ head.T

    def loss_sum(self, ids, targets, mask):
        """Sum of per-token cross-entropy over targets where mask is 1."""
        logits = self.forward(ids)
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        return (ce * mask.reshape(-1).float()).sum()


# ---- safetensors ---------------------------------------------------------------------------

_DT = {"F32": (np.float32, 4), "F16": (np.float16, 2)}


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: dict name -> torch tensor. dtype F32 or BF16 or F16."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if dtype == "BF16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        elif dtype == "F16":
            raw = t.to(torch.float16).numpy().tobytes()
        else:
            raw = t.to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b: 8 + n + end]
        if e["dtype"] == "BF16":
            arr = np.frombuffer(raw, dtype=np.int16).copy()
            out[name] = torch.from_numpy(arr).view(torch.bfloat16).float().reshape(e["shape"])
        else:
            np_dt, _ = _DT[e["dtype"]]
            out[name] = torch.from_numpy(np.frombuffer(raw, dtype=np_dt).copy()).float().reshape(e["shape"])
    return out


def save_hf_folder(model, folder, dtype="F32"):
    import os
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(model.cfg.hf_json(), f, indent=2)
    write_safetensors(os.path.join(folder, "model.safetensors"), model.named(), dtype)


# ---- token shards (DESIGN.md §6) -----------------------------------------------------------

def write_shard(path, tokens, vocab_size, doc_offsets=None, loss_mask=None):
    import h5py
    with h5py.File(path, "w") as f:
        dt = "uint16" if vocab_size <= 65535 else "uint32"
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=dt))
        f.create_dataset("doc_offsets", data=np.asarray(doc_offsets or [0], dtype="uint64"))
        if loss_mask is not None:
            f.create_dataset("loss_mask", data=np.asarray(loss_mask, dtype="uint8"))
        f.attrs["format"] = "ft-tokens"
        f.attrs["version"] = 1
        f.attrs["vocab_size"] = vocab_size
        f.attrs["bos_id"] = 1
        f.attrs["eos_id"] = 2
        f.attrs["tokenizer_sha256"] = "0" * 64


def write_preference_shard(path, pairs, vocab_size):
    """A preference shard (format ft-preference, DESIGN.md §6). pairs: (prompt, chosen,
    rejected) token lists; its documents are prompt + chosen and prompt + rejected in turn, with
    loss_mask 1 on the completions."""
    import h5py
    tokens, offsets, mask = [], [], []
    for prompt, chosen, rejected in pairs:
        for completion in (chosen, rejected):
            offsets.append(len(tokens))
            tokens += list(prompt) + list(completion)
            mask += [0] * len(prompt) + [1] * len(completion)
    with h5py.File(path, "w") as f:
        dt = "uint16" if vocab_size <= 65535 else "uint32"
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=dt))
        f.create_dataset("doc_offsets", data=np.asarray(offsets, dtype="uint64"))
        f.create_dataset("loss_mask", data=np.asarray(mask, dtype="uint8"))
        f.attrs["format"] = "ft-preference"
        f.attrs["version"] = 1
        f.attrs["vocab_size"] = vocab_size
        f.attrs["bos_id"] = 1
        f.attrs["eos_id"] = 2
        f.attrs["tokenizer_sha256"] = "0" * 64


# ---- sample order (DESIGN.md §6; lib/data/loader.cpp documents the exact algorithm) -------

_M64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def sample_order(index, n, shuffle, seed, epoch):
    """Entry `index` of epoch `epoch`'s order of n samples, as ft's sample_order: the identity
    without shuffle; with it, a 6-round Feistel network over [0, 4^h) (h = ceil(b/2), b the bit
    length of n - 1, at least 2) keyed by splitmix64, restricted to [0, n) by cycle walking."""
    if not 0 <= index < n:
        raise ValueError(f"sample index {index} out of range for {n} samples")
    if not shuffle or n <= 1:
        return index
    bits = max((n - 1).bit_length(), 2)
    h = (bits + 1) // 2
    mask = (1 << h) - 1
    base = splitmix64(splitmix64(seed & _M64) ^ (epoch & _M64))
    keys = [splitmix64((base + r) & _M64) for r in range(6)]
    x = index
    while True:
        for k in keys:
            left, right = x >> h, x & mask
            x = (right << h) | (left ^ (splitmix64(right ^ k) & mask))
        if x < n:
            return x


def stream_sample(j, n, shuffle, seed):
    """(epoch, sample index) at position j of the sample stream: entry j mod n of epoch j div n."""
    return j // n, sample_order(j % n, n, shuffle, seed, j // n)


def samples_no_shuffle(shards, T):
    """Samples of a shard list (token arrays, mask arrays or None) in stream order, shuffle off:
    sample k of a shard is tokens[k*T : k*T+T+1]."""
    out = []
    for toks, mask in shards:
        n = (len(toks) - 1) // T
        for k in range(n):
            w = np.asarray(toks[k * T: k * T + T + 1], dtype=np.int64)
            m = np.ones(T, dtype=np.uint8) if mask is None else np.asarray(mask[k * T + 1: k * T + T + 1], dtype=np.uint8)
            out.append((w[:-1], w[1:], m))
    return out
