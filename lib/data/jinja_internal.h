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
//
// The files, each with one job, and this header, which they share (nothing outside
// lib/data includes it):
//   jinja_values.cpp    values: Python's str(), repr, ==, strip; json.dumps; from JSON
//   jinja_lexer.cpp     the template cut into text and tags, a tag into tokens
//   jinja_parser.cpp    tokens parsed into expression trees, tags into a tree of statements
//   jinja_render.cpp    the Renderer: worlds and forks, output, variables, statements
//   jinja_eval.cpp      the Renderer: expressions and operators
//   jinja_builtins.cpp  the Renderer: calls (range, namespace, ...), methods, filters, tests
//   jinja.cpp           the Template of jinja.h
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/jinja.h"

namespace ft::jinja::detail {

[[noreturn]] inline void fail(const std::string& name, int line, const std::string& msg) {
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

// The value as it is in world w (w < 0: the real world): its shadow for w, else itself.
inline const Value& at(const Value& v, int w) {
  if (w >= 0 && v.shadows)
    for (const Shadow& s : *v.shadows)
      if (s.world == w) return s.v;
  return v;
}

// `v` without its shadows (its leaves keep theirs).
inline Value strip(Value v) {
  v.shadows.reset();
  return v;
}

// `v` as it is in world w, without shadows at its top level.
inline Value project(const Value& v, int w) {
  const Value& x = at(v, w);
  return &x == &v ? strip(v) : x;
}

inline bool is_scalar(const Value& v) {
  return v.kind != Value::Kind::kList && v.kind != Value::Kind::kDict &&
         v.kind != Value::Kind::kNamespace;
}

// Python truthiness. Of a list or dict it reads the length only (not the items).
inline bool truthy(const Value& v) {
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

// Defined in jinja_values.cpp.
Value make_dict(std::vector<std::pair<std::string, Value>> items);
Value make_namespace();
bool same_scalar(const Value& a, const Value& b);
Value from_json(const Json& j, const std::unordered_map<const Json*, std::vector<Shadow>>* alts);
const char* type_name(const Value& v);
std::vector<std::string> code_points(const std::string& s);
uint32_t decode_cp(const std::string& cp);
bool py_space(uint32_t c);
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
std::string str_of(const Value& v, int w);
bool dump_json(const Value& v, int indent, int depth, int w, std::string* out);
bool equal(const Value& x, const Value& y, int w);

// ---- lexing the template into text and tags (jinja_lexer.cpp) -----------------------------

struct Piece {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;  // the text, or the tag's inside
  int line;
};

struct Tok {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;  // name, operator, or the string's value
  Json number;
};

std::vector<Piece> cut(const std::string& s, const std::string& name);
std::vector<Tok> lex(const std::string& s, const std::string& name, int line);

// ---- trees (jinja_parser.cpp) -------------------------------------------------------------

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

// The names of the subset (jinja.h): what the parser accepts.
extern const std::set<std::string> kFilters, kTests, kMethods, kFunctions;

// The tree of statements of a template cut into `pieces` (errors name the template `name`).
std::vector<Node> build_tree(const std::vector<Piece>& pieces, const std::string& name);

// ---- evaluation ---------------------------------------------------------------------------

using WorldSet = std::vector<int32_t>;  // sorted

inline void insert_world(WorldSet* ws, int32_t w) {
  auto it = std::lower_bound(ws->begin(), ws->end(), w);
  if (it == ws->end() || *it != w) ws->insert(it, w);
}

// Walks a tree of statements with a stack of variable frames (shadow execution: at the top of
// this file). Its templates and the hot one-liners are defined here; the other members in the
// file their section names.
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

  // ---- worlds (jinja_render.cpp) ----

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

  void add_edit(int32_t w, size_t pos, size_t len, std::string with);
  void write(const std::string& s);

  // While computing a value in one world: its steps count apart (shadow_steps_).
  struct InWorld {
    Renderer* r;
    int saved;
    InWorld(Renderer* renderer, int w) : r(renderer), saved(renderer->world_) { r->world_ = w; }
    ~InWorld() { r->world_ = saved; }
  };

  void walk_worlds(const Value& v, WorldSet* ws);
  void add_worlds(const Value& v, bool deep, WorldSet* ws);

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

  Value with_shadow(Value v, int32_t w, Value sv);
  bool decide(const Value& v, WorldSet* away = nullptr);

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

  void emit(const Value& v, int line);

  // ---- variables (jinja_render.cpp) ----

  Value* find(const std::string& var);
  std::vector<Value> unpack(const Value& v, size_t n, int line);
  Value assigned(const Value* old, Value v);
  void set_var(const std::string& var, Value v);
  void assign(const std::vector<std::string>& targets, const Value& v, int line);

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

  Value bounded(Value v, int line);
  Value element(Value v, int line);

  // ---- statements (jinja_render.cpp) ----

  void exec(const Node& n);
  void exec_if(const Node& n);
  std::vector<Value> items_of(const Value& v, int line);
  std::vector<Value> items_with_worlds(const Value& v, int line);
  void exec_for(const Node& n);

  // ---- expressions (jinja_eval.cpp) ----

  Value eval(const Expr& e);
  Value eval_here(const Expr& e);
  Value unary(const Expr& e, const Value& a);
  Value attribute(const Value& obj, const std::string& attr, int line);
  Value item(const Value& obj, const Value& key, int line);
  Value slice(const std::vector<Value>& a, int line);
  Value binary(const Expr& e);
  Value binary_op(const std::string& op, const Value& a, const Value& b, int line, int w);

  // ---- calls, methods, filters and tests (jinja_builtins.cpp) ----

  int64_t indent_arg(const Value& v, int line);
  std::string str_arg(const std::vector<Value>& a, size_t k, int line, const std::string& what);
  Value call(const Expr& e);
  Value range(const std::vector<Value>& a, int line);
  Value method(const Expr& e, const std::vector<Value>& a);
  static std::string capitalize(const std::string& s, bool each_word);
  std::string strftime_fixed(const std::string& fmt, int line);

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

  Value test_value(const std::string& t, const Value& x, const Value& arg, int line, int w);
  Value filter(const Expr& e);
  Value apply_filter(const Expr& e, const std::vector<Value>& a, int w);
  bool apply_test(const std::string& t, const Value& v, const Value& arg, int line, int w);

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

}  // namespace ft::jinja::detail
