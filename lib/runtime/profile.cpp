#include "runtime/profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ft {
namespace {

class ProfilingOps final : public Ops {
 public:
  ProfilingOps(Ops& inner, OpProfile& p) : in_(inner), p_(p) {}

  void linear_forward(Stream s, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    ProfileScope t(&p_, OpFamily::kGemmForward, s);
    in_.linear_forward(s, y, x, W, N, in, out, accumulate);
  }
  void linear_backward(Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in,
                       int out, bool accumulate_dx) override {
    if (dx.ptr) {
      ProfileScope t(&p_, OpFamily::kGemmDx, s);
      in_.linear_backward(s, dx, nullptr, dy, x, W, N, in, out, accumulate_dx);
    }
    if (dW) {
      ProfileScope t(&p_, OpFamily::kGemmDw, s);
      in_.linear_backward(s, Ref(nullptr, dx.dtype), dW, dy, x, W, N, in, out, accumulate_dx);
    }
  }
  void embedding_forward(Stream s, Ref out, const int32_t* ids, CRef table, int N, int C,
                         int v_begin, int v_count) override {
    ProfileScope t(&p_, OpFamily::kEmbedding, s);
    in_.embedding_forward(s, out, ids, table, N, C, v_begin, v_count);
  }
  void embedding_backward(Stream s, float* dtable, const int32_t* ids, CRef dout, int N, int C,
                          int v_begin, int v_count) override {
    ProfileScope t(&p_, OpFamily::kEmbedding, s);
    in_.embedding_backward(s, dtable, ids, dout, N, C, v_begin, v_count);
  }
  void rmsnorm_forward(Stream s, Ref out, float* rstd, CRef x, CRef w, int N, int C,
                       float eps) override {
    ProfileScope t(&p_, OpFamily::kRmsnorm, s);
    in_.rmsnorm_forward(s, out, rstd, x, w, N, C, eps);
  }
  void rmsnorm_backward(Stream s, Ref dx, float* dw, CRef dout, CRef x, CRef w,
                        const float* rstd, int N, int C, bool accumulate_dx) override {
    ProfileScope t(&p_, OpFamily::kRmsnorm, s);
    in_.rmsnorm_backward(s, dx, dw, dout, x, w, rstd, N, C, accumulate_dx);
  }
  void rope_forward(Stream s, Ref x, const float* inv_freq, int B, int T, int nh,
                    int D) override {
    ProfileScope t(&p_, OpFamily::kRope, s);
    in_.rope_forward(s, x, inv_freq, B, T, nh, D);
  }
  void rope_backward(Stream s, Ref dx, const float* inv_freq, int B, int T, int nh,
                     int D) override {
    ProfileScope t(&p_, OpFamily::kRope, s);
    in_.rope_backward(s, dx, inv_freq, B, T, nh, D);
  }
  void attention_forward(Stream s, Ref out, float* lse, CRef q, CRef k, CRef v, int B, int T,
                         int H, int K, int D) override {
    ProfileScope t(&p_, OpFamily::kAttentionForward, s);
    in_.attention_forward(s, out, lse, q, k, v, B, T, H, K, D);
  }
  size_t attention_backward_scratch_elems(DType dt, int B, int T, int H, int D) override {
    return in_.attention_backward_scratch_elems(dt, B, T, H, D);  // a size, no work
  }
  void attention_backward(Stream s, Ref dq, Ref dk, Ref dv, CRef dout, CRef out,
                          const float* lse, CRef q, CRef k, CRef v, float* scratch, int B, int T,
                          int H, int K, int D) override {
    ProfileScope t(&p_, OpFamily::kAttentionBackward, s);
    in_.attention_backward(s, dq, dk, dv, dout, out, lse, q, k, v, scratch, B, T, H, K, D);
  }
  void swiglu_forward(Stream s, Ref h, CRef g, CRef u, size_t n) override {
    ProfileScope t(&p_, OpFamily::kSwiglu, s);
    in_.swiglu_forward(s, h, g, u, n);
  }
  void swiglu_backward(Stream s, Ref dg, Ref du, CRef dh, CRef g, CRef u, size_t n) override {
    ProfileScope t(&p_, OpFamily::kSwiglu, s);
    in_.swiglu_backward(s, dg, du, dh, g, u, n);
  }
  void cross_entropy(Stream s, Ref dlogits, CRef logits, const int32_t* targets,
                     const uint8_t* mask, int N, int V, float scale, double* loss_acc) override {
    ProfileScope t(&p_, OpFamily::kCrossEntropy, s);
    in_.cross_entropy(s, dlogits, logits, targets, mask, N, V, scale, loss_acc);
  }
  void row_max(Stream s, float* out, CRef x, int N, int V) override {
    ProfileScope t(&p_, OpFamily::kCrossEntropy, s);
    in_.row_max(s, out, x, N, V);
  }
  void ce_partial(Stream s, double* sumexp, double* target_logit, CRef logits,
                  const int32_t* targets, const uint8_t* mask, const float* row_max, int N, int V,
                  int v_begin) override {
    ProfileScope t(&p_, OpFamily::kCrossEntropy, s);
    in_.ce_partial(s, sumexp, target_logit, logits, targets, mask, row_max, N, V, v_begin);
  }
  void ce_finish(Stream s, Ref dlogits, CRef logits, const int32_t* targets, const uint8_t* mask,
                 const float* row_max, const double* sumexp, const double* target_logit, int N,
                 int V, int v_begin, float scale, double* loss_acc) override {
    ProfileScope t(&p_, OpFamily::kCrossEntropy, s);
    in_.ce_finish(s, dlogits, logits, targets, mask, row_max, sumexp, target_logit, N, V,
                  v_begin, scale, loss_acc);
  }
  void convert(Stream s, Ref dst, CRef src, size_t n) override {
    ProfileScope t(&p_, OpFamily::kConvert, s);
    in_.convert(s, dst, src, n);
  }
  void add(Stream s, Ref y, CRef x, size_t n) override {
    ProfileScope t(&p_, OpFamily::kAdd, s);
    in_.add(s, y, x, n);
  }
  void scale(Stream s, float* y, float f, size_t n) override {
    ProfileScope t(&p_, OpFamily::kScale, s);
    in_.scale(s, y, f, n);
  }
  void sum_squares(Stream s, double* acc, const float* x, size_t n, double divisor) override {
    ProfileScope t(&p_, OpFamily::kSumSquares, s);
    in_.sum_squares(s, acc, x, n, divisor);
  }
  void adamw_update(Stream s, float* p, const float* g, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int64_t step,
                    float grad_scale, Ref p_compute) override {
    ProfileScope t(&p_, OpFamily::kAdamw, s);
    in_.adamw_update(s, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                     p_compute);
  }

