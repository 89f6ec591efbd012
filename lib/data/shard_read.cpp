// Reading a folder of shards (ShardSet, shard.h). libhdf5 stays out of the data path: the check
// child (shard_check.cpp) reports the file offsets of contiguous data and of every unfiltered
// chunk, the parent checks each against the file size (shard_report.cpp), and windows are read
// here with pread. Only datasets that need libhdf5 to decode (compressed chunks, compact or
// external storage, which h5py users may write) are read through libhdf5, and only after the
// child has read them in full once: same bytes, same code path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "data/shard.h"
#include "data/shard_internal.h"

namespace ft {

using detail::H5Handle;
using detail::Hdf5Lock;
namespace fs = std::filesystem;

std::vector<std::string> list_shard_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) FT_FAIL(dir, ": no such shard folder");
  if (!fs::is_directory(dir, ec)) FT_FAIL(dir, ": not a folder (expected a folder of *.h5 shards)");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  // Each is a regular file, checked before anything opens it (a FIFO would block libhdf5's open
  // in the check child until its time limit; a device is no shard).
  for (const std::string& f : files)
    check_regular_file(f, kMaxShardBytes, "shard",
                       "a shard folder holds the *.h5 files `ft tokenize` writes");
  if (ec) FT_FAIL(dir, ": cannot list the folder: ", ec.message());
  if (files.empty())
    FT_FAIL(dir, ": no *.h5 shard files; create them with `ft tokenize --output ", dir, " ...`");
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

static_assert(std::endian::native == std::endian::little,
              "the pread path assumes a little-endian host (values are swapped from BE only)");

// Reads exactly `n` bytes at `at`, or throws: a shard that shrank since the check is an error.
void pread_exact(int fd, void* out, uint64_t n, uint64_t at, const std::string& path,
                 const char* name) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) FT_FAIL(path, ": cannot read ", name, ": ", std::strerror(errno));
    if (r == 0)
      FT_FAIL(path, ": ", name, " ends early at byte ", at,
              " (was the shard truncated or rewritten while ft was reading it?)");
    p += r, at += uint64_t(r), n -= uint64_t(r);
  }
}

// Values [start, start + count) of a contiguous or chunked dataset, as stored bytes into `out`
// (count * elem_bytes), swapped to little-endian. Offsets were bounds-checked when parsed.
void pread_values(int fd, const DatasetLayout& l, uint64_t start, uint64_t count, uint8_t* out,
                  const std::string& path, const char* name) {
  const uint64_t eb = uint64_t(l.elem_bytes);
  uint8_t* p = out;
  if (l.kind == DatasetLayout::Kind::kContiguous) {
    pread_exact(fd, p, count * eb, l.offset + start * eb, path, name);
  } else {
    for (uint64_t i = start, left = count; left > 0;) {
      const uint64_t k = i / l.chunk_len, in = i % l.chunk_len;
      const uint64_t take = std::min(left, l.chunk_len - in);
      FT_CHECK(k < l.chunk_offsets.size(), path, ": ", name, " index ", i, " has no chunk");
      pread_exact(fd, p, take * eb, l.chunk_offsets[k] + in * eb, path, name);
      p += take * eb, i += take, left -= take;
    }
  }
  if (l.big_endian && eb > 1)
    for (uint64_t j = 0; j < count; ++j) std::reverse(out + j * eb, out + (j + 1) * eb);
}

}  // namespace

struct ShardSet::Impl {
  // One open shard: a file descriptor for the pread path; for kLibrary datasets the HDF5 file
  // and datasets, kept open between reads.
  struct Open {
    int fd = -1;
    H5Handle file, tokens, mask, tokens_space, mask_space;
    uint64_t last_use = 0;
    ~Open() {
      if (fd >= 0) ::close(fd);
    }
  };
  std::string dir;
  std::vector<ShardInfo> shards;
  ShardAttributes attrs;
  uint64_t total_tokens = 0, total_documents = 0;
  int max_open = 64;
  std::vector<std::unique_ptr<Open>> open;  // (shards,) null when closed
  std::vector<size_t> open_list;            // indices currently open
  uint64_t use_clock = 0;
  std::vector<uint8_t> scratch;  // (count * token_bytes,) stored bytes of one window

