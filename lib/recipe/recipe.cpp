// Recipe loading: YAML file + dotted overrides → a validated Recipe, or every problem at once.
//
// The schema table (schema() below) is the one place recipe keys are defined: path, type,
// range or choices, whether it is required, its Hugging Face name, and a line of doc. Parsing,
// range checks, did-you-mean suggestions, model.from agreement and recipe_to_yaml are all
// driven by it, so adding a key is adding one row (plus its field in recipe.h, which holds the
// default value).
//
// Stages, each of which only adds issues and never stops early:
//   1. read the file into per-key settings (YAML node + where it was written),
//   2. overlay the KEY=VALUE overrides,
//   3. convert every setting by its row's type and range into the Recipe,
//   4. fill derived defaults, take sizes from model.from's config.json,
//   5. check paths, refuse unimplemented features, check rules across keys.
// A key that already has an issue is left out of later rules that read it, so one mistake
// is reported once rather than echoed by every rule that depends on it.
#include "recipe/recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

#include "ckpt/hf.h"
#include "core/error.h"
#include "core/utf8.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "model/rope.h"
#include "runtime/device.h"

namespace ft {
namespace {

constexpr const char* kCommandLine = "<command line>";
// A recipe is a page of YAML; anything this large is the wrong file (or /dev/zero), and reading
// it whole would take the machine's memory.
constexpr size_t kMaxRecipeBytes = 1 << 20;
// More threads than any machine has cores; beyond it OpenMP and OpenBLAS fail to start them.
constexpr int kMaxThreads = 1024;
// The largest fp16 loss scale a recipe may ask for: 2^32, Megatron's initial scale and the
// largest in common use. fp16 tops out at 65504, so the first steps at such a scale overflow
// and halve it; a larger one only adds skipped steps.
constexpr double kMaxLossScale = 4294967296.0;

// ---------------------------------------------------------------------------------------------
// The schema

enum class Kind {
  kInt,     // 32-bit signed integer
  kInt64,   // 64-bit signed integer (step counts)
  kUInt64,  // 64-bit unsigned integer (seeds)
  kFloat,   // finite double; integers are accepted too
  kBool,
  kString,  // any scalar; empty means "unset" for optional keys
  kDir,     // string naming an existing directory (checked after parsing)
  kFile,    // string naming an existing regular file (checked after parsing)
  kChoice,  // string from a fixed list
  kBetas,   // list of two floats → optimizer.beta1, beta2
};

// A parsed value, in the widest type of its kind.
using Betas = std::array<double, 2>;
using Value = std::variant<int64_t, uint64_t, double, bool, std::string, Betas>;

// Inclusive or exclusive bounds for numeric keys (for kBetas: each element).
struct Range {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const {
    if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
    if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
    return true;
  }
  std::string describe() const;
};

Range at_least(double lo) { return Range{lo, std::nullopt, false, false}; }
Range above(double lo) { return Range{lo, std::nullopt, true, false}; }
Range between(double lo, double hi) { return Range{lo, hi, false, false}; }
Range from_until(double lo, double hi) { return Range{lo, hi, false, true}; }  // [lo, hi)

enum class Need {
  kOptional,    // has a default (in recipe.h or derived)
  kRequired,    // must be set
  kUnlessFrom,  // must be set unless model.from provides it
};

struct KeySpec {
  std::string path;  // "section.key"
  Kind kind;
  std::string doc;
  Range range;
  std::vector<std::string> choices;  // kChoice
  Need need = Need::kOptional;
  std::string hf_name;  // the config.json key that provides it under model.from, if any
  std::function<Value(const Recipe&)> get;
  std::function<void(Recipe&, const Value&)> set;

