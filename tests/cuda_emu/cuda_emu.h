// CUDA emulation, a TEST TOOL: lets g++ compile kernels/cuda/*.cu (with -DFT_CUDA_EMU, through
// kernels/cuda/common.cuh) and run them on the CPU, so CI executes the CUDA kernels without a GPU.
// It says nothing about speed on a GPU and does not model the GPU's memory system.
//
// Execution model:
//   - Each CUDA thread is a fiber (a register-only context switch on x86-64, ucontext elsewhere)
//     with its own stack; the blocks of a grid run one after another, the threads of a block
//     interleave only at synchronisation points (__syncthreads, __syncwarp, shuffles, ballots,
//     atomics). Between two such points a thread runs alone, so a race shows up only as a
//     dependence on the order threads are resumed in, and a thread spinning on a flag that
//     another thread sets never ends.
//   - The schedule seed (env FT_CUDA_EMU_SEED, or set_seed) picks that order: seed 0 resumes
//     threads in index order and runs blocks in index order; any other seed draws both from a
//     pseudo-random generator, so a kernel whose result depends on the order (a missing barrier,
//     a float atomic) gives different results under different seeds.
//   - `__shared__` is `static`: one instance per declaration, shared by the threads of the block
//     that runs. That is per block because blocks never interleave (one block's fibers finish
//     before the next block starts) and launches are serialised by a process-wide mutex. Static
//     shared memory is NOT reset between blocks (a kernel reading it before writing sees the
//     previous block's values); dynamic shared memory is filled with 0xff bytes (NaN for every
//     float type, -1 for integers) before each block, so such reads show up there.
//   - Reported misuse, as ft::emu::Error (kernel, block, thread, what), thrown by the launch
//     after every fiber has unwound:
//       * __syncthreads: threads of a block waiting at different __syncthreads (a barrier in a
//         divergent branch), a thread exiting while others wait at a barrier, or a barrier
//         reached after a thread of the block exited (an early return before a barrier);
//       * warp operations (__syncwarp, __shfl*_sync, __ballot_sync, __all/__any_sync): a mask
//         without the calling lane, naming a lane that does not exist or has exited, lanes
//         meeting with different overlapping masks or different operations, a shuffle reading
//         a lane outside the mask, a width that is not a power of two up to 32;
//       * mma / ldmatrix (kernels/cuda/warp_matrix.cuh; warp collectives, .sync.aligned): a
//         warp short of 32 lanes or with an exited lane, lanes at different call sites or with
//         different qualifiers, an ldmatrix row address not 16-byte aligned or outside the
//         launch's dynamic shared memory (static __shared__ is not recognised);
//       * cp.async: a size other than 4, 8, 16 (.cg: 16), src-size outside [0, size], an address
//         not aligned to the size, a destination outside dynamic shared memory, a source outside
//         GPU memory or changed before the copy completed, and a thread exiting with copies
//         never waited for. Copies are performed at the wait_group / wait_all that covers them
//         (not at __syncthreads), so shared memory read before holds its old bytes;
//       * deadlock: no thread can run while some wait (e.g. lanes at a shuffle whose partner
//         waits at a barrier);
//       * an exception escaping the kernel;
//       * a pointer argument that is neither null nor inside (or one past) a cudaMalloc or
//         cudaMallocHost allocation: a host pointer handed to a kernel (thrown at launch).
//     Bad launch configurations (empty grid, more than 1024 threads, too much shared memory)
//     set the last error (cudaErrorInvalidConfiguration / cudaErrorInvalidValue) as the runtime
//     does, for FT_CUDA_CHECK_LAUNCH to find.
//   - Out-of-bounds accesses to global, dynamic shared or static shared memory are ASan's job:
//     build with -fsanitize=address (the fibers carry ASan's fiber annotations).
//
// Device code may use: __global__/__device__/__host__/__forceinline__, threadIdx/blockIdx/
// blockDim/gridDim, warpSize, __syncthreads, __syncwarp, __shfl_sync/_up/_down/_xor, __ballot_sync,
// __all_sync, __any_sync, __activemask, integer atomics, kernels/cuda/warp_matrix.cuh (mma.sync
// m16n8k16 bf16/f16 -> f32, ldmatrix x1/x2/x4 and .trans, cp.async with commit/wait),
// kernels/cuda/hopper.cuh (mbarrier, TMA; hopper_emu.h, modelled as hopper_emu.cpp says), the math
// and bit-cast intrinsics declared below, and what cuda_bf16.h / cuda_fp16.h compile to for a host
// compiler: their host implementations of __float2bfloat16_rn, __bfloat162float, __float2half_rn,
// __half2float, the 2-wide forms (__floats2bfloat162_rn, __bfloat1622float2, __half22float2, ...),
// the bit casts (__bfloat16_as_ushort, __ushort_as_half, ...) and the __h* arithmetic, compiled
// by g++ without __CUDACC__ (tests/cuda_emu/test_convert.cpp checks the conversions' bits
// against core/half.h). No float atomics (determinism).
//
// The CUDA runtime API subset the backend uses is emulated on host memory (cuda_emu.cpp), against
// the real declarations of <cuda_runtime.h>. Work on a stream runs in stream order, deferred
// until something waits for it (FT_CUDA_EMU_STREAMS=deferred, the default; `eager` runs it
// when it is queued; cuda_emu.cpp, "stream order", says what each call waits for), so that a
// missing cudaStreamWaitEvent changes the bits a test compares. Copies and memsets check that their
// kind matches where the pointers live (cudaErrorInvalidValue otherwise); cudaMalloc'd bytes count
// against a fake device of FT_CUDA_EMU_MEMORY_MIB (default 16384) for cudaMemGetInfo and
// out-of-memory errors; FT_CUDA_EMU_PINNED_MIB (unlimited by default) limits cudaMallocHost's
// bytes, as a host's locked-memory limit does; FT_CUDA_EMU_DEVICES (default 1) sets the device
// count. The device calls itself "CUDA emulation (test tool)". FT_CUDA_EMU_LAUNCHES=1 prints each
// kernel's launch count to stderr at exit ("ft_emu launches: NAME COUNT"), for system tests that
// must know which kernels ran.
#pragma once
// kernels/cuda/common.cuh checks that the emulated build force-included this header.
#define FT_CUDA_EMU_HEADER_INCLUDED 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>  // the C math names in the global namespace, as device code calls them

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// Under g++ the CUDA headers define __shared__ as an empty attribute; here it is `static`.
#undef __shared__
#define __shared__ static
// Occupancy hints mean nothing here (the CUDA headers leave it undefined for host compilers).
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// ---- the execution model -----------------------------------------------------------------
namespace ft::emu {

// A misuse found while running a kernel (see the top of this file).
class Error : public std::runtime_error {
 public:
  Error(const std::string& kernel, dim3 block, dim3 thread, const std::string& what);
  const std::string& kernel() const { return kernel_; }
  dim3 block() const { return block_; }
  dim3 thread() const { return thread_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string kernel_;
  dim3 block_, thread_;
  std::string problem_;
};

// The schedule seed: FT_CUDA_EMU_SEED (default 0) until set_seed is called. set_seed also
// restarts the generator, so a sequence of launches after it is reproducible.
void set_seed(uint64_t seed);
uint64_t seed();

// The dynamic shared memory of the running launch (FT_DYNAMIC_SHARED).
void* dynamic_shared();

// For the emulated libraries beside the runtime (nccl_emu.cpp): is [p, p + n) inside one
// allocation a kernel may read (cudaMalloc, cudaMallocHost, cudaHostRegister; n 0: any p); is
// s the null, legacy or per-thread stream or a live one?
bool gpu_memory(const void* p, size_t n);
bool valid_stream_handle(const void* s);
// Queues `op` on stream s (a valid handle) in stream order (cuda_emu.cpp, "stream order"), or
// records it where s captures; false (nothing done) where the capture rules refuse it (the
// legacy stream beside a blocking capture, an invalidated capture).
bool stream_submit(const void* s, std::function<void()> op);
// Runs s's queued work and every later operation on s as it is queued (NCCL's streams); false
// (nothing done) while s is capturing.
bool stream_make_eager(const void* s);
// While s captures: records `op` (an NCCL call made again at each launch) as s's next node, and
// marks the graph as one that runs at its launch (cudaGraphLaunch); false (nothing done) where s
// does not capture or its capture refuses work.
bool stream_record_collective(const void* s, std::function<void()> op);

namespace detail {
struct LaunchConfig {
  const char* name;
  const void* kernel;
  dim3 grid, block;
  size_t shared_bytes;
  const void* stream;
  // The kernel's pointer arguments (index, value): each must be null or point into memory a
  // GPU can reach (cudaMalloc or cudaMallocHost, up to one past the end).
  const std::pair<int, const void*>* pointers = nullptr;
  int pointer_count = 0;
};
// Checks the launch (its configuration and pointers: cudaGetLastError or Error now) and queues
// `body(ctx)` as every thread of the grid on the launch's stream; the run throws Error on a
// report, from the call that runs it (the launch itself where the stream is eager).
void run_launch(const LaunchConfig& config, void (*body)(void*), std::shared_ptr<void> ctx);

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

// Warp operations: one entry point, values travel as 8 raw bytes.
enum class WarpOp {
  kSync,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAll,
  kAny,
  kMma,
  kLdmatrix
};
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                 const std::source_location& where);
// Returns the number of threads of the block that passed a non-zero `predicate`.
int syncthreads(int predicate, const std::source_location& where);
unsigned active_mask();
// Atomics, mbarrier arrivals and wgmma waits may be preempted here (seeded), as other threads may
// run first on a GPU.
void atomic_point();

// Values travel as their bytes (CUDA's __nv_bfloat162 / __half2 are not trivially copyable
// by the letter of C++, but are plain bits).
template <typename T>
uint64_t to_raw(const T& v) {
  static_assert(sizeof(T) <= 8, "warp shuffles move values of at most 8 bytes");
  uint64_t r = 0;
  std::memcpy(&r, static_cast<const void*>(&v), sizeof(T));
  return r;
}
template <typename T>
T from_raw(uint64_t r) {
  T v;
  std::memcpy(static_cast<void*>(&v), &r, sizeof(T));
  return v;
}
}  // namespace detail

// The warp-level matrix instructions and cp.async, for kernels/cuda/warp_matrix.cuh (its
// emulated build calls these; device code calls the header's functions, not these). mma and
// ldmatrix are warp collectives (.sync.aligned: the full warp, every lane at the same
// instruction); `where` is the call site, which identifies "the same instruction".
enum class MmaType { kBf16, kF16 };
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32; d may alias c.
void mma_m16n8k16(MmaType type, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], const std::source_location& where);
// ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16 into r[0..num).
void ldmatrix(int num, bool trans, uint32_t* r, const void* row_addr,
              const std::source_location& where);
