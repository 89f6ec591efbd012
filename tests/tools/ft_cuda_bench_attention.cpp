// Attention benchmark on the GPU (not a test): ft's causal GQA attention through the CUDA
// device's ops (runtime/op_list.h attention_forward / attention_backward), the path picked by
// FT_CUDA_ATTENTION as in training (fused: the FlashAttention-2 kernels, on sm_90 the Hopper
// kernels with FT_CUDA_ATTENTION_SM90=1, which "kernels" names; gemm: the chunked
// cuBLASLt GEMMs; simt), timed with CUDA events after a warmup. For scripts/gpu_check.py's
// `attention` stage, which sets PyTorch's sdpa backends beside it on the same GPU.
//
//   ft_cuda_bench_attention [--path fused|gemm|simt] [--dtype bf16|f16] [--warmup N] [--reps N]
//                           B,H,K,T,D [B,H,K,T,D ...]
//
// Prints one JSON line per shape: the path, the device, forward ms and forward+backward ms (mean
// over --reps back-to-back calls between two events), and TFLOP/s. FLOPs, causal: the forward
// is QKᵀ and PV, 2·2·B·H·T²·D over the full square, halved by the mask: 2·B·H·T²·D; the
// backward is counted as 2.5× the forward (FlashAttention-2's convention: five T²·D GEMMs
// against two), so forward+backward is 3.5× the forward. The FLOPs the mask skips are not
// counted, whatever a kernel does with the diagonal blocks.
// Exit 0; 1: an error or a non-finite output; 2: bad arguments; 77: no usable GPU here (or a
// build without the CUDA backend), with the reason on one "no GPU: ..." line.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "runtime/device.h"
#if FT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/ops_memory.h"
#endif

namespace {

struct Shape {
  int B, H, K, T, D;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "ft_cuda_bench_attention: %s\nusage: ft_cuda_bench_attention [--path fused|gemm|"
               "simt] [--dtype bf16|f16] [--warmup N] [--reps N] B,H,K,T,D [B,H,K,T,D ...]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "fused", dtype = "bf16";
  int warmup = 3, reps = 10;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--path" && has_value) {
      path = argv[++i];
    } else if (a == "--dtype" && has_value) {
      dtype = argv[++i];
    } else if (a == "--warmup" && has_value) {
      warmup = std::atoi(argv[++i]);
    } else if (a == "--reps" && has_value) {
      reps = std::atoi(argv[++i]);
    } else {
      Shape s{};
      if (std::sscanf(a.c_str(), "%d,%d,%d,%d,%d", &s.B, &s.H, &s.K, &s.T, &s.D) != 5)
        return usage(("not an option or a shape B,H,K,T,D: '" + a + "'").c_str());
      if (s.B < 1 || s.H < 1 || s.K < 1 || s.T < 1 || s.D < 1 || s.H % s.K != 0)
        return usage(("shape '" + a + "': all positive, H a multiple of K").c_str());
      shapes.push_back(s);
    }
  }
  if (shapes.empty()) return usage("no shape given");
  if (path != "fused" && path != "gemm" && path != "simt")
    return usage(("--path '" + path + "': fused, gemm or simt").c_str());
  if (dtype != "bf16" && dtype != "f16")
    return usage(("--dtype '" + dtype + "': bf16 or f16").c_str());
  if (warmup < 0 || reps < 1) return usage("--warmup ≥ 0 and --reps ≥ 1");
#if !FT_HAVE_CUDA
  std::printf("no GPU: this build of ft has no CUDA backend (ft_cuda_bench_attention skipped)\n");
  return 77;
