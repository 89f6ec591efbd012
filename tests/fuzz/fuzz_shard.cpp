// libFuzzer harness for the shard reader (not part of the default build).
//
// What runs in this process on a shard's bytes is the parent's side of lib/data's shard check: it
// parses the check child's report and reads windows with pread at the reported offsets. libhdf5
// runs only in the child, where a crash or a hang is contained by design and becomes an error.
// Two modes, chosen by FT_FUZZ_SHARD_MODE:
//
//   report (default, fast)  input = REPORT '\0' FILE: the report as the child would send it and
//     the bytes of the file it describes. parse_shard_report must accept it or throw ft::Error;
//     when it accepts, every window of the shard reads or throws ft::Error. Datasets that only
//     libhdf5 can decode ("library" layout) are skipped: the parent opens those with libhdf5
//     only after the child has read them in full, which this mode cannot vouch for.
//   full (slow: one child process per input)  input = FILE: check_shards on it (libhdf5 in the
//     child), then every window through ShardSet. At exit it prints how many inputs were read
//     fully, and how many crashed libhdf5 in the child, made a sanitizer report there or ran
//     out of time, each of which must have been a clean ft::Error.
//
// Contract: any input gives a result or an ft::Error; a crash, a sanitizer report or another
// exception type is a bug. Each input is written over one temporary file ($TMPDIR, else /tmp;
// removed at exit, left behind when a finding ends the run), which the check child and ShardSet
// open by its path. Not a memfd opened through /proc/self/fd/N: libhdf5 (1.10) resolves a symbolic
// link with realpath() before it opens a file, and that link names "/memfd:... (deleted)", so every
// shard, the seeds too, was refused as "cannot open as HDF5" and full mode exercised nothing past
// that error. scripts/fuzz.sh runs full mode as the target shard_full and fails it when no input
// was read fully.
//
// Build and run (clang, from the repository root):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib \
//     -I/usr/include/hdf5/serial tests/fuzz/fuzz_shard.cpp lib/data/shard*.cpp \
//     -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -o /tmp/fuzz_shard
//   /tmp/fuzz_shard -max_total_time=300 /tmp/shard_corpus tests/fuzz/corpus/shard/report
//   FT_FUZZ_SHARD_MODE=full /tmp/fuzz_shard -max_total_time=300 /tmp/full \
//     tests/fuzz/corpus/shard/full
// The seeds are tiny shards written by the unit tests' writer and by h5py (contiguous, chunked,
// gzip); report seeds are `ft __ft_shard_check__ $$ FILE` output (from a shell: $$ is ft's
// parent), a NUL, then FILE.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/shard.h"

