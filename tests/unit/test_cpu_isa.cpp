// The CPU kernels' instruction-set levels (kernels.h's CpuIsa, kernels/cpu/isa.h): FT_CPU_ISA's
// parsing, and every level's copy of the kernels against the others on the same inputs, each
// level this CPU runs called directly (a process runs one level through kernels.h; the CLI test
// tests/cli/test_cpu_isa.sh runs whole test binaries and trainings under each).
//
// What must agree, and why:
//   - avx2 and avx512 give the same bits: the kernels never reassociate a sum (16 fixed
//     lanes, vec_math.h), GCC contracts the same a·b + c into FMAs whatever the vector width,
//     and the vector 16-bit conversions give half.h's bits (test_kernels16.cpp);
//   - baseline has no FMA, so each product is rounded before its sum: fp32 outputs agree to a few
//     units in the last place (kRel32, relative to the output's scale), and an output stored in
//     16 bits may round the other way, one unit of T (kRel16). The kernels' own tolerances against
//     references are checked under FT_CPU_ISA=baseline by test_cpu_isa.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/isa_levels.h"  // the levels' copies, as kernels/cpu/dispatch.cpp sees them
#include "kernels/kernels.h"
#include "kernels/nf4.h"
#include "random_values.h"

namespace k = ft::kernels;
using ft::bf16;
using ft::f16;
using k::CpuIsa;

namespace {

// CALL (a kernel call) on level ISA's copy.
// (avx512_bf16 and amx run avx512's copy.)
#define ON_LEVEL(ISA, CALL)                      \
  ((ISA) >= CpuIsa::avx512 ? k::isa_avx512::CALL \
   : (ISA) == CpuIsa::avx2 ? k::isa_avx2::CALL   \
                           : k::isa_baseline::CALL)

// fp32 without FMA against fp32 with it: a few ulp of each intermediate (the exp polynomial,
// a·b + c chains), relative to the output's scale.
constexpr float kRel32 = 1e-5f;
// A 16-bit output may round the other way: one unit roundoff of bf16 (f16's is smaller).
constexpr float kRel16 = 0x1p-7f;

template <typename T>
std::vector<T> cast(const std::vector<float>& x) {
  std::vector<T> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ft::from_f32<T>(x[i]);
  return r;
}

template <typename T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ft::to_f32(x[i]);
  return r;
}

// Runs run(level) -> std::vector<float> on every level this CPU supports; the FMA levels must
// give the same bits, baseline must be within rel of them (relative to the largest output).
template <typename Run>
void check_levels(const std::string& what, float rel, Run run) {
  const CpuIsa top = k::cpu_isa_supported();
  const std::vector<float> base = run(CpuIsa::baseline);
  std::vector<float> fma_ref;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (isa > top) continue;
    const std::vector<float> out = run(isa);
    REQUIRE(out.size() == base.size());
    if (fma_ref.empty()) {
      fma_ref = out;
    } else {
      INFO(what, ": avx512 against avx2");
      CHECK(std::memcmp(out.data(), fma_ref.data(), out.size() * sizeof(float)) == 0);
    }
  }
  if (fma_ref.empty()) return;  // only baseline here: nothing to compare
  float scale = 0.0f, worst = 0.0f;
  for (float x : fma_ref) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < base.size(); ++i) worst = std::max(worst, std::abs(base[i] - fma_ref[i]));
  INFO(what, ": baseline against the FMA levels, worst ", worst, " at scale ", scale);
  CHECK(worst <= rel * std::max(scale, 1e-30f));
}

}  // namespace

