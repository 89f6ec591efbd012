// The conformance harness (op_harness.h) on the devices every build has, against the CPU
// device: the guard device (runtime/guard_device.h) and the CPU device under FT_PROFILE. Both
// run the CPU kernels behind a decorator generated from the op list (forwarding_ops.h), so
// every output must have the reference's bits; the profiled one must also count every call in
// its op's family. And the harness itself: every op of the list has a case, and an op whose
// output is off fails it, naming op, dtype, shape and the worst element.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/half.h"
#include "runtime/device.h"
#include "runtime/forwarding_ops.h"
#include "runtime/guard_device.h"
#include "runtime/profile.h"
#include "tests/ops/expect_conforms.h"
#include "tests/ops/op_harness.h"
#include "tests/unit/env_scope.h"

namespace ft::op_test {
namespace {

// Options for a device that runs the reference's kernels: the reference's bits.
Options same_bits(bool on = true) {
  Options o;
  o.same_kernels = on;
  return o;
}

TEST_CASE("ops: every op of runtime/op_list.h has a conformance case") {
  const std::vector<std::string> problems = check_coverage(all_cases());
  for (const std::string& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
}

TEST_CASE("ops: the guard device gives the CPU device's bits on every op, run after run") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = make_guard_device();
  Options o = same_bits();
  o.twice = true;  // the CPU kernels' bits do not change from run to run either
  expect_conforms(*dev, *ref, all_cases(), o, "same kernels: same bits, twice");
}

TEST_CASE("ops: the profiled CPU device gives the CPU's bits and counts every op in its family") {
  const std::unique_ptr<Device> ref = make_cpu_device();
  std::unique_ptr<Device> dev;
  {
    const ft::test::EnvScope profile("FT_PROFILE", "1");
    dev = make_cpu_device();
  }
  REQUIRE(dev->profile() != nullptr);
  dev->profile()->recording = true;
  const std::vector<Case> cases = all_cases();
  expect_conforms(*dev, *ref, cases, same_bits(), "FT_PROFILE: same bits");

  // What each case's one call must have added: its op's family from the list, but
  // linear_backward, which is timed as its dx GEMM and its dW GEMM.
  const std::map<std::string, OpFamily> family = {
#define FT_OP(name, family, params, args) {#name, OpFamily::family},
#include "runtime/op_list.h"
  };
  std::map<OpFamily, int64_t> want;
  for (const Case& c : cases) {
    if (c.op == "linear_backward") {
      if (!c.tensors[0].null) ++want[OpFamily::kGemmDx];
      if (!c.tensors[1].null) ++want[OpFamily::kGemmDw];
    } else {
      ++want[family.at(c.op)];
    }
  }
  for (const auto& [f, n] : family) CHECK_MESSAGE(want[n] > 0, f << " was never called");
  for (const auto& [f, n] : want) {
    INFO(op_family_name(f));
    CHECK(dev->profile()->count(f) == n);
  }
}

// ---- A deliberately broken op: the harness must catch it and say where ----

// A Device that is `inner` in every respect but its ops, which `make_ops` makes in front of
// inner's: test-only, to put a decorator at the dispatch point.
class WrappedDevice final : public Device {
 public:
  WrappedDevice(std::unique_ptr<Device> inner, std::string label,
                const std::function<std::unique_ptr<Ops>(Device& inner)>& make_ops)
      : inner_(std::move(inner)), label_(std::move(label)), ops_(make_ops(*inner_)) {}
  DeviceKind kind() const override { return inner_->kind(); }
  std::string name() const override { return inner_->name() + " (" + label_ + ")"; }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p, size_t bytes) override { inner_->free(p, bytes); }
  void memset_zero(void* p, size_t bytes) override { inner_->memset_zero(p, bytes); }
  void copy_to_host(void* d, const void* s, size_t b) override { inner_->copy_to_host(d, s, b); }
  void copy_from_host(void* d, const void* s, size_t b) override {
    inner_->copy_from_host(d, s, b);
  }
  void copy(Stream st, void* d, const void* s, size_t b) override { inner_->copy(st, d, s, b); }
  void synchronize() override { inner_->synchronize(); }
  AllocatorStats stats() const override { return inner_->stats(); }
  bool host_accessible() const override { return inner_->host_accessible(); }
  Ops& ops() override { return *ops_; }
  Stream stream() override { return inner_->stream(); }

