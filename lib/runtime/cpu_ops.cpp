// The CPU backend's ops: each forwards to its kernel in kernels/cpu/ (the reference
// implementation), the instance for the tensors' element type (float, bf16 or f16). The stream
// is ignored: every kernel has finished when it returns.
#include "runtime/cpu_ops.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/kernels.h"
#include "runtime/dtype_dispatch.h"

namespace ft {
namespace k = kernels;
namespace {

// The element type every typed argument of one op must share.
DType same_dtype(const char* op, std::initializer_list<DType> types) {
  DType t = *types.begin();
  for (DType u : types)
    FT_CHECK(u == t, op, ": arguments of different element types (", dtype_name(t), ", ",
             dtype_name(u), ")");
  FT_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16, op, ": element type ",
           dtype_name(t), " is not a float type");
  return t;
}

// The cross-entropy ops' gradient scale, read from its device pointer (host memory here, and
// every earlier op has finished): 0 when no gradient is asked for.
float token_scale(const char* op, Ref dlogits, const float* scale) {
  if (!dlogits.ptr) return 0.0f;
  FT_CHECK(scale != nullptr, op, ": dlogits asked for without a scale (a null pointer)");
  return *scale;
}

void convert_any(Ref dst, CRef src, size_t n) {
  if (dst.dtype == src.dtype) {
    if (n && dst.ptr != src.ptr) std::memmove(dst.ptr, src.ptr, n * dtype_size(dst.dtype));
    return;
  }
  for (DType t : {dst.dtype, src.dtype})
    FT_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16, "convert: dtype ",
             dtype_name(t), " is not a float type");
  auto load = [&](size_t i) -> float {
    switch (src.dtype) {
      case DType::kF32:
        return static_cast<const float*>(src.ptr)[i];
      case DType::kBF16:
        return to_f32(static_cast<const bf16*>(src.ptr)[i]);
      case DType::kF16:
        return to_f32(static_cast<const f16*>(src.ptr)[i]);
      default:
        return 0.0f;  // excluded above
    }
  };
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const float x = load(i);
    switch (dst.dtype) {
      case DType::kF32:
        static_cast<float*>(dst.ptr)[i] = x;
        break;
      case DType::kBF16:
        static_cast<bf16*>(dst.ptr)[i] = to_bf16(x);
        break;
      case DType::kF16:
        static_cast<f16*>(dst.ptr)[i] = to_f16(x);
        break;
      default:
        break;
    }
  }
}

template <typename T>
T* as(Ref r) {
  return static_cast<T*>(r.ptr);
}
template <typename T>
const T* as(CRef r) {
  return static_cast<const T*>(r.ptr);
}