TEST_CASE("FT_CPU_ISA names a level, or fails naming the choices") {
  CHECK(k::parse_cpu_isa(nullptr, CpuIsa::avx2) == CpuIsa::avx2);
  CHECK(k::parse_cpu_isa("", CpuIsa::avx512_bf16) == CpuIsa::avx512_bf16);
  CHECK(k::parse_cpu_isa("baseline", CpuIsa::avx512_bf16) == CpuIsa::baseline);
  CHECK(k::parse_cpu_isa("avx2", CpuIsa::avx2) == CpuIsa::avx2);
  CHECK(k::parse_cpu_isa("avx512", CpuIsa::avx512_bf16) == CpuIsa::avx512);
  CHECK(k::parse_cpu_isa("avx512_bf16", CpuIsa::avx512_bf16) == CpuIsa::avx512_bf16);
  CHECK(k::parse_cpu_isa("amx", CpuIsa::amx) == CpuIsa::amx);
  CHECK(k::parse_cpu_isa("avx512_bf16", CpuIsa::amx) == CpuIsa::avx512_bf16);
  for (const char* bad : {"avx1024", "AVX2", "native", "x86-64-v3", "avx512bf16"}) {
    try {
      k::parse_cpu_isa(bad, CpuIsa::avx512_bf16);
      FAIL("no error for FT_CPU_ISA=", bad);
    } catch (const ft::Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(std::string("FT_CPU_ISA=") + bad) != std::string::npos);
      CHECK(msg.find("baseline, avx2, avx512, avx512_bf16, amx") != std::string::npos);
    }
  }
  // A level the CPU lacks is refused (it would die of SIGILL), naming what the CPU runs.
  try {
    k::parse_cpu_isa("avx512_bf16", CpuIsa::avx2);
    FAIL("no error for a level above the CPU's");
  } catch (const ft::Error& e) {
    CHECK(std::string(e.what()).find("at most avx2") != std::string::npos);
  }
  try {
    k::parse_cpu_isa("amx", CpuIsa::avx512_bf16);
    FAIL("no error for amx on a CPU without it");
  } catch (const ft::Error& e) {
    CHECK(std::string(e.what()).find("at most avx512_bf16") != std::string::npos);
  }
  // The process's choice is one of the levels, within what the CPU runs.
  CHECK(k::cpu_isa() <= k::cpu_isa_supported());
  const std::string line = std::string("CPU kernels: ") + k::cpu_isa_name(k::cpu_isa()) +
                           " (this CPU supports up to " + k::cpu_isa_name(k::cpu_isa_supported()) +
                           ")";
  MESSAGE(line);
}

