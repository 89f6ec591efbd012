// read_hf_config: a Hugging Face LlamaForCausalLM config.json → ModelConfig.
//
// Invariant: whatever this returns is a model ft computes exactly as transformers would. So a
// config that asks for something the model code does not do (RoPE scaling, biases, another
// activation, a head_dim that is not hidden_size / heads) is refused here rather than loaded
// and then trained with different math. Every problem of the file is collected into one error,
// so a user fixes them in one pass.
#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "core/error.h"

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
      problems_.push_back(std::string("\"") + key + "\" must be a number > 0, got " + v.dump());
      return 1.0;
    }
    return v.get<double>();
  }

  bool boolean_or(const char* key, bool fallback) {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_boolean()) {
      problems_.push_back(std::string("\"") + key + "\" must be true or false, got " +
                          j_[key].dump());
      return fallback;
    }
    return j_[key].get<bool>();
  }

  void problem(std::string p) { problems_.push_back(std::move(p)); }

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
                          v.dump());
      return 1;
    }
    return int(v.get<int64_t>());
  }

  const json& j_;
  std::string file_;
  std::vector<std::string> problems_;
};

}  // namespace

ModelConfig read_hf_config(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(file);
  if (!in) {
    throw UsageError(file +
                     ": cannot open it; a Hugging Face model folder holds config.json "
                     "beside its *.safetensors");
  }
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(file + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw UsageError(file + ": expected a JSON object at the top level");

  ConfigReader c(j, file);

  // Which architecture: either key may be missing in hand-written configs; when present they
  // must say llama, since the weights of another family would load into the wrong math.
  if (j.contains("model_type") && j["model_type"] != "llama") {
    c.problem("model_type is " + j["model_type"].dump() + ", only \"llama\" is implemented");
  }
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    bool llama = a.is_array() && !a.empty();
    if (llama) {
      for (const json& name : a) llama = llama && name == "LlamaForCausalLM";
    }
    if (!llama) {
      c.problem("architectures is " + a.dump() + ", only [\"LlamaForCausalLM\"] is implemented");
    }
  }

  ModelConfig m;
  m.arch = "llama";
  m.from = dir;
  m.dim = c.positive_int("hidden_size");
  m.n_layers = c.positive_int("num_hidden_layers");
  m.n_heads = c.positive_int("num_attention_heads");
  m.n_kv_heads = c.positive_int_or("num_key_value_heads", m.n_heads);  // absent: no GQA
  m.ffn_dim = c.positive_int("intermediate_size");
  m.vocab_size = c.positive_int("vocab_size");
  m.max_seq_len = c.positive_int("max_position_embeddings");
  m.rope_theta = c.positive_number("rope_theta", 10000.0);  // absent before transformers 4.31
  m.norm_eps = c.positive_number("rms_norm_eps", std::nullopt);
  m.tie_embeddings = c.boolean_or("tie_word_embeddings", false);

  // Features of LlamaConfig the model code does not implement: refuse, never ignore.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    c.problem("rope_scaling " + j["rope_scaling"].dump() + " is not implemented yet");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && j[key] == true) {
      c.problem(std::string(key) + " is true; ft's Llama has no biases");
    }
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    c.problem("hidden_act is " + j["hidden_act"].dump() + ", only \"silu\" is implemented");
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null() && m.n_heads > 0 &&
      j["head_dim"] != m.dim / m.n_heads) {
    c.problem("head_dim " + j["head_dim"].dump() +
              " differs from hidden_size / num_attention_heads; not implemented");
  }
  c.throw_if_any();
  return m;
}

}  // namespace ft
