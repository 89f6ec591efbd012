// The folders of checkpoint.dir (DESIGN.md §8): step folder names and their parsing, the
// listing of complete checkpoints, the `latest` file, and setting damaged folders aside.
//
// Invariants: a folder's step is read from its name alone, never from what a manifest inside
// says; a damaged folder is renamed aside, never deleted.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "ckpt/io.h"
#include "core/error.h"
#include "core/files.h"

namespace ft::ckpt {
namespace fs = std::filesystem;

std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = parse_step_folder_name(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

std::string step_folder_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", (long long)step);
  return b;
}

int64_t parse_step_folder_name(const std::string& name, bool set_aside) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  size_t i = 5;
  int64_t v = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    if (v > kMaxStep) return -1;  // no overflow on a long run of digits
    v = v * 10 + (name[i] - '0');
  }
  if (i == 5) return -1;
  if (i == name.size()) return v;
  if (!set_aside || name.compare(i, 8, ".damaged") != 0) return -1;
  i += 8;
  if (i == name.size()) return v;
  if (name[i] != '.' || i + 1 == name.size()) return -1;
  for (++i; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return v;
}

std::string set_aside_damaged(const std::string& step_dir) {
  fs::path from = fs::path(step_dir).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();
  for (int n = 0;; ++n) {
    fs::path to = from;
    to += n == 0 ? std::string(".damaged") : ".damaged." + std::to_string(n);
    std::error_code ec;
    if (fs::exists(to, ec) || fs::is_symlink(to, ec)) continue;
    // rename(2) never replaces a non-empty folder, and `to` does not exist: nothing is lost
    // even if another process races us to the name.
    if (::rename(from.c_str(), to.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) continue;
      throw Error("cannot rename the damaged checkpoint " + from.string() + " to " + to.string() +
                  ": " + errno_text() + "; nothing was deleted");
    }
    return to.string();
  }
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [step, path] : step_folders(dir))
    if (fs::exists(fs::path(path) / "COMPLETE")) out.push_back(path);
  return out;
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path p = fs::path(dir) / "latest";
  if (!fs::exists(p)) return "";
  std::string name = read_text(p.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r'))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(p.string() +
                ": does not name a step folder; delete it to resume from the newest "
                "complete checkpoint");
  const fs::path folder = fs::path(dir) / name;
  if (!fs::is_directory(folder))
    throw Error(p.string() + " names " + excerpt(name, 60) + ", which is not in " + dir +
                " (deleted or moved?); give a step_* folder by its path, or delete `latest` "
                "to resume from the newest complete checkpoint");
  return folder.string();
}

bool has_checkpoints(const std::string& dir) {
  return fs::exists(fs::path(dir) / "latest") || !step_folders(dir).empty();
}

}  // namespace ft::ckpt
