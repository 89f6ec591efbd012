// The Jinja2 subset of jinja.h: a template is cut into text and tags (with trim_blocks,
// lstrip_blocks and the -/- whitespace control applied as it is cut), the tags are parsed into
// a tree of statements over expression trees, and a Renderer walks the tree with a stack of
// variable frames.
//
// Values are immutable and shared: a string, list or dict is held by a shared pointer, so
// reading `messages`, `messages[i]` or `loop` copies nothing (rendering is linear in the
// conversation's length). Lists and dicts keep their keys in insertion order (Python's dicts);
// undefined (a missing variable, attribute or key) and namespace() are kinds of their own.
//
// Shadow execution (Template::render_varied). A world is one alternative of one variation (a
// string of the context replaced). A value may carry shadows: what it is in some worlds, where
// it differs from what it is in the rendering as given (the real world); a list or dict holds
// values that carry theirs, and records the worlds among them (its taint). Invariants:
//   - a shadow holds no shadows at its top level; a leaf found inside a value seen in world w
//     is read in w through at(leaf, w) (its shadow for w, or itself);
//   - every operation is computed for the real operands and again for each world that its
//     operands carry (lift): at the top level for operations that read only the structure
//     (an item, a slice, a length, a type test), and in the leaves too for those that read the
//     contents (==, in, ~, print, tojson, join);
//   - every decision is made in the real world and compared in each world its value carries.
//     A world that decides otherwise at an {% if %}, a ternary or and/or takes its own branch
//     (operand) in a fork: run after the real branch, in that world alone (values read as they
//     are in it), its text inserted into that world's rendering and its assignments made to
//     that world's values only; meanwhile the real branch runs with the world suspended (its
//     text deleted from the world's rendering, its assignments leaving the world's values as
//     they were). select/reject and default filter the world's own way. A world whose loop
//     would run another number of times (a loop over a varied value, or its filter), whose
//     computation fails, or that a value would carry beside more than kMaxShadowWorlds others,
//     is killed: its rendering is made in full afterwards;
//   - so a live world's rendering is the real one with each printed value replaced by that
//     value in the world and each branch it did not share replaced by its own: edits.
#include "data/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

namespace ft::jinja {
namespace {

[[noreturn]] void fail(const std::string& name, int line, const std::string& msg) {
  throw TemplateError(name + ":" + std::to_string(line) + ": " + msg);
}

// Limits that keep a hostile or broken template from exhausting the stack, memory or time:
// nesting of expressions and of statements (recursion depth), range() length (Jinja's sandbox
// has the same 100000), the length of a string or list made by + ~ * join, and the steps of one
// rendering (Template::render's max_steps; a chat template takes some thousands per
// conversation).
constexpr int kMaxDepth = 100;
constexpr int64_t kMaxRange = 100000;
constexpr size_t kMaxLength = size_t(1) << 26;
// The most worlds one value may carry (8 varied strings of two alternatives each): a value
// built from more (e.g. a string concatenating every message's content) kills them instead, so
// that the work of a shadow stays a small multiple of the real operation's.
constexpr size_t kMaxShadowWorlds = 16;

// ---- values -------------------------------------------------------------------------------

struct Value;
struct Shadow;
struct ListNode;
struct DictNode;

// The worlds a list or dict holds shadows of, anywhere inside it (sorted); `many`: more than
// kMaxShadowWorlds, found by walking the value when needed.
struct Taint {
  std::vector<int32_t> worlds;
  bool many = false;
  bool empty() const { return worlds.empty() && !many; }
  void add_world(int32_t w) {
    if (many) return;
    auto it = std::lower_bound(worlds.begin(), worlds.end(), w);
    if (it != worlds.end() && *it == w) return;
    if (worlds.size() >= kMaxShadowWorlds) {
      many = true;
      worlds.clear();
      return;
    }
    worlds.insert(it, w);
  }
  void merge(const Taint& t) {
    if (t.many) {
      many = true;
      worlds.clear();
    }
    for (int32_t w : t.worlds) add_world(w);
  }
  inline void add(const Value& v);
};

struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace
  };
  Kind kind = Kind::kUndefined;
  int64_t i = 0;                         // kBool (0 or 1), kInt
  double d = 0;                          // kFloat
  std::shared_ptr<const std::string> s;  // kString
  std::shared_ptr<const ListNode> l;     // kList
  // kDict (never changed once built) and kNamespace (changed by {% set ns.x = ... %}, seen by
  // every copy).
  std::shared_ptr<DictNode> m;
  std::shared_ptr<const std::vector<Shadow>> shadows;  // sorted by world; null: none

  static Value none() { return of_kind(Kind::kNone); }
  static Value boolean(bool b) {
    Value v = of_kind(Kind::kBool);
    v.i = b;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = of_kind(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = of_kind(Kind::kFloat);
    v.d = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = of_kind(Kind::kString);
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static inline Value list(std::vector<Value> items);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_namespace() const { return kind == Kind::kNamespace; }
  bool is_int() const { return kind == Kind::kInt; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  // bool, int or float: what Python's arithmetic takes.
  bool is_numeric() const { return kind == Kind::kBool || is_number(); }
  double as_double() const { return kind == Kind::kFloat ? d : double(i); }
  const std::string& str() const { return *s; }

 private:
  static Value of_kind(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

struct Shadow {
  int32_t world;
  Value v;
};

struct ListNode {
  std::vector<Value> items;
  Taint taint;
};

// A dict or namespace: insertion-ordered items, with a hash index once it has more than a few.
struct DictNode {
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;  // when items.size() > kIndexFrom
  Taint taint;                                    // dicts only
  static constexpr size_t kIndexFrom = 16;

  const Value* find(const std::string& k) const {
    if (items.size() > kIndexFrom) {
      auto it = index.find(k);
      return it == index.end() ? nullptr : &items[it->second].second;
    }
    for (const auto& [key, v] : items)
      if (key == k) return &v;
    return nullptr;
  }
  // Python's d[k] = v: a new key goes last, an existing one keeps its place.
  void set(const std::string& k, Value v) {
    if (Value* old = const_cast<Value*>(find(k))) {
      *old = std::move(v);
      return;
    }
    items.emplace_back(k, std::move(v));
    if (items.size() == kIndexFrom + 1)
      for (size_t i = 0; i < items.size(); ++i) index[items[i].first] = i;
    else if (items.size() > kIndexFrom + 1)
      index[k] = items.size() - 1;
  }
};

void Taint::add(const Value& v) {
  if (v.shadows)
    for (const Shadow& s : *v.shadows) add_world(s.world);
  if (v.is_list()) merge(v.l->taint);
  if (v.is_dict()) merge(v.m->taint);
}

Value Value::list(std::vector<Value> items) {
  auto node = std::make_shared<ListNode>();
  for (const Value& x : items) node->taint.add(x);
  node->items = std::move(items);
  Value v = of_kind(Kind::kList);
  v.l = std::move(node);
  return v;
}

// A dict of `items` (a later duplicate key replaces an earlier one's value, in its place).
Value make_dict(std::vector<std::pair<std::string, Value>> items) {
  auto node = std::make_shared<DictNode>();
  for (auto& [k, x] : items) {
    node->taint.add(x);
    node->set(k, std::move(x));
  }
  Value v;
  v.kind = Value::Kind::kDict;
  v.m = std::move(node);
  return v;
}

Value make_namespace() {
  Value v;
  v.kind = Value::Kind::kNamespace;
  v.m = std::make_shared<DictNode>();
  return v;
}

// The value as it is in world w (w < 0: the real world): its shadow for w, else itself.
const Value& at(const Value& v, int w) {
  if (w >= 0 && v.shadows)
    for (const Shadow& s : *v.shadows)
      if (s.world == w) return s.v;
  return v;
}

// `v` without its shadows (its leaves keep theirs).
Value strip(Value v) {
  v.shadows.reset();
  return v;
}

// `v` as it is in world w, without shadows at its top level.
Value project(const Value& v, int w) {
  const Value& x = at(v, w);
  return &x == &v ? strip(v) : x;
}

bool is_scalar(const Value& v) {
  return v.kind != Value::Kind::kList && v.kind != Value::Kind::kDict &&
         v.kind != Value::Kind::kNamespace;
}

// Same kind and value, for scalars (a shadow equal to its real value is no shadow).
bool same_scalar(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return a.i == b.i;
    case Value::Kind::kFloat:
      return a.d == b.d || (std::isnan(a.d) && std::isnan(b.d));
    case Value::Kind::kString:
      return a.s == b.s || *a.s == *b.s;
    default:
      return false;
  }
}

Value from_json(const Json& j, const std::unordered_map<const Json*, std::vector<Shadow>>* alts) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      // Past int64 (ft's ints are 64-bit): a float, as near as it gets.
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case Json::value_t::number_float:
      return Value::number(j.get<double>());
    case Json::value_t::string: {
      Value v = Value::string(j.get<std::string>());
      if (alts) {
        auto it = alts->find(&j);
        if (it != alts->end()) v.shadows = std::make_shared<const std::vector<Shadow>>(it->second);
      }
      return v;
    }
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& x : j) items.push_back(from_json(x, alts));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        items.emplace_back(it.key(), from_json(it.value(), alts));
      return make_dict(std::move(items));
    }
    default:
      return Value::none();
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "namespace";
  }
  return "?";
}

// Python truthiness. Of a list or dict it reads the length only (not the items).
bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.d != 0;
    case Value::Kind::kString:
      return !v.s->empty();
    case Value::Kind::kList:
      return !v.l->items.empty();
    case Value::Kind::kDict:
      return !v.m->items.empty();
    case Value::Kind::kNamespace:
      return true;
  }
  return false;
}

// UTF-8 code points of s, each as its bytes (Python indexes strings by code point).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t decode_cp(const std::string& cp) {
  const unsigned char c = cp[0];
  if (cp.size() == 1) return c;
  uint32_t v = cp.size() == 2 ? (c & 0x1F) : cp.size() == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3F);
  return v;
}

// Python's str.isspace() for one code point.
bool py_space(uint32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace, else those code points.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::set<std::string> set;
  if (chars)
    for (auto& c : code_points(*chars)) set.insert(c);
  auto strip_it = [&](const std::string& cp) {
    return chars ? set.count(cp) > 0 : py_space(decode_cp(cp));
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Python's repr of a string (for str() of lists and dicts): single quotes unless the string
// holds one and no double quote.
std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else
      out += char(c);
  }
  return out + q;
}

// Python's repr of a value seen in world w (str() of lists and dicts shows their items so).
void py_repr(const Value& v, int w, std::string* out) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "None";
      return;
    case Value::Kind::kBool:
      *out += v.i ? "True" : "False";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      *out += py_float(v.d);
      return;
    case Value::Kind::kString:
      *out += py_repr_string(v.str());
      return;
    case Value::Kind::kList: {
      *out += '[';
      bool first = true;
      for (const Value& x : v.l->items) {
        if (!first) *out += ", ";
        first = false;
        py_repr(at(x, w), w, out);
        if (out->size() > kMaxLength) return;  // the caller refuses it
      }
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      *out += '{';
      bool first = true;
      for (const auto& [k, x] : v.m->items) {
        if (!first) *out += ", ";
        first = false;
        *out += py_repr_string(k) + ": ";
        py_repr(at(x, w), w, out);
        if (out->size() > kMaxLength) return;
      }
      *out += '}';
      return;
    }
    case Value::Kind::kNamespace:
      *out += "<Namespace>";
      return;
  }
}

