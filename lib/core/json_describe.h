// How a JSON value reads in an error message ("the string \"abc\"", "an object", "1.5"), for
// readers that check untrusted JSON (checkpoint manifests, the loss scaler's saved state); and
// what a JSON library error says, in words (no "[json.exception.parse_error.101]" code, at most a
// short excerpt of the input).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/files.h"

namespace ft {

// "an array", "an object", "a string", "a number", "a boolean", "null", for messages.
template <typename Json>
std::string a_json_type(const Json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  return "null";
}

inline std::string describe_json_value(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_null()) return "null";
  if (v.is_boolean()) return std::string("the bool ") + (v.get<bool>() ? "true" : "false");
  if (v.is_string()) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return "the string " + s;
  }
  if (v.is_number_float()) return "the non-integer " + v.dump();
  return v.dump();
}

// nlohmann's message without its "[json.exception.KIND.NNN] " code, and the input it quotes
// ("last read: '...'") cut to a short excerpt: "parse error at line 3, column 17: syntax error
// while parsing object - invalid literal; last read: \"tru\"".
inline std::string json_error_words(const nlohmann::json::exception& e) {
  std::string w = e.what();
  if (w.rfind("[json.exception.", 0) == 0) {
    const size_t close = w.find("] ");
    if (close != std::string::npos) w = w.substr(close + 2);
  }
  const std::string quote = "; last read: '";
  if (const size_t q = w.find(quote); q != std::string::npos) {
    std::string read = w.substr(q + quote.size());
    if (!read.empty() && read.back() == '\'') read.pop_back();
    // The library quotes what it read of the token, which can be the whole of a long line.
    const size_t keep = read.size() > 40 ? read.size() - 40 : 0;
    w = w.substr(0, q) + "; last read: " + (keep ? "…" : "") + excerpt(read.substr(keep), 40);
  }
  // A number nlohmann cannot hold is quoted whole ("number overflow parsing '1e999'"), however
  // many digits it has.
  if (const size_t n = w.find(" parsing '"); n != std::string::npos && w.size() - n > 60)
    w = w.substr(0, n + 10) + excerpt(w.substr(n + 10), 30);
  return w;
}

// v.dump(), cut to about `max_bytes` (at a UTF-8 boundary, "..." appended), for messages that
// show a value of an untrusted file.
inline std::string short_dump(const nlohmann::json& v, size_t max_bytes = 60) {
  std::string d = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (d.size() <= max_bytes) return d;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(d[cut]) & 0xC0) == 0x80) --cut;
  return d.substr(0, cut) + "...";
}

}  // namespace ft
