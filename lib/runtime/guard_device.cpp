#include "runtime/guard_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "runtime/cpu_ops.h"
#include "runtime/forwarding_ops.h"

namespace ft {
namespace {

class GuardDevice;

// While alive, every allocation of the device is readable and writable (nested uses nest).
struct Open {
  explicit Open(GuardDevice* d);
  ~Open();
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;
  GuardDevice* dev;
};

// The hook of forwarding_ops.h: the device's memory open for the op's call.
struct OpenDuringOp {
  GuardDevice* dev;
  Open operator()(OpFamily, Stream) const { return Open(dev); }
};
// Every op forwarded to the CPU ops with the device's memory open.
using GuardOps = ForwardingOps<OpenDuringOp>;

class GuardDevice final : public Device {
 public:
  GuardDevice() : cpu_ops_(make_cpu_ops()), ops_(*cpu_ops_, OpenDuringOp{this}) {}
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu (guarded: FT_TEST_GUARD_DEVICE)"; }

  void* alloc(size_t bytes) override {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t len = std::max(page, (bytes + page - 1) / page * page);
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(detail::concat("guard device: out of memory (", bytes, " B)"));
    std::lock_guard<std::mutex> lk(mu_);
    if (open_ > 0) protect(p, len, PROT_READ | PROT_WRITE);
    maps_[p] = len;
    current_ += bytes;
    peak_ = std::max(peak_, current_);
    ++num_allocs_;
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = maps_.find(ptr);
    FT_CHECK(it != maps_.end(), "guard device: free of an unknown pointer");
    munmap(ptr, it->second);
    maps_.erase(it);
    current_ -= bytes;
  }
  void memset_zero(void* ptr, size_t bytes) override {
    const Open open(this);
    std::memset(ptr, 0, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    const Open open(this);
    std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    const Open open(this);
    std::memcpy(dst, src, bytes);
  }
  void copy(Stream, void* dst, const void* src, size_t bytes) override {
    const Open open(this);
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  void synchronize() override {}
  bool host_accessible() const override { return false; }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return AllocatorStats{current_, peak_, num_allocs_};
  }
  Ops& ops() override { return ops_; }

  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    if (open_++ == 0)
      for (const auto& [p, len] : maps_) protect(p, len, PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    if (--open_ == 0)
      for (const auto& [p, len] : maps_) protect(p, len, PROT_NONE);
  }

 private:
  static void protect(void* p, size_t len, int prot) {
    FT_CHECK(mprotect(p, len, prot) == 0, "guard device: mprotect failed");
  }
  std::unique_ptr<Ops> cpu_ops_;
  GuardOps ops_;
  mutable std::mutex mu_;
  std::map<void*, size_t> maps_;
  int open_ = 0;
  size_t current_ = 0, peak_ = 0, num_allocs_ = 0;
};

Open::Open(GuardDevice* d) : dev(d) { dev->open(); }
Open::~Open() { dev->close(); }

}  // namespace

std::unique_ptr<Device> make_guard_device() { return std::make_unique<GuardDevice>(); }

}  // namespace ft
