// Hopper (sm_90a) asynchronous instructions for kernels that include this after common.cuh:
// mbarrier, TMA (cp.async.bulk.tensor with host-made tensor maps) and wgmma. Under nvcc each
// function wraps one PTX instruction; under the CUDA emulation (FT_CUDA_EMU, a test tool) it calls
// the emulator's twin (tests/cuda_emu/hopper_emu.h), which models the instruction's state and
// ordering rules and reports misuse (tests/cuda_emu/hopper_emu.cpp says what is modelled).
//
// Sources: NVIDIA PTX ISA 8.x: §9.7.13.15 mbarrier; §9.7.9.25 asynchronous copies,
// cp.async.bulk.tensor; §9.7.15 wgmma (.m64nNk16 fragments, shared memory matrix layouts and the
// matrix descriptor); the CUDA driver API's cuTensorMapEncodeTiled.
//
// mbarrier (an 8-byte object in shared memory; here: in the launch's dynamic shared memory,
// FT_DYNAMIC_SHARED, 8-byte aligned). Each phase completes when its pending arrival count
// (reloaded from init's count) and its tx-count (bytes announced by expect_tx, taken off by
// complete_tx, as a TMA copy does on completion) are both zero; a waiter names the phase by its
// parity: mbarrier_wait(bar, p) returns once the phase of parity p is complete, so a consumer
// waits on parity 0, 1, 0, ... for the barrier's successive phases. One thread inits, then a
// __syncthreads before any other thread uses the barrier.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_matrix.cuh"  // MmaElement
#if !defined(FT_CUDA_EMU)
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

// FT_HOPPER_DEVICE: 1 where these instructions exist: the emulation, nvcc's host pass (kernel
// bodies are parsed there, never run) and its sm_90a device pass. A kernel built for several
// architectures (CMAKE_CUDA_ARCHITECTURES 80;90a) puts its body under it; its launcher must not
// launch it on an older GPU.
#if defined(FT_CUDA_EMU) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FT_HOPPER_DEVICE 1
#else
#define FT_HOPPER_DEVICE 0
#endif

