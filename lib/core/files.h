// Reading the files a user names, bounded (DESIGN.md §4 "Inputs are bounded before work"): every
// file ft reads is first checked to be a regular file of a plausible size, so that a path that
// names a device (/dev/zero), a FIFO, a folder or a 40 GB log is refused at once, naming the
// file, what it is and the limit, instead of being read for ever or blocking. And every message
// that quotes a user's input quotes at most a short excerpt of it (`excerpt`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ft {

// Plausible sizes of the files ft reads whole. A limit is far above any real file of the kind
// (Llama 3's tokenizer.json is 9 MB, Qwen's 7 MB, a config.json some kB) and far below what would
// exhaust memory.
constexpr uint64_t kMaxTokenizerBytes = uint64_t(256) << 20;  // tokenizer.json, .model
constexpr uint64_t kMaxConfigBytes = uint64_t(16) << 20;      // config.json, *_config.json
constexpr uint64_t kMaxTemplateBytes = uint64_t(4) << 20;     // chat_template.jinja
constexpr uint64_t kMaxManifestBytes = uint64_t(256) << 20;   // checkpoint manifest, index
constexpr uint64_t kMaxShardBytes = uint64_t(1) << 40;        // a token shard: 1 TiB
constexpr uint64_t kMaxJsonlLineBytes = uint64_t(64) << 20;   // one record of a JSONL file

// What the path names, for messages: "a regular file", "a folder", "a FIFO (named pipe)",
// "a character device", "a block device", "a socket", "a symbolic link to nothing", "missing".
std::string file_kind(const std::string& path);

// Throws UsageError (exit 2) unless `path` is a regular file (after symbolic links) of at most
// `max_bytes`: "<what> <path>: <what it is instead / its size and the limit>; <hint>". `what`
// names the file's role ("tokenizer", "chat template"); `hint` (may be empty) says what to give.
// Returns the file's size.
uint64_t check_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what,
                            const std::string& hint = "");

// The whole file, after check_regular_file. Opened without blocking (a FIFO swapped in after the
// check is refused, not waited on), and read at most to max_bytes + 1 (a file that grows past the
// limit while being read is refused too). Errors name the file and the reason (errno's words).
std::string read_bounded_file(const std::string& path, uint64_t max_bytes, const std::string& what,
                              const std::string& hint = "");

// At most `max_chars` characters (code points) of `s`, quoted for a message: "…" appended when
// cut, invalid UTF-8 bytes and control characters shown as \xNN, \n, \t, so that a message
// never carries a user's megabytes or raw binary.
std::string excerpt(std::string_view s, size_t max_chars = 60);

}  // namespace ft
