// The Renderer (jinja_internal.h), its expressions: names, literals, lists and dicts, attributes,
// items, slices, the ternary, and the unary and binary operators with Python's semantics.
#include "data/jinja_internal.h"

#include <cmath>

namespace ft::jinja::detail {

// An expression's value (in a fork: as it is in the fork's world, without shadows).
Value Renderer::eval(const Expr& e) {
  if (view_ >= 0) return project(eval_here(e), view_);
  return eval_here(e);
}

Value Renderer::eval_here(const Expr& e) {
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
      return lift(args, false, [&](const std::vector<Value>& a, int) { return slice(a, e.line); });
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

Value Renderer::unary(const Expr& e, const Value& a) {
  if (e.name == "not") return Value::boolean(!truthy(a));
  if (!a.is_number()) error(e.line, "unary " + e.name + " on a " + type_name(a));
  if (e.name == "+") return a;
  if (a.kind == Value::Kind::kFloat) return Value::number(-a.d);
  int64_t r;
  if (__builtin_sub_overflow(int64_t(0), a.i, &r)) error(e.line, "integer overflow in unary -");
  return Value::integer(r);
}

Value Renderer::attribute(const Value& obj, const std::string& attr, int line) {
  if (obj.is_undefined()) error(line, "'." + attr + "' of an undefined value");
  if (obj.is_namespace() || obj.is_dict()) {
    const Value* v = obj.m->find(attr);
    return v ? *v : Value();
  }
  return Value();
}

Value Renderer::item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) error(line, "subscript of an undefined value");
  if (obj.is_dict() || obj.is_namespace()) {
    if (!key.is_string()) return Value();
    return attribute(obj, key.str(), line);
  }
  if (obj.is_list() || obj.is_string()) {
    if (!key.is_int())
      error(line,
            std::string("a ") + type_name(obj) + " index must be an int, not a " + type_name(key));
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
Value Renderer::slice(const std::vector<Value>& a, int line) {
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

Value Renderer::binary(const Expr& e) {
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

Value Renderer::binary_op(const std::string& op, const Value& a, const Value& b, int line, int w) {
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

}  // namespace ft::jinja::detail
