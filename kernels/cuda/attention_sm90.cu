// Causal grouped-query attention forward for Hopper (sm_90a), in the manner of FlashAttention-3
// (Shah et al. 2024, arXiv 2407.08608): TMA loads into a ring of shared-memory stages guarded by
// mbarriers, wgmma on tensor cores (kernels/cuda/hopper.cuh). The contract is
// attention_fused_forward's (kernels_cuda.h, attention_fused.cuh): q, out (B, T, H, D); k, v
// (B, T, K, D); lse (B, H, T) fp32, the natural-log logsumexp of the scores scaled by 1/sqrt(D);
// bf16 or f16; head dims 64 and 128; query head h reads kv head h / (H/K); optional segment ids
// (B, T), non-decreasing along T, attention only within a document.
//
// A block owns 64·NC query rows of one (head, batch row) and has NC consumer warpgroups (64 rows
// each) and one producer warp after them. The producer's lane 0 loads Q once, then each 64-key
// tile's K and V into stage n % Stages of a ring: it waits for the stage's `empty` barrier (every
// consumer thread arrives on it once done with the stage), announces the bytes on the stage's
// `full_k` / `full_v` barrier (arrive.expect_tx) and issues the TMA copies, which complete their
// bytes there. K and V complete on barriers of their own, so S = Q Kᵀ starts before V lands.
// Every consumer thread waits on the barriers itself (TMA's writes become visible to the threads
// that observe the phase complete).
//
// Shared tiles are 64 rows x 64 elements (128 bytes a row) with the 128-byte swizzle, as TMA
// writes them; a head dim of 128 is two such boxes side by side (8 KiB apart). Q (A) and K (B)
// are K-major for S = Q Kᵀ (SBO 1024: eight 128-byte rows; a k-step of 16 is 32 bytes along the
// row, the next box after k 64); V is the B of O += P V read MN-major (trans-b: its rows are the
// k dimension; LBO 8 KiB between boxes of 64 head-dim columns, SBO 1024 between groups of 8
// keys, a k-step of 16 keys 2 KiB). P goes from S's accumulators to the A registers of the .rs
// wgmma without shared memory: thread t holds S's row 16w + g (+8) at columns 8j + 2q (+1),
// exactly the rows and columns of its A fragment (register j of k-step s from accumulators
// 8s + 2j, 8s + 2j + 1), rounded once to E.
//
// Softmax per row as the FA2 kernel's (same formulas, same order of l's sums): m' = max(m, rowmax
// S) over the quad of lanes sharing a row, P = exp2(scale·log2e·S − m'), l = l·α + rowsum P,
// O = O·α + P V with α = exp2(scale·log2e·(m − m')); at the end O/l and lse = scale·m + log l.
//
// Within a warpgroup the softmax of tile n overlaps P_{n−1} V_{n−1} on the tensor cores (FA3's
// intra-warpgroup pipelining), and the warpgroups issue their GEMMs in turn (FA3's ping-pong,
// here through mbarriers: the emulation has no named barriers), so that one's softmax runs
// under the other's GEMMs. Not yet (the next steps of issue 33): setmaxnreg (registers moved
// from the producer to the consumers), O stored through shared memory by a TMA store rather than
// from registers, a measurement on a GPU.
#include "kernels/cuda/attention_fused.cuh"  // check_fused, first_key_tile, block_tile, quad sums
#include "kernels/cuda/hopper.cuh"

