// The Template of jinja.h: a template cut (jinja_lexer.cpp), parsed into a tree
// (jinja_parser.cpp) and rendered (the Renderer: jinja_render.cpp, jinja_eval.cpp,
// jinja_builtins.cpp). How, and the invariants of shadow execution: jinja_internal.h.
#include "data/jinja.h"

#include <unordered_map>
#include <vector>

#include "data/jinja_internal.h"

namespace ft::jinja {

struct Template::Impl {
  std::string name;
  std::vector<detail::Node> nodes;
};

Template::Template(const std::string& text, const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = name;
  std::vector<detail::Piece> pieces = detail::cut(text, name);
  impl_->nodes = detail::build_tree(pieces, name);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Json& context, int64_t max_steps, int64_t* steps) const {
  detail::Renderer r(impl_->name, max_steps, 0);
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it)
      r.set(it.key(), detail::from_json(it.value(), nullptr));
  r.run(impl_->nodes);
  if (steps) *steps = r.steps();
  return std::move(r.out);
}

VariedRendering Template::render_varied(const Json& context,
                                        const std::vector<Variation>& variations,
                                        int64_t max_steps) const {
  VariedRendering out;
  // World w is alternative world_of[w].second of variation world_of[w].first.
  std::unordered_map<const Json*, std::vector<detail::Shadow>> alternatives;
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
          {int32_t(world_of.size()), detail::Value::string(var.alternatives[k])});
      world_of.emplace_back(v, k);
    }
  }
  detail::Renderer r(impl_->name, max_steps, int32_t(world_of.size()));
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it)
      r.set(it.key(), detail::from_json(it.value(), &alternatives));
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