// cp.async.{ca,cg}.shared.global: queued per thread, performed at the wait that covers its group.
void cp_async(void* smem, const void* gmem, int cp_size, int src_bytes, bool cg,
              const std::source_location& where);
void cp_async_commit();
// cp.async.wait_group n; n < 0: cp.async.wait_all.
void cp_async_wait(int n, const std::source_location& where);

// Launch(name, kernel, grid, block, shared_bytes, stream)(args...): FT_LAUNCH under the
// emulator. The arguments are converted to the kernel's parameter types once, as <<<>>> does.
template <typename... P>
class Launch {
 public:
  template <typename S>
  Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
         S stream)
      : config_{name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, nullptr},
        kernel_(kernel) {
    if constexpr (std::is_pointer_v<S>) config_.stream = stream;
  }

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "FT_LAUNCH: wrong number of kernel arguments");
    struct Ctx {
      void (*kernel)(P...);
      std::tuple<std::decay_t<P>...> params;
    };
    // On the heap: the launch may run after this call returns (deferred streams).
    auto held = std::make_shared<Ctx>(
        Ctx{kernel_, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
    Ctx& ctx = *held;
    std::pair<int, const void*> pointers[sizeof...(P) + 1];
    int count = 0;
    std::apply(
        [&](const auto&... p) {
          int index = 0;
          auto note = [&](const auto& v) {
            if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>)
              pointers[count++] = {index, static_cast<const void*>(v)};
            ++index;
          };
          (note(p), ...);
        },
        ctx.params);
    detail::LaunchConfig config = config_;
    config.pointers = pointers;
    config.pointer_count = count;
    detail::run_launch(
        config,
        [](void* c) {
          Ctx& k = *static_cast<Ctx*>(c);
          std::apply(k.kernel, k.params);  // a copy of the parameters per thread, as on a GPU
        },
        std::move(held));
  }

 private:
  detail::LaunchConfig config_;
  void (*kernel_)(P...);
};

}  // namespace ft::emu

