"""The GPU check (issue 9, point 6): run on a machine with an NVIDIA GPU from a bundle made by
scripts/bundle.sh, it prints one summary and leaves its logs under --out.

    python3 scripts/gpu_check.py --bundle DIR --out DIR [--only NAME,...] [--skip NAME,...]

DIR is an unpacked bundle (ft, lib/, tests/, data/); scripts/gpu_check.sh unpacks the archive
and calls this. Standard library only: the GPU image has Python and PyTorch but may lack numpy,
h5py and transformers, so the bundle carries the token shards and the PyTorch comparison falls
back to tests/ref/llama_ref.py when transformers is missing.

Checks, in order (each PASS, FAIL or SKIP with a reason; a failure does not stop the next):
  env          GPU, driver, ft --version
  kernels      the CUDA kernel tests natively (tests/ft_cuda_kernel_tests) against the CPU
  ops          every op of the op list through the CUDA device against the CPU device, with each
               op's tolerance (tests/ft_ops_gpu_tests, the conformance harness of tests/ops/)
  lt_gemm      the cuBLASLt GEMMs against the CPU GEMMs (tests/lt_gemm_gpu_tests)
  device       the CUDA device: allocator, copies, pinned staging, out of memory
               (tests/ft_cuda_device_check)
  memcheck     compute-sanitizer --tool memcheck over the kernel tests
  racecheck    compute-sanitizer --tool racecheck over the kernel tests
  fp32_vs_cpu  50 steps on the GPU and on the CPU, fp32: losses within 1e-4 relative
  bf16_vs_cpu  the same in bf16: losses within 2e-2 relative (a stated tolerance: bf16 rounds
               activations to 8 mantissa bits, and the two backends sum in different orders)
  determinism  two GPU runs, bf16: every loss and gradient norm bit-identical
  bench        ~1B Llama (dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 5632, seq 2048, bf16),
               activation checkpointing off and on: tokens/s, MFU, peak memory
  torch        the same shape in PyTorch on the same GPU (bf16 autocast, sdpa, fused AdamW)

The device tool runs one command for at most 10 minutes: split the checks, e.g.
  --only env,kernels,ops,lt_gemm,device,fp32_vs_cpu,bf16_vs_cpu,determinism
  --only memcheck,racecheck
  --only bench,torch
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import flops_per_token  # noqa: E402  (6N + 12·L·T·C per token)

# Dense bf16 tensor-core peaks (FLOP/s, without sparsity) by device-name substring, for MFU.
# NVIDIA's data sheets: H100 SXM 989.4 T, H100 PCIe 756 T, H200 as H100 SXM, A100 312 T.
PEAKS = [("H200", 989.4e12), ("H100 PCIe", 756e12), ("H100", 989.4e12), ("A100", 312e12),
         ("L40S", 362e12), ("RTX 4090", 165e12)]

TINY = dict(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=704, vocab_size=512)
BIG = dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=5632, vocab_size=32000)


class Check:
    def __init__(self, out):
        self.out = out
        self.rows = []

    def log(self, name):
        return os.path.join(self.out, name + ".log")

    def run(self, name, cmd, timeout, env=None):
        """Runs cmd with its output in OUT/name.log; returns (exit code, output)."""
        t0 = time.time()
        with open(self.log(name), "a") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=timeout, env=env)
                rc, text = p.returncode, p.stdout
            except subprocess.TimeoutExpired as e:
                rc, text = 124, (e.stdout or b"").decode(errors="replace") + "\n[timed out]"
            except OSError as e:
                rc, text = 127, str(e)
            f.write(text + f"\n[exit {rc}, {time.time() - t0:.1f} s]\n")
        return rc, text

    def record(self, name, status, detail):
        self.rows.append((name, status, detail))
        print(f"{status:4s} {name:12s} {detail}", flush=True)


def write_recipe(path, shape, data, out_dir, steps, seq, micro, precision, device, ac=False,
                 metrics=None):
    with open(path, "w") as f:
        f.write(f"""run: {{name: gpu_check, output_dir: {out_dir}, seed: 0}}
model: {{dim: {shape['dim']}, n_layers: {shape['n_layers']}, n_heads: {shape['n_heads']},
        n_kv_heads: {shape['n_kv_heads']}, ffn_dim: {shape['ffn_dim']},
        vocab_size: {shape['vocab_size']}, max_seq_len: {seq}}}
data: {{train: {data}, seq_len: {seq}, shuffle: false}}
training: {{steps: {steps}, micro_batch_size: {micro}, global_batch_size: {micro},
           grad_clip: 1.0, precision: {precision},
           activation_checkpointing: {'true' if ac else 'false'}}}
