// The fused attention's tuning lab: kernels/cuda/attention_fused.cu's two launchers
// (attention_fused_forward, attention_fused_backward of kernels_cuda.h) with every form of
// kernels/cuda/attention_fused.cuh that was measured and kept for comparison, picked at run time
// by FT_CUDA_FUSED_TUNING. Not part of ft: the binaries of dev/attention/CMakeLists.txt link this
// file in place of attention_fused.cu, so that the kernel tests
// (tests/cuda_emu/test_attention_fused.cpp) and the attention benchmark
// (tests/tools/ft_cuda_bench_attention.cpp) run unchanged on any form.
//
// FT_CUDA_FUSED_TUNING="fwd_mt=1,grid_lpt=0" (comma-separated key=value; unset keys keep ft's
// forms, ChosenForms) picks one; dev/attention/gpu_tune_attention.py times each on a GPU after the
// kernel tests ran under it. Each element's arithmetic is the same in every form (the same bits),
// and a value that is not instantiated is an error naming the ones that are. fwd_mt and dq_mt
// apply to head dim 64 (head dim 128 has one m-tile only). The measurements: NOTES.md here.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention_fused.cuh"

namespace ft::kernels::cuda {
namespace {

// The keys of FT_CUDA_FUSED_TUNING, each defaulting to ft's form. The forms Tuning does not name
// (dK/dV's query tile and blocks an SM) are ft's at each head dim.
using Ft64 = ChosenForms<64>;
using Ft128 = ChosenForms<128>;
static_assert(Ft64::kLpt == Ft128::kLpt && Ft64::kDkdvIlv == Ft128::kDkdvIlv &&
                  Ft64::kDqKvBuf == Ft128::kDqKvBuf && Ft64::kDqIlv == Ft128::kDqIlv,
              "a key of Tuning that applies to both head dims has one default");
static_assert(Ft128::kFwdMt == 1 && Ft128::kDqMt == 1, "head dim 128 has one m-tile only");

struct Tuning {
  // m16 tiles per warp in the forward: 1 or 2 (2 measured faster on an H100: 0.374 -> 0.371 ms
  // at B4 H32 K8 T2048, 1.367 -> 1.317 ms at T8192).
  int fwd_mt = Ft64::kFwdMt;
  // 1: every kernel's grid longest tile first across heads (block_tile); 0: one head after
  // another. Measured on an H100: forward+backward 1.666 -> 1.447 ms at B4 H32 K8 T2048 D64,
  // 1.709 -> 1.350 at D128, 5.843 -> 5.090 at T8192.
  int grid_lpt = Ft64::kLpt;
  // m16 tiles per warp in the dQ kernel (head dim 64): 1 or 2 (two 32-key chunks a key tile, 2
  // blocks an SM). Measured on an H100 (backward, ms): 1.009 -> 0.987 at B4 H32 K8 T2048, 3.544
  // -> 3.417 at T8192.
  int dq_mt = Ft64::kDqMt;
  // 1: dK/dV's Pᵀ, dSᵀ slice by slice between the dV and dK products; 0: all first. Measured on
  // an H100 (forward+backward, ms, both with dK/dV's lse by cp.async): 1.166 -> 1.174 at B4 H32
  // K8 T2048 D64, 1.155 -> 1.183 at D128, 4.022 -> 3.975 at T8192 (6.343 -> 6.332 summed over
  // the three); on another machine with the other forms of today, 0 against 1: 6.369 against
  // 6.379. Within noise; kept at 1.
  int dkdv_ilv = Ft64::kDkdvIlv;
  // K/V tiles in shared memory in the dQ kernel (head dims 64 and 128): 1 (staggered, four
  // barriers a key tile), or 2 (double-buffered, one barrier a key tile; 18 KiB more at head dim
  // 64, 34 KiB at 128, still 2 blocks an SM). Measured on an H100 (forward+backward, ms): 1.213
  // -> 1.204 at B4 H32 K8 T2048 D64, 1.180 -> 1.166 at D128, 4.111 -> 4.157 at T8192; kept at 1.
  int dq_kvbuf = Ft64::kDqKvBuf;
  // 1: the dQ kernel's dS slice by slice between its dQ += dS K products, in the chunks that need
  // no mask; 0: all of a chunk's dS first. The dq_kvbuf=2 form has only the latter. Measured on
  // an H100 (forward+backward, ms): 1.180 -> 1.163 at B4 H32 K8 T2048 D64, 1.172 -> 1.148 at
  // D128, 4.027 -> 3.998 at T8192.
  int dq_ilv = Ft64::kDqIlv;
};
// Measured on an H100 and dropped: dK/dV with a 32-query tile (1.317 -> 1.488 ms backward at the
// ~1B layer), and the same capped at 168 registers for 3 blocks an SM (1.375 ms); dK/dV at 64
// queries capped at 168 registers for 3 blocks an SM (dkdv_minb=3: backward 1.019 -> 1.063 ms at
// B4 H32 K8 T2048 D64, 3.536 -> 3.748 at T8192). Measured on an H100 and made the only form:
// dK/dV's three query-tile buffers (two: backward 1.009 -> 0.950 ms at B4 H32 K8 T2048 D64,
// 0.979 -> 0.927 at D128, 3.544 -> 3.321 at T8192), its lse and Δ by cp.async, the forward's
// P between its P V products (both at their kernels).

Tuning parse_tuning(const char* text) {
  Tuning t;
  if (!text || !*text) return t;
  const std::string all(text);
  size_t at = 0;
  while (at <= all.size()) {
    const size_t comma = std::min(all.find(',', at), all.size());
    const std::string item = all.substr(at, comma - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    int* field = key == "fwd_mt"     ? &t.fwd_mt
                 : key == "grid_lpt" ? &t.grid_lpt
                 : key == "dkdv_ilv" ? &t.dkdv_ilv
                 : key == "dq_mt"    ? &t.dq_mt
                 : key == "dq_kvbuf" ? &t.dq_kvbuf
                 : key == "dq_ilv"   ? &t.dq_ilv
                                     : nullptr;
    if (!field || eq == std::string::npos)
      throw ::ft::Error("FT_CUDA_FUSED_TUNING: '" + item +
                        "' is not key=value with a key of fwd_mt, grid_lpt, dkdv_ilv, dq_mt, "
                        "dq_kvbuf, dq_ilv");
    *field = std::atoi(item.c_str() + eq + 1);
    at = comma + 1;
  }
  if ((t.fwd_mt != 1 && t.fwd_mt != 2) || (t.grid_lpt != 0 && t.grid_lpt != 1) ||
      (t.dkdv_ilv != 0 && t.dkdv_ilv != 1) || (t.dq_mt != 1 && t.dq_mt != 2) ||
      (t.dq_kvbuf != 1 && t.dq_kvbuf != 2) || (t.dq_ilv != 0 && t.dq_ilv != 1))
    throw ::ft::Error("FT_CUDA_FUSED_TUNING='" + all +
                      "': the instantiated variants are fwd_mt 1 or 2, grid_lpt 0 or 1, "
                      "dkdv_ilv 0 or 1, dq_mt 1 or 2, dq_kvbuf 1 or 2, dq_ilv 0 or 1");
  return t;
}

// Read once per process.
const Tuning& tuning() {
  static const Tuning t = parse_tuning(std::getenv("FT_CUDA_FUSED_TUNING"));
  return t;
}

template <typename T, int D>
void forward_d(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* seg, int B,
               int T_, int H, int K, void* stream) {
  const Tuning& tu = tuning();
  if constexpr (D == 64) {
    if (tu.fwd_mt == 2)
      return forward_launch<T, D, 2>(out, lse, q, k, v, seg, B, T_, H, K, tu.grid_lpt, stream);
  }
  forward_launch<T, D, 1>(out, lse, q, k, v, seg, B, T_, H, K, tu.grid_lpt, stream);
}

// The dK/dV variant the tuning names (dkdv_ilv), at ft's query tile and blocks an SM.
template <typename T, int D, typename... A>
void dkdv_pick(const Tuning& tu, A... a) {
  using F = ChosenForms<D>;
  if (tu.dkdv_ilv == 1) return dkdv_launch<T, D, F::kDkdvTq, F::kDkdvMinB, true>(a...);
  dkdv_launch<T, D, F::kDkdvTq, F::kDkdvMinB, false>(a...);
}

template <typename T, int D>
void backward_d(T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* delta,
                const T* q, const T* k, const T* v, const int32_t* seg, int B, int T_, int H, int K,
                void* stream) {
  const float scale = softmax_scale(D);
  const Tuning& tu = tuning();
  const bool lpt = tu.grid_lpt;
  dkdv_pick<T, D>(tu, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale, lpt, stream);
  const bool kvbuf2 = tu.dq_kvbuf == 2, ilv = tu.dq_ilv == 1;
  if constexpr (D == 64) {
    if (tu.dq_mt == 2) {
      if (kvbuf2)
        return dq_launch<T, D, 2, 2, false>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale,
                                            lpt, stream);
      if (ilv)
        return dq_launch<T, D, 2, 1, true>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale,
                                           lpt, stream);
      return dq_launch<T, D, 2, 1, false>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale,
                                          lpt, stream);
    }
  }
  if (kvbuf2)
    return dq_launch<T, D, 1, 2, false>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale, lpt,
                                        stream);
  if (ilv)
    return dq_launch<T, D, 1, 1, true>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale, lpt,
                                       stream);
  dq_launch<T, D, 1, 1, false>(dq, dout, lse, delta, q, k, v, seg, B, T_, H, K, scale, lpt, stream);
}

}  // namespace

