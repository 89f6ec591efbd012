// Emulated NCCL (a test tool): the NCCL calls ft's NcclCommunicator makes
// (lib/comm/nccl_communicator.cpp), between the processes of an mpirun over MPI, on the
// emulated device memory (cuda_emu.cpp: host memory the emulator tracks). Declarations are the
// real nccl.h's. The semantics NCCL's documentation states, as far as ft relies on them:
//  - Stream order. A call reads its buffers after the work queued on its stream before it and
//    has written them before the work queued after it. A call here first runs its stream's
//    queued work (and what that waits for) and makes the stream eager (cuda_emu.cpp, "stream
//    order": a call deferred on one rank would leave the others waiting in theirs), then runs
//    when it is made (in a group: at the outermost ncclGroupEnd) and is complete when it
//    returns. The stream must be valid.
//  - Graphs (CUDA graphs; NCCL 2.9+). A collective on a capturing stream is recorded, not made:
//    a node of the graph makes it at each launch, the test hooks below striking that call, and
//    such a graph runs at its launch with the work queued before it on the launching stream
//    (cuda_emu.cpp, cudaGraphLaunch), so that its collectives meet the peers' in program order.
//    Sends, receives and groups on a capturing stream are not emulated (ncclInvalidUsage).
//  - Buffers are device memory: a host pointer is an error (ncclInvalidArgument), as on a GPU,
//    where it would be a crash.
//  - Groups: calls between ncclGroupStart and ncclGroupEnd are queued; at the outermost
//    ncclGroupEnd the sends and receives are all posted before any is waited on (two stages
//    exchanging both ways inside one group do not deadlock), then the collectives run in order.
//    A send completes only once its receive is posted (MPI_Issend), as NCCL's sends wait for the
//    receiver whatever their size: a schedule whose sends only work when buffered deadlocks
//    here as on GPUs (here the host waits, there the stream).
//  - ncclCommInitRank bootstraps from a ncclUniqueId made by ncclGetUniqueId on one rank and
//    handed to the others; here the world communicator must span the whole MPI world (every
//    rank checks the others passed the same id). ncclCommSplit is collective over its parent;
//    NCCL_SPLIT_NOCOLOR gives a null communicator.
//  - A fixed reduction order: every rank's contribution is gathered and summed in rank order
//    0, 1, …, n−1 (bf16/fp16: rounded after each addition, in fp32 between), so a result is
//    the same bits on every rank and every run, whatever the timing. Real NCCL's order depends
//    on its algorithm and topology, but is also fixed for a given communicator and size.
//  - Abort. A GPU's collective waits for its peers inside the device, where ncclCommAbort (from
//    another thread: ft's watchdog, comm/nccl_communicator.cpp) ends it. Here the host thread
//    waits for them inside the call, so the calls use non-blocking MPI and poll: an abort from
//    another thread (a flag; no MPI call, MPI is FUNNELED) ends the wait with ncclInvalidUsage,
//    and its buffers are left to MPI (never freed: the process is ending). The aborted
//    communicator's memory is kept, as the thread that waits still reads it. While it polls,
//    the host answers the collective watchdog's status requests (answer_watchdog_requests),
//    as ft's host would while a GPU ran the call: the host thread is taken only because this
//    emulation runs the device's work on it.
//  - ncclCommGetAsyncError: ncclSuccess unless the communicator was aborted (ncclInvalidUsage)
//    or FT_NCCL_EMU_ASYNC_ERROR struck it (below).
//  - FT_NCCL_EMU_STOP=RANK:STEP (a test hook): world rank RANK stops itself (SIGSTOP) at its
//    first data call (collective, send or receive) of training step STEP (1-based, as ft's
//    watchdog names steps), so that its peers wait in that call.
//  - FT_NCCL_EMU_ASYNC_ERROR=RANK:STEP (a test hook): at world rank RANK's first data call of
//    training step STEP, that call's communicator gets an asynchronous error, ncclRemoteError,
//    as real NCCL reports when a peer process died or a network operation failed: from then on
//    ncclCommGetAsyncError returns it, and the call never completes (the data it waits for
//    will not come), as a GPU's kernel would wait, until the communicator is aborted (the
//    call then returns ncclInvalidUsage). Its peers wait in their matching call.
// ncclGetLastError returns the last failure's message; bytes sent are tallied per call kind by
// the ring algorithms' counts (CountingCommunicator's formulas) and printed at exit when
// FT_NCCL_EMU_TALLY names a file (one line per kind), so ft plan can be checked against them.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/device_comm.h"
#include "core/half.h"

