#include "runtime/guard_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "runtime/cpu_ops.h"

namespace ft {
namespace {

class GuardDevice;

// While alive, every allocation of the device is readable and writable (nested uses nest).
struct Open {
  explicit Open(GuardDevice* d);
  ~Open();
  GuardDevice* dev;
};

// Forwards every op to the CPU ops with the device's memory open.
class GuardOps final : public Ops {
 public:
  GuardOps(GuardDevice* dev, Ops& inner) : dev_(dev), inner_(inner) {}
  void linear_forward(Stream s, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    const Open open(dev_);
    inner_.linear_forward(s, y, x, W, N, in, out, accumulate);
  }
  void linear_backward(Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in, int out,
                       bool accumulate_dx) override {
    const Open open(dev_);
    inner_.linear_backward(s, dx, dW, dy, x, W, N, in, out, accumulate_dx);
  }
  void embedding_forward(Stream s, Ref out, const int32_t* ids, CRef table, int N, int C,
                         int v_begin, int v_count) override {
    const Open open(dev_);
    inner_.embedding_forward(s, out, ids, table, N, C, v_begin, v_count);
  }
  void embedding_backward(Stream s, float* dtable, const int32_t* ids, CRef dout, int N, int C,
                          int v_begin, int v_count) override {
    const Open open(dev_);
    inner_.embedding_backward(s, dtable, ids, dout, N, C, v_begin, v_count);
  }
  void rmsnorm_forward(Stream s, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                       float eps) override {
    const Open open(dev_);
    inner_.rmsnorm_forward(s, out, rstd, x, w, N, C, eps);
  }
  void rmsnorm_backward(Stream s, Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd,
                        int N, int C, bool accumulate_dx) override {
    const Open open(dev_);
    inner_.rmsnorm_backward(s, dx, dw, dout, x, w, rstd, N, C, accumulate_dx);
  }
  void rope_forward(Stream s, Ref x, const float* inv_freq, int B, int T, int nh, int D) override {
    const Open open(dev_);
    inner_.rope_forward(s, x, inv_freq, B, T, nh, D);
  }
  void rope_backward(Stream s, Ref dx, const float* inv_freq, int B, int T, int nh,
                     int D) override {
    const Open open(dev_);
    inner_.rope_backward(s, dx, inv_freq, B, T, nh, D);
  }
  void attention_forward(Stream s, Ref out, float* lse, CRef q, CRef k, CRef v, int B, int T, int H,
                         int K, int D) override {
    const Open open(dev_);
    inner_.attention_forward(s, out, lse, q, k, v, B, T, H, K, D);
  }
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    const Open open(dev_);
    return inner_.attention_backward_scratch_elems(t, B, T, H, D);
  }
  void attention_backward(Stream s, Ref dq, Ref dk, Ref dv, CRef dout, CRef out, const float* lse,
                          CRef q, CRef k, CRef v, float* scratch, int B, int T, int H, int K,
                          int D) override {
    const Open open(dev_);
    inner_.attention_backward(s, dq, dk, dv, dout, out, lse, q, k, v, scratch, B, T, H, K, D);
  }
  void swiglu_forward(Stream s, Ref h, CRef g, CRef u, size_t n) override {
    const Open open(dev_);
    inner_.swiglu_forward(s, h, g, u, n);
  }
  void swiglu_backward(Stream s, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) override {
    const Open open(dev_);
    inner_.swiglu_backward(s, dg, du, dh, g, u, n);
  }
  void cross_entropy(Stream s, Ref dlogits, CRef logits, const int32_t* targets,
                     const uint8_t* mask, int N, int V, float scale, double* loss_acc) override {
    const Open open(dev_);
    inner_.cross_entropy(s, dlogits, logits, targets, mask, N, V, scale, loss_acc);
  }
  void row_max(Stream s, float* out, CRef x, int N, int V) override {
    const Open open(dev_);
    inner_.row_max(s, out, x, N, V);
  }
  void ce_partial(Stream s, double* sumexp, double* target_logit, CRef logits,
                  const int32_t* targets, const uint8_t* mask, const float* row_max, int N, int V,
                  int v_begin) override {
    const Open open(dev_);
    inner_.ce_partial(s, sumexp, target_logit, logits, targets, mask, row_max, N, V, v_begin);
  }
  void ce_finish(Stream s, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale, double* loss_acc) override {
    const Open open(dev_);
    inner_.ce_finish(s, dlogits, logits, targets, mask, row_max, sumexp, target_logit, N, V,
                     v_begin, scale, loss_acc);
  }
  void convert(Stream s, Ref dst, CRef src, size_t n) override {
    const Open open(dev_);
    inner_.convert(s, dst, src, n);
  }
  void add(Stream s, Ref y, CRef x, size_t n) override {
    const Open open(dev_);
    inner_.add(s, y, x, n);
  }
  void scale(Stream s, float* y, float f, size_t n) override {
    const Open open(dev_);
    inner_.scale(s, y, f, n);
  }
  void sum_squares(Stream s, double* acc, const float* x, size_t n, double divisor) override {
    const Open open(dev_);
    inner_.sum_squares(s, acc, x, n, divisor);
  }
  void adamw_update(Stream s, float* p, const float* g, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int64_t t,
                    float grad_scale, Ref p_compute) override {
    const Open open(dev_);
    inner_.adamw_update(s, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                        p_compute);
  }

 private:
  GuardDevice* dev_;
  Ops& inner_;
};

class GuardDevice final : public Device {
 public:
  GuardDevice() : cpu_ops_(make_cpu_ops()), ops_(this, *cpu_ops_) {}
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
