// The collective watchdog's message (lib/comm/hang_report.cpp): a person acts on the step, the
// collective and the silent ranks it names, so each is asserted as written. The live behaviour
// (a stopped rank, exit code 3) is tests/cli/test_hang.sh.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/hang_report.h"

using ft::RankStatus;

namespace {

RankStatus waiting(int rank, int64_t step, const char* phase, const char* in, double s) {
  RankStatus r;
  r.rank = rank;
  r.answered = true;
  r.pid = 100 + rank;
  r.host = "node1";
  r.step = step;
  r.phase = phase;
  r.waiting_in = in;
  r.waited_s = s;
  return r;
}

RankStatus silent(int rank, const char* host) {
  RankStatus r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.host = host;
  return r;
}

bool has(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return true;
  MESSAGE("missing '", part, "' in: ", s);
  return false;
}

}  // namespace

TEST_CASE("hang message: names the step, the collective and the one silent rank") {
  const RankStatus self = waiting(0, 12, "gradient reduction",
                                  "all_reduce_sum #41 on the data group (ranks 0,2)", 30.2);
  const std::string m = ft::hang_message(
      self, 30,
      {waiting(1, 12, "forward/backward", "all_reduce_sum #40 on the tensor group (ranks 0,1)", 29),
       silent(2, "node2"),
       waiting(3, 12, "forward/backward", "all_reduce_sum #40 on the tensor group (ranks 2,3)",
               29)});
  CHECK(m.rfind("step 12 (gradient reduction): all_reduce_sum #41 on the data group "
                "(ranks 0,2) made no progress for 30 s on rank 0 (timeout 30 s)",
                0) == 0);
  CHECK(has(m, "; rank 2 did not answer (rank 2 pid 102 on node2)"));
  // Ranks 1 and 3 wait in different groups: two entries, not one.
  CHECK(has(m,
            "rank 1 is at step 12 (forward/backward) in all_reduce_sum #40 on the tensor "
            "group (ranks 0,1)"));
  CHECK(has(m,
            "rank 3 is at step 12 (forward/backward) in all_reduce_sum #40 on the tensor "
            "group (ranks 2,3)"));
  CHECK(has(m, "raise runtime.collective_timeout_s"));
  CHECK(has(m, "exit code 3"));
  CHECK(m.find("every rank answered") == std::string::npos);
}

TEST_CASE("hang message: ranks in the same place are one entry; several silent ranks listed") {
  const char* in = "all_reduce_max #7 on the world";
  const std::string m =
      ft::hang_message(waiting(1, 3, "stop and checkpoint flags", in, 5.04), 5,
                       {waiting(0, 3, "stop and checkpoint flags", in, 4.9), silent(2, "a"),
                        silent(5, "b"), waiting(3, 3, "stop and checkpoint flags", in, 4.8),
                        waiting(4, 3, "stop and checkpoint flags", in, 4.7)});
  CHECK(has(m, "made no progress for 5.0 s on rank 1 (timeout 5.0 s)"));
  CHECK(has(m, "ranks 2,5 did not answer (rank 2 pid 102 on a, rank 5 pid 105 on b)"));
  CHECK(has(m,
            "ranks 0,3,4 are at step 3 (stop and checkpoint flags) in all_reduce_max #7 on "
            "the world"));
}

TEST_CASE("hang message: every rank answered reads as a deadlock; outside the step loop") {
  const std::string m =
      ft::hang_message(waiting(0, 0, "start-up", "barrier #3 on the world", 3700), 3600,
                       {waiting(1, 0, "start-up", "broadcast #4 on the world", 3700),
                        waiting(2, 5, "reading the batch", "", 0)});
  CHECK(m.rfind("start-up: barrier #3 on the world made no progress for 3700 s", 0) == 0);
  CHECK(has(m, "every rank answered"));
  CHECK(has(m, "rank 1 is at start-up in broadcast #4 on the world"));
  CHECK(has(m, "rank 2 is at step 5 (reading the batch), outside any collective"));
  CHECK(has(m, "do not match (a deadlock)"));
}

TEST_CASE("collective watch: the step and phase a rank reports, and the one-process world") {
  ft::set_watch_step(7, "evaluation", true);
  CHECK(ft::watch_step().step == 7);
  CHECK(std::string(ft::watch_step().phase) == "evaluation");
  CHECK(ft::watch_step().long_wait);
  ft::set_watch_step(0, "start-up");
  CHECK_FALSE(ft::watch_step().long_wait);
  // The one-process communicator never waits: a timeout of a microsecond changes nothing.
  const ft::CollectiveWatch saved = ft::collective_watch();
  ft::set_collective_watch({1e-6, 1e-6});
  auto one = ft::make_single_process_communicator();
  float x[3] = {1, 2, 3};
  one->all_reduce_sum(x, 3);
  one->barrier();
  CHECK(x[2] == 3);
  ft::set_collective_watch(saved);
}

TEST_CASE("hang message of a rank that could not ask the others: names only itself, and why") {
  RankStatus self = waiting(3, 7, "forward/backward",
                            "all_reduce_sum #9 on the tensor group (ranks 2,3) through NCCL", 5.04);
  const std::string m = ft::hang_message_unasked(self, 5, "the main thread did not come back");
  CHECK(m ==
        "step 7 (forward/backward): all_reduce_sum #9 on the tensor group (ranks 2,3) through "
        "NCCL made no progress for 5.0 s on rank 3 (timeout 5.0 s); the main thread did not come "
        "back; raise runtime.collective_timeout_s if steps are legitimately this slow. Ending the "
        "job with exit code 3");
}