// ---- what device code sees -----------------------------------------------------------------
#define threadIdx (::ft::emu::detail::thread_idx())
#define blockIdx (::ft::emu::detail::block_idx())
#define blockDim (::ft::emu::detail::block_dim())
#define gridDim (::ft::emu::detail::grid_dim())
// Not a macro: cudaDeviceProp has a member of that name.
inline constexpr int warpSize = 32;

inline void __syncthreads(const std::source_location& where = std::source_location::current()) {
  ::ft::emu::detail::syncthreads(0, where);
}
inline int __syncthreads_count(
    int predicate, const std::source_location& where = std::source_location::current()) {
  return ::ft::emu::detail::syncthreads(predicate != 0, where);
}
inline int __syncthreads_and(int predicate,
                             const std::source_location& where = std::source_location::current()) {
  return ::ft::emu::detail::syncthreads(predicate != 0, where) ==
         int(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int predicate,
                            const std::source_location& where = std::source_location::current()) {
  return ::ft::emu::detail::syncthreads(predicate != 0, where) > 0;
}
// Memory fences order a thread's writes on a GPU; threads here interleave only at
// synchronisation points, where all earlier writes are visible.
inline void __threadfence() {}
inline void __threadfence_block() {}
// Read-only cache loads are plain loads.
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       const std::source_location& where = std::source_location::current()) {
  ::ft::emu::detail::warp_op(::ft::emu::detail::WarpOp::kSync, mask, 0, 0, 32, where);
}
// The lanes of the caller's warp that exist and have not exited. Threads between
// synchronisation points run one at a time here, so lanes that a GPU would run converged may
// already have finished: do not build on __activemask beyond "which lanes can still be named".
inline unsigned __activemask() { return ::ft::emu::detail::active_mask(); }

