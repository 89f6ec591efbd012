// cuBLASLt calls for lt_gemm.h. Per call: find the problem's cached descriptors and algorithm
// (created and chosen the first time the problem is seen: the heuristic's first, timed among
// its candidates, or taken from the record of an earlier run: LtChoice), then one
// cublasLtMatmul on the caller's stream with the caller's workspace.
#include "runtime/cuda/lt_gemm.h"

// The emulated build (FT_CUDA_EMU) links the emulated cuBLASLt (tests/cuda_emu/cublaslt_emu.cpp,
// a test tool) against the same declarations.
#include <cublasLt.h>

#if !defined(FT_CUDA_EMU)
#include <dlfcn.h>
#endif

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace ft::cuda {

namespace {

// cuBLASLt is loaded when the first LtGemm is made (a CUDA device's ops), not when a process
// starts: the library is half a gigabyte, and loading it costs a process about 70 ms and 210 MB
// of resident memory (its relocations, measured with Debian's python3 loading it through ctypes
// on this project's build machine), which `ft plan`, `ft validate`, the shard-check child, and
// every rank of a CPU job would otherwise pay for nothing. The functions used, once each:
#define FT_LT_FUNCTIONS(X)                \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetStatusName)                \
  X(cublasLtGetVersion)                   \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoCheck)              \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)
struct LtApi {
#define FT_LT_MEMBER(f) decltype(&::f) f = nullptr;
  FT_LT_FUNCTIONS(FT_LT_MEMBER)
#undef FT_LT_MEMBER
};

