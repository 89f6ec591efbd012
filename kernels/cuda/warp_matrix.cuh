// Warp-level matrix instructions (tensor cores, sm_80+) and cp.async, for kernels that include
// this after common.cuh. Under nvcc each function is a small wrapper around one PTX instruction;
// under the CUDA emulation (FT_CUDA_EMU, a test tool) it calls the emulator's twin
// (tests/cuda_emu/cuda_emu.h), which checks the instruction's rules and reports misuse.
//
// Sources: NVIDIA PTX ISA 8.7: §9.7.14.5.14 mma, §9.7.14.5.8 the m16n8k16 fragments,
// §9.7.14.5.15 ldmatrix, §9.7.9.25.3 cp.async / commit_group / wait_group, §6.4.1 alignment.
// Notation: lane l, g = l >> 2, q = l & 3. Element types E: bf16 / f16 of core/half.h (or
// __nv_bfloat16 / __half, the same bits), two per 32-bit register, the lower-indexed element
// in bits 0..15 (pack2).
//
// Fragments of mma.m16n8k16 (element i of the lane's list):
//   A 16x16 (4 regs, 8 elements): row g + 8·((i >> 1) & 1), column 2q + (i & 1) + 8·(i >= 4);
//   B 16x8, [k][n] (2 regs, 4 elements): k = 2q + (i & 1) + 8·(i >= 2), n = g;
//   C, D 16x8 f32 (4 floats): row g + 8·(i >= 2), column 2q + (i & 1).
// ldmatrix: lane 8i + j gives the address of row j (8 elements, 16 bytes, 16-byte aligned, in
// shared memory) of matrix i; register i of lane l gets M_i[g][2q], M_i[g][2q + 1] (low, high),
// with .trans M_i[2q][g], M_i[2q + 1][g]. Lanes past 8·num give addresses that are ignored.
// mma and ldmatrix are .sync.aligned: all 32 lanes of the warp execute the same instruction, none
// has exited. The emulator's shared memory is the launch's dynamic shared memory
// (FT_DYNAMIC_SHARED): ldmatrix rows and cp.async destinations must lie there.
//
// cp.async is per thread and asynchronous: the copy is complete (and visible to this thread)
// only after a cp_async_wait<N> that covers its group, or cp_async_wait_all; __syncthreads does
// not wait for it. So: issue, commit, wait, then __syncthreads before other threads read.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ft::kernels::cuda {

// MmaElement<E>::kBf16: which of the two 16-bit float types E is.
template <class E>
struct MmaElement;
template <>
struct MmaElement<::ft::bf16> {
  static constexpr bool kBf16 = true;
};
template <>
struct MmaElement<::ft::f16> {
  static constexpr bool kBf16 = false;
};
template <>
struct MmaElement<__nv_bfloat16> : MmaElement<::ft::bf16> {};
template <>
struct MmaElement<__half> : MmaElement<::ft::f16> {};

// pack2<E>(lo, hi): two elements rounded to nearest even (from_float), lo in bits 0..15.
template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (MmaElement<E>::kBf16) {
    return uint32_t(__bfloat16_as_ushort(from_float<__nv_bfloat16>(lo))) |
           uint32_t(__bfloat16_as_ushort(from_float<__nv_bfloat16>(hi))) << 16;
  } else {
    return uint32_t(__half_as_ushort(from_float<__half>(lo))) |
           uint32_t(__half_as_ushort(from_float<__half>(hi))) << 16;
  }
}

