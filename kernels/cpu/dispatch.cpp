// kernels.h's per-instruction-set kernels: each call runs the copy of the level cpu_isa() chose
// (isa.h says how the copies are built). Compiled once, with the baseline flags. One switch per
// call (a load and a predictable branch, nothing beside the kernels' own work).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/isa_levels.h"
#include "kernels/kernels.h"

namespace ft::kernels {

// Returns CALL (a kernel call, arguments named as in the caller) from the chosen level's copy.
#define FT_DISPATCH(CALL)           \
  switch (cpu_isa()) {              \
    case CpuIsa::avx512_bf16:       \
      return isa_avx512_bf16::CALL; \
    case CpuIsa::avx2:              \
      return isa_avx2::CALL;        \
    case CpuIsa::baseline:          \
      break;                        \
  }                                 \
  return isa_baseline::CALL

template <typename T>
void bias_add(T* y, const T* b, int N, int C) {
  FT_DISPATCH(bias_add<T>(y, b, N, C));
}
template <typename T>
void bias_grad(float* db, const T* dy, int N, int C) {
  FT_DISPATCH(bias_grad<T>(db, dy, N, C));
}

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int C, int v_begin,
                       int v_count) {
  FT_DISPATCH(embedding_forward<T>(out, ids, table, N, C, v_begin, v_count));
}
template <typename T>
void embedding_backward(float* dtable, const int32_t* ids, const T* dout, int N, int C, int v_begin,
                        int v_count) {
  FT_DISPATCH(embedding_backward<T>(dtable, ids, dout, N, C, v_begin, v_count));
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps) {
  FT_DISPATCH(rmsnorm_forward<T>(out, rstd, x, w, N, C, eps));
}
template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, bool accumulate_dx) {
  FT_DISPATCH(rmsnorm_backward<T>(dx, dw, dout, x, w, rstd, N, C, accumulate_dx));
}

template <typename E>
void rope_forward(E* x, const float* inv_freq, int B, int T, int nh, int D) {
  FT_DISPATCH(rope_forward<E>(x, inv_freq, B, T, nh, D));
}
template <typename E>
void rope_backward(E* dx, const float* inv_freq, int B, int T, int nh, int D) {
  FT_DISPATCH(rope_backward<E>(dx, inv_freq, B, T, nh, D));
}

template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, int B, int T, int H,
                       int K, int D, const int32_t* seg) {
  FT_DISPATCH(attention_forward<E>(out, lse, q, k, v, B, T, H, K, D, seg));
}
template <typename E>
size_t attention_backward_scratch_elems(int B, int T, int H, int D) {
  FT_DISPATCH(attention_backward_scratch_elems<E>(B, T, H, D));
}
template <typename E>
void attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* out, const float* lse,
                        const E* q, const E* k, const E* v, float* scratch, int B, int T, int H,
                        int K, int D, const int32_t* seg) {
  FT_DISPATCH(
      attention_backward<E>(dq, dk, dv, dout, out, lse, q, k, v, scratch, B, T, H, K, D, seg));
}

template <typename T>
void swiglu_forward(T* h, const T* g, const T* u, size_t n) {
  FT_DISPATCH(swiglu_forward<T>(h, g, u, n));
}
template <typename T>
void swiglu_backward(T* dg, T* du, const T* dh, const T* g, const T* u, size_t n) {
  FT_DISPATCH(swiglu_backward<T>(dg, du, dh, g, u, n));
}

