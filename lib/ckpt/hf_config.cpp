// read_hf_config: a Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or
// MistralForCausalLM config.json → ModelConfig.
//
// Invariant: whatever this returns is a model ft computes exactly as transformers would. So a
// config that asks for something the model code does not do (a RoPE type other than default,
// linear and llama3, biases other than Qwen2's, another activation, a sliding window that binds)
// is refused here rather than loaded and then trained with different math. Every problem of the
// file is collected into one error, so a user fixes them in one pass.
#include <climits>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "model/arch.h"
#include "model/rope.h"

namespace ft {
namespace {

using nlohmann::json;

// Collects the problems of one config.json; every accessor records what is wrong and returns a
// fallback so the remaining keys are still checked.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  // A required positive integer that must fit ModelConfig's int fields.
  int positive_int(const char* key) {
    if (!j_.contains(key) || j_[key].is_null()) {
      problems_.push_back(std::string("missing \"") + key + "\"");
      return 1;
    }
    return positive_int_value(key, j_[key]);
  }

  // An optional positive integer; `fallback` when absent or null (HF writes null for defaults).
  int positive_int_or(const char* key, int fallback) {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    return positive_int_value(key, j_[key]);
  }

  double positive_number(const char* key, std::optional<double> fallback) {
    if (!j_.contains(key) || j_[key].is_null()) {
      if (fallback) return *fallback;
      problems_.push_back(std::string("missing \"") + key + "\"");
      return 1.0;
    }
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() > 0)) {
      problems_.push_back(std::string("\"") + key + "\" must be a number > 0, got " +
                          short_dump(v));
      return 1.0;
    }
    return v.get<double>();
  }

  bool boolean_or(const char* key, bool fallback) {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_boolean()) {
      problems_.push_back(std::string("\"") + key + "\" must be true or false, got " +
                          short_dump(j_[key]));
      return fallback;
    }
    return j_[key].get<bool>();
  }

  void problem(std::string p) { problems_.push_back(std::move(p)); }
  // A well-formed value naming a feature ft does not implement: refused by read_hf_config and
  // recipe validation, reported as a compatibility problem by ft inspect.
  void unsupported(std::string p) { unsupported_.push_back(std::move(p)); }
  const std::vector<std::string>& unsupported_list() const { return unsupported_; }

  // Throws one error naming the file and listing every problem.
  void throw_if_any() const {
    if (problems_.empty()) return;
    std::ostringstream os;
    os << file_ << ": ";
    for (size_t i = 0; i < problems_.size(); ++i) os << (i ? "; " : "") << problems_[i];
    throw UsageError(os.str());
  }

 private:
  int positive_int_value(const char* key, const json& v) {
    // HF writes sizes as JSON integers; a float such as 4096.0 means a hand-edited file and is
    // refused rather than rounded.
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > INT_MAX) {
      problems_.push_back(std::string("\"") + key + "\" must be a positive integer, got " +
                          short_dump(v));
      return 1;
    }
    return int(v.get<int64_t>());
  }

  const json& j_;
  std::string file_;
  std::vector<std::string> problems_;
  std::vector<std::string> unsupported_;
};

// One RoPE description as one of the two formats states it, with where each value was found.
struct RopeSpec {
  std::string type = "default";
  double theta = 10000.0;  // LlamaConfig's default when the file has none
  std::optional<double> factor, low_freq_factor, high_freq_factor;
  std::optional<int> original_max;
  std::string type_at, theta_at;  // config.json key paths; empty: absent (the default applies)
};

