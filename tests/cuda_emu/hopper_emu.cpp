// The CUDA emulation's Hopper instructions (a test tool; declarations in hopper_emu.h, the
// wrappers device code calls in kernels/cuda/hopper.cuh). Sources: NVIDIA PTX ISA 8.x,
// §9.7.13.15 mbarrier (contents, phases, expect-tx / complete-tx, arrive, try_wait), §9.7.9.25
// asynchronous copies and cp.async.bulk.tensor (loads and stores, bulk groups), §9.7.13.1 bar
// (named barriers), setmaxnreg, §9.7.15 wgmma (register fragments, shared memory
// layouts, matrix descriptors, fence / commit_group / wait_group); the CUDA driver API's
// cuTensorMapEncodeTiled (its documented argument rules).
//
// mbarrier: the object's state lives beside the emulator (per block, keyed by its shared
// offset): phase, pending and expected arrival counts, tx-count (PTX ISA §9.7.13.15.2). init
// writes a cookie into the object's 8 bytes; any later operation finding other bytes there
// reports a non-mbarrier access to an initialised object. A phase completes when the pending
// count and the tx-count are both zero (§9.7.13.15.6); the pending count is then reloaded.
// Reported: an object outside dynamic shared memory or not 8-byte aligned, use before init (or
// after inval), init of an initialised object, counts outside the ISA's ranges (expected
// 1..2^20-1, tx-count ±(2^20-1)), an arrival when none is pending (arrival count underflow), a
// tx-count below zero once every arrival is in (more bytes completed than expected: the phase
// can never complete), and, through the scheduler, waiting for a phase that cannot complete
// (deadlock, with each barrier's counts). The ISA lets the tx-count go negative while arrivals
// are pending (a copy may complete before its expect-tx), and so does the emulator.
//
// The proxies (PTX ISA §8 memory consistency model: proxies; §9.7.13.15.16 try_wait, acquire at
// CTA scope, which makes the writes of the copies completing the phase visible to the waiting
// thread; §9.7.12.4 fence.proxy; §9.7.15.5 wgmma.mma_async reads shared memory through the async
// proxy). TMA copies and wgmma's shared operands are the async proxy, a thread's loads and stores
// the generic proxy. (1) Each shared byte a TMA copy writes is marked with the mbarrier phase its
// copy completes on; each thread records the phases it observed complete (try_wait returning),
// and a __syncthreads gives every thread what any of them observed (bar.sync orders them). A
// wgmma reading a marked byte before every thread of its warpgroup observed the phase is
// reported (thread, shared offset, barrier): conservative, as each of the 128 threads issues
// the instruction; so is an ldmatrix lane reading a row it has not. (2) The emulator keeps
// shared memory as the async proxy sees it: its own TMA writes, and the generic proxy's as of
// the last fence.proxy.async.shared::cta; a wgmma reading a byte that differs (a thread's store
// with no fence since) is reported. Limits: plain C++ loads and stores of shared memory are not
// intercepted, so a plain load of TMA data without a wait goes unseen; a store is seen only if
// it changed the byte; a fence by any thread covers every store before it (the ISA: the fencing
// thread's own). mbarrier.arrive releases what the arriving thread observed, to the threads that
// observe that phase complete (the ISA's default .release / .acquire at CTA scope); a named
// barrier passes what its arrivals observed on to its bar.sync threads; __syncwarp passes nothing
// on, which can only report more.
#include "tests/cuda_emu/cuda_emu.h"

#include "core/error.h"
#include "core/half.h"
#include "tests/cuda_emu/emu_internal.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace ft::emu {
namespace {

using detail::fail;
using detail::note;
using detail::site;

constexpr int64_t kCountMax = (1 << 20) - 1;  // PTX ISA §9.7.13.15.2: every count's bound
constexpr uint32_t kNoBarrier = ~0u;

std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// ---- mbarrier ---------------------------------------------------------------------------------
struct Waiter {
  int thread;
  unsigned parity;
  std::source_location where;
};

// A cp.async.bulk.tensor in flight (TMA, below).
struct PendingCopy {
  uint32_t dst;
  TensorMap map;
  int coords[5];
  std::vector<unsigned char> image;  // as read at issue
  int thread;
  std::source_location where;
};

struct Barrier {
  uint64_t phase = 0;  // the current phase's number; its parity is phase & 1
  int64_t expected = 0, pending = 0, tx = 0;
  uint64_t cookie = 0;
  std::source_location init_where;
  std::vector<Waiter> waiters;
  std::vector<PendingCopy> copies;  // completing on this barrier
  // Phases observed complete (barrier offset -> count, as BlockState::observed) that the current
  // phase's arrivals release, and that every completed phase released (a waiter acquires them).
  std::map<uint32_t, uint64_t> releasing, released;
};

void merge_observed(std::map<uint32_t, uint64_t>& into, const std::map<uint32_t, uint64_t>& from) {
  for (const auto& [off, n] : from) into[off] = std::max(into[off], n);
}

// A shared byte a TMA copy wrote: the mbarrier (shared offset) and phase its copy completes on.
struct TmaMark {
  uint32_t bar = kNoBarrier;
  uint32_t phase = 0;
};

struct BlockState {
  std::map<uint32_t, Barrier> barriers;  // by shared offset
  uint64_t next_cookie = 0;
  int running = 0;  // threads of the block not finished
  // The proxies (top comment): shared memory as the async proxy sees it (the emulator's own
  // writes for TMA, and the generic proxy's up to the last fence.proxy.async), the TMA marks per
  // shared byte, and per thread the phases it has observed complete (by barrier offset: phases
  // 0 .. n - 1).
  std::vector<unsigned char> async_view;
  std::vector<TmaMark> tma;
  bool any_tma = false;  // tma holds a mark
  std::vector<std::map<uint32_t, uint64_t>> observed;
};
BlockState g_block;  // launches are serialised (cuda_emu.cpp), so one block at a time

std::string bar_name(uint32_t offset) {
  return "mbarrier at shared offset " + std::to_string(offset);
}

std::string counts(const Barrier& b) {
  return "phase " + std::to_string(b.phase) + ": " + std::to_string(b.pending) + " of " +
         std::to_string(b.expected) + " arrivals pending, tx-count " + std::to_string(b.tx);
}

// The shared offset of an mbarrier operand, checked to be in dynamic shared memory and aligned.
uint32_t bar_offset(const uint64_t* bar, const char* op, const std::source_location& where) {
  const auto* p = reinterpret_cast<const unsigned char*>(bar);
  const unsigned char* base = detail::shared_base();
  if (p < base || p + 8 > base + detail::shared_bytes())
    fail(std::string(op) + " (" + site(where) + "): the mbarrier " + ptr_str(bar) +
         " is not in the block's shared memory (" + std::to_string(detail::shared_bytes()) +
         " dynamic bytes; the emulator knows FT_DYNAMIC_SHARED only, not static __shared__)");
  if (reinterpret_cast<uintptr_t>(bar) % 8 != 0)
    fail(std::string(op) + " (" + site(where) + "): the mbarrier " + ptr_str(bar) +
         " is not 8-byte aligned");
  return uint32_t(p - base);
}

// The initialised barrier at bar, its cookie intact.
Barrier& live_barrier(const uint64_t* bar, const char* op, const std::source_location& where) {
  const uint32_t off = bar_offset(bar, op, where);
  auto it = g_block.barriers.find(off);
  if (it == g_block.barriers.end())
    fail(std::string(op) + " (" + site(where) + ") on the " + bar_name(off) +
         ", which is not initialised (mbarrier.init first, and a __syncthreads between it and "
         "the other threads' use; or it was invalidated)");
  Barrier& b = it->second;
  uint64_t now;
  std::memcpy(&now, bar, 8);
  if (now != b.cookie)
    fail(std::string(op) + " (" + site(where) + ") on the " + bar_name(off) +
         ": its 8 bytes were written by something other than an mbarrier instruction since "
         "mbarrier.init (" +
         site(b.init_where) + "), which the PTX ISA leaves undefined");
  return b;
}

// After any change of the counts: the phase completes when nothing is pending (§9.7.13.15.6).
// Returns "" or a report (the scheduler's stall hook cannot throw, so the caller reports).
std::string settle(Barrier& b, uint32_t off, const char* op, const std::source_location& where) {
  if (b.tx < -kCountMax || b.tx > kCountMax)
    return std::string(op) + " (" + site(where) + ") on the " + bar_name(off) + ": tx-count " +
           std::to_string(b.tx) + " is outside the PTX ISA's range ±(2^20 - 1)";
  if (b.pending == 0 && b.tx < 0)
    return std::string(op) + " (" + site(where) + ") on the " + bar_name(off) +
           ": tx-count went negative with every arrival in (" + counts(b) +
           "): more bytes completed than expect-tx announced, so the phase can never complete";
  if (b.pending != 0 || b.tx != 0) return "";
  merge_observed(b.released, b.releasing);
  b.releasing.clear();
  ++b.phase;
  b.pending = b.expected;
  std::vector<Waiter> waiters;
  waiters.swap(b.waiters);
  for (const Waiter& w : waiters) detail::wake(w.thread);
  return "";
}

void settle_or_fail(Barrier& b, uint32_t off, const char* op, const std::source_location& where) {
  if (const std::string e = settle(b, off, op, where); !e.empty()) fail(e);
}

}  // namespace

