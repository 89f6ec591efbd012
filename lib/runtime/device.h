// Device: where buffers live and kernels run. Every buffer in the model, optimizer and loader
// comes from a Device's allocator, so that `mem_peak_bytes` in the metrics is the real peak and
// a CUDA backend can slot in behind the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/ops.h"

namespace ft {

enum class DeviceKind { kCpu, kCuda };

// What an allocation is for, as `ft plan` reports a rank's memory (DESIGN.md §4). The code that
// allocates says so with a MemoryScope around the allocation (the innermost scope of the thread
// wins); the counting device of `ft plan` (runtime/counting_device.h) tallies by it, the others
// ignore it. kOther is what no scope claimed: ft plan shows it, and its tests require it empty.
enum class MemoryCategory : uint8_t {
  kOther,
  kParameters,     // the weights: fp32 masters and shards, the compute copy
  kGradients,      // full gradients or ZeRO gradient shards
  kOptimizer,      // AdamW's moments
  kActivations,    // a micro-batch's activations, its backward's buffers, the step's scalars
  kCommunication,  // ZeRO's gathered parameters and working gradients, pipeline send/receive
  kScratch,        // a backend's own buffers (cuBLASLt workspace, the ops' shared scratch)
  kCheckpoint,     // host only: checkpoint.async's staging buffer, a synchronous save's copy
  kCount
};
// Host memory comes in two kinds, which ft plan reports apart (DESIGN.md §4): page-locked
// (Device::alloc_host; cudaMallocHost on CUDA: the OS never pages it out, and copies between it
// and the GPU run asynchronously at full bandwidth) and pageable (Device::alloc_pageable: the
// heap's).
enum class HostMemory : uint8_t { kPinned, kPageable };
// The host memory a device handed out through alloc_host and alloc_pageable (not the process's
// other host memory): live now and the most live at once, each kind and both together. The run's
// metrics report the peaks (mem_host_pinned_bytes, mem_host_pageable_bytes), which ft plan
// counts.
struct HostMemoryStats {
  size_t pinned_bytes = 0, pinned_peak_bytes = 0;
  size_t pageable_bytes = 0, pageable_peak_bytes = 0;
  size_t peak_bytes = 0;  // of pinned + pageable
};
// What lowers a rank's host memory of category c and this kind, in the recipe's words, for a
// message that refuses it (a failed cudaMallocHost, ft train's host memory check).
std::string host_memory_hint(MemoryCategory c, HostMemory kind);
const char* memory_category_name(MemoryCategory c);
// This thread's category now: the innermost live MemoryScope's, kOther outside any.
MemoryCategory current_memory_category();
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory c);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemoryCategory prev_;
};
struct OpProfile;  // runtime/profile.h
class Device;

// A point in a stream's work (CUDA: a cudaEvent_t; the CPU, whose work is done when its call
// returns, keeps the host time it was recorded at). Made by Device::make_event; owning and
// move-only; an empty Event (default-made) may only be destroyed or assigned to.
class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept : dev_(o.dev_), handle_(o.handle_) { o.handle_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  bool valid() const { return handle_ != nullptr; }
  // Marks the point after the work queued on `s` so far (re-recording moves the point).
  void record(Stream s);
  // Blocks the host until the work before the recorded point is done; at once when the event
  // was never recorded (as cudaEventSynchronize).
  void synchronize();
  // Whether that work is done, without blocking (true when never recorded).
  bool query();
  // Milliseconds from `start`'s recorded point to `end`'s (the device's clock). Both must come
  // from make_event(true) and be recorded, else ft::Error saying which.
  friend float elapsed_ms(const Event& start, const Event& end);

 private:
  friend class Device;
  Event(Device* dev, void* handle) : dev_(dev), handle_(handle) {}
  Device* dev_ = nullptr;
  void* handle_ = nullptr;
};

