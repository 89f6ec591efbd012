// Recipe loading, stages 1-4a (recipe.cpp has the list): the YAML file and the KEY=VALUE
// overrides read into per-key settings with where each was written, each setting converted by its
// schema row's type and range, derived defaults and missing required keys; the did-you-mean
// hints for unknown keys; issues sorted, and each formatted (RecipeIssue::format), as a compiler
// sorts and writes its errors.
//
// Invariants: nothing here throws on a user's input (every problem is an issue at a file, line
// and column, or at "<command line>"); a file that is unusable as a whole (unreadable, too large,
// not YAML, not a mapping) is one issue, not one per missing key.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/files.h"
#include "core/utf8.h"
#include "recipe/loader.h"
#include "recipe/schema.h"

namespace ft::recipe_internal {
namespace {

constexpr const char* kCommandLine = "<command line>";
// A recipe is a page of YAML; anything this large is the wrong file (or /dev/zero), and reading
// it whole would take the machine's memory.
constexpr size_t kMaxRecipeBytes = 1 << 20;

// Edit distance with adjacent transpositions counted as one edit (optimal string alignment),
// since swapped letters ("stpes") are the commonest typo in a key.
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

// Candidates that `name` is probably a misspelling of: the nearest within a few edits (fewer
// for short names, where a few edits turn any word into any other).
std::vector<std::string> misspelt(const std::string& name, const std::vector<std::string>& cands) {
  const size_t budget = name.size() <= 4 ? 1 : name.size() <= 8 ? 2 : 3;
  size_t best = budget + 1;
  std::vector<std::string> out;
  for (const std::string& c : cands) {
    const size_t d = edit_distance(name, c);
    if (d < best) {
      best = d;
      out.clear();
    }
    if (d == best) out.push_back(c);
  }
  return out;
}

// Candidates that contain `name` or that it contains, when the shorter is a real part of the
// longer ("batch_size" → micro_batch_size, global_batch_size), not a stray "eps" inside
// "warmup_steps".
std::vector<std::string> overlapping(const std::string& name,
                                     const std::vector<std::string>& cands) {
  std::vector<std::string> out;
  for (const std::string& c : cands) {
    const std::string& shorter = c.size() < name.size() ? c : name;
    const std::string& longer = c.size() < name.size() ? name : c;
    if (shorter.size() >= 4 && 2 * shorter.size() >= longer.size() &&
        longer.find(shorter) != std::string::npos) {
      out.push_back(c);
    }
  }
  return out;
}

// The first non-empty tier of suggestions.
std::vector<std::string> first_of(std::initializer_list<std::vector<std::string>> tiers) {
  for (const auto& t : tiers) {
    if (!t.empty()) return t;
  }
  return {};
}

std::string did_you_mean(const std::vector<std::string>& s) {
  return "did you mean " + join(s, " or ") + "?";
}

// How a node reads to a person, for "expected X, got Y" messages.
bool is_quoted(const YAML::Node& n) { return n.Tag() == "!"; }

std::optional<double> parse_double(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const YAML::Node& n) {
  bool b = false;
  if (is_quoted(n) || !YAML::convert<bool>::decode(n, b)) return std::nullopt;
  return b;
}

// At most 60 characters of a user's text, for a message (excerpt() without its quotes: a key
// path, a number as written).
std::string clip(const std::string& s) {
  std::string e = excerpt(s, 60);
  const bool cut = e.size() >= 4 && e.compare(e.size() - 3, 3, "…") == 0;
  if (cut) e.resize(e.size() - 3);
  return e.substr(1, e.size() - 2) + (cut ? "…" : "");
}

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "no value";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  if (is_quoted(n)) return "the string " + excerpt(n.Scalar());
  if (parse_bool(n)) return "the boolean " + n.Scalar();
  if (parse_double(n.Scalar())) return "the number " + clip(n.Scalar());
  return "the string " + excerpt(n.Scalar());
}

}  // namespace

