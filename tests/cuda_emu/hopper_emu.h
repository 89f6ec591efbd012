// The CUDA emulation's Hopper (sm_90) instructions, a TEST TOOL included by cuda_emu.h: the twins
// that kernels/cuda/hopper.cuh calls under FT_CUDA_EMU (device code calls the header's wrappers,
// not these). Sources: NVIDIA PTX ISA 8.x, §9.7.13.15 mbarrier, §9.7.9.25 asynchronous copies
// (cp.async.bulk.tensor), §9.7.15 wgmma; the CUDA driver API's cuTensorMapEncodeTiled. What is
// modelled and what is not: hopper_emu.cpp's top comment. `where` is the call site, for reports.
#pragma once

#include <cstdint>
#include <source_location>

namespace ft::emu {

// ---- mbarrier (shared memory, 8 bytes, 8-byte aligned, in the launch's dynamic shared memory)
void mbarrier_init(uint64_t* bar, unsigned count, const std::source_location& where);
void mbarrier_inval(uint64_t* bar, const std::source_location& where);
// expect-tx of tx_bytes (when expect_tx), then arrive-on with `count`; returns the phase before
// the arrival (the opaque state of mbarrier.arrive).
uint64_t mbarrier_arrive(uint64_t* bar, unsigned count, bool expect_tx, unsigned tx_bytes,
                         const std::source_location& where);
void mbarrier_expect_tx(uint64_t* bar, unsigned tx_bytes, const std::source_location& where);
void mbarrier_complete_tx(uint64_t* bar, unsigned tx_bytes, const std::source_location& where);
// mbarrier.try_wait.parity: suspends the thread until the phase of that parity is complete (a
// GPU may return false after a time limit; here it returns when the phase completes), so the
// wrapper's retry loop runs once. Waiting for a phase that never completes is a deadlock report.
bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity, const std::source_location& where);

// ---- TMA: tensor maps and cp.async.bulk.tensor (global -> shared, completing on an mbarrier)
enum class TmaType { kBf16, kF16, kF32 };
enum class TmaSwizzle { kNone, k32B, k64B, k128B };
// The emulator's tensor map, the stand-in for CUtensorMap (cuTensorMapEncodeTiled's result):
// tile mode, no interleave, element strides 1, out-of-bounds elements filled with zeros.
struct alignas(64) TensorMap {
  uint64_t magic = 0;  // kTensorMapMagic once encoded
  const unsigned char* base = nullptr;
  int rank = 0;
  TmaType type = TmaType::kBf16;
  TmaSwizzle swizzle = TmaSwizzle::kNone;
  uint64_t dims[5] = {};     // elements, innermost first
  uint64_t strides[5] = {};  // bytes; strides[0] is the element size
  uint32_t box[5] = {};      // elements
};
inline constexpr uint64_t kTensorMapMagic = 0x544d41505f454d55ull;
// Checks the arguments as cuTensorMapEncodeTiled documents them (throws ft::Error naming the
// broken rule). dims and box have `rank` entries, strides rank - 1 (bytes, of dimensions 1..).
TensorMap encode_tensor_map(TmaType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, TmaSwizzle swizzle);
// cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: the box
// at coords (rank of them, signed, innermost first) to smem, its bytes completing on bar.
void tma_load(void* smem, const TensorMap& map, int rank, const int* coords, uint64_t* bar,
              const std::source_location& where);

// cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group (a TMA store): the box at
// coords from smem (laid out as tma_load lands it) to the tensor, elements outside the tensor not
// written; it belongs to the issuing thread's bulk groups (below).
void tma_store(const TensorMap& map, int rank, const int* coords, const void* smem,
               const std::source_location& where);
// cp.async.bulk.commit_group: the thread's uncommitted bulk copies become one bulk group.
void bulk_commit_group(const std::source_location& where);
// cp.async.bulk.wait_group{.read} n: until at most n of the thread's newest bulk groups are
// pending: with read, their reads of shared memory are done (the source may be reused); without,
// their writes to global memory are done too.
void bulk_wait_group(int n, bool read, const std::source_location& where);

// ---- named barriers: bar.sync (wait) / bar.arrive (no wait) with a barrier index and a thread
// count (PTX ISA §9.7.13.1 bar / barrier)
void named_barrier(unsigned id, unsigned count, bool wait, const std::source_location& where);

// ---- setmaxnreg.{inc,dec}.sync.aligned.u32 count (PTX ISA: setmaxnreg): the warpgroup's
// per-thread register limit, moved to or from the block's pool
void setmaxnreg(bool inc, unsigned count, const std::source_location& where);

// ---- wgmma (warpgroup: 4 consecutive warps, the first a multiple of 4)
enum class WgmmaType { kBf16, kF16 };
// The shared address of p (its offset in the launch's dynamic shared memory, as the descriptor
// encodes it); reports a p outside it.
uint32_t shared_offset(const void* p, const char* what, const std::source_location& where);
// Reports a descriptor whose start is not 16-byte aligned or whose offsets do not encode.
[[noreturn]] void wgmma_descriptor_error(uint32_t start, uint32_t lbo, uint32_t sbo,
                                         const std::source_location& where);
// fence.proxy.async.shared::cta: the generic proxy's writes to shared memory so far become
// visible to the async proxy (wgmma's shared operands).
void fence_proxy_async(const std::source_location& where);
void wgmma_fence(const std::source_location& where);
void wgmma_commit_group(const std::source_location& where);
void wgmma_wait_group(int n, const std::source_location& where);
// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{type}.{type}: d (n / 2 floats) = A·B (+ d when
// accumulate). A from desc_a (a_regs null) or from a_regs (4 registers); B from desc_b.
void wgmma_mma(WgmmaType type, int n, float* d, uint64_t desc_a, const uint32_t* a_regs,
               uint64_t desc_b, bool trans_a, bool trans_b, bool accumulate,
               const std::source_location& where);

}  // namespace ft::emu
