// Causal grouped-query attention, forward and backward, for Hopper (sm_90a), in the manner of
// FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608): TMA loads into a ring of shared-memory
// stages guarded by mbarriers, wgmma on tensor cores (kernels/cuda/hopper.cuh). The contracts are
// attention_fused_forward's and attention_fused_backward's (kernels_cuda.h, attention_fused.cuh):
// q, out, dout, dq (B, T, H, D); k, v, dk, dv (B, T, K, D); lse (B, H, T) fp32, the natural-log
// logsumexp of the scores scaled by 1/sqrt(D); bf16 or f16; head dims 64 and 128; query head h
// reads kv head h / (H/K); optional segment ids (B, T), non-decreasing along T, attention only
// within a document. The backward (after the forward's kernel, below) is FlashAttention-2's
// algorithm, deterministic without atomics, on the forward's machinery: Δ = rowsum(dO ∘ O)
// first, a dK/dV kernel per key tile and a dQ kernel per query tile (their comments).
//
// The forward. A block owns 64·NC query rows of one (head, batch row) and has NC consumer
// warpgroups (64 rows each) and one producer warp after them. The producer's lane 0 loads Q once,
// then each 64-key tile's K and V into stage n % Stages of a ring: it waits for the stage's `empty`
// barrier (every consumer thread arrives on it once done with the stage), announces the bytes on
// the stage's `full_k` / `full_v` barrier (arrive.expect_tx) and issues the TMA copies, which
// complete their bytes there. K and V complete on barriers of their own, so S = Q Kᵀ starts before
// V lands. Every consumer thread waits on the barriers itself (TMA's writes become visible to the
// threads that observe the phase complete).
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
// here through mbarriers), so that one's softmax runs under the other's GEMMs. At the end each
// warpgroup writes O / l into its Q tile and stores it by TMA. Not yet (the next steps of issue
// 33): setmaxnreg (registers moved from the producer to the consumers), a measurement on a GPU.
#include "kernels/cuda/attention_fused.cuh"  // check_fused, first_key_tile, block_tile, quad sums
#include "kernels/cuda/hopper.cuh"