namespace ft::emu {
bool gpu_memory(const void* p, size_t n);
bool valid_stream_handle(const void* s);
bool stream_make_eager(const void* s);
bool stream_record_collective(const void* s, std::function<void()> op);
}  // namespace ft::emu

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL for a group of one made without MPI
  int rank = 0, size = 1;
  std::atomic<bool> aborted{false};                    // set by ncclCommAbort, from any thread
  std::atomic<ncclResult_t> async_error{ncclSuccess};  // FT_NCCL_EMU_ASYNC_ERROR's
};

namespace {

constexpr char kIdTag[] = "ft-nccl-emu";
std::string g_last_error;
int g_group_depth = 0;
std::vector<std::function<ncclResult_t()>> g_queued;  // collectives of the open group
struct P2p {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  ncclComm* comm;
};
std::vector<P2p> g_p2p;  // sends and receives of the open group
// The capturing stream the current call is recorded on (check_call), null when it runs.
cudaStream_t g_recording = nullptr;

// Bytes this process would have sent, by kind: all-reduce, reduce-scatter, all-gather,
// broadcast, send.
std::array<int64_t, 5> g_sent{};
int g_world_rank =
    0;  // set by ncclCommInitRank (MPI is finalized by the time the tally is written)
void write_tally() {
  const char* path = std::getenv("FT_NCCL_EMU_TALLY");
  if (!path || !*path) return;
  const std::string file = std::string(path) + "." + std::to_string(g_world_rank);
  if (FILE* f = std::fopen(file.c_str(), "w")) {
    const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast", "send"};
    for (size_t k = 0; k < g_sent.size(); ++k)
      std::fprintf(f, "%s %lld\n", names[k], (long long)g_sent[k]);
    std::fclose(f);
  }
}
struct TallyAtExit {
  TallyAtExit() { std::atexit(write_tally); }
} g_tally_at_exit;

ncclResult_t fail(ncclResult_t r, const std::string& why) {
  g_last_error = why;
  return r;
}

// A test hook's RANK:STEP from the environment variable `name`; rank -1 when unset or malformed.
std::pair<int, long long> hook_at(const char* name) {
  const char* e = std::getenv(name);
  int rank = -1;
  long long step = 0;
  if (e && std::sscanf(e, "%d:%lld", &rank, &step) != 2) rank = -1;
  return {rank, step};
}

// FT_NCCL_EMU_STOP (the header comment): stops this process at its first data call of a step.
void maybe_stop(int world_rank) {
  static const std::pair<int, long long> at = hook_at("FT_NCCL_EMU_STOP");
  static bool stopped = false;
  if (at.first == world_rank && !stopped && ft::watch_step().step == at.second) {
    stopped = true;
    std::raise(SIGSTOP);
  }
}

// FT_NCCL_EMU_ASYNC_ERROR (the header comment): at this process's first data call of a step,
// `comm` gets ncclRemoteError and the call waits until the communicator is aborted, answering
// the collective watchdog's status requests meanwhile (as wait_all does).
ncclResult_t maybe_async_error(int world_rank, ncclComm* comm, const char* what) {
  static const std::pair<int, long long> at = hook_at("FT_NCCL_EMU_ASYNC_ERROR");
  static bool struck = false;
  if (at.first != world_rank || struck || ft::watch_step().step != at.second) return ncclSuccess;
  struck = true;
  comm->async_error = ncclRemoteError;
  while (!comm->aborted) {
    ft::answer_watchdog_requests();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return fail(ncclInvalidUsage, std::string(what) + ": communicator aborted while waiting");
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// The checks every data call makes; a message naming what is wrong.
ncclResult_t check_call(const char* what, ncclComm* comm, ncclDataType_t type, cudaStream_t s,
                        std::initializer_list<std::pair<const void*, size_t>> buffers) {
  if (!comm) return fail(ncclInvalidArgument, std::string(what) + ": null communicator");
  if (comm->aborted) return fail(ncclInvalidUsage, std::string(what) + ": communicator aborted");
  if (!type_size(type)) return fail(ncclInvalidArgument, std::string(what) + ": bad data type");
  if (!ft::emu::valid_stream_handle(s))
    return fail(ncclInvalidArgument, std::string(what) + ": invalid stream");
  g_recording = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess ||
      capture == cudaStreamCaptureStatusInvalidated)
    return fail(ncclInvalidUsage, std::string(what) + ": the stream's capture is invalidated");
  if (capture == cudaStreamCaptureStatusActive) {
    if (g_group_depth > 0)
      return fail(ncclInvalidUsage,
                  std::string(what) + ": a group on a capturing stream (not emulated)");
    g_recording = s;
  } else if (!ft::emu::stream_make_eager(s)) {
    return fail(ncclInvalidUsage, std::string(what) + ": the stream began capturing meanwhile");
  }
  for (const auto& [p, bytes] : buffers)
    if (bytes && !ft::emu::gpu_memory(p, bytes))
      return fail(ncclInvalidArgument,
                  std::string(what) + ": a buffer is not device memory (a host pointer?)");
  if (g_recording) return ncclSuccess;  // the hooks strike the launch's call (run_or_queue)
  maybe_stop(g_world_rank);
  return maybe_async_error(g_world_rank, comm, what);
}

ncclResult_t mpi_result(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return ncclSuccess;
  return fail(ncclSystemError, std::string(what) + ": MPI call failed");
}

// Buffers of calls that an abort ended while MPI may still write them: kept to the end.
std::vector<std::vector<char>> g_orphans;

// Waits for `reqs` as a GPU's kernel waits for its peers, until they complete or one of `comms`
// is aborted (the header comment). Yields the core for the first 50 ms, then sleeps up to 1 ms
// between polls (as the MPI communicator's waits do); answers status requests every poll.
ncclResult_t wait_all(std::vector<MPI_Request>& reqs, std::initializer_list<ncclComm*> comms,
                      const char* what, std::initializer_list<std::vector<char>*> buffers = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  int sleep_us = 0;
  for (;;) {
    int done = 0;
    if (auto r = mpi_result(MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE),
                            what))
      return r;
    if (done) return ncclSuccess;
    for (ncclComm* c : comms)
      if (c->aborted) {
        for (std::vector<char>* b : buffers) g_orphans.push_back(std::move(*b));
        return fail(ncclInvalidUsage, std::string(what) + ": communicator aborted while waiting");
      }
    ft::answer_watchdog_requests();
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
      sched_yield();
    } else {
      sleep_us = std::min(1000, std::max(20, sleep_us * 2));
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }
}

// dst = dst op src, element-wise, `n` elements of `type`; 16-bit floats rounded after the step.
void combine(void* dst, const void* src, size_t n, ncclDataType_t type, ncclRedOp_t op) {
  auto apply = [op](auto a, auto b) { return op == ncclMax ? std::max(a, b) : a + b; };
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<T*>(dst);
    const auto* s = static_cast<const T*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = apply(d[i], s[i]);
  };
  auto run16 = [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<T*>(dst);
    const auto* s = static_cast<const T*>(src);
    for (size_t i = 0; i < n; ++i)
      d[i] = ft::from_f32<T>(apply(ft::to_f32(d[i]), ft::to_f32(s[i])));
  };
  switch (type) {
    case ncclFloat32:
      return run(float{});
    case ncclFloat64:
      return run(double{});
    case ncclInt32:
      return run(int32_t{});
    case ncclUint32:
      return run(uint32_t{});
    case ncclInt64:
      return run(int64_t{});
    case ncclUint64:
      return run(uint64_t{});
    case ncclInt8:
      return run(int8_t{});
    case ncclUint8:
      return run(uint8_t{});
    case ncclBfloat16:
      return run16(ft::bf16{});
    case ncclFloat16:
      return run16(ft::f16{});
    default:
      return;
  }
}

