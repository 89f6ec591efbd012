// Values (jinja_internal.h): dicts and namespaces made, values read from JSON, and what Python and
// transformers' tojson make of them: type names, code points, str.strip(), repr(), str(), ==,
// json.dumps().
#include "data/jinja_internal.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ft::jinja::detail {

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

namespace {

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

}  // namespace

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

}  // namespace ft::jinja::detail
