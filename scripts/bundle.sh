#!/usr/bin/env bash
# Makes ft-bundle.tar.xz: ft, the test binaries and the scripts a GPU check runs, with every
# shared library they need that a CUDA 13 Ubuntu image does not bring, so the archive runs on
# a machine with no package manager and no network (issue 9: the GPU machine receives only
# files carried from the repository, at most 64 MiB).
#   scripts/bundle.sh [BUILD_DIR]     # default build/; builds it first (FT_BUNDLE_BUILD=0: as is)
# Environment: FT_BUNDLE_OUT (default ft-bundle.tar.xz in the repository root); FT_BUNDLE_TUNING=1
# makes a tuning bundle: also the fused attention's tuning lab (dev/attention/: its native kernel
# tests and benchmark, ft_attention_variants_tests and ft_attention_variants_bench, and its
# scripts), for dev/attention/gpu_tune_attention.py. The default bundle carries ft's kernels only.
#
# Layout of the archive (one folder, ft-bundle/), the build folder's layout over the source
# tree's, so the CLI tests run from it as `bash tests/cli/test_X.sh . .`:
#   ft, and any other executable of the build folder's top level     RPATH $ORIGIN/lib
#   tests/<test binaries of build/tests>                              RPATH $ORIGIN/../lib
#   (both followed by /usr/local/cuda/lib64, for the toolkit's libraries)
#   lib/   the shared libraries, each with RPATH $ORIGIN (they find one another there)
#   scripts/, tests/{cli,ref,data}/, recipes/   from the source tree
#   dev/attention/   a tuning bundle only: the lab's binaries (RPATH $ORIGIN/../../lib) and files
#   BUNDLE.txt   what it was built from
# The build is portable: no -march anywhere, the CPU kernels' AVX2 and AVX-512 code chosen at
# run time by cpuid (kernels.h's cpu_isa(); FT_CPU_ISA overrides it), so no x86-64-v3 or other
# -march flag is needed for the bundle to run on a GPU host that differs from this machine.
# Open MPI: ft's libmpi and the libraries it links are shipped (lib/), not mpirun, orted or the
# MCA plugins it opens from Open MPI's own folder: several ranks need Open MPI 4.1 installed on
# the GPU machine (gpu_check.py's nccl stage looks for mpirun and says when there is none).
# Not shipped: the base system's C runtime (glibc's libraries, libgcc_s: every image has
# them; ft needs glibc 2.34 or newer, which the CUDA 13 images have) and the CUDA toolkit and
# driver (libcuda, libcudart, libcublas*, libnccl, libcudnn*, ...: the GPU image has its own,
# matched to its driver). libstdc++ and libgomp ARE shipped: the C++ libraries in lib/
# (yaml-cpp, sentencepiece, oneDNN) were built against this machine's libstdc++, and an image
# with an older one would fail to load them; every C++ user in the process comes from lib/,
# so a newer system libstdc++ is never needed instead.
#
# Then it checks the archive: unpacked into a temporary folder with LD_LIBRARY_PATH empty,
# `ft --version` runs, a 3-step training on the CPU finishes, and ldd resolves every library
# that is not base system or CUDA to the bundle's lib/. It prints the archive's size and fails
# above 40 MiB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$(pwd)
build=$(realpath -m "${1:-${BUILD_DIR:-build}}")
out=$(realpath -m "${FT_BUNDLE_OUT:-ft-bundle.tar.xz}")
max_bytes=$((40 * 1024 * 1024))
fail() { echo "bundle: FAIL: $*" >&2; exit 1; }
command -v patchelf >/dev/null ||
  fail "patchelf is missing: apt-get install patchelf (scripts/setup.sh installs it)"

