// What every kernels/cuda/*.cu includes: the CUDA headers (nvcc) or the CUDA emulation (g++ with
// FT_CUDA_EMU, tests/cuda_emu/: each CUDA thread a fiber on the CPU, a test tool), the launch
// macros that keep one source for both, and the device helpers every kernel needs.
//
// Device code in kernels/cuda/ sticks to what the emulator provides (see cuda_emu.h); one
// 1-D block layout is assumed by the block reductions below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/half.h"

#if defined(FT_CUDA_EMU)
// The emulation's declarations (threadIdx, __syncthreads, shuffles, launches) come first in
// every translation unit of the emulated build, which force-includes its header
// (tests/cuda_emu/CMakeLists.txt): production code names no test file.
#ifndef FT_CUDA_EMU_HEADER_INCLUDED
#error "the emulated build force-includes the CUDA emulation's header (tests/cuda_emu/cuda_emu.h)"
#endif
#elif defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#else
#error "kernels/cuda/*.cu compile under nvcc (FT_CUDA) or g++ with -DFT_CUDA_EMU (the emulator)"
#endif

// FT_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...): launches `kernel` on `stream`
// (a cudaStream_t passed as void*). A template kernel goes in parentheses so the preprocessor
// keeps its commas: FT_LAUNCH((convert_kernel<Dst, Src>), grid, 256, 0, stream)(dst, src, n).
// Under the emulator the call runs the whole grid before it returns and throws ft::emu::Error
// on a reported misuse (barrier divergence, bad shuffle mask, deadlock, a host pointer
// argument); a bad configuration sets the last error, as on a GPU.
#if defined(FT_CUDA_EMU)
#define FT_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::ft::emu::Launch(#kernel, kernel, dim3(grid), dim3(block), size_t(shared_bytes), stream)
#else
#define FT_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<dim3(grid), dim3(block), size_t(shared_bytes), static_cast<cudaStream_t>(stream)>>>
#endif

// FT_DYNAMIC_SHARED(type, name): in a kernel, `type* name` = the launch's dynamic shared memory
// (shared_bytes of FT_LAUNCH), 16-byte aligned.
#if defined(FT_CUDA_EMU)
#define FT_DYNAMIC_SHARED(type, name) \
  type* name = reinterpret_cast<type*>(::ft::emu::dynamic_shared())
#else
#define FT_DYNAMIC_SHARED(type, name)                                 \
  extern __shared__ __align__(16) unsigned char ft_dynamic_shared_[]; \
  type* name = reinterpret_cast<type*>(ft_dynamic_shared_)
#endif

namespace ft::kernels::cuda {

// Throws ft::Error if the last launch on this host thread failed (bad configuration, too much
// shared memory, no device); `where` names the launcher. Launches are asynchronous, so a fault
// inside the kernel surfaces later, at the next synchronising call.
inline void check_launch(const char* where, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw ::ft::Error(std::string("CUDA kernel launch failed in ") + where + " [" + file + ":" +
                      std::to_string(line) + "]: " + cudaGetErrorString(err) +
                      " (hint: check grid/block sizes and shared memory; run under "
                      "compute-sanitizer for faults inside the kernel)");
}

}  // namespace ft::kernels::cuda

// FT_CUDA_CHECK_LAUNCH(): after FT_LAUNCH(...)(...), in the launcher.
#define FT_CUDA_CHECK_LAUNCH() ::ft::kernels::cuda::check_launch(__func__, __FILE__, __LINE__)

namespace ft::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

// DeviceType<T>::type: the CUDA type with the bits of a core/half.h storage type, so the
// launchers (declared on bf16/f16) reinterpret their pointers for the kernels.
template <typename T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<::ft::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<::ft::f16> {
  using type = __half;
};
template <typename T>
using device_t = typename DeviceType<T>::type;

// dev(p): p as a pointer to its DeviceType (same bits, same size).
template <typename T>
inline device_t<T>* dev(T* p) {
  static_assert(sizeof(device_t<T>) == sizeof(T));
  return reinterpret_cast<device_t<T>*>(p);
}
template <typename T>
inline const device_t<T>* dev(const T* p) {
  static_assert(sizeof(device_t<T>) == sizeof(T));
  return reinterpret_cast<const device_t<T>*>(p);
}

// to_float / from_float<T>: the load and the rounding store of every kernel, bit for bit
// core/half.h's to_f32 / to_bf16 / to_f16 (round to nearest even, subnormals kept). The
// hardware conversions agree with half.h except on NaN (they return a canonical NaN, half.h keeps
// the payload), so NaN takes half.h's rule explicitly. Not with nvcc's --use_fast_math: its
// flush-to-zero would drop the fp32 subnormals that bf16 keeps.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __uint_as_float(unsigned(__bfloat16_as_ushort(x)) << 16);  // exact, NaN payload kept
}
__device__ __forceinline__ float to_float(__half x) {
  const unsigned h = __half_as_ushort(x);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0)  // NaN: keep the payload as half.h does
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: quieted, payload's top bits kept
    return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  const unsigned u = __float_as_uint(x);
  const unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u)  // NaN: quiet, top 10 payload bits kept
    return __ushort_as_half(
        static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu)));
  return __float2half_rn(x);
}

// warp_sum / warp_max: xor butterfly over the 32 lanes of a full warp; every lane ends with the
// same bits (each step adds the same two values, in either order, and + is commutative), so the
// result does not depend on the schedule.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// block_sum / block_max: over a 1-D block whose blockDim.x is a multiple of 32 (at most 1024);
// every thread must call it (it has barriers) and every thread gets the same bits. Order fixed:
// butterfly inside each warp, then the warp partials in warp order by the same butterfly. The
// leading barrier makes back-to-back calls safe (the partials array is reused).
template <typename F, typename Op>
__device__ __forceinline__ F block_reduce_(F v, F identity, Op warp_op) {
  __shared__ F partials[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_op(v);
  __syncthreads();
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  return warp_op(lane < warps ? partials[lane] : identity);
}
struct WarpSum_ {
  template <typename F>
  __device__ __forceinline__ F operator()(F v) const {
    return warp_sum(v);
  }
};
struct WarpMax_ {
  __device__ __forceinline__ float operator()(float v) const { return warp_max(v); }
};
__device__ __forceinline__ float block_sum(float v) { return block_reduce_(v, 0.0f, WarpSum_{}); }
__device__ __forceinline__ double block_sum(double v) { return block_reduce_(v, 0.0, WarpSum_{}); }
// -inf is max's identity; a NaN anywhere makes the result NaN (fmaxf drops NaN, so callers that
// must propagate NaN check for it themselves).
__device__ __forceinline__ float block_max(float v) {
  return block_reduce_(v, -__int_as_float(0x7f800000), WarpMax_{});
}

// The elementwise kernels' grid-stride loop:
//   for (size_t i = grid_thread_index(); i < n; i += grid_thread_count())
__device__ __forceinline__ size_t grid_thread_index() {
  return size_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_thread_count() { return size_t(gridDim.x) * blockDim.x; }

// Blocks for a grid-stride loop over n items: about items_per_thread items per thread, at most
// max_blocks (1024 blocks of 256 threads are about what an H100's 132 SMs hold at once, 2048
// threads each). At least 1: callers skip the launch for n == 0 (an empty grid is an error).
inline unsigned grid_blocks(size_t n, unsigned threads, unsigned items_per_thread,
                            unsigned max_blocks = 1024) {
  const size_t per_block = size_t(threads) * items_per_thread;
  const size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

}  // namespace ft::kernels::cuda
