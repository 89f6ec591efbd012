// Emulated cuBLASLt: see cublaslt_emu.h. Descriptor state lives inside the library's own
// semi-opaque structs (memcpy'd in and out), tagged so a wrong or destroyed handle is caught.
#include "tests/cuda_emu/cublaslt_emu.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/half.h"

struct cublasLtContext {
  uint32_t magic;
};

// The CUDA emulation's stream order (cuda_emu.h), where the program links it (ft_emu and the
// kernel tests do; lt_gemm_cuda_emu_tests, on host memory, does not: its calls run at once).
namespace ft::emu {
[[gnu::weak]] bool valid_stream_handle(const void* s);
[[gnu::weak]] bool stream_submit(const void* s, std::function<void()> op);
}  // namespace ft::emu

namespace {

constexpr uint32_t kHandleMagic = 0x4c74486e, kDescMagic = 0x4c744465, kLayoutMagic = 0x4c744c79,
                   kPrefMagic = 0x4c745072, kAlgoMagic = 0x4c74416c;

std::atomic<uint64_t> g_heuristic_queries{0}, g_matmuls{0};
thread_local std::string g_last_error;

cublasStatus_t fail(cublasStatus_t s, std::string why) {
  g_last_error = std::move(why);
  return s;
}
cublasStatus_t ok() {
  g_last_error.clear();
  return CUBLAS_STATUS_SUCCESS;
}

struct DescState {
  uint32_t magic;
  int32_t compute, scale, pointer_mode, transa, transb, transc;
  uint32_t epilogue;
};
struct LayoutState {
  uint32_t magic;
  uint32_t type;
  int32_t order, batch_count;
  uint64_t rows, cols;
  int64_t ld;
  int64_t batch_stride;  // elements from one matrix of a strided batch to the next
};
struct PrefState {
  uint32_t magic, search_mode;
  uint64_t max_workspace;
  uint32_t align[4];  // A, B, C, D
};
static_assert(sizeof(DescState) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutState) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(PrefState) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

template <typename S, typename O>
bool load(const O* o, uint32_t magic, S* s) {
  if (!o) return false;
  std::memcpy(s, o->data, sizeof(S));
  return s->magic == magic;
}
template <typename S, typename O>
void store(O* o, const S& s) {
  std::memcpy(o->data, &s, sizeof(S));
}

// Copies an attribute value of exactly the size the library stores (it checks the same).
template <typename V>
bool take(const void* buf, size_t bytes, V* out) {
  if (!buf || bytes != sizeof(V)) return false;
  std::memcpy(out, buf, sizeof(V));
  return true;
}

size_t type_size(uint32_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F:
      return 2;
    default:
      return 0;
  }
}

const char* type_name(uint32_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    default:
      return "an unsupported cudaDataType";
  }
}

// The problem a set of descriptors defines, after the checks cuBLASLt makes (and a few where
// the library's behaviour would be undefined).
struct Problem {
  DescState desc;
  LayoutState a, b, c, d;
  uint64_t m, n, k;
};

