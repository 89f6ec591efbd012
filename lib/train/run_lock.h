// One job per run (DESIGN.md §4 "One job per run"): a training job holds an advisory lock on
// its run folders (run.output_dir, and checkpoint.dir when it saves there) for as long as it
// runs, so that a second `ft train` of the same recipe (a resubmitted batch job while the first
// still runs, a second terminal) is refused before any work instead of training beside the
// first and both saving and pruning checkpoints in one folder.
//
// The lock is flock(2) on `<folder>/ft.lock`: the kernel releases it when the process ends, by
// any signal or crash, so there is never a stale lock to remove by hand. The file holds the
// holder's host, pid and start time for the refusal message; it stays after the run (deleting a
// lock file that another process may have opened would let two processes "hold" it). Where the
// file system has no locks (some parallel file systems without their flock option), the run
// warns and goes on unlocked.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "recipe/recipe.h"

namespace ft {

// The folders a run of recipe `r` locks, each with the recipe key that names it:
// ("run.output_dir", dir) and, when the run saves checkpoints into another folder,
// ("checkpoint.dir", dir).
std::vector<std::pair<std::string, std::string>> run_folders(const Recipe& r);

class RunLock {
 public:
  RunLock() = default;
  RunLock(RunLock&&) noexcept;
  RunLock& operator=(RunLock&&) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // Releases the locks. Folders the lock created stay only when keep() was called (the run wrote
  // its outputs there); otherwise they are removed again with their ft.lock, if nothing else
  // was put in them, so a run refused at start-up leaves no empty run folder behind.
  ~RunLock();

  // Creates each folder when missing and locks it; throws UsageError (exit 2) naming the key,
  // the folder and the holder (host, pid, since when) when another process holds one, or Error
  // when a folder cannot be created.
  static RunLock acquire(const std::vector<std::pair<std::string, std::string>>& folders);
  void keep() { keep_ = true; }

 private:
  struct Held {
    std::string dir;
    int fd = -1;
    bool created = false;
  };
  std::vector<Held> held_;
  bool keep_ = false;
};

// The run's folders locked by rank 0 for the job, every rank agreeing: when another job holds
// one, every rank throws AgreedError (exit 2) and rank 0 prints why. Other ranks get an empty
// lock.
RunLock lock_run_folders(const Recipe& r, Communicator& comm);

// For `ft validate`: why `ft train` would be refused, as lock_run_folders says it, or "" when
// no other process holds a folder of the run. Creates nothing.
std::string run_folders_in_use(const Recipe& r);

}  // namespace ft
