// Events on the CPU device (runtime/device.h): its work is done when a call returns, so an
// event is done at once, a stream's wait is nothing, and elapsed_ms is the host time between
// two records. The errors (an event without timing, one never recorded) are the CUDA device's
// too. Then the profile's event mode (runtime/profile.h, what the CUDA device uses) driven by
// the CPU's events: ops counted at resolve_events, not before. Times are never asserted beyond
// their sign (they depend on the machine's load).
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/device.h"
#include "runtime/profile.h"

namespace ft {
namespace {

TEST_CASE("events on the CPU: done at once, timed by the host clock, errors that say why") {
  std::unique_ptr<Device> dev = make_cpu_device();
  Event start = dev->make_event(/*timing=*/true), end = dev->make_event(/*timing=*/true);
  CHECK(start.valid());
  CHECK(start.query());  // never recorded: nothing to wait for
  start.synchronize();
  CHECK_THROWS_WITH_AS(elapsed_ms(start, end), doctest::Contains("never recorded"), Error);
  start.record(dev->stream());
  CHECK_THROWS_WITH_AS(elapsed_ms(start, end), doctest::Contains("end event was never"), Error);
  end.record(dev->stream());
  CHECK(end.query());
  end.synchronize();
  CHECK(elapsed_ms(start, end) >= 0.0f);

  Event plain = dev->make_event();  // without timing: fine to wait on, not to time
  plain.record(dev->stream());
  CHECK(plain.query());
  CHECK_THROWS_WITH_AS(elapsed_ms(start, plain), doctest::Contains("make_event(true)"), Error);

  // The staging path as a checkpoint save runs it: on the CPU one stream, copies at once.
  std::vector<float> src(19), dst(19, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.25f;
  Buffer<float> b(dev.get(), src.size());
  b.upload(src.data(), src.size());
  CHECK(dev->copy_stream().handle == dev->stream().handle);
  dev->wait(dev->copy_stream(), plain);
  dev->copy_to_host_async(dev->copy_stream(), dst.data(), b.data(), src.size() * sizeof(float));
  plain.record(dev->copy_stream());
  plain.synchronize();
  CHECK(std::memcmp(dst.data(), src.data(), src.size() * sizeof(float)) == 0);
  CHECK(dev->memory_info().total_bytes == 0);  // host memory: the trainer asks the system

  // Moves keep the one handle; an empty event is refused by name.
  Event moved = std::move(start);
  CHECK(moved.valid());
  CHECK_FALSE(start.valid());
  CHECK_THROWS_WITH_AS(start.record(dev->stream()), doctest::Contains("empty event"), Error);
  CHECK_THROWS_AS(dev->wait(dev->stream(), start), Error);
}

TEST_CASE("profile, event mode: ops are counted when their events are resolved") {
  std::unique_ptr<Device> dev = make_cpu_device();
  OpProfile p;
  p.event_device = dev.get();
  p.recording = true;
  for (int i = 0; i < 3; ++i) {
    ProfileScope t(&p, OpFamily::kAdd, dev->stream());
  }
  { ProfileScope t(&p, OpFamily::kScale, dev->stream()); }
  CHECK(p.count(OpFamily::kAdd) == 0);  // pending until the step ends
  p.resolve_events();
  CHECK(p.count(OpFamily::kAdd) == 3);
  CHECK(p.count(OpFamily::kScale) == 1);
  CHECK(p.seconds(OpFamily::kAdd) >= 0.0);
  // Events are reused: another step adds to the same totals.
  { ProfileScope t(&p, OpFamily::kAdd, dev->stream()); }
  p.resolve_events();
  CHECK(p.count(OpFamily::kAdd) == 4);
  p.recording = false;
  { ProfileScope t(&p, OpFamily::kAdd, dev->stream()); }
  p.resolve_events();
  CHECK(p.count(OpFamily::kAdd) == 4);
}

}  // namespace
}  // namespace ft
