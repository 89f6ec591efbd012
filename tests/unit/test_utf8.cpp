// is_valid_utf8 (lib/core/utf8.h): the check that keeps non-UTF-8 recipe strings out of JSON.
#include <doctest/doctest.h>

#include <string>

#include "core/utf8.h"

TEST_CASE("utf8: well-formed text passes, every kind of malformed sequence fails") {
  using ft::is_valid_utf8;
  CHECK(is_valid_utf8(""));
  CHECK(is_valid_utf8("runs/quickstart"));
  CHECK(is_valid_utf8("caf\xc3\xa9"));               // é, two bytes
  CHECK(is_valid_utf8("\xe6\x97\xa5\xe6\x9c\xac"));  // 日本, three bytes each
  CHECK(is_valid_utf8("\xf0\x9f\x98\x80"));          // U+1F600, four bytes
  CHECK(is_valid_utf8("\xf4\x8f\xbf\xbf"));          // U+10FFFF, the last code point
  CHECK(is_valid_utf8(std::string("a\0b", 3)));      // NUL is valid UTF-8

  CHECK_FALSE(is_valid_utf8("caf\xe9"));               // Latin-1 é
  CHECK_FALSE(is_valid_utf8("\xc3"));                  // truncated at the end
  CHECK_FALSE(is_valid_utf8("\xc3\x28"));              // bad continuation byte
  CHECK_FALSE(is_valid_utf8("\x80"));                  // lone continuation byte
  CHECK_FALSE(is_valid_utf8("\xc0\xaf"));              // overlong '/'
  CHECK_FALSE(is_valid_utf8("\xe0\x80\xaf"));          // overlong, three bytes
  CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));          // UTF-16 surrogate U+D800
  CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));      // U+110000, past the last code point
  CHECK_FALSE(is_valid_utf8("\xf8\x88\x80\x80\x80"));  // five-byte form
  CHECK_FALSE(is_valid_utf8("\xff\xfe"));
}
