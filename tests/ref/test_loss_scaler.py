"""ft's fp16 loss scaler (lib/optim/loss_scaler.h) against the rules it claims to follow, run by
ctest:
    /usr/bin/python3 tests/ref/test_loss_scaler.py BUILD_DIR SOURCE_DIR

Random overflow patterns (a step overflows or not; some patterns with bursts long enough to
reach the minimum scale) go through build/tests/ft_loss_scaler_replay, which prints, per step,
the scale used, whether the step was skipped, whether the run stops, and the next scale. Each
sequence must equal, exactly (scales are powers of two, so no rounding is involved):

1. PyTorch's GradScaler (init_scale 2^16, growth 2, backoff 0.5, growth_interval N) with ft's
   hysteresis 1 and window N. torch 1.13 has no CPU kernel for torch._amp_update_scale_ (the
   rule GradScaler.update runs); when the installed torch has one, it is the reference, else
   the rule written out below: overflow: scale * 0.5 and tracker 0; clean: tracker + 1, and at
   the interval scale * 2 (kept only if finite in fp32) and tracker 0. GradScaler has no
   minimum; ft's is set to 2^-120 and patterns whose GradScaler scale gets near it are not
   compared.
2. DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py) with its
   defaults consecutive_hysteresis False, raise_error_at_min_scale True, written out in its own
   terms (iteration counter, last overflow iteration, hysteresis counter); its exception at the
   minimum scale is ft's stop. Its scale, a Python float, has no ceiling: compared while it
   stays within fp32 (2^127), where ft's stops growing.
3. Megatron-LM's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py): growth and
   hysteresis trackers, a minimum but no stop, so compared up to ft's first stop.
4. ft's own bound, training.max_skipped_steps: DeepSpeed's sequence cut at the step that makes
   that many consecutive skips, which stops.
"""

import os
import random
import subprocess
import sys

import numpy as np
import torch

