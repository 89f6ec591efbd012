"""Writes a folder of random token shards (DESIGN.md §6) for the multi-rank tests.

    /usr/bin/python3 tests/ref/make_shards.py OUT_DIR --vocab 64 --samples 37 --seq-len 12 \
        [--shards 2] [--seed 5] [--mask 0.8]

Each shard holds samples·seq_len + 1 random tokens below --vocab and, with --mask, a loss_mask
that keeps each target with that probability. Deterministic for a given seed.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--samples", type=int, required=True, help="samples per shard")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mask", type=float, default=None, help="fraction of targets trained on")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out)
    for i in range(a.shards):
        toks = rng.integers(0, a.vocab, a.samples * a.seq_len + 1)
        mask = None if a.mask is None else (rng.random(toks.size) < a.mask).astype(np.uint8)
        ref.write_shard(os.path.join(a.out, f"shard_{i:05d}.h5"), toks, a.vocab, loss_mask=mask)


if __name__ == "__main__":
    main()