namespace ft::kernels::cuda {

// TMA (cp.async.bulk.tensor, tile mode): a tensor map, made on the host by encode_tensor_map
// (cuTensorMapEncodeTiled; under the emulation its stand-in, which checks the same documented
// rules), describes a global tensor of `rank` dimensions, innermost first (dims in elements,
// strides in bytes for dimensions 1.., multiples of 16), and a box (box[d] elements, 1..256;
// box[0] times the element size a multiple of 16 and, when swizzled, no more than the swizzle's
// span: the emulator takes exactly the span). Passed to the kernel as a `const __grid_constant__
// TensorMap` parameter. tma_load_{2,3}d(smem, map, coords.., bar) copies the box at those
// element coordinates (signed; elements outside the tensor become zeros) to smem (128-byte
// aligned; 1024 with the 128-byte swizzle keeps the pattern aligned with the tile), row-major
// with dimension 0 fastest, each 16-byte chunk at the swizzled shared address (tma_swizzle), and
// completes its bytes (the whole box) on bar: the issuing thread announces them first with
// mbarrier_arrive_expect_tx, and the data may be read once the phase is complete.
// tma_store_{2,3}d(map, coords.., smem) is the reverse: the box laid out in smem as a load lands
// it, to the tensor (elements outside it are not written). The threads that wrote smem call
// fence_proxy_async_shared() and meet the issuing thread at a barrier first; the store belongs to
// the issuing thread's bulk groups: bulk_commit_group(), then bulk_wait_group_read<n>() before
// smem is written again (or the block ends), bulk_wait_group<n>() before the global data is read.
// Named barriers: named_barrier_sync / _arrive(id, count), ids 1 .. 15, count a multiple of 32.
// setmaxnreg_inc / _dec<n>(): a warpgroup's register limit per thread (warp specialisation: the
// producer gives registers back, the consumers take them), under __launch_bounds__(threads, 1).
enum class TmaType { kBf16 = 0, kF16 = 1, kF32 = 2 };
enum class TmaSwizzle { kNone = 0, k32B = 1, k64B = 2, k128B = 3 };

// The shared address a 16-byte chunk at `address` lands at under a swizzle of `span` bytes (0,
// 32, 64, 128): Swizzle<B,4,3>, bits [4, 4 + B) ^= bits [7, 7 + B), B = log2(span / 16). So row
// r of a 128-byte-swizzled tile (128 bytes a row, from a 1024-byte boundary) holds its chunk c
// at chunk c ^ (r % 8). wgmma's descriptors read the same patterns.
__host__ __device__ __forceinline__ uint32_t tma_swizzle(uint32_t address, int span) {
  const uint32_t mask = span == 128 ? 7u : span == 64 ? 3u : span == 32 ? 1u : 0u;
  return address ^ (((address >> 7) & mask) << 4);
}

// wgmma (warpgroup MMA, §9.7.15): the 128 threads of a warpgroup (4 consecutive warps, the first
// a multiple of 4) execute every instruction together. wgmma_m64k16<E, N, TransA, TransB>(d,
// desc_a, desc_b, accumulate): D (64 x N f32) = A (64 x 16) · B (16 x N) (+ D), A and B in shared
// memory through matrix descriptors (wgmma_descriptor: start, leading and stride byte offsets,
// swizzle), K-major unless Trans (M- / N-major); wgmma_m64k16_rs takes A from 4 registers (the
// mma.m16n8k16 A layout, warp w holding rows 16 w ..). Thread t of the warpgroup (w = t / 32, lane
// l, g = l >> 2, q = l & 3) holds in d[i], i < N / 2: row 16 w + g + 8 ((i >> 1) & 1), column
// 8 (i >> 2) + 2 q + (i & 1). Asynchronous: wgmma_fence() before the first wgmma and after
// touching its registers, wgmma_commit_group() closes the issued ones into a group,
// wgmma_wait_group<n>() waits until at most n groups are pending; only then may d be read or
// written. Shared memory the threads wrote themselves needs fence_proxy_async_shared() (and a
// __syncthreads) before a wgmma reads it; TMA's writes do not, but every thread of the warpgroup
// must have waited on the copy's mbarrier phase (or passed a __syncthreads after one that did:
// the emulation checks both rules). To nvcc a wgmma's asm writes d
// when issued, so it could move code that reads or writes d above the wgmma_wait_group that
// completes it (the wait names no register): wgmma_fence_operand(d) after that wait (an empty
// asm reading and writing each register, ordered with the other volatile asms) pins those
// accesses after it, as CUTLASS's warpgroup_fence_operand does; likewise for the A registers of
// wgmma_m64k16_rs, which the next tile's fragments may overwrite only once the wgmmas that read
// them have completed.
// Descriptor layouts for 16-bit elements (byte offsets of element (r, k), r the M or N index;
// W the swizzle's bytes): K-major: none: (r % 8) 16 + (r / 8) SBO + (k % 8) 2 + (k / 8) LBO;
// swizzled: (r % 8) W + (r / 8) SBO + 2 k (LBO unused). MN-major: none: (r % 8) 2 + (r / 8) SBO +
// (k % 8) 16 + (k / 8) LBO; swizzled: (r % (W / 2)) 2 + (r / (W / 2)) LBO + (k % 8) W +
// (k / 8) SBO. The start is added and tma_swizzle applied to the shared address: a
// 128-byte-swizzled TMA box of 64 x 64 bf16 (1024-byte aligned) is K-major with SBO = 1024, its
// k-steps of 16 at start + 32 bytes each.
enum class WgmmaSwizzle { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };  // the descriptor's codes

#if defined(FT_CUDA_EMU)

#define FT_HOPPER_WHERE const std::source_location& where = std::source_location::current()

// The shared address of p (here: its offset in the dynamic shared memory, 1024-byte aligned).
inline uint32_t smem_offset(const void* p, FT_HOPPER_WHERE) {
  return ::ft::emu::shared_offset(p, "smem_offset", where);
}

inline void mbarrier_init(uint64_t* bar, unsigned count, FT_HOPPER_WHERE) {
  ::ft::emu::mbarrier_init(bar, count, where);
}
inline void mbarrier_inval(uint64_t* bar, FT_HOPPER_WHERE) {
  ::ft::emu::mbarrier_inval(bar, where);
}
inline uint64_t mbarrier_arrive(uint64_t* bar, unsigned count = 1, FT_HOPPER_WHERE) {
  return ::ft::emu::mbarrier_arrive(bar, count, false, 0, where);
}
inline uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, unsigned tx_bytes, FT_HOPPER_WHERE) {
  return ::ft::emu::mbarrier_arrive(bar, 1, true, tx_bytes, where);
}
inline void mbarrier_expect_tx(uint64_t* bar, unsigned tx_bytes, FT_HOPPER_WHERE) {
  ::ft::emu::mbarrier_expect_tx(bar, tx_bytes, where);
}
inline void mbarrier_complete_tx(uint64_t* bar, unsigned tx_bytes, FT_HOPPER_WHERE) {
  ::ft::emu::mbarrier_complete_tx(bar, tx_bytes, where);
}
inline bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity, FT_HOPPER_WHERE) {
  return ::ft::emu::mbarrier_try_wait_parity(bar, parity, where);
}
inline void mbarrier_wait(uint64_t* bar, unsigned parity, FT_HOPPER_WHERE) {
  while (!::ft::emu::mbarrier_try_wait_parity(bar, parity, where)) {
  }
}