  Open& get(size_t s) {
    if (!open[s]) {
      if (int(open_list.size()) >= max_open) {  // close the least recently used shard
        auto lru = std::min_element(open_list.begin(), open_list.end(), [&](size_t a, size_t b) {
          return open[a]->last_use < open[b]->last_use;
        });
        open[*lru].reset();
        open_list.erase(lru);
      }
      auto o = std::make_unique<Open>();
      const ShardInfo& info = shards[s];
      const std::string& path = info.path;
      o->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (o->fd < 0) FT_FAIL(path, ": cannot open: ", std::strerror(errno));
      struct stat st {};
      if (::fstat(o->fd, &st) != 0 || uint64_t(st.st_size) != info.file_bytes)
        FT_FAIL(path, ": changed since it was checked (", uint64_t(st.st_size), " bytes, was ",
                info.file_bytes, "); is something rewriting the shard folder?");
      // libhdf5 opens only what the check child has already read in full without harm.
      if (info.tokens.kind == DatasetLayout::Kind::kLibrary ||
          info.loss_mask.kind == DatasetLayout::Kind::kLibrary)
        o->file = detail::open_shard_file(path);
      if (info.tokens.kind == DatasetLayout::Kind::kLibrary) {
        o->tokens = detail::open_shard_dataset(o->file.get(), "tokens", path, true);
        o->tokens_space = H5Handle(H5Dget_space(o->tokens.get()), H5Sclose);
      }
      if (info.has_loss_mask && info.loss_mask.kind == DatasetLayout::Kind::kLibrary) {
        o->mask = detail::open_shard_dataset(o->file.get(), "loss_mask", path, true);
        o->mask_space = H5Handle(H5Dget_space(o->mask.get()), H5Sclose);
      }
      open[s] = std::move(o);
      open_list.push_back(s);
    }
    open[s]->last_use = ++use_clock;
    return *open[s];
  }
};

ShardSet::ShardSet(const std::string& dir, int max_open_files)
    : ShardSet(dir, check_shards(list_shard_files(dir)), max_open_files) {}

ShardSet::ShardSet(const std::string& dir, std::vector<ShardInfo> checked, int max_open_files)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.max_open = std::max(1, max_open_files);
  m.shards = std::move(checked);
  FT_CHECK(!m.shards.empty(), dir, ": no shards");
  const ShardInfo& first = m.shards.front();
  m.attrs = first.attrs;
  for (const ShardInfo& s : m.shards) {
    auto differs = [&](const char* what, const auto& mine, const auto& theirs) {
      FT_FAIL(s.path, ": ", what, " ", mine, " differs from ", theirs, " in ", first.path,
              "; every shard of a folder must come from the same tokenizer (re-run `ft tokenize`)");
    };
    if (s.attrs.preference != first.attrs.preference)
      FT_FAIL(s.path, ": holds ", s.attrs.preference ? "preference pairs" : "token documents",
              " but ", first.path, " holds ",
              first.attrs.preference ? "preference pairs" : "token documents",
              "; a folder holds one kind of shard");
    if (s.attrs.vocab_size != first.attrs.vocab_size)
      differs("vocab_size", s.attrs.vocab_size, first.attrs.vocab_size);
    if (s.attrs.tokenizer_sha256 != first.attrs.tokenizer_sha256)
      differs("tokenizer_sha256", s.attrs.tokenizer_sha256, first.attrs.tokenizer_sha256);
    if (s.attrs.bos_id != first.attrs.bos_id) differs("bos_id", s.attrs.bos_id, first.attrs.bos_id);
    if (s.attrs.eos_id != first.attrs.eos_id) differs("eos_id", s.attrs.eos_id, first.attrs.eos_id);
    m.total_tokens += s.num_tokens;
    m.total_documents += s.num_documents;
  }
  m.open.resize(m.shards.size());
}

ShardSet::~ShardSet() {
  Hdf5Lock lock;
  impl_->open.clear();
}

const std::string& ShardSet::dir() const { return impl_->dir; }
const std::vector<ShardInfo>& ShardSet::shards() const { return impl_->shards; }
const ShardAttributes& ShardSet::attrs() const { return impl_->attrs; }
uint64_t ShardSet::total_tokens() const { return impl_->total_tokens; }
uint64_t ShardSet::total_documents() const { return impl_->total_documents; }

