// safetensors reader and writer.
//
// Invariants the reader establishes in the constructor, before any tensor byte is read:
//   - the file holds 8 + N + D bytes: N (the header length) is in [1, min(file − 8, 100 MiB)],
//     D = file − 8 − N is the data section;
//   - every entry has a known dtype, a shape of non-negative integers whose element count and
//     byte count fit in 64 bits, and data_offsets [begin, end) with end ≤ D and
//     end − begin = numel × dtype_size;
//   - no two non-empty tensors share a byte.
// read_f32 can therefore compute every read range from the entry alone. Reads use pread rather
// than mmap: a file truncated by someone else after the header was checked gives a short read
// (an ft::Error) instead of SIGBUS.
#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "ckpt/io.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"

namespace ft {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

// The format's own reference reader refuses larger headers; a real header (a few hundred bytes
// per tensor) stays far below, so anything bigger is corruption, not a model.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests three deep (root → entry → shape); the limit only keeps a hostile
// header of a million '[' from building a million-level DOM.
constexpr int kMaxJsonDepth = 8;
// Conversion buffer for non-f32 tensors: big enough for large sequential reads, small enough
// not to matter next to the model.
constexpr size_t kChunkBytes = 4u << 20;

std::string errno_text(int err) { return std::system_category().message(err); }

// A file that is not what it claims to be: bad input (UsageError, exit code 2), as a missing one.
[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw UsageError("safetensors file '" + path + "': " + problem);
}

// A failure of the system or of the caller, not of the file's contents: an I/O error, a file
// shortened while it is read, a file that cannot be written, a read the header does not allow
// (Error, exit code 1).
[[noreturn]] void fail_io(const std::string& path, const std::string& problem) {
  throw Error("safetensors file '" + path + "': " + problem);
}

// A tensor name of a header in a message: whole when of a plausible length, else an excerpt (a
// hostile header may hold a megabyte-long name).
std::string tensor_name(const std::string& name) {
  return name.size() <= 200 ? "'" + name + "'" : excerpt(name, 100);
}

// Reads exactly n bytes at offset, retrying on EINTR and short reads; a premature end of file
// is an error (the header said the bytes are there).
void pread_all(int fd, const std::string& path, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io(path, "read failed at byte " + std::to_string(offset) + ": " + errno_text(errno));
    }
    if (got == 0)
      fail_io(path, "unexpected end of file at byte " + std::to_string(offset) +
                        " (was the file truncated while it was being read?)");
    p += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
}

// Non-negative JSON integer (nlohmann parses "-1" as signed, "1.0"/"1e3" as float).
bool as_u64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Validates one header entry; `where` prefixes every problem ("tensor 'x': ...").
SafetensorsEntry parse_entry(const std::string& path, const std::string& name,
                             const nlohmann::json& v, uint64_t data_size) {
  const std::string where = "tensor " + tensor_name(name) + ": ";
  if (!v.is_object()) fail(path, where + "entry is not a JSON object");

  SafetensorsEntry e;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail(path, where + "missing or non-string \"dtype\"");
  if (!dtype_from_name(dt->get<std::string>(), &e.dtype))
    fail(path, where + "unknown dtype " + excerpt(dt->get<std::string>(), 20) +
                   " (supported: F32, BF16, F16, U8, U16, U32, I32, I64, U64)");

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) fail(path, where + "missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    uint64_t dim;
    if (!as_u64(d, &dim))
      fail(path, where + "shape holds something other than a non-negative integer");
    if (dim > uint64_t(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, dim, &numel))
      fail(path, where + "shape's element count overflows 64 bits");
    e.shape.push_back(int64_t(dim));
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes))
    fail(path, where + "shape's byte count overflows 64 bits");

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], &e.begin) ||
      !as_u64((*off)[1], &e.end))
    fail(path, where + "\"data_offsets\" must be [begin, end] with non-negative integers");
  if (e.begin > e.end)
    fail(path, where + "data_offsets begin " + std::to_string(e.begin) + " > end " +
                   std::to_string(e.end));
  if (e.end > data_size)
    fail(path, where + "data_offsets end " + std::to_string(e.end) +
                   " is past the end of the data section (" + std::to_string(data_size) +
                   " bytes; truncated file?)");
  if (e.end - e.begin != nbytes)
    fail(path, where + "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but " +
                   dtype_name(e.dtype) + " " + shape_str(e.shape) + " needs " +
                   std::to_string(nbytes));
  return e;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO in the file's place is refused below instead of waiting for a writer
  // (regular files ignore the flag).
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) fail(path, "is " + file_kind(path) + "; is the download complete?");
    fail_io(path, "cannot open: " + errno_text(err));
  }
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0) fail_io(path, "cannot stat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode))
      fail(path, "is " + file_kind(path) +
                     ", not a regular file; a model folder holds its weights as regular files");
    file_size_ = uint64_t(st.st_size);
    if (file_size_ < 8)
      fail(path, "file is " + std::to_string(file_size_) +
                     " bytes, shorter than the 8-byte header length");

    unsigned char len_bytes[8];
    pread_all(fd_, path, len_bytes, 8, 0);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
    if (n == 0) fail(path, "header length is 0");
    if (n > file_size_ - 8)
      fail(path, "header length " + std::to_string(n) + " is larger than the " +
                     std::to_string(file_size_ - 8) + " bytes after it (truncated file?)");
    if (n > kMaxHeaderBytes)
      fail(path, "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
    data_start_ = 8 + n;
    const uint64_t data_size = file_size_ - data_start_;

    std::string text(size_t(n), '\0');
    pread_all(fd_, path, text.data(), text.size(), 8);

    // Duplicate tensor names would silently collapse in the DOM; catch them while parsing.
    std::set<std::string> seen;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if ((ev == E::object_start || ev == E::array_start) && depth > kMaxJsonDepth)
        fail(path, "header is nested more than " + std::to_string(kMaxJsonDepth) + " levels deep");
      if (ev == E::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second)
        fail(path,
             "duplicate tensor name " + tensor_name(parsed.get<std::string>()) + " in the header");
      return true;
    };
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text, on_event);
    } catch (const nlohmann::json::exception& e) {
      fail(path, "header is not valid JSON (" + json_error_words(e) +
                     "); the file is damaged: download it again");
    }
    if (!header.is_object()) fail(path, "header is not a JSON object");

    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path, "__metadata__ is not a JSON object");
        for (const auto& [k, mv] : v.items()) {
          if (!mv.is_string())
            fail(path, "__metadata__ value of " + tensor_name(k) + " is not a string");
          metadata_[k] = mv.get<std::string>();
        }
        continue;
      }
      entries_.emplace(name, parse_entry(path, name, v, data_size));
    }

    // Overlap check: sort non-empty ranges by start; each must begin at or after the previous
    // one's end. Empty tensors occupy no bytes, so they can sit anywhere.
    std::vector<std::pair<const std::string*, const SafetensorsEntry*>> ranges;
    for (const auto& [name, e] : entries_)
      if (e.end > e.begin) ranges.emplace_back(&name, &e);
    std::sort(ranges.begin(), ranges.end(),
              [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].second->begin < ranges[i - 1].second->end)
        fail(path, "tensors " + tensor_name(*ranges[i - 1].first) + " and " +
                       tensor_name(*ranges[i].first) + " overlap in the data section");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read_f32(const std::string& name, float* dst, size_t numel) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_io(path_, "no tensor named '" + name + "'");
  const SafetensorsEntry& e = it->second;
  const uint64_t have = (e.end - e.begin) / dtype_size(e.dtype);
  if (have != numel)
    fail_io(path_, "tensor '" + name + "' has " + std::to_string(have) + " elements " +
                       shape_str(e.shape) + ", the caller expects " + std::to_string(numel));
  read_f32_range(name, dst, 0, numel);
}