// The shuffles take `width` before the source location, as CUDA's default argument.
#define FT_EMU_SHUFFLE(name, op)                                                                  \
  template <typename T>                                                                           \
  inline T name(unsigned mask, T var, int arg, int width = 32,                                    \
                const std::source_location& where = std::source_location::current()) {            \
    return ::ft::emu::detail::from_raw<T>(::ft::emu::detail::warp_op(                             \
        ::ft::emu::detail::WarpOp::op, mask, ::ft::emu::detail::to_raw(var), arg, width, where)); \
  }
FT_EMU_SHUFFLE(__shfl_sync, kShfl)
FT_EMU_SHUFFLE(__shfl_up_sync, kShflUp)
FT_EMU_SHUFFLE(__shfl_down_sync, kShflDown)
FT_EMU_SHUFFLE(__shfl_xor_sync, kShflXor)
#undef FT_EMU_SHUFFLE

inline unsigned __ballot_sync(unsigned mask, int pred,
                              const std::source_location& where = std::source_location::current()) {
  return unsigned(::ft::emu::detail::warp_op(::ft::emu::detail::WarpOp::kBallot, mask, pred != 0, 0,
                                             32, where));
}
inline int __all_sync(unsigned mask, int pred,
                      const std::source_location& where = std::source_location::current()) {
  return int(
      ::ft::emu::detail::warp_op(::ft::emu::detail::WarpOp::kAll, mask, pred != 0, 0, 32, where));
}
inline int __any_sync(unsigned mask, int pred,
                      const std::source_location& where = std::source_location::current()) {
  return int(
      ::ft::emu::detail::warp_op(::ft::emu::detail::WarpOp::kAny, mask, pred != 0, 0, 32, where));
}

