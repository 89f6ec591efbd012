// The recipe schema's types and lookups (internal to lib/recipe): one KeySpec row per key, the
// table itself in schema.cpp, and how values are written in messages and in recipe_to_yaml.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "recipe/recipe.h"

namespace ft::recipe_internal {

enum class Kind {
  kInt,     // 32-bit signed integer
  kInt64,   // 64-bit signed integer (step counts)
  kUInt64,  // 64-bit unsigned integer (seeds)
  kFloat,   // finite double; integers are accepted too
  kBool,
  kString,     // any scalar; empty means "unset" for optional keys
  kDir,        // string naming an existing directory (checked after parsing)
  kFile,       // string naming an existing regular file (checked after parsing)
  kTokenizer,  // a tokenizer file, or a folder holding one (data/tokenizer.h; checked after
               // parsing)
  kChoice,     // string from a fixed list
  kBetas,      // list of two floats → optimizer.beta1, beta2
  kNames,      // list of names (a single name is a list of one), each one of `choices`; the
               // names are checked by validation, which knows each list's own refusals
};

// A parsed value, in the widest type of its kind.
using Betas = std::array<double, 2>;
using Names = std::vector<std::string>;
using Value = std::variant<int64_t, uint64_t, double, bool, std::string, Betas, Names>;

// Inclusive or exclusive bounds for numeric keys (for kBetas: each element).
struct Range {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const {
    if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
    if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
    return true;
  }
  std::string describe() const;
};

enum class Need {
  kOptional,    // has a default (in recipe.h or derived)
  kRequired,    // must be set
  kUnlessFrom,  // must be set unless model.from provides it
};

struct KeySpec {
  std::string path;  // "section.key"
  Kind kind;
  std::string doc;
  Range range;
  std::vector<std::string> choices;  // kChoice; kNames: what each name may be
  Need need = Need::kOptional;
  std::string hf_name;  // the config.json key that provides it under model.from, if any
  std::function<Value(const Recipe&)> get;
  std::function<void(Recipe&, const Value&)> set;

  std::string section() const { return path.substr(0, path.find('.')); }
  std::string key() const { return path.substr(path.find('.') + 1); }
};

// Every recipe key, in the order recipe_to_yaml writes them (schema.cpp).
const std::vector<KeySpec>& schema();
const KeySpec* find_key(std::string_view path);  // null for an unknown "section.key"
std::vector<std::string> section_names();        // in schema order
std::vector<std::string> keys_of(const std::string& section);

std::string join(const std::vector<std::string>& v, const char* sep);
// The shortest decimal text that reads back as the same double.
std::string format_double(double v);
std::string format_value(const Value& v);

}  // namespace ft::recipe_internal
