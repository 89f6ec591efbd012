// An environment variable set (or, given nullptr, unset) for a scope and restored after: for
// tests of knobs read from the environment (FT_PROGRESS, FT_CUDA_ATTENTION, ...).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace ft::test {

class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvScope() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace ft::test