namespace ft::kernels::cuda {
namespace {

constexpr int kSm90Rows = 64;  // query rows of a consumer warpgroup, keys of a tile
static_assert(kSm90Rows == kTileK, "first_key_tile steps by the fused kernel's key tile");

template <int D>
constexpr int kSm90TileBytes = D * 2 * kSm90Rows;  // 64 rows of a head, 16-bit
constexpr size_t kSm90MaxSmem = 227 * 1024;        // a block's dynamic shared memory on sm_90

// FA3's ping-pong between a block's NC consumer warpgroups: turn t of each (issuing its GEMMs)
// goes in order, warpgroup 0, 1, .., NC − 1, then 0 again, so that one's softmax runs while the
// next one's GEMMs occupy the tensor cores. Warpgroup c waits on turn[c] (but warpgroup 0 at turn
// 0), whose phases the warpgroup before it completes (its 128 threads arrive once a turn, after
// issuing: each turn[c] is initialized for 128 arrivals), and then passes the turn on. Every
// warpgroup takes the same turns, those in which it issues nothing too, so that the turns stay in
// order; a turn's arrivals on turn[c] come only after warpgroup c waited for the phase before
// (warpgroup c − 1 can take its next turn only once the turns of every other warpgroup, c's
// included, have gone round), so no barrier sees a second arrival in a phase and no waiter falls
// two phases behind.
template <int NC>
struct Turns {
  uint64_t* turn;  // [NC], in shared memory
  int cg;          // this warpgroup
  // By one thread before the block's barrier: each warpgroup's 128 threads arrive once a phase.
  __device__ __forceinline__ static void init(uint64_t* turn) {
    for (int c = 0; c < NC; ++c) mbarrier_init(&turn[c], 128);
  }
  __device__ __forceinline__ void take(int t) const {
    if (NC > 1 && (cg > 0 || t > 0)) mbarrier_wait(&turn[cg], unsigned(cg > 0 ? t : t - 1) & 1u);
  }
  __device__ __forceinline__ void pass() const {
    if (NC > 1) mbarrier_arrive(&turn[(cg + 1) % NC]);
  }
};

// The forward's and dQ's producer after Q: each key tile n's K (with its keys' segment ids, with
// segments) and V into ring stage n % Stages, on barriers of their own, once every consumer has
// released what the stage held before.
template <int D, int Stages>
struct KvRing {
  unsigned char *k_s, *v_s;  // [Stages][D / 64][64 keys][128 bytes]
  int32_t* kseg_s;           // [Stages][64]
  uint64_t *full_k, *full_v, *empty;
  __device__ __forceinline__ void load(const TensorMap& map_k, const TensorMap& map_v,
                                       const TensorMap& map_seg, bool seg, int kh, int b, int T_,
                                       int j_first, int n_tiles) const {
    constexpr int kTile = kSm90TileBytes<D>, kBoxBytes = 64 * 64 * 2;
    for (int n = 0; n < n_tiles; ++n) {
      const int st = n % Stages, j0 = j_first + n * kSm90Rows;
      mbarrier_wait(&empty[st], ((n / Stages) & 1) ^ 1);  // round 0: the phase before init
      mbarrier_arrive_expect_tx(&full_k[st], kTile + (seg ? kSm90Rows * 4 : 0));
      for (int ch = 0; ch < D / 64; ++ch)
        tma_load_3d(k_s + st * kTile + ch * kBoxBytes, map_k, kh * D + 64 * ch, j0, b, &full_k[st]);
      if (seg)  // keys past T read the next row's ids (or zeros): masked by c >= T anyway
        tma_load_2d(kseg_s + st * kSm90Rows, map_seg, b * T_ + j0, 0, &full_k[st]);
      mbarrier_arrive_expect_tx(&full_v[st], kTile);
      for (int ch = 0; ch < D / 64; ++ch)
        tma_load_3d(v_s + st * kTile + ch * kBoxBytes, map_v, kh * D + 64 * ch, j0, b, &full_v[st]);
    }
  }
};

// The forward's and dQ's header: barriers (512 bytes), then each stage's key segment ids (256
// bytes a stage), in whole KiB so that the tiles after it start on a 1024-byte boundary (the
// 128-byte swizzle's period).
template <int Stages>
constexpr int kSm90Header = (512 + Stages * kSm90Rows * 4 + 1023) / 1024 * 1024;
// The header, Q of every consumer, then K and V of every stage; 1 KiB more so that the tiles can
// start on a 1024-byte boundary wherever the dynamic shared memory starts.
template <int D, int NC, int Stages>
constexpr size_t sm90_smem_bytes() {
  return 1024 + size_t(kSm90Header<Stages>) + size_t(NC + 2 * Stages) * kSm90TileBytes<D>;
}

template <typename E, int D, int NC, int Stages>
__global__ void __launch_bounds__(128 * NC + 32)
    attention_sm90_forward_kernel(const __grid_constant__ TensorMap map_q,
                                  const __grid_constant__ TensorMap map_k,
                                  const __grid_constant__ TensorMap map_v,
                                  const __grid_constant__ TensorMap map_seg,
                                  const __grid_constant__ TensorMap map_o, float* lse,
                                  const int32_t* seg, int T_, int H, int K, float scale) {
#if FT_HOPPER_DEVICE
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
  static_assert(8 * (1 + 3 * Stages + NC) <= 512, "512 bytes of barriers");
  unsigned char* q_s = smem + kSm90Header<Stages>;  // [NC][kChunks][64 rows][128 bytes]
  unsigned char* k_s = q_s + NC * kTile;            // [Stages][kChunks][64 keys][128 bytes]
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
    Turns<NC>::init(turn);
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
    const KvRing<D, Stages> ring{k_s, v_s, kseg_s, full_k, full_v, empty};
    ring.load(map_k, map_v, map_seg, seg != nullptr, kh, b, T_, j_first, n_tiles);
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

  // The ping-pong (Turns): turn n of each warpgroup issues tile n's GEMMs; every warpgroup takes
  // n_tiles turns.
  const Turns<NC> turns{turn, cg};

  // FA3's overlap within the warpgroup: while P_{n−1} V_{n−1} runs on the tensor cores, the
  // softmax of S_n = Q K_nᵀ runs on the other units. Tile n's S is issued before P_{n−1} V_{n−1}
  // (wgmma groups complete in order), waited for alone (wait_group 1), and O is rescaled once
  // P_{n−1} V_{n−1} has completed too.
  if (n_mine > 0) {
    turns.take(0);
    mbarrier_wait(&full_k[stage(0)], phase(0));
    issue_scores(0);
    turns.pass();
    wgmma_wait_group<0>();
    wgmma_fence_operand(s);
    softmax(0);
    rescale_and_pack();
    for (int n = 1; n < n_mine; ++n) {
      turns.take(n);
      mbarrier_wait(&full_k[stage(n)], phase(n));
      issue_scores(n);
      mbarrier_wait(&full_v[stage(n - 1)], phase(n - 1));
      issue_pv(n - 1);
      turns.pass();
      wgmma_wait_group<1>();  // S_n
      wgmma_fence_operand(s);
      softmax(n);
      wgmma_wait_group<0>();  // P_{n−1} V_{n−1}
      wgmma_fence_operand(o);
      wgmma_fence_operand(p);
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
    turns.take(n);
    turns.pass();
    mbarrier_wait(&full_k[stage(n)], phase(n));
    mbarrier_wait(&full_v[stage(n)], phase(n));
    mbarrier_arrive(&empty[stage(n)]);
  }

  if (n_mine == 0) return;  // rows all past T (the whole warpgroup alike)
  // O / l into this warpgroup's Q tile (its last reader, the last S = Q Kᵀ, has completed), laid
  // out as a TMA load of those rows lands them (64-column boxes, 128-byte swizzle: element (r, c)
  // of a box at byte tma_swizzle(128 r + 2 c)), then one TMA store a box by the warpgroup's first
  // thread once every thread's stores are fenced for the async proxy and met at the warpgroup's
  // named barrier; rows past T lie outside the tensor map and are not written.
  unsigned char* o_tile = q_s + cg * kTile;
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float sum = quad_sum(l[x]);
    const float inv = 1.0f / sum;  // rows past T: computed, never stored
    const uint32_t r = 16 * w + g + 8 * x;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      const int c = 8 * t + 2 * qd;
      *reinterpret_cast<uint32_t*>(o_tile + (c / 64) * kBoxBytes +
                                   tma_swizzle(128 * r + 2 * (c % 64), 128)) =
          pack2<E>(o[4 * t + 2 * x] * inv, o[4 * t + 2 * x + 1] * inv);
    }
    if (qd == 0 && row[x] < T_) lse[(size_t(b) * H + h) * T_ + row[x]] = m[x] * scale + logf(sum);
  }
  fence_proxy_async_shared();
  named_barrier_sync(1 + cg, 128);
  if (threadIdx.x % 128 == 0) {
    for (int ch = 0; ch < kChunks; ++ch)
      tma_store_3d(map_o, h * D + 64 * ch, r0, b, o_tile + ch * kBoxBytes);
    bulk_commit_group();
    bulk_wait_group_read<0>();  // the tile's shared memory stays until the copy has read it
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

// n 32-bit values (B·T segment ids, B·H·T lse or Δ) as one row, copied as fp32 bits (TMA has no
// int32 type of its own), in boxes of `box` elements; elements past n read as zeros. A second
// dimension of 1 because only the 2-D and 3-D copies are wrapped.
inline TensorMap row_map(const void* p, uint64_t n, uint32_t box) {
  const uint64_t dims[2] = {n, 1}, strides[1] = {(n * 4 + 15) / 16 * 16};
  const uint32_t boxes[2] = {box, 1};
  return encode_tensor_map(TmaType::kF32, 2, p, dims, strides, boxes, TmaSwizzle::kNone);
}

template <typename T, int D, int NC, int Stages>
void sm90_forward_launch(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* seg,
                         int B, int T_, int H, int K, void* stream) {
  auto kernel = attention_sm90_forward_kernel<T, D, NC, Stages>;
  constexpr size_t smem = sm90_smem_bytes<D, NC, Stages>();
  static_assert(smem <= kSm90MaxSmem, "the forward's shared memory exceeds a block's");
  constexpr int kTq = NC * kSm90Rows;
  allow_smem(reinterpret_cast<const void*>(kernel), smem, "attention_sm90_forward");
  const TensorMap map_q = heads_map(q, B, T_, H, D), map_k = heads_map(k, B, T_, K, D),
                  map_v = heads_map(v, B, T_, K, D);
  // The segment ids in boxes of 64 (a tile's keys); without segments an unused stand-in.
  const TensorMap map_seg = seg ? row_map(seg, uint64_t(B) * T_, kSm90Rows) : map_q;
  const TensorMap map_o = heads_map(out, B, T_, H, D);
  FT_LAUNCH((attention_sm90_forward_kernel<T, D, NC, Stages>),
            tile_grid(true, (T_ + kTq - 1) / kTq, H, B), 128 * NC + 32, smem, stream)
  (map_q, map_k, map_v, map_seg, map_o, lse, seg, T_, H, K, softmax_scale(D));
  FT_CUDA_CHECK_LAUNCH();
}

// ---- The backward (attention_fused_backward's contract; Δ by attention_delta first) ----------

// dQ: a block owns 64·NC query rows of one (head, batch row), NC consumer warpgroups of 64 rows
// and a producer warp, as the forward (a producer warpgroup under the register split, below). The
// producer loads Q and dO once, then each key tile's K (with the key segment ids) and V into stage
// n % Stages of a ring, on the stage's `full_k` and `full_v` barriers (as the forward: S = Q Kᵀ
// starts before V lands). Per key tile, in
// the warpgroup: S = Q Kᵀ and dP = dO Vᵀ (wgmma SS, all four operands K-major, a commit group
// each), P = exp2(scale·log2e·S − lse·log2e) masked to 0, dS = P ∘ (dP − Δ) in fp32 (0 on rows that
// see one key), rounded once to E into the A registers of dQ += dS K (wgmma RS, K read MN-major as
// the forward's V). The groups S_n, dP_n, dS_{n−1} K_{n−1} are issued in that order and complete in
// it: P_n is computed while dP_n and dS_{n−1} K_{n−1} run (wait_group 2), dS_n while the latter
// does (wait_group 1). The warpgroups issue in turn (the ping-pong, Turns: turn n issues S_n,
// dP_n and dS_{n−1} K_{n−1}; the last dS K after the turns), so that one's P and dS run under the
// other's products. dQ is scaled once at the end. lse,
// Δ, the row's segment id and its one-key flag are per row: read once from global memory. FA3's
// register split (both backward kernels): where a consumer warpgroup needs more registers than a
// block of NC consumer warpgroups and a producer warp leaves it (head dim 128: dK and dV alone are
// 128 a thread, dQ's kernel needed 174), the producer is a whole warpgroup that gives registers
// back (setmaxnreg.dec to 24) and the consumers take them (.inc to 240): 384 threads start at 168
// each; 128 · 144 freed = 2 · 128 · 72 taken. The .inc can be served only if the kernel starts at
// 168 registers a thread (3 · 168 − 24 ≥ 2 · 240): ptxas gives a kernel with setmaxnreg its launch
// bounds' cap (168 reported for both kernels, nvcc 13.0), and the launcher checks the count
// (sm90_check_split). dQ takes the split at head dim 128; dK/dV at both, at 64 for the overlap
// of a tile's softmax with the previous tile's products (kSm90DkdvOverlap, at its kernel).
template <int D, int NC>
constexpr bool kSm90DqSplit = D == 128 && NC == 2;
template <int D, int NC>
constexpr bool kSm90DkdvSplit = NC == 2;
template <bool Split, int NC>
constexpr int kSm90BackwardThreads = Split ? 128 * (NC + 1) : 128 * NC + 32;

template <int D, int NC, int Stages>
constexpr size_t sm90_dq_smem_bytes() {  // the header (kSm90Header), Q, dO, K, V
  return 1024 + size_t(kSm90Header<Stages>) + size_t(2 * NC + 2 * Stages) * kSm90TileBytes<D>;
}

template <typename E, int D, int NC, int Stages>
__global__ void __launch_bounds__(kSm90BackwardThreads<kSm90DqSplit<D, NC>, NC>, 1)
    attention_sm90_dq_kernel(const __grid_constant__ TensorMap map_q,
                             const __grid_constant__ TensorMap map_do,
                             const __grid_constant__ TensorMap map_k,
                             const __grid_constant__ TensorMap map_v,
                             const __grid_constant__ TensorMap map_seg, device_t<E>* dq,
                             const float* lse, const float* delta, const int32_t* seg, int T_,
                             int H, int K, float scale) {
#if FT_HOPPER_DEVICE
  using Dev = device_t<E>;
  constexpr int kTq = NC * kSm90Rows, kTile = kSm90TileBytes<D>, kChunks = D / 64;
  constexpr int kBoxBytes = 64 * 64 * 2;
  FT_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* smem = smem_raw + ((1024u - smem_offset(smem_raw) % 1024u) % 1024u);
  auto* bars = reinterpret_cast<uint64_t*>(smem);
  uint64_t* q_full = bars;  // Q and dO
  uint64_t* full_k = bars + 1;
  uint64_t* full_v = full_k + Stages;
  uint64_t* empty = full_v + Stages;
  uint64_t* turn = empty + Stages;                        // [NC]: the ping-pong
  auto* kseg_s = reinterpret_cast<int32_t*>(smem + 512);  // [Stages][64]
  static_assert(8 * (1 + 3 * Stages + NC) <= 512, "512 bytes of barriers");
  unsigned char* q_s = smem + kSm90Header<Stages>;  // [NC][kChunks][64 rows][128 bytes]
  unsigned char* do_s = q_s + NC * kTile;           // the same
  unsigned char* k_s = do_s + NC * kTile;           // [Stages][kChunks][64 keys][128 bytes]
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
    Turns<NC>::init(turn);
  }
  __syncthreads();

  const int cg = __shfl_sync(kFullMask, int(threadIdx.x) / 128, 0);  // uniform: see the forward
  if (cg == NC) {  // the producer warp (warpgroup, with the register split)
    if constexpr (kSm90DqSplit<D, NC>) setmaxnreg_dec<24>();
    if (threadIdx.x != 128 * NC) return;
    mbarrier_arrive_expect_tx(q_full, 2 * NC * kTile);
    for (int c = 0; c < NC; ++c)
      for (int ch = 0; ch < kChunks; ++ch) {
        const int at = c * kTile + ch * kBoxBytes, r = i0 + kSm90Rows * c;
        tma_load_3d(q_s + at, map_q, h * D + 64 * ch, r, b, q_full);
        tma_load_3d(do_s + at, map_do, h * D + 64 * ch, r, b, q_full);
      }
    const KvRing<D, Stages> ring{k_s, v_s, kseg_s, full_k, full_v, empty};
    ring.load(map_k, map_v, map_seg, seg != nullptr, kh, b, T_, j_first, n_tiles);
    return;
  }

  if constexpr (kSm90DqSplit<D, NC>) setmaxnreg_inc<240>();
  const int w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, qd = lane & 3;
  const int r0 = i0 + kSm90Rows * cg;
  const float scale_log2 = scale * kLog2e;
  int row[2], rseg[2];
  float lse2[2], dlt[2];
  bool one[2];
  for (int x = 0; x < 2; ++x) {
    row[x] = r0 + 16 * w + g + 8 * x;
    const bool in = row[x] < T_;
    rseg[x] = seg_b && in ? seg_b[row[x]] : 0;
    const size_t st = (size_t(b) * H + h) * T_ + row[x];
    lse2[x] = in ? lse[st] * kLog2e : 0.0f;
    dlt[x] = in ? delta[st] : 0.0f;
    one[x] = in && sees_one_key(seg_b, row[x]);
  }
  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  const unsigned char* q_tile = q_s + cg * kTile;
  const unsigned char* do_tile = do_s + cg * kTile;
  mbarrier_wait(q_full, 0);

  // The tiles this warpgroup computes come first (as the forward); the rest it waits for and
  // releases.
  const int n_mine = r0 >= T_ ? 0 : min(n_tiles, (r0 + kSm90Rows - 1 - j_first) / kSm90Rows + 1);
  const auto stage = [&](int n) { return n % Stages; };
  const auto phase = [&](int n) { return unsigned(n / Stages) & 1u; };

  float s[kSm90Rows / 2], dp[kSm90Rows / 2];  // S and dP of the newest tile, then P and dS
  uint32_t ds[kSm90Rows / 16][4];             // dS of the tile whose dS K is next, A fragments
  // S = Q K_nᵀ and dP = dO V_nᵀ, a commit group each (P's exponentials run while dP does), each
  // once its tile has landed (S needs no V).
  const auto issue_scores = [&](int n) {
    const unsigned char* k_tile = k_s + stage(n) * kTile;
    const unsigned char* v_tile = v_s + stage(n) * kTile;
    mbarrier_wait(&full_k[stage(n)], phase(n));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int at = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64k16<E, kSm90Rows>(s, wgmma_descriptor(q_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(k_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 kk > 0);
    }
    wgmma_commit_group();
    mbarrier_wait(&full_v[stage(n)], phase(n));
    wgmma_fence();  // after the wait: else ptxas injects one (C7519)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int at = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64k16<E, kSm90Rows>(dp, wgmma_descriptor(do_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(v_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 kk > 0);
    }
    wgmma_commit_group();
  };
  // dQ += dS K_n (K's rows are the k dimension: MN-major, as V in the forward's P V).
  const auto issue_dq = [&](int n) {
    const unsigned char* k_tile = k_s + stage(n) * kTile;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
      wgmma_m64k16_rs<E, D, true>(
          acc, ds[ks], wgmma_descriptor(k_tile + ks * 2048, kBoxBytes, 1024, WgmmaSwizzle::k128B),
          true);
    wgmma_commit_group();
  };
  // The masks only where tile n needs them (warp-uniform: the diagonal, the end of the
  // sequence, documents; rows that see one key exist only in such tiles).
  const auto masked = [&](int n) {
    const int j0 = j_first + n * kSm90Rows;
    return seg_b || j0 + kSm90Rows - 1 > r0 + 16 * w || j0 + kSm90Rows > T_;
  };
  // P of tile n in place of S (dP may still be in flight).
  const auto probs = [&](int n) {
    const int j0 = j_first + n * kSm90Rows;
    const int32_t* kseg = kseg_s + stage(n) * kSm90Rows;
    const auto body = [&](auto general) {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int x = (i >> 1) & 1;
        s[i] = exp2_approx(fmaf(s[i], scale_log2, -lse2[x]));
        if constexpr (decltype(general)::value) {
          const int c = j0 + 8 * (i >> 2) + 2 * qd + (i & 1);
          if (c > row[x] || c >= T_ || (seg_b && kseg[c - j0] != rseg[x])) s[i] = 0.0f;
        }
      }
    };
    if (masked(n))
      body(std::true_type{});
    else
      body(std::false_type{});
  };
  // dS = P ∘ (dP − Δ) of tile n in place of P.
  const auto dscores = [&](int n) {
    if (masked(n)) {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int x = (i >> 1) & 1;
        s[i] = one[x] ? 0.0f : s[i] * (dp[i] - dlt[x]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) s[i] *= dp[i] - dlt[(i >> 1) & 1];
    }
  };
  const auto pack = [&]() {
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) ds[ks][j] = pack2_rn<E>(s[8 * ks + 2 * j], s[8 * ks + 2 * j + 1]);
  };

