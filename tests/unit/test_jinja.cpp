// jinja: the chat-template subset (lib/data/jinja.h) on cases small enough to state by hand —
// whitespace control with trim_blocks/lstrip_blocks, Python semantics of the operators,
// filters, tests and methods the templates call, loops, namespace(), raise_exception — and the
// refusal of constructs outside the subset, naming them and the line. Agreement with Jinja2
// through transformers on the four committed templates is tests/cli/test_chat_data.sh.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "data/jinja.h"

namespace {

using ft::jinja::Json;
using ft::jinja::Template;
using ft::jinja::TemplateError;

std::string render(const std::string& text, const Json& ctx = Json::object()) {
  return Template(text, "t").render(ctx);
}

std::string error_of(const std::string& text, const Json& ctx = Json::object()) {
  try {
    render(text, ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("jinja: text, output and whitespace control") {
  CHECK(render("plain text") == "plain text");
  CHECK(render("{{ 'a' }}{{ \"b\" }}") == "ab");
  CHECK(render("x  {{- ' y' -}}  \n z") == "x yz");
  CHECK(render("{# comment #}a{#- c -#}  b") == "ab");
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before one.
  CHECK(render("{% if true %}\nyes\n{% endif %}\nafter") == "yes\nafter");
  CHECK(render("line\n    {% if true %}in{% endif %}") == "line\nin");
  // Not before an output tag, nor when text precedes the tag on its line.
  CHECK(render("  {{ 'a' }}") == "  a");
  CHECK(render("x  {% if true %}a{% endif %}") == "x  a");
  // "}}" inside a string does not close the tag (Mistral v0.3 writes {{- "}}" }}).
  CHECK(render("{{- \"}}\" }}") == "}}");
}

TEST_CASE("jinja: values and operators with Python semantics") {
  CHECK(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }}") ==
        "7 3 -4 2 3.5");
  CHECK(render("{{ 'a' ~ 1 ~ none ~ true }}") == "a1NoneTrue");
  CHECK(render("{{ none }}|{{ undefined_name }}|{{ [1, 'x'] }}|{{ {'k': false} }}") ==
        "None||[1, 'x']|{'k': False}");
  CHECK(render("{{ 'ab' in 'cabd' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}") ==
        "True True True False");
  CHECK(render("{{ not 0 and 'x' or 'y' }}") == "x");
  CHECK(render("{{ '' or 'fallback' }} {{ 'a' if false else 'b' }}") == "fallback b");
  CHECK(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} {{ 'a' < 'b' }}") ==
        "True True True True");
  CHECK(contains(error_of("{{ 'a' + 1 }}"), "'+' between a string and a int"));
  CHECK(render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ (-3) ** 3 }} {{ 1 ** 99999999999 }}") ==
        "1024 0.5 -27 1");
  CHECK(contains(error_of("{{ 9223372036854775807 + 1 }}"), "integer overflow"));
  CHECK(contains(error_of("{{ 3 ** 99 }}"), "integer overflow"));
  CHECK(contains(error_of("{{ range(100001) | length }}"), "range() longer than 100000"));
  CHECK(contains(error_of("{{ 'ab' * 100000000 }}"), "longer than"));
  // A bound on work: a loop with an empty body counts too (a small bound keeps this quick).
  CHECK_THROWS_WITH_AS(Template("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                                "{% endfor %}",
                                "t")
                           .render(Json::object(), 10000),
                       "t:1: the template took more than 10000 steps", TemplateError);
  CHECK(contains(error_of("{{ {'a': 1} | tojson(indent='x') }}"), "indent must be an int"));
}