  std::string section() const { return path.substr(0, path.find('.')); }
  std::string key() const { return path.substr(path.find('.') + 1); }
};

// Optional columns of a row, so each row names only what it uses.
struct Opts {
  Range range{};
  std::vector<std::string> choices{};
  Need need = Need::kOptional;
  const char* hf_name = "";
};

// Field ↔ Value conversions, chosen by the field's C++ type.
Value to_value(int v) { return int64_t(v); }
Value to_value(int64_t v) { return v; }
Value to_value(uint64_t v) { return v; }
Value to_value(double v) { return v; }
Value to_value(bool v) { return v; }
Value to_value(const std::string& v) { return v; }
Value to_value(const OptimizerConfig& o) { return Betas{o.beta1, o.beta2}; }

void assign(int& f, const Value& v) { f = int(std::get<int64_t>(v)); }
void assign(int64_t& f, const Value& v) { f = std::get<int64_t>(v); }
void assign(uint64_t& f, const Value& v) { f = std::get<uint64_t>(v); }
void assign(double& f, const Value& v) { f = std::get<double>(v); }
void assign(bool& f, const Value& v) { f = std::get<bool>(v); }
void assign(std::string& f, const Value& v) { f = std::get<std::string>(v); }
void assign(OptimizerConfig& o, const Value& v) {
  o.beta1 = std::get<Betas>(v)[0];
  o.beta2 = std::get<Betas>(v)[1];
}

// `ref` is a generic lambda returning a reference to the field, usable on const and non-const
// Recipes, so one accessor serves both reading and writing.
template <typename Ref>
KeySpec row(std::string path, Kind kind, Ref ref, std::string doc, Opts o = {}) {
  KeySpec k;
  k.path = std::move(path);
  k.kind = kind;
  k.doc = std::move(doc);
  k.range = o.range;
  k.choices = std::move(o.choices);
  k.need = o.need;
  k.hf_name = o.hf_name;
  k.get = [ref](const Recipe& r) { return to_value(ref(r)); };
  k.set = [ref](Recipe& r, const Value& v) { assign(ref(r), v); };
  return k;
}

#define FT_KEY(section, key, kind, doc, ...)                                         \
  row(                                                                               \
      #section "." #key, Kind::kind, [](auto& r) -> auto& { return r.section.key; }, \
      doc __VA_OPT__(, ) __VA_ARGS__)

// Every recipe key, in the order recipe_to_yaml writes them. Defaults live in recipe.h.
const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = [] {
    const Opts positive{.range = at_least(1)};
    const Opts non_negative{.range = at_least(0)};
    std::vector<KeySpec> t = {
        FT_KEY(run, name, kString, "name of the run; output_dir defaults to runs/<name>"),
        FT_KEY(run, output_dir, kString,
               "metrics, checkpoints and resolved recipe (default runs/<run.name>)"),
        FT_KEY(run, seed, kUInt64, "seeds initialisation and data shuffling"),

        FT_KEY(model, arch, kChoice, "model family", {.choices = {"llama", "gpt2"}}),
        FT_KEY(model, from, kDir,
               "Hugging Face folder to start from; sizes then come from its config.json"),
        FT_KEY(model, dim, kInt, "hidden size",
               {.range = at_least(1), .need = Need::kUnlessFrom, .hf_name = "hidden_size"}),
        FT_KEY(model, n_layers, kInt, "transformer blocks",
               {.range = at_least(1), .need = Need::kUnlessFrom, .hf_name = "num_hidden_layers"}),
        FT_KEY(model, n_heads, kInt, "attention heads",
               {.range = at_least(1), .need = Need::kUnlessFrom, .hf_name = "num_attention_heads"}),
        FT_KEY(model, n_kv_heads, kInt,
               "key/value heads, for grouped-query attention (default n_heads)",
               {.range = at_least(1), .hf_name = "num_key_value_heads"}),
        FT_KEY(model, ffn_dim, kInt, "MLP hidden size",
               {.range = at_least(1), .need = Need::kUnlessFrom, .hf_name = "intermediate_size"}),
        FT_KEY(model, vocab_size, kInt, "vocabulary size",
               {.range = at_least(1), .need = Need::kUnlessFrom, .hf_name = "vocab_size"}),
        FT_KEY(model, max_seq_len, kInt, "longest sequence the model takes",
               {.range = at_least(1), .hf_name = "max_position_embeddings"}),
        FT_KEY(model, rope_theta, kFloat, "RoPE base",
               {.range = above(0), .hf_name = "rope_theta"}),
        // The RoPE scaling of transformers' rope_parameters (model/rope.h has the formulas).
        FT_KEY(model, rope_type, kChoice, "RoPE scaling: default (none), linear or llama3",
               {.choices = {"default", "linear", "llama3"}, .hf_name = "rope_type"}),
        FT_KEY(model, rope_factor, kFloat, "linear, llama3: how much the context is stretched",
               {.range = above(0), .hf_name = "factor"}),
        FT_KEY(model, rope_low_freq_factor, kFloat, "llama3: low_freq_factor",
               {.range = above(0), .hf_name = "low_freq_factor"}),
        FT_KEY(model, rope_high_freq_factor, kFloat, "llama3: high_freq_factor",
               {.range = above(0), .hf_name = "high_freq_factor"}),
        FT_KEY(model, rope_original_max_seq_len, kInt,
               "llama3: context length of pretraining (original_max_position_embeddings)",
               {.range = at_least(1), .hf_name = "original_max_position_embeddings"}),
        FT_KEY(model, norm_eps, kFloat, "RMSNorm epsilon",
               {.range = above(0), .hf_name = "rms_norm_eps"}),
        FT_KEY(model, tie_embeddings, kBool, "share the embedding and output matrices",
               {.hf_name = "tie_word_embeddings"}),
        FT_KEY(model, init_std, kFloat, "std of the random initialisation (without model.from)",
               {.range = above(0)}),

        FT_KEY(tokenizer, path, kFile, "SentencePiece .model file (optional)"),

        FT_KEY(data, train, kDir, "folder of training shards (*.h5)", {.need = Need::kRequired}),
        FT_KEY(data, valid, kDir, "folder of validation shards (optional)"),
        FT_KEY(data, seq_len, kInt, "tokens per sample", positive),
        FT_KEY(data, shuffle, kBool, "shuffle samples each epoch (seeded by run.seed)"),
        FT_KEY(data, prefetch, kInt, "batches the background loader keeps ready", positive),

        FT_KEY(training, steps, kInt64,
               "optimizer steps (0: only load/initialise and save a checkpoint)", non_negative),
        FT_KEY(training, micro_batch_size, kInt, "samples per data rank per micro-step", positive),
        FT_KEY(training, global_batch_size, kInt, "samples per optimizer step", positive),
        FT_KEY(training, precision, kChoice, "compute precision",
               {.choices = {"fp32", "bf16", "fp16"}}),
        FT_KEY(training, grad_clip, kFloat, "max global gradient norm; 0 disables clipping",
               non_negative),
        FT_KEY(training, activation_checkpointing, kBool, "recompute activations in backward"),
        FT_KEY(training, eval_every_steps, kInt64, "evaluate on data.valid every N steps; 0: never",
               non_negative),
        FT_KEY(training, eval_batches, kInt64, "global batches per evaluation", positive),
        // fp16 loss scaling (optim/loss_scaler.h has the rules). Scales are powers of two
        // (check_loss_scaling) up to kMaxLossScale.
        FT_KEY(training, loss_scale, kFloat,
               "fp16: 0 = dynamic loss scaling; N > 0 = static scale N (a power of two)",
               {.range = between(0, kMaxLossScale)}),
        FT_KEY(training, loss_scale_window, kInt64,
               "fp16 dynamic scaling: clean steps before the scale doubles", positive),
        FT_KEY(training, initial_loss_scale, kFloat,
               "fp16 dynamic scaling: first scale, a power of two (2^initial_scale_power)",
               {.range = Range{0, kMaxLossScale, true, false}}),
        FT_KEY(training, min_loss_scale, kFloat,
               "fp16 dynamic scaling: lowest scale (a power of two); an overflow at it stops",
               {.range = Range{0, kMaxLossScale, true, false}}),
        FT_KEY(training, loss_scale_hysteresis, kInt,
               "fp16 dynamic scaling: overflows before the scale halves (DeepSpeed hysteresis)",
               positive),
        FT_KEY(training, max_skipped_steps, kInt64,
               "fp16: consecutive steps skipped for overflow that stop the run (exit 1)", positive),

        FT_KEY(optimizer, name, kChoice, "optimizer", {.choices = {"adamw"}}),
        FT_KEY(optimizer, lr, kFloat, "peak learning rate", {.range = above(0)}),
        row("optimizer.betas", Kind::kBetas, [](auto& r) -> auto& { return r.optimizer; },
            "AdamW [beta1, beta2]", {.range = from_until(0, 1)}),
        FT_KEY(optimizer, eps, kFloat, "AdamW epsilon", {.range = above(0)}),
        FT_KEY(optimizer, weight_decay, kFloat, "decoupled weight decay (matrices only)",
               non_negative),

        FT_KEY(scheduler, name, kChoice, "learning-rate schedule after warmup",
               {.choices = {"constant", "linear", "cosine"}}),
        FT_KEY(scheduler, warmup_steps, kInt64, "linear warmup steps", non_negative),
        FT_KEY(scheduler, min_lr, kFloat, "final learning rate of linear and cosine", non_negative),

        FT_KEY(parallel, tensor, kInt, "tensor-parallel ranks", positive),
        FT_KEY(parallel, pipeline, kInt, "pipeline stages", positive),
        FT_KEY(parallel, zero_stage, kInt, "ZeRO stage over the data group",
               {.range = between(0, 3)}),

        FT_KEY(checkpoint, dir, kString,
               "checkpoint folder (default <run.output_dir>/checkpoints)"),
        FT_KEY(checkpoint, every_steps, kInt64, "save every N steps; 0: off", non_negative),
        FT_KEY(checkpoint, every_minutes, kFloat, "save every N minutes; 0: off", non_negative),
        FT_KEY(checkpoint, keep_last, kInt, "complete checkpoints kept", positive),
        FT_KEY(checkpoint, async, kBool, "write checkpoints in the background"),
        FT_KEY(checkpoint, overwrite, kBool,
               "with --resume never: delete the checkpoints already in checkpoint.dir"),

        FT_KEY(logging, every_steps, kInt64, "log metrics every N steps", positive),
        FT_KEY(logging, metrics, kString,
               "JSON Lines metrics file (default <run.output_dir>/metrics.jsonl)"),

        FT_KEY(runtime, device, kChoice, "auto: CUDA when present, else CPU",
               {.choices = {"auto", "cpu", "cuda"}}),
        FT_KEY(runtime, threads, kInt, "CPU threads; 0: all cores",
               {.range = between(0, kMaxThreads)}),
        FT_KEY(runtime, collective_timeout_s, kFloat,
               "end the job (exit 3) when a step's collective waits this long; 0: never",
               non_negative),
        FT_KEY(runtime, tf32, kBool,
               "CUDA fp32 GEMMs may round inputs to TF32 (faster, ~1e-3 relative); off: exact "
               "fp32"),
    };
    return t;
  }();
  return table;
}

#undef FT_KEY

const KeySpec* find_key(std::string_view path) {
  for (const KeySpec& k : schema()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const KeySpec& k : schema()) {
    if (std::find(out.begin(), out.end(), k.section()) == out.end()) out.push_back(k.section());
  }
  return out;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const KeySpec& k : schema()) {
    if (k.section() == section) out.push_back(k.key());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Text helpers

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// The shortest decimal text that reads back as the same double (std::to_chars guarantees the
// round trip), so recipe_to_yaml shows 0.0003 rather than 0.00029999999999999997. Plain
// notation for the magnitudes people write that way (lr 0.0003, rope_theta 500000), scientific
// beyond (eps 1e-08).
std::string format_double(double v) {
  char buf[64];
  const double mag = std::fabs(v);
  const auto fmt = (mag == 0 || (mag >= 1e-5 && mag < 1e15)) ? std::chars_format::fixed
                                                             : std::chars_format::scientific;
  const auto res = std::to_chars(buf, buf + sizeof buf, v, fmt);
  return std::string(buf, res.ptr);
}

std::string format_value(const Value& v) {
  struct {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(uint64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const { return format_double(x); }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return x; }
    std::string operator()(const Betas& b) const {
      return "[" + format_double(b[0]) + ", " + format_double(b[1]) + "]";
    }
  } visitor;
  return std::visit(visitor, v);
}

std::string Range::describe() const {
  auto num = [](double x) { return format_double(x); };
  if (lo && hi) {
    return "in " + std::string(lo_open ? "(" : "[") + num(*lo) + ", " + num(*hi) +
           (hi_open ? ")" : "]");
  }
  if (lo) return std::string(lo_open ? "> " : ">= ") + num(*lo);
  if (hi) return std::string(hi_open ? "< " : "<= ") + num(*hi);
  return "any value";
}

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

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "no value";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  if (is_quoted(n)) return "the string \"" + n.Scalar() + "\"";
  if (parse_bool(n)) return "the boolean " + n.Scalar();
  if (parse_double(n.Scalar())) return "the number " + n.Scalar();
  return "the string \"" + n.Scalar() + "\"";
}

// ---------------------------------------------------------------------------------------------
// Loading

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

