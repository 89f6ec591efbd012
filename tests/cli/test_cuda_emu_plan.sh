#!/usr/bin/env bash
# The CUDA backend's share of `ft plan`, runtime.tf32 and pinned checkpoint staging, executed on
# ft_emu (ft with lib/runtime/cuda/ built against the CUDA emulation, a test tool: nothing here
# runs on a GPU). The emulated device has the real one's caching allocator and CudaOps (the
# cuBLASLt workspace, the ops' scratch), so its mem_peak_bytes tests the plan's accounting; a
# real GPU adds its CUDA context, which no allocator sees.
#  - plan vs measurement: `ft plan ... runtime.device=cuda` (sm_90: the emulation reports
#    compute capability 9.0; the plan's counting device makes the CUDA ops' requests, lib/
#    runtime/cuda/ops_memory.h) against ft_emu's mem_peak_bytes on 2 ranks, ZeRO 0 and 3, fp32
#    and bf16, ZeRO 2 with parallel.offload_optimizer (the state in host memory: the device holds
#    no masters, moments nor gradient shards) and ZeRO 3 with parallel.offload_params too (no
#    parameter shards either; start-up streams one group at a time; the host memory each holds,
#    page-locked, equal to the measured mem_host_pinned_bytes), 2 pipeline stages
#    evaluating after every step (the plan's evaluation pass with the CUDA ops' scratch), and
#    with FT_CUDA_GRAPHS=1 ZeRO 3 and bf16 ZeRO 2 with a bf16 reduce_dtype (the buffers kept
#    for graphs, planned: without, the plan was 86,724 bytes short at ZeRO 3; under FT_PROFILE,
#    where a run records nothing, not planned: the plan equals ZeRO 3's without graphs): equal to the
#    byte, as on the CPU (tests/cli/test_plan.sh), and so the total less the 32 MiB cuBLASLt workspace too (the ops' scratch, ~1% here, and
#    the CPU-only fp32 dQ buffer that CUDA does without, 1.3% of bf16 ZeRO 3, would each break
#    it); and per attention path (FT_CUDA_ATTENTION=fused|gemm|simt, lib/runtime/cuda/
#    ops_memory.h) on a bf16 model with head dim 64, where the fused kernel applies: the same
#    equality, the chunked GEMMs' score chunks planned and the fused and SIMT kernels' absence
#    of scratch too; an unknown value is a usage error (exit 2) naming the three, and so is an
#    FT_CUDA_GRAPHS other than 0 or 1;
#  - the device planned for: runtime.device auto is CUDA under ft_emu (a usable emulated GPU)
#    and the CPU under ft here (no GPU); --cuda-sm 80 plans a 4 MiB workspace;
#  - runtime.tf32 reaches cuBLASLt: an fp32 run with tf32 true differs from one with tf32 false
#    (the emulated cuBLASLt rounds inputs to TF32 when asked for CUBLAS_COMPUTE_32F_FAST_TF32)
#    by over 100 times what tf32 false differs from the CPU, which stays within 1e-5 (the
#    tolerance of test_cuda_emu_train);
#  - checkpoint.async on the CUDA device (staging in page-locked memory from alloc_host): a run
#    killed after its step-4 save resumes bit-identically to the uninterrupted run.
#   bash tests/cli/test_cuda_emu_plan.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/data:1" --vocab 61 --samples 40 \
  --seq-len 16 --seed 7

cat > "$tmp/r.yaml" <<YAML
run: {name: plan_cuda, output_dir: $tmp/out, seed: 1}
model: {dim: 40, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 44, vocab_size: 64,
        max_seq_len: 16}
data: {train: $tmp/data, seq_len: 16}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 8}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# 1. The plan against what the emulated CUDA device measures. name:overrides, 2 ranks each.
runs=("f32_z0:parallel.zero_stage=0" "f32_z3:parallel.zero_stage=3"
      "bf16_z0:parallel.zero_stage=0 training.precision=bf16"
      "bf16_z3:parallel.zero_stage=3 training.precision=bf16"
      "bf16_z2_offload:parallel.zero_stage=2 training.precision=bf16 parallel.offload_optimizer=cpu"
      "bf16_z3_offload_both:parallel.zero_stage=3 training.precision=bf16 parallel.offload_optimizer=cpu parallel.offload_params=cpu"
      "bf16_pipe2_eval:parallel.pipeline=2 model.n_layers=3 training.precision=bf16 data.valid=$tmp/data training.eval_every_steps=1"
      "f32_z3_graphs:parallel.zero_stage=3"
      "bf16_z2_graphs:parallel.zero_stage=2 training.precision=bf16 parallel.reduce_dtype=bf16")
