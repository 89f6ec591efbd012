// The SentencePiece tokenizer behind one small interface, so that only tokenizer.cpp includes
// sentencepiece_processor.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ft {

class Tokenizer {
 public:
  // Loads a SentencePiece model file; throws ft::Error naming the file when it cannot.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, without BOS/EOS. Safe to call from several threads at once
  // (SentencePiece's encoding is const).
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int64_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model defines none
  int32_t eos_id() const;  // -1 when the model defines none
  const std::string& path() const;
  const std::string& sha256() const;  // hex SHA-256 of the model file's bytes

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