uint32_t shared_offset(const void* p, const char* what, const std::source_location& where) {
  const auto* c = static_cast<const unsigned char*>(p);
  const unsigned char* base = detail::shared_base();
  if (c < base || c > base + detail::shared_bytes())
    fail(std::string(what) + " (" + site(where) + "): " + ptr_str(p) +
         " is not in the block's shared memory (" + std::to_string(detail::shared_bytes()) +
         " dynamic bytes; the emulator knows FT_DYNAMIC_SHARED only, not static __shared__)");
  return uint32_t(c - base);
}

void mbarrier_init(uint64_t* bar, unsigned count, const std::source_location& where) {
  detail::current_thread("mbarrier.init");
  const uint32_t off = bar_offset(bar, "mbarrier.init", where);
  if (count < 1 || count > kCountMax)
    fail("mbarrier.init (" + site(where) + ") of the " + bar_name(off) + ": count " +
         std::to_string(count) + " is outside the PTX ISA's 1 .. 2^20 - 1");
  if (auto it = g_block.barriers.find(off); it != g_block.barriers.end())
    fail("mbarrier.init (" + site(where) + ") of the " + bar_name(off) +
         ", which is already initialised (at " + site(it->second.init_where) +
         "): mbarrier.inval it first (the PTX ISA leaves this undefined)");
  Barrier& b = g_block.barriers[off];
  for (auto& seen : g_block.observed) seen.erase(off);  // a barrier here before an inval
  b.expected = b.pending = count;
  b.init_where = where;
  b.cookie = 0x4d4241520000000ull ^ (++g_block.next_cookie << 20) ^ off;
  std::memcpy(bar, &b.cookie, 8);
}

void mbarrier_inval(uint64_t* bar, const std::source_location& where) {
  Barrier& b = live_barrier(bar, "mbarrier.inval", where);
  const uint32_t off = bar_offset(bar, "mbarrier.inval", where);
  if (!b.waiters.empty() || !b.copies.empty())
    fail("mbarrier.inval (" + site(where) + ") of the " + bar_name(off) + " while " +
         std::to_string(b.waiters.size()) + " thread(s) wait on it and " +
         std::to_string(b.copies.size()) + " copy(ies) complete on it");
  g_block.barriers.erase(off);
}

uint64_t mbarrier_arrive(uint64_t* bar, unsigned count, bool expect_tx, unsigned tx_bytes,
                         const std::source_location& where) {
  const char* op = expect_tx ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive";
  const int me = detail::current_thread(op);
  Barrier& b = live_barrier(bar, op, where);
  const uint32_t off = bar_offset(bar, op, where);
  const uint64_t state = b.phase;
  if (expect_tx) b.tx += int64_t(tx_bytes);
  if (count < 1 || int64_t(count) > b.pending)
    fail(std::string(op) + " (" + site(where) + ") on the " + bar_name(off) + ": arrival count " +
         "underflow, " + std::to_string(count) + " arrival(s) where " + counts(b) +
         " (more arrivals than mbarrier.init's count in one phase)");
  b.pending -= count;
  merge_observed(b.releasing, g_block.observed[size_t(me)]);  // arrive is a release (CTA scope)
  settle_or_fail(b, off, op, where);
  // A thread this arrival released (an mbarrier's waiter: a TMA producer refilling a stage) may
  // run before the arriving thread's next instruction, as on a GPU: a seeded preemption point.
  detail::atomic_point();
  return state;
}

void mbarrier_expect_tx(uint64_t* bar, unsigned tx_bytes, const std::source_location& where) {
  Barrier& b = live_barrier(bar, "mbarrier.expect_tx", where);
  b.tx += int64_t(tx_bytes);
  settle_or_fail(b, bar_offset(bar, "mbarrier.expect_tx", where), "mbarrier.expect_tx", where);
}

void mbarrier_complete_tx(uint64_t* bar, unsigned tx_bytes, const std::source_location& where) {
  Barrier& b = live_barrier(bar, "mbarrier.complete_tx", where);
  b.tx -= int64_t(tx_bytes);
  settle_or_fail(b, bar_offset(bar, "mbarrier.complete_tx", where), "mbarrier.complete_tx", where);
}

namespace {
std::string complete_copies(Barrier& b, uint32_t off);  // TMA, below
}  // namespace

bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity, const std::source_location& where) {
  const int me = detail::current_thread("mbarrier.try_wait.parity");
  const uint32_t off = bar_offset(bar, "mbarrier.try_wait.parity", where);
  if (parity > 1)
    fail("mbarrier.try_wait.parity (" + site(where) + "): parity " + std::to_string(parity) +
         " is not 0 or 1");
  Barrier* b = &live_barrier(bar, "mbarrier.try_wait.parity", where);
  // The copies a GPU would finish while the thread waits.
  if (const std::string e = complete_copies(*b, off); !e.empty()) fail(e);
  // The phase of that parity is complete when the current phase has the other parity
  // (§9.7.13.15.16: phaseParity names the current or the immediately preceding phase).
  while ((b->phase & 1u) == parity) {
    b->waiters.push_back(Waiter{me, parity, where});
    detail::suspend();
    b = &live_barrier(bar, "mbarrier.try_wait.parity", where);
  }
  // This thread has now observed phases 0 .. phase - 1 complete (try_wait's acquire), and what
  // the arrivals of those phases released.
  auto& observed = g_block.observed[size_t(me)];
  merge_observed(observed, b->released);
  observed[off] = std::max(observed[off], b->phase);
  return true;
}

