// The recipe schema: the one place recipe keys are defined (DESIGN.md §5).
//
// The schema table (schema() below) names each key's path, type, range or choices, whether it is
// required, its Hugging Face name, and a line of doc. Parsing (load.cpp), range checks,
// did-you-mean suggestions, model.from agreement (validate_inputs.cpp) and recipe_to_yaml (below)
// are all driven by it, so adding a key is adding one row (plus its field in recipe.h, which
// holds the default value). Also here: the lookups into the table and how values are written.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include "model/arch.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"

namespace ft {
namespace recipe_internal {
namespace {

// More threads than any machine has cores; beyond it OpenMP and OpenBLAS fail to start them.
constexpr int kMaxThreads = 1024;
// The largest fp16 loss scale a recipe may ask for: 2^32, Megatron's initial scale and the
// largest in common use. fp16 tops out at 65504, so the first steps at such a scale overflow
// and halve it; a larger one only adds skipped steps.
constexpr double kMaxLossScale = 4294967296.0;
// Upper bounds of the sizes (DESIGN.md §5: every number has a range): each far above any real
// model or run (Llama 3 405B: dim 16384, 126 layers, 128 heads, ffn 53248, vocab 128256; a
// million-token context), and low enough that products of them stay well inside int64.
constexpr double kMaxWidth = 1 << 20;  // dim, ffn_dim, head_dim
constexpr double kMaxLayers = 100000;  // as ft plan's own bound
constexpr double kMaxHeads = 1 << 16;
constexpr double kMaxVocab = 1 << 26;   // 67M tokens
constexpr double kMaxTokens = 1 << 26;  // seq_len, max_seq_len
constexpr double kMaxBatch = 1 << 24;   // samples
constexpr double kMaxSteps = 1e15;      // steps and step intervals
constexpr double kMaxRanks = 1 << 20;   // tensor, pipeline
constexpr double kMaxMinutes = 525600;  // a year

Range between(double lo, double hi) { return Range{lo, hi, false, false}; }
Range from_until(double lo, double hi) { return Range{lo, hi, false, true}; }  // [lo, hi)

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
Value to_value(const Names& v) { return v; }
Value to_value(const OptimizerConfig& o) { return Betas{o.beta1, o.beta2}; }

void assign(int& f, const Value& v) { f = int(std::get<int64_t>(v)); }
void assign(int64_t& f, const Value& v) { f = std::get<int64_t>(v); }
void assign(uint64_t& f, const Value& v) { f = std::get<uint64_t>(v); }
void assign(double& f, const Value& v) { f = std::get<double>(v); }
void assign(bool& f, const Value& v) { f = std::get<bool>(v); }
void assign(std::string& f, const Value& v) { f = std::get<std::string>(v); }
void assign(Names& f, const Value& v) { f = std::get<Names>(v); }
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

// model.arch's choices: every row of model/arch.h's table (validation refuses the unimplemented).
std::vector<std::string> arch_names() {
  std::vector<std::string> names;
  for (const ArchSpec& a : arch_table()) names.emplace_back(a.name);
  return names;
}

#define FT_KEY(section, key, kind, doc, ...)                                         \
  row(                                                                               \
      #section "." #key, Kind::kind, [](auto& r) -> auto& { return r.section.key; }, \
      doc __VA_OPT__(, ) __VA_ARGS__)

}  // namespace

// Every recipe key, in the order recipe_to_yaml writes them. Defaults live in recipe.h.
const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = [] {
    const Opts steps{.range = between(0, kMaxSteps)};
    std::vector<KeySpec> t = {
        FT_KEY(run, name, kString, "name of the run; output_dir defaults to runs/<name>"),
        FT_KEY(run, output_dir, kString,
               "metrics, checkpoints and resolved recipe (default runs/<run.name>)"),
        FT_KEY(run, seed, kUInt64, "seeds initialisation and data shuffling"),

        FT_KEY(model, arch, kChoice, "model family (with model.from: from config.json)",
               {.choices = arch_names(), .hf_name = "architectures"}),
        FT_KEY(model, from, kDir,
               "Hugging Face folder to start from; sizes then come from its config.json"),
        FT_KEY(
            model, dim, kInt, "hidden size",
            {.range = between(1, kMaxWidth), .need = Need::kUnlessFrom, .hf_name = "hidden_size"}),
        FT_KEY(model, n_layers, kInt, "transformer blocks",
               {.range = between(1, kMaxLayers),
                .need = Need::kUnlessFrom,
                .hf_name = "num_hidden_layers"}),
        FT_KEY(model, n_heads, kInt, "attention heads",
               {.range = between(1, kMaxHeads),
                .need = Need::kUnlessFrom,
                .hf_name = "num_attention_heads"}),
        FT_KEY(model, n_kv_heads, kInt,
               "key/value heads, for grouped-query attention (default n_heads)",
               {.range = between(1, kMaxHeads), .hf_name = "num_key_value_heads"}),
        FT_KEY(model, head_dim, kInt, "channels per attention head; 0: dim / n_heads",
               {.range = between(0, kMaxWidth), .hf_name = "head_dim"}),
        FT_KEY(model, ffn_dim, kInt, "MLP hidden size",
               {.range = between(1, kMaxWidth),
                .need = Need::kUnlessFrom,
                .hf_name = "intermediate_size"}),
        FT_KEY(
            model, vocab_size, kInt, "vocabulary size",
            {.range = between(1, kMaxVocab), .need = Need::kUnlessFrom, .hf_name = "vocab_size"}),
        FT_KEY(model, max_seq_len, kInt, "longest sequence the model takes",
               {.range = between(1, kMaxTokens), .hf_name = "max_position_embeddings"}),
        FT_KEY(model, rope_theta, kFloat, "RoPE base",
               {.range = Range{0, 1e12, true, false}, .hf_name = "rope_theta"}),
        // The RoPE scaling of transformers' rope_parameters (model/rope.h has the formulas).
        FT_KEY(model, rope_type, kChoice, "RoPE scaling: default (none), linear or llama3",
               {.choices = {"default", "linear", "llama3"}, .hf_name = "rope_type"}),
        FT_KEY(model, rope_factor, kFloat, "linear, llama3: how much the context is stretched",
               {.range = Range{0, 1e6, true, false}, .hf_name = "factor"}),
        FT_KEY(model, rope_low_freq_factor, kFloat, "llama3: low_freq_factor",
               {.range = Range{0, 1e6, true, false}, .hf_name = "low_freq_factor"}),
        FT_KEY(model, rope_high_freq_factor, kFloat, "llama3: high_freq_factor",
               {.range = Range{0, 1e6, true, false}, .hf_name = "high_freq_factor"}),
        FT_KEY(model, rope_original_max_seq_len, kInt,
               "llama3: context length of pretraining (original_max_position_embeddings)",
               {.range = between(1, kMaxTokens), .hf_name = "original_max_position_embeddings"}),
        FT_KEY(model, norm_eps, kFloat, "RMSNorm epsilon",
               {.range = Range{0, 1, true, false}, .hf_name = "rms_norm_eps"}),
        FT_KEY(model, tie_embeddings, kBool, "share the embedding and output matrices",
               {.hf_name = "tie_word_embeddings"}),
        FT_KEY(model, init_std, kFloat, "std of the random initialisation (without model.from)",
               {.range = Range{0, 10, true, false}}),

        // The adapter trained on a frozen base, with PEFT LoraConfig's meanings (adapt/config.h).
        // recipe_to_yaml writes this section only when adapter.type is not none. alpha's bound
        // is far above the 8 to 256 in use, as the other bounds are above real models.
        FT_KEY(adapter, type, kChoice,
               "none: every parameter trains; lora: a LoRA adapter on the frozen base; qlora: "
               "LoRA on a base whose blocks are held in NF4 (QLoRA)",
               {.choices = {"none", "lora", "qlora"}}),
        FT_KEY(adapter, r, kInt, "rank of the adapter's matrices", {.range = between(1, 4096)}),
        FT_KEY(adapter, alpha, kFloat,
               "lora_alpha: the update is scaled by alpha / r (alpha / sqrt(r) with use_rslora)",
               {.range = Range{0, 1e6, true, false}}),
        FT_KEY(adapter, dropout, kFloat,
               "lora_dropout: dropout on the adapter's input, in training only",
               {.range = from_until(0, 1)}),
        FT_KEY(adapter, target_modules, kNames,
               "linear layers adapted, by HF name (q_proj ... down_proj), or [all-linear]",
               {.choices = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj", "all-linear"}}),
        FT_KEY(adapter, use_rslora, kBool, "rsLoRA: scale by alpha / sqrt(r) instead of alpha / r"),
        FT_KEY(adapter, init, kChoice,
               "A's initialisation (B starts at zero): kaiming uniform (PEFT's default) or "
               "gaussian N(0, 1/r)",
               {.choices = {"kaiming", "gaussian"}}),
        FT_KEY(adapter, from, kDir,
               "PEFT adapter folder to continue (adapter_config.json, adapter_model.safetensors)"),
        FT_KEY(adapter, modules_to_save, kNames,
               "modules trained whole beside the adapter (PEFT's modules_to_save; tied "
               "embeddings: either trains the shared table)",
               {.choices = {"embed_tokens", "lm_head"}}),

        FT_KEY(tokenizer, path, kTokenizer,
               "SentencePiece .model, tokenizer.json, or a Hugging Face folder (optional)"),

        FT_KEY(data, train, kDir, "folder of training shards (*.h5)", {.need = Need::kRequired}),
        FT_KEY(data, valid, kDir, "folder of validation shards (optional)"),
        FT_KEY(data, seq_len, kInt, "tokens per sample", {.range = between(1, kMaxTokens)}),
        FT_KEY(data, shuffle, kBool, "shuffle samples each epoch (seeded by run.seed)"),
        FT_KEY(data, prefetch, kInt, "batches the background loader keeps ready",
               {.range = between(1, 64)}),
        FT_KEY(data, pack, kBool,
               "pack whole documents into each window; attention and positions stay per document"),
        FT_KEY(data, pack_overflow, kChoice,
               "with data.pack, a document longer than a window: split into pieces, or drop",
               {.choices = {"split", "drop"}}),

        FT_KEY(training, objective, kChoice,
               "sft: next-token loss on the trained targets; dpo: preference pairs (dpo:)",
               {.choices = {"sft", "dpo"}}),
        FT_KEY(training, steps, kInt64,
               "optimizer steps (0: only load/initialise and save a checkpoint)", steps),
        FT_KEY(training, micro_batch_size, kInt, "samples per data rank per micro-step",
               {.range = between(1, kMaxBatch)}),
        FT_KEY(training, global_batch_size, kInt, "samples per optimizer step",
               {.range = between(1, kMaxBatch)}),
        FT_KEY(training, precision, kChoice, "compute precision",
               {.choices = {"fp32", "bf16", "fp16"}}),
        FT_KEY(training, grad_clip, kFloat, "max global gradient norm; 0 disables clipping",
               {.range = between(0, 1e9)}),
        FT_KEY(training, activation_checkpointing, kBool, "recompute activations in backward"),
        FT_KEY(training, loss_chunk_tokens, kInt,
               "the output projection and cross-entropy run over chunks of this many tokens, so "
               "the (tokens x vocabulary) logits never exist whole; 0: one chunk",
               {.range = between(0, kMaxTokens)}),
        FT_KEY(training, eval_every_steps, kInt64, "evaluate on data.valid every N steps; 0: never",
               steps),
        FT_KEY(training, eval_batches, kInt64, "global batches per evaluation",
               {.range = between(1, kMaxSteps)}),
        // fp16 loss scaling (optim/loss_scaler.h has the rules). Scales are powers of two
        // (check_loss_scaling) up to kMaxLossScale.
        FT_KEY(training, loss_scale, kFloat,
               "fp16: 0 = dynamic loss scaling; N > 0 = static scale N (a power of two)",
               {.range = between(0, kMaxLossScale)}),
        FT_KEY(training, loss_scale_window, kInt64,
               "fp16 dynamic scaling: clean steps before the scale doubles",
               {.range = between(1, kMaxSteps)}),
        FT_KEY(training, initial_loss_scale, kFloat,
               "fp16 dynamic scaling: first scale, a power of two (2^initial_scale_power)",
               {.range = Range{0, kMaxLossScale, true, false}}),
        FT_KEY(training, min_loss_scale, kFloat,
               "fp16 dynamic scaling: lowest scale (a power of two); an overflow at it stops",
               {.range = Range{0, kMaxLossScale, true, false}}),
        FT_KEY(training, loss_scale_hysteresis, kInt,
               "fp16 dynamic scaling: overflows before the scale halves (DeepSpeed hysteresis)",
               {.range = between(1, 1000000)}),
        FT_KEY(training, max_skipped_steps, kInt64,
               "fp16: consecutive steps skipped for overflow that stop the run (exit 1)",
               {.range = between(1, kMaxSteps)}),

        // Direct Preference Optimization (train/dpo.h). recipe_to_yaml writes this section only
        // with training.objective dpo.
        FT_KEY(dpo, beta, kFloat,
               "the weight of the KL penalty to the reference: rewards are beta * (log p - log "
               "p_ref)",
               {.range = Range{0, 1e3, true, false}}),
        FT_KEY(dpo, loss, kChoice,
               "sigmoid: DPO's -log sigmoid(beta * margin); ipo: (margin - 1 / (2 beta))^2; "
               "hinge: relu(1 - beta * margin)",
               {.choices = {"sigmoid", "ipo", "hinge"}}),
        FT_KEY(dpo, label_smoothing, kFloat,
               "sigmoid: the chance a pair's preference is flipped (conservative DPO)",
               {.range = from_until(0, 0.5)}),
        FT_KEY(dpo, reference, kChoice,
               "initial: the model at step 0, its log-probabilities computed once before step 1; "
               "base: the frozen base with the adapter off (with an adapter)",
               {.choices = {"initial", "base"}}),

        FT_KEY(optimizer, name, kChoice, "optimizer", {.choices = {"adamw"}}),
        FT_KEY(optimizer, lr, kFloat, "peak learning rate", {.range = Range{0, 1e10, true, false}}),
        row("optimizer.betas", Kind::kBetas, [](auto& r) -> auto& { return r.optimizer; },
            "AdamW [beta1, beta2]", {.range = from_until(0, 1)}),
        FT_KEY(optimizer, eps, kFloat, "AdamW epsilon", {.range = Range{0, 1, true, false}}),
        FT_KEY(optimizer, weight_decay, kFloat, "decoupled weight decay (matrices only)",
               {.range = between(0, 100)}),

        FT_KEY(scheduler, name, kChoice, "learning-rate schedule after warmup",
               {.choices = {"constant", "linear", "cosine"}}),
        FT_KEY(scheduler, warmup_steps, kInt64, "linear warmup steps", steps),
        FT_KEY(scheduler, min_lr, kFloat, "final learning rate of linear and cosine",
               {.range = between(0, 10)}),

        FT_KEY(parallel, tensor, kInt, "tensor-parallel ranks", {.range = between(1, kMaxRanks)}),
        FT_KEY(parallel, pipeline, kInt, "pipeline stages", {.range = between(1, kMaxRanks)}),
        FT_KEY(parallel, zero_stage, kInt, "ZeRO stage over the data group",
               {.range = between(0, 3)}),
        FT_KEY(parallel, overlap_comm, kBool,
               "reduce each group's gradient as soon as it is final, while the backward goes "
               "on (the same bits as off)"),
        FT_KEY(parallel, overlap_update, kBool,
               "run AdamW on a stream of its own, each group's update under the next step's "
               "forward of the groups before it (GPU; ZeRO stage 0 without offload; the same "
               "bits as off)"),
        FT_KEY(parallel, reduce_bucket_mb, kFloat,
               "largest gradient reduction call, MiB of fp32 (a larger group: several calls); "
               "1 KiB (0.0009765625) to 1 TiB",
               {.range = between(1.0 / 1024, 1 << 20)}),
        FT_KEY(parallel, prefetch_blocks, kInt,
               "ZeRO-3: parameter groups gathered ahead of use, while the current one computes",
               {.range = between(0, 8)}),
        FT_KEY(parallel, reduce_dtype, kChoice,
               "what the data group's gradient reductions move and sum in (bf16: half the bytes; "
               "NCCL only)",
               {.choices = {"fp32", "bf16"}}),
        FT_KEY(parallel, offload_optimizer, kChoice,
               "cpu: this rank's fp32 master weights, gradients and AdamW moments in host memory "
               "(page-locked), the update on the host's cores (a GPU run; ZeRO-Offload)",
               {.choices = {"none", "cpu"}}),
        FT_KEY(parallel, offload_params, kChoice,
               "cpu (zero_stage 3, with offload_optimizer: cpu): this rank's parameter shards in "
               "host memory too; each layer copied to the GPU when gathered, "
               "parallel.prefetch_blocks ahead",
               {.choices = {"none", "cpu"}}),

        FT_KEY(checkpoint, dir, kString,
               "checkpoint folder (default <run.output_dir>/checkpoints)"),
        FT_KEY(checkpoint, every_steps, kInt64, "save every N steps; 0: off", steps),
        FT_KEY(checkpoint, every_minutes, kFloat, "save every N minutes; 0: off",
               {.range = between(0, kMaxMinutes)}),
        FT_KEY(checkpoint, keep_last, kInt, "complete checkpoints kept",
               {.range = between(1, 1000000)}),
        FT_KEY(checkpoint, async, kBool, "write checkpoints in the background"),
        FT_KEY(checkpoint, overwrite, kBool,
               "with --resume never: delete the checkpoints already in checkpoint.dir"),

        FT_KEY(logging, every_steps, kInt64, "log metrics every N steps",
               {.range = between(1, kMaxSteps)}),
        FT_KEY(logging, metrics, kString,
               "JSON Lines metrics file (default <run.output_dir>/metrics.jsonl)"),
        FT_KEY(logging, peak_tflops, kFloat,
               "one device's dense peak TFLOP/s, for the metrics' mfu (0: NVIDIA GPUs' from "
               "ft's table; the CPU has none)",
               {.range = between(0, 1e6)}),
        FT_KEY(logging, tensorboard, kString,
               "folder of TensorBoard event files, the metrics as scalar series (tensorboard "
               "--logdir DIR); empty: none"),

        FT_KEY(runtime, device, kChoice, "auto: CUDA when present, else CPU",
               {.choices = {"auto", "cpu", "cuda"}}),
        FT_KEY(runtime, threads, kInt, "CPU threads; 0: all cores",
               {.range = between(0, kMaxThreads)}),
        FT_KEY(runtime, collective_timeout_s, kFloat,
               "end the job (exit 3) when a step's collective waits this long; 0: never",
               {.range = between(0, kMaxMinutes * 60)}),
        FT_KEY(runtime, communicator, kChoice,
               "device memory between ranks: auto (NCCL between GPUs when built with it, else "
               "MPI through host memory) | nccl | mpi",
               {.choices = {"auto", "nccl", "mpi"}}),
        FT_KEY(runtime, tf32, kBool,
               "CUDA fp32 GEMMs may round inputs to TF32 (faster, ~1e-3 relative); off: exact "
               "fp32"),
        FT_KEY(runtime, gemm_algos, kChoice,
               "CUDA GEMM algorithms: heuristic (cuBLASLt's first) | measure (the fastest of its "
               "candidates, timed on a shape's first call and kept in output_dir/gemm_algos/ "
               "for a resume)",
               {.choices = {"heuristic", "measure"}}),
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
      std::string out = "[";  // appended, as below: GCC 12 warns (-Wrestrict) on "[" + ...
      out += format_double(b[0]);
      out += ", ";
      out += format_double(b[1]);
      return out + "]";
    }
    std::string operator()(const Names& n) const {
      std::string out = "[";  // appended, not "[" + ...: GCC 12 warns (-Wrestrict) on the sum
      out += join(n, ", ");
      return out + "]";
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

}  // namespace recipe_internal

using recipe_internal::Betas;
using recipe_internal::format_double;
using recipe_internal::format_value;
using recipe_internal::KeySpec;
using recipe_internal::Names;
using recipe_internal::schema;
using recipe_internal::Value;

std::string recipe_to_yaml(const Recipe& r) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const KeySpec& k : schema()) {
    // Without an adapter the section is left out, so that recipes and resolved recipes written
    // before it existed read the same.
    if (k.section() == "adapter" && !r.adapter.enabled()) continue;
    if (k.section() == "dpo" && r.training.objective != "dpo") continue;
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
    } else if (const auto* names = std::get_if<Names>(&v)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const std::string& n : *names) out << n;
      out << YAML::EndSeq;
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

}  // namespace ft
