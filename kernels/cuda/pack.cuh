// Vectorized access for the elementwise and row kernels (rmsnorm, swiglu, embedding, rope,
// adamw): Pack<D, W>, W consecutive elements moved as one aligned load or store, and the
// host-side checks that choose W.
//
// Why packs: a warp moving 16 bytes per thread issues one 128-bit instruction per thread and
// fills whole 32-byte sectors, where 2-byte scalar accesses issue 8x the instructions for the
// same bytes. Launchers choose W = 16 / sizeof(T) only when every pointer is 16-byte aligned
// (and rows are whole packs); otherwise W = 1, the same code with scalar accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/half.h"
#include "kernels/cuda/common.cuh"

namespace ft::kernels::cuda {

// W elements of D, aligned as one W * sizeof(D)-byte access (W a power of two, at most 16 bytes).
template <typename D, int W>
struct alignas(sizeof(D) * W) Pack {
  D v[W];
};

template <int W, typename D>
__device__ __forceinline__ Pack<D, W> load_pack(const D* p) {
  return *reinterpret_cast<const Pack<D, W>*>(p);
}
template <int W, typename D>
__device__ __forceinline__ void store_pack(D* p, const Pack<D, W>& v) {
  *reinterpret_cast<Pack<D, W>*>(p) = v;
}

// Elements per 16-byte pack.
template <typename T>
constexpr int kPack16 = int(16 / sizeof(T));

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
inline bool all_aligned(std::initializer_list<const void*> ptrs, size_t bytes) {
  for (const void* p : ptrs)
    if (!aligned_to(p, bytes)) return false;
  return true;
}

}  // namespace ft::kernels::cuda
