// One job per run (run_lock.h).
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "train/trainer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = "ft.lock";

std::string host_name() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "an unknown host";
  return h;
}

// "host H, pid P, since T" as the holder wrote it, or a sentence saying it wrote nothing yet.
std::string holder_of(const std::string& lock_path) {
  std::string text;
  try {
    text = read_bounded_file(lock_path, 4096, "lock file");
  } catch (const Error&) {
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return "a process that has not yet written its host and pid";
  return excerpt(text, 200);
}

std::string in_use_message(const std::string& key, const std::string& dir,
                           const std::string& lock_path) {
  return key + " " + dir + " is in use by another ft train: " + holder_of(lock_path) +
         ". Two jobs training in one run folder would save and prune each other's checkpoints; "
         "wait for that job to end (or stop it), or give this run another " +
         key;
}

// Tries the lock of an open lock file: 0 taken, EWOULDBLOCK held by another process, or
// another errno (the file system has no locks).
int try_lock(int fd) {
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    return errno;
  }
  return 0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> run_folders(const Recipe& r) {
  std::vector<std::pair<std::string, std::string>> out = {{"run.output_dir", r.run.output_dir}};
  const bool saves = r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0;
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(r.run.output_dir, ec);
  const fs::path b = fs::weakly_canonical(r.checkpoint.dir, ec);
  if (saves && !r.checkpoint.dir.empty() && a != b)
    out.emplace_back("checkpoint.dir", r.checkpoint.dir);
  return out;
}

RunLock::RunLock(RunLock&& o) noexcept : held_(std::move(o.held_)), keep_(o.keep_) {
  o.held_.clear();
}

RunLock& RunLock::operator=(RunLock&& o) noexcept {
  if (this != &o) {
    this->~RunLock();
    new (this) RunLock(std::move(o));
  }
  return *this;
}

RunLock::~RunLock() {
  // Removed in reverse: checkpoint.dir may lie inside run.output_dir.
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    if (!keep_ && it->created) {
      // Only our ft.lock in it: the run wrote nothing. Unlinking a lock file is safe here: no
      // other process can have opened it, since the folder did not exist before this run.
      std::error_code ec;
      fs::remove(fs::path(it->dir) / kLockName, ec);
      fs::remove(it->dir, ec);  // fails, harmlessly, when anything else is in it
    }
    if (it->fd >= 0) ::close(it->fd);
  }
  held_.clear();
}

RunLock RunLock::acquire(const std::vector<std::pair<std::string, std::string>>& folders) {
  RunLock lock;
  for (const auto& [key, dir] : folders) {
    Held h;
    h.dir = dir;
    std::error_code ec;
    // Each missing level is created in turn so that the lock knows which it made.
    if (!fs::exists(dir, ec)) {
      h.created = true;
      fs::create_directories(dir, ec);
    }
    if (ec || !fs::is_directory(dir)) {
      throw Error(key + " " + dir + " cannot be created: " +
                  (ec ? ec.message() : std::string(std::strerror(EEXIST))) + "; choose another " +
                  key + " or fix its permissions");
    }
    const std::string path = (fs::path(dir) / kLockName).string();
    h.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (h.fd < 0) {
      const int err = errno;
      lock.held_.push_back(h);
      throw Error(key + " " + dir + ": cannot open its lock file " + path + " (" +
                  std::strerror(err) + "); choose another " + key + " or fix its permissions");
    }
    const int err = try_lock(h.fd);
    if (err == EWOULDBLOCK) {
      lock.held_.push_back(h);
      throw UsageError(in_use_message(key, dir, path));
    }
    if (err != 0) {
      log_warn(key, " ", dir, ": the file system does not lock files (", std::strerror(err),
               "), so ft cannot refuse a second job training in this folder: make sure no other "
               "job uses it");
    } else {
      const std::string who = "host " + host_name() + ", pid " + std::to_string(getpid()) +
                              ", since " + utc_now() + "\n";
      if (ftruncate(h.fd, 0) != 0 || pwrite(h.fd, who.data(), who.size(), 0) < 0) {
        // The lock holds regardless; only a refused job's message loses the holder's name.
      }
    }
    lock.held_.push_back(h);
  }
  return lock;
}

RunLock lock_run_folders(const Recipe& r, Communicator& comm) {
  RunLock lock;
  std::string refusal;
  int code = 0;
  if (comm.rank() == 0) {
    try {
      lock = RunLock::acquire(run_folders(r));
    } catch (const Error& e) {
      refusal = e.what();
      code = int(e.code());
    }
  }
  if (comm.size() > 1) {
    int32_t shared = code;
    comm.broadcast_bytes(&shared, sizeof shared, 0);
    code = shared;
  }
  if (code != 0) throw AgreedError(refusal, ExitCode(code));
  return lock;
}

std::string run_folders_in_use(const Recipe& r) {
  for (const auto& [key, dir] : run_folders(r)) {
    const std::string path = (fs::path(dir) / kLockName).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // no lock file (no folder yet): nobody trains there
    const int err = try_lock(fd);
    ::close(fd);  // releases the lock just taken, if it was
    if (err == EWOULDBLOCK) return in_use_message(key, dir, path);
  }
  return "";
}

}  // namespace ft
