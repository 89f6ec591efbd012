// Bounded reads of user-named files and message excerpts (lib/core/files.h).
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "core/files.h"
#include "temp_dir.h"

namespace {

std::string refusal(const std::string& path, uint64_t max) {
  try {
    ft::read_bounded_file(path, max, "tokenizer", "give a tokenizer.json");
  } catch (const ft::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("files: a regular file within the limit is read whole") {
  TempDir d;
  { std::ofstream(d.file("t.json")) << "{\"a\": 1}"; }
  CHECK(ft::read_bounded_file(d.file("t.json"), 64, "config") == "{\"a\": 1}");
  CHECK(ft::check_regular_file(d.file("t.json"), 64, "config") == 8);
  // Exactly at the limit passes, one byte over does not.
  CHECK(ft::read_bounded_file(d.file("t.json"), 8, "config").size() == 8);
  CHECK(refusal(d.file("t.json"), 7).find("more than the 7 bytes") != std::string::npos);
  std::ofstream(d.file("empty"));
  CHECK(ft::read_bounded_file(d.file("empty"), 8, "config").empty());
}

TEST_CASE("files: devices, FIFOs, folders, sockets and dangling links are refused by kind") {
  TempDir d;
  const std::string zero = refusal("/dev/zero", 1 << 20);
  CHECK(zero.find("tokenizer /dev/zero: is a character device, not a regular file") == 0);
  CHECK(zero.find("give a tokenizer.json") != std::string::npos);

  REQUIRE(::mkfifo(d.file("fifo").c_str(), 0600) == 0);
  // Must return at once (no writer is ever opened): a blocking open would hang the test.
  CHECK(refusal(d.file("fifo"), 1 << 20).find("is a FIFO (named pipe)") != std::string::npos);
  CHECK(refusal(d.path, 1 << 20).find("is a folder") != std::string::npos);
  CHECK(refusal(d.file("nothing"), 1 << 20).find(": no such file") != std::string::npos);
  REQUIRE(::symlink(d.file("nothing").c_str(), d.file("dangling").c_str()) == 0);
  CHECK(refusal(d.file("dangling"), 1 << 20).find("symbolic link to nothing") != std::string::npos);
  CHECK(ft::file_kind(d.file("fifo")) == "a FIFO (named pipe)");
  CHECK(ft::file_kind(d.file("nothing")) == "missing");

  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = d.file("sock");
  if (sock.size() < sizeof addr.sun_path) {
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    CHECK(refusal(sock, 1 << 20).find("is a socket") != std::string::npos);
  }
  ::close(s);
}

TEST_CASE("files: excerpt quotes at most max_chars characters, escaped") {
  CHECK(ft::excerpt("abc") == "\"abc\"");
  CHECK(ft::excerpt(std::string(1000, 'x'), 5) == "\"xxxxx\"…");
  CHECK(ft::excerpt("a\nb\t\"c\\") == "\"a\\nb\\t\\\"c\\\\\"");
  CHECK(ft::excerpt(std::string("\x01\x7f", 2)) == "\"\\x01\\x7f\"");
  // Whole code points are kept and counted as one character each; invalid bytes are escaped.
  CHECK(ft::excerpt("caf\xc3\xa9!", 4) == "\"caf\xc3\xa9\"…");
  CHECK(ft::excerpt("caf\xe9") == "\"caf\\xe9\"");
  CHECK(ft::excerpt("\xc3") == "\"\\xc3\"");
  CHECK(ft::excerpt("\xed\xa0\x80") == "\"\\xed\\xa0\\x80\"");  // a surrogate: not UTF-8
  // A 100 MB line gives a message of bounded length.
  CHECK(ft::excerpt(std::string(100 << 20, '{')).size() < 100);
}
