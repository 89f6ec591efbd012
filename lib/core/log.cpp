#include "core/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ft {
namespace {
std::string g_prefix;
LogLevel g_level = [] {
  const char* e = std::getenv("FT_LOG_LEVEL");  // debug|info|warn|error
  if (!e) return LogLevel::kInfo;
  std::string s(e);
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}();
std::mutex g_mu;
bool g_live_line = false;
}  // namespace

void note_live_line(bool open) { g_live_line = open; }

void clear_live_line() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_live_line) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  g_live_line = false;
}

void set_log_prefix(const std::string& prefix) { g_prefix = prefix; }
void set_log_level(LogLevel level) { g_level = level; }

void log_message(LogLevel level, const std::string& msg) {
  if (level < g_level) return;
  const char* tag = level == LogLevel::kWarn    ? "warning: "
                    : level == LogLevel::kError ? "error: "
                                                : "";
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_live_line) {
    // The live progress line is redrawn by its next update, after this message.
    std::fputs("\r\033[K", stderr);
    g_live_line = false;
  }
  std::fprintf(stderr, "%s%s%s\n", g_prefix.c_str(), tag, msg.c_str());
  std::fflush(stderr);
}

void note_job_cause(const std::string& line) {
  const char* path = std::getenv("FT_JOB_CAUSE_FILE");
  if (!path || !*path) return;
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;
  std::string text = g_prefix + line;
  for (char& c : text)
    if (c == '\n') c = ' ';
  text += '\n';
  // One write with O_APPEND: lines of several ranks do not interleave.
  [[maybe_unused]] const ssize_t w = ::write(fd, text.data(), text.size());
  ::close(fd);
}

}  // namespace ft