TEST_CASE_TEMPLATE("every instruction-set level's elementwise kernels agree", T, float, bf16, f16) {
  const float rel = std::is_same_v<T, float> ? kRel32 : kRel16;
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(4133)}) {
    const auto g = cast<T>(ft::unit_test::randn(n, 1, 3.0f));
    const auto u = cast<T>(ft::unit_test::randn(n, 2));
    const auto dh = cast<T>(ft::unit_test::randn(n, 3));
    const std::string at = " n=" + std::to_string(n);
    check_levels("swiglu_forward" + at, rel, [&](CpuIsa isa) {
      std::vector<T> h(n);
      ON_LEVEL(isa, swiglu_forward<T>(h.data(), g.data(), u.data(), n));
      return widen(h);
    });
    check_levels("swiglu_backward" + at, rel, [&](CpuIsa isa) {
      std::vector<T> dg(n), du(n);
      ON_LEVEL(isa, swiglu_backward<T>(dg.data(), du.data(), dh.data(), g.data(), u.data(), n));
      auto r = widen(dg), r2 = widen(du);
      r.insert(r.end(), r2.begin(), r2.end());
      return r;
    });
    check_levels("add_inplace, accumulate" + at, rel, [&](CpuIsa isa) {
      std::vector<T> y = g;
      std::vector<float> acc = ft::unit_test::randn(n, 4);
      ON_LEVEL(isa, add_inplace<T>(y.data(), u.data(), n));
      ON_LEVEL(isa, accumulate<T>(acc.data(), dh.data(), n));
      auto r = widen(y);
      r.insert(r.end(), acc.begin(), acc.end());
      return r;
    });
    // Integer mask and one product per element, nothing to contract: the same bits on every
    // level, baseline included.
    check_levels("dropout_scale" + at, 0.0f, [&](CpuIsa isa) {
      std::vector<T> y(n);
      ON_LEVEL(isa, dropout_scale<T>(y.data(), g.data(), 1, n, 3, 0.1f, 2.0f, 11));
      return widen(y);
    });
    // NF4: a quotient and comparisons, or one product, nothing to contract (kernels/cpu/nf4.cpp):
    // the same bits on every level, baseline included.
    check_levels("quantize_nf4, dequantize_nf4" + at, 0.0f, [&](CpuIsa isa) {
      std::vector<uint8_t> codes(k::nf4_code_bytes(n));
      std::vector<float> absmax(k::nf4_blocks(n));
      ON_LEVEL(isa, quantize_nf4<T>(codes.data(), absmax.data(), g.data(), n));
      std::vector<int8_t> q(absmax.size());
      std::vector<float> scale(k::nf4_groups(absmax.size()));
      float mean = 0;
      k::nf4_double_quantize(absmax.data(), absmax.size(), q.data(), scale.data(), &mean);
      std::vector<T> y(n);
      ON_LEVEL(isa, dequantize_nf4<T>(y.data(), codes.data(), q.data(), scale.data(), mean, n));
      std::vector<float> r(codes.begin(), codes.end());
      r.insert(r.end(), absmax.begin(), absmax.end());
      const auto yf = widen(y);
      r.insert(r.end(), yf.begin(), yf.end());
      return r;
    });
    if constexpr (!std::is_same_v<T, float>) {
      // The conversions are exact (to fp32) or one rounding (to T): the same bits on every level,
      // baseline included.
      const auto x = ft::unit_test::randn(n, 5, 100.0f);
      check_levels("convert" + at, 0.0f, [&](CpuIsa isa) {
        std::vector<T> t(n);
        std::vector<float> back(n);
        ON_LEVEL(isa, convert<T>(t.data(), x.data(), n));
        ON_LEVEL(isa, convert<T>(back.data(), t.data(), n));
        return back;
      });
    }
    check_levels("adamw_update" + at, kRel32, [&](CpuIsa isa) {
      std::vector<float> p = ft::unit_test::randn(n, 6), m = ft::unit_test::randn(n, 7, 0.1f),
                         v(n, 0.01f);
      const auto grad = ft::unit_test::randn(n, 8);
      std::vector<T> pc(n);
      const ft::kernels::AdamwStep k = ft::kernels::adamw_step(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
      ON_LEVEL(isa,
               adamw_update<T>(p.data(), grad.data(), m.data(), v.data(), n, k, pc.data(), 0.5f));
      p.insert(p.end(), m.begin(), m.end());
      p.insert(p.end(), v.begin(), v.end());
      return p;
    });
  }
}

