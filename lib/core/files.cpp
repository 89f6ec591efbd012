// Bounded reads of user-named files (files.h).
#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ft {
namespace {

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(b) / double(uint64_t(1) << 30));
  else if (b >= (uint64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(uint64_t(1) << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)b);
  return buf;
}

std::string kind_of_mode(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& why,
                         const std::string& hint) {
  std::string msg = what + " " + path + ": " + why;
  if (!hint.empty()) msg += "; " + hint;
  throw UsageError(msg);
}

void check_stat(const struct stat& st, const std::string& path, uint64_t max_bytes,
                const std::string& what, const std::string& hint) {
  if (!S_ISREG(st.st_mode))
    refuse(what, path, "is " + kind_of_mode(st.st_mode) + ", not a regular file", hint);
  if (uint64_t(st.st_size) > max_bytes)
    refuse(what, path,
           human_bytes(uint64_t(st.st_size)) + ", more than the " + human_bytes(max_bytes) +
               " such a file can plausibly be",
           hint.empty() ? "check the path" : hint);
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return kind_of_mode(st.st_mode);
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return "a symbolic link to nothing";
  return "missing";
}

uint64_t check_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what,
                            const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      struct stat lst {};
      if (::lstat(path.c_str(), &lst) == 0)
        refuse(what, path, "is a symbolic link to nothing", hint);
      refuse(what, path, "no such file", hint);
    }
    refuse(what, path, std::string("cannot be read (") + std::strerror(err) + ")", hint);
  }
  check_stat(st, path, max_bytes, what, hint);
  return uint64_t(st.st_size);
}

std::string read_bounded_file(const std::string& path, uint64_t max_bytes, const std::string& what,
                              const std::string& hint) {
  check_regular_file(path, max_bytes, what, hint);
  // O_NONBLOCK: should the path have become a FIFO since the check, open() returns instead of
  // waiting for a writer, and fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    refuse(what, path, std::string("cannot be opened (") + std::strerror(err) + ")", hint);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    refuse(what, path, std::string("cannot be read (") + std::strerror(err) + ")", hint);
  }
  try {
    check_stat(st, path, max_bytes, what, hint);
  } catch (...) {
    ::close(fd);
    throw;
  }
  std::string out;
  out.resize(size_t(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) break;
      out.resize(std::min<uint64_t>(max_bytes + 1, out.size() + 65536));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      refuse(what, path, std::string("read failed (") + std::strerror(err) + ")", hint);
    }
    if (n == 0) break;
    got += size_t(n);
  }
  ::close(fd);
  out.resize(got);
  if (got > max_bytes)
    refuse(what, path,
           "grew past the " + human_bytes(max_bytes) + " such a file can plausibly be while read",
           hint.empty() ? "check the path" : hint);
  return out;
}

std::string excerpt(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t chars = 0, i = 0;
  auto hex = [&](uint8_t b) {
    static const char* d = "0123456789abcdef";
    out += "\\x";
    out += d[b >> 4];
    out += d[b & 15];
  };
  while (i < s.size() && chars < max_chars) {
    const uint8_t c = uint8_t(s[i]);
    if (c < 0x80) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '"' || c == '\\') {
        out += '\\';
        out += char(c);
      } else if (c < 0x20 || c == 0x7f) {
        hex(c);
      } else {
        out += char(c);
      }
      ++i;
      ++chars;
      continue;
    }
    // A whole, well-formed multi-byte sequence is copied; anything else is shown byte by byte.
    const int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + size_t(len) <= s.size();
    uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; ok && k < len; ++k) {
      const uint8_t cc = uint8_t(s[i + size_t(k)]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(s.substr(i, size_t(len)));
      i += size_t(len);
    } else {
      hex(c);
      ++i;
    }
    ++chars;
  }
  out += '"';
  if (i < s.size()) out += "…";
  return out;
}

}  // namespace ft