// ---- TMA ----------------------------------------------------------------------------------------
// cp.async.bulk.tensor (PTX ISA §9.7.9.25.5), tile mode, global -> shared::cta, completing on an
// mbarrier with complete_tx of the box's bytes (out-of-bounds elements included). The box lands
// in shared memory row-major (dimension 0 fastest) from the destination, each 16-byte chunk's
// address swizzled: Swizzle<B,4,3> of the shared address, bits [4, 4 + B) ^= bits [7, 7 + B), B
// = 3, 2, 1 for 128, 64, 32 bytes (the pattern repeats every 1024, 512, 256 bytes: the PTX
// ISA's table of the wgmma descriptor's base offset; the driver API: "swizzle 16B chunks within
// a 128B span"). Elements outside the tensor are zeros (OOB_FILL_NONE). The emulator reads the
// source at issue and again at completion (a change between is reported: the ISA leaves it
// undefined), fills the destination with 0xff bytes at issue (a NaN in every float type), and
// writes the box at completion, which comes when a thread waits on the barrier or no thread can
// run: a read before the phase completes sees the fill.
namespace {

constexpr int kElemBytes[] = {2, 2, 4};            // TmaType: bf16, f16, f32
constexpr int kSwizzleBytes[] = {0, 32, 64, 128};  // TmaSwizzle

// Swizzle<B,4,3> of a shared address (see above); bytes 0: none.
uint32_t tma_swizzle_address(uint32_t a, int bytes) {
  const uint32_t mask = bytes == 128 ? 7u : bytes == 64 ? 3u : bytes == 32 ? 1u : 0u;
  return a ^ (((a >> 7) & mask) << 4);
}

uint64_t box_bytes(const TensorMap& m) {
  uint64_t n = uint64_t(kElemBytes[int(m.type)]);
  for (int d = 0; d < m.rank; ++d) n *= m.box[d];
  return n;
}

// The bytes the box at coords lands as, in shared memory order from dst (a shared address).
std::vector<unsigned char> box_image(const TensorMap& m, const int* coords, uint32_t dst) {
  const int es = kElemBytes[int(m.type)];
  const uint64_t n = box_bytes(m);
  std::vector<unsigned char> out(n);
  uint32_t idx[5] = {0, 0, 0, 0, 0};
  for (uint64_t e = 0; e * es < n; ++e) {
    bool inside = true;
    uint64_t src = 0;
    for (int d = 0; d < m.rank; ++d) {
      const int64_t g = int64_t(coords[d]) + idx[d];
      inside = inside && g >= 0 && uint64_t(g) < m.dims[d];
      src += uint64_t(g) * m.strides[d];
    }
    const uint32_t at =
        tma_swizzle_address(dst + uint32_t(e * es), kSwizzleBytes[int(m.swizzle)]) - dst;
    if (inside)
      std::memcpy(out.data() + at, m.base + src, size_t(es));
    else
      std::memset(out.data() + at, 0, size_t(es));
    for (int d = 0; d < m.rank && ++idx[d] == m.box[d]; ++d) idx[d] = 0;
  }
  return out;
}

}  // namespace

