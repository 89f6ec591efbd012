// The conformance harness (op_harness.h) on the CUDA device against the CPU device: every op of
// the list through Device::ops(), each case's outputs within its op's tolerance. Built twice:
// against the CUDA emulation (ft_ops_cuda_emu_tests: lib/runtime/cuda/ and kernels/cuda/
// compiled by g++ for the emulated runtime and cuBLASLt, a test tool; ctest
// ops_conformance_cuda_emu, label cuda-emu) and against the real backend (ft_ops_gpu_tests,
// for the GPU machine: scripts/gpu_check.py's `ops` check; exit 77 without a usable GPU).
// Attention has two CUDA implementations, chosen per device by FT_CUDA_ATTENTION: the default
// (tensor cores through cuBLASLt) runs every case, the SIMT kernels the attention cases. Each
// case runs twice on the device and must give the same bits (no float atomics, fixed sum
// orders); on the emulation, under two thread schedules.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"
#include "tests/ops/expect_conforms.h"
#include "tests/ops/op_harness.h"
#if defined(FT_CUDA_EMU)
#include "tests/cuda_emu/emu_test_util.h"
#endif

namespace ft::op_test {
namespace {

// The CUDA device with attention `mode` ("gemm" or "simt"): FT_CUDA_ATTENTION is read when the
// device's ops are made, and restored after.
std::unique_ptr<Device> cuda_device(const char* mode) {
  std::optional<std::string> old;
  if (const char* v = std::getenv("FT_CUDA_ATTENTION")) old = v;
  setenv("FT_CUDA_ATTENTION", mode, 1);
  std::unique_ptr<Device> dev = make_cuda_device();
  if (old)
    setenv("FT_CUDA_ATTENTION", old->c_str(), 1);
  else
    unsetenv("FT_CUDA_ATTENTION");
  return dev;
}

// Each case twice, the same bits; the emulation's two runs under emu_test_util.h's two seeds
// (the process's, FT_CUDA_EMU_SEED, and one derived from it).
Options twice() {
  Options o;
  o.twice = true;
#if defined(FT_CUDA_EMU)
  o.before_run = [seeds = ft::emu::test::test_seeds()](int run) {
    ft::emu::set_seed(seeds[size_t(run)]);
  };
#endif
  return o;
}

TEST_CASE("ops: the CUDA device against the CPU device on every op") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("gemm");
#if defined(FT_CUDA_EMU)
  const ft::emu::test::SeedScope keep_seed(ft::emu::seed());
#endif
  const Report r = expect_conforms(*dev, *ref, all_cases(), twice(), "attention on tensor cores");
  CHECK(r.cases_per_op.size() == op_names().size());
}

TEST_CASE("ops: the CUDA device with SIMT attention against the CPU device on attention") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("simt");
  std::vector<Case> cases;
  for (Case& c : all_cases())
    if (c.op == "attention_forward" || c.op == "attention_backward") cases.push_back(std::move(c));
  REQUIRE(!cases.empty());
#if defined(FT_CUDA_EMU)
  const ft::emu::test::SeedScope keep_seed(ft::emu::seed());
#endif
  expect_conforms(*dev, *ref, cases, twice(), "SIMT attention");
}

}  // namespace
}  // namespace ft::op_test
