#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "runtime/cpu_ops.h"
#include "runtime/cuda/gpu_choice.h"
#include "runtime/device.h"
#include "runtime/guard_device.h"
#include "runtime/profile.h"

namespace ft {
namespace {

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }

  void* alloc(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
      throw Error(detail::concat("out of host memory allocating ", bytes, " bytes (", current_,
                                 " bytes already in use); try a smaller micro_batch_size or "
                                 "seq_len, or activation_checkpointing: true"));
    size_t cur = current_.fetch_add(bytes) + bytes;
    size_t peak = peak_.load();
    while (cur > peak && !peak_.compare_exchange_weak(peak, cur)) {
    }
    num_allocs_++;
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    std::free(ptr);
    current_ -= bytes;
  }
  void memset_zero(void* ptr, size_t bytes) override {
    ProfileScope t(profile_.get(), OpFamily::kMemset);
    std::memset(ptr, 0, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ProfileScope t(profile_.get(), OpFamily::kCopyHost);
    std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    ProfileScope t(profile_.get(), OpFamily::kCopyHost);
    std::memcpy(dst, src, bytes);
  }
  void copy(Stream, void* dst, const void* src, size_t bytes) override {
    ProfileScope t(profile_.get(), OpFamily::kCopyDevice);
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  Ops& ops() override { return profiling_ops_ ? *profiling_ops_ : *ops_; }
  OpProfile* profile() override { return profile_.get(); }
  void synchronize() override {}
  AllocatorStats stats() const override {
    const size_t cur = current_.load();
    return AllocatorStats{cur, peak_.load(), num_allocs_.load(), cur};
  }

 private:
  std::atomic<size_t> current_{0}, peak_{0}, num_allocs_{0};
  std::unique_ptr<Ops> ops_ = make_cpu_ops();
  // FT_PROFILE only (runtime/profile.h); without it both stay null and nothing is timed.
  std::unique_ptr<OpProfile> profile_ =
      profile_requested() ? std::make_unique<OpProfile>() : nullptr;
  std::unique_ptr<Ops> profiling_ops_ = profile_ ? make_profiling_ops(*ops_, *profile_) : nullptr;
};

}  // namespace

namespace {
thread_local MemoryCategory g_memory_category = MemoryCategory::kOther;
}  // namespace

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizer:
      return "optimizer state";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kCommunication:
      return "comm buffers";
    case MemoryCategory::kScratch:
      return "scratch";
    case MemoryCategory::kCheckpoint:
      return "checkpoint";
    default:
      return "other";
  }
}

std::string host_memory_hint(MemoryCategory c, HostMemory kind) {
  const bool pinned = kind == HostMemory::kPinned;
  switch (c) {
    case MemoryCategory::kCheckpoint:
      return pinned ? "checkpoint.async: false stages no copy of the state (a save then holds "
                      "training while it writes)"
                    : "a synchronous save copies its largest piece: more data ranks cut it";
    case MemoryCategory::kOptimizer:
    case MemoryCategory::kGradients:
      return "the offloaded optimizer state shrinks with more data ranks under "
             "parallel.zero_stage 1-3, or stays on the GPU with parallel.offload_optimizer: none";
    case MemoryCategory::kParameters:
      return pinned ? "parameters held on the host shrink with more data ranks under "
                      "parallel.zero_stage 3, or stay on the GPU with parallel.offload_params: "
                      "none"
                    : "model.from is read a group at a time into one buffer of the largest "
                      "group: parallel.tensor splits it";
    case MemoryCategory::kCommunication:
      return "MPI stages GPU memory through the host: runtime.communicator: nccl does not";
    default:
      return "`ft plan` shows what each rank holds on the host";
  }
}

MemoryCategory current_memory_category() { return g_memory_category; }
MemoryScope::MemoryScope(MemoryCategory c) : prev_(g_memory_category) { g_memory_category = c; }
MemoryScope::~MemoryScope() { g_memory_category = prev_; }

