#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "runtime/cpu_ops.h"
#include "runtime/guard_device.h"
#include "runtime/device.h"
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
    while (cur > peak && !peak_.compare_exchange_weak(peak, cur)) {}
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
    return AllocatorStats{current_.load(), peak_.load(), num_allocs_.load()};
  }

 private:
  std::atomic<size_t> current_{0}, peak_{0}, num_allocs_{0};
  std::unique_ptr<Ops> ops_ = make_cpu_ops();
  // FT_PROFILE only (runtime/profile.h); without it both stay null and nothing is timed.
  std::unique_ptr<OpProfile> profile_ =
      profile_requested() ? std::make_unique<OpProfile>() : nullptr;
  std::unique_ptr<Ops> profiling_ops_ =
      profile_ ? make_profiling_ops(*ops_, *profile_) : nullptr;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

std::unique_ptr<Device> make_device(const std::string& spec) {
  if (spec == "cpu" || spec == "auto") {
    // Test support (runtime/guard_device.h): device memory the host cannot touch.
    if (const char* g = std::getenv("FT_TEST_GUARD_DEVICE"); g && std::string(g) == "1")
      return make_guard_device();
    return make_cpu_device();
  }
  if (spec == "cuda")
    throw UsageError(
        "runtime.device: cuda requested, but this build of ft has no CUDA backend yet; "
        "use runtime.device: cpu (or auto)");
  throw UsageError("runtime.device: unknown device '" + spec + "' (expected auto, cpu or cuda)");
}

}  // namespace ft
