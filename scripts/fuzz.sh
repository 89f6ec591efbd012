#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp, in the sanitizer build build-asan/:
# clang 19 with ASan + UBSan, scripts/sanitizers.sh) and runs each for SECONDS (default 60) from
# its seed corpus (tests/fuzz/corpus/<target>/), which is copied, so new inputs the fuzzer keeps
# stay out of the repository.
#   scripts/fuzz.sh                 # every harness, 60 s each
#   scripts/fuzz.sh 600 recipe      # one harness, 10 minutes
#   FUZZ_JOBS=2 scripts/fuzz.sh     # harnesses in parallel
#   scripts/fuzz.sh --build         # build only
# A finding (crash, sanitizer report, leak, timeout of one input, out of memory) fails the run;
# the input that caused it is saved as build-asan/findings/<target>/crash-* (or timeout-*, oom-*)
# and can be replayed with build-asan/tests/fuzz/fuzz_<target> FILE.
# At the end it prints one line per harness: executions, execs/s, corpus size, result.
# shard_full is fuzz_shard in its full mode (FT_FUZZ_SHARD_MODE=full: libhdf5 in a check child
# per input, ~20 inputs/s) from tests/fuzz/corpus/shard/full, for FUZZ_SHARD_FULL_SECONDS
# (default SECONDS, at most 15 when every harness runs); it also fails when no input at all was
# read fully, since the seeds are good shards (a harness that cannot open any file passes
# otherwise, every input "rejected").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_only=0
[[ ${1:-} == --build ]] && build_only=1 && shift
seconds="${1:-60}"
shift || true

source scripts/sanitizers.sh
build=$sanitize_dir
sanitize_build ft_fuzz_targets >/dev/null
sanitize_env
((build_only)) && exit 0

targets=("$@")
full_seconds="${FUZZ_SHARD_FULL_SECONDS:-$seconds}"
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done
  targets+=(shard_full)
  [[ -z ${FUZZ_SHARD_FULL_SECONDS:-} ]] && ((full_seconds > 15)) && full_seconds=15
fi

run_one() {
  local t=$1 work="$build/work/$1" findings="$build/findings/$1" harness=$1 corpus=$1
  local time=$seconds mode=
  if [[ $t == shard_full ]]; then harness=shard corpus=shard/full time=$full_seconds mode=full; fi
  rm -rf "$work" && mkdir -p "$work" "$findings"
  [[ -d tests/fuzz/corpus/$corpus ]] && cp -r "tests/fuzz/corpus/$corpus/." "$work/"
  # -timeout: one input taking over 10 s is a hang. -rss_limit_mb: bounded memory per input.
  # Leak checking stays on (ASan's default).
  if FT_FUZZ_SHARD_MODE=$mode "$build/tests/fuzz/fuzz_$harness" "$work" -max_total_time="$time" \
       -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1 \
       >"$build/fuzz_$t.log" 2>&1; then
    result=ok
  else
    result="FAILED (see $build/fuzz_$t.log and $findings/)"
  fi
  if [[ $t == shard_full && $result == ok ]] &&
     ! grep -Eq 'fuzz_shard \(full\): [0-9]+ inputs, [1-9][0-9]* read fully' "$build/fuzz_$t.log"; then
    result="FAILED (no input read fully, not even the seed shards: see $build/fuzz_$t.log)"
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
  if [[ $t != shard_full && ! -f tests/fuzz/fuzz_$t.cpp ]]; then
    echo "fuzz: no harness tests/fuzz/fuzz_$t.cpp"
    exit 2
  fi
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
