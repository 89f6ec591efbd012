// model/arch.h's table: each implemented family's config.json, as ft exports it, reads back as
// that family, and the layout holds exactly the tensors its flags name.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/hf.h"
#include "ckpt/hf_export.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/layout.h"
#include "temp_dir.h"

namespace {

bool layout_has(const ft::ParamLayout& layout, const std::string& name) {
  int g = 0;
  const ft::ParamEntry* e = nullptr;
  return layout.find(name, &g, &e);
}

}  // namespace

TEST_CASE("arch: names and classes are unique, lookups find each row") {
  int implemented = 0;
  for (const ft::ArchSpec& a : ft::arch_table()) {
    CAPTURE(a.name);
    CHECK(ft::find_arch(a.name) == &a);
    CHECK(ft::find_arch_by_class(a.hf_class) == &a);
    CHECK(ft::is_implemented_arch(a.name) == a.implemented);
    CHECK_FALSE((a.qkv_bias && a.qk_norm));  // first_family_with's hints assume one extra each
    implemented += a.implemented;
  }
  CHECK(implemented >= 4);
  CHECK(ft::find_arch("gemma") == nullptr);
  CHECK(ft::implemented_archs(&ft::ArchSpec::name) == "llama, qwen2, qwen3 or mistral");
  CHECK(ft::implemented_archs(&ft::ArchSpec::label, &ft::ArchSpec::qkv_bias) == "Qwen2");
}

TEST_CASE("arch: every implemented family's export reads back as it, with its tensors") {
  TempDir tmp;
  for (const ft::ArchSpec& a : ft::arch_table()) {
    if (!a.implemented) continue;
    CAPTURE(a.name);
    ft::ModelConfig m;
    m.arch = a.name;
    m.dim = 64;
    m.n_layers = 1;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.ffn_dim = 96;
    m.vocab_size = 101;
    m.max_seq_len = 128;
    const std::string dir = tmp.file(a.name);
    std::filesystem::create_directories(dir);
    ft::write_hf_config(m, ft::DType::kBF16, dir + "/config.json");
    std::ifstream in(dir + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    CHECK(j.at("architectures") == nlohmann::json::array({a.hf_class}));
    CHECK(j.at("model_type") == a.name);
    CHECK(j.contains("attention_bias") == a.attention_bias_key);
    CHECK(j.contains("mlp_bias") == a.mlp_bias_key);
    CHECK(j.contains("use_sliding_window") == (a.sliding_window == ft::SlidingWindowKeys::kSwitch));
    if (a.sliding_window != ft::SlidingWindowKeys::kNone) CHECK(j.at("sliding_window").is_null());

    const ft::ModelConfig back = ft::read_hf_config(dir);
    CHECK(back.arch == m.arch);
    CHECK(ft::head_dim_of(back) == ft::head_dim_of(m));

    const ft::ParamLayout layout(back, 1);
    const std::string attn = "model.layers.0.self_attn.";
    CHECK(layout_has(layout, attn + "q_proj.bias") == a.qkv_bias);
    CHECK(layout_has(layout, attn + "v_proj.bias") == a.qkv_bias);
    CHECK(layout_has(layout, attn + "q_norm.weight") == a.qk_norm);
    CHECK(layout_has(layout, attn + "k_norm.weight") == a.qk_norm);
  }
}
