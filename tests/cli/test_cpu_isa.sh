#!/usr/bin/env bash
# The CPU kernels' instruction-set levels (kernels.h's CpuIsa, kernels/cpu/isa.h, DESIGN.md §2):
#   1. ft is portable: disassembled, no function of the binary uses an instruction beyond x86-64
#      (SSE2) except the kernels of the avx2 and avx512 copies (namespaces ft::kernels::isa_avx2
#      and isa_avx512, which run only once cpu_isa() chose such a level; the avx512_bf16 and amx
#      levels run the avx512 copy) and GCC's target_clones copies (an AVX2 clone of
#      ckpt/writer.cpp's first_non_finite, chosen by GCC's own resolver at load time). The avx512
#      kernels do hold AVX-512 code and the baseline ones none (so the check can tell them apart).
#   2. The kernel unit tests (their tolerances against the references, unchanged) pass under
#      FT_CPU_ISA=baseline and every other level this CPU runs.
#   3. ft train under each level: the run header names it and, in bf16, the 16-bit GEMM path;
#      the FMA levels (avx2, avx512, avx512_bf16, amx) give the same losses and gradient norms bit
#      for bit where their GEMMs take the same path (all of them in fp32; in bf16 the packed
#      kernel at avx2, avx512 and avx512_bf16 on Intel, oneDNN's at amx), baseline (no FMA) the same within 1e-5 (fp32) or
#      1e-2 (bf16: see below).
#   4. FT_CPU_ISA=<unknown> fails naming the choices.
#   bash tests/cli/test_cpu_isa.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
command -v objdump >/dev/null || fail "objdump is missing (binutils)"

# 1. Instructions beyond x86-64 (SSE2): any VEX/EVEX form (mnemonics v*, the opmask k*), BMI1/2,
# LZCNT, MOVBE, POPCNT, and SSSE3/SSE4.1/SSE4.2's. Function by function (objdump's <name>: lines,
# demangled).
beyond='^(v[a-z0-9]+|k(mov|and|andn|or|xnor|xor|not|shiftl|shiftr|test|ortest|unpck|add)[bwdq]?|(andn|bextr|blsi|blsmsk|blsr|bzhi|mulx|pdep|pext|rorx|sarx|shlx|shrx|lzcnt|movbe|popcnt)[lqw]?|pshufb|palignr|phadd[swd]+|phsub[swd]+|pabs[bwd]|pmaddubsw|pmulhrsw|psign[bwd]|blendv?p[sd]|pblend(vb|w)|dpp[sd]|insertps|extractps|pextr[bdq]|pinsr[bdq]|pm(ax|in)(sb|sd|ud|uw)|pmov[sz]x[bwd][wdq]|pmuldq|pmulld|ptest|round[ps][sd]|packusdw|pcmp(eq|gt)q|movntdqa|mpsadbw|phminposuw|pcmp[ei]str[im]|crc32[bwlq]?)$'
objdump -d --no-show-raw-insn -C "$build/ft" | awk -v re="$beyond" '
  /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
  NF >= 2 && $1 ~ /:$/ {
    m = $2; if (m ~ /^(rep|repz|repnz|lock|notrack|bnd|data16)$/) m = $3
    dispatched = fn ~ /(^| )ft::kernels::isa_(avx2|avx512)::/ ||
                 fn ~ /\[clone \.(avx|fma|arch_)[a-z0-9_]*\]$/
    if (m ~ re) { if (dispatched) n_disp++; else { bad++; if (!(fn in seen)) { seen[fn] = 1; print "  " fn ": " m > "/dev/stderr" } } }
    if (fn ~ /(^| )ft::kernels::isa_avx512::/ && $0 ~ /zmm/) zmm++
    if (fn ~ /(^| )ft::kernels::isa_baseline::/) base++
  }
  END { printf "%d instructions beyond x86-64 outside the dispatched kernels; %d inside; %d zmm in avx512; %d in baseline kernels\n", bad, n_disp, zmm, base
        exit (bad > 0 || zmm == 0 || base == 0) }' > "$tmp/objdump.txt" 2> "$tmp/beyond.txt" ||
  fail "ft is not portable: $(cat "$tmp/objdump.txt"); first functions: $(head -20 "$tmp/beyond.txt")"
cat "$tmp/objdump.txt"

# Levels this CPU runs (the unit test prints it).
top=$("$build/tests/ft_unit_tests" -tc='FT_CPU_ISA names*' -s 2>&1 | sed -n 's/.*supports up to \([a-z0-9_]*\).*/\1/p' | head -1)
case "$top" in
  baseline) levels="baseline" ;;
  avx2) levels="baseline avx2" ;;
  avx512) levels="baseline avx2 avx512" ;;
  avx512_bf16) levels="baseline avx2 avx512 avx512_bf16" ;;
  amx) levels="baseline avx2 avx512 avx512_bf16 amx" ;;
  *) fail "could not read the CPU's level from ft_unit_tests: '$top'" ;;
esac

