"""ft's DPO (training.objective dpo, lib/train/dpo.h) against a float64 PyTorch DPO written here,
run by ctest:
    /usr/bin/python3 tests/ref/test_dpo.py BUILD_DIR SOURCE_DIR

The data are preference shards (format ft-preference, DESIGN.md §6) written with h5py: pairs of
random prompts and completions of varied lengths in two shards, one pair whose chosen completion
is cut to data.seq_len and one whose prompt fills it (dropped), so N = 7 pairs kept; the
reference applies the same rules (a row is the sequence's first T + 1 tokens).
1. sigmoid DPO with dpo.reference: initial, 4 steps of 4 pairs (2 micro-batches of 2 pairs, so
   steps straddle epochs), AdamW, an evaluation after steps 2 and 4 on a validation set:
   - step 1's loss is ln 2 to 1e-12 and its rewards and margin 0 (the policy is the reference,
     computed by the same forward);
   - every step's loss and gradient norm within 1e-5 and 1e-4 relative of the float64 reference
     (fp32 on ft's side), rewards_chosen, rewards_rejected, reward_margin, logps_chosen,
     logps_rejected within 1e-4 (relative to their scale), reward_accuracy equal where no
     pair's margin is within rounding of 0; eval lines alike (eval_loss, eval_reward_margin...);
   - the reference was computed once and kept in the run folder (dpo_reference.json/.bin), and a
     second run with the same recipe reuses it (says so, same metrics bit for bit).
2. ipo (per-token mean log-probabilities) and sigmoid with label_smoothing 0.1, two steps each,
   and hinge, four steps (some pair passes the hinge, so both of its branches run): loss and
   gradient norm against the reference.
3. A toy preference set: sentences of a small grammar (determiner, adjective, noun, verb,
   determiner, noun, each from its own words) after a prompt token; the chosen completion is the
   sentence, the rejected one the same words shuffled. A randomly initialised model trained with
   DPO alone reaches reward_accuracy >= 0.9 on held-out pairs (the validation set) and on the
   last training steps; so does a LoRA adapter on that random model's frozen base with
   dpo.reference: base.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402
from dpo_ref import reference_run, rows_of  # noqa: E402

BUILD, SOURCE = sys.argv[1], sys.argv[2]
FT = os.path.join(BUILD, "ft")
torch.set_num_threads(2)
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def random_pairs(rng, vocab, n, T):
    out = []
    for _ in range(n):
        p = [1] + list(rng.integers(3, vocab, rng.integers(1, 5)))
        c = list(rng.integers(3, vocab, rng.integers(1, 6))) + [2]
        r = list(rng.integers(3, vocab, rng.integers(1, 6))) + [2]
        out.append(([int(x) for x in p], [int(x) for x in c], [int(x) for x in r]))
    return out


def setup(case, T):
    cfg = ref.Config(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=61)
    model = ref.Llama(cfg, seed=5, std=0.08)
    hf = os.path.join(case, "hf")
    ref.save_hf_folder(model, hf)
    rng = np.random.default_rng(7)
    pairs = random_pairs(rng, cfg.vocab_size, 6, T)
    # One chosen completion longer than the window (cut), one prompt that fills it (dropped).
    pairs.insert(2, ([1, 5, 6, 7], list(range(10, 22)) + [2], [30, 31, 2]))
    pairs.insert(5, ([1] + list(range(40, 51)), [8, 2], [9, 2]))
    data = os.path.join(case, "data")
    os.makedirs(data)
    ref.write_preference_shard(os.path.join(data, "a.h5"), pairs[:4], cfg.vocab_size)
    ref.write_preference_shard(os.path.join(data, "b.h5"), pairs[4:], cfg.vocab_size)
    kept = [rows_of(p, T) for p in pairs]
    check(sum(k is None for k in kept) == 1 and len(rows_of(pairs[2], T)[0][0]) == T,
          f"{case}: one pair dropped, one cut ({len(pairs)} written)")
    kept = [k for k in kept if k is not None]
    valid = os.path.join(case, "valid")
    os.makedirs(valid)
    vpairs = random_pairs(np.random.default_rng(8), cfg.vocab_size, 4, T)
    ref.write_preference_shard(os.path.join(valid, "v.h5"), vpairs, cfg.vocab_size)
    return cfg, model, hf, data, valid, kept, [rows_of(p, T) for p in vpairs]


def run_ft(case, hf, data, valid, T, steps, dpo, extra_args=()):
    metrics = os.path.join(case, "metrics.jsonl")
    r = os.path.join(case, "r.yaml")
    with open(r, "w") as f:
        f.write(f"""run: {{output_dir: {case}/run, seed: 1}}