struct AllocatorStats {
  size_t current_bytes = 0;  // live allocations
  size_t peak_bytes = 0;     // high-water mark of current_bytes
  size_t num_allocs = 0;     // calls to alloc() so far
  // Held from the system by the device's allocator (CUDA: segments cached for reuse); the CPU
  // allocates exactly what is asked and reports current_bytes.
  size_t reserved_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;
  // Returns memory aligned to 64 bytes; throws ft::Error when out of memory.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr, size_t bytes) = 0;
  virtual void memset_zero(void* ptr, size_t bytes) = 0;
  // Copies between host and device wait for the copy (and the work before it) to finish.
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  // Device to device, ordered on the stream like an op.
  virtual void copy(Stream s, void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  virtual AllocatorStats stats() const = 0;
  // Host memory for staging device ↔ host copies (checkpoint saves copy device → host
  // staging, then write): page-locked on CUDA, so copies run at full bandwidth; plain aligned
  // memory on the CPU. The host reads and writes it directly (but see host_memory_backed).
  // Every override reports what it hands out and takes back through count_host.
  virtual void* alloc_host(size_t bytes);
  virtual void free_host(void* ptr, size_t bytes);
  // Zeroes alloc_host memory (a memset; the counting device's host addresses are not memory).
  virtual void zero_host(void* ptr, size_t bytes);
  // Plain (pageable) host memory, 64-byte aligned, for a rank's host buffers whose size follows
  // the model (model.from's weights read at start-up, a synchronous save's copy of a piece):
  // taken through the Device so that the run's metrics and ft plan count them (HostMemory).
  // Small buffers of a fixed size (the data loader's batches, a reader's chunk) stay std::vector.
  virtual void* alloc_pageable(size_t bytes);
  virtual void free_pageable(void* ptr, size_t bytes);
  // Whether the host may touch what alloc_host and alloc_pageable give: false only for ft plan's
  // counting device, whose host addresses, like its device addresses, are not memory (code that
  // writes host memory itself, not through host_ops() or the copies, asks first).
  virtual bool host_memory_backed() const { return true; }
  HostMemoryStats host_stats() const;
  // The CPU's staging memory (what alloc_host gives by default), for callers without a Device.
  static void* alloc_host_plain(size_t bytes);
  static void free_host_plain(void* ptr, size_t bytes);
  // Whether code outside the Device (MPI, reading a buffer) may use its memory as host memory.
  // The CPU's may; a GPU's may not, nor the guard device's (runtime/guard_device.h), nor the
  // emulated GPU's, although that is host memory, so that CI runs what a GPU needs: the
  // communicators reach such memory through host staging (comm/host_staging.h).
  virtual bool host_accessible() const { return true; }
  // Every op the model, ZeRO and optimizer run on this device (runtime/ops.h).
  virtual Ops& ops() = 0;
  // The ops that run on the host's memory from alloc_host (HostBuffer below): the offloaded
  // optimizer's update and its gradient sums (parallel.offload_optimizer). The CPU's kernels
  // (kernels/cpu/) on every device that runs, whatever its ops() are; the counting device's
  // run nothing, as its ops() do, for its host addresses are not memory either.
  virtual Ops& host_ops();
  // The stream work is issued on by default.
  virtual Stream stream() { return Stream{}; }
  // The per-op timings when FT_PROFILE is set (runtime/profile.h), else null.
  virtual OpProfile* profile() { return nullptr; }

  // Events (the Event class above). timing: the event can be an end of elapsed_ms (CUDA times
  // only such events; the others, cudaEventDisableTiming, cost less to record and wait on).
  Event make_event(bool timing = false) { return Event(this, event_create(timing)); }
  // `s` waits on the device for the work before `e`'s recorded point (the host is not held;
  // nothing to wait for when `e` was never recorded). The CPU's work is done already.
  void wait(Stream s, const Event& e);
  // The stream for device → host staging copies (checkpoint saves), apart from stream() so
  // that a copy can overlap the next step's compute; the CPU has one stream (what stream()
  // gives). Order it against stream() with events.
  virtual Stream copy_stream() { return stream(); }
  // The stream the optimizer's update runs on with parallel.overlap_update, apart from stream()
  // so that it overlaps the next forward (parallel/zero.h "Overlapped update"); the CPU has one.
  virtual Stream update_stream() { return stream(); }
  // memset_zero queued on `s` (the CPU: at once).
  virtual void memset_zero_async(Stream s, void* ptr, size_t bytes) {
    (void)s;
    memset_zero(ptr, bytes);
  }
  // Device → host into alloc_host memory, queued on `s`: the host may read `dst` once an event
  // recorded on `s` after it has completed. The CPU copies at once.
  virtual void copy_to_host_async(Stream s, void* dst, const void* src, size_t bytes);
  // Host (alloc_host memory) → device, queued on `s`: the host may change `src` again once an
  // event recorded on `s` after it has completed. The CPU copies at once.
  virtual void copy_from_host_async(Stream s, void* dst, const void* src, size_t bytes);
  // Any host memory → device in `s`'s order, without waiting for the device: the bytes are taken
  // before it returns (CUDA copies them into a pinned staging slot, whose earlier copy it waits
  // for, and queues the copy from there), so `src` may change at once. What a micro-batch's
  // inputs and AdamW's step constants go through; from one thread, never while a graph is
  // recorded (graph_begin). Default: copy_from_host, finished on return (the devices without a
  // second stream).
  virtual void upload_async(Stream, void* dst, const void* src, size_t bytes) {
    copy_from_host(dst, src, bytes);
  }
  // Graphs (CUDA graphs; issue 33 point 3). Between graph_begin and graph_end the work queued on
  // stream() is recorded, not run; graph_launch queues the recording on stream() with the
  // pointers and by-value arguments it was recorded with (so a per-step value must be read from
  // device memory). graphs_enabled(): this device records graphs (CUDA with FT_CUDA_GRAPHS=1);
  // elsewhere the calls are ft::Errors. The recording is the calling thread's: other threads may
  // wait on events meanwhile (a checkpoint writer), while this thread's own waits break it. While
  // recording, an allocation (device or page-locked) or a free of page-locked memory is an
  // ft::Error (a block handed out then would be baked into the graph and handed out again later)
  // and so is every copy between host and device, on any stream (a recorded one would replay the
  // recording's bytes; a synchronous one waits). graph_end throws when a call broke the
  // recording, which is then over (no graph_cancel needed). graph_epoch() changes whenever a
  // block that existed when a graph was last recorded is freed: a graph recorded in an older
  // epoch may point at freed memory and must not be launched. graph_cancel ends a recording that
  // failed, keeping nothing; graph_recording() says whether one is under way.
  virtual bool graphs_enabled() const { return false; }
  // Whether the run this device stands for would record graphs: graphs_enabled(), and for a
  // counting device (ft plan) whether the CUDA run it plans would (FT_CUDA_GRAPHS=1), so that
  // what a run keeps for its graphs is planned too.
  virtual bool plans_graphs() const { return graphs_enabled(); }
  virtual bool graph_recording() const { return false; }
  virtual void graph_begin();
  virtual void* graph_end();  // the executable graph, for graph_launch and graph_destroy
  virtual void graph_cancel();
  // graph_begin, `work`, graph_end: the recorded graph. On any exception the recording is
  // cancelled (nothing recorded ran) and the exception passes on.
  void* graph_record(const std::function<void()>& work);
  virtual void graph_launch(void* graph);
  virtual void graph_destroy(void* graph);
  virtual uint64_t graph_epoch() const { return 0; }
  // The device's free and total memory as its driver reports them (CUDA: cudaMemGetInfo);
  // {0, 0} where the device is host memory (the CPU: see available_memory_bytes).
  struct MemoryInfo {
    size_t free_bytes = 0, total_bytes = 0;
  };
  virtual MemoryInfo memory_info() { return {}; }
  // How busy the device is, as its driver reports it (CUDA: NVML, runtime/cuda/gpu_usage.h),
  // read when a metrics line is due (DESIGN.md §7). `known` false: no reading; then `why_not`
  // says why, once per device (the first time), and is empty after that and where the device
  // has no such figures (the CPU).
  struct Usage {
    bool known = false;
    double util_percent = 0;      // share of the driver's last sample period a kernel ran, 0-100
    uint64_t mem_used_bytes = 0;  // every process's memory on the GPU, as nvidia-smi counts it
    std::string why_not;
  };
  virtual Usage usage() { return {}; }

 protected:
  friend class Event;
  friend float elapsed_ms(const Event& start, const Event& end);
  // Event primitives behind Event; the defaults are the CPU's (work synchronous, the host
  // clock at record). A device with its own events overrides all of them.
  virtual void* event_create(bool timing);
  virtual void event_destroy(void* e);
  virtual void event_record(void* e, Stream s);
  virtual void event_synchronize(void* e);
  virtual bool event_query(void* e);
  virtual float event_elapsed_ms(void* start, void* end);
  virtual void stream_wait_event(Stream s, void* e);
  // Notes `bytes` of host memory of `kind` handed out (added) or taken back (removed) by an
  // override of alloc_host/free_host or alloc_pageable/free_pageable, for host_stats().
  void count_host(HostMemory kind, size_t bytes, bool added);

 private:
  mutable std::mutex host_mu_;  // the checkpoint writer's thread frees staging too
  HostMemoryStats host_;
};

// The CPU device; threads for kernels come from OpenMP (runtime.threads).
std::unique_ptr<Device> make_cpu_device();

// What a recipe's runtime section asks of the device it makes (recipe.h RuntimeConfig).
struct DeviceOptions {
  // runtime.tf32: fp32 GEMMs may round their inputs to TF32 (CUDA, cuBLASLt's
  // CUBLAS_COMPUTE_32F_FAST_TF32). The CPU has no TF32 and ignores it.
  bool allow_tf32 = false;
  // runtime.gemm_algos: measure: each cuBLASLt problem's algorithm is the fastest of the
  // heuristic's candidates, timed on its first call, and the choices are kept in
  // `gemm_algos_record` (when not empty) for a resumed run to reuse (runtime/cuda/lt_gemm.h
  // LtChoice). The CPU has one GEMM path per type and ignores both.
  bool measure_gemm_algos = false;
  std::string gemm_algos_record = {};
  // "auto" without a usable GPU: say nothing of it (ft validate), instead of one line on stderr.
  bool quiet = false;
};

// "auto" | "cpu" | "cuda". "cuda" is the GPU of this rank's node-local rank (runtime/cuda/
// gpu_choice.h), or an ft::Error naming why there is none (no CUDA backend in this build, no
// device, a driver older than the runtime). "auto" is that GPU when usable, else the CPU, and
// in a CUDA build says why in one line on stderr.
std::unique_ptr<Device> make_device(const std::string& spec, const DeviceOptions& options = {});

// The backends this executable has, for `ft --version`: "cpu", or "cpu, cuda (runtime 13.0)".
std::string built_backends();

// A CUDA backend, when the executable links one: `ft` registers lib/runtime/cuda/ built for the
// GPU (FT_CUDA), the test tool `ft_emu` the same sources built against the CUDA emulation
// (tests/cuda_emu/). Libraries and unit tests have none unless they register one. Registered
// once, before any Device is made (main does it first thing).
struct CudaBackend {
  std::string (*unusable_reason)();  // empty when a GPU is usable, else why not
  std::unique_ptr<Device> (*make)(const DeviceOptions&);  // this rank's GPU
  std::string (*description)();                           // "runtime 13.0"
};
void register_cuda_backend(const CudaBackend* backend);
const CudaBackend* cuda_backend();  // null when none is registered

// A typed, owning allocation on a Device. Move-only. Its memory is device memory: the host
// reaches it only through upload/download (or the Device's copies), never by indexing.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* dev, size_t count) : dev_(dev), count_(count) {
    if (count_) ptr_ = static_cast<T*>(dev_->alloc(count_ * sizeof(T)));
  }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      dev_ = o.dev_;
      ptr_ = o.ptr_;
      count_ = o.count_;
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void zero() {
    if (ptr_) dev_->memset_zero(ptr_, bytes());
  }
  // Host ↔ device copies of n elements starting at element `at`.
  void upload(const T* host, size_t n, size_t at = 0) {
    if (n) dev_->copy_from_host(ptr_ + at, host, n * sizeof(T));
  }
  void download(T* host, size_t n, size_t at = 0) const {
    if (n) dev_->copy_to_host(host, ptr_ + at, n * sizeof(T));
  }
  Device* device() const { return dev_; }

 private:
  void release() {
    if (ptr_) dev_->free(ptr_, bytes());
    ptr_ = nullptr;
    count_ = 0;
  }
  Device* dev_ = nullptr;
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A typed, owning allocation of host memory from Device::alloc_host: page-locked on CUDA, so
// that copies between it and the device run at full bandwidth and asynchronously (what the
// offloaded optimizer state lives in); or, with HostMemory::kPageable, from
// Device::alloc_pageable (a host buffer ft plan must count that needs no page-locking). Move-only.
// The host reads and writes it: directly, or through the device's host_ops() where `ft plan`'s
// counting device must be able to stand in (its host addresses are not memory).
template <typename T>
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Device* dev, size_t count, HostMemory kind = HostMemory::kPinned)
      : dev_(dev), count_(count), kind_(kind) {
    if (count_)
      ptr_ =
          static_cast<T*>(kind_ == HostMemory::kPinned ? dev_->alloc_host(count_ * sizeof(T))
                                                       : dev_->alloc_pageable(count_ * sizeof(T)));
  }
  ~HostBuffer() { release(); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      release();
      dev_ = o.dev_;
      ptr_ = o.ptr_;
      count_ = o.count_;
      kind_ = o.kind_;
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  Device* device() const { return dev_; }
  void zero() {
    if (ptr_) dev_->zero_host(ptr_, bytes());
  }
  HostMemory kind() const { return kind_; }

 private:
  void release() {
    if (ptr_ && kind_ == HostMemory::kPinned) dev_->free_host(ptr_, bytes());
    if (ptr_ && kind_ == HostMemory::kPageable) dev_->free_pageable(ptr_, bytes());
    ptr_ = nullptr;
    count_ = 0;
  }
  Device* dev_ = nullptr;
  T* ptr_ = nullptr;
  size_t count_ = 0;
  HostMemory kind_ = HostMemory::kPinned;
};

// An owning allocation whose element type is chosen at run time (the compute dtype of the
// precision policy: fp32, bf16 or fp16). Move-only; data() gives the typed device pointer.
class DBuffer {
 public:
  DBuffer() = default;
  DBuffer(Device* dev, DType dtype, size_t count)
      : raw_(dev, count * dtype_size(dtype)), dtype_(dtype), count_(count) {}
  Ref data() { return Ref(raw_.data(), dtype_); }
  CRef data() const { return CRef(raw_.data(), dtype_); }
  DType dtype() const { return dtype_; }
  size_t size() const { return count_; }
  size_t bytes() const { return raw_.bytes(); }
  void zero() { raw_.zero(); }
  Device* device() const { return raw_.device(); }

 private:
  Buffer<std::byte> raw_;
  DType dtype_ = DType::kF32;
  size_t count_ = 0;
};

// FT_CUDA_GRAPHS: 1 lets the CUDA backend record a micro-batch's forward and backward as a graph
// and replay it (Device::graphs_enabled; not yet measured on a GPU), 0 (the default) never; any
// other value is a UsageError (exit 2).
bool cuda_graphs_requested();

}  // namespace ft
