#include "comm/hang_report.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace ft {
namespace {

std::string where(int64_t step, const std::string& phase) {
  char buf[64];
  if (step > 0)
    std::snprintf(buf, sizeof buf, "step %lld (%s)", (long long)step, phase.c_str());
  else
    std::snprintf(buf, sizeof buf, "%s", phase.c_str());
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

std::string first_sentence(const RankStatus& self, double timeout_s) {
  return where(self.step, self.phase) + ": " + self.waiting_in + " made no progress for " +
         seconds(self.waited_s) + " on rank " + std::to_string(self.rank) + " (timeout " +
         seconds(timeout_s) + ")";
}

const char kHint[] =
    "raise runtime.collective_timeout_s if steps are legitimately this slow. Ending the job with "
    "exit code 3";

}  // namespace

std::string hang_message_unasked(const RankStatus& self, double timeout_s, const std::string& why) {
  return first_sentence(self, timeout_s) + "; " + why + "; " + kHint;
}

std::string hang_message(const RankStatus& self, double timeout_s,
                         const std::vector<RankStatus>& ranks) {
  std::string msg = first_sentence(self, timeout_s);
  std::vector<int> silent;
  std::string silent_detail;
  // Answering ranks grouped by where they wait, so that four ranks in one collective read as one.
  std::map<std::string, std::vector<int>> by_place;
  for (const RankStatus& r : ranks) {
    if (!r.answered) {
      silent.push_back(r.rank);
      if (!silent_detail.empty()) silent_detail += ", ";
      silent_detail +=
          "rank " + std::to_string(r.rank) + " pid " + std::to_string(r.pid) + " on " + r.host;
      continue;
    }
    const std::string place = r.waiting_in.empty()
                                  ? where(r.step, r.phase) + ", outside any collective"
                                  : where(r.step, r.phase) + " in " + r.waiting_in;
    by_place[place].push_back(r.rank);
  }
  if (silent.empty()) {
    msg += "; every rank answered";
  } else {
    msg += std::string("; ") + (silent.size() == 1 ? "rank " : "ranks ") + rank_list(silent) +
           " did not answer (" + silent_detail + ")";
  }
  for (const auto& [place, rs] : by_place)
    msg += std::string("; ") + (rs.size() == 1 ? "rank " : "ranks ") + rank_list(rs) +
           (rs.size() == 1 ? " is at " : " are at ") + place;
  msg += silent.empty()
             ? ". The ranks wait in collectives that do not match (a deadlock): report this as a "
               "bug, with the lines above"
             : ". A rank that does not answer is stopped (SIGSTOP, a debugger), busy outside any "
               "collective, deadlocked, or its node is unreachable";
  return msg + "; " + kHint;
}

}  // namespace ft
