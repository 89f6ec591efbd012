// The CUDA caching allocator (lib/runtime/cuda/caching_allocator.h) as pure logic: a test double
// stands in for cudaMalloc/cudaFree with a fixed capacity, records every segment and fills it
// with a byte pattern, so the tests see reuse, splits, coalescing, stats and the OOM path
// without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/caching_allocator.h"

using ft::cuda::CachingAllocator;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

// A "device" of `capacity` bytes: raw allocations beyond it fail (return null), as cudaMalloc
// does with cudaErrorMemoryAllocation.
struct FakeDevice {
  size_t capacity;
  size_t used = 0;
  size_t raw_allocs = 0, raw_frees = 0;
  std::map<char*, size_t> segments;

  explicit FakeDevice(size_t cap) : capacity(cap) {}
  ~FakeDevice() {
    for (auto& [p, n] : segments) std::free(p);
  }
  CachingAllocator make(const std::string& name = "fake:0") {
    return CachingAllocator(
        [this](size_t n) -> void* {
          if (used + n > capacity) return nullptr;
          auto* p = static_cast<char*>(std::aligned_alloc(512, n));
          segments[p] = n;
          used += n;
          raw_allocs++;
          return p;
        },
        [this](void* p, size_t n) {
          auto it = segments.find(static_cast<char*>(p));
          REQUIRE(it != segments.end());  // only what raw_alloc gave comes back
          REQUIRE(it->second == n);       // with the size it was given for
          std::free(p);
          segments.erase(it);
          used -= n;
          raw_frees++;
        },
        name);
  }
  // Whether [p, p + n) lies inside one segment.
  bool inside_one_segment(const void* p, size_t n) const {
    auto c = static_cast<const char*>(p);
    for (auto& [s, len] : segments)
      if (c >= s && c + n <= s + len) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("caching allocator: rounding and segment sizes") {
  CHECK(CachingAllocator::round_size(0) == 512);  // a zero-byte buffer still gets an address
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  // Up to 1 MiB: the small pool's 2 MiB segments; above: rounded up to 2 MiB.
  CHECK(CachingAllocator::segment_size(512) == 2 * kMiB);
  CHECK(CachingAllocator::segment_size(kMiB) == 2 * kMiB);
  CHECK(CachingAllocator::segment_size(kMiB + 512) == 2 * kMiB);
  CHECK(CachingAllocator::segment_size(2 * kMiB + 512) == 4 * kMiB);
  CHECK(CachingAllocator::segment_size(19 * kMiB + 111) == 20 * kMiB);
}

TEST_CASE("caching allocator: a freed block is reused, not taken from the driver again") {
  FakeDevice dev(64 * kMiB);
  {
    CachingAllocator a = dev.make();
    void* p = a.allocate(3 * kMiB + 19);
    CHECK(dev.raw_allocs == 1);
    CHECK(dev.inside_one_segment(p, 3 * kMiB + 19));
    std::memset(p, 0xab, 3 * kMiB + 19);  // the whole request is usable memory
    a.deallocate(p);
    CHECK(dev.raw_frees == 0);  // cached
    void* q = a.allocate(3 * kMiB);
    CHECK(q == p);
    CHECK(dev.raw_allocs == 1);
    a.deallocate(q);

    // Small requests share one 2 MiB segment.
    std::vector<void*> small;
    for (int i = 0; i < 111; ++i) small.push_back(a.allocate(size_t(i) * 97 + 1));
    CHECK(dev.raw_allocs == 2);
    for (size_t i = 0; i < small.size(); ++i) {
      CHECK(reinterpret_cast<uintptr_t>(small[i]) % 512 == 0);
      for (size_t j = 0; j < i; ++j) CHECK(small[i] != small[j]);
    }
    for (void* s : small) a.deallocate(s);
    CHECK(dev.raw_allocs == 2);
  }
  CHECK(dev.raw_frees == 2);  // the destructor returns every segment
  CHECK(dev.used == 0);
}

TEST_CASE("caching allocator: blocks are reused per stream") {
  FakeDevice dev(64 * kMiB);
  CachingAllocator a = dev.make();
  int s1 = 0, s2 = 0;  // any distinct addresses serve as stream handles
  void* p = a.allocate(4096, &s1);
  a.deallocate(p);
  // Another stream may still be reading the block as far as the device is concerned: it gets
  // memory of its own segment.
  void* q = a.allocate(4096, &s2);
  CHECK(q != p);
  CHECK(dev.raw_allocs == 2);
  void* r = a.allocate(4096, &s1);
  CHECK(r == p);  // same stream: reused at once (stream order)
  a.deallocate(q);
  a.deallocate(r);
}

TEST_CASE("caching allocator: split and coalesce") {
  FakeDevice dev(64 * kMiB);
  CachingAllocator a = dev.make();
  // Three small blocks carved from one segment, back to back.
  void* x = a.allocate(1000);
  void* y = a.allocate(1000);
  void* z = a.allocate(1000);
  CHECK(dev.raw_allocs == 1);
  CHECK(static_cast<char*>(y) == static_cast<char*>(x) + 1024);
  CHECK(static_cast<char*>(z) == static_cast<char*>(y) + 1024);
  // Freeing the middle one leaves a 1024-byte hole: a 1024 request fits it exactly (best fit),
  // a 2048 request does not.
  a.deallocate(y);
  void* w = a.allocate(2048);
  CHECK(w == static_cast<char*>(z) + 1024);
  void* v = a.allocate(1024);
  CHECK(v == y);
  // Free all: the neighbours coalesce back into one 2 MiB block, so a request for the whole
  // segment's worth of small memory is served from it without a second segment.
  a.deallocate(x);
  a.deallocate(v);
  a.deallocate(z);
  a.deallocate(w);
  void* whole = a.allocate(kMiB);
  CHECK(whole == x);
  void* rest = a.allocate(kMiB);
  CHECK(rest == static_cast<char*>(x) + kMiB);
  CHECK(dev.raw_allocs == 1);
  a.deallocate(whole);
  a.deallocate(rest);
  a.empty_cache();
  CHECK(dev.raw_frees == 1);  // coalesced into one free segment, returned whole

  // Large pool: a 6 MiB segment split into 3 MiB + the rest; the rest (3 MiB) serves the next
  // large request, and a remainder of only 1 MiB would not be split off.
  void* l1 = a.allocate(3 * kMiB);
  a.deallocate(l1);
  a.empty_cache();
  void* big = a.allocate(6 * kMiB);
  a.deallocate(big);
  void* l2 = a.allocate(3 * kMiB);
  void* l3 = a.allocate(3 * kMiB);
  CHECK(l2 == big);
  CHECK(l3 == static_cast<char*>(big) + 3 * kMiB);
  a.deallocate(l2);
  a.deallocate(l3);
  void* l4 = a.allocate(5 * kMiB);    // 1 MiB left: kept in the block, not split off
  void* l5 = a.allocate(kMiB + 512);  // cannot come from l4's segment
  CHECK(l4 == big);
  CHECK(!(l5 >= big && l5 < static_cast<void*>(static_cast<char*>(big) + 6 * kMiB)));
  a.deallocate(l4);
  a.deallocate(l5);
}

TEST_CASE("caching allocator: stats") {
  FakeDevice dev(64 * kMiB);
  CachingAllocator a = dev.make();
  auto s = a.stats();
  CHECK(s.current_bytes == 0);
  CHECK(s.reserved_bytes == 0);
  void* p = a.allocate(111);
  void* q = a.allocate(3 * kMiB + 1);
  s = a.stats();
  // current counts what was asked (as the CPU device does, so mem_peak_bytes compares across
  // backends); reserved counts segments.
  CHECK(s.current_bytes == 111 + 3 * kMiB + 1);
  CHECK(s.peak_bytes == 111 + 3 * kMiB + 1);
  CHECK(s.reserved_bytes == 2 * kMiB + 4 * kMiB);
  CHECK(s.num_segments == 2);
  CHECK(s.num_allocs == 2);
  a.deallocate(q);
  s = a.stats();
  CHECK(s.current_bytes == 111);
  CHECK(s.peak_bytes == 111 + 3 * kMiB + 1);
  CHECK(s.reserved_bytes == 6 * kMiB);  // cached, still reserved
  a.empty_cache();
  s = a.stats();
  CHECK(s.reserved_bytes == 2 * kMiB);  // the small segment is still in use by p
  CHECK(s.peak_reserved_bytes == 6 * kMiB);
  CHECK(s.num_segments == 1);
  a.deallocate(p);
  CHECK(a.stats().current_bytes == 0);
  CHECK(a.stats().num_allocs == 2);
  CHECK_THROWS_WITH_AS(a.deallocate(p), doctest::Contains("did not allocate"), ft::Error);
}

TEST_CASE("caching allocator: out of memory says what was asked, used and reserved") {
  FakeDevice dev(8 * kMiB);
  CachingAllocator a = dev.make("cuda:0 (Fake GPU)");
  void* p = a.allocate(5 * kMiB);
  std::string msg;
  try {
    a.allocate(3 * kMiB);  // needs a 4 MiB segment; 6 MiB of 8 are taken
  } catch (const ft::Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("out of memory on cuda:0 (Fake GPU)") != std::string::npos);
  CHECK(msg.find("asked for 3.00 MiB (3145728 bytes") != std::string::npos);
  CHECK(msg.find("5.00 MiB in use") != std::string::npos);
  CHECK(msg.find("6.00 MiB reserved") != std::string::npos);
  CHECK(msg.find("ft plan") != std::string::npos);
  CHECK(msg.find("zero_stage") != std::string::npos);
  CHECK(msg.find("activation_checkpointing") != std::string::npos);
  CHECK(msg.find("micro_batch_size") != std::string::npos);
  // A size whose rounding would wrap around is out of memory too, not a tiny block.
  CHECK_THROWS_WITH_AS(a.allocate(SIZE_MAX), doctest::Contains("out of memory"), ft::Error);
  // The failed requests left nothing behind.
  CHECK(a.stats().current_bytes == 5 * kMiB);
  CHECK(a.stats().num_segments == 1);
  a.deallocate(p);
}

TEST_CASE("caching allocator: a failed raw allocation empties the cache and retries") {
  FakeDevice dev(8 * kMiB);
  CachingAllocator a = dev.make();
  int s1 = 0, s2 = 0;
  // Stream 1 leaves 6 MiB cached; stream 2 cannot reuse it, and the device has only 2 MiB
  // left, so its 5 MiB request succeeds only after the cache is returned to the driver.
  void* p = a.allocate(6 * kMiB, &s1);
  a.deallocate(p);
  CHECK(a.stats().reserved_bytes == 6 * kMiB);
  void* q = a.allocate(5 * kMiB, &s2);
  CHECK(q != nullptr);
  CHECK(a.stats().num_cache_flushes == 1);
  CHECK(a.stats().reserved_bytes == 6 * kMiB);  // the old 6 MiB segment went, a new one came
  CHECK(dev.raw_frees == 1);
  a.deallocate(q);
}

TEST_CASE("caching allocator: fragmentation keeps every block inside its segment") {
  // Allocate many mixed sizes, free every other one, then allocate again: the holes are
  // reused where they fit, nothing overlaps, and after freeing everything the cache holds
  // only whole segments, all of which empty_cache() returns.
  FakeDevice dev(256 * kMiB);
  CachingAllocator a = dev.make();
  std::vector<std::pair<char*, size_t>> live;
  unsigned seed = 19;
  auto next = [&] {
    seed = seed * 1103515245u + 12345u;
    return (seed >> 8) % 111 + 1;
  };
  for (int i = 0; i < 300; ++i) {
    size_t n = (i % 7 == 0) ? next() * 37 * 1024 : next() * 257;  // small and large
    live.push_back({static_cast<char*>(a.allocate(n)), n});
  }
  std::vector<std::pair<char*, size_t>> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 2)
      a.deallocate(live[i].first);
    else
      kept.push_back(live[i]);
  }
  const size_t raw_before = dev.raw_allocs;
  for (int i = 0; i < 100; ++i) {
    size_t n = next() * 257;
    kept.push_back({static_cast<char*>(a.allocate(n)), n});
  }
  CHECK(dev.raw_allocs == raw_before);  // the small holes serve the small requests
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i < kept.size(); ++i) {
    CHECK(dev.inside_one_segment(kept[i].first, kept[i].second));
    if (i) CHECK(kept[i - 1].first + kept[i - 1].second <= kept[i].first);  // no overlap
  }
  for (auto& [p, n] : kept) a.deallocate(p);
  CHECK(a.stats().current_bytes == 0);
  a.empty_cache();
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(a.stats().num_segments == 0);
  CHECK(dev.used == 0);
}