// Stage 1: the YAML file → sections_ and settings_. False when the file as a whole is
// unusable (unreadable, not YAML, not a mapping).
bool Loader::read_file() {
  // Checked before it is opened: opening a FIFO would wait for a writer, and a device or a
  // huge file is no recipe.
  const std::string kind = file_kind(path_);
  if (kind == "missing") {
    issue({path_, 0, 0}, "", "no such file", "check the path");
    return false;
  }
  if (kind == "a folder") {
    issue({path_, 0, 0}, "", "this is a folder, not a recipe file",
          "give the path of a .yaml file, e.g. recipes/quickstart.yaml");
    return false;
  }
  if (kind != "a regular file") {
    issue({path_, 0, 0}, "", "this is " + kind + ", not a recipe file",
          "give the path of a .yaml file, e.g. recipes/quickstart.yaml");
    return false;
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    issue({path_, 0, 0}, "", "cannot read the recipe file", "check the path and permissions");
    return false;
  }
  // Read at most one byte past the limit: the file may grow while it is read.
  std::string text(kMaxRecipeBytes + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  if (text.size() > kMaxRecipeBytes) {
    issue({path_, 0, 0}, "",
          "larger than " + std::to_string(kMaxRecipeBytes >> 20) +
              " MiB: not a recipe (a recipe is a page of YAML)",
          "check the path: ft validate and ft train take the recipe's .yaml file");
    return false;
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    // Nothing after a syntax error can be trusted, so it is the one issue of the file.
    issue(origin(e.mark), "", "YAML syntax error: " + e.msg,
          "check indentation, colons and brackets at or just before this position");
    return false;
  }
  if (root.IsNull()) return true;  // empty file: every required key will be reported missing
  if (!root.IsMap()) {
    issue(origin(root.Mark()), "", "a recipe is a mapping of sections, got " + describe(root),
          "start with sections such as `model:`, `data:`, `training:`");
    return false;
  }
  const std::vector<std::string> sections = section_names();
  // Copies, not references: yaml-cpp's iterator hands out a temporary pair.
  for (const auto& entry : root) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    const Origin key_at = origin(key.Mark());
    if (!key.IsScalar()) {
      issue(key_at, "", "a section name must be a plain word, got " + describe(key), "");
      continue;
    }
    const std::string name = key.Scalar();
    if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
      unknown_top_level(key_at, name);
      continue;
    }
    if (sections_.count(name)) {
      issue(key_at, name,
            "section written twice (first at line " + std::to_string(sections_[name].line) + ")",
            "merge the two into one `" + name + ":` section");
      continue;
    }
    sections_[name] = key_at;
    if (value.IsNull()) continue;  // `run:` with nothing under it: all defaults
    if (!value.IsMap()) {
      issue(key_at, name, "a section is a mapping of keys, got " + describe(value),
            "write its keys on the lines below `" + name + ":`, indented, e.g. `  " +
                keys_of(name)[0] + ": ...`");
      continue;
    }
    read_section(name, value);
  }
  return true;
}

void Loader::read_section(const std::string& section, const YAML::Node& map) {
  const std::vector<std::string> valid = keys_of(section);
  // Copies, not references: yaml-cpp's iterator hands out a temporary pair.
  for (const auto& entry : map) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    const Origin key_at = origin(key.Mark());
    if (!key.IsScalar()) {
      issue(key_at, section, "a key must be a plain word, got " + describe(key), "");
      continue;
    }
    const std::string path = section + "." + key.Scalar();
    if (!find_key(path)) {
      unknown_in_section(key_at, section, key.Scalar());
      continue;
    }
    if (auto prev = settings_.find(path); prev != settings_.end()) {
      issue(key_at, path,
            "written twice (first at line " + std::to_string(prev->second.at.line) + ")",
            "keep one of them");
      continue;
    }
    // yaml-cpp marks an empty value at the next token, possibly on a later line; the key's
    // own position is the useful one then.
    settings_[path] = {value, value.IsNull() ? key_at : origin(value.Mark())};
  }
}

void Loader::unknown_top_level(const Origin& at, const std::string& name) {
  const std::vector<std::string> sections = section_names();
  std::string hint;
  if (auto s = misspelt(name, sections); !s.empty()) {
    hint = did_you_mean(s);
  } else if (auto p = paths_like(name); !p.empty()) {
    hint = did_you_mean(p) + " (keys go inside their section)";
  } else if (auto o = overlapping(name, sections); !o.empty()) {
    hint = did_you_mean(o);
  } else {
    hint = "sections are " + join(sections, ", ");
  }
  issue(at, clip(name), "unknown section", hint);
}

