// Byte-level file primitives of the checkpoint code (io.h): CRC-32, whole writes, fsync, atomic
// small files, whole-file reads. Nothing here knows what a checkpoint holds.
#include "ckpt/io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace ft::ckpt {
namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

uint32_t crc_of(const void* p, uint64_t n, uint32_t crc) {
  auto* b = static_cast<const Bytef*>(p);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = uInt(std::min<uint64_t>(n, uint64_t(1) << 30));
    c = crc32(c, b, chunk);
    b += chunk;
    n -= chunk;
  }
  return uint32_t(c);
}

void write_all(int fd, const void* p, uint64_t n, const std::string& path) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("writing " + path + ": " + errno_text());
    }
    b += w;
    n -= uint64_t(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error("opening " + path + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0 && !(directory && (e == EINVAL || e == EROFS)))
    throw Error("syncing " + path + " to disk: " + std::strerror(e));
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("creating " + tmp + ": " + errno_text());
  try {
    write_all(fd, text.data(), text.size(), tmp);
    if (::fsync(fd) != 0) throw Error("syncing " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_text();
    ::unlink(tmp.c_str());
    throw Error("renaming " + tmp + " to " + path + ": " + e);
  }
  fsync_path(fs::path(path).parent_path().string(), true);
}

std::string read_text(const std::string& path) {
  // A checkpoint's text files (latest, manifests, the tokenizer copied in) are regular files of
  // bounded size; anything else makes the checkpoint damaged (exit 1), not bad input.
  try {
    return read_bounded_file(path, kMaxManifestBytes, "checkpoint file");
  } catch (const UsageError& e) {
    throw Error(e.what());
  }
}

}  // namespace ft::ckpt
