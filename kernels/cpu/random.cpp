// Normal init on the CPU: kernels/philox.h's counter-based draws, elements split among OpenMP
// threads in chunks (the 2-D form, a column slice of a tensor: whole rows per thread). Each
// element's bits depend only on (key, its index in the tensor), so the thread count and the
// chunking change nothing (and kernels/cuda/random.cu gives the same bits).
//
// Whole Philox blocks go through philox.h's functions in batches of kLanes blocks, each step a
// loop over the batch (structure of arrays), which the compiler vectorizes (5x faster than one
// block at a time here); the same scalar functions per element, so the same bits as the
// one-block path (fill_normal), which the partial blocks at a range's ends take.
#include "kernels/kernels.h"
#include "kernels/philox.h"

namespace ft::kernels {

namespace {

using namespace philox;

// Elements per OpenMP chunk, a multiple of 4: the chunks after the first start on a block.
constexpr size_t kChunk = 16384;
constexpr int kLanes = 32;  // blocks per batch

// o[4b .. 4b + 3] = std · the normals of block b0 + b, for b in [0, blocks).
void fill_blocks(float* o, uint64_t b0, size_t blocks, uint32_t k0, uint32_t k1, double std) {
  size_t b = 0;
  for (; b + kLanes <= blocks; b += kLanes) {
    uint32_t w[4][kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t j = b0 + b + size_t(l);
      const Block blk = philox4x32_10(uint32_t(j), uint32_t(j >> 32), 0u, 0u, k0, k1);
      for (int q = 0; q < 4; ++q) w[q][l] = blk.w[q];
    }
    double z[4][kLanes];  // as normals4: (r cos, r sin) of words (0, 1), then of (2, 3)
    for (int l = 0; l < kLanes; ++l) {
      const double r = radius(w[0][l]);
      double c, s;
      sincos_turn(w[1][l], &c, &s);
      z[0][l] = r * c;
      z[1][l] = r * s;
    }
    for (int l = 0; l < kLanes; ++l) {
      const double r = radius(w[2][l]);
      double c, s;
      sincos_turn(w[3][l], &c, &s);
      z[2][l] = r * c;
      z[3][l] = r * s;
    }
    for (int l = 0; l < kLanes; ++l)
      for (int q = 0; q < 4; ++q) o[4 * (b + size_t(l)) + size_t(q)] = float(std * z[q][l]);
  }
  for (; b < blocks; ++b) {
    double z[4];
    normals4(b0 + b, k0, k1, z);
    for (int q = 0; q < 4; ++q) o[4 * b + size_t(q)] = float(std * z[q]);
  }
}

// out[j] = float(std · z(first + j)) for j in [0, n), on the calling thread: the partial blocks
// at the ends one element at a time (fill_normal), the whole blocks between in batches.
void draw_range(float* out, size_t n, uint64_t key, uint64_t first, double std) {
  const uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  const size_t lead = size_t((4 - first % 4) % 4);  // elements before the first block boundary
  const size_t a = lead < n ? lead : n;
  const size_t blocks = (n - a) / 4;
  fill_normal(out, 0, a, key, first, std);
  fill_blocks(out + a, (first + a) / 4, blocks, k0, k1, std);
  fill_normal(out, a + 4 * blocks, n, key, first, std);
}

}  // namespace

void random_normal(float* out, size_t n, uint64_t key, uint64_t first, double std) {
  if (n == 0) return;
  // Chunk c covers [c·kChunk − lead, (c+1)·kChunk − lead) ∩ [0, n): its boundaries after the
  // first are multiples of 4 of the element index first + j.
  const size_t lead = size_t(first % 4);
  const size_t chunks = (n + lead + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c == 0 ? 0 : c * kChunk - lead;
    const size_t end = (c + 1) * kChunk - lead < n ? (c + 1) * kChunk - lead : n;
    draw_range(out + begin, end - begin, key, first + begin, std);
  }
}

void random_normal(float* out, size_t rows, size_t cols, size_t ld, uint64_t key, uint64_t first,
                   double std) {
  if (rows == 0 || cols == 0) return;
  // Contiguous in the whole tensor (one row, or rows that follow each other): one range.
  if (rows == 1 || ld == cols) return random_normal(out, rows * cols, key, first, std);
  // Long rows: each split among the threads as above; short ones: whole rows to each thread.
  if (cols >= kChunk) {
    for (size_t r = 0; r < rows; ++r) random_normal(out + r * cols, cols, key, first + r * ld, std);
    return;
  }
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
  for (size_t r = 0; r < rows; ++r) draw_range(out + r * cols, cols, key, first + r * ld, std);
}

}  // namespace ft::kernels