void Loader::unknown_in_section(const Origin& at, const std::string& section,
                                const std::string& key) {
  issue(at, clip(section + "." + key), "unknown key", unknown_key_hint(section, key));
}

// Full paths of keys, in any section, whose name or HF name ("hidden_size") is `key`, else
// close to it, else overlapping it: for a key written in the wrong section or at the top level.
std::vector<std::string> Loader::paths_like(const std::string& key) {
  std::vector<std::string> names;
  for (const KeySpec& k : schema()) {
    names.push_back(k.key());
    if (!k.hf_name.empty()) names.push_back(k.hf_name);
  }
  const std::vector<std::string> close = first_of(
      {std::find(names.begin(), names.end(), key) != names.end() ? std::vector<std::string>{key}
                                                                 : std::vector<std::string>{},
       misspelt(key, names), overlapping(key, names)});
  std::vector<std::string> out;
  for (const KeySpec& k : schema()) {
    for (const std::string& c : close) {
      if ((k.key() == c || k.hf_name == c) &&
          std::find(out.begin(), out.end(), k.path) == out.end()) {
        out.push_back(k.path);
      }
    }
  }
  return out;
}

std::string Loader::unknown_key_hint(const std::string& section, const std::string& key) {
  std::vector<std::string> valid = keys_of(section);
  if (auto s = misspelt(key, valid); !s.empty()) {
    for (auto& name : s) name = section + "." + name;
    return did_you_mean(s);
  }
  if (auto p = paths_like(key); !p.empty()) {
    const KeySpec* only = p.size() == 1 ? find_key(p[0]) : nullptr;
    if (only && only->hf_name == key) {
      return did_you_mean(p) + " (" + key + " is config.json's name for it)";
    }
    if (only && only->section() != section) {
      return did_you_mean(p) + " (it goes in section " + only->section() + ")";
    }
    return did_you_mean(p);
  }
  return "keys of " + section + " are " + join(valid, ", ");
}

std::string Loader::suggest(const std::string& name, const std::vector<std::string>& cands) {
  const std::vector<std::string> s = first_of({misspelt(name, cands), overlapping(name, cands)});
  return s.empty() ? "" : did_you_mean(s);
}

// Stage 2: KEY=VALUE overrides replace or add settings; the value is parsed as YAML so
// `optimizer.betas=[0.9,0.95]` is a list and `training.steps=20` an integer.
void Loader::apply_overrides(const std::vector<std::string>& overrides) {
  const Origin cli{kCommandLine, 0, 0};
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      issue(cli, clip(o), "not a KEY=VALUE override", "write e.g. training.steps=20");
      continue;
    }
    const std::string path = o.substr(0, eq);
    const KeySpec* spec = find_key(path);
    if (!spec) {
      const size_t dot = path.find('.');
      const std::vector<std::string> sections = section_names();
      std::string hint;
      if (dot != std::string::npos &&
          std::find(sections.begin(), sections.end(), path.substr(0, dot)) != sections.end()) {
        hint = unknown_key_hint(path.substr(0, dot), path.substr(dot + 1));
      } else {
        std::vector<std::string> all;
        for (const KeySpec& k : schema()) all.push_back(k.path);
        auto s = misspelt(path, all);
        if (s.empty()) s = paths_like(dot == std::string::npos ? path : path.substr(dot + 1));
        hint =
            s.empty() ? "override keys are dotted paths such as training.steps" : did_you_mean(s);
      }
      issue(cli, clip(path), "unknown key in override `" + clip(o) + "`", hint);
      continue;
    }
    try {
      settings_[path] = {YAML::Load(o.substr(eq + 1)), cli};
    } catch (const YAML::Exception& e) {
      issue(cli, path, "cannot parse the value of `" + o + "`: " + e.msg,
            "quote it or write a YAML scalar or flow list, e.g. optimizer.betas=[0.9,0.95]");
    }
  }
}

// Stage 3: each setting → its field, by the type and range of its row.
void Loader::convert_settings() {
  for (const KeySpec& k : schema()) {
    auto it = settings_.find(k.path);
    if (it == settings_.end()) continue;
    if (std::optional<Value> v = convert(k, it->second)) k.set(r_, *v);
  }
}

