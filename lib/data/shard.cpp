#include "data/shard.h"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// See shard.h: one lock for every HDF5 call in lib/data. Recursive because public entry
// points call each other (ShardSet's constructor calls read_shard_info).
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

// Holds the HDF5 lock and makes sure HDF5 does not print its error stack on this thread
// (the error-reporting setting is per thread in thread-safe builds of libhdf5).
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) {
    thread_local bool quiet = false;
    if (!quiet) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      quiet = true;
    }
  }

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Owns one HDF5 identifier; closes it with the matching H5?close. Destroy only under Hdf5Lock.
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_, close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~H5Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

constexpr uint64_t kDocChunk = 4096;  // doc_offsets chunk length (8 bytes each)

hid_t file_token_type(int token_bytes) { return token_bytes == 2 ? H5T_STD_U16LE : H5T_STD_U32LE; }

// ---- writing -----------------------------------------------------------------------------

H5Handle create_extendable(hid_t file, const char* name, hid_t type, uint64_t chunk,
                           const std::string& path) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk_dims[1] = {chunk};
  H5Handle space(H5Screate_simple(1, dims, maxdims), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // No modification times in object headers: the same input then gives byte-identical shards.
  if (!space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl.get(), 1, chunk_dims) < 0 ||
      H5Pset_obj_track_times(dcpl.get(), false) < 0)
    FT_FAIL(path, ": cannot set up dataset '", name, "'");
  H5Handle ds(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
              H5Dclose);
  if (!ds.valid()) FT_FAIL(path, ": cannot create dataset '", name, "' (disk full?)");
  return ds;
}

// Appends n elements of memory type `mem_type` to a 1-D extendable dataset of length `len`.
void append(hid_t ds, uint64_t len, const void* data, uint64_t n, hid_t mem_type,
            const std::string& path, const char* name) {
  if (n == 0) return;
  hsize_t new_len[1] = {len + n}, start[1] = {len}, count[1] = {n};
  bool ok = H5Dset_extent(ds, new_len) >= 0;
  H5Handle file_space(H5Dget_space(ds), H5Sclose);
  H5Handle mem_space(H5Screate_simple(1, count, nullptr), H5Sclose);
  ok = ok && file_space.valid() && mem_space.valid() &&
       H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
       H5Dwrite(ds, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data) >= 0;
  if (!ok) FT_FAIL(path, ": cannot write ", n, " values to '", name, "' (disk full?)");
}

void write_int_attr(hid_t obj, const char* name, int64_t value, const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    FT_FAIL(path, ": cannot write attribute '", name, "'");
}

// Variable-length UTF-8, which is what h5py writes for a Python str (and reads back as str).
void write_string_attr(hid_t obj, const char* name, const std::string& value,
                       const std::string& path) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char* p = value.c_str();
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), &p) < 0)
    FT_FAIL(path, ": cannot write attribute '", name, "'");
}

// ---- reading -----------------------------------------------------------------------------

H5Handle open_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) FT_FAIL(path, ": no such shard file");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid())
    FT_FAIL(path,
            ": cannot open as HDF5 (truncated or corrupt shard? re-run `ft tokenize` "
            "for this folder)");
  return file;
}

H5Handle open_dataset(hid_t file, const char* name, const std::string& path, bool required) {
  htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  if (exists <= 0) {
    if (required)
      FT_FAIL(path, ": dataset '", name, "' is missing; not an ft-tokens shard (DESIGN.md §6)");
    return {};
  }
  // Chunk cache off: windows are small and random, so HDF5 reads exactly the requested bytes
  // of an uncompressed chunk and leaves locality to the OS page cache. Keeps memory per open
  // shard near zero.
  H5Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0);
  H5Handle ds(H5Dopen2(file, name, dapl.get()), H5Dclose);
  if (!ds.valid()) FT_FAIL(path, ": cannot open dataset '", name, "' (corrupt shard?)");
  return ds;
}

