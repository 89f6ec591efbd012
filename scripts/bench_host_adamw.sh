#!/usr/bin/env bash
# The offloaded optimizer's host AdamW (parallel.offload_optimizer: cpu, DESIGN.md §3 "Offload";
# the CPU kernel kernels/cpu/adamw.cpp, the copy of the instruction set chosen at run time)
# against PyTorch's CPU AdamW on the same machine, in the same call: torch.optim.AdamW with
# foreach=True and with fused=True, on one flat fp32 parameter of ELEMENTS (PyTorch's best case:
# one tensor, no per-tensor overhead), at 1 thread and at THREADS. ft's update also writes the
# bf16 compute copy (what goes back to the GPU), PyTorch's does not, so ft moves 30 bytes an
# element to PyTorch's 28; the row torch-fused+bf16 adds that copy (p.to(bf16) into a buffer
# kept: 34 bytes), the same job as ft's. Prints elements per second per thread and ft / PyTorch.
# Issue 29's goal is >= 5x; an update of this size is bound by memory bandwidth (the GB/s
# column) in ft and in the fused step alike, so against the fused step no code can reach it
# (DESIGN.md §3 "Offload"). Not part of the test suite; builds nothing (ft_bench_adamw is a test tool, built
# with the tree). PyTorch: $TORCH_PYTHON, else build/hf_venv_torch2 (the tests' venv), else
# python3.
#   scripts/bench_host_adamw.sh [BUILD_DIR]         # default: build
#   ELEMENTS=16777216 THREADS=2 REPEATS=5 scripts/bench_host_adamw.sh
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
bench="$build/tests/ft_bench_adamw"
[[ -x $bench ]] || { echo "bench_host_adamw: no $bench; build first (cmake --build $build)" >&2; exit 1; }
elements=${ELEMENTS:-16777216}
threads=${THREADS:-$(nproc)}
repeats=${REPEATS:-5}
py=${TORCH_PYTHON:-}
[[ -n $py ]] || { [[ -x $build/hf_venv_torch2/bin/python ]] && py=$build/hf_venv_torch2/bin/python; } || true
[[ -n $py ]] || py=python3
"$py" -c 'import torch' 2> /dev/null \
  || { echo "bench_host_adamw: $py has no torch (set TORCH_PYTHON)" >&2; exit 1; }

echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; ELEMENTS=$elements REPEATS=$repeats"
results=()
for t in 1 $threads; do
  results+=("$("$bench" "$elements" "$t" bf16 "$repeats")")
  results+=("$(OMP_NUM_THREADS=$t "$py" - "$elements" "$t" "$repeats" <<'PY'
import json, sys, time
import torch
n, threads, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
out = []
# fused+bf16: the fused step, then the bf16 copy of the result that a GPU computes with (what ft's
# update writes in the same pass): 28 + 6 bytes an element.
for mode in ("foreach", "fused", "fused+bf16"):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = 1e-3 * torch.randn(n)
    low = torch.empty(n, dtype=torch.bfloat16) if mode == "fused+bf16" else None
    kw = {"foreach": True} if mode == "foreach" else {"fused": True}
    opt = torch.optim.AdamW([p], lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kw)
    opt.step()  # state allocation, page faults
    best = 1e30
    for _ in range(repeats):
        calls, t0 = 0, time.perf_counter()
        while True:
            opt.step()
            if low is not None:
                low.copy_(p.detach())
            calls += 1
            s = time.perf_counter() - t0
            if s >= 0.2:
                break
        best = min(best, s / calls)
    out.append({"impl": "torch-" + mode, "torch": torch.__version__,
                "isa": torch.backends.cpu.get_cpu_capability(), "threads": threads,
                "elements": n, "seconds": best, "elems_per_s": n / best,
                "elems_per_s_per_thread": n / best / threads,
                "gb_per_s": (34.0 if low is not None else 28.0) * n / best / 1e9})
print(json.dumps(out))
PY
)")
  [[ $t == "$threads" ]] && break
done
/usr/bin/python3 - "${results[@]}" <<'PY'
import json, sys
rows = []
for r in sys.argv[1:]:
    x = json.loads(r)
    rows += x if isinstance(x, list) else [x]
for t in sorted({r["threads"] for r in rows}):
    at = {r["impl"]: r for r in rows if r["threads"] == t}
    ft = at["ft"]
    print(f"threads {t}:")
    for name, r in at.items():
        ratio = ft["elems_per_s"] / r["elems_per_s"]
        print(f"  {name:16s} ({r['isa']:>8s}) {r['elems_per_s_per_thread'] / 1e6:8.1f} M elements/s "
              f"per thread, {r['gb_per_s']:6.1f} GB/s" + ("" if name == "ft" else
              f"   ft / this: {ratio:.2f}x"))
PY