std::string Loader::example(const KeySpec& k) const {
  if (k.kind == Kind::kBetas) return "e.g. " + k.key() + ": [0.9, 0.999]";
  if (k.kind == Kind::kNames) {
    Names d = std::get<Names>(k.get(Recipe{}));
    if (d.empty()) d = {k.choices.front()};
    return "e.g. " + k.key() + ": " + format_value(d);
  }
  const std::string d = format_value(k.get(Recipe{}));
  return d.empty() ? "" : "e.g. " + k.key() + ": " + d;
}

std::optional<Value> Loader::convert(const KeySpec& k, const Setting& s) {
  const YAML::Node& n = s.value;
  auto wrong = [&](const std::string& expected, std::string hint) -> std::optional<Value> {
    issue(s.at, k.path, "expected " + expected + ", got " + describe(n), std::move(hint));
    return std::nullopt;
  };
  auto in_range = [&](double x, const std::string& shown) {
    if (k.range.contains(x)) return true;
    issue(s.at, k.path, clip(shown) + " is out of range: must be " + k.range.describe(),
          example(k));
    return false;
  };
  const bool plain = n.IsScalar() && !is_quoted(n);
  switch (k.kind) {
    case Kind::kInt:
    case Kind::kInt64:
    case Kind::kUInt64: {
      const std::string text = plain ? n.Scalar() : "";
      size_t digits_from = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
      const bool integer = text.size() > digits_from &&
                           text.find_first_not_of("0123456789", digits_from) == std::string::npos;
      if (!integer) {
        std::string hint = example(k);
        // A rounding suggestion only where llround is defined (|d| < 2^63); else the example.
        if (auto d = parse_double(text); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
          hint = "this key counts whole units; write an integer such as " +
                 std::to_string(int64_t(std::llround(*d)));
        }
        return wrong("an integer", hint);
      }
      errno = 0;
      if (k.kind == Kind::kUInt64) {
        if (text[0] == '-') {
          issue(s.at, k.path, clip(text) + " is out of range: must be >= 0", example(k));
          return std::nullopt;
        }
        const unsigned long long u = std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return wrong("an integer below 2^64", example(k));
        return Value(uint64_t(u));
      }
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      const long long limit = k.kind == Kind::kInt ? INT_MAX : LLONG_MAX;
      if (errno == ERANGE || v > limit || v < -limit) {
        issue(s.at, k.path,
              clip(text) + " is too large for this key (at most " + std::to_string(limit) + ")",
              example(k));
        return std::nullopt;
      }
      if (!in_range(double(v), text)) return std::nullopt;
      return Value(int64_t(v));
    }
    case Kind::kFloat: {
      std::optional<double> d = plain ? parse_double(n.Scalar()) : std::nullopt;
      if (!d || !std::isfinite(*d)) return wrong("a finite number", example(k));
      if (!in_range(*d, n.Scalar())) return std::nullopt;
      return Value(*d);
    }
    case Kind::kBool: {
      std::optional<bool> b = n.IsScalar() ? parse_bool(n) : std::nullopt;
      if (!b) return wrong("true or false", example(k));
      return Value(*b);
    }
    case Kind::kString:
    case Kind::kDir:
    case Kind::kFile:
    case Kind::kTokenizer:
    case Kind::kChoice: {
      if (k.kind == Kind::kChoice && !n.IsScalar()) {
        return wrong("one of " + join(k.choices, ", "), example(k));
      }
      if (!n.IsNull() && !n.IsScalar()) return wrong("a single value", example(k));
      const std::string text = n.IsNull() ? "" : n.Scalar();
      // Names and paths are written into JSON (metrics, manifests), which must be UTF-8:
      // refuse here, naming the key, rather than after the run has trained.
      if (!is_valid_utf8(text)) {
        return wrong("UTF-8 text",
                     "the value has bytes that are not UTF-8 (e.g. Latin-1 from "
                     "an old editor); re-save the file as UTF-8");
      }
      if (k.kind == Kind::kChoice &&
          std::find(k.choices.begin(), k.choices.end(), text) == k.choices.end()) {
        const std::string close = suggest(text, k.choices);
        issue(s.at, k.path, excerpt(text) + " is not one of " + join(k.choices, ", "),
              close.empty() ? example(k) : close);
        return std::nullopt;
      }
      return Value(text);
    }
    case Kind::kNames: {
      // Nothing written is no names; one name alone is a list of one (PEFT's target_modules
      // takes "all-linear" as a string). The names themselves are checked in validation.
      Names names;
      if (n.IsNull()) return Value(names);
      if (!n.IsScalar() && !n.IsSequence()) return wrong("a list of names", example(k));
      const bool one = n.IsScalar();
      for (size_t i = 0; i < (one ? 1 : n.size()); ++i) {
        const YAML::Node e = one ? n : n[i];
        if (!e.IsScalar()) {
          issue(locate_element(k.path, i), k.path,
                "expected a list of names, got a list holding " + describe(e), example(k));
          return std::nullopt;
        }
        if (!is_valid_utf8(e.Scalar())) {
          issue(locate_element(k.path, i), k.path, "expected UTF-8 text, got " + describe(e),
                "the value has bytes that are not UTF-8; re-save the file as UTF-8");
          return std::nullopt;
        }
        names.push_back(e.Scalar());
      }
      return Value(names);
    }
    case Kind::kBetas: {
      Betas b{};
      bool ok = n.IsSequence() && n.size() == 2;
      for (size_t i = 0; ok && i < 2; ++i) {
        const YAML::Node e = n[i];
        std::optional<double> d =
            e.IsScalar() && !is_quoted(e) ? parse_double(e.Scalar()) : std::nullopt;
        ok = d && std::isfinite(*d);
        if (ok) b[i] = *d;
      }
      if (!ok) return wrong("a list of two numbers", example(k));
      for (int i = 0; i < 2; ++i) {
        if (!in_range(b[i], "beta" + std::to_string(i + 1) + " = " + format_double(b[i]))) {
          return std::nullopt;
        }
      }
      return Value(b);
    }
  }
  return std::nullopt;
}

