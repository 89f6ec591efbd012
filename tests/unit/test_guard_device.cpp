// The guard device (runtime/guard_device.h, a test tool): its memory works through the Device's
// copies and ops, and a host access outside them kills the process. The negative control for
// tests/cli/test_guard_device.sh, which runs training under it.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "runtime/device.h"
#include "runtime/guard_device.h"

namespace {

// Runs f in a child process; returns its wait status.
template <typename F>
int in_child(F f) {
  const pid_t pid = fork();
  if (pid == 0) {
    f();
    _exit(7);  // f returned: the access was not stopped
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("guard device: copies and ops reach its memory") {
  auto dev = ft::make_guard_device();
  ft::Buffer<float> a(dev.get(), 1000), b(dev.get(), 1000);
  std::vector<float> x(1000), y(1000), got(1000);
  for (int i = 0; i < 1000; ++i) x[size_t(i)] = float(i), y[size_t(i)] = 0.5f * float(i);
  a.upload(x.data(), x.size());
  b.upload(y.data(), y.size());
  dev->ops().add(dev->stream(), a.data(), b.data(), 1000);
  a.download(got.data(), got.size());
  for (int i = 0; i < 1000; ++i) CHECK(got[size_t(i)] == 1.5f * float(i));
  ft::Buffer<float> c(dev.get(), 1000);
  dev->copy(dev->stream(), c.data(), a.data(), 1000 * sizeof(float));
  c.download(got.data(), 10);
  CHECK(got[9] == 13.5f);
  CHECK(dev->stats().current_bytes == 3 * 1000 * sizeof(float));
}

TEST_CASE("guard device: a host read or write of its memory kills the process") {
  auto dev = ft::make_guard_device();
  ft::Buffer<float> a(dev.get(), 16);
  a.zero();
  float* p = a.data();
  const int read = in_child([&] {
    volatile float v = p[3];
    (void)v;
  });
  const int write = in_child([&] { p[3] = 1.0f; });
  for (int status : {read, write}) {
    // SIGSEGV; under AddressSanitizer its handler reports the fault and aborts (or exits 1).
    CHECK_FALSE((WIFEXITED(status) && (WEXITSTATUS(status) == 7 || WEXITSTATUS(status) == 0)));
    if (WIFSIGNALED(status)) CHECK((WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGABRT));
  }
  // The parent still reads it the sanctioned way.
  float v = -1;
  a.download(&v, 1, 3);
  CHECK(v == 0.0f);
}
