// Resolving a checkpoint path for ft generate and ft export (checkpoint_source.h).
#include "apps/ft/checkpoint_source.h"

#include <filesystem>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/files.h"

namespace ft::app {
namespace {

namespace fs = std::filesystem;

// `latest` holds one step folder name and a newline; anything longer is not one.
constexpr uint64_t kMaxLatestBytes = 4096;

// There in some form (a FIFO, a device, a dangling link too): such a `latest` is refused for
// what it is, not taken for absent.
bool is_there(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// What to give instead, for messages: the newest complete step folder of `dir`, if any.
std::string instead(const std::string& dir, const std::string& verb) {
  const std::vector<std::string> complete = ckpt::complete_checkpoints(dir);
  if (complete.empty())
    return "no step folder of " + dir + " is complete, so there is nothing to " + verb +
           " (ft inspect " + dir + " lists them)";
  return "give a step folder instead: " + complete.front() + " is the newest complete one";
}

// A step folder a save finished: manifest.json and COMPLETE (the manifest's contents are checked
// when it is read).
std::string complete_step(const std::string& step, const std::string& verb) {
  std::error_code ec;
  const std::string parent = fs::path(step).parent_path().string();
  if (!is_there(fs::path(step) / "manifest.json"))
    throw Error(step + ": no manifest.json: not a checkpoint step folder, or a save that never " +
                "finished; nothing to " + verb + (parent.empty() ? "" : "; ft inspect " + parent) +
                " lists the step folders");
  if (!is_there(fs::path(step) / "COMPLETE"))
    throw Error(step +
                ": no COMPLETE file: the save never finished, so it is not a checkpoint to " +
                verb + "; give an earlier step folder" +
                (parent.empty() ? "" : " (ft inspect " + parent + " lists them)"));
  return step;
}

}  // namespace

std::string latest_step_name(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  if (!is_there(latest)) return "";
  std::string name =
      read_bounded_file(latest.string(), kMaxLatestBytes, "the checkpoint pointer",
                        "it names the newest complete step folder; delete it (ft then takes the "
                        "newest complete step folder), or give a step folder");
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  if (ckpt::parse_step_folder_name(name) < 0)
    throw UsageError(latest.string() + ": holds " + excerpt(name) +
                     ", not a step folder name such as step_00000100; delete it (ft then takes "
                     "the newest complete step folder), or give a step folder");
  return name;
}

bool is_checkpoint_path(const std::string& dir) {
  return is_there(fs::path(dir) / "manifest.json") || ckpt::has_checkpoints(dir);
}

std::string resolve_checkpoint(const std::string& dir, const std::string& verb, std::string* note) {
  if (is_there(fs::path(dir) / "manifest.json")) return complete_step(dir, verb);
  const fs::path latest = fs::path(dir) / "latest";
  if (is_there(latest)) {
    const std::string name = latest_step_name(dir);
    const std::string step = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::is_directory(step, ec))
      throw UsageError(latest.string() + " names " + name +
                       ", which is not there (removed, or set aside as damaged by --resume "
                       "auto?); " +
                       instead(dir, verb));
    return complete_step(step, verb);
  }
  if (ckpt::has_checkpoints(dir)) {
    // No `latest`: a run stopped between COMPLETE and `latest`, or a pruned folder. The newest
    // complete step folder is what --resume auto would take.
    const std::vector<std::string> complete = ckpt::complete_checkpoints(dir);
    if (complete.empty())
      throw Error(dir +
                  ": has step folders but none is complete (no COMPLETE file): no save finished "
                  "here; see ft inspect " +
                  dir);
    if (note) *note = dir + " has no `latest`; taking the newest complete step folder";
    return complete.front();
  }
  throw UsageError(dir +
                   ": not a checkpoint (no manifest.json, latest or step_* folders); give a step "
                   "folder such as <checkpoint.dir>/step_00000100, or the checkpoint.dir holding "
                   "`latest`");
}

}  // namespace ft::app
