// CUDA emulation (a test tool; see cuda_emu.h): the fiber scheduler that runs a grid, the warp
// and block synchronisation with its checks, and the CUDA runtime API subset on host memory.
#include "tests/cuda_emu/cuda_emu.h"

#include "tests/cuda_emu/emu_internal.h"

#include "core/asan.h"
#include "core/half.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if FT_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace ft::emu {
struct Capture;
// A stream's work in order (the stream order of cudaStreamWaitEvent, events and the legacy
// stream's implicit synchronisation: "Stream order" below). `started` counts the operations
// taken from the front; an operation is at most `enqueued` (its number from 1).
struct Queue : std::enable_shared_from_this<Queue> {
  std::deque<std::function<void()>> ops;
  uint64_t enqueued = 0, started = 0;
  bool legacy = false;   // the null / cudaStreamLegacy stream
  bool blocking = true;  // synchronises with the legacy stream (not cudaStreamNonBlocking)
  bool eager = false;    // runs each operation as it is queued (FT_CUDA_EMU_STREAMS=eager, NCCL)
  // Stream capture ("stream capture" below): the capture this stream records into, and the
  // nodes its next operation follows.
  std::shared_ptr<Capture> capture;
  std::vector<size_t> tail;
  // The first failure of its work (what an operation threw: a kernel's report) not yet raised;
  // sticky until the main thread's next synchronising call raises it ("stream order" below).
  std::exception_ptr error;
};
// A stream capture in progress, cudaStreamBeginCapture .. cudaStreamEndCapture: its streams'
// operations recorded as nodes (each with the nodes it follows) instead of queued.
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;  // the thread that began it (cudaStreamCaptureModeThreadLocal)
  std::weak_ptr<Queue> origin;
  std::vector<std::weak_ptr<Queue>> members;  // the origin and the streams that joined
  std::vector<std::function<void()>> nodes;
  std::vector<std::vector<size_t>> deps;
  cudaError_t invalid = cudaSuccess;  // the error that invalidated it
  bool ended = false;
  bool collectives = false;  // an emulated NCCL call recorded (stream_record_collective)
};
// One cudaEventRecord: done when its stream's work up to `seq` has run.
struct EventRecord {
  std::shared_ptr<Queue> queue;
  uint64_t seq = 0;
  bool done = false;
  std::chrono::steady_clock::time_point time;
  // Recorded in a capture: the nodes a wait on it follows (no queue, no seq).
  std::shared_ptr<Capture> capture;
  std::vector<size_t> nodes;
};
}  // namespace ft::emu

// The runtime's opaque handles (only declared by driver_types.h; cudart defines them).
struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<ft::emu::Queue> queue;
};
// A graph (cudaStreamEndCapture) and its executable (cudaGraphInstantiate): the captured nodes
// in recording order.
struct CUgraph_st {
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
  bool collectives = false;  // holds emulated NCCL calls: launched eagerly (cudaGraphLaunch)
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
  bool collectives = false;
};
struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<ft::emu::EventRecord> last;  // the latest record; null: never recorded
};

namespace ft::emu {

// ---- runtime state (the API itself is at the end of this file) -------------------------------
namespace {

// As the runtime: per host thread, returned and cleared by cudaGetLastError.
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

cudaError_t set_last_error(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

size_t env_size(const char* name, size_t fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  return *end == '\0' ? size_t(v) : fallback;
}

// The fake device's memory: FT_CUDA_EMU_MEMORY_MIB (default 16 GiB), so the allocator's out of
// memory path can be tested with a small value.
size_t total_memory() {
  static const size_t total = env_size("FT_CUDA_EMU_MEMORY_MIB", 16384) << 20;
  return total;
}
// A limit on page-locked host memory, as a host's locked-memory limit (ulimit -l) sets one:
// FT_CUDA_EMU_PINNED_MIB, unlimited when unset, so the failure's path can be tested.
size_t pinned_limit() {
  static const size_t limit = env_size("FT_CUDA_EMU_PINNED_MIB", SIZE_MAX >> 20) << 20;
  return limit;
}
int device_count() {
  static const int n = int(std::max<size_t>(1, env_size("FT_CUDA_EMU_DEVICES", 1)));
  return n;
}

constexpr size_t kDefaultSharedBytes = 48 << 10;  // without cudaFuncSetAttribute, as the GPU
constexpr size_t kOptinSharedBytes = 227 << 10;   // sm_90's opt-in limit per block

struct Runtime {
  std::mutex mutex;
  std::map<const char*, size_t> device;      // cudaMalloc'd ranges: base -> bytes
  std::map<const char*, size_t> pinned;      // cudaMallocHost'd ranges
  std::map<const char*, size_t> registered;  // cudaHostRegister'd ranges (the caller's memory)
  size_t device_bytes = 0;
  size_t pinned_bytes = 0;  // cudaMallocHost'd bytes live, against FT_CUDA_EMU_PINNED_MIB
  std::set<const CUstream_st*> streams;
  std::set<const CUevent_st*> events;
  std::map<const void*, size_t> max_shared;  // per kernel, set by cudaFuncSetAttribute
};
Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: frees may come from static destructors
  return *r;
}

// Is [p, p + n) inside one device allocation? (rt().mutex held)
bool in_device(const void* p, size_t n) {
  const auto& m = rt().device;
  const char* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + std::max<size_t>(it->second, 1);
}
bool touches_device(const void* p) { return in_device(p, 1); }

// Is [p, p + n) inside one allocation a kernel can read: cudaMalloc, cudaMallocHost or
// cudaHostRegister'd? (takes rt().mutex)
bool in_gpu_memory(const void* p, size_t n) {
  std::lock_guard<std::mutex> lock(rt().mutex);
  const char* c = static_cast<const char*>(p);
  for (const auto* m : {&rt().device, &rt().pinned, &rt().registered}) {
    auto it = m->upper_bound(c);
    if (it != m->begin() && c >= std::prev(it)->first &&
        c + n <= std::prev(it)->first + std::prev(it)->second)
      return true;
  }
  return false;
}

// Can a kernel be handed p: null, or in [base, base + size] of a device or pinned allocation?
bool kernel_reachable(const void* p) {
  if (!p) return true;
  std::lock_guard<std::mutex> lock(rt().mutex);
  const char* c = static_cast<const char*>(p);
  for (const auto* m : {&rt().device, &rt().pinned, &rt().registered}) {
    auto it = m->upper_bound(c);
    if (it != m->begin() && c <= std::prev(it)->first + std::prev(it)->second) return true;
  }
  return false;
}

size_t max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(rt().mutex);
  auto it = rt().max_shared.find(kernel);
  return it == rt().max_shared.end() ? kDefaultSharedBytes : it->second;
}

// The null stream, the legacy and per-thread handles, and live streams.
bool stream_is_valid(const void* s) {
  if (reinterpret_cast<uintptr_t>(s) <= 2) return true;
  std::lock_guard<std::mutex> lock(rt().mutex);
  return rt().streams.count(static_cast<const CUstream_st*>(s)) > 0;
}

// ---- stream order ---------------------------------------------------------------------------
// FT_CUDA_EMU_STREAMS=deferred (the default): work queued on a stream runs only when something
// needs it done: a synchronisation of its stream, or of an event recorded after it; another
// stream's cudaStreamWaitEvent on such an event, when that stream's work runs; an implicit
// device synchronisation (cudaDeviceSynchronize, cudaFree, cudaFreeHost, cudaHostUnregister);
// cudaStreamDestroy (that stream's work); work on the legacy stream (the null stream), which runs
// at once after the blocking streams' work (streams not made with cudaStreamNonBlocking); a copy to
// pageable host memory, which returns done. Each stream thus runs as late as what is waited on
// allows, so a missing cudaStreamWaitEvent shows as other bits: a consumer forced to run before its
// producer reads the old bytes, and a stream that runs after another overwrote what it was
// meant to read first reads the new ones. Streams that carry NCCL calls run eagerly
// (nccl_emu.cpp: ranks meet in them, and a call deferred on one rank would hang the others),
// so a read of NCCL's output without a wait goes unseen, and so does work that overwrites an NCCL
// call's input without waiting for the call; FT_CUDA_EMU_STREAMS=eager runs every operation when
// it is queued, as the emulation did before. Kernel errors of deferred work are thrown by the
// next synchronising call of the main thread (the thread that ran the static initialisers), as a
// GPU reports them at a synchronisation: when an operation fails its queue keeps the failure
// (the first one; the queue's later work still runs), and cudaStreamSynchronize, cudaStreamQuery,
// cudaEventSynchronize, cudaEventQuery, cudaDeviceSynchronize, a copy into pageable memory and
// any call that runs work at once (the legacy stream, eager streams) raise the oldest failure
// not yet raised, the original exception, from any queue, when made on the main thread outside
// stack unwinding. Work run by another thread (a checkpoint writer's synchronisation) or by
// cudaFree, cudaFreeHost, cudaHostUnregister and cudaStreamDestroy (which destructors call)
// raises nothing there; a destructor that synchronises a stream on the main thread
// (~CudaDevice) raises it, which ends the process with the report (std::terminate), as before.
// A failure never raised is printed at exit, which then fails. In a graph launch (one operation)
// a node that fails ends the launch: its later nodes do not run.
std::recursive_mutex& stream_mutex() {
  static auto* m = new std::recursive_mutex;
  return *m;
}
bool deferred_mode() {
  static const bool deferred = [] {
    const char* v = std::getenv("FT_CUDA_EMU_STREAMS");
    if (!v || !*v || std::string(v) == "deferred") return true;
    if (std::string(v) == "eager") return false;
    std::fprintf(stderr, "FT_CUDA_EMU_STREAMS=%s: expected deferred or eager\n", v);
    std::abort();
  }();
  return deferred;
}
std::vector<std::weak_ptr<Queue>>& all_queues() {
  static auto* v = new std::vector<std::weak_ptr<Queue>>;
  return *v;
}
std::shared_ptr<Queue> new_queue(bool blocking) {
  auto q = std::make_shared<Queue>();
  q->blocking = blocking;
  q->eager = !deferred_mode();
  all_queues().push_back(q);
  return q;
}
// The legacy stream runs its work at once (after the blocking streams'), so that a kernel
// launched on it reports at its launch, as the emulator's own tests expect.
const std::shared_ptr<Queue>& legacy_queue() {
  static auto* q = new std::shared_ptr<Queue>([] {
    auto l = new_queue(true);
    l->legacy = l->eager = true;
    return l;
  }());
  return *q;
}
const std::shared_ptr<Queue>& per_thread_queue() {
  static auto* q = new std::shared_ptr<Queue>(new_queue(true));
  return *q;
}
// The queue of a valid handle.
std::shared_ptr<Queue> queue_of(const void* s) {
  const uintptr_t h = reinterpret_cast<uintptr_t>(s);
  if (h <= 1) return legacy_queue();
  if (h == 2) return per_thread_queue();
  return static_cast<const CUstream_st*>(s)->queue;
}
// Queues whose work failed and whose failure is not raised yet, oldest failure first.
std::deque<std::shared_ptr<Queue>>& failed_queues() {
  static auto* v = new std::deque<std::shared_ptr<Queue>>;
  return *v;
}
const std::thread::id g_main_thread = std::this_thread::get_id();
// At exit: a failure nothing raised (no synchronisation on the main thread after it) would
// otherwise go unseen.
void report_unraised_failures() {
  if (failed_queues().empty()) return;
  for (const std::shared_ptr<Queue>& q : failed_queues()) {
    try {
      std::rethrow_exception(q->error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "CUDA emulation: a failure of deferred work never raised: %s\n",
                   e.what());
    } catch (...) {
      std::fprintf(stderr, "CUDA emulation: a failure of deferred work never raised\n");
    }
  }
  std::fflush(nullptr);
  std::_Exit(1);
}
// Runs q's work up to operation n (stream_mutex() held). A failure is kept on the queue.
void run_until(Queue& q, uint64_t n) {
  while (q.started < n) {
    std::function<void()> op = std::move(q.ops.front());
    q.ops.pop_front();
    ++q.started;
    try {
      op();
    } catch (...) {
      if (!q.error) {
        static const bool at_exit = std::atexit(report_unraised_failures) == 0;
        (void)at_exit;
        q.error = std::current_exception();
        failed_queues().push_back(q.shared_from_this());
      }
    }
  }
}
// After a synchronising call (stream_mutex() held): raises the oldest failure not yet raised,
// on the main thread outside stack unwinding; elsewhere the failure waits for such a call.
void raise_failure() {
  if (std::this_thread::get_id() != g_main_thread || std::uncaught_exceptions() > 0) return;
  auto& failed = failed_queues();
  if (failed.empty()) return;
  const std::shared_ptr<Queue> q = std::move(failed.front());
  failed.pop_front();
  std::rethrow_exception(std::exchange(q->error, nullptr));
}
void run_queue(Queue& q) { run_until(q, q.enqueued); }
// Every stream's work: an implicit device synchronisation.
void run_all() {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  auto& all = all_queues();
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i < all.size(); ++i)
      if (std::shared_ptr<Queue> q = all[i].lock(); q && q->started < q->enqueued) {
        run_queue(*q);
        again = true;
      }
  }
  std::erase_if(all, [](const std::weak_ptr<Queue>& w) { return w.expired(); });
}
// Queues `op` on stream s (a valid handle) and returns its number; runs it now where the stream
// is eager.
uint64_t submit(const void* s, std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  const std::shared_ptr<Queue> q = queue_of(s);
  if (q->capture) {  // recorded, not queued (the callers checked capture_gate)
    Capture& c = *q->capture;
    c.nodes.push_back(std::move(op));
    c.deps.push_back(q->tail);
    q->tail = {c.nodes.size() - 1};
    return 0;
  }
  if (q->legacy)
    for (const auto& w : all_queues())
      if (std::shared_ptr<Queue> b = w.lock(); b && b->blocking && !b->legacy) run_queue(*b);
  q->ops.push_back(std::move(op));
  const uint64_t n = ++q->enqueued;
  if (q->eager) {
    run_queue(*q);
    raise_failure();
  }
  return n;
}

