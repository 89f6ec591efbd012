// Test kernels for kernels/cuda/warp_matrix.cuh (see warp_matrix_kernels.h): nvcc builds them for
// a GPU, g++ for the CUDA emulation (through warp_matrix_kernels_emu.cpp).
#include "tests/cuda_emu/warp_matrix_kernels.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_matrix.cuh"

namespace ft::kernels::cuda::test {
namespace {

// Element (row, col) of a row-major 16-bit matrix with `cols` columns, packed with its right
// neighbour: lo = (row, col), hi = (row, col + 1).
__device__ __forceinline__ uint32_t pair(const uint16_t* m, int cols, int row, int col) {
  return uint32_t(m[row * cols + col]) | uint32_t(m[row * cols + col + 1]) << 16;
}

template <class E>
__global__ void mma_packed_kernel(float* d, const uint16_t* a, const uint16_t* b, const float* c,
                                  int mapping) {
  const int l = threadIdx.x, g = l >> 2, q = l & 3;
  uint32_t ra[4];
  for (int j = 0; j < 4; ++j) {  // register j: elements 2j, 2j + 1 (PTX ISA §9.7.14.5.8)
    int row = g + 8 * (j & 1), col = 2 * q + 8 * (j >> 1);
    if (mapping == int(AMapping::kHalvesSwapped)) col ^= 8;  // columns 0-7 and 8-15 exchanged
    if (mapping == int(AMapping::kTransposed)) {             // A(col, row) in place of A(row, col)
      ra[j] = uint32_t(a[col * 16 + row]) | uint32_t(a[(col + 1) * 16 + row]) << 16;
    } else {
      ra[j] = pair(a, 16, row, col);
    }
  }
  uint32_t rb[2];
  for (int j = 0; j < 2; ++j) {  // k = 2q + 8j and 2q + 8j + 1, n = g
    const int k = 2 * q + 8 * j;
    rb[j] = uint32_t(b[k * 8 + g]) | uint32_t(b[(k + 1) * 8 + g]) << 16;
  }
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
  mma_m16n8k16<E>(acc, ra, rb, acc);  // d aliases c
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = acc[i];
}

constexpr int kTilePitch = 24;  // elements per shared row of the 16x16 tiles: 48 bytes

template <class E>
__global__ void mma_ldmatrix_kernel(float* d, const uint16_t* a, const uint16_t* b,
                                    const uint16_t* b_nk, const float* c) {
  FT_DYNAMIC_SHARED(uint16_t, smem);
  uint16_t* sa = smem;                    // 16 rows
  uint16_t* sb = smem + 16 * kTilePitch;  // 16 rows ([k][n], 8 used) or 8 rows ([n][k])
  const int l = threadIdx.x, g = l >> 2, q = l & 3;
  // A: 16 rows of two 16-byte chunks, one chunk per lane.
  cp_async_cg16(sa + (l >> 1) * kTilePitch + 8 * (l & 1), a + (l >> 1) * 16 + 8 * (l & 1));
  if (b_nk) {  // 8 rows of two chunks
    if (l < 16) cp_async_ca<16>(sb + (l >> 1) * kTilePitch + 8 * (l & 1), b_nk + l * 8);
  } else {  // 16 rows of one chunk
    if (l < 16) cp_async_ca<16>(sb + l * kTilePitch, b + l * 8);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  uint32_t ra[4], rb[2];
  ldmatrix_x4(ra, sa + (l & 15) * kTilePitch + 8 * (l >> 4));
  if (b_nk)
    ldmatrix_x2(rb, sb + (l & 7) * kTilePitch + 8 * ((l >> 3) & 1));
  else
    ldmatrix_x2_trans(rb, sb + (l & 15) * kTilePitch);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)];
  float out[4];
  mma_m16n8k16<E>(out, ra, rb, acc);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = out[i];
}

__global__ void ldmatrix_lanes_kernel(uint32_t* out, const uint16_t* src, const int* row_of_lane,
                                      int num, bool trans) {
  FT_DYNAMIC_SHARED(uint16_t, smem);
  const int l = threadIdx.x;
  for (int i = 0; i < 8; ++i) smem[l * 8 + i] = src[l * 8 + i];
  __syncwarp();
  uint32_t r[4] = {0, 0, 0, 0};
  const void* p = smem + row_of_lane[l] * 8;
  if (num == 1) {
    uint32_t x[1];
    trans ? ldmatrix_x1_trans(x, p) : ldmatrix_x1(x, p);
    r[0] = x[0];
  } else if (num == 2) {
    uint32_t x[2];
    trans ? ldmatrix_x2_trans(x, p) : ldmatrix_x2(x, p);
    r[0] = x[0];
    r[1] = x[1];
  } else {
    trans ? ldmatrix_x4_trans(r, p) : ldmatrix_x4(r, p);
  }
  for (int i = 0; i < 4; ++i) out[4 * l + i] = r[i];
}

__global__ void cp_async_zero_fill_kernel(unsigned char* out, const unsigned char* src) {
  FT_DYNAMIC_SHARED(unsigned char, smem);
  const int t = threadIdx.x;
  unsigned char* s16 = smem + 16 * t;
  unsigned char* s8 = smem + 16 * 64 + 8 * t;
  unsigned char* s4 = smem + 24 * 64 + 4 * t;
  if (t % 2 == 0)
    cp_async_cg16(s16, src + 16 * t, t % 17);
  else
    cp_async_ca<16>(s16, src + 16 * t, t % 17);
  cp_async_commit();
  cp_async_ca<8>(s8, src + 16 * 64 + 8 * t, (t % 3) * 4);
  cp_async_ca<4>(s4, src + 24 * 64 + 4 * t, t % 2 * 4);
  cp_async_wait_all();
  for (int i = 0; i < 16; ++i) out[28 * t + i] = s16[i];
  for (int i = 0; i < 8; ++i) out[28 * t + 16 + i] = s8[i];
  for (int i = 0; i < 4; ++i) out[28 * t + 24 + i] = s4[i];
}

// The tiled GEMM: block tile 64x64, k chunks of 32, two stages. Warp w owns rows 16w..16w+15 of
// the tile and all 64 columns (8 n-tiles of 8).
constexpr int kGemmPitchA = 32 + 8, kGemmPitchB = 64 + 8;  // padded rows, 16-byte multiples
constexpr int kGemmStage = 64 * kGemmPitchA + 32 * kGemmPitchB;
constexpr int kGemmSharedBytes = 2 * kGemmStage * 2;

template <class E>
__global__ void tiled_gemm_kernel(float* c, const uint16_t* a, const uint16_t* b, int n, int k) {
  FT_DYNAMIC_SHARED(uint16_t, smem);
  const int t = threadIdx.x, l = t & 31, w = t >> 5, g = l >> 2, q = l & 3;
  const int row0 = blockIdx.x * 64, col0 = blockIdx.y * 64;
  const auto load = [&](int chunk, int stage) {
    uint16_t* sa = smem + stage * kGemmStage;
    uint16_t* sb = sa + 64 * kGemmPitchA;
    const int k0 = chunk * 32;
    for (int i = t; i < 64 * 4; i += 128) {  // A: 64 rows x 4 chunks of 8 elements
      const int r = i >> 2, ch = i & 3;
      cp_async_cg16(sa + r * kGemmPitchA + 8 * ch, a + size_t(row0 + r) * k + k0 + 8 * ch);
    }
    for (int i = t; i < 32 * 8; i += 128) {  // B: 32 rows x 8 chunks
      const int r = i >> 3, ch = i & 7;
      cp_async_ca<16>(sb + r * kGemmPitchB + 8 * ch, b + size_t(k0 + r) * n + col0 + 8 * ch);
    }
  };
  float acc[8][4];
  for (auto& tile : acc)
    for (float& v : tile) v = 0.0f;
  const int chunks = k / 32;
  load(0, 0);
  cp_async_commit();
  for (int chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + 1 < chunks) load(chunk + 1, (chunk + 1) & 1);
    cp_async_commit();   // possibly empty: the last one
    cp_async_wait<1>();  // every group but the newest: this chunk's is complete
    __syncthreads();
    const uint16_t* sa = smem + (chunk & 1) * kGemmStage;
    const uint16_t* sb = sa + 64 * kGemmPitchA;
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t ra[4];
      ldmatrix_x4(ra, sa + (16 * w + (l & 15)) * kGemmPitchA + 16 * ks + 8 * (l >> 4));
      for (int p = 0; p < 4; ++p) {  // n-tiles 2p, 2p + 1
        uint32_t rb[4];
        ldmatrix_x4_trans(rb, sb + (16 * ks + (l & 15)) * kGemmPitchB + 16 * p + 8 * (l >> 4));
        const uint32_t b0[2] = {rb[0], rb[1]}, b1[2] = {rb[2], rb[3]};
        mma_m16n8k16<E>(acc[2 * p], ra, b0, acc[2 * p]);
        mma_m16n8k16<E>(acc[2 * p + 1], ra, b1, acc[2 * p + 1]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's load
  }
  for (int nt = 0; nt < 8; ++nt)
    for (int i = 0; i < 4; ++i)
      c[size_t(row0 + 16 * w + g + 8 * (i >> 1)) * n + col0 + 8 * nt + 2 * q + (i & 1)] =
          acc[nt][i];
}

template <class E>
__global__ void pack_pairs_kernel(uint32_t* rn, uint32_t* keep, const float* in, int pairs) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= pairs) return;
  rn[i] = pack2_rn<E>(in[2 * i], in[2 * i + 1]);
  keep[i] = pack2<E>(in[2 * i], in[2 * i + 1]);
}

}  // namespace