#else
  using namespace ft;
  register_cuda_backend(&this_cuda_backend());
  if (std::string why = cuda_unusable_reason(); !why.empty()) {
    std::printf("no GPU: %s (ft_cuda_bench_attention skipped)\n", why.c_str());
    return 77;
  }
  // The CUDA ops read FT_CUDA_ATTENTION when the device is made (runtime/cuda/ops_memory.h).
  setenv("FT_CUDA_ATTENTION", path.c_str(), 1);
  try {
    std::unique_ptr<Device> dev = make_device("cuda");
    Ops& ops = dev->ops();
    const Stream st = dev->stream();
    const DType dt = dtype == "bf16" ? DType::kBF16 : DType::kF16;
    int gpu = 0, sm_major = 0;
    if (cudaGetDevice(&gpu) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_major, cudaDevAttrComputeCapabilityMajor, gpu) != cudaSuccess)
      FT_FAIL("cannot read the GPU's compute capability");
    std::mt19937 gen(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (const Shape& s : shapes) {
      // The path the ops take at this shape (a fused request falls back where the kernel does
      // not apply: ops_memory.h), so that a number is never labelled with a path it did not use.
      const char* taken = cuda::attention_path_name(
          cuda::attention_path(cuda::requested_attention_path(), dt, s.D, sm_major));
      const std::string kernels = std::string(taken) != "fused" ? taken
                                  : cuda::fused_sm90(sm_major)  ? "sm90"
                                                                : "fa2";
      if (path != taken)
        std::printf("note: FT_CUDA_ATTENTION=%s falls back to %s at %d,%d,%d,%d,%d\n", path.c_str(),
                    taken, s.B, s.H, s.K, s.T, s.D);
      const size_t nq = size_t(s.B) * s.T * s.H * s.D;  // q, out, dout, dq: (B, T, H, D)
      const size_t nk = size_t(s.B) * s.T * s.K * s.D;  // k, v, dk, dv: (B, T, K, D)
      const size_t nlse = size_t(s.B) * s.H * s.T;      // lse: (B, H, T) fp32
      // 16-bit elements as raw bits: bf16 and f16 both from the host's float.
      auto random_halves = [&](size_t n) {
        std::vector<uint16_t> h(n);
        for (auto& e : h) {
          const float x = nd(gen);
          if (dt == DType::kBF16) {
            bf16 b = to_bf16(x);
            std::memcpy(&e, &b, 2);
          } else {
            f16 f = to_f16(x);
            std::memcpy(&e, &f, 2);
          }
        }
        return h;
      };
      Buffer<uint16_t> q(dev.get(), nq), k(dev.get(), nk), v(dev.get(), nk), out(dev.get(), nq),
          dout(dev.get(), nq), dq(dev.get(), nq), dk(dev.get(), nk), dv(dev.get(), nk);
      Buffer<float> lse(dev.get(), nlse),
          scratch(dev.get(), ops.attention_backward_scratch_elems(dt, s.B, s.T, s.H, s.D));
      q.upload(random_halves(nq).data(), nq);
      k.upload(random_halves(nk).data(), nk);
      v.upload(random_halves(nk).data(), nk);
      dout.upload(random_halves(nq).data(), nq);
      auto R = [&](Buffer<uint16_t>& b) { return Ref(b.data(), dt); };
      auto forward = [&] {
        ops.attention_forward(st, R(out), lse.data(), R(q), R(k), R(v), nullptr, s.B, s.T, s.H, s.K,
                              s.D);
      };
      auto backward = [&] {
        ops.attention_backward(st, R(dq), R(dk), R(dv), R(dout), R(out), lse.data(), R(q), R(k),
                               R(v), nullptr, scratch.data(), s.B, s.T, s.H, s.K, s.D);
      };
      Event t0 = dev->make_event(true), t1 = dev->make_event(true);
      auto time_ms = [&](auto&& body) {
        for (int i = 0; i < warmup; ++i) body();
        t0.record(st);
        for (int i = 0; i < reps; ++i) body();
        t1.record(st);
        t1.synchronize();
        return double(elapsed_ms(t0, t1)) / reps;
      };
      const double fwd_ms = time_ms(forward);
      const double fwd_bwd_ms = time_ms([&] {
        forward();
        backward();
      });
      // A kernel that wrote nothing or overflowed would still time: check the results.
      auto finite = [&](Buffer<uint16_t>& b, size_t n) {
        std::vector<uint16_t> h(n);
        b.download(h.data(), n);
        for (uint16_t e : h) {
          float x;
          if (dt == DType::kBF16) {
            bf16 y;
            std::memcpy(&y, &e, 2);
            x = to_f32(y);
          } else {
            f16 y;
            std::memcpy(&y, &e, 2);
            x = to_f32(y);
          }
          if (!std::isfinite(x)) return false;
        }
        return true;
      };
      const bool ok = finite(out, nq) && finite(dq, nq) && finite(dk, nk) && finite(dv, nk);
      const double fwd_flop = 2.0 * s.B * s.H * double(s.T) * s.T * s.D;
      const double fwd_bwd_flop = 3.5 * fwd_flop;
      std::printf(
          "{\"impl\": \"ft %s\", \"path\": \"%s\", \"requested\": \"%s\", \"kernels\": \"%s\", "
          "\"device\": \"%s\", \"dtype\": \"%s\", "
          "\"B\": %d, \"H\": %d, \"K\": %d, \"T\": %d, \"D\": %d, \"warmup\": %d, \"reps\": %d, "
          "\"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
          "\"fwd_bwd_tflops\": %.2f, \"finite\": %s}\n",
          taken, taken, path.c_str(), kernels.c_str(), dev->name().c_str(), dtype.c_str(), s.B, s.H,
          s.K, s.T, s.D, warmup, reps, fwd_ms, fwd_bwd_ms, fwd_flop / (fwd_ms * 1e9),
          fwd_bwd_flop / (fwd_bwd_ms * 1e9), ok ? "true" : "false");
      std::fflush(stdout);
      if (!ok) {
        std::fprintf(stderr, "ft_cuda_bench_attention: non-finite output at %d,%d,%d,%d,%d\n", s.B,
                     s.H, s.K, s.T, s.D);
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_cuda_bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
#endif
}