// ---- stream capture ---------------------------------------------------------------------------
// cudaStreamBeginCapture .. cudaStreamEndCapture (the CUDA programming guide's stream capture):
// the operations queued on a capturing stream are recorded as graph nodes instead of queued;
// another stream joins the capture by waiting on an event recorded in it (a fork), and its work
// must be joined back into the origin stream (an event recorded on it that the origin waits on)
// before the capture ends. A graph launch runs its nodes in the order they were recorded (a
// topological order: a node follows only earlier ones), on the launching stream, re-running
// each kernel with the arguments it was captured with: a value that changes from step to step
// passed by value is replayed stale, as on a GPU, and must live in device memory instead.
// Reported as the runtime reports them (the call's error; the capture invalidated where the
// runtime invalidates it, after which its streams' calls answer
// cudaErrorStreamCaptureInvalidated and cudaStreamEndCapture gives no graph): a synchronisation
// of a capturing stream or of the device, a query or synchronisation of an event recorded in a
// capture (cudaErrorCapturedEvent), work on the legacy stream while a blocking stream captures
// (cudaErrorStreamCaptureImplicit), and in global mode (thread-local: on the capturing thread)
// cudaMalloc, cudaMallocHost, cudaFree, cudaFreeHost, cudaHostRegister / Unregister and a
// synchronisation or query of any other event (cudaErrorStreamCaptureUnsupported: under a global
// capture, another thread's cudaEventQuery fails and invalidates it, as PyTorch's NCCL watchdog
// found), a fork not joined at the end
// (cudaErrorStreamCaptureUnjoined), cudaStreamEndCapture on another stream than the origin
// (cudaErrorStreamCaptureUnmatched), cudaStreamEndCapture of a global or thread-local capture
// on another thread than the one that began it (cudaErrorStreamCaptureWrongThread), and
// cudaStreamIsCapturing of the legacy stream beside a blocking capture
// (cudaErrorStreamCaptureImplicit, not invalidating). The emulation's own stricter choices: a
// copy to or from pageable host memory in a capture (the bytes would be those of the capture,
// not of the replay) and a capturing stream's wait on an event recorded outside the capture
// (whatever cudaStreamWaitEvent's flags) are refused with cudaErrorStreamCaptureUnsupported /
// cudaErrorStreamCaptureIsolation (the capture invalidated); cudaMallocAsync / cudaFreeAsync on
// a capturing stream (the runtime's memory nodes), cudaStreamDestroy of a capturing stream and
// graph launches into a capture are refused with cudaErrorStreamCaptureUnsupported; NCCL
// collectives on a capturing stream are recorded as nodes that make the call at each launch
// (nccl_emu.cpp; stream_record_collective: such a graph runs at its launch, cudaGraphLaunch),
// and cuBLASLt matmuls the capture's state refuses fail (cublaslt_emu.cpp). Each call that records
// or queues work on a stream checks the stream's capture state and records or queues it under one
// hold of the streams' lock, so another thread's cudaStreamBeginCapture or cudaStreamEndCapture
// cannot come between the two (calls that queue nothing, cudaMallocAsync, cudaStreamSynchronize and
// cudaStreamDestroy, check apart).

// Every capture still recording, found from its streams (stream_mutex() held).
std::vector<std::shared_ptr<Capture>> active_captures() {
  std::vector<std::shared_ptr<Capture>> out;
  for (const auto& w : all_queues())
    if (std::shared_ptr<Queue> q = w.lock();
        q && q->capture && std::find(out.begin(), out.end(), q->capture) == out.end())
      out.push_back(q->capture);
  return out;
}
void invalidate(Capture& c, cudaError_t why) {
  if (c.invalid == cudaSuccess) c.invalid = why;
}
// A potentially unsafe call (the runtime's term: cudaMalloc, synchronous frees, ...) under the
// captures that prohibit it: cudaSuccess where none does, else `e`, each such capture invalidated.
cudaError_t unsafe_call(cudaError_t e) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  bool prohibited = false;
  for (const std::shared_ptr<Capture>& c : active_captures())
    if (c->mode == cudaStreamCaptureModeGlobal ||
        (c->mode == cudaStreamCaptureModeThreadLocal && c->owner == std::this_thread::get_id())) {
      invalidate(*c, e);
      prohibited = true;
    }
  return prohibited ? e : cudaSuccess;
}
// Before an operation is queued on stream s: cudaSuccess, or the call's error.
cudaError_t capture_gate(const void* s) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  const std::shared_ptr<Queue> q = queue_of(s);
  if (q->legacy) {  // its implicit synchronisation with the blocking streams
    bool implicit = false;
    for (const std::shared_ptr<Capture>& c : active_captures())
      for (const auto& w : c->members)
        if (std::shared_ptr<Queue> m = w.lock(); m && m->blocking && !implicit) {
          invalidate(*c, cudaErrorStreamCaptureImplicit);
          implicit = true;
        }
    return implicit ? cudaErrorStreamCaptureImplicit : cudaSuccess;
  }
  if (q->capture && q->capture->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
  // FT_CUDA_EMU_GRAPH_CAPTURE=fail@N: the N-th operation recorded into each capture is refused
  // (cudaErrorStreamCaptureUnsupported, the capture invalidated), as one the driver cannot
  // capture would be, so that a caller's way back from a recording that fails midway runs in
  // tests.
  static const size_t fail_at = [] {
    const char* v = std::getenv("FT_CUDA_EMU_GRAPH_CAPTURE");
    if (!v) return size_t(0);
    const std::string mode = v;
    if (mode.rfind("fail@", 0) != 0 || mode.size() == 5 ||
        mode.find_first_not_of("0123456789", 5) != std::string::npos)
      throw std::runtime_error("FT_CUDA_EMU_GRAPH_CAPTURE='" + mode + "': expected fail@N");
    return size_t(std::stoull(mode.substr(5)));
  }();
  if (q->capture && fail_at && q->capture->nodes.size() + 1 == fail_at) {
    invalidate(*q->capture, cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaSuccess;
}
// Is stream s recording into a capture?
bool capturing(const void* s) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  return queue_of(s)->capture != nullptr;
}
// A call refused because s captures: e, s's capture invalidated (s null: every blocking capture,
// for the legacy stream).
cudaError_t refuse_in_capture(const void* s, cudaError_t e) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  if (s) {
    if (const std::shared_ptr<Queue> q = queue_of(s); q->capture) invalidate(*q->capture, e);
  } else {
    capture_gate(nullptr);
  }
  return e;
}

}  // namespace