cublasStatus_t resolve(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                       cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                       Problem* p) {
  if (!load(desc, kDescMagic, &p->desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor missing or destroyed");
  const char* names[4] = {"A", "B", "C", "D"};
  LayoutState* ls[4] = {&p->a, &p->b, &p->c, &p->d};
  cublasLtMatrixLayout_t hs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i) {
    if (!load(hs[i], kLayoutMagic, ls[i]))
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string("layout of ") + names[i] + " missing or destroyed");
    if (ls[i]->order != CUBLASLT_ORDER_COL)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  std::string("layout of ") + names[i] + ": the emulator runs column-major only");
    if (ls[i]->batch_count < 1 || ls[i]->batch_count != ls[0]->batch_count)
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string("layout of ") + names[i] + ": batch count " +
                      std::to_string(ls[i]->batch_count) + " (A has " +
                      std::to_string(ls[0]->batch_count) +
                      "; the emulator needs the same count >= 1 on A, B, C and D)");
    if (ls[i]->batch_count > 1 && ls[i]->batch_stride <= 0)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  std::string("layout of ") + names[i] + ": batch stride " +
                      std::to_string(ls[i]->batch_stride) +
                      " (the emulator refuses broadcast and negative strides, whose support "
                      "cuBLASLt does not document)");
    if (ls[i]->rows == 0 || ls[i]->cols == 0 || ls[i]->ld < static_cast<int64_t>(ls[i]->rows))
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string("layout of ") + names[i] + ": rows " + std::to_string(ls[i]->rows) +
                      ", cols " + std::to_string(ls[i]->cols) + ", ld " +
                      std::to_string(ls[i]->ld) + " (needs rows, cols > 0, ld >= rows)");
  }
  const DescState& s = p->desc;
  if (s.pointer_mode != CUBLASLT_POINTER_MODE_HOST || s.epilogue != CUBLASLT_EPILOGUE_DEFAULT ||
      s.transc != CUBLAS_OP_N)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "the emulator supports host alpha/beta, the default epilogue and TRANSC = N");
  const bool ta = s.transa == CUBLAS_OP_T, tb = s.transb == CUBLAS_OP_T;
  if ((!ta && s.transa != CUBLAS_OP_N) || (!tb && s.transb != CUBLAS_OP_N))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "TRANSA / TRANSB must be N or T");
  p->m = p->d.rows;
  p->n = p->d.cols;
  p->k = ta ? p->a.rows : p->a.cols;
  if ((ta ? p->a.cols : p->a.rows) != p->m || (tb ? p->b.cols : p->b.rows) != p->k ||
      (tb ? p->b.rows : p->b.cols) != p->n || p->c.rows != p->m || p->c.cols != p->n)
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "layouts do not fit: D is " + std::to_string(p->m) + "x" + std::to_string(p->n) +
                    ", op(A) " + std::to_string(ta ? p->a.cols : p->a.rows) + "x" +
                    std::to_string(p->k) + ", op(B) " + std::to_string(tb ? p->b.cols : p->b.rows) +
                    "x" + std::to_string(tb ? p->b.rows : p->b.cols));
  // The type combinations cuBLASLt lists for CUBLAS_COMPUTE_32F[_FAST_TF32] with fp32 scale.
  const bool tf32 = s.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (s.compute != CUBLAS_COMPUTE_32F && !tf32)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "compute type must be CUBLAS_COMPUTE_32F[_FAST_TF32]");
  if (s.scale != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "scale type must be CUDA_R_32F");
  const uint32_t in = p->a.type, out = p->d.type;
  const bool combo = p->b.type == in && p->c.type == out && type_size(in) &&
                     (out == in || out == CUDA_R_32F) && (!tf32 || in == CUDA_R_32F);
  if (!combo)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                std::string("type combination A ") + type_name(p->a.type) + ", B " +
                    type_name(p->b.type) + ", C " + type_name(p->c.type) + ", D " +
                    type_name(p->d.type) + (tf32 ? " with TF32" : "") + " is not supported");
  return CUBLAS_STATUS_SUCCESS;
}

// A fingerprint of the problem, stored in the algorithm so Matmul can tell it is used with the
// descriptors it was chosen for (FNV-1a over the resolved state).
uint64_t fingerprint(const Problem& p) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* v, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(v);
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  for (const int32_t* f : {&p.desc.compute, &p.desc.scale, &p.desc.transa, &p.desc.transb})
    mix(f, sizeof *f);
  for (const LayoutState* l : {&p.a, &p.b, &p.c, &p.d}) {
    mix(&l->type, sizeof l->type);
    mix(&l->rows, sizeof l->rows);
    mix(&l->cols, sizeof l->cols);
    mix(&l->ld, sizeof l->ld);
    mix(&l->batch_count, sizeof l->batch_count);
    mix(&l->batch_stride, sizeof l->batch_stride);
  }
  return h;
}

float load_elem(const void* base, uint32_t type, uint64_t idx) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[idx];
    case CUDA_R_16BF:
      return ft::to_f32(static_cast<const ft::bf16*>(base)[idx]);
    default:
      return ft::to_f32(static_cast<const ft::f16*>(base)[idx]);
  }
}

void store_elem(void* base, uint32_t type, uint64_t idx, float v) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(base)[idx] = v;
      break;
    case CUDA_R_16BF:
      static_cast<ft::bf16*>(base)[idx] = ft::to_bf16(v);
      break;
    default:
      static_cast<ft::f16*>(base)[idx] = ft::to_f16(v);
      break;
  }
}

// fp32 -> TF32 (10 explicit mantissa bits), round to nearest with ties away from zero, as the
// tensor cores' conversion; NaN and infinity pass unchanged.
float to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// The bytes a column-major matrix (every matrix of its batch) spans: [first, last element + 1).
std::pair<uintptr_t, uintptr_t> extent(const void* ptr, const LayoutState& l) {
  const auto lo = reinterpret_cast<uintptr_t>(ptr);
  const uint64_t elems = (l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows +
                         uint64_t(l.batch_count - 1) * uint64_t(l.batch_stride);
  return {lo, lo + elems * type_size(l.type)};
}

const void* batch_ptr(const void* base, const LayoutState& l, int32_t i) {
  return static_cast<const char*>(base) + size_t(i) * size_t(l.batch_stride) * type_size(l.type);
}

uint32_t alignment_of(const void* ptr) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

// The product itself, run in stream order (defined after the API).
void run_matmul(const Problem& p, uint64_t parts, float alpha, float beta, const void* A_p,
                const void* B_p, const void* C_p, void* D_p);

}  // namespace