void ShardSet::read(size_t shard, uint64_t start, uint64_t count, int32_t* tokens, uint8_t* mask) {
  Impl& m = *impl_;
  FT_CHECK(shard < m.shards.size(), "shard index ", shard, " out of range");
  const ShardInfo& info = m.shards[shard];
  FT_CHECK(start <= info.num_tokens && count <= info.num_tokens - start, info.path, ": window [",
           start, ", ", start + count, ") is past the end (", info.num_tokens, " tokens)");
  if (count == 0) return;
  Hdf5Lock lock;  // also guards the open-file table and the scratch buffer
  Impl::Open& o = m.get(shard);
  hsize_t h_start[1] = {start}, h_count[1] = {count};
  auto read_library = [&](hid_t ds, hid_t space, hid_t mem_type, void* out, const char* name) {
    H5Handle mem_space(H5Screate_simple(1, h_count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(space, H5S_SELECT_SET, h_start, nullptr, h_count, nullptr) < 0 ||
        H5Dread(ds, mem_type, mem_space.get(), space, H5P_DEFAULT, out) < 0)
      FT_FAIL(info.path, ": cannot read ", name, "[", start, ", ", start + count,
              ") (truncated or corrupt shard?)");
  };
  // Stored width first, then widened to int32.
  m.scratch.resize(count * uint64_t(info.token_bytes));
  if (info.tokens.kind == DatasetLayout::Kind::kLibrary)
    read_library(o.tokens.get(), o.tokens_space.get(),
                 info.token_bytes == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32, m.scratch.data(),
                 "tokens");
  else
    pread_values(o.fd, info.tokens, start, count, m.scratch.data(), info.path, "tokens");
  if (info.token_bytes == 2) {
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, m.scratch.data() + 2 * i, 2);
      tokens[i] = v;
    }
  } else {
    std::memcpy(tokens, m.scratch.data(), 4 * count);
  }
  const uint64_t vocab = uint64_t(info.attrs.vocab_size);
  for (uint64_t i = 0; i < count; ++i) {
    if (uint64_t(uint32_t(tokens[i])) >= vocab)
      FT_FAIL(info.path, ": token id ", uint32_t(tokens[i]), " at index ", start + i,
              " is >= vocab_size ", vocab, " (corrupt shard, or tokenized with another tokenizer)");
  }
  if (mask) {
    if (!info.has_loss_mask)
      std::fill(mask, mask + count, uint8_t(1));
    else if (info.loss_mask.kind == DatasetLayout::Kind::kLibrary)
      read_library(o.mask.get(), o.mask_space.get(), H5T_NATIVE_UINT8, mask, "loss_mask");
    else
      pread_values(o.fd, info.loss_mask, start, count, mask, info.path, "loss_mask");
    // A mask is 0 or 1: another value would scale that target's loss (DESIGN.md §6).
    for (uint64_t i = 0; i < count; ++i)
      if (mask[i] > 1)
        throw UsageError(detail::concat(info.path, ": loss_mask value ", int(mask[i]), " at index ",
                                        start + i,
                                        " (loss_mask holds 0 or 1: whether the target at that "
                                        "position is trained on); fix the shard's writer, or "
                                        "re-create it with `ft tokenize`"));
  }
}

std::vector<uint64_t> ShardSet::read_doc_offsets(size_t shard) {
  Impl& m = *impl_;
  FT_CHECK(shard < m.shards.size(), "shard index ", shard, " out of range");
  const ShardInfo& info = m.shards[shard];
  std::vector<uint64_t> offsets(info.num_documents);
  Hdf5Lock lock;
  m.get(shard);  // checks that the file is the one the child checked (its size)
  H5Handle file = detail::open_shard_file(info.path);
  H5Handle ds = detail::open_shard_dataset(file.get(), "doc_offsets", info.path, true);
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space.get()) != hssize_t(info.num_documents))
    FT_FAIL(info.path, ": doc_offsets changed since the shard was checked");
  if (!offsets.empty() &&
      H5Dread(ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0)
    FT_FAIL(info.path, ": cannot read doc_offsets (truncated or corrupt shard?)");
  for (size_t d = 0; d < offsets.size(); ++d)
    if ((d == 0 && offsets[0] != 0) || (d > 0 && offsets[d] < offsets[d - 1]) ||
        offsets[d] > info.num_tokens)
      FT_FAIL(info.path, ": doc_offsets[", d, "] = ", offsets[d],
              " breaks the rules it was checked against (start at 0, never decrease, at most ",
              info.num_tokens, "); was the shard rewritten while ft was reading it?");
  return offsets;
}

}  // namespace ft
