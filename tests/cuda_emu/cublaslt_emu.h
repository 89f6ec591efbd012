// Emulated cuBLASLt (a test tool, never a claim about a GPU): host definitions of the cuBLASLt
// functions lib/runtime/cuda/lt_gemm.cpp calls, linked instead of libcublasLt in the emulated
// build (FT_CUDA_EMU) so CI runs lt_gemm without a GPU. Declared by the real <cublasLt.h> where
// the CUDA toolkit is installed (g++ compiles it without the library), else by
// cublaslt_decls.h (FT_CUBLASLT_EMU_OWN_DECLS; checked against the real header where both are).
//
// cublasLtMatmul is a naive reference GEMM that reads the descriptors exactly as cuBLASLt
// defines them: column-major layouts (rows, cols as stored, column stride ld), op(A) and op(B)
// from TRANSA / TRANSB, D = alpha·op(A)·op(B) + beta·C with C not read when beta == 0, data
// types fp32 / bf16 / fp16 with fp32 accumulation (inputs rounded to TF32 under
// CUBLAS_COMPUTE_32F_FAST_TF32) and one rounding to D's type. It is stricter than the library
// where the library's behaviour is undefined: it refuses layouts that do not fit m, n, k,
// attribute buffers of the wrong size, an algorithm used with other descriptors than the ones
// it was chosen for, pointers (of any matrix of a batch) less aligned than the heuristic was
// told, D overlapping A or B,
// C == D with different layouts, and a workspace smaller than the algorithm asked for (it
// writes that many bytes, so ASan catches a short buffer).
// "Device" pointers are host pointers; the stream is ignored and every call completes at once.
//
// Supported: cublasLtCreate/Destroy, GetStatusName/String, MatmulDescCreate/Destroy/
// SetAttribute (COMPUTE_TYPE, SCALE_TYPE, POINTER_MODE host, TRANSA, TRANSB, TRANSC = N,
// EPILOGUE default), MatrixLayoutCreate/Destroy/SetAttribute (TYPE, ORDER col, ROWS, COLS, LD,
// BATCH_COUNT, STRIDED_BATCH_OFFSET: strided batches of one count on A, B, C and D, strides
// positive), MatmulPreferenceCreate/Destroy/SetAttribute (SEARCH_MODE best fit,
// MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_A/B/C/D_BYTES), MatmulAlgoGetHeuristic, MatmulAlgoCheck,
// Matmul, GetVersion. Anything else returns CUBLAS_STATUS_NOT_SUPPORTED with the reason in
// cublaslt_emu_last_error().
//
// Algorithms: the heuristic offers kCublasLtEmuAlgos, in order, as the library offers several
// that round differently: algorithm v splits k into 2^v consecutive parts, each summed in fp32
// from zero, the parts then added in order (as a split-k kernel reduces). Algorithm 0 (one
// part) is the plain k-order sum, what the heuristic's first always was. So a caller that
// keeps one algorithm per problem gets the same bits every call, and one that mixes them up
// (a measured choice not restored on resume) is seen in the bits.
#pragma once

#ifdef FT_CUBLASLT_EMU_OWN_DECLS
#include "tests/cuda_emu/cublaslt_decls.h"
#else
#include <cublasLt.h>
#endif

#include <cstdint>
#include <string>

namespace ft::cuda_emu {

struct CublasLtEmuStats {
  uint64_t heuristic_queries = 0;  // cublasLtMatmulAlgoGetHeuristic calls
  uint64_t matmuls = 0;            // cublasLtMatmul calls that computed
};
CublasLtEmuStats cublaslt_emu_stats();

// Why the last failing call failed (the library only returns a status); empty after success.
std::string cublaslt_emu_last_error();

// The workspace the emulated algorithms ask for, capped by MAX_WORKSPACE_BYTES: non-zero, so
// the workspace plumbing is exercised.
constexpr size_t kCublasLtEmuWorkspaceBytes = 4096;
constexpr int kCublasLtEmuAlgos = 3;
// What cublasLtGetVersion answers (no library's: a record of choices names it).
constexpr size_t kCublasLtEmuVersion = 999999;

}  // namespace ft::cuda_emu
