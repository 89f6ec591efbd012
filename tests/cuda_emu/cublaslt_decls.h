// The subset of cuBLASLt's API (types, enum values, prototypes) that lt_gemm.cpp and the
// emulated cuBLASLt use, for machines without the CUDA toolkit: cublaslt_emu.h takes the real
// <cublasLt.h> when it is installed and this file otherwise, so the emulated GEMM path builds
// and runs in CI with g++ alone. Names and numeric values are cuBLASLt's (CUDA 13); where the
// real header is present, cublaslt_decls_check.cpp compares every value and struct layout
// declared here with it at compile time.
//
// FT_CUBLASLT_DECLS_TYPES_ONLY leaves out the prototypes (the check includes this file inside
// a namespace beside the real header, where C functions of the same names would clash).
#pragma once

#include <cstddef>
#include <cstdint>

// library_types.h
typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_32F = 0,
  CUDA_R_16BF = 14,
} cudaDataType;

// cublas_api.h
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;

// driver_types.h
typedef struct CUstream_st* cudaStream_t;

// cublasLt.h
typedef struct cublasLtContext* cublasLtHandle_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  uint64_t data[32];
} cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

typedef enum { CUBLASLT_POINTER_MODE_HOST = 0 } cublasLtPointerMode_t;

typedef enum { CUBLASLT_ORDER_COL = 0 } cublasLtOrder_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,
  CUBLASLT_MATRIX_LAYOUT_LD = 4,
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_TRANSC = 5,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
} cublasLtMatmulDescAttributes_t;

typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1 } cublasLtEpilogue_t;

typedef enum { CUBLASLT_SEARCH_BEST_FIT = 0 } cublasLtMatmulSearch_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

#ifndef FT_CUBLASLT_DECLS_TYPES_ONLY
extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);
size_t cublasLtGetVersion(void);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle,
                                       cublasLtMatmulDesc_t operationDesc,
                                       cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                       cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
}  // extern "C"
#endif