// Length of a 1-D integer dataset whose elements are `allowed_bytes` wide (any of them), unsigned.
uint64_t check_1d_unsigned(hid_t ds, const char* name, std::initializer_list<size_t> allowed_bytes,
                           const std::string& path, size_t* bytes_out = nullptr) {
  H5Handle type(H5Dget_type(ds), H5Tclose);
  H5Handle space(H5Dget_space(ds), H5Sclose);
  if (!type.valid() || !space.valid()) FT_FAIL(path, ": cannot read dataset '", name, "'");
  size_t bytes = H5Tget_size(type.get());
  bool size_ok =
      std::find(allowed_bytes.begin(), allowed_bytes.end(), bytes) != allowed_bytes.end();
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
      !size_ok) {
    std::string want;
    for (size_t b : allowed_bytes)
      want += (want.empty() ? "uint" : " or uint") + std::to_string(8 * b);
    FT_FAIL(path, ": dataset '", name, "' must be ", want, " (DESIGN.md §6)");
  }
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    FT_FAIL(path, ": dataset '", name, "' must be one-dimensional");
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  if (bytes_out) *bytes_out = bytes;
  return dims[0];
}

H5Handle open_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0)
    FT_FAIL(path, ": attribute '", name, "' is missing; not an ft-tokens shard (DESIGN.md §6)");
  H5Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (!attr.valid() || !space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1)
    FT_FAIL(path, ": attribute '", name, "' must be a single value");
  return attr;
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  H5Handle attr = open_attr(obj, name, path);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  int64_t v = 0;
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0)
    FT_FAIL(path, ": attribute '", name, "' must be an integer");
  return v;
}

// Accepts both variable-length strings (h5py's str) and fixed-length ones (numpy bytes).
std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  H5Handle attr = open_attr(obj, name, path);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    FT_FAIL(path, ": attribute '", name, "' must be a string");
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* p = nullptr;
    if (H5Aread(attr.get(), mem.get(), &p) < 0 || !p)
      FT_FAIL(path, ": cannot read attribute '", name, "'");
    std::string s(p);
    H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type.get());
  H5Tset_size(mem.get(), n);
  std::string s(n, '\0');
  if (H5Aread(attr.get(), mem.get(), s.data()) < 0)
    FT_FAIL(path, ": cannot read attribute '", name, "'");
  s.resize(std::strlen(s.c_str()));  // fixed-length strings are NUL-padded
  return s;
}

ShardInfo read_info_locked(const std::string& path) {
  H5Handle file = open_file(path);
  ShardInfo info;
  info.path = path;
  hid_t root = file.get();
  std::string format = read_string_attr(root, "format", path);
  if (format != kShardFormat)
    FT_FAIL(path, ": format is '", format, "', expected '", kShardFormat, "'");
  int64_t version = read_int_attr(root, "version", path);
  if (version != kShardVersion)
    FT_FAIL(path, ": shard version ", version, " is not supported (this ft reads version ",
            kShardVersion, "); re-run `ft tokenize` with this ft");
  info.attrs.vocab_size = read_int_attr(root, "vocab_size", path);
  info.attrs.bos_id = read_int_attr(root, "bos_id", path);
  info.attrs.eos_id = read_int_attr(root, "eos_id", path);
  info.attrs.tokenizer_sha256 = read_string_attr(root, "tokenizer_sha256", path);
  if (info.attrs.vocab_size < 1 || info.attrs.vocab_size > (int64_t(1) << 31))
    FT_FAIL(path, ": vocab_size ", info.attrs.vocab_size, " is out of range");

  size_t token_bytes = 0;
  H5Handle tokens = open_dataset(root, "tokens", path, true);
  info.num_tokens = check_1d_unsigned(tokens.get(), "tokens", {2, 4}, path, &token_bytes);
  info.token_bytes = int(token_bytes);
  H5Handle docs = open_dataset(root, "doc_offsets", path, true);
  info.num_documents = check_1d_unsigned(docs.get(), "doc_offsets", {8}, path);
  H5Handle mask = open_dataset(root, "loss_mask", path, false);
  if (mask.valid()) {
    uint64_t n = check_1d_unsigned(mask.get(), "loss_mask", {1}, path);
    if (n != info.num_tokens)
      FT_FAIL(path, ": loss_mask has ", n, " values but tokens has ", info.num_tokens);
    info.has_loss_mask = true;
  }
  return info;
}

}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65535 ? 2 : 4; }