void pack_pairs(bool bf16, uint32_t* rn, uint32_t* keep, const float* in, int pairs) {
  const unsigned blocks = unsigned((pairs + 127) / 128);
  if (bf16)
    FT_LAUNCH((pack_pairs_kernel<::ft::bf16>), blocks, 128, 0, nullptr)(rn, keep, in, pairs);
  else
    FT_LAUNCH((pack_pairs_kernel<::ft::f16>), blocks, 128, 0, nullptr)(rn, keep, in, pairs);
  FT_CUDA_CHECK_LAUNCH();
}

void mma_packed(bool bf16, float* d, const uint16_t* a, const uint16_t* b, const float* c,
                AMapping mapping) {
  if (bf16)
    FT_LAUNCH((mma_packed_kernel<::ft::bf16>), 1, 32, 0, nullptr)(d, a, b, c, int(mapping));
  else
    FT_LAUNCH((mma_packed_kernel<::ft::f16>), 1, 32, 0, nullptr)(d, a, b, c, int(mapping));
  FT_CUDA_CHECK_LAUNCH();
}

void mma_ldmatrix(bool bf16, float* d, const uint16_t* a, const uint16_t* b, const uint16_t* b_nk,
                  const float* c) {
  const size_t shared = 32 * kTilePitch * sizeof(uint16_t);
  if (bf16)
    FT_LAUNCH((mma_ldmatrix_kernel<::ft::bf16>), 1, 32, shared, nullptr)(d, a, b, b_nk, c);
  else
    FT_LAUNCH((mma_ldmatrix_kernel<::ft::f16>), 1, 32, shared, nullptr)(d, a, b, b_nk, c);
  FT_CUDA_CHECK_LAUNCH();
}

void ldmatrix_lanes(uint32_t* out, const uint16_t* src, const int* row_of_lane, int num,
                    bool trans) {
  FT_LAUNCH(ldmatrix_lanes_kernel, 1, 32, 32 * 8 * sizeof(uint16_t), nullptr)
  (out, src, row_of_lane, num, trans);
  FT_CUDA_CHECK_LAUNCH();
}

void cp_async_zero_fill(unsigned char* out, const unsigned char* src) {
  FT_LAUNCH(cp_async_zero_fill_kernel, 1, 64, 28 * 64, nullptr)(out, src);
  FT_CUDA_CHECK_LAUNCH();
}

void tiled_gemm(bool bf16, float* c, const uint16_t* a, const uint16_t* b, int m, int n, int k) {
  const dim3 grid(unsigned(m / 64), unsigned(n / 64));
  if (bf16)
    FT_LAUNCH((tiled_gemm_kernel<::ft::bf16>), grid, 128, kGemmSharedBytes, nullptr)(c, a, b, n, k);
  else
    FT_LAUNCH((tiled_gemm_kernel<::ft::f16>), grid, 128, kGemmSharedBytes, nullptr)(c, a, b, n, k);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda::test
