// The shard check: libhdf5 runs on a shard's bytes only in a child process with limits.
//
// Why: libhdf5 trusts the file it reads. Fuzzed shards crash it (SIGSEGV inside a
// variable-length string attribute) or make it loop forever, and nothing short of rewriting it
// makes every path safe. So check_shards() runs everything libhdf5 does with a shard's bytes in
// a child (shard_metadata.cpp: attributes, dataset types, shapes and storage, doc_offsets,
// bos/eos ids, where the values lie), which reports back on a pipe (shard_report.cpp); a crash,
// a signal or a limit becomes an error naming the file. One child per folder (per batch of
// paths that fits a command line), not per file, to keep startup cheap.
//
// How the child starts: posix_spawn of /proc/self/exe — whichever program this is — with the
// arguments `__ft_shard_check__ PARENT_PID FILE...`. posix_spawn, not fork(): an MPI rank must
// not fork (Open MPI's registered memory), and spawning is the same fork-then-exec that Open MPI
// accepts. Every program that checks shards (ft and ft_emu, the unit tests, the test tools that
// read shards, the fuzz harnesses) calls run_shard_check_if_child(argc, argv) first thing in
// main() (LLVMFuzzerInitialize for a harness): in the child it runs the check and exits,
// otherwise it returns at once. check_shards() refuses to spawn in a program whose main() has
// not called it, since that child would run the program itself. By hand:
// `ft __ft_shard_check__ $$ FILE...` prints the report.
//
// Limits, so that the child never outlives its use:
//   - it dies with its parent: PR_SET_PDEATHSIG (SIGKILL), then its parent's pid is compared
//     with PARENT_PID, since the parent may have died before prctl ran. (The signal comes when
//     the spawning thread ends; that thread waits for the child, so it outlives it.)
//   - wall clock, enforced by the parent: per file, check_time_limit_s() of its size, counted
//     from the child's "begin I"; the child's own start (exec, dynamic linking) has its own
//     allowance, kStartLimitS, so a slow start never counts against a shard.
//   - CPU time, enforced by the kernel (RLIMIT_CPU): per file its wall-clock limit plus 1 to 2 s
//     (whole seconds, and a margin so that while the parent watches, its clock decides: one
//     thread cannot use more CPU than wall time). So the check also ends when the parent cannot
//     watch it (stopped, say); the child then dies of SIGXCPU, which the parent reports as well.
//   - memory (RLIMIT_DATA, 2 GiB): see kCheckMemoryBytes.
// The parent keeps libhdf5 out of its data path afterwards: shard_read.cpp.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/asan.h"
#include "core/error.h"
#include "data/shard.h"
#include "data/shard_internal.h"

namespace ft {
namespace {

constexpr const char* kCheckArg = "__ft_shard_check__";

// A corrupt length makes libhdf5 allocate and copy gigabytes (measured: 6 GiB within 16 s on
// one fuzzed attribute); a data limit turns that into a quick allocation failure, which
// libhdf5 reports as an error. Not under AddressSanitizer, whose shadow memory is counted
// (kLimitCheckMemory false).
constexpr rlim_t kCheckMemoryBytes = rlim_t(2) << 30;
constexpr bool kLimitCheckMemory = !FT_ASAN;

// The child's start, from posix_spawn to its first "begin" (or FT_SHARD_CHECK_TIMEOUT_S if
// longer): exec and dynamic linking of this program, 0.14 s measured while the parent's pages
// are cached, but seconds on an oversubscribed node or a cold cache, which is no shard's fault.
// 120: a fresh-clone CI run on a 2-core host (two tests at once, one of them ft on both cores)
// once saw a start take more than 30 s (stop 41). The limit only bounds how long a child that
// never starts is waited for.
constexpr double kStartLimitS = 120;

// FT_SHARD_CHECK_TIMEOUT_S (default 5): seconds the check may spend on one shard before the file
// counts as damaged, plus 1 s per 50 MiB of the file. Reading a good shard's metadata takes
// milliseconds; the per-size term covers what grows with the file: compressed data is decoded
// once in full, and doc_offsets and the chunk index are read from disk (50 MiB/s: a slow disk
// or network file system on a cold cache). DESIGN.md §6 states it.
double check_time_limit_s(uint64_t file_bytes) {
  double base = 5;
  if (const char* e = std::getenv("FT_SHARD_CHECK_TIMEOUT_S")) base = std::max(0.1, std::atof(e));
  return base + double(file_bytes) / double(50 << 20);
}

// Set by run_shard_check_if_child(): this program's main() starts the check when spawned as one.
std::atomic<bool> g_entry_called{false};

// ---- the child -------------------------------------------------------------------------------

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ::_exit(3);  // the parent is gone; nobody is left to tell
    done += size_t(w);
  }
}

