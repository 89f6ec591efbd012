// FT_PROFILE's wrapper (runtime/profile.h): every op reaches the inner Ops with the same
// arguments, is counted under its family, and nothing is counted while the profile is not
// recording. Times are not asserted (they depend on the machine's load), only that they are
// not negative.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/adamw_step.h"
#include "runtime/profile.h"

namespace ft {
namespace {

// An argument as an integer: pointers, sizes, flags, the bits of floats; a Ref's dtype goes in
// the top byte, above its pointer (kPtrBits).
constexpr uint64_t kPtrBits = (uint64_t(1) << 56) - 1;
uint64_t arg_value(Stream s) { return uint64_t(uintptr_t(s.handle)); }
uint64_t arg_value(DType t) { return uint64_t(t); }
uint64_t arg_value(CRef r) { return uint64_t(uintptr_t(r.ptr)) | (uint64_t(r.dtype) << 56); }
uint64_t arg_value(Ref r) { return arg_value(CRef(r)); }
template <typename T>
uint64_t arg_value(T* p) {
  return uint64_t(uintptr_t(p));
}
uint64_t arg_value(float f) { return std::bit_cast<uint32_t>(f); }
uint64_t arg_value(double d) { return std::bit_cast<uint64_t>(d); }
template <typename T>
requires std::is_integral_v<T> uint64_t arg_value(T i) { return uint64_t(i); }

struct Call {
  std::string op;
  std::vector<uint64_t> args;
  bool operator==(const Call&) const = default;
};

// Records each call (the op's name and every argument), generated from the op list like the
// wrapper itself, so every op, present and future, is checked.
struct RecordingOps final : Ops {
  std::vector<Call> calls;
  template <typename... A>
  void note(const char* op, A... a) {
    calls.push_back(Call{op, {arg_value(a)...}});
  }
#define FT_ARGS(...) __VA_ARGS__
#define FT_OP(name, family, params, args) \
  void name params override { note(#name, FT_ARGS args); }
#include "runtime/op_list.h"
#undef FT_ARGS
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    note("attention_backward_scratch_elems", t, B, T, H, D);
    return size_t(B) * T * H * D;
  }
};

// Calls the training step's ops once each with distinct pointers and sizes (odd ones: 1, 19,
// 111). Every op of the list, later ones included, goes through the profiling wrapper in
// tests/ops/test_ops.cpp, which checks its family's count.
void call_step_ops(Ops& ops, float* a, float* b) {
  Stream s;
  ops.linear_forward(s, a, b, b, 19, 3, 5, false);
  ops.linear_backward(s, a, b, a, b, b, 111, 3, 5, false);  // both outputs: two calls inside
  ops.linear_backward(s, Ref(nullptr, DType::kF32), b, a, b, b, 1, 3, 5, false);  // dW only
  ops.embedding_forward(s, a, nullptr, b, 19, 2, 0, 7);
  ops.embedding_backward(s, b, nullptr, a, 19, 2, 0, 7);
  ops.rmsnorm_forward(s, a, b, a, b, 19, 2, 1e-5f);
  ops.rmsnorm_backward(s, a, b, a, a, b, b, 19, 2, false);
  ops.rmsnorm_backward(s, b, a, b, b, a, a, 111, 2, true);  // the flag reaches the inner op
  ops.rope_forward(s, a, b, 1, 2, 3, 4, nullptr);
  ops.rope_backward(s, b, a, 1, 2, 3, 4, nullptr);
  ops.attention_forward(s, a, b, a, a, a, nullptr, 1, 19, 4, 2, 8);
  CHECK(ops.attention_backward_scratch_elems(DType::kBF16, 1, 19, 4, 8) == 19 * 4 * 8);
  ops.attention_backward(s, a, a, a, b, b, b, a, a, a, nullptr, b, 1, 19, 4, 2, 8);
  ops.swiglu_forward(s, a, b, b, 111);
  ops.swiglu_backward(s, a, a, b, b, b, 111);
  double acc = 0;
  ops.cross_entropy(s, a, b, nullptr, nullptr, 19, 7, b, &acc);
  ops.row_max(s, a, b, 19, 7);
  ops.ce_partial(s, &acc, &acc, b, nullptr, nullptr, a, 19, 7, 0);
  ops.ce_finish(s, a, b, nullptr, nullptr, a, &acc, &acc, 19, 7, 0, b, &acc);
  ops.convert(s, a, b, 111);
  ops.add(s, a, b, 19);
  ops.scale(s, b, 0.5f, 1);
  ops.sum_squares(s, &acc, a, 111, 1.0);
  const kernels::AdamwArgs args{kernels::adamw_step(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1), 0.5f};
  ops.adamw_update(s, a, b, a, b, 19, &args, Ref());
}

TEST_CASE("profile: the wrapper forwards every op unchanged and counts it by family") {
  float a[4], b[4];
  RecordingOps direct, inner;
  call_step_ops(direct, a, b);
  OpProfile prof;
  prof.recording = true;
  std::unique_ptr<Ops> wrapped = make_profiling_ops(inner, prof);
  call_step_ops(*wrapped, a, b);

  // The same calls with the same arguments in the same order, except that a linear_backward
  // with both outputs arrives as dx (dW null) then dW (dx null, its dtype kept), so the
  // profile can time the two GEMMs apart.
  std::vector<Call> expected;
  for (const Call& c : direct.calls) {
    if (c.op == "linear_backward" && (c.args[1] & kPtrBits) && c.args[2]) {
      Call dx = c, dw = c;
      dx.args[2] = 0;           // dW
      dw.args[1] &= ~kPtrBits;  // dx: null, of dx's dtype
      expected.push_back(dx);
      expected.push_back(dw);
    } else {
      expected.push_back(c);
    }
  }
  CHECK(inner.calls.size() == direct.calls.size() + 1);
  CHECK(inner.calls == expected);

  auto calls = [&](OpFamily f) { return prof.count(f); };
  CHECK(calls(OpFamily::kGemmForward) == 1);
  CHECK(calls(OpFamily::kGemmDx) == 1);
  CHECK(calls(OpFamily::kGemmDw) == 2);
  CHECK(calls(OpFamily::kEmbedding) == 2);
  CHECK(calls(OpFamily::kRmsnorm) == 3);
  CHECK(calls(OpFamily::kRope) == 2);
  CHECK(calls(OpFamily::kAttentionForward) == 1);
  CHECK(calls(OpFamily::kAttentionBackward) == 1);  // the scratch size is not an op
  CHECK(calls(OpFamily::kSwiglu) == 2);
  CHECK(calls(OpFamily::kCrossEntropy) == 4);
  CHECK(calls(OpFamily::kConvert) == 1);
  CHECK(calls(OpFamily::kAdd) == 1);
  CHECK(calls(OpFamily::kScale) == 1);
  CHECK(calls(OpFamily::kSumSquares) == 1);
  CHECK(calls(OpFamily::kAdamw) == 1);
  CHECK(calls(OpFamily::kCopyDevice) == 0);
  int64_t total = 0;
  for (int i = 0; i < int(OpFamily::kCount); ++i) {
    total += prof.count(OpFamily(i));
    CHECK(prof.seconds(OpFamily(i)) >= 0);
  }
  CHECK(total == 24);
}

TEST_CASE("profile: nothing is counted while not recording; the table names what ran") {
  float a[4], b[4];
  RecordingOps inner;
  OpProfile prof;
  std::unique_ptr<Ops> wrapped = make_profiling_ops(inner, prof);
  call_step_ops(*wrapped, a, b);
  for (int i = 0; i < int(OpFamily::kCount); ++i) CHECK(prof.count(OpFamily(i)) == 0);
  CHECK(inner.calls.size() == 25);  // still forwarded

  prof.recording = true;
  const kernels::AdamwArgs args{kernels::adamw_step(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1), 1.0f};
  wrapped->adamw_update(Stream{}, a, b, a, b, 19, &args, Ref());
  { ProfileScope copy(&prof, OpFamily::kCopyHost); }
  { ProfileScope none(nullptr, OpFamily::kCopyHost); }  // no profile: a no-op
  prof.step_seconds = 2.0;
  prof.steps = 3;
  const std::string table = format_profile(prof);
  CHECK(table.find("3 steps") != std::string::npos);
  CHECK(table.find("adamw") != std::string::npos);
  CHECK(table.find("copy (host <-> device)") != std::string::npos);
  CHECK(table.find("other (comm, loader, host)") != std::string::npos);
  CHECK(table.find("GEMM forward") == std::string::npos);  // families that never ran are left out
  CHECK(prof.count(OpFamily::kCopyHost) == 1);
}

}  // namespace
}  // namespace ft