namespace {

bool full_mode = false;
constexpr int kSanitizerExit = 86;  // the check child's exit status after a sanitizer report
std::string input_path;             // the temporary file each input is written over
int input_fd = -1;
long inputs = 0, rejected = 0, accepted = 0, hdf5_crashes = 0, hdf5_timeouts = 0, child_reports = 0;

void print_stats() {
  std::fprintf(stderr,
               "fuzz_shard (%s): %ld inputs, %ld read fully, %ld rejected with ft::Error, of "
               "which %ld crashed libhdf5 in the child, %ld made a sanitizer report there and "
               "%ld ran out of time\n",
               full_mode ? "full" : "report", inputs, accepted, rejected, hdf5_crashes,
               child_reports, hdf5_timeouts);
}

// Reads the whole shard through the set in windows of several sizes, as the loader would.
void read_everything(ft::ShardSet& set) {
  for (size_t s = 0; s < set.shards().size(); ++s) {
    const uint64_t n = set.shards()[s].num_tokens;
    // Bounded: a report may claim many tokens in a small file only for chunks it has.
    const uint64_t limit = std::min<uint64_t>(n, 1 << 16);
    std::vector<int32_t> tokens(std::max<uint64_t>(limit, 1));
    std::vector<uint8_t> mask(tokens.size());
    for (uint64_t window : {uint64_t(1), uint64_t(7), uint64_t(64), limit}) {
      if (window == 0) continue;
      for (uint64_t start = 0; start + window <= limit; start += std::max<uint64_t>(window, 61))
        set.read(s, start, window, tokens.data(), mask.data());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  ft::run_shard_check_if_child(*argc, *argv);  // full mode's check child (data/shard.h)
  const char* mode = std::getenv("FT_FUZZ_SHARD_MODE");
  full_mode = mode && std::strcmp(mode, "full") == 0;
  // A spinning libhdf5 costs this much per input; the limit itself is what is under test.
  setenv("FT_SHARD_CHECK_TIMEOUT_S", "2", 0);
  // The check child is this program, under AddressSanitizer too, whose handler would turn
  // libhdf5's SIGSEGV into a report and exit status 1 ("the shard check process failed"), not
  // the signal ft's own child dies of. So the child leaves SIGSEGV, SIGBUS and SIGFPE alone
  // (they kill it, as in ft), a huge allocation returns null (as RLIMIT_DATA makes it in ft),
  // and a report ASan does make exits with kSanitizerExit, counted apart. Such reports come
  // from libhdf5 (a memcpy of overlapping ranges in H5HG_read on a fuzzed vlen string, ~10% of
  // inputs in a minute), so they are contained like its crashes, not findings; each report is
  // in the log. Later options override earlier ones: the user's ASAN_OPTIONS hold otherwise.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string child_asan =
      std::string(asan ? asan : "") +
      ":handle_segv=0:handle_sigbus=0:handle_sigfpe=0:allocator_may_return_null=1:exitcode=" +
      std::to_string(kSanitizerExit);
  setenv("ASAN_OPTIONS", child_asan.c_str(), 1);  // read by the children only: ours has started
  const char* tmp = std::getenv("TMPDIR");
  input_path = std::string(tmp && *tmp ? tmp : "/tmp") + "/fuzz_shard.XXXXXX";
  input_fd = ::mkostemp(input_path.data(), O_CLOEXEC);  // the child opens it by path
  if (input_fd < 0) {
    std::fprintf(stderr, "fuzz_shard: cannot create a temporary file %s: %s\n", input_path.c_str(),
                 std::strerror(errno));
    std::exit(1);
  }
  std::atexit([] { ::unlink(input_path.c_str()); });
  std::atexit(print_stats);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = input_fd;
  const std::string& path = input_path;
  const uint8_t* file = data;
  size_t file_size = size;
  std::string report;
  if (!full_mode) {
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    if (!nul) return 0;
    report.assign(reinterpret_cast<const char*>(data), size_t(nul - data));
    file = nul + 1;
    file_size = size - size_t(nul - data) - 1;
  }
  if (::ftruncate(fd, 0) != 0 ||
      (file_size > 0 && ::pwrite(fd, file, file_size, 0) != ssize_t(file_size)))
    std::abort();
  ++inputs;
  try {
    std::vector<ft::ShardInfo> infos;
    if (full_mode) {
      infos = ft::check_shards({path});
    } else {
      infos = ft::detail::parse_shard_report(report, {path}, {uint64_t(file_size)});
      for (const ft::ShardInfo& s : infos)
        if (s.tokens.kind == ft::DatasetLayout::Kind::kLibrary ||
            (s.has_loss_mask && s.loss_mask.kind == ft::DatasetLayout::Kind::kLibrary))
          return 0;
    }
    ft::ShardSet set("fuzz", std::move(infos));
    read_everything(set);
    ++accepted;
  } catch (const ft::Error& e) {
    ++rejected;
    const std::string what = e.what();
    if (what.find("(exit status " + std::to_string(kSanitizerExit) + ")") != std::string::npos)
      ++child_reports;
    if (what.find("crashed libhdf5") != std::string::npos) ++hdf5_crashes;
    if (what.find("did not finish") != std::string::npos ||
        what.find("s of CPU time") != std::string::npos)
      ++hdf5_timeouts;
  }
  return 0;
}
