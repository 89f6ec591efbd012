#include "runtime/cuda/caching_allocator.h"

#include <cstdio>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace ft::cuda {
namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// "1.50 GiB" for messages; exact byte counts follow where they matter.
std::string human(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace

bool CachingAllocator::FreeOrder::operator()(const Block* a, const Block* b) const {
  // Streams compare as addresses; any fixed order works, it only groups a stream's blocks.
  auto key = [](const Block* x) {
    return std::make_tuple(reinterpret_cast<uintptr_t>(x->stream), x->size,
                           reinterpret_cast<uintptr_t>(x->ptr));
  };
  return key(a) < key(b);
}

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::string device_name)
    : raw_alloc_(std::move(raw_alloc)),
      raw_free_(std::move(raw_free)),
      device_name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Every block is either free (in a pool) or live; collect the segment heads of both.
  std::set<Block*> heads;
  auto head_of = [](Block* b) {
    while (b->prev) b = b->prev;
    return b;
  };
  for (Block* b : small_free_) heads.insert(head_of(b));
  for (Block* b : large_free_) heads.insert(head_of(b));
  for (auto& [p, b] : live_) heads.insert(head_of(b));
  for (Block* h : heads) {
    size_t seg = 0;
    for (Block* b = h; b; b = b->next) seg += b->size;
    char* base = h->ptr;
    for (Block* b = h; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    raw_free_(base, seg);
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  return bytes == 0 ? kRound : round_up(bytes, kRound);
}

size_t CachingAllocator::segment_size(size_t rounded) {
  return rounded <= kSmallLimit ? kSmallSegment : round_up(rounded, kLargeRound);
}

CachingAllocator::Block* CachingAllocator::find_free(FreeSet& pool, size_t size, void* stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = pool.lower_bound(&key);  // the smallest block of this stream that fits
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, bool small, void* stream,
                                                       size_t requested) {
  void* p = raw_alloc_(size);
  if (!p) {
    // Cached segments of other streams or of the other pool may be what fills the device.
    stats_.num_cache_flushes++;
    release_free_segments();
    p = raw_alloc_(size);
    if (!p) throw_oom(requested, size);
  }
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = size;
  b->stream = stream;
  b->small = small;
  stats_.reserved_bytes += size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  stats_.num_segments++;
  stats_.num_raw_allocs++;
  return b;
}

void* CachingAllocator::allocate(size_t bytes, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  // Beyond any device (and where rounding up would wrap around): out of memory as it is.
  if (bytes > (size_t(1) << 60)) throw_oom(bytes, bytes);
  const size_t size = round_size(bytes);
  const bool small = size <= kSmallLimit;
  FreeSet& pool = small ? small_free_ : large_free_;
  Block* b = find_free(pool, size, stream);
  if (!b) b = new_segment(segment_size(size), small, stream, bytes);

  // Split off the rest when it is worth keeping: any whole granule in the small pool; in the
  // large pool only a remainder that is itself a large request, so large segments are not
  // carved into slivers no large request can use.
  const size_t rest = b->size - size;
  if (small ? rest >= kRound : rest > kSmallLimit) {
    auto* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = stream;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
  }
  b->allocated = true;
  b->requested = bytes;
  live_.emplace(b->ptr, b);
  stats_.current_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.num_allocs++;
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    FT_FAIL("CUDA allocator on ", device_name_, ": free of ", ptr,
            ", which it did not allocate or which was already freed (a Buffer freed twice, or "
            "a pointer from another device)");
  Block* b = it->second;
  live_.erase(it);
  stats_.current_bytes -= b->requested;
  b->allocated = false;
  b->requested = 0;
  FreeSet& pool = b->small ? small_free_ : large_free_;
  // Coalesce with free neighbours; the lower block survives, so a segment's first Block
  // object stays its head for the segment's whole life.
  if (Block* n = b->next; n && !n->allocated) {
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (Block* p = b->prev; p && !p->allocated) {
    pool.erase(p);  // its key (size) changes
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  pool.insert(b);
}

void CachingAllocator::release_free_segments() {
  for (FreeSet* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {
        ++it;
        continue;
      }  // part of a segment still in use
      it = pool->erase(it);
      stats_.reserved_bytes -= b->size;
      stats_.num_segments--;
      raw_free_(b->ptr, b->size);
      delete b;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments();
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::throw_oom(size_t requested, size_t segment) const {
  throw Error(detail::concat(
      "out of memory on ", device_name_, ": asked for ", human(requested), " (", requested,
      " bytes; a new ", human(segment), " segment), with ", human(stats_.current_bytes),
      " in use by live buffers and ", human(stats_.reserved_bytes),
      " reserved by ft's allocator (cached segments were already returned to the driver and "
      "the allocation retried). Check the estimate with `ft plan <recipe>`, and try ZeRO "
      "(parallel.zero_stage: 1, 2 or 3 across more GPUs), activation checkpointing "
      "(training.activation_checkpointing: true) or a smaller training.micro_batch_size"));
}

}  // namespace ft::cuda
