// The CUDA device (cuda_device.h). Every op, memset and device-to-device copy is queued on one
// non-blocking stream; host copies wait for it (the Device contract: a host copy sees the work
// before it and is finished on return), except upload_async's, staged through pinned slots. A
// second stream carries the checkpoint's device → host staging copies (copy_to_host_async), ordered
// against the first by events only.
#include "runtime/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/gpu_choice.h"
#include "runtime/cuda/gpu_usage.h"
#include "runtime/profile.h"

namespace ft {
namespace {

// Throws ft::Error naming the call, the CUDA error and where: errors from the device are rare
// and usually fatal (a bad launch, an ECC fault), so they are reported, not recovered from.
#define FT_CUDA_CHECK(call)                                                                      \
  do {                                                                                           \
    const cudaError_t ft_cuda_err_ = (call);                                                     \
    if (ft_cuda_err_ != cudaSuccess)                                                             \
      throw ::ft::Error(::ft::detail::concat(#call, " failed: ", cudaGetErrorName(ft_cuda_err_), \
                                             ": ", cudaGetErrorString(ft_cuda_err_), " [",       \
                                             __FILE__, ":", __LINE__, "]"));                     \
  } while (0)

// "13.0" from CUDA's 13000 encoding.
std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? detail::concat(" (CUDA_VISIBLE_DEVICES='", v, "')") : std::string();
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, const DeviceOptions& options) : ordinal_(ordinal) {
    FT_CUDA_CHECK(cudaSetDevice(ordinal_));
    cudaDeviceProp prop{};
    FT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
    name_ = detail::concat("cuda:", ordinal_, " (", prop.name, ", ",
                           (prop.totalGlobalMem + (size_t(1) << 29)) >> 30, " GiB, sm_", prop.major,
                           prop.minor, ")");
    graphs_enabled_ = cuda_graphs_requested();
    FT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    FT_CUDA_CHECK(cudaStreamCreateWithFlags(&update_stream_, cudaStreamNonBlocking));
    allocator_ = std::make_unique<cuda::CachingAllocator>(
        [](size_t bytes) -> void* {
          void* p = nullptr;
          const cudaError_t e = cudaMalloc(&p, bytes);
          if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // clear it: out of memory is reported by the allocator
            return nullptr;
          }
          FT_CUDA_CHECK(e);
          return p;
        },
        [](void* p, size_t) { cudaFree(p); }, name_);
    ops_ = make_cuda_ops(*this, stream_, prop.major, options,
                         detail::concat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                                        prop.multiProcessorCount, " SMs)"));
    // FT_PROFILE: each op between two events on its stream, so the table shows GPU time, not
    // the time to queue the launch (runtime/profile.h).
    if (profile_requested()) {
      profile_ = std::make_unique<OpProfile>();
      profile_->event_device = this;
      profiling_ops_ = make_profiling_ops(*ops_, *profile_);
    }
  }
  ~CudaDevice() override {
    // Nothing may still run on memory about to be freed; errors here cannot be thrown.
    cudaStreamSynchronize(update_stream_);
    cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(stream_);
    for (UploadSlot& u : uploads_) {
      if (u.host) cudaFreeHost(u.host);
      if (u.done) cudaEventDestroy(u.done);
    }
    for (void* p : retired_uploads_) cudaFreeHost(p);
    profiling_ops_.reset();
    profile_.reset();  // its events, before the streams go
    ops_.reset();
    allocator_.reset();
    cudaStreamDestroy(update_stream_);
    cudaStreamDestroy(copy_stream_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  void* alloc(size_t bytes) override {
    if (recording_)
      throw Error(detail::concat("an allocation of ", bytes,
                                 " bytes while a graph is recorded (FT_CUDA_GRAPHS): every buffer "
                                 "the recorded work uses must exist before graph_begin"));
    void* p = allocator_->allocate(bytes, stream_);
    if (graphs_enabled_) serial_[p] = next_serial_++;
    return p;
  }
  void free(void* ptr, size_t) override {
    if (graphs_enabled_) {
      const auto it = serial_.find(ptr);
      if (it != serial_.end()) {
        if (it->second < recorded_below_) {  // a recorded graph may use it: all are stale now
          ++graph_epoch_;
          recorded_below_ = 0;
        }
        serial_.erase(it);
      }
    }
    allocator_->deallocate(ptr);
  }
  void memset_zero(void* ptr, size_t bytes) override {
    if (!bytes) return;
    ProfileScope t(profile_.get(), OpFamily::kMemset, Stream{stream_});
    FT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream_));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    refuse_while_recording("copy_to_host");
    {
      ProfileScope t(profile_.get(), OpFamily::kCopyHost, Stream{stream_});
      FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    refuse_while_recording("copy_from_host");
    // Waited for: the host buffer may be reused or freed as soon as this returns.
    {
      ProfileScope t(profile_.get(), OpFamily::kCopyHost, Stream{stream_});
      FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    }
    FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(Stream s, void* dst, const void* src, size_t bytes) override {
    if (!bytes || dst == src) return;
    const cudaStream_t st = s.handle ? static_cast<cudaStream_t>(s.handle) : stream_;
    ProfileScope t(profile_.get(), OpFamily::kCopyDevice, Stream{st});
    FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  }
  Stream copy_stream() override { return Stream{copy_stream_}; }
  Stream update_stream() override { return Stream{update_stream_}; }
  void memset_zero_async(Stream s, void* ptr, size_t bytes) override {
    if (!bytes) return;
    ProfileScope t(profile_.get(), OpFamily::kMemset, Stream{as_stream(s)});
    FT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, as_stream(s)));
  }
  void copy_to_host_async(Stream s, void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    refuse_while_recording("copy_to_host_async");
    FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(s)));
  }
  void copy_from_host_async(Stream s, void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    refuse_while_recording("copy_from_host_async");
    FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(s)));
  }
  // Through the staging ring: the slot's previous copy is waited for (issued uploads_.size()
  // uploads ago, normally long finished), the bytes copied in, the copy queued and marked.
  void upload_async(Stream s, void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    refuse_while_recording("upload_async");
    UploadSlot& u = uploads_[next_upload_];
    next_upload_ = (next_upload_ + 1) % uploads_.size();
    if (u.done)
      FT_CUDA_CHECK(cudaEventSynchronize(u.done));
    else
      FT_CUDA_CHECK(cudaEventCreateWithFlags(&u.done, cudaEventDisableTiming));
    if (u.bytes < bytes) {
      // The old buffer is kept to the end: cudaFreeHost may wait for the whole device. Sizes at
      // least double, so a slot holds a few buffers at most.
      if (u.host) retired_uploads_.push_back(u.host);
      u.host = nullptr;
      const size_t want = std::max({bytes, 2 * u.bytes, kUploadMinBytes});
      u.bytes = 0;
      const cudaError_t e = cudaMallocHost(&u.host, want);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw Error(detail::concat(
            "cudaMallocHost of a ", want,
            "-byte staging slot for an upload (a micro-batch's inputs, AdamW's constants) failed: ",
            cudaGetErrorString(e), " (host memory is short)"));
      }
      u.bytes = want;
    }
    std::memcpy(u.host, src, bytes);
    const cudaStream_t st = as_stream(s);
    ProfileScope t(profile_.get(), OpFamily::kCopyHost, Stream{st});
    FT_CUDA_CHECK(cudaMemcpyAsync(dst, u.host, bytes, cudaMemcpyHostToDevice, st));
    FT_CUDA_CHECK(cudaEventRecord(u.done, st));
  }
  MemoryInfo memory_info() override {
    MemoryInfo m;
    FT_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
    return m;
  }
  Usage usage() override {
    if (!usage_reader_) usage_reader_ = make_usage_reader();
    return usage_reader_->read();
  }
  void synchronize() override { FT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  AllocatorStats stats() const override {
    const cuda::CachingAllocatorStats s = allocator_->stats();
    return AllocatorStats{s.current_bytes, s.peak_bytes, s.num_allocs, s.reserved_bytes};
  }
  bool host_accessible() const override { return false; }
  void* alloc_host(size_t bytes) override {
    refuse_while_recording("alloc_host");
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      auto gib = [](size_t b) {
        char text[32];
        if (b < (size_t(1) << 30))
          std::snprintf(text, sizeof text, "%.1f MiB", double(b) / double(1 << 20));
        else
          std::snprintf(text, sizeof text, "%.2f GiB", double(b) / double(1 << 30));
        return std::string(text);
      };
      throw Error(detail::concat(
          "cannot allocate ", bytes, " bytes (", gib(bytes), ") of page-locked host memory for ",
          name_, ", with ", gib(host_stats().pinned_bytes),
          " held already: ", cudaGetErrorString(e),
          ". Page-locked memory holds checkpoint.async's staging, communication staging and "
          "the state parallel.offload_optimizer and parallel.offload_params move to the host "
          "(`ft plan` counts it per rank: host pinned); to ask for less, spread the state "
          "over more data ranks (ZeRO shards it), set parallel.offload_params: none (then "
          "parallel.offload_optimizer: none) or checkpoint.async: false, or raise the "
          "locked-memory limit (ulimit -l; under SLURM, the job's memory)"));
    }
    count_host(HostMemory::kPinned, bytes, true);
    return p;
  }
  void free_host(void* ptr, size_t bytes) override {
    refuse_while_recording("free_host");
    cudaFreeHost(ptr);
    count_host(HostMemory::kPinned, bytes, false);
  }
  Ops& ops() override { return profiling_ops_ ? *profiling_ops_ : *ops_; }
  OpProfile* profile() override { return profile_.get(); }
  Stream stream() override { return Stream{stream_}; }

  bool graphs_enabled() const override { return graphs_enabled_; }
  bool graph_recording() const override { return recording_; }
  void graph_begin() override {
    if (!graphs_enabled_) Device::graph_begin();
    FT_CHECK(!recording_, "graph_begin while a graph is already recorded");
    // Thread-local mode: a potentially unsafe call of this thread (cudaMalloc, a synchronisation)
    // fails and invalidates the recording instead of running, while the other threads' calls
    // (the NCCL watchdog's event queries, a checkpoint writer's wait for its copies) run as usual;
    // under global mode they would fail and break the recording.
    FT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    recording_ = true;
  }
  void* graph_end() override {
    FT_CHECK(recording_, "graph_end without graph_begin");
    recording_ = false;
    cudaGraph_t graph = nullptr;
    if (const cudaError_t e = cudaStreamEndCapture(stream_, &graph); e != cudaSuccess) {
      cudaGetLastError();  // not left for the next call's check to report
      if (graph) cudaGraphDestroy(graph);
      throw Error(detail::concat("cudaStreamEndCapture failed: ", cudaGetErrorName(e), ": ",
                                 cudaGetErrorString(e),
                                 " (a call of this thread during the recording broke it; that "
                                 "call answered an error of its own, which may have been "
                                 "ignored)"));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::concat("cudaGraphInstantiate failed: ", cudaGetErrorName(e), ": ",
                                 cudaGetErrorString(e)));
    }
    recorded_below_ = next_serial_;
    return exec;
  }
  void graph_cancel() override {
    if (!recording_) return;
    recording_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // an invalidated capture answers an error: ignored
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
  }
  void graph_launch(void* graph) override {
    FT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_));
  }
  void graph_destroy(void* graph) override {
    if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
  uint64_t graph_epoch() const override { return graph_epoch_; }

 protected:
  void* event_create(bool timing) override {
    cudaEvent_t e = nullptr;
    FT_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void event_destroy(void* e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  void event_record(void* e, Stream s) override {
    FT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), as_stream(s)));
  }
  void event_synchronize(void* e) override {
    FT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }
  bool event_query(void* e) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: the work is still running
      return false;
    }
    FT_CUDA_CHECK(r);
    return true;
  }
  float event_elapsed_ms(void* start, void* end) override {
    float ms = 0;
    FT_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms;
  }
  void stream_wait_event(Stream s, void* e) override {
    FT_CUDA_CHECK(cudaStreamWaitEvent(as_stream(s), static_cast<cudaEvent_t>(e), 0));
  }

 private:
  // Host memory's calls while recording (Device's graph contract): a copy recorded in a graph
  // would copy the recording's bytes at every replay, a synchronous one waits, and page-locked
  // memory's allocations and frees break the recording. Refused on every stream, though only
  // stream() records: conservative, since no caller needs them there while recording.
  void refuse_while_recording(const char* what) const {
    if (recording_)
      throw Error(detail::concat(what,
                                 " while a graph is recorded (FT_CUDA_GRAPHS): copies between "
                                 "host and device and page-locked memory belong before "
                                 "graph_begin or after graph_end"));
  }
  cudaStream_t as_stream(Stream s) const {
    return s.handle ? static_cast<cudaStream_t>(s.handle) : stream_;
  }
  // NVML on this GPU, opened at the first metrics line (gpu_usage.h). The emulated build (a test
  // tool) reads the emulated NVML it links (tests/cuda_emu/nvml_emu.cpp) through the same reader.
  std::unique_ptr<cuda::GpuUsageReader> make_usage_reader() const {
#if FT_CUDA_EMU
    cuda::NvmlApi api;
#define FT_NVML_SET(f) api.f = &::f;
    FT_NVML_FUNCTIONS(FT_NVML_SET)
#undef FT_NVML_SET
#else
    cuda::NvmlApi api = cuda::load_nvml();
#endif
    char bus_id[32] = {};
    const cudaError_t e = cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal_);
    if (e != cudaSuccess) {
      cudaGetLastError();  // reported as the readings' failure, not the next call's
      return std::make_unique<cuda::GpuUsageReader>(
          std::move(api), "",
          detail::concat("cudaDeviceGetPCIBusId(", ordinal_, "): ", cudaGetErrorString(e)));
    }
    return std::make_unique<cuda::GpuUsageReader>(std::move(api), bus_id);
  }
  int ordinal_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;    // device → host staging (checkpoint saves)
  cudaStream_t update_stream_ = nullptr;  // parallel.overlap_update's AdamW
  // upload_async's staging ring: pinned slots, each with the event after its last copy, and the
  // buffers slots outgrew. Not in ft plan's host figures: 16 slots of at least 64 KiB (1 MiB),
  // more where a micro-batch's token ids (4 bytes a token) need it.
  struct UploadSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  static constexpr size_t kUploadMinBytes = size_t(64) << 10;
  std::array<UploadSlot, 16> uploads_{};
  size_t next_upload_ = 0;
  std::vector<void*> retired_uploads_;
  // Graphs (FT_CUDA_GRAPHS=1): each live block's allocation serial, the serials below which a
  // block may be used by a recorded graph, and the epoch that freeing such a block advances.
  bool graphs_enabled_ = false;
  bool recording_ = false;
  std::unordered_map<void*, uint64_t> serial_;
  uint64_t next_serial_ = 1, recorded_below_ = 0, graph_epoch_ = 0;
  std::unique_ptr<OpProfile> profile_;  // FT_PROFILE only
  std::unique_ptr<Ops> profiling_ops_;
  std::unique_ptr<cuda::CachingAllocator> allocator_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<cuda::GpuUsageReader> usage_reader_;  // made by the first usage()
};

}  // namespace