// ---- ShardWriter -------------------------------------------------------------------------

struct ShardWriter::Impl {
  std::string path, tmp_path;
  ShardAttributes attrs;
  Options options;
  int token_bytes = 2;
  H5Handle file, tokens_ds, docs_ds, mask_ds;
  // Buffered appends, flushed a chunk at a time so HDF5 sees few, large writes.
  std::vector<uint32_t> token_buf;  // widened; converted to the file type by HDF5 on write
  std::vector<uint8_t> mask_buf;
  std::vector<uint64_t> doc_buf;
  uint64_t tokens_written = 0, docs_written = 0, mask_written = 0;
  bool closed = false;

  void flush_tokens() {
    append(tokens_ds.get(), tokens_written, token_buf.data(), token_buf.size(), H5T_NATIVE_UINT32,
           tmp_path, "tokens");
    tokens_written += token_buf.size();
    token_buf.clear();
    if (mask_ds.valid()) {
      append(mask_ds.get(), mask_written, mask_buf.data(), mask_buf.size(), H5T_NATIVE_UINT8,
             tmp_path, "loss_mask");
      mask_written += mask_buf.size();
      mask_buf.clear();
    }
  }
  void flush_docs() {
    append(docs_ds.get(), docs_written, doc_buf.data(), doc_buf.size(), H5T_NATIVE_UINT64, tmp_path,
           "doc_offsets");
    docs_written += doc_buf.size();
    doc_buf.clear();
  }
};

ShardWriter::ShardWriter(const std::string& path, const ShardAttributes& attrs,
                         const Options& options)
    : impl_(std::make_unique<Impl>()) {
  Hdf5Lock lock;
  Impl& m = *impl_;
  m.path = path;
  m.tmp_path = path + ".tmp";
  m.attrs = attrs;
  m.options = options;
  FT_CHECK(attrs.vocab_size >= 1, "shard vocab_size must be positive");
  FT_CHECK(options.chunk_tokens >= 1, "chunk_tokens must be positive");
  m.token_bytes = token_bytes_for_vocab(attrs.vocab_size);
  m.file =
      H5Handle(H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!m.file.valid())
    FT_FAIL("cannot create ", m.tmp_path, " (does the folder exist and is it writable?)");
  hid_t f = m.file.get();
  write_string_attr(f, "format", kShardFormat, m.tmp_path);
  write_int_attr(f, "version", kShardVersion, m.tmp_path);
  write_int_attr(f, "vocab_size", attrs.vocab_size, m.tmp_path);
  write_int_attr(f, "bos_id", attrs.bos_id, m.tmp_path);
  write_int_attr(f, "eos_id", attrs.eos_id, m.tmp_path);
  write_string_attr(f, "tokenizer_sha256", attrs.tokenizer_sha256, m.tmp_path);
  m.tokens_ds = create_extendable(f, "tokens", file_token_type(m.token_bytes), options.chunk_tokens,
                                  m.tmp_path);
  m.docs_ds = create_extendable(f, "doc_offsets", H5T_STD_U64LE, kDocChunk, m.tmp_path);
  if (options.loss_mask)
    m.mask_ds = create_extendable(f, "loss_mask", H5T_STD_U8LE, options.chunk_tokens, m.tmp_path);
}