# 2. The kernels' unit tests under each level (OMP_WAIT_POLICY as ctest's unit run).
for isa in $levels; do
  out=$(FT_CPU_ISA=$isa OMP_WAIT_POLICY=PASSIVE "$build/tests/ft_unit_tests" \
    -sf='*test_kernels*,*test_kernels16*,*test_attention.cpp,*test_gemm16*,*test_adamw_grad_scale*,*test_rope*,*test_cpu_isa*' 2>&1) ||
    fail "FT_CPU_ISA=$isa: kernel unit tests failed: $(tail -30 <<< "$out")"
  grep -Eq 'test cases: +[1-9][0-9]* \| +[1-9][0-9]* passed \| +0 failed' <<< "$out" ||
    fail "FT_CPU_ISA=$isa ran no kernel test: $(tail -5 <<< "$out")"
  echo "FT_CPU_ISA=$isa: $(grep -E 'test cases:' <<< "$out")"
done

# 3. A short training run under each level, fp32 and bf16.
/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:3" --vocab 97 --samples 40 \
  --seq-len 16 --seed 0 > /dev/null
for prec in fp32 bf16; do
  cat > "$tmp/r_$prec.yaml" <<YAML
run: {name: t, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, seq_len: 16, shuffle: true}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, precision: $prec}
optimizer: {lr: 0.01}
logging: {every_steps: 1}
runtime: {threads: 2}
YAML
  for isa in $levels; do
    FT_CPU_ISA=$isa "$ft" train "$tmp/r_$prec.yaml" "run.output_dir=$tmp/run_${prec}_$isa" \
      > "$tmp/out_${prec}_$isa.txt" 2>&1 || fail "FT_CPU_ISA=$isa ft train ($prec): $(tail -5 "$tmp/out_${prec}_$isa.txt")"
    grep -q "CPU kernels $isa, " "$tmp/out_${prec}_$isa.txt" ||
      fail "the run header does not name FT_CPU_ISA=$isa: $(grep '^ft: data' "$tmp/out_${prec}_$isa.txt")"
    # bf16 GEMMs (DESIGN §2): widened at baseline (no FMA), ft's packed kernel at avx2 and
    # avx512 (no oneDNN kernel worth running there), and the header says so; fp32 runs name no
    # 16-bit path.
    want=
    [[ $prec == bf16 && $isa == baseline ]] && want="widened to fp32 for OpenBLAS"
    [[ $prec == bf16 && ($isa == avx2 || $isa == avx512) ]] && want="packed for fp32 FMAs"
    if [[ -n $want ]]; then
      grep -q "16-bit GEMMs $want$" "$tmp/out_${prec}_$isa.txt" ||
        fail "FT_CPU_ISA=$isa bf16: the header does not name the GEMMs $want: $(grep '^ft: data' "$tmp/out_${prec}_$isa.txt")"
    elif [[ $prec == fp32 ]] && grep -q "16-bit GEMMs" "$tmp/out_${prec}_$isa.txt"; then
      fail "an fp32 run names a 16-bit GEMM path: $(grep '^ft: data' "$tmp/out_${prec}_$isa.txt")"
    fi
  done
  # Unset, the run takes the CPU's highest level.
  "$ft" train "$tmp/r_$prec.yaml" "run.output_dir=$tmp/run_${prec}_auto" > "$tmp/out_${prec}_auto.txt" 2>&1 ||
    fail "ft train ($prec): $(tail -5 "$tmp/out_${prec}_auto.txt")"
  grep -q "CPU kernels $top, " "$tmp/out_${prec}_auto.txt" ||
    fail "without FT_CPU_ISA the run header should name $top: $(grep '^ft: data' "$tmp/out_${prec}_auto.txt")"
  cmp_args=(--keys loss,grad_norm --min-entries 16)
  # Each FMA level against the first one whose header names the same GEMM path: bit for bit.
  declare -A first_on_path=()
  for isa in $levels; do
    [[ $isa == baseline ]] && continue
    path=$(grep -o '16-bit GEMMs [^,]*$' "$tmp/out_${prec}_$isa.txt" || echo none)
    ref=${first_on_path[$path]:-}
    if [[ -z $ref ]]; then
      first_on_path[$path]=$isa
      continue
    fi
    /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/run_${prec}_$ref" \
      "$tmp/run_${prec}_$isa" --loss-rel 0 --norm-rel 0 "${cmp_args[@]}" ||
      fail "$prec: $ref and $isa differ ($path)"
  done
  unset first_on_path
  if [[ "$levels" != baseline ]]; then
    # fp32: a few ulp per op without FMA, amplified over 8 steps; bf16: the same differences
    # sometimes flip a bf16 rounding of an activation (one unit, 2^-8), so its bound is looser.
    rel=1e-5; [[ $prec == bf16 ]] && rel=1e-2
    /usr/bin/python3 "$src/tests/cli/compare_metrics.py" "$tmp/run_${prec}_baseline" \
      "$tmp/run_${prec}_$top" --loss-rel $rel --norm-rel $rel "${cmp_args[@]}" ||
      fail "$prec: baseline and $top differ by more than $rel"
  fi
done

# 4. An unknown level.
if FT_CPU_ISA=avx1024 "$ft" train "$tmp/r_fp32.yaml" "run.output_dir=$tmp/run_bad" > "$tmp/bad.txt" 2>&1; then
  fail "FT_CPU_ISA=avx1024 (unknown) was accepted"
fi
grep -q 'FT_CPU_ISA=avx1024 is not an instruction set .*baseline, avx2, avx512, avx512_bf16, amx' "$tmp/bad.txt" ||
  fail "FT_CPU_ISA=avx1024: the error does not name the choices: $(tail -3 "$tmp/bad.txt")"
echo "ok"
