// The conformance harness (op_harness.h) on the CUDA device against the CPU device: every op of
// the list through Device::ops(), each case's outputs within its op's tolerance. Built twice:
// against the CUDA emulation (ft_ops_cuda_emu_tests: lib/runtime/cuda/ and kernels/cuda/
// compiled by g++ for the emulated runtime and cuBLASLt, a test tool; ctest
// ops_conformance_cuda_emu, label cuda-emu) and against the real backend (ft_ops_gpu_tests,
// for the GPU machine: scripts/gpu_check.py's `ops` check; exit 77 without a usable GPU).
// Attention has three CUDA paths, chosen per device by FT_CUDA_ATTENTION (ops_memory.h): the
// default (fused: FlashAttention-2 on tensor cores where it applies, on sm_90 the Hopper kernels
// with FT_CUDA_ATTENTION_SM90=1; the chunked GEMMs for fp32 and other head dims)
// runs every case but the fp32 ones with document segments (which no CUDA
// path takes: a clear error, checked below); the chunked GEMMs (gemm) and the SIMT kernels
// (simt) run the attention cases without segments. Each case runs twice on the device and must
// give the same bits (no float atomics, fixed sum orders); on the emulation, under two thread
// schedules.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"
#include "tests/ops/expect_conforms.h"
#include "tests/ops/op_harness.h"
#include "tests/unit/env_scope.h"
#if defined(FT_CUDA_EMU)
#include "tests/cuda_emu/emu_test_util.h"
#endif

namespace ft::op_test {
namespace {

// The CUDA device with attention `mode` ("fused", "gemm" or "simt") and FT_CUDA_ATTENTION_SM90
// `sm90` (nullptr: unset, the default): both are read when the device's ops are made.
std::unique_ptr<Device> cuda_device(const char* mode, const char* sm90 = nullptr) {
  const ft::test::EnvScope path("FT_CUDA_ATTENTION", mode), forward("FT_CUDA_ATTENTION_SM90", sm90);
  return make_cuda_device();
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

bool is_attention(const Case& c) {
  return c.op == "attention_forward" || c.op == "attention_backward";
}
bool has_segments(const Case& c) { return c.shape.find("segments") != std::string::npos; }

TEST_CASE("ops: the CUDA device against the CPU device on every op") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("fused");
  std::vector<Case> cases;
  size_t fused_segments = 0;
  for (Case& c : all_cases()) {
    if (is_attention(c) && has_segments(c) && c.dtype == "f32") continue;
    fused_segments += is_attention(c) && has_segments(c);
    cases.push_back(std::move(c));
  }
  CHECK(fused_segments > 0);
#if defined(FT_CUDA_EMU)
  const ft::emu::test::SeedScope keep_seed(ft::emu::seed());
#endif
  const Report r = expect_conforms(*dev, *ref, cases, twice(), "fused attention (the default)");
  CHECK(r.cases_per_op.size() == op_names().size());
}

// The attention cases without segments on the device with attention path `mode`.
void attention_cases_on(const char* mode, const char* label) {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device(mode);
  std::vector<Case> cases;
  for (Case& c : all_cases())
    if (is_attention(c) && !has_segments(c)) cases.push_back(std::move(c));
  REQUIRE(!cases.empty());
#if defined(FT_CUDA_EMU)
  const ft::emu::test::SeedScope keep_seed(ft::emu::seed());
#endif
  expect_conforms(*dev, *ref, cases, twice(), label);
}

TEST_CASE("ops: the CUDA device with attention through cuBLASLt against the CPU device") {
  attention_cases_on("gemm", "attention on tensor cores through cuBLASLt");
}

TEST_CASE("ops: the CUDA device with SIMT attention against the CPU device on attention") {
  attention_cases_on("simt", "SIMT attention");
}

// On an sm_90 device (the emulation's) FT_CUDA_ATTENTION_SM90=1 makes the fused path's forward and
// backward attention_sm90's: the attention cases, segments included, once more that way.
// Elsewhere the knob changes nothing and this repeats the default's cases.
TEST_CASE(
    "ops: the CUDA device with FT_CUDA_ATTENTION_SM90=1 against the CPU device on attention") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("fused", "1");
  std::vector<Case> cases;
  for (Case& c : all_cases())
    if (is_attention(c) && !(has_segments(c) && c.dtype == "f32")) cases.push_back(std::move(c));
  REQUIRE(!cases.empty());
#if defined(FT_CUDA_EMU)
  const ft::emu::test::SeedScope keep_seed(ft::emu::seed());
#endif
  expect_conforms(*dev, *ref, cases, twice(), "fused attention, the Hopper kernels");
  CHECK_THROWS_WITH_AS(cuda_device("fused", "yes"),
                       doctest::Contains("FT_CUDA_ATTENTION_SM90='yes'"), Error);
}

// Document segments on a path without them (gemm, simt, and fp32 under the default) are an
// error naming the cause, not a silently unmasked attention.
TEST_CASE("ops: CUDA attention refuses segments where its path has none") {
  struct Refusal {
    const char* mode;
    DType dtype;
  };
  for (const Refusal r : {Refusal{"gemm", DType::kBF16}, Refusal{"simt", DType::kF16},
                          Refusal{"fused", DType::kF32}}) {
    CAPTURE(r.mode);
    const std::unique_ptr<Device> dev = cuda_device(r.mode);
    const int B = 1, T = 3, H = 1, K = 1, D = 64;
    const size_t n = size_t(B) * T * H * D;
    Buffer<float> x(dev.get(), n), lse(dev.get(), size_t(B) * H * T);  // fp32-sized: room for all
    Buffer<int32_t> seg(dev.get(), size_t(B) * T);
    const Ref out(x.data(), r.dtype);
    const CRef in(x.data(), r.dtype);
    try {
      dev->ops().attention_forward(dev->stream(), out, lse.data(), in, in, in, seg.data(), B, T, H,
                                   K, D);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("document segments need the fused") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace ft::op_test