std::string fmt_number(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The keys a rope mapping may hold for the types ft implements; any other key would change the
// math in some transformers release (attention_factor, beta_fast, partial_rotary_factor, ...),
// so it is refused rather than skipped.
bool known_rope_key(const std::string& k) {
  for (const char* name : {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                           "high_freq_factor", "original_max_position_embeddings"})
    if (k == name) return true;
  return false;
}

// Reads the rope mapping `m`, found at config.json key `where` (rope_parameters or
// rope_scaling), into `spec`. theta_allowed: transformers 5's rope_parameters holds rope_theta;
// 4.x's rope_scaling does not (it sat at the top level).
void read_rope_mapping(ConfigReader& c, const json& m, const std::string& where, RopeSpec& spec,
                       bool theta_allowed) {
  if (!m.is_object()) {
    c.problem(where +
              " must be a mapping such as {\"rope_type\": \"llama3\", \"factor\": 8.0}, "
              "got " +
              short_dump(m));
    return;
  }
  // transformers 5 also allows one mapping per attention kind ({"full_attention": {...}});
  // Llama has one kind of attention, so such a file is from another architecture.
  for (const auto& [k, v] : m.items()) {
    if (v.is_object()) {
      c.problem(where + " holds per-layer-type mappings (\"" + k +
                "\"); Llama uses one RoPE for every layer");
      return;
    }
  }
  const bool has_new = m.contains("rope_type") && !m["rope_type"].is_null();
  const bool has_old = m.contains("type") && !m["type"].is_null();
  const json* type = has_new ? &m["rope_type"] : has_old ? &m["type"] : nullptr;
  if (has_new && has_old && m["rope_type"] != m["type"]) {
    c.problem(where + ".rope_type " + short_dump(m["rope_type"]) + " and " + where + ".type " +
              short_dump(m["type"]) + " disagree");
  }
  if (type) {
    if (!type->is_string()) {
      c.problem(where + "." + (has_new ? "rope_type" : "type") + " must be a string, got " +
                short_dump(*type));
    } else {
      spec.type = type->get<std::string>();
      spec.type_at = where + "." + (has_new ? "rope_type" : "type");
    }
  }
  auto number = [&](const char* key) -> std::optional<double> {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    const json& v = m[key];
    if (!v.is_number() || !(v.get<double>() > 0)) {
      c.problem(where + "." + key + " must be a number > 0, got " + short_dump(v));
      return std::nullopt;
    }
    return v.get<double>();
  };
  if (auto t = number("rope_theta")) {
    if (theta_allowed) {
      spec.theta = *t;
      spec.theta_at = where + ".rope_theta";
    } else {
      // transformers 4 reads only the top-level rope_theta; a value here is ignored there and
      // read by 5, so the two would train different models.
      c.problem(where +
                ".rope_theta is set; transformers 4 reads rope_theta only at the top "
                "level and 5 only in rope_parameters: move it to one of those");
    }
  }
  spec.factor = number("factor");
  spec.low_freq_factor = number("low_freq_factor");
  spec.high_freq_factor = number("high_freq_factor");
  if (auto o = number("original_max_position_embeddings")) {
    if (*o != std::floor(*o) || *o > INT_MAX)
      c.problem(where + ".original_max_position_embeddings must be a whole number, got " +
                short_dump(m["original_max_position_embeddings"]));
    else
      spec.original_max = int(*o);
  }
  // Keys the implemented types do not read. transformers ignores some of them too, but which
  // ones changes between releases, so the file is refused rather than half read. Not checked
  // for an unimplemented type: that type is refused by name below.
  if (is_rope_type(spec.type)) {
    for (const auto& [k, v] : m.items()) {
      if (k == "partial_rotary_factor" && v.is_number() && v.get<double>() == 1.0) continue;
      if (!known_rope_key(k) && !v.is_null())
        c.unsupported(where + "." + k + " = " + short_dump(v) + " is not implemented by ft's " +
                      spec.type + " RoPE");
    }
  }
}

// RoPE from either format: transformers ≥ 5 writes rope_parameters {rope_type, rope_theta,
// factor, ...}; 4.x wrote a top-level rope_theta and rope_scaling {rope_type (before 4.43:
// "type"), factor, ...} (null without scaling). A file with both must say the same in both,
// since the two transformers generations would each read one of them.
void read_rope(ConfigReader& c, const json& j, ModelConfig& m, HfConfigOrigins& origins) {
  const bool has_v5 = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  const bool has_theta = j.contains("rope_theta") && !j["rope_theta"].is_null();
  const bool has_scaling = j.contains("rope_scaling") && !j["rope_scaling"].is_null();
  RopeSpec v5, v4;
  if (has_v5) read_rope_mapping(c, j["rope_parameters"], "rope_parameters", v5, true);
  if (has_theta) {
    v4.theta = c.positive_number("rope_theta", 10000.0);
    v4.theta_at = "rope_theta";
  }
  if (has_scaling) read_rope_mapping(c, j["rope_scaling"], "rope_scaling", v4, false);

  // Both formats in one file: read as transformers 5 reads it (rope_scaling, when present,
  // replaces rope_parameters; a top-level rope_theta fills a rope_parameters without one), and
  // refused where 4 would read something else, naming both places.
  if (has_v5 && has_theta && v5.theta_at.empty()) {
    v5.theta = v4.theta;
    v5.theta_at = v4.theta_at;
  }
  auto differ = [&](const std::string& what, const std::string& a_at, const std::string& a,
                    const std::string& b_at, const std::string& b) {
    if (a == b) return;
    c.problem(
        (a_at.empty() ? "rope_parameters has no " + what + " (" + a + ")" : a_at + " = " + a) +
        " but " +
        (b_at.empty() ? "rope_scaling has no " + what + " (" + b + ")" : b_at + " = " + b) +
        "; transformers 5 and 4 would read different RoPE: make them agree");
  };
  if (has_v5 && has_theta && v5.theta_at != v4.theta_at)
    differ("rope_theta", v5.theta_at, fmt_number(v5.theta), v4.theta_at, fmt_number(v4.theta));
  if (has_v5 && has_scaling) {
    auto opt = [](const auto& o) { return o ? fmt_number(double(*o)) : std::string("unset"); };
    auto at = [](bool set, const char* where, const char* key) {
      return set ? std::string(where) + "." + key : std::string();
    };
    differ("rope_type", v5.type_at, v5.type, v4.type_at, v4.type);
    differ("factor", at(bool(v5.factor), "rope_parameters", "factor"), opt(v5.factor),
           at(bool(v4.factor), "rope_scaling", "factor"), opt(v4.factor));
    differ("low_freq_factor", at(bool(v5.low_freq_factor), "rope_parameters", "low_freq_factor"),
           opt(v5.low_freq_factor), at(bool(v4.low_freq_factor), "rope_scaling", "low_freq_factor"),
           opt(v4.low_freq_factor));
    differ("high_freq_factor", at(bool(v5.high_freq_factor), "rope_parameters", "high_freq_factor"),
           opt(v5.high_freq_factor),
           at(bool(v4.high_freq_factor), "rope_scaling", "high_freq_factor"),
           opt(v4.high_freq_factor));
    differ("original_max_position_embeddings",
           at(bool(v5.original_max), "rope_parameters", "original_max_position_embeddings"),
           opt(v5.original_max),
           at(bool(v4.original_max), "rope_scaling", "original_max_position_embeddings"),
           opt(v4.original_max));
  }
  RopeSpec& r = has_v5 ? v5 : v4;
  const std::string where = has_v5 ? "rope_parameters" : "rope_scaling";
  // transformers 5 lets a top-level original_max_position_embeddings (Phi-3 style) override the
  // mapping's for llama3; 4 reads only the mapping. Agreeing or filling a gap is fine.
  if (j.contains("original_max_position_embeddings") &&
      !j["original_max_position_embeddings"].is_null() && r.type == "llama3") {
    const json& top = j["original_max_position_embeddings"];
    if (!top.is_number_integer() || top.get<int64_t>() < 1 || top.get<int64_t>() > INT_MAX) {
      c.problem("original_max_position_embeddings must be a positive integer, got " +
                short_dump(top));
    } else if (!r.original_max) {
      r.original_max = int(top.get<int64_t>());
    } else if (*r.original_max != top.get<int64_t>()) {
      c.problem("original_max_position_embeddings = " + short_dump(top) + " but " + where +
                ".original_max_position_embeddings = " + std::to_string(*r.original_max) +
                "; transformers 5 and 4 would read different RoPE: make them agree");
    }
  }
  m.rope_theta = r.theta;
  origins["model.rope_theta"] = r.theta_at;
  origins["model.rope_type"] = r.type_at;
  if (!is_rope_type(r.type)) {
    std::string list;
    for (const std::string& t : rope_types()) list += (list.empty() ? "" : ", ") + t;
    m.rope_type = r.type;  // so that ft inspect shows what the file asks for
    c.unsupported("rope type \"" + r.type + "\" (" + r.type_at +
                  ") is not implemented; ft implements " + list);
    return;
  }
  m.rope_type = r.type;
  // What each type needs, as transformers' rope_config_validation requires it.
  auto need = [&](const auto& v, const char* key) {
    if (!v) c.problem(where + "." + key + " is required by rope type \"" + r.type + "\"");
    return bool(v);
  };
  // A factor the type does not use (factor with default, low_freq_factor with linear) is
  // ignored here as transformers ignores it: both compute the same RoPE.
  if (r.type == "linear" || r.type == "llama3") {
    if (need(r.factor, "factor")) m.rope_factor = *r.factor;
    origins["model.rope_factor"] = where + ".factor";
  }
  if (r.type == "llama3") {
    const bool lo = need(r.low_freq_factor, "low_freq_factor");
    const bool hi = need(r.high_freq_factor, "high_freq_factor");
    if (need(r.original_max, "original_max_position_embeddings"))
      m.rope_original_max_seq_len = *r.original_max;
    if (lo) m.rope_low_freq_factor = *r.low_freq_factor;
    if (hi) m.rope_high_freq_factor = *r.high_freq_factor;
    if (lo && hi && !(*r.low_freq_factor < *r.high_freq_factor))
      c.problem(where + ".low_freq_factor " + fmt_number(*r.low_freq_factor) +
                " must be below high_freq_factor " + fmt_number(*r.high_freq_factor) +
                " (the smooth band between them would be empty or reversed)");
    origins["model.rope_low_freq_factor"] = where + ".low_freq_factor";
    origins["model.rope_high_freq_factor"] = where + ".high_freq_factor";
    origins["model.rope_original_max_seq_len"] = where + ".original_max_position_embeddings";
  }
}

// model.arch from model_type and architectures (either may be absent: llama).
std::string read_arch(ConfigReader& c, const json& j) {
  std::string from_type, from_class;
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    const json& t = j["model_type"];
    const ArchSpec* a = t.is_string() ? find_arch(t.get<std::string>()) : nullptr;
    if (a != nullptr && a->implemented) from_type = a->name;
    if (from_type.empty())
      c.problem("model_type is " + short_dump(t) + "; implemented: " + implemented_arch_classes());
  }
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    if (a.is_array() && !a.empty() && a[0].is_string()) {
      const ArchSpec* f = find_arch_by_class(a[0].get<std::string>());
      if (f != nullptr && f->implemented) from_class = f->name;
    }
    bool same = !from_class.empty();
    for (size_t i = 1; same && i < a.size(); ++i) same = a[i] == a[0];
    if (!same)
      c.problem("architectures is " + short_dump(a) +
                "; implemented: " + implemented_arch_classes());
  }
  if (!from_type.empty() && !from_class.empty() && from_type != from_class)
    c.problem("model_type \"" + from_type + "\" and architectures " +
              short_dump(j["architectures"]) + " name different families");
  if (!from_class.empty()) return from_class;
  return from_type.empty() ? "llama" : from_type;
}