names=()
for run in "${runs[@]}"; do
  IFS=: read -r name overrides <<< "$run"; read -r -a ov <<< "$overrides"
  # *_graphs: trained and planned with FT_CUDA_GRAPHS=1 (the buffers kept for graphs planned).
  graphs=0
  [[ $name == *_graphs ]] && graphs=1
  FT_CUDA_GRAPHS=$graphs "$emu" train "$tmp/r.yaml" "${ov[@]}" runtime.device=cuda \
    run.output_dir="$tmp/$name" --nproc 2 > "$tmp/$name.log" 2>&1 \
    || fail "train $name: $(tail -5 "$tmp/$name.log")"
  [[ $graphs == 0 ]] || grep -q 'micro-batch .* recorded as a graph' "$tmp/$name.log" \
    || fail "$name: no micro-batch recorded"
  FT_CUDA_GRAPHS=$graphs "$ft" plan "$tmp/r.yaml" "${ov[@]}" runtime.device=cuda --world 2 \
    --json > "$tmp/$name.plan.json" || fail "plan $name"
  names+=("$name")
done
# FT_PROFILE=1 runs op by op (a run profiled records no graph), so its plan keeps nothing for
# graphs under FT_CUDA_GRAPHS=1 either.
FT_PROFILE=1 FT_CUDA_GRAPHS=1 "$ft" plan "$tmp/r.yaml" parallel.zero_stage=3 runtime.device=cuda \
  --world 2 --json > "$tmp/f32_z3_profiled.plan.json" || fail "plan f32_z3 under FT_PROFILE"
# Each attention path at head dim 64 (dim 128, 2 query heads, 1 kv head), bf16, one rank; the
# plan is made under the same FT_CUDA_ATTENTION.
hd64="model.dim=128 model.n_heads=2 model.n_kv_heads=1 training.precision=bf16 training.steps=2"
read -r -a ov <<< "$hd64"
for path in fused gemm simt; do
  name=attn_$path
  FT_CUDA_ATTENTION=$path "$emu" train "$tmp/r.yaml" "${ov[@]}" runtime.device=cuda \
    run.output_dir="$tmp/$name" > "$tmp/$name.log" 2>&1 || fail "train $name: $(tail -5 "$tmp/$name.log")"
  FT_CUDA_ATTENTION=$path "$ft" plan "$tmp/r.yaml" "${ov[@]}" runtime.device=cuda --world 1 \
    --json > "$tmp/$name.plan.json" || fail "plan $name"
  names+=("$name")
done
# An unknown path is a usage error (exit 2) naming the three, before any work; so is a value of
# FT_CUDA_GRAPHS other than 0 and 1, which the plan reads for a CUDA target.
rc=0
FT_CUDA_ATTENTION=flash "$ft" plan "$tmp/r.yaml" runtime.device=cuda > "$tmp/bad.log" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "FT_CUDA_ATTENTION=flash: exit $rc, not 2"
grep -q "FT_CUDA_ATTENTION='flash'.*fused.*gemm.*simt" "$tmp/bad.log" \
  || fail "FT_CUDA_ATTENTION=flash: $(cat "$tmp/bad.log")"
rc=0
FT_CUDA_GRAPHS=yes "$ft" plan "$tmp/r.yaml" runtime.device=cuda > "$tmp/bad.log" 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "FT_CUDA_GRAPHS=yes: exit $rc, not 2"
grep -q "FT_CUDA_GRAPHS='yes': use 1 .* or 0" "$tmp/bad.log" \
  || fail "FT_CUDA_GRAPHS=yes: $(cat "$tmp/bad.log")"
