#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp, clang with ASan + UBSan, in build-fuzz/)
# and runs each for SECONDS (default 60) from its seed corpus (tests/fuzz/corpus/<target>/),
# which is copied, so new inputs the fuzzer keeps stay out of the repository.
#   scripts/fuzz.sh                 # every harness, 60 s each
#   scripts/fuzz.sh 600 recipe      # one harness, 10 minutes
#   FUZZ_JOBS=2 scripts/fuzz.sh     # harnesses in parallel
# A finding (crash, sanitizer report, leak, timeout of one input, out of memory) fails the run;
# the input that caused it is saved as build-fuzz/findings/<target>/crash-* (or timeout-*, oom-*)
# and can be replayed with build-fuzz/tests/fuzz/fuzz_<target> FILE.
# At the end it prints one line per harness: executions, execs/s, corpus size, result.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-60}"
shift || true

source scripts/install_missing.sh
install_missing fuzz clang libclang-rt-14-dev libomp-14-dev

build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -DFT_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null

targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done
fi

run_one() {
  local t=$1 work="$build/work/$t" findings="$build/findings/$t"
  rm -rf "$work" && mkdir -p "$work" "$findings"
  [[ -d tests/fuzz/corpus/$t ]] && cp -r "tests/fuzz/corpus/$t/." "$work/"
  # -timeout: one input taking over 10 s is a hang. -rss_limit_mb: bounded memory per input.
  # Leak checking stays on (ASan's default).
  if "$build/tests/fuzz/fuzz_$t" "$work" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1 \
       >"$build/fuzz_$t.log" 2>&1; then
    result=ok
  else
    result="FAILED (see $build/fuzz_$t.log and $findings/)"
  fi
  local execs rate
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz_$t.log" | grep -o '[0-9]*$' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$build/fuzz_$t.log" | grep -o '[0-9]*$' || true)
  printf 'fuzz %-22s %10s execs %7s/s  corpus %5s  %s\n' "$t" "${execs:-?}" "${rate:-?}" \
    "$(ls "$work" | wc -l)" "$result" >"$build/fuzz_$t.result"
  [[ $result == ok ]]
}

echo "fuzz: ${#targets[@]} harnesses, ${seconds} s each: ${targets[*]}"
status=0
pids=()
jobs="${FUZZ_JOBS:-1}"
for t in "${targets[@]}"; do
  if [[ ! -f tests/fuzz/fuzz_$t.cpp ]]; then echo "fuzz: no harness tests/fuzz/fuzz_$t.cpp"; exit 2; fi
  run_one "$t" & pids+=($!)
  if ((${#pids[@]} >= jobs)); then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
passed=0
for t in "${targets[@]}"; do
  cat "$build/fuzz_$t.result"
  grep -q ' ok$' "$build/fuzz_$t.result" && passed=$((passed + 1))
done
echo "fuzz: $passed passed, $((${#targets[@]} - passed)) failed"
exit $status