model: {{from: {hf}}}
data: {{train: {data}, valid: {valid}, seq_len: {T}, shuffle: false}}
training: {{objective: dpo, steps: {steps}, micro_batch_size: 2, global_batch_size: 4, grad_clip: 0,
  eval_every_steps: 2, eval_batches: 1}}
dpo: {dpo}
optimizer: {{lr: 0.01, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}}
scheduler: {{name: constant}}
logging: {{every_steps: 1, metrics: {metrics}}}
runtime: {{threads: 2}}
""")
    if os.path.exists(metrics):
        os.remove(metrics)
    res = subprocess.run([FT, "train", r, *extra_args], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{case}: ft train failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        return None, res
    return [json.loads(l) for l in open(metrics)], res


def close(a, b, tol, scale=None):
    return abs(a - b) <= tol * max(abs(b) if scale is None else scale, 1e-3)


def sigmoid_case(tmp):
    case = os.path.join(tmp, "sigmoid")
    os.makedirs(case)
    T, steps = 10, 4
    cfg, model, hf, data, valid, kept, vkept = setup(case, T)
    lines, res = run_ft(case, hf, data, valid, T, steps, "{beta: 0.5, loss: sigmoid}")
    if lines is None:
        return
    check("dpo: 7 preference pairs" in res.stdout and "1 with a completion cut" in res.stdout
          and "1 left out" in res.stdout, f"sigmoid: the header counts the pairs: {res.stdout[:600]}")
    check("the reference's log-probabilities of 7 pairs" in res.stdout,
          "sigmoid: the reference pass is announced with its pairs")
    want, evals = reference_run(model, kept, vkept, steps, "sigmoid", 0.5, 0.0)
    step_lines = {l["step"]: l for l in lines if "loss" in l}
    eval_lines = {l["step"]: l for l in lines if "eval_loss" in l}
    first = step_lines.get(1, {})
    check(abs(first.get("loss", 0) - math.log(2)) <= 1e-12 and first.get("reward_margin") == 0
          and first.get("rewards_chosen") == 0 and first.get("reward_accuracy") == 0,
          f"sigmoid: step 1's loss is ln 2 and its rewards 0: {first}")
    keys = ["rewards_chosen", "rewards_rejected", "reward_margin", "logps_chosen", "logps_rejected"]
    for s, (loss, norm, m, per_pair) in enumerate(want, start=1):
        got = step_lines.get(s)
        if got is None:
            check(False, f"sigmoid: no metrics line for step {s}")
            continue
        check(close(got["loss"], loss, 1e-5) and close(got["grad_norm"], norm, 1e-4),
              f"sigmoid: step {s} loss ft {got['loss']:.8f} torch {loss:.8f}, grad_norm ft "
              f"{got['grad_norm']:.6f} torch {norm:.6f}")
        bad = [k for k in keys if not close(got[k], m[k], 1e-4, scale=abs(m["logps_chosen"]) * 0.5
                                            if k.startswith("logps") else 0.05)]
        check(not bad, f"sigmoid: step {s} metrics {[(k, got[k], m[k]) for k in bad]}")
        if s > 1 and bool((per_pair["reward_margin"].abs() > 1e-5).all()):
            check(got["reward_accuracy"] == m["reward_accuracy"],
                  f"sigmoid: step {s} reward_accuracy ft {got['reward_accuracy']} torch "
                  f"{m['reward_accuracy']}")
    check(sorted(eval_lines) == sorted(evals), f"sigmoid: evaluations after {sorted(eval_lines)}")
    for s, (loss, m) in evals.items():
        got = eval_lines.get(s, {})
        check(close(got.get("eval_loss", 1e9), loss, 1e-5) and
              close(got.get("eval_reward_margin", 1e9), m["reward_margin"], 1e-4, scale=0.05),
              f"sigmoid: eval after step {s}: loss ft {got.get('eval_loss')} torch {loss}, margin "
              f"ft {got.get('eval_reward_margin')} torch {m['reward_margin']}")
    # Throughput: two rows a pair, 6·N + 12·L·T·C a token (DESIGN.md §7).
    C, L = cfg.dim, cfg.n_layers
    n = L * (2 * C * C + 2 * C * cfg.n_kv_heads * cfg.head_dim + 3 * C * cfg.ffn_dim)
    want = (6 * (n + cfg.vocab_size * C) + 12 * L * T * C) * 2 * 4 * T
    check(all(abs(l["tflops"] * l["step_time_s"] * 1e12 - want) <= 1e-9 * want
              for l in step_lines.values()), f"sigmoid: tflops counts both rows ({want:.6g})")
    kept_json = os.path.join(case, "run", "dpo_reference.json")
    check(os.path.exists(kept_json) and json.load(open(kept_json))["train_pairs"] == 7,
          "sigmoid: the reference is kept in the run folder")
    again, res2 = run_ft(case, hf, data, valid, T, steps, "{beta: 0.5, loss: sigmoid}")
    if again is not None:
        check("reference's log-probabilities from" in res2.stdout and
              [l.get("loss") for l in again] == [l.get("loss") for l in lines],
              "sigmoid: a second run reuses the kept reference, with the same losses")


def loss_kind_case(tmp, kind, beta, eps, steps=2):
    case = os.path.join(tmp, f"{kind}_{eps}")
    os.makedirs(case)
    T = 10
    cfg, model, hf, data, valid, kept, vkept = setup(case, T)
    lines, _ = run_ft(case, hf, data, valid, T, steps,
                      f"{{beta: {beta}, loss: {kind}, label_smoothing: {eps}}}")
    if lines is None:
        return
    want, _ = reference_run(model, kept, vkept, steps, kind, beta, eps)
    if kind == "hinge":  # both branches: some pair past the hinge (beta·z > 1) at some step
        check(any(bool((per_pair["reward_margin"] > 1).any()) for *_, per_pair in want),
              "hinge: some pair's beta*z passes 1 (the loss's flat branch runs)")
    step_lines = {l["step"]: l for l in lines if "loss" in l}
    for s, (loss, norm, m, _) in enumerate(want, start=1):
        got = step_lines.get(s, {"loss": 1e9, "grad_norm": 1e9})
        check(close(got["loss"], loss, 1e-5) and close(got["grad_norm"], norm, 1e-4),
              f"{kind} (label_smoothing {eps}): step {s} loss ft {got['loss']:.8f} torch "
              f"{loss:.8f}, grad_norm ft {got['grad_norm']:.6f} torch {norm:.6f}")


def toy_case(tmp, label="toy", lora=False):
    case = os.path.join(tmp, label)
    os.makedirs(case)
    rng = np.random.default_rng(13)
    classes = [list(range(3 + 6 * k, 9 + 6 * k)) for k in range(4)]  # det, adj, noun, verb
    order = [0, 1, 2, 3, 0, 2]

    def pairs(n):
        out = []
        for _ in range(n):
            sent = [int(rng.choice(classes[c])) for c in order]
            shuffled = list(sent)
            while shuffled == sent:
                shuffled = [int(x) for x in rng.permutation(sent)]
            out.append(([1, 40], sent + [2], shuffled + [2]))
        return out

    for name, n in (("data", 256), ("valid", 64)):
        os.makedirs(os.path.join(case, name))
        ref.write_preference_shard(os.path.join(case, name, "s.h5"), pairs(n), 48)
    metrics = os.path.join(case, "metrics.jsonl")
    r = os.path.join(case, "r.yaml")
    with open(r, "w") as f:
        f.write(f"""run: {{output_dir: {case}/run, seed: 2}}