/usr/bin/python3 - "$tmp" "${names[@]}" <<'PY' || fail "plan disagrees with the emulated device"
import json, sys
tmp, names = sys.argv[1], sys.argv[2:]
WS = 32 << 20  # the cuBLASLt workspace on sm_90, allocated once per device
for name in names:
    m = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l][-1]
    plan = json.load(open(f"{tmp}/{name}.plan.json"))
    assert plan["device"] == "cuda" and plan["cuda_sm"] == 90, (name, plan["device"])
    role = next(r for r in plan["roles"] if 0 in r["ranks"])  # metrics come from rank 0
    planned, measured = role["peak_bytes"], m["mem_peak_bytes"]
    assert role["backend_bytes"] > WS, (name, "backend bytes", role["backend_bytes"])
    assert measured > WS, (name, "measured peak below the workspace", measured)
    assert planned == measured, (name, "peak", planned, measured)
    assert role["other_bytes"] == 0, (name, "allocations without a category", role)
    evals = sum('"eval_loss"' in l for l in open(f"{tmp}/{name}/metrics.jsonl"))
    assert (role["eval_bytes"] > WS and evals == 3) if "eval" in name else \
        (role["eval_bytes"] == 0 and evals == 0), (name, role["eval_bytes"], evals)
    line = [f"peak {planned} (less the workspace {planned - WS})"]
    for k in ("params", "grads", "optim"):
        planned_k, measured_k = role[f"{k}_bytes"], m[f"mem_{k}_bytes"]
        assert planned_k == measured_k, (name, k, planned_k, measured_k)
    # Host memory (page-locked from cudaMallocHost, pageable), counted by the plan as device
    # memory is: the offloaded state is page-locked, and nothing else here is on the host.
    host = role["host_bytes"]
    for k in ("pinned", "pageable"):
        planned_k, measured_k = host[k], m[f"mem_host_{k}_bytes"]
        assert planned_k == measured_k, (name, f"host {k}", planned_k, measured_k)
    assert (host["pinned"] > 0) == ("offload" in name), (name, host)
    line.append(f"host pinned {host['pinned']} {host['pinned_by_category']}")
    print(f"{name}: planned = measured bytes: " + ", ".join(line))
# The buffers kept for graphs are more memory than op by op (the same configuration), and not
# planned under FT_PROFILE, where a run records nothing.
peaks = {n: next(r for r in json.load(open(f"{tmp}/{n}.plan.json"))["roles"]
                 if 0 in r["ranks"])["peak_bytes"]
         for n in ("f32_z3", "f32_z3_graphs", "f32_z3_profiled")}
assert peaks["f32_z3_graphs"] > peaks["f32_z3"] == peaks["f32_z3_profiled"], peaks
print(f"kept for graphs at ZeRO 3: {peaks['f32_z3_graphs'] - peaks['f32_z3']} bytes more")
# The paths' scratch differs: only the chunked GEMMs hold score chunks (the rest of the backend's
# memory is the same), so the plan sees which path runs.
backend = {p: next(r for r in json.load(open(f"{tmp}/attn_{p}.plan.json"))["roles"]
                   if 0 in r["ranks"])["backend_bytes"] for p in ("fused", "gemm", "simt")}
assert backend["fused"] == backend["simt"] < backend["gemm"], backend
print(f"backend bytes per attention path at head dim 64: {backend}")
PY

