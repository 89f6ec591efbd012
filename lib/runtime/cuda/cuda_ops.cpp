// The CUDA backend's ops: each op of runtime/ops.h launches its kernels/cuda/ launcher
// (kernels/cuda/kernels_cuda.h) for the tensors' element type on the op's stream, or cuBLASLt
// (lt_gemm.h) for the linear layers. Ops whose kernels reduce across blocks get their scratch
// from OpsMemory (ops_memory.h: one buffer of the device's allocator, grown when an op needs
// more; the cuBLASLt workspace, allocated once), asking for ScratchRequests' sizes, the same
// ft plan's counting device asks for. Both count in mem_peak_bytes like any buffer.
#include "runtime/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/cuda/attention_gemm.h"
#include "runtime/cuda/lt_gemm.h"
#include "runtime/cuda/ops_memory.h"
#include "runtime/device.h"
#include "runtime/dtype_dispatch.h"

namespace ft {
namespace kc = kernels::cuda;
using Req = cuda::ScratchRequests;
namespace {

template <typename T>
T* as(Ref r) {
  return static_cast<T*>(r.ptr);
}
template <typename T>
const T* as(CRef r) {
  return static_cast<const T*>(r.ptr);
}

void same_dtype(const char* op, DType a, DType b) {
  FT_CHECK(a == b, op, ": arguments of different element types (", dtype_name(a), ", ",
           dtype_name(b), ")");
}

class CudaOps final : public Ops {
 public:
  CudaOps(Device& dev, void* default_stream, int sm_major, const DeviceOptions& options,
          const std::string& gpu)
      : dev_(dev),
        default_stream_(default_stream),
        sm_major_(sm_major),
        attention_requested_(cuda::requested_attention_path()),
        sm90_(cuda::fused_sm90(sm_major)),
        mem_(dev, sm_major) {
    cuda::LtChoice choice;
    choice.measure = options.measure_gemm_algos;
    choice.record = options.gemm_algos_record;
    choice.device = gpu;
    if (choice.measure) {
      // Timing on the GPU: two events around the work; scratch from the device's allocator.
      choice.time_ms = [this](void* s, const std::function<void()>& work) {
        auto check = [](cudaError_t e, const char* what) {
          FT_CHECK(e == cudaSuccess, what,
                   " failed while timing cuBLASLt algorithms: ", cudaGetErrorString(e));
        };
        for (cudaEvent_t* e : {&time_start_, &time_end_})
          if (!*e) check(cudaEventCreate(e), "cudaEventCreate");
        const auto st = static_cast<cudaStream_t>(s);
        check(cudaEventRecord(time_start_, st), "cudaEventRecord");
        work();
        check(cudaEventRecord(time_end_, st), "cudaEventRecord");
        check(cudaEventSynchronize(time_end_), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, time_start_, time_end_), "cudaEventElapsedTime");
        return ms;
      };
      choice.alloc = [this](size_t bytes) -> void* {
        try {
          return dev_.alloc(bytes);
        } catch (const Error&) {
          // A recording (FT_CUDA_GRAPHS) cannot measure: the recording fails. Else out of
          // memory: that problem keeps the heuristic's first.
          if (dev_.graph_recording()) throw;
          return nullptr;
        }
      };
      choice.free = [this](void* p, size_t bytes) { dev_.free(p, bytes); };
      choice.copy = [](void* dst, const void* src, size_t bytes, void* s) {
        const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                              static_cast<cudaStream_t>(s));
        FT_CHECK(e == cudaSuccess, "cudaMemcpyAsync failed while timing cuBLASLt algorithms: ",
                 cudaGetErrorString(e));
      };
    }
    lt_ = std::make_unique<cuda::LtGemm>(mem_.workspace(), mem_.workspace_bytes(),
                                         options.allow_tf32, std::move(choice));
  }
  ~CudaOps() override {
    lt_.reset();
    for (cudaEvent_t e : {time_start_, time_end_})
      if (e) cudaEventDestroy(e);
  }

