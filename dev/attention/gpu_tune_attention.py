#!/usr/bin/env python3
"""The fused attention kernel's forms on a GPU, in one command (issue 16's tuning).

    python3 dev/attention/gpu_tune_attention.py --bundle DIR --out DIR [--tuning T ...] [--reps N]

DIR is a tuning bundle (`FT_BUNDLE_TUNING=1 bash scripts/bundle.sh`: the default bundle has no
tuning lab). For each tuning T (a value of FT_CUDA_FUSED_TUNING, dev/attention/fused_variants.cu:
which instantiated form of the kernels runs; "" is ft's own), it runs the lab's native
fused-attention kernel tests (dev/attention/ft_attention_variants_tests) with it, then its
attention benchmark (dev/attention/ft_attention_variants_bench --path fused, ft's
ft_cuda_bench_attention on the lab's kernels) at gpu_check.py's ATTENTION_SHAPES. It prints one
row per tuning and shape, writes every result to OUT/tune.json, and writes to OUT/best_tuning.txt
the tuning with the least forward+backward time summed over the shapes, among those whose tests
passed. ft itself never reads FT_CUDA_FUSED_TUNING: a form that wins becomes ft's by a change to
ChosenForms (kernels/cuda/attention_fused.cuh), after which the bundle's step benchmarks
(scripts/gpu_lease.sh) run it. The measurements so far: dev/attention/NOTES.md.

Standard library only (the GPU image may lack numpy). Exit 0 when every tuning's tests passed.
"""

import argparse
import json
import os
import subprocess
import sys

# scripts/gpu_check.py, two folders up (in the repository and in the bundle alike).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from gpu_check import ATTENTION_SHAPES  # noqa: E402

# The defaults (fwd_mt=2, grid_lpt=1, dkdv_ilv=1, dq_mt=2, dq_kvbuf=1, dq_ilv=1) and the
# variants to compare them with. Measured on an H100 (2026-11-27), forward+backward ms summed over the
# shapes: before dK/dV's third buffer and the two-m-tile dQ 7.012; with them 6.504; then dK/dV's
# lse by cp.async 6.343, the forward's and dK/dV's exponentials between their products 6.445
# and 6.447, all three 6.274 (the defaults now; fused_variants.cu's Tuning has each figure);
# dq_kvbuf=2 6.526 (kept off); fwd_mt=1 7.070 and dkdv_minb=3 7.258 (off; dkdv_minb removed).
# Then (another machine of the same kind, 1-2% slower overall) 6.379 against dQ's exponentials
# between its products 6.309 (the default now), dq_kvbuf=2 6.349, dkdv_ilv=0 6.369.
TUNINGS = ["", "dkdv_ilv=0", "dq_ilv=0", "dq_kvbuf=2"]


def run(cmd, env, limit):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or "") if isinstance(e.stdout, str) else "timed out"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tuning", nargs="*", default=TUNINGS)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--combine", action="store_true",
                    help="also time the tunings faster than the defaults merged into one")
    ap.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in ATTENTION_SHAPES],
                    help="B,H,K,T,D each (default: gpu_check.py's ATTENTION_SHAPES)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lab = os.path.join(a.bundle, "dev", "attention")
    tests = os.path.join(lab, "ft_attention_variants_tests")
    bench = os.path.join(lab, "ft_attention_variants_bench")
    for exe in (tests, bench):
        if not os.access(exe, os.X_OK):
            sys.exit(f"gpu_tune_attention: {exe} is missing: make the bundle with "
                     "FT_BUNDLE_TUNING=1 bash scripts/bundle.sh")
    shapes = a.shapes
    results, ok_all = [], True
    log = open(os.path.join(a.out, "tune_log.txt"), "w")

    def measure(tu):
        """Runs tuning tu's tests and timings; returns whether its tests passed."""
        env = dict(os.environ, FT_CUDA_FUSED_TUNING=tu)
        rc, text = run([tests], env, 180)
        log.write(f"== tests, tuning '{tu}': exit {rc}\n{text[-3000:]}\n")
        passed = rc == 0
        summary = [l for l in text.splitlines() if "test cases:" in l or "assertions:" in l]
        print(f"tuning '{tu or 'default'}': fused kernel tests {'PASS' if passed else 'FAIL'} "
              f"({'; '.join(s.strip() for s in summary)})", flush=True)
        rc, text = run([bench, "--path", "fused", "--reps", str(a.reps)] + shapes, env, 120)
        log.write(f"== bench, tuning '{tu}': exit {rc}\n{text[-3000:]}\n")
        for line in text.splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            r.update(tuning=tu, tests_passed=passed)
            results.append(r)
            if "error" in r:
                print(f"  {r}", flush=True)
                continue
            print(f"  B{r['B']} H{r['H']} K{r['K']} T{r['T']} D{r['D']}: fwd {r['fwd_ms']:.3f} ms "
                  f"{r['fwd_tflops']:.0f} TF/s, fwd+bwd {r['fwd_bwd_ms']:.3f} ms "
                  f"{r['fwd_bwd_tflops']:.0f} TF/s, bwd {r['fwd_bwd_ms'] - r['fwd_ms']:.3f} ms",
                  flush=True)
        return passed

    def totals():
        """Forward+backward ms summed over the shapes, per tuning whose tests passed."""
        out = {}
        for tu in dict.fromkeys(r["tuning"] for r in results):
            rows = [r for r in results if r["tuning"] == tu and "error" not in r]
            if all(r["tests_passed"] for r in rows) and len(rows) == len(shapes):
                out[tu] = sum(r["fwd_bwd_ms"] for r in rows)
        return out

    for tu in a.tuning:
        ok_all &= measure(tu)
    # --combine: the tunings faster than the defaults, merged into one (each key=value of the
    # faster tuning wins where two set the same key), timed as one more tuning.
    base = totals().get("")
    if a.combine and base is not None:
        faster = sorted((v, tu) for tu, v in totals().items() if tu and v < base)
        merged = {}
        for _, tu in reversed(faster):
            merged.update(item.split("=", 1) for item in tu.split(","))
        combo = ",".join(f"{k}={v}" for k, v in sorted(merged.items()))
        if len(faster) > 1 and combo not in totals():
            ok_all &= measure(combo)
    with open(os.path.join(a.out, "tune.json"), "w") as f:
        json.dump(results, f, indent=1)

    sums = totals()
    choice = min(sums, key=sums.get) if sums else ""
    with open(os.path.join(a.out, "best_tuning.txt"), "w") as f:
        f.write(choice)
    print("forward+backward ms summed over the shapes: "
          + ", ".join(f"'{k or 'default'}' {v:.3f}" for k, v in sums.items()))
    print(f"best tuning: '{choice}' (empty: the defaults)")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