ShardWriter::~ShardWriter() {
  if (!impl_ || impl_->closed) return;
  Hdf5Lock lock;
  impl_->mask_ds.reset();
  impl_->docs_ds.reset();
  impl_->tokens_ds.reset();
  impl_->file.reset();
  std::remove(impl_->tmp_path.c_str());
}

void ShardWriter::add_document(const int32_t* tokens, size_t n, const uint8_t* mask) {
  Impl& m = *impl_;
  FT_CHECK(!m.closed, m.path, ": add_document after close");
  FT_CHECK(!m.mask_ds.valid() || mask || n == 0, m.path, ": this shard has a loss_mask; pass one");
  const uint64_t limit = m.token_bytes == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  Hdf5Lock lock;
  m.doc_buf.push_back(num_tokens());
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || uint64_t(tokens[i]) > limit)
      FT_FAIL(m.path, ": token id ", tokens[i], " does not fit a uint", 8 * m.token_bytes,
              " shard (vocab_size ", m.attrs.vocab_size, ")");
    m.token_buf.push_back(uint32_t(tokens[i]));
    if (m.mask_ds.valid()) m.mask_buf.push_back(mask[i]);
    if (m.token_buf.size() >= m.options.chunk_tokens) m.flush_tokens();
  }
  if (m.doc_buf.size() >= kDocChunk) m.flush_docs();
}

void ShardWriter::add_document(const std::vector<int32_t>& tokens,
                               const std::vector<uint8_t>* mask) {
  FT_CHECK(!mask || mask->size() == tokens.size(), impl_->path,
           ": mask and tokens differ in length");
  add_document(tokens.data(), tokens.size(), mask ? mask->data() : nullptr);
}

uint64_t ShardWriter::num_tokens() const { return impl_->tokens_written + impl_->token_buf.size(); }
uint64_t ShardWriter::num_documents() const { return impl_->docs_written + impl_->doc_buf.size(); }

void ShardWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  Hdf5Lock lock;
  m.flush_tokens();
  m.flush_docs();
  m.mask_ds.reset();
  m.docs_ds.reset();
  m.tokens_ds.reset();
  hid_t f = m.file.get();
  bool ok = H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0;
  m.file.reset();  // H5Fclose writes the remaining metadata
  m.closed = true;
  if (!ok) {
    std::remove(m.tmp_path.c_str());
    FT_FAIL(m.tmp_path, ": cannot finish writing the shard (disk full?)");
  }
  if (std::rename(m.tmp_path.c_str(), m.path.c_str()) != 0) {
    int err = errno;
    std::remove(m.tmp_path.c_str());
    FT_FAIL("cannot rename ", m.tmp_path, " to ", m.path, ": ", std::strerror(err));
  }
}

// ---- reading -----------------------------------------------------------------------------

ShardInfo read_shard_info(const std::string& path) {
  Hdf5Lock lock;
  return read_info_locked(path);
}

std::vector<std::string> list_shard_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) FT_FAIL(dir, ": no such shard folder");
  if (!fs::is_directory(dir, ec)) FT_FAIL(dir, ": not a folder (expected a folder of *.h5 shards)");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  if (ec) FT_FAIL(dir, ": cannot list the folder: ", ec.message());
  if (files.empty())
    FT_FAIL(dir, ": no *.h5 shard files; create them with `ft tokenize --output ", dir, " ...`");
  std::sort(files.begin(), files.end());
  return files;
}

