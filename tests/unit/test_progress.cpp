// Progress of long work (core/progress.h): what a terminal and a log each get, read back from
// stderr redirected into a file.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "temp_dir.h"
#include "tests/unit/env_scope.h"

using namespace ft;
using ft::test::EnvScope;

namespace {

// Sets an environment variable for one scope, restoring what was there.
// stderr goes into a file for one scope; text() is what was written.
struct CaptureStderr {
  TempDir dir;
  int saved = -1;
  CaptureStderr() {
    std::fflush(stderr);
    saved = dup(STDERR_FILENO);
    const int fd = open(dir.file("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  std::string text() {
    std::fflush(stderr);
    std::ifstream f(dir.file("err"));
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  ~CaptureStderr() {
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
  }
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("progress: a log gets one plain line per stage, when it ends") {
  EnvScope plain("FT_PROGRESS", "plain");
  CaptureStderr err;
  {
    WorkProgress p("loading weights", 3e6, WorkProgress::Unit::kItems, "parameters");
    CHECK_FALSE(p.live());
    for (int i = 1; i <= 3; ++i) p.update(i * 1e6, "layers." + std::to_string(i));
    p.finish();
  }
  const std::string out = err.text();
  CHECK(count(out, "\n") == 1);
  CHECK(out.rfind("ft: loading weights: 3.00M/3.00M parameters in ", 0) == 0);
  CHECK(out.find("parameters/s)\n") != std::string::npos);
  CHECK(out.find('\r') == std::string::npos);
}

TEST_CASE("progress: a terminal gets a line rewritten in place, with percent, rate and ETA") {
  EnvScope bar("FT_PROGRESS", "bar");
  EnvScope every("FT_PROGRESS_EVERY_S", "0");  // every update is drawn
  CaptureStderr err;
  {
    WorkProgress p("export", 4096.0 * 1024, WorkProgress::Unit::kBytes);
    CHECK(p.live());
    usleep(2000);  // a rate to show
    p.update(1024.0 * 1024, "layers.0");
    p.update(2048.0 * 1024, "layers.1");
    p.finish();
  }
  const std::string out = err.text();
  CHECK(count(out, "\rft: export: 25% 1.0 MiB of 4.0 MiB, ") == 1);
  CHECK(count(out, "\rft: export: 50% 2.0 MiB of 4.0 MiB, ") == 1);
  CHECK(out.find(", ETA ") != std::string::npos);
  CHECK(out.find(", layers.1\033[K") != std::string::npos);
  // The final state stands on a line of its own.
  CHECK(count(out, "\n") == 1);
  CHECK(out.find("\rft: export: 2.0 MiB of 4.0 MiB in ") != std::string::npos);
  CHECK(out.back() == '\n');
}

TEST_CASE("progress: FT_PROGRESS_EVERY_S must be a number of seconds >= 0") {
  EnvScope bar("FT_PROGRESS", "bar");
  for (const char* bad : {"fast", "-1", "0.5s", "nan"}) {
    CAPTURE(bad);
    EnvScope every("FT_PROGRESS_EVERY_S", bad);
    CaptureStderr err;
    WorkProgress p("export", 10, WorkProgress::Unit::kItems);
    const std::string want =
        std::string("FT_PROGRESS_EVERY_S=") + bad + " is not a number of seconds >= 0";
    CHECK_THROWS_WITH_AS(p.update(1), doctest::Contains(want.c_str()), ft::Error);
    p.close();
  }
  for (const char* good : {"0", "0.25", "2"}) {
    EnvScope every("FT_PROGRESS_EVERY_S", good);
    CaptureStderr err;
    WorkProgress p("export", 10, WorkProgress::Unit::kItems);
    CHECK_NOTHROW(p.update(1));
    p.close();
  }
}

TEST_CASE("progress: close() removes the live line; a message clears it first") {
  EnvScope bar("FT_PROGRESS", "bar");
  EnvScope every("FT_PROGRESS_EVERY_S", "0");
  CaptureStderr err;
  {
    WorkProgress p("tokenize", 100, WorkProgress::Unit::kItems, "files");
    p.update(10);
    log_warn("a message in the middle");
    p.update(20);
    p.close();
  }
  const std::string out = err.text();
  // The message starts at the line's start, after the live line was erased.
  CHECK(out.find("\r\033[Kwarning: a message in the middle\n") != std::string::npos);
  CHECK(out.size() >= 4);
  CHECK(out.substr(out.size() - 4) == "\r\033[K");  // closed: nothing left on the line
}

TEST_CASE("progress: a stage cut short keeps its last state on a line of its own") {
  EnvScope bar("FT_PROGRESS", "bar");
  EnvScope every("FT_PROGRESS_EVERY_S", "0");
  CaptureStderr err;
  try {
    WorkProgress p("reading step_00000004", 10, WorkProgress::Unit::kItems, "groups");
    p.update(3);
    throw std::runtime_error("damaged");
  } catch (const std::runtime_error&) {
  }
  const std::string out = err.text();
  CHECK(out.back() == '\n');
  CHECK(count(out, "\rft: reading step_00000004: 30% 3/10 groups") == 2);  // drawn, then kept
}

TEST_CASE("progress: a disabled stage (not rank 0) prints nothing") {
  EnvScope bar("FT_PROGRESS", "bar");
  CaptureStderr err;
  {
    WorkProgress p("loading weights", 10, WorkProgress::Unit::kItems, "parameters", false);
    p.update(5);
    p.finish();
  }
  CHECK(err.text().empty());
}

TEST_CASE("progress: numbers for people") {
  CHECK(human_bytes(512) == "512 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(16.1 * 1024 * 1024 * 1024) == "16.1 GiB");
  CHECK(human_duration(42) == "0:42");
  CHECK(human_duration(3723) == "1:02:03");
  CHECK(human_duration(-1) == "?");
  CHECK(human_seconds(0.0154) == "0.015 s");
  CHECK(human_seconds(65) == "1 min 05 s");
  CHECK(human_count(950) == "950");
  CHECK(human_count(12345) == "12.3k");
  CHECK(human_count(4.56e6) == "4.56M");
  CHECK(human_count(1.234e9) == "1.23G");
}