  // The ping-pong (as the forward's): step n of each warpgroup, issuing S_n, dP_n and
  // dS_{n−1} K_{n−1}, goes in turn, so that one's P and dS run under the other's products.
  const Turns<NC> turns{turn, cg};
  if (n_mine > 0) {
    turns.take(0);
    issue_scores(0);
    turns.pass();
    wgmma_wait_group<1>();  // S_0
    wgmma_fence_operand(s);
    probs(0);
    wgmma_wait_group<0>();  // dP_0
    wgmma_fence_operand(dp);
    dscores(0);
    pack();
    for (int n = 1; n < n_mine; ++n) {
      turns.take(n);
      issue_scores(n);
      issue_dq(n - 1);
      turns.pass();
      wgmma_wait_group<2>();  // S_n
      wgmma_fence_operand(s);
      probs(n);
      wgmma_wait_group<1>();  // dP_n
      wgmma_fence_operand(dp);
      dscores(n);
      wgmma_wait_group<0>();  // dS_{n−1} K_{n−1}
      wgmma_fence_operand(acc);
      wgmma_fence_operand(ds);
      mbarrier_arrive(&empty[stage(n - 1)]);
      pack();
    }
    issue_dq(n_mine - 1);
    wgmma_wait_group<0>();
    wgmma_fence_operand(acc);
    mbarrier_arrive(&empty[stage(n_mine - 1)]);
  }
  for (int n = n_mine; n < n_tiles; ++n) {  // wait before arriving: one arrival a phase
    turns.take(n);
    turns.pass();
    mbarrier_wait(&full_k[stage(n)], phase(n));
    mbarrier_wait(&full_v[stage(n)], phase(n));
    mbarrier_arrive(&empty[stage(n)]);
  }

