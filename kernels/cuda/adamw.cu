// AdamW on the GPU: the contract of kernels/kernels.h's adamw_update (torch.optim.AdamW), tested
// against kernels/cpu/adamw.cpp.
//
// One fused pass over the flat range: read p, g, m, v (fp32), write p, m, v and, when p_compute
// is given, the updated p rounded to the compute dtype, so an optimizer step moves each byte
// once. grad_scale (clipping, fp16 unscaling) is folded into the read of g. The step constants
// (bias corrections, step size) are computed once on the host in double, as the CPU and torch
// do, and read from device memory with grad_scale when the kernel runs (so a recorded graph
// takes each step's); the element math is the CPU's expression, operation for operation (nvcc may
// contract a multiply-add into an FMA, hence "to rounding" in kernels_cuda.h).
//
// Memory-bound: 16-byte packs of 4 floats when every pointer allows it (p_compute: 4 elements,
// 8 or 16 bytes), a grid-stride loop, the n mod 4 tail one element per thread.
#include <cmath>

#include "kernels/adamw_step.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// One element: the CPU's adamw_range body. Returns the new p.
__device__ __forceinline__ float adamw_element(float& p, float g, float& m, float& v,
                                               const AdamwStep& k, float grad_scale) {
  const float gi = g * grad_scale;  // rounded as scale_inplace would store it
  const float pi = p * k.decay;
  const float mi = m * k.beta1 + (1.0f - k.beta1) * gi;
  const float vi = v * k.beta2 + (1.0f - k.beta2) * gi * gi;
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
  p = pi - k.step_size * (mi / denom);
  return p;
}

// W = 4: float4 packs of p, g, m, v; W = 1: scalars. D: the compute copy's element type.
template <typename D, int W>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n,
                             const AdamwArgs* args, D* p_compute) {
  const AdamwStep k = args->step;
  const float grad_scale = args->grad_scale;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t packs = n / W;
  for (size_t i = tid; i < packs; i += stride) {
    const size_t o = i * W;
    Pack<float, W> pp = load_pack<W>(p + o), mp = load_pack<W>(m + o), vp = load_pack<W>(v + o);
    const Pack<float, W> gp = load_pack<W>(g + o);
    Pack<D, W> cp;
    for (int j = 0; j < W; ++j)
      cp.v[j] = from_float<D>(adamw_element(pp.v[j], gp.v[j], mp.v[j], vp.v[j], k, grad_scale));
    store_pack<W>(p + o, pp);
    store_pack<W>(m + o, mp);
    store_pack<W>(v + o, vp);
    if (p_compute) store_pack<W>(p_compute + o, cp);
  }
  const size_t e = packs * W + tid;  // the tail: fewer than W elements
  if (e < n) {
    const float pe = adamw_element(p[e], g[e], m[e], v[e], k, grad_scale);
    if (p_compute) p_compute[e] = from_float<D>(pe);
  }
}

}  // namespace

template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamwArgs* args,
                  T* p_compute, void* stream) {
  if (n == 0) return;
  using D = device_t<T>;
  constexpr int W = 4;
  if (all_aligned({p, g, m, v}, 16) && all_aligned({p_compute}, W * sizeof(T)))
    FT_LAUNCH((adamw_kernel<D, W>), grid_blocks(n / W + 1, kThreads, 1), kThreads, 0, stream)
  (p, g, m, v, n, args, dev(p_compute));
  else FT_LAUNCH((adamw_kernel<D, 1>), grid_blocks(n, kThreads, 1), kThreads, 0, stream)(
      p, g, m, v, n, args, dev(p_compute));
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                        \
  template void adamw_update(float*, const float*, float*, float*, size_t, const AdamwArgs*, T*, \
                             void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
