// Lexing: a template cut into text and tags (trim_blocks, lstrip_blocks and the -/- whitespace
// control applied as it is cut), and a tag's inside into tokens.
#include "data/jinja_internal.h"

#include <cctype>

namespace ft::jinja::detail {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

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

}  // namespace ft::jinja::detail