using TensorMap = ::ft::emu::TensorMap;
inline TensorMap encode_tensor_map(TmaType type, int rank, const void* base, const uint64_t* dims,
                                   const uint64_t* strides, const uint32_t* box,
                                   TmaSwizzle swizzle) {
  return ::ft::emu::encode_tensor_map(::ft::emu::TmaType(int(type)), rank, base, dims, strides, box,
                                      ::ft::emu::TmaSwizzle(int(swizzle)));
}
inline void tma_load_2d(void* smem, const TensorMap& map, int c0, int c1, uint64_t* bar,
                        FT_HOPPER_WHERE) {
  const int coords[2] = {c0, c1};
  ::ft::emu::tma_load(smem, map, 2, coords, bar, where);
}
inline void tma_load_3d(void* smem, const TensorMap& map, int c0, int c1, int c2, uint64_t* bar,
                        FT_HOPPER_WHERE) {
  const int coords[3] = {c0, c1, c2};
  ::ft::emu::tma_load(smem, map, 3, coords, bar, where);
}

inline void tma_store_2d(const TensorMap& map, int c0, int c1, const void* smem, FT_HOPPER_WHERE) {
  const int coords[2] = {c0, c1};
  ::ft::emu::tma_store(map, 2, coords, smem, where);
}
inline void tma_store_3d(const TensorMap& map, int c0, int c1, int c2, const void* smem,
                         FT_HOPPER_WHERE) {
  const int coords[3] = {c0, c1, c2};
  ::ft::emu::tma_store(map, 3, coords, smem, where);
}
inline void bulk_commit_group(FT_HOPPER_WHERE) { ::ft::emu::bulk_commit_group(where); }
template <int N>
inline void bulk_wait_group_read(FT_HOPPER_WHERE) {
  static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0 .. 7 here");
  ::ft::emu::bulk_wait_group(N, true, where);
}
template <int N>
inline void bulk_wait_group(FT_HOPPER_WHERE) {
  static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0 .. 7 here");
  ::ft::emu::bulk_wait_group(N, false, where);
}
inline void named_barrier_sync(unsigned id, unsigned count, FT_HOPPER_WHERE) {
  ::ft::emu::named_barrier(id, count, true, where);
}
inline void named_barrier_arrive(unsigned id, unsigned count, FT_HOPPER_WHERE) {
  ::ft::emu::named_barrier(id, count, false, where);
}
template <int N>
inline void setmaxnreg_inc(FT_HOPPER_WHERE) {
  ::ft::emu::setmaxnreg(true, N, where);
}
template <int N>
inline void setmaxnreg_dec(FT_HOPPER_WHERE) {
  ::ft::emu::setmaxnreg(false, N, where);
}

