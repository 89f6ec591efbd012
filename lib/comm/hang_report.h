// The collective watchdog's message (DESIGN.md §4, exit code 3): what the rank that timed out
// was waiting in, which ranks answered its status request and where they were, and which did
// not. Kept apart from the MPI code so that the wording is tested without a hung job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ft {

struct RankStatus {
  int rank = 0;           // world rank
  bool answered = false;  // answered the status request within the grace period
  int pid = 0;
  std::string host;
  // Where an answering rank was (empty: waiting in nothing, e.g. the reporting rank itself).
  int64_t step = 0;        // 1-based; 0: outside the step loop
  std::string phase;       // "forward/backward", "start-up", ...
  std::string waiting_in;  // "all_reduce_sum #41 on the data group (ranks 0,2)"
  double waited_s = 0;
};

// One paragraph naming the step, the collective and the ranks that did not answer, with what
// to do. `self` is the reporting rank; `ranks` holds every rank of the world but `self`.
std::string hang_message(const RankStatus& self, double timeout_s,
                         const std::vector<RankStatus>& ranks);
// The same for a rank that could not ask the others (`why`), e.g. NCCL's watchdog thread when
// the main thread does not come back from the device: names no rank but `self`.
std::string hang_message_unasked(const RankStatus& self, double timeout_s, const std::string& why);

}  // namespace ft
