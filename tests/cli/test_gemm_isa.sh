#!/usr/bin/env bash
# The bf16/f16 GEMM tests (tests/unit/test_gemm16.cpp) again with oneDNN capped below its bf16
# kernels, so that the fallback (packed, or widened to fp32) runs for bf16 too (on CPUs without
# AVX-512 it is the path users get), and at plain AVX-512 (bf16 emulated by oneDNN). The uncapped run is in
# `unit`. gemm_isa() must name the capped ISA (checked inside the test case). Then uncapped with
# FT_GEMM16=widen, =packed and =onednn, which send every 16-bit GEMM through one path (measuring knobs,
# scripts/bench.sh), so that each is known to work on any CPU; and a bad FT_GEMM16 is refused.
#   bash tests/cli/test_gemm_isa.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }

for setting in ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX512_CORE FT_GEMM16=widen FT_GEMM16=packed \
  FT_GEMM16=onednn; do
  out=$(env "$setting" "$build/tests/ft_unit_tests" -tc="linear*,gemm_isa*" 2>&1) \
    || fail "$setting: $out"
  grep -Eq 'test cases: +[1-9][0-9]* \| +[1-9][0-9]* passed \| +0 failed' <<< "$out" \
    || fail "$setting ran no GEMM test: $out"
done
# A path that does not exist: every 16-bit GEMM fails naming the choices (ft train says it
# before its first step: test_error_messages.sh).
out=$(FT_GEMM16=dnnl "$build/tests/ft_unit_tests" -tc="linear bf16 propagates*" 2>&1) &&
  fail "FT_GEMM16=dnnl was accepted: $out"
grep -q 'FT_GEMM16=dnnl is not a 16-bit GEMM path: choose onednn, packed or widen' <<< "$out" ||
  fail "FT_GEMM16=dnnl: the error does not name the choices: $out"
echo "ok"
