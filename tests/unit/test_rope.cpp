// RoPE scaling: the inverse-frequency table against transformers' formulas, config.json in the
// formats of transformers 5 (rope_parameters) and 4 (rope_theta + rope_scaling), every refusal,
// and the recipe keys model.rope_* with and without model.from.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "ckpt/hf_export.h"
#include "core/error.h"
#include "model/rope.h"
#include "recipe/recipe.h"
#include "temp_dir.h"
#include "train/train_state.h"

namespace {

doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

// Distance in units in the last place between two positive floats.
int64_t ulps(float a, float b) {
  return std::abs(int64_t(std::bit_cast<int32_t>(a)) - int64_t(std::bit_cast<int32_t>(b)));
}

// Compares ft's table with transformers'; returns how many entries are bit-identical.
int compare_table(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  int exact = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("inv_freq[" << i << "] ft " << got[i] << " transformers " << want[i]);
    // One ulp: ft's powf and torch's vectorised pow may round the last bit differently; every
    // later step is the same fp32 operation on both sides.
    CHECK(ulps(got[i], want[i]) <= 1);
    exact += got[i] == want[i];
  }
  return exact;
}

// A LlamaForCausalLM config.json with head_dim 16; `rope` is spliced in as written.
std::string config_json(const std::string& rope) {
  return "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
         " \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
         " \"num_key_value_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 101,"
         " \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05" +
         (rope.empty() ? std::string() : ", " + rope) + "}";
}

const char* kLlama3 =
    "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192";

struct Folder {
  TempDir tmp;
  std::string write(const std::string& name, const std::string& config) const {
    const std::string dir = tmp.file(name);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config;
    return dir;
  }
};

