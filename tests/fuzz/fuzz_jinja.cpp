// libFuzzer harness for the chat-template renderer (lib/data/jinja.h): a model folder's
// template is input ft did not write.
//
// Contract under test: any byte string as a template either throws jinja::TemplateError when
// parsed, or parses; a parsed template rendered on a small conversation either gives a string
// or throws TemplateError (raise_exception, a type error, a bound). Anything else (a crash, a
// sanitizer report, another exception type, a hang or a huge allocation) is a bug.
//
// Build and run (clang, from the repository root):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib \
//     tests/fuzz/fuzz_jinja.cpp lib/data/jinja*.cpp -o /tmp/fuzz_jinja
//   mkdir -p /tmp/jinja_corpus
//   /tmp/fuzz_jinja -max_total_time=300 /tmp/jinja_corpus tests/fuzz/corpus/jinja
#include <cstdint>
#include <string>

#include "data/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ft::jinja::Json;
  static const Json context = {
      {"messages", Json::array({Json{{"role", "system"}, {"content", "Be brief."}},
                                Json{{"role", "user"}, {"content", " Hi <think>x</think>"}},
                                Json{{"role", "assistant"}, {"content", "Hello 😀"}}})},
      {"add_generation_prompt", true},
      {"tools", nullptr},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    ft::jinja::Template t(text, "fuzz.jinja");
    // A smaller work bound than ft's keeps each input quick under the sanitizers.
    (void)t.render(context, 200000);
  } catch (const ft::jinja::TemplateError&) {
  }
  return 0;
}
