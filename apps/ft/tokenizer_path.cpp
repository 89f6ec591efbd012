// Checking a tokenizer path before it is read (tokenizer_path.h).
#include "apps/ft/tokenizer_path.h"

#include <cstdint>
#include <filesystem>

#include "core/files.h"

namespace ft::app {

void check_tokenizer_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto there = [&](const fs::path& p) { return fs::exists(fs::symlink_status(p, ec)); };
  const std::string hint =
      "give a tokenizer.model or tokenizer.json file, or the Hugging Face folder holding one";
  if (fs::is_directory(path, ec)) {
    // The files load_tokenizer takes from a folder, in its order.
    for (const char* name : {"tokenizer.model", "tokenizer.json"})
      if (there(fs::path(path) / name)) {
        check_regular_file((fs::path(path) / name).string(), kMaxTokenizerBytes, "tokenizer", hint);
        return;
      }
    return;
  }
  if (there(path)) check_regular_file(path, kMaxTokenizerBytes, "tokenizer", hint);
}

void check_chat_files(const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(tokenizer_path, ec)
                           ? fs::path(tokenizer_path)
                           : fs::path(tokenizer_path).parent_path();
  const auto check = [&](const char* name, uint64_t max_bytes, const char* what) {
    const fs::path p = dir / name;
    if (fs::exists(fs::symlink_status(p, ec)))
      check_regular_file(p.string(), max_bytes, what, "restore it from the model's download");
  };
  check("tokenizer_config.json", kMaxConfigBytes, "the tokenizer's config");
  check("chat_template.jinja", kMaxTemplateBytes, "the chat template");
}

}  // namespace ft::app
