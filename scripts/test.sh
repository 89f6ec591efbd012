#!/usr/bin/env bash
# Runs the whole test suite, in stages, each timed (README "Building and testing"):
#   setup          the Debian packages (scripts/setup.sh --packages)
#   release-build  the Release build in build/ (scripts/setup.sh --no-data)
#   release-suite  every ctest test on it
#   slurm          as root: a local one-node SLURM and tests/slurm/test_slurm.sh (srun and sbatch
#                  against mpirun, a batch job preempted with USR1, requeued and resumed; ~25 s);
#                  FT_TEST_SLURM=0 skips it, FT_TEST_SLURM=1 asks for it
#   asan-build     the sanitizer build, build-asan/ (scripts/sanitizers.sh: clang 19,
#                  AddressSanitizer + UndefinedBehaviorSanitizer, libFuzzer): what the tests
#                  labelled `sanitize` run (target ft_sanitize_targets) and the fuzz harnesses
#   asan-suite     `ctest -L sanitize` there: what the sanitizers find (unit, ops, emulated kernels,
#                  parsers, one multi-process case per subsystem; the list and why: tests/
#                  CMakeLists.txt, tests/cuda_emu/CMakeLists.txt), not every end-to-end test again
#   fuzz           every harness of tests/fuzz for FT_TEST_FUZZ_SECONDS (default 30) from its seed
#                  corpus (scripts/fuzz.sh)
# and at the end a table of the stages' times and the total, also when a stage failed (that
# stage is marked FAILED, the rest are not run).
#   scripts/test.sh                        # everything
#   FT_TEST_SANITIZE=0 scripts/test.sh     # no asan-build, asan-suite, fuzz
#   FT_TEST_FUZZ=0 scripts/test.sh         # no fuzz
# FT_CMAKE_ARGS: extra cmake arguments for both builds (a compiler launcher while working; CI has
# none).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs="$(nproc)"

# stage NAME: ends the stage before (its time printed) and starts NAME. The EXIT trap ends the
# last one and prints the table, so a run that stops at a failure still says what ran and for how
# long.
stage_names=()
stage_secs=()
stage=""
stage_t0=0
run_t0=$SECONDS
end_stage() {
  [[ -n $stage ]] || return 0
  local took=$((SECONDS - stage_t0))
  stage_names+=("$stage")
  stage_secs+=("$took")
  echo "test: stage $stage took $took s"
  stage=""
}
start_stage() {
  end_stage
  stage=$1
  stage_t0=$SECONDS
  echo "test: stage $stage"
}
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
summary() {
  local rc=$? failed=$stage i result
  end_stage
  echo "test: stage          seconds   m:ss"
  for i in "${!stage_names[@]}"; do
    result=""
    [[ $rc != 0 && ${stage_names[$i]} == "$failed" ]] && result="  FAILED (exit $rc)"
    printf 'test: %-14s %7d %6s%s\n' "${stage_names[$i]}" "${stage_secs[$i]}" \
      "$(mmss "${stage_secs[$i]}")" "$result"
  done
  local total=$((SECONDS - run_t0))
  printf 'test: %-14s %7d %6s  %s\n' total "$total" "$(mmss "$total")" \
    "$([[ $rc == 0 ]] && echo ok || echo FAILED)"
}
trap summary EXIT

start_stage setup
scripts/setup.sh --packages
start_stage release-build
# The CLI tests' Python venvs (PyPI downloads, torch 2's 2.8 GB among them) are made meanwhile,
# in the background: network time that would otherwise hold a ctest slot of the suite.
mkdir -p build
bash tests/cli/make_venvs.sh build . > build/make_venvs.log 2>&1 &
venvs_pid=$!
scripts/setup.sh --no-data
if wait "$venvs_pid"; then
  tail -1 build/make_venvs.log
else
  echo "test: making the Python venvs failed (build/make_venvs.log); the tests that need them" \
    "try again and say why:"
  tail -5 build/make_venvs.log
fi

start_stage release-suite
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

slurm_default=0
[[ $(id -u) == 0 ]] && slurm_default=1  # the local cluster's daemons need root
if [[ "${FT_TEST_SLURM:-$slurm_default}" == "1" ]]; then
  start_stage slurm
  bash tests/slurm/test_slurm.sh build .
fi

if [[ "${FT_TEST_SANITIZE:-1}" == "1" ]]; then
  start_stage asan-build
  source scripts/sanitizers.sh
  targets=(ft_sanitize_targets)
  [[ "${FT_TEST_FUZZ:-1}" == "1" ]] && targets+=(ft_fuzz_targets)
  sanitize_build "${targets[@]}"
  start_stage asan-suite
  # halt_on_error: any report fails the test. FT_TEST_VENVS: the Python venvs the Release pass
  # made (tests/cli/common.sh), linked, not made again.
  sanitize_env
  FT_TEST_VENVS="$PWD/build" \
  ASAN_OPTIONS="halt_on_error=1:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir "$sanitize_dir" -L sanitize --output-on-failure -j"$jobs" --timeout 1800
  if [[ "${FT_TEST_FUZZ:-1}" == "1" ]]; then
    start_stage fuzz
    FUZZ_JOBS="$jobs" scripts/fuzz.sh "${FT_TEST_FUZZ_SECONDS:-30}"
  fi
fi