bool gpu_memory(const void* p, size_t n) { return n == 0 || in_gpu_memory(p, n); }
bool valid_stream_handle(const void* s) { return stream_is_valid(s); }
bool stream_submit(const void* s, std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());  // the check and the recording
  if (capture_gate(s) != cudaSuccess) return false;
  submit(s, std::move(op));
  return true;
}
bool stream_record_collective(const void* s, std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  const std::shared_ptr<Queue> q = queue_of(s);
  if (!q->capture || capture_gate(s) != cudaSuccess) return false;
  q->capture->collectives = true;
  submit(s, std::move(op));
  return true;
}
bool stream_make_eager(const void* s) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  const std::shared_ptr<Queue> q = queue_of(s);
  if (q->capture) return false;
  q->eager = true;
  run_queue(*q);
  raise_failure();
  return true;
}

namespace {

std::string dim_str(dim3 d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", d.x, d.y, d.z);
  return buf;
}
std::string loc_str(const std::source_location& w) {  // file:line:column
  return std::string(w.file_name()) + ":" + std::to_string(w.line()) + ":" +
         std::to_string(w.column());
}
bool same_loc(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::strcmp(a.file_name(), b.file_name()) == 0;
}
std::string hex(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

}  // namespace

Error::Error(const std::string& kernel, dim3 block, dim3 thread, const std::string& what)
    : std::runtime_error("CUDA emulation: kernel " + kernel + ", block " + dim_str(block) +
                         ", thread " + dim_str(thread) + ": " + what),
      kernel_(kernel),
      block_(block),
      thread_(thread),
      problem_(what) {}

// ---- schedule seed ---------------------------------------------------------------------------
namespace {

struct Rng {
  uint64_t state = 0;
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return size_t(next() % n); }
};

uint64_t seed_from_env() {
  const char* s = std::getenv("FT_CUDA_EMU_SEED");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0') {
    std::fprintf(stderr, "FT_CUDA_EMU_SEED=%s is not a non-negative integer; using 0\n", s);
    return 0;
  }
  return v;
}

// Guarded by g_launch_mutex (set_seed takes it too).
std::mutex g_launch_mutex;
uint64_t g_seed = seed_from_env();
Rng g_rng{g_seed};

}  // namespace

void set_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_seed = seed;
  g_rng = Rng{seed};
}

uint64_t seed() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return g_seed;
}

// ---- fibers and the scheduler ---------------------------------------------------------------
namespace detail {
namespace {

using detail::WarpOp;

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSync:
      return "__syncwarp";
    case WarpOp::kShfl:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kMma:
      return "mma.sync.aligned.m16n8k16";
    case WarpOp::kLdmatrix:
      return "ldmatrix.sync.aligned.m8n8";
  }
  return "?";
}

// Thrown inside a fiber to unwind it when the launch is abandoned; not a std::exception, so
// nothing in a kernel catches it by accident.
struct FiberAbort {};

// kHopper: suspended at an mbarrier wait or a warpgroup instruction (hopper_emu.cpp).
enum class State { kReady, kRunning, kBarrier, kWarp, kHopper, kDone };

// Stack per fiber: mmap'd with a guard page below (an overflow faults instead of corrupting the
// neighbour), kept for the next launch.
#if FT_ASAN
constexpr size_t kStackBytes = 512 << 10;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = 256 << 10;
#endif

struct Stack {
  char* base = nullptr;  // usable region [base, base + kStackBytes)
};

// Execution contexts. On x86-64 a switch saves the callee-saved registers and the stack
// pointer (ft_emu_switch below): glibc's swapcontext also saves the signal mask with a system
// call per switch, which made the emulator several times slower. Elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
}  // namespace
}  // namespace detail
}  // namespace ft::emu

extern "C" void ft_emu_switch(void** save_sp, void* new_sp);
// ft_emu_switch(save, next): pushes rbp, rbx, r12-r15, stores rsp in *save, loads next as rsp,
// pops the same registers from it and returns into the code that switched away from it. The
// other callee-saved state (MXCSR, the x87 control word) is shared: nothing here changes it.
asm(R"(
  .text
  .p2align 4
  .globl ft_emu_switch
  .hidden ft_emu_switch
  .type ft_emu_switch, @function
ft_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ft_emu_switch, .-ft_emu_switch
)");

namespace ft::emu {
namespace detail {
namespace {

void switch_context(Context& from, Context& to) { ft_emu_switch(&from.sp, to.sp); }

// A fresh context that starts in entry() on the stack [base, base + bytes): the frame that
// ft_emu_switch pops (six registers, rbp = 0 to end frame-pointer walks) and entry as the
// return address, placed so that entry starts with the stack aligned as after a call.
void make_context(Context& c, char* base, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t(15);
  auto* slot = reinterpret_cast<void**>(top - 64);
  for (int i = 0; i < 6; ++i) slot[i] = nullptr;
  slot[6] = reinterpret_cast<void*>(entry);
  slot[7] = nullptr;  // entry's return address: it never returns
  c.sp = slot;
}
#else
struct Context {
  ucontext_t uc;
};
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void make_context(Context& c, char* base, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = base;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

Stack new_stack() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("CUDA emulation: cannot map a fiber stack");
  mprotect(m, page, PROT_NONE);
  return Stack{static_cast<char*>(m) + page};
}

// A cp.async issued and not yet performed (see cp_async below).
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int size, src_bytes;
  unsigned char snapshot[16];  // the source bytes at issue, to catch a change before completion
  std::source_location where;
};

struct Fiber {
  Context ctx;
  Stack stack;
  uint3 tid;
  int linear = 0;
  State state = State::kDone;
  bool started = false;
  // At a warp operation:
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
  std::source_location where;
  // At mma / ldmatrix: the lane's operands and results, on its own stack (arg: the qualifiers).
  const void* in = nullptr;
  void* out = nullptr;
  // cp.async: issued and not committed, and the committed groups, oldest first.
  std::vector<AsyncCopy> copies;
  std::deque<std::vector<AsyncCopy>> copy_groups;
};

// Lanes of one warp waiting at one warp operation with one mask.
struct WarpGroup {
  unsigned mask = 0, arrived = 0;
  WarpOp op = WarpOp::kSync;
  int first_lane = 0;
};

struct Runner {
  const LaunchConfig* config = nullptr;
  void (*body)(void*) = nullptr;
  void* body_ctx = nullptr;
  int nthreads = 0;
  uint3 block{0, 0, 0};
  std::vector<Fiber>* fibers = nullptr;
  std::deque<int> ready;
  bool random_order = false;
  Context sched_ctx;
  Fiber* current = nullptr;
  bool aborting = false;
  std::optional<Error> error;
  // __syncthreads
  int barrier_waiting = 0, barrier_first = 0;
  std::source_location barrier_where;
  int exited = 0, first_exited = 0;
  // warp operations, per warp
  std::vector<std::vector<WarpGroup>> warps;
  std::vector<unsigned> exited_lanes;
  unsigned char* dynamic_shared = nullptr;
  // ASan: the scheduler's stack, learnt when the first fiber starts.
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
};

// Launches are serialised by g_launch_mutex, so one Runner at a time in the process.
Runner* g_runner = nullptr;
uint3 g_thread_idx{0, 0, 0}, g_block_idx{0, 0, 0};
dim3 g_block_dim, g_grid_dim;
std::vector<Fiber> g_fibers;  // stacks kept across launches

dim3 to_dim(uint3 u) { return dim3(u.x, u.y, u.z); }

uint3 thread_of(int linear, dim3 b) {
  return uint3{unsigned(linear) % b.x, (unsigned(linear) / b.x) % b.y,
               unsigned(linear) / (b.x * b.y)};
}

void start_switch([[maybe_unused]] void** fake, [[maybe_unused]] const void* bottom,
                  [[maybe_unused]] size_t size) {
#if FT_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#endif
}
void finish_switch([[maybe_unused]] void* fake, [[maybe_unused]] const void** bottom,
                   [[maybe_unused]] size_t* size) {
#if FT_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#endif
}

// Records the first report of the launch (later ones are consequences).
void record(Runner& r, const Fiber& f, const std::string& what) {
  if (!r.error) r.error.emplace(r.config->name, to_dim(r.block), to_dim(f.tid), what);
}

// Inside a fiber: record and unwind this fiber.
[[noreturn]] void report(Runner& r, const Fiber& f, const std::string& what) {
  record(r, f, what);
  throw FiberAbort{};
}

// Inside a fiber: back to the scheduler; resumes when the scheduler picks this fiber again.
void yield(Runner& r) {
  Fiber& f = *r.current;
  void* fake = nullptr;
  start_switch(&fake, r.sched_bottom, r.sched_size);
  switch_context(f.ctx, r.sched_ctx);
  finish_switch(fake, nullptr, nullptr);
  if (r.aborting) throw FiberAbort{};
}

void fiber_entry() {
  Runner& r = *g_runner;
  finish_switch(nullptr, &r.sched_bottom, &r.sched_size);
  Fiber& f = *r.current;
  try {
    r.body(r.body_ctx);
  } catch (const FiberAbort&) {
  } catch (const std::exception& e) {
    record(r, f, std::string("the kernel threw: ") + e.what());
  } catch (...) {
    record(r, f, "the kernel threw a non-standard exception");
  }
  f.state = State::kDone;
  start_switch(nullptr, r.sched_bottom, r.sched_size);  // nullptr: this fiber's frames are gone
  switch_context(f.ctx, r.sched_ctx);
  std::abort();  // a finished fiber is never resumed
}

// From the scheduler into fiber f until it blocks, yields or finishes.
void run_fiber(Runner& r, Fiber& f) {
  r.current = &f;
  g_thread_idx = f.tid;
  f.state = State::kRunning;
  f.started = true;
  void* fake = nullptr;
  start_switch(&fake, f.stack.base, kStackBytes);
  switch_context(r.sched_ctx, f.ctx);
  finish_switch(fake, nullptr, nullptr);
  r.current = nullptr;
}

Runner& current_runner(const char* what) {
  if (!g_runner || !g_runner->current)
    throw Error("(none)", dim3(0, 0, 0), dim3(0, 0, 0),
                std::string(what) + " called outside a kernel launch");
  return *g_runner;
}

void make_ready(Runner& r, Fiber& f) {
  f.state = State::kReady;
  r.ready.push_back(f.linear);
}

// A thread finished: nobody may still wait for it.
void on_exit(Runner& r, Fiber& f) {
  if (r.exited++ == 0) r.first_exited = f.linear;
  const int warp = f.linear / 32, lane = f.linear % 32;
  r.exited_lanes[warp] |= 1u << lane;
  if (r.barrier_waiting > 0) {
    record(r, f,
           "thread exited while " + std::to_string(r.barrier_waiting) +
               " thread(s) of its block wait at __syncthreads (" + loc_str(r.barrier_where) +
               "): every thread of a block must reach every barrier (an early return?)");
  }
  size_t pending = f.copies.size();
  for (const auto& g : f.copy_groups) pending += g.size();
  if (pending > 0) {
    const AsyncCopy& c = f.copies.empty() ? f.copy_groups.front().front() : f.copies.front();
    record(r, f,
           "thread exited with " + std::to_string(pending) +
               " cp.async copy(ies) never waited for (the first issued at " + loc_str(c.where) +
               (f.copies.empty() ? "" : ", not even committed") +
               "): cp.async.wait_group / wait_all must complete a copy before its data is used");
  }
  if (const std::string left = hopper_thread_exit(f.linear); !left.empty()) record(r, f, left);
  for (const WarpGroup& g : r.warps[warp]) {
    if (g.mask & (1u << lane)) {
      const Fiber& w = (*r.fibers)[warp * 32 + g.first_lane];
      record(r, f,
             "lane " + std::to_string(lane) + " exited while lanes of its warp wait for it at " +
                 op_name(g.op) + " with mask " + hex(g.mask) + " (" + loc_str(w.where) + ")");
    }
  }
}

// Who waits where, for the deadlock report: the barrier's waiters, then each warp group.
std::string waiting_list(Runner& r) {
  std::ostringstream os;
  if (r.barrier_waiting > 0) {
    os << r.barrier_waiting << " thread(s) at __syncthreads (" << loc_str(r.barrier_where)
       << "), first thread " << dim_str(to_dim(thread_of(r.barrier_first, r.config->block)));
  }
  for (size_t w = 0; w < r.warps.size(); ++w) {
    for (const WarpGroup& g : r.warps[w]) {
      const Fiber& f = (*r.fibers)[w * 32 + size_t(g.first_lane)];
      os << (os.tellp() > 0 ? "; " : "") << "lanes " << hex(g.arrived) << " of warp " << w << " at "
         << op_name(g.op) << " (" << loc_str(f.where) << ") waiting for lanes "
         << hex(g.mask & ~g.arrived);
    }
  }
  if (const std::string h = hopper_waiting(); !h.empty()) os << (os.tellp() > 0 ? "; " : "") << h;
  return os.str();
}

// Unwinds every started, unfinished fiber of the block (they throw FiberAbort where they wait).
void abort_block(Runner& r) {
  r.aborting = true;
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = (*r.fibers)[i];
    if (f.started && f.state != State::kDone) run_fiber(r, f);
    f.state = State::kDone;
  }
  r.aborting = false;
}

void run_block(Runner& r) {
  std::vector<Fiber>& fibers = *r.fibers;
  const dim3 bd = r.config->block;
  r.ready.clear();
  r.barrier_waiting = 0;
  r.exited = 0;
  const int nwarps = (r.nthreads + 31) / 32;
  r.warps.resize(size_t(nwarps));  // keeps the groups' capacity from block to block
  for (auto& groups : r.warps) groups.clear();
  r.exited_lanes.assign(size_t(nwarps), 0u);
  if (r.dynamic_shared) std::memset(r.dynamic_shared, 0xff, r.config->shared_bytes);
  hopper_block_start(r.nthreads);
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = fibers[i];
    f.linear = i;
    f.tid = thread_of(i, bd);
    f.started = false;
    f.copies.clear();
    f.copy_groups.clear();
    make_context(f.ctx, f.stack.base, kStackBytes, fiber_entry);
    make_ready(r, f);
  }
  int done = 0;
  while (done < r.nthreads) {
    if (r.error) break;
    if (r.ready.empty() && hopper_stalled()) continue;  // copies in flight completed
    if (r.ready.empty()) {
      const Fiber* first = nullptr;
      for (int i = 0; i < r.nthreads && !first; ++i)
        if (fibers[i].state != State::kDone) first = &fibers[i];
      record(r, *first, "deadlock: no thread can run while some wait: " + waiting_list(r));
      break;
    }
    int idx;
    if (r.random_order) {  // any ready thread; the ready list's order does not matter then
      std::swap(r.ready[g_rng.below(r.ready.size())], r.ready.back());
      idx = r.ready.back();
      r.ready.pop_back();
    } else {  // seed 0: first come, first served
      idx = r.ready.front();
      r.ready.pop_front();
    }
    Fiber& f = fibers[idx];
    run_fiber(r, f);
    if (f.state == State::kDone) {
      ++done;
      on_exit(r, f);
    }
  }
  if (r.error) abort_block(r);
}

}  // namespace