inline uint64_t wgmma_descriptor(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                 WgmmaSwizzle swizzle, FT_HOPPER_WHERE) {
  const uint32_t a = ::ft::emu::shared_offset(smem, "wgmma_descriptor", where);
  if (a % 16 != 0 || lbo_bytes % 16 != 0 || sbo_bytes % 16 != 0 || lbo_bytes >= (1u << 18) ||
      sbo_bytes >= (1u << 18))
    ::ft::emu::wgmma_descriptor_error(a, lbo_bytes, sbo_bytes, where);
  return uint64_t((a & 0x3ffffu) >> 4) | uint64_t(lbo_bytes >> 4) << 16 |
         uint64_t(sbo_bytes >> 4) << 32 | uint64_t(swizzle) << 62;
}
inline void fence_proxy_async_shared(FT_HOPPER_WHERE) { ::ft::emu::fence_proxy_async(where); }
template <int N>
inline void wgmma_fence_operand(float (&)[N]) {}  // a compiler barrier only
template <int K>
inline void wgmma_fence_operand(uint32_t (&)[K][4]) {}
inline void wgmma_fence(FT_HOPPER_WHERE) { ::ft::emu::wgmma_fence(where); }
inline void wgmma_commit_group(FT_HOPPER_WHERE) { ::ft::emu::wgmma_commit_group(where); }
template <int N>
inline void wgmma_wait_group(FT_HOPPER_WHERE) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 .. 7");
  ::ft::emu::wgmma_wait_group(N, where);
}
template <class E, int N, bool TransA = false, bool TransB = false>
inline void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                         FT_HOPPER_WHERE) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N a multiple of 8 to 256");
  ::ft::emu::wgmma_mma(
      MmaElement<E>::kBf16 ? ::ft::emu::WgmmaType::kBf16 : ::ft::emu::WgmmaType::kF16, N, d, desc_a,
      nullptr, desc_b, TransA, TransB, accumulate, where);
}
template <class E, int N, bool TransB = false>
inline void wgmma_m64k16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                            bool accumulate, FT_HOPPER_WHERE) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N a multiple of 8 to 256");
  ::ft::emu::wgmma_mma(
      MmaElement<E>::kBf16 ? ::ft::emu::WgmmaType::kBf16 : ::ft::emu::WgmmaType::kF16, N, d, 0, a,
      desc_b, false, TransB, accumulate, where);
}

#else  // nvcc

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// The shared address of p (the shared window's address: swizzle patterns follow its bits).
__device__ __forceinline__ uint32_t smem_offset(const void* p) { return smem_u32(p); }

// mbarrier.init / inval (§9.7.13.15.9, .10): count in 1 .. 2^20 - 1.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbarrier_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// mbarrier.arrive{.expect_tx} (§9.7.13.15.13), release at CTA scope (the default): the returned
// state is opaque.
__device__ __forceinline__ uint64_t mbarrier_arrive(uint64_t* bar, unsigned count = 1) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_u32(bar)), "r"(count)
               : "memory");
  return state;
}
__device__ __forceinline__ uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, unsigned tx_bytes) {
  uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_u32(bar)), "r"(tx_bytes)
               : "memory");
  return state;
}
// mbarrier.expect_tx / complete_tx (§9.7.13.15.11, .12): the tx-count alone.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, unsigned tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(tx_bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_complete_tx(uint64_t* bar, unsigned tx_bytes) {
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(tx_bytes)
               : "memory");
}
// mbarrier.try_wait.parity (§9.7.13.15.16), acquire at CTA scope: true once the phase of that
// parity is complete; false when the hardware's time limit ran out first.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

