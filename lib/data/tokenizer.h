// One tokenizer interface, two kinds behind it (DESIGN.md §6 "Tokenizers"):
//   SentencePiece   a `.model` file (tokenizer.cpp; only it includes sentencepiece_processor.h)
//   byte-level BPE  a Hugging Face `tokenizer.json` (bpe_*.cpp; PCRE2 for its regexes)
// load_tokenizer() picks by the path: a folder, a `.json` file, or anything else (SentencePiece).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, without BOS/EOS. Safe to call from several threads at once.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // encode(text), and in *offsets the bytes of `text` each token stands for, [begin, end), as
  // the `tokenizers` library's offsets map a token back through its normalizer: text NFC
  // changed (or invalid UTF-8 replaced) is followed as whole stretches, so a token made from
  // such a stretch stands for the stretch of the original (the normalization segment, e.g.
  // "e" + U+0301 for "é"); an added token stands for what it matched, with the whitespace its
  // lstrip/rstrip took. Begins and ends never decrease. The default (SentencePiece) decodes
  // each token and fails unless they spell `text` byte for byte.
  virtual std::vector<int32_t> encode_with_offsets(
      std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  virtual int64_t vocab_size() const = 0;  // 1 + the largest id the tokenizer can produce
  virtual int32_t bos_id() const = 0;      // -1 when the tokenizer defines none
  virtual int32_t eos_id() const = 0;      // -1 when the tokenizer defines none
  // Whether `id` is a special token: an added token of tokenizer.json marked `special: true`
  // (chat data trains on the one that ends an assistant turn). SentencePiece: never.
  virtual bool is_special(int32_t id) const {
    (void)id;
    return false;
  }
  // The file read (a folder resolved to its tokenizer file) and the hex SHA-256 of its bytes,
  // which shards record as tokenizer_sha256.
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }

 protected:
  std::string path_, sha256_;
};

// The file a tokenizer path names: the path itself when it is a file; for a folder (a Hugging
// Face model folder), its tokenizer.model when it holds one (SentencePiece, what ft read before
// tokenizer.json support), else its tokenizer.json. Throws UsageError for a folder with neither
// (naming what it found, e.g. Mistral's tekken.json, which ft does not read).
std::string resolve_tokenizer_file(const std::string& path);

// Loads the tokenizer `path` names (resolve_tokenizer_file): a `.json` file as a Hugging Face
// tokenizer.json (byte-level BPE), anything else as a SentencePiece model. Throws ft::Error
// naming the file (and the key, for tokenizer.json) when it cannot.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The SentencePiece kind (tokenizer.cpp). A file that is not one fails with a message that
// names the format when it recognises it (a tiktoken rank file).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& file);
// The byte-level BPE kind (bpe_load.cpp reads it, bpe_tokenizer.cpp encodes).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& file);

}  // namespace ft
