// Reading shards defensively. libhdf5 trusts the file it reads: fuzzed shards crash it
// (SIGSEGV inside a variable-length string attribute) or make it loop forever, and nothing
// short of rewriting it makes every path safe. So whatever libhdf5 does with a shard's bytes
// happens first in a child process with a time limit (check_shards: posix_spawn of
// /proc/self/exe, entered through an ELF constructor below; one child per folder, not per
// file, to keep startup cheap). The child opens each shard, reads and checks all metadata
// (attributes, dataset types, shapes and storage, doc_offsets, bos/eos ids) and reports back
// on a pipe; a crash, a signal or the time limit becomes an error naming the file.
//
// The parent then keeps libhdf5 out of its data path: the child reports the file offsets of
// contiguous data and of every unfiltered chunk, the parent checks each against the file size
// and reads windows with pread. Only datasets that need libhdf5 to decode (compressed chunks,
// compact or external storage, which h5py users may write) are read through libhdf5 in the
// parent, and only after the child has read them in full once: same bytes, same code path.
#include "data/shard.h"

#include <hdf5.h>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>

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

// ---- the check child: everything libhdf5 does with a shard's bytes -----------------------

// Reads values [0, n) of a 1-D dataset in blocks and hands each block to `visit`. Blocks keep
// memory bounded whatever length a corrupt header claims; the time limit bounds the rest.
template <typename T, typename Visit>
void read_blocks(hid_t ds, hid_t mem_type, uint64_t n, const char* name, const std::string& path,
                 Visit visit) {
  constexpr uint64_t kBlock = 1 << 16;
  H5Handle space(H5Dget_space(ds), H5Sclose);
  std::vector<T> buf;
  for (uint64_t start = 0; start < n; start += kBlock) {
    hsize_t h_start[1] = {start}, h_count[1] = {std::min(kBlock, n - start)};
    buf.resize(h_count[0]);
    H5Handle mem(H5Screate_simple(1, h_count, nullptr), H5Sclose);
    if (!space.valid() || !mem.valid() ||
        H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, h_start, nullptr, h_count, nullptr) < 0 ||
        H5Dread(ds, mem_type, mem.get(), space.get(), H5P_DEFAULT, buf.data()) < 0)
      FT_FAIL(path, ": cannot read ", name, "[", start, ", ", start + h_count[0],
              ") (truncated or corrupt shard?)");
    visit(start, buf);
  }
}