TensorMap encode_tensor_map(TmaType type, int rank, const void* base, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, TmaSwizzle swizzle) {
  const auto bad = [](const std::string& what) {
    throw ::ft::Error("cuTensorMapEncodeTiled (CUDA emulation): " + what);
  };
  if (rank < 1 || rank > 5) bad("rank " + std::to_string(rank) + " is not 1 to 5");
  if (!base || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    bad("the global address " + ptr_str(base) + " is not 16-byte aligned");
  TensorMap m;
  m.base = static_cast<const unsigned char*>(base);
  m.rank = rank;
  m.type = type;
  m.swizzle = swizzle;
  const int es = kElemBytes[int(type)];
  m.strides[0] = uint64_t(es);
  for (int d = 0; d < rank; ++d) {
    if (dims[d] < 1 || dims[d] > (1ull << 32))
      bad("globalDim[" + std::to_string(d) + "] " + std::to_string(dims[d]) + " is not 1 to 2^32");
    if (box[d] < 1 || box[d] > 256)
      bad("boxDim[" + std::to_string(d) + "] " + std::to_string(box[d]) + " is not 1 to 256");
    m.dims[d] = dims[d];
    m.box[d] = box[d];
    if (d > 0) {
      const uint64_t s = strides[d - 1];
      if (s % 16 != 0 || s >= (1ull << 40))
        bad("globalStrides[" + std::to_string(d - 1) + "] " + std::to_string(s) +
            " is not a multiple of 16 below 2^40");
      if (s < m.dims[d - 1] * m.strides[d - 1])
        bad("globalStrides[" + std::to_string(d - 1) + "] " + std::to_string(s) +
            " is less than the dimension below it spans (" +
            std::to_string(m.dims[d - 1] * m.strides[d - 1]) + " bytes)");
      m.strides[d] = s;
    }
  }
  const uint64_t inner = uint64_t(box[0]) * uint64_t(es);
  if (inner % 16 != 0)
    bad("boxDim[0] * element size = " + std::to_string(inner) + " bytes is not a multiple of 16");
  const int span = kSwizzleBytes[int(swizzle)];
  if (span > 0 && inner > uint64_t(span))
    bad("boxDim[0] * element size = " + std::to_string(inner) + " bytes exceeds the swizzle's " +
        std::to_string(span) + " bytes");
  // What the emulator models: a swizzled box's rows exactly one swizzle span long (the layout the
  // wgmma descriptors' canonical forms use). The driver also takes shorter rows.
  if (span > 0 && inner != uint64_t(span))
    bad("boxDim[0] * element size = " + std::to_string(inner) + " bytes: the emulator models " +
        "swizzled boxes whose rows are exactly the swizzle's " + std::to_string(span) + " bytes");
  m.magic = kTensorMapMagic;
  return m;
}

namespace {
std::string copy_name(int rank) {
  return "cp.async.bulk.tensor." + std::to_string(rank) +
         "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes";
}

// Performs the barrier's copies in flight: the box to shared memory, then complete_tx.
std::string complete_copies(Barrier& b, uint32_t off) {
  std::vector<PendingCopy> copies;
  copies.swap(b.copies);
  unsigned char* shared = detail::shared_base();
  for (const PendingCopy& c : copies) {
    if (box_image(c.map, c.coords, c.dst) != c.image)
      return copy_name(c.map.rank) + " (" + site(c.where) + "): its global source changed " +
             "before the copy completed, which the PTX ISA leaves undefined";
    std::memcpy(shared + c.dst, c.image.data(), c.image.size());
    std::memcpy(g_block.async_view.data() + c.dst, c.image.data(), c.image.size());
    std::fill_n(g_block.tma.begin() + c.dst, c.image.size(), TmaMark{off, uint32_t(b.phase)});
    b.tx -= int64_t(c.image.size());
    if (std::string e = settle(b, off, "the completion of a TMA copy", c.where); !e.empty())
      return e;
  }
  return "";
}
// The checks a TMA copy's operands share (`name` the instruction and call site, `what` the
// shared operand: "destination" or "source"): a tensor map of this rank made by
// encode_tensor_map, the box inside the block's shared memory at a 128-byte aligned offset
// (returned), the tensor inside GPU memory.
uint32_t tma_operands(const std::string& name, const TensorMap& map, int rank, const void* smem,
                      const char* what) {
  if (map.magic != kTensorMapMagic)
    fail(name + ": the tensor map was not made by encode_tensor_map (cuTensorMapEncodeTiled)");
  if (map.rank != rank)
    fail(name + ": the tensor map has " + std::to_string(map.rank) + " dimensions");
  const auto* p = static_cast<const unsigned char*>(smem);
  const unsigned char* base = detail::shared_base();
  const uint64_t bytes = box_bytes(map);
  if (p < base || p + bytes > base + detail::shared_bytes())
    fail(name + ": the " + what + " " + ptr_str(smem) + " + " + std::to_string(bytes) +
         " bytes is not in the block's shared memory (" + std::to_string(detail::shared_bytes()) +
         " dynamic bytes)");
  const auto at = uint32_t(p - base);
  if (at % 128 != 0)
    fail(name + ": the shared " + what + " (offset " + std::to_string(at) +
         ") is not 128-byte aligned");
  uint64_t last = uint64_t(kElemBytes[int(map.type)]);
  for (int d = 0; d < map.rank; ++d) last += (map.dims[d] - 1) * map.strides[d];
  if (!gpu_memory(map.base, last))
    fail(name + ": the tensor map's global memory [" + ptr_str(map.base) + ", +" +
         std::to_string(last) + ") is not inside a cudaMalloc or cudaMallocHost allocation");
  return at;
}
}  // namespace

void tma_load(void* smem, const TensorMap& map, int rank, const int* coords, uint64_t* bar,
              const std::source_location& where) {
  const int me = detail::current_thread("cp.async.bulk.tensor");
  const std::string name = copy_name(rank) + " (" + site(where) + ")";
  const uint32_t dst = tma_operands(name, map, rank, smem, "destination");
  unsigned char* base = detail::shared_base();
  const uint64_t bytes = box_bytes(map);
  Barrier& b = live_barrier(bar, name.c_str(), where);
  PendingCopy c{dst, map, {}, {}, me, where};
  std::memcpy(c.coords, coords, sizeof(int) * size_t(map.rank));
  c.image = box_image(map, c.coords, dst);
  std::memset(base + dst, 0xff, bytes);
  std::memset(g_block.async_view.data() + dst, 0xff, bytes);
  g_block.any_tma = true;
  std::fill_n(g_block.tma.begin() + dst, bytes,
              TmaMark{bar_offset(bar, name.c_str(), where), uint32_t(b.phase)});
  b.copies.push_back(std::move(c));
}

// ---- wgmma ------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16} (PTX ISA §9.7.15.5): a collective of the
// warpgroup's 128 threads (threads 128 g .. 128 g + 127 of the block), every one at the same call
// site with the same shape, type, descriptors and immediates (reported otherwise, and a thread of
// the warpgroup exiting while others wait is reported). The last thread to arrive computes D for
// all: D = A·B (+ D when accumulate), products exact in fp32 summed in k order 0..15 after D, as
// the emulated mma.sync (the ISA fixes no order: tests use tolerances). D's fragment
// (§9.7.15.5.1.1.1, Figure 149): thread t of the warpgroup, w = t / 32, lane l, g = l >> 2,
// q = l & 3, register i < N / 2 holds row 16 w + g + 8 ((i >> 1) & 1), column
// 8 (i >> 2) + 2 q + (i & 1); A from registers (Figure 148): register j holds row
// 16 w + g + 8 (j & 1), columns k = 2 q + 8 (j >> 1) (low half) and k + 1 (high half).
// Shared operands through matrix descriptors (§9.7.15.5.1.2.2: start, leading and stride byte
// offsets >> 4 in 14 bits each, base offset bits 49-51, swizzle bits 62-63: 0 none, 1 128B, 2 64B,
// 3 32B), 16-bit elements at byte offsets (the canonical layouts of §9.7.15.5.1.2.1.3, T = 8):
//   K-major, no swizzle:  (r % 8) 16 + (r / 8) SBO + (k % 8) 2 + (k / 8) LBO;
//   K-major, W-byte swizzle: (r % 8) W + (r / 8) SBO + 2 k;
//   MN-major, no swizzle: (r % 8) 2 + (r / 8) SBO + (k % 8) 16 + (k / 8) LBO;
//   MN-major, W-byte swizzle: (r % (W / 2)) 2 + (r / (W / 2)) LBO + (k % 8) W + (k / 8) SBO;
// r the M (A) or N (B) index, then the start address added and the swizzle (tma_swizzle) applied
// to the shared address. Asynchrony (§9.7.15.6-.9): the result is written to the threads'
// registers at the wgmma.wait_group that covers its commit_group; until then they hold a NaN
// (0x7fc0dead), so reading them early shows, and a register changed meanwhile is reported. A's
// registers (the .rs form) are read at issue: in C++ an array reused for the next fragment is a
// new value, which nvcc keeps apart (ptxas injects the fences). The shared operands are read at
// issue and again at completion (a change between is reported). A
// thread's first mma_async needs a wgmma.fence before it, and so does one whose accumulators the
// thread wrote after the emulator last wrote them (both reported). The proxy rules: the top
// comment. Not modelled: base offsets other than 0, sparse and other-typed variants.
namespace {

constexpr uint32_t kPendingBits = 0x7fc0deadu;  // the NaN in a pending wgmma's registers

struct WgmmaOp {  // one warpgroup instruction, shared by its 128 threads' pending entries
  std::vector<unsigned char> operands;  // the shared bytes it read, in read order
  std::vector<uint32_t> addresses;      // and their shared offsets
  std::source_location where;
};

struct PendingMma {
  float* d;
  int regs;
  std::vector<float> result;
  std::shared_ptr<WgmmaOp> op;
};

struct WgThread {
  bool fenced = false;  // a wgmma.fence since the last write of the emulator's into registers
  bool ever_fenced = false;
  std::vector<PendingMma> uncommitted;
  std::deque<std::vector<PendingMma>> groups;
  std::map<float*, std::vector<float>> written;  // what the last wait wrote, per accumulator
};

struct WgArrival {
  WgmmaType type;
  int n;
  float* d;
  uint64_t desc_a, desc_b;
  const uint32_t* a_regs;
  uint32_t a[4];
  bool trans_a, trans_b, accumulate;
  std::source_location where;
};

struct Warpgroup {
  std::vector<WgArrival> arrived;  // in arrival order
  std::vector<int> threads;
};

std::vector<WgThread> g_wg_threads;
std::map<int, Warpgroup> g_warpgroups;  // by warpgroup index, while threads wait there

std::string mma_name(WgmmaType type, int n) {
  const char* t = type == WgmmaType::kBf16 ? "bf16" : "f16";
  return std::string("wgmma.mma_async.sync.aligned.m64n") + std::to_string(n) + "k16.f32." + t +
         "." + t;
}

uint32_t bits(uint64_t v, int lo, int count) { return uint32_t(v >> lo) & ((1u << count) - 1u); }

// Element (r, k) of a descriptor's matrix (r the M or N index): its shared offset.
uint32_t element_offset(uint64_t desc, bool mn_major, int r, int k) {
  const uint32_t start = bits(desc, 0, 14) << 4, lbo = bits(desc, 16, 14) << 4,
                 sbo = bits(desc, 32, 14) << 4;
  const int swizzle = int(bits(desc, 62, 2));
  const uint32_t w = swizzle == 1 ? 128 : swizzle == 2 ? 64 : swizzle == 3 ? 32 : 0;
  uint32_t off;
  if (!mn_major && w == 0)
    off =
        uint32_t(r % 8) * 16 + uint32_t(r / 8) * sbo + uint32_t(k % 8) * 2 + uint32_t(k / 8) * lbo;
  else if (!mn_major)
    off = uint32_t(r % 8) * w + uint32_t(r / 8) * sbo + uint32_t(k) * 2;
  else if (w == 0)
    off =
        uint32_t(r % 8) * 2 + uint32_t(r / 8) * sbo + uint32_t(k % 8) * 16 + uint32_t(k / 8) * lbo;
  else
    off = uint32_t(r % int(w / 2)) * 2 + uint32_t(r / int(w / 2)) * lbo + uint32_t(k % 8) * w +
          uint32_t(k / 8) * sbo;
  return tma_swizzle_address(start + off, int(w));
}

float element(WgmmaType type, uint16_t bits16) {
  return type == WgmmaType::kBf16 ? to_f32(bf16{bits16}) : to_f32(f16{bits16});
}

}  // namespace

void wgmma_descriptor_error(uint32_t start, uint32_t lbo, uint32_t sbo,
                            const std::source_location& where) {
  fail("wgmma_descriptor (" + site(where) + "): start (shared offset " + std::to_string(start) +
       ") must be 16-byte aligned and the byte offsets (" + std::to_string(lbo) + ", " +
       std::to_string(sbo) + ") multiples of 16 below 2^18 (the descriptor keeps bits 4..17)");
}

void wgmma_fence(const std::source_location&) {
  WgThread& t = g_wg_threads[size_t(detail::current_thread("wgmma.fence"))];
  t.fenced = t.ever_fenced = true;
  t.written.clear();
}

void wgmma_commit_group(const std::source_location&) {
  WgThread& t = g_wg_threads[size_t(detail::current_thread("wgmma.commit_group"))];
  t.groups.push_back(std::move(t.uncommitted));
  t.uncommitted.clear();
}

void wgmma_wait_group(int n, const std::source_location& where) {
  // Other threads may run while the wgmmas finish (a seeded preemption point): what they write
  // meanwhile (a stage released too early and refilled) is seen by the operand check below.
  detail::atomic_point();
  WgThread& t = g_wg_threads[size_t(detail::current_thread("wgmma.wait_group"))];
  const unsigned char* shared = detail::shared_base();
  // Another pending wgmma on the same registers after entry `i` of the oldest group: then they
  // stay pending (the later one's result, chained on this one's, is what they will hold).
  const auto later_on = [&t](const float* d, size_t i) {
    for (size_t g = 0; g < t.groups.size(); ++g)
      for (size_t j = g == 0 ? i + 1 : 0; j < t.groups[g].size(); ++j)
        if (t.groups[g][j].d == d) return true;
    for (const PendingMma& p : t.uncommitted)
      if (p.d == d) return true;
    return false;
  };
  while (t.groups.size() > size_t(n)) {
    for (size_t e = 0; e < t.groups.front().size(); ++e) {
      PendingMma& p = t.groups.front()[e];
      for (size_t i = 0; i < p.op->addresses.size(); ++i)
        if (shared[p.op->addresses[i]] != p.op->operands[i])
          fail("wgmma.mma_async (" + site(p.op->where) + "): its shared memory operand (offset " +
               std::to_string(p.op->addresses[i]) + ") changed before wgmma.wait_group (" +
               site(where) + ") completed it, which the PTX ISA leaves undefined");
      for (int i = 0; i < p.regs; ++i) {
        uint32_t now;
        std::memcpy(&now, p.d + i, 4);
        if (now != kPendingBits)
          fail("wgmma.mma_async (" + site(p.op->where) + "): accumulator register " +
               std::to_string(i) + " was written before wgmma.wait_group (" + site(where) +
               ") completed the instruction");
      }
      if (later_on(p.d, e)) continue;
      std::memcpy(p.d, p.result.data(), sizeof(float) * size_t(p.regs));
      t.written[p.d] = p.result;
      t.fenced = false;
    }
    t.groups.pop_front();
  }
}

void wgmma_mma(WgmmaType type, int n, float* d, uint64_t desc_a, const uint32_t* a_regs,
               uint64_t desc_b, bool trans_a, bool trans_b, bool accumulate,
               const std::source_location& where) {
  const int me = detail::current_thread("wgmma.mma_async");
  const std::string name = mma_name(type, n) + " (" + site(where) + ")";
  const int threads = detail::block_threads(), group = me / 128;
  if (n < 8 || n > 256 || n % 8 != 0) fail(name + ": N must be a multiple of 8 in 8 .. 256");
  if (threads < 128 * (group + 1))
    fail(name + ": the block's threads " + std::to_string(128 * group) + ".." +
         std::to_string(threads - 1) + " do not make a warpgroup (128 threads, 4 warps)");
  WgThread& self = g_wg_threads[size_t(me)];
  if (!self.ever_fenced)
    fail(name +
         ": no wgmma.fence before the thread's first wgmma.mma_async (the PTX ISA "
         "requires one)");
  if (auto it = self.written.find(d); !self.fenced && it != self.written.end() &&
                                      std::memcmp(it->second.data(), d, 4 * size_t(n / 2)) != 0)
    fail(name +
         ": the thread wrote accumulator registers after wgmma.wait_group wrote them, "
         "without a wgmma.fence before this wgmma.mma_async");
  WgArrival a{type, n, d, desc_a, desc_b, a_regs, {}, trans_a, trans_b, accumulate, where};
  if (a_regs) std::memcpy(a.a, a_regs, sizeof a.a);
  Warpgroup& wg = g_warpgroups[group];
  if (!wg.arrived.empty()) {
    const WgArrival& f = wg.arrived.front();
    const bool same_site = f.where.line() == where.line() && f.where.column() == where.column() &&
                           std::strcmp(f.where.file_name(), where.file_name()) == 0;
    if (!same_site || f.type != type || f.n != n || (f.a_regs == nullptr) != (a_regs == nullptr) ||
        f.trans_a != trans_a || f.trans_b != trans_b || f.accumulate != accumulate)
      fail(name + ": thread " + std::to_string(wg.threads.front()) + " of the warpgroup is at " +
           mma_name(f.type, f.n) + " (" + site(f.where) +
           ") with other operands or qualifiers: every thread of the warpgroup must execute the "
           "same wgmma (.sync.aligned)");
    if (f.desc_a != desc_a || f.desc_b != desc_b)
      fail(name + ": its matrix descriptors differ from thread " +
           std::to_string(wg.threads.front()) + "'s: the warpgroup must give the same ones");
  }
  wg.arrived.push_back(a);
  wg.threads.push_back(me);
  if (wg.arrived.size() < 128) {
    detail::suspend();
    return;
  }
  // The last of the 128: compute and queue for everyone.
  const int regs = n / 2;
  auto op = std::make_shared<WgmmaOp>();
  op->where = where;
  const unsigned char* shared = detail::shared_base();
  const size_t shared_bytes = detail::shared_bytes();
  const int swz_a = int(bits(desc_a, 62, 2)), swz_b = int(bits(desc_b, 62, 2));
  if ((!a_regs && swz_a != 0 && bits(desc_a, 49, 3) != 0) ||
      (swz_b != 0 && bits(desc_b, 49, 3) != 0))
    fail(name +
         ": a descriptor's base offset is not 0 (the emulator models matrices whose "
         "swizzle pattern starts at its boundary only)");
  const auto read = [&](uint64_t desc, bool mn_major, int r, int k, const char* which) {
    const uint32_t at = element_offset(desc, mn_major, r, k);
    if (size_t(at) + 2 > shared_bytes)
      fail(name + ": matrix " + which + "'s element (" + std::to_string(r) + ", " +
           std::to_string(k) + ") lies at shared offset " + std::to_string(at) +
           ", outside the block's " + std::to_string(shared_bytes) +
           " bytes of dynamic shared memory (descriptor " + std::to_string(desc) + ")");
    uint16_t v;
    std::memcpy(&v, shared + at, 2);
    op->addresses.push_back(at);
    op->addresses.push_back(at + 1);
    op->operands.push_back(shared[at]);
    op->operands.push_back(shared[at + 1]);
    return element(type, v);
  };
  std::vector<float> A(64 * 16), B(16 * size_t(n));
  if (a_regs) {
    for (size_t i = 0; i < 128; ++i) {
      const WgArrival& x = wg.arrived[i];
      const int tw = wg.threads[i] % 128, w = tw / 32, l = tw % 32, g = l >> 2, q = l & 3;
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h)
          A[size_t(16 * w + g + 8 * (j & 1)) * 16 + size_t(2 * q + 8 * (j >> 1) + h)] =
              element(type, uint16_t(x.a[j] >> (16 * h)));
    }
  } else {
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) A[size_t(m) * 16 + size_t(k)] = read(desc_a, trans_a, m, k, "A");
  }
  for (int k = 0; k < 16; ++k)
    for (int c = 0; c < n; ++c)
      B[size_t(k) * size_t(n) + size_t(c)] = read(desc_b, trans_b, c, k, "B");
  for (size_t i = 0; i < 128; ++i) {
    const WgArrival& x = wg.arrived[i];
    WgThread& t = g_wg_threads[size_t(wg.threads[i])];
    const int tw = wg.threads[i] % 128, w = tw / 32, l = tw % 32, g = l >> 2, q = l & 3;
    // The accumulator's value at issue: a pending result on the same registers (the implicit
    // ordering of same-shape wgmmas on one accumulator), else the registers.
    const std::vector<float>* chained = nullptr;
    for (const auto& grp : t.groups)
      for (const PendingMma& p : grp)
        if (p.d == x.d) chained = &p.result;
    for (const PendingMma& p : t.uncommitted)
      if (p.d == x.d) chained = &p.result;
    PendingMma p{x.d, regs, std::vector<float>(size_t(regs)), op};
    for (int r = 0; r < regs; ++r) {
      const int row = 16 * w + g + 8 * ((r >> 1) & 1), col = 8 * (r >> 2) + 2 * q + (r & 1);
      float acc = accumulate ? (chained ? (*chained)[size_t(r)] : x.d[r]) : 0.0f;
      for (int k = 0; k < 16; ++k)
        acc += A[size_t(row) * 16 + size_t(k)] * B[size_t(k) * size_t(n) + size_t(col)];
      p.result[size_t(r)] = acc;
    }
    for (int r = 0; r < regs; ++r) std::memcpy(x.d + r, &kPendingBits, 4);
    t.uncommitted.push_back(std::move(p));
  }
  // The proxies: each byte read as the async proxy sees it (no generic store since the last
  // fence.proxy.async), and each TMA-written byte's phase observed by all 128 threads.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> phases;  // (barrier, phase) -> an offset
  for (const uint32_t at : op->addresses) {
    if (shared[at] != g_block.async_view[at])
      fail(name + ": its shared operand at offset " + std::to_string(at) +
           " was written by a thread's store (the generic proxy) with no "
           "fence.proxy.async.shared::cta since: the async proxy may not see the write "
           "(fence_proxy_async_shared() after the stores, then a barrier, before the wgmma)");
    if (const TmaMark m = g_block.tma[at]; m.bar != kNoBarrier)
      phases.emplace(std::pair{m.bar, m.phase}, at);
  }
  for (const auto& [bp, at] : phases)
    for (const int th : wg.threads) {
      const auto& seen = g_block.observed[size_t(th)];
      if (auto it = seen.find(bp.first); it == seen.end() || it->second <= bp.second)
        fail(name + ": thread " + std::to_string(th) + " has not observed the completion of " +
             "phase " + std::to_string(bp.second) + " of the " + bar_name(bp.first) +
             ", on which the TMA copy writing its shared operand at offset " + std::to_string(at) +
             " completes: each thread of the warpgroup waits on that phase (or passes a "
             "__syncthreads after a thread that did) before the wgmma");
    }
  const std::vector<int> waiting = wg.threads;
  g_warpgroups.erase(group);
  for (int th : waiting)
    if (th != me) detail::wake(th);
}

