"""Speed baseline: ft against PyTorch on one shape, one process, fp32 (run by scripts/bench.sh).

Both train the same Llama shape on the same random tokens with AdamW and clipping; we report the
median over the timed steps (the first steps are warm-up and not counted).
FLOPs per token, the usual estimate (Kaplan et al.; PaLM appendix B): 6·N for the matmul
parameters N (every linear layer plus the LM head; the embedding lookup is free) plus
12·L·T·C for attention scores and their backward (full T², as the estimate counts it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import llama_ref as ref  # noqa: E402


def flops_per_token(c, T):
    C, L, F, V = c.dim, c.n_layers, c.ffn_dim, c.vocab_size
    HD, KD = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    n_matmul = L * (C * HD + 2 * C * KD + HD * C + 3 * C * F) + V * C
    return 6 * n_matmul + 12 * L * T * C


def torch_steps(a):
    """The PyTorch side, in its own process (so OPENBLAS_CORETYPE applies before torch loads)."""
    cfg = ref.Config(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1408, vocab_size=32000,
                     max_seq_len=256)
    T, B = 256, 4
    torch.set_num_threads(a.threads)
    model = ref.Llama(cfg, seed=0, std=0.02)
    params = list(model.named().values())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
    mask = torch.ones(B, T)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model.loss_sum(ids[:, :-1], ids[:, 1:], mask) / (B * T)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    print(f"pytorch {torch.__version__} {statistics.median(times[a.warmup:])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ft", default="build/ft")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--tensor-parallel", type=int, default=0, metavar="N",
                    help="also run ft with N tensor-parallel ranks (--nproc N), the cores split "
                         "between them")
    ap.add_argument("--data-parallel", type=int, default=0, metavar="N",
                    help="also run ft with N data-parallel ranks (--nproc N), the cores split "
                         "between them, micro-batch 4 per rank")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_only:
        return torch_steps(a)

    cfg = ref.Config(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1408, vocab_size=32000,
                     max_seq_len=256)
    T, B = 256, 4
    fpt = flops_per_token(cfg, T)
    print(f"shape: dim 512, 8 layers, 8 heads, ffn 1408, vocab 32000, seq {T}, micro-batch {B}, "
          f"fp32, {a.threads} threads; {fpt / 1e9:.3f} GFLOP per token")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ft_bench_") as tmp:
        rng = np.random.default_rng(0)
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        ref.write_shard(os.path.join(data, "shard_00000.h5"),
                        rng.integers(0, cfg.vocab_size, (a.steps + 1) * B * max(1, a.data_parallel) * T + 1),
                        cfg.vocab_size)
        metrics = os.path.join(tmp, "metrics.jsonl")
        recipe = os.path.join(tmp, "bench.yaml")
        with open(recipe, "w") as f:
            f.write(f"""run: {{name: bench, output_dir: {tmp}/run, seed: 0}}
model: {{dim: 512, n_layers: 8, n_heads: 8, n_kv_heads: 8, ffn_dim: 1408, vocab_size: 32000,
        max_seq_len: 256}}
data: {{train: {data}, seq_len: {T}, shuffle: false}}
training: {{steps: {a.steps}, micro_batch_size: {B}, global_batch_size: {B}, grad_clip: 1.0}}
optimizer: {{lr: 1.0e-4, weight_decay: 0.1}}
logging: {{every_steps: 1, metrics: {metrics}}}
runtime: {{threads: {a.threads}}}
""")
        out = subprocess.run([a.ft, "train", recipe], check=True, capture_output=True, text=True).stdout
        # ft corrects OpenBLAS's kernel choice on CPUs that OpenBLAS 0.3.21 does not know (see
        # kernels::blas_better_coretype); PyTorch uses the same OpenBLAS, so it gets the same
        # kernels, or the comparison would measure the BLAS choice instead of the two programs.
        kernels = out.split("BLAS kernels ")[1].split()[0] if "BLAS kernels " in out else None
        lines = [json.loads(l) for l in open(metrics) if '"loss"' in l]
        ft_times = [l["step_time_s"] for l in lines][a.warmup:]
        ft_mem = max(l["mem_peak_bytes"] for l in lines)
        rows.append(("ft", statistics.median(ft_times), ft_mem))

        if a.data_parallel > 1:
            n = a.data_parallel
            dp_metrics = os.path.join(tmp, "metrics_dp.jsonl")
            subprocess.run([a.ft, "train", recipe, "--nproc", str(n), f"training.global_batch_size={B * n}",
                            f"runtime.threads={max(1, a.threads // n)}", f"logging.metrics={dp_metrics}",
                            f"run.output_dir={tmp}/run_dp"], check=True, capture_output=True)
            lines = [json.loads(l) for l in open(dp_metrics) if '"loss"' in l]
            t = statistics.median([l["step_time_s"] for l in lines][a.warmup:])
            # n ranks each process B samples per step: report per-step time normalised to B samples.
            rows.append((f"ft data {n} (ZeRO 0)", t / n, max(l["mem_peak_bytes"] for l in lines)))

        if a.tensor_parallel > 1:
            n = a.tensor_parallel
            tp_metrics = os.path.join(tmp, "metrics_tp.jsonl")
            subprocess.run([a.ft, "train", recipe, "--nproc", str(n), f"parallel.tensor={n}",
                            f"runtime.threads={max(1, a.threads // n)}", f"logging.metrics={tp_metrics}",
                            f"run.output_dir={tmp}/run_tp"], check=True, capture_output=True)
            lines = [json.loads(l) for l in open(tp_metrics) if '"loss"' in l]
            t = statistics.median([l["step_time_s"] for l in lines][a.warmup:])
            rows.append((f"ft tensor {n}", t, max(l["mem_peak_bytes"] for l in lines)))

        if not a.skip_torch:
            env = dict(os.environ)
            if kernels and "OPENBLAS_CORETYPE" not in env:
                env["OPENBLAS_CORETYPE"] = kernels
            res = subprocess.run([sys.executable, __file__, "--torch-only", "--steps", str(a.steps),
                                  "--warmup", str(a.warmup), "--threads", str(a.threads)],
                                 env=env, check=True, capture_output=True, text=True)
            name, t = res.stdout.strip().rsplit(" ", 1)
            rows.append((name, float(t), None))
        print(f"BLAS kernels: {kernels or 'as detected'} (both programs)")

    print(f"{'':24s} {'s/step':>8s} {'tokens/s':>10s} {'GFLOP/s':>9s}")
    for name, t, mem in rows:
        tps = B * T / t
        extra = f"   peak device memory {mem / 2**20:.0f} MiB" if mem else ""
        print(f"{name:24s} {t:8.3f} {tps:10.0f} {tps * fpt / 1e9:9.1f}{extra}")
    if len(rows) == 2:
        print(f"ft / pytorch tokens/s: {rows[1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
    main()