// Sliding-window attention is not implemented: refused wherever it would bind. Qwen2 and Qwen3
// use it only with use_sliding_window: true (then on the layers from max_window_layers on, or
// as layer_types says); Mistral on every layer unless sliding_window is null (MistralConfig's
// default when the key is absent is 4096). A window at least max_position_embeddings never
// binds (a sequence is never longer, forward checks it), so it is accepted.
void read_sliding_window(ConfigReader& c, const json& j, const ArchSpec& arch,
                         const ModelConfig& m) {
  auto window_binds = [&](const json& w) {
    return !w.is_null() && !(w.is_number() && w.get<double>() >= m.max_seq_len);
  };
  if (arch.sliding_window == SlidingWindowKeys::kSwitch) {
    if (j.contains("use_sliding_window") && j["use_sliding_window"] == true) {
      const json w = j.contains("sliding_window") ? j["sliding_window"] : json(4096);
      if (window_binds(w))
        c.unsupported("use_sliding_window is true (sliding_window " + short_dump(w) +
                      "): sliding-window attention is not implemented");
    }
    if (j.contains("layer_types") && j["layer_types"].is_array())
      for (const json& t : j["layer_types"])
        if (t != "full_attention") {
          c.unsupported("layer_types has " + short_dump(t) +
                        "; only \"full_attention\" is implemented");
          break;
        }
  } else if (arch.sliding_window == SlidingWindowKeys::kWindow) {
    const json w = j.contains("sliding_window") ? j["sliding_window"] : json(4096);
    if (window_binds(w))
      c.unsupported("sliding_window is " + short_dump(w) +
                    (j.contains("sliding_window") ? "" : " (MistralConfig's default)") +
                    ", below max_position_embeddings " + std::to_string(m.max_seq_len) +
                    ": sliding-window attention is not implemented (Mistral 7B v0.2 and later have "
                    "sliding_window null)");
  }
}

}  // namespace