  const size_t ldq = size_t(H) * D;
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (row[x] >= T_) continue;
    Dev* grow = dq + (size_t(b) * T_ + row[x]) * ldq + size_t(h) * D + 2 * qd;
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      *reinterpret_cast<uint32_t*>(grow + 8 * t) =
          pack2<E>(acc[4 * t + 2 * x] * scale, acc[4 * t + 2 * x + 1] * scale);
  }
#endif
}

// dK/dV: a block owns 64·NC keys of one (kv head, batch row), NC consumer warpgroups of 64 keys
// and a producer warp (a producer warpgroup under the register split, below). The producer loads
// every warpgroup's K and V once, then streams the query tiles (each query head of the group in
// order, each from the block's first key to the end or to a later document than its last key, as
// the FA2 kernel) into a ring: Q, dO, their lse and Δ (64 fp32 each) and, with segments, the ids of
// queries i0 − 8 .. i0 + 63 (one 72-id box: a query's predecessor's id gives its one-key flag), all
// on the stage's `full` barrier. Per query tile, in the warpgroup, transposed (M = keys) so that
// the results' rows are keys: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (SS, K-major), Pᵀ = exp2(scale·log2e·Sᵀ −
// lse·log2e) (lse per column, the query), dSᵀ = Pᵀ ∘ (dPᵀ − Δ) in fp32, then Pᵀ and dSᵀ rounded
// once to E into the A registers of dV += Pᵀ dO and dK += dSᵀ Q (RS; dO and Q read MN-major: their
// rows are the k dimension). A warpgroup skips the query tiles wholly above its keys (the first of
// each head for the second warpgroup: those queries see none of its keys; exact, their P is 0).
// Within a warpgroup at head dim 64 (kSm90DkdvOverlap), tile n's Sᵀ and dPᵀ are issued before
// tile n − 1's products, and its Pᵀ and dSᵀ computed while those run (as dQ does; the A
// fragments are packed once they completed), head by head; between the warpgroups the ping-pong
// (Turns, a turn a tile). That needs Sᵀ and dPᵀ of one tile and Pᵀ, dSᵀ of the other in
// registers beside dK and dV: more than the 168 a thread that ptxas allowed a 288-thread block
// (spills), so dK/dV takes the register split at 64 too (nvcc 13.0: no spill, no serialized
// wgmma). At 128 it spilled 200 bytes even under the split (64 with Pᵀ and dSᵀ through shared
// memory as the A of SS products: dK, dV, Sᵀ and dPᵀ alone are 192 a thread): there each tile
// goes in turn, with two turns a tile (Sᵀ and dPᵀ, then dV's and dK's products), one
// warpgroup's Pᵀ and dSᵀ under the other's products. Each gradient element is summed by one thread
// in query order (the same bits in both forms): deterministic, no atomics.
template <int D, int NC>
constexpr bool kSm90DkdvOverlap = D == 64 && kSm90DkdvSplit<D, NC>;
constexpr int kIdsPad = 8, kIdsBox = kSm90Rows + kIdsPad;  // 72 ids: 288 bytes, a 16 multiple
constexpr int kSmallSlot = 512;  // bytes of a stage's lse, Δ or ids (128-byte aligned for TMA)
template <int Stages>  // barriers (1 KiB), then lse, Δ, ids; the tiles from a 1024-byte boundary
constexpr int kSm90DkdvHeader = 1024 + (3 * Stages * kSmallSlot + 1023) / 1024 * 1024;
template <int D, int NC, int Stages>
constexpr size_t sm90_dkdv_smem_bytes() {
  return 1024 + size_t(kSm90DkdvHeader<Stages>) +
         size_t(2 * NC + 2 * Stages) * kSm90TileBytes<D>;  // K, V; Q, dO
}

