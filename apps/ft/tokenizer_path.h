// The tokenizer file a path names (a file, or a Hugging Face folder's tokenizer.model or
// tokenizer.json), checked before the tokenizer libraries read it: ft generate and ft inspect
// refuse a FIFO or /dev/zero in its place at once instead of blocking on it or reading it for
// ever (DESIGN.md §4, inputs are bounded before work).
#pragma once

#include <string>

namespace ft::app {

// Throws UsageError (exit 2) naming the file and what it is when the tokenizer file `path` names
// is there but not a regular file of at most kMaxTokenizerBytes. A path with no tokenizer is
// left to load_tokenizer, which says what it looked for.
void check_tokenizer_path(const std::string& path);

// The same for the files beside it that chat data reads (data/chat.h): tokenizer_config.json and
// chat_template.jinja of the tokenizer's folder, where they are.
void check_chat_files(const std::string& tokenizer_path);

}  // namespace ft::app