using TensorMap = CUtensorMap;
// cuTensorMapEncodeTiled through the runtime's driver entry point (libcuda is not linked);
// throws ft::Error with the driver's error.
inline TensorMap encode_tensor_map(TmaType type, int rank, const void* base, const uint64_t* dims,
                                   const uint64_t* strides, const uint32_t* box,
                                   TmaSwizzle swizzle) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) throw ::ft::Error("cuTensorMapEncodeTiled: not found in the CUDA driver");
  const CUtensorMapDataType types[] = {CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                       CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                       CU_TENSOR_MAP_DATA_TYPE_FLOAT32};
  const CUtensorMapSwizzle swizzles[] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
                                         CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_128B};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  TensorMap map;
  const CUresult r =
      encode(&map, types[int(type)], cuuint32_t(rank), const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzles[int(swizzle)],
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw ::ft::Error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) +
                      "): check the rank, alignment, strides and box against its rules");
  return map;
}
// cp.async.bulk.tensor.{2,3}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// (§9.7.9.25.5.2): map is the kernel's __grid_constant__ parameter (a generic address).
__device__ __forceinline__ void tma_load_2d(void* smem, const TensorMap& map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* smem, const TensorMap& map, int c0, int c1,
                                            int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

// cp.async.bulk.tensor.{2,3}d.global.shared::cta.tile.bulk_group (§9.7.9.25.5.2), a TMA store,
// and its bulk groups (§9.7.9.25.6): commit_group, wait_group.read N (the sources of all but the
// N newest groups read), wait_group N (their global writes done too).
__device__ __forceinline__ void tma_store_2d(const TensorMap& map, int c0, int c1,
                                             const void* smem) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(&map)),
      "r"(c0), "r"(c1), "r"(smem_u32(smem))
      : "memory");
}
__device__ __forceinline__ void tma_store_3d(const TensorMap& map, int c0, int c1, int c2,
                                             const void* smem) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::
          "l"(reinterpret_cast<uint64_t>(&map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(smem))
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0 .. 7 here");
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0 .. 7 here");
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// bar.sync / bar.arrive id, count (§9.7.13.1): named barrier `id` (1 .. 15; 0 is __syncthreads's)
// over `count` threads, a multiple of 32; arrive does not wait.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// setmaxnreg.{inc,dec}.sync.aligned.u32 N: the warpgroup's register limit per thread (24 .. 256,
// a multiple of 8), to or from the block's pool; the kernel needs __launch_bounds__(threads, 1).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: 24 .. 256, a multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: 24 .. 256, a multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Matrix descriptor (§9.7.15.5.1.2.2): (address & 0x3ffff) >> 4, LBO >> 4, SBO >> 4, swizzle.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* smem, uint32_t lbo_bytes,
                                                     uint32_t sbo_bytes, WgmmaSwizzle swizzle) {
  return uint64_t((smem_u32(smem) & 0x3ffffu) >> 4) | uint64_t((lbo_bytes & 0x3ffffu) >> 4) << 16 |
         uint64_t((sbo_bytes & 0x3ffffu) >> 4) << 32 | uint64_t(swizzle) << 62;
}
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int K>  // the A fragments of K k-steps of wgmma_m64k16_rs
__device__ __forceinline__ void wgmma_fence_operand(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[k][j])::"memory");
}
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 .. 7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The operand lists of the accumulators: "+f"(d[0]) .. and "%0, %1, ..".
#define FT_WG_D8(b)                                                                               \
  "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
      "+f"(d[b + 6]), "+f"(d[b + 7])
#define FT_WG_D32(b) FT_WG_D8(b), FT_WG_D8(b + 8), FT_WG_D8(b + 16), FT_WG_D8(b + 24)
#define FT_WG_R10(t)                                                                               \
  "%" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t "8, %" #t \
  "9"
#define FT_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9"
#define FT_WG_REGS64 "{" FT_WG_R0 ", " FT_WG_R10(1) ", " FT_WG_R10(2) ", %30, %31}"
#define FT_WG_REGS128                                                                \
  "{" FT_WG_R0 ", " FT_WG_R10(1) ", " FT_WG_R10(2) ", " FT_WG_R10(3) ", " FT_WG_R10( \
      4) ", " FT_WG_R10(5) ", %60, %61, %62, %63}"
#define FT_WG_REGS256 \
  "{" FT_WG_R0 ", " FT_WG_R10(1) ", " FT_WG_R10(2) ", " FT_WG_R10(3) ", " FT_WG_R10(4) ", "     \
  FT_WG_R10(5) ", " FT_WG_R10(6) ", " FT_WG_R10(7) ", " FT_WG_R10(8) ", " FT_WG_R10(9) ", "     \
  FT_WG_R10(10) ", " FT_WG_R10(11) ", %120, %121, %122, %123, %124, %125, %126, %127}"
// One wgmma.mma_async with A and B from descriptors (SS) or A from registers (RS); scale-d is a
// predicate made from `accumulate`, the scales of A and B 1.
#define FT_WGMMA_SS(shape, type, regs, da, db, sd, ta, tb, ...)                            \
  asm volatile(                                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %" sd ", 0;\nwgmma.mma_async.sync.aligned." shape  \
      ".f32." type "." type " " regs ", %" da ", %" db ", p, 1, 1, %" ta ", %" tb ";\n}\n" \
      : __VA_ARGS__                                                                        \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(TransA)), "n"(int(TransB)))