optimizer: {{lr: 3.0e-4, weight_decay: 0.1}}
scheduler: {{name: cosine, warmup_steps: 5}}
logging: {{every_steps: 1, metrics: {metrics or os.path.join(out_dir, 'metrics.jsonl')}}}
runtime: {{device: {device}}}
""")


def read_metrics(path):
    try:
        return [json.loads(l) for l in open(path) if '"loss"' in l]
    except OSError:
        return []


def train(chk, name, ft, shape, data, work, steps, seq, micro, precision, device, ac=False,
          timeout=1800, env=None):
    run_dir = os.path.join(work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    recipe = os.path.join(run_dir, "recipe.yaml")
    write_recipe(recipe, shape, data, run_dir, steps, seq, micro, precision, device, ac)
    rc, text = chk.run(name, [ft, "train", recipe, "--resume", "never"], timeout, env=env)
    return rc, read_metrics(os.path.join(run_dir, "metrics.jsonl")), text


def compare(chk, name, a, b, rel):
    if not a or not b or len(a) != len(b):
        return chk.record(name, "FAIL", f"runs gave {len(a)} and {len(b)} metric lines")
    worst = max(abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-12) for x, y in zip(a, b))
    status = "PASS" if worst <= rel else "FAIL"
    chk.record(name, status, f"{len(a)} steps, worst loss difference {worst:.2e} relative "
               f"(bound {rel:g}); final loss GPU {a[-1]['loss']:.5f} CPU {b[-1]['loss']:.5f}")


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True, help="unpacked bundle folder")
    ap.add_argument("--out", required=True, help="logs and summary go here")
    ap.add_argument("--only", default="", help="comma-separated checks to run")
    ap.add_argument("--skip", default="", help="comma-separated checks to skip")
    ap.add_argument("--bench-micro-batch", type=int, default=4)
    ap.add_argument("--bench-steps", type=int, default=20)
    ap.add_argument("--device", default="cuda",
                    help="the device of the 'GPU' runs; cpu tries this script out on a machine "
                         "without a GPU (every comparison is then CPU against CPU)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    B = os.path.abspath(a.bundle)
    ft = os.path.join(B, "ft")
    tests = os.path.join(B, "tests", "ft_cuda_kernel_tests")
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    chk = Check(a.out)
    only = set(filter(None, a.only.split(",")))
    skip = set(filter(None, a.skip.split(",")))

    def want(n):
        return (not only or n in only) and n not in skip

    gpu = gpu_name()
    if want("env"):
        rc, text = chk.run("env", [ft, "--version"], 60)
        version = text.strip().splitlines()[0] if text.strip() else f"exit {rc}"
        chk.record("env", "PASS" if rc == 0 and gpu else "FAIL",
                   f"GPU: {gpu or 'none found by nvidia-smi'}; ft: {version}")

    has_tests = os.path.exists(tests)
    if want("kernels"):
        if not has_tests:
            chk.record("kernels", "SKIP", "the bundle has no tests/ft_cuda_kernel_tests")
        else:
            rc, text = chk.run("kernels", [tests], 1800)
            last = [l for l in text.splitlines()
                    if "test cases" in l or "assertions" in l or l.startswith("no GPU:")]
            # 77: no usable GPU here (the binary says why in one "no GPU: ..." line).
            chk.record("kernels", "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"),
                       "; ".join(last) or f"exit {rc}")
    if want("ops"):
        path = os.path.join(B, "tests", "ft_ops_gpu_tests")
        if not os.path.exists(path):
            chk.record("ops", "SKIP", "the bundle has no tests/ft_ops_gpu_tests")
        else:
            rc, text = chk.run("ops", [path], 900)
            # "N cases of M ops on cuda:0 (...): K failed" per device, and the failed cases'
            # lines (op, dtype, shape, worst element) in the log.
            last = [l.split("MESSAGE: ")[-1] for l in text.splitlines()
                    if " cases of " in l or l.startswith("no GPU:")]
            chk.record("ops", "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"),
                       "; ".join(last) or f"exit {rc}")
    for name, binary in (("lt_gemm", "lt_gemm_gpu_tests"), ("device", "ft_cuda_device_check")):
        if not want(name):
            continue
        path = os.path.join(B, "tests", binary)
        if not os.path.exists(path):
            chk.record(name, "SKIP", f"the bundle has no tests/{binary}")
            continue
        rc, text = chk.run(name, [path], 900)
        last = [l for l in text.splitlines() if l.strip()][-1:] or [f"exit {rc}"]
        chk.record(name, "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"), last[0])
    sanitizer = shutil.which("compute-sanitizer") or (
        "/usr/local/cuda/bin/compute-sanitizer"
        if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    for tool in ("memcheck", "racecheck"):
        if not want(tool):
            continue
        if not has_tests or not sanitizer:
            chk.record(tool, "SKIP", "no kernel tests in the bundle" if not has_tests
                       else "compute-sanitizer not found")
            continue
        rc, text = chk.run(tool, [sanitizer, "--tool", tool, "--error-exitcode", "99", tests],
                           2400)
        summary = [l for l in text.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY"
                   in l]
        chk.record(tool, "PASS" if rc == 0 else "FAIL", (summary[-1] if summary else f"exit {rc}"))

    data_tiny = os.path.join(B, "data", "tiny")
    data_big = os.path.join(B, "data", "big")
    for prec, rel in (("fp32", 1e-4), ("bf16", 2e-2)):
        n = f"{prec}_vs_cpu"
        if not want(n):
            continue
        rc_g, gpu_m, _ = train(chk, n, ft, TINY, data_tiny, work, 50, 128, 4, prec, a.device)
        rc_c, cpu_m, _ = train(chk, n + "_cpu", ft, TINY, data_tiny, work, 50, 128, 4, prec, "cpu")
        if rc_g or rc_c:
            chk.record(n, "FAIL", f"ft train exit {rc_g} (cuda), {rc_c} (cpu): see {chk.log(n)}")
        else:
            compare(chk, n, gpu_m, cpu_m, rel)

    if want("determinism"):
        runs = [train(chk, f"determinism_{i}", ft, TINY, data_tiny, work, 30, 128, 4, "bf16",
                      a.device) for i in (1, 2)]
        if any(r[0] for r in runs):
            chk.record("determinism", "FAIL", f"ft train exit {[r[0] for r in runs]}")
        else:
            key = [[(m["loss"], m["grad_norm"]) for m in r[1]] for r in runs]
            same = key[0] == key[1] and len(key[0]) == 30
            chk.record("determinism", "PASS" if same else "FAIL",
                       f"{len(key[0])} steps, losses and grad norms "
                       + ("bit-identical" if same else "differ"))

    fpt = flops_per_token(BIG, 2048)
    peak = next((p for k, p in PEAKS if k in gpu), None)
    bench = {}
    if want("bench"):
        # Attention on tensor cores (the default) with activation checkpointing off and on, and
        # the SIMT attention kernels (FT_CUDA_ATTENTION=simt) for the measured choice between them.
        simt = dict(os.environ, FT_CUDA_ATTENTION="simt")
        for n, ac, env in (("bench_ac_off", False, None), ("bench_ac_on", True, None),
                           ("bench_simt", False, simt)):
            rc, m, _ = train(chk, n, ft, BIG, data_big, work, a.bench_steps, 2048,
                             a.bench_micro_batch, "bf16", a.device, ac=ac, timeout=3000, env=env)
            timed = m[5:]
            if rc or not timed:
                chk.record(n, "FAIL", f"ft train exit {rc}, {len(m)} metric lines")
                continue
            t = sorted(x["step_time_s"] for x in timed)[len(timed) // 2]
            tps = a.bench_micro_batch * 2048 / t
            mem = max(x["mem_peak_bytes"] for x in m)
            mfu = f"{tps * fpt / peak:.1%}" if peak else "? (unknown GPU peak)"
            bench[n] = tps
            # Startup: process start to step 1 (setup and parameter init; target under 5 s).
            start = m[0].get("time_to_first_step_s")
            start = f", step 1 began {start:.1f} s after start" if start is not None else ""
            chk.record(n, "PASS", f"{tps:,.0f} tokens/s, MFU {mfu}, mem_peak "
                       f"{mem / 2**30:.1f} GiB, median step {t:.3f} s{start}")
    if want("torch"):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_bench_torch.py")
        rc, text = chk.run("torch", [sys.executable, script, "--micro-batch",
                                     str(a.bench_micro_batch), "--steps", str(a.bench_steps)],
                           3000)
        try:
            r = json.loads(text.strip().splitlines()[-1])
            mfu = f"{r['tokens_per_s'] * fpt / peak:.1%}" if peak else "?"
            ratio = (f"; ft/torch {bench['bench_ac_off'] / r['tokens_per_s']:.2f}x"
                     if "bench_ac_off" in bench else "")
            chk.record("torch", "PASS", f"{r['model']}: {r['tokens_per_s']:,.0f} tokens/s, MFU "
                       f"{mfu}, peak {r['peak_bytes'] / 2**30:.1f} GiB{ratio}")
        except (ValueError, IndexError, KeyError):
            chk.record("torch", "FAIL", f"exit {rc}: see {chk.log('torch')}")

    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(f"GPU: {gpu}\n")
        for n, s, d in chk.rows:
            f.write(f"{s:4s} {n:12s} {d}\n")
    failed = [n for n, s, _ in chk.rows if s == "FAIL"]
    print(f"gpu_check: {len(chk.rows) - len(failed)} of {len(chk.rows)} checks passed or skipped"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