TEST_CASE("jinja: subscripts, slices, attributes") {
  const Json ctx = {{"m", Json::array({Json{{"role", "system"}, {"content", "S"}},
                                       Json{{"role", "user"}, {"content", "U"}}})},
                    {"s", "héllo"}};
  CHECK(render("{{ m[0]['role'] }} {{ m[-1].content }} {{ m[1:] | length }}", ctx) == "system U 1");
  CHECK(render("{% for x in m[::-1] %}{{ x.role }},{% endfor %}", ctx) == "user,system,");
  CHECK(render("{{ s[1] }} {{ s[:-1] }} {{ s[::-1] }} {{ s | length }}", ctx) == "é héll olléh 5");
  CHECK(render("{{ m[5] is defined }} {{ m[0].tool_calls is defined }}", ctx) == "False False");
  CHECK(contains(error_of("{{ nothing.attr }}"), "of an undefined value"));
}

TEST_CASE("jinja: filters, tests and methods the templates call") {
  CHECK(render("[{{ '  a b \n' | trim }}]") == "[a b]");
  CHECK(render("{{ '\u00a0x\u3000' | trim | length }}") == "1");  // Unicode whitespace
  CHECK(render("{{ {'a': [1, 'é'], 'b': none} | tojson }}") == "{\"a\": [1, \"é\"], \"b\": null}");
  CHECK(render("{{ {'a': 1} | tojson(indent=2) }}") == "{\n  \"a\": 1\n}");
  CHECK(render("{{ 'a\"\n' | tojson }}") == "\"a\\\"\\n\"");
  const Json ctx = {{"m", Json::array({Json{{"role", "user"}, {"content", "1"}},
                                       Json{{"role", "assistant"}, {"content", "2"}},
                                       Json{{"role", "user"}, {"content", "3"}}})}};
  CHECK(render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
               "join(',') }}",
               ctx) == "1,3");
  CHECK(render("{{ m | rejectattr('role', 'equalto', 'user') | list | length }}", ctx) == "1");
  CHECK(render("{{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(', ') }} "
               "{{ [0, 1, '', 'x'] | select | list }}") == "a, b [1, 'x']");
  CHECK(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} "
               "{{ false is false }} {{ 0 is false }} {{ {} is mapping }} {{ 4 is even }}") ==
        "False True True True True False True True");
  CHECK(render("{{ 'x' is not none and 'y' is not string }}") == "False");
  CHECK(render("{{ '\n\nabc\n'.strip('\n') }}|{{ 'xxabc'.lstrip('x') }}|{{ ' a '.rstrip() }}") ==
        "abc|abc| a");
  CHECK(render("{{ 'a</think>b'.split('</think>')[-1] }} {{ ' a  b '.split() | length }}") ==
        "b 2");
  CHECK(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'aXa'.replace('a', "
               "'b') }} {{ 'ab'.upper() }}") == "True True bXb AB");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() if k != 'b' %}{{ k }}={{ v }}{% endfor "
               "%}") == "a=1");
  CHECK(render("{{ strftime_now('%d %b %Y') }}") == "26 Jul 2024");
}

TEST_CASE("jinja: loops, scopes and namespace") {
  CHECK(render("{% for x in [1, 2, 3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
               "{{ loop.length }};{% endfor %}") == "0TrueFalse3;1FalseFalse3;2FalseTrue3;");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in 'abc' %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }},{% endfor %}") ==
        "ab,abc,bc,");
  // A set inside a loop stays inside; a namespace carries values out.
  CHECK(render("{% set a = 1 %}{% for x in [5] %}{% set a = x %}{% endfor %}{{ a }}") == "1");
  CHECK(render("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}"
               "{% endfor %}{{ ns.n }}") == "3");
  CHECK(render("{% if false %}a{% elif 1 %}b{% else %}c{% endif %}") == "b");
  CHECK(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}") == "21");
  CHECK(contains(error_of("{{ raise_exception('roles must alternate') }}"),
                 "raised an exception: roles must alternate"));
  // A message built from a (long) content is cut, at a character.
  const std::string long_message =
      error_of("{{ raise_exception('bad: ' ~ c) }}", {{"c", std::string(100000, 'x') + "é"}});
  CHECK(contains(long_message, "raised an exception: bad: xxx"));
  CHECK(long_message.size() < 300);
}