template <typename T>
double cross_entropy_forward_backward(std::type_identity_t<T>* dlogits, const T* logits,
                                      const int32_t* targets, const uint8_t* mask, int N, int V,
                                      float scale) {
  FT_DISPATCH(cross_entropy_forward_backward<T>(dlogits, logits, targets, mask, N, V, scale));
}
template <typename T>
void row_max(float* out, const T* x, int N, int V) {
  FT_DISPATCH(row_max<T>(out, x, N, V));
}
template <typename T>
void ce_partial(double* sumexp, double* target_logit, const T* logits, const int32_t* targets,
                const uint8_t* mask, const float* row_max, int N, int V, int v_begin) {
  FT_DISPATCH(ce_partial<T>(sumexp, target_logit, logits, targets, mask, row_max, N, V, v_begin));
}
template <typename T>
double ce_finish(std::type_identity_t<T>* dlogits, const T* logits, const int32_t* targets,
                 const uint8_t* mask, const float* row_max, const double* sumexp,
                 const double* target_logit, int N, int V, int v_begin, float scale) {
  FT_DISPATCH(ce_finish<T>(dlogits, logits, targets, mask, row_max, sumexp, target_logit, N, V,
                           v_begin, scale));
}

template <typename T>
void add_inplace(T* y, const T* x, size_t n) {
  FT_DISPATCH(add_inplace<T>(y, x, n));
}
template <typename T>
void accumulate(float* y, const T* x, size_t n) {
  FT_DISPATCH(accumulate<T>(y, x, n));
}
void scale_inplace(float* y, float s, size_t n) { FT_DISPATCH(scale_inplace(y, s, n)); }
double sum_squares(const float* x, size_t n) { FT_DISPATCH(sum_squares(x, n)); }

void convert(float* dst, const float* src, size_t n) { FT_DISPATCH(convert(dst, src, n)); }
template <typename T>
void convert(T* dst, const float* src, size_t n) {
  FT_DISPATCH(convert<T>(dst, src, n));
}
template <typename T>
void convert(float* dst, const T* src, size_t n) {
  FT_DISPATCH(convert<T>(dst, src, n));
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t, float grad_scale) {
  FT_DISPATCH(adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale));
}
template <typename T>
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t, T* p_compute,
                  float grad_scale) {
  FT_DISPATCH(adamw_update<T>(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t, p_compute,
                              grad_scale));
}

#undef FT_DISPATCH

// Every level's copy is instantiated for these three (kernels.h); so are the entry points.
#define FT_INSTANTIATE(T)                                                                          \
  template void bias_add(T*, const T*, int, int);                                                  \
  template void bias_grad(float*, const T*, int, int);                                             \
  template void embedding_forward(T*, const int32_t*, const T*, int, int, int, int);               \
  template void embedding_backward(float*, const int32_t*, const T*, int, int, int, int);          \
  template void rmsnorm_forward(T*, float*, const T*, const T*, int, int, float);                  \
  template void rmsnorm_backward(T*, float*, const T*, const T*, const T*, const float*, int, int, \
                                 bool);                                                            \
  template void rope_forward(T*, const float*, int, int, int, int);                                \
  template void rope_backward(T*, const float*, int, int, int, int);                               \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, int, int, int, int, \
                                     int, const int32_t*);                                         \
  template size_t attention_backward_scratch_elems<T>(int, int, int, int);                         \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const float*, const T*,      \
                                      const T*, const T*, float*, int, int, int, int, int,         \
                                      const int32_t*);                                             \
  template void swiglu_forward(T*, const T*, const T*, size_t);                                    \
  template void swiglu_backward(T*, T*, const T*, const T*, const T*, size_t);                     \
  template double cross_entropy_forward_backward<T>(T*, const T*, const int32_t*, const uint8_t*,  \
                                                    int, int, float);                              \
  template void row_max(float*, const T*, int, int);                                               \
  template void ce_partial(double*, double*, const T*, const int32_t*, const uint8_t*,             \
                           const float*, int, int, int);                                           \
  template double ce_finish<T>(T*, const T*, const int32_t*, const uint8_t*, const float*,         \
                               const double*, const double*, int, int, int, float);                \
  template void add_inplace(T*, const T*, size_t);                                                 \
  template void accumulate(float*, const T*, size_t);                                              \
  template void adamw_update(float*, const float*, float*, float*, size_t, float, float, float,    \
                             float, float, int64_t, T*, float);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

template void convert(bf16*, const float*, size_t);
template void convert(f16*, const float*, size_t);
template void convert(float*, const bf16*, size_t);
template void convert(float*, const f16*, size_t);

}  // namespace ft::kernels
