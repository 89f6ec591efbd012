// See lt_layout.h for the derivation of each mapping.
#include "runtime/cuda/lt_layout.h"

#include "core/error.h"

namespace ft::cuda {
namespace {

const char* gemm_name(LinearGemm g) {
  switch (g) {
    case LinearGemm::kForward:
      return "linear forward";
    case LinearGemm::kBackwardData:
      return "linear backward dx";
    case LinearGemm::kBackwardWeight:
      return "linear backward dW";
  }
  return "?";
}

LtType lt_type(DType t, const char* what) {
  switch (t) {
    case DType::kF32:
      return LtType::kF32;
    case DType::kBF16:
      return LtType::kBF16;
    case DType::kF16:
      return LtType::kF16;
    default:
      FT_FAIL("cuBLASLt ", what, ": element type ", dtype_name(t),
              " is not a compute dtype (F32, BF16 or F16); the precision policy should never "
              "pass it here");
  }
}

// A stored row-major (r, c) matrix with row stride ld, read column-major: (c, r) with the same
// ld; its batch as given.
LtMatrix stored(const void* ptr, LtType type, int64_t r, int64_t c, int64_t ld, int32_t batch,
                int64_t stride) {
  LtMatrix m;
  m.ptr = ptr;
  m.type = type;
  m.rows = c;
  m.cols = r;
  m.ld = ld;
  m.batch = batch;
  m.batch_stride = batch > 1 ? stride : 0;
  return m;
}

}  // namespace

LtProblem map_gemm(const GemmCall& g) {
  FT_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "cuBLASLt ", g.what, ": negative size M=", g.M,
           " N=", g.N, " K=", g.K);
  FT_CHECK(g.batch >= 1, "cuBLASLt ", g.what, ": batch ", g.batch, " (needs >= 1)");
  const LtType in = lt_type(g.in, g.what), out = lt_type(g.out, g.what);
  FT_CHECK(out == in || out == LtType::kF32, "cuBLASLt ", g.what, ": output type ",
           dtype_name(g.out), " from ", dtype_name(g.in),
           " inputs (the output is the input type or fp32)");
  // Stored shapes: A (M, K) or (K, M); B (K, N) or (N, K); C (M, N).
  const int64_t a_cols = g.trans_a ? g.M : g.K, b_cols = g.trans_b ? g.K : g.N;
  FT_CHECK(g.lda >= a_cols && g.ldb >= b_cols && g.ldc >= g.N, "cuBLASLt ", g.what,
           ": a row stride shorter than its row (", describe(g), ")");
  LtProblem p;
  // Inputs in fp32 with runtime.tf32: cuBLASLt may round them to TF32 (10-bit mantissa) for
  // tensor cores; 16-bit inputs already run on tensor cores with exact fp32 products.
  p.compute = (in == LtType::kF32 && g.allow_tf32) ? LtCompute::k32FFastTF32 : LtCompute::k32F;
  p.scale_type = LtType::kF32;
  p.alpha = g.alpha;
  p.beta = g.beta;
  // Cᵀ (N, M) = op(B)ᵀ · op(A)ᵀ. B stored (K, N) reads column-major as (N, K) = op(B)ᵀ already;
  // stored (N, K) (trans_b) it reads as (K, N) and needs cuBLASLt's transpose. Likewise A.
  p.transa = g.trans_b ? LtOp::kT : LtOp::kN;
  p.transb = g.trans_a ? LtOp::kT : LtOp::kN;
  p.m = g.N;
  p.n = g.M;
  p.k = g.K;
  p.A = g.trans_b ? stored(g.b, in, g.N, g.K, g.ldb, g.batch, g.stride_b)
                  : stored(g.b, in, g.K, g.N, g.ldb, g.batch, g.stride_b);
  p.B = g.trans_a ? stored(g.a, in, g.K, g.M, g.lda, g.batch, g.stride_a)
                  : stored(g.a, in, g.M, g.K, g.lda, g.batch, g.stride_a);
  p.D = stored(g.c, out, g.M, g.N, g.ldc, g.batch, g.stride_c);
  // In place C is D (read only when beta != 0); out of place, D's layout read from c_source.
  p.C = p.D;
  if (g.c_source) p.C.ptr = g.c_source;
  return p;
}

GemmCall linear_gemm(const LinearCall& call) {
  GemmCall g;
  g.in = call.dtype;
  g.out = call.dtype;
  g.allow_tf32 = call.allow_tf32;
  g.what = gemm_name(call.gemm);
  g.c = call.out_ptr;
  g.a = call.a;
  g.b = call.b;
  g.beta = call.accumulate ? 1.0f : 0.0f;
  FT_CHECK(!call.residual || (call.gemm == LinearGemm::kForward && call.accumulate), "cuBLASLt ",
           g.what, ": a residual is read only by an accumulating forward product");
  g.c_source = call.residual;
  switch (call.gemm) {
    case LinearGemm::kForward:  // y (N, out) = x (N, in) · Wᵀ, W stored (out, in)
      g.M = call.N, g.N = call.out, g.K = call.in;
      g.lda = call.in;
      g.ldb = call.in, g.trans_b = true;
      g.ldc = call.out;
      break;
    case LinearGemm::kBackwardData:  // dx (N, in) = dy (N, out) · W (out, in)
      g.M = call.N, g.N = call.in, g.K = call.out;
      g.lda = call.out;
      g.ldb = call.in;
      g.ldc = call.in;
      break;
    case LinearGemm::kBackwardWeight:
      // dW (out, in) += dyᵀ · x, dy stored (N, out), x (N, in). dW is fp32 whatever the compute
      // dtype (gradients are reduced and stepped in fp32) and always accumulates.
      g.out = DType::kF32;
      g.M = call.out, g.N = call.in, g.K = call.N;
      g.lda = call.out, g.trans_a = true;
      g.ldb = call.in;
      g.ldc = call.in;
      g.beta = 1.0f;
      break;
  }
  return g;
}

LtProblem map_linear(const LinearCall& call) {
  FT_CHECK(call.N >= 0 && call.in >= 0 && call.out >= 0, "cuBLASLt ", gemm_name(call.gemm),
           ": negative size N=", call.N, " in=", call.in, " out=", call.out);
  return map_gemm(linear_gemm(call));
}

std::string describe(const GemmCall& g) {
  return detail::concat(
      g.what, ' ', dtype_name(g.in), " -> ", dtype_name(g.out), " M=", g.M, " N=", g.N, " K=", g.K,
      g.batch > 1 ? detail::concat(" batch=", g.batch) : std::string(), " (A", g.trans_a ? "ᵀ" : "",
      " ld ", g.lda, ", B", g.trans_b ? "ᵀ" : "", " ld ", g.ldb, ", C ld ", g.ldc,
      ", beta=", g.beta, g.c_source && g.c_source != g.c ? ", C apart from D" : "",
      g.allow_tf32 && g.in == DType::kF32 ? ", tf32" : "", ")");
}

std::string describe(const LinearCall& call, const LtProblem& p) {
  return detail::concat(gemm_name(call.gemm), ' ', dtype_name(call.dtype), " N=", call.N,
                        " in=", call.in, " out=", call.out, " (m=", p.m, " n=", p.n, " k=", p.k,
                        ", transa=", p.transa == LtOp::kT ? 'T' : 'N',
                        " transb=", p.transb == LtOp::kT ? 'T' : 'N', ", beta=", p.beta,
                        p.compute == LtCompute::k32FFastTF32 ? ", tf32" : "", ")");
}

}  // namespace ft::cuda