 private:
  std::unique_ptr<Device> inner_;
  std::string label_;
  std::unique_ptr<Ops> ops_;
};

struct NoHook {
  int operator()(OpFamily, Stream) const { return 0; }
};

// linear_forward's output y (N, out) with its middle element moved by a quarter of its size
// (at least 0.25): far beyond any tolerance, in every dtype. Read and written through the
// Device's copies, as device memory. `every` > 1: only every every-th call (a flaky op).
class BrokenLinearForward final : public ForwardingOps<NoHook> {
 public:
  BrokenLinearForward(Ops& inner, Device& dev, int every = 1)
      : ForwardingOps(inner, NoHook{}), dev_(dev), every_(every) {}
  void linear_forward(Stream s, Ref y, CRef x, CRef W, int N, int in, int out,
                      bool accumulate) override {
    inner_.linear_forward(s, y, x, W, N, in, out, accumulate);
    if (++calls_ % every_ != 0) return;
    const size_t i = size_t(N) * size_t(out) / 2, es = dtype_size(y.dtype);
    void* at = static_cast<char*>(y.ptr) + i * es;
    float f32 = 0;
    bf16 b16;
    f16 h16;
    void* host = y.dtype == DType::kF32    ? static_cast<void*>(&f32)
                 : y.dtype == DType::kBF16 ? static_cast<void*>(&b16)
                                           : static_cast<void*>(&h16);
    dev_.copy_to_host(host, at, es);
    const float v = y.dtype == DType::kF32    ? f32
                    : y.dtype == DType::kBF16 ? to_f32(b16)
                                              : to_f32(h16);
    const float moved = v + std::max(0.25f, 0.25f * std::fabs(v));
    f32 = moved;
    b16 = to_bf16(moved);
    h16 = to_f16(moved);
    dev_.copy_from_host(at, host, es);
  }

 private:
  Device& dev_;
  int every_, calls_ = 0;
};

TEST_CASE("ops: a broken op fails the harness, which names op, dtype, shape and worst element") {
  WrappedDevice dev(make_cpu_device(), "linear_forward broken", [](Device& inner) {
    return std::make_unique<BrokenLinearForward>(inner.ops(), inner);
  });
  const std::unique_ptr<Device> ref = make_cpu_device();
  std::vector<Case> cases;
  size_t n_linear = 0;
  for (Case& c : all_cases()) {
    if (c.op == "linear_forward") ++n_linear;
    if (c.op == "linear_forward" || c.op == "swiglu_forward") cases.push_back(std::move(c));
  }
  REQUIRE(n_linear > 0);

  for (bool same_kernels : {false, true}) {
    CAPTURE(same_kernels);
    const Report r = run_cases(cases, dev, *ref, same_bits(same_kernels));
    CHECK(r.cases == cases.size());
    // Every linear_forward case fails, nothing else does.
    CHECK(r.failures.size() == n_linear);
    for (const std::string& f : r.failures) {
      INFO(f);
      CHECK(f.rfind("FAIL linear_forward ", 0) == 0);
      CHECK(f.find("(linear_forward broken)") != std::string::npos);  // the device
    }
    // One case in full: N = 19, out = 19, so the broken element is y[180].
    const std::string want_prefix = "FAIL linear_forward bf16 N=19 in=111 out=19 on ";
    const std::string* line = nullptr;
    for (const std::string& f : r.failures)
      if (f.rfind(want_prefix, 0) == 0) line = &f;
    REQUIRE(line != nullptr);
    INFO(*line);
    if (same_kernels) {
      CHECK(line->find("y: 1 of 361 elements differ in bits") != std::string::npos);
      CHECK(line->find("first at [180]: got ") != std::string::npos);
    } else {
      CHECK(line->find("y: 1 of 361 elements beyond the bound; worst at [180]: got ") !=
            std::string::npos);
      CHECK(line->find(", want ") != std::string::npos);
      CHECK(line->find(", error ") != std::string::npos);
      CHECK(line->find(" (bound ") != std::string::npos);
    }
  }
}

TEST_CASE("ops: an op whose second run differs fails the harness's determinism check") {
  WrappedDevice dev(make_cpu_device(), "linear_forward flaky", [](Device& inner) {
    return std::make_unique<BrokenLinearForward>(inner.ops(), inner, /*every=*/2);
  });
  const std::unique_ptr<Device> ref = make_cpu_device();
  std::vector<Case> cases;
  for (Case& c : all_cases())
    if (c.op == "linear_forward" && c.dtype == "f16") cases.push_back(std::move(c));
  REQUIRE(!cases.empty());
  Options o;
  o.twice = true;
  int runs = 0;
  o.before_run = [&](int run) { CHECK(run == runs++ % 2); };
  const Report r = run_cases(cases, dev, *ref, o);
  CHECK(runs == int(2 * cases.size()));
  // The first run of each case is right, the second is not: every case fails, as such.
  CHECK(r.failures.size() == cases.size());
  for (const std::string& f : r.failures) {
    INFO(f);
    CHECK(f.find(": y: 1 of ") != std::string::npos);
    CHECK(f.find(" elements differ between two runs on the device (not deterministic); first "
                 "at [") != std::string::npos);
  }
}

}  // namespace
}  // namespace ft::op_test
