#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/ft/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "recipe/recipe.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace ft::app {
namespace {

// `--nproc N` on a workstation: ft starts the N ranks itself through Open MPI's mpirun (which
// supervises them: if one fails, the others are stopped and mpirun exits non-zero), so the user
// types no mpirun. Each rank runs the same command without --nproc.
//
// This process stays mpirun's parent rather than becoming it, to turn a stop request into a
// checkpoint: mpirun answers SIGTERM by killing the ranks (after 1 s) and no longer relaying
// their output, but it forwards SIGUSR1 to every rank, which ft treats as "finish the step,
// save, exit 75". So (DESIGN.md §4 "Signals"):
//   - mpirun and the ranks run in a process group of their own, so a terminal's Ctrl-C reaches
//     this process only, never the ranks directly (which would each decide alone);
//   - the first SIGINT or SIGTERM here (SIGHUP too: the terminal went away), and every SIGUSR1,
//     becomes SIGUSR1 to mpirun and to the ranks it started: the ranks stop after the step with
//     a checkpoint, and this process exits with their code (75). The ranks get it from here as
//     well because Open MPI 4.1's mpirun relays it late while they compute (29 to 62 s seen on
//     an idle 2-core host, against 2 s sent directly); a rank takes a second request as the
//     same stop;
//   - a second SIGINT or SIGTERM becomes SIGTERM to mpirun (stop now), and this process exits
//     with 130 or 143 once mpirun has gone (SIGKILL to its group after kHardStopWaitS);
//   - mpirun dies with this process, whatever ends it (PR_SET_PDEATHSIG: SIGTERM, so mpirun
//     stops the ranks), and each rank dies with mpirun (train_state.h die_with_launcher).
constexpr double kHardStopWaitS = 10.0;
volatile std::sig_atomic_t g_mpirun_pid = 0;
volatile std::sig_atomic_t g_hard_signal = 0;     // the first SIGINT/SIGTERM/SIGHUP
volatile std::sig_atomic_t g_hard_again = 0;      // the second: stop now
volatile std::sig_atomic_t g_relay_to_ranks = 0;  // a stop request for mpirun's children

void say(const char* s) { [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, s, std::strlen(s)); }

void forward_stop(int sig) {
  if (g_mpirun_pid <= 0) return;
  const bool hard = sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
  if (hard && g_hard_signal != 0) {
    if (g_hard_again == 0) {
      g_hard_again = sig;
      say("ft: a second stop signal: stopping the ranks now, without a checkpoint\n");
    }
    kill(pid_t(g_mpirun_pid), SIGTERM);
    return;
  }
  if (hard) {
    g_hard_signal = sig;
    say(sig == SIGINT ? "ft: SIGINT: " : sig == SIGTERM ? "ft: SIGTERM: " : "ft: SIGHUP: ");
    say("the ranks stop after this step, with a checkpoint (send it again to stop at once, "
        "without one)\n");
  }
  kill(pid_t(g_mpirun_pid), SIGUSR1);
  g_relay_to_ranks = 1;  // the wait loop finds the ranks (reading /proc is no handler's work)
}

// Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/PID/status): a rank
// gets its stop request only once it can take it, since SIGUSR1's default action ends a process.
bool catches(pid_t pid, int sig) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!f) return false;
  char line[256];
  unsigned long long mask = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f))
    found = std::sscanf(line, "SigCgt: %llx", &mask) == 1;
  std::fclose(f);
  return found && (mask >> (sig - 1) & 1) != 0;
}

// Sends SIGUSR1 to each child of `pid` (the local ranks, which mpirun forks itself, as listed
// by /proc/PID/task/TID/children of each of its threads) that catches it and is not in `done`,
// and adds it there.
void relay_stop_to_children(pid_t pid, std::vector<pid_t>& done) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = opendir(tasks.c_str());
  if (!dir) return;  // mpirun has just ended: nothing to relay
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    FILE* f = std::fopen((tasks + "/" + e->d_name + "/children").c_str(), "r");
    if (!f) continue;
    long child = 0;
    while (std::fscanf(f, "%ld", &child) == 1) {
      const pid_t c = pid_t(child);
      if (c <= 0 || std::find(done.begin(), done.end(), c) != done.end()) continue;
      if (!catches(c, SIGUSR1)) continue;  // not yet: tried again at the next poll
      kill(c, SIGUSR1);
      done.push_back(c);
    }
    std::fclose(f);
  }
  closedir(dir);
}