std::string read_error(const std::string& dir) {
  try {
    ft::read_hf_config(dir);
  } catch (const ft::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("rope: inv_freq tables match transformers' formulas to one ulp") {
  // Llama 3.1's RoPE: theta 500000, head_dim 128, llama3 with factor 8, low/high frequency
  // factors 1/4, original max positions 8192 (29 frequencies kept, 6 blended, 29 divided).
  // Values printed by tests/ref/llama_ref.py rope_inv_freq (transformers'
  // _compute_llama3_parameters written out in torch 1.13 fp32 ops) as float.hex().
  const std::vector<float> llama31 = {
      0x1p+0f,         0x1.a11582p-1f,  0x1.53c38cp-1f,  0x1.14c708p-1f,  0x1.c2ef78p-2f,
      0x1.6f56fap-2f,  0x1.2b3dc6p-2f,  0x1.e788c2p-3f,  0x1.8d276p-3f,   0x1.43874p-3f,
      0x1.078d4p-3f,   0x1.ad6338p-4f,  0x1.5dc95ap-4f,  0x1.1cf13p-4f,   0x1.d03ccep-5f,
      0x1.7a2d08p-5f,  0x1.34119p-5f,   0x1.f5ea7ep-6f,  0x1.98de92p-6f,  0x1.4d1272p-6f,
      0x1.0f5386p-6f,  0x1.ba0dd8p-7f,  0x1.681adap-7f,  0x1.2558fep-7f,  0x1.ddee9ep-8f,
      0x1.8554ecp-8f,  0x1.3d2804p-8f,  0x1.025c6ap-8f,  0x1.a4ee4p-9f,   0x1.1bfa0cp-9f,
      0x1.67a23ap-10f, 0x1.c12f3cp-11f, 0x1.132ba4p-11f, 0x1.47e21p-12f,  0x1.765ba4p-13f,
      0x1.90d10cp-14f, 0x1.46831ap-14f, 0x1.09fb7ep-14f, 0x1.b15902p-15f, 0x1.610332p-15f,
      0x1.1f91fp-15f,  0x1.d484dep-16f, 0x1.7da9e8p-16f, 0x1.36e8eap-16f, 0x1.fa8b86p-17f,
      0x1.9ca3eap-17f, 0x1.5024d6p-17f, 0x1.11d41ep-17f, 0x1.be2188p-18f, 0x1.6b6d0ep-18f,
      0x1.280d96p-18f, 0x1.e257p-19f,   0x1.88ec2p-19f,  0x1.4014d2p-19f, 0x1.04be68p-19f,
      0x1.a8d01p-20f,  0x1.5a0f4ep-20f, 0x1.19e8p-20f,   0x1.cb4a9ap-21f, 0x1.76258ep-21f,
      0x1.30c94ep-21f, 0x1.f09184p-22f, 0x1.94836p-22f,  0x1.4985fep-22f};
  ft::ModelConfig m;
  m.rope_theta = 500000.0;
  m.rope_type = "llama3";
  m.rope_factor = 8.0;
  m.rope_low_freq_factor = 1.0;
  m.rope_high_freq_factor = 4.0;
  m.rope_original_max_seq_len = 8192;
  const std::vector<float> got = ft::rope_inv_freq(m, 128);
  const int exact = compare_table(got, llama31);
  MESSAGE("llama3: " << exact << " of 64 entries bit-identical to transformers'");
  // The three bands: kept (i < 29), blended (29..34), divided by 8 (35..63).
  ft::ModelConfig plain = m;
  plain.rope_type = "default";
  const std::vector<float> base = ft::rope_inv_freq(plain, 128);
  CHECK(got[28] == base[28]);
  CHECK(got[29] != base[29]);
  CHECK(got[29] != base[29] / 8.0f);
  CHECK(got[34] != base[34] / 8.0f);
  CHECK(got[35] == base[35] / 8.0f);

  // Linear, factor 4, theta 10000, head_dim 16 (same source).
  const std::vector<float> linear4 = {0x1p-2f,         0x1.43d136p-4f, 0x1.99999ap-6f,
                                      0x1.030dc6p-7f,  0x1.47ae14p-9f, 0x1.9e7c7p-11f,
                                      0x1.0624dep-12f, 0x1.4b96cp-14f};
  ft::ModelConfig lin;
  lin.rope_type = "linear";
  lin.rope_factor = 4.0;
  MESSAGE("linear: " << compare_table(ft::rope_inv_freq(lin, 16), linear4)
                     << " of 8 entries bit-identical");

  // Odd or zero head_dim is a programming error, not a table.
  CHECK_THROWS_AS(ft::rope_inv_freq(lin, 15), ft::Error);
  lin.rope_type = "yarn";
  CHECK_THROWS_AS(ft::rope_inv_freq(lin, 16), ft::Error);
}

TEST_CASE("rope: config.json in transformers 5 and 4 formats") {
  Folder f;
  SUBCASE("transformers 5: rope_parameters with rope_theta inside") {
    const std::string dir =
        f.write("v5", config_json("\"rope_parameters\": {\"rope_theta\": 500000.0, " +
                                  std::string(kLlama3) + "}"));
    const ft::HfConfigRead r = ft::read_hf_config_located(dir);
    CHECK(r.model.rope_theta == 500000.0);
    CHECK(r.model.rope_type == "llama3");
    CHECK(r.model.rope_factor == 8.0);
    CHECK(r.model.rope_low_freq_factor == 1.0);
    CHECK(r.model.rope_high_freq_factor == 4.0);
    CHECK(r.model.rope_original_max_seq_len == 8192);
    CHECK(r.origins.at("model.rope_theta") == "rope_parameters.rope_theta");
    CHECK(r.origins.at("model.rope_type") == "rope_parameters.rope_type");
    CHECK(r.unsupported.empty());
    CHECK(r.warnings.empty());
  }
  SUBCASE("transformers 5: default rope, theta 500000 (ft once read 10000 here)") {
    const std::string dir =
        f.write("v5d", config_json("\"rope_parameters\": {\"rope_type\": \"default\", "
                                   "\"rope_theta\": 500000.0}"));
    const ft::ModelConfig m = ft::read_hf_config(dir);
    CHECK(m.rope_theta == 500000.0);
    CHECK(m.rope_type == "default");
  }
  SUBCASE("transformers 4: top-level rope_theta and rope_scaling") {
    const std::string dir = f.write(
        "v4",
        config_json("\"rope_theta\": 500000.0, \"rope_scaling\": {" + std::string(kLlama3) + "}"));
    const ft::HfConfigRead r = ft::read_hf_config_located(dir);
    CHECK(r.model.rope_theta == 500000.0);
    CHECK(r.model.rope_type == "llama3");
    CHECK(r.model.rope_factor == 8.0);
    CHECK(r.origins.at("model.rope_theta") == "rope_theta");
    CHECK(r.origins.at("model.rope_factor") == "rope_scaling.factor");
  }
  SUBCASE("transformers before 4.43: the key was \"type\"; null scaling is none") {
    const ft::ModelConfig lin = ft::read_hf_config(
        f.write("old", config_json("\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}")));
    CHECK(lin.rope_type == "linear");
    CHECK(lin.rope_factor == 2.0);
    CHECK(lin.rope_theta == 10000.0);
    const ft::HfConfigRead none =
        ft::read_hf_config_located(f.write("null", config_json("\"rope_scaling\": null")));
    CHECK(none.model.rope_type == "default");
    CHECK(none.origins.at("model.rope_theta").empty());  // absent: the default
  }
  SUBCASE("both formats: agreeing is fine, rope_theta may sit at the top level only") {
    const ft::ModelConfig m = ft::read_hf_config(f.write(
        "both", config_json("\"rope_theta\": 500000.0, \"rope_scaling\": {" + std::string(kLlama3) +
                            "}, \"rope_parameters\": {" + kLlama3 + "}")));
    CHECK(m.rope_theta == 500000.0);
    CHECK(m.rope_type == "llama3");
  }
  SUBCASE("both formats disagreeing: refused naming both places") {
    const std::string theta = read_error(f.write(
        "theta", config_json("\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": "
                             "\"default\", \"rope_theta\": 500000.0}")));
    CHECK(theta.find("rope_parameters.rope_theta = 500000") != std::string::npos);
    CHECK(theta.find("rope_theta = 10000") != std::string::npos);
    const std::string type = read_error(f.write(
        "type", config_json("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, "
                            "\"rope_parameters\": {\"rope_type\": \"default\"}")));
    CHECK(type.find("rope_parameters.rope_type = default but rope_scaling.rope_type = linear") !=
          std::string::npos);
    const std::string factor = read_error(f.write(
        "factor", config_json("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, "
                              "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 4}")));
    CHECK(factor.find("rope_parameters.factor = 4 but rope_scaling.factor = 2") !=
          std::string::npos);
    // transformers 5 lets a top-level original_max_position_embeddings win for llama3.
    const std::string orig = read_error(f.write(
        "orig", config_json("\"original_max_position_embeddings\": 4096, \"rope_scaling\": {" +
                            std::string(kLlama3) + "}")));
    CHECK(orig.find("original_max_position_embeddings = 4096 but "
                    "rope_scaling.original_max_position_embeddings = 8192") != std::string::npos);
  }
  SUBCASE("other rope types are refused by name, with the supported list") {
    for (const char* type : {"yarn", "dynamic", "longrope"}) {
      CAPTURE(type);
      const std::string dir = f.write(
          type, config_json(std::string("\"rope_scaling\": {\"rope_type\": \"") + type +
                            "\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}"));
      const std::string what = read_error(dir);
      CHECK(what.find(std::string("rope type \"") + type +
                      "\" (rope_scaling.rope_type) is not "
                      "implemented; ft implements default, linear, llama3") != std::string::npos);
      CHECK(what.find(dir) != std::string::npos);  // names the file
      // For ft inspect: reported, not thrown, with the type kept for display.
      const ft::HfConfigRead r = ft::read_hf_config_located(dir);
      REQUIRE(r.unsupported.size() == 1);
      CHECK(r.model.rope_type == type);
    }
  }
  SUBCASE("what each type needs, and keys ft does not read") {
    const std::string missing = read_error(
        f.write("missing", config_json("\"rope_parameters\": {\"rope_type\": \"llama3\"}")));
    CHECK(missing.find("rope_parameters.factor is required by rope type \"llama3\"") !=
          std::string::npos);
    CHECK(missing.find("low_freq_factor is required") != std::string::npos);
    CHECK(missing.find("original_max_position_embeddings is required") != std::string::npos);
    const std::string linear =
        read_error(f.write("linear", config_json("\"rope_scaling\": {\"type\": \"linear\"}")));
    CHECK(linear.find("rope_scaling.factor is required by rope type \"linear\"") !=
          std::string::npos);
    const std::string band = read_error(
        f.write("band", config_json("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                                    "\"low_freq_factor\": 4, \"high_freq_factor\": 4, "
                                    "\"original_max_position_embeddings\": 8192}")));
    CHECK(band.find("low_freq_factor 4 must be below high_freq_factor 4") != std::string::npos);
    const std::string extra =
        read_error(f.write("extra", config_json("\"rope_parameters\": {" + std::string(kLlama3) +
                                                ", \"attention_factor\": 0.5}")));
    CHECK(extra.find("rope_parameters.attention_factor = 0.5 is not implemented") !=
          std::string::npos);
    const std::string partial =
        read_error(f.write("partial", config_json("\"partial_rotary_factor\": 0.5")));
    CHECK(partial.find("partial_rotary_factor 0.5 is not implemented") != std::string::npos);
    const std::string theta_in_v4 = read_error(f.write(
        "v4theta", config_json("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2, "
                               "\"rope_theta\": 5}")));
    CHECK(theta_in_v4.find("rope_scaling.rope_theta is set") != std::string::npos);
    // Fits a double, not the fp32 table: angles of inf or 0 would train silently.
    const std::string tiny = read_error(f.write(
        "tiny", config_json("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e-300}")));
    CHECK(tiny.find("RoPE inverse frequency 0 of head_dim 16 is inf in fp32") != std::string::npos);
    const std::string huge = read_error(f.write("huge", config_json("\"rope_theta\": 1e300")));
    CHECK(huge.find("RoPE inverse frequency 7 of head_dim 16 is 0 in fp32") != std::string::npos);
    const std::string negative = read_error(f.write(
        "neg", config_json("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": -2}")));
    CHECK(negative.find("rope_scaling.factor must be a number > 0, got -2") != std::string::npos);
  }
  SUBCASE("attention_dropout: a one-line warning above 0, refused when malformed") {
    const ft::HfConfigRead d =
        ft::read_hf_config_located(f.write("drop", config_json("\"attention_dropout\": 0.1")));
    REQUIRE(d.warnings.size() == 1);
    CHECK(d.warnings[0].find("attention_dropout is 0.1; ft has no dropout and trains this model "
                             "without it") != std::string::npos);
    CHECK(ft::read_hf_config_located(f.write("zero", config_json("\"attention_dropout\": 0.0")))
              .warnings.empty());
    const std::string bad = f.write("bad", config_json("\"attention_dropout\": 1"));
    CHECK_THROWS_WITH_AS(ft::read_hf_config(bad),
                         has("attention_dropout must be a number in [0, 1), got 1"),
                         ft::UsageError);
  }
}

TEST_CASE("rope: recipe keys, with and without model.from") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.file("shards"));
  auto write = [&](const std::string& name, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(tmp.file(name)).parent_path());
    std::ofstream(tmp.file(name)) << text;
    return tmp.file(name);
  };
  auto issues = [](const ft::RecipeResult& r) {
    std::string s;
    for (const ft::RecipeIssue& i : r.issues) s += i.format() + "\n";
    return s;
  };
  const std::string sizes =
      "model:\n  dim: 64\n  n_layers: 2\n  n_heads: 4\n  ffn_dim: 96\n  vocab_size: 101\n";
  const std::string data = "data: {train: " + tmp.file("shards") + ", seq_len: 16}\n";

  SUBCASE("llama3 in a recipe: all four factors, and the resolved recipe reads back") {
    const ft::RecipeResult r = ft::load_recipe(
        write("a.yaml", sizes +
                            "  rope_theta: 500000\n  rope_type: llama3\n  rope_factor: 8\n"
                            "  rope_low_freq_factor: 1\n  rope_high_freq_factor: 4\n"
                            "  rope_original_max_seq_len: 8192\n" +
                            data),
        {}, 1, false);
    INFO(issues(r));
    REQUIRE(r.ok());
    CHECK(r.recipe.model.rope_type == "llama3");
    CHECK(r.recipe.model.rope_original_max_seq_len == 8192);
    const ft::RecipeResult again =
        ft::load_recipe(write("again.yaml", ft::recipe_to_yaml(r.recipe)), {}, 1, false);
    INFO(issues(again));
    CHECK(again.ok());
    CHECK(again.recipe.model.rope_factor == 8.0);
    // A default recipe's resolved form (neutral factors written out) reads back too.
    const ft::RecipeResult plain = ft::load_recipe(write("plain.yaml", sizes + data), {}, 1, false);
    REQUIRE(plain.ok());
    CHECK(
        ft::load_recipe(write("plain2.yaml", ft::recipe_to_yaml(plain.recipe)), {}, 1, false).ok());
  }
  SUBCASE("missing factors, unused factors, a reversed band") {
    const ft::RecipeResult r = ft::load_recipe(
        write("b.yaml", sizes + "  rope_type: llama3\n  rope_low_freq_factor: 4\n" + data), {}, 1,
        false);
    const std::string all = issues(r);
    CHECK(all.find("model.rope_factor: is required when model.rope_type is llama3") !=
          std::string::npos);
    CHECK(all.find("model.rope_high_freq_factor: is required") != std::string::npos);
    CHECK(all.find("model.rope_original_max_seq_len: is required") != std::string::npos);
    const ft::RecipeResult u =
        ft::load_recipe(write("c.yaml", sizes + "  rope_factor: 8\n" + data), {}, 1, false);
    CHECK(issues(u).find("model.rope_factor: is set but model.rope_type default does not use "
                         "it") != std::string::npos);
    const ft::RecipeResult band = ft::load_recipe(
        write("d.yaml", sizes +
                            "  rope_type: llama3\n  rope_factor: 8\n"
                            "  rope_low_freq_factor: 4\n  rope_high_freq_factor: 2\n"
                            "  rope_original_max_seq_len: 64\n" +
                            data),
        {}, 1, false);
    CHECK(issues(band).find("model.rope_low_freq_factor 4 must be below "
                            "model.rope_high_freq_factor 2") != std::string::npos);
    // A base past the key's range (1e12) is refused by the range, before the check of its
    // inverse frequencies in fp32 (which a base within the range always passes).
    const ft::RecipeResult huge =
        ft::load_recipe(write("h.yaml", sizes + "  rope_theta: 1e300\n" + data), {}, 1, false);
    CHECK(issues(huge).find("model.rope_theta: 1e300 is out of range: must be in (0, "
                            "1000000000000]") != std::string::npos);
    const ft::RecipeResult yarn =
        ft::load_recipe(write("e.yaml", sizes + "  rope_type: yarn\n" + data), {}, 1, false);
    CHECK(issues(yarn).find("\"yarn\" is not one of default, linear, llama3") != std::string::npos);
  }
  SUBCASE("model.from: values and errors quote where config.json says it") {
    const std::string hf = tmp.file("hf");
    write("hf/config.json", config_json("\"rope_parameters\": {\"rope_theta\": 500000.0, " +
                                        std::string(kLlama3) + "}, \"attention_dropout\": 0.1"));
    write("hf/model.safetensors", "");  // validation checks only that the weights are there
    const std::string from = "model:\n  from: " + hf + "\n";
    const ft::RecipeResult ok = ft::load_recipe(write("f.yaml", from + data), {}, 1, false);
    INFO(issues(ok));
    REQUIRE(ok.ok());
    CHECK(ok.recipe.model.rope_type == "llama3");
    CHECK(ok.recipe.model.rope_theta == 500000.0);
    REQUIRE(ok.warnings.size() == 1);
    CHECK(ok.warnings[0].find("attention_dropout") != std::string::npos);

    const ft::RecipeResult bad = ft::load_recipe(
        write("g.yaml", from + "  rope_theta: 10000\n  rope_factor: 4\n" + data), {}, 1, false);
    const std::string all = issues(bad);
    CHECK(all.find("model.rope_theta = 10000 but " + hf +
                   "/config.json has rope_parameters.rope_theta = 500000") != std::string::npos);
    CHECK(all.find("model.rope_factor = 4 but " + hf +
                   "/config.json has rope_parameters.factor = 8") != std::string::npos);

    write("old/config.json", config_json(""));
    write("old/model.safetensors", "");
    const ft::RecipeResult absent = ft::load_recipe(
        write("h.yaml", "model:\n  from: " + tmp.file("old") + "\n  rope_theta: 500000\n" + data),
        {}, 1, false);
    CHECK(issues(absent).find("config.json has no rope_theta (transformers' default 10000)") !=
          std::string::npos);

    write("yarn/config.json",
          config_json("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"));
    const ft::RecipeResult yarn = ft::load_recipe(
        write("i.yaml", "model:\n  from: " + tmp.file("yarn") + "\n" + data), {}, 1, false);
    CHECK(issues(yarn).find("model.from: " + tmp.file("yarn") +
                            "/config.json: rope type \"yarn\" (rope_scaling.rope_type) is not "
                            "implemented") != std::string::npos);
  }
}

TEST_CASE("rope: ft export's config.json reads back as the same RoPE, in both formats") {
  TempDir tmp;
  ft::ModelConfig base;
  base.dim = 64;
  base.n_layers = 2;
  base.n_heads = 4;
  base.n_kv_heads = 2;
  base.ffn_dim = 96;
  base.vocab_size = 101;
  base.rope_theta = 500000.0;
  for (const char* type : {"default", "linear", "llama3"}) {
    CAPTURE(type);
    ft::ModelConfig m = base;
    m.rope_type = type;
    if (m.rope_type != "default") m.rope_factor = 8.0;
    if (m.rope_type == "llama3") {
      m.rope_low_freq_factor = 2.0;
      m.rope_high_freq_factor = 5.0;
      m.rope_original_max_seq_len = 4096;
    }
    const std::string dir = tmp.file(type);
    std::filesystem::create_directories(dir);
    ft::write_hf_config(m, ft::DType::kBF16, dir + "/config.json");
    const ft::ModelConfig back = ft::read_hf_config(dir);
    CHECK(back.rope_type == m.rope_type);
    CHECK(back.rope_theta == m.rope_theta);
    CHECK(back.rope_factor == m.rope_factor);
    CHECK(back.rope_low_freq_factor == m.rope_low_freq_factor);
    CHECK(back.rope_high_freq_factor == m.rope_high_freq_factor);
    CHECK(back.rope_original_max_seq_len == m.rope_original_max_seq_len);
    // transformers 4 reads rope_theta and rope_scaling, 5 rope_parameters: both are written.
    std::ifstream in(dir + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    CHECK(j.at("rope_theta") == 500000.0);
    CHECK(j.at("rope_parameters").at("rope_theta") == 500000.0);
    CHECK(j.at("rope_parameters").at("rope_type") == type);
    if (m.rope_type == "default")
      CHECK(j.at("rope_scaling").is_null());
    else
      CHECK(j.at("rope_scaling").at("factor") == 8.0);
  }
}

TEST_CASE("rope: a checkpoint resumes only with the same RoPE") {
  ft::ckpt::Manifest m;
  m.dir = "/ckpt/step_00000002";
  m.model.rope_type = "llama3";
  m.model.rope_factor = 8.0;
  ft::Recipe r;
  r.model = m.model;
  CHECK_NOTHROW(ft::check_same_model(m, r));
  r.model.rope_factor = 4.0;
  CHECK_THROWS_WITH_AS(ft::check_same_model(m, r),
                       has("model.rope_factor 8 in the checkpoint, 4 in the recipe"),
                       ft::UsageError);
  r.model = m.model;
  r.model.rope_type = "default";
  CHECK_THROWS_WITH_AS(ft::check_same_model(m, r),
                       has("model.rope_type llama3 in the checkpoint, default in the recipe"),
                       ft::UsageError);
  r.model = m.model;
  r.model.rope_theta = 500000.0;
  CHECK_THROWS_WITH_AS(ft::check_same_model(m, r),
                       has("model.rope_theta 10000 in the checkpoint, 500000 in the recipe"),
                       ft::UsageError);
}
