// ft plan's counting device (runtime/counting_device.h) and counting communicator
// (comm/counting_communicator.h): the tallies they keep, on hand-made sequences.
#include <doctest/doctest.h>

#include "comm/counting_communicator.h"
#include "core/error.h"
#include "runtime/counting_device.h"

using ft::Buffer;
using ft::CountingCommunicator;
using ft::CountingDevice;
using ft::MemoryCategory;
using ft::MemoryScope;

TEST_CASE("counting device: live bytes by category, the peak and the categories at it") {
  CountingDevice dev;
  CHECK_FALSE(dev.host_accessible());
  Buffer<float> params, acts, grads;
  {
    const MemoryScope tag(MemoryCategory::kParameters);
    params = Buffer<float>(&dev, 100);  // 400 B
  }
  {
    const MemoryScope tag(MemoryCategory::kActivations);
    acts = Buffer<float>(&dev, 50);  // 200 B
    {
      const MemoryScope inner(MemoryCategory::kGradients);  // the innermost scope wins
      grads = Buffer<float>(&dev, 25);                      // 100 B
    }
  }
  CHECK(dev.tally().total == 700);
  CHECK(dev.tally().peak == 700);
  CHECK(dev.tally().get(MemoryCategory::kParameters) == 400);
  CHECK(dev.tally().get(MemoryCategory::kActivations) == 200);
  CHECK(dev.tally().get(MemoryCategory::kGradients) == 100);
  CHECK(ft::current_memory_category() == MemoryCategory::kOther);  // scopes restore

  acts = Buffer<float>();  // freed: the peak and its breakdown stay
  CHECK(dev.tally().total == 500);
  CHECK(dev.tally().peak == 700);
  CHECK(dev.tally().get(MemoryCategory::kActivations) == 200);
  CHECK(dev.stats().peak_bytes == 700);

  dev.reset_peak();  // a new peak from what is live
  CHECK(dev.tally().peak == 500);
  CHECK(dev.tally().get(MemoryCategory::kActivations) == 0);
  Buffer<char> untagged(&dev, 10);
  CHECK(dev.tally().get(MemoryCategory::kOther) == 10);
  CHECK(dev.tally().peak == 510);
  CHECK(dev.tally().allocs == 4);

  // Distinct addresses, never backed; what the host reads back is 0.
  CHECK(params.data() != grads.data());
  double loss = 7;
  dev.copy_to_host(&loss, params.data(), sizeof loss);
  CHECK(loss == 0.0);
  CHECK_THROWS_AS(dev.free(reinterpret_cast<void*>(16), 4), ft::Error);
}

TEST_CASE("counting device: host memory, pinned and pageable, apart from the device's") {
  using ft::HostBuffer;
  using ft::HostMemory;
  CountingDevice dev;
  CHECK_FALSE(dev.host_memory_backed());
  Buffer<float> params;
  HostBuffer<float> staging, copy;
  {
    const MemoryScope tag(MemoryCategory::kParameters);
    params = Buffer<float>(&dev, 100);  // 400 B on the device
  }
  {
    const MemoryScope tag(MemoryCategory::kCheckpoint);
    staging = HostBuffer<float>(&dev, 50);                      // 200 B pinned
    copy = HostBuffer<float>(&dev, 25, HostMemory::kPageable);  // 100 B pageable
  }
  CHECK(dev.tally().total == 400);  // the device's tally sees none of it
  const auto& pinned = dev.host_tally(HostMemory::kPinned);
  const auto& pageable = dev.host_tally(HostMemory::kPageable);
  CHECK(pinned.total == 200);
  CHECK(pinned.get(MemoryCategory::kCheckpoint) == 200);
  CHECK(pageable.total == 100);
  CHECK(dev.host_tally().peak == 300);
  CHECK(dev.combined_peak() == 700);
  CHECK(dev.host_stats().pinned_bytes == 200);
  CHECK(dev.host_stats().pageable_peak_bytes == 100);
  // Addresses distinct from every other, never memory: a copy into them writes nothing (it
  // would fault), a copy into real host memory writes zeros.
  CHECK(static_cast<void*>(staging.data()) != static_cast<void*>(params.data()));
  CHECK(static_cast<void*>(staging.data()) != static_cast<void*>(copy.data()));
  dev.copy_to_host(staging.data() + 10, params.data(), 40 * sizeof(float));
  dev.copy_to_host_async(ft::Stream{}, copy.data(), params.data(), 25 * sizeof(float));
  float real[2] = {1, 1};
  dev.copy_to_host(real, params.data(), sizeof real);
  CHECK(real[1] == 0.0f);

  // The host tallies keep their peak through reset_peak (a plan's host figures span it all).
  copy = HostBuffer<float>();
  dev.reset_peak();
  CHECK(pageable.total == 0);
  CHECK(pageable.peak == 100);
  CHECK(dev.host_tally().peak == 300);
  CHECK(dev.host_stats().pageable_bytes == 0);
  // A host address freed as device memory, or as the other kind, is refused.
  CHECK_THROWS_AS(dev.free(staging.data(), 200), ft::Error);
  CHECK_THROWS_AS(dev.free_pageable(staging.data(), 200), ft::Error);
}

