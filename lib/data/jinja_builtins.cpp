// The Renderer (jinja_internal.h), its built-ins: the functions (raise_exception, namespace,
// range, strftime_now), string and dict methods, filters and tests.
#include "data/jinja_internal.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace ft::jinja::detail {

int64_t Renderer::indent_arg(const Value& v, int line) {
  if (!v.is_int()) error(line, "|tojson indent must be an int");
  return std::clamp<int64_t>(v.i, -1, 64);
}

// The string argument k of a call (a: the evaluated arguments).
std::string Renderer::str_arg(const std::vector<Value>& a, size_t k, int line,
                              const std::string& what) {
  if (k >= a.size()) error(line, what + " needs an argument");
  if (!a[k].is_string()) error(line, what + " needs a string argument");
  return a[k].str();
}

Value Renderer::call(const Expr& e) {
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
      return lift(args, false, [&](const std::vector<Value>& a, int) { return range(a, e.line); });
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

Value Renderer::range(const std::vector<Value>& a, int line) {
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
Value Renderer::method(const Expr& e, const std::vector<Value>& a) {
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

std::string Renderer::capitalize(const std::string& s, bool each_word) {
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

std::string Renderer::strftime_fixed(const std::string& fmt, int line) {
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

// test t of x (and arg) as a value: with shadows in the real world (w = -1).
Value Renderer::test_value(const std::string& t, const Value& x, const Value& arg, int line,
                           int w) {
  const bool deep = t == "equalto" || t == "eq" || t == "==" || t == "ne";
  if (w >= 0) return Value::boolean(apply_test(t, at(x, w), at(arg, w), line, w));
  return lift({x, arg}, deep, [&](const std::vector<Value>& a, int aw) {
    return Value::boolean(apply_test(t, a[0], a[1], line, aw));
  });
}

Value Renderer::filter(const Expr& e) {
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
        return lift({x}, false,
                    [](const std::vector<Value>& a, int) { return Value::boolean(truthy(a[0])); });
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
Value Renderer::apply_filter(const Expr& e, const std::vector<Value>& a, int w) {
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

bool Renderer::apply_test(const std::string& t, const Value& v, const Value& arg, int line, int w) {
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

}  // namespace ft::jinja::detail