// Where the n values of dataset `name` lie in a file of `file_bytes` bytes. Contiguous and
// unfiltered chunked storage get their byte offsets (so the parent reads them with pread);
// anything else is read here once in full, so that every chunk has been decoded by libhdf5
// before the parent lets libhdf5 read it again.
DatasetLayout dataset_layout(hid_t ds, const char* name, uint64_t n, int elem_bytes,
                             uint64_t file_bytes, const std::string& path) {
  DatasetLayout l;
  l.elem_bytes = elem_bytes;
  H5Handle type(H5Dget_type(ds), H5Tclose);
  H5Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!type.valid() || !dcpl.valid()) FT_FAIL(path, ": cannot read dataset '", name, "'");
  l.big_endian = H5Tget_order(type.get()) == H5T_ORDER_BE;
  const H5D_layout_t kind = H5Pget_layout(dcpl.get());
  const int filters = H5Pget_nfilters(dcpl.get());
  const int external = H5Pget_external_count(dcpl.get());
  const uint64_t eb = uint64_t(elem_bytes);
  auto too_long = [&](uint64_t needed) {
    FT_FAIL(path, ": dataset '", name, "' claims ", n, " values (", needed,
            " bytes) but the file has only ", file_bytes, " bytes (truncated or corrupt shard)");
  };
  if (kind == H5D_CONTIGUOUS && external == 0) {
    if (n == 0) return l;
    if (n > file_bytes / eb) too_long(n * eb);
    const haddr_t at = H5Dget_offset(ds);
    if (at == HADDR_UNDEF)
      FT_FAIL(path, ": dataset '", name, "' has no stored values (incomplete shard?)");
    if (at > file_bytes || n * eb > file_bytes - at) too_long(n * eb);
    l.offset = at;
    return l;
  }
  if (kind == H5D_CHUNKED && filters == 0 && external == 0) {
    hsize_t chunk[1] = {0};
    if (H5Pget_chunk(dcpl.get(), 1, chunk) != 1 || chunk[0] == 0 || chunk[0] > (1ull << 32))
      FT_FAIL(path, ": dataset '", name, "' has an unreadable chunk shape (corrupt shard?)");
    l.kind = DatasetLayout::Kind::kChunked;
    l.chunk_len = chunk[0];
    const uint64_t chunk_bytes = l.chunk_len * eb;
    const uint64_t chunks = n / l.chunk_len + (n % l.chunk_len != 0);
    // Unfiltered chunks are stored whole, so a length the file cannot hold is corrupt; checked
    // before walking the chunk index so that a huge claimed length costs nothing.
    if (chunks > file_bytes / chunk_bytes) too_long(n * eb);
    l.chunk_offsets.reserve(chunks);
    for (uint64_t k = 0; k < chunks; ++k) {
      hsize_t coord[1] = {k * l.chunk_len}, size = 0;
      unsigned filter_mask = 0;
      haddr_t at = HADDR_UNDEF;
      if (H5Dget_chunk_info_by_coord(ds, coord, &filter_mask, &at, &size) < 0 ||
          at == HADDR_UNDEF)
        FT_FAIL(path, ": chunk ", k, " of dataset '", name,
                "' is missing (incomplete or corrupt shard)");
      if (size != chunk_bytes || at > file_bytes || size > file_bytes - at)
        FT_FAIL(path, ": chunk ", k, " of dataset '", name, "' (", size, " bytes at ", at,
                ") does not fit the file (", file_bytes, " bytes; corrupt shard)");
      l.chunk_offsets.push_back(at);
    }
    return l;
  }
  l.kind = DatasetLayout::Kind::kLibrary;
  const hid_t mem = eb == 1 ? H5T_NATIVE_UINT8 : eb == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
  read_blocks<uint32_t>(ds, mem, n, name, path, [](uint64_t, const std::vector<uint32_t>&) {});
  return l;
}

// doc_offsets start at 0 (the shard starts a document), never decrease (documents may be
// empty) and stay <= num_tokens. Streamed, so a huge claimed length costs no memory.
void check_doc_offsets(hid_t ds, uint64_t n_docs, uint64_t n_tokens, const std::string& path) {
  if (n_docs == 0) {
    if (n_tokens > 0)
      FT_FAIL(path, ": doc_offsets is empty but tokens has ", n_tokens,
              " values (doc_offsets must start with 0)");
    return;
  }
  uint64_t prev = 0;
  read_blocks<uint64_t>(ds, H5T_NATIVE_UINT64, n_docs, "doc_offsets", path,
                        [&](uint64_t start, const std::vector<uint64_t>& v) {
    for (size_t j = 0; j < v.size(); ++j) {
      const uint64_t i = start + j;
      if (i == 0 && v[j] != 0)
        FT_FAIL(path, ": doc_offsets[0] is ", v[j],
                ", must be 0 (the first document starts the shard)");
      if (v[j] < prev)
        FT_FAIL(path, ": doc_offsets[", i, "] = ", v[j], " is below doc_offsets[", i - 1,
                "] = ", prev, " (document starts must be sorted)");
      if (v[j] > n_tokens)
        FT_FAIL(path, ": doc_offsets[", i, "] = ", v[j], " is past the end of tokens (",
                n_tokens, " values)");
      prev = v[j];
    }
  });
}

void check_special_id(const char* name, int64_t id, int64_t vocab, const std::string& path) {
  if (id < -1 || id >= vocab)
    FT_FAIL(path, ": ", name, " ", id, " is not a token id of the vocabulary (vocab_size ", vocab,
            "; -1 means the tokenizer has none)");
}

ShardInfo read_info_locked(const std::string& path, uint64_t file_bytes) {
  H5Handle file = open_file(path);
  ShardInfo info;
  info.path = path;
  info.file_bytes = file_bytes;
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
  check_special_id("bos_id", info.attrs.bos_id, info.attrs.vocab_size, path);
  check_special_id("eos_id", info.attrs.eos_id, info.attrs.vocab_size, path);

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
  check_doc_offsets(docs.get(), info.num_documents, info.num_tokens, path);
  info.tokens = dataset_layout(tokens.get(), "tokens", info.num_tokens, info.token_bytes,
                               file_bytes, path);
  if (info.has_loss_mask)
    info.loss_mask = dataset_layout(mask.get(), "loss_mask", info.num_tokens, 1, file_bytes, path);
  return info;
}

