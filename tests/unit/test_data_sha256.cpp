// SHA-256 against the FIPS 180-4 / NIST example vectors, plus odd-sized incremental updates
// (the buffering across 64-byte blocks is where hand-written hashes go wrong).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "data/sha256.h"

using ft::sha256_hex;

TEST_CASE("data/sha256: known vectors") {
  CHECK(sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks =
      "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 448 bits
  CHECK(sha256_hex(two_blocks.data(), two_blocks.size()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  CHECK(sha256_hex(million.data(), million.size()) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("data/sha256: padding edge lengths and incremental updates agree with one shot") {
  // 55, 56, 63, 64, 65 bytes straddle the one-or-two padding blocks boundary.
  std::string data;
  for (int i = 0; i < 1000; ++i) data += char('a' + (i * 7) % 26);
  for (size_t len : {1, 55, 56, 57, 63, 64, 65, 119, 128, 1000}) {
    const std::string one_shot = sha256_hex(data.data(), len);
    for (size_t piece : {1, 3, 63, 64, 65}) {
      ft::Sha256 h;
      for (size_t off = 0; off < len; off += piece)
        h.update(data.data() + off, std::min(piece, len - off));
      CHECK_MESSAGE(h.finish_hex() == one_shot, "len ", len, " piece ", piece);
    }
  }
  // Pinned: sha256 of 55 'a's (padding fits in one block) and of 56 'a's (needs a second block).
  const std::string a55(55, 'a'), a56(56, 'a');
  CHECK(sha256_hex(a55.data(), 55) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(sha256_hex(a56.data(), 56) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
}

TEST_CASE("data/sha256: file hash and a missing file") {
  const std::string path = (std::filesystem::temp_directory_path() / "ft_test_sha256.bin").string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  std::fwrite("abc", 1, 3, f);
  std::fclose(f);
  CHECK(ft::sha256_file_hex(path) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(ft::sha256_file_hex(path), doctest::Contains("ft_test_sha256.bin"),
                       ft::Error);
}
