// See lt_layout.h for the derivation of each mapping.
#include "runtime/cuda/lt_layout.h"

#include "core/error.h"

namespace ft::cuda {
namespace {

const char* gemm_name(LinearGemm g) {
  switch (g) {
    case LinearGemm::kForward: return "forward";
    case LinearGemm::kBackwardData: return "backward dx";
    case LinearGemm::kBackwardWeight: return "backward dW";
  }
  return "?";
}

LtType lt_type(DType t, LinearGemm g) {
  switch (t) {
    case DType::kF32: return LtType::kF32;
    case DType::kBF16: return LtType::kBF16;
    case DType::kF16: return LtType::kF16;
    default:
      FT_FAIL("cuBLASLt linear ", gemm_name(g), ": element type ", dtype_name(t),
              " is not a compute dtype (F32, BF16 or F16); the precision policy should never "
              "pass it here");
  }
}

// A row-major (r, c) matrix with row stride c, read column-major: (c, r) with ld c.
LtMatrix row_major(const void* ptr, LtType type, int r, int c) {
  LtMatrix m;
  m.ptr = ptr;
  m.type = type;
  m.rows = c;
  m.cols = r;
  m.ld = c;
  return m;
}

}  // namespace

LtProblem map_linear(const LinearCall& call) {
  FT_CHECK(call.N >= 0 && call.in >= 0 && call.out >= 0, "cuBLASLt linear ", gemm_name(call.gemm),
           ": negative size N=", call.N, " in=", call.in, " out=", call.out);
  const LtType t = lt_type(call.dtype, call.gemm);
  LtProblem p;
  // Inputs in fp32 with runtime.tf32: cuBLASLt may round them to TF32 (10-bit mantissa) for
  // tensor cores; 16-bit inputs already run on tensor cores with exact fp32 products.
  p.compute = (t == LtType::kF32 && call.allow_tf32) ? LtCompute::k32FFastTF32 : LtCompute::k32F;
  p.scale_type = LtType::kF32;
  p.alpha = 1.0f;
  switch (call.gemm) {
    case LinearGemm::kForward:
      // yᵀ (out, N) = op_T(W stored (in, out)) · x stored (in, N)
      p.transa = LtOp::kT;
      p.transb = LtOp::kN;
      p.m = call.out;
      p.n = call.N;
      p.k = call.in;
      p.A = row_major(call.b, t, call.out, call.in);
      p.B = row_major(call.a, t, call.N, call.in);
      p.D = row_major(call.out_ptr, t, call.N, call.out);
      p.beta = call.accumulate ? 1.0f : 0.0f;
      break;
    case LinearGemm::kBackwardData:
      // dxᵀ (in, N) = W stored (in, out) · dy stored (out, N)
      p.transa = LtOp::kN;
      p.transb = LtOp::kN;
      p.m = call.in;
      p.n = call.N;
      p.k = call.out;
      p.A = row_major(call.b, t, call.out, call.in);
      p.B = row_major(call.a, t, call.N, call.out);
      p.D = row_major(call.out_ptr, t, call.N, call.in);
      p.beta = call.accumulate ? 1.0f : 0.0f;
      break;
    case LinearGemm::kBackwardWeight:
      // dWᵀ (in, out) += x stored (in, N) · op_T(dy stored (out, N)); dW is fp32 whatever the
      // compute dtype (gradients are reduced and stepped in fp32) and always accumulates.
      p.transa = LtOp::kN;
      p.transb = LtOp::kT;
      p.m = call.in;
      p.n = call.out;
      p.k = call.N;
      p.A = row_major(call.b, t, call.N, call.in);
      p.B = row_major(call.a, t, call.N, call.out);
      p.D = row_major(call.out_ptr, LtType::kF32, call.out, call.in);
      p.beta = 1.0f;
      break;
  }
  p.C = p.D;  // in place: C is read only when beta != 0
  return p;
}

std::string describe(const LinearCall& call, const LtProblem& p) {
  return detail::concat(gemm_name(call.gemm), ' ', dtype_name(call.dtype), " N=", call.N,
                        " in=", call.in, " out=", call.out, " (m=", p.m, " n=", p.n, " k=", p.k,
                        ", transa=", p.transa == LtOp::kT ? 'T' : 'N',
                        " transb=", p.transb == LtOp::kT ? 'T' : 'N', ", beta=", p.beta,
                        p.compute == LtCompute::k32FFastTF32 ? ", tf32" : "", ")");
}

}  // namespace ft::cuda