# 2. The device a plan is for, and the workspace by compute capability.
/usr/bin/python3 - "$tmp" "$emu" "$ft" <<'PY' || fail "device choice of ft plan"
import json, subprocess, sys
tmp, emu, ft = sys.argv[1:]
def plan(binary, *args):
    out = subprocess.run([binary, "plan", f"{tmp}/r.yaml", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)
assert plan(emu, "runtime.device=auto")["device"] == "cuda"   # an emulated GPU is usable
assert plan(ft, "runtime.device=auto")["device"] == "cpu"     # no GPU on this machine
cpu = plan(ft, "runtime.device=cpu")["roles"][0]
assert cpu["backend_bytes"] == 0, cpu["backend_bytes"]
a100 = plan(ft, "runtime.device=cuda", "--cuda-sm", "80")
h100 = plan(ft, "runtime.device=cuda")
assert a100["cuda_sm"] == 80
d = h100["roles"][0]["backend_bytes"] - a100["roles"][0]["backend_bytes"]
assert d == (32 - 4) << 20, d
assert any("sm_90" in n for n in h100["notes"]), h100["notes"]
print("ft plan: auto is cuda under ft_emu, cpu here; sm_80 plans 28 MiB less workspace")
PY
"$ft" plan "$tmp/r.yaml" runtime.device=cuda > "$tmp/table.txt" || fail "plan table"
grep -q 'cuda backend' "$tmp/table.txt" || fail "no cuda backend row: $(cat "$tmp/table.txt")"

# 3. runtime.tf32 (fp32, one process).
train() {  # BINARY NAME [OVERRIDES...]
  local bin=$1 name=$2
  shift 2
  "$bin" train "$tmp/r.yaml" run.output_dir="$tmp/$name" training.steps=4 "$@" \
    > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"
}
train "$emu" tf32_off runtime.device=cuda runtime.tf32=false
train "$emu" tf32_on runtime.device=cuda runtime.tf32=true
train "$ft" tf32_cpu runtime.device=cpu runtime.tf32=true  # the CPU ignores it
/usr/bin/python3 - "$tmp" <<'PY' || fail "runtime.tf32"
import json, sys
tmp = sys.argv[1]
def metrics(name):  # every step's loss and grad norm
    return [(j["loss"], j["grad_norm"])
            for j in map(json.loads, open(f"{tmp}/{name}/metrics.jsonl")) if "loss" in j]
def worst(a, b):
    return max(abs(x - y) / abs(y) for p, q in zip(a, b) for x, y in zip(p, q))
off, on, cpu = metrics("tf32_off"), metrics("tf32_on"), metrics("tf32_cpu")
assert len(off) == len(on) == len(cpu) == 4, (off, on, cpu)
worst_cpu = worst(off, cpu)
assert worst_cpu <= 1e-5, ("tf32 false vs the CPU", off, cpu, worst_cpu)  # as test_cuda_emu_train
worst_on = worst(on, off)
# TF32 keeps 10 mantissa bits (~5e-4 per input): on this model the losses move by ~1e-6 and
# the grad norms by ~5e-5, while fp32 without it stays within ~1e-8 of the CPU. A tenth of
# the first and 100 times the second tell the two apart with room on both sides.
assert worst_on > 1e-7 and worst_on > 100 * worst_cpu, (
    "tf32 true gave fp32 results: TF32 was not asked for", on, off, worst_on, worst_cpu)
print(f"runtime.tf32: true vs false {worst_on:.1e} (differs), false vs CPU {worst_cpu:.1e}")
PY

# 4. Async checkpoints on the CUDA device: killed as step 5 begins (step_4 saved), resumed.
ck="checkpoint.every_steps=2 checkpoint.async=true training.steps=6"
read -r -a ckv <<< "$ck"
train "$emu" async_full runtime.device=cuda "${ckv[@]}"
rc=0
(FT_TEST_KILL_AT_STEP=5 exec "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/async_resumed" \
  runtime.device=cuda "${ckv[@]}") > "$tmp/async_1.log" 2>&1 || rc=$?
[[ $rc == 137 ]] || fail "async part 1: exit $rc, expected 137: $(tail -3 "$tmp/async_1.log")"
"$emu" train "$tmp/r.yaml" run.output_dir="$tmp/async_resumed" runtime.device=cuda "${ckv[@]}" \
  > "$tmp/async_2.log" 2>&1 || fail "async part 2: $(tail -3 "$tmp/async_2.log")"
grep -q 'resumed from' "$tmp/async_2.log" \
  || fail "async part 2 did not resume: $(tail -3 "$tmp/async_2.log")"
/usr/bin/python3 - "$tmp" <<'PY' || fail "async resume on the CUDA device is not bit-identical"
import json, sys
tmp = sys.argv[1]
def last_per_step(name):  # a resumed run appends: the last line of a step counts
    out = {}
    for j in map(json.loads, open(f"{tmp}/{name}/metrics.jsonl")):
        if "loss" in j:
            out[j["step"]] = (j["loss"], j["grad_norm"])
    return out
a, b = last_per_step("async_full"), last_per_step("async_resumed")
assert sorted(a) == sorted(b) == list(range(1, 7)), (sorted(a), sorted(b))
assert a == b, [(s, a[s], b[s]) for s in a if a[s] != b[s]]
print("async checkpoint on the emulated CUDA device: resumed run bit-identical")
PY
echo "test_cuda_emu_plan: OK"
