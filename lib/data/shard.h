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
// Uncompressed chunks let a reader fetch exactly those bytes (no chunk decode, no chunk cache),
// so a random window costs one small pread whatever the shard size; chunking (rather than
// contiguous storage) lets the writer append without knowing the final length.
//
// Reading is defensive (shard_check.cpp says how): libhdf5 runs on a shard's bytes only in a
// child process with time limits, and the windows of unfiltered datasets are read with pread at
// the file offsets the child reported, bounds-checked against the file size. Every HDF5 call in
// this process goes through one process-wide mutex: the loader's prefetch threads and the
// writers may run at the same time, and not every libhdf5 build is thread-safe. HDF5's own
// error-stack printing is silenced; failures become ft::Error messages that name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

inline constexpr const char* kShardFormat = "ft-tokens";
// Preference pairs (DESIGN.md §6 "Preference data"): the same datasets, a loss_mask always, an
// even number of documents; documents 2k and 2k + 1 are pair k's chosen and rejected sequences
// (prompt + completion), and loss_mask marks their completions' tokens.
inline constexpr const char* kPreferenceShardFormat = "ft-preference";
inline constexpr int64_t kShardVersion = 1;

struct ShardAttributes {
  bool preference = false;  // format "ft-preference" (else "ft-tokens")
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

// Where the values of one 1-D dataset lie in the file, as the shard check found them.
struct DatasetLayout {
  enum class Kind {
    kContiguous,  // n values from `offset`
    kChunked,     // unfiltered chunks of `chunk_len` values; chunk k at chunk_offsets[k]
    kLibrary,     // anything else (compressed, compact, external): read through libhdf5
  };
  Kind kind = Kind::kContiguous;
  int elem_bytes = 1;       // 1, 2 or 4
  bool big_endian = false;  // as stored; values are swapped on read
  uint64_t offset = 0;
  uint64_t chunk_len = 0;
  std::vector<uint64_t> chunk_offsets;  // (ceil(n / chunk_len),)
};

// What one shard holds, from its metadata (no token data is read by the caller).
struct ShardInfo {
  std::string path;
  uint64_t file_bytes = 0;  // size when checked; a shard that changes afterwards is an error
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
  bool has_loss_mask = false;
  int token_bytes = 2;  // 2 or 4, as stored
  ShardAttributes attrs;
  DatasetLayout tokens, loss_mask;
};

// Checks that `path` is a complete ft-tokens shard, in a child process (shard_check.cpp): HDF5
// opens it within the time limit without crashing, the datasets and attributes exist with the
// right types, format and version match, bos_id/eos_id are -1 or < vocab_size, and doc_offsets
// start at 0, never decrease and stay <= num_tokens. Throws ft::Error naming the file and the
// problem ("damaged: reading it crashed libhdf5 (SIGSEGV)", "... did not finish in N s").
ShardInfo read_shard_info(const std::string& path);

// The same check for several files in one child process (cheaper than one child each);
// returns their infos in order, or throws for the first file that fails.
std::vector<ShardInfo> check_shards(const std::vector<std::string>& paths);

// The check child is this program, started again (posix_spawn of /proc/self/exe) with the
// arguments `__ft_shard_check__ PARENT_PID FILE...`. Every program that checks shards calls this
// first thing in main(), before anything that starts threads or MPI: when this process is such
// a child it runs the check and exits (never returns); otherwise it returns at once.
// check_shards() throws in a program that has not called it.
void run_shard_check_if_child(int argc, char** argv);

namespace detail {
// The parent's side of the check, exposed for the fuzz harness: parses the child's report on
// `paths` (file sizes `file_bytes`) and checks every offset against the file size. Throws
// ft::Error on anything malformed or out of bounds.
std::vector<ShardInfo> parse_shard_report(const std::string& report,
                                          const std::vector<std::string>& paths,
                                          const std::vector<uint64_t>& file_bytes);
}  // namespace detail

// The *.h5 files of a folder in name order. Throws if the folder is missing or holds none.
std::vector<std::string> list_shard_files(const std::string& dir);

// A folder of shards opened for reading windows of tokens. The constructor validates every
// shard (check_shards) and that all agree on vocab_size, bos/eos ids and tokenizer hash.
// At most `max_open_files` shards are open at once (least recently used are closed): a file
// descriptor each on the pread path; through libhdf5 (compressed shards) ~0.6 MiB each (HDF5's
// per-file metadata cache index, measured with libhdf5 1.10) and ~100 us per reopen.
class ShardSet {
 public:
  explicit ShardSet(const std::string& dir, int max_open_files = 32);
  // Over shards already checked (by check_shards or detail::parse_shard_report), in order.
  ShardSet(const std::string& dir, std::vector<ShardInfo> checked, int max_open_files = 32);
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

  // The whole doc_offsets of shard `shard` (num_documents values), read through libhdf5 after
  // the check child has read them in full (the rule for libhdf5 in this process, shard_read.cpp);
  // throws naming the file if they no longer start at 0, rise and stay within the tokens.
  std::vector<uint64_t> read_doc_offsets(size_t shard);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
