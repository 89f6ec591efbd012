#include "core/log.h"

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
}  // namespace

void set_log_prefix(const std::string& prefix) { g_prefix = prefix; }
void set_log_level(LogLevel level) { g_level = level; }

void log_message(LogLevel level, const std::string& msg) {
  if (level < g_level) return;
  const char* tag = level == LogLevel::kWarn    ? "warning: "
                    : level == LogLevel::kError ? "error: "
                                                : "";
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s%s%s\n", g_prefix.c_str(), tag, msg.c_str());
  std::fflush(stderr);
}

}  // namespace ft