  void linear_forward(Stream s, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    same_dtype("linear_forward", y.dtype, x.dtype);
    same_dtype("linear_forward", y.dtype, W.dtype);
    lt_->linear_forward(y.ptr, x.ptr, W.ptr, y.dtype, N, in, out, accumulate, stream(s));
  }
  void linear_forward_residual(Stream s, Ref y, CRef r, CRef x, CRef W, int N, int in,
                               int out) override {
    same_dtype("linear_forward_residual", y.dtype, r.dtype);
    same_dtype("linear_forward_residual", y.dtype, x.dtype);
    same_dtype("linear_forward_residual", y.dtype, W.dtype);
    FT_CHECK(r.ptr == y.ptr || !ranges_overlap(y, r, size_t(N) * size_t(out)),
             "linear_forward_residual: the residual r overlaps y without being y; give y its own "
             "buffer, or pass y as r to add in place");
    lt_->linear_forward_residual(y.ptr, r.ptr, x.ptr, W.ptr, y.dtype, N, in, out, stream(s));
  }
  void linear_backward(Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in, int out,
                       bool accumulate_dx) override {
    same_dtype("linear_backward", dy.dtype, x.dtype);
    same_dtype("linear_backward", dy.dtype, W.dtype);
    if (dx.ptr) same_dtype("linear_backward", dy.dtype, dx.dtype);
    lt_->linear_backward(dx.ptr, dW, dy.ptr, x.ptr, W.ptr, dy.dtype, N, in, out, accumulate_dx,
                         stream(s));
  }

  void bias_add(Stream s, Ref y, CRef b, int N, int C) override {
    same_dtype("bias_add", y.dtype, b.dtype);
    dispatch(y.dtype, "bias_add", [&](auto t) {
      using T = decltype(t);
      kc::bias_add(as<T>(y), as<T>(b), N, C, stream(s));
    });
  }
  void bias_grad(Stream s, float* db, CRef dy, int N, int C) override {
    void* scratch = mem_.scratch(Req::bias_grad(N, C));
    dispatch(dy.dtype, "bias_grad",
             [&](auto t) { kc::bias_grad(db, as<decltype(t)>(dy), N, C, scratch, stream(s)); });
  }

  void embedding_forward(Stream s, Ref out, const int32_t* ids, CRef table, int N, int C,
                         int v_begin, int v_count) override {
    same_dtype("embedding_forward", out.dtype, table.dtype);
    dispatch(out.dtype, "embedding_forward", [&](auto t) {
      using T = decltype(t);
      kc::embedding_forward(as<T>(out), ids, as<T>(table), N, C, v_begin, v_count, stream(s));
    });
  }
  void embedding_backward(Stream s, float* dtable, const int32_t* ids, CRef dout, int N, int C,
                          int v_begin, int v_count) override {
    dispatch(dout.dtype, "embedding_backward", [&](auto t) {
      using T = decltype(t);
      kc::embedding_backward(dtable, ids, as<T>(dout), N, C, v_begin, v_count, stream(s));
    });
  }

  void rmsnorm_forward(Stream s, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                       float eps) override {
    same_dtype("rmsnorm_forward", out.dtype, x.dtype);
    same_dtype("rmsnorm_forward", out.dtype, w.dtype);
    dispatch(out.dtype, "rmsnorm_forward", [&](auto t) {
      using T = decltype(t);
      kc::rmsnorm_forward(as<T>(out), rstd, as<T>(x), as<T>(w), N, C, eps, stream(s));
    });
  }
  void rmsnorm_backward(Stream s, Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd,
                        int N, int C, bool accumulate_dx) override {
    same_dtype("rmsnorm_backward", dx.dtype, dout.dtype);
    same_dtype("rmsnorm_backward", dx.dtype, x.dtype);
    same_dtype("rmsnorm_backward", dx.dtype, w.dtype);
    const size_t n = size_t(N) * size_t(C);
    FT_CHECK(!ranges_overlap(dx, dout, n) && !ranges_overlap(dx, x, n),
             "rmsnorm_backward: dx overlaps dout or x, which the kernel reads after writing dx; "
             "give dx its own buffer (with accumulate_dx, the gradient it adds into)");
    void* scratch = mem_.scratch(Req::rmsnorm_backward(N, C));
    dispatch(dx.dtype, "rmsnorm_backward", [&](auto t) {
      using T = decltype(t);
      kc::rmsnorm_backward(as<T>(dx), dw, as<T>(dout), as<T>(x), as<T>(w), rstd, N, C,
                           accumulate_dx, scratch, stream(s));
    });
  }

  void rope_forward(Stream s, Ref x, const float* inv_freq, int B, int T_, int nh, int D,
                    const int32_t* pos) override {
    dispatch(x.dtype, "rope_forward", [&](auto t) {
      kc::rope_forward(as<decltype(t)>(x), inv_freq, B, T_, nh, D, stream(s), pos);
    });
  }
  void rope_backward(Stream s, Ref dx, const float* inv_freq, int B, int T_, int nh, int D,
                     const int32_t* pos) override {
    dispatch(dx.dtype, "rope_backward", [&](auto t) {
      kc::rope_backward(as<decltype(t)>(dx), inv_freq, B, T_, nh, D, stream(s), pos);
    });
  }