// ---- the report: child to parent -----------------------------------------------------------
//
// Text lines, one record each, fields separated by one space; strings travel hex-encoded:
//   begin I                     before the child touches file I (so a crash names the file)
//   error I HEX(message)        file I is bad; the child stops here
//   shard I TOKENS DOCS VOCAB BOS EOS HEX(sha256) TOKEN_BYTES HAS_MASK
//   data I tokens|loss_mask contiguous|chunked|library ELEM_BYTES BIG_ENDIAN OFFSET CHUNK_LEN
//        N_CHUNKS CHUNK_OFFSET...                        (one line)
//   end I

std::string hex_encode(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * s.size() + 1);
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
  return out.empty() ? "-" : out;  // never an empty field
}

const char* layout_name(DatasetLayout::Kind k) {
  switch (k) {
    case DatasetLayout::Kind::kContiguous: return "contiguous";
    case DatasetLayout::Kind::kChunked: return "chunked";
    case DatasetLayout::Kind::kLibrary: return "library";
  }
  return "?";
}

std::string data_record(size_t i, const char* name, const DatasetLayout& l) {
  std::string r = detail::concat("data ", i, " ", name, " ", layout_name(l.kind), " ",
                                 l.elem_bytes, " ", int(l.big_endian), " ", l.offset, " ",
                                 l.chunk_len, " ", l.chunk_offsets.size());
  for (uint64_t at : l.chunk_offsets) {
    r += ' ';
    r += std::to_string(at);
  }
  r += '\n';
  return r;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ::_exit(3);  // the parent is gone; nobody is left to tell
    done += size_t(w);
  }
}

// The child's entry point. check_shards() spawns /proc/self/exe — whichever program this is:
// ft, the unit tests, a fuzz harness — with argv[1] == kCheckArg. glibc hands argc/argv to ELF
// constructors, so this runs before that program's main() and never returns into it: every
// program that links this file can check shards without its main() knowing about it.
constexpr const char* kCheckArg = "__ft_shard_check__";
#if defined(__SANITIZE_ADDRESS__)  // GCC
#define FT_UNDER_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define FT_UNDER_ASAN 1
#endif
#endif
constexpr rlim_t kCheckMemoryBytes = rlim_t(2) << 30;  // heap of the check child