// The table, filled on first use. The emulated build (a test tool) takes the emulated functions
// it links; the real one opens the toolkit's libcublasLt.so.<major> by the loader's search
// (ft's RUNPATH holds the toolkit's library folder, as for libcudart).
LtApi load_lt_api() {
  LtApi api;
#if defined(FT_CUDA_EMU)
#define FT_LT_SET(f) api.f = &::f;
  FT_LT_FUNCTIONS(FT_LT_SET)
#undef FT_LT_SET
#else
  const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    throw Error(detail::concat("cannot load ", name,
                               " (cuBLASLt, the CUDA backend's GEMMs): ", dlerror(),
                               "; the CUDA toolkit's library folder must be on the loader's path "
                               "(ldconfig, or LD_LIBRARY_PATH)"));
#define FT_LT_SET(f)                                                                  \
  api.f = reinterpret_cast<decltype(&::f)>(dlsym(lib, #f));                           \
  if (!api.f)                                                                         \
    throw Error(detail::concat(name, " has no ", #f, " (a cuBLASLt older than CUDA ", \
                               CUBLAS_VER_MAJOR, "?)"));
  FT_LT_FUNCTIONS(FT_LT_SET)
#undef FT_LT_SET
#endif
  return api;
}

// Loaded once per process; a failed load throws and is tried again by the next caller.
const LtApi& lt() {
  static const LtApi api = load_lt_api();
  return api;
}

}  // namespace

// lt_layout.h's enums carry CUDA's values, so they convert by cast.
static_assert(static_cast<int>(LtOp::kN) == CUBLAS_OP_N);
static_assert(static_cast<int>(LtOp::kT) == CUBLAS_OP_T);
static_assert(static_cast<int>(LtType::kF32) == CUDA_R_32F);
static_assert(static_cast<int>(LtType::kF16) == CUDA_R_16F);
static_assert(static_cast<int>(LtType::kBF16) == CUDA_R_16BF);
static_assert(static_cast<int>(LtCompute::k32F) == CUBLAS_COMPUTE_32F);
static_assert(static_cast<int>(LtCompute::k32FFastTF32) == CUBLAS_COMPUTE_32F_FAST_TF32);

namespace {

cudaDataType_t cuda_type(LtType t) { return static_cast<cudaDataType_t>(t); }

// cuBLASLt's heuristic assumes 256-byte aligned buffers unless told less; a sub-matrix (a
// tensor-parallel slice, a micro-batch offset) can be aligned to as little as its element size,
// and an algorithm chosen for 256 bytes may then fail or read wrongly. So the alignment each
// pointer actually has is both a preference of the heuristic and part of the cache key.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);  // the largest power of two dividing the address
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

size_t type_bytes(LtType t) { return t == LtType::kF32 ? 4 : 2; }

// The alignment every matrix of a batch has: that of its first address and its stride in bytes.
uint32_t alignment(const LtMatrix& m) {
  const auto a = reinterpret_cast<uintptr_t>(m.ptr);
  if (a == 0 || m.batch <= 1) return alignment(m.ptr);
  const auto stride = static_cast<uintptr_t>(m.batch_stride) * type_bytes(m.type);
  return alignment(reinterpret_cast<const void*>(a | stride));
}

std::string status_text(cublasStatus_t s) {
  return detail::concat(lt().cublasLtGetStatusName(s), " (", lt().cublasLtGetStatusString(s), ")");
}

// Everything the algorithm choice depends on; pointers enter only through their alignment.
struct Key {
  int32_t transa, transb, compute;
  int64_t m, n, k;
  int32_t ta, tb, tc, td;
  int64_t lda, ldb, ldc, ldd;
  int32_t batch;
  int64_t stride_a, stride_b, stride_c;
  bool beta_nonzero;
  uint32_t align_a, align_b, align_c, align_d;
  auto operator<=>(const Key&) const = default;
};

Key key_of(const LtProblem& p) {
  return Key{static_cast<int32_t>(p.transa),
             static_cast<int32_t>(p.transb),
             static_cast<int32_t>(p.compute),
             p.m,
             p.n,
             p.k,
             static_cast<int32_t>(p.A.type),
             static_cast<int32_t>(p.B.type),
             static_cast<int32_t>(p.C.type),
             static_cast<int32_t>(p.D.type),
             p.A.ld,
             p.B.ld,
             p.C.ld,
             p.D.ld,
             p.D.batch,
             p.A.batch_stride,
             p.B.batch_stride,
             p.D.batch_stride,
             p.beta != 0.0f,
             alignment(p.A),
             alignment(p.B),
             alignment(p.C),
             alignment(p.D)};
}

// The record (LtChoice): a header of two lines, then one line per choice: the key's fields in
// Key's order, ':', the algorithm's 8 words in hex, the time it took in ms (-1: not measured).
constexpr const char* kRecordMagic = "ft-gemm-algos 1";
constexpr size_t kKeyFields = 23;

std::array<int64_t, kKeyFields> fields_of(const Key& k) {
  return {k.transa,       k.transb,  k.compute, k.m,        k.n,        k.k,
          k.ta,           k.tb,      k.tc,      k.td,       k.lda,      k.ldb,
          k.ldc,          k.ldd,     k.batch,   k.stride_a, k.stride_b, k.stride_c,
          k.beta_nonzero, k.align_a, k.align_b, k.align_c,  k.align_d};
}

Key key_from(const std::array<int64_t, kKeyFields>& f) {
  auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  return Key{i32(f[0]),  i32(f[1]),  i32(f[2]),  f[3],       f[4],      f[5],
             i32(f[6]),  i32(f[7]),  i32(f[8]),  i32(f[9]),  f[10],     f[11],
             f[12],      f[13],      i32(f[14]), f[15],      f[16],     f[17],
             f[18] != 0, u32(f[19]), u32(f[20]), u32(f[21]), u32(f[22])};
}

// One entry line (with its newline).
std::string record_line(const Key& k, const cublasLtMatmulAlgo_t& algo, float ms) {
  std::ostringstream o;
  for (int64_t v : fields_of(k)) o << v << ' ';
  o << ':';
  char word[24];
  for (uint64_t w : algo.data) {
    std::snprintf(word, sizeof word, " %" PRIx64, w);
    o << word;
  }
  o << ' ' << ms << '\n';
  return o.str();
}

// Parses an entry line; false when it is not one (a torn last line after a crash, an edit).
bool parse_record_line(const std::string& line, Key* k, cublasLtMatmulAlgo_t* algo) {
  std::istringstream in(line);
  std::array<int64_t, kKeyFields> f{};
  for (int64_t& v : f)
    if (!(in >> v)) return false;
  char colon = 0;
  if (!(in >> colon) || colon != ':') return false;
  for (uint64_t& w : algo->data)
    if (!(in >> std::hex >> w)) return false;
  float ms = 0;
  if (!(in >> std::dec >> ms)) return false;
  *k = key_from(f);
  return fields_of(*k) == f;  // every field in its type's range
}

// The descriptors and algorithm of one problem, created once and reused for every call.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destroy calls only free host memory; their status is of no use in a destructor.
    if (d) lt().cublasLtMatrixLayoutDestroy(d);
    if (c) lt().cublasLtMatrixLayoutDestroy(c);
    if (b) lt().cublasLtMatrixLayoutDestroy(b);
    if (a) lt().cublasLtMatrixLayoutDestroy(a);
    if (desc) lt().cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

struct LtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool allow_tf32 = false;
  LtChoice choice;
  std::string record_header;  // the record's second line: this GPU and cuBLASLt
  std::mutex mu;  // guards what follows (one LtGemm may serve more than one host thread)
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, cublasLtMatmulAlgo_t> recorded;  // read from the record, not yet used
  std::FILE* record_out = nullptr;               // the record, open for appending once written
  size_t measured = 0, from_record = 0;

  ~Impl() {
    plans.clear();
    if (record_out) std::fclose(record_out);
    if (handle) lt().cublasLtDestroy(handle);
  }

  // The record's folder, made when missing (the run's output_dir exists; the record sits in a
  // folder of its own below it), at start: an output_dir that cannot take it is refused before
  // any work, not at the first GEMM.
  void make_record_dir() const {
    const size_t slash = choice.record.rfind('/');
    if (slash == std::string::npos || slash == 0) return;
    const std::string dir = choice.record.substr(0, slash);
    if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
      FT_FAIL("cannot create ", dir, ": ", std::strerror(errno),
              " (runtime.gemm_algos: measure keeps its choices there)");
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      FT_FAIL(dir, " is not a folder (runtime.gemm_algos: measure keeps its choices there)");
    if (::access(dir.c_str(), W_OK) != 0)
      FT_FAIL("cannot write in ", dir, ": ", std::strerror(errno),
              " (runtime.gemm_algos: measure keeps its choices there)");
    // The record itself, where one exists, must be a file this run can read and extend.
    if (::stat(choice.record.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      FT_FAIL(choice.record, " is not a regular file (runtime.gemm_algos: measure keeps its",
              " choices there; remove it)");
  }

  // Reads the record's choices when it is this GPU's and library's; else leaves it to be
  // replaced (with a warning: the bits of a resumed run may then differ from its original).
  void read_record() {
    std::ifstream in(choice.record);
    if (!in) return;  // none yet
    std::string magic, header, line;
    std::getline(in, magic);
    std::getline(in, header);
    if (magic != kRecordMagic || header != record_header) {
      log_warn("cuBLASLt algorithms: ", choice.record, " was written ",
               magic != kRecordMagic ? std::string("by something else")
                                     : "for " + header.substr(header.find(' ') + 1),
               "; measuring afresh for ", record_header.substr(record_header.find(' ') + 1),
               " (a resumed run's GEMMs may then round differently from the run it continues)");
      return;
    }
    int number = 2;
    while (std::getline(in, line)) {
      ++number;
      Key k;
      cublasLtMatmulAlgo_t algo;
      if (parse_record_line(line, &k, &algo)) {
        recorded[k] = algo;
        continue;
      }
      // An append cut short by a crash is the last line, without its newline: that choice is
      // measured again. Anything else is damage worth a word.
      if (!in.eof())
        log_warn("cuBLASLt algorithms: ", choice.record, ":", number,
                 " is not a record line; that problem is measured again");
    }
    in.close();
    // The file is this GPU's: later choices are appended to it, after the last whole line (a
    // torn one is cut off).
    std::string text;
    {
      std::ifstream all(choice.record, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(all), std::istreambuf_iterator<char>());
    }
    if (!text.empty() && text.back() != '\n' &&
        ::truncate(choice.record.c_str(), off_t(text.rfind('\n') + 1)) != 0)
      FT_FAIL("cannot cut the torn last line off ", choice.record, ": ", std::strerror(errno));
    record_out = std::fopen(choice.record.c_str(), "a");
    if (!record_out)
      FT_FAIL("cannot append to ", choice.record, ": ", std::strerror(errno),
              " (runtime.gemm_algos: measure keeps its choices there)");
  }

  // Appends one choice durably (a crash right after it keeps it).
  void append_record(const Key& k, const cublasLtMatmulAlgo_t& algo, float ms) {
    if (choice.record.empty()) return;
    if (!record_out) {  // a new record (its folder made at start): header first
      record_out = std::fopen(choice.record.c_str(), "w");
      if (!record_out)
        FT_FAIL("cannot write ", choice.record, ": ", std::strerror(errno),
                " (runtime.gemm_algos: measure keeps its choices there)");
      std::fprintf(record_out, "%s\n%s\n", kRecordMagic, record_header.c_str());
    }
    const std::string line = record_line(k, algo, ms);
    std::fputs(line.c_str(), record_out);
    if (std::fflush(record_out) != 0 || ::fsync(::fileno(record_out)) != 0)
      FT_FAIL("cannot write ", choice.record, ": ", std::strerror(errno));
  }

  // Fails with the product and the status; `hint` says what to try.
  static void check(cublasStatus_t s, const char* fn, const GemmCall& call, const LtProblem& p,
                    const char* hint) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    FT_FAIL(fn, " failed for the ", describe(call), " [cuBLASLt m=", p.m, " n=", p.n, " k=", p.k,
            ", transa=", p.transa == LtOp::kT ? 'T' : 'N',
            " transb=", p.transb == LtOp::kT ? 'T' : 'N', "]: ", status_text(s), ". ", hint);
  }

  // The index of the fastest of the n candidates on this call's operands (each run once to warm
  // up, then kTimedRuns times, the least time kept in *best_ms), 0 and -1 ms when none could be
  // timed. An accumulating in-place output is saved to scratch first and put back at the end
  // (the tries add to it meanwhile, which changes no timing), and no scratch means no
  // measuring. Other outputs are written whole by every run (D = alpha·AB, or + beta·C from a C
  // apart from D). Either way the real call that follows leaves the chosen algorithm's bits.
  int fastest(const Plan& plan, const LtProblem& p, const cublasLtMatmulHeuristicResult_t* cand,
              int n, void* stream, float* best_ms) {
    constexpr int kTimedRuns = 3;
    FT_CHECK(
        choice.time_ms && choice.alloc && choice.free && choice.copy,
        "runtime.gemm_algos: measure without the GPU's timers (a bug: an incomplete LtChoice)");
    *best_ms = -1.0f;
    const bool in_place = p.beta != 0.0f && p.C.ptr == p.D.ptr;
    const LtMatrix& d = p.D;
    const size_t bytes =
        in_place ? size_t((d.batch - 1) * d.batch_stride + d.ld * (d.cols - 1) + d.rows) *
                       type_bytes(d.type)
                 : 0;
    void* saved = in_place ? choice.alloc(bytes) : nullptr;
    if (in_place && !saved) return 0;  // no room to keep the output: the heuristic's first
    void* out = const_cast<void*>(d.ptr);
    if (in_place) choice.copy(saved, out, bytes, stream);
    int best = 0;
    float best_t = std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) {
      if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > workspace_bytes)
        continue;
      float t = std::numeric_limits<float>::infinity();
      bool ok = true;
      for (int rep = 0; rep <= kTimedRuns && ok; ++rep) {
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        const float ms = choice.time_ms(stream, [&] {
          st = lt().cublasLtMatmul(handle, plan.desc, &p.alpha, p.A.ptr, plan.a, p.B.ptr, plan.b,
                                   &p.beta, p.C.ptr, plan.c, out, plan.d, &cand[i].algo, workspace,
                                   workspace_bytes, static_cast<cudaStream_t>(stream));
        });
        ok = st == CUBLAS_STATUS_SUCCESS;
        if (rep > 0) t = std::min(t, ms);
      }
      if (ok && t < best_t) best = i, best_t = t;
    }
    if (in_place) {
      choice.time_ms(stream, [&] { choice.copy(out, saved, bytes, stream); });  // done before free
      choice.free(saved, bytes);
    }
    if (best_t != std::numeric_limits<float>::infinity()) *best_ms = best_t;
    return best;
  }

  const Plan& plan_for(const GemmCall& call, const LtProblem& p, void* stream) {
    const Key key = key_of(p);
    std::lock_guard<std::mutex> lk(mu);
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;

    const char* bad_desc = "A descriptor attribute has the wrong type or size (a bug in lt_gemm).";
    auto plan = std::make_unique<Plan>();
    check(lt().cublasLtMatmulDescCreate(&plan->desc, static_cast<cublasComputeType_t>(p.compute),
                                        cuda_type(p.scale_type)),
          "cublasLtMatmulDescCreate", call, p, bad_desc);
    const int32_t ta = static_cast<int32_t>(p.transa), tb = static_cast<int32_t>(p.transb);
    check(lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                              sizeof ta),
          "cublasLtMatmulDescSetAttribute(TRANSA)", call, p, bad_desc);
    check(lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                              sizeof tb),
          "cublasLtMatmulDescSetAttribute(TRANSB)", call, p, bad_desc);
    auto layout = [&](cublasLtMatrixLayout_t* out, const LtMatrix& mat, const char* name) {
      const char* bad_layout = "The layout is invalid: a bug in lt_layout's map_gemm.";
      check(
          lt().cublasLtMatrixLayoutCreate(out, cuda_type(mat.type), static_cast<uint64_t>(mat.rows),
                                          static_cast<uint64_t>(mat.cols), mat.ld),
          name, call, p, bad_layout);
      if (mat.batch <= 1) return;
      const int32_t count = mat.batch;
      const int64_t stride = mat.batch_stride;
      check(lt().cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count),
            name, call, p, bad_layout);
      check(lt().cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride),
            name, call, p, bad_layout);
    };
    layout(&plan->a, p.A, "cublasLtMatrixLayoutCreate(A)");
    layout(&plan->b, p.B, "cublasLtMatrixLayoutCreate(B)");
    layout(&plan->c, p.C, "cublasLtMatrixLayoutCreate(C)");
    layout(&plan->d, p.D, "cublasLtMatrixLayoutCreate(D)");

    cublasLtMatmulPreference_t pref = nullptr;
    check(lt().cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", call, p,
          "Out of host memory?");
    // The preference is only needed for the query; destroy it however the query ends.
    struct PrefGuard {
      cublasLtMatmulPreference_t p;
      ~PrefGuard() { lt().cublasLtMatmulPreferenceDestroy(p); }
    } guard{pref};
    const uint64_t ws = workspace_bytes;
    check(lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", call, p, bad_desc);
    const uint32_t align[4] = {key.align_a, key.align_b, key.align_c, key.align_d};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      check(lt().cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i],
                                                      sizeof align[i]),
            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", call, p, bad_desc);

    // An earlier run's choice (the record), when cuBLASLt still accepts it for this problem.
    if (auto r = recorded.find(key); r != recorded.end()) {
      cublasLtMatmulHeuristicResult_t checked{};
      const cublasStatus_t st = lt().cublasLtMatmulAlgoCheck(
          handle, plan->desc, plan->a, plan->b, plan->c, plan->d, &r->second, &checked);
      const cublasLtMatmulAlgo_t algo = r->second;
      recorded.erase(r);
      if (st == CUBLAS_STATUS_SUCCESS && checked.workspaceSize <= workspace_bytes) {
        plan->algo = algo;
        ++from_record;
        return *plans.emplace(key, std::move(plan)).first->second;
      }
      log_warn("cuBLASLt algorithms: the recorded choice for the ", describe(call), " in ",
               choice.record, " is refused (", status_text(st), "); measuring it again");
    }

    cublasLtMatmulHeuristicResult_t results[LtChoice::kLtCandidates]{};
    int found = 0;
    check(lt().cublasLtMatmulAlgoGetHeuristic(
              handle, plan->desc, plan->a, plan->b, plan->c, plan->d, pref,
              choice.measure ? LtChoice::kLtCandidates : 1, results, &found),
          "cublasLtMatmulAlgoGetHeuristic", call, p,
          "cuBLASLt has no algorithm for these types on this GPU (bf16 needs sm_80 or newer).");
    const cublasLtMatmulHeuristicResult_t& result = results[0];
    if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
      FT_FAIL("cublasLtMatmulAlgoGetHeuristic found no algorithm for the ", describe(call),
              " with a ", workspace_bytes, "-byte workspace and alignments ", key.align_a, '/',
              key.align_b, '/', key.align_c, '/', key.align_d,
              " bytes (A/B/C/D). A larger cuBLASLt workspace or 16-byte aligned buffers may help.");
    // Each workspaceSize is at most ours (MAX_WORKSPACE_BYTES).
    if (!choice.measure) {
      plan->algo = result.algo;
    } else {
      float ms = -1.0f;
      const int pick = fastest(*plan, p, results, found, stream, &ms);
      plan->algo = results[pick].algo;
      ++measured;
      append_record(key, plan->algo, ms);
    }
    return *plans.emplace(key, std::move(plan)).first->second;
  }

  void run(const GemmCall& call, void* stream) {
    const LtProblem p = map_gemm(call);
    if (p.m == 0 || p.n == 0) return;  // an empty output: nothing to write
    if (p.k == 0) {
      // D = beta · C: in place with beta = 1 that leaves D as it is (a dW of zero tokens).
      // Zero-filling D for beta = 0, or copying a C apart from D into it, would need work on the
      // stream; no layer has in = 0.
      FT_CHECK(p.beta == 1.0f, "cuBLASLt ", describe(call),
               ": an inner dimension of 0 with a non-accumulating output is not supported");
      FT_CHECK(p.C.ptr == p.D.ptr, "cuBLASLt ", describe(call),
               ": an inner dimension of 0 with a residual apart from the output is not supported");
      return;
    }
    const Plan& plan = plan_for(call, p, stream);
    check(
        lt().cublasLtMatmul(handle, plan.desc, &p.alpha, p.A.ptr, plan.a, p.B.ptr, plan.b, &p.beta,
                            p.C.ptr, plan.c, const_cast<void*>(p.D.ptr), plan.d, &plan.algo,
                            workspace, workspace_bytes, static_cast<cudaStream_t>(stream)),
        "cublasLtMatmul", call, p,
        "Check that every buffer is device memory of the current GPU and large enough.");
  }
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes, bool allow_tf32, LtChoice choice)
    : impl_(std::make_unique<Impl>()) {
  impl_->workspace = workspace;
  impl_->workspace_bytes = workspace ? workspace_bytes : 0;
  impl_->allow_tf32 = allow_tf32;
  impl_->choice = std::move(choice);
  const cublasStatus_t s = lt().cublasLtCreate(&impl_->handle);
  if (s != CUBLAS_STATUS_SUCCESS)
    FT_FAIL("cublasLtCreate failed: ", status_text(s),
            ". Is a CUDA device visible (nvidia-smi) and its driver as new as the CUDA runtime?");
  impl_->record_header =
      detail::concat("device ", impl_->choice.device, ", cuBLASLt ", lt().cublasLtGetVersion(),
                     ", workspace ", impl_->workspace_bytes);
  if (!impl_->choice.record.empty()) {
    impl_->make_record_dir();
    impl_->read_record();
  }
}