#define FT_WGMMA_RS(shape, type, regs, a0, db, sd, tb, ...)                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" sd ", 0;\nwgmma.mma_async.sync.aligned." shape \
               ".f32." type "." type " " regs ", {%" a0 "}, %" db ", p, 1, 1, %" tb ";\n}\n"       \
               : __VA_ARGS__                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)),    \
                 "n"(int(TransB)))

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16} (§9.7.15.5.2), N 64, 128, 256.
template <class E, int N, bool TransA = false, bool TransB = false>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                             bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma m64nNk16 wrapped for N 64, 128, 256");
  constexpr bool kBf16 = MmaElement<E>::kBf16;
  if constexpr (N == 64 && kBf16)
    FT_WGMMA_SS("m64n64k16", "bf16", FT_WG_REGS64, "32", "33", "34", "35", "36", FT_WG_D32(0));
  else if constexpr (N == 64)
    FT_WGMMA_SS("m64n64k16", "f16", FT_WG_REGS64, "32", "33", "34", "35", "36", FT_WG_D32(0));
  else if constexpr (N == 128 && kBf16)
    FT_WGMMA_SS("m64n128k16", "bf16", FT_WG_REGS128, "64", "65", "66", "67", "68", FT_WG_D32(0),
                FT_WG_D32(32));
  else if constexpr (N == 128)
    FT_WGMMA_SS("m64n128k16", "f16", FT_WG_REGS128, "64", "65", "66", "67", "68", FT_WG_D32(0),
                FT_WG_D32(32));
  else if constexpr (kBf16)
    FT_WGMMA_SS("m64n256k16", "bf16", FT_WG_REGS256, "128", "129", "130", "131", "132",
                FT_WG_D32(0), FT_WG_D32(32), FT_WG_D32(64), FT_WG_D32(96));
  else
    FT_WGMMA_SS("m64n256k16", "f16", FT_WG_REGS256, "128", "129", "130", "131", "132", FT_WG_D32(0),
                FT_WG_D32(32), FT_WG_D32(64), FT_WG_D32(96));
}
template <class E, int N, bool TransB = false>
__device__ __forceinline__ void wgmma_m64k16_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                                uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma m64nNk16 wrapped for N 64, 128, 256");
  constexpr bool kBf16 = MmaElement<E>::kBf16;
  if constexpr (N == 64 && kBf16)
    FT_WGMMA_RS("m64n64k16", "bf16", FT_WG_REGS64, "32, %33, %34, %35", "36", "37", "38",
                FT_WG_D32(0));
  else if constexpr (N == 64)
    FT_WGMMA_RS("m64n64k16", "f16", FT_WG_REGS64, "32, %33, %34, %35", "36", "37", "38",
                FT_WG_D32(0));
  else if constexpr (N == 128 && kBf16)
    FT_WGMMA_RS("m64n128k16", "bf16", FT_WG_REGS128, "64, %65, %66, %67", "68", "69", "70",
                FT_WG_D32(0), FT_WG_D32(32));
  else if constexpr (N == 128)
    FT_WGMMA_RS("m64n128k16", "f16", FT_WG_REGS128, "64, %65, %66, %67", "68", "69", "70",
                FT_WG_D32(0), FT_WG_D32(32));
  else if constexpr (kBf16)
    FT_WGMMA_RS("m64n256k16", "bf16", FT_WG_REGS256, "128, %129, %130, %131", "132", "133", "134",
                FT_WG_D32(0), FT_WG_D32(32), FT_WG_D32(64), FT_WG_D32(96));
  else
    FT_WGMMA_RS("m64n256k16", "f16", FT_WG_REGS256, "128, %129, %130, %131", "132", "133", "134",
                FT_WG_D32(0), FT_WG_D32(32), FT_WG_D32(64), FT_WG_D32(96));
}
#undef FT_WGMMA_SS
#undef FT_WGMMA_RS
#undef FT_WG_REGS64
#undef FT_WG_REGS128
#undef FT_WG_REGS256
#undef FT_WG_R0
#undef FT_WG_R10
#undef FT_WG_D32
#undef FT_WG_D8

#endif

}  // namespace ft::kernels::cuda
