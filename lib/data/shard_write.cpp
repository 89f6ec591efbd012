// ShardWriter (shard.h): one shard written through libhdf5 under PATH.tmp, renamed on close.
#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "data/shard.h"
#include "data/shard_internal.h"

namespace ft {
namespace {

using detail::H5Handle;
using detail::Hdf5Lock;

constexpr uint64_t kDocChunk = 4096;  // doc_offsets chunk length (8 bytes each)

hid_t file_token_type(int token_bytes) { return token_bytes == 2 ? H5T_STD_U16LE : H5T_STD_U32LE; }

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

}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65535 ? 2 : 4; }

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
  FT_CHECK(!attrs.preference || options.loss_mask, "a preference shard needs a loss_mask");
  m.token_bytes = token_bytes_for_vocab(attrs.vocab_size);
  m.file =
      H5Handle(H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!m.file.valid())
    FT_FAIL("cannot create ", m.tmp_path, " (does the folder exist and is it writable?)");
  hid_t f = m.file.get();
  write_string_attr(f, "format", attrs.preference ? kPreferenceShardFormat : kShardFormat,
                    m.tmp_path);
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

}  // namespace ft