  RecipeResult run(const std::vector<std::string>& overrides) {
    r_.source_path = path_;
    const bool file_ok = read_file();
    apply_overrides(overrides);
    convert_settings();
    // An unreadable file has no keys to check further; reporting every required key as missing
    // would bury the one real problem.
    if (!file_ok) return {std::move(r_), std::move(issues_), {}};
    derive_defaults();
    take_model_from();
    check_paths();
    check_unimplemented();
    if (refuse_unbuilt_) check_unbuilt();
    check_cross_rules();
    sort_issues();
    return {std::move(r_), std::move(issues_), std::move(warnings_)};
  }

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

  // Stage 1: the YAML file → sections_ and settings_. False when the file as a whole is
  // unusable (unreadable, not YAML, not a mapping).
  bool read_file() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      issue({path_, 0, 0}, "", "cannot read the recipe file", "check the path and permissions");
      return false;
    }
    if (std::filesystem::is_directory(path_)) {
      issue({path_, 0, 0}, "", "this is a folder, not a recipe file",
            "give the path of a .yaml file, e.g. recipes/quickstart.yaml");
      return false;
    }
    // Read at most one byte past the limit: a device or a pipe has no size to ask for first.
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

  void read_section(const std::string& section, const YAML::Node& map) {
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

  void unknown_top_level(const Origin& at, const std::string& name) {
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
    issue(at, name, "unknown section", hint);
  }

  void unknown_in_section(const Origin& at, const std::string& section, const std::string& key) {
    issue(at, section + "." + key, "unknown key", unknown_key_hint(section, key));
  }

  // Full paths of keys, in any section, whose name or HF name ("hidden_size") is `key`, else
  // close to it, else overlapping it: for a key written in the wrong section or at the top level.
  static std::vector<std::string> paths_like(const std::string& key) {
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

  static std::string unknown_key_hint(const std::string& section, const std::string& key) {
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

  // Stage 2: KEY=VALUE overrides replace or add settings; the value is parsed as YAML so
  // `optimizer.betas=[0.9,0.95]` is a list and `training.steps=20` an integer.
  void apply_overrides(const std::vector<std::string>& overrides) {
    const Origin cli{kCommandLine, 0, 0};
    for (const std::string& o : overrides) {
      const size_t eq = o.find('=');
      if (eq == std::string::npos || eq == 0) {
        issue(cli, o, "not a KEY=VALUE override", "write e.g. training.steps=20");
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
        issue(cli, path, "unknown key in override `" + o + "`", hint);
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
  void convert_settings() {
    for (const KeySpec& k : schema()) {
      auto it = settings_.find(k.path);
      if (it == settings_.end()) continue;
      if (std::optional<Value> v = convert(k, it->second)) k.set(r_, *v);
    }
  }

  std::string example(const KeySpec& k) const {
    if (k.kind == Kind::kBetas) return "e.g. " + k.key() + ": [0.9, 0.999]";
    const std::string d = format_value(k.get(Recipe{}));
    return d.empty() ? "" : "e.g. " + k.key() + ": " + d;
  }

  std::optional<Value> convert(const KeySpec& k, const Setting& s) {
    const YAML::Node& n = s.value;
    auto wrong = [&](const std::string& expected, std::string hint) -> std::optional<Value> {
      issue(s.at, k.path, "expected " + expected + ", got " + describe(n), std::move(hint));
      return std::nullopt;
    };
    auto in_range = [&](double x, const std::string& shown) {
      if (k.range.contains(x)) return true;
      issue(s.at, k.path, shown + " is out of range: must be " + k.range.describe(), example(k));
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
          if (auto d = parse_double(text); d && std::isfinite(*d)) {
            hint = "this key counts whole units; write an integer such as " +
                   std::to_string(int64_t(std::llround(*d)));
          }
          return wrong("an integer", hint);
        }
        errno = 0;
        if (k.kind == Kind::kUInt64) {
          if (text[0] == '-') {
            issue(s.at, k.path, text + " is out of range: must be >= 0", example(k));
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
                text + " is too large for this key (at most " + std::to_string(limit) + ")",
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
      case Kind::kChoice: {
        if (k.kind == Kind::kChoice && !n.IsScalar()) {
          return wrong("one of " + join(k.choices, ", "), example(k));
        }
        if (!n.IsNull() && !n.IsScalar()) return wrong("a single value", example(k));
        const std::string text = n.IsNull() ? "" : n.Scalar();
        // Names and paths are written into JSON (metrics, manifests), which must be UTF-8:
        // refuse here, naming the key, rather than after the run has trained.
        if (!is_valid_utf8(text)) {
          return wrong("UTF-8 text", "the value has bytes that are not UTF-8 (e.g. Latin-1 from "
                                     "an old editor); re-save the file as UTF-8");
        }
        if (k.kind == Kind::kChoice &&
            std::find(k.choices.begin(), k.choices.end(), text) == k.choices.end()) {
          auto s2 = first_of({misspelt(text, k.choices), overlapping(text, k.choices)});
          issue(s.at, k.path, "\"" + text + "\" is not one of " + join(k.choices, ", "),
                s2.empty() ? example(k) : did_you_mean(s2));
          return std::nullopt;
        }
        return Value(text);
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
  void derive_defaults() {
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

  // Stage 4b: with model.from, the HF config provides the size keys; explicit recipe values
  // must agree with it (DESIGN.md §5: a disagreement is an error, not a silent override).
  void take_model_from() {
    if (r_.model.from.empty() || !usable("model.from")) return;
    if (!std::filesystem::is_directory(r_.model.from)) return;  // reported by check_paths
    HfConfigRead hf;
    try {
      hf = read_hf_config_located(r_.model.from);
    } catch (const Error& e) {
      issue(locate("model.from"), "model.from", e.what(),
            "point model.from at a Hugging Face LlamaForCausalLM folder");
      return;
    }
    const std::string config = (std::filesystem::path(r_.model.from) / "config.json").string();
    for (const std::string& u : hf.unsupported) {
      issue(locate("model.from"), "model.from", config + ": " + u,
            "ft cannot train this model as transformers would; use a checkpoint without it");
    }
    warnings_.insert(warnings_.end(), hf.warnings.begin(), hf.warnings.end());
    check_weight_files();
    Recipe from_hf = r_;
    from_hf.model = hf.model;
    for (const KeySpec& k : schema()) {
      if (k.hf_name.empty()) continue;
      const Value theirs = k.get(from_hf);
      if (is_set(k.path) && usable(k.path) && k.get(r_) != theirs) {
        issue(locate(k.path), k.path,
              k.path + " = " + format_value(k.get(r_)) + " but " + config + " " +
                  hf_says(k, hf, format_value(theirs)),
              "remove " + k.path + " or make it match");
      }
      k.set(r_, theirs);
    }
  }

  // ft reads safetensors only (ckpt/hf.cpp). Only their presence is checked here, so that
  // validate refuses what train would: the headers are read when the weights load.
  void check_weight_files() {
    namespace fs = std::filesystem;
    const fs::path dir = r_.model.from;
    std::error_code ec;
    if (fs::is_regular_file(dir / "model.safetensors", ec) ||
        fs::is_regular_file(dir / "model.safetensors.index.json", ec))
      return;
    std::string others;  // weights in formats ft does not read
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".bin" || ext == ".pth" || ext == ".pt" || ext == ".safetensors" ||
          e.path().filename() == "pytorch_model.bin.index.json")
        others += (others.empty() ? "" : ", ") + e.path().filename().string();
    }
    issue(locate("model.from"), "model.from",
          r_.model.from + " has no model.safetensors or model.safetensors.index.json" +
              (others.empty() ? "" : " (it holds " + others + ")"),
          others.empty()
              ? "point model.from at the folder that holds the weights"
              : "ft reads safetensors only: convert the weights, e.g. in Python "
                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT)");
  }

  // What config.json says about key k, quoting the place it was read from: "has hidden_size
  // 256", "has rope_parameters.rope_theta = 500000", "has no rope_theta (transformers' default
  // 10000)". For a RoPE factor the file's rope type does not have: "uses rope type X, which
  // has no factor".
  static std::string hf_says(const KeySpec& k, const HfConfigRead& hf, const std::string& value) {
    const auto it = hf.origins.find(k.path);
    if (it == hf.origins.end()) {
      if (k.path.rfind("model.rope_", 0) == 0)
        return "uses rope type " + hf.model.rope_type + ", which has no " + k.hf_name;
      return "has " + k.hf_name + " " + value;
    }
    if (it->second.empty()) return "has no " + k.hf_name + " (transformers' default " + value + ")";
    return "has " + it->second + " = " + value;
  }

  // Stage 5a: paths that must exist now. Relative paths are resolved against the current
  // working directory (where ft runs), not the recipe's folder, the same way every other
  // command-line tool treats paths; they are kept as written in the Recipe.
  void check_paths() {
    for (const KeySpec& k : schema()) {
      if (k.kind != Kind::kDir && k.kind != Kind::kFile) continue;
      if (!usable(k.path)) continue;
      const std::string p = std::get<std::string>(k.get(r_));
      if (p.empty()) continue;
      const bool want_dir = k.kind == Kind::kDir;
      std::error_code ec;
      const auto status = std::filesystem::status(p, ec);
      const bool exists = std::filesystem::exists(status);
      if (want_dir ? std::filesystem::is_directory(status)
                   : std::filesystem::is_regular_file(status)) {
        continue;
      }
      std::string message = !exists    ? "\"" + p + "\" does not exist"
                            : want_dir ? "\"" + p + "\" is not a directory"
                                       : "\"" + p + "\" is not a regular file";
      std::string hint = want_dir ? "give the path of a directory" : "give the path of a file";
      if (p.rfind("~/", 0) == 0)
        hint = "~ is not expanded in recipes; write the full path";
      else if (std::filesystem::path(p).is_relative()) {
        hint += "; relative paths are resolved against the current directory, " +
                std::filesystem::current_path(ec).string();
      }
      issue(locate(k.path), k.path, message, hint);
    }
  }

  // Stage 5b: accepted values whose feature is not built yet: refused loudly, never ignored.
  void check_unimplemented() {
    if (r_.model.arch == "gpt2" && usable("model.arch")) {
      issue(locate("model.arch"), "model.arch", "gpt2 is not implemented yet", "use llama");
    }
  }

  // Features the recipe format defines (DESIGN.md §5) but this build cannot run yet. Refused
  // here, so `ft validate` and `ft train` agree and nothing a recipe asks for is silently
  // skipped. Tests of the format's own rules (e.g. layout divisibility) switch this off.
  void check_unbuilt() {
    if (!cuda_backend() && r_.runtime.device == "cuda" && usable("runtime.device")) {
      issue(locate("runtime.device"), "runtime.device",
            "cuda is not available: this build of ft has no CUDA backend (configured with "
            "FT_CUDA=OFF or without nvcc)", "use auto or cpu");
    }
  }

  // Stage 5c: rules across keys, each checked only when every key it reads is usable.
  void check_cross_rules() {
    const ModelConfig& m = r_.model;
    if (all_usable({"model.dim", "model.n_heads"})) {
      if (m.dim % m.n_heads != 0) {
        issue(locate("model.n_heads"), "model.n_heads",
              "model.dim " + std::to_string(m.dim) + " is not divisible by model.n_heads " +
                  std::to_string(m.n_heads),
              "each head gets dim / n_heads channels; pick n_heads dividing dim, e.g. " +
                  std::to_string(nearest_divisor(m.dim, m.n_heads)));
      } else if ((m.dim / m.n_heads) % 2 != 0) {
        issue(locate("model.n_heads"), "model.n_heads",
              "head_dim = dim / n_heads = " + std::to_string(m.dim / m.n_heads) + " is odd",
              "RoPE rotates pairs of channels, so head_dim must be even; change dim or n_heads");
      }
    }
    if (all_usable({"model.n_heads", "model.n_kv_heads"}) && m.n_heads % m.n_kv_heads != 0) {
      issue(locate("model.n_kv_heads"), "model.n_kv_heads",
            "model.n_heads " + std::to_string(m.n_heads) +
                " is not divisible by model.n_kv_heads " + std::to_string(m.n_kv_heads),
            "each key/value head serves n_heads / n_kv_heads query heads; e.g. n_kv_heads: " +
                std::to_string(nearest_divisor(m.n_heads, m.n_kv_heads)));
    }
    if (all_usable({"data.seq_len", "model.max_seq_len"}) && r_.data.seq_len > m.max_seq_len) {
      issue(locate("data.seq_len"), "data.seq_len",
            "data.seq_len " + std::to_string(r_.data.seq_len) + " exceeds model.max_seq_len " +
                std::to_string(m.max_seq_len),
            "use a data.seq_len of at most " + std::to_string(m.max_seq_len));
    }
    if (all_usable({"scheduler.warmup_steps", "training.steps"}) &&
        r_.scheduler.warmup_steps > r_.training.steps) {
      issue(locate("scheduler.warmup_steps"), "scheduler.warmup_steps",
            "scheduler.warmup_steps " + std::to_string(r_.scheduler.warmup_steps) +
                " exceeds training.steps " + std::to_string(r_.training.steps),
            "warmup must end by the last step");
    }
    if (all_usable({"scheduler.min_lr", "optimizer.lr"}) && r_.scheduler.min_lr > r_.optimizer.lr) {
      issue(locate("scheduler.min_lr"), "scheduler.min_lr",
            "scheduler.min_lr " + format_double(r_.scheduler.min_lr) + " exceeds optimizer.lr " +
                format_double(r_.optimizer.lr),
            "the schedule decays from lr down to min_lr; make min_lr <= lr");
    }
    if (all_usable({"training.eval_every_steps", "data.valid"}) &&
        r_.training.eval_every_steps > 0 && r_.data.valid.empty()) {
      issue(locate("training.eval_every_steps"), "training.eval_every_steps",
            "evaluation is on but data.valid is not set",
            "set data.valid to a shard folder, or training.eval_every_steps: 0");
    }
    check_rope();
    check_vocabulary();
    check_layout();
    check_loss_scaling();
  }

  // fp16 loss scaling keys (optim/loss_scaler.h). Checked whatever the precision, so that a
  // recipe's mistakes show before fp16 is switched on; set with another precision, they do
  // nothing, which one warning line says.
  void check_loss_scaling() {
    const TrainingConfig& t = r_.training;
    // Powers of two, so that scaling the loss and unscaling the gradients are exact (only the
    // exponent changes) and every scale the dynamic rule reaches by halving and doubling is one.
    auto power_of_two = [&](const char* key, double v) {
      int e = 0;
      if (!usable(key) || v == 0 || std::frexp(v, &e) == 0.5) return;
      const double below = std::ldexp(1.0, e - 1), above = std::ldexp(1.0, e);
      issue(locate(key), key, format_double(v) + " is not a power of two",
            "scaling by a power of two is exact; use " + format_double(below) + " or " +
                format_double(above));
    };
    power_of_two("training.loss_scale", t.loss_scale);
    power_of_two("training.initial_loss_scale", t.initial_loss_scale);
    power_of_two("training.min_loss_scale", t.min_loss_scale);
    if (all_usable({"training.min_loss_scale", "training.initial_loss_scale"}) &&
        t.min_loss_scale > t.initial_loss_scale) {
      issue(locate("training.min_loss_scale"), "training.min_loss_scale",
            "training.min_loss_scale " + format_double(t.min_loss_scale) +
                " exceeds training.initial_loss_scale " + format_double(t.initial_loss_scale),
            "the dynamic scale starts at initial_loss_scale and halves down to min_loss_scale; "
            "make min_loss_scale <= initial_loss_scale");
    }
    // Keys set away from their defaults that this run does not read: said once, not refused
    // (a resolved recipe, which writes every key, must load without a warning).
    const Recipe defaults;
    auto changed = [&](std::initializer_list<const char*> keys) {
      std::vector<std::string> out;
      for (const char* key : keys) {
        const KeySpec& k = *find_key(key);
        if (is_set(key) && usable(key) && k.get(r_) != k.get(defaults)) out.push_back(key);
      }
      return out;
    };
    // bf16 and fp16 are refused by check_unimplemented today but keep their value, which says
    // whether these keys act; a precision that failed to convert is left at fp32 and says
    // nothing.
    const bool precision_known = usable("training.precision") || t.precision != "fp32";
    if (precision_known && t.precision != "fp16") {
      const std::vector<std::string> ignored =
          changed({"training.loss_scale", "training.loss_scale_window",
                   "training.initial_loss_scale", "training.min_loss_scale",
                   "training.loss_scale_hysteresis", "training.max_skipped_steps"});
      if (!ignored.empty())
        warnings_.push_back(join(ignored, ", ") + (ignored.size() == 1 ? " acts" : " act") +
                            " only with training.precision fp16; ignored in this " +
                            t.precision + " run");
    } else if (t.precision == "fp16" && t.loss_scale > 0 && usable("training.loss_scale")) {
      const std::vector<std::string> ignored =
          changed({"training.loss_scale_window", "training.initial_loss_scale",
                   "training.min_loss_scale", "training.loss_scale_hysteresis"});
      if (!ignored.empty())
        warnings_.push_back(join(ignored, ", ") + (ignored.size() == 1 ? " acts" : " act") +
                            " only with dynamic loss scaling (training.loss_scale 0); ignored "
                            "with the static scale " + format_double(t.loss_scale));
    }
  }

  // Token ids must be rows of the embedding. ft train refuses shards whose vocab_size attribute
  // exceeds model.vocab_size (every id of a shard is below its attribute, data/shard_read.cpp), so
  // validate checks the same here from the first shard's attributes, without reading tokens;
  // and a tokenizer with more pieces than the model has rows would produce such ids.
  void check_vocabulary() {
    if (!usable("model.vocab_size")) return;
    const int64_t V = r_.model.vocab_size;
    const std::string source = r_.model.from.empty()
                                   ? std::string()
                                   : " (vocab_size in " + r_.model.from + "/config.json)";
    for (const char* key : {"data.train", "data.valid"}) {
      const KeySpec& k = *find_key(key);
      const std::string dir = std::get<std::string>(k.get(r_));
      std::error_code ec;
      if (dir.empty() || !usable(key) || !std::filesystem::is_directory(dir, ec)) continue;
      std::vector<std::string> files;
      try {
        files = list_shard_files(dir);
      } catch (const Error&) {
        continue;  // no shards yet: the loader names the folder when training starts
      }
      ShardInfo info;
      try {
        info = read_shard_info(files.front());
      } catch (const Error& e) {
        issue(locate(key), key, e.what(), "re-create the shards with ft tokenize");
        continue;
      }
      if (info.attrs.vocab_size > V) {
        issue(locate("model.vocab_size"), "model.vocab_size",
              "model.vocab_size " + std::to_string(V) + source + " is smaller than vocab_size " +
                  std::to_string(info.attrs.vocab_size) + " of the shards in " + dir + " (" +
                  files.front() + ")",
              "tokenize " + std::string(key) + " with the model's tokenizer, or use a model "
              "whose vocabulary covers it");
      }
    }
    // tokenizer.path is also used as opaque bytes (its hash must match the shards'), so a file
    // SentencePiece cannot load is left to that check.
    if (!r_.tokenizer.path.empty() && usable("tokenizer.path")) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(r_.tokenizer.path, ec)) return;
      int64_t pieces = 0;
      try {
        pieces = Tokenizer(r_.tokenizer.path).vocab_size();
      } catch (const Error&) {
        return;
      }
      if (pieces > V) {
        issue(locate("model.vocab_size"), "model.vocab_size",
              "model.vocab_size " + std::to_string(V) + source + " is smaller than the " +
                  std::to_string(pieces) + " pieces of tokenizer " + r_.tokenizer.path,
              "use the model's own tokenizer, or a model whose vocabulary covers it");
      }
    }
  }

  // RoPE scaling written in the recipe (with model.from, read_hf_config has checked the file's
  // and any recipe key that disagrees is already an issue). Each type needs its factors, as
  // transformers' rope validation requires them; a factor the type does not use is refused when
  // it is not the neutral default, since the recipe then asks for a scaling it would not get.
  void check_rope() {
    const ModelConfig& m = r_.model;
    if (!m.from.empty() || !usable("model.rope_type")) return;
    const std::string& type = m.rope_type;
    const Recipe defaults;
    struct Factor {
      const char* path;
      bool used;
    };
    const bool llama3 = type == "llama3";
    for (Factor f : {Factor{"model.rope_factor", type != "default"},
                     Factor{"model.rope_low_freq_factor", llama3},
                     Factor{"model.rope_high_freq_factor", llama3},
                     Factor{"model.rope_original_max_seq_len", llama3}}) {
      const KeySpec& k = *find_key(f.path);
      if (!usable(f.path)) continue;
      if (f.used && !is_set(f.path)) {
        issue(locate(f.path), f.path, "is required when model.rope_type is " + type,
              "set it to the model's " + k.hf_name + " (in config.json's rope_parameters or "
              "rope_scaling)");
      } else if (!f.used && is_set(f.path) && k.get(r_) != k.get(defaults)) {
        issue(locate(f.path), f.path,
              "is set but model.rope_type " + type + " does not use it",
              "set model.rope_type to the scaling it belongs to, or remove " + std::string(f.path));
      }
    }
    if (all_usable({"model.rope_theta", "model.rope_factor", "model.dim", "model.n_heads"}) &&
        m.n_heads > 0 && m.dim % m.n_heads == 0) {
      if (std::string p = rope_table_problem(m, m.dim / m.n_heads); !p.empty())
        issue(locate("model.rope_theta"), "model.rope_theta", p,
              "Llama models use rope_theta between 1e4 and 1e6 and factors between 1 and 64");
    }
    if (llama3 && all_usable({"model.rope_low_freq_factor", "model.rope_high_freq_factor"}) &&
        !(m.rope_low_freq_factor < m.rope_high_freq_factor)) {
      issue(locate("model.rope_high_freq_factor"), "model.rope_high_freq_factor",
            "model.rope_low_freq_factor " + format_double(m.rope_low_freq_factor) +
                " must be below model.rope_high_freq_factor " +
                format_double(m.rope_high_freq_factor),
            "llama3 blends the frequencies between the two; Llama 3.1 uses 1 and 4");
    }
  }

  // World = data × pipeline × tensor (DESIGN.md §3). world_size <= 0 means "not known yet"
  // (ft validate without a launcher): then the smallest world, one data rank, is assumed.
  void check_layout() {
    const ParallelConfig& p = r_.parallel;
    const ModelConfig& m = r_.model;
    if (!usable("parallel.tensor") || !usable("parallel.pipeline")) return;
    const int64_t model_ranks = int64_t(p.tensor) * p.pipeline;
    const int64_t world = world_size_ > 0 ? world_size_ : model_ranks;
    if (world % model_ranks != 0) {
      issue(locate("parallel.tensor"), "parallel.tensor",
            "world size " + std::to_string(world) +
                " is not divisible by tensor × pipeline = " + std::to_string(model_ranks),
            "the ranks form a data × pipeline × tensor grid; launch a multiple of " +
                std::to_string(model_ranks) + " ranks or change parallel.tensor/pipeline");
      return;
    }
    const int64_t data = world / model_ranks;
    if (all_usable({"training.micro_batch_size", "training.global_batch_size"})) {
      const int64_t per_step = int64_t(r_.training.micro_batch_size) * data;
      if (r_.training.global_batch_size % per_step != 0) {
        const int64_t up = (r_.training.global_batch_size / per_step + 1) * per_step;
        issue(locate("training.global_batch_size"), "training.global_batch_size",
              "global_batch_size " + std::to_string(r_.training.global_batch_size) +
                  " is not divisible by micro_batch_size × data ranks = " +
                  std::to_string(r_.training.micro_batch_size) + " × " + std::to_string(data),
              "use a multiple of " + std::to_string(per_step) + ", e.g. " + std::to_string(up));
      }
    }
    // Tensor parallelism splits heads, KV heads, the MLP and the vocabulary (embedding, lm_head
    // and cross-entropy) across tensor ranks. The vocabulary is not padded: a vocab_size that
    // does not divide is refused rather than silently changing the model's shapes.
    struct Split {
      const char* key;
      int value;
    };
    for (Split s : {Split{"model.n_heads", m.n_heads}, Split{"model.n_kv_heads", m.n_kv_heads},
                    Split{"model.ffn_dim", m.ffn_dim}, Split{"model.vocab_size", m.vocab_size}}) {
      if (usable(s.key) && s.value % p.tensor != 0) {
        issue(locate("parallel.tensor"), "parallel.tensor",
              std::string(s.key) + " " + std::to_string(s.value) +
                  " does not split evenly over parallel.tensor " + std::to_string(p.tensor),
              "use a parallel.tensor that divides it");
      }
    }
    if (usable("model.n_layers") && m.n_layers < p.pipeline) {
      issue(locate("parallel.pipeline"), "parallel.pipeline",
            "parallel.pipeline " + std::to_string(p.pipeline) + " stages for only " +
                std::to_string(m.n_layers) + " layers",
            "every stage needs at least one layer; use at most " + std::to_string(m.n_layers));
    }
  }

  static int nearest_divisor(int n, int near) {
    int best = 1;
    for (int d = 1; d <= n; ++d) {
      if (n % d == 0 && std::abs(d - near) < std::abs(best - near)) best = d;
    }
    return best;
  }

  // Issues read like compiler output: the recipe file in line order, then the command line.
  void sort_issues() {
    auto rank = [&](const RecipeIssue& i) {
      return std::make_tuple(i.file != path_, i.line == 0, i.line, i.column);
    };
    std::stable_sort(issues_.begin(), issues_.end(),
                     [&](const RecipeIssue& a, const RecipeIssue& b) { return rank(a) < rank(b); });
  }

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

}  // namespace

std::string RecipeIssue::format() const {
  std::string out = file;
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  out += ": ";
  if (!key_path.empty()) out += key_path + ": ";
  out += message;
  if (!hint.empty()) out += " (hint: " + hint + ")";
  return out;
}

RecipeResult load_recipe(const std::string& path, const std::vector<std::string>& overrides,
                         int world_size, bool refuse_unbuilt) {
  return Loader(path, world_size, refuse_unbuilt).run(overrides);
}

Recipe load_recipe_or_throw(const std::string& path, const std::vector<std::string>& overrides,
                            int world_size, bool refuse_unbuilt,
                            std::vector<std::string>* warnings) {
  RecipeResult res = load_recipe(path, overrides, world_size, refuse_unbuilt);
  if (warnings) *warnings = res.warnings;
  if (res.ok()) return std::move(res.recipe);
  std::string msg;
  for (const RecipeIssue& i : res.issues) msg += i.format() + "\n";
  msg += std::to_string(res.issues.size()) + (res.issues.size() == 1 ? " problem" : " problems") +
         " in recipe " + path;
  throw UsageError(msg);
}

std::string recipe_to_yaml(const Recipe& r) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const KeySpec& k : schema()) {
    if (k.section() != section) {
      if (!section.empty()) out << YAML::EndMap;
      section = k.section();
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << k.key() << YAML::Value;
    const Value v = k.get(r);
    if (const auto* s = std::get_if<std::string>(&v)) {
      out << *s;  // the emitter quotes what would not read back as this string ("", "null")
    } else if (const auto* b = std::get_if<bool>(&v)) {
      out << *b;
    } else if (const auto* betas = std::get_if<Betas>(&v)) {
      out << YAML::Flow << YAML::BeginSeq << format_double((*betas)[0])
          << format_double((*betas)[1]) << YAML::EndSeq;
    } else {
      out << format_value(v);  // numbers: shortest text that reads back as the same value
    }
    out << YAML::Comment(k.doc);
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  std::string text = out.c_str();
  if (!r.source_path.empty()) text = "# resolved from " + r.source_path + "\n" + text;
  return text + "\n";
}

int data_parallel_size(const Recipe& r, int world_size) {
  const int model_ranks = r.parallel.tensor * r.parallel.pipeline;
  FT_CHECK(model_ranks > 0 && world_size % model_ranks == 0, "world size ", world_size,
           " is not divisible by tensor × pipeline = ", model_ranks);
  return world_size / model_ranks;
}

int grad_accum_steps(const Recipe& r, int world_size) {
  const int per_step = r.training.micro_batch_size * data_parallel_size(r, world_size);
  FT_CHECK(per_step > 0 && r.training.global_batch_size % per_step == 0, "global_batch_size ",
           r.training.global_batch_size,
           " is not divisible by micro_batch_size × data ranks = ", per_step);
  return r.training.global_batch_size / per_step;
}

LossScalerConfig loss_scaler_config(const TrainingConfig& t) {
  LossScalerConfig c;
  c.loss_scale = t.loss_scale;
  c.initial_scale = t.initial_loss_scale;
  c.min_scale = t.min_loss_scale;
  c.window = t.loss_scale_window;
  c.hysteresis = t.loss_scale_hysteresis;
  c.max_skipped_steps = t.max_skipped_steps;
  return c;
}

}  // namespace ft