void fence_proxy_async(const std::source_location& where) {
  detail::current_thread("fence.proxy.async.shared::cta");
  // Every generic write so far, not only this thread's (a limit: see the top comment).
  const unsigned char* shared = detail::shared_base();
  for (size_t i = 0; i < g_block.async_view.size(); ++i)
    if (shared[i] != g_block.async_view[i]) {
      g_block.async_view[i] = shared[i];
      g_block.tma[i] = TmaMark{};
    }
}

// ---- TMA stores
// -----------------------------------------------------------------------------------
// cp.async.bulk.tensor (PTX ISA §9.7.9.25.5), tile mode, shared::cta -> global, completed through
// bulk async-groups (cp.async.bulk.commit_group, cp.async.bulk.wait_group{.read}, §9.7.9.25.6):
// the box is read from shared memory as tma_load lays it down (row-major from the source, each
// 16-byte chunk at its swizzled address) and written to the tensor's elements inside its bounds
// (elements outside are not written). The copy reads shared memory through the async proxy, so
// a thread's stores there need a fence.proxy.async.shared::cta before the copy is issued (and a
// barrier between the storing threads and the issuing one): a source byte that differs from the
// async proxy's view (top comment) is reported at issue, and so is a byte a TMA load wrote on a
// phase the issuing thread has not observed. The source is read at issue and checked again when
// a wait_group.read (or wait_group) covering its group returns: a change between is reported
// (the ISA leaves it undefined). Global memory is written when a wait_group without .read covers
// the group, or when the thread exits (the kernel's completion makes the writes visible to later
// work), so a read of the destination in the kernel before that sees the old bytes. A thread
// exiting with a store whose source reads it has not waited for is reported: the block's shared
// memory goes with its last thread, and every later use of the source must wait anyway.
namespace {

struct PendingStore {
  TensorMap map;
  int coords[5];
  uint32_t src;                      // shared offset
  std::vector<unsigned char> image;  // the source's bytes at issue, in shared order
  std::source_location where;
};
struct BulkGroup {
  std::vector<PendingStore> stores;
  bool read = false;  // a wait_group.read covered it: its source was read
};
struct BulkThread {
  std::vector<PendingStore> uncommitted;
  std::deque<BulkGroup> groups;  // oldest first
};
std::vector<BulkThread> g_bulk;  // per thread of the block

std::string store_name(int rank) {
  return "cp.async.bulk.tensor." + std::to_string(rank) + "d.global.shared::cta.tile.bulk_group";
}

// The store's bytes into the tensor, those of elements inside it.
void write_box(const PendingStore& c) {
  const TensorMap& m = c.map;
  const int es = kElemBytes[int(m.type)];
  const uint64_t n = box_bytes(m);
  auto* base = const_cast<unsigned char*>(m.base);
  uint32_t idx[5] = {0, 0, 0, 0, 0};
  for (uint64_t e = 0; e * es < n; ++e) {
    bool inside = true;
    uint64_t dst = 0;
    for (int d = 0; d < m.rank; ++d) {
      const int64_t g = int64_t(c.coords[d]) + idx[d];
      inside = inside && g >= 0 && uint64_t(g) < m.dims[d];
      dst += uint64_t(g) * m.strides[d];
    }
    const uint32_t at =
        tma_swizzle_address(c.src + uint32_t(e * es), kSwizzleBytes[int(m.swizzle)]) - c.src;
    if (inside) std::memcpy(base + dst, c.image.data() + at, size_t(es));
    for (int d = 0; d < m.rank && ++idx[d] == m.box[d]; ++d) idx[d] = 0;
  }
}

// The source of a store whose reads a wait covers: unchanged since issue, or the report.
void check_source(const PendingStore& c, const char* wait, const std::source_location& where) {
  const unsigned char* shared = detail::shared_base();
  for (size_t i = 0; i < c.image.size(); ++i)
    if (shared[c.src + i] != c.image[i])
      fail(store_name(c.map.rank) + " (" + site(c.where) + "): its shared source (offset " +
           std::to_string(c.src + i) + ") changed before " + wait + " (" + site(where) +
           ") covered the copy's reads, which the PTX ISA leaves undefined");
}

}  // namespace