TEST_CASE("a device's host memory: alloc_host and alloc_pageable, now and at most") {
  const auto cpu = ft::make_cpu_device();
  CHECK(cpu->host_memory_backed());
  {
    ft::HostBuffer<char> a(cpu.get(), 1000);
    ft::HostBuffer<char> b(cpu.get(), 300, ft::HostMemory::kPageable);
    a.data()[999] = 1;  // real memory
    b.data()[299] = 1;
    CHECK(cpu->host_stats().pinned_bytes == 1000);
    CHECK(cpu->host_stats().pageable_bytes == 300);
  }
  ft::HostBuffer<char> c(cpu.get(), 200, ft::HostMemory::kPageable);
  const ft::HostMemoryStats s = cpu->host_stats();
  CHECK(s.pinned_bytes == 0);
  CHECK(s.pinned_peak_bytes == 1000);
  CHECK(s.pageable_bytes == 200);
  CHECK(s.pageable_peak_bytes == 300);
  CHECK(s.peak_bytes == 1300);
}

TEST_CASE("counting device for CUDA: the cuBLASLt workspace and the ops' scratch requests") {
  ft::CountingDevice dev(ft::CountingTarget{ft::DeviceKind::kCuda, 80});
  CHECK(dev.kind() == ft::DeviceKind::kCuda);
  // The workspace is allocated with the ops: 4 MiB before sm_90.
  CHECK(dev.tally().get(MemoryCategory::kScratch) == int64_t{4} << 20);
  // RMSNorm's backward asks for min(N, 512) partial rows of C floats: 3 × 8 × 4 = 96 B; a
  // smaller request reuses the buffer, a larger one grows it to max(asked, 2 × held).
  dev.ops().rmsnorm_backward(ft::Stream{}, ft::Ref(), nullptr, ft::CRef(), ft::CRef(), ft::CRef(),
                             nullptr, 3, 8, false);
  CHECK(dev.tally().total == (int64_t{4} << 20) + 96);
  dev.ops().sum_squares(ft::Stream{}, nullptr, nullptr, 100, 1.0);  // one block: 8 B
  CHECK(dev.tally().total == (int64_t{4} << 20) + 96);
  dev.ops().rmsnorm_backward(ft::Stream{}, ft::Ref(), nullptr, ft::CRef(), ft::CRef(), ft::CRef(),
                             nullptr, 4, 8, false);  // 128 B > 96: grows to 192
  CHECK(dev.tally().total == (int64_t{4} << 20) + 192);
  // bias_grad: one partial row of C floats per chunk of 32 rows: 40 rows, C = 64: 2 × 256 B.
  dev.ops().bias_grad(ft::Stream{}, nullptr, ft::CRef(), 40, 64);
  CHECK(dev.tally().total == (int64_t{4} << 20) + 512);
}

TEST_CASE("counting communicator: the bytes each collective sends") {
  CountingCommunicator c(4, 1, "data");
  float f[8] = {};
  c.all_reduce_sum(f, 8);  // 32 B: 2·3/4 · 32 = 48
  CHECK(c.sent_bytes(CountingCommunicator::kAllReduce) == 48);
  c.reduce_scatter(ft::Stream{}, f, f, 2);  // shard of 8 B: 3 · 8
  CHECK(c.sent_bytes(CountingCommunicator::kReduceScatter) == 24);
  uint16_t h[8] = {};
  c.all_gather(ft::Stream{}, ft::CRef(h, ft::DType::kBF16), ft::Ref(h, ft::DType::kBF16),
               2);  // 3 · 4 B
  CHECK(c.sent_bytes(CountingCommunicator::kAllGather) == 12);
  c.send(ft::Stream{}, ft::CRef(f), 8, 2, 0).wait();
  c.recv(ft::Stream{}, ft::Ref(f), 8, 0, 0).wait();  // receives send nothing
  CHECK(c.sent_bytes(CountingCommunicator::kSend) == 32);
  CHECK(c.sent_bytes() == 48 + 24 + 12 + 32);
  c.reset();
  CHECK(c.sent_bytes() == 0);
  CountingCommunicator one(1, 0, "tensor");
  one.all_reduce_sum(f, 8);
  CHECK(one.sent_bytes() == 0);  // a group of one sends nothing
  CHECK_THROWS_AS(c.split(0, 0), ft::Error);
}