[[noreturn]] void launch_local_ranks(const TrainArgs& a) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) throw Error("--nproc: cannot find this executable's path (/proc/self/exe)");
  self[len] = '\0';
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "-np", std::to_string(a.nproc)};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* s : {static_cast<const char*>(self), "train", a.recipe.c_str()})
    args.push_back(s);
  for (const auto& o : a.overrides) args.push_back(o);
  args.push_back("--resume");
  args.push_back(a.resume);
  // The ranks' stop messages are this process's (forward_stop).
  setenv("FT_NPROC_PARENT", std::to_string(getpid()).c_str(), 1);
  // The ranks' stdout goes through mpirun; tell them whether the person sees a terminal.
  setenv("FT_PROGRESS", isatty(STDOUT_FILENO) ? "bar" : "plain", 0);
  // Where a rank that ends the job says why (core/log.h note_job_cause), restated below.
  std::string cause_file;
  {
    const char* dir = std::getenv("TMPDIR");
    std::string templ = std::string(dir && *dir ? dir : "/tmp") + "/ft_job_cause.XXXXXX";
    const int fd = mkstemp(templ.data());
    if (fd >= 0) {
      close(fd);
      cause_file = templ;
      setenv("FT_JOB_CAUSE_FILE", cause_file.c_str(), 1);
    }
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  // The handlers are in place before mpirun exists, so no signal finds it unsupervised; they
  // act only once g_mpirun_pid is set.
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaction(sig, &sa, nullptr);
  const pid_t self_pid = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("--nproc: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // mpirun: a process group of its own (out of the terminal's reach), no terminal input
    // (mpirun would forward stdin to rank 0, and reading a terminal from a background group
    // stops the process), and death with this process.
    setpgid(0, 0);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != self_pid) _exit(int(ExitCode::kRuntime));  // ft ended before prctl ran
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaction(sig, &dfl, nullptr);
    execvp("mpirun", argv.data());
    std::fprintf(stderr,
                 "ft: error: --nproc %d: cannot start mpirun (Open MPI): %s; install "
                 "openmpi-bin (scripts/setup.sh does)\n",
                 a.nproc, std::strerror(errno));
    _exit(int(ExitCode::kRuntime));
  }
  setpgid(pid, pid);  // as the child does: whichever runs first
  g_mpirun_pid = pid;
  int status = 0;
  double hard_wait_s = 0;
  // Polled every 0.1 s rather than blocked in waitpid, so that a stop request that arrives at
  // any moment reaches the ranks within 0.1 s (or once each has its handlers).
  std::vector<pid_t> relayed;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) std::exit(int(ExitCode::kRuntime));
    if (g_relay_to_ranks && !g_hard_again) relay_stop_to_children(pid, relayed);
    if (g_hard_again) {
      // Stopping now: mpirun had its SIGTERM; past the wait, its whole group goes.
      if (hard_wait_s >= kHardStopWaitS) kill(-pid, SIGKILL);
      hard_wait_s += 0.1;
    }
    usleep(100000);
  }
  std::fflush(nullptr);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (g_hard_again) code = 128 + (g_hard_again == SIGHUP ? SIGTERM : int(g_hard_again));
  // The job's cause as its last line: after a rank failed or hung, mpirun's banner and the
  // other ranks' lines (e.g. their "mpirun is ending the job", at its SIGTERM) come last
  // otherwise.
  if (!cause_file.empty()) {
    std::string first;
    if (FILE* f = std::fopen(cause_file.c_str(), "r")) {
      char line[4096];
      if (std::fgets(line, sizeof line, f)) first = line;
      std::fclose(f);
    }
    unlink(cause_file.c_str());
    while (!first.empty() && first.back() == '\n') first.pop_back();
    if (code != 0 && !first.empty())
      std::fprintf(stderr, "ft: error: the job ended (exit %d): %s\n", code, first.c_str());
  }
  std::exit(code);
}

}  // namespace

int cmd_train(const TrainArgs& a) {
  if (a.nproc > 1 && !launched_by_mpi()) launch_local_ranks(a);
  // A rank never outlives its launcher (mpirun, orted, slurmstepd): no orphan trains on.
  if (launched_by_mpi()) die_with_launcher();

  auto comm = init_world_communicator(nullptr, nullptr);
  const bool is_root = comm->rank() == 0;
  if (!is_root) set_log_prefix(detail::concat("[rank ", comm->rank(), "] "));
  // Every problem in the recipe is reported before any work starts (exit code 2). Every rank
  // finds the same problems; only rank 0 prints them.
  Recipe recipe;
  std::vector<std::string> warnings;
  try {
    recipe = load_recipe_or_throw(a.recipe, a.overrides, comm->size(), true, &warnings);
  } catch (const UsageError& e) {
    // Every rank found the same problems. Rank 0 prints them before any rank exits, since a
    // launcher may kill the others (and lose rank 0's message) as soon as one exits non-zero;
    // then every rank ends with the same exit code, as an AgreedError below.
    if (is_root) {
      std::fprintf(stderr, "ft: error: %s\n", e.what());
      std::fflush(stderr);
      note_job_cause(e.what());
    }
    comm->barrier();
    return int(e.code());
  }
  if (is_root)
    for (const std::string& w : warnings) log_warn(w);
  if (is_root) {
    std::printf("# resolved recipe (%s), %s\n%s\n", a.recipe.c_str(), comm->describe().c_str(),
                recipe_to_yaml(recipe).c_str());
    std::fflush(stdout);
  }
  try {
    const TrainSummary sum = train(recipe, *comm, a.resume);
    if (sum.preempted) return int(ExitCode::kPreempted);
  } catch (const AgreedError& e) {
    // Every rank stopped here alike (e.g. a non-finite gradient norm): rank 0 prints the one
    // message before any rank exits, since a launcher may kill the others as soon as one exits
    // non-zero; then every rank ends normally with the same exit code. The stop signal that
    // launcher sends the ranks still finishing is no request to save: ignore it.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGUSR1, SIG_IGN);
    if (is_root) {
      std::fprintf(stderr, "ft: error: %s\n", e.what());
      std::fflush(stderr);
    }
    comm->barrier();
    return int(e.code());
  } catch (const Error& e) {
    // A failure on one rank must not leave the others waiting in a collective: report it here,
    // naming the rank, and end the whole job.
    if (comm->size() > 1) {
      log_error(e.what());
      note_job_cause(e.what());  // main() would, but the abort ends this process first
      comm->abort(int(e.code()));
    }
    throw;
  }
  return 0;
}

}  // namespace ft::app