void tma_store(const TensorMap& map, int rank, const int* coords, const void* smem,
               const std::source_location& where) {
  const int me = detail::current_thread("cp.async.bulk.tensor (store)");
  const std::string name = store_name(rank) + " (" + site(where) + ")";
  const uint32_t src = tma_operands(name, map, rank, smem, "source");
  const unsigned char* base = detail::shared_base();
  const uint64_t bytes = box_bytes(map);
  const unsigned char* p = base + src;
  for (uint32_t i = src; i < src + bytes; ++i)
    if (base[i] != g_block.async_view[i])
      fail(name + ": its shared source at offset " + std::to_string(i) +
           " was written by a thread's store (the generic proxy) with no "
           "fence.proxy.async.shared::cta since: the copy (the async proxy) may not see the "
           "write (fence_proxy_async_shared() after the stores, then a barrier with the issuing "
           "thread)");
  if (const std::string e = detail::hopper_generic_read(me, src, uint32_t(bytes)); !e.empty())
    fail(name + ": " + e);
  PendingStore c{map, {}, src, std::vector<unsigned char>(p, p + bytes), where};
  std::memcpy(c.coords, coords, sizeof(int) * size_t(rank));
  g_bulk[size_t(me)].uncommitted.push_back(std::move(c));
}

void bulk_commit_group(const std::source_location&) {
  BulkThread& t = g_bulk[size_t(detail::current_thread("cp.async.bulk.commit_group"))];
  t.groups.push_back(BulkGroup{std::move(t.uncommitted), false});
  t.uncommitted.clear();
}

void bulk_wait_group(int n, bool read, const std::source_location& where) {
  const char* op = read ? "cp.async.bulk.wait_group.read" : "cp.async.bulk.wait_group";
  BulkThread& t = g_bulk[size_t(detail::current_thread(op))];
  if (n < 0 || n > 7) fail(std::string(op) + " (" + site(where) + "): " + std::to_string(n));
  // Other threads may run while the copies are in flight (a seeded preemption point): a write
  // of the source meanwhile is what check_source reports.
  detail::atomic_point();
  const size_t covered = t.groups.size() > size_t(n) ? t.groups.size() - size_t(n) : 0;
  for (size_t g = 0; g < covered; ++g) {
    BulkGroup& grp = t.groups[g];
    if (!grp.read)
      for (const PendingStore& c : grp.stores) check_source(c, op, where);
    grp.read = true;
  }
  if (read) return;
  for (size_t g = 0; g < covered; ++g) {
    for (const PendingStore& c : t.groups.front().stores) write_box(c);
    t.groups.pop_front();
  }
}

