#include "runtime/profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/forwarding_ops.h"

namespace ft {
namespace {

// The hook of forwarding_ops.h: each op timed into its family.
struct TimeIntoFamily {
  OpProfile* profile;
  ProfileScope operator()(OpFamily f, Stream s) const { return ProfileScope(profile, f, s); }
};

class ProfilingOps final : public ForwardingOps<TimeIntoFamily> {
 public:
  ProfilingOps(Ops& inner, OpProfile& p) : ForwardingOps(inner, TimeIntoFamily{&p}), p_(p) {}

  // Two GEMMs, timed apart: dx, then dW, each forwarded with the other output null.
  void linear_backward(Stream s, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N, int in, int out,
                       bool accumulate_dx) override {
    if (dx.ptr) {
      ProfileScope t(&p_, OpFamily::kGemmDx, s);
      inner_.linear_backward(s, dx, nullptr, dy, x, W, N, in, out, accumulate_dx);
    }
    if (dW) {
      ProfileScope t(&p_, OpFamily::kGemmDw, s);
      inner_.linear_backward(s, Ref(nullptr, dx.dtype), dW, dy, x, W, N, in, out, accumulate_dx);
    }
  }

 private:
  OpProfile& p_;
};

}  // namespace

const char* op_family_name(OpFamily f) {
  switch (f) {
#define FT_OP_FAMILY(id, label) \
  case OpFamily::id:            \
    return label;
#include "runtime/op_list.h"
    case OpFamily::kGemmDx:
      return "GEMM backward dx";
    case OpFamily::kGemmDw:
      return "GEMM backward dW";
    case OpFamily::kCopyDevice:
      return "copy (device)";
    case OpFamily::kCopyHost:
      return "copy (host <-> device)";
    case OpFamily::kMemset:
      return "memset";
    case OpFamily::kCount:
      break;
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
                "ft: FT_PROFILE, rank 0: %lld step%s (the first, a warm-up, left out when more "
                "followed), %.3f s of step time (wall clock)\n",
                (long long)p.steps, p.steps == 1 ? "" : "s", total);
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
  std::snprintf(line, sizeof line, "  %-28s %10.3f %6.1f%%\n", "other (comm, loader, host)", other,
                share(other));
  s += line;
  std::snprintf(line, sizeof line, "  %-28s %10.3f %6.1f%%\n", "GEMM, all three", gemm,
                share(gemm));
  s += line;
  return s;
}

}  // namespace ft