void* Device::alloc_host(size_t bytes) {
  void* p = alloc_host_plain(bytes);
  count_host(HostMemory::kPinned, bytes, true);
  return p;
}

void* Device::alloc_pageable(size_t bytes) {
  void* p = std::aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
  if (!p)
    throw Error(detail::concat("out of host memory allocating ", bytes, " bytes for ",
                               memory_category_name(current_memory_category()),
                               " on the host; `ft plan` shows each rank's host memory"));
  count_host(HostMemory::kPageable, bytes, true);
  return p;
}

void Device::free_pageable(void* ptr, size_t bytes) {
  std::free(ptr);
  count_host(HostMemory::kPageable, bytes, false);
}

void Device::count_host(HostMemory kind, size_t bytes, bool added) {
  const std::lock_guard<std::mutex> lock(host_mu_);
  size_t& now = kind == HostMemory::kPinned ? host_.pinned_bytes : host_.pageable_bytes;
  size_t& peak = kind == HostMemory::kPinned ? host_.pinned_peak_bytes : host_.pageable_peak_bytes;
  now = added ? now + bytes : now - std::min(now, bytes);
  peak = std::max(peak, now);
  host_.peak_bytes = std::max(host_.peak_bytes, host_.pinned_bytes + host_.pageable_bytes);
}

HostMemoryStats Device::host_stats() const {
  const std::lock_guard<std::mutex> lock(host_mu_);
  return host_;
}

Ops& Device::host_ops() {
  static const std::unique_ptr<Ops> cpu = make_cpu_ops();
  return *cpu;
}

// ---- events: the CPU's (and the guard device's) defaults ------------------------------------
// The work before a record has finished when record is called, so the event is the host time.
namespace {
struct HostEvent {
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};
}  // namespace

void* Device::event_create(bool timing) { return new HostEvent{timing, false, {}}; }
void Device::event_destroy(void* e) { delete static_cast<HostEvent*>(e); }
void Device::event_record(void* e, Stream) {
  auto* h = static_cast<HostEvent*>(e);
  h->recorded = true;
  if (h->timing) h->at = std::chrono::steady_clock::now();
}
void Device::event_synchronize(void*) {}
bool Device::event_query(void*) { return true; }
float Device::event_elapsed_ms(void* start, void* end) {
  const auto* a = static_cast<HostEvent*>(start);
  const auto* b = static_cast<HostEvent*>(end);
  if (!a->timing || !b->timing)
    throw Error(detail::concat("elapsed_ms on ", name(),
                               ": an event made without timing; "
                               "make both with make_event(true)"));
  if (!a->recorded || !b->recorded)
    throw Error(detail::concat("elapsed_ms on ", name(), ": the ", a->recorded ? "end" : "start",
                               " event was never recorded; record both first"));
  return std::chrono::duration<float, std::milli>(b->at - a->at).count();
}
void Device::stream_wait_event(Stream, void*) {}
void Device::copy_to_host_async(Stream, void* dst, const void* src, size_t bytes) {
  copy_to_host(dst, src, bytes);
}
void Device::copy_from_host_async(Stream, void* dst, const void* src, size_t bytes) {
  copy_from_host(dst, src, bytes);
}
namespace {
[[noreturn]] void no_graphs(const std::string& device) {
  throw Error(detail::concat(device,
                             ": graphs need the CUDA backend with FT_CUDA_GRAPHS=1 "
                             "(Device::graphs_enabled)"));
}
}  // namespace
bool cuda_graphs_requested() {
  const char* v = std::getenv("FT_CUDA_GRAPHS");
  const std::string mode = v ? v : "0";
  if (mode != "0" && mode != "1")
    throw UsageError(
        detail::concat("FT_CUDA_GRAPHS='", mode,
                       "': use 1 (a micro-batch's forward and backward recorded once as a "
                       "CUDA graph and replayed, where the run allows it) or 0 (the "
                       "default: every kernel launched one by one)"));
  return mode == "1";
}
void Device::graph_begin() { no_graphs(name()); }
void* Device::graph_end() { no_graphs(name()); }
void Device::graph_cancel() {}
void* Device::graph_record(const std::function<void()>& work) {
  graph_begin();
  try {
    work();
    return graph_end();
  } catch (...) {
    graph_cancel();  // after a graph_end that threw: nothing left to cancel
    throw;
  }
}
void Device::graph_launch(void*) { no_graphs(name()); }
void Device::graph_destroy(void*) {}
void Device::zero_host(void* ptr, size_t bytes) {
  if (bytes) std::memset(ptr, 0, bytes);
}