// kernels_cuda.h's launchers, as attention_fused.cu defines them but for the forms.
template <typename T>
void attention_fused_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const int32_t* seg, int B, int T_, int H, int K, int D, void* stream) {
  check_fused("attention_fused_forward", B, T_, H, K, D, {out, q, k, v});
  if (B == 0 || T_ == 0) return;
  if (D == 64)
    forward_d<T, 64>(out, lse, q, k, v, seg, B, T_, H, K, stream);
  else
    forward_d<T, 128>(out, lse, q, k, v, seg, B, T_, H, K, stream);
}

template <typename T>
void attention_fused_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const int32_t* seg, void* scratch,
                              int B, int T_, int H, int K, int D, void* stream) {
  check_fused("attention_fused_backward", B, T_, H, K, D, {dq, dk, dv, dout, q, k, v});
  if (B == 0 || T_ == 0) return;
  auto* delta = static_cast<float*>(scratch);  // (B, H, T)
  attention_delta(delta, dout, out, B, T_, H, D, stream);
  if (D == 64)
    backward_d<T, 64>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
  else
    backward_d<T, 128>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
}

#define FT_ATTENTION_FUSED_INSTANTIATE(T)                                                        \
  template void attention_fused_forward<T>(T*, float*, const T*, const T*, const T*,             \
                                           const int32_t*, int, int, int, int, int, void*);      \
  template void attention_fused_backward<T>(T*, T*, T*, const T*, const T*, const float*,        \
                                            const T*, const T*, const T*, const int32_t*, void*, \
                                            int, int, int, int, int, void*);
FT_ATTENTION_FUSED_INSTANTIATE(bf16)
FT_ATTENTION_FUSED_INSTANTIATE(f16)
#undef FT_ATTENTION_FUSED_INSTANTIATE

}  // namespace ft::kernels::cuda