// ---- named barriers ---------------------------------------------------------------------------
// bar.sync / bar.arrive a, b (PTX ISA §9.7.13.1; bar.sync is barrier.sync.aligned): barrier a of
// the block's 16 completes when b threads (a multiple of the warp size) have arrived; bar.sync
// waits for the completion, bar.arrive does not. Reported: an index outside 1..15 (0 is the one
// __syncthreads uses with every thread; the emulator keeps them apart), a count not a positive
// multiple of 32 or above the block's threads (rounded up to warps), arrivals of one use giving
// different counts, and through the scheduler a barrier that never completes (deadlock, with its
// count and arrivals). Memory: the arrivals release what their threads observed (mbarrier phases,
// the top comment) to the bar.sync threads of that use, as barrier's release/acquire semantics
// among the participating threads order their accesses. Arrivals are counted per thread, where the
// hardware counts whole warps (.aligned: every lane of a warp executes it): a use that completes
// with a warp some of whose live lanes did not arrive is reported (one that never completes is
// a deadlock).
namespace {

struct NamedBarrier {
  unsigned count = 0;  // of the use in progress (arrived > 0)
  unsigned arrived = 0;
  std::vector<int> waiters;
  int first = -1;
  std::source_location where;  // the first arrival's
  std::map<uint32_t, uint64_t> releasing;
  // Per warp: the lanes that arrived in this use, and the warp's live lanes as its first arrival
  // saw them (__activemask).
  std::map<int, std::pair<unsigned, unsigned>> lanes;
};
NamedBarrier g_named[16];

}  // namespace

void named_barrier(unsigned id, unsigned count, bool wait, const std::source_location& where) {
  const char* op = wait ? "bar.sync" : "bar.arrive";
  const int me = detail::current_thread(op);
  const std::string name = std::string(op) + " " + std::to_string(id) + ", " +
                           std::to_string(count) + " (" + site(where) + ")";
  if (id == 0 || id > 15)
    fail(name + ": barrier " + std::to_string(id) +
         " is not one of 1 .. 15 (0 is __syncthreads's, with every thread of the block; the "
         "emulator keeps named barriers apart from it)");
  const unsigned warps = unsigned(detail::block_threads() + 31) / 32;
  if (count == 0 || count % 32 != 0 || count > 32 * warps)
    fail(name +
         ": the thread count must be a multiple of the warp size (32), at most the "
         "block's " +
         std::to_string(32 * warps) + " threads in whole warps");
  NamedBarrier& b = g_named[id];
  if (b.arrived > 0 && b.count != count)
    fail(name + ": thread " + std::to_string(b.first) + " arrived at barrier " +
         std::to_string(id) + " for this use with a count of " + std::to_string(b.count) + " (" +
         site(b.where) + "): every arrival of one use must give the same count");
  if (b.arrived++ == 0) {
    b.count = count;
    b.first = me;
    b.where = where;
  }
  merge_observed(b.releasing, g_block.observed[size_t(me)]);
  if (wait) b.waiters.push_back(me);
  // The warp's live lanes as its first arrival of this use sees them: threads run one at a time
  // here, so by a later arrival lanes that arrived may have exited.
  b.lanes.try_emplace(me / 32, 0u, detail::active_mask()).first->second.first |= 1u << (me % 32);
  if (b.arrived == b.count) {
    for (const auto& [warp, m] : b.lanes)
      if (m.first != m.second) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "lanes 0x%08x of warp %d (live: 0x%08x)", m.first, warp,
                      m.second);
        fail(name + ": the use completed with " + buf +
             " only: every live lane of a warp executes bar.sync / bar.arrive (barrier.aligned; "
             "the hardware counts whole warps)");
      }
    std::vector<int> waiters;
    waiters.swap(b.waiters);
    const std::map<uint32_t, uint64_t> released = std::move(b.releasing);
    b = NamedBarrier{};
    for (const int w : waiters) {
      merge_observed(g_block.observed[size_t(w)], released);
      if (w != me) detail::wake(w);
    }
    detail::atomic_point();
    return;
  }
  if (wait)
    detail::suspend();
  else
    detail::atomic_point();
}

// ---- setmaxnreg -------------------------------------------------------------------------------
// setmaxnreg.{inc,dec}.sync.aligned.u32 n (PTX ISA, setmaxnreg): every warp of a warpgroup
// executes the same instruction; the warpgroup's per-thread register limit becomes n (24 .. 256,
// a multiple of 8): .dec gives the difference back to the block's pool, .inc takes it from the
// pool and waits until the pool has it. The pool is what a launch under
// __launch_bounds__(threads, 1) holds, which the kernel must be compiled with: every thread
// starts at the 65536 registers of an SM shared over the block's threads, rounded down to a
// multiple of 8, at most 256 (the emulation's assumption of the entry count; ptxas must reach
// the same, or .inc may wait for registers that are not there). Reported: a block that is not
// whole warpgroups, n out of range, warps of the warpgroup at different setmaxnreg instructions,
// .inc below or .dec above the current limit, and through the scheduler an .inc that can never
// be satisfied (deadlock, with the pool's count).
namespace {

struct RegArrival {
  bool inc;
  unsigned count;
  std::source_location where;
};
struct RegGroup {
  unsigned limit = 0;  // per thread
  std::vector<int> threads;
  std::vector<RegArrival> arrived;
  bool waiting = false;  // an .inc waiting for the pool
};
std::map<int, RegGroup> g_reg_groups;  // by warpgroup
int64_t g_reg_pool = 0;                // registers free in the block's pool

unsigned entry_registers(int threads) {
  const unsigned per = unsigned(65536 / std::max(threads, 1)) / 8 * 8;
  return std::min(per, 256u);
}

std::string reg_name(const RegArrival& a) {
  return std::string("setmaxnreg.") + (a.inc ? "inc" : "dec") + ".sync.aligned.u32 " +
         std::to_string(a.count);
}

// Satisfies the waiting .inc of each warpgroup the pool can now serve, in warpgroup order, and
// wakes its threads (but `self`, the running one).
void serve_reg_waiters(int self) {
  for (auto& [group, g] : g_reg_groups) {
    if (!g.waiting) continue;
    const int64_t need = (int64_t(g.arrived.front().count) - int64_t(g.limit)) * 128;
    if (need > g_reg_pool) continue;
    g_reg_pool -= need;
    g.limit = g.arrived.front().count;
    g.waiting = false;
    for (const int t : g.threads)
      if (t != self) detail::wake(t);
    g.threads.clear();
    g.arrived.clear();
  }
}

}  // namespace

void setmaxnreg(bool inc, unsigned count, const std::source_location& where) {
  const int me = detail::current_thread("setmaxnreg");
  const RegArrival a{inc, count, where};
  const std::string name = reg_name(a) + " (" + site(where) + ")";
  const int threads = detail::block_threads();
  if (threads % 128 != 0)
    fail(name + ": the block's " + std::to_string(threads) +
         " threads are not whole warpgroups (128 threads each)");
  if (count < 24 || count > 256 || count % 8 != 0)
    fail(name + ": the register count must be a multiple of 8 in 24 .. 256");
  const int group = me / 128;
  RegGroup& g = g_reg_groups[group];
  if (g.limit == 0) g.limit = entry_registers(threads);
  if (!g.arrived.empty()) {
    const RegArrival& f = g.arrived.front();
    if (f.inc != inc || f.count != count || f.where.line() != where.line() ||
        f.where.column() != where.column() ||
        std::strcmp(f.where.file_name(), where.file_name()) != 0)
      fail(name + ": thread " + std::to_string(g.threads.front()) + " of warpgroup " +
           std::to_string(group) + " is at " + reg_name(f) + " (" + site(f.where) +
           "): every warp of the warpgroup executes the same setmaxnreg (.sync.aligned)");
  }
  g.arrived.push_back(a);
  g.threads.push_back(me);
  if (g.arrived.size() < 128) {
    detail::suspend();
    return;
  }
  if (inc && count < g.limit)
    fail(name + ": .inc to fewer registers than the warpgroup's current " +
         std::to_string(g.limit) + " per thread");
  if (!inc && count > g.limit)
    fail(name + ": .dec to more registers than the warpgroup's current " + std::to_string(g.limit) +
         " per thread");
  if (!inc) {
    g_reg_pool += (int64_t(g.limit) - int64_t(count)) * 128;
    g.limit = count;
    for (const int t : g.threads)
      if (t != me) detail::wake(t);
    g.threads.clear();
    g.arrived.clear();
    serve_reg_waiters(me);
    return;
  }
  g.waiting = true;
  serve_reg_waiters(me);
  if (g.waiting) detail::suspend();  // the last of the 128 waits with the others
}

