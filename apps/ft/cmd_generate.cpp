// ft generate SOURCE --prompt TEXT: text from a Hugging Face folder or an ft checkpoint
// (DESIGN.md §2). Loads the weights and tokenizer, renders the prompt (with --chat through the
// tokenizer's chat template), then runs model/decode.h's KvDecoder: the prompt in one pass, then
// one token at a time against the KV cache, greedy or sampled, until an end-of-sequence or
// end-of-turn token or --max-new-tokens. The text goes to stdout as it is made (or one JSON
// object with --json); what was loaded and the speed go to stderr. An adapter run's checkpoint
// generates with its LoRA adapter on its base, and --adapter applies a PEFT folder to an HF
// source (DESIGN.md §5 Adapters): the adapter's hooks in the decoder, nothing merged.
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "adapt/lora.h"
#include "adapt/peft.h"
#include "apps/ft/checkpoint_source.h"
#include "apps/ft/commands.h"
#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/hf_export.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/system.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "model/decode.h"
#include "model/layout.h"
#include "runtime/device.h"

namespace ft::app {
namespace {

namespace fs = std::filesystem;
using jinja::Json;

// Where the weights are: an HF folder (config.json) or a checkpoint step folder (manifest.json),
// or a checkpoint.dir, resolved to what its `latest` names.
struct Source {
  bool hf = false;
  std::string dir;
};

Source resolve_source(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(path + ": no such file or folder");
  if (!fs::is_directory(path, ec))
    throw UsageError(path +
                     ": not a folder; give a Hugging Face model folder (config.json) or an ft "
                     "checkpoint (a step folder, or checkpoint.dir)");
  if (fs::exists(fs::symlink_status(fs::path(path) / "config.json", ec))) return {true, path};
  if (is_checkpoint_path(path)) {
    std::string note;
    const std::string step = resolve_checkpoint(path, "generate from", &note);
    if (!note.empty()) std::fprintf(stderr, "ft generate: %s\n", note.c_str());
    return {false, step};
  }
  throw UsageError(path +
                   ": neither a Hugging Face model folder (no config.json) nor an ft checkpoint "
                   "(no manifest.json, latest or step_* folders)");
}

// The device --device names, in generate's words (make_device speaks of runtime.device and
// training). auto: the GPU when one is usable, else the CPU, saying why in one line.
std::unique_ptr<Device> make_generate_device(const std::string& spec) {
  const CudaBackend* cuda = cuda_backend();
  // Test support (runtime/guard_device.h): make_device stands it in for a GPU under "auto".
  const char* guard = std::getenv("FT_TEST_GUARD_DEVICE");
  if (spec == "auto" && guard && std::string(guard) == "1") return make_device("auto");
  if (spec == "cuda" && !cuda)
    throw UsageError(
        "--device cuda: this build of ft has no CUDA backend (configured with FT_CUDA=OFF or "
        "without nvcc); use --device cpu (or auto), or rebuild ft with the CUDA toolkit");
  if (spec == "cpu" || !cuda) return make_device("cpu");
  const std::string why = cuda->unusable_reason();
  if (why.empty()) return make_device("cuda");
  if (spec == "cuda")
    throw Error("--device cuda: no usable GPU here (" + why +
                "); use --device cpu (or auto) to generate on the CPU");
  std::fprintf(stderr, "ft generate: --device auto: generating on the CPU, no usable GPU (%s)\n",
               why.c_str());
  return make_device("cpu");
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  if (s == "f32") return DType::kF32;
  throw UsageError("--dtype '" + s + "': expected f32, bf16 or f16");
}

// Refuses, before anything is allocated, a model the CPU's memory cannot hold: its f32 weights,
// the host copy they are loaded through and a 16-bit compute copy (a GPU's memory is the
// backend's to report).
void check_memory(const ModelConfig& cfg, const Device& dev, DType dtype) {
  if (dev.name() != "cpu") return;
  const double params = double(ParamLayout(cfg).total_numel());
  const double need = params * (8.0 + (dtype == DType::kF32 ? 0.0 : 2.0));
  const double have = double(available_memory_bytes());
  if (have > 0 && need > have)
    throw Error(detail::concat(
        "the model's ", params / 1e9, "B parameters need about ", need / double(1 << 30),
        " GiB of memory to generate on the CPU (f32 weights and the copy they load through",
        dtype == DType::kF32 ? "" : ", and the 16-bit compute copy", "); ", have / double(1 << 30),
        " GiB are available here: use --device cuda, or a machine with more memory"));
}

// The model of `src` on `dev`, weights loaded, compute copy made. With an adapter (an adapter
// run's checkpoint, or --adapter's PEFT folder on an HF source) the model is built with its
// LoraConverter (`converters`, which must outlive the model: the hooks are its), the base's
// groups from the base (the checkpoint's: frozen.from or the seeded initialisation, as ft export
// --merge reads it), the adapter's from the checkpoint or the folder. convert_model installs the
// hooks before the values are uploaded, so its initialisation of A never reaches them.
std::unique_ptr<LlamaModel> load_model(const Source& src, const std::string& adapter_dir,
                                       Device* dev, DType dtype, ModelConverters& converters) {
  std::unique_ptr<LlamaModel> model;
  std::vector<std::vector<float>> host;
  if (src.hf) {
    // config.json against the tensors' names and shapes first: a config of the wrong sizes
    // (10^8 layers, a huge intermediate_size) is refused by name before it is allocated.
    const ModelConfig cfg = read_hf_config(src.dir);
    check_hf_folder(src.dir);
    check_memory(cfg, *dev, dtype);
    if (!adapter_dir.empty())
      converters.push_back(std::make_unique<LoraConverter>(read_peft_adapter_config(
          adapter_dir, cfg.tie_embeddings,
          "give --adapter a folder PEFT's save_pretrained (or ft export) wrote")));
    model = std::make_unique<LlamaModel>(cfg, dev, false, nullptr, StageSpec{}, dtype, &converters);
    host = model->flat_params().to_host();
    std::vector<float*> ptrs;
    for (auto& g : host) ptrs.push_back(g.data());
    load_hf_weights(src.dir, model->layout(), ptrs);
    if (!adapter_dir.empty()) load_peft_adapter(adapter_dir, model->layout(), ptrs);
  } else {
    const ckpt::Manifest m = ckpt::read_manifest(src.dir);
    check_memory(m.model, *dev, dtype);
    if (m.adapter.enabled()) {
      check_adapter_base(m, "ft generate");
      converters.push_back(std::make_unique<LoraConverter>(m.adapter));
    }
    model =
        std::make_unique<LlamaModel>(m.model, dev, false, nullptr, StageSpec{}, dtype, &converters);
    const ParamLayout full = ckpt::manifest_layout(m, 1);
    AdapterBase base(m, full);
    const auto& groups = model->layout().groups();
    for (size_t g = 0; g < groups.size(); ++g)
      host.push_back(m.adapter.enabled() && groups[g].attached_to < 0
                         ? base.group(int(g))
                         : ckpt::read_global_group(m, ckpt::State::kParam, int(g)));
  }
  for (const auto& c : converters) c->convert_model(*model, 0);
  model->flat_params().from_host(host);
  model->flat_params().make_compute_copy();
  return model;
}

// eos_token_id of a config.json or generation_config.json: a number or a list; absent: none.
// The file is checked before it is read (a FIFO or /dev/zero in its place is refused at once);
// a broken one is bad input (exit 2), as read_hf_config treats config.json.
void read_eos_ids(const fs::path& file, std::set<int32_t>& out) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return;
  const std::string hint = file.filename() == "config.json"
                               ? "restore it from the model's download"
                               : "restore it from the model's download, or delete it (it is "
                                 "optional)";
  const std::string text = read_bounded_file(file.string(), kMaxConfigBytes,
                                             "the model's " + file.filename().string(), hint);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(file.string() + ": not valid JSON (" + json_error_words(e) + "); " + hint);
  }
  if (!j.is_object() || !j.contains("eos_token_id")) return;
  const Json& e = j["eos_token_id"];
  const auto take = [&](const Json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      throw UsageError(file.string() +
                       ": eos_token_id: expected a token id (an integer from 0 to 2^31-1) or a "
                       "list of them, found " +
                       short_dump(v) + "; " + hint);
    out.insert(int32_t(v.get<int64_t>()));
  };
  if (e.is_array())
    for (const Json& v : e) take(v);
  else if (!e.is_null())
    take(e);
}

