#!/usr/bin/env bash
# What the compiler made of the fused attention kernel, without a GPU (issue 16, point 4):
# ptxas's registers, shared memory and spill bytes per kernel and architecture, and, where a
# cuobjdump is at hand, how many tensor-core (HMMA), ldmatrix (LDSM) and cp.async (LDGSTS)
# instructions each kernel's SASS holds: that the inline PTX of warp_matrix.cuh became those
# instructions and not a fallback.
#   dev/attention/kernel_report.sh [FILE.cu ...]
# Default files: kernels/cuda/attention_fused.cu (the forms ft runs) and
# tests/cuda_emu/warp_matrix_kernels.cu (the warp_matrix test kernels); the tuning lab's forms:
# dev/attention/fused_variants.cu. Compiled as the build compiles kernels/cuda/ (CMakeLists.txt:
# -O3, C++20, the ptxas flags FT_CUDA_PTXAS_FLAGS, which fail on a spill) for sm_80 and sm_90a,
# plus -Xptxas -v for the report.
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc); CUOBJDUMP (default:
# cuobjdump on PATH or beside nvcc; the counts are left out, saying so, when there is none; the
# PyPI package nvidia-cuda-cuobjdump holds one; CUDA 13's needs nvdisasm, found on PATH or
# through NVDISASM_PATH, e.g. from nvidia-cuda-nvdisasm); ARCHS (default "80 90a").
# Shared memory: ptxas reports the static part only (a few hundred bytes to 1.7 KB for the
# attention kernels); their tiles are dynamic shared memory, sized at launch (attention_fused.cuh:
# fwd_smem_bytes, dq_smem_bytes, dkdv_smem_bytes), and not in this table.
set -euo pipefail
# A kernel's name as c++filt gives it, without the namespaces and the parameter list.
short() { c++filt | sed -E 's/^void //; s/ft::kernels::cuda::(test::)?\(anonymous namespace\):://; s/\(.*$//'; }
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x "$nvcc" ]] || { echo "kernel_report: no nvcc (set NVCC=path)" >&2; exit 1; }
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || echo "$(dirname "$nvcc")/cuobjdump")}
[[ -x "$cuobjdump" ]] || cuobjdump=""
archs=${ARCHS:-"80 90a"}
files=("$@")
((${#files[@]})) || files=(kernels/cuda/attention_fused.cu tests/cuda_emu/warp_matrix_kernels.cu)
gencode=()
for a in $archs; do gencode+=("--generate-code=arch=compute_$a,code=sm_$a"); done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

echo "nvcc: $("$nvcc" --version | tail -1)"
echo "cuobjdump: ${cuobjdump:-none (set CUOBJDUMP=path for the SASS counts)}"
for f in "${files[@]}"; do
  obj="$work/$(basename "$f").o"
  "$nvcc" -O3 -DNDEBUG -std=c++20 -Ilib -I. "${gencode[@]}" \
    -Xptxas=-v,-warn-spills,-warn-lmem-usage,-Werror -c "$f" -o "$obj" 2> "$work/ptxas.txt" || {
    cat "$work/ptxas.txt" >&2
    echo "kernel_report: $f does not compile" >&2
    exit 1
  }
  echo
  echo "== $f: ptxas (per kernel; regs, static smem bytes, spill store/load bytes)"
  # ptxas -v: "Compiling entry function 'NAME' for 'sm_XX'", then "N bytes stack frame, N bytes
  # spill stores, N bytes spill loads", then "Used N registers, ... N bytes smem, ...".
  awk '
    /Compiling entry function/ { match($0, /function .[^'\'']*/); name = substr($0, RSTART + 10,
                                 RLENGTH - 10); match($0, /for .sm_[0-9a-z]+/);
                                 arch = substr($0, RSTART + 5, RLENGTH - 5); st = 0; ld = 0 }
    /spill stores/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "spill" &&
                     $(i+3) ~ /^stores/) st = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" &&
                     $(i+3) ~ /^loads/) ld = $i } }
    /Used [0-9]+ registers/ { regs = 0; smem = 0
                     for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^registers/) regs = $i;
                                                 if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
                     if (name != "") printf "%s\t%s\t%s\t%s\t%s\t%s\n", arch, regs, smem, st, ld, name
                     name = "" }
  ' "$work/ptxas.txt" > "$work/table.txt"
  printf "%-7s %5s %6s %6s %6s  %s\n" arch regs smem spillS spillL kernel
  while IFS=$'\t' read -r arch regs smem st ld name; do
    printf "%-7s %5s %6s %6s %6s  %s\n" "$arch" "$regs" "$smem" "$st" "$ld" \
      "$(echo "$name" | short)"
  done < <(sort -t$'\t' -k6,6 -k1,1 "$work/table.txt")
  [[ -n "$cuobjdump" ]] || continue
  echo "-- $f: SASS instruction counts (cuobjdump -sass; dev/attention/sass_counts.py: loop ="
  echo "   the longest loop's instructions, common = those of its blocks without FSEL, the"
  echo "   unmasked path)"
  printf "%-7s %6s %6s %7s %6s %7s  %s\n" arch HMMA LDSM LDGSTS loop common kernel
  "$cuobjdump" -sass "$obj" | python3 dev/attention/sass_counts.py | sort -t$'\t' -k7,7 -k1,1 |
    while IFS=$'\t' read -r arch h l g loop common fn; do
      printf "%-7s %6s %6s %7s %6s %7s  %s\n" "$arch" "$h" "$l" "$g" "$loop" "$common" \
        "$(echo "$fn" | short)"
    done
done
