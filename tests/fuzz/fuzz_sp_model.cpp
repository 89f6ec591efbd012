// libFuzzer harness for the SentencePiece model reader of the Hugging Face export
// (lib/ckpt/hf_tokenizer.cpp; not part of the default build).
//
// Contract under test: any byte string either parses, and then the tokenizer files are written
// (or the model is reported unsupported), or throws ft::Error; anything else (a crash, a
// sanitizer report, another exception type such as a JSON error on a bad piece) is a bug. The
// reader takes the file's bytes, so the input goes to it directly, without a file.
//
// Build and run (clang, from the repository root):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib \
//     tests/fuzz/fuzz_sp_model.cpp lib/ckpt/hf_tokenizer.cpp -o /tmp/fuzz_sp_model
//   /tmp/fuzz_sp_model -max_total_time=300 -max_len=4096 /tmp/sp_corpus tests/fuzz/corpus/sp_model
// The seeds are small SentencePiece models (spm_train on a few lines; BPE and Unigram).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/hf_tokenizer.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const ft::SpModelInfo sp =
        ft::parse_sp_model(std::string(reinterpret_cast<const char*>(data), size), "fuzz.model");
    if (ft::unsupported_sp_settings(sp).empty()) {
      const std::string j = ft::hf_tokenizer_json(sp);
      if (j.empty()) std::abort();
    }
    (void)ft::hf_tokenizer_config_json(sp, 16);
    (void)ft::hf_special_tokens_map_json(sp);
  } catch (const ft::Error&) {
  }
  return 0;
}