TEST_CASE_TEMPLATE("every instruction-set level's row kernels agree", T, float, bf16, f16) {
  const float rel = std::is_same_v<T, float> ? kRel32 : kRel16;
  for (int C : {1, 19, 111, 1000}) {
    const int N = 7;
    const std::string at = " C=" + std::to_string(C);
    const auto x = cast<T>(ft::unit_test::randn(size_t(N) * C, 11));
    const auto w = cast<T>(ft::unit_test::randn(size_t(C), 12));
    const auto dout = cast<T>(ft::unit_test::randn(size_t(N) * C, 13));
    check_levels("rmsnorm forward, backward" + at, rel, [&](CpuIsa isa) {
      std::vector<T> out(size_t(N) * C), dx(size_t(N) * C);
      std::vector<float> rstd(N), dw(C);
      ON_LEVEL(isa, rmsnorm_forward<T>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f));
      ON_LEVEL(isa, rmsnorm_backward<T>(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                        rstd.data(), N, C, false));
      auto r = widen(out), r2 = widen(dx);
      r.insert(r.end(), r2.begin(), r2.end());
      r.insert(r.end(), rstd.begin(), rstd.end());
      r.insert(r.end(), dw.begin(), dw.end());
      return r;
    });
    check_levels("bias_add, bias_grad" + at, rel, [&](CpuIsa isa) {
      std::vector<T> y = x;
      std::vector<float> db(C);
      ON_LEVEL(isa, bias_add<T>(y.data(), w.data(), N, C));
      ON_LEVEL(isa, bias_grad<T>(db.data(), dout.data(), N, C));
      auto r = widen(y);
      r.insert(r.end(), db.begin(), db.end());
      return r;
    });
    // Logits over a vocabulary of C: the loss (double) and dlogits.
    check_levels("cross_entropy_forward_backward" + at, rel, [&](CpuIsa isa) {
      const auto logits = cast<T>(ft::unit_test::randn(size_t(N) * C, 14, 4.0f));
      std::vector<int32_t> targets(N);
      for (int i = 0; i < N; ++i) targets[i] = (i * 7919) % C;
      std::vector<uint8_t> mask(N, 1);
      mask[N / 2] = 0;  // a row left out
      std::vector<T> d(size_t(N) * C);
      const double loss =
          ON_LEVEL(isa, cross_entropy_forward_backward<T>(d.data(), logits.data(), targets.data(),
                                                          mask.data(), N, C, 1.0f / N));
      auto r = widen(d);
      r.push_back(float(loss));
      return r;
    });
    check_levels("embedding_forward, backward" + at, 0.0f, [&](CpuIsa isa) {
      const int V = 5;
      const auto table = cast<T>(ft::unit_test::randn(size_t(V) * C, 15));
      std::vector<int32_t> ids(N);
      for (int i = 0; i < N; ++i) ids[i] = (i * 3) % V;
      std::vector<T> out(size_t(N) * C);
      std::vector<float> dtable(size_t(V) * C, 0.0f);
      ON_LEVEL(isa, embedding_forward<T>(out.data(), ids.data(), table.data(), N, C, 0, V));
      ON_LEVEL(isa, embedding_backward<T>(dtable.data(), ids.data(), dout.data(), N, C, 0, V));
      auto r = widen(out);
      r.insert(r.end(), dtable.begin(), dtable.end());
      return r;
    });
  }
}

TEST_CASE_TEMPLATE("every instruction-set level's attention and rope agree", T, float, bf16, f16) {
  const float rel = std::is_same_v<T, float> ? kRel32 : kRel16;
  const int B = 2, H = 4, K = 2, D = 16;
  for (int T_len : {1, 19, 111}) {
    const std::string at = " T=" + std::to_string(T_len);
    const size_t nq = size_t(B) * T_len * H * D, nk = size_t(B) * T_len * K * D;
    const auto q = cast<T>(ft::unit_test::randn(nq, 21));
    const auto kk = cast<T>(ft::unit_test::randn(nk, 22));
    const auto v = cast<T>(ft::unit_test::randn(nk, 23));
    const auto dout = cast<T>(ft::unit_test::randn(nq, 24));
    check_levels("attention forward, backward" + at, rel, [&](CpuIsa isa) {
      std::vector<T> out(nq), dq(nq), dk(nk), dv(nk);
      std::vector<float> lse(size_t(B) * H * T_len);
      ON_LEVEL(isa, attention_forward<T>(out.data(), lse.data(), q.data(), kk.data(), v.data(), B,
                                         T_len, H, K, D, nullptr));
      std::vector<float> scratch(
          ON_LEVEL(isa, attention_backward_scratch_elems<T>(B, T_len, H, D)));
      ON_LEVEL(isa, attention_backward<T>(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                          lse.data(), q.data(), kk.data(), v.data(), scratch.data(),
                                          B, T_len, H, K, D, nullptr));
      auto r = widen(out);
      for (const auto* t : {&dq, &dk, &dv}) {
        const auto w = widen(*t);
        r.insert(r.end(), w.begin(), w.end());
      }
      r.insert(r.end(), lse.begin(), lse.end());
      return r;
    });
    check_levels("rope forward, backward" + at, rel, [&](CpuIsa isa) {
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
      std::vector<T> y = q, dy = dout;
      ON_LEVEL(isa, rope_forward<T>(y.data(), inv_freq.data(), B, T_len, H, D, nullptr));
      ON_LEVEL(isa, rope_backward<T>(dy.data(), inv_freq.data(), B, T_len, H, D, nullptr));
      auto r = widen(y), r2 = widen(dy);
      r.insert(r.end(), r2.begin(), r2.end());
      return r;
    });
  }
}