// Integer atomics (returning the old value, as CUDA's). Float atomics are left out on purpose:
// kernels here reduce in a fixed order.
#define FT_EMU_ATOMICS(T)                    \
  inline T atomicAdd(T* p, T v) {            \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    *p = static_cast<T>(old + v);            \
    return old;                              \
  }                                          \
  inline T atomicSub(T* p, T v) {            \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    *p = static_cast<T>(old - v);            \
    return old;                              \
  }                                          \
  inline T atomicMax(T* p, T v) {            \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    *p = old < v ? v : old;                  \
    return old;                              \
  }                                          \
  inline T atomicMin(T* p, T v) {            \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    *p = v < old ? v : old;                  \
    return old;                              \
  }                                          \
  inline T atomicExch(T* p, T v) {           \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    *p = v;                                  \
    return old;                              \
  }                                          \
  inline T atomicCAS(T* p, T compare, T v) { \
    ::ft::emu::detail::atomic_point();       \
    const T old = *p;                        \
    if (old == compare) *p = v;              \
    return old;                              \
  }
FT_EMU_ATOMICS(int)
FT_EMU_ATOMICS(unsigned)
FT_EMU_ATOMICS(unsigned long long)
#undef FT_EMU_ATOMICS

// Bit casts and integer intrinsics.
inline float __int_as_float(int x) { return ::ft::emu::detail::from_raw<float>(uint32_t(x)); }
inline float __uint_as_float(unsigned x) { return ::ft::emu::detail::from_raw<float>(x); }
inline int __float_as_int(float x) { return int(uint32_t(::ft::emu::detail::to_raw(x))); }
inline unsigned __float_as_uint(float x) { return unsigned(::ft::emu::detail::to_raw(x)); }
inline double __longlong_as_double(long long x) { return ::ft::emu::detail::from_raw<double>(x); }
inline long long __double_as_longlong(double x) {
  return static_cast<long long>(::ft::emu::detail::to_raw(x));
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Math intrinsics g++ lacks. The fast ones (__expf, __logf) are approximate on a GPU and exact
// here: tests compare against the CPU reference with tolerances that cover the GPU's error.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dmul_rn(double x, double y) { return x * y; }
inline double __fma_rn(double x, double y, double z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }

// CUDA's device min/max overloads for same-typed arguments.
#define FT_EMU_MINMAX(T)                           \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
FT_EMU_MINMAX(int)
FT_EMU_MINMAX(unsigned)
FT_EMU_MINMAX(long)
FT_EMU_MINMAX(unsigned long)
FT_EMU_MINMAX(long long)
FT_EMU_MINMAX(unsigned long long)
#undef FT_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }  // CUDA's: fminf, fmaxf
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// The Hopper instructions (mbarrier, TMA, wgmma) for kernels/cuda/hopper.cuh.
#include "tests/cuda_emu/hopper_emu.h"