ModelConfig read_hf_config(const std::string& dir) {
  HfConfigRead r = read_hf_config_located(dir);
  if (!r.unsupported.empty()) {
    std::string msg = (std::filesystem::path(dir) / "config.json").string() + ": ";
    for (size_t i = 0; i < r.unsupported.size(); ++i) msg += (i ? "; " : "") + r.unsupported[i];
    throw UsageError(msg);
  }
  return r.model;
}

HfConfigRead read_hf_config_located(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  // Checked before it is read: a FIFO or /dev/zero in its place is refused at once.
  const std::string text =
      read_bounded_file(file, kMaxConfigBytes, "the model's config",
                        "a Hugging Face model folder holds config.json beside its *.safetensors");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error for bad syntax; out_of_range for a number beyond a double (1e999), which
    // would otherwise escape as an exception no caller expects.
    throw UsageError(file + ": not valid JSON (" + json_error_words(e) +
                     "); restore the file from the model's download");
  }
  if (!j.is_object())
    throw UsageError(file + ": expected a JSON object at the top level, found " +
                     describe_json_value(j));

  ConfigReader c(j, file);

  // Which architecture: either key may be missing in hand-written configs (then llama); when
  // present they must name one family ft implements, and the same one, since the weights of
  // another family would load into the wrong math.
  const ArchSpec& arch = *find_arch(read_arch(c, j));

  ModelConfig m;
  m.arch = arch.name;
  m.from = dir;
  m.dim = c.positive_int("hidden_size");
  m.n_layers = c.positive_int("num_hidden_layers");
  m.n_heads = c.positive_int("num_attention_heads");
  m.n_kv_heads = c.positive_int_or("num_key_value_heads", m.n_heads);  // absent: no GQA
  m.ffn_dim = c.positive_int("intermediate_size");
  m.vocab_size = c.positive_int("vocab_size");
  m.max_seq_len = c.positive_int("max_position_embeddings");
  m.norm_eps = c.positive_number("rms_norm_eps", std::nullopt);
  m.tie_embeddings = c.boolean_or("tie_word_embeddings", false);

  HfConfigRead out;
  read_rope(c, j, m, out.origins);
  // transformers rotates only head_dim · partial_rotary_factor channels; ft rotates all.
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null() &&
      j["partial_rotary_factor"] != 1.0)
    c.unsupported("partial_rotary_factor " + short_dump(j["partial_rotary_factor"]) +
                  " is not implemented (ft rotates every channel of a head)");

  // Features of the configs the model code does not implement: refuse, never ignore. A family
  // with q, k, v biases (Qwen2) has no attention_bias key, they are always there; Qwen3's covers
  // o_proj too, which ft does not have.
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (arch.qkv_bias && std::string(key) == "attention_bias") continue;
    if (j.contains(key) && j[key] == true) {
      c.problem(std::string(key) + " is true; ft's " + arch.name + " has " +
                (arch.qkv_bias ? "biases on q, k and v only" : "no biases"));
    }
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    c.problem("hidden_act is " + short_dump(j["hidden_act"]) + ", only \"silu\" is implemented");
  }
  // head_dim: absent means hidden_size / num_attention_heads, except where the family's config
  // class has its own default (Qwen3Config: 128). Kept as 0 (that quotient) when it is the
  // quotient, so that the manifests of such models stay as before.
  const bool head_dim_given = j.contains("head_dim") && !j["head_dim"].is_null();
  const json head_dim = head_dim_given              ? j["head_dim"]
                        : arch.default_head_dim > 0 ? json(arch.default_head_dim)
                                                    : json();
  out.origins["model.head_dim"] = head_dim_given ? "head_dim" : "";
  if (!head_dim.is_null()) {
    if (!head_dim.is_number_integer() || head_dim.get<int64_t>() < 2 ||
        head_dim.get<int64_t>() > (int64_t(1) << 20) || head_dim.get<int64_t>() % 2 != 0)
      c.problem("head_dim must be an even whole number from 2 to 2^20, got " +
                short_dump(head_dim) +
                (head_dim_given ? "" : std::string(" (") + arch.label + "Config's default)"));
    else if (m.n_heads <= 0 || m.dim % m.n_heads != 0 ||
             head_dim.get<int64_t>() != m.dim / m.n_heads)
      m.head_dim = int(head_dim.get<int64_t>());
  }
  read_sliding_window(c, j, arch, m);
  // A theta or factor that fits a double but not the fp32 table would rotate by inf or NaN.
  if (heads_whole(m))
    if (std::string p = rope_table_problem(m, head_dim_of(m)); !p.empty()) c.problem(p);
  // ft has no dropout (DESIGN.md §5): trained without it, with one line saying so, since
  // fine-tuning usually turns dropout off anyway and a refusal would send people to edit a
  // downloaded config.json.
  if (j.contains("attention_dropout") && !j["attention_dropout"].is_null()) {
    const json& d = j["attention_dropout"];
    if (!d.is_number() || d.get<double>() < 0 || d.get<double>() >= 1)
      c.problem("attention_dropout must be a number in [0, 1), got " + short_dump(d));
    else if (d.get<double>() > 0)
      out.warnings.push_back(file + ": attention_dropout is " + short_dump(d) +
                             "; ft has no dropout and trains this model without it");
  }
  c.throw_if_any();
  out.model = m;
  out.unsupported = c.unsupported_list();
  return out;
}

}  // namespace ft