namespace ft::kernels::cuda {
namespace {

constexpr int kSm90Rows = 64;  // query rows of a consumer warpgroup, keys of a tile
static_assert(kSm90Rows == kTileK, "first_key_tile steps by the fused kernel's key tile");

template <int D>
constexpr int kSm90TileBytes = D * 2 * kSm90Rows;  // 64 rows of a head, 16-bit
// Barriers and key segment ids (1 KiB), Q of every consumer, then K and V of every stage; 1 KiB
// more so that the tiles can start on a 1024-byte boundary (the 128-byte swizzle's period) wherever
// the dynamic shared memory starts.
template <int D, int NC, int Stages>
constexpr size_t sm90_smem_bytes() {
  return 2048 + size_t(NC + 2 * Stages) * kSm90TileBytes<D>;
}

template <typename E, int D, int NC, int Stages>
__global__ void __launch_bounds__(128 * NC + 32)
    attention_sm90_forward_kernel(const __grid_constant__ TensorMap map_q,
                                  const __grid_constant__ TensorMap map_k,
                                  const __grid_constant__ TensorMap map_v,
                                  const __grid_constant__ TensorMap map_seg, device_t<E>* out,
                                  float* lse, const int32_t* seg, int T_, int H, int K,
                                  float scale) {
#if FT_HOPPER_DEVICE
  using Dev = device_t<E>;
  constexpr int kTq = NC * kSm90Rows, kTile = kSm90TileBytes<D>, kChunks = D / 64;
  constexpr int kBoxBytes = 64 * 64 * 2;  // one 64 x 64 16-bit box, 128-byte swizzled
  FT_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* smem = smem_raw + ((1024u - smem_offset(smem_raw) % 1024u) % 1024u);
  auto* bars = reinterpret_cast<uint64_t*>(smem);
  uint64_t* q_full = bars;
  uint64_t* full_k = bars + 1;
  uint64_t* full_v = full_k + Stages;
  uint64_t* empty = full_v + Stages;
  uint64_t* turn = empty + Stages;  // [NC]: the ping-pong between consumer warpgroups
  // [Stages][64]: each key tile's segment ids (with segments), loaded with its K
  auto* kseg_s = reinterpret_cast<int32_t*>(smem + 512);
  static_assert(Stages * kSm90Rows * 4 <= 512 && 8 * (1 + 3 * Stages + NC) <= 512, "1 KiB");
  unsigned char* q_s = smem + 1024;       // [NC][kChunks][64 rows][128 bytes]
  unsigned char* k_s = q_s + NC * kTile;  // [Stages][kChunks][64 keys][128 bytes]
  unsigned char* v_s = k_s + Stages * kTile;

  const BlockTile bt = block_tile(true);
  const int i0 = (bt.n_tiles - 1 - bt.tile) * kTq;
  const int h = bt.head, b = bt.b, kh = h / (H / K);
  const int32_t* seg_b = seg ? seg + size_t(b) * T_ : nullptr;
  const int j_first = first_key_tile(seg_b, i0, T_);
  const int last = min(i0 + kTq, T_) - 1;
  const int n_tiles = (last - j_first) / kSm90Rows + 1;

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&full_k[s], 1);
      mbarrier_init(&full_v[s], 1);
      mbarrier_init(&empty[s], 128 * NC);
    }
    for (int c = 0; c < NC; ++c) mbarrier_init(&turn[c], 128);
  }
  __syncthreads();

  // The warpgroup (NC: the producer warp) through a shuffle, so that ptxas knows it is uniform
  // over the warp: a wgmma under a branch it cannot prove uniform is serialized (C7520).
  const int cg = __shfl_sync(kFullMask, int(threadIdx.x) / 128, 0);
  if (cg == NC) {  // the producer warp
    if (threadIdx.x != 128 * NC) return;
    mbarrier_arrive_expect_tx(q_full, NC * kTile);
    for (int c = 0; c < NC; ++c)
      for (int ch = 0; ch < kChunks; ++ch)
        tma_load_3d(q_s + c * kTile + ch * kBoxBytes, map_q, h * D + 64 * ch, i0 + kSm90Rows * c, b,
                    q_full);
    for (int n = 0; n < n_tiles; ++n) {
      const int st = n % Stages, j0 = j_first + n * kSm90Rows;
      mbarrier_wait(&empty[st], ((n / Stages) & 1) ^ 1);  // round 0: the phase before init
      mbarrier_arrive_expect_tx(&full_k[st], kTile + (seg ? kSm90Rows * 4 : 0));
      for (int ch = 0; ch < kChunks; ++ch)
        tma_load_3d(k_s + st * kTile + ch * kBoxBytes, map_k, kh * D + 64 * ch, j0, b, &full_k[st]);
      if (seg)  // keys past T read the next row's ids (or zeros): masked by c >= T anyway
        tma_load_2d(kseg_s + st * kSm90Rows, map_seg, b * T_ + j0, 0, &full_k[st]);
      mbarrier_arrive_expect_tx(&full_v[st], kTile);
      for (int ch = 0; ch < kChunks; ++ch)
        tma_load_3d(v_s + st * kTile + ch * kBoxBytes, map_v, kh * D + 64 * ch, j0, b, &full_v[st]);
    }
    return;
  }

  // Consumer warpgroup cg: rows r0 .. r0 + 63; this thread's two rows (x = 0, 1) of every
  // accumulator: 16 w + g + 8 x.
  const int w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, qd = lane & 3;
  const int r0 = i0 + kSm90Rows * cg;
  const float scale_log2 = scale * kLog2e;
  int row[2], rseg[2];
  for (int x = 0; x < 2; ++x) {
    row[x] = r0 + 16 * w + g + 8 * x;
    rseg[x] = seg_b && row[x] < T_ ? seg_b[row[x]] : 0;
  }
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row
  const unsigned char* q_tile = q_s + cg * kTile;
  mbarrier_wait(q_full, 0);

  // The tiles this warpgroup computes: those from j_first whose first key is at or before its
  // last row (none when its rows all lie past T). They come first; the block's others (the
  // diagonal tile of the next warpgroup) it only waits for and releases, so that it arrives on
  // each stage's empty barrier once a phase.
  const int n_mine = r0 >= T_ ? 0 : min(n_tiles, (r0 + kSm90Rows - 1 - j_first) / kSm90Rows + 1);
  const auto stage = [&](int n) { return n % Stages; };
  const auto phase = [&](int n) { return unsigned(n / Stages) & 1u; };

  float s[kSm90Rows / 2];         // S of the newest tile, then its P (fp32)
  uint32_t p[kSm90Rows / 16][4];  // P of the tile whose P V is next, the A fragments
  float alpha[2];                 // the rescale of O and l that the newest tile's softmax asks for
  // S = Q K_nᵀ, issued and committed (the caller waits).
  const auto issue_scores = [&](int n) {
    const unsigned char* k_tile = k_s + stage(n) * kTile;
    wgmma_fence();  // s (and o) were written since the last wgmma
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int at = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64k16<E, kSm90Rows>(s, wgmma_descriptor(q_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(k_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 kk > 0);
    }
    wgmma_commit_group();
  };
  // O += P V_n, issued and committed. p is written before the fence, so that ptxas needs to
  // inject no warpgroup.arrive for the registers the wgmmas read (C7519).
  const auto issue_pv = [&](int n) {
    const unsigned char* v_tile = v_s + stage(n) * kTile;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
      wgmma_m64k16_rs<E, D, true>(
          o, p[ks], wgmma_descriptor(v_tile + ks * 2048, kBoxBytes, 1024, WgmmaSwizzle::k128B),
          true);
    wgmma_commit_group();
  };
  // The online softmax of tile n's scores in s: masks, updates m and l, sets alpha and leaves
  // P = exp2(scale·log2e·S − m') in s; O is left to the caller (its P V may be in flight).
  const auto softmax = [&](int n) {
    const int j0 = j_first + n * kSm90Rows;
    const int32_t* kseg = kseg_s + stage(n) * kSm90Rows;  // complete with K_n (full_k)
    // Mask where the tile crosses the warp's diagonal, the end of the sequence, or documents.
    if (seg_b || j0 + kSm90Rows - 1 > r0 + 16 * w || j0 + kSm90Rows > T_) {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int c = j0 + 8 * (i >> 2) + 2 * qd + (i & 1), x = (i >> 1) & 1;
        if (c > row[x] || c >= T_ || (seg_b && kseg[c - j0] != rseg[x])) s[i] = -INFINITY;
      }
    }
    float mx[2] = {m[0], m[1]}, sub[2];
#pragma unroll
    for (int i = 0; i < kSm90Rows / 2; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      mx[x] = quad_max(mx[x]);
      // A row with nothing visible yet keeps m = −inf: subtract 0 instead (no −inf − −inf).
      sub[x] = mx[x] == -INFINITY ? 0.0f : mx[x] * scale_log2;
      alpha[x] = exp2_approx(fmaf(m[x], scale_log2, -sub[x]));  // 0 while m = −inf
      m[x] = mx[x];
      l[x] *= alpha[x];
    }
#pragma unroll
    for (int i = 0; i < kSm90Rows / 2; ++i) {
      s[i] = exp2_approx(fmaf(s[i], scale_log2, -sub[(i >> 1) & 1]));
      l[(i >> 1) & 1] += s[i];
    }
  };
  // O ·= alpha (O complete: no P V in flight), then P from s (rounded once to E).
  const auto rescale_and_pack = [&]() {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) p[ks][j] = pack2_rn<E>(s[8 * ks + 2 * j], s[8 * ks + 2 * j + 1]);
  };

  // FA3's ping-pong between the warpgroups: step n of each (issuing tile n's GEMMs) goes in turn,
  // warpgroup 0, 1, .., NC − 1, then 0 again, so that one's softmax runs while the next one's
  // GEMMs occupy the tensor cores. Warpgroup c waits on turn[c] (but warpgroup 0 at step 0),
  // whose phases the warpgroup before it completes (its 128 threads arrive once a step, after
  // issuing), and then passes the turn on. Every warpgroup takes n_tiles steps, those without
  // GEMMs too, so that the turns stay in order (a step's arrivals come only after the phase
  // before completed: no double arrival).
  const auto take_turn = [&](int n) {
    if (NC > 1 && (cg > 0 || n > 0)) mbarrier_wait(&turn[cg], unsigned(cg > 0 ? n : n - 1) & 1u);
  };
  const auto pass_turn = [&]() {
    if (NC > 1) mbarrier_arrive(&turn[(cg + 1) % NC]);
  };

  // FA3's overlap within the warpgroup: while P_{n−1} V_{n−1} runs on the tensor cores, the
  // softmax of S_n = Q K_nᵀ runs on the other units. Tile n's S is issued before P_{n−1} V_{n−1}
  // (wgmma groups complete in order), waited for alone (wait_group 1), and O is rescaled once
  // P_{n−1} V_{n−1} has completed too.
  if (n_mine > 0) {
    take_turn(0);
    mbarrier_wait(&full_k[stage(0)], phase(0));
    issue_scores(0);
    pass_turn();
    wgmma_wait_group<0>();
    wgmma_fence_operand(s);
    softmax(0);
    rescale_and_pack();
    for (int n = 1; n < n_mine; ++n) {
      take_turn(n);
      mbarrier_wait(&full_k[stage(n)], phase(n));
      issue_scores(n);
      mbarrier_wait(&full_v[stage(n - 1)], phase(n - 1));
      issue_pv(n - 1);
      pass_turn();
      wgmma_wait_group<1>();  // S_n
      wgmma_fence_operand(s);
      softmax(n);
      wgmma_wait_group<0>();  // P_{n−1} V_{n−1}
      wgmma_fence_operand(o);
      mbarrier_arrive(&empty[stage(n - 1)]);  // this thread is done with K_{n−1} and V_{n−1}
      rescale_and_pack();
    }
    mbarrier_wait(&full_v[stage(n_mine - 1)], phase(n_mine - 1));
    issue_pv(n_mine - 1);
    wgmma_wait_group<0>();
    wgmma_fence_operand(o);
    mbarrier_arrive(&empty[stage(n_mine - 1)]);
  }
  for (int n = n_mine; n < n_tiles; ++n) {  // wait before arriving: one arrival a phase
    take_turn(n);
    pass_turn();
    mbarrier_wait(&full_k[stage(n)], phase(n));
    mbarrier_wait(&full_v[stage(n)], phase(n));
    mbarrier_arrive(&empty[stage(n)]);
  }

  const size_t ldq = size_t(H) * D;
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float sum = quad_sum(l[x]);
    if (row[x] >= T_) continue;
    const float inv = 1.0f / sum;
    Dev* orow = out + (size_t(b) * T_ + row[x]) * ldq + size_t(h) * D + 2 * qd;
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      *reinterpret_cast<uint32_t*>(orow + 8 * t) =
          pack2<E>(o[4 * t + 2 * x] * inv, o[4 * t + 2 * x + 1] * inv);
    if (qd == 0) lse[(size_t(b) * H + h) * T_ + row[x]] = m[x] * scale + logf(sum);
  }
