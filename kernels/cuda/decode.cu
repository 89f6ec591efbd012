// Generation with a KV cache on the GPU (kernels/kernels.h "decode.cpp", tested against
// kernels/cpu/decode.cpp): attention of a few new queries over the cached keys and values. A
// plain SIMT kernel: one sequence, a handful of queries per call. (RoPE at the cache's positions
// is rope_forward's with positions, rope.cu.)
//
// attention_decode_kernel: one warp per (query t, head h). Lane l owns output dims l + 32c;
// for each key j ≤ pos + t in order, the lanes' partial products are summed by an xor
// butterfly (every lane ends with the same bits), then the running max m and sum l update
// online (FlashAttention's recurrence, attention.cu): m' = max(m, s), a = exp(m − m'),
// p = exp(s − m'), l = l·a + p, O = O·a + p·V_j; finally O / l. All math fp32.
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::kernels::cuda {
namespace {

constexpr int kMaxD = 256;
constexpr int kDimsPerLane = kMaxD / kWarpSize;

template <typename E>
__global__ void attention_decode_kernel(E* out, const E* q, const E* k, const E* v, int pos, int H,
                                        int K, int D_, float scale) {
  const int t = int(blockIdx.x) / H, h = int(blockIdx.x) % H;
  const int g = h / (H / K), lane = int(threadIdx.x);
  const E* qh = q + (size_t(t) * H + h) * D_;
  float qv[kDimsPerLane], acc[kDimsPerLane];
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) {
    const int d = lane + kWarpSize * c;
    qv[c] = d < D_ ? to_float(qh[d]) : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= pos + t; ++j) {
    const E* kj = k + (size_t(j) * K + g) * D_;
    float part = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < D_) part += qv[c] * to_float(kj[d]);
    }
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) part += __shfl_xor_sync(kFullMask, part, off);
    const float s = part * scale, m_new = fmaxf(m, s);
    const float a = expf(m - m_new), p = expf(s - m_new);  // exp(−inf) = 0 on the first key
    l = l * a + p;
    m = m_new;
    const E* vj = v + (size_t(j) * K + g) * D_;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + kWarpSize * c;
      acc[c] = acc[c] * a + (d < D_ ? p * to_float(vj[d]) : 0.0f);
    }
  }
  E* oh = out + (size_t(t) * H + h) * D_;
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) {
    const int d = lane + kWarpSize * c;
    if (d < D_) oh[d] = from_float<E>(acc[c] / l);
  }
}

}  // namespace

template <typename T>
void attention_decode(T* out, const T* q, const T* k, const T* v, int pos, int Tq, int H, int K,
                      int D, void* stream) {
  if (Tq <= 0 || H <= 0) return;
  if (D > kMaxD || K <= 0 || H % K != 0)
    throw ::ft::Error("attention_decode: head dim " + std::to_string(D) + " (at most " +
                      std::to_string(kMaxD) + ") or heads " + std::to_string(H) + "/" +
                      std::to_string(K) + " (query heads a multiple of kv heads) unsupported");
  FT_LAUNCH((attention_decode_kernel<device_t<T>>), unsigned(Tq * H), kWarpSize, 0, stream)
  (dev(out), dev(q), dev(k), dev(v), pos, H, K, D, 1.0f / sqrtf(float(D)));
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T) \
  template void attention_decode(T*, const T*, const T*, const T*, int, int, int, int, int, void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