double cpu_seconds_used() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The CPU-time limits of the child over `sizes` (bytes of each file): a hard limit for all files
// at once (what the soft limits below can add up to), set once because a process cannot raise
// its own hard limit; cpu_limit_for_file() then moves the soft limit, at which the kernel sends
// SIGXCPU, to the CPU time used so far plus the next file's limit plus 1 s, rounded up.
rlim_t set_cpu_hard_limit(const std::vector<uint64_t>& sizes) {
  double total = cpu_seconds_used() + 1;
  for (uint64_t b : sizes) total += check_time_limit_s(b) + 2;
  rlimit cpu{};
  ::getrlimit(RLIMIT_CPU, &cpu);
  cpu.rlim_max = std::min(cpu.rlim_max, rlim_t(std::ceil(total)));
  cpu.rlim_cur = cpu.rlim_max;
  ::setrlimit(RLIMIT_CPU, &cpu);
  return cpu.rlim_max;
}

void cpu_limit_for_file(uint64_t file_bytes, rlim_t hard) {
  const double soft = std::ceil(cpu_seconds_used() + check_time_limit_s(file_bytes) + 1);
  const rlimit cpu{std::min(hard, rlim_t(soft)), hard};
  ::setrlimit(RLIMIT_CPU, &cpu);
}

