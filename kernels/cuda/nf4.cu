// NF4 quantization and dequantization on the GPU: the contract of kernels/kernels.h quantize_nf4 /
// dequantize_nf4 (the format: kernels/nf4.h), tested bit for bit against kernels/cpu/nf4.cpp
// (tests/ops/). Each value is the CPU's fp32 operation, written as the round-to-nearest
// intrinsics (__fmul_rn, __fdiv_rn, __fadd_rn) that nvcc never contracts into an fma, or a
// comparison; the absmax is a max, the same whatever the order it is taken in. So the same bits.
//
// Quantize: one warp per block of 64, lane l holding elements 2l and 2l + 1 (so its code byte),
// the block's absmax by an xor butterfly over the lanes. Dequantize: a grid-stride loop over
// packs of 16 bytes of output (8 elements of a 16-bit type, 4 floats; never across a block of 64)
// when the output is 16-byte aligned and the codes aligned to the pack's bytes of codes, single
// elements otherwise; the table in shared memory (16 floats in 16 banks: no conflicts).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/nf4.h"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;  // a multiple of 32: quantize's warps are whole

// The table as a kernel argument (a host constexpr array is not addressable in device code).
struct Nf4Levels {
  float v[16];
};

// The index of v: how many midpoints lie below it (a NaN v: none).
__device__ __forceinline__ unsigned nf4_index(float v, const Nf4Mids mids) {
  unsigned c = 0;
#pragma unroll
  for (int k = 0; k < 15; ++k) c += v > mids.v[k] ? 1u : 0u;
  return c;
}

// Warp w of the grid takes blocks w, w + warps, ... (the loop is the same for the whole warp, as
// the shuffles need). Lanes past n read 0, which leaves the max as it is.
template <typename D>
__global__ void quantize_nf4_kernel(uint8_t* codes, float* absmax, const D* x, size_t n, size_t nb,
                                    Nf4Mids mids) {
  const unsigned lane = threadIdx.x % 32;
  const size_t warps = grid_thread_count() / 32;
  for (size_t b = grid_thread_index() / 32; b < nb; b += warps) {
    const size_t e = b * kNf4Block + 2 * lane;  // this lane's pair, elements e and e + 1
    const float x0 = e < n ? to_float(x[e]) : 0.0f;
    const float x1 = e + 1 < n ? to_float(x[e + 1]) : 0.0f;
    float a = 0.0f;  // a NaN is never greater: left out, as on the CPU
    a = fabsf(x0) > a ? fabsf(x0) : a;
    a = fabsf(x1) > a ? fabsf(x1) : a;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, a, o);
      a = other > a ? other : a;
    }
    if (e < n) {
      const unsigned hi = nf4_index(a == 0.0f ? 0.0f : __fdiv_rn(x0, a), mids);
      const unsigned lo = e + 1 < n ? nf4_index(a == 0.0f ? 0.0f : __fdiv_rn(x1, a), mids) : 0u;
      codes[e / 2] = uint8_t(hi << 4 | lo);
    }
    if (lane == 0) absmax[b] = a;
  }
}

// Block b's absmax from its double quantization: float(q) · scale / 127 + mean, each rounded.
__device__ __forceinline__ float block_absmax(const int8_t* qabsmax, const float* scale, float mean,
                                              size_t b) {
  return __fadd_rn(__fdiv_rn(__fmul_rn(float(qabsmax[b]), scale[b / kNf4Group]), 127.0f), mean);
}

// W > 1: packs of W elements (W / 2 code bytes, one aligned load), then the n mod W tail one
// element a thread; W = 1: every element one at a time.
template <typename D, int W>
__global__ void dequantize_nf4_kernel(D* out, const uint8_t* codes, const int8_t* qabsmax,
                                      const float* scale, float mean, size_t n, Nf4Levels levels) {
  __shared__ float level[16];
  if (threadIdx.x == 0) {  // constant indices: the argument is read in place, not copied to local
#pragma unroll
    for (int k = 0; k < 16; ++k) level[k] = levels.v[k];
  }
  __syncthreads();
  size_t done = 0;
  if constexpr (W > 1) {
    const size_t packs = n / W;
    for (size_t p = grid_thread_index(); p < packs; p += grid_thread_count()) {
      const size_t e = p * W;  // W divides 64: the pack is in one block
      const float a = block_absmax(qabsmax, scale, mean, e / kNf4Block);
      const Pack<uint8_t, W / 2> c = load_pack<W / 2>(codes + e / 2);
      Pack<D, W> y;
#pragma unroll
      for (int j = 0; j < W / 2; ++j) {
        y.v[2 * j] = from_float<D>(__fmul_rn(level[c.v[j] >> 4], a));
        y.v[2 * j + 1] = from_float<D>(__fmul_rn(level[c.v[j] & 15u], a));
      }
      store_pack<W>(out + e, y);
    }
    done = packs * W;
  }
  for (size_t e = done + grid_thread_index(); e < n; e += grid_thread_count()) {
    const unsigned byte = codes[e / 2];
    const float a = block_absmax(qabsmax, scale, mean, e / kNf4Block);
    out[e] = from_float<D>(__fmul_rn(level[e % 2 ? byte & 15u : byte >> 4], a));
  }
}

}  // namespace

template <typename T>
void quantize_nf4(uint8_t* codes, float* absmax, const T* x, size_t n, void* stream) {
  if (n == 0) return;
  const size_t nb = nf4_blocks(n);
  FT_LAUNCH((quantize_nf4_kernel<device_t<T>>), grid_blocks(nb * 32, kThreads, 1), kThreads, 0,
            stream)
  (codes, absmax, dev(x), n, nb, kNf4Mids);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void dequantize_nf4(T* out, const uint8_t* codes, const int8_t* qabsmax, const float* scale,
                    float mean, size_t n, void* stream) {
  if (n == 0) return;
  using D = device_t<T>;
  constexpr int W = kPack16<T>;
  Nf4Levels levels;
  for (int k = 0; k < 16; ++k) levels.v[k] = kNf4Codes[k];
  if (aligned_to(out, 16) && aligned_to(codes, W / 2)) {
    FT_LAUNCH((dequantize_nf4_kernel<D, W>), grid_blocks(n / W + 1, kThreads, 1), kThreads, 0,
              stream)
    (dev(out), codes, qabsmax, scale, mean, n, levels);
  } else {
    FT_LAUNCH((dequantize_nf4_kernel<D, 1>), grid_blocks(n, kThreads, 1), kThreads, 0, stream)
    (dev(out), codes, qabsmax, scale, mean, n, levels);
  }
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                      \
  template void quantize_nf4(uint8_t*, float*, const T*, size_t, void*);                       \
  template void dequantize_nf4(T*, const uint8_t*, const int8_t*, const float*, float, size_t, \
                               void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