// The collective `f` of a call check_call passed, tallying `bytes` sent of kind `kind`: runs
// now, or at the end of the open group, or (g_recording) at each launch of the graph being
// captured. A launch's call is the call a GPU's graph makes: the test hooks strike it, an abort
// ends it quietly (the watchdog reports; the graph goes on, as its kernels would end), and any
// other failure is the launch's (raised at the stream's next synchronisation).
ncclResult_t run_or_queue(int kind, int64_t bytes, ncclComm* comm, const char* what,
                          std::function<ncclResult_t()> f) {
  if (g_recording) {
    const auto node = [=] {
      g_sent[size_t(kind)] += bytes;
      maybe_stop(g_world_rank);
      if (maybe_async_error(g_world_rank, comm, what) != ncclSuccess || comm->aborted) return;
      if (f() != ncclSuccess && !comm->aborted)
        throw std::runtime_error(std::string("emulated NCCL, in a graph launch: ") + g_last_error);
    };
    if (!ft::emu::stream_record_collective(g_recording, node))
      return fail(ncclInvalidUsage, std::string(what) + ": the capture refused the call");
    return ncclSuccess;
  }
  g_sent[size_t(kind)] += bytes;
  if (g_group_depth > 0) {
    g_queued.push_back(std::move(f));
    return ncclSuccess;
  }
  return f();
}

