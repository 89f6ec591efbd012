// The choice of instruction-set level for the per-level kernels (kernels.h, kernels/cpu/isa.h):
// once per process, from FT_CPU_ISA or the CPU's cpuid. Compiled once, with the baseline flags.
#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/kernels.h"

namespace ft::kernels {

CpuIsa parse_cpu_isa(const char* value, CpuIsa supported) {
  if (!value || !*value) return supported;
  for (CpuIsa isa :
       {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16, CpuIsa::amx}) {
    if (std::string(value) != cpu_isa_name(isa)) continue;
    if (isa > supported)
      FT_FAIL("FT_CPU_ISA=", value, ": this CPU runs at most ", cpu_isa_name(supported),
              "; choose one of baseline, avx2, avx512, avx512_bf16, amx up to it, or unset "
              "FT_CPU_ISA for the highest");
    return isa;
  }
  FT_FAIL("FT_CPU_ISA=", value, " is not an instruction set of ft's CPU kernels: choose one of ",
          "baseline, avx2, avx512, avx512_bf16, amx, or unset it for the highest this CPU runs");
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline:
      return "baseline";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx512_bf16:
      return "avx512_bf16";
    case CpuIsa::amx:
      return "amx";
  }
  return "?";
}

namespace {

// AMX-BF16 and AMX-TILE in cpuid (leaf 7: EDX bits 22 and 24), and the OS saving the tile state
// (XCR0 bits 17 and 18). Linux also asks a process to request the tile data before its first
// use (arch_prctl ARCH_REQ_XCOMP_PERM), which oneDNN does itself.
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 22)) || !(edx & (1u << 24))) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

}  // namespace

CpuIsa cpu_isa_supported() {
  // __builtin_cpu_supports checks the OS too: an AVX feature counts only where XGETBV says the
  // OS saves the ymm (and zmm, opmask) state.
  __builtin_cpu_init();
  // F16C, LZCNT and MOVBE came with AVX2 + FMA in every CPU that has those (Haswell, Zen), and
  // some compilers cannot ask for them; they are not checked apart.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                  __builtin_cpu_supports("popcnt");
  if (!v3) return CpuIsa::baseline;
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  if (!v4) return CpuIsa::avx2;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::avx512;
  return amx_usable() ? CpuIsa::amx : CpuIsa::avx512_bf16;
}

CpuIsa cpu_isa() {
  // A throwing first call (a bad FT_CPU_ISA) leaves the static unset; the next call throws again.
  static const CpuIsa isa = parse_cpu_isa(std::getenv("FT_CPU_ISA"), cpu_isa_supported());
  return isa;
}

}  // namespace ft::kernels