namespace ft::cuda_emu {
CublasLtEmuStats cublaslt_emu_stats() { return {g_heuristic_queries.load(), g_matmuls.load()}; }
std::string cublaslt_emu_last_error() { return g_last_error; }
}  // namespace ft::cuda_emu

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null handle pointer");
  *handle = new cublasLtContext{kHandleMagic};
  return ok();
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle || handle->magic != kHandleMagic)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: not a live handle");
  handle->magic = 0;
  delete handle;
  return ok();
}

const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    default:
      return "emulated cuBLASLt error";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!desc) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescCreate: null pointer");
  *desc = new cublasLtMatmulDescOpaque_t{};
  store(*desc, DescState{kDescMagic, compute, scale, CUBLASLT_POINTER_MODE_HOST, CUBLAS_OP_N,
                         CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT});
  return ok();
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  DescState s;
  if (!load(desc, kDescMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescDestroy: not a live descriptor");
  s.magic = 0;
  store(desc, s);
  delete desc;
  return ok();
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  DescState s;
  if (!load(desc, kDescMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: not a live descriptor");
  bool good;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      good = take(buf, bytes, &s.compute);
      break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      good = take(buf, bytes, &s.scale);
      break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      good = take(buf, bytes, &s.pointer_mode);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
      good = take(buf, bytes, &s.transa);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      good = take(buf, bytes, &s.transb);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSC:
      good = take(buf, bytes, &s.transc);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      good = take(buf, bytes, &s.epilogue);
      break;
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "MatmulDescSetAttribute: attribute " + std::to_string(attr) + " is not emulated");
  }
  if (!good)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: attribute " +
                                                 std::to_string(attr) + " given " +
                                                 std::to_string(bytes) + " bytes");
  store(desc, s);
  return ok();
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutCreate: null pointer");
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  store(*layout, LayoutState{kLayoutMagic, static_cast<uint32_t>(type), CUBLASLT_ORDER_COL, 1, rows,
                             cols, ld, 0});
  return ok();
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  LayoutState s;
  if (!load(layout, kLayoutMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutDestroy: not a live layout");
  s.magic = 0;
  store(layout, s);
  delete layout;
  return ok();
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  LayoutState s;
  if (!load(layout, kLayoutMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutSetAttribute: not a live layout");
  bool good;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      good = take(buf, bytes, &s.type);
      break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      good = take(buf, bytes, &s.order);
      break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      good = take(buf, bytes, &s.rows);
      break;
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      good = take(buf, bytes, &s.cols);
      break;
    case CUBLASLT_MATRIX_LAYOUT_LD:
      good = take(buf, bytes, &s.ld);
      break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      good = take(buf, bytes, &s.batch_count);
      break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      good = take(buf, bytes, &s.batch_stride);
      break;
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "MatrixLayoutSetAttribute: attribute " +
                                                   std::to_string(attr) + " is not emulated");
  }
  if (!good)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatrixLayoutSetAttribute: attribute " +
                                                 std::to_string(attr) + " given " +
                                                 std::to_string(bytes) + " bytes");
  store(layout, s);
  return ok();
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceCreate: null pointer");
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  // The library's defaults: best fit, no workspace, 256-byte alignment assumed.
  store(*pref, PrefState{kPrefMagic, CUBLASLT_SEARCH_BEST_FIT, 0, {256, 256, 256, 256}});
  return ok();
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  PrefState s;
  if (!load(pref, kPrefMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceDestroy: not a live preference");
  s.magic = 0;
  store(pref, s);
  delete pref;
  return ok();
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  PrefState s;
  if (!load(pref, kPrefMagic, &s))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceSetAttribute: not a live preference");
  bool good;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      good = take(buf, bytes, &s.search_mode) && s.search_mode == CUBLASLT_SEARCH_BEST_FIT;
      break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      good = take(buf, bytes, &s.max_workspace);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      good = take(buf, bytes, &s.align[0]);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      good = take(buf, bytes, &s.align[1]);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      good = take(buf, bytes, &s.align[2]);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      good = take(buf, bytes, &s.align[3]);
      break;
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, "MatmulPreferenceSetAttribute: attribute " +
                                                   std::to_string(attr) + " is not emulated");
  }
  if (!good)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceSetAttribute: attribute " +
                                                 std::to_string(attr) + " given " +
                                                 std::to_string(bytes) +
                                                 " bytes or a value "
                                                 "the emulator does not support");
  store(pref, s);
  return ok();
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (!handle || handle->magic != kHandleMagic)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "AlgoGetHeuristic: not a live handle");
  if (requested <= 0 || !results || !returned)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "AlgoGetHeuristic: requestedAlgoCount <= 0");
  PrefState ps;
  if (!load(pref, kPrefMagic, &ps))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "AlgoGetHeuristic: not a live preference");
  ++g_heuristic_queries;
  *returned = 0;
  Problem p;
  if (const cublasStatus_t s = resolve(desc, A, B, C, D, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  for (uint32_t a : ps.align)
    if (a == 0 || (a & (a - 1)) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  "AlgoGetHeuristic: alignment " + std::to_string(a) + " is not a power of 2");
  // The naive loop of cublasLtMatmul below, its k split into 1, 2, 4, ... parts (data[7]).
  const int n = std::min(requested, ft::cuda_emu::kCublasLtEmuAlgos);
  for (int v = 0; v < n; ++v) {
    cublasLtMatmulHeuristicResult_t& r = results[v];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo.data[0] = kAlgoMagic;
    r.algo.data[1] = fingerprint(p);
    for (int i = 0; i < 4; ++i) r.algo.data[2 + i] = ps.align[i];
    r.workspaceSize =
        std::min<uint64_t>(ps.max_workspace, ft::cuda_emu::kCublasLtEmuWorkspaceBytes);
    r.algo.data[6] = r.workspaceSize;
    r.algo.data[7] = uint64_t(v);
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returned = n;
  return ok();
}

// As the library: the algorithm must be one of this emulator's and chosen for these descriptors
// (alignment needs the pointers, so only cublasLtMatmul can check it).
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                       cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  if (!handle || handle->magic != kHandleMagic)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "AlgoCheck: not a live handle");
  if (!algo || !result) return fail(CUBLAS_STATUS_INVALID_VALUE, "AlgoCheck: a null pointer");
  Problem p;
  if (const cublasStatus_t s = resolve(desc, A, B, C, D, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo->data[0] != kAlgoMagic || algo->data[7] >= uint64_t(ft::cuda_emu::kCublasLtEmuAlgos))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "AlgoCheck: not an algorithm of this emulator");
  if (algo->data[1] != fingerprint(p))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "AlgoCheck: the algorithm was chosen for other descriptors");
  const cublasLtMatmulAlgo_t copy = *algo;  // algo may point into *result
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = copy;
  result->workspaceSize = copy.data[6];
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return ok();
}

