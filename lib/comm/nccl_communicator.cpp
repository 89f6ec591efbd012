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
// Built twice from this file (CMakeLists.txt): ft_nccl, against the real NCCL opened on first
// use (dlopen of libnccl.so.2: the library is large, and a CPU-only process never needs it),
// and ft_nccl_emu, against the emulated NCCL (tests/cuda_emu/nccl_emu.cpp, a test tool) for
// ft_emu.
#include <cuda_runtime.h>
#include <nccl.h>

#if !defined(FT_CUDA_EMU)
#include <dlfcn.h>
#endif

#include <memory>
#include <string>

#include "comm/device_comm.h"
#include "core/error.h"

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

// A call in flight: the event recorded on the communication stream after it.
class NcclWork final : public CommWork::Pending {
 public:
  NcclWork(Device& dev, Event done) : dev_(dev), done_(std::move(done)) {}
  void wait() override { done_.synchronize(); }
  void wait_on(Stream s) override { dev_.wait(s, done_); }

 private:
  Device& dev_;
  Event done_;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; `host` is the same group over MPI (barrier, abort, messages).
  NcclCommunicator(ncclComm_t comm, std::unique_ptr<Communicator> host, Device& dev)
      : comm_(comm), host_(std::move(host)), dev_(dev) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (NCCL's stream)");
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (comm_) nccl().ncclCommDestroy(comm_);  // null after abort()
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) override {
    after(s);
    check(nccl().ncclAllReduce(data.ptr, data.ptr, n, nccl_type(data.dtype),
                               op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_),
          "all-reduce", comm_);
    return done();
  }
  CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "reduce_scatter of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    after(s);
    check(nccl().ncclReduceScatter(in.ptr, out.ptr, shard, nccl_type(in.dtype), ncclSum, comm_,
                                   stream_),
          "reduce-scatter", comm_);
    return done();
  }
  CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "all_gather of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    after(s);
    check(nccl().ncclAllGather(in.ptr, out.ptr, shard, nccl_type(in.dtype), comm_, stream_),
          "all-gather", comm_);
    return done();
  }
  CommWork broadcast(Stream s, Ref data, size_t n, int root) override {
    after(s);
    check(nccl().ncclBroadcast(data.ptr, data.ptr, n, nccl_type(data.dtype), root, comm_, stream_),
          "broadcast", comm_);
    return done();
  }
  CommWork send(Stream s, CRef data, size_t n, int peer, int) override {
    after(s);
    check(nccl().ncclSend(data.ptr, n, nccl_type(data.dtype), peer, comm_, stream_), "send", comm_);
    return done();
  }
  CommWork recv(Stream s, Ref data, size_t n, int peer, int) override {
    after(s);
    check(nccl().ncclRecv(data.ptr, n, nccl_type(data.dtype), peer, comm_, stream_), "receive",
          comm_);
    return done();
  }
  CommWork send_recv(Stream s, CRef send_data, size_t send_n, int send_peer, Ref recv_data,
                     size_t recv_n, int recv_peer, int, int) override {
    after(s);
    check(nccl().ncclGroupStart(), "group start", comm_);
    if (send_n)
      check(nccl().ncclSend(send_data.ptr, send_n, nccl_type(send_data.dtype), send_peer, comm_,
                            stream_),
            "send", comm_);
    if (recv_n)
      check(nccl().ncclRecv(recv_data.ptr, recv_n, nccl_type(recv_data.dtype), recv_peer, comm_,
                            stream_),
            "receive", comm_);
    check(nccl().ncclGroupEnd(), "send and receive", comm_);
    return done();
  }
  void barrier() override { host_->barrier(); }
  void abort(int code) override {
    nccl().ncclCommAbort(comm_);
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

 private:
  // The communication stream waits for the work queued on `s` so far.
  void after(Stream s) {
    Event ready = dev_.make_event();
    ready.record(s);
    dev_.wait(Stream{stream_}, ready);
  }
  CommWork done() {
    Event e = dev_.make_event();
    e.record(Stream{stream_});
    return CommWork(std::make_unique<NcclWork>(dev_, std::move(e)));
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
  // The world's twin over MPI: a split of one color, so the NCCL world owns its own copy.
  return std::make_unique<NcclCommunicator>(comm, world.split(0, world.rank()), dev);
}

std::string description() {
  const NcclApi& api = nccl();
  return api.version ? "nccl " + version_string(api.version) : "nccl";
}

const NcclBackend kBackend{unusable_reason, make_world, description};

}  // namespace

const NcclBackend& this_nccl_backend() { return kBackend; }

}  // namespace ft
