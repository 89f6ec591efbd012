// A stream-ordered caching allocator: device memory is taken from the driver in segments
// (cudaMalloc is slow and synchronizes the device) and handed out as blocks that are reused,
// split and coalesced, never returned to the driver except by empty_cache().
//
// Pure logic over a raw allocate/free pair, so it is tested on the CPU with a test double
// (tests/unit/test_caching_allocator.cpp); the CUDA device (cuda_device.cpp) plugs in cudaMalloc
// and cudaFree.
//
// Invariants:
//   - Sizes are rounded up to kRound (512 B), so every block is 512-byte aligned within its
//     segment (segments from cudaMalloc are at least 256-aligned; Device promises 64).
//   - Requests up to kSmallLimit (1 MiB) come from the small pool: 2 MiB segments shared by
//     many blocks. Larger ones come from the large pool: segments of the request rounded up to
//     2 MiB. Keeping the pools apart stops small long-lived buffers from pinning large segments.
//   - A block belongs to the stream it was allocated on and is reused only by that stream:
//     work on one stream runs in order, so a block freed there may be handed out again at once
//     without waiting for the device (the stream-ordered contract; a buffer used on a second
//     stream must be kept alive by its owner until that stream is synchronized).
//   - Free neighbours in a segment are coalesced on free; a segment whose blocks are all free
//     is one free block and is what empty_cache() returns to the driver.
//   - When the raw allocation fails, the cache is emptied and the allocation retried once
//     before the out-of-memory error (ft::Error) is thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace ft::cuda {

struct CachingAllocatorStats {
  size_t current_bytes = 0;   // bytes asked for by live allocations (as the CPU device counts)
  size_t peak_bytes = 0;      // high-water mark of current_bytes
  size_t reserved_bytes = 0;  // bytes in segments held from the driver (in use or cached)
  size_t peak_reserved_bytes = 0;
  size_t num_allocs = 0;         // calls to allocate()
  size_t num_segments = 0;       // segments held now
  size_t num_raw_allocs = 0;     // segments ever taken from the driver
  size_t num_cache_flushes = 0;  // empty_cache() calls made to recover from a failed raw alloc
};

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallLimit = size_t(1) << 20;    // 1 MiB
  static constexpr size_t kSmallSegment = size_t(2) << 20;  // 2 MiB
  static constexpr size_t kLargeRound = size_t(2) << 20;    // 2 MiB

  // raw_alloc returns null when the device is out of memory (it must not throw for that);
  // raw_free gets back exactly the pointer and size raw_alloc gave. `device_name` names the
  // device in errors ("cuda:0 (NVIDIA H100)").
  using RawAlloc = std::function<void*(size_t bytes)>;
  using RawFree = std::function<void(void* ptr, size_t bytes)>;
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::string device_name);
  // Returns every segment to the driver; blocks still allocated are a leak of the caller and
  // their segments are freed too.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for work on `stream` (any value; null is the default stream).
  // Throws ft::Error when the device has no room even after empty_cache().
  void* allocate(size_t bytes, void* stream = nullptr);
  // Returns the block to its stream's cache. Throws ft::Error for a pointer it did not give.
  void deallocate(void* ptr);
  // Returns every fully free segment to the driver.
  void empty_cache();
  CachingAllocatorStats stats() const;

  // The size a request is rounded to, and the segment a request would get if none is cached.
  static size_t round_size(size_t bytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;       // rounded
    size_t requested = 0;  // what allocate() was asked for (0 while free)
    void* stream = nullptr;
    bool small = false;  // pool
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
  };
  // Free blocks ordered for best fit: by stream, then size, then address.
  struct FreeOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, FreeOrder>;

  Block* find_free(FreeSet& pool, size_t size, void* stream);
  Block* new_segment(size_t size, bool small, void* stream, size_t requested);
  void release_free_segments();  // callers hold mu_
  [[noreturn]] void throw_oom(size_t requested, size_t segment) const;

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::string device_name_;
  mutable std::mutex mu_;
  FreeSet small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;  // allocated blocks by pointer
  CachingAllocatorStats stats_;
};

}  // namespace ft::cuda
