"""Speed: ft against PyTorch on one shape, one process (run by scripts/bench.sh).

Both train the same Llama shape on the same random tokens with AdamW and clipping. Each program
runs in its own process, alternately (ft, torch, ft, torch, ... for --pairs pairs), so that a
slow minute on a shared machine hits both; a run's figure is the median step time over its
timed steps (the first --warmup steps are not counted), and the table gives the median of the
runs' figures and their spread (min-max).
Precision: fp32 on both sides, or bf16 (fp16): ft's training.precision against PyTorch's
torch.autocast("cpu", dtype=torch.bfloat16 (float16)) with fp32 parameters and AdamW, what an AMP
user runs. --precision fp32,bf16,fp16 runs each in every pair and gives each 16-bit one's speed
against the fp32 one's of the same program (issue: a 16-bit step never slower than fp32).
--isa caps the instruction set of both programs' kernels, to measure a lower CPU's paths on a
better one: ft's FT_CPU_ISA, oneDNN's ONEDNN_MAX_CPU_ISA, OpenBLAS's OPENBLAS_CORETYPE,
PyTorch's ATEN_CPU_CAPABILITY and MKL's MKL_ENABLE_INSTRUCTIONS. PyTorch 2.x uses F.scaled_dot_product_attention; 1.13 (Debian's) the explicit softmax.
Memory: peak RSS of each process (the kernel's ru_maxrss, so the same measure for both), and
ft's own mem_peak_bytes (its device allocator: buffers only, no code, no heap of libraries).
FLOPs per token, the usual estimate (Kaplan et al.; PaLM appendix B): 6·N for the matmul
parameters N (every linear layer plus the LM head; the embedding lookup is free) plus
12·L·T·C for attention scores and their backward (full T², as the estimate counts it).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))

SHAPE = dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1408, vocab_size=32000)

# --isa LEVEL: the environment that caps each library at it (ft's levels, kernels/cpu/isa.h;
# PyTorch's own kernels by ATEN_CPU_CAPABILITY, the MKL of its PyPI wheels by
# MKL_ENABLE_INSTRUCTIONS, its oneDNN by ONEDNN_MAX_CPU_ISA).
ISA_CAPS = {
    "baseline": {"FT_CPU_ISA": "baseline", "ONEDNN_MAX_CPU_ISA": "SSE41",
                 "OPENBLAS_CORETYPE": "Nehalem", "ATEN_CPU_CAPABILITY": "default",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"FT_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"FT_CPU_ISA": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512_bf16": {"FT_CPU_ISA": "avx512_bf16", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                    "ATEN_CPU_CAPABILITY": "avx512"},
    "amx": {"FT_CPU_ISA": "amx", "ATEN_CPU_CAPABILITY": "avx512"},
}


def flops_per_token(c, T):
    C, L, F, V = c["dim"], c["n_layers"], c["ffn_dim"], c["vocab_size"]
    hd = C // c["n_heads"]
    HD, KD = c["n_heads"] * hd, c["n_kv_heads"] * hd
    n_matmul = L * (C * HD + 2 * C * KD + HD * C + 3 * C * F) + V * C
    return 6 * n_matmul + 12 * L * T * C


def torch_steps(a):
    """The PyTorch side, in its own process (its own interpreter with --torch-python, and so that
    OPENBLAS_CORETYPE applies before torch loads). Prints one JSON line."""
    import resource

    import torch
    import llama_ref as ref

    # RSS once the libraries are loaded (PyPI's CUDA build maps large libraries even on the
    # CPU): the part of the peak that is not the training's.
    rss_import = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                      if l.startswith("VmRSS:"))
    T, B = a.seq, a.micro_batch
    cfg = ref.Config(**SHAPE, max_seq_len=T)
    torch.set_num_threads(a.threads)
    model = ref.Llama(cfg, seed=0, std=0.02)
    model.sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    params = list(model.named().values())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
    mask = torch.ones(B, T)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        # autocast: the matmuls and attention in bf16 on bf16 copies of the fp32 parameters;
        # the backward runs outside the context, as the AMP recipe says.
        with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=half is not None):
            loss = model.loss_sum(ids[:, :-1], ids[:, 1:], mask) / (B * T)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    blas = next((w.split("=", 1)[1].rstrip(",") for w in torch.__config__.show().split()
                 if w.startswith("BLAS_INFO=")), "?")
    print(json.dumps({
        "name": f"pytorch {torch.__version__}", "step_s": statistics.median(times[a.warmup:]),
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "attention": "sdpa" if model.sdpa else "softmax", "cpu_capability": cap,
        "blas": blas, "rss_import": rss_import, "loss": float(loss)}))


def run_measured(cmd, env=None):
    """Runs cmd to completion; returns (stdout, peak RSS in bytes of that process alone)."""
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read()
        if p.returncode != 0:
            sys.exit(f"bench.py: {shlex.join(cmd)} failed (exit {p.returncode}):\n"
                     f"{text[-2000:]}{err.read()[-4000:]}")
    return text, usage.ru_maxrss * 1024


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def spread(xs):
    return f"{min(xs):.3f}-{max(xs):.3f}" if len(xs) > 1 else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ft", default="build/ft")
    ap.add_argument("--precision", default="fp32",
                    help="ft's training.precision, fp32, bf16 or fp16, or several with commas "
                         "(each run in every pair); PyTorch: fp32, or autocast to bf16 / fp16")
    ap.add_argument("--isa", choices=sorted(ISA_CAPS), default=None,
                    help="cap both programs' CPU kernels at this instruction set (default: the "
                         "CPU's best)")
    ap.add_argument("--seq", type=int, default=256, help="sequence length (default 256)")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3,
                    help="runs of each program, interleaved ft, torch, ft, ... (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--torch-python", default=sys.executable, metavar="PATH",
                    help="interpreter for the PyTorch side (e.g. the venv of "
                         "scripts/bench_torch_venv.sh; default: this one)")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="one more ft run with FT_PROFILE=1; prints its per-op table")
    ap.add_argument("--tensor-parallel", type=int, default=0, metavar="N",
                    help="also run ft with N tensor-parallel ranks (--nproc N), the cores split "
                         "between them")
    ap.add_argument("--data-parallel", type=int, default=0, metavar="N",
                    help="also run ft with N data-parallel ranks (--nproc N), the cores split "
                         "between them, micro-batch B per rank")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.warmup >= a.steps:
        sys.exit(f"bench.py: --warmup {a.warmup} leaves no timed step of --steps {a.steps}")
    if a.torch_only:
        return torch_steps(a)
    precisions = a.precision.split(",")
    for p in precisions:
        if p not in ("fp32", "bf16", "fp16"):
            sys.exit(f"bench.py: --precision {p}: expected fp32, bf16 or fp16")
    if a.isa:
        os.environ.update(ISA_CAPS[a.isa])

    import numpy as np
    import llama_ref as ref

    T, B = a.seq, a.micro_batch
    fpt = flops_per_token(SHAPE, T)
    print("command: " + shlex.join([sys.argv[0]] + sys.argv[1:]))
    print(f"shape: dim 512, 8 layers, 8 heads, ffn 1408, vocab 32000, seq {T}, micro-batch {B}, "
          f"{a.precision}, {a.threads} threads, one process; {fpt / 1e9:.3f} GFLOP per token; "
          + (f"instruction sets capped at {a.isa}; " if a.isa else "") +
          f"{a.steps} steps, median of the last {a.steps - a.warmup}")
    print(f"cpu: {cpu_name()}, {os.cpu_count()} cores visible")
    # (program, precision) -> [(s/step, peak RSS, mem_peak_bytes or None)], in run order.
    results = {}
    with tempfile.TemporaryDirectory(prefix="ft_bench_") as tmp:
        rng = np.random.default_rng(0)
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        ref.write_shard(os.path.join(data, "shard_00000.h5"),
                        rng.integers(0, SHAPE["vocab_size"],
                                     (a.steps + 1) * B * max(1, a.data_parallel) * T + 1),
                        SHAPE["vocab_size"])
        metrics = os.path.join(tmp, "metrics.jsonl")
        recipe = os.path.join(tmp, "bench.yaml")
        with open(recipe, "w") as f:
            f.write(f"""run: {{name: bench, output_dir: {tmp}/run, seed: 0}}