const uint3& thread_idx() { return g_thread_idx; }
const uint3& block_idx() { return g_block_idx; }
const dim3& block_dim() { return g_block_dim; }
const dim3& grid_dim() { return g_grid_dim; }

unsigned active_mask() {
  Runner& r = current_runner("__activemask");
  const int warp = r.current->linear / 32;
  const int lanes = std::min(32, r.nthreads - warp * 32);
  const unsigned exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  return exist & ~r.exited_lanes[warp];
}

void atomic_point() {
  if (!g_runner || !g_runner->current) return;  // host code
  Runner& r = *g_runner;
  if (!r.random_order || (g_rng.next() & 1u)) return;
  make_ready(r, *r.current);
  yield(r);
}

int syncthreads(int predicate, const std::source_location& where) {
  Runner& r = current_runner("__syncthreads");
  Fiber& f = *r.current;
  if (r.exited > 0) {
    report(r, f,
           "__syncthreads (" + loc_str(where) + ") reached after thread " +
               dim_str(to_dim(thread_of(r.first_exited, r.config->block))) +
               " of the block exited: every thread of a block must reach every barrier (an "
               "early return before a barrier?)");
  }
  if (r.barrier_waiting > 0 && !same_loc(where, r.barrier_where)) {
    report(r, f,
           "threads of the block wait at different barriers: this thread at __syncthreads (" +
               loc_str(where) + "), thread " +
               dim_str(to_dim(thread_of(r.barrier_first, r.config->block))) + " at (" +
               loc_str(r.barrier_where) + ") (a __syncthreads inside a divergent branch?)");
  }
  if (r.barrier_waiting == 0) {
    r.barrier_where = where;
    r.barrier_first = f.linear;
  }
  f.state = State::kBarrier;
  f.value = uint64_t(predicate);
  if (++r.barrier_waiting == r.nthreads) {
    r.barrier_waiting = 0;
    int count = 0;
    for (int i = 0; i < r.nthreads; ++i) count += int((*r.fibers)[i].value);
    hopper_barrier_sync();
    for (int i = 0; i < r.nthreads; ++i) {
      Fiber& w = (*r.fibers)[i];
      w.result = uint64_t(count);
      make_ready(r, w);
    }
  }
  yield(r);
  return int(f.result);
}

namespace {

// ---- warp-level matrix instructions (completed by the last lane to arrive) --------------------
// Sources: NVIDIA PTX ISA 8.7, §9.7.14.5.14 "mma" and §9.7.14.5.8 "Matrix Fragments for
// mma.m16n8k16 with floating point type" (Figures 79, 81, 83); §9.7.14.5.15 "ldmatrix"
// (Figure 104). Notation: lane l, g = l >> 2 (groupID), q = l & 3 (threadID_in_group).

struct MmaIn {  // one lane's operands, on its stack
  uint32_t a[4], b[2];
  float c[4];
};

std::string mma_name(int type) {
  return type == int(MmaType::kBf16) ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                     : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
}
// ldmatrix's qualifiers as one int: num | trans << 4.
std::string ldmatrix_name(int qual) {
  return "ldmatrix.sync.aligned.m8n8.x" + std::to_string(qual & 7) + (qual >> 4 ? ".trans" : "") +
         ".shared.b16";
}

// D = A·B + C. Fragments (§9.7.14.5.8), element i of a lane's list, two 16-bit elements per
// register, the lower-indexed one in bits 0..15:
//   A (16x16, .row): row g + 8·((i >> 1) & 1), column 2q + (i & 1) + 8·(i >= 4), i < 8;
//   B (16x8, .col, element [k][n]): k = 2q + (i & 1) + 8·(i >= 2), n = g, i < 4;
//   C, D (16x8 f32): row g + 8·(i >= 2), column 2q + (i & 1), i < 4.
// Numerics: a product of two bf16 or two f16 values is exact in fp32; the ISA fixes neither the
// order nor the rounding of the sum inside the instruction (tensor cores are not bit-equal to an
// fp32 FMA chain). Here: C plus the products in k order 0..15, each addition rounded to fp32,
// deterministic. Tests compare with a CPU reference under a tolerance, never GPU bits.
void complete_mma(Runner& r, int base, int type) {
  float A[16][16], B[16][8], C[16][8];
  const auto elem = [type](uint32_t reg, int half) {
    const auto bits = uint16_t(reg >> (16 * half));
    return type == int(MmaType::kBf16) ? to_f32(bf16{bits}) : to_f32(f16{bits});
  };
  for (int l = 0; l < 32; ++l) {
    const auto& in = *static_cast<const MmaIn*>((*r.fibers)[base + l].in);
    const int g = l >> 2, q = l & 3;
    for (int i = 0; i < 8; ++i)
      A[g + 8 * ((i >> 1) & 1)][2 * q + (i & 1) + 8 * (i >= 4)] = elem(in.a[i >> 1], i & 1);
    for (int i = 0; i < 4; ++i) {
      B[2 * q + (i & 1) + 8 * (i >= 2)][g] = elem(in.b[i >> 1], i & 1);
      C[g + 8 * (i >= 2)][2 * q + (i & 1)] = in.c[i];
    }
  }
  for (int l = 0; l < 32; ++l) {  // every input was read: d may alias c
    auto* d = static_cast<float*>((*r.fibers)[base + l].out);
    const int g = l >> 2, q = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int m = g + 8 * (i >= 2), n = 2 * q + (i & 1);
      float acc = C[m][n];
      for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
      d[i] = acc;
    }
  }
}

