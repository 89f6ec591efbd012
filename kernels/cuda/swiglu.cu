// SwiGLU h = silu(g) · u and its gradient on the GPU: the contract of kernels/kernels.h, tested
// against kernels/cpu/swiglu.cpp. fp32 math, one rounding on store.
//
// Elementwise and memory-bound: a grid-stride loop over 16-byte packs when every pointer is
// 16-byte aligned (the bulk of n), then the n mod W tail elements one per thread; W = 1 (plain
// scalar accesses) otherwise. expf, not __expf: the fast intrinsic's error near g ≈ 0 would show
// against the CPU reference, and the kernel is bound by memory, not by the exponential.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }

// du = dh · silu(g);  dg = dh · u · s (1 + g (1 − s)), s = sigmoid(g)
__device__ __forceinline__ void swiglu_grad(float dh, float g, float u, float& dg, float& du) {
  const float s = sigmoid(g);
  du = dh * (g * s);
  dg = dh * u * s * (1.0f + g * (1.0f - s));
}

template <typename D, int W>
__global__ void swiglu_forward_kernel(D* h, const D* g, const D* u, size_t n) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t packs = n / W;
  for (size_t i = tid; i < packs; i += stride) {
    const Pack<D, W> gp = load_pack<W>(g + i * W), up = load_pack<W>(u + i * W);
    Pack<D, W> hp;
    for (int j = 0; j < W; ++j)
      hp.v[j] = from_float<D>(swiglu_value(to_float(gp.v[j]), to_float(up.v[j])));
    store_pack<W>(h + i * W, hp);
  }
  const size_t e = packs * W + tid;  // the tail: fewer than W elements
  if (e < n) h[e] = from_float<D>(swiglu_value(to_float(g[e]), to_float(u[e])));
}

template <typename D, int W>
__global__ void swiglu_backward_kernel(D* dg, D* du, const D* dh, const D* g, const D* u,
                                       size_t n) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t packs = n / W;
  for (size_t i = tid; i < packs; i += stride) {
    const Pack<D, W> dhp = load_pack<W>(dh + i * W), gp = load_pack<W>(g + i * W),
                     up = load_pack<W>(u + i * W);
    Pack<D, W> dgp, dup;
    for (int j = 0; j < W; ++j) {
      float a, b;
      swiglu_grad(to_float(dhp.v[j]), to_float(gp.v[j]), to_float(up.v[j]), a, b);
      dgp.v[j] = from_float<D>(a);
      dup.v[j] = from_float<D>(b);
    }
    store_pack<W>(dg + i * W, dgp);
    store_pack<W>(du + i * W, dup);
  }
  const size_t e = packs * W + tid;
  if (e < n) {
    float a, b;
    swiglu_grad(to_float(dh[e]), to_float(g[e]), to_float(u[e]), a, b);
    dg[e] = from_float<D>(a);
    du[e] = from_float<D>(b);
  }
}

}  // namespace

template <typename T>
void swiglu_forward(T* h, const T* g, const T* u, size_t n, void* stream) {
  if (n == 0) return;
  constexpr int W = kPack16<T>;
  using D = device_t<T>;
  if (all_aligned({h, g, u}, 16))
    FT_LAUNCH((swiglu_forward_kernel<D, W>), grid_blocks(n / W + 1, kThreads, 1), kThreads, 0,
              stream)
  (dev(h), dev(g), dev(u), n);
  else FT_LAUNCH((swiglu_forward_kernel<D, 1>), grid_blocks(n, kThreads, 1), kThreads, 0, stream)(
      dev(h), dev(g), dev(u), n);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dg, T* du, const T* dh, const T* g, const T* u, size_t n, void* stream) {
  if (n == 0) return;
  constexpr int W = kPack16<T>;
  using D = device_t<T>;
  if (all_aligned({dg, du, dh, g, u}, 16))
    FT_LAUNCH((swiglu_backward_kernel<D, W>), grid_blocks(n / W + 1, kThreads, 1), kThreads, 0,
              stream)
  (dev(dg), dev(du), dev(dh), dev(g), dev(u), n);
  else FT_LAUNCH((swiglu_backward_kernel<D, 1>), grid_blocks(n, kThreads, 1), kThreads, 0, stream)(
      dev(dg), dev(du), dev(dh), dev(g), dev(u), n);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                              \
  template void swiglu_forward(T*, const T*, const T*, size_t, void*); \
  template void swiglu_backward(T*, T*, const T*, const T*, const T*, size_t, void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
