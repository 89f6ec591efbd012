// Elementwise accumulate/scale and the squared-norm reduction on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
#include "kernels/kernels.h"

namespace ft::kernels {

void add_inplace(float* y, const float* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

double sum_squares(const float* x, size_t n) {
  double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s)
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace ft::kernels