void SafetensorsFile::read_f32_range(const std::string& name, float* dst, size_t first,
                                     size_t count) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_io(path_, "no tensor named '" + name + "'");
  const SafetensorsEntry& e = it->second;
  const size_t esize = dtype_size(e.dtype);
  const uint64_t have = (e.end - e.begin) / esize;
  if (first > have || count > have - first)
    fail_io(path_, "tensor '" + name + "' has " + std::to_string(have) + " elements " +
                       shape_str(e.shape) + ", the caller reads [" + std::to_string(first) + ", " +
                       std::to_string(first + count) + ")");
  if (e.dtype != DType::kF32 && e.dtype != DType::kBF16 && e.dtype != DType::kF16)
    fail_io(path_, "tensor '" + name + "' has dtype " + dtype_name(e.dtype) +
                       "; only F32, BF16 and F16 convert to f32");
  if (count == 0) return;
  const uint64_t start = data_start_ + e.begin + uint64_t(first) * esize;
  if (e.dtype == DType::kF32) {
    pread_all(fd_, path_, dst, count * 4, start);
    return;
  }
  // 16-bit types: read a chunk of raw halves, widen it, repeat.
  std::vector<uint16_t> buf(std::min<size_t>(count, kChunkBytes / 2));
  const bool is_bf16 = e.dtype == DType::kBF16;
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(buf.size(), count - done);
    pread_all(fd_, path_, buf.data(), n * 2, start + uint64_t(done) * 2);
    if (is_bf16) {
      for (size_t i = 0; i < n; ++i) dst[done + i] = bf16_to_f32(buf[i]);
    } else {
      for (size_t i = 0; i < n; ++i) dst[done + i] = f16_to_f32(buf[i]);
    }
    done += n;
  }
}

namespace {

// Makes the rename itself durable (io.h's fsync_path); failure here is not fatal to correctness
// of the file's contents, but a crash right after could lose the new name, so it is still
// reported.
void fsync_parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  ckpt::fsync_path(dir, /*directory=*/true);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the caller's tensor order in the header, which readers that show the
  // header (and people diffing files) see.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail_io(path, "cannot write a tensor named '" + t.name + "'");
    if (!names.insert(t.name).second) fail_io(path, "tensor '" + t.name + "' is given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        fail_io(path, "tensor '" + t.name + "' has a negative dimension " + shape_str(t.shape));
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
        fail_io(path, "tensor '" + t.name + "' has too many elements");
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes))
      fail_io(path, "tensor '" + t.name + "' has too many bytes");
    if (nbytes > 0 && t.data == nullptr) fail_io(path, "tensor '" + t.name + "' has no data");
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(nbytes);
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    fail_io(path, "cannot encode the header (" + json_error_words(e) + ")");
  }
  // The format allows trailing spaces in the header; padding to a multiple of 8 puts the data
  // section on an 8-byte boundary so that a reader's mmap can be used in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(tmp, "cannot create: " + errno_text(errno));
  try {
    ckpt::write_all(fd, len_bytes, 8, tmp);
    ckpt::write_all(fd, text.data(), text.size(), tmp);
    for (size_t i = 0; i < tensors.size(); ++i)
      if (sizes[i] > 0) ckpt::write_all(fd, tensors[i].data, sizes[i], tmp);
    if (::fsync(fd) != 0) fail_io(tmp, "fsync failed: " + errno_text(errno));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail_io(tmp, "close failed: " + errno_text(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail_io(tmp, "cannot rename to '" + path + "': " + errno_text(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent_dir(path);
}

}  // namespace ft