model: {{dim: 512, n_layers: 8, n_heads: 8, n_kv_heads: 8, ffn_dim: 1408, vocab_size: 32000,
        max_seq_len: {T}}}
data: {{train: {data}, seq_len: {T}, shuffle: false}}
training: {{steps: {a.steps}, micro_batch_size: {B}, global_batch_size: {B}, grad_clip: 1.0,
           precision: {precisions[0]}}}
optimizer: {{lr: 1.0e-4, weight_decay: 0.1}}
logging: {{every_steps: 1, metrics: {metrics}}}
runtime: {{threads: {a.threads}}}
""")

        def ft_run(extra_env=None, args=(), metrics_path=metrics):
            env = dict(os.environ, **(extra_env or {}))
            if os.path.exists(metrics_path):
                os.remove(metrics_path)
            out, rss = run_measured([a.ft, "train", recipe, *args], env)
            lines = [json.loads(l) for l in open(metrics_path) if '"loss"' in l]
            t = statistics.median([l["step_time_s"] for l in lines][a.warmup:])
            return out, t, rss, max(l["mem_peak_bytes"] for l in lines)

        kernels = isa = cpu_isa = None
        gemm16 = {}
        torch_info = None
        for i in range(a.pairs):
            print(f"  pair {i + 1}:", end="", flush=True)
            for prec in precisions:
                out, t, rss, mem = ft_run(args=[f"training.precision={prec}"])
                results.setdefault(("ft", prec), []).append((t, rss, mem))
                # ft corrects OpenBLAS's kernel choice on CPUs that OpenBLAS 0.3.21 does not
                # know (kernels::blas_better_coretype); a PyTorch on the same OpenBLAS (Debian's)
                # gets the same kernels, or the comparison would measure the BLAS choice instead.
                if "BLAS kernels " in out:
                    kernels = out.split("BLAS kernels ")[1].split(",")[0].split()[0]
                if "oneDNN ISA " in out:
                    isa = out.split("oneDNN ISA ")[1].split()[0].rstrip(",")
                if "16-bit GEMMs " in out:
                    gemm16[prec] = out.split("16-bit GEMMs ")[1].splitlines()[0].strip()
                if "CPU kernels " in out:
                    cpu_isa = out.split("CPU kernels ")[1].split(",")[0].split()[0]
                print(f" ft {prec} {t:.3f} s/step", end="", flush=True)
                if a.skip_torch:
                    continue
                env = dict(os.environ)
                if kernels and "OPENBLAS_CORETYPE" not in env:
                    env["OPENBLAS_CORETYPE"] = kernels
                out, rss = run_measured(
                    [a.torch_python, os.path.abspath(__file__), "--torch-only",
                     "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads",
                     str(a.threads), "--precision", prec, "--seq", str(T), "--micro-batch",
                     str(B)], env)
                torch_info = json.loads(out.strip().splitlines()[-1])
                results.setdefault(("torch", prec), []).append((torch_info["step_s"], rss, None))
                print(f", torch {prec} {torch_info['step_s']:.3f} s/step", end="", flush=True)
            print(flush=True)

        rows = [(f"ft {p}", results[("ft", p)]) for p in precisions]
        if torch_info:
            rows += [(f"{torch_info['name']} {p if p == 'fp32' else p + ' autocast'}",
                      results[("torch", p)]) for p in precisions]
        if a.data_parallel > 1:
            n = a.data_parallel
            _, t, rss, mem = ft_run(
                args=["--nproc", str(n), f"training.global_batch_size={B * n}",
                      f"runtime.threads={max(1, a.threads // n)}", f"run.output_dir={tmp}/run_dp"])
            # n ranks each process B samples per step: per-step time normalised to B samples.
            rows.append((f"ft data {n} (ZeRO 0)", [(t / n, None, mem)]))
        if a.tensor_parallel > 1:
            n = a.tensor_parallel
            _, t, rss, mem = ft_run(args=["--nproc", str(n), f"parallel.tensor={n}",
                                          f"runtime.threads={max(1, a.threads // n)}",
                                          f"run.output_dir={tmp}/run_tp"])
            rows.append((f"ft tensor {n}", [(t, None, mem)]))
        profile = None
        if a.profile:
            profile = ""
            for prec in precisions:
                out, _, _, _ = ft_run(extra_env={"FT_PROFILE": "1"},
                                      args=[f"training.precision={prec}"])
                table = out[out.index("ft: FT_PROFILE"):] if "ft: FT_PROFILE" in out else out
                profile += f"\n{prec}:\n" + table.rstrip() + "\n"

    print(f"ft: CPU kernels {cpu_isa or '?'}, BLAS kernels {kernels or '?'} (OpenBLAS core type), "
          f"oneDNN ISA {isa or '?'}"
          + "".join(f"; {p} GEMMs {path}" for p, path in gemm16.items()))
    if torch_info:
        coretype = os.environ.get("OPENBLAS_CORETYPE", kernels)
        print(f"{torch_info['name']} ({a.torch_python}): attention {torch_info['attention']}, "
              f"CPU capability {torch_info['cpu_capability']}, BLAS {torch_info['blas']}, "
              f"RSS after import {torch_info['rss_import'] / 2**20:.0f} MiB"
              + (f" (OPENBLAS_CORETYPE={coretype})" if torch_info["blas"] != "mkl" and coretype
                 else ""))
    print(f"\n{'':32s} {'s/step':>8s} {'spread':>13s} {'tokens/s':>9s} {'GFLOP/s':>8s} "
          f"{'peak RSS':>9s} {'ft mem_peak':>11s}")
    medians = []
    for name, runs in rows:
        t = statistics.median(r[0] for r in runs)
        medians.append(t)
        tps = B * T / t
        rss = [r[1] for r in runs if r[1]]
        mem = [r[2] for r in runs if r[2]]
        rss_s = f"{max(rss) / 2**20:6.0f} MiB" if rss else ""
        mem_s = f"{max(mem) / 2**20:7.0f} MiB" if mem else ""
        print(f"{name:32s} {t:8.3f} {spread([r[0] for r in runs]):>13s} {tps:9.0f} "
              f"{tps * fpt / 1e9:8.1f} {rss_s:>9s} {mem_s:>11s}")
    n = len(precisions)
    for k, p in enumerate(precisions):
        if p != "fp32" and "fp32" in precisions:
            f = precisions.index("fp32")
            print(f"ft {p} speed / ft fp32 speed: {medians[f] / medians[k]:.2f}x"
                  + (f"; pytorch {p} autocast / pytorch fp32: {medians[n + f] / medians[n + k]:.2f}x"
                     if torch_info else ""))
        if torch_info:
            print(f"ft speed / pytorch speed ({p}, median of {a.pairs} interleaved pairs): "
                  f"{medians[n + k] / medians[k]:.2f}x")
    if profile:
        print("\n" + profile.rstrip())


if __name__ == "__main__":
    main()