struct ShardSet::Impl {
  // One open shard: the file and its datasets, kept open between reads.
  struct Open {
    H5Handle file, tokens, mask, tokens_space, mask_space;
    uint64_t last_use = 0;
  };
  std::string dir;
  std::vector<ShardInfo> shards;
  ShardAttributes attrs;
  uint64_t total_tokens = 0, total_documents = 0;
  int max_open = 64;
  std::vector<std::unique_ptr<Open>> open;  // (shards,) null when closed
  std::vector<size_t> open_list;            // indices currently open
  uint64_t use_clock = 0;
  std::vector<uint16_t> scratch16;  // (count,) when the shard stores uint16

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
      const std::string& path = shards[s].path;
      o->file = open_file(path);
      o->tokens = open_dataset(o->file.get(), "tokens", path, true);
      o->tokens_space = H5Handle(H5Dget_space(o->tokens.get()), H5Sclose);
      if (shards[s].has_loss_mask) {
        o->mask = open_dataset(o->file.get(), "loss_mask", path, true);
        o->mask_space = H5Handle(H5Dget_space(o->mask.get()), H5Sclose);
      }
      open[s] = std::move(o);
      open_list.push_back(s);
    }
    open[s]->last_use = ++use_clock;
    return *open[s];
  }
};

ShardSet::ShardSet(const std::string& dir, int max_open_files) : impl_(std::make_unique<Impl>()) {
  Hdf5Lock lock;
  Impl& m = *impl_;
  m.dir = dir;
  m.max_open = std::max(1, max_open_files);
  for (const std::string& path : list_shard_files(dir)) m.shards.push_back(read_info_locked(path));
  const ShardInfo& first = m.shards.front();
  m.attrs = first.attrs;
  for (const ShardInfo& s : m.shards) {
    auto differs = [&](const char* what, const auto& mine, const auto& theirs) {
      FT_FAIL(s.path, ": ", what, " ", mine, " differs from ", theirs, " in ", first.path,
              "; every shard of a folder must come from the same tokenizer (re-run `ft tokenize`)");
    };
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
  FT_CHECK(start + count <= info.num_tokens, info.path, ": window [", start, ", ", start + count,
           ") is past the end (", info.num_tokens, " tokens)");
  if (count == 0) return;
  Hdf5Lock lock;
  Impl::Open& o = m.get(shard);
  hsize_t h_start[1] = {start}, h_count[1] = {count};
  H5Handle mem_space(H5Screate_simple(1, h_count, nullptr), H5Sclose);
  auto read_range = [&](hid_t ds, hid_t space, hid_t mem_type, void* out, const char* name) {
    if (H5Sselect_hyperslab(space, H5S_SELECT_SET, h_start, nullptr, h_count, nullptr) < 0 ||
        H5Dread(ds, mem_type, mem_space.get(), space, H5P_DEFAULT, out) < 0)
      FT_FAIL(info.path, ": cannot read ", name, "[", start, ", ", start + count,
              ") (truncated or corrupt shard?)");
  };
  // Read in the stored width (no HDF5 type conversion, which would allocate a conversion
  // buffer per call), then widen to int32.
  if (info.token_bytes == 2) {
    m.scratch16.resize(count);
    read_range(o.tokens.get(), o.tokens_space.get(), H5T_NATIVE_UINT16, m.scratch16.data(),
               "tokens");
    for (uint64_t i = 0; i < count; ++i) tokens[i] = m.scratch16[i];
  } else {
    static_assert(sizeof(int32_t) == sizeof(uint32_t));
    read_range(o.tokens.get(), o.tokens_space.get(), H5T_NATIVE_UINT32, tokens, "tokens");
  }
  const uint64_t vocab = uint64_t(info.attrs.vocab_size);
  for (uint64_t i = 0; i < count; ++i) {
    if (uint64_t(uint32_t(tokens[i])) >= vocab)
      FT_FAIL(info.path, ": token id ", uint32_t(tokens[i]), " at index ", start + i,
              " is >= vocab_size ", vocab, " (corrupt shard, or tokenized with another tokenizer)");
  }
  if (mask) {
    if (info.has_loss_mask)
      read_range(o.mask.get(), o.mask_space.get(), H5T_NATIVE_UINT8, mask, "loss_mask");
    else
      std::fill(mask, mask + count, uint8_t(1));
  }
}

}  // namespace ft