class CpuOps final : public Ops {
 public:
  void linear_forward(Stream, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    dispatch(same_dtype("linear_forward", {y.dtype, x.dtype, W.dtype}), [&](auto t) {
      using T = decltype(t);
      k::linear_forward<T>(as<T>(y), as<T>(x), as<T>(W), N, in, out, accumulate);
    });
  }
  void linear_forward_residual(Stream, Ref y, CRef r, CRef x, CRef W, int N, int in,
                               int out) override {
    FT_CHECK(r.ptr == y.ptr || !ranges_overlap(y, r, size_t(N) * size_t(out)),
             "linear_forward_residual: the residual r overlaps y without being y; give y its own "
             "buffer, or pass y as r to add in place");
    dispatch(same_dtype("linear_forward_residual", {y.dtype, r.dtype, x.dtype, W.dtype}),
             [&](auto t) {
               using T = decltype(t);
               k::linear_forward_residual<T>(as<T>(y), as<T>(r), as<T>(x), as<T>(W), N, in, out);
             });
  }
  void linear_backward(Stream, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in, int out,
                       bool accumulate_dx) override {
    dispatch(
        same_dtype("linear_backward", {dx.ptr ? dx.dtype : dy.dtype, dy.dtype, x.dtype, W.dtype}),
        [&](auto t) {
          using T = decltype(t);
          k::linear_backward<T>(as<T>(dx), dW, as<T>(dy), as<T>(x), as<T>(W), N, in, out,
                                accumulate_dx);
        });
  }
  void bias_add(Stream, Ref y, CRef b, int N, int C) override {
    dispatch(same_dtype("bias_add", {y.dtype, b.dtype}), [&](auto t) {
      using T = decltype(t);
      k::bias_add(as<T>(y), as<T>(b), N, C);
    });
  }
  void bias_grad(Stream, float* db, CRef dy, int N, int C) override {
    dispatch(same_dtype("bias_grad", {dy.dtype}),
             [&](auto t) { k::bias_grad(db, as<decltype(t)>(dy), N, C); });
  }
  void embedding_forward(Stream, Ref out, const int32_t* ids, CRef table, int N, int C, int v_begin,
                         int v_count) override {
    FT_CHECK(v_count >= 0, "embedding_forward: the table's row count is required");
    dispatch(same_dtype("embedding_forward", {out.dtype, table.dtype}), [&](auto t) {
      using T = decltype(t);
      k::embedding_forward(as<T>(out), ids, as<T>(table), N, C, v_begin, v_count);
    });
  }
  void embedding_backward(Stream, float* dtable, const int32_t* ids, CRef dout, int N, int C,
                          int v_begin, int v_count) override {
    dispatch(same_dtype("embedding_backward", {dout.dtype}), [&](auto t) {
      using T = decltype(t);
      k::embedding_backward(dtable, ids, as<T>(dout), N, C, v_begin, v_count);
    });
  }
  void rmsnorm_forward(Stream, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                       float eps) override {
    dispatch(same_dtype("rmsnorm_forward", {out.dtype, x.dtype, w.dtype}), [&](auto t) {
      using T = decltype(t);
      k::rmsnorm_forward(as<T>(out), rstd, as<T>(x), as<T>(w), N, C, eps);
    });
  }
  void rmsnorm_backward(Stream, Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd,
                        int N, int C, bool accumulate_dx) override {
    const DType t = same_dtype("rmsnorm_backward", {dx.dtype, dout.dtype, x.dtype, w.dtype});
    const size_t n = size_t(N) * size_t(C);
    FT_CHECK(!ranges_overlap(dx, dout, n) && !ranges_overlap(dx, x, n),
             "rmsnorm_backward: dx overlaps dout or x, which the kernel reads after writing dx; "
             "give dx its own buffer (with accumulate_dx, the gradient it adds into)");
    dispatch(t, [&](auto e) {
      using T = decltype(e);
      k::rmsnorm_backward(as<T>(dx), dw, as<T>(dout), as<T>(x), as<T>(w), rstd, N, C,
                          accumulate_dx);
    });
  }
  void rope_forward(Stream, Ref x, const float* inv_freq, int B, int T, int nh, int D,
                    const int32_t* pos) override {
    dispatch(same_dtype("rope_forward", {x.dtype}),
             [&](auto t) { k::rope_forward(as<decltype(t)>(x), inv_freq, B, T, nh, D, pos); });
  }
  void rope_backward(Stream, Ref dx, const float* inv_freq, int B, int T, int nh, int D,
                     const int32_t* pos) override {
    dispatch(same_dtype("rope_backward", {dx.dtype}),
             [&](auto t) { k::rope_backward(as<decltype(t)>(dx), inv_freq, B, T, nh, D, pos); });
  }
  void attention_decode(Stream, Ref out, CRef q, CRef kk, CRef v, int pos, int Tq, int H, int K,
                        int D) override {
    dispatch(same_dtype("attention_decode", {out.dtype, q.dtype, kk.dtype, v.dtype}), [&](auto t) {
      using E = decltype(t);
      k::attention_decode(as<E>(out), as<E>(q), as<E>(kk), as<E>(v), pos, Tq, H, K, D);
    });
  }
  void attention_forward(Stream, Ref out, float* lse, CRef q, CRef kk, CRef v, const int32_t* seg,
                         int B, int T, int H, int K, int D) override {
    dispatch(same_dtype("attention_forward", {out.dtype, q.dtype, kk.dtype, v.dtype}), [&](auto t) {
      using E = decltype(t);
      k::attention_forward(as<E>(out), lse, as<E>(q), as<E>(kk), as<E>(v), B, T, H, K, D, seg);
    });
  }
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    size_t n = 0;
    dispatch(t, [&](auto e) { n = k::attention_backward_scratch_elems<decltype(e)>(B, T, H, D); });
    return n;
  }
  void attention_backward(Stream, Ref dq, Ref dk, Ref dv, CRef dout, CRef out, const float* lse,
                          CRef q, CRef kk, CRef v, const int32_t* seg, float* scratch, int B, int T,
                          int H, int K, int D) override {
    dispatch(same_dtype("attention_backward", {dq.dtype, dk.dtype, dv.dtype, dout.dtype, out.dtype,
                                               q.dtype, kk.dtype, v.dtype}),
             [&](auto t) {
               using E = decltype(t);
               k::attention_backward(as<E>(dq), as<E>(dk), as<E>(dv), as<E>(dout), as<E>(out), lse,
                                     as<E>(q), as<E>(kk), as<E>(v), scratch, B, T, H, K, D, seg);
             });
  }
  void swiglu_forward(Stream, Ref h, CRef g, CRef u, size_t n) override {
    dispatch(same_dtype("swiglu_forward", {h.dtype, g.dtype, u.dtype}), [&](auto t) {
      using T = decltype(t);
      k::swiglu_forward(as<T>(h), as<T>(g), as<T>(u), n);
    });
  }
  void swiglu_backward(Stream, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) override {
    dispatch(same_dtype("swiglu_backward", {dg.dtype, du.dtype, dh.dtype, g.dtype, u.dtype}),
             [&](auto t) {
               using T = decltype(t);
               k::swiglu_backward(as<T>(dg), as<T>(du), as<T>(dh), as<T>(g), as<T>(u), n);
             });
  }
  void cross_entropy(Stream, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                     int N, int V, const float* scale, double* loss_acc) override {
    const float sc = token_scale("cross_entropy", dlogits, scale);
    dispatch(
        same_dtype("cross_entropy", {dlogits.ptr ? dlogits.dtype : logits.dtype, logits.dtype}),
        [&](auto t) {
          using T = decltype(t);
          *loss_acc += k::cross_entropy_forward_backward<T>(as<T>(dlogits), as<T>(logits), targets,
                                                            mask, N, V, sc);
        });
  }
  void row_max(Stream, float* out, CRef x, int N, int V) override {
    dispatch(same_dtype("row_max", {x.dtype}),
             [&](auto t) { k::row_max(out, as<decltype(t)>(x), N, V); });
  }
  void ce_partial(Stream, double* sumexp, double* target_logit, CRef logits, const int32_t* targets,
                  const uint8_t* mask, const float* row_max, int N, int V, int v_begin) override {
    dispatch(same_dtype("ce_partial", {logits.dtype}), [&](auto t) {
      k::ce_partial(sumexp, target_logit, as<decltype(t)>(logits), targets, mask, row_max, N, V,
                    v_begin);
    });
  }
  void ce_finish(Stream, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, const float* scale, double* loss_acc) override {
    const float sc = token_scale("ce_finish", dlogits, scale);
    dispatch(same_dtype("ce_finish", {dlogits.ptr ? dlogits.dtype : logits.dtype, logits.dtype}),
             [&](auto t) {
               using T = decltype(t);
               *loss_acc += k::ce_finish<T>(as<T>(dlogits), as<T>(logits), targets, mask, row_max,
                                            sumexp, target_logit, N, V, v_begin, sc);
             });
  }
  void convert(Stream, Ref dst, CRef src, size_t n) override {
    if (dst.dtype == src.dtype || (dst.dtype != DType::kF32 && src.dtype != DType::kF32)) {
      convert_any(dst, src, n);  // a copy, or 16-bit to 16-bit (unused in training)
    } else if (src.dtype == DType::kF32) {
      dispatch(dst.dtype, [&](auto t) { k::convert(as<decltype(t)>(dst), as<float>(src), n); });
    } else {
      dispatch(src.dtype, [&](auto t) { k::convert(as<float>(dst), as<decltype(t)>(src), n); });
    }
  }
  void add(Stream, Ref y, CRef x, size_t n) override {
    dispatch(same_dtype("add", {y.dtype, x.dtype}), [&](auto t) {
      using T = decltype(t);
      k::add_inplace(as<T>(y), as<T>(x), n);
    });
  }
  void scale(Stream, float* y, float s, size_t n) override { k::scale_inplace(y, s, n); }
  void sum_squares(Stream, double* acc, const float* x, size_t n, double divisor) override {
    const double sq = k::sum_squares(x, n);
    *acc += divisor == 1.0 ? sq : sq / divisor;
  }
  void random_normal(Stream, float* out, size_t rows, size_t cols, size_t ld, uint64_t key,
                     uint64_t first, double std) override {
    k::random_normal(out, rows, cols, ld, key, first, std);
  }
  void dropout_scale(Stream, Ref y, CRef x, size_t rows, size_t cols, size_t col0, float p, float f,
                     const uint64_t* key) override {
    FT_CHECK(p >= 0.0f && p < 1.0f, "dropout_scale: p = ", p,
             " is outside [0, 1) (the probability of dropping an element)");
    FT_CHECK(p == 0.0f || key != nullptr, "dropout_scale: p > 0 without a key (a null pointer)");
    FT_CHECK(y.ptr == x.ptr || !ranges_overlap(y, x, rows * cols),
             "dropout_scale: y overlaps x without being x; in place is y = x, else give y its own "
             "buffer");
    dispatch(same_dtype("dropout_scale", {y.dtype, x.dtype}), [&](auto t) {
      using T = decltype(t);
      k::dropout_scale(as<T>(y), as<T>(x), rows, cols, col0, p, f, p == 0.0f ? 0 : *key);
    });
  }
  void quantize_nf4(Stream, uint8_t* codes, float* absmax, CRef x, size_t n) override {
    dispatch(same_dtype("quantize_nf4", {x.dtype}), [&](auto t) {
      using T = decltype(t);
      k::quantize_nf4(codes, absmax, as<T>(x), n);
    });
  }
  void dequantize_nf4(Stream, Ref out, const uint8_t* codes, const int8_t* qabsmax,
                      const float* scale, float mean, size_t n) override {
    dispatch(same_dtype("dequantize_nf4", {out.dtype}), [&](auto t) {
      using T = decltype(t);
      k::dequantize_nf4(as<T>(out), codes, qabsmax, scale, mean, n);
    });
  }
  void adamw_update(Stream, float* p, const float* g, float* m, float* v, size_t n,
                    const k::AdamwArgs* args, Ref p_compute) override {
    if (!p_compute.ptr) {
      k::adamw_update(p, g, m, v, n, args->step, args->grad_scale);
      return;
    }
    dispatch(p_compute.dtype, [&](auto e) {
      k::adamw_update(p, g, m, v, n, args->step, as<decltype(e)>(p_compute), args->grad_scale);
    });
  }
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace ft
