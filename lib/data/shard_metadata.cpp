// Reading and checking one shard's metadata with libhdf5 (DESIGN.md §6): attributes, dataset
// types, shapes and storage, doc_offsets, bos/eos ids, and where the values of tokens and
// loss_mask lie in the file. libhdf5 trusts the bytes it reads, so this runs only in the check
// child (shard_check.cpp), where a crash or an endless loop is contained.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "core/error.h"
#include "data/shard_internal.h"

namespace ft::detail {
namespace {

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
      if (H5Dget_chunk_info_by_coord(ds, coord, &filter_mask, &at, &size) < 0 || at == HADDR_UNDEF)
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
                              FT_FAIL(path, ": doc_offsets[", i, "] = ", v[j],
                                      " is below doc_offsets[", i - 1, "] = ", prev,
                                      " (document starts must be sorted)");
                            if (v[j] > n_tokens)
                              FT_FAIL(path, ": doc_offsets[", i, "] = ", v[j],
                                      " is past the end of tokens (", n_tokens, " values)");
                            prev = v[j];
                          }
                        });
}

void check_special_id(const char* name, int64_t id, int64_t vocab, const std::string& path) {
  if (id < -1 || id >= vocab)
    FT_FAIL(path, ": ", name, " ", id, " is not a token id of the vocabulary (vocab_size ", vocab,
            "; -1 means the tokenizer has none)");
}

}  // namespace

ShardInfo read_shard_metadata(const std::string& path, uint64_t file_bytes) {
  H5Handle file = open_shard_file(path);
  ShardInfo info;
  info.path = path;
  info.file_bytes = file_bytes;
  hid_t root = file.get();
  std::string format = read_string_attr(root, "format", path);
  if (format != kShardFormat && format != kPreferenceShardFormat)
    FT_FAIL(path, ": format is '", format, "', expected '", kShardFormat, "' or '",
            kPreferenceShardFormat, "'");
  info.attrs.preference = format == kPreferenceShardFormat;
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
  H5Handle tokens = open_shard_dataset(root, "tokens", path, true);
  info.num_tokens = check_1d_unsigned(tokens.get(), "tokens", {2, 4}, path, &token_bytes);
  info.token_bytes = int(token_bytes);
  H5Handle docs = open_shard_dataset(root, "doc_offsets", path, true);
  info.num_documents = check_1d_unsigned(docs.get(), "doc_offsets", {8}, path);
  H5Handle mask = open_shard_dataset(root, "loss_mask", path, false);
  if (mask.valid()) {
    uint64_t n = check_1d_unsigned(mask.get(), "loss_mask", {1}, path);
    if (n != info.num_tokens)
      FT_FAIL(path, ": loss_mask has ", n, " values but tokens has ", info.num_tokens);
    info.has_loss_mask = true;
  }
  if (info.attrs.preference && !info.has_loss_mask)
    FT_FAIL(path, ": a preference shard (format '", kPreferenceShardFormat,
            "') has no loss_mask dataset; it marks the completions that count");
  if (info.attrs.preference && info.num_documents % 2 != 0)
    FT_FAIL(path, ": a preference shard holds pairs (chosen, rejected), but it has ",
            info.num_documents, " documents, an odd number");
  check_doc_offsets(docs.get(), info.num_documents, info.num_tokens, path);
  info.tokens =
      dataset_layout(tokens.get(), "tokens", info.num_tokens, info.token_bytes, file_bytes, path);
  if (info.has_loss_mask)
    info.loss_mask = dataset_layout(mask.get(), "loss_mask", info.num_tokens, 1, file_bytes, path);
  return info;
}

}  // namespace ft::detail