std::string json_ids(const std::vector<int32_t>& ids) {
  Json a = Json::array();
  for (int32_t i : ids) a.push_back(i);
  return a.dump();
}

// The end of `s` is an incomplete UTF-8 sequence (decoded so far as U+FFFD by some tokenizers):
// wait for the next token before printing it.
bool ends_incomplete(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// ids the tokenizer can decode: a model's vocabulary may be larger than its tokenizer's (padded
// to a multiple of 64 or 128, as Qwen's), and an id past the tokenizer's has no text.
std::vector<int32_t> decodable(const std::vector<int32_t>& ids, const Tokenizer& tok,
                               size_t* dropped) {
  std::vector<int32_t> out;
  for (int32_t id : ids)
    if (id >= 0 && id < tok.vocab_size()) out.push_back(id);
  if (dropped) *dropped = ids.size() - out.size();
  return out;
}

}  // namespace

int cmd_generate(const GenerateArgs& a) {
  // main.cpp's validators bound the flags (DESIGN.md §4); the Sampler checks its own again.
  if (a.max_new_tokens < 1 || a.max_new_tokens > kMaxNewTokens)
    throw UsageError("--max-new-tokens " + std::to_string(a.max_new_tokens) +
                     ": must be from 1 to " + std::to_string(kMaxNewTokens));
  Sampler sampler(a.temperature, a.top_p, a.seed);
  const Source src = resolve_source(a.source);
  if (!a.adapter.empty()) {
    if (!src.hf)
      throw UsageError("--adapter " + a.adapter + ": " + a.source +
                       " is an ft checkpoint, which brings its own adapter when its run trained "
                       "one; give --adapter with a Hugging Face base model folder");
    std::error_code ec;
    if (!fs::is_directory(a.adapter, ec))
      throw UsageError("--adapter " + a.adapter + ": " + file_kind(a.adapter) +
                       ", not a folder; give a PEFT adapter folder (adapter_config.json, "
                       "adapter_model.safetensors)");
  }
  std::unique_ptr<Device> dev = make_generate_device(a.device);
  const std::string tok_path = a.tokenizer.empty() ? src.dir : a.tokenizer;
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(tok_path);
  } catch (const Error& e) {
    throw UsageError(std::string(e.what()) +
                     (a.tokenizer.empty() ? " (hint: name one with --tokenizer PATH)" : ""));
  }

  std::vector<int32_t> prompt;
  std::set<int32_t> stop_ids;
  std::set<int32_t> turn_ids;
  if (a.chat) {
    // A checkpoint keeps the tokenizer folder's tokenizer_config.json and chat_template.jinja
    // beside its tokenizer.json (ckpt/checkpoint.h), where that folder had them.
    std::error_code ec;
    if (!src.hf && a.tokenizer.empty() &&
        !fs::is_regular_file(fs::path(src.dir) / "tokenizer_config.json", ec) &&
        !fs::is_regular_file(fs::path(src.dir) / "chat_template.jinja", ec))
      throw UsageError(
          "--chat: a checkpoint holds no chat template; give --tokenizer the Hugging Face "
          "folder whose tokenizer_config.json or chat_template.jinja has it");
    const ChatTemplate t = load_chat_template(tok_path);
    Json messages = Json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
    messages.push_back({{"role", "user"}, {"content", a.prompt}});
    prompt = tok->encode(render_chat(t, messages, /*add_generation_prompt=*/true));
    turn_ids = end_of_turn_ids(t, *tok);
  } else {
    if (!a.system.empty()) throw UsageError("--system needs --chat");
    if (tok->bos_id() >= 0 && !a.no_bos) prompt.push_back(tok->bos_id());
    const std::vector<int32_t> text = tok->encode(a.prompt);
    prompt.insert(prompt.end(), text.begin(), text.end());
  }
  if (prompt.empty()) throw UsageError("--prompt: the prompt has no tokens (give some text)");
  if (!a.ignore_eos) {
    if (tok->eos_id() >= 0) stop_ids.insert(tok->eos_id());
    if (src.hf) {
      read_eos_ids(fs::path(src.dir) / "generation_config.json", stop_ids);
      read_eos_ids(fs::path(src.dir) / "config.json", stop_ids);
    }
    stop_ids.insert(turn_ids.begin(), turn_ids.end());
  }

  const auto t0 = std::chrono::steady_clock::now();
  ModelConverters converters;  // outlives the model: the adapter's hooks are its
  std::unique_ptr<LlamaModel> model =
      load_model(src, a.adapter, dev.get(), parse_dtype(a.dtype), converters);
  const ModelConfig& cfg = model->config();
  if (int64_t(prompt.size()) >= cfg.max_seq_len)
    throw UsageError("--prompt: " + std::to_string(prompt.size()) +
                     " tokens leave no room under the model's max_seq_len " +
                     std::to_string(cfg.max_seq_len));
  if (tok->vocab_size() > cfg.vocab_size)
    throw UsageError(tok->path() + ": the tokenizer's " + std::to_string(tok->vocab_size()) +
                     " ids exceed the model's vocab_size " + std::to_string(cfg.vocab_size) +
                     " (hint: a tokenizer of another model? name the right one with --tokenizer)");
  const int max_len =
      int(std::min<int64_t>(cfg.max_seq_len, int64_t(prompt.size()) + a.max_new_tokens));
  std::unique_ptr<KvDecoder> cache;
  try {
    cache = std::make_unique<KvDecoder>(*model, max_len);
  } catch (const Error& e) {
    // The allocator's own hint speaks of training (micro_batch_size, seq_len): keep its reason.
    const std::string why = std::string(e.what()).substr(0, std::string(e.what()).find("; "));
    throw Error("cannot hold the KV cache and activations of " + std::to_string(max_len) +
                " positions (a prompt of " + std::to_string(prompt.size()) +
                " tokens and --max-new-tokens " + std::to_string(a.max_new_tokens) + "): " + why +
                "; give a smaller --max-new-tokens");
  }
  KvDecoder& decoder = *cache;
  std::fprintf(stderr, "ft generate: %s (%s, %d layers, dim %d) on %s, %s, prompt %zu tokens\n",
               src.dir.c_str(), cfg.arch.c_str(), cfg.n_layers, cfg.dim, dev->name().c_str(),
               a.dtype.c_str(), prompt.size());
  const auto t1 = std::chrono::steady_clock::now();

  std::vector<int32_t> out;
  std::string printed, stop = "length";
  const std::vector<float>* logits = &decoder.forward(prompt.data(), int(prompt.size()));
  while (true) {
    const int32_t id = sampler.next(*logits);
    out.push_back(id);
    if (stop_ids.count(id)) {
      stop = turn_ids.count(id) ? "end_of_turn" : "eos";
      break;
    }
    if (!a.json) {
      const std::string text = tok->decode(decodable(out, *tok, nullptr));
      if (text.compare(0, printed.size(), printed) == 0 && !ends_incomplete(text)) {
        std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
        std::fflush(stdout);
        printed = text;
      }
    }
    if (int(out.size()) >= a.max_new_tokens) break;
    if (decoder.pos() >= max_len) break;  // the model's max_seq_len
    logits = &decoder.forward(&id, 1);
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::vector<int32_t> text_ids = out;
  if (stop != "length") text_ids.pop_back();  // the stop token is not part of the text
  size_t dropped = 0;
  const std::string text = tok->decode(decodable(text_ids, *tok, &dropped));
  if (dropped)
    std::fprintf(stderr,
                 "ft generate: %zu generated id%s past the tokenizer's vocabulary (%lld ids) "
                 "have no text\n",
                 dropped, dropped == 1 ? "" : "s", (long long)tok->vocab_size());
  if (a.json) {
    Json j = Json::object();
    j["prompt_ids"] = Json::parse(json_ids(prompt));
    j["ids"] = Json::parse(json_ids(out));
    j["text"] = text;
    j["stop"] = stop;
    std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    if (text.compare(0, printed.size(), printed) == 0)
      std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
    else
      std::fwrite(text.data(), 1, text.size(), stdout);  // the decoding changed: all of it
    std::printf("\n");
  }
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr,
               "ft generate: %zu new tokens in %.3f s (%.1f tokens/s; loading %.2f s), stopped: "
               "%s\n",
               out.size(), gen_s, gen_s > 0 ? double(out.size()) / gen_s : 0.0, load_s,
               stop == "length"
                   ? (int(out.size()) >= a.max_new_tokens ? "--max-new-tokens" : "max_seq_len")
                   : stop.c_str());
  return 0;
}

}  // namespace ft::app
