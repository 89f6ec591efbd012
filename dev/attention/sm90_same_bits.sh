#!/usr/bin/env bash
# Do the sm90 attention kernels (kernels/cuda/attention_sm90.cu) of this checkout give the same
# bits as those of revision BASE? A change of form (the ping-pong, pipelining, ring stages,
# barriers) must change the time only. Builds dev/attention/sm90_outputs.cpp on the CUDA
# emulation (a test tool) against BASE's kernels (a git worktree, its own build of the emulated
# kernel library) and against this checkout's (build/, made if missing), runs both under each
# schedule seed, and compares the output files byte for byte. Exit 0 when every file is equal.
#   dev/attention/sm90_same_bits.sh BASE [SEED ...]      (default seeds: 0 1 2)
# Environment: BUILD (this checkout's build folder, default build), WORK (default: a temporary
# folder, removed at the end).
set -euo pipefail
base=${1:?usage: dev/attention/sm90_same_bits.sh BASE [SEED ...]}
shift
seeds=("$@")
((${#seeds[@]})) || seeds=(0 1 2)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
build=${BUILD:-build}
work=${WORK:-$(mktemp -d)}
trap 'git -C "$root" worktree remove --force "$work/base" 2>/dev/null || true; [[ -n "${WORK:-}" ]] || rm -rf "$work"' EXIT
libs=(ft_cuda_kernels_emu ft_cuda_emu ft_kernels ft_core)

# The emulated kernel library of a source tree and its build folder; then the harness against it.
harness() {  # tree build out
  cmake --build "$2" -j2 --target "${libs[@]}" >"$3.build.log" 2>&1 ||
    { echo "sm90_same_bits: building $1's libraries failed: $3.build.log" >&2; exit 1; }
  local a=()
  for l in "${libs[@]}"; do
    a+=("$(find "$2" -name "lib$l.a" -print -quit)")
  done
  c++ -DFT_CUDA_EMU=1 -I"$1/lib" -I"$1" -isystem /usr/local/cuda/include \
    -include "$1/tests/cuda_emu/cuda_emu.h" -O2 -std=gnu++20 \
    "$root/dev/attention/sm90_outputs.cpp" -o "$3" "${a[@]}" -lpthread
}

git -C "$root" worktree add -q --detach "$work/base" "$base"
cmake -S "$work/base" -B "$work/base/b" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
  { echo "sm90_same_bits: configuring $base failed: $work/configure.log" >&2; exit 1; }
[[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
harness "$work/base" "$work/base/b" "$work/base_outputs"
harness "$root" "$build" "$work/head_outputs"
status=0
for s in "${seeds[@]}"; do
  FT_CUDA_EMU_SEED=$s "$work/base_outputs" "$work/base.$s.bin"
  FT_CUDA_EMU_SEED=$s "$work/head_outputs" "$work/head.$s.bin"
  if cmp -s "$work/base.$s.bin" "$work/head.$s.bin"; then
    echo "seed $s: the same bits ($(stat -c %s "$work/head.$s.bin") bytes of outputs)"
  else
    echo "seed $s: the outputs differ from $base's: $(cmp "$work/base.$s.bin" "$work/head.$s.bin" | head -1)"
    status=1
  fi
done
exit $status
