// RMSNorm forward and backward on the CPU.
// Loops over rows run under OpenMP with static schedules, so results are bit-identical from run
// to run for a fixed thread count (resume tests rely on this).
// 16-bit rows are staged in fp32 (kernels/cpu/half_vec.h); the statistics (rstd) and dw stay
// fp32, as torch autocast keeps norms in fp32.
#include <cmath>
#include <vector>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps) {
  std::vector<float> wbuf(cpu::staging<T>(C));
  const float* wf = cpu::in_f32(w, C, wbuf.data());
#pragma omp parallel
  {
    std::vector<float> xbuf(cpu::staging<T>(C)), obuf(cpu::staging<T>(C));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* xr = cpu::in_f32(x + size_t(n) * C, C, xbuf.data());
      float* o = cpu::out_f32(out + size_t(n) * C, obuf.data());
      const float ss = cpu::lane_sum_squares(xr, C);  // vectorised (vec_math.h)
      float r = 1.0f / std::sqrt(ss / float(C) + eps);
      rstd[n] = r;
      // HF: weight * (x * rstd)
      for (int c = 0; c < C; ++c) o[c] = wf[c] * (xr[c] * r);
      cpu::store_out(out + size_t(n) * C, o, C);
    }
  }
}

template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, bool accumulate_dx) {
  // y = w ∘ x r, r = (mean(x²)+eps)^(-1/2)
  // dx (+)= r (w∘dy) − x r³/C Σ_c (w∘dy∘x);  dw += Σ_n dy ∘ x r
  std::vector<float> wbuf(cpu::staging<T>(C));
  const float* wf = cpu::in_f32(w, C, wbuf.data());
#pragma omp parallel
  {
    std::vector<float> xbuf(cpu::staging<T>(C)), dybuf(cpu::staging<T>(C)),
        dbuf(cpu::staging<T>(C));
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* xr = cpu::in_f32(x + size_t(n) * C, C, xbuf.data());
      const float* dy = cpu::in_f32(dout + size_t(n) * C, C, dybuf.data());
      float* d = cpu::out_f32(dx + size_t(n) * C, dbuf.data());
      float r = rstd[n];
      const float dot = cpu::lane_dot3(wf, dy, xr, C);
      float k = dot * r * r * r / float(C);
      if (accumulate_dx) {
        // The sum add_inplace would form (old + norm's dx, in fp32), without the norm's dx
        // ever stored: fp32 gives the same bits as the two ops, 16-bit rounds once, not twice.
        const float* old = cpu::in_f32(dx + size_t(n) * C, C, d);
        for (int c = 0; c < C; ++c) d[c] = old[c] + (r * wf[c] * dy[c] - k * xr[c]);
      } else {
        for (int c = 0; c < C; ++c) d[c] = r * wf[c] * dy[c] - k * xr[c];
      }
      cpu::store_out(dx + size_t(n) * C, d, C);
    }
  }
  if (dw == nullptr) return;  // a frozen weight: no gradient
  // dw by column blocks: each thread owns its columns and adds the rows in order.
  constexpr int kCols = 64;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kCols) {
    int c1 = c0 + kCols < C ? c0 + kCols : C;
    float xbuf[cpu::staging<T>(kCols) + 1], dybuf[cpu::staging<T>(kCols) + 1];
    for (int n = 0; n < N; ++n) {
      const float* xr = cpu::in_f32(x + size_t(n) * C + c0, size_t(c1 - c0), xbuf);
      const float* dy = cpu::in_f32(dout + size_t(n) * C + c0, size_t(c1 - c0), dybuf);
      float r = rstd[n];
      float* dwc = dw + c0;
      for (int c = 0; c < c1 - c0; ++c) dwc[c] += dy[c] * xr[c] * r;
    }
  }
}

#define FT_INSTANTIATE(T)                                                                          \
  template void rmsnorm_forward(T*, float*, const T*, const T*, int, int, float);                  \
  template void rmsnorm_backward(T*, float*, const T*, const T*, const T*, const float*, int, int, \
                                 bool);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