// ---- the scheduler's hooks (emu_internal.h) ----------------------------------------------------
namespace detail {

void hopper_block_start(int nthreads) {
  g_block = BlockState{};
  g_block.running = nthreads;
  g_block.async_view.assign(shared_base(), shared_base() + shared_bytes());
  g_block.tma.assign(shared_bytes(), TmaMark{});
  g_block.observed.assign(size_t(nthreads), {});
  g_wg_threads.assign(size_t(nthreads), WgThread{});
  g_warpgroups.clear();
  g_bulk.assign(size_t(nthreads), BulkThread{});
  for (NamedBarrier& b : g_named) b = NamedBarrier{};
  g_reg_groups.clear();
  g_reg_pool = 0;
}

std::string hopper_thread_exit(int linear) {
  const WgThread& t = g_wg_threads[size_t(linear)];
  size_t pending = t.uncommitted.size();
  for (const auto& g : t.groups) pending += g.size();
  if (pending > 0) {
    const PendingMma& p = t.uncommitted.empty() ? t.groups.front().front() : t.uncommitted.front();
    return "thread exited with " + std::to_string(pending) +
           " wgmma.mma_async never waited for (the first at " + site(p.op->where) +
           (t.uncommitted.empty() ? "" : ", not even committed") +
           "): wgmma.commit_group and wgmma.wait_group must complete it";
  }
  if (auto it = g_warpgroups.find(linear / 128); it != g_warpgroups.end())
    return "thread exited while " + std::to_string(it->second.arrived.size()) +
           " thread(s) of its warpgroup wait for it at " +
           mma_name(it->second.arrived.front().type, it->second.arrived.front().n) + " (" +
           site(it->second.arrived.front().where) +
           "): all 128 threads of a warpgroup execute every wgmma";
  if (auto it = g_reg_groups.find(linear / 128);
      it != g_reg_groups.end() && !it->second.arrived.empty() && !it->second.waiting)
    return "thread exited while " + std::to_string(it->second.arrived.size()) +
           " thread(s) of its warpgroup wait for it at " + reg_name(it->second.arrived.front()) +
           " (" + site(it->second.arrived.front().where) +
           "): every warp of a warpgroup executes every setmaxnreg";
  BulkThread& bulk = g_bulk[size_t(linear)];
  if (!bulk.uncommitted.empty())
    return "thread exited with " + std::to_string(bulk.uncommitted.size()) +
           " TMA store(s) never committed (the first at " + site(bulk.uncommitted.front().where) +
           "): cp.async.bulk.commit_group and cp.async.bulk.wait_group.read must complete them";
  for (const BulkGroup& g : bulk.groups)
    if (!g.read)
      return "thread exited with TMA store(s) whose reads of shared memory it never waited for "
             "(the first at " +
             site(g.stores.front().where) +
             "): cp.async.bulk.wait_group.read (the block's shared memory goes with its last "
             "thread)";
  for (const BulkGroup& g : bulk.groups)  // done reading: written by the kernel's completion
    for (const PendingStore& c : g.stores) write_box(c);
  bulk.groups.clear();
  if (--g_block.running > 0) return "";
  for (const auto& [off, b] : g_block.barriers)  // the block's last thread
    if (!b.copies.empty())
      return "the block finished with " + std::to_string(b.copies.size()) +
             " TMA copy(ies) into shared memory never waited for (the first issued at " +
             site(b.copies.front().where) + ", completing on the " + bar_name(off) + ")";
  return "";
}

std::string hopper_generic_read(int thread, uint32_t offset, uint32_t bytes) {
  if (!g_block.any_tma) return "";
  const auto& seen = g_block.observed[size_t(thread)];
  for (uint32_t i = offset; i < offset + bytes && i < g_block.tma.size(); ++i) {
    const TmaMark m = g_block.tma[i];
    if (m.bar == kNoBarrier) continue;
    if (auto it = seen.find(m.bar); it != seen.end() && it->second > m.phase) continue;
    return "thread " + std::to_string(thread) + " has not observed the completion of phase " +
           std::to_string(m.phase) + " of the " + bar_name(m.bar) +
           ", on which the TMA copy writing shared offset " + std::to_string(i) +
           " completes: a thread reads TMA data after it waited on that phase (or passed a "
           "__syncthreads after a thread that did)";
  }
  return "";
}

void hopper_barrier_sync() {
  if (g_block.barriers.empty()) return;  // no mbarrier, nothing observed (most kernels)
  std::map<uint32_t, uint64_t> all;
  for (const auto& seen : g_block.observed) merge_observed(all, seen);
  for (auto& seen : g_block.observed) seen = all;
}

bool hopper_stalled() {
  bool progressed = false;
  for (auto& [off, b] : g_block.barriers) {
    if (b.copies.empty()) continue;
    const int thread = b.copies.front().thread;
    if (const std::string e = complete_copies(b, off); !e.empty()) {
      note(thread, e);
      return true;  // the scheduler stops at the report
    }
    progressed = true;
  }
  return progressed;
}

std::string hopper_waiting() {
  std::ostringstream os;
  for (const auto& [off, b] : g_block.barriers) {
    if (b.waiters.empty()) continue;
    const Waiter& w = b.waiters.front();
    os << (os.tellp() > 0 ? "; " : "") << b.waiters.size() << " thread(s) (the first: " << w.thread
       << ") at mbarrier.try_wait.parity " << w.parity << " (" << site(w.where) << ") on the "
       << bar_name(off) << " (" << counts(b) << ")";
  }
  for (const auto& [group, wg] : g_warpgroups)
    os << (os.tellp() > 0 ? "; " : "") << wg.arrived.size() << " thread(s) of warpgroup " << group
       << " at " << mma_name(wg.arrived.front().type, wg.arrived.front().n) << " ("
       << site(wg.arrived.front().where) << ") waiting for the rest of its 128";
  for (unsigned id = 1; id < 16; ++id) {
    const NamedBarrier& b = g_named[id];
    if (b.waiters.empty()) continue;
    os << (os.tellp() > 0 ? "; " : "") << b.waiters.size()
       << " thread(s) (the first: " << b.waiters.front() << ") at bar.sync " << id << ", "
       << b.count << " (" << site(b.where) << "): " << b.arrived << " of " << b.count
       << " threads arrived";
  }
  for (const auto& [group, g] : g_reg_groups) {
    if (g.arrived.empty()) continue;
    os << (os.tellp() > 0 ? "; " : "") << "warpgroup " << group << " at "
       << reg_name(g.arrived.front()) << " (" << site(g.arrived.front().where) << "): ";
    if (g.waiting)
      os << "needs " << (int64_t(g.arrived.front().count) - int64_t(g.limit)) * 128
         << " registers, the block's pool has " << g_reg_pool << " (each thread started with "
         << entry_registers(int(g_bulk.size())) << ")";
    else
      os << g.arrived.size() << " of its 128 threads arrived";
  }
  return os.str();
}

}  // namespace detail
}  // namespace ft::emu