// Checks each path with libhdf5 and writes the report to `fd`. Returns the exit status (0 also
// when a shard is bad: that is reported, not a failure of the check).
int check_in_child(const std::vector<std::string>& paths, int fd) {
  detail::Hdf5Lock lock;
  std::vector<uint64_t> sizes;
  for (const std::string& p : paths) {
    struct stat st {};
    sizes.push_back(::stat(p.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0);
  }
  const rlim_t cpu_hard = set_cpu_hard_limit(sizes);
  for (size_t i = 0; i < paths.size(); ++i) {
    cpu_limit_for_file(sizes[i], cpu_hard);
    write_all(fd, detail::report_begin(i));
    std::string record;
    try {
      struct stat st {};
      if (::stat(paths[i].c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        FT_FAIL(paths[i], ": no such shard file");
      record = detail::report_shard(i, detail::read_shard_metadata(paths[i], uint64_t(st.st_size)));
    } catch (const std::bad_alloc&) {
      write_all(fd, detail::report_error(i, paths[i] + ": damaged: its metadata asks for more "
                                                       "memory than there is (corrupt shard)"));
      return 0;
    } catch (const std::exception& e) {
      write_all(fd, detail::report_error(i, e.what()));
      return 0;
    }
    write_all(fd, record);
  }
  return 0;
}

// ---- the parent ------------------------------------------------------------------------------

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", s);
  return buf;
}

// Runs one child over `paths` and returns its report; throws naming the file it was on when
// it crashed or ran out of time.
std::string run_check_child(const std::vector<std::string>& paths,
                            const std::vector<uint64_t>& file_bytes) {
  if (!g_entry_called.load())
    FT_FAIL(paths.front(),
            ": cannot check the shard: this program's main() does not call "
            "ft::run_shard_check_if_child(argc, argv) first (lib/data/shard.h), so a check "
            "child would run the program itself; this is a bug in the program");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    FT_FAIL(paths.front(), ": cannot check the shard: pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // SIGXCPU (the CPU limit) at its default action, unblocked: a launcher or a thread of this
  // process may ignore or block signals, and both would survive the exec. The stop signals are
  // blocked for the child's life: a terminal's Ctrl-C reaches the whole foreground process
  // group, and the child dying of it would read as a shard that crashed libhdf5; the stop is
  // this process's to handle (it may go on, and the child dies with it, PR_SET_PDEATHSIG).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t stops, xcpu;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&stops, sig);
  sigemptyset(&xcpu);
  sigaddset(&xcpu, SIGXCPU);
  posix_spawnattr_setsigmask(&attr, &stops);
  posix_spawnattr_setsigdefault(&attr, &xcpu);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> args = {"ft-shard-check", kCheckArg, std::to_string(::getpid())};
  args.insert(args.end(), paths.begin(), paths.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // One thread in the child: OpenBLAS starts its pool when it is loaded, for nothing here.
  std::vector<std::string> env = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    if (!v.starts_with("OPENBLAS_NUM_THREADS=") && !v.starts_with("OMP_NUM_THREADS="))
      env.emplace_back(v);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    FT_FAIL(paths.front(), ": cannot start the shard check (/proc/self/exe): ", std::strerror(rc));
  }

  std::string report;
  long current = -1;  // the file the child is on: the last "begin I" seen
  size_t scanned = 0;
  double limit_s = std::max(kStartLimitS, check_time_limit_s(0));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  bool timed_out = false;
  char buf[1 << 16];
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, int(std::min<int64_t>(wait.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above decides
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // EOF: the child is done (or died)
    report.append(buf, size_t(r));
    // A new "begin I" restarts the clock with file I's own limit.
    for (size_t nl; (nl = report.find('\n', scanned)) != std::string::npos; scanned = nl + 1) {
      if (report.compare(scanned, 6, "begin ") != 0) continue;
      current = std::strtol(report.c_str() + scanned + 6, nullptr, 10);
      if (current >= 0 && size_t(current) < paths.size()) {
        limit_s = check_time_limit_s(file_bytes[size_t(current)]);
        deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
      }
    }
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool on_file = current >= 0 && size_t(current) < paths.size();
  const std::string& who = on_file ? paths[size_t(current)] : paths.front();
  // First: a child that reached its CPU limit died of SIGXCPU on its own, whether or not the
  // wall clock ran out too (then the kill above found a zombie).
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXCPU && on_file)
    FT_FAIL(who, ": damaged: reading it with libhdf5 used more than ", seconds(limit_s),
            " s of CPU time (a corrupt shard can make libhdf5 loop forever); re-create it with "
            "`ft tokenize` (on a very slow machine, raise FT_SHARD_CHECK_TIMEOUT_S)");
  if (timed_out && !on_file)
    FT_FAIL(who,
            ": the shard check process (this program, run again through /proc/self/exe) "
            "did not start within ",
            seconds(limit_s), " s; is the machine overloaded?");
  if (timed_out)
    FT_FAIL(who, ": damaged: reading it with libhdf5 did not finish in ", seconds(limit_s),
            " s (a corrupt shard can make libhdf5 loop forever); re-create it with `ft tokenize`"
            " (on a very slow file system, raise FT_SHARD_CHECK_TIMEOUT_S)");
  if (WIFSIGNALED(status) && !on_file)  // before any file: not the shards' fault
    FT_FAIL(who,
            ": the shard check process (this program, run again through /proc/self/exe) "
            "died of ",
            signal_name(WTERMSIG(status)), " before reading any shard");
  if (WIFSIGNALED(status))
    FT_FAIL(who, ": damaged: reading it crashed libhdf5 (", signal_name(WTERMSIG(status)),
            ", in the shard check's child process); re-create it with `ft tokenize`");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    FT_FAIL(who, ": the shard check process failed (exit status ", WEXITSTATUS(status), ")");
  return report;
}

}  // namespace

void run_shard_check_if_child(int argc, char** argv) {
  g_entry_called.store(true);
  if (argc < 3 || !argv || !argv[1] || std::strcmp(argv[1], kCheckArg) != 0) return;
  // Die with the parent. It may have died before prctl ran: then this process has a new parent.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const std::string_view parent_arg(argv[2]);
  pid_t parent = 0;
  const auto [end, ec] =
      std::from_chars(parent_arg.data(), parent_arg.data() + parent_arg.size(), parent);
  if (ec != std::errc() || end != parent_arg.data() + parent_arg.size() || ::getppid() != parent)
    ::_exit(4);
  if (kLimitCheckMemory) {
    const rlimit data_limit{kCheckMemoryBytes, kCheckMemoryBytes};
    ::setrlimit(RLIMIT_DATA, &data_limit);
  }
  // SIGXCPU's default action dumps core: not a file to leave in the user's folder.
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  const std::vector<std::string> paths(argv + 3, argv + argc);
  ::_exit(check_in_child(paths, STDOUT_FILENO));
}

std::vector<ShardInfo> check_shards(const std::vector<std::string>& paths) {
  std::vector<uint64_t> sizes;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) FT_FAIL(p, ": no such shard file");
    sizes.push_back(uint64_t(st.st_size));
  }
  // One child per batch of files; batches keep each command line well under ARG_MAX.
  constexpr size_t kBatchArgBytes = 512 << 10;
  std::vector<ShardInfo> out;
  for (size_t begin = 0; begin < paths.size();) {
    size_t end = begin, bytes = 0;
    while (end < paths.size() && (end == begin || bytes + paths[end].size() < kBatchArgBytes))
      bytes += paths[end++].size() + 1;
    const std::vector<std::string> batch(paths.begin() + long(begin), paths.begin() + long(end));
    const std::vector<uint64_t> batch_sizes(sizes.begin() + long(begin), sizes.begin() + long(end));
    for (ShardInfo& s :
         detail::parse_shard_report(run_check_child(batch, batch_sizes), batch, batch_sizes))
      out.push_back(std::move(s));
    begin = end;
  }
  return out;
}

ShardInfo read_shard_info(const std::string& path) { return check_shards({path}).front(); }

}  // namespace ft
