// Rotary position embedding (rotate-half pairing) on the GPU: the contract of kernels/kernels.h,
// tested against kernels/cpu/rope.cpp. x (B, T, nh, D) is rotated in place.
//
// One thread per (token, pair index i < D/2): it computes the angle float(p) · inv_freq[i] (p the
// token's position: pos[token], or t without pos) and
// its cos and sin once and applies them to pair (i, i + D/2) of every head of the token.
// Consecutive threads take consecutive i, so each head's halves are read and written coalesced;
// the trigonometry is shared by the nh heads instead of redone per element.
//
// cos and sin of the fp32 angle (up to T radians) are evaluated in double and rounded once, so
// they agree with the CPU's std::cos/std::sin of the same float to within its rounding: the fast
// __sinf loses accuracy as the angle grows, and CUDA's sinf/cosf carry a Payne-Hanek path for
// huge arguments that uses local memory (which the build forbids).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/sincos.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// sign = +1: (x1, x2) → (x1 c − x2 s, x2 c + x1 s); sign = −1: the transpose (the inverse).
template <typename D>
__global__ void rope_kernel(D* x, const float* inv_freq, const int32_t* pos, int T_, int nh, int D_,
                            size_t tokens, float sign) {
  const int half = D_ / 2;
  const size_t pairs = tokens * size_t(half);
  for (size_t idx = grid_thread_index(); idx < pairs; idx += grid_thread_count()) {
    const size_t token = idx / size_t(half);
    const int i = int(idx % size_t(half));
    const int t = pos ? pos[token] : int(token % size_t(T_));
    const float a = float(t) * inv_freq[i];
    float s, c;
    sincos_of_angle(a, s, c);
    s *= sign;
    D* head = x + token * size_t(nh) * size_t(D_);
    for (int h = 0; h < nh; ++h, head += D_) {
      const float x1 = to_float(head[i]), x2 = to_float(head[i + half]);
      head[i] = from_float<D>(x1 * c - x2 * s);
      head[i + half] = from_float<D>(x2 * c + x1 * s);
    }
  }
}

template <typename T>
void rope_apply(T* x, const float* inv_freq, const int32_t* pos, int B, int T_, int nh, int D,
                float sign, void* stream) {
  if (B <= 0 || T_ <= 0 || nh <= 0 || D < 2) return;
  const size_t tokens = size_t(B) * size_t(T_);
  FT_LAUNCH((rope_kernel<device_t<T>>), grid_blocks(tokens * size_t(D / 2), kThreads, 1), kThreads,
            0, stream)
  (dev(x), inv_freq, pos, T_, nh, D, tokens, sign);
}

}  // namespace

template <typename T>
void rope_forward(T* x, const float* inv_freq, int B, int T_, int nh, int D, void* stream,
                  const int32_t* pos) {
  rope_apply(x, inv_freq, pos, B, T_, nh, D, 1.0f, stream);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope_backward(T* dx, const float* inv_freq, int B, int T_, int nh, int D, void* stream,
                   const int32_t* pos) {
  rope_apply(dx, inv_freq, pos, B, T_, nh, D, -1.0f, stream);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                  \
  template void rope_forward(T*, const float*, int, int, int, int, void*, const int32_t*); \
  template void rope_backward(T*, const float*, int, int, int, int, void*, const int32_t*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
