"""Compares every layout run by scripts/test_layouts.sh with the one-process run.

Per step: loss within 1e-5 relative (the issue's bound; ≤ 7e-7 seen), grad_norm within 1e-4
relative at step 1 and 5e-4 over the 10 steps; evaluation losses within 1e-5 relative. Final parameters: each layout's ranks wrote their slices (FT_TEST_DUMP_PARAMS);
tensor slices are put back together along the split axis, tensors held by several ranks
(replicated norms, tied embeddings on two stages) must agree exactly, and every element must
match the one-process run within 5e-5 absolute (parameters here are O(0.01–1); lr is 0.01).
Why these bounds: a layout sums the same numbers in another order (all-reduces of partial
sums), so step 1's gradients differ by ~1e-8 relative. Adam then amplifies such differences
for elements whose gradient is tiny (the update is ~lr·sign(g) early on), and they grow about
tenfold every two steps: by step 10 the grad norm differs by up to ~1.3e-4 relative (seen with
the vectorised SwiGLU sigmoid; 5e-5 with libm's exp before it: which elements get amplified
depends on the last bits of every op) and a few parameters by ~5e-5 of their tensor's largest
entry, while the loss stays within ~7e-7.
How far depends on the BLAS kernels, which set the summation order: with OpenBLAS's SkylakeX
(AVX-512) kernels the worst parameter differs by 4.9e-6, with its Haswell (AVX2) kernels — what
an environment's OPENBLAS_CORETYPE=Haswell selects, as the development sandbox sets — by 1.9e-5
(tensor-parallel layouts, the same losses within
2e-7). So the bound is 5e-5 = 0.5% of one step's largest Adam move (lr): far below what a wrong
slice, a missing all-reduce or a mis-ordered micro-batch does (the loss moves by > 1e-3 at once).
Layouts that keep the summation order (pipeline only) match bit for bit.
    /usr/bin/python3 tests/ref/compare_layouts.py TMP_DIR SOURCE_DIR
"""

import glob
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402

tmp = sys.argv[1]

# Relative loss (and evaluation loss) and grad_norm bounds over the 10 steps, the same at step 1
# (before any update), and an absolute parameter bound. fp32 as explained above.
# bf16 (training.precision: bf16; the dumped parameters are then the bf16 compute copy): a layout
# rounds other partial sums to bf16 (tensor parallelism rounds each rank's share, then sums in
# fp32), so activations differ by a bf16 unit (2^-8 relative) here and there from step 1 on. At
# step 1 that moves the loss by ~1e-6 and the grad norm by ~4e-5, but how far depends on the
# draw: over run.seed 1-10, tensor2 against one process at step 1 moved the loss by 8e-8 to 4.4e-5
# and the grad norm by 1.7e-5 to 1.4e-3, with the Philox init as with the one before it (issue
# 16; the table is in the commit that set these bounds). The earlier bounds, 1e-5 and 1e-3, sat
# inside that spread (3-4 of 10 seeds failed them with either init). Bounds 1e-4 and 5e-3 cover
# it with a margin of 2-3x and still catch what they are for: a missing all-reduce or a wrong
# slice moves the loss by > 1e-2. After an update
# the masters differ by fp32 rounding, their bf16 copies then by whole bf16 units, and this tiny
# model (dim 32, lr 0.01, clipping at 0.3) amplifies that as it amplifies fp32 differences, only
# from a 1e4 times larger start: by step 10 the loss differs by up to 5e-3 relative (seen) and the
# grad norm by up to 2x at a single step (one-process bf16 against one-process fp32 differs as
# much: 0.91 vs 1.39 at step 9). So over 10 steps only the loss is bounded tightly (2e-2, the
# tolerance PyTorch's own bf16 autocast is held to against ft), the grad norm loosely (3x) and the
# parameters at 0.1 absolute (seen 4.6e-2; parameters are O(0.01-1)).
BOUNDS = {
    "fp32": {"loss": 1e-5, "grad_norm": 5e-4, "params": 5e-5, "loss1": 1e-5, "grad_norm1": 1e-4},
    "bf16": {"loss": 2e-2, "grad_norm": 2.0, "params": 0.1, "loss1": 1e-4, "grad_norm1": 5e-3},
}


def metrics(name):
    return [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]


def evals(name):
    return [json.loads(l)["eval_loss"] for l in open(f"{tmp}/{name}/metrics.jsonl") if '"eval_loss"' in l]