// Stage 4a: defaults that depend on other keys.
void Loader::derive_defaults() {
  // Written out only when not given, so the resolved recipe shows where output actually goes.
  if (!is_set("run.output_dir") || r_.run.output_dir.empty()) {
    r_.run.output_dir = "runs/" + r_.run.name;
  }
  if (!is_set("checkpoint.dir") || r_.checkpoint.dir.empty()) {
    r_.checkpoint.dir = (std::filesystem::path(r_.run.output_dir) / "checkpoints").string();
  }
  if (!is_set("logging.metrics") || r_.logging.metrics.empty()) {
    r_.logging.metrics = (std::filesystem::path(r_.run.output_dir) / "metrics.jsonl").string();
  }
  // As in Hugging Face's LlamaConfig: no n_kv_heads means plain multi-head attention.
  if (!is_set("model.n_kv_heads")) r_.model.n_kv_heads = r_.model.n_heads;

  if (r_.run.name.empty() && usable("run.name")) {
    issue(locate("run.name"), "run.name", "must not be empty",
          "it names the output folder runs/<name>");
  }
  // Missing required keys.
  const bool has_from = !r_.model.from.empty();
  for (const KeySpec& k : schema()) {
    const bool required = k.need == Need::kRequired || (k.need == Need::kUnlessFrom && !has_from);
    // A section that is itself malformed was reported once; its keys are not listed again.
    if (!required || !usable(k.path) || !usable(k.section())) continue;
    const bool missing =
        !is_set(k.path) || (k.kind == Kind::kDir && std::get<std::string>(k.get(r_)).empty());
    if (!missing) continue;
    issue(locate(k.path), k.path, "is required but not set",
          k.need == Need::kUnlessFrom
              ? "set " + k.path + ", or set model.from to a Hugging Face folder to take it from"
              : "set " + k.path + " (" + k.doc + ")");
  }
}

// Issues read like compiler output: the recipe file in line order, then the command line.
void Loader::sort_issues() {
  auto rank = [&](const RecipeIssue& i) {
    return std::make_tuple(i.file != path_, i.line == 0, i.line, i.column);
  };
  std::stable_sort(issues_.begin(), issues_.end(),
                   [&](const RecipeIssue& a, const RecipeIssue& b) { return rank(a) < rank(b); });
}

}  // namespace ft::recipe_internal

namespace ft {

std::string RecipeIssue::format() const {
  std::string out = file;
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  out += ": ";
  if (!key_path.empty()) out += key_path + ": ";
  out += message;
  if (!hint.empty()) out += " (hint: " + hint + ")";
  return out;
}

}  // namespace ft