// Python's str() of a value, which is what {{ x }}, ~ and |string give.
std::string str_of(const Value& v, int w) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) return "";
  std::string out;
  py_repr(v, w, &out);
  return out;
}

// json.dumps(x, ensure_ascii=False, indent=indent): what transformers' tojson filter gives.
// Returns false for a namespace (not JSON).
bool dump_json(const Value& v, int indent, int depth, int w, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(size_t(indent * d), ' ');
  };
  auto dump_string = [&](const std::string& s) {
    *out += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        case '\b':
          *out += "\\b";
          break;
        case '\f':
          *out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof(b), "\\u%04x", c);
            *out += b;
          } else {
            *out += char(c);
          }
      }
    }
    *out += '"';
  };
  switch (v.kind) {
    case Value::Kind::kString:
      dump_string(v.str());
      return true;
    case Value::Kind::kUndefined:  // undefined in a literal: None, as near as JSON gets
    case Value::Kind::kNone:
      *out += "null";
      return true;
    case Value::Kind::kBool:
      *out += v.i ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return true;
    case Value::Kind::kFloat:
      *out += std::isnan(v.d)   ? "NaN"
              : std::isinf(v.d) ? (v.d > 0 ? "Infinity" : "-Infinity")
                                : py_float(v.d);
      return true;
    case Value::Kind::kList:
    case Value::Kind::kDict: {
      const bool obj = v.is_dict();
      const size_t n = obj ? v.m->items.size() : v.l->items.size();
      if (n == 0) {
        *out += obj ? "{}" : "[]";
        return true;
      }
      *out += obj ? '{' : '[';
      for (size_t k = 0; k < n; ++k) {
        if (k) *out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        if (obj) {
          dump_string(v.m->items[k].first);
          *out += ": ";
        }
        const Value& x = obj ? v.m->items[k].second : v.l->items[k];
        if (!dump_json(at(x, w), indent, depth + 1, w, out)) return false;
        if (out->size() > kMaxLength) return true;  // the caller refuses it
      }
      newline(depth);
      *out += obj ? '}' : ']';
      return true;
    }
    case Value::Kind::kNamespace:
      return false;
  }
  return false;
}

// Python's ==, of values seen in world w.
bool equal(const Value& x, const Value& y, int w) {
  if (x.is_undefined() || y.is_undefined()) return x.is_undefined() && y.is_undefined();
  if (x.is_namespace() || y.is_namespace()) return x.m == y.m;
  // Python: True == 1 and 1 == 1.0.
  if (x.is_numeric() && y.is_numeric()) {
    if (x.kind != Value::Kind::kFloat && y.kind != Value::Kind::kFloat) return x.i == y.i;
    return x.as_double() == y.as_double();
  }
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return x.s == y.s || x.str() == y.str();
    case Value::Kind::kList: {
      const auto &a = x.l->items, &b = y.l->items;
      if (a.size() != b.size()) return false;
      for (size_t k = 0; k < a.size(); ++k)
        if (!equal(at(a[k], w), at(b[k], w), w)) return false;
      return true;
    }
    case Value::Kind::kDict: {  // the same keys with equal values, in any order
      if (x.m->items.size() != y.m->items.size()) return false;
      for (const auto& [k, a] : x.m->items) {
        const Value* b = y.m->find(k);
        if (!b || !equal(at(a, w), at(*b, w), w)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

// ---- lexing the template into text and tags -----------------------------------------------

struct Piece {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;  // the text, or the tag's inside
  int line;
};

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::vector<Piece> cut(const std::string& s, const std::string& name) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;  // the previous tag ended with -
  auto count_lines = [](const std::string& t) { return int(std::count(t.begin(), t.end(), '\n')); };
  while (pos <= s.size()) {
    size_t open = pos;
    while ((open = s.find('{', open)) != std::string::npos) {
      if (open + 1 < s.size() && (s[open + 1] == '{' || s[open + 1] == '%' || s[open + 1] == '#'))
        break;
      ++open;
    }
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(text);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
    }
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    const char kind = s[open + 1];
    const bool minus = open + 2 < s.size() && s[open + 2] == '-';
    if (minus) {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (kind != '{') {
      // lstrip_blocks: spaces and tabs between a line start and a block tag or comment go.
      // The text starts a line when it follows a newline in the source (one trim_blocks took
      // counts) or the template's start.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      const bool at_line_start = k > 0 ? text[k - 1] == '\n' : (pos == 0 || s[pos - 1] == '\n');
      if (at_line_start) text.erase(k);
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
    const int tag_line = line;
    size_t body = open + 2 + (minus ? 1 : 0);
    size_t close;
    std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    if (kind == '#') {
      close = s.find("#}", body);
    } else {  // skip quoted strings: "}}" may sit inside one ({{- "}}" }})
      close = std::string::npos;
      char quote = 0;
      for (size_t i = body; i + 1 < s.size(); ++i) {
        const char c = s[i];
        if (quote) {
          if (c == '\\')
            ++i;
          else if (c == quote)
            quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == closer[0] && s[i + 1] == closer[1]) {
          close = i;
          break;
        }
      }
    }
    if (close == std::string::npos)
      fail(name, tag_line, std::string("unclosed '{") + kind + "' (no '" + closer + "')");
    const bool rminus = close > body && s[close - 1] == '-';
    std::string inner = s.substr(body, close - body - (rminus ? 1 : 0));
    line += count_lines(s.substr(open, close + 2 - open));
    pos = close + 2;
    strip_next = rminus;
    if (!rminus && kind != '{') {  // trim_blocks: one newline after a block tag or comment
      if (pos < s.size() && s[pos] == '\n') {
        ++pos;
        ++line;
      } else if (pos + 1 < s.size() && s[pos] == '\r' && s[pos + 1] == '\n') {
        pos += 2;
        ++line;
      }
    }
    if (kind == '{') pieces.push_back({Piece::Kind::kOutput, inner, tag_line});
    if (kind == '%') pieces.push_back({Piece::Kind::kStatement, inner, tag_line});
  }
  return pieces;
}

// ---- expression tokens --------------------------------------------------------------------

struct Tok {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;  // name, operator, or the string's value
  Json number;
};

std::vector<Tok> lex(const std::string& s, const std::string& name, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_ws(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::Kind::kName, s.substr(i, j - i), {}});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      const std::string t = s.substr(i, j - i);
      Tok tok{is_float ? Tok::Kind::kFloat : Tok::Kind::kInt, t, {}};
      try {
        tok.number = is_float ? Json(std::stod(t)) : Json(int64_t(std::stoll(t)));
      } catch (const std::exception&) {
        fail(name, line, "the number " + t + " is out of range");
      }
      out.push_back(tok);
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '0':
            v += '\0';
            break;
          case '\\':
            v += '\\';
            break;
          case '\'':
            v += '\'';
            break;
          case '"':
            v += '"';
            break;
          case 'u': {
            if (j + 4 >= s.size()) fail(name, line, "bad \\u escape in a string");
            const std::string hex = s.substr(j + 1, 4);
            if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
              fail(name, line, "bad \\u escape in a string");
            const uint32_t cp = uint32_t(std::stoul(hex, nullptr, 16));
            j += 4;
            if (cp < 0x80) {
              v += char(cp);
            } else if (cp < 0x800) {
              v += char(0xC0 | (cp >> 6));
              v += char(0x80 | (cp & 0x3F));
            } else {
              v += char(0xE0 | (cp >> 12));
              v += char(0x80 | ((cp >> 6) & 0x3F));
              v += char(0x80 | (cp & 0x3F));
            }
            break;
          }
          default:
            v += '\\';
            v += e;  // Python keeps unknown escapes as written
        }
      }
      if (j >= s.size()) fail(name, line, "unterminated string literal");
      out.push_back({Tok::Kind::kString, v, {}});
      i = j + 1;
      continue;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                 "|",  "(",  ")",  "[",  "]",  "{",  "}"};
    bool found = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (s.compare(i, n, op) == 0) {
        out.push_back({Tok::Kind::kOp, op, {}});
        i += n;
        found = true;
        break;
      }
    }
    if (!found) fail(name, line, std::string("unexpected character '") + c + "' in a tag");
  }
  out.push_back({Tok::Kind::kEnd, "", {}});
  return out;
}

// ---- trees --------------------------------------------------------------------------------

struct Expr;
using ExprP = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCond
  } kind;
  int line = 0;
  std::string name;  // name, attribute, filter, test, operator
  Value literal;     // kLiteral
  ExprP a, b, c;
  std::vector<ExprP> args;  // call/filter/test args; list items; dict k0 v0 k1 v1; slice parts
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;  // is not
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet } kind;
  int line = 0;
  std::string text;                                           // kText
  ExprP expr;                                                 // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprP, std::vector<Node>>> branches;  // kIf (cond null: else)
  std::vector<std::string> targets;                           // kFor, kSet
  std::string attr;                                           // kSet ns.attr
  ExprP cond;                                                 // kFor filter
  std::vector<Node> body, else_body;                          // kFor
};

const std::set<std::string> kFilters = {
    "trim", "length", "count", "tojson",  "string",     "list",    "selectattr", "rejectattr",
    "join", "first",  "last",  "lower",   "upper",      "default", "d",          "items",
    "int",  "float",  "abs",   "reverse", "capitalize", "map",     "select",     "reject"};
const std::set<std::string> kTests = {"defined", "undefined", "none",    "string",   "number",
                                      "integer", "float",     "mapping", "iterable", "sequence",
                                      "boolean", "true",      "false",   "equalto",  "eq",
                                      "ne",      "even",      "odd",     "=="};
const std::set<std::string> kMethods = {"strip",      "lstrip", "rstrip", "startswith", "endswith",
                                        "split",      "upper",  "lower",  "replace",    "title",
                                        "capitalize", "items",  "keys",   "values",     "get"};
const std::set<std::string> kFunctions = {"raise_exception", "namespace", "range", "strftime_now"};

