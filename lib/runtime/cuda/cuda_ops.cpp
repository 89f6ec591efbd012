// The CUDA backend's ops. Each op forwards to its launcher in kernels/cuda/kernels_cuda.h for
// the tensors' element type, on the op's stream. An op whose kernel file is not in this tree
// yet (kernels/cuda/<file>.cu; CMake defines FT_CUDA_KERNELS_<FILE> for each one present)
// throws "not yet", so a CUDA run stops with the op's name instead of computing garbage.
#include "runtime/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"

namespace ft {
namespace kc = kernels::cuda;
namespace {

[[noreturn]] void not_yet(const char* op) {
  FT_FAIL("the CUDA backend has no kernel for ", op,
          " yet (not yet: ", op, "); train with runtime.device: cpu");
}

#if FT_CUDA_KERNELS_REDUCE || FT_CUDA_KERNELS_CONVERT
template <typename F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(kernels::bf16{}); return;
    case DType::kF16: f(kernels::f16{}); return;
    default: FT_FAIL("no CUDA kernel for element type ", dtype_name(t));
  }
}
template <typename T>
T* as(Ref r) { return static_cast<T*>(r.ptr); }
template <typename T>
const T* as(CRef r) { return static_cast<const T*>(r.ptr); }
#endif

class CudaOps final : public Ops {
 public:
  explicit CudaOps(void* default_stream) : default_stream_(default_stream) {}

  void linear_forward(Stream, Ref, CRef, CRef, int, int, int, bool) override {
    not_yet("linear_forward");
  }
  void linear_backward(Stream, Ref, float*, CRef, CRef, CRef, int, int, int, bool) override {
    not_yet("linear_backward");
  }
  void embedding_forward(Stream, Ref, const int32_t*, CRef, int, int, int, int) override {
    not_yet("embedding_forward");
  }
  void embedding_backward(Stream, float*, const int32_t*, CRef, int, int, int, int) override {
    not_yet("embedding_backward");
  }
  void rmsnorm_forward(Stream, Ref, float*, CRef, CRef, int, int, float) override {
    not_yet("rmsnorm_forward");
  }
  void rmsnorm_backward(Stream, Ref, float*, CRef, CRef, CRef, const float*, int,
                        int) override {
    not_yet("rmsnorm_backward");
  }
  void rope_forward(Stream, Ref, const float*, int, int, int, int) override {
    not_yet("rope_forward");
  }
  void rope_backward(Stream, Ref, const float*, int, int, int, int) override {
    not_yet("rope_backward");
  }
  void attention_forward(Stream, Ref, float*, CRef, CRef, CRef, int, int, int, int,
                         int) override {
    not_yet("attention_forward");
  }
  size_t attention_backward_scratch_elems(DType, int, int, int, int) override {
    not_yet("attention_backward_scratch_elems");
  }
  void attention_backward(Stream, Ref, Ref, Ref, CRef, CRef, const float*, CRef, CRef, CRef,
                          float*, int, int, int, int, int) override {
    not_yet("attention_backward");
  }
  void swiglu_forward(Stream, Ref, CRef, CRef, size_t) override { not_yet("swiglu_forward"); }
  void swiglu_backward(Stream, Ref, Ref, CRef, CRef, CRef, size_t) override {
    not_yet("swiglu_backward");
  }
  void cross_entropy(Stream, Ref, CRef, const int32_t*, const uint8_t*, int, int, float,
                     double*) override {
    not_yet("cross_entropy");
  }
  void row_max(Stream, float*, CRef, int, int) override { not_yet("row_max"); }
  void ce_partial(Stream, double*, double*, CRef, const int32_t*, const uint8_t*, const float*,
                  int, int, int) override {
    not_yet("ce_partial");
  }
  void ce_finish(Stream, Ref, CRef, const int32_t*, const uint8_t*, const float*,
                 const double*, const double*, int, int, int, float, double*) override {
    not_yet("ce_finish");
  }

  void convert(Stream s, Ref dst, CRef src, size_t n) override {
    if (dst.dtype == src.dtype) {  // a copy, as on the CPU
      if (n && dst.ptr != src.ptr) {
        const cudaError_t e =
            cudaMemcpyAsync(dst.ptr, src.ptr, n * dtype_size(dst.dtype),
                            cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream(s)));
        FT_CHECK(e == cudaSuccess, "convert: cudaMemcpyAsync of ", n, " ",
                 dtype_name(dst.dtype), " elements failed: ", cudaGetErrorString(e));
      }
      return;
    }
#if FT_CUDA_KERNELS_CONVERT
    FT_CHECK(dst.dtype == DType::kF32 || src.dtype == DType::kF32,
             "convert: ", dtype_name(src.dtype), " to ", dtype_name(dst.dtype),
             " has no CUDA kernel (one side must be fp32)");
    if (src.dtype == DType::kF32)
      dispatch(dst.dtype, [&](auto t) {
        kc::convert(as<decltype(t)>(dst), as<float>(src), n, stream(s));
      });
    else
      dispatch(src.dtype, [&](auto t) {
        kc::convert(as<float>(dst), as<decltype(t)>(src), n, stream(s));
      });
#else
    not_yet("convert");
#endif
  }
  void add(Stream s, Ref y, CRef x, size_t n) override {
#if FT_CUDA_KERNELS_REDUCE
    FT_CHECK(y.dtype == x.dtype, "add: arguments of different element types (",
             dtype_name(y.dtype), ", ", dtype_name(x.dtype), ")");
    dispatch(y.dtype, [&](auto t) {
      using T = decltype(t);
      kc::add_inplace(as<T>(y), as<T>(x), n, stream(s));
    });
#else
    not_yet("add");
#endif
  }
  void scale(Stream s, float* y, float f, size_t n) override {
#if FT_CUDA_KERNELS_REDUCE
    kc::scale_inplace(y, f, n, stream(s));
#else
    not_yet("scale");
#endif
  }
  void sum_squares(Stream, double*, const float*, size_t, double) override {
    not_yet("sum_squares");  // needs scratch from the device's allocator
  }
  void adamw_update(Stream, float*, const float*, float*, float*, size_t, float, float, float,
                    float, float, int64_t, float, Ref) override {
    not_yet("adamw_update");
  }

 private:
  void* stream(Stream s) const { return s.handle ? s.handle : default_stream_; }
  void* default_stream_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(void* default_stream) {
  return std::make_unique<CudaOps>(default_stream);
}

}  // namespace ft