// Lane 8i + j gives the address of row j of matrix i (i < num; the other lanes' addresses are
// ignored, as on sm_80+); each must be 16-byte aligned and in shared memory. Register i of lane
// l receives, low half then high half (Figure 104 for the plain form; .trans delivers the same
// positions of the transposed matrix):
//   plain:  M_i[g][2q], M_i[g][2q + 1];   .trans: M_i[2q][g], M_i[2q + 1][g].
void complete_ldmatrix(Runner& r, int base, int qual) {
  const int num = qual & 7;
  const bool trans = (qual >> 4) != 0;
  const unsigned char* rows[32];
  const uintptr_t lo = reinterpret_cast<uintptr_t>(r.dynamic_shared);
  const uintptr_t hi = lo + r.config->shared_bytes;
  for (int l = 0; l < 8 * num; ++l) {
    const Fiber& w = (*r.fibers)[base + l];
    const void* p = *static_cast<const void* const*>(w.in);
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto site = [&] {  // built only for a report
      char addr[32];
      std::snprintf(addr, sizeof addr, "%p", p);
      return ldmatrix_name(qual) + " (" + loc_str(w.where) + "): lane " + std::to_string(l) +
             "'s row address " + addr;
    };
    if (a % 16 != 0) report(r, w, site() + " is not 16-byte aligned");
    if (a < lo || a + 16 > hi || a + 16 < a)
      report(r, w,
             site() + " is not in the block's shared memory (" + std::to_string(hi - lo) +
                 " dynamic bytes; the emulator knows FT_DYNAMIC_SHARED only, not static "
                 "__shared__ arrays)");
    rows[l] = static_cast<const unsigned char*>(p);
  }
  // Each lane reads the rows it receives elements of: TMA data there must be visible to it.
  for (int l = 0; l < 32; ++l) {
    const int first = trans ? 2 * (l & 3) : l >> 2, count = trans ? 2 : 1;
    for (int i = 0; i < num; ++i)
      for (int row = first; row < first + count; ++row)
        if (const std::string e =
                hopper_generic_read(base + l, uint32_t(rows[8 * i + row] - r.dynamic_shared), 16);
            !e.empty())
          report(r, (*r.fibers)[base + l],
                 ldmatrix_name(qual) + " (" + loc_str((*r.fibers)[base + l].where) + "): " + e);
  }
  const auto elem = [&](int i, int row, int col) {
    uint16_t v;
    std::memcpy(&v, rows[8 * i + row] + 2 * col, 2);
    return uint32_t(v);
  };
  for (int l = 0; l < 32; ++l) {
    auto* out = static_cast<uint32_t*>((*r.fibers)[base + l].out);
    const int g = l >> 2, q = l & 3;
    for (int i = 0; i < num; ++i)
      out[i] = trans ? elem(i, 2 * q, g) | elem(i, 2 * q + 1, g) << 16
                     : elem(i, g, 2 * q) | elem(i, g, 2 * q + 1) << 16;
  }
}

// The last lane of an mma / ldmatrix arrived (the full warp, .aligned): every lane must be at
// the same instruction (call site and qualifiers), then the result.
void complete_matrix(Runner& r, int base, WarpOp op) {
  const Fiber& f0 = (*r.fibers)[base];
  const auto name = [op](int qual) {
    return op == WarpOp::kMma ? mma_name(qual) : ldmatrix_name(qual);
  };
  for (int l = 1; l < 32; ++l) {
    const Fiber& w = (*r.fibers)[base + l];
    if (w.arg != f0.arg || !same_loc(w.where, f0.where))
      report(r, w,
             "lanes of warp " + std::to_string(base / 32) +
                 " execute different instructions where every lane must execute the same one "
                 "(.aligned): lane 0 at " +
                 name(f0.arg) + " (" + loc_str(f0.where) + "), lane " + std::to_string(l) + " at " +
                 name(w.arg) + " (" + loc_str(w.where) + ")");
  }
  if (op == WarpOp::kMma)
    complete_mma(r, base, f0.arg);
  else
    complete_ldmatrix(r, base, f0.arg);
}

// The warp operations: the shuffles and votes (8-byte value), and mma / ldmatrix (operands
// through in / out, qualifiers in arg).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                         const std::source_location& where, const void* in, void* out) {
  Runner& r = current_runner(op_name(op));
  Fiber& f = *r.current;
  const int warp = f.linear / 32, lane = f.linear % 32, base = warp * 32;
  const int lanes = std::min(32, r.nthreads - base);
  const unsigned exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  const auto site = [&] { return std::string(op_name(op)) + " (" + loc_str(where) + ")"; };
  if (!(mask & (1u << lane)))
    report(
        r, f,
        site() + ": mask " + hex(mask) + " does not name the calling lane " + std::to_string(lane));
  if (mask & ~exist)
    report(r, f,
           site() + ": mask " + hex(mask) + " names lane " +
               std::to_string(__builtin_ctz(mask & ~exist)) + ", which does not exist (warp " +
               std::to_string(warp) + " has " + std::to_string(lanes) + " lanes)");
  if (mask & r.exited_lanes[warp])
    report(r, f,
           site() + ": mask " + hex(mask) + " names lane " +
               std::to_string(__builtin_ctz(mask & r.exited_lanes[warp])) + ", which has exited");
  if (width < 1 || width > 32 || (width & (width - 1)))
    report(r, f, site() + ": width " + std::to_string(width) + " is not a power of two up to 32");

  std::vector<WarpGroup>& groups = r.warps[warp];
  WarpGroup* group = nullptr;
  for (WarpGroup& g : groups) {
    const Fiber& w = (*r.fibers)[base + g.first_lane];
    if (g.mask == mask && g.op == op) {
      group = &g;
    } else if (g.mask & mask) {
      report(r, f,
             "lanes of warp " + std::to_string(warp) +
                 " meet at different warp "
                 "operations: this lane at " +
                 site() + " with mask " + hex(mask) + ", lane " + std::to_string(g.first_lane) +
                 " at " + op_name(g.op) + " (" + loc_str(w.where) + ") with mask " + hex(g.mask));
    }
  }
  if (!group) {
    groups.push_back(WarpGroup{mask, 0u, op, lane});
    group = &groups.back();
  }
  f.op = op;
  f.mask = mask;
  f.value = value;
  f.arg = arg;
  f.width = width;
  f.where = where;
  f.in = in;
  f.out = out;
  f.state = State::kWarp;
  group->arrived |= 1u << lane;
  if (group->arrived == mask && (op == WarpOp::kMma || op == WarpOp::kLdmatrix)) {
    complete_matrix(r, base, op);
    groups.erase(groups.begin() + (group - groups.data()));
    for (int l = 0; l < 32; ++l) make_ready(r, (*r.fibers)[base + l]);
  } else if (group->arrived == mask) {
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
      if ((mask >> l & 1u) && (*r.fibers)[base + l].value != 0) ballot |= 1u << l;
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      Fiber& w = (*r.fibers)[base + l];
      const int seg = l & ~(w.width - 1);
      int src = l;  // CUDA returns the caller's own value when the source is out of range
      switch (op) {
        case WarpOp::kShfl:
          src = seg + (w.arg % w.width + w.width) % w.width;
          break;
        case WarpOp::kShflUp:
          if (unsigned(l - seg) >= unsigned(w.arg)) src = l - w.arg;
          break;
        case WarpOp::kShflDown:
          if (unsigned(l - seg) + unsigned(w.arg) < unsigned(w.width)) src = l + w.arg;
          break;
        case WarpOp::kShflXor:
          if ((l ^ w.arg) >= 0 && (l ^ w.arg) < seg + w.width) src = l ^ w.arg;
          break;
        default:
          break;
      }
      if (src != l && !(mask >> src & 1u))
        report(r, w,
               std::string(op_name(op)) + " (" + loc_str(w.where) + "): lane " + std::to_string(l) +
                   " reads lane " + std::to_string(src) + ", which is not in the mask " +
                   hex(mask));
      switch (op) {
        case WarpOp::kBallot:
          w.result = ballot;
          break;
        case WarpOp::kAll:
          w.result = ballot == mask;
          break;
        case WarpOp::kAny:
          w.result = ballot != 0;
          break;
        case WarpOp::kSync:
          w.result = 0;
          break;
        default:
          w.result = (*r.fibers)[base + src].value;
          break;
      }
    }
    groups.erase(groups.begin() + (group - groups.data()));
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) make_ready(r, (*r.fibers)[base + l]);
  }
  yield(r);
  return f.result;
}

}  // namespace

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                 const std::source_location& where) {
  return warp_collective(op, mask, value, arg, width, where, nullptr, nullptr);
}

namespace {

// FT_CUDA_EMU_LAUNCHES=1: each kernel's launches counted by name and printed to stderr at exit
// ("ft_emu launches: NAME COUNT" a line), so a system test can tell which kernels a run took.
// Guarded by g_launch_mutex.
std::map<std::string, uint64_t>* launch_counts() {
  static std::map<std::string, uint64_t>* counts = [] {
    const char* v = std::getenv("FT_CUDA_EMU_LAUNCHES");
    if (!v || std::string(v) != "1") return static_cast<std::map<std::string, uint64_t>*>(nullptr);
    static std::map<std::string, uint64_t> m;
    std::atexit([] {
      for (const auto& [name, n] : m)
        std::fprintf(stderr, "ft_emu launches: %s %llu\n", name.c_str(),
                     static_cast<unsigned long long>(n));
    });
    return &m;
  }();
  return counts;
}

}  // namespace

namespace {
void execute_launch(const LaunchConfig& config, void (*body)(void*), void* ctx);
}  // namespace

