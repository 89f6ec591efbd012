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

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::kFused:
      return "fused";
    case AttentionPath::kGemm:
      return "gemm";
    case AttentionPath::kSimt:
      return "simt";
  }
  return "?";
}

AttentionPath requested_attention_path() {
  const char* v = std::getenv("FT_CUDA_ATTENTION");
  const std::string mode = v ? v : "fused";
  for (AttentionPath p : {AttentionPath::kFused, AttentionPath::kGemm, AttentionPath::kSimt})
    if (mode == attention_path_name(p)) return p;
  throw UsageError(detail::concat(
      "FT_CUDA_ATTENTION='", mode,
      "': use fused (FlashAttention-2 on tensor cores, the default), gemm (the score "
      "products through cuBLASLt) or simt (the SIMT kernels)"));
}

bool fused_sm90(int sm_major) {
  const char* v = std::getenv("FT_CUDA_ATTENTION_SM90");
  const std::string mode = v ? v : "0";
  if (mode != "0" && mode != "1")
    throw UsageError(detail::concat(
        "FT_CUDA_ATTENTION_SM90='", mode,
        "': use 1 (on a Hopper GPU the fused attention's forward and backward run the sm_90 "
        "kernels, TMA and wgmma; not yet checked on a GPU) or 0 (the default: "
        "FlashAttention-2's)"));
  return mode == "1" && sm_major == 9;  // sm_90a code: Hopper only
}

AttentionPath attention_path(AttentionPath requested, DType dtype, int D, int sm_major) {
  if (requested != AttentionPath::kFused) return requested;
  // mma.sync m16n8k16 with bf16/f16 operands needs sm_80; the kernel is written for head dims
  // 64 and 128. Everything else (fp32 models, other head dims) takes the chunked GEMMs.
  const bool applies = dtype != DType::kF32 && kc::attention_fused_supported(D) && sm_major >= 8;
  return applies ? AttentionPath::kFused : AttentionPath::kGemm;
}

std::string segments_refusal(AttentionPath requested, DType dtype, int D, int sm_major) {
  const AttentionPath path = attention_path(requested, dtype, D, sm_major);
  if (path == AttentionPath::kFused) return {};
  return detail::concat(
      "document segments need the fused attention kernel (bf16/f16, head dim 64 or 128, sm_80+); "
      "this is ",
      dtype_name(dtype), " at head dim ", D,
      sm_major < 8 ? detail::concat(" on sm_", sm_major, "x") : std::string(),
      ", so attention takes the ", attention_path_name(path), " path",
      requested == AttentionPath::kFused
          ? ""
          : detail::concat(" (FT_CUDA_ATTENTION=", attention_path_name(requested), ")"));
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
    // Freed first, so that the caching allocator may reuse the block; the state stays whole if
    // the allocation throws (memory is short, or a graph is being recorded).
    const size_t grown = std::max(bytes, scratch_bytes_ * 2);
    if (scratch_) dev_.free(scratch_, scratch_bytes_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    const MemoryScope tag(MemoryCategory::kScratch);
    scratch_ = dev_.alloc(grown);
    scratch_bytes_ = grown;
  }
  return scratch_;
}

size_t ScratchRequests::bias_grad(int N, int C) { return kc::bias_grad_scratch_bytes(N, C); }

size_t ScratchRequests::rmsnorm_backward(int N, int C) {
  return kc::rmsnorm_backward_scratch_bytes(N, C);
}

size_t ScratchRequests::attention_forward(AttentionPath path, int B, int T, int H, int K, int D,
                                          DType dtype) {
  if (path != AttentionPath::kGemm) return 0;
  const AttentionGemmPlan plan = attention_gemm_plan(B, T, K, H / K, dtype);
  return attention_gemm_scratch_bytes(B, T, H, K, D, dtype, plan, false);
}

size_t ScratchRequests::attention_backward(AttentionPath path, int B, int T, int H, int K, int D,
                                           DType dtype) {
  if (path != AttentionPath::kGemm) return 0;
  const AttentionGemmPlan plan = attention_gemm_plan(B, T, K, H / K, dtype);
  return attention_gemm_scratch_bytes(B, T, H, K, D, dtype, plan, true);
}

size_t ScratchRequests::cross_entropy(int N, int V) {
  return kc::cross_entropy_scratch_bytes(N, V);
}

size_t ScratchRequests::sum_squares(size_t n) { return kc::sum_squares_scratch_bytes(n); }

size_t ScratchRequests::attention_backward_caller_elems(DType, int B, int T, int H, int D) {
  // Δ (B, H, T) whatever the dtype and K: the CUDA kernels sum dQ in registers
  // (kernels/cuda/attention.cu, attention_fused.cu); the chunked GEMMs keep the same Δ.
  const size_t bytes = std::max(kc::attention_backward_scratch_bytes<float>(B, T, H, H, D),
                                kc::attention_fused_backward_scratch_bytes(B, T, H));
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

}  // namespace ft::cuda
