#!/usr/bin/env bash
# One command for a lent GPU machine (the device tool: one command of at most 10 minutes, at most
# 8 files back from $OUT): the GPU check's stages in two groups with Nsight Compute's view of
# the fused attention kernels between them, every log packed into $OUT/gpu_logs.tgz and both
# groups' rows in $OUT/summary.txt.
#   bash scripts/gpu_lease.sh SECONDS FIRST_STAGES [LATER_STAGES]
# e.g. bash scripts/gpu_lease.sh 540 env,kernels,ops,device,bf16_vs_cpu,determinism,attention \
#        bench,torch,profile,bench_long
# SECONDS bounds the whole command: each part gets what is left (the GPU check's own per-stage
# limits still apply inside it), and the packing of the logs always runs. Needs the bundle
# (scripts/bundle.sh) at ft-bundle.tar.xz, carried with the command. FT_LEASE_NCU=0 skips ncu;
# FT_LEASE_LIMIT_SCALE=X passes --limit-scale X (every stage's time limit times X).
# Issue 28 point 6 (LoRA and QLoRA at the 8B-class shape: peak = plan, ft >= 1.5x PEFT), one
# call after `bash scripts/peft_wheels.sh` and scripts/bundle.sh here (gpu_check.py's header):
#   FT_LEASE_NCU=0 bash scripts/gpu_lease.sh 420 env,lora_8b,qlora_8b
#   with carry ["ft-bundle.tar.xz", "build/wheels"] and timeout_s 480
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $# -ge 2 ]] || { echo "usage: gpu_lease.sh SECONDS FIRST_STAGES [LATER_STAGES]" >&2; exit 2; }
budget=$1 first=$2 later=${3:-}
final=${OUT:-$PWD/gpu_lease_out}
mkdir -p "$final"
logs=$(mktemp -d /tmp/gpu_lease.XXXXXX)
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0) - 15)); }  # 15 s kept for the packing

{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE; } > "$logs/nvidia_smi.txt" 2>&1
export PYTHONUNBUFFERED=1
python3 -m tarfile -e ft-bundle.tar.xz "$logs/bundle" || { echo "no bundle"; exit 2; }
bundle=$logs/bundle/ft-bundle

check() {  # check STAGES: the GPU check's stages with what is left of the budget
  local l; l=$(left)
  ((l > 20)) || { echo "gpu_lease: no time left for $1"; return; }
  timeout -k 5 "$l" python3 scripts/gpu_check.py --bundle "$bundle" --out "$logs/check" \
    --only "$1" --limit-scale "${FT_LEASE_LIMIT_SCALE:-1}" 2>&1 |
    tee -a "$logs/rows.txt" "$final/rows_so_far.txt"  # rows_so_far: if the call is cut short
  echo "gpu_lease: stages $1 ended (exit ${PIPESTATUS[0]}) at $(($(date +%s) - t0)) s"
}

check "$first"

ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [[ ${FT_LEASE_NCU:-1} == 1 && -n $ncu && $(left) -gt 120 ]]; then
  # One launch of each fused kernel (the second forward, the backward's dK/dV and dQ) at the
  # ~1B layer's shape (B 4, H 32, K 8, T 2048, D 64), at head dim 128 and at T 8192: throughput,
  # occupancy, warp stalls, shared-memory conflicts. The sections print no stall breakdown
  # without PC sampling (stop 21's report had none), so the stall reasons (cycles a warp spends
  # stalled per issued instruction, by reason), the tensor and ALU pipes' use, and the shared
  # memory's wavefronts and bank conflicts are asked for by name.
  stalls=""
  for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait \
    not_selected selected dispatch_stall lg_throttle no_instruction branch_resolving drain \
    membar sleeping misc tex_throttle imc_miss; do
    stalls+="smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio,"
  done
  ncu_metrics="${stalls}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,"
  ncu_metrics+="sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,"
  ncu_metrics+="sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,"
  ncu_metrics+="sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,"
  ncu_metrics+="l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,"
  ncu_metrics+="l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,"
  ncu_metrics+="smsp__inst_executed.sum"
  for shape in 4,32,8,2048,64 2,32,8,2048,128 1,32,8,8192,64; do
    for extra in "--metrics=$ncu_metrics" ""; do  # without the named metrics if one is unknown
      timeout -k 5 60 "$ncu" --kernel-name regex:fused --launch-skip 1 --launch-count 3 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section InstructionStats ${extra:+"$extra"} \
        "$bundle/tests/ft_cuda_bench_attention" --path fused --warmup 0 --reps 1 "$shape" \
        > "$logs/ncu_$shape.txt" 2>&1
      rc=$?
      echo "gpu_lease: ncu $shape ${extra:+(named metrics) }exit $rc at $(($(date +%s) - t0)) s"
      ((rc == 0)) && ! grep -q "Failed to find metric" "$logs/ncu_$shape.txt" && break
      (($(left) > 90)) || break
    done
  done
fi

[[ -n $later ]] && check "$later"

# FT_LEASE_SANITIZE=PATTERN: compute-sanitizer memcheck and racecheck over the kernel tests whose
# doctest names match PATTERN (e.g. '*fused*'), after everything else, with what is left (at most
# 90 s each).
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n ${FT_LEASE_SANITIZE:-} && -n $san ]]; then
  for tool in memcheck racecheck; do
    l=$(left); ((l > 90)) && l=90
    ((l > 20)) || { echo "gpu_lease: no time left for $tool"; continue; }
    timeout -k 5 "$l" "$san" --tool "$tool" --error-exitcode 99 \
      "$bundle/tests/ft_cuda_kernel_tests" -tc="$FT_LEASE_SANITIZE" > "$logs/$tool.txt" 2>&1
    echo "gpu_lease: $tool over '$FT_LEASE_SANITIZE' exit $? at $(($(date +%s) - t0)) s:" \
      "$(grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases:" "$logs/$tool.txt" | tr '\n' ' ')"
  done
fi

# Everything small (no checkpoints, no shards) into one archive; the summaries beside it.
(cd "$logs" && find . -path ./bundle -prune -o -type f -size -4M -print |
  tar czf "$final/gpu_logs.tgz" -T -)
{ head -1 "$logs/check/summary.txt" 2>/dev/null; cat "$logs/rows.txt"; } > "$final/summary.txt"
rm -f "$final/rows_so_far.txt"
echo "gpu_lease: done at $(($(date +%s) - t0)) s"
