// Logging to stderr. Messages from ranks other than 0 carry the rank prefix set by the comm
// layer, so a multi-rank failure names where it happened.
#pragma once

#include <string>

#include "core/error.h"

namespace ft {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void set_log_prefix(const std::string& prefix);  // e.g. "[rank 3 d1 p0 t1] "
void set_log_level(LogLevel level);
void log_message(LogLevel level, const std::string& msg);
// Why this rank is ending the job, for the `ft train --nproc` process that started it: one line
// appended to the file FT_JOB_CAUSE_FILE names (set by that process; nothing happens without
// it), with this rank's log prefix. The supervising ft restates the first such line as its last
// line once mpirun has ended, after mpirun's own banner and the other ranks' lines.
void note_job_cause(const std::string& line);
// A live progress line (core/progress.h) is open on stderr, without its newline: the next
// message first clears it, so that it does not run on after the line's text.
void note_live_line(bool open);
// Clears that line now (the next update draws it again): before printing on stdout, which the
// terminal would otherwise append to it.
void clear_live_line();

template <typename... Args>
void log_info(Args&&... args) {
  log_message(LogLevel::kInfo, detail::concat(args...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  log_message(LogLevel::kWarn, detail::concat(args...));
}
template <typename... Args>
void log_error(Args&&... args) {
  log_message(LogLevel::kError, detail::concat(args...));
}
template <typename... Args>
void log_debug(Args&&... args) {
  log_message(LogLevel::kDebug, detail::concat(args...));
}

}  // namespace ft
