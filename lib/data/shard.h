// Tokenized HDF5 shards (DESIGN.md §6): writing one shard, and reading a folder of them.
//
// A shard file holds
//   tokens       (n,)  uint16 when vocab_size <= 65535, else uint32; chunked, uncompressed
//   doc_offsets  (d,)  uint64, the index in `tokens` where each document starts
//   loss_mask    (n,)  uint8, optional: 1 = token i counts as a training target
// and the attributes format="ft-tokens", version=1, vocab_size, bos_id, eos_id (int64; -1 when
// the tokenizer has no such token and documents therefore carry none) and tokenizer_sha256.
//
// Why chunked and uncompressed: a training step reads a few hundred tokens at random places.
// Uncompressed chunks let HDF5 read exactly those bytes (no chunk decode, no chunk cache), so
// a random window costs one small pread whatever the shard size; chunking (rather than
// contiguous storage) lets the writer append without knowing the final length.
//
// Every HDF5 call in lib/data goes through one process-wide mutex: the loader's prefetch
// threads and the writers may run at the same time, and not every libhdf5 build is
// thread-safe. HDF5's own error-stack printing is silenced; failures become ft::Error messages
// that name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

inline constexpr const char* kShardFormat = "ft-tokens";
inline constexpr int64_t kShardVersion = 1;

struct ShardAttributes {
  int64_t vocab_size = 0;
  int64_t bos_id = -1;           // -1: the tokenizer has no BOS and documents start without one
  int64_t eos_id = -1;           // -1: likewise for EOS
  std::string tokenizer_sha256;  // hex SHA-256 of the tokenizer model file
};

// Bytes per stored token for a vocabulary: 2 (uint16) when vocab_size <= 65535, else 4.
int token_bytes_for_vocab(int64_t vocab_size);

// Writes one shard. The file is built under `path + ".tmp"` and renamed to `path` by close(),
// so a crash never leaves a half-written file with a name that readers pick up (*.h5).
class ShardWriter {
 public:
  struct Options {
    bool loss_mask = false;           // write a loss_mask dataset (then every add passes one)
    uint64_t chunk_tokens = 1 << 16;  // HDF5 chunk length of tokens / loss_mask
  };
  ShardWriter(const std::string& path, const ShardAttributes& attrs, const Options& options);
  ShardWriter(const std::string& path, const ShardAttributes& attrs)
      : ShardWriter(path, attrs, Options{}) {}
  ~ShardWriter();  // without close(): deletes the temporary file
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Starts a new document (records its offset) and appends its tokens. `mask` (n values) is
  // required when the shard has a loss_mask, and ignored otherwise. Ids must fit the token
  // type; they are not checked against vocab_size here (the loader checks what it reads), so
  // tests can write deliberately bad shards.
  void add_document(const int32_t* tokens, size_t n, const uint8_t* mask = nullptr);
  void add_document(const std::vector<int32_t>& tokens, const std::vector<uint8_t>* mask = nullptr);

  uint64_t num_tokens() const;
  uint64_t num_documents() const;
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What one shard holds, read from its metadata (no token data is read).
struct ShardInfo {
  std::string path;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
  bool has_loss_mask = false;
  int token_bytes = 2;  // 2 or 4, as stored
  ShardAttributes attrs;
};

// Opens `path` and checks it is a complete ft-tokens shard: HDF5 opens it, the datasets and
// attributes exist with the right types, format and version match. Throws ft::Error naming
// the file and the problem.
ShardInfo read_shard_info(const std::string& path);

// The *.h5 files of a folder in name order. Throws if the folder is missing or holds none.
std::vector<std::string> list_shard_files(const std::string& dir);

// A folder of shards opened for reading windows of tokens. The constructor validates every
// shard (read_shard_info) and that all agree on vocab_size, bos/eos ids and tokenizer hash.
// At most `max_open_files` shards are open at once (least recently used are closed). Measured
// with libhdf5 1.10: an open shard costs ~0.6 MiB (mostly HDF5's per-file metadata cache
// index) and reopening one ~100 us, so shuffling over far more shards than stay open is
// bounded by opens (~10k windows/s with 256 shards) but never by memory.
class ShardSet {
 public:
  explicit ShardSet(const std::string& dir, int max_open_files = 32);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  const std::string& dir() const;
  const std::vector<ShardInfo>& shards() const;
  const ShardAttributes& attrs() const;  // common to every shard
  uint64_t total_tokens() const;
  uint64_t total_documents() const;

  // Reads tokens[start, start + count) of shard `shard` into `tokens` and, when `mask` is not
  // null, loss_mask over the same range (all 1 when the shard has none). Throws, naming the
  // file and the index, when a token id is >= vocab_size. Safe to call from several threads.
  void read(size_t shard, uint64_t start, uint64_t count, int32_t* tokens, uint8_t* mask);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
