"""Writes folders of random token shards (DESIGN.md §6) for the CLI and multi-rank tests.

    /usr/bin/python3 tests/ref/make_shards.py OUT_DIR[:N] [OUT_DIR[:N] ...] --vocab 64 \
        (--samples 37 --seq-len 12 | --tokens 2000) [--shards 2] [--seed 5] [--mask 0.8]

Each shard holds samples·seq_len + 1 (or --tokens) random tokens below --vocab and, with --mask,
a loss_mask that keeps each target with that probability. With --pairs P instead, each shard
holds P preference pairs (format ft-preference): a prompt of 1-5 random tokens after BOS (1),
two completions of 1-6 random tokens and EOS (2). Each OUT_DIR gets N shards (default
--shards), drawn in the order given from one generator, so that `train:2 valid:1` gives a
validation set that does not repeat the training data. Deterministic for a given seed.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="+", help="OUT_DIR or OUT_DIR:N (N shards in that folder)")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--samples", type=int, help="samples per shard (with --seq-len)")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--tokens", type=int, help="tokens per shard, instead of --samples/--seq-len")
    ap.add_argument("--shards", type=int, default=2, help="shards per folder without :N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mask", type=float, default=None, help="fraction of targets trained on")
    ap.add_argument("--pairs", type=int, help="preference pairs per shard (no --samples/--tokens)")
    a = ap.parse_args()
    if a.pairs is not None:
        rng = np.random.default_rng(a.seed)
        for spec in a.out:
            out, _, n = spec.rpartition(":") if ":" in spec else (spec, "", "")
            os.makedirs(out)
            for i in range(int(n) if n else a.shards):
                def seq(lo, hi):
                    return [int(x) for x in rng.integers(3, a.vocab, rng.integers(lo, hi + 1))]
                pairs = [([1] + seq(1, 5), seq(1, 6) + [2], seq(1, 6) + [2]) for _ in range(a.pairs)]
                ref.write_preference_shard(os.path.join(out, f"shard_{i:05d}.h5"), pairs, a.vocab)
        return
    if (a.tokens is None) == (a.samples is None or a.seq_len is None):
        ap.error("give either --samples and --seq-len, or --tokens")
    n_tokens = a.tokens if a.tokens is not None else a.samples * a.seq_len + 1
    rng = np.random.default_rng(a.seed)
    for spec in a.out:
        out, _, n = spec.rpartition(":") if ":" in spec else (spec, "", "")
        os.makedirs(out)
        for i in range(int(n) if n else a.shards):
            toks = rng.integers(0, a.vocab, n_tokens)
            mask = None if a.mask is None else (rng.random(toks.size) < a.mask).astype(np.uint8)
            ref.write_shard(os.path.join(out, f"shard_{i:05d}.h5"), toks, a.vocab, loss_mask=mask)


if __name__ == "__main__":
    main()