model: {{dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 64, vocab_size: 48, max_seq_len: 16}}
data: {{train: {case}/data, valid: {case}/valid, seq_len: 10}}
training: {{objective: dpo, steps: 60, micro_batch_size: 8, global_batch_size: 16,
  eval_every_steps: 60, eval_batches: 4}}
dpo: {{beta: 0.1{", reference: base" if lora else ""}}}
optimizer: {{lr: {0.01 if lora else 0.003}}}
{"adapter: {type: lora, r: 8, alpha: 16, target_modules: [all-linear]}" if lora else ""}
scheduler: {{name: cosine, warmup_steps: 5}}
logging: {{every_steps: 1, metrics: {metrics}}}
runtime: {{threads: 2}}
""")
    res = subprocess.run([FT, "train", r], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{label}: ft train failed: {res.stderr[-1500:]}")
        return
    lines = [json.loads(l) for l in open(metrics)]
    steps = [l for l in lines if "reward_accuracy" in l]
    evals = [l for l in lines if "eval_reward_accuracy" in l]
    last = sum(l["reward_accuracy"] for l in steps[-5:]) / 5
    check(len(evals) == 1 and evals[0]["eval_reward_accuracy"] >= 0.9 and last >= 0.9,
          f"{label}: reward_accuracy of the last 5 steps {last:.3f}, held out "
          f"{evals[0]['eval_reward_accuracy'] if evals else None} (first step "
          f"{steps[0]['reward_accuracy']}, margin {steps[-1]['reward_margin']:.3f})")


def main():
    with tempfile.TemporaryDirectory(prefix="ft_dpo_") as tmp:
        sigmoid_case(tmp)
        loss_kind_case(tmp, "ipo", 0.5, 0.0)
        loss_kind_case(tmp, "hinge", 2.0, 0.0, steps=4)
        loss_kind_case(tmp, "sigmoid", 0.5, 0.1)
        toy_case(tmp)
        # LoRA on the random model's frozen base, the reference that base (the adapter off).
        toy_case(tmp, "toy_lora", lora=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


main()
