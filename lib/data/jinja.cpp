// The Jinja2 subset of jinja.h: a template is cut into text and tags (with trim_blocks,
// lstrip_blocks and the -/- whitespace control applied as it is cut), the tags are parsed into
// a tree of statements over expression trees, and render() walks the tree with a stack of
// variable frames. Values are JSON values (ordered, as Python dicts keep insertion order) plus
// two kinds JSON lacks: undefined (a missing variable, attribute or key) and namespace().
#include "data/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
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

// ---- values -------------------------------------------------------------------------------

struct Value {
  enum class Kind { kUndefined, kJson, kNamespace };
  Kind kind = Kind::kUndefined;
  Json j;                    // kJson
  std::shared_ptr<Json> ns;  // kNamespace: an object, shared by every copy (set ns.x = ...)

  static Value undefined() { return Value(); }
  static Value of(Json v) {
    Value r;
    r.kind = Kind::kJson;
    r.j = std::move(v);
    return r;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_json() const { return kind == Kind::kJson; }
  bool is_string() const { return is_json() && j.is_string(); }
  bool is_number() const { return is_json() && j.is_number(); }
  bool is_list() const { return is_json() && j.is_array(); }
  bool is_dict() const { return is_json() && j.is_object(); }
};

const char* type_name(const Value& v) {
  if (v.is_undefined()) return "undefined";
  if (v.kind == Value::Kind::kNamespace) return "namespace";
  switch (v.j.type()) {
    case Json::value_t::null:
      return "none";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    case Json::value_t::number_float:
      return "float";
    default:
      return "int";
  }
}

bool truthy(const Value& v) {
  if (v.is_undefined()) return false;
  if (v.kind == Value::Kind::kNamespace) return true;
  const Json& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_float()) return j.get<double>() != 0;
  if (j.is_number()) return j.get<int64_t>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();  // list, dict
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

std::string py_repr(const Json& j);

// Python's str() of a value, which is what {{ x }}, ~ and |string give.
std::string py_str(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  return py_repr(j);
}

std::string py_repr(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return j.get<bool>() ? "True" : "False";
    case Json::value_t::string:
      return py_repr_string(j.get<std::string>());
    case Json::value_t::number_float:
      return py_float(j.get<double>());
    case Json::value_t::number_unsigned:
      return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_integer:
      return std::to_string(j.get<int64_t>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it, first = false)
        out += (first ? "" : ", ") + py_repr_string(it.key()) + ": " + py_repr(it.value());
      return out + "}";
    }
    default:
      return "?";
  }
}

std::string str_of(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.kind == Value::Kind::kNamespace) return "<Namespace>";
  return py_str(v.j);
}