void Device::wait(Stream s, const Event& e) {
  FT_CHECK(e.handle_ && e.dev_ == this, "Device::wait: an empty event or one of another device");
  stream_wait_event(s, e.handle_);
}

Event::~Event() {
  if (handle_) dev_->event_destroy(handle_);
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) dev_->event_destroy(handle_);
    dev_ = o.dev_;
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}
void Event::record(Stream s) {
  FT_CHECK(handle_, "Event::record on an empty event");
  dev_->event_record(handle_, s);
}
void Event::synchronize() {
  FT_CHECK(handle_, "Event::synchronize on an empty event");
  dev_->event_synchronize(handle_);
}
bool Event::query() {
  FT_CHECK(handle_, "Event::query on an empty event");
  return dev_->event_query(handle_);
}
float elapsed_ms(const Event& start, const Event& end) {
  FT_CHECK(start.handle_ && end.handle_ && start.dev_ == end.dev_,
           "elapsed_ms: an empty event, or events of two devices");
  return start.dev_->event_elapsed_ms(start.handle_, end.handle_);
}
void Device::free_host(void* ptr, size_t bytes) {
  free_host_plain(ptr, bytes);
  count_host(HostMemory::kPinned, bytes, false);
}

void* Device::alloc_host_plain(size_t bytes) {
  void* p = std::aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
  if (!p)
    throw Error(detail::concat("out of host memory allocating a ", bytes,
                               "-byte staging buffer; try checkpoint.async: false"));
  return p;
}

void Device::free_host_plain(void* ptr, size_t) { std::free(ptr); }

namespace {
const CudaBackend* g_cuda_backend = nullptr;
}  // namespace

void register_cuda_backend(const CudaBackend* backend) { g_cuda_backend = backend; }
const CudaBackend* cuda_backend() { return g_cuda_backend; }

std::string built_backends() {
  if (const CudaBackend* cuda = cuda_backend()) return "cpu, cuda (" + cuda->description() + ")";
  return "cpu";
}

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

std::unique_ptr<Device> make_device(const std::string& spec, const DeviceOptions& options) {
  if (spec != "auto" && spec != "cpu" && spec != "cuda")
    throw UsageError("runtime.device: unknown device '" + spec + "' (expected auto, cpu or cuda)");
  // Test support (runtime/guard_device.h): device memory the host cannot touch.
  const char* guard = std::getenv("FT_TEST_GUARD_DEVICE");
  const bool use_guard = guard && std::string(guard) == "1";
  if (const CudaBackend* cuda = cuda_backend()) {
    // The guard device stands in for a GPU in tests, so "auto" under it never probes one.
    if (spec == "cuda" || (spec == "auto" && !use_guard)) {
      const std::string why = cuda->unusable_reason();
      if (why.empty()) return cuda->make(options);
      if (spec == "cuda")
        throw Error("runtime.device: cuda requested, but " + why +
                    "; use runtime.device: cpu (or auto) to train on the CPU");
      if (cuda::world_rank_hint() == 0 && !options.quiet)
        log_info("ft: runtime.device: auto: training on the CPU, no usable GPU (", why, ")");
    }
  } else if (spec == "cuda") {
    throw UsageError(
        "runtime.device: cuda requested, but this build of ft has no CUDA backend (it was "
        "configured with FT_CUDA=OFF or without nvcc); use runtime.device: cpu (or auto), or "
        "rebuild with the CUDA toolkit installed");
  }
  if (use_guard) return make_guard_device();
  return make_cpu_device();
}

}  // namespace ft