  void attention_decode(Stream s, Ref out, CRef q, CRef k, CRef v, int pos, int Tq, int H, int K,
                        int D) override {
    same_dtype("attention_decode", out.dtype, q.dtype);
    same_dtype("attention_decode", out.dtype, k.dtype);
    same_dtype("attention_decode", out.dtype, v.dtype);
    dispatch(out.dtype, "attention_decode", [&](auto t) {
      using T = decltype(t);
      kc::attention_decode(as<T>(out), as<T>(q), as<T>(k), as<T>(v), pos, Tq, H, K, D, stream(s));
    });
  }

  // The attention path of this op (ops_memory.h): FT_CUDA_ATTENTION's, the fused kernel by
  // default where it applies. A non-null seg needs the fused kernel (op_list.h).
  cuda::AttentionPath attention_path(const char* op, DType dt, int D, const int32_t* seg) const {
    const cuda::AttentionPath path = cuda::attention_path(attention_requested_, dt, D, sm_major_);
    if (seg && path != cuda::AttentionPath::kFused)
      FT_FAIL(op, ": ", cuda::segments_refusal(attention_requested_, dt, D, sm_major_));
    return path;
  }
  std::string attention_segments_refusal(DType dt, int D) override {
    return cuda::segments_refusal(attention_requested_, dt, D, sm_major_);
  }

