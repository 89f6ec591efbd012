// A byte-level BPE tokenizer.json made in code for the chat tests (tests/unit/test_chat.cpp,
// tests/fuzz/fuzz_chat.cpp), so that they need no trained file: the 256 bytes and a few merges
// (English pairs, "é" as one token), an NFC normalizer, Qwen2's split pattern then ByteLevel,
// and as added tokens the special tokens the committed chat templates write (special: true) and
// <think>, </think> (plain).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace chat_test {

// The byte-level text of raw bytes (GPT-2's bytes_to_unicode).
inline std::string byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) {
    uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      uint32_t n = 0;  // rank of b among the non-printable bytes
      for (uint32_t c = 0; c < b; ++c)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++n;
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

inline const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> t = {"<|endoftext|>",
                                             "<|im_start|>",
                                             "<|im_end|>",
                                             "<|begin_of_text|>",
                                             "<|start_header_id|>",
                                             "<|end_header_id|>",
                                             "<|eot_id|>",
                                             "<s>",
                                             "</s>",
                                             "[INST]",
                                             "[/INST]"};
  return t;
}

inline std::string tokenizer_json() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, char(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {" ", "t"}, {" t", "h"},  {"e", "r"},       {"a", "n"},
      {" ", "a"}, {"i", "n"},  {"o", "n"}, {"\n", "\n"}, {"\xC3", "\xA9"}, {"e", "s"},
      {" ", "s"}, {"s", "t"},  {"A", "n"}, {"w", "o"},   {"r", "d"},       {"wo", "rd"}};
  json m = json::array();
  int32_t id = 256;
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(byte_level(l + r))) vocab[byte_level(l + r)] = id++;
    m.push_back(json::array({byte_level(l), byte_level(r)}));
  }
  json added = json::array();
  auto add = [&](const std::string& content, bool special) {
    added.push_back({{"id", id++},
                     {"content", content},
                     {"special", special},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}});
  };
  for (const std::string& t : special_tokens()) add(t, true);
  add("<think>", false);
  add("</think>", false);
  const char* qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", qwen2}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", m}};
  return j.dump();
}

}  // namespace chat_test
