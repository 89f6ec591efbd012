// SHA-256 (FIPS 180-4), used to fingerprint the tokenizer model file so that shards written
// with one tokenizer are never trained with another (DESIGN.md §6 `tokenizer_sha256`).
// A few dozen lines here instead of a crypto dependency; speed is irrelevant for files of
// a few MB.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ft {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The digest of everything passed to update(); the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();
  // finish() as 64 lowercase hex digits.
  std::string finish_hex();

 private:
  void compress(const uint8_t* block);  // one 64-byte block
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const void* data, size_t n);
// Hex SHA-256 of a file's bytes; throws ft::Error naming the file when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace ft
