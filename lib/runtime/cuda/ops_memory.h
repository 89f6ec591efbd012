// The device memory the CUDA ops hold besides their operands, and what each op asks of it. Plain
// C++ (no CUDA headers): the CUDA ops (cuda_ops.cpp) allocate through it before they launch, and
// the counting device of `ft plan` (runtime/counting_device.h) makes the very same requests
// instead of launching, so the plan counts this memory without a GPU.
//   - The cuBLASLt workspace: lt_workspace_bytes(sm), allocated with the ops.
//   - One scratch buffer that the ops which reduce across blocks share (per-block partials,
//     attention's score chunks), grown on demand to max(asked, 2 × held); stream order makes
//     its reuse by the next op safe, and growing frees the old buffer (the allocator is
//     stream-ordered, so the ops queued before still see theirs).
// Both count as MemoryCategory::kScratch.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "runtime/device.h"

namespace ft::cuda {

// Attention's implementations on CUDA:
//   kFused: FlashAttention-2 fused on tensor cores (kernels/cuda/attention_fused.cu: mma.sync,
//           P in registers; bf16/f16, head dims 64 and 128, sm_80+; document segments).
//   kGemm:  the score and value products as cuBLASLt GEMMs in query chunks (attention_gemm.h),
//           any dtype and head dim.
//   kSimt:  the SIMT FlashAttention kernels (kernels/cuda/attention.cu, head dim <= 128), the
//           plain twin, for comparison and benchmarks.
enum class AttentionPath { kFused, kGemm, kSimt };
const char* attention_path_name(AttentionPath path);
// FT_CUDA_ATTENTION: fused (the default when unset), gemm or simt; any other value is an
// ft::Error naming the three. Read when a device's ops are made (CudaOps, ft plan's counting
// ops), which keep the answer: one path per device, and a test can make one device per path.
AttentionPath requested_attention_path();
// FT_CUDA_ATTENTION_SM90: 1 runs the fused path's forward and backward with the Hopper kernels
// (kernels/cuda/attention_sm90.cu: TMA, mbarrier, wgmma) on a GPU of compute capability 9.x; 0
// (the default when unset, until a GPU has checked the kernels) keeps FlashAttention-2's there.
// Both contracts are FlashAttention-2's (the backward reads the forward's out and lse and the same
// Δ scratch). Any other value is an ft::Error. Read when a device's ops are made, as
// FT_CUDA_ATTENTION.
bool fused_sm90(int sm_major);
// The path an attention op of this dtype and head dim takes on a GPU of compute capability
// sm_major.x when `requested` was asked for: the fused kernel where it applies (bf16/f16, head
// dim 64 or 128, sm >= 8); otherwise, fp32 models and other head dims fall back to kGemm (the
// tensor-core path for every shape and dtype; fp32 GEMMs without TF32 match the CPU). gemm
// and simt are taken as asked. CudaOps and ft plan's counting ops both decide through this.
AttentionPath attention_path(AttentionPath requested, DType dtype, int D, int sm_major);
// Why attention of this dtype and head dim cannot take document segments (data.pack; only the
// fused kernel masks them, op_list.h) when `requested` was asked for on sm_major.x: its
// dtype, head dim and the path it takes instead; "" when it takes the fused kernel.
std::string segments_refusal(AttentionPath requested, DType dtype, int D, int sm_major);

class OpsMemory {
 public:
  // Allocates the cuBLASLt workspace for a GPU of compute capability sm_major.x.
  OpsMemory(Device& dev, int sm_major);
  ~OpsMemory();
  OpsMemory(const OpsMemory&) = delete;
  OpsMemory& operator=(const OpsMemory&) = delete;
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Scratch of at least `bytes` for the next op on the stream (null when bytes is 0 and none is
  // held yet).
  void* scratch(size_t bytes);

 private:
  Device& dev_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// The scratch bytes each op asks for, given its arguments; ops not listed ask for none.
struct ScratchRequests {
  static size_t bias_grad(int N, int C);
  static size_t rmsnorm_backward(int N, int C);
  // The ops' scratch of each attention path: the chunked GEMMs' score chunks; none for the
  // fused and SIMT kernels (their only buffer, Δ, is the caller's).
  static size_t attention_forward(AttentionPath path, int B, int T, int H, int K, int D,
                                  DType dtype);
  static size_t attention_backward(AttentionPath path, int B, int T, int H, int K, int D,
                                   DType dtype);
  static size_t cross_entropy(int N, int V);  // cross_entropy and ce_finish
  static size_t sum_squares(size_t n);
  // Ops::attention_backward_scratch_elems: the fp32 elements of the caller's buffer (Δ, the
  // same for every path).
  static size_t attention_backward_caller_elems(DType dtype, int B, int T, int H, int D);
};

}  // namespace ft::cuda