// Checks the launch now and queues its execution on its stream (stream order above).
void run_launch(const LaunchConfig& config, void (*body)(void*), std::shared_ptr<void> ctx) {
  const dim3 g = config.grid, b = config.block;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || threads == 0 ||
      threads > 1024 || b.z > 64) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (config.shared_bytes > max_dynamic_shared(config.kernel)) {
    set_last_error(cudaErrorInvalidValue);
    return;
  }
  if (!stream_is_valid(config.stream)) {
    set_last_error(cudaErrorInvalidResourceHandle);
    return;
  }
  for (int i = 0; i < config.pointer_count; ++i) {
    const auto [index, pointer] = config.pointers[i];
    if (!kernel_reachable(pointer)) {
      char where[32];
      std::snprintf(where, sizeof where, "%p", pointer);
      throw Error(config.name, dim3(0, 0, 0), dim3(0, 0, 0),
                  "argument " + std::to_string(index + 1) + " (" + where +
                      ") is not device memory: not inside a cudaMalloc or cudaMallocHost "
                      "allocation (a host pointer passed to a kernel?)");
    }
  }
  LaunchConfig queued = config;
  queued.pointers = nullptr;  // the caller's, checked above
  queued.pointer_count = 0;
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());  // the check and the recording
  if (const cudaError_t e = capture_gate(config.stream); e != cudaSuccess) {
    set_last_error(e);
    return;
  }
  submit(config.stream,
         [queued, body, ctx = std::move(ctx)] { execute_launch(queued, body, ctx.get()); });
}

namespace {
void execute_launch(const LaunchConfig& config, void (*body)(void*), void* ctx) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  // Counted when it runs (FT_CUDA_EMU_LAUNCHES: the kernels that ran).
  if (std::map<std::string, uint64_t>* counts = launch_counts()) ++(*counts)[config.name];
  const dim3 g = config.grid, b = config.block;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  while (g_fibers.size() < threads) {
    g_fibers.emplace_back();
    g_fibers.back().stack = new_stack();
  }
  Runner r;
  r.config = &config;
  r.body = body;
  r.body_ctx = ctx;
  r.nthreads = int(threads);
  r.fibers = &g_fibers;
  r.random_order = g_seed != 0;
  // 1024-byte aligned: the swizzle patterns of TMA and wgmma repeat every 1024 bytes of the
  // shared address (hopper_emu.cpp), which the emulation takes as the offset in this buffer, so
  // a tile the kernel aligns to 1024 in one is aligned in the other.
  struct AlignedFree {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(1024)); }
  };
  std::unique_ptr<unsigned char[], AlignedFree> shared(static_cast<unsigned char*>(
      ::operator new[](std::max<size_t>(config.shared_bytes, 1), std::align_val_t(1024))));
  r.dynamic_shared = shared.get();
  g_runner = &r;
  struct Reset {  // no dangling runner if anything below throws
    ~Reset() { g_runner = nullptr; }
  } reset;
  g_block_dim = b;
  g_grid_dim = g;

  const unsigned long long blocks = 1ull * g.x * g.y * g.z;
  std::vector<unsigned long long> order(blocks);
  for (unsigned long long i = 0; i < blocks; ++i) order[i] = i;
  if (r.random_order)
    for (unsigned long long i = blocks; i > 1; --i) std::swap(order[i - 1], order[g_rng.below(i)]);
  for (unsigned long long id : order) {
    r.block =
        uint3{unsigned(id % g.x), unsigned(id / g.x % g.y), unsigned(id / (1ull * g.x * g.y))};
    g_block_idx = r.block;
    run_block(r);
    if (r.error) break;
  }
  if (r.error) throw *r.error;
}
}  // namespace

}  // namespace detail

void* dynamic_shared() {
  return detail::current_runner("dynamic shared memory (FT_DYNAMIC_SHARED)").dynamic_shared;
}

// ---- the primitives hopper_emu.cpp builds on (emu_internal.h) -------------------------------
namespace detail {

int current_thread(const char* what) { return current_runner(what).current->linear; }
int block_threads() { return current_runner("block_threads").nthreads; }
void fail(const std::string& what) {
  Runner& r = current_runner("fail");
  report(r, *r.current, what);
}
void note(int linear, const std::string& what) {
  record(*g_runner, (*g_runner->fibers)[linear], what);
}
void suspend() {
  Runner& r = current_runner("suspend");
  r.current->state = State::kHopper;
  yield(r);
}
void wake(int linear) {
  Fiber& f = (*g_runner->fibers)[linear];
  if (f.state == State::kHopper) make_ready(*g_runner, f);
}
// The block's, not a thread's: hopper_stalled completes TMA copies from the scheduler, where no
// thread is current (current_runner would throw there).
Runner& block_runner(const char* what) {
  if (!g_runner)
    throw Error("(none)", dim3(0, 0, 0), dim3(0, 0, 0),
                std::string(what) + " called outside a kernel launch");
  return *g_runner;
}
unsigned char* shared_base() { return block_runner("shared memory").dynamic_shared; }
size_t shared_bytes() { return block_runner("shared memory").config->shared_bytes; }
std::string site(const std::source_location& where) { return loc_str(where); }

}  // namespace detail

// ---- kernels/cuda/warp_matrix.cuh's twins ----------------------------------------------------
void mma_m16n8k16(MmaType type, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], const std::source_location& where) {
  detail::MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  float out[4];
  detail::warp_collective(detail::WarpOp::kMma, 0xffffffffu, 0, int(type), 32, where, &in, out);
  std::memcpy(d, out, sizeof out);
}

void ldmatrix(int num, bool trans, uint32_t* r, const void* row_addr,
              const std::source_location& where) {
  if (num != 1 && num != 2 && num != 4)
    throw std::logic_error("ft::emu::ldmatrix: num must be 1, 2 or 4");
  uint32_t out[4];
  detail::warp_collective(detail::WarpOp::kLdmatrix, 0xffffffffu, 0, num | int(trans) << 4, 32,
                          where, &row_addr, out);
  std::memcpy(r, out, sizeof(uint32_t) * size_t(num));
}

// cp.async (PTX ISA 8.7 §9.7.9.25.3.1): cp-size 4, 8 or 16 bytes (.cg: 16), dst and src aligned
// to it (§6.4.1), src-size in [0, cp-size] bytes copied and the rest of dst zero-filled. The copy
// is queued on the thread; commit_group closes the uncommitted ones into a group (§9.7.9.25.3.2),
// and wait_group N performs the oldest groups until at most N remain (§9.7.9.25.3.3). So shared
// memory read before the wait holds what it held before (0xff bytes from the launch, or older
// data), as undefined as the ISA makes it, and a change to the source before completion is
// reported.
void cp_async(void* smem, const void* gmem, int cp_size, int src_bytes, bool cg,
              const std::source_location& where) {
  detail::Runner& r = detail::current_runner("cp.async");
  detail::Fiber& f = *r.current;
  const auto site = [&] {  // built only for a report
    return std::string(cg ? "cp.async.cg" : "cp.async.ca") + ".shared.global (" + loc_str(where) +
           ")";
  };
  const auto ptr = [](const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return std::string(buf);
  };
  if ((cp_size != 4 && cp_size != 8 && cp_size != 16) || (cg && cp_size != 16))
    detail::report(
        r, f,
        site() + ": cp-size " + std::to_string(cp_size) + " is not one of 4, 8, 16 (.cg: 16 only)");
  if (src_bytes < 0 || src_bytes > cp_size)
    detail::report(r, f,
                   site() + ": src-size " + std::to_string(src_bytes) + " is outside [0, cp-size " +
                       std::to_string(cp_size) + "]");
  if (reinterpret_cast<uintptr_t>(smem) % unsigned(cp_size) != 0)
    detail::report(r, f,
                   site() + ": shared address " + ptr(smem) + " is not aligned to the cp-size " +
                       std::to_string(cp_size));
  if (reinterpret_cast<uintptr_t>(gmem) % unsigned(cp_size) != 0)
    detail::report(r, f,
                   site() + ": global address " + ptr(gmem) + " is not aligned to the cp-size " +
                       std::to_string(cp_size));
  const auto* dst = static_cast<unsigned char*>(smem);
  if (dst < r.dynamic_shared || dst + cp_size > r.dynamic_shared + r.config->shared_bytes)
    detail::report(r, f,
                   site() + ": destination " + ptr(smem) +
                       " is not in the block's shared memory (" +
                       std::to_string(r.config->shared_bytes) +
                       " dynamic bytes; the emulator knows FT_DYNAMIC_SHARED only, not static "
                       "__shared__ arrays)");
  if (src_bytes > 0 && !in_gpu_memory(gmem, size_t(src_bytes)))
    detail::report(r, f,
                   site() + ": source [" + ptr(gmem) + ", +" + std::to_string(src_bytes) +
                       ") is not inside a cudaMalloc or cudaMallocHost allocation");
  detail::AsyncCopy c{static_cast<unsigned char*>(smem),
                      static_cast<const unsigned char*>(gmem),
                      cp_size,
                      src_bytes,
                      {},
                      where};
  if (src_bytes > 0) std::memcpy(c.snapshot, gmem, size_t(src_bytes));
  f.copies.push_back(c);
}

void cp_async_commit() {
  detail::Fiber& f = *detail::current_runner("cp.async.commit_group").current;
  f.copy_groups.push_back(std::move(f.copies));
  f.copies.clear();
}

void cp_async_wait(int n, const std::source_location& where) {
  detail::Runner& r = detail::current_runner("cp.async.wait_group");
  detail::Fiber& f = *r.current;
  if (n < 0) {  // wait_all: commit_group, then wait_group 0
    cp_async_commit();
    n = 0;
  }
  while (f.copy_groups.size() > size_t(n)) {
    for (const detail::AsyncCopy& c : f.copy_groups.front()) {
      if (c.src_bytes == 0) {  // all zeros; src may be any pointer
        std::memset(c.dst, 0, size_t(c.size));
        continue;
      }
      if (std::memcmp(c.src, c.snapshot, size_t(c.src_bytes)) != 0)
        detail::report(r, f,
                       "cp.async (" + loc_str(c.where) +
                           "): its global source changed before the copy completed (at "
                           "cp.async.wait (" +
                           loc_str(where) + ")), which the PTX ISA leaves undefined");
      std::memcpy(c.dst, c.src, size_t(c.src_bytes));
      std::memset(c.dst + c.src_bytes, 0, size_t(c.size - c.src_bytes));
    }
    f.copy_groups.pop_front();
  }
}

}  // namespace ft::emu

