// FT_PROFILE's wrapper (runtime/profile.h): every op reaches the inner Ops unchanged, is counted
// under its family, and nothing is counted while the profile is not recording. Times are not
// asserted (they depend on the machine's load), only that they are not negative.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runtime/profile.h"

namespace ft {
namespace {

// Records each call's name and the first pointer/size it was given, to check the forwarding.
struct RecordingOps final : Ops {
  std::vector<std::string> calls;
  std::vector<const void*> first_ptr;
  std::vector<size_t> size;
  void note(const char* name, const void* p, size_t n) {
    calls.push_back(name);
    first_ptr.push_back(p);
    size.push_back(n);
  }
  void linear_forward(Stream, Ref y, CRef, CRef, int N, int, int, bool) override {
    note("linear_forward", y.ptr, size_t(N));
  }
  void linear_backward(Stream, Ref dx, float* dW, CRef, CRef, CRef, int N, int, int,
                       bool) override {
    note(dx.ptr ? (dW ? "linear_backward dx+dW" : "linear_backward dx") : "linear_backward dW",
         dx.ptr ? dx.ptr : dW, size_t(N));
  }
  void embedding_forward(Stream, Ref out, const int32_t*, CRef, int N, int, int, int) override {
    note("embedding_forward", out.ptr, size_t(N));
  }
  void embedding_backward(Stream, float* d, const int32_t*, CRef, int N, int, int,
                          int) override {
    note("embedding_backward", d, size_t(N));
  }
  void rmsnorm_forward(Stream, Ref out, float*, CRef, CRef, int N, int, float) override {
    note("rmsnorm_forward", out.ptr, size_t(N));
  }
  void rmsnorm_backward(Stream, Ref dx, float*, CRef, CRef, CRef, const float*, int N, int,
                        bool accumulate_dx) override {
    note(accumulate_dx ? "rmsnorm_backward +=" : "rmsnorm_backward", dx.ptr, size_t(N));
  }
  void rope_forward(Stream, Ref x, const float*, int B, int, int, int) override {
    note("rope_forward", x.ptr, size_t(B));
  }
  void rope_backward(Stream, Ref dx, const float*, int B, int, int, int) override {
    note("rope_backward", dx.ptr, size_t(B));
  }
  void attention_forward(Stream, Ref out, float*, CRef, CRef, CRef, int B, int, int, int,
                         int) override {
    note("attention_forward", out.ptr, size_t(B));
  }
  size_t attention_backward_scratch_elems(DType, int B, int T, int H, int D) override {
    note("attention_backward_scratch_elems", nullptr, size_t(B));
    return size_t(B) * T * H * D;
  }
  void attention_backward(Stream, Ref dq, Ref, Ref, CRef, CRef, const float*, CRef, CRef, CRef,
                          float*, int B, int, int, int, int) override {
    note("attention_backward", dq.ptr, size_t(B));
  }
  void swiglu_forward(Stream, Ref h, CRef, CRef, size_t n) override {
    note("swiglu_forward", h.ptr, n);
  }
  void swiglu_backward(Stream, Ref dg, Ref, CRef, CRef, CRef, size_t n) override {
    note("swiglu_backward", dg.ptr, n);
  }
  void cross_entropy(Stream, Ref d, CRef, const int32_t*, const uint8_t*, int N, int, float,
                     double* acc) override {
    note("cross_entropy", d.ptr, size_t(N));
    *acc += 1.5;
  }
  void row_max(Stream, float* out, CRef, int N, int) override { note("row_max", out, size_t(N)); }
  void ce_partial(Stream, double* sumexp, double*, CRef, const int32_t*, const uint8_t*,
                  const float*, int N, int, int) override {
    note("ce_partial", sumexp, size_t(N));
  }
  void ce_finish(Stream, Ref d, CRef, const int32_t*, const uint8_t*, const float*,
                 const double*, const double*, int N, int, int, float, double*) override {
    note("ce_finish", d.ptr, size_t(N));
  }
  void convert(Stream, Ref dst, CRef, size_t n) override { note("convert", dst.ptr, n); }
  void add(Stream, Ref y, CRef, size_t n) override { note("add", y.ptr, n); }
  void scale(Stream, float* y, float, size_t n) override { note("scale", y, n); }
  void sum_squares(Stream, double* acc, const float*, size_t n, double) override {
    note("sum_squares", acc, n);
  }
  void adamw_update(Stream, float* p, const float*, float*, float*, size_t n, float, float, float,
                    float, float, int64_t, float, Ref) override {
    note("adamw_update", p, n);
  }
};

// Calls every op once with distinct pointers and sizes (odd ones: 1, 19, 111).
void call_every_op(Ops& ops, float* a, float* b) {
  Stream s;
  ops.linear_forward(s, a, b, b, 19, 3, 5, false);
  ops.linear_backward(s, a, b, a, b, b, 111, 3, 5, false);  // both outputs: two calls inside
  ops.linear_backward(s, Ref(nullptr, DType::kF32), b, a, b, b, 1, 3, 5, false);  // dW only
  ops.embedding_forward(s, a, nullptr, b, 19, 2, 0, 7);
  ops.embedding_backward(s, b, nullptr, a, 19, 2, 0, 7);
  ops.rmsnorm_forward(s, a, b, a, b, 19, 2, 1e-5f);
  ops.rmsnorm_backward(s, a, b, a, a, b, b, 19, 2, false);
  ops.rmsnorm_backward(s, b, a, b, b, a, a, 111, 2, true);  // the flag reaches the inner op
  ops.rope_forward(s, a, b, 1, 2, 3, 4);
  ops.rope_backward(s, b, a, 1, 2, 3, 4);
  ops.attention_forward(s, a, b, a, a, a, 1, 19, 4, 2, 8);
  CHECK(ops.attention_backward_scratch_elems(DType::kBF16, 1, 19, 4, 8) == 19 * 4 * 8);
  ops.attention_backward(s, a, a, a, b, b, b, a, a, a, b, 1, 19, 4, 2, 8);
  ops.swiglu_forward(s, a, b, b, 111);
  ops.swiglu_backward(s, a, a, b, b, b, 111);
  double acc = 0;
  ops.cross_entropy(s, a, b, nullptr, nullptr, 19, 7, 1.0f, &acc);
  CHECK(acc == 1.5);  // the accumulator reaches the inner op
  ops.row_max(s, a, b, 19, 7);
  ops.ce_partial(s, &acc, &acc, b, nullptr, nullptr, a, 19, 7, 0);
  ops.ce_finish(s, a, b, nullptr, nullptr, a, &acc, &acc, 19, 7, 0, 1.0f, &acc);
  ops.convert(s, a, b, 111);
  ops.add(s, a, b, 19);
  ops.scale(s, b, 0.5f, 1);
  ops.sum_squares(s, &acc, a, 111, 1.0);
  ops.adamw_update(s, a, b, a, b, 19, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f, Ref());
}

TEST_CASE("profile: the wrapper forwards every op unchanged and counts it by family") {
  float a[4], b[4];
  RecordingOps direct, inner;
  call_every_op(direct, a, b);
  OpProfile prof;
  prof.recording = true;
  std::unique_ptr<Ops> wrapped = make_profiling_ops(inner, prof);
  call_every_op(*wrapped, a, b);

  // The same calls in the same order, except that a linear_backward with both outputs arrives
  // as dx then dW (so the profile can time the two GEMMs apart).
  std::vector<std::string> expected;
  for (const std::string& c : direct.calls) {
    if (c == "linear_backward dx+dW") {
      expected.push_back("linear_backward dx");
      expected.push_back("linear_backward dW");
    } else {
      expected.push_back(c);
    }
  }
  CHECK(inner.calls == expected);
  REQUIRE(inner.calls.size() == direct.calls.size() + 1);
  CHECK(inner.first_ptr[1] == static_cast<void*>(a));  // dx
  CHECK(inner.first_ptr[2] == static_cast<void*>(b));  // dW
  CHECK(inner.size[2] == 111);
  for (size_t i = 3; i < inner.calls.size(); ++i) {  // the rest line up with direct's
    CHECK(inner.first_ptr[i] == direct.first_ptr[i - 1]);
    CHECK(inner.size[i] == direct.size[i - 1]);
  }

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
  call_every_op(*wrapped, a, b);
  for (int i = 0; i < int(OpFamily::kCount); ++i) CHECK(prof.count(OpFamily(i)) == 0);
  CHECK(inner.calls.size() == 25);  // still forwarded

  prof.recording = true;
  wrapped->adamw_update(Stream{}, a, b, a, b, 19, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f,
                        Ref());
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