size_t cublasLtGetVersion(void) { return ft::cuda_emu::kCublasLtEmuVersion; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha_p, const void* A_p, cublasLtMatrixLayout_t A,
                              const void* B_p, cublasLtMatrixLayout_t B, const void* beta_p,
                              const void* C_p, cublasLtMatrixLayout_t C, void* D_p,
                              cublasLtMatrixLayout_t D, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!handle || handle->magic != kHandleMagic)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "Matmul: not a live handle");
  Problem p;
  if (const cublasStatus_t s = resolve(desc, A, B, C, D, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  // The library picks an algorithm itself when algo is null; lt_gemm always passes one, and
  // the emulator insists, so a missing heuristic step cannot hide here.
  if (!algo || algo->data[0] != kAlgoMagic)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: no algorithm from AlgoGetHeuristic");
  if (algo->data[1] != fingerprint(p))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "Matmul: the algorithm was chosen for other descriptors (types, transposes, "
                "shapes or lds differ)");
  if (algo->data[7] >= uint64_t(ft::cuda_emu::kCublasLtEmuAlgos))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: not an algorithm of this emulator");
  const uint64_t parts = uint64_t(1) << algo->data[7];
  const void* ptrs[4] = {A_p, B_p, C_p, D_p};
  const char* names = "ABCD";
  const LayoutState* layouts[4] = {&p.a, &p.b, &p.c, &p.d};
  for (int i = 0; i < 4; ++i)
    for (int32_t b = 0; b < p.d.batch_count && ptrs[i]; ++b) {
      const uint32_t have = alignment_of(batch_ptr(ptrs[i], *layouts[i], b));
      if (have < algo->data[2 + i])
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    std::string("Matmul: ") + names[i] + " (matrix " + std::to_string(b) +
                        " of the batch) is " + std::to_string(have) +
                        "-byte aligned but the algorithm was chosen for " +
                        std::to_string(algo->data[2 + i]) + " bytes");
    }
  const size_t ws_needed = algo->data[6];
  if (workspace_bytes < ws_needed || (ws_needed && !workspace))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "Matmul: the algorithm needs a " + std::to_string(ws_needed) +
                    "-byte workspace, given " + std::to_string(workspace_bytes));
  if (!alpha_p || !beta_p || !A_p || !B_p || !D_p)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: a null pointer");
  // In place (C == D) needs one layout for both; D overlapping an input is undefined in the
  // library (its tiles would read what others already wrote), so the emulator refuses it.
  if (C_p == D_p &&
      (p.c.ld != p.d.ld || p.c.type != p.d.type || p.c.batch_stride != p.d.batch_stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: C == D with different layouts");
  const auto [d_lo, d_hi] = extent(D_p, p.d);
  for (auto [ptr, l, name] : {std::tuple{A_p, &p.a, "A"}, std::tuple{B_p, &p.b, "B"}}) {
    const auto [lo, hi] = extent(ptr, *l);
    if (lo < d_hi && d_lo < hi)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("Matmul: D overlaps ") + name);
  }
  // Host scalars are read when the call is made, the matrices when the stream runs it.
  const float alpha = *static_cast<const float*>(alpha_p);
  const float beta = *static_cast<const float*>(beta_p);
  if (beta != 0.0f && !C_p) return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: C null, beta != 0");
  if (ft::emu::valid_stream_handle && !ft::emu::valid_stream_handle(stream))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: not a live stream");
  ++g_matmuls;
  auto op = [=] {
    if (ws_needed) std::memset(workspace, 0xA5, ws_needed);  // touch it: ASan checks the size
    run_matmul(p, parts, alpha, beta, A_p, B_p, C_p, D_p);
  };
  if (!ft::emu::stream_submit)
    op();
  else if (!ft::emu::stream_submit(stream, op))
    return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                "Matmul: the stream's capture refuses it (legacy stream beside a blocking "
                "capture, or an invalidated capture)");
  return ok();
}

}  // extern "C"

