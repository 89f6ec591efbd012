// ft inspect PATH: says what a folder holds. It recognises the folder kind first and then
// hands it to that kind's summary, so checkpoints and Hugging Face folders slot in beside
// shard folders.
#include <cstdio>
#include <filesystem>
#include <string>

#include "apps/ft/commands.h"
#include "core/error.h"
#include "data/shard.h"

namespace ft::app {
namespace {

namespace fs = std::filesystem;

enum class FolderKind { kShards, kCheckpoint, kHuggingFace, kUnknown };

bool has_file_with_extension(const fs::path& dir, const std::string& ext) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ext) return true;
  return false;
}

// DESIGN.md §6 and §8 tell the kinds apart: *.h5 shards; a checkpoint step folder
// (manifest.json) or checkpoint root (latest); an HF folder (config.json).
FolderKind classify(const fs::path& dir) {
  std::error_code ec;
  if (has_file_with_extension(dir, ".h5")) return FolderKind::kShards;
  if (fs::exists(dir / "manifest.json", ec) || fs::exists(dir / "latest", ec))
    return FolderKind::kCheckpoint;
  if (fs::exists(dir / "config.json", ec)) return FolderKind::kHuggingFace;
  return FolderKind::kUnknown;
}

int inspect_shards(const std::string& dir) {
  ShardSet set(dir);  // validates every shard; errors name the file
  const auto& shards = set.shards();
  const ShardAttributes& a = set.attrs();
  int with_mask = 0;
  for (const ShardInfo& s : shards) with_mask += s.has_loss_mask;
  std::printf("shard folder %s\n", dir.c_str());
  std::printf("  files:            %zu\n", shards.size());
  std::printf("  tokens:           %llu\n", (unsigned long long)set.total_tokens());
  std::printf("  documents:        %llu\n", (unsigned long long)set.total_documents());
  std::printf("  vocab_size:       %lld\n", (long long)a.vocab_size);
  std::printf("  token dtype:      uint%d\n", 8 * shards.front().token_bytes);
  std::printf("  bos_id:           %lld\n", (long long)a.bos_id);
  std::printf("  eos_id:           %lld\n", (long long)a.eos_id);
  std::printf("  tokenizer_sha256: %s\n", a.tokenizer_sha256.c_str());
  if (with_mask == 0)
    std::printf("  loss_mask:        no\n");
  else if (with_mask == int(shards.size()))
    std::printf("  loss_mask:        yes\n");
  else
    std::printf("  loss_mask:        in %d of %zu files\n", with_mask, shards.size());
  std::printf("  %-24s %14s %12s %s\n", "file", "tokens", "documents", "loss_mask");
  for (const ShardInfo& s : shards)
    std::printf("  %-24s %14llu %12llu %s\n", fs::path(s.path).filename().c_str(),
                (unsigned long long)s.num_tokens, (unsigned long long)s.num_documents,
                s.has_loss_mask ? "yes" : "no");
  // Leftovers of an interrupted `ft tokenize` are ignored by readers, but worth knowing about.
  int partial = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) partial += e.path().extension() == ".tmp";
  if (partial > 0)
    std::printf(
        "  note: %d unfinished *.tmp file%s (an interrupted ft tokenize?); they are ignored\n",
        partial, partial == 1 ? "" : "s");
  return 0;
}

}  // namespace

int cmd_inspect(const InspectArgs& a) {
  std::error_code ec;
  if (!fs::exists(a.path, ec)) throw UsageError(a.path + ": no such file or folder");
  if (!fs::is_directory(a.path, ec))
    throw UsageError(a.path +
                     ": not a folder; ft inspect takes a shard folder, checkpoint or "
                     "Hugging Face folder");
  switch (classify(a.path)) {
    case FolderKind::kShards:
      return inspect_shards(a.path);
    case FolderKind::kCheckpoint:
      throw Error(a.path +
                  ": looks like a checkpoint; inspecting checkpoints is not supported yet");
    case FolderKind::kHuggingFace:
      throw Error(a.path +
                  ": looks like a Hugging Face folder; inspecting those is not supported yet");
    case FolderKind::kUnknown:
      break;
  }
  throw UsageError(a.path +
                   ": not a shard folder, checkpoint or Hugging Face folder (found no "
                   "*.h5 files, manifest.json, latest or config.json)");
}

}  // namespace ft::app