// ---- the CUDA runtime API subset, on host memory ------------------------------------------
// Work on streams runs in stream order (above: deferred by default). Memory copies check their
// kind against where the pointers live (a host pointer passed as a device one is the bug this
// catches), as the runtime does for device memory.
namespace {
using ft::emu::rt;
using ft::emu::set_last_error;

cudaError_t fail(cudaError_t e) { return set_last_error(e); }

bool valid_stream(cudaStream_t s) { return ft::emu::stream_is_valid(s); }

bool valid_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(rt().mutex);
  return rt().events.count(e) > 0;
}

cudaError_t device_alloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(rt().mutex);
  if (rt().device_bytes + size > ft::emu::total_memory()) return fail(cudaErrorMemoryAllocation);
  // Exact size, so ASan sees a read past the end; 256-byte aligned as cudaMalloc's.
  char* p = static_cast<char*>(::operator new(size, std::align_val_t(256), std::nothrow));
  if (!p) return fail(cudaErrorMemoryAllocation);
  rt().device[p] = size;
  rt().device_bytes += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t device_free(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(rt().mutex);
  auto it = rt().device.find(static_cast<char*>(ptr));
  if (it == rt().device.end()) return fail(cudaErrorInvalidValue);
  rt().device_bytes -= it->second;
  rt().device.erase(it);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

cudaError_t host_alloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(rt().mutex);
    if (rt().pinned_bytes + size > ft::emu::pinned_limit()) return fail(cudaErrorMemoryAllocation);
  }
  char* p = static_cast<char*>(::operator new(size, std::align_val_t(256), std::nothrow));
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(rt().mutex);
  rt().pinned[p] = size;
  rt().pinned_bytes += size;
  *ptr = p;
  return cudaSuccess;
}

// A copy on `stream` in its order. Pageable host memory as the runtime treats it: the source
// bytes are taken when the call is made, and a copy into pageable memory has completed when the
// call returns.
cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(rt().mutex);
    const bool dst_dev = ft::emu::in_device(dst, n), src_dev = ft::emu::in_device(src, n);
    const bool dst_touch = ft::emu::touches_device(dst), src_touch = ft::emu::touches_device(src);
    bool ok = false;
    switch (kind) {
      case cudaMemcpyHostToHost:
        ok = !dst_touch && !src_touch;
        break;
      case cudaMemcpyHostToDevice:
        ok = dst_dev && !src_touch;
        break;
      case cudaMemcpyDeviceToHost:
        ok = !dst_touch && src_dev;
        break;
      case cudaMemcpyDeviceToDevice:
        ok = dst_dev && src_dev;
        break;
      case cudaMemcpyDefault:
        ok = (dst_dev || !dst_touch) && (src_dev || !src_touch);
        break;
      default:
        ok = false;
    }
    if (!ok) return fail(cudaErrorInvalidValue);
  }
  // Neither device memory nor page-locked (cudaMallocHost, cudaHostRegister): pageable.
  const bool src_pageable = !ft::emu::in_gpu_memory(src, n);
  const bool dst_pageable = !ft::emu::in_gpu_memory(dst, n);
  // A pageable source is read now (before the lock: a checkpoint's load may be large).
  std::shared_ptr<std::vector<char>> bytes;
  if (src_pageable)
    bytes = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                static_cast<const char*>(src) + n);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());  // check and record
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  if ((src_pageable || dst_pageable) && ft::emu::capturing(stream))  // stream capture above
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
  if (src_pageable) {
    ft::emu::submit(stream, [dst, bytes] { std::memmove(dst, bytes->data(), bytes->size()); });
  } else {
    ft::emu::submit(stream, [dst, src, n] { std::memmove(dst, src, n); });
  }
  if (dst_pageable) {
    ft::emu::run_queue(*ft::emu::queue_of(stream));
    ft::emu::raise_failure();
  }
  return cudaSuccess;
}

cudaError_t fill(void* dst, int value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(rt().mutex);
    if (!ft::emu::in_device(dst, n)) return fail(cudaErrorInvalidValue);
  }
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());  // check and record
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  ft::emu::submit(stream, [dst, value, n] { std::memset(dst, value, n); });
  return cudaSuccess;
}

}  // namespace

// Allocation and the synchronous frees are potentially unsafe calls under a stream capture.
cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  return device_alloc(devPtr, size);
}
// cudaFree, cudaFreeHost and cudaHostUnregister synchronise the device first, as the runtime.
cudaError_t cudaFree(void* devPtr) {
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  ft::emu::run_all();
  return device_free(devPtr);
}
// In a capture these would be graph memory nodes, which the emulation does not record.
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (ft::emu::capturing(stream))
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
  return device_alloc(devPtr, size);
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());  // check and record
  if (ft::emu::capturing(stream))
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  ft::emu::submit(stream, [devPtr] { device_free(devPtr); });
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  return host_alloc(ptr, size);
}
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
  return cudaMallocHost(pHost, size);
}
cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  ft::emu::run_all();
  std::lock_guard<std::mutex> lock(rt().mutex);
  auto it = rt().pinned.find(static_cast<char*>(ptr));
  if (it == rt().pinned.end()) return fail(cudaErrorInvalidValue);
  rt().pinned_bytes -= it->second;
  rt().pinned.erase(it);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

