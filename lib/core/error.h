// Errors: one exception type that carries a message already written for the user
// (what failed, where, and what to try). Code throws; apps/ft catches, prints, and maps to
// the exit codes of DESIGN.md §4.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ft {

// DESIGN.md §4. kHung: the collective watchdog ended the job (a rank made no progress).
enum class ExitCode : int { kOk = 0, kRuntime = 1, kUsage = 2, kHung = 3, kPreempted = 75 };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, ExitCode code = ExitCode::kRuntime)
      : std::runtime_error(msg), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// A usage or recipe error (exit code 2).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg, ExitCode::kUsage) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ft

// FT_CHECK(cond, parts...): an invariant of ft's own code, never a check of a user's input (that
// throws UsageError or Error with a message written for the user: what, where, what to do). A
// broken one is a bug: the message says "internal error", what to report, the streamed parts,
// and the source file and line (for the report; a user-reachable failure never shows them,
// ctest cli_test_error_messages).
#define FT_CHECK(cond, ...)                                                                     \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::ft::Error(::ft::detail::concat(                                                   \
          "internal error (a bug in ft: please report it with the command, its output and `ft " \
          "--version`): ",                                                                      \
          __VA_ARGS__, " [", __FILE_NAME__, ":", __LINE__, ", check `", #cond, "`]"));          \
  } while (0)

#define FT_FAIL(...) throw ::ft::Error(::ft::detail::concat(__VA_ARGS__))
