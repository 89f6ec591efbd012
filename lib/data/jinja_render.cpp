// The Renderer (jinja_internal.h), its worlds and statements: the text each world writes, the
// worlds a value carries and the decisions they take, variables and assignment, {% if %} and
// {% for %}. The invariants of shadow execution are at the top of jinja_internal.h.
#include "data/jinja_internal.h"

namespace ft::jinja::detail {

// Appends an edit of world w's rendering (merged into the previous one where they touch).
void Renderer::add_edit(int32_t w, size_t pos, size_t len, std::string with) {
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
void Renderer::write(const std::string& s) {
  if (s.empty()) return;
  if (view_ >= 0) {
    add_edit(view_, out.size(), 0, s);
    return;
  }
  for (int32_t w : suspended_)
    if (alive(w)) add_edit(w, out.size(), s.size(), "");
  out += s;
}

// Every live world found inside v (a full walk: for a value whose taint is `many`).
void Renderer::walk_worlds(const Value& v, WorldSet* ws) {
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
void Renderer::add_worlds(const Value& v, bool deep, WorldSet* ws) {
  if (live_ == 0 || view_ >= 0) return;
  if (v.shadows)
    for (const Shadow& s : *v.shadows)
      if (live(s.world)) insert_world(ws, s.world);
  if (deep && (v.is_list() || v.is_dict() || v.is_namespace())) walk_worlds(v, ws);
}

// v with shadow sv for world w (v's own shadow for w replaced).
Value Renderer::with_shadow(Value v, int32_t w, Value sv) {
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
bool Renderer::decide(const Value& v, WorldSet* away) {
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

// {{ v }}: its text, and an edit for each world where the text differs.
void Renderer::emit(const Value& v, int line) {
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

Value* Renderer::find(const std::string& var) {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = it->find(var);
    if (f != it->end()) return &f->second;
  }
  return nullptr;
}

// The n items of a list to unpack into n names, each with its shadows (a world whose list
// differs in length is killed).
std::vector<Value> Renderer::unpack(const Value& v, size_t n, int line) {
  if (!v.is_list() || v.l->items.size() != n)
    error(line,
          "cannot unpack a " + std::string(type_name(v)) + " into " + std::to_string(n) + " names");
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
Value Renderer::assigned(const Value* old, Value v) {
  if (view_ >= 0) return with_shadow(old ? *old : Value(), view_, std::move(v));
  for (int32_t w : suspended_)
    if (alive(w)) v = with_shadow(std::move(v), w, old ? project(*old, w) : Value());
  return v;
}

// Sets a variable in the innermost frame (a frame a fork pushed is its world's alone).
void Renderer::set_var(const std::string& var, Value v) {
  if ((view_ >= 0 && frames_.size() > fork_frames_) || (view_ < 0 && suspended_.empty())) {
    frames_.back()[var] = std::move(v);
    return;
  }
  Value* old = find(var);
  Value nv = assigned(old, std::move(v));
  frames_.back()[var] = std::move(nv);
}

void Renderer::assign(const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    set_var(targets[0], v);
    return;
  }
  std::vector<Value> parts = unpack(v, targets.size(), line);
  for (size_t k = 0; k < targets.size(); ++k) set_var(targets[k], std::move(parts[k]));
}

// A string or list result longer than kMaxLength is an error.
Value Renderer::bounded(Value v, int line) {
  const size_t n = v.is_string() ? v.str().size() : v.is_list() ? v.l->items.size() : 0;
  step(line, int64_t(v.is_string() ? n / 256 : n));
  if (n > kMaxLength)
    error(line, "a value longer than " + std::to_string(kMaxLength) + " (string or list)");
  return v;
}

// A value put into a list or dict: undefined becomes None (as near as JSON gets); a
// namespace cannot go in.
Value Renderer::element(Value v, int line) {
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

void Renderer::exec(const Node& n) {
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
void Renderer::exec_if(const Node& n) {
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
std::vector<Value> Renderer::items_of(const Value& v, int line) {
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
std::vector<Value> Renderer::items_with_worlds(const Value& v, int line) {
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

void Renderer::exec_for(const Node& n) {
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

}  // namespace ft::jinja::detail