BUILD, SOURCE = sys.argv[1], sys.argv[2]
REPLAY = os.path.join(BUILD, "tests", "ft_loss_scaler_replay")
failures = []
BIG = 10**9  # max_skipped_steps that never bounds


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def ft_replay(loss_scale, initial, min_scale, window, hysteresis, max_skipped, pattern):
    """[(used, skip, stop, after)] as ft computes them, up to and including a stop."""
    out = subprocess.run([REPLAY, repr(float(loss_scale)), repr(float(initial)),
                          repr(float(min_scale)), str(window), str(hysteresis), str(max_skipped),
                          pattern], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.split("\n"):
        if line:
            used, skip, stop, after = line.split()
            rows.append((float.fromhex(used), skip == "1", stop == "1", float.fromhex(after)))
    return rows


def torch_update_scale():
    """torch._amp_update_scale_ on CPU when this torch has it, else None."""
    try:
        s = torch.full((1,), 1.0)
        torch._amp_update_scale_(s, torch.zeros(1, dtype=torch.int32), torch.zeros(1), 2.0, 0.5, 1)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return torch._amp_update_scale_


def gradscaler(pattern, init, interval, kernel):
    """GradScaler's scale sequence (float32, as its scale tensor)."""
    rows = []
    if kernel is not None:
        scale = torch.full((1,), float(init))
        tracker = torch.zeros(1, dtype=torch.int32)
        for c in pattern:
            used = float(scale.item())
            kernel(scale, tracker, torch.full((1,), 1.0 if c == "x" else 0.0), 2.0, 0.5, interval)
            rows.append((used, c == "x", False, float(scale.item())))
        return rows
    scale, tracker = np.float32(init), 0
    for c in pattern:
        used = float(scale)
        if c == "x":
            scale, tracker = np.float32(scale * np.float32(0.5)), 0
        else:
            tracker += 1
            if tracker == interval:
                with np.errstate(over="ignore"):
                    grown = np.float32(scale * np.float32(2.0))
                if np.isfinite(grown):
                    scale = grown
                tracker = 0
        rows.append((used, c == "x", False, float(scale)))
    return rows


def deepspeed(pattern, init, min_scale, window, hysteresis, max_skipped=BIG):
    """DeepSpeed's update_scale in its own terms; its raise at the minimum is a stop. With
    max_skipped, ft's bound on consecutive skips is added on top."""
    cur_scale, cur_iter, last_overflow_iter, cur_hysteresis = float(init), 0, -1, hysteresis
    consecutive, rows = 0, []
    for c in pattern:
        used, overflow, stop = cur_scale, c == "x", False
        if overflow:
            consecutive += 1
            if hysteresis == 1 or cur_hysteresis == 1:
                if cur_scale == min_scale:
                    stop = True  # DeepSpeed: "Current loss scale already at minimum"
                else:
                    cur_scale = max(cur_scale / 2.0, min_scale)
            else:
                cur_hysteresis -= 1
            last_overflow_iter = cur_iter
        else:
            consecutive = 0
            if (cur_iter - last_overflow_iter) % window == 0:
                cur_hysteresis = hysteresis  # consecutive_hysteresis False: only on growth
                cur_scale *= 2.0
        cur_iter += 1
        stop = stop or consecutive >= max_skipped
        rows.append((used, overflow, stop, cur_scale))
        if stop:
            break
    return rows


def megatron(pattern, init, min_scale, window, hysteresis):
    scale, growth_tracker, hysteresis_tracker = np.float32(init), 0, hysteresis
    rows = []
    for c in pattern:
        used = float(scale)
        if c == "x":
            growth_tracker = 0
            hysteresis_tracker -= 1
            if hysteresis_tracker <= 0:
                scale = max(np.float32(scale * np.float32(0.5)), np.float32(min_scale))
        else:
            growth_tracker += 1
            if growth_tracker == window:
                growth_tracker = 0
                hysteresis_tracker = hysteresis
                scale = np.float32(scale * np.float32(2.0))
        rows.append((used, c == "x", False, float(scale)))
    return rows


def same(got, want, compare_after_of_stop=True):
    """First differing step, or None."""
    if len(got) != len(want):
        n = min(len(got), len(want))
        return f"{len(got)} steps from ft, {len(want)} expected (first differing at or before {n})"
    for i, (g, w) in enumerate(zip(got, want)):
        if g[:3] != w[:3] or (g[3] != w[3] and (compare_after_of_stop or not g[2])):
            return f"step {i + 1}: ft (used, skip, stop, after) = {g}, expected {w}"
    return None


def pattern_of(rng, n, p, burst_p=0.0, burst_len=0):
    out = []
    while len(out) < n:
        if burst_p and rng.random() < burst_p:
            out.extend("x" * burst_len)
        else:
            out.append("x" if rng.random() < p else ".")
    return "".join(out[:n])


def main():
    rng = random.Random(20260511)
    kernel = torch_update_scale()
    source = "torch._amp_update_scale_" if kernel else "the rule written out"
    print(f"GradScaler reference: {source} (torch {torch.__version__})")

    # 1. GradScaler: hysteresis 1, window = growth_interval, no minimum in reach.
    compared = grown_to_cap = 0
    for interval in (1, 3, 50, 2000):
        for p in (0.0005, 0.02, 0.1, 0.3):
            for _ in range(3):
                pat = pattern_of(rng, 4000, p)
                want = gradscaler(pat, 65536.0, interval, kernel)
                if min(r[3] for r in want) < 2.0**-100:
                    continue  # GradScaler has no minimum; ft's (2^-120) would be met
                got = ft_replay(0, 65536, 2.0**-120, interval, 1, BIG, pat)
                diff = same(got, want)
                if diff:
                    check(False, f"GradScaler interval {interval} p {p}: {diff}")
                    return
                compared += 1
                grown_to_cap += max(r[3] for r in want) == 2.0**127
    check(compared >= 30, f"{compared} patterns equal PyTorch GradScaler's scale sequence "
                          f"(hysteresis 1, window = growth_interval)")
    check(grown_to_cap > 0, f"{grown_to_cap} of them grew to 2^127, where fp32 doubling stops")

    # 2 and 3. DeepSpeed and Megatron, with hysteresis and a minimum; bursts reach the minimum.
    stops = forgiven = 0
    ds_compared = mg_compared = 0
    for window in (1, 4, 16, 1000):
        for hysteresis in (1, 2, 3):
            for min_scale, init in ((1.0, 65536.0), (0.25, 16.0), (1024.0, 4096.0), (3.0, 64.0)):
                for p, burst_p, burst_len in ((0.05, 0.0, 0), (0.2, 0.01, 12), (0.01, 0.02, 25)):
                    pat = pattern_of(rng, 1200, p, burst_p, burst_len)
                    want = deepspeed(pat, init, min_scale, window, hysteresis)
                    # DeepSpeed's scale is a Python float without a ceiling; ft's stays a finite
                    # fp32 (GradScaler's rule), so patterns are compared up to 2^127.
                    past = [i for i, r in enumerate(want) if r[3] > 2.0**127]
                    if past:
                        want = want[: past[0]]
                    pat = pat[: len(want)]  # and nothing after a stop
                    got = ft_replay(0, init, min_scale, window, hysteresis, BIG, pat)
                    diff = same(got, want)
                    if diff:
                        check(False, f"DeepSpeed window {window} hysteresis {hysteresis} min "
                                     f"{min_scale} init {init}: {diff}")
                        return
                    ds_compared += 1
                    stops += got[-1][2]
                    forgiven += any(r[1] and r[0] == r[3] for r in got)
                    # Megatron: the same, up to ft's stop (Megatron stays at the minimum).
                    mg = megatron(pat, init, min_scale, window, hysteresis)[: len(got)]
                    if got[-1][2]:  # ft stopped: the steps before, and the stop's scale used
                        diff = same(got[:-1], mg[:-1]) or (
                            None if got[-1][:2] == mg[-1][:2] else f"last step: {got[-1]} {mg[-1]}")
                    else:
                        diff = same(got, mg)
                    if diff:
                        check(False, f"Megatron window {window} hysteresis {hysteresis} min "
                                     f"{min_scale}: {diff}")
                        return
                    mg_compared += 1
    check(ds_compared == 144, f"{ds_compared} patterns equal DeepSpeed's DynamicLossScaler "
                              f"(windows 1-1000, hysteresis 1-3, minimum 0.25-1024)")
    check(mg_compared == 144, f"{mg_compared} equal Megatron's DynamicGradScaler up to ft's stop")
    check(stops >= 20, f"{stops} of them stop at the minimum scale, as DeepSpeed raises")
    check(forgiven >= 20, f"{forgiven} have an overflow forgiven by hysteresis")

    # 4. max_skipped_steps on top of DeepSpeed's rule, and with a static scale.
    bounded = 0
    for max_skipped in (1, 3, 7):
        for _ in range(8):
            pat = pattern_of(rng, 800, 0.1, 0.02, 9)
            got = ft_replay(0, 2.0**20, 1.0, 8, 2, max_skipped, pat)
            want = deepspeed(pat, 2.0**20, 1.0, 8, 2, max_skipped)
            diff = same(got, want, compare_after_of_stop=False)
            if diff:
                check(False, f"max_skipped_steps {max_skipped}: {diff}")
                return
            bounded += got[-1][2] and sum(1 for r in got[-max_skipped:] if r[1]) == max_skipped
            # A static scale: never moves; only max_skipped_steps stops it.
            static = ft_replay(512, 65536, 1, 8, 2, max_skipped, pat)
            run, want_static = 0, []
            for c in pat:
                run = run + 1 if c == "x" else 0
                want_static.append((512.0, c == "x", run >= max_skipped, 512.0))
                if run >= max_skipped:
                    break
            diff = same(static, want_static)
            if diff:
                check(False, f"static scale 512, max_skipped_steps {max_skipped}: {diff}")
                return
    check(bounded >= 12, f"{bounded} runs stopped by max_skipped_steps after exactly that many "
                         f"consecutive skips; static scales never move")


if __name__ == "__main__":
    if not os.path.exists(REPLAY):
        print(f"FAIL {REPLAY} is missing: build the test tools (cmake --build {BUILD})")
        sys.exit(1)
    main()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all loss scaler reference checks passed")