namespace {

// D = alpha op(A) op(B) + beta C, as the checked call described it.
void run_matmul(const Problem& p, uint64_t parts, float alpha, float beta, const void* A_p,
                const void* B_p, const void* C_p, void* D_p) {
  const bool ta = p.desc.transa == CUBLAS_OP_T, tb = p.desc.transb == CUBLAS_OP_T;
  const bool tf32 = p.desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  std::vector<float> out(p.m * p.n);
  for (int32_t batch = 0; batch < p.d.batch_count; ++batch) {
    const void* a_p = batch_ptr(A_p, p.a, batch);
    const void* b_p = batch_ptr(B_p, p.b, batch);
    const void* c_p = C_p ? batch_ptr(C_p, p.c, batch) : nullptr;
    void* d_p = const_cast<void*>(batch_ptr(D_p, p.d, batch));
    // Column-major element (i, j) of a stored matrix is at i + j·ld.
    auto in_a = [&](uint64_t i, uint64_t l) {  // op(A)(i, l)
      const float v = load_elem(a_p, p.a.type, ta ? l + i * p.a.ld : i + l * p.a.ld);
      return tf32 ? to_tf32(v) : v;
    };
    auto in_b = [&](uint64_t l, uint64_t j) {  // op(B)(l, j)
      const float v = load_elem(b_p, p.b.type, tb ? j + l * p.b.ld : l + j * p.b.ld);
      return tf32 ? to_tf32(v) : v;
    };
    // All of D is computed before any is stored, so C may alias D (in place), as in the library.
    for (uint64_t j = 0; j < p.n; ++j)
      for (uint64_t i = 0; i < p.m; ++i) {
        // fp32 accumulation, as CUBLAS_COMPUTE_32F: per part of k, then the parts in order.
        const uint64_t span = (p.k + parts - 1) / parts;
        float acc = 0.0f;
        for (uint64_t l0 = 0; l0 < p.k; l0 += span) {
          float part = 0.0f;
          for (uint64_t l = l0; l < std::min(p.k, l0 + span); ++l) part += in_a(i, l) * in_b(l, j);
          acc = l0 == 0 ? part : acc + part;
        }
        float v = alpha * acc;
        if (beta != 0.0f) v += beta * load_elem(c_p, p.c.type, i + j * p.c.ld);  // unread at 0
        out[i + j * p.m] = v;
      }
    for (uint64_t j = 0; j < p.n; ++j)
      for (uint64_t i = 0; i < p.m; ++i)
        store_elem(d_p, p.d.type, i + j * p.d.ld, out[i + j * p.m]);
  }
}

}  // namespace