class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::string& name, int line)
      : t_(std::move(toks)), name_(name), line_(line) {}

  const Tok& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Tok::Kind::kEnd; }
  bool is_op(const char* op, size_t k = 0) const {
    return peek(k).kind == Tok::Kind::kOp && peek(k).text == op;
  }
  bool is_name(const char* n, size_t k = 0) const {
    return peek(k).kind == Tok::Kind::kName && peek(k).text == n;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "'");
    ++i_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::Kind::kName) error("expected a name");
    return t_[i_++].text;
  }
  void expect_end() {
    if (!at_end()) error("unexpected '" + peek().text + "'");
  }
  [[noreturn]] void error(const std::string& msg) const {
    const std::string at = at_end() ? "end of tag" : "'" + peek().text + "'";
    fail(name_, line_, msg + " at " + at);
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    fail(name_, line_, what + " is outside the Jinja subset ft renders (DESIGN.md §6 Chat data)");
  }

  ExprP make(Expr::Kind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  ExprP binary(const std::string& op, ExprP a, ExprP b) {
    ExprP e = make(Expr::Kind::kBinary);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  // Counts recursion into nested expressions (parentheses, brackets, not, unary minus).
  struct Nest {
    Parser* p;
    explicit Nest(Parser* parser) : p(parser) {
      if (++p->depth_ > kMaxDepth)
        fail(p->name_, p->line_, "expressions nested deeper than " + std::to_string(kMaxDepth));
    }
    ~Nest() { --p->depth_; }
  };

  ExprP expression(bool with_cond = true) {
    Nest nest(this);
    ExprP e = parse_or();
    if (with_cond && is_name("if")) {
      ++i_;
      ExprP c = make(Expr::Kind::kCond);
      c->a = e;
      c->b = parse_or();
      if (is_name("else")) {
        ++i_;
        c->c = expression();
      }
      return c;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      ++i_;
      e = binary("or", e, parse_and());
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      ++i_;
      e = binary("and", e, parse_not());
    }
    return e;
  }
  ExprP parse_not() {
    Nest nest(this);
    if (is_name("not")) {
      ++i_;
      ExprP e = make(Expr::Kind::kUnary);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    for (;;) {
      std::string op;
      if (peek().kind == Tok::Kind::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = peek().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        i_ += 2;
      } else {
        return e;
      }
      e = binary(op, e, parse_math1());
    }
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[i_++].text;
      e = binary(op, e, parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      ++i_;
      e = binary("~", e, parse_math2());
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[i_++].text;
      e = binary(op, e, parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (is_op("**")) {
      ++i_;
      e = binary("**", e, parse_unary());
    }
    return e;
  }
  ExprP parse_unary() {
    Nest nest(this);
    if (is_op("-") || is_op("+")) {
      const std::string op = t_[i_++].text;
      ExprP e = make(Expr::Kind::kUnary);
      e->name = op;
      e->a = parse_unary();
      return e;
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  ExprP parse_primary() {
    const Tok& t = peek();
    if (t.kind == Tok::Kind::kName) {
      ++i_;
      ExprP e = make(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True")
        e->literal = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        e->literal = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        e->literal = Value::none();
      else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.kind == Tok::Kind::kString) {
      ExprP e = make(Expr::Kind::kLiteral);
      std::string v;
      while (peek().kind == Tok::Kind::kString) v += t_[i_++].text;  // "a" "b" is "ab"
      e->literal = Value::string(v);
      return e;
    }
    if (t.kind == Tok::Kind::kInt || t.kind == Tok::Kind::kFloat) {
      ++i_;
      ExprP e = make(Expr::Kind::kLiteral);
      e->literal = from_json(t.number, nullptr);
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        ExprP e = make(Expr::Kind::kList);
        return e;
      }
      ExprP e = expression();
      if (is_op(",")) {  // a tuple: a list here
        ExprP l = make(Expr::Kind::kList);
        l->args.push_back(e);
        while (is_op(",")) {
          ++i_;
          if (is_op(")")) break;
          l->args.push_back(expression());
        }
        e = l;
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      ExprP l = make(Expr::Kind::kList);
      while (!is_op("]")) {
        l->args.push_back(expression());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++i_;
      ExprP d = make(Expr::Kind::kDict);
      while (!is_op("}")) {
        d->args.push_back(expression());
        expect_op(":");
        d->args.push_back(expression());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return d;
    }
    error("expected a value");
  }
  void call_args(ExprP e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::Kind::kName && is_op("=", 1)) {
        const std::string k = t_[i_].text;
        i_ += 2;
        e->kwargs.emplace_back(k, expression());
      } else {
        e->args.push_back(expression());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        ++i_;
        ExprP a = make(Expr::Kind::kAttr);
        a->a = e;
        a->name = expect_name();
        e = a;
      } else if (is_op("[")) {
        ++i_;
        ExprP parts[3];
        int colons = 0;
        for (;;) {
          if (is_op(":")) {
            if (++colons > 2) error("too many ':' in a slice");
            ++i_;
            continue;
          }
          if (is_op("]")) break;
          if (parts[colons]) error("expected ':' or ']'");
          parts[colons] = expression();
        }
        expect_op("]");
        ExprP s = make(colons ? Expr::Kind::kSlice : Expr::Kind::kItem);
        s->a = e;
        if (colons) {
          s->args = {parts[0], parts[1], parts[2]};
        } else {
          if (!parts[0]) error("empty subscript");
          s->b = parts[0];
        }
        e = s;
      } else if (is_op("(")) {
        ExprP c = make(Expr::Kind::kCall);
        c->a = e;
        if (e->kind == Expr::Kind::kName) {
          if (!kFunctions.count(e->name)) unsupported("the function " + e->name + "()");
        } else if (e->kind == Expr::Kind::kAttr) {
          if (!kMethods.count(e->name)) unsupported("the method ." + e->name + "()");
        } else {
          unsupported("calling the result of an expression");
        }
        call_args(c);
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprP parse_filters(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        ExprP f = make(Expr::Kind::kFilter);
        f->name = expect_name();
        if (!kFilters.count(f->name)) unsupported("the filter |" + f->name);
        f->a = e;
        if (is_op("(")) call_args(f);
        e = f;
      } else if (is_name("is")) {
        ++i_;
        ExprP t = make(Expr::Kind::kTest);
        if (is_name("not")) {
          ++i_;
          t->negate = true;
        }
        if (is_op("==")) {
          ++i_;
          t->name = "==";
        } else {
          t->name = expect_name();
        }
        if (!kTests.count(t->name)) unsupported("the test 'is " + t->name + "'");
        t->a = e;
        if (is_op("(")) {
          call_args(t);
        } else if ((peek().kind == Tok::Kind::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if")) ||
                   peek().kind == Tok::Kind::kString || peek().kind == Tok::Kind::kInt ||
                   peek().kind == Tok::Kind::kFloat || is_op("[") || is_op("{")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else {
        return e;
      }
    }
  }

  std::vector<Tok> t_;
  size_t i_ = 0;
  std::string name_;
  int line_;
  int depth_ = 0;
};

// ---- statements ---------------------------------------------------------------------------

class TreeBuilder {
 public:
  TreeBuilder(const std::vector<Piece>& pieces, const std::string& name)
      : p_(pieces), name_(name) {}

  // The block a body belongs to ({% if %} or {% for %} and its line), for errors that say what
  // is not closed.
  struct Open {
    const char* keyword;
    int line;
    bool in_else;  // after the block's {% else %}
  };

  // Parses nodes until a statement whose keyword is in `stops` (returned in *stop, its parser
  // in *rest), or the end of the template (an error inside an `open` block; at the top level,
  // *stop is then empty).
  std::vector<Node> block(const std::set<std::string>& stops, const Open* open, std::string* stop,
                          std::unique_ptr<Parser>* rest) {
    if (++depth_ > kMaxDepth)
      fail(name_, k_ < p_.size() ? p_[k_].line : 0,
           "statements nested deeper than " + std::to_string(kMaxDepth));
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    std::vector<Node> nodes;
    while (k_ < p_.size()) {
      const Piece& pc = p_[k_++];
      if (pc.kind == Piece::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.line = pc.line;
        n.text = pc.text;
        nodes.push_back(std::move(n));
        continue;
      }
      auto parser = std::make_unique<Parser>(lex(pc.text, name_, pc.line), name_, pc.line);
      Parser& ps = *parser;
      if (pc.kind == Piece::Kind::kOutput) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = pc.line;
        n.expr = ps.expression();
        ps.expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      const std::string kw = ps.expect_name();
      if (stops.count(kw)) {
        *stop = kw;
        *rest = std::move(parser);
        return nodes;
      }
      if (kw == "if") {
        nodes.push_back(parse_if(ps, pc.line));
      } else if (kw == "for") {
        nodes.push_back(parse_for(ps, pc.line));
      } else if (kw == "set") {
        nodes.push_back(parse_set(ps, pc.line));
      } else if (kw == "generation" || kw == "endgeneration") {
        // transformers' assistant-mask markers: they render nothing.
        ps.expect_end();
      } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
        misplaced(kw, pc.line, open);
      } else {
        ps.unsupported("the statement {% " + kw + " %}");
      }
    }
    if (open)
      fail(name_, open->line,
           std::string("{% ") + open->keyword + " %} is never closed: no {% end" + open->keyword +
               " %} before the end of the template");
    stop->clear();
    return nodes;
  }

  // A closing or middle tag that does not belong where it is: say which block is open instead.
  [[noreturn]] void misplaced(const std::string& kw, int line, const Open* open) {
    const std::string tag = "{% " + kw + " %}";
    if (!open) {
      if (kw == "elif" || kw == "else")
        fail(name_, line, tag + " outside an {% if %} (or {% for %} for else)");
      fail(name_, line, tag + " without an open {% " + kw.substr(3) + " %}");
    }
    const std::string opened =
        std::string("the {% ") + open->keyword + " %} opened at line " + std::to_string(open->line);
    if (kw == "elif" || kw == "else")
      fail(name_, line,
           tag + " is not allowed here: it is inside " + opened +
               (open->in_else ? ", after its {% else %}" : ""));
    fail(name_, line,
         tag + " where {% end" + open->keyword + " %} was expected: " + opened +
             " is not closed yet");
  }

  std::vector<Node> top() {
    std::string stop;
    std::unique_ptr<Parser> rest;
    return block({}, nullptr, &stop, &rest);
  }

 private:
  Node parse_if(Parser& ps, int line) {
    Node n;
    n.kind = Node::Kind::kIf;
    n.line = line;
    ExprP cond = ps.expression();
    ps.expect_end();
    const Open open{"if", line, false}, open_else{"if", line, true};
    for (;;) {
      std::string stop;
      std::unique_ptr<Parser> rest;
      std::vector<Node> body = block({"elif", "else", "endif"}, &open, &stop, &rest);
      n.branches.emplace_back(cond, std::move(body));
      if (stop == "endif") {
        rest->expect_end();
        return n;
      }
      if (stop == "else") {
        rest->expect_end();
        cond = nullptr;
      } else {
        cond = rest->expression();
        rest->expect_end();
      }
      if (!cond) {
        std::vector<Node> else_body = block({"endif"}, &open_else, &stop, &rest);
        rest->expect_end();
        n.branches.emplace_back(nullptr, std::move(else_body));
        return n;
      }
    }
  }

  Node parse_for(Parser& ps, int line) {
    Node n;
    n.kind = Node::Kind::kFor;
    n.line = line;
    n.targets.push_back(ps.expect_name());
    while (ps.is_op(",")) {
      ++ps.i_;
      n.targets.push_back(ps.expect_name());
    }
    if (!ps.is_name("in")) ps.error("expected 'in'");
    ++ps.i_;
    n.expr = ps.expression(false);
    if (ps.is_name("if")) {
      ++ps.i_;
      n.cond = ps.expression(false);
    }
    if (ps.is_name("recursive")) ps.unsupported("a recursive for loop");
    ps.expect_end();
    std::string stop;
    std::unique_ptr<Parser> rest;
    const Open open{"for", line, false}, open_else{"for", line, true};
    n.body = block({"else", "endfor"}, &open, &stop, &rest);
    rest->expect_end();
    if (stop == "else") {
      n.else_body = block({"endfor"}, &open_else, &stop, &rest);
      rest->expect_end();
    }
    return n;
  }

  Node parse_set(Parser& ps, int line) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.line = line;
    n.targets.push_back(ps.expect_name());
    if (ps.is_op(".")) {
      ++ps.i_;
      n.attr = ps.expect_name();
    } else {
      while (ps.is_op(",")) {
        ++ps.i_;
        n.targets.push_back(ps.expect_name());
      }
    }
    if (ps.at_end()) ps.unsupported("a block {% set %} ... {% endset %}");
    ps.expect_op("=");
    n.expr = ps.expression();
    if (ps.is_op(",")) {  // set a, b = x, y
      ExprP l = ps.make(Expr::Kind::kList);
      l->args.push_back(n.expr);
      while (ps.is_op(",")) {
        ++ps.i_;
        l->args.push_back(ps.expression());
      }
      n.expr = l;
    }
    ps.expect_end();
    return n;
  }

  const std::vector<Piece>& p_;
  std::string name_;
  size_t k_ = 0;
  int depth_ = 0;
};

// ---- evaluation ---------------------------------------------------------------------------

using WorldSet = std::vector<int32_t>;  // sorted

void insert_world(WorldSet* ws, int32_t w) {
  auto it = std::lower_bound(ws->begin(), ws->end(), w);
  if (it == ws->end() || *it != w) ws->insert(it, w);
}

class Renderer {
 public:
  // `worlds`: how many worlds the context's values carry shadows of (render_varied).
  Renderer(const std::string& name, int64_t max_steps, int32_t worlds)
      : name_(name), max_steps_(max_steps), dead_(size_t(worlds), 0), edits_(size_t(worlds)) {
    frames_.emplace_back();
    live_ = worlds;
  }

  void set(const std::string& var, Value v) { frames_.front()[var] = std::move(v); }
  void run(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) exec(n);
  }

  std::string out;
  int64_t steps() const { return steps_; }
  int64_t shadow_steps() const { return shadow_steps_; }
  bool dead(int32_t w) const { return dead_[size_t(w)] != 0; }
  std::vector<Edit>& edits(int32_t w) { return edits_[size_t(w)]; }

 private:
  [[noreturn]] void error(int line, const std::string& msg) const { fail(name_, line, msg); }

  // ---- worlds ----

  // Not killed.
  bool alive(int32_t w) const { return !dead_[size_t(w)]; }
  // Alive and executing what runs now: not suspended (in a branch it does not take).
  bool live(int32_t w) const {
    return !dead_[size_t(w)] &&
           (suspended_.empty() || !std::binary_search(suspended_.begin(), suspended_.end(), w));
  }
  void kill(int32_t w) {
    if (!dead_[size_t(w)]) {
      dead_[size_t(w)] = 1;
      --live_;
    }
  }

  // While it lives, the worlds of ws are suspended too (a branch they do not take runs).
  struct Suspend {
    Renderer* r;
    std::vector<int32_t> saved;
    Suspend(Renderer* renderer, const WorldSet& ws) : r(renderer), saved(renderer->suspended_) {
      if (ws.empty()) return;
      std::vector<int32_t> u;
      std::set_union(saved.begin(), saved.end(), ws.begin(), ws.end(), std::back_inserter(u));
      r->suspended_ = std::move(u);
    }
    ~Suspend() { r->suspended_ = std::move(saved); }
  };

  // Runs body() as a fork of world w: in w alone (every value read as it is in w), its output
  // inserted in w's rendering at the current position, its assignments made to w's values
  // only. An error kills w (its full rendering gives the error). Returns whether it completed.
  template <class F>
  bool run_fork(int32_t w, F&& body) {
    if (!alive(w)) return false;
    const int saved_view = view_;
    const size_t saved_base = fork_frames_, depth = frames_.size();
    std::vector<int32_t> saved_suspended;
    saved_suspended.swap(suspended_);
    view_ = w;
    fork_frames_ = depth;
    bool ok = true;
    try {
      InWorld in(this, w);
      body();
    } catch (const TemplateError&) {
      kill(w);
      ok = false;
    }
    frames_.resize(depth);
    view_ = saved_view;
    fork_frames_ = saved_base;
    suspended_.swap(saved_suspended);
    return ok;
  }

  // Appends an edit of world w's rendering (merged into the previous one where they touch).
  void add_edit(int32_t w, size_t pos, size_t len, std::string with) {
    std::vector<Edit>& e = edits_[size_t(w)];
    if (!e.empty() && e.back().pos + e.back().len == pos) {
      e.back().len += len;
      e.back().with += with;
      return;
    }
    e.push_back({pos, len, std::move(with)});
  }

  // Text the real world writes: the suspended worlds do not write it (their own branch's text
  // is inserted by their fork); in a fork, the text is its world's alone.
  void write(const std::string& s) {
    if (s.empty()) return;
    if (view_ >= 0) {
      add_edit(view_, out.size(), 0, s);
      return;
    }
    for (int32_t w : suspended_)
      if (alive(w)) add_edit(w, out.size(), s.size(), "");
    out += s;
  }

  // While computing a value in one world: its steps count apart (shadow_steps_).
  struct InWorld {
    Renderer* r;
    int saved;
    InWorld(Renderer* renderer, int w) : r(renderer), saved(renderer->world_) { r->world_ = w; }
    ~InWorld() { r->world_ = saved; }
  };

  // Every live world found inside v (a full walk: for a value whose taint is `many`).
  void walk_worlds(const Value& v, WorldSet* ws) {
    if (v.shadows)
      for (const Shadow& s : *v.shadows)
        if (live(s.world)) insert_world(ws, s.world);
    if (v.is_namespace()) {  // no taint kept (it changes): its entries, walked
      for (const auto& kv : v.m->items) walk_worlds(kv.second, ws);
      return;
    }
    const Taint* t = v.is_list() ? &v.l->taint : v.is_dict() ? &v.m->taint : nullptr;
    if (!t || t->empty()) return;
    if (!t->many) {
      for (int32_t w : t->worlds)
        if (live(w)) insert_world(ws, w);
      return;
    }
    if (v.is_list())
      for (const Value& x : v.l->items) walk_worlds(x, ws);
    else
      for (const auto& kv : v.m->items) walk_worlds(kv.second, ws);
  }

  // The live worlds v carries: its shadows', and when `deep` (the operation reads the contents
  // of lists and dicts, not only their structure) those of its items.
  void add_worlds(const Value& v, bool deep, WorldSet* ws) {
    if (live_ == 0 || view_ >= 0) return;
    if (v.shadows)
      for (const Shadow& s : *v.shadows)
        if (live(s.world)) insert_world(ws, s.world);
    if (deep && (v.is_list() || v.is_dict() || v.is_namespace())) walk_worlds(v, ws);
  }

  // `real` with, for each world of ws, the value g(w) gives in that world (replacing a shadow
  // real already had for it); a world whose computation fails is killed, as are all of them
  // when there are too many for one value.
  template <class G>
  Value with_worlds(Value real, const WorldSet& ws, G&& g) {
    if (ws.empty()) return real;
    if (ws.size() > kMaxShadowWorlds) {
      for (int32_t w : ws) kill(w);
      return real;
    }
    std::vector<Shadow> sh;
    if (real.shadows)
      for (const Shadow& s : *real.shadows)
        if (alive(s.world) && !std::binary_search(ws.begin(), ws.end(), s.world)) sh.push_back(s);
    for (int32_t w : ws) {
      try {
        InWorld in(this, w);
        step(0);  // one step for each world's value, besides the work of computing it
        Value r = project(g(w), w);
        if (is_scalar(r) && is_scalar(real) && same_scalar(r, real)) continue;
        sh.push_back({w, std::move(r)});
      } catch (const TemplateError&) {
        kill(w);  // rendered in full later, where the same error is the error
      }
    }
    if (sh.size() > kMaxShadowWorlds) {
      for (const Shadow& s : sh) kill(s.world);
      return strip(std::move(real));
    }
    std::sort(sh.begin(), sh.end(),
              [](const Shadow& a, const Shadow& b) { return a.world < b.world; });
    if (sh.empty())
      real.shadows.reset();
    else
      real.shadows = std::make_shared<const std::vector<Shadow>>(std::move(sh));
    return real;
  }

  // fn(args, w) on the real arguments (w = -1) and on the arguments as they are in each world
  // they carry (deep: see add_worlds).
  template <class F>
  Value lift(const std::vector<Value>& args, bool deep, F&& fn) {
    Value real = fn(args, view_);  // in a fork, the arguments are its world's already
    if (live_ == 0 || view_ >= 0) return real;
    WorldSet ws;
    for (const Value& a : args) add_worlds(a, deep, &ws);
    if (ws.empty()) return real;
    std::vector<Value> in_world(args.size());
    return with_worlds(std::move(real), ws, [&](int w) {
      for (size_t k = 0; k < args.size(); ++k) in_world[k] = project(args[k], w);
      return fn(in_world, w);
    });
  }

  // v with shadow sv for world w (v's own shadow for w replaced).
  Value with_shadow(Value v, int32_t w, Value sv) {
    std::vector<Shadow> sh;
    if (v.shadows)
      for (const Shadow& s : *v.shadows)
        if (s.world != w && alive(s.world)) sh.push_back(s);
    if (!(is_scalar(sv) && is_scalar(v) && same_scalar(sv, v))) {
      sh.push_back({w, std::move(sv)});
      std::sort(sh.begin(), sh.end(),
                [](const Shadow& a, const Shadow& b) { return a.world < b.world; });
    }
    if (sh.size() > kMaxShadowWorlds) {
      for (const Shadow& s : sh) kill(s.world);
      return strip(std::move(v));
    }
    if (sh.empty())
      v.shadows.reset();
    else
      v.shadows = std::make_shared<const std::vector<Shadow>>(std::move(sh));
    return v;
  }

  // A decision on v's truthiness: the real one; a world that decides otherwise goes into
  // *away (for the caller to fork), or is killed.
  bool decide(const Value& v, WorldSet* away = nullptr) {
    const bool r = truthy(v);
    if (view_ >= 0 || !v.shadows || live_ == 0) return r;
    for (const Shadow& s : *v.shadows)
      if (live(s.world) && truthy(s.v) != r) {
        if (away)
          insert_world(away, s.world);
        else
          kill(s.world);
      }
    return r;
  }

  // The value `value()` gives, with, for each world of `away`, the value `other()` gives in a
  // fork of that world (the operand or branch it took where the real world took value's).
  template <class V, class O>
  Value diverge(const WorldSet& away, V&& value, O&& other) {
    Value r;
    {
      Suspend s(this, away);
      r = value();
    }
    for (int32_t w : away) {
      Value rw;
      if (run_fork(w, [&] { rw = project(other(), w); }))
        r = with_shadow(std::move(r), w, std::move(rw));
    }
    return r;
  }

  // {{ v }}: its text, and an edit for each world where the text differs.
  void emit(const Value& v, int line) {
    std::string s = str_of(v, view_);
    step(line, int64_t(s.size() / 256));
    if (live_ > 0 && view_ < 0) {
      WorldSet ws;
      add_worlds(v, true, &ws);
      if (ws.size() > kMaxShadowWorlds) {
        for (int32_t w : ws) kill(w);
      } else {
        for (int32_t w : ws) {
          try {
            InWorld in(this, w);
            std::string sw = str_of(at(v, w), w);
            step(line, 1 + int64_t(sw.size() / 256));
            if (sw != s) add_edit(w, out.size(), s.size(), std::move(sw));
          } catch (const TemplateError&) {
            kill(w);
          }
        }
      }
    }
    write(s);
  }

  // ---- variables ----

  Value* find(const std::string& var) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(var);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  // The n items of a list to unpack into n names, each with its shadows (a world whose list
  // differs in length is killed).
  std::vector<Value> unpack(const Value& v, size_t n, int line) {
    if (!v.is_list() || v.l->items.size() != n)
      error(line, "cannot unpack a " + std::string(type_name(v)) + " into " + std::to_string(n) +
                      " names");
    std::vector<Value> parts = v.l->items;
    if (view_ >= 0)
      for (Value& x : parts) x = project(x, view_);
    if (v.shadows && live_ > 0 && view_ < 0)
      for (const Shadow& s : *v.shadows) {
        if (!live(s.world)) continue;
        if (!s.v.is_list() || s.v.l->items.size() != n) {
          kill(s.world);
          continue;
        }
        for (size_t k = 0; k < n; ++k)
          parts[k] = with_shadow(parts[k], s.world, project(s.v.l->items[k], s.world));
      }
    return parts;
  }

  // v as what `old` becomes: in a fork, only its world's value changes; in a branch some worlds
  // are suspended from (they took another), theirs stay what they were.
  Value assigned(const Value* old, Value v) {
    if (view_ >= 0) return with_shadow(old ? *old : Value(), view_, std::move(v));
    for (int32_t w : suspended_)
      if (alive(w)) v = with_shadow(std::move(v), w, old ? project(*old, w) : Value());
    return v;
  }

  // Sets a variable in the innermost frame (a frame a fork pushed is its world's alone).
  void set_var(const std::string& var, Value v) {
    if ((view_ >= 0 && frames_.size() > fork_frames_) || (view_ < 0 && suspended_.empty())) {
      frames_.back()[var] = std::move(v);
      return;
    }
    Value* old = find(var);
    Value nv = assigned(old, std::move(v));
    frames_.back()[var] = std::move(nv);
  }

  void assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      set_var(targets[0], v);
      return;
    }
    std::vector<Value> parts = unpack(v, targets.size(), line);
    for (size_t k = 0; k < targets.size(); ++k) set_var(targets[k], std::move(parts[k]));
  }

  // Counts work: one per statement, expression and loop iteration, and n for an operation on n
  // elements (or n / 256 for n bytes of string). Work done for a world counts apart, under the
  // same bound (past it, that world is rendered in full instead).
  void step(int line, int64_t n = 1) {
    if (world_ >= 0) {
      if ((shadow_steps_ += n) > max_steps_) error(line, "shadow values took too many steps");
      return;
    }
    if ((steps_ += n) > max_steps_)
      error(line, "the template took more than " + std::to_string(max_steps_) + " steps");
  }

  // A string or list result longer than kMaxLength is an error.
  Value bounded(Value v, int line) {
    const size_t n = v.is_string() ? v.str().size() : v.is_list() ? v.l->items.size() : 0;
    step(line, int64_t(v.is_string() ? n / 256 : n));
    if (n > kMaxLength)
      error(line, "a value longer than " + std::to_string(kMaxLength) + " (string or list)");
    return v;
  }

  // A value put into a list or dict: undefined becomes None (as near as JSON gets); a
  // namespace cannot go in.
  Value element(Value v, int line) {
    auto fix = [&](const Value& x) -> bool {  // false: a namespace
      return !x.is_namespace();
    };
    if (!fix(v)) error(line, "a namespace cannot go into a list or dict");
    if (v.is_undefined()) v = Value::none();
    if (v.shadows) {
      std::vector<Shadow> sh;
      for (const Shadow& s : *v.shadows) {
        if (!alive(s.world)) continue;
        if (!fix(s.v)) {
          kill(s.world);
          continue;
        }
        sh.push_back({s.world, s.v.is_undefined() ? Value::none() : s.v});
      }
      v.shadows = sh.empty() ? nullptr : std::make_shared<const std::vector<Shadow>>(sh);
    }
    return v;
  }

  // ---- statements ----

  void exec(const Node& n) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::kText:
        write(n.text);
        return;
      case Node::Kind::kOutput:
        emit(eval(*n.expr), n.line);
        return;
      case Node::Kind::kIf:
        exec_if(n);
        return;
      case Node::Kind::kSet: {
        Value v = eval(*n.expr);
        if (n.attr.empty()) {
          assign(n.targets, v, n.line);
          return;
        }
        Value* found = find(n.targets[0]);
        const Value ns = found && view_ >= 0 ? project(*found, view_) : found ? *found : Value();
        if (!ns.is_namespace())
          error(n.line, "{% set " + n.targets[0] + "." + n.attr + " %} needs " + n.targets[0] +
                            " to be a namespace()");
        if (ns.shadows)  // another namespace in some world: that world is rendered in full
          for (const Shadow& s : *ns.shadows)
            if (s.v.m != ns.m) kill(s.world);
        auto bad = [&](const Value& x, bool real) {
          if (x.is_undefined() || x.is_namespace()) {
            if (real)
              error(n.line, x.is_undefined() ? "assigning an undefined value to a namespace"
                                             : "a namespace inside a namespace");
            return true;
          }
          return false;
        };
        bad(v, true);
        if (v.shadows)
          for (const Shadow& s : *v.shadows)
            if (live(s.world) && bad(s.v, false)) kill(s.world);
        const Value* old = ns.m->find(n.attr);
        if (view_ >= 0 || !suspended_.empty()) v = assigned(old, std::move(v));
        ns.m->set(n.attr, std::move(v));
        return;
      }
      case Node::Kind::kFor:
        exec_for(n);
        return;
    }
  }

  // {% if %}: the real world's branch runs; a world that decides otherwise at a condition
  // runs in a fork after it: the branch of that condition (real false, the world true), or
  // the conditions after it (real true, the world false). The real branch runs with those
  // worlds suspended, so its text is deleted from their renderings.
  void exec_if(const Node& n) {
    if (view_ >= 0) {  // a fork: its world's branch
      for (const auto& [cond, body] : n.branches)
        if (!cond || truthy(eval(*cond))) {
          run(body);
          return;
        }
      return;
    }
    struct Fork {
      int32_t w;
      size_t branch;
      bool take;  // run branch's body; else test the conditions from branch on
    };
    std::vector<Fork> forks;
    WorldSet away;
    size_t k = 0;
    for (; k < n.branches.size(); ++k) {
      const ExprP& cond = n.branches[k].first;
      if (!cond) break;
      WorldSet other;
      bool take;
      {
        Suspend s(this, away);
        take = decide(eval(*cond), &other);
      }
      for (int32_t w : other) {
        forks.push_back({w, take ? k + 1 : k, !take});
        insert_world(&away, w);
      }
      if (take) break;
    }
    {
      Suspend s(this, away);
      if (k < n.branches.size()) run(n.branches[k].second);
    }
    for (const Fork& f : forks)
      run_fork(f.w, [&] {
        if (f.take) {
          run(n.branches[f.branch].second);
          return;
        }
        for (size_t j = f.branch; j < n.branches.size(); ++j)
          if (!n.branches[j].first || truthy(eval(*n.branches[j].first))) {
            run(n.branches[j].second);
            return;
          }
      });
  }

  // The items a for loop or filter goes through: a list's items, a dict's keys, a string's
  // code points, nothing for undefined (in a fork, each as it is in its world).
  std::vector<Value> items_of(const Value& v, int line) {
    if (v.is_list()) {
      step(line, int64_t(v.l->items.size()));
      if (view_ < 0) return v.l->items;
      std::vector<Value> items;
      items.reserve(v.l->items.size());
      for (const Value& x : v.l->items) items.push_back(project(x, view_));
      return items;
    }
    std::vector<Value> items;
    if (v.is_dict()) {
      step(line, int64_t(v.m->items.size()));
      items.reserve(v.m->items.size());
      for (const auto& kv : v.m->items) items.push_back(Value::string(kv.first));
    } else if (v.is_string()) {
      for (auto& c : code_points(v.str())) items.push_back(Value::string(c));
    } else if (!v.is_undefined()) {
      error(line, std::string("cannot iterate over a ") + type_name(v));
    }
    return items;
  }

  // items_of, each item with its shadows where v has some (a world where v has another number
  // of items is killed: the loop would run another number of times).
  std::vector<Value> items_with_worlds(const Value& v, int line) {
    std::vector<Value> items = items_of(v, line);
    if (!v.shadows || live_ == 0 || view_ >= 0) return items;
    for (const Shadow& s : *v.shadows) {
      if (!live(s.world)) continue;
      std::vector<Value> its;
      try {
        InWorld in(this, s.world);
        its = items_of(s.v, line);
      } catch (const TemplateError&) {
        kill(s.world);
        continue;
      }
      if (its.size() != items.size()) {
        kill(s.world);
        continue;
      }
      for (size_t k = 0; k < items.size(); ++k)
        items[k] = with_shadow(items[k], s.world, project(its[k], s.world));
    }
    return items;
  }

  void exec_for(const Node& n) {
    std::vector<Value> items = items_with_worlds(eval(*n.expr), n.line);
    if (n.cond) {
      std::vector<Value> kept;
      for (const Value& it : items) {
        step(n.line);
        frames_.emplace_back();
        assign(n.targets, it, n.line);
        if (decide(eval(*n.cond))) kept.push_back(it);
        frames_.pop_back();
      }
      items.swap(kept);
    }
    const int64_t len = int64_t(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step(n.line);  // an empty body still costs its iterations
      frames_.emplace_back();
      assign(n.targets, items[size_t(i)], n.line);
      std::vector<std::pair<std::string, Value>> loop = {
          {"index", Value::integer(i + 1)},      {"index0", Value::integer(i)},
          {"revindex", Value::integer(len - i)}, {"revindex0", Value::integer(len - i - 1)},
          {"first", Value::boolean(i == 0)},     {"last", Value::boolean(i == len - 1)},
          {"length", Value::integer(len)}};
      if (i > 0) loop.emplace_back("previtem", element(items[size_t(i - 1)], n.line));
      if (i + 1 < len) loop.emplace_back("nextitem", element(items[size_t(i + 1)], n.line));
      frames_.back()["loop"] = make_dict(std::move(loop));
      run(n.body);
      frames_.pop_back();
    }
    if (len == 0) run(n.else_body);
  }

  // ---- expressions ----

  int64_t indent_arg(const Value& v, int line) {
    if (!v.is_int()) error(line, "|tojson indent must be an int");
    return std::clamp<int64_t>(v.i, -1, 64);
  }

  // An expression's value (in a fork: as it is in the fork's world, without shadows).
  Value eval(const Expr& e) {
    if (view_ >= 0) return project(eval_here(e), view_);
    return eval_here(e);
  }

  Value eval_here(const Expr& e) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        Value* v = find(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::kList: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const ExprP& a : e.args) items.push_back(element(eval(*a), e.line));
        return Value::list(std::move(items));
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<std::string, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) error(e.line, "dict keys must be strings here");
          if (k.shadows)  // a key that varies: such a dict is rendered in full
            for (const Shadow& s : *k.shadows) kill(s.world);
          items.emplace_back(k.str(), element(eval(*e.args[i + 1]), e.line));
        }
        return make_dict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        std::vector<Value> args{eval(*e.a)};
        return lift(args, false, [&](const std::vector<Value>& a, int) {
          return attribute(a[0], e.name, e.line);
        });
      }
      case Expr::Kind::kItem: {
        std::vector<Value> args{eval(*e.a), eval(*e.b)};
        return lift(args, false,
                    [&](const std::vector<Value>& a, int) { return item(a[0], a[1], e.line); });
      }
      case Expr::Kind::kSlice: {
        // The absent parts are None, which slices take as "not given".
        std::vector<Value> args{eval(*e.a)};
        for (int k = 0; k < 3; ++k)
          args.push_back(e.args[size_t(k)] ? eval(*e.args[size_t(k)]) : Value::none());
        return lift(args, false,
                    [&](const std::vector<Value>& a, int) { return slice(a, e.line); });
      }
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return filter(e);
      case Expr::Kind::kTest: {
        std::vector<Value> args{eval(*e.a), e.args.empty() ? Value() : eval(*e.args[0])};
        const bool deep = e.name == "equalto" || e.name == "eq" || e.name == "==" || e.name == "ne";
        return lift(args, deep, [&](const std::vector<Value>& a, int w) {
          return Value::boolean(apply_test(e.name, a[0], a[1], e.line, w) != e.negate);
        });
      }
      case Expr::Kind::kUnary: {
        std::vector<Value> args{eval(*e.a)};
        return lift(args, false, [&](const std::vector<Value>& a, int) { return unary(e, a[0]); });
      }
      case Expr::Kind::kBinary:
        return binary(e);
      case Expr::Kind::kCond: {
        auto branch = [&](bool which) { return which ? eval(*e.a) : e.c ? eval(*e.c) : Value(); };
        WorldSet away;
        const bool t = decide(eval(*e.b), &away);
        return diverge(
            away, [&] { return branch(t); }, [&] { return branch(!t); });
      }
    }
    return Value();
  }

  Value unary(const Expr& e, const Value& a) {
    if (e.name == "not") return Value::boolean(!truthy(a));
    if (!a.is_number()) error(e.line, "unary " + e.name + " on a " + type_name(a));
    if (e.name == "+") return a;
    if (a.kind == Value::Kind::kFloat) return Value::number(-a.d);
    int64_t r;
    if (__builtin_sub_overflow(int64_t(0), a.i, &r)) error(e.line, "integer overflow in unary -");
    return Value::integer(r);
  }

  Value attribute(const Value& obj, const std::string& attr, int line) {
    if (obj.is_undefined()) error(line, "'." + attr + "' of an undefined value");
    if (obj.is_namespace() || obj.is_dict()) {
      const Value* v = obj.m->find(attr);
      return v ? *v : Value();
    }
    return Value();
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) error(line, "subscript of an undefined value");
    if (obj.is_dict() || obj.is_namespace()) {
      if (!key.is_string()) return Value();
      return attribute(obj, key.str(), line);
    }
    if (obj.is_list() || obj.is_string()) {
      if (!key.is_int())
        error(line, std::string("a ") + type_name(obj) + " index must be an int, not a " +
                        type_name(key));
      std::vector<std::string> cps;
      if (obj.is_string()) cps = code_points(obj.str());
      const int64_t n = obj.is_list() ? int64_t(obj.l->items.size()) : int64_t(cps.size());
      int64_t i = key.i;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return obj.is_list() ? obj.l->items[size_t(i)] : Value::string(cps[size_t(i)]);
    }
    return Value();
  }

  // a: the object, then start, stop, step (None: not given).
  Value slice(const std::vector<Value>& a, int line) {
    const Value& obj = a[0];
    if (!obj.is_list() && !obj.is_string())
      error(line, std::string("cannot slice a ") + type_name(obj));
    std::vector<std::string> cps;
    if (obj.is_string()) cps = code_points(obj.str());
    const int64_t n = obj.is_list() ? int64_t(obj.l->items.size()) : int64_t(cps.size());
    auto part = [&](int k, bool* given) -> int64_t {
      const Value& v = a[size_t(k)];
      *given = false;
      if (v.is_none()) return 0;
      if (!v.is_int()) error(line, "slice bounds must be ints");
      *given = true;
      return v.i;
    };
    bool has_start, has_stop, has_step;
    int64_t start = part(1, &has_start), stop = part(2, &has_stop), stride = part(3, &has_step);
    if (!has_step) stride = 1;
    if (stride == 0) error(line, "slice step cannot be zero");
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += n;
      if (stride > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    start = clamp(start, has_start, stride > 0 ? 0 : n - 1);
    stop = clamp(stop, has_stop, stride > 0 ? n : -1);
    std::vector<Value> l;
    std::string s;
    for (int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) {
      if (obj.is_list())
        l.push_back(obj.l->items[size_t(i)]);
      else
        s += cps[size_t(i)];
    }
    step(line, int64_t(l.size()));
    return obj.is_list() ? Value::list(std::move(l)) : Value::string(s);
  }

  // The string argument k of a call (a: the evaluated arguments).
  std::string str_arg(const std::vector<Value>& a, size_t k, int line, const std::string& what) {
    if (k >= a.size()) error(line, what + " needs an argument");
    if (!a[k].is_string()) error(line, what + " needs a string argument");
    return a[k].str();
  }

  Value call(const Expr& e) {
    if (e.a->kind == Expr::Kind::kName) {
      const std::string& f = e.a->name;
      if (f == "raise_exception") {
        // The template's message may quote a message's content: at most ~200 bytes of it.
        std::string msg = e.args.empty() ? std::string() : str_of(eval(*e.args[0]), view_);
        if (msg.size() > 200) {
          size_t cut = 200;
          while (cut > 0 && (uint8_t(msg[cut]) & 0xC0) == 0x80) --cut;  // a whole character
          msg = msg.substr(0, cut) + "…";
        }
        error(e.line, "the template raised an exception: " + msg);
      }
      if (f == "namespace") {
        Value v = make_namespace();
        for (const auto& [k, x] : e.kwargs) v.m->set(k, element(eval(*x), e.line));
        if (!e.args.empty()) error(e.line, "namespace() takes keyword arguments only here");
        return v;
      }
      std::vector<Value> args;
      for (const ExprP& x : e.args) args.push_back(eval(*x));
      if (f == "range")
        return lift(args, false,
                    [&](const std::vector<Value>& a, int) { return range(a, e.line); });
      if (f == "strftime_now")
        return lift(args, false, [&](const std::vector<Value>& a, int) {
          return Value::string(strftime_fixed(str_arg(a, 0, e.line, "strftime_now()"), e.line));
        });
    }
    // A method: e.a is kAttr. args: the object, then the arguments.
    std::vector<Value> args{eval(*e.a->a)};
    for (const ExprP& x : e.args) args.push_back(eval(*x));
    const bool deep = !args[0].is_dict();  // a dict's methods read its structure
    return lift(args, deep, [&](const std::vector<Value>& a, int) { return method(e, a); });
  }

  Value range(const std::vector<Value>& a, int line) {
    std::vector<int64_t> v;
    for (const Value& x : a) {
      if (!x.is_int()) error(line, "range() takes ints");
      v.push_back(x.i);
    }
    if (v.empty() || v.size() > 3) error(line, "range() takes 1 to 3 arguments");
    const int64_t start = v.size() == 1 ? 0 : v[0], stop = v.size() == 1 ? v[0] : v[1],
                  stride = v.size() == 3 ? v[2] : 1;
    if (stride == 0) error(line, "range() step cannot be zero");
    std::vector<Value> l;
    for (int64_t i = start; stride > 0 ? i < stop : i > stop;) {
      if (int64_t(l.size()) >= kMaxRange)
        error(line, "range() longer than " + std::to_string(kMaxRange));
      step(line);
      l.push_back(Value::integer(i));
      if (__builtin_add_overflow(i, stride, &i)) break;
    }
    return Value::list(std::move(l));
  }

  // a: the object, then the arguments.
  Value method(const Expr& e, const std::vector<Value>& a) {
    const Value& obj = a[0];
    const std::string& m = e.a->name;
    const int line = e.line;
    const size_t nargs = a.size() - 1;
    if (obj.is_string()) {
      const std::string& s = obj.str();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const bool has = nargs > 0 && !a[1].is_none();
        std::string chars;
        if (has) chars = str_arg(a, 1, line, m);
        return Value::string(py_strip(s, has ? &chars : nullptr, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        const std::string x = str_arg(a, 1, line, m);
        const bool r = x.size() <= s.size() &&
                       (m == "startswith" ? s.compare(0, x.size(), x) == 0
                                          : s.compare(s.size() - x.size(), x.size(), x) == 0);
        return Value::boolean(r);
      }
      if (m == "split") {
        std::vector<Value> l;
        if (nargs > 1 || !e.kwargs.empty())
          error(line, ".split() takes one argument here (no maxsplit)");
        if (nargs == 0 || a[1].is_none()) {  // runs of whitespace
          std::string cur;
          bool in_word = false;
          for (const std::string& cp : code_points(s)) {
            if (py_space(decode_cp(cp))) {
              if (in_word) l.push_back(Value::string(cur));
              cur.clear();
              in_word = false;
            } else {
              cur += cp;
              in_word = true;
            }
          }
          if (in_word) l.push_back(Value::string(cur));
          return Value::list(std::move(l));
        }
        const std::string sep = str_arg(a, 1, line, ".split()");
        if (sep.empty()) error(line, ".split() with an empty separator");
        size_t pos = 0, at_pos;
        while ((at_pos = s.find(sep, pos)) != std::string::npos) {
          l.push_back(Value::string(s.substr(pos, at_pos - pos)));
          pos = at_pos + sep.size();
        }
        l.push_back(Value::string(s.substr(pos)));
        return Value::list(std::move(l));
      }
      if (m == "upper" || m == "lower") {
        std::string r = s;
        for (char& c : r)
          c = char(m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
        return Value::string(r);
      }
      if (m == "capitalize" || m == "title") return Value::string(capitalize(s, m == "title"));
      if (m == "replace") {
        const std::string x = str_arg(a, 1, line, ".replace()"),
                          y = str_arg(a, 2, line, ".replace()");
        if (x.empty()) error(line, ".replace() of an empty string");
        std::string r;
        size_t pos = 0, at_pos;
        while ((at_pos = s.find(x, pos)) != std::string::npos) {
          r += s.substr(pos, at_pos - pos) + y;
          pos = at_pos + x.size();
          if (r.size() > kMaxLength) error(line, ".replace() longer than the limit");
        }
        return bounded(Value::string(r + s.substr(pos)), line);
      }
    }
    if (obj.is_dict()) {
      if (m == "items" || m == "keys" || m == "values") {
        std::vector<Value> l;
        step(line, int64_t(obj.m->items.size()));
        for (const auto& [k, v] : obj.m->items) {
          if (m == "items")
            l.push_back(Value::list({Value::string(k), v}));
          else if (m == "keys")
            l.push_back(Value::string(k));
          else
            l.push_back(v);
        }
        return Value::list(std::move(l));
      }
      if (m == "get") {
        const std::string k = str_arg(a, 1, line, ".get()");
        if (const Value* v = obj.m->find(k)) return *v;
        return nargs > 1 ? a[2] : Value::none();
      }
    }
    error(line, "a " + std::string(type_name(obj)) + " has no method ." + m + "()");
  }

  static std::string capitalize(const std::string& s, bool each_word) {
    std::string r = s;
    bool start = true;
    for (char& c : r) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = char(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else if (each_word) {
        start = true;
      }
    }
    return r;
  }

  std::string strftime_fixed(const std::string& fmt, int line) {
    static const char* kMonths[] = {"January",   "February", "March",    "April",
                                    "May",       "June",     "July",     "August",
                                    "September", "October",  "November", "December"};
    std::string r;
    char buf[16];
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%' || i + 1 >= fmt.size()) {
        r += fmt[i];
        continue;
      }
      switch (fmt[++i]) {
        case 'd':
          std::snprintf(buf, sizeof(buf), "%02d", kFixedDay);
          r += buf;
          break;
        case 'm':
          std::snprintf(buf, sizeof(buf), "%02d", kFixedMonth);
          r += buf;
          break;
        case 'Y':
          r += std::to_string(kFixedYear);
          break;
        case 'y':
          std::snprintf(buf, sizeof(buf), "%02d", kFixedYear % 100);
          r += buf;
          break;
        case 'B':
          r += kMonths[kFixedMonth - 1];
          break;
        case 'b':
          r += std::string(kMonths[kFixedMonth - 1]).substr(0, 3);
          break;
        case '%':
          r += '%';
          break;
        default:
          error(line, std::string("strftime_now(): %") + fmt[i] + " is not supported");
      }
    }
    return r;
  }

  // The items of seq for which pred holds (or, keep = false, does not). pred(x, w) is the
  // predicate of item x in world w; in the real world (w = -1) it may carry shadows, and each
  // item's is a decision (checked in its worlds). seq's own shadows are filtered in their worlds.
  template <class P>
  Value filter_items(const Value& seq, int line, bool keep, P&& pred) {
    std::vector<Value> kept;
    WorldSet ws;  // worlds whose list differs: filtered in their world below
    for (const Value& x : items_of(seq, line))
      if (view_ >= 0 ? truthy(pred(x, view_)) == keep : decide(pred(x, -1), &ws) == keep)
        kept.push_back(x);
    Value real = Value::list(std::move(kept));
    add_worlds(seq, false, &ws);
    return with_worlds(std::move(real), ws, [&](int w) {
      std::vector<Value> in_world;
      for (const Value& x : items_of(at(seq, w), line))
        if (truthy(pred(x, w)) == keep) in_world.push_back(x);
      return Value::list(std::move(in_world));
    });
  }

  // test t of x (and arg) as a value: with shadows in the real world (w = -1).
  Value test_value(const std::string& t, const Value& x, const Value& arg, int line, int w) {
    const bool deep = t == "equalto" || t == "eq" || t == "==" || t == "ne";
    if (w >= 0) return Value::boolean(apply_test(t, at(x, w), at(arg, w), line, w));
    return lift({x, arg}, deep, [&](const std::vector<Value>& a, int aw) {
      return Value::boolean(apply_test(t, a[0], a[1], line, aw));
    });
  }

  Value filter(const Expr& e) {
    const std::string& f = e.name;
    const int line = e.line;
    Value v = eval(*e.a);
    if (f == "default" || f == "d") {
      Value dflt = e.args.empty() ? Value::string("") : eval(*e.args[0]);
      Value boolean = e.args.size() > 1 ? eval(*e.args[1]) : Value::boolean(false);
      for (const auto& [k, x] : e.kwargs)
        if (k == "boolean") boolean = eval(*x);
      const Value use_default = lift({v, boolean}, false, [](const std::vector<Value>& a, int) {
        return Value::boolean(a[0].is_undefined() || (truthy(a[1]) && !truthy(a[0])));
      });
      WorldSet away;
      const bool t = decide(use_default, &away);
      Value r = t ? dflt : v;
      for (int32_t w : away) r = with_shadow(std::move(r), w, project(t ? v : dflt, w));
      return r;
    }
    if (f == "select" || f == "reject") {
      std::vector<Value> args;
      for (const ExprP& x : e.args) args.push_back(eval(*x));
      const std::string t = args.empty() ? "" : str_arg(args, 0, line, "|" + f);
      if (!args.empty() && args[0].shadows)  // the test's name varies: render in full
        for (const Shadow& s : *args[0].shadows) kill(s.world);
      const Value arg = args.size() > 1 ? args[1] : Value();
      if (!t.empty() && !kTests.count(t)) error(line, "|" + f + ": the test '" + t + "'");
      return filter_items(v, line, f == "select", [&](const Value& x, int w) {
        if (t.empty()) {
          if (w >= 0) return Value::boolean(truthy(at(x, w)));
          return lift({x}, false, [](const std::vector<Value>& a, int) {
            return Value::boolean(truthy(a[0]));
          });
        }
        return test_value(t, x, arg, line, w);
      });
    }
    if (f == "selectattr" || f == "rejectattr") {
      std::vector<Value> args;
      for (const ExprP& x : e.args) args.push_back(eval(*x));
      if (args.empty()) error(line, "|" + f + " needs an attribute name");
      const std::string attr = str_arg(args, 0, line, "|" + f);
      const std::string t = args.size() > 1 ? str_arg(args, 1, line, "|" + f) : "";
      for (size_t k = 0; k < std::min<size_t>(2, args.size()); ++k)
        if (args[k].shadows)
          for (const Shadow& s : *args[k].shadows) kill(s.world);
      const Value arg = args.size() > 2 ? args[2] : Value();
      return filter_items(v, line, f == "selectattr", [&](const Value& x, int w) {
        if (w >= 0) {
          const Value a = project(attribute(at(x, w), attr, line), w);
          if (t.empty()) return Value::boolean(truthy(a));
          return Value::boolean(apply_test(t, a, at(arg, w), line, w));
        }
        const Value a = lift({x}, false, [&](const std::vector<Value>& xa, int) {
          return attribute(xa[0], attr, line);
        });
        if (t.empty())
          return lift({a}, false, [](const std::vector<Value>& aa, int) {
            return Value::boolean(truthy(aa[0]));
          });
        return test_value(t, a, arg, line, -1);
      });
    }
    // The others: an operation on v and the arguments (then the keyword arguments, in order).
    std::vector<Value> args{v};
    for (const ExprP& x : e.args) args.push_back(eval(*x));
    for (const auto& kw : e.kwargs) args.push_back(eval(*kw.second));
    // Those that read the contents of lists and dicts (not only their structure).
    const bool deep = f == "tojson" || f == "string" || f == "join" || f == "trim";
    return lift(args, deep,
                [&](const std::vector<Value>& a, int w) { return apply_filter(e, a, w); });
  }

  // a: the value, the arguments, then the keyword arguments' values (e.kwargs' order).
  Value apply_filter(const Expr& e, const std::vector<Value>& a, int w) {
    const std::string& f = e.name;
    const int line = e.line;
    const Value& v = a[0];
    const size_t nargs = e.args.size();
    const Value* kw = a.data() + 1 + nargs;
    auto need_string = [&]() -> const std::string& {
      if (!v.is_string()) error(line, "|" + f + " of a " + type_name(v));
      return v.str();
    };
    if (f == "trim") {
      std::string chars;
      const bool has = nargs > 0;
      if (has) chars = str_arg(a, 1, line, "|trim");
      return Value::string(py_strip(str_of(v, w), has ? &chars : nullptr, true, true));
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value::integer(int64_t(code_points(v.str()).size()));
      if (v.is_list()) return Value::integer(int64_t(v.l->items.size()));
      if (v.is_dict()) return Value::integer(int64_t(v.m->items.size()));
      if (v.is_undefined()) return Value::integer(0);
      error(line, std::string("|length of a ") + type_name(v));
    }
    if (f == "tojson") {
      int indent = -1;
      for (size_t k = 0; k < e.kwargs.size(); ++k) {
        if (e.kwargs[k].first != "indent") error(line, "|tojson takes only indent= here");
        if (!kw[k].is_none()) indent = int(indent_arg(kw[k], line));
      }
      if (nargs > 0) indent = int(indent_arg(a[1], line));
      std::string s;
      if (v.is_namespace() || !dump_json(v, indent, 0, w, &s))
        error(line, "a namespace cannot go into a list or dict");
      return bounded(Value::string(s), line);
    }
    if (f == "string") return bounded(Value::string(str_of(v, w)), line);
    if (f == "list") return Value::list(items_of(v, line));
    if (f == "map") {
      if (e.kwargs.size() != 1 || e.kwargs[0].first != "attribute" || nargs != 0)
        error(line, "|map takes only attribute= here");
      const std::string name = str_of(kw[0], w);
      std::vector<Value> l;
      for (const Value& x : items_of(v, line)) l.push_back(element(attribute(x, name, line), line));
      return Value::list(std::move(l));
    }
    if (f == "join") {
      const std::string sep = nargs == 0 ? "" : str_arg(a, 1, line, "|join");
      std::string r;
      bool first = true;
      for (const Value& x : items_of(v, line)) {
        r += (first ? "" : sep) + str_of(at(x, w), w);
        first = false;
        if (r.size() > kMaxLength) error(line, "|join longer than the limit");
      }
      return Value::string(r);
    }
    if (f == "first" || f == "last") {
      std::vector<Value> xs = items_of(v, line);
      if (xs.empty()) return Value();
      return f == "first" ? xs.front() : xs.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.str());
        std::string r;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
        return Value::string(r);
      }
      std::vector<Value> xs = items_of(v, line);
      std::reverse(xs.begin(), xs.end());
      return Value::list(std::move(xs));
    }
    if (f == "lower" || f == "upper" || f == "capitalize") {
      std::string s = need_string();
      if (f == "capitalize") return Value::string(capitalize(s, false));
      for (char& c : s)
        c = char(f == "upper" ? std::toupper(static_cast<unsigned char>(c))
                              : std::tolower(static_cast<unsigned char>(c)));
      return Value::string(s);
    }
    if (f == "items") {
      if (!v.is_dict()) error(line, std::string("|items of a ") + type_name(v));
      std::vector<Value> l;
      for (const auto& [k, x] : v.m->items) l.push_back(Value::list({Value::string(k), x}));
      return Value::list(std::move(l));
    }
    if (f == "int") {
      if (v.is_int() || v.kind == Value::Kind::kBool) return Value::integer(v.i);
      if (v.kind == Value::Kind::kFloat) {
        const double d = std::trunc(v.d);
        if (!(d > -9.2e18 && d < 9.2e18)) error(line, "|int of a float out of the int range");
        return Value::integer(int64_t(d));
      }
      if (v.is_string()) {
        try {
          return Value::integer(int64_t(std::stoll(v.str())));
        } catch (const std::exception&) {
          return Value::integer(0);
        }
      }
      return Value::integer(0);
    }
    if (f == "float") {
      if (v.is_numeric()) return Value::number(v.as_double());
      return Value::number(0.0);
    }
    if (f == "abs") {
      if (!v.is_number()) error(line, std::string("|abs of a ") + type_name(v));
      if (v.kind == Value::Kind::kFloat) return Value::number(std::fabs(v.d));
      if (v.i == INT64_MIN) error(line, "integer overflow in |abs");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    error(line, "the filter |" + f + " is not supported");
  }

  bool apply_test(const std::string& t, const Value& v, const Value& arg, int line, int w) {
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_int();
    if (t == "float") return v.kind == Value::Kind::kFloat;
    if (t == "mapping") return v.is_dict() || v.is_namespace();
    if (t == "iterable" || t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "boolean") return v.kind == Value::Kind::kBool;
    if (t == "true") return v.kind == Value::Kind::kBool && v.i;
    if (t == "false") return v.kind == Value::Kind::kBool && !v.i;
    if (t == "equalto" || t == "eq" || t == "==") return equal(v, arg, w);
    if (t == "ne") return !equal(v, arg, w);
    if (t == "even" || t == "odd") {
      if (!v.is_int()) error(line, "is " + t + " of a non-int");
      return ((v.i % 2) == 0) == (t == "even");
    }
    error(line, "the test 'is " + t + "' is not supported");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and" || op == "or") {
      // a and b: b where a is truthy, else a; a or b: a where a is truthy, else b.
      const Value a = eval(*e.a);
      WorldSet away;
      const bool takes_b = decide(a, &away) == (op == "and");
      auto operand = [&](bool b) { return b ? eval(*e.b) : view_ >= 0 ? project(a, view_) : a; };
      return diverge(
          away, [&] { return operand(takes_b); }, [&] { return operand(!takes_b); });
    }
    std::vector<Value> args{eval(*e.a), eval(*e.b)};
    const bool deep = op == "==" || op == "!=" || op == "~" || op == "in" || op == "not in";
    return lift(args, deep, [&](const std::vector<Value>& a, int w) {
      return binary_op(op, a[0], a[1], e.line, w);
    });
  }

  Value binary_op(const std::string& op, const Value& a, const Value& b, int line, int w) {
    if (op == "==") return Value::boolean(equal(a, b, w));
    if (op == "!=") return Value::boolean(!equal(a, b, w));
    if (op == "~") return bounded(Value::string(str_of(a, w) + str_of(b, w)), line);
    if (op == "in" || op == "not in") {
      bool r = false;
      if (b.is_string()) {
        if (!a.is_string())
          error(line, std::string("'in <string>' needs a string, not a ") + type_name(a));
        r = b.str().find(a.str()) != std::string::npos;
      } else if (b.is_list()) {
        step(line, int64_t(b.l->items.size()));
        for (const Value& x : b.l->items)
          if (equal(a, at(x, w), w)) {
            r = true;
            break;
          }
      } else if (b.is_dict() || b.is_namespace()) {
        // (a namespace entry a fork made holds undefined in the real world: not there)
        const Value* f = a.is_string() ? b.m->find(a.str()) : nullptr;
        r = f && !at(*f, w).is_undefined();
      } else {
        error(line, std::string("'in' a ") + type_name(b));
      }
      return Value::boolean(op == "in" ? r : !r);
    }
    if (op == "+" && a.is_string() && b.is_string())
      return bounded(Value::string(a.str() + b.str()), line);
    if (op == "+" && a.is_list() && b.is_list()) {
      const auto &x = a.l->items, &y = b.l->items;
      if (x.size() + y.size() > kMaxLength) error(line, "a list longer than the limit");
      step(line, int64_t(x.size() + y.size()));
      std::vector<Value> l = x;
      l.insert(l.end(), y.begin(), y.end());
      return Value::list(std::move(l));
    }
    if (op == "*" && a.is_string() && b.is_int()) {
      const std::string& x = a.str();
      const int64_t n = std::max<int64_t>(0, b.i);
      if (!x.empty() && uint64_t(n) > kMaxLength / x.size())
        error(line, "a string longer than " + std::to_string(kMaxLength));
      std::string r;
      for (int64_t i = 0; i < n; ++i) r += x;
      return bounded(Value::string(r), line);
    }
    if ((op == "<" || op == ">" || op == "<=" || op == ">=") && a.is_string() && b.is_string()) {
      const int c = a.str().compare(b.str());
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (!a.is_numeric() || !b.is_numeric())
      error(line, std::string("'") + op + "' between a " + type_name(a) + " and a " + type_name(b));
    const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
    if (ints && op == "**" && b.i >= 0) {  // Python: an int to a non-negative int power
      int64_t r = 1, p = a.i;              // by squaring: r * p^k stays the answer
      for (uint64_t k = uint64_t(b.i); k > 0;) {
        if ((k & 1) && __builtin_mul_overflow(r, p, &r)) error(line, "integer overflow in '**'");
        k >>= 1;
        if (k > 0 && __builtin_mul_overflow(p, p, &p)) error(line, "integer overflow in '**'");
      }
      return Value::integer(r);
    }
    if (ints && op != "/" && op != "**") {
      const int64_t x = a.i, y = b.i;
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
      if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
      if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
      if (overflow) error(line, "integer overflow in '" + op + "' (ft's ints are 64-bit)");
      if (op == "+" || op == "-" || op == "*") return Value::integer(r);
      if (op == "<") return Value::boolean(x < y);
      if (op == ">") return Value::boolean(x > y);
      if (op == "<=") return Value::boolean(x <= y);
      if (op == ">=") return Value::boolean(x >= y);
      if (y == 0) error(line, "division by zero");
      if (y == -1) {  // x / -1 overflows for the least int64
        if (op == "%") return Value::integer(0);
        if (__builtin_sub_overflow(int64_t(0), x, &r)) error(line, "integer overflow in '//'");
        return Value::integer(r);
      }
      int64_t q = x / y;
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "**") return Value::number(std::pow(x, y));
    if (op == "<") return Value::boolean(x < y);
    if (op == ">") return Value::boolean(x > y);
    if (op == "<=") return Value::boolean(x <= y);
    if (op == ">=") return Value::boolean(x >= y);
    if (y == 0) error(line, "division by zero");
    if (op == "/") return Value::number(x / y);
    if (op == "//") return Value::number(std::floor(x / y));
    return Value::number(x - y * std::floor(x / y));
  }

  std::string name_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  int64_t steps_ = 0, shadow_steps_ = 0, max_steps_;
  int world_ = -1;  // the world being computed (-1: the real one): its steps count apart
  int view_ = -1;   // the world of the fork being run (-1: none, the real world's execution)
  size_t fork_frames_ = 0;                // frames_.size() when the fork began
  std::vector<int32_t> suspended_;        // (sorted) worlds in another branch than the real one
  std::vector<uint8_t> dead_;             // (worlds) killed: rendered in full afterwards
  int64_t live_ = 0;                      // worlds not killed
  std::vector<std::vector<Edit>> edits_;  // (worlds) the edits of each world's rendering
};

}  // namespace