template <typename E, int D, int NC, int Stages>
__global__ void __launch_bounds__(kSm90BackwardThreads<kSm90DkdvSplit<D, NC>, NC>, 1)
    attention_sm90_dkdv_kernel(
        const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_do,
        const __grid_constant__ TensorMap map_k, const __grid_constant__ TensorMap map_v,
        const __grid_constant__ TensorMap map_lse, const __grid_constant__ TensorMap map_dlt,
        const __grid_constant__ TensorMap map_ids, device_t<E>* dk, device_t<E>* dv,
        const int32_t* seg, int T_, int H, int K, float scale) {
#if FT_HOPPER_DEVICE
  constexpr int kTk = NC * kSm90Rows, kTile = kSm90TileBytes<D>, kChunks = D / 64;
  constexpr int kBoxBytes = 64 * 64 * 2;
  FT_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* smem = smem_raw + ((1024u - smem_offset(smem_raw) % 1024u) % 1024u);
  auto* bars = reinterpret_cast<uint64_t*>(smem);
  uint64_t* kv_full = bars;
  uint64_t* full = bars + 1;
  uint64_t* empty = full + Stages;
  uint64_t* turn = empty + Stages;  // [NC]: the ping-pong
  static_assert(8 * (1 + 2 * Stages + NC) <= 1024, "1 KiB of barriers");
  auto* lse_s = reinterpret_cast<float*>(smem + 1024);  // [Stages][kSmallSlot / 4]
  auto* dlt_s = reinterpret_cast<float*>(smem + 1024 + Stages * kSmallSlot);
  auto* ids_s = reinterpret_cast<int32_t*>(smem + 1024 + 2 * Stages * kSmallSlot);
  unsigned char* k_s = smem + kSm90DkdvHeader<Stages>;  // [NC][kChunks][64 keys][128 bytes]
  unsigned char* v_s = k_s + NC * kTile;
  unsigned char* q_s = v_s + NC * kTile;  // [Stages][kChunks][64 queries][128 bytes]
  unsigned char* do_s = q_s + Stages * kTile;

  // The first key tiles are seen by the most queries: they go first (lpt).
  const BlockTile bt = block_tile(true);
  const int j0 = bt.tile * kTk;
  const int kh = bt.head, b = bt.b, group = H / K;
  const int32_t* seg_b = seg ? seg + size_t(b) * T_ : nullptr;
  // Query tiles from j0 (earlier queries see none of these keys) to the end, or to the first
  // tile of a later document than the block's last key; n = head · n_q + tile.
  const int last_seg = seg_b ? seg_b[min(j0 + kTk, T_) - 1] : 0;
  int i_end = j0 + kSm90Rows;
  while (i_end < T_ && !(seg_b && seg_b[i_end] > last_seg)) i_end += kSm90Rows;
  const int n_q = (i_end - j0) / kSm90Rows, n_all = group * n_q;

  if (threadIdx.x == 0) {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 128 * NC);
    }
    Turns<NC>::init(turn);
  }
  __syncthreads();

  const int cg = __shfl_sync(kFullMask, int(threadIdx.x) / 128, 0);  // uniform: see the forward
  if (cg == NC) {  // the producer warp (warpgroup, with the register split)
    if constexpr (kSm90DkdvSplit<D, NC>) setmaxnreg_dec<24>();
    if (threadIdx.x != 128 * NC) return;
    mbarrier_arrive_expect_tx(kv_full, 2 * NC * kTile);
    for (int c = 0; c < NC; ++c)
      for (int ch = 0; ch < kChunks; ++ch) {
        const int at = c * kTile + ch * kBoxBytes, key = j0 + kSm90Rows * c;
        tma_load_3d(k_s + at, map_k, kh * D + 64 * ch, key, b, kv_full);
        tma_load_3d(v_s + at, map_v, kh * D + 64 * ch, key, b, kv_full);
      }
    for (int n = 0, h = kh * group, i0 = j0; n < n_all; ++n) {
      const int st = n % Stages;
      mbarrier_wait(&empty[st], ((n / Stages) & 1) ^ 1);  // round 0: the phase before init
      mbarrier_arrive_expect_tx(&full[st], 2 * kTile + 2 * kSm90Rows * 4 + (seg ? kIdsBox * 4 : 0));
      for (int ch = 0; ch < kChunks; ++ch) {
        const int at = st * kTile + ch * kBoxBytes;
        tma_load_3d(q_s + at, map_q, h * D + 64 * ch, i0, b, &full[st]);
        tma_load_3d(do_s + at, map_do, h * D + 64 * ch, i0, b, &full[st]);
      }
      // Queries past T read the next head's values (or zeros): masked by r >= T anyway.
      const int stat = (b * H + h) * T_ + i0;  // < 2^31: checked by the launcher
      tma_load_2d(lse_s + st * (kSmallSlot / 4), map_lse, stat, 0, &full[st]);
      tma_load_2d(dlt_s + st * (kSmallSlot / 4), map_dlt, stat, 0, &full[st]);
      if (seg)  // from i0 − 8: before the first row, zeros (its one-key flag is r == 0's)
        tma_load_2d(ids_s + st * (kSmallSlot / 4), map_ids, b * T_ + i0 - kIdsPad, 0, &full[st]);
      i0 += kSm90Rows;
      if (i0 == i_end) {
        i0 = j0;
        ++h;
      }
    }
    return;
  }

  // Consumer warpgroup cg: keys kw0 .. kw0 + 63; this thread's two keys (x = 0, 1) of every
  // accumulator row: 16 w + g + 8 x.
  if constexpr (kSm90DkdvSplit<D, NC>) setmaxnreg_inc<240>();
  const int w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, qd = lane & 3;
  const int kw0 = j0 + kSm90Rows * cg;
  const float scale_log2 = scale * kLog2e;
  int key[2], kseg[2];
  for (int x = 0; x < 2; ++x) {
    key[x] = kw0 + 16 * w + g + 8 * x;
    kseg[x] = seg_b && key[x] < T_ ? seg_b[key[x]] : 0;
  }
  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
  const unsigned char* k_tile = k_s + cg * kTile;
  const unsigned char* v_tile = v_s + cg * kTile;
  mbarrier_wait(kv_full, 0);
  const auto stage = [&](int n) { return n % Stages; };
  const auto phase = [&](int n) { return unsigned(n / Stages) & 1u; };

  float st[kSm90Rows / 2], dpt[kSm90Rows / 2];  // Sᵀ and dPᵀ of the newest tile, then Pᵀ, dSᵀ
  uint32_t pa[kSm90Rows / 16][4], dsa[kSm90Rows / 16][4];  // Pᵀ, dSᵀ as A fragments
  // Sᵀ = K Q_nᵀ and dPᵀ = V dOᵀ, one commit group. (Pᵀ's exponentials while dPᵀ runs, as dQ
  // does, made ptxas serialize the wgmmas at head dim 128 and spill at 64: tried before dK/dV
  // took the register split, with one consumer warpgroup at 128 and 168 registers at 64.)
  const auto issue_scores = [&](int n) {
    const unsigned char* q_tile = q_s + stage(n) * kTile;
    const unsigned char* do_tile = do_s + stage(n) * kTile;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int at = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64k16<E, kSm90Rows>(st, wgmma_descriptor(k_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(q_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int at = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64k16<E, kSm90Rows>(dpt, wgmma_descriptor(v_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 wgmma_descriptor(do_tile + at, 16, 1024, WgmmaSwizzle::k128B),
                                 kk > 0);
    }
    wgmma_commit_group();
  };
  // dV += Pᵀ dO_n and dK += dSᵀ Q_n (dO and Q read MN-major), one commit group. The A
  // fragments are written before the fence, so that ptxas needs to inject no warpgroup.arrive.
  // (dV's products issued before dSᵀ is computed, to overlap the two, also made ptxas
  // serialize the wgmmas at head dim 128 and spill at 64, tried before the split likewise.)
  const auto issue_grads = [&](int n) {
    const unsigned char* q_tile = q_s + stage(n) * kTile;
    const unsigned char* do_tile = do_s + stage(n) * kTile;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
      wgmma_m64k16_rs<E, D, true>(
          dv_acc, pa[ks],
          wgmma_descriptor(do_tile + ks * 2048, kBoxBytes, 1024, WgmmaSwizzle::k128B), true);
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
      wgmma_m64k16_rs<E, D, true>(
          dk_acc, dsa[ks],
          wgmma_descriptor(q_tile + ks * 2048, kBoxBytes, 1024, WgmmaSwizzle::k128B), true);
    wgmma_commit_group();
  };
  // Masks only where the tile (first query i0) needs them (uniform over the warpgroup: its keys
  // reach past the tile's first query, the tile crosses the end of the sequence, or documents;
  // queries that see one key exist only in such tiles).
  const auto masked = [&](int i0) {
    return seg_b || kw0 + kSm90Rows - 1 > i0 || i0 + kSm90Rows > T_ || kw0 + kSm90Rows > T_;
  };
  // Pᵀ of tile n in place of Sᵀ; lse belongs to the column (the query).
  const auto probs = [&](int n, int i0) {
    const float* ls = lse_s + stage(n) * (kSmallSlot / 4);
    const int32_t* ids = ids_s + stage(n) * (kSmallSlot / 4) + kIdsPad;
    const auto body = [&](auto general) {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int c = 8 * (i >> 2) + 2 * qd + (i & 1), x = (i >> 1) & 1;
        st[i] = exp2_approx(fmaf(st[i], scale_log2, -(ls[c] * kLog2e)));
        if constexpr (decltype(general)::value) {
          const int r = i0 + c;
          if (key[x] > r || r >= T_ || key[x] >= T_ || (seg_b && ids[c] != kseg[x])) st[i] = 0.0f;
        }
      }
    };
    if (masked(i0))
      body(std::true_type{});
    else
      body(std::false_type{});
  };
  // dSᵀ = Pᵀ ∘ (dPᵀ − Δ) of tile n in place of dPᵀ; Δ per column.
  const auto dscores = [&](int n, int i0) {
    const float* dl = dlt_s + stage(n) * (kSmallSlot / 4);
    const int32_t* ids = ids_s + stage(n) * (kSmallSlot / 4) + kIdsPad;  // ids[-1]: i0 − 1's
    if (masked(i0)) {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int c = 8 * (i >> 2) + 2 * qd + (i & 1), r = i0 + c;
        const bool one = r == 0 || (seg_b && ids[c - 1] != ids[c]);
        dpt[i] = one ? 0.0f : st[i] * (dpt[i] - dl[c]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSm90Rows / 2; ++i) {
        const int c = 8 * (i >> 2) + 2 * qd + (i & 1);
        dpt[i] = st[i] * (dpt[i] - dl[c]);
      }
    }
  };
  // v (fp32, the tile's 64 queries) rounded once to E into A fragments.
  const auto pack = [&](uint32_t(&a)[kSm90Rows / 16][4], const float(&v)[kSm90Rows / 2]) {
#pragma unroll
    for (int ks = 0; ks < kSm90Rows / 16; ++ks)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[ks][j] = pack2_rn<E>(v[8 * ks + 2 * j], v[8 * ks + 2 * j + 1]);
  };

  // Once tile n's products have completed: dK and dV readable, Pᵀ and dSᵀ rewritable, its stage
  // released.
  const auto grads_done = [&](int n) {
    wgmma_wait_group<0>();
    wgmma_fence_operand(dv_acc);
    wgmma_fence_operand(dk_acc);
    wgmma_fence_operand(pa);
    wgmma_fence_operand(dsa);
    mbarrier_arrive(&empty[stage(n)]);
  };
  if constexpr (kSm90DkdvOverlap<D, NC>) {
    // The ping-pong: a turn a query tile (issuing its Sᵀ and dPᵀ, then the previous tile's dV's
    // and dK's products); a warpgroup takes the turns of the tiles it skips too. Within the
    // warpgroup, tile n's Pᵀ and dSᵀ run while tile n − 1's products do, head by head.
    const Turns<NC> turns{turn, cg};
    for (int hd = 0; hd < group; ++hd) {
      const int base = hd * n_q, first = kw0 >= T_ ? n_q : min(cg, n_q);
      for (int il = 0; il < first; ++il) {  // skipped: wait before arriving, one arrival a phase
        turns.take(base + il);
        turns.pass();
        mbarrier_wait(&full[stage(base + il)], phase(base + il));
        mbarrier_arrive(&empty[stage(base + il)]);
      }
      if (first == n_q) continue;
      int n = base + first;
      turns.take(n);
      mbarrier_wait(&full[stage(n)], phase(n));
      issue_scores(n);
      turns.pass();
      wgmma_wait_group<0>();
      wgmma_fence_operand(st);
      wgmma_fence_operand(dpt);
      probs(n, j0 + kSm90Rows * first);
      dscores(n, j0 + kSm90Rows * first);
      pack(pa, st);
      pack(dsa, dpt);
      for (int il = first + 1; il < n_q; ++il) {
        n = base + il;
        turns.take(n);
        mbarrier_wait(&full[stage(n)], phase(n));
        issue_scores(n);
        issue_grads(n - 1);
        turns.pass();
        wgmma_wait_group<1>();  // Sᵀ_n, dPᵀ_n
        wgmma_fence_operand(st);
        wgmma_fence_operand(dpt);
        probs(n, j0 + kSm90Rows * il);
        dscores(n, j0 + kSm90Rows * il);
        grads_done(n - 1);
        pack(pa, st);
        pack(dsa, dpt);
      }
      issue_grads(n);
      grads_done(n);
    }
  } else {
    // The ping-pong: two turns a query tile, 2n issuing Sᵀ and dPᵀ, 2n + 1 issuing dV's and dK's
    // products, so that one warpgroup's Pᵀ and dSᵀ run under the other's products. A warpgroup that
    // skips the tile takes both turns too.
    const Turns<NC> turns{turn, cg};
    for (int n = 0, il = 0; n < n_all; ++n, il = il + 1 == n_q ? 0 : il + 1) {
      mbarrier_wait(&full[stage(n)], phase(n));  // also before a skipped tile's release
      if (kw0 >= T_ || il < cg) {
        turns.take(2 * n);
        turns.pass();
        turns.take(2 * n + 1);
        turns.pass();
        mbarrier_arrive(&empty[stage(n)]);
        continue;
      }
      const int i0 = j0 + kSm90Rows * il;
      turns.take(2 * n);
      issue_scores(n);
      turns.pass();
      wgmma_wait_group<0>();
      wgmma_fence_operand(st);
      wgmma_fence_operand(dpt);
      probs(n, i0);
      dscores(n, i0);
      pack(pa, st);
      pack(dsa, dpt);
      turns.take(2 * n + 1);
      issue_grads(n);
      turns.pass();
      grads_done(n);
    }
  }

  const size_t ldk = size_t(K) * D;
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (key[x] >= T_) continue;
    const size_t off = (size_t(b) * T_ + key[x]) * ldk + size_t(kh) * D + 2 * qd;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      *reinterpret_cast<uint32_t*>(dk + off + 8 * t) =
          pack2<E>(dk_acc[4 * t + 2 * x] * scale, dk_acc[4 * t + 2 * x + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + 8 * t) =
          pack2<E>(dv_acc[4 * t + 2 * x], dv_acc[4 * t + 2 * x + 1]);
    }
  }
#endif
}

