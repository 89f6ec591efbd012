// NcclCommunicator: the Communicator of comm/communicator.h on NCCL, for GPU memory. Each call
// is ordered after the work queued on the caller's stream by an event, runs on the
// communicator's own stream (so compute queued after it overlaps it), and returns a handle
// holding an event recorded after it: wait() blocks the host on that event, wait_on(s) makes
// stream s wait for it on the device.
//
// Buffers: the callers' buffers come from the device's caching allocator, which hands a freed
// block to the next allocation on the compute stream at once. So a buffer a call reads or
// writes must not be freed before the call is ordered on the compute stream again: every
// caller waits on the handle (wait_on(dev.stream()) or wait()) before it frees the buffer.
//
// The collective watchdog (runtime.collective_timeout_s, DESIGN §4). An NCCL call returns before
// the GPU has done it and can hang inside the GPU, where no host wait sees it. So each call is
// registered, before it is made, with its label, the step it belongs to and its deadline (the
// MPI communicator's: the step timeout inside the step loop, the longer one elsewhere), and an
// event recorded after it once it has returned. A watchdog thread (as PyTorch's ProcessGroupNCCL
// has) polls those events and ncclCommGetAsyncError every 10 ms. When a call is past its
// deadline it calls ncclCommAbort on every communicator, so that whatever waits on the device
// returns, and the main thread, at its next NCCL call or handle wait (which polls the event,
// answering the other ranks' status requests meanwhile), reports it through the MPI
// communicator's watchdog (report_device_hang: the other ranks' state, the same message, exit
// 3). MPI stays FUNNELED: the thread makes no MPI call. Should the main thread not come back
// within kTakeoverS (blocked elsewhere on the device), the thread prints what it knows and ends
// the process with exit 3 itself. An asynchronous error ends the job the same way, exit 1.
//
// Built twice from this file (CMakeLists.txt): ft_nccl, against the real NCCL opened on first
// use (dlopen of libnccl.so.2: the library is large, and a CPU-only process never needs it),
// and ft_nccl_emu, against the emulated NCCL (tests/cuda_emu/nccl_emu.cpp, a test tool) for
// ft_emu.
#include <cuda_runtime.h>
#include <nccl.h>

#if !defined(FT_CUDA_EMU)
#include <dlfcn.h>
#endif

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_comm.h"
#include "comm/hang_report.h"
#include "core/error.h"
#include "core/log.h"