if [[ "${FT_BUNDLE_BUILD:-1}" == "1" ]]; then
  [[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  echo "bundle: building $build"
  cmake --build "$build" -j"$(nproc)" >/dev/null
  if [[ "${FT_BUNDLE_TUNING:-0}" == "1" ]]; then  # the lab is not part of `all`
    cmake --build "$build" -j"$(nproc)" --target ft_attention_variants_tests \
      ft_attention_variants_bench >/dev/null
  fi
fi
[[ -x "$build/ft" ]] ||
  fail "$build/ft does not exist; build it (cmake --build $build) or drop FT_BUNDLE_BUILD=0"

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
stage="$work/ft-bundle"
mkdir -p "$stage/lib" "$stage/tests"

# Executables: the top level of the build folder (ft, and whatever else a helper puts there)
# and build/tests/ (the GPU-side test binaries: ft_cuda_device_check, lt_gemm_gpu_tests,
# ft_ops_gpu_tests, ft_nccl_check for the nccl stage (it opens the GPU image's libnccl.so.2, never
# shipped), and ft_cuda_bench_attention, which times ft's attention for gpu_check.py's
# attention stage), plus the native CUDA kernel tests of build/tests/cuda_emu/
# (ft_cuda_kernel_tests; the emulation's own binaries stay behind); never CMake's own files.
is_exe() { [[ -f "$1" && -x "$1" && $(head -c 4 "$1" | tr -d '\0') == $'\x7fELF' ]]; }
exes=()
declare -A exe_src=()
# Left out: host-only test binaries that CI runs on the CPU and the GPU check never does (they
# took the archive past its limit once the fused kernel's tuning variants, since moved to
# dev/attention/, grew the GPU binaries).
host_only='ft_unit_tests|ft_ops_tests|lt_gemm_cuda_emu_tests|ft_gradcheck'
lab=()
if [[ "${FT_BUNDLE_TUNING:-0}" == "1" ]]; then
  lab=("$build"/dev/attention/ft_attention_variants_tests
       "$build"/dev/attention/ft_attention_variants_bench)
  for f in "${lab[@]}"; do
    [[ -x "$f" ]] || fail "FT_BUNDLE_TUNING=1: $f does not exist (a build with FT_CUDA has it)"
  done
fi
for f in "$build"/* "$build"/tests/* "$build"/tests/cuda_emu/ft_cuda_kernel_tests "${lab[@]}"; do
  is_exe "$f" || continue
  [[ $(basename "$f") =~ ^($host_only)$ ]] && continue
  rel=${f#"$build"/}
  rel=${rel/#tests\/cuda_emu\//tests/}
  mkdir -p "$stage/$(dirname "$rel")"
  cp "$f" "$stage/$rel"
  exes+=("$rel")
  exe_src[$rel]=$f
done

# Libraries not shipped (see the top). Matched on the soname.
system_lib() {
  local glibc='linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil'
  [[ "$1" =~ ^($glibc|libmvec|libgcc_s)\.so ]]
}
cuda_lib() {
  local names='cuda|cudart|cublas|cublasLt|nccl|cudnn[a-z_]*|nvrtc[a-z.-]*|nvJitLink|cufft[a-z]*'
  names+='|curand|cusolver[A-Za-z]*|cusparse|cupti|nvToolsExt|nvidia-[a-z-]+'
  [[ "$1" =~ ^lib($names)\.so ]]
}

# ldd gives the transitive closure; a "not found" here would be missing on the GPU too.
declare -A libs=()
for rel in "${exes[@]}"; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$path" == "not" ]] && fail "$rel needs $name, which ldd cannot find here"
    system_lib "$name" || cuda_lib "$name" || libs[$name]=$path
  done < <(ldd "${exe_src[$rel]}")
done
for name in "${!libs[@]}"; do
  cp -L "${libs[$name]}" "$stage/lib/$name"
  chmod u+w "$stage/lib/$name"
  # DT_RPATH rather than RUNPATH (--force-rpath): it also applies to the libraries a library
  # loads, so the whole closure resolves inside lib/ with LD_LIBRARY_PATH empty.
  patchelf --force-rpath --set-rpath '$ORIGIN' "$stage/lib/$name"
done
# After lib/, the toolkit's usual folder: CUDA images normally list it for ld.so, and where one
# does not, libcudart and libcublasLt are still found.
for rel in "${exes[@]}"; do
  up=${rel//[^\/]/}  # one ../ per folder above the executable
  rpath='$ORIGIN/'${up//\//../}lib
  patchelf --force-rpath --set-rpath "$rpath:/usr/local/cuda/lib64" "$stage/$rel"
done

# Token shards for scripts/gpu_check.py (the GPU image may lack h5py and numpy): data/tiny for
# the GPU-against-CPU runs (vocabulary 512, 60 steps of 4 x 128 tokens), data/big for the ~1B
# benchmark (vocabulary 32000, 30 steps of 4 x 2048 tokens). Random tokens: speed and agreement
# between backends do not depend on what the tokens say.
/usr/bin/python3 - "$stage" "$src" <<'PY'
import os, sys
stage, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tests", "ref"))
import numpy as np, llama_ref as ref
rng = np.random.default_rng(0)
for name, vocab, tokens in (("tiny", 512, 60 * 4 * 129 + 1), ("big", 32000, 30 * 4 * 2049 + 1)):
    os.makedirs(f"{stage}/data/{name}")
    ref.write_shard(f"{stage}/data/{name}/shard_00000.h5", rng.integers(0, vocab, tokens), vocab)
# data/packed, for the packing stage (data.pack): 1500 documents of 3..200 tokens with loss masks.
docs = [rng.integers(0, 512, rng.integers(3, 201)) for _ in range(1500)]
os.makedirs(f"{stage}/data/packed")
ref.write_shard(f"{stage}/data/packed/shard_00000.h5", np.concatenate(docs), 512,
                doc_offsets=[int(o) for o in np.cumsum([0] + [d.size for d in docs[:-1]])],
                loss_mask=(rng.random(sum(d.size for d in docs)) < 0.8).astype(np.uint8))
PY

# The sources the checks run (shell and Python), and the recipes.
dirs=(scripts tests/cli tests/ref tests/data recipes)
((${#lab[@]})) && dirs+=(dev/attention)
for d in "${dirs[@]}"; do
  [[ -d "$d" ]] && mkdir -p "$stage/$d" && cp -r "$d/." "$stage/$d"
done
{
  echo "ft bundle: $("$build/ft" --version)"
  dirty=$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$dirty"
  echo "built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "executables: ${exes[*]}"
  echo "libraries: $(cd "$stage/lib" && ls | tr '\n' ' ')"
  echo "not shipped: glibc, libgcc_s, the CUDA toolkit and driver (the GPU image has them)"
} > "$stage/BUNDLE.txt"

echo "bundle: compressing ${#exes[@]} executables and ${#libs[@]} libraries"
mkdir -p "$(dirname "$out")"; rm -f "$out"
# One xz stream with a dictionary larger than the whole archive: the GPU binaries each hold the
# same kernels (about 9 MB of fatbin), which a smaller window or a multithreaded xz (independent
# blocks) compresses once per binary.
tar -C "$work" -cf - ft-bundle | xz -T1 --lzma2=preset=6,dict=256MiB > "$out"
size=$(stat -c %s "$out")
mib="$((size / 1048576)).$((size % 1048576 * 10 / 1048576))"
echo "bundle: $out: $mib MiB ($size bytes; limit 40 MiB)"
((size <= max_bytes)) || fail "$out is $size bytes, over the 40 MiB limit"

# ---- The check: the archive alone, with no library path ----
check="$work/check"
mkdir -p "$check"
tar -C "$check" -xJf "$out"
b="$check/ft-bundle"
export LD_LIBRARY_PATH=
"$b/ft" --version || fail "the bundled ft does not start"
# Every library is the bundle's, the base system's or CUDA's.
bad=$(ldd "$b/ft" | awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
  system_lib "$name" || cuda_lib "$name" || [[ "$path" == "$b/lib/"* ]] || echo "$name => $path"
done)
[[ -z "$bad" ]] || fail "the bundled ft loads libraries from outside the bundle: $bad"
echo "bundle: ldd of the unpacked ft, libraries from the bundle's lib/:"
ldd "$b/ft" | awk -v lib="$b/lib/" 'index($3, lib) == 1 {print "  " $1}' | sort | tr '\n' ' '
echo
/usr/bin/python3 "$b/tests/ref/make_shards.py" "$check/train:1" --vocab 97 --samples 40 \
  --seq-len 16 --seed 0
cat > "$check/r.yaml" <<YAML
run: {name: bundle, output_dir: $check/out, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97,
        max_seq_len: 32}
data: {train: $check/train, seq_len: 16}
training: {steps: 3, micro_batch_size: 2, global_batch_size: 2}
optimizer: {lr: 0.01}
runtime: {threads: 2, device: cpu}
YAML
# ft is built portable (the compiler's x86-64; the CPU kernels choose AVX2 or AVX-512 at run
# time, DESIGN.md §2), so the bundle runs on any x86-64 GPU host: the training runs at the level
# this CPU picks and again at the baseline, the code an older host would run.
for isa in "" baseline; do
  (cd "$check" && rm -rf out && FT_CPU_ISA=$isa "$b/ft" train r.yaml > train.out 2>&1) ||
    fail "3-step training (FT_CPU_ISA=$isa): $(cat "$check/train.out")"
  grep -q '^ft: done: 3 steps' "$check/train.out" || fail "no summary: $(cat "$check/train.out")"
  echo "bundle: FT_CPU_ISA=${isa:-(unset)}: $(grep -o 'CPU kernels [a-z0-9_]*' "$check/train.out"); $(grep '^ft: done' "$check/train.out")"
done
echo "bundle: ok: $out"