 private:
  Ops& in_;
  OpProfile& p_;
};

}  // namespace

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::kGemmForward: return "GEMM forward";
    case OpFamily::kGemmDx: return "GEMM backward dx";
    case OpFamily::kGemmDw: return "GEMM backward dW";
    case OpFamily::kAttentionForward: return "attention forward";
    case OpFamily::kAttentionBackward: return "attention backward";
    case OpFamily::kRmsnorm: return "rmsnorm";
    case OpFamily::kRope: return "rope";
    case OpFamily::kSwiglu: return "swiglu";
    case OpFamily::kCrossEntropy: return "cross-entropy";
    case OpFamily::kEmbedding: return "embedding";
    case OpFamily::kAdamw: return "adamw";
    case OpFamily::kConvert: return "convert";
    case OpFamily::kAdd: return "add";
    case OpFamily::kScale: return "scale";
    case OpFamily::kSumSquares: return "sum_squares";
    case OpFamily::kCopyDevice: return "copy (device)";
    case OpFamily::kCopyHost: return "copy (host <-> device)";
    case OpFamily::kMemset: return "memset";
    case OpFamily::kCount: break;
  }
  return "?";
}

OpProfile::Timed OpProfile::begin_timed(OpFamily f, Stream s) {
  Timed t{f, {}, {}};
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      t.start = std::move(free_.back().first);
      t.end = std::move(free_.back().second);
      free_.pop_back();
    }
  }
  if (!t.start.valid()) {
    t.start = event_device->make_event(/*timing=*/true);
    t.end = event_device->make_event(/*timing=*/true);
  }
  t.start.record(s);
  return t;
}

void OpProfile::end_timed(Timed t, Stream s) {
  t.end.record(s);
  std::lock_guard<std::mutex> lk(mu_);
  pending_.push_back(std::move(t));
}

void OpProfile::resolve_events() {
  std::lock_guard<std::mutex> lk(mu_);
  for (Timed& t : pending_) {
    t.end.synchronize();
    add(t.family, int64_t(double(elapsed_ms(t.start, t.end)) * 1e6));
    free_.emplace_back(std::move(t.start), std::move(t.end));
  }
  pending_.clear();
}

bool profile_requested() {
  const char* v = std::getenv("FT_PROFILE");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::unique_ptr<Ops> make_profiling_ops(Ops& inner, OpProfile& profile) {
  return std::make_unique<ProfilingOps>(inner, profile);
}

std::string format_profile(const OpProfile& p) {
  std::string s;
  char line[160];
  const double total = p.step_seconds;
  auto share = [&](double sec) { return total > 0 ? 100.0 * sec / total : 0.0; };
  std::snprintf(line, sizeof line,
                "ft: FT_PROFILE, rank 0: %lld steps, %.3f s of step time (wall clock)\n",
                (long long)p.steps, total);
  s += line;
  std::snprintf(line, sizeof line, "  %-28s %10s %7s %9s\n", "op family", "seconds", "share",
                "calls");
  s += line;
  double in_ops = 0, gemm = 0;
  for (int i = 0; i < int(OpFamily::kCount); ++i) {
    const auto f = OpFamily(i);
    const double sec = p.seconds(f);
    in_ops += sec;
    if (f == OpFamily::kGemmForward || f == OpFamily::kGemmDx || f == OpFamily::kGemmDw)
      gemm += sec;
    if (p.count(f) == 0) continue;
    std::snprintf(line, sizeof line, "  %-28s %10.3f %6.1f%% %9lld\n", op_family_name(f), sec,
                  share(sec), (long long)p.count(f));
    s += line;
  }
  // Outside every op: collectives, the loader's hand-over, host-side bookkeeping.
  const double other = total - in_ops;
  std::snprintf(line, sizeof line, "  %-28s %10.3f %6.1f%%\n", "other (comm, loader, host)",
                other, share(other));
  s += line;
  std::snprintf(line, sizeof line, "  %-28s %10.3f %6.1f%%\n", "GEMM, all three", gemm,
                share(gemm));
  s += line;
  return s;
}

}  // namespace ft