LtGemm::~LtGemm() = default;

void LtGemm::linear(LinearCall call, void* stream) {
  FT_CHECK(call.N >= 0 && call.in >= 0 && call.out >= 0,
           "cuBLASLt linear: negative size N=", call.N, " in=", call.in, " out=", call.out);
  call.allow_tf32 = impl_->allow_tf32;
  impl_->run(linear_gemm(call), stream);
}

void LtGemm::gemm(GemmCall call, void* stream) {
  call.allow_tf32 = impl_->allow_tf32;
  impl_->run(call, stream);
}

namespace {

// y (N, out) = x (N, in) · Wᵀ, not yet accumulating.
LinearCall forward_call(void* y, const void* x, const void* W, DType t, int N, int in, int out) {
  LinearCall call;
  call.gemm = LinearGemm::kForward;
  call.dtype = t;
  call.out_ptr = y;
  call.a = x;
  call.b = W;
  call.N = N;
  call.in = in;
  call.out = out;
  return call;
}

}  // namespace

void LtGemm::linear_forward(void* y, const void* x, const void* W, DType t, int N, int in, int out,
                            bool accumulate, void* stream) {
  LinearCall call = forward_call(y, x, W, t, N, in, out);
  call.accumulate = accumulate;
  linear(call, stream);
}

