#!/usr/bin/env bash
# The GPU load on the metrics lines (DESIGN.md §7 "GPU load"): ft_emu reads the emulated NVML
# (tests/cuda_emu/nvml_emu.cpp, a test tool, linked where ft opens libnvidia-ml.so.1; utilisation
# from FT_NVML_EMU_UTIL per emulated GPU, used memory from the emulated device memory) through
# the reader the GPU build uses (lib/runtime/cuda/gpu_usage.h; its failures to load the real
# library: tests/unit/test_gpu_usage.cpp):
#  - two ranks at 90 % and 40 %: every step line has rank 0's gpu_util 90 and a used memory of
#    whole 2 MiB segments (the caching allocator's) at least its mem_peak_bytes, and names rank
#    1 the slowest with its 40 % and its memory (the same work: the same bytes); the progress
#    line shows "GPU 90%";
#  - NVML failing to start on both ranks: no gpu_* key on any line, and its reason said once in
#    the whole job's log (rank 0's; rank 1 keeps its own to itself);
#  - one rank whose GPU is lost at its second reading: step 1 has the figures, the later steps
#    none, the reason said once;
#  - a CPU run (ft_emu's CPU device): no gpu_* key and nothing said.
#   bash tests/cli/test_cuda_emu_nvml.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
need_emu
mpi_env
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" --vocab 64 --samples 16 \
  --seq-len 8 --seed 7

cat > "$tmp/r.yaml" <<YAML
run: {name: r, output_dir: $tmp/out, seed: 3}
model: {dim: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, ffn_dim: 40, vocab_size: 64,
        max_seq_len: 8}
data: {train: $tmp/train, seq_len: 8}
training: {steps: 3, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 1}
YAML

# on_emu NAME NP VAR=VALUE...: NP ranks of ft_emu, one emulated GPU each, the variables passed.
on_emu() {
  local name=$1 np=$2 vars=() exports=() v
  shift 2
  for v in "$@"; do vars+=("$v"); exports+=(-x "${v%%=*}"); done
  env FT_CUDA_EMU_DEVICES="$np" "${vars[@]}" mpirun "${mpirun_args[@]}" -np "$np" \
    -x FT_CUDA_EMU_DEVICES "${exports[@]}" "$emu" train "$tmp/r.yaml" \
    run.output_dir="$tmp/$name" runtime.device=cuda > "$tmp/$name.log" 2>&1 \
    || fail "$name: $(tail -5 "$tmp/$name.log")"
}
# check NAME PYTHON: PYTHON's asserts over `lines`, the step lines of NAME's metrics.jsonl.
check() {
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$2" <<'PY' || fail "$1: the metrics lines above"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert [l["step"] for l in lines] == [1, 2, 3], [l["step"] for l in lines]
gpu_keys = {"gpu_util", "gpu_mem_used_bytes", "gpu_util_slowest", "gpu_mem_used_bytes_slowest",
            "slowest_rank"}
try:
    exec(sys.argv[2])
except AssertionError:
    for l in lines:
        print({k: v for k, v in l.items() if k in gpu_keys or k in ("step", "mem_peak_bytes")})
    raise
PY
}
# said_once NAME TEXT: the job's log has TEXT on exactly one line.
said_once() {
  local n
  n=$(grep -cF -- "$2" "$tmp/$1.log" || true)
  [[ $n == 1 ]] || fail "$1: '$2' said $n times, not once: $(grep -F gpu_ "$tmp/$1.log" | head -3)"
}

on_emu util 2 FT_NVML_EMU_UTIL=90,40
check util '
for l in lines:
    assert l["gpu_util"] == 90 and l["gpu_util_slowest"] == 40 and l["slowest_rank"] == 1, l
    used = l["gpu_mem_used_bytes"]
    assert used > 0 and used % (2 << 20) == 0 and used >= l["mem_peak_bytes"], l
    assert l["gpu_mem_used_bytes_slowest"] == used, l
'
grep -q '^step 1/3 .*TFLOP/s [0-9.e+-]* GPU 90% mem' "$tmp/util.log" \
  || fail "util: no 'GPU 90%' on the progress line: $(grep -m1 '^step' "$tmp/util.log")"
if grep -q 'gpu_util' "$tmp/util.log"; then fail "util: $(grep gpu_util "$tmp/util.log")"; fi
echo "two ranks at 90 % and 40 %: rank 0's figures, rank 1 the slowest"

on_emu no_driver 2 FT_NVML_EMU_FAIL=init
check no_driver 'assert all(not gpu_keys & l.keys() for l in lines), lines'
said_once no_driver "gpu_util: NVML unavailable (nvmlInit_v2: Driver Not Loaded (NVML status 9)); \
the metrics lines go without gpu_util and gpu_mem_used_bytes from here on"
echo "NVML failing to start on both ranks: no gpu_* keys, the reason said once"

on_emu lost 1 FT_NVML_EMU_UTIL=70 FT_NVML_EMU_FAIL=lost:2
check lost '
assert lines[0]["gpu_util"] == 70 and lines[0]["slowest_rank"] == 0, lines[0]
assert lines[0]["gpu_util_slowest"] == 70, lines[0]
assert all(not gpu_keys & l.keys() for l in lines[1:]), lines[1:]
'
said_once lost "gpu_util: NVML unavailable (nvmlDeviceGetUtilizationRates: GPU is lost"
echo "a GPU lost at its second reading: step 1's figures, then none, the reason said once"

# ft_emu on the CPU device: the same binary, its emulated NVML linked but never asked.
FT_NVML_EMU_UTIL=90 "$emu" train "$tmp/r.yaml" run.output_dir="$tmp/cpu" runtime.device=cpu \
  > "$tmp/cpu.log" 2>&1 || fail "cpu: $(tail -3 "$tmp/cpu.log")"
check cpu 'assert all(not gpu_keys & l.keys() for l in lines), lines'
if grep -q 'gpu_util\|GPU [0-9]*%' "$tmp/cpu.log"; then fail "cpu: $(grep gpu "$tmp/cpu.log")"; fi
echo "a CPU run: no gpu_* keys, nothing said"
echo "test_cuda_emu_nvml: OK"
