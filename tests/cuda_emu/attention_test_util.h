// What the attention tests of the CUDA kernels share (test_attention.cpp: the SIMT and cuBLASLt
// paths; test_attention_fused.cpp: the fused kernel), on top of kernel_check.h: the shape, inputs
// rounded to the element type, the closeness check scaled to a tensor's largest value, and a CUDA
// path's forward and backward run under the two schedule seeds, compared against the reference
// and against each other.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "tests/cuda_emu/emu_test_util.h"
#include "tests/cuda_emu/kernel_check.h"

namespace ft::cuda_test::attention {

// q and out (B, T, H, D); k, v (B, T, K, D); lse (B, H, T).
struct Shape {
  int B, T, H, K, D;
};

// "B=… T=… H=… K=… D=…", for the messages.
inline std::string shape_text(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " K=" + std::to_string(s.K) + " D=" + std::to_string(s.D);
}

// n normal values of standard deviation scale, rounded to E once.
template <typename E>
std::vector<E> random_tensor(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<E> v(n);
  for (auto& x : v) x = ft::from_f32<E>(d(g));
  return v;
}

// Every element within rtol·|ref| + atol_frac·max|ref| (check_close with that scale on every
// element; it names the worst element).
template <typename E>
void expect_close(const std::string& what, const std::vector<E>& got, const std::vector<E>& ref,
                  double rtol, double atol_frac) {
  float amax = 0.0f;
  for (const E& r : ref) amax = std::max(amax, std::fabs(ft::to_f32(r)));
  check_close(got, ref, rtol, atol_frac, std::vector<float>(ref.size(), amax), what);
}

// A forward's out and lse and a backward's gradients.
template <typename E>
struct Result {
  std::vector<E> out, dq, dk, dv;
  std::vector<float> lse;
};

// launch(out, lse, dq, dk, dv) (device pointers) under each of the two schedule seeds, the
// outputs starting as NaN bits so that every element must be written: both runs' results.
template <typename E, typename Launch>
std::pair<Result<E>, Result<E>> run_under_two_seeds(const Shape& s, const Launch& launch) {
  using ft::emu::test::DeviceBuffer;
  const size_t nq = size_t(s.B) * s.T * s.H * s.D, nk = size_t(s.B) * s.T * s.K * s.D;
  const size_t nl = size_t(s.B) * s.H * s.T;
  auto run = [&](uint64_t seed) {
    ft::emu::test::SeedScope scope(seed);
    DeviceBuffer<E> o(nq), gq(nq), gk(nk), gv(nk);
    DeviceBuffer<float> l(nl);
    for (DeviceBuffer<E>* t : {&o, &gq, &gk, &gv})
      REQUIRE(cudaMemset(t->get(), 0xff, sizeof(E) * t->size()) == cudaSuccess);
    REQUIRE(cudaMemset(l.get(), 0xff, sizeof(float) * nl) == cudaSuccess);
    launch(o.get(), l.get(), gq.get(), gk.get(), gv.get());
    return Result<E>{o.to_host(), gq.to_host(), gk.to_host(), gv.to_host(), l.to_host()};
  };
  const std::vector<uint64_t> seeds = ft::emu::test::test_seeds();
  Result<E> a = run(seeds[0]);
  Result<E> b = run(seeds[1]);
  return {std::move(a), std::move(b)};
}

// a against ref: out, dq, dk and dv within (rtol, atol_frac), lse within (lse_rtol,
// lse_atol_frac); then a against b (the other schedule seed's run) bit for bit. where starts
// each message.
template <typename E>
void expect_matches(const std::string& where, const Result<E>& a, const Result<E>& b,
                    const Result<E>& ref, double rtol, double atol_frac, double lse_rtol,
                    double lse_atol_frac) {
  expect_close<E>(where + "out", a.out, ref.out, rtol, atol_frac);
  expect_close<float>(where + "lse", a.lse, ref.lse, lse_rtol, lse_atol_frac);
  expect_close<E>(where + "dq", a.dq, ref.dq, rtol, atol_frac);
  expect_close<E>(where + "dk", a.dk, ref.dk, rtol, atol_frac);
  expect_close<E>(where + "dv", a.dv, ref.dv, rtol, atol_frac);
  CHECK_MESSAGE(same_bits(a.out, b.out), where << "out differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.lse, b.lse), where << "lse differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dq, b.dq), where << "dq differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dk, b.dk), where << "dk differs between schedule seeds");
  CHECK_MESSAGE(same_bits(a.dv, b.dv), where << "dv differs between schedule seeds");
}

}  // namespace ft::cuda_test::attention
