#include <sys/wait.h>
#include <unistd.h>

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
#include "train/trainer.h"

namespace ft::app {
namespace {

// `--nproc N` on a workstation: ft starts the N ranks itself through Open MPI's mpirun (which
// supervises them: if one fails, the others are stopped and mpirun exits non-zero), so the user
// types no mpirun. Each rank runs the same command without --nproc.
//
// This process stays mpirun's parent rather than becoming it, to turn a stop request into a
// checkpoint: mpirun answers SIGTERM by killing the ranks (after 1 s) and no longer relaying
// their output, but it forwards SIGUSR1 to every rank — which ft treats as "finish the step,
// save, exit 75". So SIGTERM or SIGUSR1 here becomes SIGUSR1 to mpirun; a second SIGTERM is
// passed on as SIGTERM (stop now). Ctrl-C (SIGINT) reaches mpirun directly and ends the job.
volatile std::sig_atomic_t g_mpirun_pid = 0;
volatile std::sig_atomic_t g_stop_requests = 0;

void forward_stop(int sig) {
  if (g_mpirun_pid <= 0) return;
  const int before = g_stop_requests;
  if (sig == SIGTERM) g_stop_requests = before + 1;
  const bool again = sig == SIGTERM && before > 0;
  kill(pid_t(g_mpirun_pid), again ? SIGTERM : SIGUSR1);
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
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("--nproc: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    execvp("mpirun", argv.data());
    std::fprintf(stderr,
                 "ft: error: --nproc %d: cannot start mpirun (Open MPI): %s; install "
                 "openmpi-bin (scripts/setup.sh does)\n",
                 a.nproc, std::strerror(errno));
    _exit(int(ExitCode::kRuntime));
  }
  g_mpirun_pid = pid;
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  signal(SIGINT, SIG_IGN);  // the terminal sends it to mpirun too
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) std::exit(int(ExitCode::kRuntime));
  }
  std::fflush(nullptr);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // The job's cause as its last line: after a rank failed or hung, mpirun's banner and the
  // other ranks' lines (e.g. their "stop signal received", from mpirun's SIGTERM) come last
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

  auto comm = init_world_communicator(nullptr, nullptr);
  const bool is_root = comm->rank() == 0;
  if (!is_root) set_log_prefix(detail::concat("[rank ", comm->rank(), "] "));
  // Every problem in the recipe is reported before any work starts (exit code 2). Every rank
  // finds the same problems; only rank 0 prints them.
  Recipe recipe;
  std::vector<std::string> warnings;
  try {
    recipe = load_recipe_or_throw(a.recipe, a.overrides, comm->size(), true, &warnings);
  } catch (const UsageError&) {
    if (is_root) throw;
    return int(ExitCode::kUsage);
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
