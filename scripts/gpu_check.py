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
  nccl         NCCL, one rank (tests/ft_nccl_check: ncclCommInitRank, two ncclCommSplits, every
               collective in f32/f64/bf16/f16 against host staging bit for bit, wait and
               wait_on stream order), with libnccl.so.2 from the loader's path, else PyTorch's
               wheels (nvidia.nccl's lib/, torch's lib/); the row names the NCCL found. With NCCL
               2.30 or newer (NCCL_MULTI_RANK_GPU_ENABLE=1 lets two ranks share one GPU; older
               NCCL refuses with "Duplicate GPU detected") and an mpirun on the machine, also
               ft train of the tiny model on runtime.communicator=nccl as data 2 and as tensor 2,
               two ranks on the one GPU, against one rank (tests/cli/compare_metrics.py, fp32
               without TF32, losses 1e-4 and gradient norms 1e-3 relative); else the row says
               which of the two was missing and that the two-rank runs were skipped; then each
               of the two again with FT_CUDA_GRAPHS=1 against itself without (data 2's micro-
               batch recorded with its NCCL all-reduces, tensor 2's with the tensor ones; the
               same bits). Limit 180 s (estimate: 60 s, not measured)
  memcheck     compute-sanitizer --tool memcheck over the kernel tests
  racecheck    compute-sanitizer --tool racecheck over the kernel tests
  fp32_vs_cpu  50 steps on the GPU and on the CPU, fp32: losses within 1e-4 relative
  bf16_vs_cpu  the same in bf16: losses within 2e-2 relative (a stated tolerance: bf16 rounds
               activations to 8 mantissa bits, and the two backends sum in different orders)
  packing      30 steps with data.pack (documents packed into windows, attention and RoPE per
               document) on the GPU and on the CPU, bf16: losses within 2e-2 relative, and the
               run's packing line
  generate     scripts/gpu_generate_parity.py: ft generate's greedy 32 tokens (fp32, KV cache)
               against transformers' generate on the same GPU, for each of llama, qwen2,
               mistral, qwen3 the image's transformers has; ft's and transformers' tokens/s on
               a random Llama of dim 1024 and 16 layers in bf16 (reported, not checked)
  determinism  two GPU runs, bf16: every loss and gradient norm bit-identical
  attention    ft's attention (tests/ft_cuda_bench_attention: the fused kernel, and the
               chunked-GEMM path) against PyTorch's sdpa with the flash and the cuDNN backend
               (scripts/gpu_bench_attention.py), same GPU, same run, causal bf16, at (B 4, H 32,
               K 8, T 2048, D 64), (B 2, H 32, K 8, T 2048, D 128), (B 1, H 32, K 8, T 8192,
               D 64): ms and TFLOP/s forward and forward+backward (forward FLOPs 4·B·H·T²·D/2,
               the backward counted as 2.5x the forward); results also in OUT/attention.json
  bench        ~1B Llama (dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 5632, seq 2048, bf16),
               activation checkpointing off and on, and FT_CUDA_ATTENTION=simt: tokens/s, MFU,
               peak memory, time to step 1 (ft's tokens/s kept in OUT/bench.json for the ratios
               of a later command with the same --out)
  torch        the same shape in PyTorch eager on the same GPU (bf16 autocast, sdpa, fused
               AdamW; scripts/gpu_bench_torch.py): tokens/s, MFU, ratio ft/PyTorch
  torch_compile  the ~1B shape in PyTorch with torch.compile (compiled in the warmup steps,
               which are not timed), ratio to ft's bench_ac_off
  profile      FT_PROFILE=1 at the ~1B shape, 8 steps: the whole table in OUT/profile.log, the
               attention and GEMM rows in the summary
  gemm_algos   issue 33 point 3: the ~1B bench with runtime.gemm_algos: measure (each GEMM
               shape's cuBLASLt algorithm timed among the heuristic's candidates), tokens/s and
               the ratio to bench_ac_off's (the heuristic's first, the default), from
               OUT/bench.json; a run with the gemm_algos stage decides the default
  overlap_update  issue 33 point 4: the ~1B bench with parallel.overlap_update (AdamW on its
               own stream under the next forward), tokens/s and the ratio to bench_ac_off's;
               a run with this stage decides the default
  sm90_step    issue 33 point 4: the ~1B bench with FT_CUDA_ATTENTION_SM90=1 (the Hopper
               attention kernels in the step), tokens/s and the ratio to bench_ac_off's; a run
               with this stage (and attention's sm90 rows) decides that default
  graphs       issue 33 point 3: FT_CUDA_GRAPHS=1 (each micro-batch's forward and backward, and
               the optimizer step's AdamW, replayed as CUDA graphs) against op by op, on SMALL (a ~125M Llama, seq 512,
               micro-batch 8, where launches weigh most: rows graphs_small_off, graphs_small
               with the ratio) and on the ~1B bench (row graphs with the ratio to
               bench_ac_off's); a run with this stage decides that default
  bench_long   the ~1B model at seq 8192, micro-batch 1, ft and PyTorch eager (row
               bench_long_torch with the ratio ft/PyTorch)
  bench_8b     8B-class layers (dim 4096, 8 layers, 32/8 heads, head dim 128, ffn 14336), seq
               2048, micro-batch 2, ft and PyTorch eager (bench_8b_torch)
  lora_8b      issue 28 point 6: ft trains a LoRA adapter (r 16, alpha 32, the seven
               projections) on bench_8b's layers, bf16, seq 2048, micro-batch 2, activation
               checkpointing: tokens/s, and the run's mem_peak_bytes against `ft plan --json`'s
               peak_bytes on its resolved recipe for the GPU's sm (PASS: equal to the byte, see
               adapter_stage); then PEFT + transformers at the same shape (gpu_bench_torch.py
               --lora 16 --ac: sdpa, bf16 base, fp32 adapter, autocast bf16, gradient
               checkpointing; row lora_8b_peft): PASS when ft's tokens/s is at least 1.5x
               PEFT's; SKIP when no PEFT imports (the image has none: --wheels, filled by
               scripts/peft_wheels.sh). Random weights, random tokens (data/big)
  qlora_8b     the same with adapter.type qlora (the blocks' matrices in NF4): tokens/s and peak
               = plan (no bitsandbytes on the image, so no PyTorch comparison)
  offload_3b   issue 29 point 7: a ~3B Qwen2-shaped full fine-tune (QWEN_3B: dim 2048, 36
               layers, 16/2 heads, ffn 11008, the bundle's vocabulary), bf16, seq 2048, 32
               sequences a step, activation checkpointing, 8 steps (the median of the last 5), at
               two batch shapes, each without offload (ZeRO 0) and with
               parallel.offload_optimizer: cpu (ZeRO 2): micro-batch 16 x 2 micro-batches (rows
               offload_3b_none, offload_3b: PASS when its tokens/s is at least 0.8x the run
               without and its mem_peak_bytes equals ft plan's to the byte) and micro-batch 4 x 8
               (rows offload_3b_none_m4, offload_3b_m4: the same bounds; offload pays a copy of
               every gradient to the host, and an add there, per micro-batch, so fewer larger
               micro-batches are where it is meant to run, as DeepSpeed's ZeRO-Offload advises);
               then with offload_params too (ZeRO 3, micro-batch 16, row offload_3b_params:
               peak = plan, tokens/s reported). --device cpu: SKIP (offload needs a GPU)
MFU = (6·N_matmul + 12·L·T·C) FLOPs per token (scripts/bench.py) against the GPU's dense bf16
peak (PEAKS below).

Each check has a time limit (LIMITS below; --limit-scale multiplies them) shared by its
commands; at the limit its processes are killed and it fails, and the next check runs, so a
hang costs one check only. The device tool runs one command for at most 10 minutes: split the
checks so that each command's limits add up to at most 570 s (estimated times on an H100 SXM
from the figures of issue 16 — ft 46k tokens/s at ~1B, PyTorch eager 52k, about 10 s of
startup per ft run and 20-30 s of import and model building per PyTorch run, 1-2 minutes of
torch.compile — not measured as a whole):
  --only env,attention,bench,torch,torch_compile            limits 570 s, about 4 min
  --only profile,bench_long,bench_8b                        limits 450 s, about 2 min
  --only env,device,nccl                                    limits 240 s, about 1.5 min
    (issue 17's point 6 alone: FT_LEASE_NCU=0 bash scripts/gpu_lease.sh 300 env,device,nccl;
    nccl no longer fits beside the second line: 630 s)
  --only env,kernels,ops,lt_gemm,device,fp32_vs_cpu,bf16_vs_cpu,determinism
                                                            limits 570 s, about 3 min
  --only env,packing,generate                               limits 240 s, about 1 min
    (issue 18: data.pack on the GPU against the CPU; ft generate against transformers)
  --only env,lora_8b,qlora_8b                               limits 330 s, about 2.5 min
    (issue 28 point 6; measured with the offload stage: see the next line)
  --only env,offload_3b                                     limits 450 s, about 4 min
    (issue 29 point 7; measured on an H200, 2026-11-30: env,offload_3b 250 s; and
    env,lora_8b,qlora_8b with the older 3-run offload_3b 234 s)
The three together, about 9 minutes, are the whole check but the sanitizers; the first two
(about 6 minutes) are issue 16's measurements. Measured on an H200 (2026-11-26, through
scripts/gpu_lease.sh): env,kernels,ops,bf16_vs_cpu,determinism,attention 49 s;
bench,torch,torch_compile,profile,bench_long 207 s; bench_8b 62 s. torch and torch_compile go with bench: their
ratios to ft need its tokens/s, and the device tool gives each command a fresh $OUT.
compute-sanitizer is slow and its time over the kernel tests on an H100 is not known here: a
session with the device time runs them one command each (--only memcheck, then --only
racecheck; limit 570 s each).
(Where --out is the same folder across commands, a later torch or torch_compile also finds
ft's tokens/s in OUT/bench.json.)
Issue 28 point 6 in one device call (15 minutes of device time in all, the machine's start of a
few minutes included): first, on this side, `bash scripts/peft_wheels.sh` (PEFT, accelerate and
psutil into build/wheels, 1.7 MB, from PyPI) and `scripts/bundle.sh` (a CUDA build; under
40 MiB); then the device tool's run with
    command: FT_LEASE_NCU=0 bash scripts/gpu_lease.sh 420 env,lora_8b,qlora_8b
    carry:   ["ft-bundle.tar.xz", "build/wheels"]        timeout_s: 480
Its rows come back in $OUT/summary.txt, the logs in $OUT/gpu_logs.tgz. --bench-steps stays at
20 (the first 5 untimed): bench_8b's 20 full-training steps at this shape took about 2 s in ft
(37,957 tokens/s) and 3 s in PyTorch of the stage's 62 s, so start-up and imports, not steps,
fill these stages. A stage that reaches its limit fails alone and its log says where it stood;
FT_LEASE_LIMIT_SCALE=2 (gpu_lease.sh's --limit-scale) doubles the limits of a rerun.
Without a GPU, --only lora_8b,qlora_8b --device cpu --bench-steps 7 tries the two stages out
at ADAPTER_TRY_OUT (about 40 s on two cores; the bundle needs ft and data/big only; the ratio's
row is then a SKIP, the peak = plan rows are checked as on the GPU, against the CPU's plan).
"""

import argparse
import json
import os
import shutil
import signal
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
# The graphs stage's small model (~125M parameters with the bundle's vocabulary), where a step's
# kernel launches weigh most.
SMALL = dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000)
# 8B-class layers (Llama 3 8B's dim, heads and ffn; 8 of its 32 layers; the bundle's vocabulary).
EIGHT_B = dict(dim=4096, n_layers=8, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32000)
# The adapter stages' shape under --device cpu, a try-out of their plumbing (seq 128): the
# bundle's vocabulary (data/big), everything else tiny.
ADAPTER_TRY_OUT = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256,
                       vocab_size=32000)
# The adapter stages' LoRA: PEFT's usual r 16, alpha 2r, on the seven projections of every block
# (gpu_bench_torch.py --lora gives PEFT the same).
ADAPTER = ["adapter.r=16", "adapter.alpha=32", "adapter.target_modules=all-linear"]
# lora_8b's bound on ft's tokens/s over PEFT + transformers' (issue 28 point 6).
LORA_SPEEDUP = 1.5
# offload_3b's shape: Qwen2.5-3B's blocks (2.8B parameters in them) with the bundle's vocabulary,
# and its bound on tokens/s with offload_optimizer over without (issue 29 point 7).
QWEN_3B = dict(dim=2048, n_layers=36, n_heads=16, n_kv_heads=2, ffn_dim=11008, vocab_size=32000)
OFFLOAD_MIN_RATIO = 0.8
# The attention stage's shapes (B, H, K, T, D), causal bf16: the ~1B model's layer at seq 2048,
# the same tokens at head dim 128, and seq 8192.
ATTENTION_SHAPES = [(4, 32, 8, 2048, 64), (2, 32, 8, 2048, 128), (1, 32, 8, 8192, 64)]

# Each stage's time limit in seconds (--limit-scale multiplies them): the commands of a stage
# share it, and a stage that reaches it is killed and fails, so a hang costs one stage only.
# Sized at about twice the stage's expected time on an H100 or more (the docstring's estimates),
# and so that each suggested split's limits add up to at most 570 s: a 10-minute command ends
# even when every stage of it hangs.
LIMITS = dict(env=30, kernels=150, ops=120, lt_gemm=60, device=30, nccl=180, memcheck=570,
              racecheck=570, fp32_vs_cpu=60, bf16_vs_cpu=60, packing=60, generate=150,
              determinism=60, attention=90,
              bench=150, torch=90, torch_compile=210, profile=120, gemm_algos=90,
              overlap_update=90, sm90_step=90, graphs=150,
              bench_long=150, bench_8b=180,
              lora_8b=180, qlora_8b=120, offload_3b=420)


class Check:
    def __init__(self, out):
        self.out = out
        self.rows = []
        self.deadline = None  # the current stage's end (time.time()), set by stage()

    def log(self, name):
        return os.path.join(self.out, name + ".log")

    def stage(self, limit_s):
        """Starts a stage: every command run until the next stage() shares limit_s seconds."""
        self.deadline = time.time() + limit_s

    def run(self, name, cmd, timeout, env=None):
        """Runs cmd with its output in OUT/name.log; returns (exit code, output). It gets at most
        `timeout` seconds and never more than what is left of its stage; on timeout its whole
        process group is killed (torch.compile's worker processes too, which would otherwise
        hold the pipe open), and the exit code is 124."""
        t0 = time.time()
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - t0)
        with open(self.log(name), "a") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            if timeout <= 0:
                rc, text = 124, "[not started: its stage's time limit is spent]"
            else:
                try:
                    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, env=env, start_new_session=True)
                    try:
                        text, _ = p.communicate(timeout=timeout)
                        rc = p.returncode
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        text, _ = p.communicate()
                        rc, text = 124, (text or "") + f"\n[timed out after {timeout:.0f} s]"
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
          timeout=1800, env=None, overrides=()):
    run_dir = os.path.join(work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    recipe = os.path.join(run_dir, "recipe.yaml")
    write_recipe(recipe, shape, data, run_dir, steps, seq, micro, precision, device, ac)
    rc, text = chk.run(name, [ft, "train", recipe, "--resume", "never", *overrides], timeout,
                       env=env)
    return rc, read_metrics(os.path.join(run_dir, "metrics.jsonl")), text


def compare(chk, name, a, b, rel):
    if not a or not b or len(a) != len(b):
        return chk.record(name, "FAIL", f"runs gave {len(a)} and {len(b)} metric lines")
    worst = max(abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-12) for x, y in zip(a, b))
    status = "PASS" if worst <= rel else "FAIL"
    chk.record(name, status, f"{len(a)} steps, worst loss difference {worst:.2e} relative "
               f"(bound {rel:g}); final loss GPU {a[-1]['loss']:.5f} CPU {b[-1]['loss']:.5f}")


def attention_stage(chk, bundle, here, device):
    """ft's attention (tests/ft_cuda_bench_attention: the fused kernel and the chunked-GEMM
    path) and PyTorch's sdpa flash and cuDNN backends (scripts/gpu_bench_attention.py) at
    ATTENTION_SHAPES, one row per shape; every result also in OUT/attention.json."""
    shapes = [",".join(map(str, sh)) for sh in ATTENTION_SHAPES]
    binary = os.path.join(bundle, "tests", "ft_cuda_bench_attention")
    rows, notes = [], []

    def json_lines(text):
        out = []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out
    if not os.path.exists(binary):
        notes.append("the bundle has no tests/ft_cuda_bench_attention")
    else:
        # The fused path twice: FlashAttention-2 (the default) and, on sm_90, its forward and
        # backward by the Hopper kernels (FT_CUDA_ATTENTION_SM90=1; rows "ft fused sm90").
        sm90 = dict(os.environ, FT_CUDA_ATTENTION_SM90="1")
        for path, env in (("fused", None), ("gemm", None), ("fused", sm90)):
            rc, text = chk.run("attention", [binary, "--path", path] + shapes, 120, env=env)
            got = json_lines(text)
            if env is not None:
                got = [dict(r, impl=r["impl"] + " sm90") for r in got
                       if r.get("kernels") == "sm90"]
            rows += got
            if rc == 77:
                notes.append(next((l for l in text.splitlines() if l.startswith("no GPU:")),
                                  "no GPU"))
                break
            if rc:
                notes.append(f"ft --path {path}: exit {rc}")
    torch_cmd = [sys.executable, os.path.join(here, "gpu_bench_attention.py"), "--shapes"] + shapes
    if device == "cpu":
        torch_cmd.append("--cpu-smoke")  # tries the PyTorch side out: tiny, math backend
    rc, text = chk.run("attention", torch_cmd, 120)
    for r in json_lines(text):
        if all(k in r for k in "BHKTD"):
            rows.append(r)
        else:  # no shape: the script could not start (e.g. a PyTorch without sdpa_kernel)
            notes.append(f"PyTorch: {r.get('error', r)}")
    if rc and rc != 77:
        notes.append(f"PyTorch: exit {rc}")
    # Nothing to run here (no GPU, no binary, no PyTorch) is a skip; an exit otherwise a failure.
    status = "FAIL" if any("exit" in n for n in notes) else "SKIP"
    with open(os.path.join(chk.out, "attention.json"), "w") as f:
        json.dump(rows, f, indent=1)
    if not rows:
        return chk.record("attention", status, "; ".join(notes) or "no results")

    def cell(r, key):
        if "error" in r:
            return "error (see attention.json)"
        return f"{r[key + '_ms']:.3f} ms {r[key + '_tflops']:.0f} TF/s"
    for sh in sorted({(r["B"], r["H"], r["K"], r["T"], r["D"]) for r in rows},
                     key=lambda x: ATTENTION_SHAPES.index(x) if x in ATTENTION_SHAPES else 99):
        mine = [r for r in rows if (r["B"], r["H"], r["K"], r["T"], r["D"]) == sh]
        parts = [f"{r['impl']}: fwd {cell(r, 'fwd')}, fwd+bwd {cell(r, 'fwd_bwd')}" for r in mine]
        fused = next((r for r in mine if r.get("path") == "fused" and "error" not in r), None)
        flash = next((r for r in mine if r["impl"] == "torch sdpa flash" and "error" not in r),
                     None)
        if fused and flash:
            parts.append(f"ft fused against sdpa flash, fwd+bwd: "
                         f"{flash['fwd_bwd_ms'] / fused['fwd_bwd_ms']:.2f}x its speed")
        if fused and sh == ATTENTION_SHAPES[0]:
            tf = fused["fwd_bwd_tflops"]
            parts.append(f"target >= 200 TF/s fwd+bwd: {'met' if tf >= 200 else 'not met'}")
        chk.record("attention", "PASS" if fused else ("FAIL" if notes == [] else status),
                   f"B{sh[0]} H{sh[1]} K{sh[2]} T{sh[3]} D{sh[4]}: " + "; ".join(parts))
    if notes:
        chk.record("attention", status, "; ".join(notes))


def profile_stage(chk, ft, data, work, a):
    """FT_PROFILE=1 at the ~1B shape for a few steps: the whole table stays in profile.log;
    the row gives attention's and the GEMMs' shares."""
    env = dict(os.environ, FT_PROFILE="1")
    rc, m, text = train(chk, "profile", ft, BIG, data, work, 8, 2048, a.bench_micro_batch,
                        "bf16", a.device, timeout=3000, env=env)
    keep = [l.strip() for l in text.splitlines()
            if l.strip().startswith(("attention", "GEMM, all three", "ft: FT_PROFILE"))]
    if rc or not keep:
        return chk.record("profile", "FAIL", f"ft train exit {rc}: see {chk.log('profile')}")
    chk.record("profile", "PASS", " | ".join(" ".join(l.split()) for l in keep))


def find_nccl():
    """The folder holding libnccl.so.2 and how it was found: (None, "") when the loader finds it
    itself (ldconfig's cache or LD_LIBRARY_PATH), else PyTorch's NCCL (the nvidia-nccl wheel's
    lib/, or torch's own lib/), else (None, why none was found)."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        cache = ""
    if "libnccl.so.2 " in cache:
        return None, "the loader's cache (ldconfig)"
    for d in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        if os.path.exists(os.path.join(d, "libnccl.so.2")):
            return None, f"LD_LIBRARY_PATH ({d})"
    import importlib.util
    for mod, sub in (("nvidia.nccl", "lib"), ("torch", "lib")):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        for root in (spec.submodule_search_locations or []) if spec else []:
            d = os.path.join(root, sub)
            if os.path.exists(os.path.join(d, "libnccl.so.2")):
                return d, f"PyTorch's wheel ({d})"
    return None, "libnccl.so.2 is not on the loader's path, and no nvidia.nccl or torch wheel "\
                 "holds one"


def nccl_version(text):
    """NCCL_VERSION_CODE (2.30.1: 23001) from ft_nccl_check's "nccl X.Y.Z" (or its refusal,
    "NCCL X.Y.Z is outside the supported range"), else 0."""
    import re
    m = re.search(r"\bnccl (\d+)\.(\d+)\.(\d+)", text, re.I)
    return int(m[1]) * 10000 + int(m[2]) * 100 + int(m[3]) if m else 0


def nccl_stage(chk, B, ft, data, work, device):
    """One rank through NCCL (tests/ft_nccl_check); with NCCL 2.30 or newer and an mpirun, data
    2 and tensor 2 as two ranks on the one GPU against one rank (rows nccl, nccl_dp2,
    nccl_tp2), and each again with FT_CUDA_GRAPHS=1 against itself without (nccl_dp2_graphs,
    nccl_tp2_graphs: the same bits)."""
    tool = os.path.join(B, "tests", "ft_nccl_check")
    folder, how = find_nccl()
    env = dict(os.environ)
    if folder:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [folder, env.get("LD_LIBRARY_PATH")]))
    version, found = 0, ""
    if not os.path.exists(tool):
        chk.record("nccl", "SKIP", "the bundle has no tests/ft_nccl_check (a build without "
                   "ft_nccl: nccl.h and MPI at configure)")
    else:
        rc, text = chk.run("nccl", [tool], 300, env=env)
        version = nccl_version(text)
        found = (f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100}"
                 if version else "NCCL version unknown (the check did not reach NCCL)")
        found += f", found through {how}"
        last = [l for l in text.splitlines() if l.startswith(("ft_nccl_check:", "no GPU:",
                                                              "no NCCL:"))]
        chk.record("nccl", "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"),
                   f"{found}; " + ("; ".join(last) or f"exit {rc}: see {chk.log('nccl')}"))
    # Two ranks on one GPU: NCCL below 2.30 refuses ("Duplicate GPU detected").
    # --device cpu (a try-out without a GPU) runs them on the CPU over MPI, whatever NCCL says:
    # the plumbing (mpirun, the recipes, the comparison) without NCCL.
    dry = device == "cpu"
    mpirun = shutil.which("mpirun")
    if not dry and version < 23000:
        chk.record("nccl_ranks", "SKIP", "two-rank runs (data 2, tensor 2) skipped: "
                   + (f"the NCCL found ({found}) is below 2.30, which refuses two ranks on one "
                      "GPU" if version else "no usable NCCL was found"))
        return
    if not mpirun:
        chk.record("nccl_ranks", "SKIP", "two-rank runs (data 2, tensor 2) skipped: no mpirun "
                   "on this machine (the bundle carries Open MPI's libmpi for ft, not its "
                   "launcher)")
        return
    try:
        mpi_version = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        mpi_version = "mpirun --version said nothing"
    comm = "mpi" if dry else "nccl"
    run_dir = os.path.join(work, "nccl_ranks")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    recipe = os.path.join(run_dir, "recipe.yaml")
    # fp32, 10 steps of 4 sequences of 128 tokens: each rank of data 2 takes 2 of them.
    write_recipe(recipe, TINY, data, os.path.join(run_dir, "one"), 10, 128, 2, "fp32", device)
    # runtime.tf32=false: exact fp32 GEMMs, so that the bounds below hold tensor 2's halved
    # GEMMs to fp32's rounding, not TF32's (~1e-3).
    common = ["train", recipe, "--resume", "never", "training.global_batch_size=4",
              "runtime.tf32=false"]
    rc, _ = chk.run("nccl_one", [ft] + common, 300, env=env)
    if rc:
        chk.record("nccl_ranks", "FAIL", f"the one-rank run: exit {rc}: see "
                   f"{chk.log('nccl_one')}")
        return
    args = [mpirun, "-np", "2", "--oversubscribe"]
    if os.getuid() == 0:
        args.append("--allow-run-as-root")
    env2 = dict(env, NCCL_MULTI_RANK_GPU_ENABLE="1", FT_CUDA_GRAPHS="0")
    for v in ("NCCL_MULTI_RANK_GPU_ENABLE", "LD_LIBRARY_PATH", "FT_CUDA_GRAPHS"):
        args += ["-x", v]
    compare_py = os.path.join(B, "tests", "cli", "compare_metrics.py")
    # Then each again with FT_CUDA_GRAPHS=1: data 2's micro-batch (a step's last) recorded with
    # its NCCL all-reduces, tensor 2's with the tensor all-reduces; the same bits as without.
    for name, override in (("nccl_dp2", "parallel.tensor=1"), ("nccl_tp2", "parallel.tensor=2"),
                           ("nccl_dp2_graphs", "parallel.tensor=1"),
                           ("nccl_tp2_graphs", "parallel.tensor=2")):
        out = os.path.join(run_dir, name)
        graphs = name.endswith("_graphs")
        if graphs and dry:
            continue
        rc, text = chk.run(name, args + [ft] + common + [
            f"run.output_dir={out}", f"logging.metrics={os.path.join(out, 'metrics.jsonl')}",
            f"runtime.communicator={comm}", override], 300,
            env=dict(env2, FT_CUDA_GRAPHS="1") if graphs else env2)
        if rc:
            chk.record(name, "FAIL", f"two ranks ({mpi_version}): exit {rc}: see "
                       f"{chk.log(name)}")
            continue
        header = [l for l in text.splitlines() if l.startswith("ft: device memory between "
                                                               "ranks:")]
        if not dry and not any(": nccl 2." in l for l in header):
            chk.record(name, "FAIL", f"the run did not use NCCL: {header or 'no header line'}")
            continue
        if graphs:
            recorded = [l for l in text.splitlines() if "recorded as a graph" in l
                        and "micro-batch" in l]
            want = "with its all-reduces" if name == "nccl_dp2_graphs" else ""
            if len(recorded) != 2 or any(want not in l for l in recorded):
                chk.record(name, "FAIL", "expected one micro-batch recording a rank"
                           + (" with its all-reduces" if want else "") + f": {recorded}")
                continue
            rc, cmp = chk.run(name + "_compare", [
                sys.executable, compare_py, out, os.path.join(run_dir, name[:-len("_graphs")]),
                "--loss-rel", "0", "--norm-rel", "0", "--step1-loss-rel", "0",
                "--step1-norm-rel", "0", "--min-entries", "20"], 60)
            worst = "; ".join(l.strip() for l in cmp.splitlines() if l.strip())[-300:]
            chk.record(name, "PASS" if rc == 0 else "FAIL",
                       f"{'data' if 'dp2' in name else 'tensor'} 2 with FT_CUDA_GRAPHS=1 "
                       f"(NCCL's calls inside the graph) against the same run without: {worst}")
            continue
        rc, cmp = chk.run(name + "_compare", [sys.executable, compare_py, out,
                                              os.path.join(run_dir, "one"), "--loss-rel", "1e-4",
                                              "--norm-rel", "1e-3", "--min-entries", "20"], 60)
        worst = "; ".join(l.strip() for l in cmp.splitlines() if l.strip())[-300:]
        what = "data 2" if name == "nccl_dp2" else "tensor 2"
        chk.record(name, "PASS" if rc == 0 else "FAIL",
                   f"{what}, two ranks on one {device} device over {comm}"
                   + (" (--device cpu: a try-out of the plumbing, no NCCL)" if dry else "")
                   + f", against one rank: {worst}")


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def gpu_sm():
    """The first GPU's compute capability as ft plan's --cuda-sm takes it (9.0: 90), else None."""
    try:
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        major, minor = cap[0].split(".")
        return int(major) * 10 + int(minor)
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None


def plan_json(text):
    """ft plan --json's object out of the run's output (stderr's lines are mixed in), or None."""
    at = text.find("{")
    while at >= 0:
        try:
            return json.JSONDecoder().raw_decode(text, at)[0]
        except ValueError:
            at = text.find("{", at + 1)
    return None


def adapter_stage(chk, ft, data, work, a, here, kind, lora_tps=None):
    """Issue 28 point 6: ft trains an adapter (`kind`: lora or qlora, r 16 alpha 32 on the seven
    projections: ADAPTER) on the 8B-class layers (EIGHT_B), bf16, seq 2048, micro-batch 2,
    activation checkpointing, --bench-steps steps; then `ft plan --json` on the run's resolved
    recipe, for the GPU's sm. Row `kind`_8b: tokens/s (median step after the first 5) and the
    measured peak against the plan's. The bound is equality to the byte: mem_peak_bytes is the
    allocator's high-water mark of bytes asked for (not the segments it holds: DESIGN.md §2
    "Memory"), the plan's peak_bytes the most bytes asked for at once over the same setup and
    step on its counting device (max of the step's total and start-up's), and DESIGN.md §2
    ("ft plan") says the two are equal; cli_test_cuda_emu_plan holds them equal on the emulated
    CUDA device, so a difference here is a real allocation the plan does not know. For lora,
    also PEFT + transformers at the same shape (scripts/gpu_bench_torch.py --lora 16 --ac, the
    wheels of --wheels): row lora_8b_peft, PASS when ft's tokens/s is at least LORA_SPEEDUP
    times PEFT's, SKIP when PEFT cannot be imported. Returns ft's tokens/s (None on failure).
    --device cpu runs the same plumbing at ADAPTER_TRY_OUT, seq 128 (figures meaningless)."""
    name = f"{kind}_8b"
    cpu = a.device == "cpu"
    shape, seq, micro = (ADAPTER_TRY_OUT, 128, 2) if cpu else (EIGHT_B, 2048, 2)
    overrides = [f"adapter.type={kind}"] + ADAPTER
    rc, m, _ = train(chk, name, ft, shape, data, work, a.bench_steps, seq, micro, "bf16",
                     a.device, ac=True, timeout=3000, overrides=overrides)
    timed = m[5:]
    tps = None
    if rc or not timed:
        chk.record(name, "FAIL", f"ft train exit {rc}, {len(m)} metric lines: see "
                   f"{chk.log(name)}")
    else:
        t = sorted(x["step_time_s"] for x in timed)[len(timed) // 2]
        tps = micro * seq / t
        mem = max(x["mem_peak_bytes"] for x in m)
        sm = None if cpu else gpu_sm()
        # The resolved recipe ft train wrote (run.output_dir is the run's folder): what ran.
        recipe = os.path.join(work, name, "recipe.yaml")
        prc, text = chk.run(name + "_plan", [ft, "plan", recipe, *overrides, "--json"]
                            + (["--cuda-sm", str(sm)] if sm else []), 300)
        plan = plan_json(text) if prc == 0 else None
        role = (plan or {}).get("roles", [{}])[0]
        start = m[0].get("time_to_first_step_s")
        figures = (f"{kind} r 16 alpha 32 all-linear, {role.get('trained_elems', 0) / 1e6:.1f}M "
                   f"trained: {tps:,.0f} tokens/s, median step {t:.3f} s"
                   + (f", step 1 began {start:.1f} s after start" if start is not None else ""))
        if lora_tps and kind != "lora":
            figures += f" ({tps / lora_tps:.2f}x lora_8b's)"
        if "peak_bytes" not in role:
            chk.record(name, "FAIL", f"{figures}; mem_peak {mem:,} B; ft plan exit {prc}, no "
                       f"peak_bytes in its JSON: see {chk.log(name + '_plan')}")
        else:
            want = role["peak_bytes"]
            when = "the step's" if role["total_bytes"] >= role["startup_bytes"] else "start-up's"
            where = f"{plan.get('device')}" + (f" sm_{plan['cuda_sm']}" if plan.get("cuda_sm")
                                               else "")
            diff = mem - want
            chk.record(name, "PASS" if diff == 0 else "FAIL",
                       f"{figures}; mem_peak {mem:,} B ({mem / 2**30:.2f} GiB) against ft plan's "
                       f"peak {want:,} B ({when}, planned for {where}): "
                       + ("equal (bound: equal to the byte)" if diff == 0 else
                          f"{diff:+,} B ({diff / want:+.3%}; bound: equal to the byte)"))
    if kind != "lora":
        return tps
    cmd = [sys.executable, os.path.join(here, "gpu_bench_torch.py"), "--lora", "16", "--ac",
           "--micro-batch", str(micro), "--seq", str(seq), "--steps", str(a.bench_steps),
           "--shape", json.dumps(shape), "--wheels", a.wheels] + (["--device", "cpu"] if cpu
                                                                   else [])
    rc, text = chk.run(name + "_peft", cmd, 3000)
    try:
        r = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        r = {}
    if "skip" in r:
        chk.record(name + "_peft", "SKIP", f"PEFT's run: {r['skip']}")
    elif "tokens_per_s" not in r:
        chk.record(name + "_peft", "FAIL", f"PEFT's run: exit {rc}: see {chk.log(name + '_peft')}")
    else:
        ptps = r["tokens_per_s"]
        peak = f", peak {r['peak_bytes'] / 2**30:.2f} GiB" if r.get("peak_bytes") else ""
        figures = (f"{r['peft']}, torch {r['torch']}, {r['trainable_params'] / 1e6:.1f}M trained "
                   f"({'/'.join(r['adapter_dtypes'])} over a {'/'.join(r['base_dtypes'])} base)"
                   f": {ptps:,.0f} tokens/s{peak}")
        if tps is None:
            chk.record(name + "_peft", "FAIL", f"{figures}; no ratio: ft's run failed")
        else:
            ratio = tps / ptps
            status = "PASS" if ratio >= LORA_SPEEDUP else "FAIL"
            if cpu:  # the bound is the GPU's; a CPU try-out only shows the plumbing works
                status = "SKIP"
            chk.record(name + "_peft", status, f"{figures}; ft/PEFT {ratio:.2f}x (bound >= "
                       f"{LORA_SPEEDUP}x" + ("; --device cpu: not checked)" if cpu else ")"))
    return tps


def offload_stage(chk, ft, data, work, a):
    """Issue 29 point 7 (see the docstring's offload_3b): three runs of QWEN_3B, without
    offload, with offload_optimizer (ZeRO 2) and with offload_params too (ZeRO 3); the offload
    runs' peaks against `ft plan --json` on their resolved recipes for the GPU's sm."""
    if a.device == "cpu":
        chk.record("offload_3b", "SKIP", "--device cpu: offload needs a GPU (ft refuses it on "
                   "the CPU, whose memory is the host's already)")
        return
    seq, steps = 2048, 8
    z2 = ["parallel.zero_stage=2", "parallel.offload_optimizer=cpu"]
    runs = [("offload_3b_none", 16, ["parallel.zero_stage=0"]),
            ("offload_3b", 16, z2),
            ("offload_3b_params", 16, ["parallel.zero_stage=3", "parallel.offload_optimizer=cpu",
                                       "parallel.offload_params=cpu"]),
            ("offload_3b_none_m4", 4, ["parallel.zero_stage=0"]),
            ("offload_3b_m4", 4, z2)]
    sm = gpu_sm()
    tps = {}
    for name, micro, over in runs:
        over = ["model.arch=qwen2", "training.global_batch_size=32"] + over
        rc, m, _ = train(chk, name, ft, QWEN_3B, data, work, steps, seq, micro, "bf16", a.device,
                         ac=True, timeout=3000, overrides=over)
        timed = m[3:]
        if rc or not timed:
            chk.record(name, "FAIL", f"ft train exit {rc}, {len(m)} metric lines: see "
                       f"{chk.log(name)}")
            continue
        t = sorted(x["step_time_s"] for x in timed)[len(timed) // 2]
        tps[name] = 32 * seq / t
        mem = max(x["mem_peak_bytes"] for x in m)
        figures = (f"micro-batch {micro} x {32 // micro}, {' '.join(over[2:])}: "
                   f"{tps[name]:,.0f} tokens/s, median step {t:.2f} s, mem_peak {mem / 2**30:.2f} "
                   f"GiB, step 1 began {m[0].get('time_to_first_step_s', 0):.1f} s after start")
        if "none" in name:
            chk.record(name, "PASS", figures)
            continue
        recipe = os.path.join(work, name, "recipe.yaml")
        prc, text = chk.run(name + "_plan", [ft, "plan", recipe, "--json"]
                            + (["--cuda-sm", str(sm)] if sm else []), 300)
        plan = plan_json(text) if prc == 0 else None
        role = (plan or {}).get("roles", [{}])[0]
        ok = role.get("peak_bytes") == mem
        figures += (f"; ft plan's peak {role['peak_bytes'] / 2**30:.2f} GiB: "
                    + ("equal to the byte" if ok else f"{mem - role['peak_bytes']:+,} B")
                    if "peak_bytes" in role else f"; ft plan exit {prc}, no peak_bytes")
        base = name.replace("offload_3b", "offload_3b_none").replace("_params", "")
        if "params" not in name and base in tps:
            ratio = tps[name] / tps[base]
            ok = ok and ratio >= OFFLOAD_MIN_RATIO
            figures += f"; {ratio:.2f}x {base} (bound >= {OFFLOAD_MIN_RATIO}x)"
        chk.record(name, "PASS" if ok else "FAIL", figures)


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
    ap.add_argument("--limit-scale", type=float, default=1.0,
                    help="multiplies every stage's time limit (LIMITS), for a slower GPU")
    ap.add_argument("--wheels", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "build", "wheels"),
                    help="wheels for the PEFT run of lora_8b, for an image without PEFT "
                         "(scripts/peft_wheels.sh; default build/wheels beside this script)")
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

    unknown = (only | skip) - set(LIMITS)
    if unknown:
        ap.error(f"unknown check(s) {', '.join(sorted(unknown))}; the checks: "
                 + ", ".join(LIMITS))

    def want(n):
        return (not only or n in only) and n not in skip

    def limit(n):
        return LIMITS[n] * a.limit_scale

    gpu = gpu_name()
    if want("env"):
        chk.stage(limit("env"))
        rc, text = chk.run("env", [ft, "--version"], 60)
        version = text.strip().splitlines()[0] if text.strip() else f"exit {rc}"
        chk.record("env", "PASS" if rc == 0 and gpu else "FAIL",
                   f"GPU: {gpu or 'none found by nvidia-smi'}; ft: {version}")

    has_tests = os.path.exists(tests)
    if want("kernels"):
        chk.stage(limit("kernels"))
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
        chk.stage(limit("ops"))
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
        chk.stage(limit(name))
        path = os.path.join(B, "tests", binary)
        if not os.path.exists(path):
            chk.record(name, "SKIP", f"the bundle has no tests/{binary}")
            continue
        rc, text = chk.run(name, [path], 900)
        last = [l for l in text.splitlines() if l.strip()][-1:] or [f"exit {rc}"]
        chk.record(name, "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"), last[0])
    if want("nccl"):
        chk.stage(limit("nccl"))
        nccl_stage(chk, B, ft, os.path.join(B, "data", "tiny"), work, a.device)
    sanitizer = shutil.which("compute-sanitizer") or (
        "/usr/local/cuda/bin/compute-sanitizer"
        if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    for tool in ("memcheck", "racecheck"):
        if not want(tool):
            continue
        chk.stage(limit(tool))
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
        chk.stage(limit(n))
        rc_g, gpu_m, _ = train(chk, n, ft, TINY, data_tiny, work, 50, 128, 4, prec, a.device)
        rc_c, cpu_m, _ = train(chk, n + "_cpu", ft, TINY, data_tiny, work, 50, 128, 4, prec, "cpu")
        if rc_g or rc_c:
            chk.record(n, "FAIL", f"ft train exit {rc_g} (cuda), {rc_c} (cpu): see {chk.log(n)}")
        else:
            compare(chk, n, gpu_m, cpu_m, rel)

    # Packing (issue 18 point 4): documents packed into windows (data.pack), attention kept
    # within each (the fused kernel's segments) and RoPE restarting per document, bf16 on the
    # GPU against the same on the CPU. tests/cli/test_packing.sh shows in CI that the CPU's
    # packed run equals the unpacked one.
    if want("packing"):
        chk.stage(limit("packing"))
        pk = ["data.pack=true"]
        # Head dim 64: on CUDA, document segments need the fused kernel (head dim 64 or 128).
        shape = dict(TINY, n_heads=4, n_kv_heads=2)
        rc_g, gpu_m, text = train(chk, "packing", ft, shape, os.path.join(B, "data", "packed"),
                                  work, 30, 128, 4, "bf16", a.device, overrides=pk)
        rc_c, cpu_m, _ = train(chk, "packing_cpu", ft, shape, os.path.join(B, "data", "packed"),
                               work, 30, 128, 4, "bf16", "cpu", overrides=pk)
        line = next((l for l in text.splitlines() if l.startswith("ft: data.pack:")), "")
        if rc_g or rc_c:
            chk.record("packing", "FAIL", f"ft train exit {rc_g} (gpu), {rc_c} (cpu): see "
                       f"{chk.log('packing')}")
        elif not line:
            chk.record("packing", "FAIL", f"no packing line in the run's output: see "
                       f"{chk.log('packing')}")
        elif not gpu_m or len(gpu_m) != len(cpu_m):
            chk.record("packing", "FAIL", f"runs gave {len(gpu_m)} and {len(cpu_m)} metric lines")
        else:
            worst = max(abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-12)
                        for x, y in zip(gpu_m, cpu_m))
            chk.record("packing", "PASS" if worst <= 2e-2 else "FAIL",
                       f"{len(gpu_m)} packed bf16 steps, worst loss difference GPU against CPU "
                       f"{worst:.2e} relative (bound 0.02); {line.strip()[:160]}")

    # ft generate with its KV cache on the GPU against transformers' generate on the GPU.
    if want("generate"):
        chk.stage(limit("generate"))
        here = os.path.dirname(os.path.abspath(__file__))
        rc, text = chk.run("generate", [sys.executable, os.path.join(here,
                                                                     "gpu_generate_parity.py"),
                                        "--ft", ft, "--work", os.path.join(work, "generate"),
                                        "--device", a.device] +
                           (["--speed-layers", "2"] if a.device == "cpu" else []), 600)
        lines = [l for l in text.splitlines() if l.startswith(("FAIL:", "skip:", "speed:",
                                                               "generate_parity:", "no GPU:"))]
        chk.record("generate", "PASS" if rc == 0 else ("SKIP" if rc == 77 else "FAIL"),
                   " | ".join(lines) or f"exit {rc}: see {chk.log('generate')}")

    if want("determinism"):
        chk.stage(limit("determinism"))
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

    peak = next((p for k, p in PEAKS if k in gpu), None)
    here = os.path.dirname(os.path.abspath(__file__))

    def mfu(tps, shape, seq):
        return f"{tps * flops_per_token(shape, seq) / peak:.1%}" if peak else "? (unknown GPU peak)"

    def ft_bench(name, shape, seq, micro, ac=False, env=None, overrides=()):
        """ft trains `shape` for --bench-steps steps; the median step after the first 5 gives
        tokens/s (recorded as row `name`, returned; None on failure)."""
        rc, m, _ = train(chk, name, ft, shape, data_big, work, a.bench_steps, seq, micro, "bf16",
                         a.device, ac=ac, timeout=3000, env=env, overrides=overrides)
        timed = m[5:]
        if rc or not timed:
            chk.record(name, "FAIL", f"ft train exit {rc}, {len(m)} metric lines: see "
                       f"{chk.log(name)}")
            return None
        t = sorted(x["step_time_s"] for x in timed)[len(timed) // 2]
        tps = micro * seq / t
        mem = max(x["mem_peak_bytes"] for x in m)
        # Startup: process start to step 1 (setup and parameter init; target under 5 s).
        start = m[0].get("time_to_first_step_s")
        start = f", step 1 began {start:.1f} s after start" if start is not None else ""
        # The GPU's utilisation through NVML (DESIGN.md §7 "GPU load"), the timed steps' median.
        util = sorted(x["gpu_util"] for x in timed if "gpu_util" in x)
        gpu = (f", GPU {util[len(util) // 2]:.0f}% (NVML)" if util
               else ", no gpu_util (NVML: see the log)")
        chk.record(name, "PASS", f"{tps:,.0f} tokens/s, MFU {mfu(tps, shape, seq)}, mem_peak "
                   f"{mem / 2**30:.1f} GiB, median step {t:.3f} s{start}{gpu}")
        return tps

    def torch_bench(name, shape, seq, micro, ft_tps=None, compile=False):
        """PyTorch (scripts/gpu_bench_torch.py) at the same shape and batch; records row `name`
        with the ratio ft/PyTorch when ft's tokens/s is given."""
        cmd = [sys.executable, os.path.join(here, "gpu_bench_torch.py"), "--micro-batch",
               str(micro), "--seq", str(seq), "--steps", str(a.bench_steps), "--shape",
               json.dumps(shape)] + (["--compile"] if compile else [])
        rc, text = chk.run(name, cmd, 3000)
        try:
            r = json.loads(text.strip().splitlines()[-1])
            tps = r["tokens_per_s"]
        except (ValueError, IndexError, KeyError):
            chk.record(name, "FAIL", f"exit {rc}: see {chk.log(name)}")
            return None
        ratio = f"; ft/PyTorch {ft_tps / tps:.2f}x" if ft_tps else ""
        chk.record(name, "PASS", f"{r['model']}: {tps:,.0f} tokens/s, MFU {mfu(tps, shape, seq)}"
                   f", peak {r['peak_bytes'] / 2**30:.1f} GiB{ratio}")
        return tps

    if want("attention"):
        chk.stage(limit("attention"))
        attention_stage(chk, B, here, a.device)

    # ft's tokens/s by row, kept in OUT/bench.json so that a later command with the same --out
    # (torch, torch_compile in another split) still prints its ratio to ft.
    bench_json = os.path.join(a.out, "bench.json")
    try:
        bench = json.load(open(bench_json))
    except (OSError, ValueError):
        bench = {}
    if want("bench"):
        chk.stage(limit("bench"))
        # Attention on tensor cores (the default) with activation checkpointing off and on, and
        # the SIMT attention kernels (FT_CUDA_ATTENTION=simt) for the measured choice between them.
        simt = dict(os.environ, FT_CUDA_ATTENTION="simt")
        for n, ac, env in (("bench_ac_off", False, None), ("bench_ac_on", True, None),
                           ("bench_simt", False, simt)):
            bench[n] = ft_bench(n, BIG, 2048, a.bench_micro_batch, ac=ac, env=env)
        with open(bench_json, "w") as f:
            json.dump(bench, f)
    if want("torch"):
        chk.stage(limit("torch"))
        torch_bench("torch", BIG, 2048, a.bench_micro_batch, bench.get("bench_ac_off"))
    if want("torch_compile"):
        chk.stage(limit("torch_compile"))
        torch_bench("torch_compile", BIG, 2048, a.bench_micro_batch, bench.get("bench_ac_off"),
                    compile=True)
    if want("profile"):
        chk.stage(limit("profile"))
        profile_stage(chk, ft, data_big, work, a)

    def override_stage(name, override, label):
        """Stage `name`: the ~1B bench with one recipe override; row `name` with its tokens/s and,
        where bench_ac_off's is known, row `name`_ratio: `label` and the ratio to it."""
        chk.stage(limit(name))
        tps = ft_bench(name, BIG, 2048, a.bench_micro_batch, overrides=(override,))
        base = bench.get("bench_ac_off")
        if tps and base:
            chk.record(f"{name}_ratio", "PASS",
                       f"{label} {tps / base:.3f}x ({tps:,.0f} / {base:,.0f} tokens/s)")

    if want("gemm_algos"):
        override_stage("gemm_algos", "runtime.gemm_algos=measure", "measure / heuristic")
    if want("overlap_update"):
        override_stage("overlap_update", "parallel.overlap_update=true",
                       "overlapped / in-stream update")
    if want("sm90_step"):
        chk.stage(limit("sm90_step"))
        tps = ft_bench("sm90_step", BIG, 2048, a.bench_micro_batch,
                       env=dict(os.environ, FT_CUDA_ATTENTION_SM90="1"))
        base = bench.get("bench_ac_off")
        if tps and base:
            chk.record("sm90_step_ratio", "PASS",
                       f"Hopper / FA2-class attention {tps / base:.3f}x ({tps:,.0f} / "
                       f"{base:,.0f} tokens/s)")
    if want("graphs"):
        chk.stage(limit("graphs"))
        graphs = dict(os.environ, FT_CUDA_GRAPHS="1")
        off = ft_bench("graphs_small_off", SMALL, 512, 8)
        on = ft_bench("graphs_small", SMALL, 512, 8, env=graphs)
        if off and on:
            chk.record("graphs_small_ratio", "PASS",
                       f"graphs / op by op {on / off:.3f}x ({on:,.0f} / {off:,.0f} tokens/s)")
        tps = ft_bench("graphs", BIG, 2048, a.bench_micro_batch, env=graphs)
        base = bench.get("bench_ac_off")
        if tps and base:
            chk.record("graphs_ratio", "PASS",
                       f"graphs / op by op {tps / base:.3f}x ({tps:,.0f} / {base:,.0f} tokens/s)")
    if want("bench_long"):
        # Seq 8192, micro-batch 1: attention's share of the step grows with T.
        chk.stage(limit("bench_long"))
        tps = ft_bench("bench_long", BIG, 8192, 1)
        torch_bench("bench_long_torch", BIG, 8192, 1, tps)
    if want("bench_8b"):
        chk.stage(limit("bench_8b"))
        tps = ft_bench("bench_8b", EIGHT_B, 2048, 2)
        torch_bench("bench_8b_torch", EIGHT_B, 2048, 2, tps)
    lora_tps = None
    for kind in ("lora", "qlora"):
        if want(f"{kind}_8b"):
            chk.stage(limit(f"{kind}_8b"))
            tps = adapter_stage(chk, ft, data_big, work, a, here, kind, lora_tps)
            lora_tps = tps if kind == "lora" else lora_tps
    if want("offload_3b"):
        chk.stage(limit("offload_3b"))
        offload_stage(chk, ft, data_big, work, a)

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