  void attention_forward(Stream s, Ref out, float* lse, CRef q, CRef k, CRef v, const int32_t* seg,
                         int B, int T_, int H, int K, int D) override {
    same_dtype("attention_forward", out.dtype, q.dtype);
    same_dtype("attention_forward", out.dtype, k.dtype);
    same_dtype("attention_forward", out.dtype, v.dtype);
    const cuda::AttentionPath path = attention_path("attention_forward", out.dtype, D, seg);
    if (path == cuda::AttentionPath::kFused) {
      dispatch(out.dtype, "attention_forward", [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
          if (sm90_)
            kc::attention_sm90_forward(as<T>(out), lse, as<T>(q), as<T>(k), as<T>(v), seg, B, T_, H,
                                       K, D, stream(s));
          else
            kc::attention_fused_forward(as<T>(out), lse, as<T>(q), as<T>(k), as<T>(v), seg, B, T_,
                                        H, K, D, stream(s));
        }
      });
      return;
    }
    if (path == cuda::AttentionPath::kGemm) {
      const cuda::AttentionGemmPlan plan = cuda::attention_gemm_plan(B, T_, K, H / K, out.dtype);
      void* scratch = mem_.scratch(Req::attention_forward(path, B, T_, H, K, D, out.dtype));
      cuda::attention_gemm_forward(*lt_, out.dtype, out.ptr, lse, q.ptr, k.ptr, v.ptr, B, T_, H, K,
                                   D, plan, scratch, stream(s));
      return;
    }
    dispatch(out.dtype, "attention_forward", [&](auto t) {
      using T = decltype(t);
      kc::attention_forward(as<T>(out), lse, as<T>(q), as<T>(k), as<T>(v), B, T_, H, K, D,
                            stream(s));
    });
  }
  size_t attention_backward_scratch_elems(DType dt, int B, int T_, int H, int D) override {
    return Req::attention_backward_caller_elems(dt, B, T_, H, D);
  }
  void attention_backward(Stream s, Ref dq, Ref dk, Ref dv, CRef dout, CRef out, const float* lse,
                          CRef q, CRef k, CRef v, const int32_t* seg, float* scratch, int B, int T_,
                          int H, int K, int D) override {
    same_dtype("attention_backward", dq.dtype, dout.dtype);
    same_dtype("attention_backward", dq.dtype, q.dtype);
    const cuda::AttentionPath path = attention_path("attention_backward", dq.dtype, D, seg);
    if (path == cuda::AttentionPath::kFused) {
      // `scratch` holds Δ (B, H, T), attention_fused_backward_scratch_bytes.
      dispatch(dq.dtype, "attention_backward", [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
          if (sm90_)
            kc::attention_sm90_backward(as<T>(dq), as<T>(dk), as<T>(dv), as<T>(dout), as<T>(out),
                                        lse, as<T>(q), as<T>(k), as<T>(v), seg, scratch, B, T_, H,
                                        K, D, stream(s));
          else
            kc::attention_fused_backward(as<T>(dq), as<T>(dk), as<T>(dv), as<T>(dout), as<T>(out),
                                         lse, as<T>(q), as<T>(k), as<T>(v), seg, scratch, B, T_, H,
                                         K, D, stream(s));
        }
      });
      return;
    }
    if (path == cuda::AttentionPath::kGemm) {
      // `scratch` holds Δ (B, H, T) as for the SIMT kernels; the chunks come from the ops' own.
      const cuda::AttentionGemmPlan plan = cuda::attention_gemm_plan(B, T_, K, H / K, dq.dtype);
      void* chunks = mem_.scratch(Req::attention_backward(path, B, T_, H, K, D, dq.dtype));
      cuda::attention_gemm_backward(*lt_, dq.dtype, dq.ptr, dk.ptr, dv.ptr, dout.ptr, out.ptr, lse,
                                    q.ptr, k.ptr, v.ptr, scratch, B, T_, H, K, D, plan, chunks,
                                    stream(s));
      return;
    }
    dispatch(dq.dtype, "attention_backward", [&](auto t) {
      using T = decltype(t);
      kc::attention_backward(as<T>(dq), as<T>(dk), as<T>(dv), as<T>(dout), as<T>(out), lse,
                             as<T>(q), as<T>(k), as<T>(v), scratch, B, T_, H, K, D, stream(s));
    });
  }

  void swiglu_forward(Stream s, Ref h, CRef g, CRef u, size_t n) override {
    same_dtype("swiglu_forward", h.dtype, g.dtype);
    same_dtype("swiglu_forward", h.dtype, u.dtype);
    dispatch(h.dtype, "swiglu_forward", [&](auto t) {
      using T = decltype(t);
      kc::swiglu_forward(as<T>(h), as<T>(g), as<T>(u), n, stream(s));
    });
  }
  void swiglu_backward(Stream s, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) override {
    same_dtype("swiglu_backward", dg.dtype, dh.dtype);
    same_dtype("swiglu_backward", dg.dtype, g.dtype);
    dispatch(dg.dtype, "swiglu_backward", [&](auto t) {
      using T = decltype(t);
      kc::swiglu_backward(as<T>(dg), as<T>(du), as<T>(dh), as<T>(g), as<T>(u), n, stream(s));
    });
  }

  void cross_entropy(Stream s, Ref dlogits, CRef logits, const int32_t* targets,
                     const uint8_t* mask, int N, int V, const float* scale,
                     double* loss_acc) override {
    if (dlogits.ptr) same_dtype("cross_entropy", dlogits.dtype, logits.dtype);
    void* scratch = mem_.scratch(Req::cross_entropy(N, V));
    dispatch(logits.dtype, "cross_entropy", [&](auto t) {
      using T = decltype(t);
      kc::cross_entropy(static_cast<T*>(dlogits.ptr), as<T>(logits), targets, mask, N, V, scale,
                        loss_acc, scratch, stream(s));
    });
  }
  void row_max(Stream s, float* out, CRef x, int N, int V) override {
    dispatch(x.dtype, "row_max",
             [&](auto t) { kc::row_max(out, as<decltype(t)>(x), N, V, stream(s)); });
  }
  void ce_partial(Stream s, double* sumexp, double* target_logit, CRef logits,
                  const int32_t* targets, const uint8_t* mask, const float* row_max, int N, int V,
                  int v_begin) override {
    dispatch(logits.dtype, "ce_partial", [&](auto t) {
      kc::ce_partial(sumexp, target_logit, as<decltype(t)>(logits), targets, mask, row_max, N, V,
                     v_begin, stream(s));
    });
  }
  void ce_finish(Stream s, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, const float* scale, double* loss_acc) override {
    if (dlogits.ptr) same_dtype("ce_finish", dlogits.dtype, logits.dtype);
    void* scratch = mem_.scratch(Req::cross_entropy(N, V));
    dispatch(logits.dtype, "ce_finish", [&](auto t) {
      using T = decltype(t);
      kc::ce_finish(static_cast<T*>(dlogits.ptr), as<T>(logits), targets, mask, row_max, sumexp,
                    target_logit, N, V, v_begin, scale, loss_acc, scratch, stream(s));
    });
  }

  void convert(Stream s, Ref dst, CRef src, size_t n) override {
    if (dst.dtype == src.dtype) {  // a copy, as on the CPU
      if (n && dst.ptr != src.ptr) dev_.copy(s, dst.ptr, src.ptr, n * dtype_size(dst.dtype));
      return;
    }
    FT_CHECK(dst.dtype == DType::kF32 || src.dtype == DType::kF32,
             "convert: ", dtype_name(src.dtype), " to ", dtype_name(dst.dtype),
             " has no CUDA kernel (one side must be fp32)");
    if (src.dtype == DType::kF32)
      dispatch(dst.dtype, "convert",
               [&](auto t) { kc::convert(as<decltype(t)>(dst), as<float>(src), n, stream(s)); });
    else
      dispatch(src.dtype, "convert",
               [&](auto t) { kc::convert(as<float>(dst), as<decltype(t)>(src), n, stream(s)); });
  }
  void add(Stream s, Ref y, CRef x, size_t n) override {
    same_dtype("add", y.dtype, x.dtype);
    dispatch(y.dtype, "add", [&](auto t) {
      using T = decltype(t);
      kc::add_inplace(as<T>(y), as<T>(x), n, stream(s));
    });
  }
  void scale(Stream s, float* y, float f, size_t n) override {
    kc::scale_inplace(y, f, n, stream(s));
  }
  void sum_squares(Stream s, double* acc, const float* x, size_t n, double divisor) override {
    void* scratch = mem_.scratch(Req::sum_squares(n));
    kc::sum_squares(acc, x, n, divisor, scratch, stream(s));
  }
  void random_normal(Stream s, float* out, size_t rows, size_t cols, size_t ld, uint64_t key,
                     uint64_t first, double std) override {
    kc::random_normal(out, rows, cols, ld, key, first, std, stream(s));
  }
  void dropout_scale(Stream s, Ref y, CRef x, size_t rows, size_t cols, size_t col0, float p,
                     float f, const uint64_t* key) override {
    same_dtype("dropout_scale", y.dtype, x.dtype);
    FT_CHECK(p >= 0.0f && p < 1.0f, "dropout_scale: p = ", p,
             " is outside [0, 1) (the probability of dropping an element)");
    FT_CHECK(y.ptr == x.ptr || !ranges_overlap(y, x, rows * cols),
             "dropout_scale: y overlaps x without being x; in place is y = x, else give y its own "
             "buffer");
    dispatch(y.dtype, "dropout_scale", [&](auto t) {
      using T = decltype(t);
      kc::dropout_scale(as<T>(y), as<T>(x), rows, cols, col0, p, f, key, stream(s));
    });
  }
  void quantize_nf4(Stream s, uint8_t* codes, float* absmax, CRef x, size_t n) override {
    dispatch(x.dtype, "quantize_nf4", [&](auto t) {
      using T = decltype(t);
      kc::quantize_nf4(codes, absmax, as<T>(x), n, stream(s));
    });
  }
  void dequantize_nf4(Stream s, Ref out, const uint8_t* codes, const int8_t* qabsmax,
                      const float* scale, float mean, size_t n) override {
    dispatch(out.dtype, "dequantize_nf4", [&](auto t) {
      using T = decltype(t);
      kc::dequantize_nf4(as<T>(out), codes, qabsmax, scale, mean, n, stream(s));
    });
  }
  void adamw_update(Stream s, float* p, const float* g, float* m, float* v, size_t n,
                    const kernels::AdamwArgs* args, Ref p_compute) override {
    if (!p_compute.ptr) {
      kc::adamw_update<float>(p, g, m, v, n, args, nullptr, stream(s));
      return;
    }
    dispatch(p_compute.dtype, "adamw_update", [&](auto tag) {
      kc::adamw_update(p, g, m, v, n, args, as<decltype(tag)>(p_compute), stream(s));
    });
  }

 private:
  void* stream(Stream s) const { return s.handle ? s.handle : default_stream_; }
  Device& dev_;
  void* default_stream_;
  int sm_major_;
  cuda::AttentionPath attention_requested_;
  bool sm90_;            // the fused path by attention_sm90's kernels (FT_CUDA_ATTENTION_SM90)
  cuda::OpsMemory mem_;  // the cuBLASLt workspace and the ops' shared scratch
  std::unique_ptr<cuda::LtGemm> lt_;
  cudaEvent_t time_start_ = nullptr, time_end_ = nullptr;  // timing cuBLASLt's candidates
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(Device& dev, void* default_stream, int sm_major,
                                   const DeviceOptions& options, const std::string& gpu) {
  return std::make_unique<CudaOps>(dev, default_stream, sm_major, options, gpu);
}

}  // namespace ft