// The backward's form: consumer warpgroups and ring stages of each kernel, the same at both head
// dims. Two warpgroups: dQ at head dim 64 with a producer warp (a 288-thread block: ptxas allows
// 168 registers a thread), dQ at 128 and dK/dV at both under the register split (kSm90DqSplit,
// kSm90DkdvSplit: consumers at 240), where with a producer warp only one fitted at 128 (dK and dV
// alone are 128 floats a thread; dQ's two warpgroups spilled 48 bytes) and dK/dV's overlap
// spilled at 64.
// Three ring stages (the forward's too): where a consumer warpgroup holds two at a time (the
// forward's V_{n−1} and K_n; dQ's and dK/dV's at head dim 64, the tile whose products run and the
// next one's scores) and the producer refills a stage only once every consumer has released
// it, with two the next tile's loads would start only as it is needed (dK/dV at 128 holds one
// a warpgroup: three there for the warpgroups that run out of step). Occupancy is unchanged:
// registers allow one block an SM (two of the forward's at head dim 64: 106 registers, 67 KiB a
// block with three stages); at 128 shared memory allows one too (131, 163 and 167 KiB a block;
// the forward's 98 KiB with two stages would have allowed two by shared memory, not by
// registers).
struct Sm90BackwardForm {
  static constexpr int kDqNc = 2, kDqStages = 3;
  static constexpr int kDkdvNc = 2, kDkdvStages = 3;
};

