"""PyTorch's attention kernels on the GPU, the comparison of scripts/gpu_check.py's attention
stage (ft's side: tests/ft_cuda_bench_attention): F.scaled_dot_product_attention, causal, bf16,
under torch.nn.attention.sdpa_kernel with one backend at a time (FLASH_ATTENTION: FlashAttention-2
as PyTorch ships it; CUDNN_ATTENTION: cuDNN's fused attention), forward and forward+backward,
timed with CUDA events after a warmup. Prints one JSON line per shape and backend; exit 1 when
a backend failed (its line says why), 77 when it cannot run here (no PyTorch 2.3+, no GPU).

    python3 scripts/gpu_bench_attention.py [--shapes B,H,K,T,D ...] [--backends flash,cudnn]
                                           [--warmup N] [--reps N]

Layout: q (B, H, T, D), k and v (B, K, T, D), contiguous: sdpa's own layout (ft's is (B, T, H,
D); the kernels read strides either way). GQA: enable_gqa=True (PyTorch 2.5 and later) where
the backend takes it; where it does not (an older PyTorch, or a backend that refuses it), k and
v are repeated to H heads with repeat_interleave BEFORE the timed region, so the copy is not
timed, and the backward's dk and dv stay per query head (the sum over each group of 4 heads,
which a GQA kernel does inside, is not timed either). The line's "gqa" says which was used.
Forward: with inputs that require grad, so the kernel saves its logsumexp as ft's forward does.
Forward+backward: out = sdpa(q, k, v); torch.autograd.grad(out, (q, k, v), dout), so gradients
are returned, not accumulated into .grad.
FLOPs as ft_cuda_bench_attention counts them: forward 4·B·H·T²·D/2 (causal), backward 2.5× the
forward, forward+backward 3.5×.
"""

import argparse
import json
import sys

SHAPES = ["4,32,8,2048,64", "2,32,8,2048,128", "1,32,8,8192,64"]


def fwd_flop(B, H, T, D):
    return 4 * B * H * T * T * D / 2


def time_ms(torch, body, warmup, reps, device):
    for _ in range(warmup):
        body()
    if device == "cpu":  # --cpu-smoke: wall clock, the numbers mean nothing
        import time
        t0 = time.perf_counter()
        for _ in range(reps):
            body()
        return (time.perf_counter() - t0) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        body()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def run_one(torch, F, sdpa_kernel, backend, shape, warmup, reps, device, dtype):
    B, H, K, T, D = shape
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(B, K, T, D, device=device, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(B, K, T, D, device=device, dtype=dtype, generator=g, requires_grad=True)
    dout = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g)
    gqa = "none" if H == K else "enable_gqa"
    with sdpa_kernel(backend):
        kk, vv = k, v
        gqa_arg = {"enable_gqa": True} if H != K else {}
        call = (lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True,
                                                                **gqa_arg))
        try:
            out = call(q, kk, vv)
            torch.autograd.grad(out, (q, kk, vv), dout)
        except (RuntimeError, TypeError):  # no enable_gqa, or this backend refuses it
            if H == K:
                raise
            gqa = "repeat_interleave (untimed)"
            kk = k.detach().repeat_interleave(H // K, dim=1).requires_grad_()
            vv = v.detach().repeat_interleave(H // K, dim=1).requires_grad_()

            def call(a, b, c):
                return F.scaled_dot_product_attention(a, b, c, is_causal=True)
            out = call(q, kk, vv)
            torch.autograd.grad(out, (q, kk, vv), dout)
        fwd = time_ms(torch, lambda: call(q, kk, vv), warmup, reps, device)

        def fwd_bwd():
            o = call(q, kk, vv)
            torch.autograd.grad(o, (q, kk, vv), dout)
        both = time_ms(torch, fwd_bwd, warmup, reps, device)
    f = fwd_flop(B, H, T, D)
    return {"B": B, "H": H, "K": K, "T": T, "D": D, "gqa": gqa, "warmup": warmup, "reps": reps,
            "fwd_ms": round(fwd, 4), "fwd_bwd_ms": round(both, 4),
            "fwd_tflops": round(f / (fwd * 1e9), 2),
            "fwd_bwd_tflops": round(3.5 * f / (both * 1e9), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,K,T,D each")
    ap.add_argument("--backends", default="flash,cudnn")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    # Tries the script out without a GPU: the math backend on the CPU, fp32, a tiny shape.
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    # Exit 77 where this cannot run here (no PyTorch, none new enough, no GPU), with the reason.
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(json.dumps({"error": f"no PyTorch here ({e})"}))
        return 77
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print(json.dumps({"error": f"PyTorch {torch.__version__} has no torch.nn.attention "
                                   "(2.3 or later needed)"}))
        return 77
    if not a.cpu_smoke and not torch.cuda.is_available():
        print(json.dumps({"error": "no GPU: torch.cuda.is_available() is false"}))
        return 77
    if a.cpu_smoke:
        device, dtype = "cpu", torch.float32
        backends = [("math", SDPBackend.MATH)]
        shapes = [(1, 4, 2, 19, 16)]
    else:
        device, dtype = "cuda", torch.bfloat16
        names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
        backends = [(n, getattr(SDPBackend, names[n])) for n in a.backends.split(",")]
        shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes]
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    failed = 0
    for shape in shapes:
        for name, backend in backends:
            row = {"impl": f"torch sdpa {name}", "torch": torch.__version__, "device": gpu}
            try:
                row.update(run_one(torch, F, sdpa_kernel, backend, shape, a.warmup, a.reps,
                                   device, dtype))
            except Exception as e:  # one backend's refusal must not hide the others
                failed += 1
                row.update(dict(zip("BHKTD", shape)), error=f"{type(e).__name__}: {e}"[:300])
            print(json.dumps(row), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
