// The CPU backend's ops: each forwards to its kernel in kernels/cpu/ (the reference
// implementation). The stream is ignored: every kernel has finished when it returns.
#include "runtime/cpu_ops.h"

#include <cstring>

#include "core/error.h"
#include "kernels/kernels.h"

namespace ft {
namespace k = kernels;
namespace {

// The element type every typed argument of one op must share. Until the 16-bit kernels are
// wired in, the CPU ops run fp32 only.
DType same_dtype(const char* op, std::initializer_list<DType> types) {
  DType t = *types.begin();
  for (DType u : types)
    FT_CHECK(u == t, op, ": arguments of different element types (", dtype_name(t), ", ",
             dtype_name(u), ")");
  FT_CHECK(t == DType::kF32, op, ": element type ", dtype_name(t),
           " is not implemented on the CPU yet");
  return t;
}

float* f(Ref r) { return static_cast<float*>(r.ptr); }
const float* f(CRef r) { return static_cast<const float*>(r.ptr); }

class CpuOps final : public Ops {
 public:
  void linear_forward(Stream, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    same_dtype("linear_forward", {y.dtype, x.dtype, W.dtype});
    k::linear_forward(f(y), f(x), f(W), N, in, out, accumulate);
  }
  void linear_backward(Stream, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in,
                       int out, bool accumulate_dx) override {
    same_dtype("linear_backward", {dx.ptr ? dx.dtype : dy.dtype, dy.dtype, x.dtype, W.dtype});
    k::linear_backward(f(dx), dW, f(dy), f(x), f(W), N, in, out, accumulate_dx);
  }
  void embedding_forward(Stream, Ref out, const int32_t* ids, CRef table, int N, int C,
                         int v_begin, int v_count) override {
    same_dtype("embedding_forward", {out.dtype, table.dtype});
    k::embedding_forward(f(out), ids, f(table), N, C, v_begin, v_count);
  }
  void embedding_backward(Stream, float* dtable, const int32_t* ids, CRef dout, int N, int C,
                          int v_begin, int v_count) override {
    same_dtype("embedding_backward", {dout.dtype});
    k::embedding_backward(dtable, ids, f(dout), N, C, v_begin, v_count);
  }
  void rmsnorm_forward(Stream, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                       float eps) override {
    same_dtype("rmsnorm_forward", {out.dtype, x.dtype, w.dtype});
    k::rmsnorm_forward(f(out), rstd, f(x), f(w), N, C, eps);
  }
  void rmsnorm_backward(Stream, Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd,
                        int N, int C) override {
    same_dtype("rmsnorm_backward", {dx.dtype, dout.dtype, x.dtype, w.dtype});
    k::rmsnorm_backward(f(dx), dw, f(dout), f(x), f(w), rstd, N, C);
  }
  void rope_forward(Stream, Ref x, const float* inv_freq, int B, int T, int nh, int D) override {
    same_dtype("rope_forward", {x.dtype});
    k::rope_forward(f(x), inv_freq, B, T, nh, D);
  }
  void rope_backward(Stream, Ref dx, const float* inv_freq, int B, int T, int nh,
                     int D) override {
    same_dtype("rope_backward", {dx.dtype});
    k::rope_backward(f(dx), inv_freq, B, T, nh, D);
  }
  void attention_forward(Stream, Ref out, float* probs, CRef q, CRef kk, CRef v, int B, int T,
                         int H, int K, int D) override {
    same_dtype("attention_forward", {out.dtype, q.dtype, kk.dtype, v.dtype});
    k::attention_forward(f(out), probs, f(q), f(kk), f(v), B, T, H, K, D);
  }
  void attention_backward(Stream, Ref dq, Ref dk, Ref dv, CRef dout, const float* probs, CRef q,
                          CRef kk, CRef v, float* scratch, int B, int T, int H, int K,
                          int D) override {
    same_dtype("attention_backward",
               {dq.dtype, dk.dtype, dv.dtype, dout.dtype, q.dtype, kk.dtype, v.dtype});
    k::attention_backward(f(dq), f(dk), f(dv), f(dout), probs, f(q), f(kk), f(v), scratch, B, T,
                          H, K, D);
  }
  void swiglu_forward(Stream, Ref h, CRef g, CRef u, size_t n) override {
    same_dtype("swiglu_forward", {h.dtype, g.dtype, u.dtype});
    k::swiglu_forward(f(h), f(g), f(u), n);
  }
  void swiglu_backward(Stream, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) override {
    same_dtype("swiglu_backward", {dg.dtype, du.dtype, dh.dtype, g.dtype, u.dtype});
    k::swiglu_backward(f(dg), f(du), f(dh), f(g), f(u), n);
  }
  void cross_entropy(Stream, Ref dlogits, CRef logits, const int32_t* targets,
                     const uint8_t* mask, int N, int V, float scale, double* loss_acc) override {
    same_dtype("cross_entropy", {dlogits.ptr ? dlogits.dtype : logits.dtype, logits.dtype});
    *loss_acc += k::cross_entropy_forward_backward(f(dlogits), f(logits), targets, mask, N, V,
                                                   scale);
  }
  void row_max(Stream, float* out, CRef x, int N, int V) override {
    same_dtype("row_max", {x.dtype});
    k::row_max(out, f(x), N, V);
  }
  void ce_partial(Stream, double* sumexp, double* target_logit, CRef logits,
                  const int32_t* targets, const uint8_t* mask, const float* row_max, int N, int V,
                  int v_begin) override {
    same_dtype("ce_partial", {logits.dtype});
    k::ce_partial(sumexp, target_logit, f(logits), targets, mask, row_max, N, V, v_begin);
  }
  void ce_finish(Stream, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale, double* loss_acc) override {
    same_dtype("ce_finish", {dlogits.ptr ? dlogits.dtype : logits.dtype, logits.dtype});
    *loss_acc += k::ce_finish(f(dlogits), f(logits), targets, mask, row_max, sumexp,
                              target_logit, N, V, v_begin, scale);
  }
  void convert(Stream, Ref dst, CRef src, size_t n) override {
    // Until kernels/cpu has vectorised casts: one element at a time, through fp32.
    if (dst.dtype == src.dtype) {
      if (n && dst.ptr != src.ptr) std::memmove(dst.ptr, src.ptr, n * dtype_size(dst.dtype));
      return;
    }
    for (DType t : {dst.dtype, src.dtype})
      FT_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16, "convert: dtype ",
               dtype_name(t), " is not a float type");
    auto load = [&](size_t i) -> float {
      switch (src.dtype) {
        case DType::kF32: return static_cast<const float*>(src.ptr)[i];
        case DType::kBF16: return k::to_f32(static_cast<const k::bf16*>(src.ptr)[i]);
        case DType::kF16: return k::to_f32(static_cast<const k::f16*>(src.ptr)[i]);
        default: return 0.0f;  // excluded above
      }
    };
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i) {
      const float x = load(i);
      switch (dst.dtype) {
        case DType::kF32: static_cast<float*>(dst.ptr)[i] = x; break;
        case DType::kBF16: static_cast<k::bf16*>(dst.ptr)[i] = k::to_bf16(x); break;
        case DType::kF16: static_cast<k::f16*>(dst.ptr)[i] = k::to_f16(x); break;
        default: break;
      }
    }
  }
  void add(Stream, Ref y, CRef x, size_t n) override {
    same_dtype("add", {y.dtype, x.dtype});
    k::add_inplace(f(y), f(x), n);
  }
  void scale(Stream, float* y, float s, size_t n) override { k::scale_inplace(y, s, n); }
  void sum_squares(Stream, double* acc, const float* x, size_t n, double divisor) override {
    const double sq = k::sum_squares(x, n);
    *acc += divisor == 1.0 ? sq : sq / divisor;
  }
  void adamw_update(Stream, float* p, const float* g, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int64_t t) override {
    k::adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
  }
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace ft