// A kernel under the register split must start at 168 registers a thread, or its consumers'
// setmaxnreg.inc waits for registers the block never holds (kSm90DqSplit, kSm90DkdvSplit):
// checked on a GPU (the emulation models the entry count from the block size instead,
// hopper_emu.cpp).
inline void sm90_check_split([[maybe_unused]] const void* kernel,
                             [[maybe_unused]] const char* name) {
#if !defined(FT_CUDA_EMU)
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    throw ::ft::Error(std::string(name) +
                      ": cudaFuncGetAttributes failed: " + cudaGetErrorString(e));
  }
  if (attr.numRegs != 168)
    throw ::ft::Error(std::string(name) + ": compiled with " + std::to_string(attr.numRegs) +
                      " registers a thread, but its register split (setmaxnreg) needs 168 at "
                      "entry; run with FT_CUDA_ATTENTION_SM90=0 and report the nvcc version");
#endif
}

template <typename T, int D>
void sm90_backward_launch(T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* delta,
                          const T* q, const T* k, const T* v, const int32_t* seg, int B, int T_,
                          int H, int K, void* stream) {
  using F = Sm90BackwardForm;
  const float scale = softmax_scale(D);
  const TensorMap map_q = heads_map(q, B, T_, H, D), map_do = heads_map(dout, B, T_, H, D),
                  map_k = heads_map(k, B, T_, K, D), map_v = heads_map(v, B, T_, K, D);
  const uint64_t n_stat = uint64_t(B) * H * T_;
  const TensorMap map_lse = row_map(lse, n_stat, kSm90Rows),
                  map_dlt = row_map(delta, n_stat, kSm90Rows);
  const TensorMap map_seg = seg ? row_map(seg, uint64_t(B) * T_, kSm90Rows) : map_q;
  const TensorMap map_ids = seg ? row_map(seg, uint64_t(B) * T_, kIdsBox) : map_q;
  {
    constexpr int NC = F::kDkdvNc, S = F::kDkdvStages;
    auto kernel = attention_sm90_dkdv_kernel<T, D, NC, S>;
    constexpr size_t smem = sm90_dkdv_smem_bytes<D, NC, S>();
    static_assert(smem <= kSm90MaxSmem, "dK/dV's shared memory exceeds a block's");
    constexpr int threads = kSm90BackwardThreads<kSm90DkdvSplit<D, NC>, NC>;
    allow_smem(reinterpret_cast<const void*>(kernel), smem, "attention_sm90_backward");
    if constexpr (kSm90DkdvSplit<D, NC>) {
      static const bool checked =
          (sm90_check_split(reinterpret_cast<const void*>(kernel), "attention_sm90_dkdv"), true);
      (void)checked;
    }
    FT_LAUNCH((attention_sm90_dkdv_kernel<T, D, NC, S>),
              tile_grid(true, (T_ + 64 * NC - 1) / (64 * NC), K, B), threads, smem, stream)
    (map_q, map_do, map_k, map_v, map_lse, map_dlt, map_ids, dev(dk), dev(dv), seg, T_, H, K,
     scale);
    FT_CUDA_CHECK_LAUNCH();
  }
  {
    constexpr int NC = F::kDqNc, S = F::kDqStages;
    auto kernel = attention_sm90_dq_kernel<T, D, NC, S>;
    constexpr size_t smem = sm90_dq_smem_bytes<D, NC, S>();
    static_assert(smem <= kSm90MaxSmem, "dQ's shared memory exceeds a block's");
    constexpr int threads = kSm90BackwardThreads<kSm90DqSplit<D, NC>, NC>;
    allow_smem(reinterpret_cast<const void*>(kernel), smem, "attention_sm90_backward");
    if constexpr (kSm90DqSplit<D, NC>) {
      static const bool checked =
          (sm90_check_split(reinterpret_cast<const void*>(kernel), "attention_sm90_dq"), true);
      (void)checked;
    }
    FT_LAUNCH((attention_sm90_dq_kernel<T, D, NC, S>),
              tile_grid(true, (T_ + 64 * NC - 1) / (64 * NC), H, B), threads, smem, stream)
    (map_q, map_do, map_k, map_v, map_seg, dev(dq), lse, delta, seg, T_, H, K, scale);
    FT_CUDA_CHECK_LAUNCH();
  }
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
  // Two consumer warpgroups, three ring stages (Sm90BackwardForm's comment) at both head dims.
  if (D == 64)
    sm90_forward_launch<T, 64, 2, 3>(out, lse, q, k, v, seg, B, T_, H, K, stream);
  else
    sm90_forward_launch<T, 128, 2, 3>(out, lse, q, k, v, seg, B, T_, H, K, stream);
}