void LtGemm::linear_forward_residual(void* y, const void* r, const void* x, const void* W, DType t,
                                     int N, int in, int out, void* stream) {
  LinearCall call = forward_call(y, x, W, t, N, in, out);
  call.accumulate = true;
  call.residual = r;
  linear(call, stream);
}

void LtGemm::linear_backward(void* dx, float* dW, const void* dy, const void* x, const void* W,
                             DType t, int N, int in, int out, bool accumulate_dx, void* stream) {
  LinearCall call;
  call.dtype = t;
  call.N = N;
  call.in = in;
  call.out = out;
  call.a = dy;
  if (dx) {
    call.gemm = LinearGemm::kBackwardData;
    call.out_ptr = dx;
    call.b = W;
    call.accumulate = accumulate_dx;
    linear(call, stream);
  }
  if (dW) {
    call.gemm = LinearGemm::kBackwardWeight;
    call.out_ptr = dW;
    call.b = x;
    call.accumulate = true;
    linear(call, stream);
  }
}

size_t LtGemm::cached_problems() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->plans.size();
}

size_t LtGemm::measured_problems() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->measured;
}

size_t LtGemm::recorded_problems() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->from_record;
}

size_t LtGemm::workspace_bytes() const { return impl_->workspace_bytes; }

}  // namespace ft::cuda