// pack2_rn<E>(lo, hi): pack2's rounding for every number, in one cvt.rn.{bf16,f16}x2.f32 (PTX
// ISA, cvt: a goes to the upper half, b to the lower; F2FP.PACK_AB in SASS), where pack2 spends
// about six instructions an element on keeping a NaN's payload as core/half.h does. For mma
// operands (P and dS in the fused attention), where a NaN operand makes the product NaN whatever
// its payload, so the payload rule buys nothing; stored results keep pack2. A NaN becomes the
// canonical NaN 0x7fff (the emulator's twin gives the same).
template <class E>
__device__ __forceinline__ uint32_t pack2_rn(float lo, float hi) {
#if defined(FT_CUDA_EMU)
  const auto one = [](float x) -> uint32_t {
    if (x != x) return 0x7fffu;
    return uint32_t(pack2<E>(x, 0.0f) & 0xffffu);
  };
  return one(lo) | one(hi) << 16;
#else
  uint32_t d;
  if constexpr (MmaElement<E>::kBf16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#endif
}

// exp2_approx(x): 2^x by the special-function unit, ex2.approx.ftz.f32 (PTX ISA, floating-point
// instructions, ex2: an approximation of a few ulp; subnormal results flushed to +0; 2^-inf = +0).
// One MUFU.EX2, where exp2f adds about four instructions (its fix-up of the subnormal range:
// nvcc's SASS of attention_fused.cu). The emulator's twin is exp2f with the same flush, so the
// emulated kernels differ from the GPU by the instruction's error only.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(FT_CUDA_EMU)
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.0f : y;  // FLT_MIN: the ftz of the result
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

#if defined(FT_CUDA_EMU)

// The emulator's twins: `where` (the call site) tells the emulator which lanes are at the same
// instruction.
template <class E>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                         const float (&c)[4],
                         const std::source_location& where = std::source_location::current()) {
  ::ft::emu::mma_m16n8k16(
      MmaElement<E>::kBf16 ? ::ft::emu::MmaType::kBf16 : ::ft::emu::MmaType::kF16, d, a, b, c,
      where);
}

#define FT_LDMATRIX_(name, num, trans)                                                    \
  inline void name(uint32_t(&r)[num], const void* row_addr,                               \
                   const std::source_location& where = std::source_location::current()) { \
    ::ft::emu::ldmatrix(num, trans, r, row_addr, where);                                  \
  }
FT_LDMATRIX_(ldmatrix_x1, 1, false)
FT_LDMATRIX_(ldmatrix_x2, 2, false)
FT_LDMATRIX_(ldmatrix_x4, 4, false)
FT_LDMATRIX_(ldmatrix_x1_trans, 1, true)
FT_LDMATRIX_(ldmatrix_x2_trans, 2, true)
FT_LDMATRIX_(ldmatrix_x4_trans, 4, true)
#undef FT_LDMATRIX_

template <int Bytes>
inline void cp_async_ca(void* smem, const void* gmem, int src_bytes = Bytes,
                        const std::source_location& where = std::source_location::current()) {
  ::ft::emu::cp_async(smem, gmem, Bytes, src_bytes, false, where);
}
inline void cp_async_cg16(void* smem, const void* gmem, int src_bytes = 16,
                          const std::source_location& where = std::source_location::current()) {
  ::ft::emu::cp_async(smem, gmem, 16, src_bytes, true, where);
}
inline void cp_async_commit() { ::ft::emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait(const std::source_location& where = std::source_location::current()) {
  static_assert(N >= 0, "cp.async.wait_group takes N >= 0");
  ::ft::emu::cp_async_wait(N, where);
}
inline void cp_async_wait_all(const std::source_location& where = std::source_location::current()) {
  ::ft::emu::cp_async_wait(-1, where);
}

#else  // nvcc

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX ISA §9.7.14.5.14):
// D = A·B + C on the warp; d may alias c.
template <class E>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2], const float (&c)[4]) {
  if constexpr (MmaElement<E>::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 (PTX ISA §9.7.14.5.15). No memory
// clobber (as CUTLASS): the shared data is written by other threads, so a __syncthreads (a
// compiler barrier too) separates the writes from the load anyway.
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(shared_address(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(shared_address(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_addr)));
}

// cp.async.{ca,cg}.shared.global [dst], [src], cp-size, src-size (PTX ISA §9.7.9.25.3.1):
// src-size bytes copied, the rest of the Bytes zero-filled.
template <int Bytes>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem, int src_bytes = Bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_address(smem)),
               "l"(__cvta_generic_to_global(gmem)), "n"(Bytes), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_cg16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)),
               "l"(__cvta_generic_to_global(gmem)), "r"(src_bytes)
               : "memory");
}
// cp.async.commit_group / wait_group N / wait_all (PTX ISA §9.7.9.25.3.2, §9.7.9.25.3.3).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group takes N >= 0");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

#endif

}  // namespace ft::kernels::cuda
