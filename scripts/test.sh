#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing and builds (scripts/setup.sh --no-data),
# runs every test with ctest on the Release build, then rebuilds with AddressSanitizer +
# UndefinedBehaviorSanitizer (FT_SANITIZE=ON) and runs the suite again there (that build leaves
# out the GPU-only binaries and the benchmark tools no test runs, and the emulated CUDA tests'
# second schedule seed: tests/CMakeLists.txt, tests/cuda_emu/CMakeLists.txt, tests/cli/common.sh).
#   scripts/test.sh              # both passes
#   FT_TEST_SANITIZE=0 scripts/test.sh   # Release pass only
# As root it also brings up a local one-node SLURM and runs tests/slurm/test_slurm.sh (srun and
# sbatch against mpirun, and a batch job preempted with USR1, requeued and resumed; ~25 s);
# FT_TEST_SLURM=0 skips that, FT_TEST_SLURM=1 asks for it.
# Last, every libFuzzer harness of tests/fuzz runs for FT_TEST_FUZZ_SECONDS (default 30) from its
# seed corpus (scripts/fuzz.sh; clang build in build-fuzz/); FT_TEST_FUZZ=0 skips that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs="$(nproc)"

scripts/setup.sh --no-data
echo "test: Release suite"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900
slurm_default=0
[[ $(id -u) == 0 ]] && slurm_default=1  # the local cluster's daemons need root
if [[ "${FT_TEST_SLURM:-$slurm_default}" == "1" ]]; then
  echo "test: SLURM (tests/slurm, local one-node cluster)"
  bash tests/slurm/test_slurm.sh build .
fi

if [[ "${FT_TEST_SANITIZE:-1}" == "1" ]]; then
  echo "test: AddressSanitizer + UndefinedBehaviorSanitizer suite"
  # -g1: line tables only, which is what the sanitizers' stack traces print (file:line, inlined
  # frames too); full -g costs about a fifth more compile time here and nothing a report uses.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFT_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
  cmake --build build-asan -j"$jobs"
  # halt_on_error: any report fails the test. Leak checking stays on.
  ASAN_OPTIONS="halt_on_error=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 1800
fi

if [[ "${FT_TEST_FUZZ:-1}" == "1" ]]; then
  echo "test: fuzzing (tests/fuzz, ${FT_TEST_FUZZ_SECONDS:-30} s per harness)"
  FUZZ_JOBS="$jobs" scripts/fuzz.sh "${FT_TEST_FUZZ_SECONDS:-30}"
fi