// json.dumps(x, ensure_ascii=False, indent=indent): what transformers' tojson filter gives.
void dump_json(const Json& j, int indent, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(size_t(indent * d), ' ');
  };
  switch (j.type()) {
    case Json::value_t::string: {
      *out += '"';
      for (unsigned char c : j.get_ref<const std::string&>()) {
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
      return;
    }
    case Json::value_t::null:
      *out += "null";
      return;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : py_float(d);
      return;
    }
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool obj = j.is_object();
      if (j.empty()) {
        *out += obj ? "{}" : "[]";
        return;
      }
      *out += obj ? '{' : '[';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) *out += indent < 0 ? ", " : ",";
        first = false;
        newline(depth + 1);
        if (obj) {
          dump_json(Json(it.key()), indent, depth + 1, out);
          *out += ": ";
        }
        dump_json(it.value(), indent, depth + 1, out);
      }
      newline(depth);
      *out += obj ? '}' : ']';
      return;
    }
    default:
      *out += j.dump();
      return;
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
  Json literal;
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
        e->literal = true;
      else if (t.text == "false" || t.text == "False")
        e->literal = false;
      else if (t.text == "none" || t.text == "None")
        e->literal = nullptr;
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
      e->literal = v;
      return e;
    }
    if (t.kind == Tok::Kind::kInt || t.kind == Tok::Kind::kFloat) {
      ++i_;
      ExprP e = make(Expr::Kind::kLiteral);
      e->literal = t.number;
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

  // Parses nodes until a statement whose keyword is in `stops` (returned in *stop, its parser
  // in *rest), or the end (then *stop is empty).
  std::vector<Node> block(const std::set<std::string>& stops, std::string* stop,
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
      } else {
        ps.unsupported("the statement {% " + kw + " %}");
      }
    }
    stop->clear();
    return nodes;
  }

  std::vector<Node> top() {
    std::string stop;
    std::unique_ptr<Parser> rest;
    return block({}, &stop, &rest);
  }

 private:
  Node parse_if(Parser& ps, int line) {
    Node n;
    n.kind = Node::Kind::kIf;
    n.line = line;
    ExprP cond = ps.expression();
    ps.expect_end();
    for (;;) {
      std::string stop;
      std::unique_ptr<Parser> rest;
      std::vector<Node> body = block({"elif", "else", "endif"}, &stop, &rest);
      n.branches.emplace_back(cond, std::move(body));
      if (stop.empty()) fail(name_, line, "{% if %} without {% endif %}");
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
        std::vector<Node> else_body = block({"endif"}, &stop, &rest);
        if (stop.empty()) fail(name_, line, "{% if %} without {% endif %}");
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
    n.body = block({"else", "endfor"}, &stop, &rest);
    if (stop.empty()) fail(name_, line, "{% for %} without {% endfor %}");
    rest->expect_end();
    if (stop == "else") {
      n.else_body = block({"endfor"}, &stop, &rest);
      if (stop.empty()) fail(name_, line, "{% for %} without {% endfor %}");
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

class Renderer {
 public:
  Renderer(const std::string& name, const Json& context, int64_t max_steps)
      : name_(name), max_steps_(max_steps) {
    frames_.emplace_back();
    for (auto it = context.begin(); it != context.end(); ++it)
      frames_.back()[it.key()] = Value::of(it.value());
  }

  void run(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) exec(n);
  }
  std::string out;

 private:
  [[noreturn]] void error(int line, const std::string& msg) const { fail(name_, line, msg); }

  Value* find(const std::string& var) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(var);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  void assign(const Node& n, const Value& v) {
    if (n.targets.size() == 1) {
      frames_.back()[n.targets[0]] = v;
      return;
    }
    if (!v.is_list() || v.j.size() != n.targets.size())
      error(n.line, "cannot unpack a " + std::string(type_name(v)) + " into " +
                        std::to_string(n.targets.size()) + " names");
    for (size_t i = 0; i < n.targets.size(); ++i) frames_.back()[n.targets[i]] = Value::of(v.j[i]);
  }

  // Counts work: one per statement, expression and loop iteration, and n for an operation on n
  // elements (or n / 256 for n bytes of string).
  void step(int line, int64_t n = 1) {
    if ((steps_ += n) > max_steps_)
      error(line, "the template took more than " + std::to_string(max_steps_) + " steps");
  }

  // A string or list result longer than kMaxLength is an error.
  const Value& bounded(const Value& v, int line) {
    const size_t n = v.is_string() ? v.j.get_ref<const std::string&>().size()
                     : v.is_list() ? v.j.size()
                                   : 0;
    step(line, int64_t(v.is_string() ? n / 256 : n));
    if (n > kMaxLength)
      error(line, "a value longer than " + std::to_string(kMaxLength) + " (string or list)");
    return v;
  }

  void exec(const Node& n) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::kText:
        out += n.text;
        return;
      case Node::Kind::kOutput:
        out += str_of(eval(*n.expr));
        return;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) {
            run(body);
            return;
          }
        return;
      case Node::Kind::kSet: {
        Value v = eval(*n.expr);
        if (n.attr.empty()) {
          assign(n, v);
          return;
        }
        Value* ns = find(n.targets[0]);
        if (!ns || ns->kind != Value::Kind::kNamespace)
          error(n.line, "{% set " + n.targets[0] + "." + n.attr + " %} needs " + n.targets[0] +
                            " to be a namespace()");
        if (v.is_undefined()) error(n.line, "assigning an undefined value to a namespace");
        if (v.kind == Value::Kind::kNamespace) error(n.line, "a namespace inside a namespace");
        (*ns->ns)[n.attr] = v.j;
        return;
      }
      case Node::Kind::kFor:
        exec_for(n);
        return;
    }
  }

  std::vector<Value> items_of(const Value& v, int line) {
    if (v.is_json() && (v.j.is_array() || v.j.is_object())) step(line, int64_t(v.j.size()));
    std::vector<Value> items;
    if (v.is_undefined()) return items;
    if (v.is_list())
      for (const Json& x : v.j) items.push_back(Value::of(x));
    else if (v.is_dict())
      for (auto it = v.j.begin(); it != v.j.end(); ++it) items.push_back(Value::of(it.key()));
    else if (v.is_string())
      for (auto& c : code_points(v.j.get<std::string>())) items.push_back(Value::of(c));
    else
      error(line, std::string("cannot iterate over a ") + type_name(v));
    return items;
  }

  void exec_for(const Node& n) {
    std::vector<Value> items = items_of(eval(*n.expr), n.line);
    if (n.cond) {
      std::vector<Value> kept;
      for (const Value& it : items) {
        step(n.line);
        frames_.emplace_back();
        assign(n, it);
        if (truthy(eval(*n.cond))) kept.push_back(it);
        frames_.pop_back();
      }
      items.swap(kept);
    }
    const int64_t len = int64_t(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step(n.line);  // an empty body still costs its iterations
      frames_.emplace_back();
      assign(n, items[size_t(i)]);
      Json loop = Json::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = len - i;
      loop["revindex0"] = len - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == len - 1;
      loop["length"] = len;
      if (i > 0) loop["previtem"] = json_of(items[size_t(i - 1)], n.line);
      if (i + 1 < len) loop["nextitem"] = json_of(items[size_t(i + 1)], n.line);
      frames_.back()["loop"] = Value::of(std::move(loop));
      run(n.body);
      frames_.pop_back();
    }
    if (len == 0) run(n.else_body);
  }

  // A bool or int (the callers have checked it is one of them).
  static int64_t as_int(const Value& v) {
    return v.j.is_boolean() ? int64_t(v.j.get<bool>()) : v.j.get<int64_t>();
  }

  int64_t indent_arg(const Value& v, int line) {
    if (!v.is_json() || !(v.j.is_number_integer() || v.j.is_number_unsigned()))
      error(line, "|tojson indent must be an int");
    return std::clamp<int64_t>(v.j.get<int64_t>(), -1, 64);
  }

  Value eval(const Expr& e) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value::of(e.literal);
      case Expr::Kind::kName: {
        Value* v = find(e.name);
        return v ? *v : Value::undefined();
      }
      case Expr::Kind::kList: {
        Json l = Json::array();
        for (const ExprP& a : e.args) l.push_back(json_of(eval(*a), e.line));
        return Value::of(std::move(l));
      }
      case Expr::Kind::kDict: {
        Json d = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) error(e.line, "dict keys must be strings here");
          d[k.j.get<std::string>()] = json_of(eval(*e.args[i + 1]), e.line);
        }
        return Value::of(std::move(d));
      }
      case Expr::Kind::kAttr:
        return attribute(eval(*e.a), e.name, e.line);
      case Expr::Kind::kItem:
        return item(eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return filter(e);
      case Expr::Kind::kTest: {
        bool r = test(e);
        return Value::of(e.negate ? !r : r);
      }
      case Expr::Kind::kUnary: {
        Value a = eval(*e.a);
        if (e.name == "not") return Value::of(!truthy(a));
        if (!a.is_number()) error(e.line, "unary " + e.name + " on a " + type_name(a));
        if (e.name == "+") return a;
        if (a.j.is_number_float()) return Value::of(-a.j.get<double>());
        int64_t r;
        if (__builtin_sub_overflow(int64_t(0), a.j.get<int64_t>(), &r))
          error(e.line, "integer overflow in unary -");
        return Value::of(r);
      }
      case Expr::Kind::kBinary:
        return binary(e);
      case Expr::Kind::kCond:
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined();
    }
    return Value::undefined();
  }

  Json json_of(const Value& v, int line) {
    if (v.is_json()) return v.j;
    if (v.kind == Value::Kind::kNamespace) error(line, "a namespace cannot go into a list or dict");
    return nullptr;  // undefined in a literal: None, as near as JSON gets
  }

  Value attribute(const Value& obj, const std::string& attr, int line) {
    if (obj.is_undefined()) error(line, "'." + attr + "' of an undefined value");
    if (obj.kind == Value::Kind::kNamespace) {
      auto it = obj.ns->find(attr);
      return it == obj.ns->end() ? Value::undefined() : Value::of(*it);
    }
    if (obj.is_dict()) {
      auto it = obj.j.find(attr);
      return it == obj.j.end() ? Value::undefined() : Value::of(*it);
    }
    return Value::undefined();
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) error(line, "subscript of an undefined value");
    if (obj.is_dict() || obj.kind == Value::Kind::kNamespace) {
      if (!key.is_string()) return Value::undefined();
      return attribute(obj, key.j.get<std::string>(), line);
    }
    if (obj.is_list() || obj.is_string()) {
      if (!key.is_json() || !(key.j.is_number_integer() || key.j.is_number_unsigned()))
        error(line, std::string("a ") + type_name(obj) + " index must be an int, not a " +
                        type_name(key));
      std::vector<std::string> cps;
      if (obj.is_string()) cps = code_points(obj.j.get<std::string>());
      const int64_t n = obj.is_list() ? int64_t(obj.j.size()) : int64_t(cps.size());
      int64_t i = key.j.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return obj.is_list() ? Value::of(obj.j[size_t(i)]) : Value::of(cps[size_t(i)]);
    }
    return Value::undefined();
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.a);
    if (!obj.is_list() && !obj.is_string())
      error(e.line, std::string("cannot slice a ") + type_name(obj));
    std::vector<std::string> cps;
    if (obj.is_string()) cps = code_points(obj.j.get<std::string>());
    const int64_t n = obj.is_list() ? int64_t(obj.j.size()) : int64_t(cps.size());
    auto part = [&](int k, bool* given) -> int64_t {
      *given = false;
      if (!e.args[size_t(k)]) return 0;
      Value v = eval(*e.args[size_t(k)]);
      if (v.is_json() && v.j.is_null()) return 0;
      if (!v.is_number() || v.j.is_number_float()) error(e.line, "slice bounds must be ints");
      *given = true;
      return v.j.get<int64_t>();
    };
    bool has_start, has_stop, has_step;
    int64_t start = part(0, &has_start), stop = part(1, &has_stop), step = part(2, &has_step);
    if (!has_step) step = 1;
    if (step == 0) error(e.line, "slice step cannot be zero");
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    start = clamp(start, has_start, step > 0 ? 0 : n - 1);
    stop = clamp(stop, has_stop, step > 0 ? n : -1);
    Json l = Json::array();
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_list())
        l.push_back(obj.j[size_t(i)]);
      else
        s += cps[size_t(i)];
    }
    return obj.is_list() ? Value::of(std::move(l)) : Value::of(s);
  }

  std::string str_arg(const Expr& e, size_t k, const char* what) {
    if (k >= e.args.size()) error(e.line, std::string(what) + " needs an argument");
    Value v = eval(*e.args[k]);
    if (!v.is_string()) error(e.line, std::string(what) + " needs a string argument");
    return v.j.get<std::string>();
  }

  Value call(const Expr& e) {
    if (e.a->kind == Expr::Kind::kName) {
      const std::string& f = e.a->name;
      if (f == "raise_exception")
        error(e.line, "the template raised an exception: " +
                          (e.args.empty() ? std::string() : str_of(eval(*e.args[0]))));
      if (f == "namespace") {
        Value v;
        v.kind = Value::Kind::kNamespace;
        v.ns = std::make_shared<Json>(Json::object());
        for (const auto& [k, x] : e.kwargs) (*v.ns)[k] = json_of(eval(*x), e.line);
        if (!e.args.empty()) error(e.line, "namespace() takes keyword arguments only here");
        return v;
      }
      if (f == "range") {
        std::vector<int64_t> a;
        for (const ExprP& x : e.args) {
          Value v = eval(*x);
          if (!v.is_number() || v.j.is_number_float()) error(e.line, "range() takes ints");
          a.push_back(v.j.get<int64_t>());
        }
        if (a.empty() || a.size() > 3) error(e.line, "range() takes 1 to 3 arguments");
        const int64_t start = a.size() == 1 ? 0 : a[0], stop = a.size() == 1 ? a[0] : a[1],
                      stride = a.size() == 3 ? a[2] : 1;
        if (stride == 0) error(e.line, "range() step cannot be zero");
        Json l = Json::array();
        for (int64_t i = start; stride > 0 ? i < stop : i > stop;) {
          if (int64_t(l.size()) >= kMaxRange)
            error(e.line, "range() longer than " + std::to_string(kMaxRange));
          step(e.line);
          l.push_back(i);
          if (__builtin_add_overflow(i, stride, &i)) break;
        }
        return Value::of(std::move(l));
      }
      if (f == "strftime_now")
        return Value::of(strftime_fixed(str_arg(e, 0, "strftime_now()"), e.line));
    }
    // A method: e.a is kAttr.
    Value obj = eval(*e.a->a);
    const std::string& m = e.a->name;
    if (obj.is_string()) {
      const std::string s = obj.j.get<std::string>();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        std::string chars;
        const bool has = !e.args.empty() && !(eval(*e.args[0]).j.is_null());
        if (has) chars = str_arg(e, 0, m.c_str());
        return Value::of(py_strip(s, has ? &chars : nullptr, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        const std::string x = str_arg(e, 0, m.c_str());
        const bool r = x.size() <= s.size() &&
                       (m == "startswith" ? s.compare(0, x.size(), x) == 0
                                          : s.compare(s.size() - x.size(), x.size(), x) == 0);
        return Value::of(r);
      }
      if (m == "split") {
        Json l = Json::array();
        if (e.args.size() > 1 || !e.kwargs.empty())
          error(e.line, ".split() takes one argument here (no maxsplit)");
        if (e.args.empty() || eval(*e.args[0]).j.is_null()) {  // runs of whitespace
          std::string cur;
          bool in_word = false;
          for (const std::string& cp : code_points(s)) {
            if (py_space(decode_cp(cp))) {
              if (in_word) l.push_back(cur);
              cur.clear();
              in_word = false;
            } else {
              cur += cp;
              in_word = true;
            }
          }
          if (in_word) l.push_back(cur);
          return Value::of(std::move(l));
        }
        const std::string sep = str_arg(e, 0, ".split()");
        if (sep.empty()) error(e.line, ".split() with an empty separator");
        size_t pos = 0, at;
        while ((at = s.find(sep, pos)) != std::string::npos) {
          l.push_back(s.substr(pos, at - pos));
          pos = at + sep.size();
        }
        l.push_back(s.substr(pos));
        return Value::of(std::move(l));
      }
      if (m == "upper" || m == "lower") {
        std::string r = s;
        for (char& c : r)
          c = char(m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
        return Value::of(r);
      }
      if (m == "capitalize" || m == "title") return Value::of(capitalize(s, m == "title"));
      if (m == "replace") {
        const std::string a = str_arg(e, 0, ".replace()"), b = str_arg(e, 1, ".replace()");
        if (a.empty()) error(e.line, ".replace() of an empty string");
        std::string r;
        size_t pos = 0, at;
        while ((at = s.find(a, pos)) != std::string::npos) {
          r += s.substr(pos, at - pos) + b;
          pos = at + a.size();
        }
        return Value::of(r + s.substr(pos));
      }
    }
    if (obj.is_dict()) {
      if (m == "items" || m == "keys" || m == "values") {
        Json l = Json::array();
        for (auto it = obj.j.begin(); it != obj.j.end(); ++it) {
          if (m == "items")
            l.push_back(Json::array({it.key(), it.value()}));
          else if (m == "keys")
            l.push_back(it.key());
          else
            l.push_back(it.value());
        }
        return Value::of(std::move(l));
      }
      if (m == "get") {
        const std::string k = str_arg(e, 0, ".get()");
        auto it = obj.j.find(k);
        if (it != obj.j.end()) return Value::of(*it);
        return e.args.size() > 1 ? eval(*e.args[1]) : Value::of(nullptr);
      }
    }
    error(e.line, "a " + std::string(type_name(obj)) + " has no method ." + m + "()");
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

  Value filter(const Expr& e) {
    Value v = eval(*e.a);
    const std::string& f = e.name;
    auto need_string = [&] {
      if (!v.is_string()) error(e.line, "|" + f + " of a " + type_name(v));
      return v.j.get<std::string>();
    };
    if (f == "trim") {
      std::string chars;
      const bool has = !e.args.empty();
      if (has) chars = str_arg(e, 0, "|trim");
      return Value::of(py_strip(str_of(v), has ? &chars : nullptr, true, true));
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value::of(int64_t(code_points(v.j.get<std::string>()).size()));
      if (v.is_list() || v.is_dict()) return Value::of(int64_t(v.j.size()));
      if (v.is_undefined()) return Value::of(int64_t(0));
      error(e.line, std::string("|length of a ") + type_name(v));
    }
    if (f == "tojson") {
      int indent = -1;
      for (const auto& [k, x] : e.kwargs) {
        Value iv = eval(*x);
        if (k != "indent") error(e.line, "|tojson takes only indent= here");
        if (!iv.is_json() || !iv.j.is_null()) indent = int(indent_arg(iv, e.line));
      }
      if (!e.args.empty()) indent = int(indent_arg(eval(*e.args[0]), e.line));
      std::string s;
      dump_json(json_of(v, e.line), indent, 0, &s);
      return Value::of(s);
    }
    if (f == "string") return Value::of(str_of(v));
    if (f == "list") {
      Json l = Json::array();
      for (const Value& x : items_of(v, e.line)) l.push_back(x.j);
      return Value::of(std::move(l));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (e.args.empty()) error(e.line, "|" + f + " needs an attribute name");
      const std::string attr = str_arg(e, 0, f.c_str());
      Json l = Json::array();
      for (const Value& x : items_of(v, e.line)) {
        Value a = attribute(x, attr, e.line);
        bool r;
        if (e.args.size() == 1) {
          r = truthy(a);
        } else {
          const std::string t = str_arg(e, 1, f.c_str());
          Value arg = e.args.size() > 2 ? eval(*e.args[2]) : Value::undefined();
          r = apply_test(t, a, arg, e.line);
        }
        if (r == (f == "selectattr")) l.push_back(x.j);
      }
      return Value::of(std::move(l));
    }
    if (f == "select" || f == "reject") {
      Json l = Json::array();
      const std::string t = e.args.empty() ? "" : str_arg(e, 0, f.c_str());
      Value arg = e.args.size() > 1 ? eval(*e.args[1]) : Value::undefined();
      if (!t.empty() && !kTests.count(t)) error(e.line, "|" + f + ": the test '" + t + "'");
      for (const Value& x : items_of(v, e.line)) {
        const bool r = t.empty() ? truthy(x) : apply_test(t, x, arg, e.line);
        if (r == (f == "select")) l.push_back(x.j);
      }
      return Value::of(std::move(l));
    }
    if (f == "map") {
      if (e.kwargs.size() != 1 || e.kwargs[0].first != "attribute" || !e.args.empty())
        error(e.line, "|map takes only attribute= here");
      const Value an = eval(*e.kwargs[0].second);
      Json l = Json::array();
      for (const Value& x : items_of(v, e.line))
        l.push_back(json_of(attribute(x, str_of(an), e.line), e.line));
      return Value::of(std::move(l));
    }
    if (f == "join") {
      const std::string sep = e.args.empty() ? "" : str_arg(e, 0, "|join");
      std::string r;
      bool first = true;
      for (const Value& x : items_of(v, e.line)) {
        r += (first ? "" : sep) + str_of(x);
        first = false;
        if (r.size() > kMaxLength) error(e.line, "|join longer than the limit");
      }
      return Value::of(r);
    }
    if (f == "first" || f == "last") {
      std::vector<Value> xs = items_of(v, e.line);
      if (xs.empty()) return Value::undefined();
      return f == "first" ? xs.front() : xs.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.j.get<std::string>());
        std::string r;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
        return Value::of(r);
      }
      Json l = Json::array();
      std::vector<Value> xs = items_of(v, e.line);
      for (auto it = xs.rbegin(); it != xs.rend(); ++it) l.push_back(it->j);
      return Value::of(std::move(l));
    }
    if (f == "lower" || f == "upper" || f == "capitalize") {
      std::string s = need_string();
      if (f == "capitalize") return Value::of(capitalize(s, false));
      for (char& c : s)
        c = char(f == "upper" ? std::toupper(static_cast<unsigned char>(c))
                              : std::tolower(static_cast<unsigned char>(c)));
      return Value::of(s);
    }
    if (f == "default" || f == "d") {
      bool boolean = e.args.size() > 1 && truthy(eval(*e.args[1]));
      for (const auto& [k, x] : e.kwargs)
        if (k == "boolean") boolean = truthy(eval(*x));
      if (v.is_undefined() || (boolean && !truthy(v)))
        return e.args.empty() ? Value::of("") : eval(*e.args[0]);
      return v;
    }
    if (f == "items") {
      if (!v.is_dict()) error(e.line, std::string("|items of a ") + type_name(v));
      Json l = Json::array();
      for (auto it = v.j.begin(); it != v.j.end(); ++it)
        l.push_back(Json::array({it.key(), it.value()}));
      return Value::of(std::move(l));
    }
    if (f == "int") {
      if (v.is_number() && !v.j.is_number_float()) return Value::of(v.j.get<int64_t>());
      if (v.is_number()) {
        const double d = std::trunc(v.j.get<double>());
        if (!(d > -9.2e18 && d < 9.2e18)) error(e.line, "|int of a float out of the int range");
        return Value::of(int64_t(d));
      }
      if (v.is_string()) {
        try {
          return Value::of(int64_t(std::stoll(v.j.get<std::string>())));
        } catch (const std::exception&) {
          return Value::of(int64_t(0));
        }
      }
      return Value::of(int64_t(0));
    }
    if (f == "float") {
      if (v.is_number()) return Value::of(v.j.get<double>());
      return Value::of(0.0);
    }
    if (f == "abs") {
      if (!v.is_number()) error(e.line, std::string("|abs of a ") + type_name(v));
      if (v.j.is_number_float()) return Value::of(std::fabs(v.j.get<double>()));
      const int64_t x = v.j.get<int64_t>();
      if (x == INT64_MIN) error(e.line, "integer overflow in |abs");
      return Value::of(x < 0 ? -x : x);
    }
    error(e.line, "the filter |" + f + " is not supported");
  }

  bool test(const Expr& e) {
    Value v = eval(*e.a);
    Value arg = e.args.empty() ? Value::undefined() : eval(*e.args[0]);
    return apply_test(e.name, v, arg, e.line);
  }

  bool equal(const Value& a, const Value& b) {
    if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
    if (a.kind == Value::Kind::kNamespace || b.kind == Value::Kind::kNamespace) return a.ns == b.ns;
    // Python: True == 1 and 1 == 1.0; JSON keeps bools apart from numbers.
    if (a.j.is_boolean() && b.j.is_number()) return Json(int64_t(a.j.get<bool>())) == b.j;
    if (b.j.is_boolean() && a.j.is_number()) return Json(int64_t(b.j.get<bool>())) == a.j;
    return a.j == b.j;
  }

  bool apply_test(const std::string& t, const Value& v, const Value& arg, int line) {
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_json() && v.j.is_null();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_json() && v.j.is_number_integer();
    if (t == "float") return v.is_json() && v.j.is_number_float();
    if (t == "mapping") return v.is_dict() || v.kind == Value::Kind::kNamespace;
    if (t == "iterable" || t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "boolean") return v.is_json() && v.j.is_boolean();
    if (t == "true") return v.is_json() && v.j.is_boolean() && v.j.get<bool>();
    if (t == "false") return v.is_json() && v.j.is_boolean() && !v.j.get<bool>();
    if (t == "equalto" || t == "eq" || t == "==") return equal(v, arg);
    if (t == "ne") return !equal(v, arg);
    if (t == "even" || t == "odd") {
      if (!v.is_number() || v.j.is_number_float()) error(line, "is " + t + " of a non-int");
      const int64_t x = v.j.get<int64_t>();
      return ((x % 2) == 0) == (t == "even");
    }
    error(line, "the test 'is " + t + "' is not supported");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.a);
      return truthy(a) ? eval(*e.b) : a;
    }
    if (op == "or") {
      Value a = eval(*e.a);
      return truthy(a) ? a : eval(*e.b);
    }
    Value a = eval(*e.a), b = eval(*e.b);
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "~") return bounded(Value::of(str_of(a) + str_of(b)), e.line);
    if (op == "in" || op == "not in") {
      bool r;
      if (b.is_string()) {
        if (!a.is_string())
          error(e.line, std::string("'in <string>' needs a string, not a ") + type_name(a));
        r = b.j.get<std::string>().find(a.j.get<std::string>()) != std::string::npos;
      } else if (b.is_list()) {
        r = false;
        for (const Json& x : b.j) r = r || equal(a, Value::of(x));
      } else if (b.is_dict() || b.kind == Value::Kind::kNamespace) {
        r = a.is_string() &&
            attribute(b, a.j.get<std::string>(), e.line).kind != Value::Kind::kUndefined;
      } else {
        error(e.line, std::string("'in' a ") + type_name(b));
      }
      return Value::of(op == "in" ? r : !r);
    }
    if (op == "+" && a.is_string() && b.is_string())
      return bounded(Value::of(a.j.get<std::string>() + b.j.get<std::string>()), e.line);
    if (op == "+" && a.is_list() && b.is_list()) {
      if (a.j.size() + b.j.size() > kMaxLength) error(e.line, "a list longer than the limit");
      step(e.line, int64_t(a.j.size() + b.j.size()));
      Json l = a.j;
      for (const Json& x : b.j) l.push_back(x);
      return Value::of(std::move(l));
    }
    if (op == "*" && a.is_string() && b.is_number() && !b.j.is_number_float()) {
      const std::string& x = a.j.get_ref<const std::string&>();
      const int64_t n = std::max<int64_t>(0, b.j.get<int64_t>());
      if (!x.empty() && uint64_t(n) > kMaxLength / x.size())
        error(e.line, "a string longer than " + std::to_string(kMaxLength));
      std::string r;
      for (int64_t i = 0; i < n; ++i) r += x;
      return bounded(Value::of(r), e.line);
    }
    if ((op == "<" || op == ">" || op == "<=" || op == ">=") && a.is_string() && b.is_string()) {
      const int c = a.j.get<std::string>().compare(b.j.get<std::string>());
      return Value::of(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    auto numeric = [](const Value& v) {
      return v.is_json() && (v.j.is_number() || v.j.is_boolean());
    };
    if (!numeric(a) || !numeric(b))
      error(e.line,
            std::string("'") + op + "' between a " + type_name(a) + " and a " + type_name(b));
    const bool ints = !a.j.is_number_float() && !b.j.is_number_float();
    if (ints && op == "**" && as_int(b) >= 0) {  // Python: an int to a non-negative int power
      int64_t r = 1, p = as_int(a);              // by squaring: r * p^k stays the answer
      for (uint64_t k = uint64_t(as_int(b)); k > 0;) {
        if ((k & 1) && __builtin_mul_overflow(r, p, &r)) error(e.line, "integer overflow in '**'");
        k >>= 1;
        if (k > 0 && __builtin_mul_overflow(p, p, &p)) error(e.line, "integer overflow in '**'");
      }
      return Value::of(r);
    }
    if (ints && op != "/" && op != "**") {
      const int64_t x = as_int(a), y = as_int(b);
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
      if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
      if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
      if (overflow) error(e.line, "integer overflow in '" + op + "' (ft's ints are 64-bit)");
      if (op == "+" || op == "-" || op == "*") return Value::of(r);
      if (op == "<") return Value::of(x < y);
      if (op == ">") return Value::of(x > y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">=") return Value::of(x >= y);
      if (y == 0) error(e.line, "division by zero");
      if (y == -1) {  // x / -1 overflows for the least int64
        if (op == "%") return Value::of(int64_t(0));
        if (__builtin_sub_overflow(int64_t(0), x, &r)) error(e.line, "integer overflow in '//'");
        return Value::of(r);
      }
      int64_t q = x / y;
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        --q;
        r += y;
      }
      return Value::of(op == "//" ? q : r);
    }
    const double x = a.j.is_boolean() ? double(a.j.get<bool>()) : a.j.get<double>();
    const double y = b.j.is_boolean() ? double(b.j.get<bool>()) : b.j.get<double>();
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "**") return Value::of(std::pow(x, y));
    if (op == "<") return Value::of(x < y);
    if (op == ">") return Value::of(x > y);
    if (op == "<=") return Value::of(x <= y);
    if (op == ">=") return Value::of(x >= y);
    if (y == 0) error(e.line, "division by zero");
    if (op == "/") return Value::of(x / y);
    if (op == "//") return Value::of(std::floor(x / y));
    return Value::of(x - y * std::floor(x / y));
  }

  std::string name_;
  std::vector<std::map<std::string, Value>> frames_;
  int64_t steps_ = 0, max_steps_;
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

std::string Template::render(const Json& context, int64_t max_steps) const {
  Renderer r(impl_->name, context, max_steps);
  try {
    r.run(impl_->nodes);
  } catch (const Json::exception& e) {  // a value of the wrong type where the code assumed one
    throw TemplateError(impl_->name + ": " + e.what());
  }
  return std::move(r.out);
}

}  // namespace ft::jinja
