// The recipe loader (internal to lib/recipe): the state of one load_recipe call and its stages,
// a member function each. The stages are defined with their job: recipe.cpp (run: the stages in
// order), load.cpp (stages 1-4a: the YAML file, overrides, conversion, derived defaults, and the
// order and text of the issues), validate_inputs.cpp (stages 4b and 5a, and the vocabulary: what
// model.from's config.json, the shards and the tokenizer say), validate.cpp (stages 5b-5c: what
// this build refuses, and the rules across keys). The helpers that say where an issue points and
// whether a key is still usable stay here, as every stage uses them.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "recipe/recipe.h"
#include "recipe/schema.h"

namespace ft {

struct HfConfigRead;  // ckpt/hf.h

namespace recipe_internal {

struct Origin {
  std::string file;
  int line = 0, column = 0;  // 1-based; 0 when unknown
};

// One key as written: where, and its raw node (converted later, by its schema row).
struct Setting {
  YAML::Node value;
  Origin at;  // of the value (of the key when the value is empty)
};

class Loader {
 public:
  Loader(std::string path, int world_size, bool refuse_unbuilt)
      : path_(std::move(path)), world_size_(world_size), refuse_unbuilt_(refuse_unbuilt) {}

  // The stages in order (recipe.cpp).
  RecipeResult run(const std::vector<std::string>& overrides);

 private:
  Origin origin(const YAML::Mark& m) const {
    if (m.is_null()) return {path_, 0, 0};
    return {path_, m.line + 1, m.column + 1};
  }

  void issue(const Origin& at, const std::string& key, std::string message, std::string hint) {
    issues_.push_back({at.file, at.line, at.column, key, std::move(message), std::move(hint)});
    bad_.insert(key);
  }

  bool is_set(const std::string& path) const { return settings_.count(path) > 0; }
  bool usable(const std::string& path) const { return !bad_.count(path); }
  bool all_usable(std::initializer_list<const char*> paths) const {
    return std::all_of(paths.begin(), paths.end(), [&](const char* p) { return usable(p); });
  }

  // Where to point an issue about `path`: where it was written; for a size taken from
  // model.from, at model.from; else at its section header; else the file alone.
  Origin locate(const std::string& path) const {
    if (auto it = settings_.find(path); it != settings_.end()) return it->second.at;
    const KeySpec* k = find_key(path);
    if (k && !k->hf_name.empty() && !r_.model.from.empty() && is_set("model.from")) {
      return settings_.at("model.from").at;
    }
    const std::string section = path.substr(0, path.find('.'));
    if (auto it = sections_.find(section); it != sections_.end()) return it->second;
    return {path_, 0, 0};
  }

  // Where the i-th name of a list key is in the file; as locate() for a single name, for an
  // override (the command line has no positions) and for a key not written.
  Origin locate_element(const std::string& path, size_t i) const {
    auto it = settings_.find(path);
    if (it == settings_.end()) return locate(path);
    const Setting& s = it->second;
    if (s.at.file != path_ || !s.value.IsSequence() || i >= s.value.size()) return s.at;
    return origin(s.value[i].Mark());
  }

  // load.cpp
  bool read_file();
  void read_section(const std::string& section, const YAML::Node& map);
  void unknown_top_level(const Origin& at, const std::string& name);
  void unknown_in_section(const Origin& at, const std::string& section, const std::string& key);
  static std::vector<std::string> paths_like(const std::string& key);
  static std::string unknown_key_hint(const std::string& section, const std::string& key);
  // "did you mean X?" for a value close to one of `cands`; empty when none is.
  static std::string suggest(const std::string& name, const std::vector<std::string>& cands);
  void apply_overrides(const std::vector<std::string>& overrides);
  void convert_settings();
  std::string example(const KeySpec& k) const;
  std::optional<Value> convert(const KeySpec& k, const Setting& s);
  void derive_defaults();
  void sort_issues();

  // validate_inputs.cpp
  void take_model_from();
  void check_weight_files();
  static std::string hf_says(const KeySpec& k, const HfConfigRead& hf, const std::string& value);
  void check_paths();
  void check_vocabulary();
  void check_adapter_from();

  // validate.cpp
  void check_unimplemented();
  void check_unbuilt();
  void check_packing_device();
  void check_cross_rules();
  void check_loss_scaling();
  void check_rope();
  void check_adapter();
  void check_dpo();
  void check_adapter_names(const std::string& path);
  void check_layout();
  static int nearest_divisor(int n, int near);

  std::string path_;
  int world_size_;
  bool refuse_unbuilt_;
  Recipe r_;
  std::vector<RecipeIssue> issues_;
  std::vector<std::string> warnings_;
  std::map<std::string, Origin> sections_;   // section name → where its header is
  std::map<std::string, Setting> settings_;  // "section.key" → as written (file or override)
  std::set<std::string> bad_;                // keys (and sections) that already have an issue
};

}  // namespace recipe_internal
}  // namespace ft