TEST_CASE("jinja: constructs outside the subset are refused by name and line") {
  auto parse_error = [](const std::string& text) -> std::string {
    try {
      Template t(text, "tmpl.jinja");
    } catch (const TemplateError& e) {
      return e.what();
    }
    return "";
  };
  const std::string m = parse_error("a\n{% macro f() %}x{% endmacro %}");
  CHECK(contains(m, "tmpl.jinja:2"));
  CHECK(contains(m, "{% macro %}"));
  CHECK(contains(m, "outside the Jinja subset"));
  CHECK(contains(parse_error("{{ x | wordwrap }}"), "the filter |wordwrap"));
  CHECK(contains(parse_error("{{ x is divisibleby 3 }}"), "the test 'is divisibleby'"));
  CHECK(contains(parse_error("{{ x.format(1) }}"), "the method .format()"));
  CHECK(contains(parse_error("{{ cycler(1) }}"), "the function cycler()"));
  CHECK(contains(parse_error("{% for x in y %}{% break %}{% endfor %}"), "{% break %}"));
  // An unclosed block is named with the line it opens at, and a closing tag where another is
  // due says which block is still open.
  CHECK(contains(parse_error("\n\n{% if x %}open"),
                 "tmpl.jinja:3: {% if %} is never closed: no {% endif %} before the end"));
  CHECK(contains(parse_error("{% for m in x %}\n{% if m %}a\n{% endfor %}"),
                 "tmpl.jinja:3: {% endfor %} where {% endif %} was expected: the {% if %} opened "
                 "at line 2 is not closed yet"));
  CHECK(contains(parse_error("{% for m in x %}{% endfor %}{% endfor %}"),
                 "{% endfor %} without an open {% for %}"));
  CHECK(contains(parse_error("a\n{% endif %}"),
                 "tmpl.jinja:2: {% endif %} without an open {% if %}"));
  CHECK(contains(parse_error("{% else %}"), "{% else %} outside an {% if %}"));
  CHECK(contains(parse_error("{% if a %}{% else %}{% else %}{% endif %}"),
                 "{% else %} is not allowed here: it is inside the {% if %} opened at line 1, "
                 "after its {% else %}"));
  CHECK(
      contains(parse_error("{% for a in b %}\n{% else %}{% elif c %}{% endfor %}"),
               "tmpl.jinja:2: {% elif %} is not allowed here: it is inside the {% for %} opened at "
               "line 1, after its {% else %}"));
  CHECK(contains(parse_error("{% for a in b %}{% if a %}x"),
                 "tmpl.jinja:1: {% if %} is never closed"));
  CHECK(contains(parse_error("{{ 'unterminated }}"), "unclosed"));
  CHECK(contains(parse_error("{{ 99999999999999999999 }}"), "out of range"));
  CHECK(contains(parse_error("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"),
                 "nested deeper than 100"));
  std::string deep;
  for (int i = 0; i < 150; ++i) deep += "{% if true %}";
  CHECK(contains(parse_error(deep), "nested deeper than 100"));
  CHECK(contains(parse_error("{{ '\\uZZZZ' }}"), "bad \\u escape"));
}

