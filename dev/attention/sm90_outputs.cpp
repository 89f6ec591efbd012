// Writes the bytes of the sm90 attention kernels' outputs (attention_sm90_forward's out and lse,
// attention_sm90_backward's dq, dk and dv) on fixed random inputs to the file named by argv[1],
// for sm90_same_bits.sh, which builds this against two revisions of the kernels on the CUDA
// emulation and compares the files: a change of form (scheduling, pipelining, stages, turns)
// must leave every bit as it was. Shapes: head dims 64 and 128, GQA, segments, several tiles a
// block (the ping-pong's turns, the ring's stages reused).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/kernels_cuda.h"

namespace {

namespace cu = ft::kernels::cuda;
using E = ft::bf16;

template <typename T>
T* upload(const std::vector<T>& host) {
  T* p = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&p), host.size() * sizeof(T)) != cudaSuccess ||
      cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "sm90_outputs: cudaMalloc/cudaMemcpy failed\n");
    std::exit(1);
  }
  return p;
}

// Appends n values read back from the device, each required finite (the inputs are, and a
// comparison of NaNs would tell nothing).
template <typename T>
void append(FILE* f, const T* device, size_t n, const char* what) {
  std::vector<T> host(n);
  if (cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess ||
      std::fwrite(host.data(), sizeof(T), n, f) != n) {
    std::fprintf(stderr, "sm90_outputs: reading back or writing failed\n");
    std::exit(1);
  }
  for (const T& x : host)
    if (!std::isfinite(ft::to_f32(x))) {
      std::fprintf(stderr, "sm90_outputs: %s holds a non-finite value\n", what);
      std::exit(1);
    }
}

struct Case {
  int B, T, H, K, D;
  bool segments;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sm90_outputs FILE\n");
    return 2;
  }
  if (!cu::attention_sm90_available()) {
    std::fprintf(stderr, "sm90_outputs: the device is not sm_90\n");
    return 1;
  }
  FILE* f = std::fopen(argv[1], "wb");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  for (const Case c : {Case{1, 400, 2, 1, 64, false}, Case{1, 300, 4, 1, 64, true},
                       Case{2, 260, 4, 2, 128, false}, Case{1, 400, 2, 1, 128, true}}) {
    std::mt19937 rng(uint32_t(c.T * 131 + c.D * 7 + c.H));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto random = [&](size_t n) {
      std::vector<E> v(n);
      for (E& x : v) x = ft::from_f32<E>(normal(rng));
      return v;
    };
    const size_t nq = size_t(c.B) * c.T * c.H * c.D, nk = size_t(c.B) * c.T * c.K * c.D;
    const size_t nstat = size_t(c.B) * c.H * c.T;
    E *q = upload(random(nq)), *k = upload(random(nk)), *v = upload(random(nk));
    E* dout = upload(random(nq));
    std::vector<int32_t> ids(size_t(c.B) * c.T);  // three documents a row
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.T; ++t) ids[size_t(b) * c.T + t] = t < 37 ? 0 : t < 150 ? 1 : 2;
    int32_t* seg = c.segments ? upload(ids) : nullptr;
    E *out = upload(std::vector<E>(nq)), *dq = upload(std::vector<E>(nq));
    E *dk = upload(std::vector<E>(nk)), *dv = upload(std::vector<E>(nk));
    float *lse = upload(std::vector<float>(nstat)), *scratch = upload(std::vector<float>(nstat));
    cu::attention_sm90_forward<E>(out, lse, q, k, v, seg, c.B, c.T, c.H, c.K, c.D, nullptr);
    cu::attention_sm90_backward<E>(dq, dk, dv, dout, out, lse, q, k, v, seg, scratch, c.B, c.T, c.H,
                                   c.K, c.D, nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "sm90_outputs: the kernels failed\n");
      return 1;
    }
    append(f, out, nq, "out");
    append(f, lse, nstat, "lse");
    append(f, dq, nq, "dq");
    append(f, dk, nk, "dk");
    append(f, dv, nk, "dv");
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(dout), static_cast<void*>(seg), static_cast<void*>(out),
                    static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    static_cast<void*>(lse), static_cast<void*>(scratch)})
      cudaFree(p);
  }
  return std::fclose(f) == 0 ? 0 : 1;
}
