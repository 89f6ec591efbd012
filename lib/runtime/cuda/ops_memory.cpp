#include "runtime/cuda/ops_memory.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cuda/kernels_cuda.h"
#include "runtime/cuda/attention_gemm.h"
#include "runtime/cuda/lt_gemm.h"

namespace ft::cuda {
namespace kc = kernels::cuda;

bool attention_on_tensor_cores() {
  static const bool gemm = [] {
    const char* v = std::getenv("FT_CUDA_ATTENTION");
    const std::string mode = v ? v : "gemm";
    FT_CHECK(mode == "gemm" || mode == "simt", "FT_CUDA_ATTENTION='", mode,
             "': use gemm (tensor cores through cuBLASLt, the default) or simt (the SIMT "
             "kernels)");
    return mode == "gemm";
  }();
  return gemm;
}

// The cuBLAS API reference (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on other
// architectures; sm_90 and later get 32 MiB. Declared in lt_gemm.h, defined here (plain C++) so
// that ft plan counts it without the CUDA libraries.
size_t lt_workspace_bytes(int sm_major) {
  return sm_major >= 9 ? size_t{32} << 20 : size_t{4} << 20;
}

OpsMemory::OpsMemory(Device& dev, int sm_major) : dev_(dev) {
  workspace_bytes_ = lt_workspace_bytes(sm_major);
  const MemoryScope tag(MemoryCategory::kScratch);
  workspace_ = dev_.alloc(workspace_bytes_);
}

OpsMemory::~OpsMemory() {
  if (scratch_) dev_.free(scratch_, scratch_bytes_);
  if (workspace_) dev_.free(workspace_, workspace_bytes_);
}

void* OpsMemory::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) dev_.free(scratch_, scratch_bytes_);
    scratch_ = nullptr;
    scratch_bytes_ = std::max(bytes, scratch_bytes_ * 2);
    const MemoryScope tag(MemoryCategory::kScratch);
    scratch_ = dev_.alloc(scratch_bytes_);
  }
  return scratch_;
}

size_t ScratchRequests::bias_grad(int N, int C) { return kc::bias_grad_scratch_bytes(N, C); }

size_t ScratchRequests::rmsnorm_backward(int N, int C) {
  return kc::rmsnorm_backward_scratch_bytes(N, C);
}

size_t ScratchRequests::attention_forward(bool tensor_cores, int B, int T, int H, int K, int D,
                                          DType dtype) {
  if (!tensor_cores) return 0;
  const AttentionGemmPlan plan = attention_gemm_plan(B, T, K, H / K, dtype);
  return attention_gemm_scratch_bytes(B, T, H, K, D, dtype, plan, false);
}

size_t ScratchRequests::attention_backward(bool tensor_cores, int B, int T, int H, int K, int D,
                                           DType dtype) {
  if (!tensor_cores) return 0;
  const AttentionGemmPlan plan = attention_gemm_plan(B, T, K, H / K, dtype);
  return attention_gemm_scratch_bytes(B, T, H, K, D, dtype, plan, true);
}

size_t ScratchRequests::cross_entropy(int N, int V) {
  return kc::cross_entropy_scratch_bytes(N, V);
}

size_t ScratchRequests::sum_squares(size_t n) { return kc::sum_squares_scratch_bytes(n); }

size_t ScratchRequests::attention_backward_caller_elems(DType, int B, int T, int H, int D) {
  // Δ (B, H, T) whatever the dtype and K: the CUDA kernels sum dQ in registers
  // (kernels/cuda/attention.cu); attention on tensor cores keeps the same Δ.
  const size_t bytes = kc::attention_backward_scratch_bytes<float>(B, T, H, H, D);
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

}  // namespace ft::cuda
