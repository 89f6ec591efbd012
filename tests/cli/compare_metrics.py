"""Compares two runs' per-step metrics (DESIGN.md §7) for the CLI tests (not a test itself).

    /usr/bin/python3 tests/cli/compare_metrics.py RUN_A RUN_B --loss-rel X --norm-rel Y \
        [--step1-loss-rel X1 --step1-norm-rel Y1] [--min-entries N] [--keys loss,grad_norm,...]

RUN_A and RUN_B are run folders (their metrics.jsonl) or metrics files. For each step the last
value of each key counts. Both runs must have the same (step, key) entries, at least
--min-entries of them, and each value of A must be within the relative bound of B's: --norm-rel
for grad_norm, --loss-rel for every other key; a bound of 0 asks for the same bits. Step 1 may
be held tighter (--step1-*: before any update, no optimizer step has amplified a difference yet).
Prints the worst relative difference per key; exits 1 naming the first entry out of bounds.
"""

import argparse
import json
import os
import sys


def per_step(path, keys):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    out = {}
    with open(path) as f:
        for j in map(json.loads, f):
            for k in keys:
                if k in j:
                    out[(j["step"], k)] = j[k]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--loss-rel", type=float, required=True)
    ap.add_argument("--norm-rel", type=float, required=True)
    ap.add_argument("--step1-loss-rel", type=float, help="default: --loss-rel")
    ap.add_argument("--step1-norm-rel", type=float, help="default: --norm-rel")
    ap.add_argument("--min-entries", type=int, default=1)
    ap.add_argument("--keys", default="loss,grad_norm,eval_loss")
    args = ap.parse_args()
    keys = args.keys.split(",")
    step1_loss = args.loss_rel if args.step1_loss_rel is None else args.step1_loss_rel
    step1_norm = args.norm_rel if args.step1_norm_rel is None else args.step1_norm_rel

    a, b = per_step(args.a, keys), per_step(args.b, keys)
    if a.keys() != b.keys() or len(a) < args.min_entries:
        only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
        sys.exit(f"different steps: {len(a)} and {len(b)} entries (at least "
                 f"{args.min_entries} wanted); only in {args.a}: {only_a[:4]}, only in "
                 f"{args.b}: {only_b[:4]}")
    worst = {}
    for k in sorted(a):
        # Equal values (null loss scales of a run without one included) differ by 0.
        rel = 0.0 if a[k] == b[k] else abs(a[k] - b[k]) / max(abs(b[k]), 1e-30)
        worst[k[1]] = max(worst.get(k[1], 0.0), rel)
        if k[1] == "grad_norm":
            bound = step1_norm if k[0] == 1 else args.norm_rel
        else:
            bound = step1_loss if k[0] == 1 else args.loss_rel
        if not rel <= bound:  # NaN is out of bounds too
            sys.exit(f"step {k[0]} {k[1]}: {a[k]!r} vs {b[k]!r} ({rel:.2e} > {bound:g})")
    print("  worst relative differences: "
          + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))


if __name__ == "__main__":
    main()
