// AdamW with the clipping factor folded in (kernels.h adamw_update's grad_scale, what the step
// passes instead of a scaling pass over the gradients): bit for bit the update after
// scale_inplace, for the fp32 update and the fused one that also writes the compute copy, at odd
// sizes and across the OpenMP block edge (2048), so the step's results did not move.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "random_values.h"

namespace ft {
namespace {

namespace k = kernels;

using unit_test::randn;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE_TEMPLATE("adamw_update with grad_scale equals scale_inplace then adamw_update", T, float,
                   ft::bf16, ft::f16) {
  // 0.3: a clip factor; 1/65536: fp16's unscaling (a power of two, exact); 0.3/1024 both.
  for (float gs : {0.3f, 1.0f / 65536, 0.3f / 1024}) {
    for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(4099)}) {
      INFO("n " << n << ", grad_scale " << gs);
      const std::vector<float> g = randn(n, 1, gs < 0.01f ? 3000.0f : 2.0f);
      std::vector<float> p = randn(n, 2, 0.05f), m = randn(n, 3, 0.1f), v = randn(n, 4, 0.1f);
      for (auto& x : v) x *= x;
      std::vector<float> p1 = p, m1 = m, v1 = v;  // folded
      std::vector<float> p2 = p, m2 = m, v2 = v;  // scaled first, as the step did before
      std::vector<float> g2 = g;
      k::scale_inplace(g2.data(), gs, n);
      std::vector<T> c1(n), c2(n);
      k::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      7, c1.data(), gs);
      k::adamw_update(p2.data(), g2.data(), m2.data(), v2.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                      0.1f, 7, c2.data());
      CHECK(same_bits(p1, p2));
      CHECK(same_bits(m1, m2));
      CHECK(same_bits(v1, v2));
      CHECK(std::memcmp(c1.data(), c2.data(), n * sizeof(T)) == 0);
      // The unfused update too.
      std::vector<float> p3 = p, m3 = m, v3 = v;
      k::adamw_update(p3.data(), g.data(), m3.data(), v3.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      7, gs);
      CHECK(same_bits(p3, p2));
      CHECK(same_bits(v3, v2));
      CHECK(p3 != p);  // the update did something
    }
  }
}

}  // namespace
}  // namespace ft