struct Template::Impl {
  std::string name;
  std::vector<Node> nodes;
};

Template::Template(const std::string& text, const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = name;
  std::vector<Piece> pieces = cut(text, name);
  impl_->nodes = TreeBuilder(pieces, name).top();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Json& context, int64_t max_steps, int64_t* steps) const {
  Renderer r(impl_->name, max_steps, 0);
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it)
      r.set(it.key(), from_json(it.value(), nullptr));
  r.run(impl_->nodes);
  if (steps) *steps = r.steps();
  return std::move(r.out);
}

VariedRendering Template::render_varied(const Json& context,
                                        const std::vector<Variation>& variations,
                                        int64_t max_steps) const {
  VariedRendering out;
  // World w is alternative world_of[w].second of variation world_of[w].first.
  std::unordered_map<const Json*, std::vector<Shadow>> alternatives;
  std::vector<std::pair<size_t, size_t>> world_of;
  out.edits.resize(variations.size());
  for (size_t v = 0; v < variations.size(); ++v) {
    const Variation& var = variations[v];
    const Json* target = nullptr;
    try {
      target = &context.at(var.where);
    } catch (const Json::exception&) {
    }
    if (!target || !target->is_string())
      throw TemplateError(impl_->name + ": rendering with variations: " + var.where.to_string() +
                          " is not a string of the context");
    out.edits[v].resize(var.alternatives.size());
    for (size_t k = 0; k < var.alternatives.size(); ++k) {
      alternatives[target].push_back(
          {int32_t(world_of.size()), Value::string(var.alternatives[k])});
      world_of.emplace_back(v, k);
    }
  }
  Renderer r(impl_->name, max_steps, int32_t(world_of.size()));
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it)
      r.set(it.key(), from_json(it.value(), &alternatives));
  r.run(impl_->nodes);
  out.text = std::move(r.out);
  out.render_steps = r.steps();
  out.steps = r.steps() + r.shadow_steps();
  for (size_t w = 0; w < world_of.size(); ++w) {
    const auto [v, k] = world_of[w];
    if (!r.dead(int32_t(w))) {
      out.edits[v][k] = std::move(r.edits(int32_t(w)));
      continue;
    }
    // A world that took another decision: rendered in full (a TemplateError here is the one
    // rendering it alone gives).
    Json alt = context;
    alt[variations[v].where] = variations[v].alternatives[k];
    int64_t steps = 0;
    const std::string full = render(alt, max_steps, &steps);
    out.steps += steps;
    ++out.full_renderings;
    // Kept as one edit of what differs (so that many such worlds do not hold many renderings).
    const std::string& t = out.text;
    size_t p = 0, q = 0;
    while (p < t.size() && p < full.size() && t[p] == full[p]) ++p;
    while (q < t.size() - p && q < full.size() - p &&
           t[t.size() - 1 - q] == full[full.size() - 1 - q])
      ++q;
    out.edits[v][k] = {Edit{p, t.size() - p - q, full.substr(p, full.size() - p - q)}};
  }
  return out;
}

}  // namespace ft::jinja