template <typename T>
void attention_sm90_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                             const T* q, const T* k, const T* v, const int32_t* seg, void* scratch,
                             int B, int T_, int H, int K, int D, void* stream) {
  // TMA: 16-byte aligned tensors; lse and Δ are read as rows of B·H·T values at int32 coordinates.
  check_fused("attention_sm90_backward", B, T_, H, K, D,
              {dq, dk, dv, dout, q, k, v, seg, lse, scratch});
  if (uint64_t(B) * H * T_ >= (uint64_t(1) << 31))
    throw ::ft::Error("attention_sm90_backward: B·H·T = " + std::to_string(uint64_t(B) * H * T_) +
                      " exceeds TMA's int32 coordinates (split the batch)");
  if (B == 0 || T_ == 0) return;
  auto* delta = static_cast<float*>(scratch);  // (B, H, T)
  attention_delta(delta, dout, out, B, T_, H, D, stream);
  if (D == 64)
    sm90_backward_launch<T, 64>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
  else
    sm90_backward_launch<T, 128>(dq, dk, dv, dout, lse, delta, q, k, v, seg, B, T_, H, K, stream);
}

template void attention_sm90_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                           const int32_t*, int, int, int, int, int, void*);
template void attention_sm90_forward<f16>(f16*, float*, const f16*, const f16*, const f16*,
                                          const int32_t*, int, int, int, int, int, void*);

template void attention_sm90_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*,
                                            const float*, const bf16*, const bf16*, const bf16*,
                                            const int32_t*, void*, int, int, int, int, int, void*);
template void attention_sm90_backward<f16>(f16*, f16*, f16*, const f16*, const f16*, const float*,
                                           const f16*, const f16*, const f16*, const int32_t*,
                                           void*, int, int, int, int, int, void*);

}  // namespace ft::kernels::cuda