def header_metadata(path):
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def assemble(name):
    """The whole model from a layout's per-rank files."""
    pieces = {}  # tensor name -> {tensor rank: tensor}
    splits = {}
    for path in sorted(glob.glob(f"{tmp}/{name}/params/rank_*.safetensors")):
        meta = header_metadata(path)
        t = int(meta["tensor_rank"])
        for k, v in ref.read_safetensors(path).items():
            splits[k] = meta["split:" + k]
            prev = pieces.setdefault(k, {}).get(t)
            if prev is not None:  # held twice (tied embedding on first and last stage)
                assert torch.equal(prev, v), f"{name}: copies of {k} differ"
            pieces[k][t] = v
    whole = {}
    for k, by_rank in pieces.items():
        parts = [by_rank[t] for t in sorted(by_rank)]
        if splits[k] == "replicated":
            for p in parts[1:]:
                assert torch.equal(parts[0], p), f"{name}: replicas of {k} differ"
            whole[k] = parts[0]
        else:
            whole[k] = torch.cat(parts, dim=0 if splits[k] == "rows" else 1)
    return whole


precision = sys.argv[3] if len(sys.argv) > 3 else "fp32"
bound = BOUNDS[precision]
failures = []
ref_metrics = metrics("single")
ref_params = assemble("single")
assert len(ref_metrics) == 10 and ref_params, "one-process run incomplete"
names = [l.strip() for l in open(f"{tmp}/layouts.txt") if l.strip() and l.strip() != "single"]
for name in names:
    got = metrics(name)
    loss = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref_metrics))
    norm = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(got, ref_metrics))
    ev_ref, ev = evals("single"), evals(name)
    ev_err = max(abs(a - b) / b for a, b in zip(ev, ev_ref)) if ev_ref else 0.0
    if len(ev) != 2 or len(ev_ref) != 2:
        failures.append(f"{name}: expected 2 evaluations, got {len(ev)} (one process: {len(ev_ref)})")
    params = assemble(name)
    worst, worst_name = 0.0, ""
    if set(params) != set(ref_params):
        failures.append(f"{name}: tensors {sorted(set(params) ^ set(ref_params))[:4]} missing or extra")
    for k, v in ref_params.items():
        if k in params:
            if params[k].shape != v.shape:
                failures.append(f"{name}: {k} shape {tuple(params[k].shape)} vs {tuple(v.shape)}")
                continue
            err = (params[k] - v).abs().max().item()
            if err > worst:
                worst, worst_name = err, k
    # DPO (test_layouts.sh --dpo): the rewards and log-probabilities, summed over the pipeline
    # and data groups (DpoRun::take_stats), within the loss's bound relative to their size (or
    # 1, as step 1's rewards are 0); reward_accuracy is left out, a count that flips with a
    # margin near 0.
    dpo_keys = [k for k in ("rewards_chosen", "rewards_rejected", "logps_chosen",
                            "logps_rejected") if k in ref_metrics[0]]
    dpo_err = max([abs(a[k] - b[k]) / max(abs(b[k]), 1.0)
                   for a, b in zip(got, ref_metrics) for k in dpo_keys] or [0.0])
    if dpo_keys and not all(k in a for a in got for k in dpo_keys):
        failures.append(f"{name}: DPO metrics missing")
    loss1 = abs(got[0]["loss"] - ref_metrics[0]["loss"]) / abs(ref_metrics[0]["loss"])
    norm1 = abs(got[0]["grad_norm"] - ref_metrics[0]["grad_norm"]) / ref_metrics[0]["grad_norm"]
    ok = (len(got) == 10 and loss <= bound["loss"] and norm <= bound["grad_norm"]
          and worst <= bound["params"] and ev_err <= bound["loss"] and loss1 <= bound["loss1"]
          and norm1 <= bound["grad_norm1"] and dpo_err <= bound["loss"])
    print(f"{'ok  ' if ok else 'FAIL'} {name:28s} step 1: loss {loss1:.1e} grad_norm {norm1:.1e}; "
          f"loss {loss:.1e}  eval {ev_err:.1e}  grad_norm {norm:.1e}  "
          f"params max |diff| {worst:.1e} ({worst_name})" +
          (f"  dpo {dpo_err:.1e}" if dpo_keys else ""))
    if not ok:
        failures.append(name)
print(f"layouts: {len(names) - len(failures)} of {len(names)} match the one-process run")
sys.exit(1 if failures else 0)
