// core/system.h seconds_since_process_start: the clock behind time_to_first_step_s.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "core/system.h"

TEST_CASE("seconds_since_process_start counts from the process's start and moves with time") {
  const double a = ft::seconds_since_process_start();
  // This test runs inside a test binary that started a moment ago (the kernel's start time
  // has 10 ms ticks: a fresh process may read 0 but never less).
  CHECK(a >= 0);
  CHECK(a < 3600);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const double b = ft::seconds_since_process_start();
  // 120 ms later by the steady clock; the boot clock against the tick-rounded start agrees to
  // a tick or two.
  CHECK(b - a > 0.09);
  CHECK(b - a < 5);
}