// Every rank's `bytes` of `send` gathered in rank order (on a group of one, just this rank's).
ncclResult_t gather_all(ncclComm* c, const void* send, size_t bytes, std::vector<char>& all) {
  all.resize(bytes * size_t(c->size));
  if (c->size == 1) {
    std::memcpy(all.data(), send, bytes);
    return ncclSuccess;
  }
  if (bytes > size_t(INT32_MAX))
    return fail(ncclInvalidArgument, "emulated NCCL: buffer too large");
  std::vector<MPI_Request> req(1);
  if (auto r = mpi_result(MPI_Iallgather(send, int(bytes), MPI_BYTE, all.data(), int(bytes),
                                         MPI_BYTE, c->mpi, req.data()),
                          "allgather"))
    return r;
  return wait_all(req, {c}, "allgather", {&all});
}

// A send or receive: kept for the open group's end, or a group of its own.
ncclResult_t post_p2p(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_size(type);
  const char* what = send ? "ncclSend" : "ncclRecv";
  if (auto r = check_call(what, comm, type, stream, {{buf, bytes}})) return r;
  if (g_recording)
    return fail(ncclInvalidUsage, std::string(what) + ": on a capturing stream (not emulated)");
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return fail(ncclInvalidArgument, std::string(what) + ": bad peer");
  if (bytes > size_t(INT32_MAX)) return fail(ncclInvalidArgument, "emulated NCCL: too large");
  if (send) g_sent[4] += int64_t(bytes);
  if (g_group_depth > 0) {
    g_p2p.push_back({send, buf, bytes, peer, comm});
    return ncclSuccess;
  }
  ncclGroupStart();
  g_p2p.push_back({send, buf, bytes, peer, comm});
  return ncclGroupEnd();
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: null");
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, kIdTag, sizeof kIdTag);
  std::random_device rd;
  const uint64_t nonce = (uint64_t(rd()) << 32) ^ rd();
  std::memcpy(id->internal + sizeof kIdTag, &nonce, sizeof nonce);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: null");
  *out = nullptr;
  if (std::memcmp(id.internal, kIdTag, sizeof kIdTag) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank out of range");
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->size = nranks;
  g_world_rank = rank;
  int inited = 0;
  MPI_Initialized(&inited);
  if (nranks > 1 || inited) {
    int world = 0, me = 0;
    if (!inited) return fail(ncclInvalidUsage, "emulated NCCL: several ranks need MPI");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != world || rank != me)
      return fail(ncclInvalidUsage,
                  "emulated NCCL: ncclCommInitRank must span the MPI world, each rank as its "
                  "world rank (make groups with ncclCommSplit)");
    if (auto r = mpi_result(MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi), "comm_dup")) return r;
    // Every rank must have been handed the same id.
    std::vector<char> ids(size_t(world) * sizeof id);
    MPI_Allgather(&id, sizeof id, MPI_BYTE, ids.data(), sizeof id, MPI_BYTE, c->mpi);
    for (int r = 0; r < world; ++r)
      if (std::memcmp(ids.data() + size_t(r) * sizeof id, &id, sizeof id) != 0)
        return fail(ncclInvalidUsage, "ncclCommInitRank: ranks were given different ids");
  }
  *out = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  if (!comm || !out) return fail(ncclInvalidArgument, "ncclCommSplit: null");
  *out = nullptr;
  if (comm->aborted) return fail(ncclInvalidUsage, "ncclCommSplit: communicator aborted");
  auto c = std::make_unique<ncclComm>();
  if (comm->mpi == MPI_COMM_NULL) {  // a group of one
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    *out = c.release();
    return ncclSuccess;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  if (auto r = mpi_result(
          MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &sub),
          "comm_split"))
    return r;
  if (sub == MPI_COMM_NULL) return ncclSuccess;
  c->mpi = sub;
  MPI_Comm_rank(sub, &c->rank);
  MPI_Comm_size(sub, &c->size);
  *out = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // Calls in flight end (wait_all sees the flag). The memory is kept: another thread may be
  // waiting in a call on it, and MPI (FUNNELED) may not be called from this one.
  if (comm) comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  if (!comm || !err) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null");
  const ncclResult_t async = comm->async_error;
  *err = async != ncclSuccess ? async : comm->aborted ? ncclInvalidUsage : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: null");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: null");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_size(type);
  if (auto r = check_call("ncclAllReduce", comm, type, stream, {{send, bytes}, {recv, bytes}}))
    return r;
  if (op != ncclSum && op != ncclMax)
    return fail(ncclInvalidArgument, "ncclAllReduce: emulated for ncclSum and ncclMax only");
  return run_or_queue(0, 2 * int64_t(comm->size - 1) * int64_t(bytes) / comm->size, comm,
                      "ncclAllReduce", [=]() -> ncclResult_t {
                        std::vector<char> all;
                        if (auto r = gather_all(comm, send, bytes, all)) return r;
                        std::vector<char> acc(all.begin(), all.begin() + long(bytes));
                        for (int k = 1; k < comm->size; ++k)
                          combine(acc.data(), all.data() + size_t(k) * bytes, count, type, op);
                        std::memcpy(recv, acc.data(), bytes);
                        return ncclSuccess;
                      });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const size_t chunk = recvcount * type_size(type);
  if (auto r = check_call("ncclReduceScatter", comm, type, stream,
                          {{send, chunk * size_t(comm ? comm->size : 1)}, {recv, chunk}}))
    return r;
  if (op != ncclSum && op != ncclMax)
    return fail(ncclInvalidArgument, "ncclReduceScatter: emulated for ncclSum and ncclMax only");
  return run_or_queue(
      1, int64_t(comm->size - 1) * int64_t(chunk), comm, "ncclReduceScatter",
      [=]() -> ncclResult_t {
        // Rank k's chunk r goes to rank r; each rank sums what it got in rank order.
        const size_t n = size_t(comm->size);
        std::vector<char> got(chunk * n);
        if (n == 1) {
          std::memcpy(got.data(), send, chunk);
        } else {
          if (chunk > size_t(INT32_MAX))
            return fail(ncclInvalidArgument, "emulated NCCL: too large");
          std::vector<MPI_Request> req(1);
          if (auto r = mpi_result(MPI_Ialltoall(send, int(chunk), MPI_BYTE, got.data(), int(chunk),
                                                MPI_BYTE, comm->mpi, req.data()),
                                  "alltoall"))
            return r;
          if (auto r = wait_all(req, {comm}, "alltoall", {&got})) return r;
        }
        for (size_t k = 1; k < n; ++k)
          combine(got.data(), got.data() + k * chunk, recvcount, type, op);
        std::memcpy(recv, got.data(), chunk);
        return ncclSuccess;
      });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t chunk = sendcount * type_size(type);
  if (auto r = check_call("ncclAllGather", comm, type, stream,
                          {{send, chunk}, {recv, chunk * size_t(comm ? comm->size : 1)}}))
    return r;
  return run_or_queue(2, int64_t(comm->size - 1) * int64_t(chunk), comm, "ncclAllGather",
                      [=]() -> ncclResult_t {
                        // In place (send at this rank's place in recv) as well: gather from a copy.
                        std::vector<char> mine(static_cast<const char*>(send),
                                               static_cast<const char*>(send) + chunk);
                        std::vector<char> all;
                        if (auto r = gather_all(comm, mine.data(), chunk, all)) {
                          if (comm->aborted)
                            g_orphans.push_back(std::move(mine));  // MPI may still read it
                          return r;
                        }
                        std::memcpy(recv, all.data(), all.size());
                        return ncclSuccess;
                      });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * type_size(type);
  const bool is_root = comm && comm->rank == root;
  if (auto r = check_call("ncclBroadcast", comm, type, stream,
                          {{is_root ? send : nullptr, is_root ? bytes : 0}, {recv, bytes}}))
    return r;
  if (root < 0 || root >= comm->size) return fail(ncclInvalidArgument, "ncclBroadcast: root");
  return run_or_queue(
      3, comm->size > 1 ? int64_t(bytes) : 0, comm, "ncclBroadcast", [=]() -> ncclResult_t {
        if (is_root && send != recv) std::memmove(recv, send, bytes);
        if (comm->size == 1) return ncclSuccess;
        if (bytes > size_t(INT32_MAX)) return fail(ncclInvalidArgument, "emulated NCCL: too large");
        std::vector<MPI_Request> req(1);
        if (auto r = mpi_result(MPI_Ibcast(recv, int(bytes), MPI_BYTE, root, comm->mpi, req.data()),
                                "bcast"))
          return r;
        return wait_all(req, {comm}, "bcast");
      });
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return post_p2p(true, const_cast<void*>(send), count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return post_p2p(false, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  // Point to point first, every request posted before any wait. Tag 0 on the communicator:
  // NCCL matches a peer's sends and receives in the order they were made, as MPI does.
  std::vector<P2p> p2p;
  p2p.swap(g_p2p);
  std::vector<MPI_Request> reqs;
  for (const P2p& m : p2p) {
    MPI_Request r;
    const int rc = m.send ? MPI_Issend(m.buf, int(m.bytes), MPI_BYTE, m.peer, 0, m.comm->mpi, &r)
                          : MPI_Irecv(m.buf, int(m.bytes), MPI_BYTE, m.peer, 0, m.comm->mpi, &r);
    if (auto res = mpi_result(rc, m.send ? "isend" : "irecv")) return res;
    reqs.push_back(r);
  }
  if (!reqs.empty()) {
    if (auto res = wait_all(reqs, {p2p.front().comm}, "send/receive group")) return res;
  }
  std::vector<std::function<ncclResult_t()>> queued;
  queued.swap(g_queued);
  for (auto& f : queued)
    if (auto r = f()) return r;
  return ncclSuccess;
}

}  // extern "C"
