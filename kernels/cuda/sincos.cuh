// sin and cos of an fp32 RoPE angle on the GPU (rope.cu): the same value for the same angle
// whichever token carries it, so a token rotated at its position in generation (rope_forward
// with positions, lib/model/decode.cpp) gets the bits training gives it there.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ft::kernels::cuda {

// s = sin(a), c = cos(a), each the double result rounded to float. Cody-Waite reduction by π/2
// (fdlibm's two-part constant: k · kPio2Hi is exact for |k| < 2^20, i.e. |a| < 1.6e6 radians,
// far beyond any position · frequency; past it the error grows slowly, still below fp32's),
// then Taylor series on |r| ≤ π/4 to the term whose size is below 1e-19. Checked on the host
// against sin/cos in long double: within 0.5 ulp (correctly rounded) on 1.2M random angles up
// to 3e6 radians; glibc's sinf/cosf, the CPU kernel's, differ from that in ~3% of them by 1 ulp.
__device__ __forceinline__ void sincos_of_angle(float a, float& s, float& c) {
  constexpr double kTwoOverPi = 0.63661977236758134308;
  constexpr double kPio2Hi = 1.57079632673412561417e+00;  // the first 33 bits of π/2
  constexpr double kPio2Lo = 6.07710050650619224932e-11;  // π/2 − kPio2Hi
  const double y = double(a) * kTwoOverPi;
  const int64_t k = int64_t(y >= 0.0 ? y + 0.5 : y - 0.5);  // nearest integer
  const double kd = double(k);
  const double r = (double(a) - kd * kPio2Hi) - kd * kPio2Lo;
  const double r2 = r * r;
  // sin r = r (1 − r²/3! (1 − r²/(4·5) (1 − ...))), cos r = 1 − r²/2! (1 − r²/(3·4) (1 − ...))
  double sp = 1.0, cp = 1.0;
  for (int n = 17; n >= 3; n -= 2) sp = 1.0 - sp * r2 * (1.0 / double((n - 1) * n));
  for (int n = 18; n >= 2; n -= 2) cp = 1.0 - cp * r2 * (1.0 / double((n - 1) * n));
  const double sr = r * sp, cr = cp;
  switch (int(k & 3)) {  // a = k·π/2 + r
    case 0:
      s = float(sr), c = float(cr);
      break;
    case 1:
      s = float(cr), c = float(-sr);
      break;
    case 2:
      s = float(-sr), c = float(-cr);
      break;
    default:
      s = float(-cr), c = float(sr);
      break;
  }
}

}  // namespace ft::kernels::cuda