#endif
}

// A (B, T, heads · D) tensor as TMA sees it: dims (heads · D, T, B), 64 x 64 boxes of one batch
// row (rows past T read as zeros), 128-byte swizzle.
template <typename T>
TensorMap heads_map(const T* p, int B, int T_, int heads, int D) {
  const uint64_t dims[3] = {uint64_t(heads) * D, uint64_t(T_), uint64_t(B)};
  const uint64_t strides[2] = {uint64_t(heads) * D * 2, uint64_t(T_) * heads * D * 2};
  const uint32_t box[3] = {64, kSm90Rows, 1};
  const TmaType type = MmaElement<T>::kBf16 ? TmaType::kBf16 : TmaType::kF16;
  return encode_tensor_map(type, 3, p, dims, strides, box, TmaSwizzle::k128B);
}

template <typename T, int D, int NC, int Stages>
void sm90_forward_launch(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* seg,
                         int B, int T_, int H, int K, void* stream) {
  auto kernel = attention_sm90_forward_kernel<T, D, NC, Stages>;
  constexpr size_t smem = sm90_smem_bytes<D, NC, Stages>();
  constexpr int kTq = NC * kSm90Rows;
  allow_smem(reinterpret_cast<const void*>(kernel), smem, "attention_sm90_forward");
  const TensorMap map_q = heads_map(q, B, T_, H, D), map_k = heads_map(k, B, T_, K, D),
                  map_v = heads_map(v, B, T_, K, D);
  // The segment ids (B·T int32, copied as fp32 bits: TMA has no int32 type of its own) as one
  // row, in boxes of 64 (a tile's keys); a second dimension of 1 because only the 2-D and 3-D
  // copies are wrapped. Without segments an unused stand-in.
  TensorMap map_seg = map_q;
  if (seg) {
    const uint64_t n = uint64_t(B) * T_;
    const uint64_t dims[2] = {n, 1}, strides[1] = {(n * 4 + 15) / 16 * 16};
    const uint32_t box[2] = {kSm90Rows, 1};
    map_seg = encode_tensor_map(TmaType::kF32, 2, seg, dims, strides, box, TmaSwizzle::kNone);
  }
  FT_LAUNCH((attention_sm90_forward_kernel<T, D, NC, Stages>),
            tile_grid(true, (T_ + kTq - 1) / kTq, H, B), 128 * NC + 32, smem, stream)
  (map_q, map_k, map_v, map_seg, dev(out), lse, seg, T_, H, K, softmax_scale(D));
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_sm90_available() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9;  // sm_90a instructions: Hopper only (the build's 90a target)
}

template <typename T>
void attention_sm90_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                            const int32_t* seg, int B, int T_, int H, int K, int D, void* stream) {
  check_fused("attention_sm90_forward", B, T_, H, K, D, {out, q, k, v, seg});  // TMA: 16 bytes
  if (B == 0 || T_ == 0) return;
  if (D == 64)
    sm90_forward_launch<T, 64, 2, 2>(out, lse, q, k, v, seg, B, T_, H, K, stream);
  else
    sm90_forward_launch<T, 128, 2, 2>(out, lse, q, k, v, seg, B, T_, H, K, stream);
}

template void attention_sm90_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                           const int32_t*, int, int, int, int, int, void*);
template void attention_sm90_forward<f16>(f16*, float*, const f16*, const f16*, const f16*,
                                          const int32_t*, int, int, int, int, int, void*);

}  // namespace ft::kernels::cuda
