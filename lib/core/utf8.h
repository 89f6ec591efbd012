// UTF-8 validity. Text that ends up in JSON (metrics, manifests, exported configs) must be valid
// UTF-8 — nlohmann::json refuses to write anything else — so strings that reach it from a user
// (recipe values, paths) are checked when they are read, where the error can name the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft {

// Text that must be valid UTF-8 but may not be (a JSONL line, a tokenizer's input) is repaired
// as Python's bytes.decode("utf-8", errors="replace") does: replace_invalid_utf8 below.
//
// True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
// U+10FFFF).
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = uint8_t(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// `s` with every maximal invalid subpart replaced by U+FFFD (Unicode §3.9, "U+FFFD
// Substitution of Maximal Subparts", what Python's errors="replace" gives): a lead byte followed
// by the continuation bytes that could still have completed it is one replacement; any other
// bad byte is one replacement. `replaced`, when given, receives the [begin, end) of each
// replaced subpart in `s`, in order.
inline std::string replace_invalid_utf8(
    std::string_view s, std::vector<std::pair<size_t, size_t>>* replaced = nullptr) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    int len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the valid range of the second byte
    if (c < 0x80) {
      out.push_back(char(c));
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    size_t ok = 1;  // bytes of a valid prefix so far
    while (len > 0 && ok < size_t(len) && i + ok < s.size()) {
      const uint8_t cc = uint8_t(s[i + ok]);
      const bool valid = ok == 1 ? (cc >= lo && cc <= hi) : (cc >= 0x80 && cc <= 0xBF);
      if (!valid) break;
      ++ok;
    }
    if (len > 0 && ok == size_t(len)) {
      out.append(s.substr(i, ok));
    } else {
      out += "\xEF\xBF\xBD";
      if (replaced) replaced->emplace_back(i, i + ok);
    }
    i += ok;
  }
  return out;
}

}  // namespace ft
