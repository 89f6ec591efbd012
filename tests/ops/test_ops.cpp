// The conformance harness (op_harness.h) on the devices every build has, against the CPU
// device: the guard device (runtime/guard_device.h) and the CPU device under FT_PROFILE. Both
// run the CPU kernels behind a decorator generated from the op list (forwarding_ops.h), so
// every output must have the reference's bits; the profiled one must also count every call in
// its op's family. And every op of the list has a case.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/guard_device.h"
#include "runtime/profile.h"
#include "tests/ops/expect_conforms.h"
#include "tests/ops/op_harness.h"

namespace ft::op_test {
namespace {

TEST_CASE("ops: every op of runtime/op_list.h has a conformance case") {
  const std::vector<std::string> problems = check_coverage(all_cases());
  for (const std::string& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());
}

TEST_CASE("ops: the guard device gives the CPU device's bits on every op") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = make_guard_device();
  expect_conforms(*dev, *ref, all_cases(), /*same_kernels=*/true, "same kernels: same bits");
}

// Sets an environment variable for a scope, restores it after.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~EnvScope() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_CASE("ops: the profiled CPU device gives the CPU's bits and counts every op in its family") {
  const std::unique_ptr<Device> ref = make_cpu_device();
  std::unique_ptr<Device> dev;
  {
    const EnvScope profile("FT_PROFILE", "1");
    dev = make_cpu_device();
  }
  REQUIRE(dev->profile() != nullptr);
  dev->profile()->recording = true;
  const std::vector<Case> cases = all_cases();
  expect_conforms(*dev, *ref, cases, /*same_kernels=*/true, "FT_PROFILE: same bits");

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

}  // namespace
}  // namespace ft::op_test