namespace ft {

namespace {

// The NCCL versions ft is built and tested against (DESIGN §3): ncclCommSplit needs 2.18.
constexpr int kMinNcclVersion = 21800;

#define FT_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)          \
  X(ncclGetErrorString)      \
  X(ncclGetLastError)        \
  X(ncclGetUniqueId)         \
  X(ncclCommInitRank)        \
  X(ncclCommSplit)           \
  X(ncclCommDestroy)         \
  X(ncclCommAbort)           \
  X(ncclCommGetAsyncError)   \
  X(ncclAllReduce)           \
  X(ncclReduceScatter)       \
  X(ncclAllGather)           \
  X(ncclBroadcast)           \
  X(ncclSend)                \
  X(ncclRecv)                \
  X(ncclGroupStart)          \
  X(ncclGroupEnd)
struct NcclApi {
#define FT_NCCL_MEMBER(f) decltype(&::f) f = nullptr;
  FT_NCCL_FUNCTIONS(FT_NCCL_MEMBER)
#undef FT_NCCL_MEMBER
  int version = 0;    // NCCL_VERSION_CODE of the library loaded
  std::string error;  // why it cannot be used; empty when it can
};

NcclApi load_nccl_api() {
  NcclApi api;
#if defined(FT_CUDA_EMU)
#define FT_NCCL_SET(f) api.f = &::f;
  FT_NCCL_FUNCTIONS(FT_NCCL_SET)
#undef FT_NCCL_SET
#else
  const std::string name = "libnccl.so." + std::to_string(NCCL_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    api.error = detail::concat("cannot load ", name, ": ", dlerror(),
                               " (NCCL's library folder must be on the loader's path: ldconfig "
                               "or LD_LIBRARY_PATH)");
    return api;
  }
#define FT_NCCL_SET(f)                                                               \
  api.f = reinterpret_cast<decltype(&::f)>(dlsym(lib, #f));                          \
  if (!api.f) {                                                                      \
    api.error = detail::concat(name, " has no ", #f, " (an NCCL older than 2.18?)"); \
    return api;                                                                      \
  }
  FT_NCCL_FUNCTIONS(FT_NCCL_SET)
#undef FT_NCCL_SET
#endif
  if (api.ncclGetVersion(&api.version) != ncclSuccess)
    api.error = "ncclGetVersion failed";
  else if (api.version < kMinNcclVersion || api.version / 10000 != NCCL_MAJOR)
    api.error = detail::concat("NCCL ", api.version / 10000, ".", api.version / 100 % 100, ".",
                               api.version % 100, " is outside the supported range (2.18 to ",
                               NCCL_MAJOR, ".x)");
  return api;
}

const NcclApi& nccl() {
  static const NcclApi api = load_nccl_api();
  return api;
}

std::string version_string(int v) {
  return detail::concat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

void check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string detail_msg;
  if (nccl().ncclGetLastError) {
    const char* last = nccl().ncclGetLastError(comm);
    if (last && *last) detail_msg = std::string(" (") + last + ")";
  }
  throw Error(detail::concat("NCCL ", what, " failed: ", nccl().ncclGetErrorString(r), detail_msg,
                             "; NCCL_DEBUG=WARN prints NCCL's own account"));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(detail::concat("CUDA ", what, " failed: ", cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kU8:
      return ncclUint8;
    case DType::kI32:
      return ncclInt32;
    case DType::kU32:
      return ncclUint32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU64:
      return ncclUint64;
    case DType::kU16:
      break;
  }
  FT_FAIL("no NCCL type for dtype ", dtype_name(t));
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// How long the watchdog thread waits, after aborting, for the main thread to report.
constexpr double kTakeoverS = 15.0;

// ncclCommAbort of each of `comms`, from a thread of its own, waited for at most `wait_s`:
// since NCCL 2.26 the call returns only once every CUDA graph that recorded the communicator's
// calls is destroyed (FT_CUDA_GRAPHS), which a process ending on an error may never do.
void abort_comms(std::vector<ncclComm_t> comms, double wait_s) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([comms = std::move(comms), done] {
    for (ncclComm_t c : comms) nccl().ncclCommAbort(c);
    *done = true;
  }).detach();
  const auto t0 = Clock::now();
  while (!*done && seconds_since(t0) < wait_s)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// The watchdog of the header comment: one per process, its thread runs while communicators exist.
class DeviceWatchdog {
 public:
  static DeviceWatchdog& get() {
    static DeviceWatchdog* dog = new DeviceWatchdog;  // never destroyed: its thread may outlive
    return *dog;                                      // the static destructors' order
  }

  void add_comm(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
    if (!thread_.joinable()) {
      stop_ = false;
      int device = 0;  // the thread queries events of this thread's device
      cudaGetDevice(&device);
      thread_ = std::thread([this, device] {
        cudaSetDevice(device);
        run();
      });
    }
  }
  // Whether the watchdog aborted it (then it must not be destroyed: ncclCommAbort freed it).
  bool remove_comm(ncclComm_t c) {
    std::thread done;
    bool was_aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
      was_aborted = std::find(aborted_.begin(), aborted_.end(), c) != aborted_.end();
      if (comms_.empty() && thread_.joinable() && state_ == kWatching) {
        stop_ = true;
        done = std::move(thread_);
      }
    }
    if (done.joinable()) done.join();
    return was_aborted;
  }

  void set_world_rank(int r) { world_rank_ = r; }

  // Registers a call about to be made; 0 when the watchdog is off (timeout 0).
  uint64_t begin(const std::string& label) {
    const WatchStep at = watch_step();
    const CollectiveWatch& w = collective_watch();
    const double timeout_s = at.step > 0 && !at.long_wait ? w.step_timeout_s : w.other_timeout_s;
    if (timeout_s <= 0) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back({++next_id_, label, at, Clock::now(), timeout_s, nullptr});
    return next_id_;
  }
  // The call has returned: its end is the event recorded on `stream` now (null: it failed, and
  // is no longer watched). The event comes from free_events_, which the thread refills with the
  // events of calls it has seen complete: a step of thousands of collectives creates only as
  // many events as calls are ever watched at once, not one per call. (All of them on one
  // device: a process drives one GPU, and its communicators all live there.)
  void returned(uint64_t id, cudaStream_t stream) {
    if (id == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto it =
        std::find_if(work_.begin(), work_.end(), [&](const Watched& w) { return w.id == id; });
    if (it == work_.end()) return;
    cudaEvent_t e = nullptr;
    if (stream) {
      if (!free_events_.empty()) {
        e = free_events_.back();
        free_events_.pop_back();
      } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
        ++events_created_;
      } else {
        e = nullptr;
      }
      if (e && cudaEventRecord(e, stream) != cudaSuccess) {
        cudaEventDestroy(e);
        e = nullptr;
      }
    }
    if (e)
      it->done = e;
    else
      work_.erase(it);
  }
  NcclWatchdogEvents events() {
    std::lock_guard<std::mutex> lock(mu_);
    return {events_created_, work_.size()};
  }

  // Main thread, at each call and while waiting: once the watchdog has fired, reports (a hang:
  // exit 3) or throws (an asynchronous error).
  void check_fired() {
    const int st = state_.load();
    if (st == kWatching) return;
    taken_ = true;
    if (st == kHung) report_device_hang(cause_.label, cause_.at, waited_s_, cause_.timeout_s);
    throw Error(async_error_);
  }

 private:
  struct Watched {
    uint64_t id;
    std::string label;
    WatchStep at;
    Clock::time_point t0;
    double timeout_s;
    cudaEvent_t done;  // recorded after the call once it returned; null while inside it
  };
  enum : int { kWatching = 0, kHung = 1, kAsyncError = 2 };

  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::vector<ncclComm_t> to_abort;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        // Done calls leave, their events back to the pool (one whose query failed is destroyed);
        // the oldest call left is the one furthest past its deadline.
        work_.erase(std::remove_if(work_.begin(), work_.end(),
                                   [this](Watched& w) {
                                     if (!w.done) return false;
                                     const cudaError_t q = cudaEventQuery(w.done);
                                     if (q == cudaErrorNotReady) return false;
                                     if (q == cudaSuccess)
                                       free_events_.push_back(w.done);
                                     else
                                       cudaEventDestroy(w.done);
                                     return true;
                                   }),
                    work_.end());
        for (const Watched& w : work_) {
          const double waited = seconds_since(w.t0);
          if (waited > w.timeout_s) {
            cause_ = w;
            waited_s_ = waited;
            state_ = kHung;
            break;
          }
        }
        if (state_ == kWatching) {
          for (ncclComm_t c : comms_) {
            ncclResult_t err = ncclSuccess;
            if (nccl().ncclCommGetAsyncError(c, &err) == ncclSuccess && err != ncclSuccess &&
                err != ncclInProgress) {
              async_error_ = detail::concat(
                  "NCCL reported an asynchronous error on rank ", world_rank_, ": ",
                  nccl().ncclGetErrorString(err),
                  " (a peer gone or a network failure; NCCL_DEBUG=WARN prints NCCL's account)");
              state_ = kAsyncError;
              break;
            }
          }
        }
        if (state_ == kWatching) continue;
        to_abort = comms_;
        aborted_ = comms_;
      }
      // Whatever waits on the device returns once its communicators are aborted (not waited
      // for here: the takeover below must come whatever the aborts do).
      abort_comms(std::move(to_abort), 0);
      const auto t0 = Clock::now();
      while (!taken_ && seconds_since(t0) < kTakeoverS)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (taken_) return;
      // The main thread is blocked elsewhere: end the process with what this rank knows.
      std::string msg;
      if (state_ == kHung) {
        RankStatus self;
        self.rank = world_rank_;
        self.step = cause_.at.step;
        self.phase = cause_.at.phase;
        self.waiting_in = cause_.label;
        self.waited_s = waited_s_;
        msg = hang_message_unasked(
            self, cause_.timeout_s,
            "the communicators were aborted, but this rank's main thread did not come back from "
            "the device to ask the other ranks where they are");
      } else {
        msg = async_error_;
      }
      note_job_cause(msg);
      log_error(msg);
      std::_Exit(state_ == kHung ? int(ExitCode::kHung) : int(ExitCode::kRuntime));
    }
  }

  std::mutex mu_;
  int world_rank_ = 0;
  std::vector<Watched> work_;
  std::vector<cudaEvent_t> free_events_;  // recorded before, completed, ready to record again
  uint64_t events_created_ = 0;
  std::vector<ncclComm_t> comms_, aborted_;
  uint64_t next_id_ = 0;
  std::thread thread_;
  bool stop_ = false;
  std::atomic<int> state_{kWatching};
  std::atomic<bool> taken_{false};
  Watched cause_{};  // written before state_ leaves kWatching, read after
  double waited_s_ = 0;
  std::string async_error_;
};

uint64_t g_call_seq = 0;  // this rank's NCCL calls, numbered for the watchdog's messages

// A call in flight: the event recorded on the communication stream after it. A host wait polls
// it, answering the other ranks' status requests, until it completes or the watchdog fires.
class NcclWork final : public CommWork::Pending {
 public:
  NcclWork(Device& dev, Event done, std::string label, bool recorded)
      : dev_(dev), done_(std::move(done)), label_(std::move(label)), recorded_(recorded) {}
  void wait() override {
    // Its event marks a point of the graph being recorded: only that capture's streams may wait
    // for it (wait_on), and only until it ends.
    FT_CHECK(!recorded_, label_, " was recorded into a graph, and the host cannot wait for it");
    if (done_.query()) return;
    device_wait_begin(label_);
    const auto t0 = Clock::now();
    int sleep_us = 0;
    while (!done_.query()) {
      DeviceWatchdog::get().check_fired();
      answer_watchdog_requests();
      if (seconds_since(t0) < 0.05) {
        sched_yield();
      } else {
        sleep_us = std::min(1000, std::max(20, sleep_us * 2));
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      }
    }
    device_wait_end();
  }
  void wait_on(Stream s) override { dev_.wait(s, done_); }

 private:
  Device& dev_;
  Event done_;
  std::string label_;
  bool recorded_;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; `host` is the same group over MPI (barrier, abort, messages).
  NcclCommunicator(ncclComm_t comm, std::unique_ptr<Communicator> host, Device& dev)
      : comm_(comm), host_(std::move(host)), dev_(dev) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (NCCL's stream)");
    DeviceWatchdog::get().add_comm(comm_);
  }
  ~NcclCommunicator() override {
    // Null after abort(); aborted (and freed) by the watchdog: not destroyed again.
    const bool aborted = comm_ && DeviceWatchdog::get().remove_comm(comm_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (comm_ && !aborted) nccl().ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) override {
    return call(
        s, op == ReduceOp::kSum ? "all_reduce_sum" : "all_reduce_max", -1, "all-reduce", [&] {
          return nccl().ncclAllReduce(data.ptr, data.ptr, n, nccl_type(data.dtype),
                                      op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_);
        });
  }
  CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "reduce_scatter of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    return call(s, "reduce_scatter_sum", -1, "reduce-scatter", [&] {
      return nccl().ncclReduceScatter(in.ptr, out.ptr, shard, nccl_type(in.dtype), ncclSum, comm_,
                                      stream_);
    });
  }
  CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "all_gather of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    return call(s, "all_gather", -1, "all-gather", [&] {
      return nccl().ncclAllGather(in.ptr, out.ptr, shard, nccl_type(in.dtype), comm_, stream_);
    });
  }
  CommWork broadcast(Stream s, Ref data, size_t n, int root) override {
    return call(s, "broadcast", -1, "broadcast", [&] {
      return nccl().ncclBroadcast(data.ptr, data.ptr, n, nccl_type(data.dtype), root, comm_,
                                  stream_);
    });
  }
  CommWork send(Stream s, CRef data, size_t n, int peer, int) override {
    return call(s, "send", -1, "send", [&] {
      return nccl().ncclSend(data.ptr, n, nccl_type(data.dtype), peer, comm_, stream_);
    });
  }
  CommWork recv(Stream s, Ref data, size_t n, int peer, int) override {
    return call(s, "recv", peer, "receive", [&] {
      return nccl().ncclRecv(data.ptr, n, nccl_type(data.dtype), peer, comm_, stream_);
    });
  }
  CommWork send_recv(Stream s, CRef send_data, size_t send_n, int send_peer, Ref recv_data,
                     size_t recv_n, int recv_peer, int, int) override {
    return call(s, recv_n ? "send_recv" : "send", recv_n ? recv_peer : -1, "send and receive", [&] {
      ncclResult_t r = nccl().ncclGroupStart();
      if (r == ncclSuccess && send_n)
        r = nccl().ncclSend(send_data.ptr, send_n, nccl_type(send_data.dtype), send_peer, comm_,
                            stream_);
      if (r == ncclSuccess && recv_n)
        r = nccl().ncclRecv(recv_data.ptr, recv_n, nccl_type(recv_data.dtype), recv_peer, comm_,
                            stream_);
      const ncclResult_t end = nccl().ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  bool records_in_graphs() const override { return true; }
  void watched_launch(Stream s, const char* what, const std::function<void()>& launch) override {
    DeviceWatchdog& dog = DeviceWatchdog::get();
    dog.check_fired();
    std::string label = call_label(what, ++g_call_seq, -1);
    const uint64_t id = dog.begin(label);
    device_wait_begin(label);  // the emulated NCCL makes the calls inside the launch
    try {
      launch();
    } catch (...) {  // not launched: no longer watched
      device_wait_end();
      dog.returned(id, nullptr);
      throw;
    }
    dog.check_fired();  // aborted during the launch (the emulated NCCL's): that is the cause
    device_wait_end();
    dog.returned(id, static_cast<cudaStream_t>(s.handle));
  }
  void barrier() override { host_->barrier(); }
  void abort(int code) override {
    if (comm_ && !DeviceWatchdog::get().remove_comm(comm_)) abort_comms({comm_}, 5.0);
    comm_ = nullptr;
    host_->abort(code);
  }
  std::string describe() const override {
    return "nccl " + version_string(nccl().version) + " (" + host_->describe() + ")";
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_->split(color, key);
    ncclComm_t sub = nullptr;
    check(nccl().ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit", comm_);
    FT_CHECK(sub, "ncclCommSplit gave no communicator for color ", color);
    return std::make_unique<NcclCommunicator>(sub, std::move(host), dev_);
  }
  void set_name(const std::string& name) override { host_->set_name(name); }
  std::string call_label(const char* op, uint64_t seq, int peer) const override {
    return host_->call_label(op, seq, peer) + " through NCCL";
  }

 private:
  // One call (or group of calls): ordered after the work queued on `s`, watched from before it
  // is made (the emulated NCCL runs it inside the call) until its event completes. Where `s` is
  // capturing a graph, the communication stream joins the capture (after), and the call is
  // recorded into the graph, made at each launch: watched then, with the launch
  // (watched_launch), not now.
  template <typename F>
  CommWork call(Stream s, const char* op, int peer, const char* what, F&& make) {
    DeviceWatchdog& dog = DeviceWatchdog::get();
    dog.check_fired();
    after(s);
    std::string label = call_label(op, ++g_call_seq, peer);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    const bool recorded = capture != cudaStreamCaptureStatusNone;
    const uint64_t id = recorded ? 0 : dog.begin(label);
    device_wait_begin(label);
    const ncclResult_t r = make();
    if (r != ncclSuccess) dog.check_fired();  // aborted by the watchdog: that is the cause
    device_wait_end();
    dog.returned(id, r == ncclSuccess ? stream_ : nullptr);
    check(r, what, comm_);
    Event e = dev_.make_event();
    e.record(Stream{stream_});
    return CommWork(std::make_unique<NcclWork>(dev_, std::move(e), std::move(label), recorded));
  }
  // The communication stream waits for the work queued on `s` so far.
  void after(Stream s) {
    Event ready = dev_.make_event();
    ready.record(s);
    dev_.wait(Stream{stream_}, ready);
  }

  ncclComm_t comm_;
  std::unique_ptr<Communicator> host_;
  Device& dev_;
  cudaStream_t stream_ = nullptr;
};

std::string unusable_reason(Device& dev) {
  if (dev.kind() != DeviceKind::kCuda) return "the device is " + dev.name() + ", not a GPU";
  return nccl().error;
}

std::unique_ptr<Communicator> make_world(Communicator& world, Device& dev) {
  const std::string why = unusable_reason(dev);
  if (!why.empty()) throw Error("NCCL: " + why);
  ncclUniqueId id{};
  if (world.rank() == 0) check(nccl().ncclGetUniqueId(&id), "ncclGetUniqueId");
  world.broadcast_bytes(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  check(nccl().ncclCommInitRank(&comm, world.size(), id, world.rank()), "ncclCommInitRank");
  DeviceWatchdog::get().set_world_rank(world.rank());
  // The world's twin over MPI: a split of one color, so the NCCL world owns its own copy.
  return std::make_unique<NcclCommunicator>(comm, world.split(0, world.rank()), dev);
}

std::string description() {
  const NcclApi& api = nccl();
  return api.version ? "nccl " + version_string(api.version) : "nccl";
}

NcclWatchdogEvents watchdog_events() { return DeviceWatchdog::get().events(); }

const NcclBackend kBackend{unusable_reason, make_world, description, watchdog_events};

}  // namespace

const NcclBackend& this_nccl_backend() { return kBackend; }

}  // namespace ft