std::string cuda_runtime_description() {
#if FT_CUDA_EMU
  return "CUDA emulation on the CPU, a test tool; runtime headers " + cuda_version(CUDART_VERSION);
#else
  return "runtime " + cuda_version(CUDART_VERSION);
#endif
}

std::string cuda_unusable_reason() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  cudaRuntimeGetVersion(&runtime);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  cudaGetLastError();  // the probe's error is ours to report, not the next call's
  if (driver == 0)
    return detail::concat(
        "no NVIDIA driver is loaded (libcuda.so.1 was not found; "
        "cudaGetDeviceCount says \"",
        cudaGetErrorString(e), "\")");
  if (e == cudaErrorInsufficientDriver || driver < runtime)
    return detail::concat("the NVIDIA driver supports CUDA ", cuda_version(driver),
                          ", older than the CUDA ", cuda_version(runtime),
                          " runtime ft was built with; update the driver");
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
    return detail::concat("no CUDA device is visible", visible_devices(),
                          " (cudaGetDeviceCount: ", cudaGetErrorString(e), ")");
  if (e != cudaSuccess)
    return detail::concat("cudaGetDeviceCount failed: ", cudaGetErrorName(e), ": ",
                          cudaGetErrorString(e), visible_devices());
  // ft's kernels carry code for sm_80 and later (CMAKE_CUDA_ARCHITECTURES); an older GPU
  // would fail at the first launch, so it is refused here, before any work. Every visible GPU
  // is checked: which one is this rank's needs the node-local rank, an MPI collective.
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (const cudaError_t pe = cudaGetDeviceProperties(&prop, i); pe != cudaSuccess)
      return detail::concat("cudaGetDeviceProperties(", i, ") failed: ", cudaGetErrorString(pe));
    if (prop.major < 8)
      return detail::concat("GPU ", i, " (", prop.name, ") has compute capability ", prop.major,
                            ".", prop.minor,
                            "; ft's CUDA kernels need 8.0 "
                            "(Ampere) or newer (hide it with CUDA_VISIBLE_DEVICES)");
  }
  return "";
}

const CudaBackend& this_cuda_backend() {
  static const CudaBackend backend{cuda_unusable_reason,
                                   [](const DeviceOptions& o) { return make_cuda_device(o); },
                                   cuda_runtime_description};
  return backend;
}

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options) {
  int count = 0;
  FT_CUDA_CHECK(cudaGetDeviceCount(&count));
  const cuda::LocalRank local = cuda::node_local_rank();
  const int ordinal = cuda::pick_gpu(local.rank, count);
  auto dev = std::make_unique<CudaDevice>(ordinal, options);
  log_debug("device: ", dev->name(), " for node-local rank ", local.rank, " (", local.source,
            ") of ", count, " visible GPU", count == 1 ? "" : "s");
  return dev;
}

}  // namespace ft
