// A renderer for the subset of Jinja2 that chat templates use (DESIGN.md §6 "Chat data"):
// the templates of Llama 3 Instruct, Qwen2.5 Instruct, Qwen3 and Mistral Instruct, and their
// kin. Written here from the Jinja2 template designer documentation, with the environment
// transformers renders chat templates in: trim_blocks and lstrip_blocks on, Python semantics
// for strings, lists, dicts and truthiness.
//
// Supported:
//   text, {{ expr }}, {# comments #}, whitespace control ({%- -%} {{- -}} {#- -#})
//   {% if %}/{% elif %}/{% else %}/{% endif %}
//   {% for x in seq [if cond] %} ... [{% else %}] {% endfor %}, with tuple targets (k, v) and
//     loop.index, index0, revindex, revindex0, first, last, length, previtem, nextitem
//   {% set name = expr %}, {% set a, b = expr %}, {% set ns.attr = expr %} (namespace())
//   literals: strings, ints, floats, true/false/none (any case), [lists], {dicts}, (tuples)
//   operators: or and not, in / not in, is [not] TEST, == != < <= > >=, + - * / // % ~,
//     unary -, x if c else y, attribute and item access, slices [a:b:c], calls
//   filters: trim length count tojson string list select reject selectattr rejectattr join
//     first last lower upper default items capitalize int float abs reverse map(attribute=)
//   tests: defined undefined none string number integer float mapping iterable sequence
//     boolean true false equalto eq ne even odd
//   methods: strip lstrip rstrip startswith endswith split upper lower replace title
//     capitalize items keys values get
//   globals: raise_exception(msg), namespace(k=v, ...), range(...), strftime_now(fmt) (fixed
//     date: kFixedDate)
// Anything else (macros, call blocks, include/import/extends, break/continue, other filters,
// tests, methods or functions) is refused when the template is parsed, naming the construct
// and the template line.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ft::jinja {

using Json = nlohmann::ordered_json;

// The date strftime_now() formats (the Llama 3.1+ templates print "Today Date"): ft renders
// training data, so a fixed date keeps tokenization reproducible. 26 Jul 2024 is the default
// those templates use when no date is given.
constexpr int kFixedYear = 2024, kFixedMonth = 7, kFixedDay = 26;

// The default bound on one rendering's work (Template::render); rendering a chat template
// takes some thousands of steps per conversation.
constexpr int64_t kMaxSteps = 5000000;

// An error while parsing or rendering; what() names the template and its line.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One string of a rendering's context to vary (Template::render_varied): the JSON pointer to it
// (e.g. "/messages/3/content") and the strings to render in its place, one at a time.
struct Variation {
  Json::json_pointer where;
  std::vector<std::string> alternatives;
};

// Replace text[pos, pos + len) by `with`.
struct Edit {
  size_t pos = 0, len = 0;
  std::string with;
};

struct VariedRendering {
  std::string text;  // the rendering of the context as given (what render() returns)
  // edits[v][k]: the rendering with variation v's string replaced by its alternative k (and all
  // else as given) is `text` with these edits applied (sorted by pos, not overlapping).
  std::vector<std::vector<std::vector<Edit>>> edits;
  int64_t render_steps = 0;     // the steps of rendering `text`, as render() counts them
  int64_t steps = 0;            // all the work: render_steps, the shadow values', full renderings'
  int64_t full_renderings = 0;  // alternatives that needed a rendering of their own
};

class Template {
 public:
  // Parses `text`; `name` (e.g. a file path) prefixes errors. Throws TemplateError for a
  // syntax error or a construct outside the subset above.
  Template(const std::string& text, const std::string& name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (a JSON object). A raise_exception() in the
  // template, a type error (e.g. "a" + 1), or more than max_steps steps of work (statements,
  // expressions, loop iterations, elements handled: a bound on time and memory) throws
  // TemplateError. `steps`, when given, receives the steps taken.
  std::string render(const Json& context, int64_t max_steps = kMaxSteps,
                     int64_t* steps = nullptr) const;

  // render(context) and, for each alternative of each variation, what render() gives with that
  // one string of the context replaced, as edits of the first rendering; the same results as
  // rendering each alternative in full (throwing the TemplateError the first such rendering to
  // fail, in variation then alternative order, would throw), in far less work when the
  // variations change only the values the template prints.
  //
  // How (shadow execution): values derived from a varied string carry what they would be in
  // each alternative ("world"), computed by applying the same operation to the worlds' operands;
  // a printed value that differs in a world is an edit of that world. Every decision that such
  // a value takes part in is checked in each world: a world that decides otherwise at an if,
  // a ternary or and/or runs its own branch in a fork (its text replacing the real branch's in
  // its rendering); one whose loop would run another number of times, that fails, or that one
  // value would carry beside more than a few other varied strings' worlds, is rendered in full.
  // A variation's `where` must name a string of `context` (else TemplateError).
  VariedRendering render_varied(const Json& context, const std::vector<Variation>& variations,
                                int64_t max_steps = kMaxSteps) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft::jinja