__attribute__((constructor)) void shard_check_entry(int argc, char** argv, char** /*envp*/) {
  if (argc < 2 || !argv || !argv[1] || std::strcmp(argv[1], kCheckArg) != 0) return;
  // A corrupt length makes libhdf5 allocate and copy gigabytes (measured: 6 GiB within 16 s on
  // one fuzzed attribute); a data limit turns that into a quick allocation failure, which
  // libhdf5 reports as an error. Not under AddressSanitizer, whose shadow memory is counted.
#if !defined(FT_UNDER_ASAN)
  const rlimit data_limit{kCheckMemoryBytes, kCheckMemoryBytes};
  ::setrlimit(RLIMIT_DATA, &data_limit);
#endif
  std::vector<std::string> paths(argv + 2, argv + argc);
  ::_exit(detail::run_shard_check(paths, STDOUT_FILENO));
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

// ---- the check: child side -----------------------------------------------------------------

namespace detail {

int run_shard_check(const std::vector<std::string>& paths, int fd) {
  Hdf5Lock lock;
  for (size_t i = 0; i < paths.size(); ++i) {
    write_all(fd, detail::concat("begin ", i, "\n"));
    std::string record;
    try {
      struct stat st {};
      if (::stat(paths[i].c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        FT_FAIL(paths[i], ": no such shard file");
      const ShardInfo s = read_info_locked(paths[i], uint64_t(st.st_size));
      record = detail::concat("shard ", i, " ", s.num_tokens, " ", s.num_documents, " ",
                              s.attrs.vocab_size, " ", s.attrs.bos_id, " ", s.attrs.eos_id, " ",
                              hex_encode(s.attrs.tokenizer_sha256), " ", s.token_bytes, " ",
                              int(s.has_loss_mask), "\n");
      record += data_record(i, "tokens", s.tokens);
      if (s.has_loss_mask) record += data_record(i, "loss_mask", s.loss_mask);
      record += detail::concat("end ", i, "\n");
    } catch (const std::bad_alloc&) {
      write_all(fd, detail::concat("error ", i, " ",
                                   hex_encode(paths[i] + ": damaged: its metadata asks for more "
                                                         "memory than there is (corrupt shard)"),
                                   "\n"));
      return 0;
    } catch (const std::exception& e) {
      write_all(fd, detail::concat("error ", i, " ", hex_encode(e.what()), "\n"));
      return 0;
    }
    write_all(fd, record);
  }
  return 0;
}

// ---- the check: parent side ----------------------------------------------------------------

std::vector<ShardInfo> parse_shard_report(const std::string& report,
                                          const std::vector<std::string>& paths,
                                          const std::vector<uint64_t>& file_bytes) {
  FT_CHECK(paths.size() == file_bytes.size(), "parse_shard_report: sizes differ");
  std::vector<ShardInfo> out;
  size_t pos = 0, line_no = 0;
  std::vector<std::string_view> f;  // fields of the current line
  auto bad = [&](const std::string& why) -> void {
    const std::string& who = out.size() < paths.size() ? paths[out.size()] : paths.back();
    FT_FAIL(who, ": the shard check sent a malformed report (line ", line_no, ": ", why,
            "); this is a bug in ft, please report it");
  };
  auto next_line = [&]() -> bool {
    if (pos >= report.size()) return false;
    size_t end = report.find('\n', pos);
    if (end == std::string::npos) bad("unterminated line");
    std::string_view line(report.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    f.clear();
    while (!line.empty()) {
      size_t sp = line.find(' ');
      f.push_back(line.substr(0, sp));
      if (sp == std::string_view::npos) break;
      line.remove_prefix(sp + 1);
    }
    return true;
  };
  auto u64 = [&](size_t k) -> uint64_t {
    uint64_t v = 0;
    if (k >= f.size()) bad("missing field");
    auto [p, ec] = std::from_chars(f[k].data(), f[k].data() + f[k].size(), v);
    if (ec != std::errc() || p != f[k].data() + f[k].size() || f[k].empty()) bad("not a number");
    return v;
  };
  auto i64 = [&](size_t k) -> int64_t {
    int64_t v = 0;
    if (k >= f.size()) bad("missing field");
    auto [p, ec] = std::from_chars(f[k].data(), f[k].data() + f[k].size(), v);
    if (ec != std::errc() || p != f[k].data() + f[k].size() || f[k].empty()) bad("not a number");
    return v;
  };
  auto hex = [&](size_t k) -> std::string {
    if (k >= f.size()) bad("missing field");
    std::string_view h = f[k];
    if (h == "-") return {};
    if (h.size() % 2) bad("odd hex string");
    std::string s;
    for (size_t j = 0; j < h.size(); j += 2) {
      auto nib = [&](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        bad("bad hex digit");
        return 0;
      };
      s += char(nib(h[j]) * 16 + nib(h[j + 1]));
    }
    return s;
  };
  auto expect = [&](const char* tag, size_t i, size_t n_fields) {
    if (!next_line()) bad(detail::concat("ended before '", tag, "'"));
    if (f.empty() || f[0] != tag) bad(detail::concat("expected '", tag, "'"));
    if (n_fields && f.size() != n_fields)
      bad(detail::concat("'", tag, "' has ", f.size(), " fields"));
    if (u64(1) != i) bad("records out of order");
  };
  auto layout = [&](size_t i, const char* name, const ShardInfo& s, int elem_bytes) {
    expect("data", i, 0);
    if (f.size() < 9 || f[2] != name) bad(detail::concat("expected the layout of ", name));
    DatasetLayout l;
    if (f[3] == "contiguous") l.kind = DatasetLayout::Kind::kContiguous;
    else if (f[3] == "chunked") l.kind = DatasetLayout::Kind::kChunked;
    else if (f[3] == "library") l.kind = DatasetLayout::Kind::kLibrary;
    else bad("unknown layout");
    l.elem_bytes = int(u64(4));
    if (l.elem_bytes != elem_bytes) bad("element size differs");
    const uint64_t be = u64(5);
    if (be > 1) bad("bad byte-order flag");
    l.big_endian = be == 1;
    l.offset = u64(6);
    l.chunk_len = u64(7);
    const uint64_t chunks = u64(8);
    if (f.size() != 9 + chunks) bad("chunk count differs from the offsets given");
    const uint64_t n = s.num_tokens, eb = uint64_t(elem_bytes), size = s.file_bytes;
    // The bounds the pread path relies on, checked here against the size this process saw.
    auto out_of_file = [&](uint64_t at, uint64_t bytes) {
      FT_FAIL(s.path, ": ", name, " (", bytes, " bytes at offset ", at,
              ") lies beyond the end of the file (", size,
              " bytes); truncated or corrupt shard: re-create it with `ft tokenize`");
    };
    if (l.kind == DatasetLayout::Kind::kContiguous) {
      if (chunks != 0 || l.chunk_len != 0) bad("contiguous data with chunks");
      if (n > 0 && (n > size / eb || l.offset > size || n * eb > size - l.offset))
        out_of_file(l.offset, n * eb);
    } else if (l.kind == DatasetLayout::Kind::kChunked) {
      if (l.chunk_len == 0 || l.chunk_len > (1ull << 32)) bad("bad chunk length");
      if (chunks != n / l.chunk_len + (n % l.chunk_len != 0)) bad("wrong number of chunks");
      const uint64_t chunk_bytes = l.chunk_len * eb;
      l.chunk_offsets.reserve(chunks);
      for (uint64_t k = 0; k < chunks; ++k) {
        const uint64_t at = u64(9 + k);
        if (at > size || chunk_bytes > size - at) out_of_file(at, chunk_bytes);
        l.chunk_offsets.push_back(at);
      }
    } else if (chunks != 0) {
      bad("library data with chunks");
    }
    return l;
  };

  for (size_t i = 0; i < paths.size(); ++i) {
    expect("begin", i, 2);
    if (!next_line()) bad("ended inside a record");
    if (!f.empty() && f[0] == "error") {
      if (f.size() != 3 || u64(1) != i) bad("malformed error");
      const std::string msg = hex(2);
      throw Error(msg.empty() ? paths[i] + ": rejected by the shard check" : msg);
    }
    if (f.size() != 10 || f[0] != "shard" || u64(1) != i) bad("expected 'shard'");
    ShardInfo s;
    s.path = paths[i];
    s.file_bytes = file_bytes[i];
    s.num_tokens = u64(2);
    s.num_documents = u64(3);
    s.attrs.vocab_size = i64(4);
    s.attrs.bos_id = i64(5);
    s.attrs.eos_id = i64(6);
    s.attrs.tokenizer_sha256 = hex(7);
    s.token_bytes = int(u64(8));
    const uint64_t mask = u64(9);
    if (s.token_bytes != 2 && s.token_bytes != 4) bad("token size");
    if (mask > 1) bad("loss_mask flag");
    if (s.attrs.vocab_size < 1 || s.attrs.vocab_size > (int64_t(1) << 31)) bad("vocab_size");
    for (int64_t id : {s.attrs.bos_id, s.attrs.eos_id})
      if (id < -1 || id >= s.attrs.vocab_size) bad("bos/eos id");
    s.has_loss_mask = mask == 1;
    s.tokens = layout(i, "tokens", s, s.token_bytes);
    if (s.has_loss_mask) s.loss_mask = layout(i, "loss_mask", s, 1);
    expect("end", i, 2);
    out.push_back(std::move(s));
  }
  if (next_line()) bad("trailing records");
  return out;
}

}  // namespace detail

namespace {

// FT_SHARD_CHECK_TIMEOUT_S: seconds the check may spend on one shard before the file counts
// as damaged, plus 1 s per 50 MiB of the file (compressed data is decoded once in full).
double check_time_limit_s(uint64_t file_bytes) {
  double base = 30;
  if (const char* e = std::getenv("FT_SHARD_CHECK_TIMEOUT_S")) base = std::max(0.1, std::atof(e));
  return base + double(file_bytes) / double(50 << 20);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Runs one child over `paths` and returns its report; throws naming the file it was on when
// it crashed or ran out of time.
std::string run_check_child(const std::vector<std::string>& paths,
                            const std::vector<uint64_t>& file_bytes) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    FT_FAIL(paths.front(), ": cannot check the shard: pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> args = {"ft-shard-check", kCheckArg};
  args.insert(args.end(), paths.begin(), paths.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // One thread in the child: OpenBLAS starts its pool when it is loaded, for nothing here.
  std::vector<std::string> env = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "FT_NO_REEXEC=1"};
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    if (!v.starts_with("OPENBLAS_NUM_THREADS=") && !v.starts_with("OMP_NUM_THREADS=") &&
        !v.starts_with("FT_NO_REEXEC="))
      env.emplace_back(v);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  // posix_spawn, not fork(): an MPI rank must not fork (Open MPI's registered memory), and
  // spawning is the same fork-then-exec that Open MPI accepts.
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    FT_FAIL(paths.front(), ": cannot start the shard check (/proc/self/exe): ",
            std::strerror(rc));
  }

  std::string report;
  long current = -1;  // the file the child is on: the last "begin I" seen
  size_t scanned = 0;
  double limit_s = check_time_limit_s(file_bytes.front());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  bool timed_out = false;
  char buf[1 << 16];
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, int(std::min<int64_t>(wait.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above decides
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // EOF: the child is done (or died)
    report.append(buf, size_t(r));
    // A new "begin I" restarts the clock with file I's own limit.
    for (size_t nl; (nl = report.find('\n', scanned)) != std::string::npos; scanned = nl + 1) {
      if (report.compare(scanned, 6, "begin ") != 0) continue;
      current = std::strtol(report.c_str() + scanned + 6, nullptr, 10);
      if (current >= 0 && size_t(current) < paths.size()) {
        limit_s = check_time_limit_s(file_bytes[size_t(current)]);
        deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
      }
    }
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool on_file = current >= 0 && size_t(current) < paths.size();
  const std::string& who = on_file ? paths[size_t(current)] : paths.front();
  if (timed_out) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.0f", limit_s);
    FT_FAIL(who, ": damaged: reading it with libhdf5 did not finish in ", secs,
            " s (a corrupt shard can make libhdf5 loop forever); re-create it with `ft tokenize`"
            " (on a very slow file system, raise FT_SHARD_CHECK_TIMEOUT_S)");
  }
  if (WIFSIGNALED(status) && !on_file)  // before any file: not the shards' fault
    FT_FAIL(who, ": the shard check process (this program, run again through /proc/self/exe) "
            "died of ", signal_name(WTERMSIG(status)), " before reading any shard");
  if (WIFSIGNALED(status))
    FT_FAIL(who, ": damaged: reading it crashed libhdf5 (", signal_name(WTERMSIG(status)),
            ", in the shard check's child process); re-create it with `ft tokenize`");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    FT_FAIL(who, ": the shard check process failed (exit status ", WEXITSTATUS(status), ")");
  return report;
}

}  // namespace

std::vector<ShardInfo> check_shards(const std::vector<std::string>& paths) {
  std::vector<uint64_t> sizes;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) FT_FAIL(p, ": no such shard file");
    sizes.push_back(uint64_t(st.st_size));
  }
  // One child per batch of files; batches keep each command line well under ARG_MAX.
  constexpr size_t kBatchArgBytes = 512 << 10;
  std::vector<ShardInfo> out;
  for (size_t begin = 0; begin < paths.size();) {
    size_t end = begin, bytes = 0;
    while (end < paths.size() && (end == begin || bytes + paths[end].size() < kBatchArgBytes))
      bytes += paths[end++].size() + 1;
    const std::vector<std::string> batch(paths.begin() + long(begin), paths.begin() + long(end));
    const std::vector<uint64_t> batch_sizes(sizes.begin() + long(begin), sizes.begin() + long(end));
    for (ShardInfo& s :
         detail::parse_shard_report(run_check_child(batch, batch_sizes), batch, batch_sizes))
      out.push_back(std::move(s));
    begin = end;
  }
  return out;
}

ShardInfo read_shard_info(const std::string& path) { return check_shards({path}).front(); }

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

// ---- ShardSet: windows by pread, or through libhdf5 for what only it can decode ------------

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
        o->file = open_file(path);
      if (info.tokens.kind == DatasetLayout::Kind::kLibrary) {
        o->tokens = open_dataset(o->file.get(), "tokens", path, true);
        o->tokens_space = H5Handle(H5Dget_space(o->tokens.get()), H5Sclose);
      }
      if (info.has_loss_mask && info.loss_mask.kind == DatasetLayout::Kind::kLibrary) {
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
  }
}

}  // namespace ft