TEST_CASE("jinja: the committed chat templates render a conversation") {
  auto read = [](const std::string& name) {
    std::ifstream in(std::string(FT_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
    REQUIRE(in);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  Json ctx = {{"messages", Json::array({Json{{"role", "system"}, {"content", "Be brief."}},
                                        Json{{"role", "user"}, {"content", "Hi"}},
                                        Json{{"role", "assistant"}, {"content", " Hello "}}})},
              {"add_generation_prompt", false},
              {"tools", nullptr},
              {"bos_token", "<s>"},
              {"eos_token", "</s>"}};
  CHECK(Template(read("llama3_instruct.jinja"), "llama3").render(ctx) ==
        "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>");
  CHECK(Template(read("qwen2_5_instruct.jinja"), "qwen2.5").render(ctx) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n Hello <|im_end|>\n");
  CHECK(Template(read("qwen3.jinja"), "qwen3").render(ctx) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n Hello <|im_end|>\n");
  // Mistral v0.3 puts the system prompt into the user turn only when that turn is the last
  // message (the prompt of a generation), so here it is dropped.
  CHECK(Template(read("mistral_instruct_v0_3.jinja"), "mistral").render(ctx) ==
        "<s>[INST] Hi[/INST] Hello</s>");
  Json prompt = ctx;
  prompt["messages"].erase(2);
  CHECK(Template(read("mistral_instruct_v0_3.jinja"), "mistral").render(prompt) ==
        "<s>[INST] Be brief.\n\nHi[/INST]");
  ctx["messages"].push_back(Json{{"role", "assistant"}, {"content", "again"}});
  CHECK(contains(error_of(read("mistral_instruct_v0_3.jinja"), ctx), "must alternate"));
}

namespace {

using ft::jinja::Edit;

std::string error_of_render(const Template& t, const Json& ctx) {
  try {
    t.render(ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

using ft::jinja::Variation;
using ft::jinja::VariedRendering;

std::string apply_edits(const std::string& text, const std::vector<Edit>& edits) {
  std::string out;
  size_t at = 0;
  for (const Edit& e : edits) {
    REQUIRE(e.pos >= at);
    REQUIRE(e.pos + e.len <= text.size());
    out += text.substr(at, e.pos - at) + e.with;
    at = e.pos + e.len;
  }
  return out + text.substr(at);
}

// render_varied against rendering every alternative in full: the same text for each, or, when
// one of those renderings fails, the same error (the first, in variation order).
VariedRendering check_varied(const Template& t, const Json& ctx,
                             const std::vector<Variation>& variations) {
  std::string first_error;
  for (const Variation& v : variations)
    for (const std::string& x : v.alternatives) {
      Json alt = ctx;
      alt[v.where] = x;
      if (first_error.empty()) first_error = error_of_render(t, alt);
    }
  if (!first_error.empty()) {
    CHECK_THROWS_WITH_AS(t.render_varied(ctx, variations), first_error.c_str(), TemplateError);
    return {};
  }
  const VariedRendering vr = t.render_varied(ctx, variations);
  CHECK(vr.text == t.render(ctx));
  REQUIRE(vr.edits.size() == variations.size());
  for (size_t v = 0; v < variations.size(); ++v) {
    REQUIRE(vr.edits[v].size() == variations[v].alternatives.size());
    for (size_t k = 0; k < variations[v].alternatives.size(); ++k) {
      Json alt = ctx;
      alt[variations[v].where] = variations[v].alternatives[k];
      CAPTURE(variations[v].where.to_string());
      CAPTURE(variations[v].alternatives[k]);
      CHECK(apply_edits(vr.text, vr.edits[v][k]) == t.render(alt));
    }
  }
  return vr;
}

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const char* const kTemplateFiles[] = {"llama3_instruct.jinja", "llama3_1_instruct.jinja",
                                      "qwen2_5_instruct.jinja", "qwen3.jinja",
                                      "mistral_instruct_v0_3.jinja"};

// A conversation of `turns` user/assistant pairs after a system prompt, the chat context of
// chat.h (tools and documents none), and a variation "A"/"B" of every assistant content.
Json conversation(int turns, const std::vector<std::string>& answers,
                  std::vector<Variation>* vars) {
  Json messages = Json::array({Json{{"role", "system"}, {"content", "Be brief."}}});
  for (int i = 0; i < turns; ++i) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", answers[size_t(i) % answers.size()]}});
    if (vars)
      vars->push_back(
          {Json::json_pointer("/messages/" + std::to_string(messages.size() - 1) + "/content"),
           {"A", "B"}});
  }
  return {{"messages", messages}, {"add_generation_prompt", false},
          {"tools", nullptr},     {"documents", nullptr},
          {"bos_token", "<s>"},   {"eos_token", "</s>"}};
}

}  // namespace

TEST_CASE("jinja: render_varied gives each alternative's rendering as edits") {
  const Json ctx = {{"a", "x"}, {"b", "yz"}, {"n", 2}};
  const std::vector<Variation> va = {{Json::json_pointer("/a"), {"A", "BB"}}};
  // Printed values only: no decision depends on a, so edits, and no full rendering.
  VariedRendering vr =
      check_varied(Template("[{{ a }}|{{ a | upper }}|{{ b ~ a }}|{{ [a, b] }}]", "t"), ctx, va);
  CHECK(vr.text == "[x|X|yzx|['x', 'yz']]");
  CHECK(vr.full_renderings == 0);
  REQUIRE(vr.edits[0][1].size() == 4);
  CHECK(vr.edits[0][1][0].pos == 1);
  CHECK(vr.edits[0][1][0].with == "BB");
  // Decisions that do not change with a keep the edits ...
  vr = check_varied(Template("{% if a is string and a | length > 0 %}{{ a }}{% endif %}", "t"), ctx,
                    va);
  CHECK(vr.full_renderings == 0);
  // ... and an alternative that decides otherwise takes its branch in a fork (A is one
  // character, like x, so a length test on it agrees; BB's does not): its edit deletes the real
  // branch's text and inserts its own.
  vr = check_varied(
      Template("<{% if a | length == 1 %}one:{{ a }}{% elif a == 'BB' %}two{% else %}more"
               "{% endif %}>{{ 'short' if a | length < 2 else 'long' }}",
               "t"),
      ctx, va);
  CHECK(vr.full_renderings == 0);
  CHECK(vr.text == "<one:x>short");
  REQUIRE(vr.edits[0][1].size() == 2);
  CHECK(vr.edits[0][1][0].pos == 1);
  CHECK(vr.edits[0][1][0].len == 5);
  CHECK(vr.edits[0][1][0].with == "two");
  // A loop that runs another number of times in an alternative: that alternative in full,
  // kept as the one edit of what differs.
  vr = check_varied(Template("<{% for c in a %}{{ c }};{% endfor %}>", "t"), ctx, va);
  CHECK(vr.full_renderings == 1);
  REQUIRE(vr.edits[0][1].size() == 1);
  CHECK(vr.edits[0][1][0].pos == 1);
  CHECK(vr.edits[0][1][0].len == 1);
  CHECK(vr.edits[0][1][0].with == "B;B");
  // Values made of several varied strings, loops over a varied value, namespaces, and, or,
  // ternaries, select, default, tests, slices and methods: all against the full renderings.
  const std::vector<Variation> both = {{Json::json_pointer("/a"), {"A", "", "x y"}},
                                       {Json::json_pointer("/b"), {"B", "yz", "<think>q"}}};
  for (const char* text :
       {"{{ a ~ b }}{{ (a + b) | length }}{{ a == b }}{{ a in b }}{{ b.split('<think>') }}",
        "{% for c in a %}{{ loop.index }}{{ c }}{% endfor %}|{% for w in b.split() %}{{ w }};"
        "{% endfor %}",
        "{% set ns = namespace(s='') %}{% for x in [a, b, 'k'] %}{% set ns.s = ns.s ~ x %}"
        "{% endfor %}{{ ns.s }}",
        "{{ a or 'none' }}|{{ b and 'yes' }}|{{ 'T' if a else 'F' }}|{{ a | default('d', true) }}",
        "{{ [a, b, ''] | select | list }}{{ [a, b] | reject('equalto', 'x') | join(',') }}",
        "{{ a[0] }}{{ b[1:] }}{{ b[::-1] }}{{ (a ~ b).strip('x') }}{{ b.startswith('y') }}",
        "{{ {'k': a, 'j': [b]} | tojson }}{{ {'k': a} == {'k': 'x'} }}{{ a * n }}",
        "{% set m = {'content': b} %}{% if '<think>' in m.content %}think{% endif %}{{ m }}",
        "{% for k, v in {'a': a, 'b': b}.items() %}{{ k }}={{ v | trim }},{% endfor %}",
        "{{ [{'r': a}, {'r': 'x'}] | selectattr('r', 'equalto', 'x') | list | length }}",
        "{% if a %}{{ raise_exception('no ' ~ a) if b == 'B' }}{% endif %}ok",
        // Forks: branches that set variables and namespaces, nested ifs, loops inside a branch,
        // and/or taking the other operand, a branch that raises in one alternative.
        "{% set ns = namespace(n=0, t='') %}{% set v = 'init' %}{% if '<think>' in b %}"
        "{% set v = b.split('<think>')[-1] %}{% set ns.t = 'T' %}{% for c in [1, 2] %}"
        "{% set ns.n = ns.n + c %}{% endfor %}{% elif a %}{% set v = a ~ '!' %}{% if b == 'yz' %}"
        "yz{% else %}not{% endif %}{% else %}{% set ns.fresh = 1 %}none{% endif %}"
        "[{{ v }}|{{ ns.n }}|{{ ns.t }}|{{ ns.fresh is defined }}|{{ 'fresh' in ns }}]",
        "{{ (a and b) ~ (a or 'dflt') ~ (b and a and 'all') ~ (not a or b) }}"
        "{% if a == '' %}{{ raise_exception('empty a') if b == 'B' }}{% endif %}",
        "{% for x in [a, b] %}{% if x | length > 2 %}{{ x | upper }}{% else %}{{ x }}"
        "{% set y = x %}{% endif %}{% endfor %}{{ y is defined }}"}) {
    CAPTURE(std::string(text));
    check_varied(Template(text, "t"), ctx, both);
  }
  // A variation that makes the template raise: the error of that rendering.
  CHECK_THROWS_WITH_AS(
      Template("{% if a == 'A' %}{{ raise_exception('bad ' ~ a) }}{% endif %}", "t")
          .render_varied(ctx, va),
      "t:1: the template raised an exception: bad A", TemplateError);
  CHECK_THROWS_AS(Template("{{ a }}", "t").render_varied(ctx, {{Json::json_pointer("/n"), {"A"}}}),
                  TemplateError);
}

TEST_CASE("jinja: render_varied on the committed templates equals the full renderings") {
  // Contents that every template prints as they are, trims, or splits (Qwen3's think blocks).
  const std::vector<std::string> answers = {
      "An answer.", " spaced ", "", "\nnewline\n", "<think>\nwhy\n</think>\n\nso", "日本語 😀"};
  for (const char* file : kTemplateFiles) {
    CAPTURE(std::string(file));
    const Template t(read_template(file), file);
    for (int turns : {1, 2, 7}) {
      std::vector<Variation> vars;
      const Json ctx = conversation(turns, answers, &vars);
      check_varied(t, ctx, vars);
    }
  }
}

TEST_CASE("jinja: render_varied's work on a 10000-turn conversation is a few renderings'") {
  // The deterministic stand-in for "linear time" (scripts/bench_chat_mask.sh measures seconds):
  // the masks of 10,000 assistant turns cost a small multiple of one rendering's steps, where
  // rendering each alternative in full costs 20,000 renderings.
  // Think blocks too: Qwen3's template decides on them (it drops earlier turns' reasoning), so
  // those alternatives take other branches, in forks.
  const std::vector<std::string> answers = {"An answer of some words.", " spaced ", "\nline\n",
                                            "<think>\nreasons\n</think>\n\nthe answer"};
  for (const char* file : kTemplateFiles) {
    CAPTURE(std::string(file));
    const Template t(read_template(file), file);
    {  // first a short one, so that a regression fails here rather than runs for hours
      std::vector<Variation> vars;
      const VariedRendering vr = t.render_varied(conversation(100, answers, &vars), vars);
      REQUIRE(vr.full_renderings == 0);
      REQUIRE(vr.steps <= 3 * vr.render_steps);
    }
    std::vector<Variation> vars;
    const Json ctx = conversation(10000, answers, &vars);
    const VariedRendering vr = t.render_varied(ctx, vars, int64_t(1) << 40);
    CHECK(vr.full_renderings == 0);
    CHECK(vr.render_steps > 100000);
    CHECK(vr.steps <= 3 * vr.render_steps);
  }
}