// The synchronous forms are the legacy stream's: after the blocking streams' work, done when
// they return (the non-blocking streams' work is not waited for, as on a GPU).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return copy(dst, src, count, kind, stream);
}
cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return fill(devPtr, value, count, nullptr);
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return fill(devPtr, value, count, stream);
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(rt().mutex);
  *total = ft::emu::total_memory();
  *free = *total - rt().device_bytes;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (!pStream) return fail(cudaErrorInvalidValue);
  auto* s = new CUstream_st{flags, nullptr};
  {
    std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
    s->queue = ft::emu::new_queue(!(flags & cudaStreamNonBlocking));
  }
  std::lock_guard<std::mutex> lock(rt().mutex);
  rt().streams.insert(s);
  *pStream = s;
  return cudaSuccess;
}
// The runtime lets a destroyed stream's work finish; here it runs now.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!valid_stream(stream) || reinterpret_cast<uintptr_t>(stream) <= 2)
    return fail(cudaErrorInvalidResourceHandle);
  if (ft::emu::capturing(stream))
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
  {
    std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
    ft::emu::run_queue(*stream->queue);
  }
  std::lock_guard<std::mutex> lock(rt().mutex);
  if (!rt().streams.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (ft::emu::capturing(stream))
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  ft::emu::run_queue(*ft::emu::queue_of(stream));
  ft::emu::raise_failure();
  return cudaSuccess;
}
// Runs the work rather than answer cudaErrorNotReady: a caller that polls would otherwise wait
// for ever on work nothing else forces.
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
// Waits for the event's latest record as of this call (a record never made: nothing to wait for).
// In a capture: a wait on an event recorded in it joins the stream to the capture (a fork) or
// adds the event's nodes to what the stream's next node follows (a join).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (!valid_stream(stream) || !valid_event(event)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  const std::shared_ptr<ft::emu::EventRecord> r = event->last;
  const std::shared_ptr<ft::emu::Queue> q = ft::emu::queue_of(stream);
  if (r && r->capture) {
    if (r->capture->ended) return fail(cudaErrorCapturedEvent);
    if (r->capture->invalid != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
    if (q->legacy) return fail(ft::emu::refuse_in_capture(nullptr, cudaErrorStreamCaptureImplicit));
    if (!q->capture) {  // a fork: the stream records into the event's capture from here
      q->capture = r->capture;
      q->tail = r->nodes;
      r->capture->members.push_back(q);
    } else if (q->capture != r->capture) {
      return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureMerge));
    } else {
      for (const size_t n : r->nodes)
        if (std::find(q->tail.begin(), q->tail.end(), n) == q->tail.end()) q->tail.push_back(n);
    }
    return cudaSuccess;
  }
  if (q->capture && r)  // on work outside the capture: refused (stream capture above)
    return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureIsolation));
  if (r) ft::emu::submit(stream, [r] { ft::emu::run_until(*r->queue, r->seq); });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->flags = flags;
  std::lock_guard<std::mutex> lock(rt().mutex);
  rt().events.insert(e);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_stream(stream) || !valid_event(event)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  if (const std::shared_ptr<ft::emu::Queue> q = ft::emu::queue_of(stream); q->capture) {
    auto r = std::make_shared<ft::emu::EventRecord>();
    r->capture = q->capture;
    r->nodes = q->tail;
    event->last = r;
    return cudaSuccess;
  }
  auto r = std::make_shared<ft::emu::EventRecord>();
  r->queue = ft::emu::queue_of(stream);
  r->seq = r->queue->enqueued + 1;  // the marker below
  event->last = r;
  ft::emu::submit(stream, [r] {
    r->done = true;
    r->time = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!valid_event(event)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (event->last && event->last->capture) return fail(cudaErrorCapturedEvent);
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  if (std::shared_ptr<ft::emu::EventRecord> r = event->last) ft::emu::run_until(*r->queue, r->seq);
  ft::emu::raise_failure();
  return cudaSuccess;
}
// As cudaStreamQuery: runs the work rather than answer cudaErrorNotReady.
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!valid_event(start) || !valid_event(end)) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle);
  // As the runtime documents it: an event never recorded is an invalid handle here, one whose
  // recorded work has not run yet is not ready.
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (!start->last || !end->last) return fail(cudaErrorInvalidResourceHandle);
  if (start->last->capture || end->last->capture) return fail(cudaErrorCapturedEvent);
  if (!start->last->done || !end->last->done) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->last->time - start->last->time).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(rt().mutex);
  if (!rt().events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  {
    std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
    const auto captures = ft::emu::active_captures();
    for (const auto& c : captures) ft::emu::invalidate(*c, cudaErrorStreamCaptureUnsupported);
    if (!captures.empty()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  ft::emu::run_all();
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  ft::emu::raise_failure();
  return cudaSuccess;
}
// ---- stream capture and graphs (ft::emu "stream capture" above) -------------------------------
namespace {
std::set<cudaGraph_t>& graphs() {
  static auto* g = new std::set<cudaGraph_t>;
  return *g;
}
std::set<cudaGraphExec_t>& graph_execs() {
  static auto* g = new std::set<cudaGraphExec_t>;
  return *g;
}
}  // namespace

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  const std::shared_ptr<ft::emu::Queue> q = ft::emu::queue_of(stream);
  if (q->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  if (q->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<ft::emu::Capture>();
  c->mode = mode;
  c->owner = std::this_thread::get_id();
  c->origin = q;
  c->members.push_back(q);
  q->capture = c;
  q->tail.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (!pGraph) return fail(cudaErrorInvalidValue);
  *pGraph = nullptr;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  const std::shared_ptr<ft::emu::Queue> q = ft::emu::queue_of(stream);
  if (!q->capture) return fail(cudaErrorIllegalState);
  const std::shared_ptr<ft::emu::Capture> c = q->capture;
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  if (c->origin.lock() != q) {
    ft::emu::invalidate(*c, cudaErrorStreamCaptureUnmatched);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  // Every node must come before the origin's last ones (the forks joined back).
  std::vector<bool> joined(c->nodes.size(), false);
  std::vector<size_t> todo = q->tail;
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (joined[n]) continue;
    joined[n] = true;
    todo.insert(todo.end(), c->deps[n].begin(), c->deps[n].end());
  }
  if (c->invalid == cudaSuccess && std::find(joined.begin(), joined.end(), false) != joined.end())
    ft::emu::invalidate(*c, cudaErrorStreamCaptureUnjoined);
  for (const auto& w : c->members)
    if (std::shared_ptr<ft::emu::Queue> m = w.lock()) {
      m->capture = nullptr;
      m->tail.clear();
    }
  c->ended = true;
  if (c->invalid == cudaErrorStreamCaptureUnjoined) return fail(cudaErrorStreamCaptureUnjoined);
  if (c->invalid != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
  auto* g = new CUgraph_st{
      std::make_shared<const std::vector<std::function<void()>>>(std::move(c->nodes)),
      c->collectives};
  graphs().insert(g);
  *pGraph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  if (!status) return fail(cudaErrorInvalidValue);
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  const std::shared_ptr<ft::emu::Queue> q = ft::emu::queue_of(stream);
  if (q->legacy)  // an implicit synchronisation with a blocking capture: refused, not invalidating
    for (const auto& c : ft::emu::active_captures())
      for (const auto& w : c->members)
        if (std::shared_ptr<ft::emu::Queue> m = w.lock(); m && m->blocking)
          return fail(cudaErrorStreamCaptureImplicit);
  *status = !q->capture                          ? cudaStreamCaptureStatusNone
            : q->capture->invalid == cudaSuccess ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long) {
  if (!pGraphExec) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (!graphs().count(graph)) return fail(cudaErrorInvalidValue);
  // FT_CUDA_EMU_GRAPH_INSTANTIATE=fail: every instantiation fails, as a graph the driver cannot
  // instantiate would, so that a caller's way back to launching op by op runs in tests;
  // fail@R: only in the process of MPI world rank R (OMPI_COMM_WORLD_RANK or PMI_RANK).
  if (const char* v = std::getenv("FT_CUDA_EMU_GRAPH_INSTANTIATE")) {
    const std::string mode = v;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = std::getenv("PMI_RANK");
    if (mode == "fail" || (rank && mode == "fail@" + std::string(rank)))
      return fail(cudaErrorNotSupported);
  }
  auto* e = new CUgraphExec_st{graph->nodes, graph->collectives};
  graph_execs().insert(e);
  *pGraphExec = e;
  return cudaSuccess;
}

// The graph's nodes run in their recorded order as one operation of the stream. A graph that
// holds emulated NCCL calls runs at its launch, after the stream's work queued before it (as an
// NCCL call does, nccl_emu.cpp: deferred, its collectives would meet the peers' in another
// order than the program's), on the launching thread and outside the streams' lock, as an NCCL
// call runs: while its collectives wait for the peers, other threads (the collective watchdog's
// event queries) go on using the runtime. A node's failure is raised by the launch.
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
  {
    std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
    if (!graph_execs().count(graphExec)) return fail(cudaErrorInvalidValue);
    if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
    if (ft::emu::capturing(stream))  // a child graph: not recorded by the emulation
      return fail(ft::emu::refuse_in_capture(stream, cudaErrorStreamCaptureUnsupported));
    if (!graphExec->collectives) {
      ft::emu::submit(stream, [nodes = graphExec->nodes] {
        for (const std::function<void()>& node : *nodes) node();
      });
      return cudaSuccess;
    }
    ft::emu::run_queue(*ft::emu::queue_of(stream));
    ft::emu::raise_failure();
    nodes = graphExec->nodes;
  }
  for (const std::function<void()>& node : *nodes) node();
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (!graph_execs().erase(graphExec)) return fail(cudaErrorInvalidValue);
  delete graphExec;  // a launch still queued holds the nodes
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());
  if (!graphs().erase(graph)) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = ft::emu::t_last_error;
  ft::emu::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return ft::emu::t_last_error; }

// The errors the emulation answers, each with its name and a description (the runtime's where
// the emulation had them before, else its own words).
#define FT_EMU_ERRORS(X)                                                                           \
  X(cudaSuccess, "no error")                                                                       \
  X(cudaErrorInvalidValue, "invalid argument")                                                     \
  X(cudaErrorMemoryAllocation, "out of memory")                                                    \
  X(cudaErrorInvalidConfiguration, "invalid configuration argument")                               \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                                              \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                     \
  X(cudaErrorNotReady, "device not ready")                                                         \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                       \
  X(cudaErrorInvalidDeviceFunction, "invalid device function")                                     \
  X(cudaErrorHostMemoryAlreadyRegistered,                                                          \
    "part or all of the requested memory range is already mapped")                                 \
  X(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region") \
  X(cudaErrorInsufficientDriver, "the driver is older than the runtime")                           \
  X(cudaErrorNotSupported, "operation not supported")                                              \
  X(cudaErrorIllegalState, "the resource is in a state that does not allow the call")              \
  X(cudaErrorStreamCaptureUnsupported, "the call is not allowed while a stream is captured")       \
  X(cudaErrorStreamCaptureInvalidated, "the stream capture was invalidated by an earlier error")   \
  X(cudaErrorStreamCaptureMerge, "the call would merge two separate stream captures")              \
  X(cudaErrorStreamCaptureUnmatched, "the capture was not begun on this stream")                   \
  X(cudaErrorStreamCaptureUnjoined, "a stream forked from the capture was not joined back")        \
  X(cudaErrorStreamCaptureIsolation, "the call would depend on work outside the capture")          \
  X(cudaErrorStreamCaptureImplicit, "the call would synchronise implicitly with a capture")        \
  X(cudaErrorCapturedEvent, "the event was recorded in a stream capture")                          \
  X(cudaErrorStreamCaptureWrongThread, "the capture was begun on another thread")

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define FT_EMU_NAME(code, text) \
  case code:                    \
    return #code;
    FT_EMU_ERRORS(FT_EMU_NAME)
#undef FT_EMU_NAME
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
#define FT_EMU_TEXT(code, text) \
  case code:                    \
    return text;
    FT_EMU_ERRORS(FT_EMU_TEXT)
#undef FT_EMU_TEXT
    default:
      return "unrecognized error code (CUDA emulation)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = ft::emu::device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= ft::emu::device_count()) return fail(cudaErrorInvalidDevice);
  ft::emu::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = ft::emu::t_device;
  return cudaSuccess;
}
// "0000:01:00.0" for GPU 0, "0000:02:00.0" for GPU 1 (hex): the ids the emulated NVML
// (nvml_emu.cpp) finds its GPUs by.
cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (!pciBusId || len < 13) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= ft::emu::device_count()) return fail(cudaErrorInvalidDevice);
  std::snprintf(pciBusId, size_t(len), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= ft::emu::device_count()) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulation (test tool)");
  prop->totalGlobalMem = ft::emu::total_memory();
  prop->sharedMemPerBlock = ft::emu::kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = ft::emu::kOptinSharedBytes;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;  // the kernels' newest target (sm_90a)
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  cudaDeviceProp p;
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = int(p.sharedMemPerBlock);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = int(p.sharedMemPerBlockOptin);
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      break;
    case cudaDevAttrWarpSize:
      *value = p.warpSize;
      break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (!driverVersion) return fail(cudaErrorInvalidValue);
  *driverVersion = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (!runtimeVersion) return fail(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints only
  if (value < 0 || size_t(value) > ft::emu::kOptinSharedBytes) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(rt().mutex);
  rt().max_shared[func] = size_t(value);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(pStream, flags);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = 0;  // one priority, as a device without priorities
  return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int) {
  return cudaEventRecord(event, stream);
}
// The host function runs in stream order, on the thread that runs the stream's work.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (!fn) return fail(cudaErrorInvalidValue);
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lock(ft::emu::stream_mutex());  // check and record
  if (const cudaError_t e = ft::emu::capture_gate(stream); e != cudaSuccess) return fail(e);
  ft::emu::submit(stream, [fn, userData] { fn(userData); });
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  if (!ptr || size == 0) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  std::lock_guard<std::mutex> lock(rt().mutex);
  if (!rt().registered.emplace(static_cast<char*>(ptr), size).second)
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
  if (const cudaError_t e = ft::emu::unsafe_call(cudaErrorStreamCaptureUnsupported)) return fail(e);
  ft::emu::run_all();
  std::lock_guard<std::mutex> lock(rt().mutex);
  if (!rt().registered.erase(static_cast<char*>(ptr)))
    return fail(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return fail(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof *attributes);
  std::lock_guard<std::mutex> lock(rt().mutex);
  const char* c = static_cast<const char*>(ptr);
  auto inside = [&](const std::map<const char*, size_t>& m) {
    auto it = m.upper_bound(c);
    return it != m.begin() && c < std::prev(it)->first + std::prev(it)->second;
  };
  if (ft::emu::in_device(ptr, 1)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (inside(rt().pinned) || inside(rt().registered)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  attributes->device = ft::emu::t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDeviceFlags(unsigned int) { return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }  // allocations stay: tests own them
