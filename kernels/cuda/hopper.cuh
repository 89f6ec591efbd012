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

#endif

}  // namespace ft::kernels::cuda
