// The fused attention's launchers (kernels_cuda.h): causal GQA on tensor cores, FlashAttention-2
// for sm_80+, in the forms ft runs (ChosenForms). The kernels, their algorithm and their launches
// are kernels/cuda/attention_fused.cuh; the other forms its templates allow, and the measurements
// that chose these, are the tuning lab's (dev/attention/).
#include "kernels/cuda/attention_fused.cuh"

namespace ft::kernels::cuda {
namespace {

template <typename T, int D>
void forward_d(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* seg, int B,
               int T_, int H, int K, void* stream) {
  using F = ChosenForms<D>;
  forward_launch<T, D, F::kFwdMt>(out, lse, q, k, v, seg, B, T_, H, K, F::kLpt, stream);
}

template <typename T, int D>
void backward_d(T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* delta,
                const T* q, const T* k, const T* v, const int32_t* seg, int B, int T_, int H, int K,
                void* stream) {
  using F = ChosenForms<D>;
  const float scale = softmax_scale(D);
  dkdv_launch<T, D, F::kDkdvTq, F::kDkdvMinB, F::kDkdvIlv>(dk, dv, dout, lse, delta, q, k, v, seg,
                                                           B, T_, H, K, scale, F::kLpt, stream);
  dq_launch<T, D, F::kDqMt, F::kDqKvBuf, F::kDqIlv>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K,
                                                    scale, F::kLpt, stream);
}

}  // namespace

template <typename T>
void attention_fused_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const int32_t* seg, int B, int T_, int H, int K, int D, void* stream) {
  check_fused("attention_fused_forward", B, T_, H, K, D, {out, q, k, v});
  if (B == 0 || T_ == 0) return;
  if (D == 64)
    forward_d<T, 64>(out, lse, q, k, v, seg, B, T_, H, K, stream);
  else
    forward_d<T, 128>(out, lse, q, k, v, seg, B, T_, H, K, stream);
}

template <typename T>
void attention_fused_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const int32_t* seg, void* scratch,
                              int B, int T_, int H, int K, int D, void* stream) {
  check_fused("attention_fused_backward", B, T_, H, K, D, {dq, dk, dv, dout, q, k, v});
  if (B == 0 || T_ == 0) return;
  auto* delta = static_cast<float*>(scratch);  // (B, H, T)
  attention_delta(delta, dout, out, B, T_, H, D, stream);
  if (D == 64)
    backward_d<T, 64>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
  else
    backward_d<T, 128>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
}

#define FT_ATTENTION_FUSED_INSTANTIATE(T)                                                        \
  template void attention_fused_forward<T>(T*, float*, const T*, const T*, const T*,             \
                                           const int32_t*, int, int, int, int, int, void*);      \
  template void attention_fused_backward<T>(T*, T*, T*, const T*, const T*, const float*,        \
                                            const T*, const T*, const T*, const int32_t*, void*, \
                                            int, int, int, int, int, void*);
FT_ATTENTION_FUSED_INSTANTIATE(bf16)
FT_ATTENTION_FUSED_INSTANTIATE(f16)
#undef FT_ATTENTION_FUSED_INSTANTIATE

}  // namespace ft::kernels::cuda
