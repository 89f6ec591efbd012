// libFuzzer harness for chat data at the conversation level (lib/data/chat.h): a JSONL record
// through parse_jsonl_line and conversation_from_record, then the mask computation of ft
// tokenize --format chat on one of the committed templates (or a template from the input), with
// a byte-level BPE tokenizer made in code (tests/unit/chat_tokenizer.h: NFC, the special tokens
// of the templates).
//
// Contract under test: any input either is refused with ft::UsageError (not JSON, not a
// conversation, a template outside the subset, a template that raises or takes too long), or
// gives the tokens and mask of tokenize_chat, which equal tokenize_chat_reference's (the rule's
// renderings made in full): the masks from one varied rendering are the rule's on every
// conversation tried. A difference, a crash, a sanitizer report, another exception type, a hang
// (libFuzzer's -timeout) or a huge allocation is a bug.
//
// Input: byte 0 chooses, by its value mod 8: 0-4 a committed template (Llama 3, Llama 3.1,
// Qwen2.5, Qwen3, Mistral v0.3) and a `chat` record; 5 an `alpaca` record on template
// (byte 0 / 8) mod 5; 6-7 a template from the input: "TEMPLATE\n---\nRECORD". The rest is the
// record (one JSONL line). Seeds (tests/fuzz/corpus/chat/) start with an ASCII digit for that.
//
// Run: scripts/fuzz.sh 60 chat
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "../unit/chat_tokenizer.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"

namespace {

using ft::jinja::Json;

struct Setup {
  std::unique_ptr<ft::Tokenizer> tok;
  std::vector<std::unique_ptr<ft::ChatTemplate>> templates;
  Json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};

  Setup() {
    std::string dir = (std::filesystem::temp_directory_path() / "ft_fuzz_chat_XXXXXX").string();
    if (!::mkdtemp(dir.data())) std::abort();
    const std::string file = dir + "/tokenizer.json";
    std::ofstream(file) << chat_test::tokenizer_json();
    tok = ft::load_tokenizer(file);
    std::filesystem::remove_all(dir);
    for (const char* name :
         {"llama3_instruct.jinja", "llama3_1_instruct.jinja", "qwen2_5_instruct.jinja",
          "qwen3.jinja", "mistral_instruct_v0_3.jinja"}) {
      std::ifstream in(std::string(FT_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
      if (!in) std::abort();
      std::ostringstream s;
      s << in.rdbuf();
      templates.push_back(std::make_unique<ft::ChatTemplate>(
          ft::ChatTemplate{ft::jinja::Template(s.str(), name), name, special}));
    }
  }
};

bool is_step_limit(const std::string& e) { return e.find(" steps") != std::string::npos; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Setup setup;
  if (size == 0) return 0;
  const int kind = data[0] % 8;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::unique_ptr<ft::ChatTemplate> own;
  const ft::ChatTemplate* t = nullptr;
  bool alpaca = false;
  if (kind <= 4) {
    t = setup.templates[size_t(kind)].get();
  } else if (kind == 5) {
    t = setup.templates[size_t(data[0] / 8 % 5)].get();
    alpaca = true;
  } else {
    const size_t sep = rest.find("\n---\n");
    if (sep == std::string::npos) return 0;
    try {
      own = std::make_unique<ft::ChatTemplate>(ft::ChatTemplate{
          ft::jinja::Template(rest.substr(0, sep), "fuzz.jinja"), "fuzz.jinja", setup.special});
    } catch (const ft::jinja::TemplateError&) {
      return 0;
    }
    t = own.get();
    rest = rest.substr(sep + 5);
  }

  Json messages;
  try {
    const Json record = ft::parse_jsonl_line(rest, "fuzz.jsonl:1");
    if (!record.is_object()) return 0;
    messages = ft::conversation_from_record(record, alpaca, "fuzz.jsonl:1");
  } catch (const ft::UsageError&) {
    return 0;
  }

  ft::ChatTokens fast, reference;
  std::string fast_error, reference_error;
  try {
    fast = ft::tokenize_chat(*t, *setup.tok, messages);
  } catch (const ft::UsageError& e) {
    fast_error = e.what();
  }
  try {
    reference = ft::tokenize_chat_reference(*t, *setup.tok, messages);
  } catch (const ft::UsageError& e) {
    reference_error = e.what();
  }
  // The same error, or the same tokens and mask. Only the bound on steps may differ: a
  // rendering the reference makes in full counts a few steps more or less than the shadow of
  // the same alternative (strings of another length), so near the bound one may stop where the
  // other does not.
  if (!fast_error.empty() || !reference_error.empty()) {
    if (fast_error == reference_error) return 0;
    if (is_step_limit(fast_error) || is_step_limit(reference_error)) return 0;
    std::fprintf(stderr, "fuzz_chat: errors differ:\n  fast      %s\n  reference %s\n",
                 fast_error.c_str(), reference_error.c_str());
    std::abort();
  }
  if (fast.ids != reference.ids || fast.mask != reference.mask ||
      fast.content_tokens != reference.content_tokens) {
    std::fprintf(stderr, "fuzz_chat: the masks from one varied rendering differ from the rule's\n");
    std::abort();
  }
  return 0;
}
