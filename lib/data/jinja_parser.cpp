// Parsing: a tag's tokens into an expression tree (Parser), the template's pieces into a tree of
// statements (TreeBuilder). A construct outside the subset is refused here, naming it.
#include "data/jinja_internal.h"

namespace ft::jinja::detail {

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

namespace {

// ---- expressions --------------------------------------------------------------------------

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

}  // namespace

std::vector<Node> build_tree(const std::vector<Piece>& pieces, const std::string& name) {
  return TreeBuilder(pieces, name).top();
}

}  // namespace ft::jinja::detail
