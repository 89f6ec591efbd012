// Recipe validation across keys (stages 5b and 5c; recipe.cpp has the list): features the format
// accepts but ft or this build cannot run yet, and the rules between keys (head and layout
// divisibility, sequence length, schedule, RoPE scaling, fp16 loss scaling, the adapter).
//
// Invariants: a rule runs only when every key it reads is usable (has no issue yet), so one
// mistake is reported once; nothing accepted is silently ignored: it is refused, or a warning
// says it does nothing in this run.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/files.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/rope.h"
#include "recipe/loader.h"
#include "recipe/schema.h"
#include "runtime/cuda/ops_memory.h"
#include "runtime/device.h"

namespace ft::recipe_internal {

// Stage 5b: accepted values whose feature is not built yet: refused loudly, never ignored.
void Loader::check_unimplemented() {
  if (!is_implemented_arch(r_.model.arch) && usable("model.arch")) {
    issue(locate("model.arch"), "model.arch", r_.model.arch + " is not implemented yet",
          "use " + implemented_archs(&ArchSpec::name));
  }
}

// Features the recipe format defines (DESIGN.md §5) but this build cannot run yet. Refused
// here, so `ft validate` and `ft train` agree and nothing a recipe asks for is silently
// skipped. Tests of the format's own rules (e.g. layout divisibility) switch this off.
void Loader::check_unbuilt() {
  if (!cuda_backend() && r_.runtime.device == "cuda" && usable("runtime.device")) {
    issue(locate("runtime.device"), "runtime.device",
          "cuda is not available: this build of ft has no CUDA backend (configured with "
          "FT_CUDA=OFF or without nvcc)",
          "use auto or cpu");
  }
  if (r_.runtime.communicator == "nccl" && r_.runtime.device == "cpu" &&
      all_usable({"runtime.communicator", "runtime.device"})) {
    issue(locate("runtime.communicator"), "runtime.communicator",
          "nccl moves GPU memory, and runtime.device is cpu", "use auto or mpi");
  }
  // Offload moves the optimizer state from device memory to the host's; the CPU device's
  // memory is the host's already. (auto that finds no GPU: refused when the run starts,
  // parallel/zero.cpp.)
  if (r_.parallel.offload_optimizer == "cpu" && r_.runtime.device == "cpu" &&
      all_usable({"parallel.offload_optimizer", "runtime.device"})) {
    issue(locate("parallel.offload_optimizer"), "parallel.offload_optimizer",
          "cpu moves the optimizer state from GPU memory to host memory, and runtime.device is "
          "cpu: it is in host memory already",
          "use parallel.offload_optimizer: none, or runtime.device: cuda");
  }
  if (r_.parallel.offload_params == "cpu" && r_.parallel.zero_stage != 3 &&
      all_usable({"parallel.offload_params", "parallel.zero_stage"})) {
    issue(locate("parallel.offload_params"), "parallel.offload_params",
          "cpu keeps ZeRO-3's parameter shards in host memory; below stage 3 every rank holds "
          "whole parameters on its device, so there is no shard to offload",
          "use parallel.zero_stage: 3, or parallel.offload_params: none");
  }
  if (r_.parallel.offload_params == "cpu" && r_.parallel.offload_optimizer != "cpu" &&
      all_usable({"parallel.offload_params", "parallel.offload_optimizer"})) {
    issue(locate("parallel.offload_params"), "parallel.offload_params",
          "cpu moves the 2-byte compute copy to host memory while parallel.offload_optimizer: "
          "none keeps the 12 bytes of fp32 masters and moments a parameter on the device: "
          "offload the optimizer first",
          "add parallel.offload_optimizer: cpu");
  }
  // The overlapped update (parallel/zero.h) waits for each group where the forward first uses
  // it; above stage 0 the updated shards are gathered first (stages 1-2 after the update, stage
  // 3 for the forward), and offload updates on the host group by group already.
  if (r_.parallel.overlap_update && r_.parallel.zero_stage != 0 &&
      all_usable({"parallel.overlap_update", "parallel.zero_stage"})) {
    issue(locate("parallel.overlap_update"), "parallel.overlap_update",
          "true runs the update under the next forward at ZeRO stage 0 only; stage " +
              std::to_string(r_.parallel.zero_stage) +
              " gathers the updated shards, which that forward would wait for",
          "use parallel.overlap_update: false, or parallel.zero_stage: 0");
  }
  if (r_.parallel.overlap_update && r_.parallel.offload_optimizer == "cpu" &&
      all_usable({"parallel.overlap_update", "parallel.offload_optimizer"})) {
    issue(locate("parallel.overlap_update"), "parallel.overlap_update",
          "true overlaps the GPU's update with the next forward; with "
          "parallel.offload_optimizer: cpu the update is on the host, group by group as that "
          "forward uses each, already",
          "use parallel.overlap_update: false");
  }
  check_packing_device();
  // The adapter section is part of the format (DESIGN.md §5); these parts of it are not built.
  // QLoRA's NF4 blocks are quantized whole, on the rank that holds them: not in tensor slices,
  // nor in ZeRO-3 shards.
  if (r_.adapter.type == "qlora" && r_.parallel.tensor > 1 &&
      all_usable({"adapter.type", "parallel.tensor"})) {
    issue(locate("parallel.tensor"), "parallel.tensor",
          "qlora holds each block's NF4 weights whole on its rank, and tensor parallelism splits "
          "them",
          "use parallel.tensor: 1 (parallel.pipeline splits the layers instead), or adapter.type: "
          "lora");
  }
  if (r_.adapter.type == "qlora" && r_.parallel.zero_stage == 3 &&
      all_usable({"adapter.type", "parallel.zero_stage"})) {
    issue(locate("parallel.zero_stage"), "parallel.zero_stage",
          "qlora holds each block's NF4 weights whole on every data rank; ZeRO-3 would shard them",
          "use parallel.zero_stage: 2 or less (the adapter's optimizer state is small), or "
          "adapter.type: lora");
  }
}

// data.pack masks attention at document boundaries, which on CUDA only the fused attention
// kernel does (runtime/op_list.h): bf16/fp16 at head dim 64 or 128. A packed recipe of another
// shape on a CUDA device would fail at its first step's attention; it is refused here when the
// device is known (runtime.device: cuda) or knowable (auto, and a usable GPU is here: the probe
// ft train makes), so ft validate says so. The trainer checks the device it made as well (it
// also sees FT_CUDA_ATTENTION).
void Loader::check_packing_device() {
  const ModelConfig& m = r_.model;
  if (!r_.data.pack || !cuda_backend() ||
      !all_usable({"data.pack", "runtime.device", "training.precision", "model.dim",
                   "model.n_heads", "model.head_dim"}) ||
      !heads_whole(m))
    return;
  const std::string& device = r_.runtime.device;
  const DType dtype = r_.training.precision == "bf16"   ? DType::kBF16
                      : r_.training.precision == "fp16" ? DType::kF16
                                                        : DType::kF32;
  const int D = head_dim_of(m);
  // Any GPU ft runs on is sm_80 or newer (cuda_unusable_reason refuses older ones).
  if (device == "cpu" ||
      cuda::attention_path(cuda::AttentionPath::kFused, dtype, D, 8) == cuda::AttentionPath::kFused)
    return;
  if (device == "auto" && !cuda_backend()->unusable_reason().empty()) return;  // the CPU then
  issue(locate("data.pack"), "data.pack",
        "true on the CUDA device (runtime.device: " + device +
            (device == "auto" ? ", and a usable GPU is here" : "") +
            ") needs the fused attention kernel to mask documents, which takes bf16/fp16 at head "
            "dim 64 or 128; this recipe has training.precision " +
            r_.training.precision + " and " + head_dim_keys(m),
        "training.precision: bf16 (or fp16) with a head dim of 64 or 128 (model.dim / "
        "model.n_heads, or model.head_dim); or runtime.device: cpu; or data.pack: false");
}

// Stage 5c: rules across keys, each checked only when every key it reads is usable.
void Loader::check_cross_rules() {
  const ModelConfig& m = r_.model;
  if (all_usable({"model.head_dim"}) && m.head_dim > 0) {
    if (m.head_dim % 2 != 0)
      issue(locate("model.head_dim"), "model.head_dim",
            "head_dim " + std::to_string(m.head_dim) + " is odd",
            "RoPE rotates pairs of channels, so head_dim must be even");
  } else if (all_usable({"model.dim", "model.n_heads", "model.head_dim"})) {
    if (m.dim % m.n_heads != 0) {
      issue(locate("model.n_heads"), "model.n_heads",
            "model.dim " + std::to_string(m.dim) + " is not divisible by model.n_heads " +
                std::to_string(m.n_heads),
            "each head gets dim / n_heads channels; pick n_heads dividing dim, e.g. " +
                std::to_string(nearest_divisor(m.dim, m.n_heads)) + ", or set model.head_dim");
    } else if ((m.dim / m.n_heads) % 2 != 0) {
      issue(locate("model.n_heads"), "model.n_heads",
            "head_dim = dim / n_heads = " + std::to_string(m.dim / m.n_heads) + " is odd",
            "RoPE rotates pairs of channels, so head_dim must be even; change dim or n_heads");
    }
  }
  if (all_usable({"model.n_heads", "model.n_kv_heads"}) && m.n_heads % m.n_kv_heads != 0) {
    issue(locate("model.n_kv_heads"), "model.n_kv_heads",
          "model.n_heads " + std::to_string(m.n_heads) + " is not divisible by model.n_kv_heads " +
              std::to_string(m.n_kv_heads),
          "each key/value head serves n_heads / n_kv_heads query heads; e.g. n_kv_heads: " +
              std::to_string(nearest_divisor(m.n_heads, m.n_kv_heads)));
  }
  if (all_usable({"data.seq_len", "model.max_seq_len"}) && r_.data.seq_len > m.max_seq_len) {
    issue(locate("data.seq_len"), "data.seq_len",
          "data.seq_len " + std::to_string(r_.data.seq_len) + " exceeds model.max_seq_len " +
              std::to_string(m.max_seq_len),
          "use a data.seq_len of at most " + std::to_string(m.max_seq_len));
  }
  if (all_usable({"scheduler.warmup_steps", "training.steps"}) &&
      r_.scheduler.warmup_steps > r_.training.steps) {
    issue(locate("scheduler.warmup_steps"), "scheduler.warmup_steps",
          "scheduler.warmup_steps " + std::to_string(r_.scheduler.warmup_steps) +
              " exceeds training.steps " + std::to_string(r_.training.steps),
          "warmup must end by the last step");
  }
  if (all_usable({"scheduler.min_lr", "optimizer.lr"}) && r_.scheduler.min_lr > r_.optimizer.lr) {
    issue(locate("scheduler.min_lr"), "scheduler.min_lr",
          "scheduler.min_lr " + format_double(r_.scheduler.min_lr) + " exceeds optimizer.lr " +
              format_double(r_.optimizer.lr),
          "the schedule decays from lr down to min_lr; make min_lr <= lr");
  }
  if (all_usable({"training.eval_every_steps", "data.valid"}) && r_.training.eval_every_steps > 0 &&
      r_.data.valid.empty()) {
    issue(locate("training.eval_every_steps"), "training.eval_every_steps",
          "evaluation is on but data.valid is not set",
          "set data.valid to a shard folder, or training.eval_every_steps: 0");
  }
  check_rope();
  check_adapter();
  check_dpo();
  check_vocabulary();
  check_layout();
  check_loss_scaling();
}

// fp16 loss scaling keys (optim/loss_scaler.h). Checked whatever the precision, so that a
// recipe's mistakes show before fp16 is switched on; set with another precision, they do
// nothing, which one warning line says.
void Loader::check_loss_scaling() {
  const TrainingConfig& t = r_.training;
  // Powers of two, so that scaling the loss and unscaling the gradients are exact (only the
  // exponent changes) and every scale the dynamic rule reaches by halving and doubling is one.
  auto power_of_two = [&](const char* key, double v) {
    int e = 0;
    if (!usable(key) || v == 0 || std::frexp(v, &e) == 0.5) return;
    const double below = std::ldexp(1.0, e - 1), above = std::ldexp(1.0, e);
    issue(locate(key), key, format_double(v) + " is not a power of two",
          "scaling by a power of two is exact; use " + format_double(below) + " or " +
              format_double(above));
  };
  power_of_two("training.loss_scale", t.loss_scale);
  power_of_two("training.initial_loss_scale", t.initial_loss_scale);
  power_of_two("training.min_loss_scale", t.min_loss_scale);
  if (all_usable({"training.min_loss_scale", "training.initial_loss_scale"}) &&
      t.min_loss_scale > t.initial_loss_scale) {
    issue(locate("training.min_loss_scale"), "training.min_loss_scale",
          "training.min_loss_scale " + format_double(t.min_loss_scale) +
              " exceeds training.initial_loss_scale " + format_double(t.initial_loss_scale),
          "the dynamic scale starts at initial_loss_scale and halves down to min_loss_scale; "
          "make min_loss_scale <= initial_loss_scale");
  }
  // Keys set away from their defaults that this run does not read: said once, not refused
  // (a resolved recipe, which writes every key, must load without a warning).
  const Recipe defaults;
  auto changed = [&](std::initializer_list<const char*> keys) {
    std::vector<std::string> out;
    for (const char* key : keys) {
      const KeySpec& k = *find_key(key);
      if (is_set(key) && usable(key) && k.get(r_) != k.get(defaults)) out.push_back(key);
    }
    return out;
  };
  // The precision says whether these keys act; one that failed to convert is left at fp32 and
  // says nothing.
  const bool precision_known = usable("training.precision") || t.precision != "fp32";
  if (precision_known && t.precision != "fp16") {
    const std::vector<std::string> ignored =
        changed({"training.loss_scale", "training.loss_scale_window", "training.initial_loss_scale",
                 "training.min_loss_scale", "training.loss_scale_hysteresis",
                 "training.max_skipped_steps"});
    if (!ignored.empty())
      warnings_.push_back(join(ignored, ", ") + (ignored.size() == 1 ? " acts" : " act") +
                          " only with training.precision fp16; ignored in this " + t.precision +
                          " run");
  } else if (t.precision == "fp16" && t.loss_scale > 0 && usable("training.loss_scale")) {
    const std::vector<std::string> ignored =
        changed({"training.loss_scale_window", "training.initial_loss_scale",
                 "training.min_loss_scale", "training.loss_scale_hysteresis"});
    if (!ignored.empty())
      warnings_.push_back(join(ignored, ", ") + (ignored.size() == 1 ? " acts" : " act") +
                          " only with dynamic loss scaling (training.loss_scale 0); ignored "
                          "with the static scale " +
                          format_double(t.loss_scale));
  }
}

// RoPE scaling written in the recipe (with model.from, read_hf_config has checked the file's
// and any recipe key that disagrees is already an issue). Each type needs its factors, as
// transformers' rope validation requires them; a factor the type does not use is refused when
// it is not the neutral default, since the recipe then asks for a scaling it would not get.
void Loader::check_rope() {
  const ModelConfig& m = r_.model;
  if (!m.from.empty() || !usable("model.rope_type")) return;
  const std::string& type = m.rope_type;
  const Recipe defaults;
  struct Factor {
    const char* path;
    bool used;
  };
  const bool llama3 = type == "llama3";
  for (Factor f :
       {Factor{"model.rope_factor", type != "default"},
        Factor{"model.rope_low_freq_factor", llama3}, Factor{"model.rope_high_freq_factor", llama3},
        Factor{"model.rope_original_max_seq_len", llama3}}) {
    const KeySpec& k = *find_key(f.path);
    if (!usable(f.path)) continue;
    if (f.used && !is_set(f.path)) {
      issue(locate(f.path), f.path, "is required when model.rope_type is " + type,
            "set it to the model's " + k.hf_name +
                " (in config.json's rope_parameters or "
                "rope_scaling)");
    } else if (!f.used && is_set(f.path) && k.get(r_) != k.get(defaults)) {
      issue(locate(f.path), f.path, "is set but model.rope_type " + type + " does not use it",
            "set model.rope_type to the scaling it belongs to, or remove " + std::string(f.path));
    }
  }
  if (all_usable({"model.rope_theta", "model.rope_factor", "model.dim", "model.n_heads",
                  "model.head_dim"}) &&
      heads_whole(m)) {
    if (std::string p = rope_table_problem(m, head_dim_of(m)); !p.empty())
      issue(locate("model.rope_theta"), "model.rope_theta", p,
            "Llama models use rope_theta between 1e4 and 1e6 and factors between 1 and 64");
  }
  if (llama3 && all_usable({"model.rope_low_freq_factor", "model.rope_high_freq_factor"}) &&
      !(m.rope_low_freq_factor < m.rope_high_freq_factor)) {
    issue(locate("model.rope_high_freq_factor"), "model.rope_high_freq_factor",
          "model.rope_low_freq_factor " + format_double(m.rope_low_freq_factor) +
              " must be below model.rope_high_freq_factor " +
              format_double(m.rope_high_freq_factor),
          "llama3 blends the frequencies between the two; Llama 3.1 uses 1 and 4");
  }
}

// The adapter section. Its keys act only with an adapter, so one set while adapter.type is none
// is refused (the recipe asks for an adapter it would not get). Otherwise the lists of names are
// checked, and adapter.from against the recipe (validate_inputs.cpp).
void Loader::check_adapter() {
  if (!usable("adapter.type")) return;
  if (!r_.adapter.enabled()) {
    for (const std::string& key : keys_of("adapter")) {
      const std::string path = "adapter." + key;
      if (key != "type" && is_set(path) && usable(path))
        issue(locate(path), path, path + " is set but adapter.type is none",
              "set adapter.type: lora");
    }
    return;
  }
  check_adapter_names("adapter.target_modules");
  check_adapter_names("adapter.modules_to_save");
  check_adapter_from();
}

// The dpo section acts only with training.objective dpo: a key of it set otherwise is refused, as
// adapter keys without an adapter are. reference: base needs an adapter to switch off; label
// smoothing is a property of the sigmoid loss only; pairs are never packed.
void Loader::check_dpo() {
  if (!usable("training.objective")) return;
  if (r_.training.objective != "dpo") {
    for (const std::string& key : keys_of("dpo")) {
      const std::string path = "dpo." + key;
      if (is_set(path) && usable(path))
        issue(locate(path), path, path + " is set but training.objective is sft",
              "set training.objective: dpo");
    }
    return;
  }
  if (r_.dpo.reference == "base" && !r_.adapter.enabled() &&
      all_usable({"dpo.reference", "adapter.type"}))
    issue(locate("dpo.reference"), "dpo.reference",
          "base is the frozen base model with the adapter switched off, and this recipe trains "
          "every parameter (adapter.type: none)",
          "use dpo.reference: initial (the model at step 0), or add an adapter (adapter.type: "
          "lora)");
  if (r_.dpo.reference == "base" && !r_.adapter.modules_to_save.empty() &&
      all_usable({"dpo.reference", "adapter.modules_to_save"}))
    issue(locate("dpo.reference"), "dpo.reference",
          "base switches the adapter off, but adapter.modules_to_save trains whole modules of the "
          "model, which the reference would then share as they train",
          "use dpo.reference: initial (the model at step 0), or no modules_to_save");
  if (r_.dpo.label_smoothing > 0 && r_.dpo.loss != "sigmoid" &&
      all_usable({"dpo.label_smoothing", "dpo.loss"}))
    issue(locate("dpo.label_smoothing"), "dpo.label_smoothing",
          "label smoothing is defined for the sigmoid loss only, and dpo.loss is " + r_.dpo.loss,
          "use dpo.loss: sigmoid, or dpo.label_smoothing: 0");
  if (r_.data.pack && all_usable({"data.pack"}))
    issue(locate("data.pack"), "data.pack",
          "true packs documents into windows, but a preference pair's two sequences are rows of "
          "their own",
          "use data.pack: false with training.objective: dpo");
}

// A list of module names (target_modules, modules_to_save): each one of its row's choices, each
// once. target_modules names at least one module, and all-linear stands alone; a module that
// only modules_to_save can train (lm_head, embed_tokens: ft has no LoRA on an embedding or on the
// output layer, which PEFT has) is pointed there. One issue per list, at its first bad name.
void Loader::check_adapter_names(const std::string& path) {
  if (!usable(path)) return;
  const KeySpec& k = *find_key(path);
  const std::vector<std::string>& choices = k.choices;
  const Names names = std::get<Names>(k.get(r_));
  const bool targets = path == "adapter.target_modules";
  if (targets && names.empty()) {
    issue(locate(path), path, "names no module",
          "e.g. target_modules: [q_proj, v_proj], or [all-linear] for every linear layer");
    return;
  }
  const std::vector<std::string>& whole = find_key("adapter.modules_to_save")->choices;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const Origin at = locate_element(path, i);
    if (targets && std::find(whole.begin(), whole.end(), n) != whole.end()) {
      issue(at, path, "LoRA on " + n + " is not supported",
            "use adapter.modules_to_save: [" + n + "] to train it whole");
      return;
    }
    if (std::find(choices.begin(), choices.end(), n) == choices.end()) {
      const std::string close = suggest(n, choices);
      issue(at, path, excerpt(n) + " is not one of " + join(choices, ", "),
            close.empty() ? example(k) : close);
      return;
    }
    if (std::find(names.begin(), names.begin() + i, n) != names.begin() + i) {
      issue(at, path, n + " is listed twice", "list each module once");
      return;
    }
  }
  if (targets && names.size() > 1 &&
      std::find(names.begin(), names.end(), "all-linear") != names.end()) {
    issue(locate(path), path, "all-linear names every linear layer and stands alone",
          "write target_modules: [all-linear], or list the modules without it");
  }
}

// World = data × pipeline × tensor (DESIGN.md §3). world_size <= 0 means "not known yet"
// (ft validate without a launcher): then the smallest world, one data rank, is assumed.
void Loader::check_layout() {
  const ParallelConfig& p = r_.parallel;
  const ModelConfig& m = r_.model;
  if (!usable("parallel.tensor") || !usable("parallel.pipeline")) return;
  const int64_t model_ranks = int64_t(p.tensor) * p.pipeline;
  const int64_t world = world_size_ > 0 ? world_size_ : model_ranks;
  if (world % model_ranks != 0) {
    issue(locate("parallel.tensor"), "parallel.tensor",
          "world size " + std::to_string(world) +
              " is not divisible by tensor × pipeline = " + std::to_string(model_ranks),
          "the ranks form a data × pipeline × tensor grid; launch a multiple of " +
              std::to_string(model_ranks) + " ranks or change parallel.tensor/pipeline");
    return;
  }
  const int64_t data = world / model_ranks;
  if (all_usable({"training.micro_batch_size", "training.global_batch_size"})) {
    const int64_t per_step = int64_t(r_.training.micro_batch_size) * data;
    if (r_.training.global_batch_size % per_step != 0) {
      const int64_t up = (r_.training.global_batch_size / per_step + 1) * per_step;
      issue(locate("training.global_batch_size"), "training.global_batch_size",
            "global_batch_size " + std::to_string(r_.training.global_batch_size) +
                " is not divisible by micro_batch_size × data ranks = " +
                std::to_string(r_.training.micro_batch_size) + " × " + std::to_string(data),
            "use a multiple of " + std::to_string(per_step) + ", e.g. " + std::to_string(up));
    }
  }
  // Tensor parallelism splits heads, KV heads, the MLP and the vocabulary (embedding, lm_head
  // and cross-entropy) across tensor ranks. The vocabulary is not padded: a vocab_size that
  // does not divide is refused rather than silently changing the model's shapes.
  struct Split {
    const char* key;
    int value;
  };
  for (Split s : {Split{"model.n_heads", m.n_heads}, Split{"model.n_kv_heads", m.n_kv_heads},
                  Split{"model.ffn_dim", m.ffn_dim}, Split{"model.vocab_size", m.vocab_size}}) {
    if (usable(s.key) && s.value % p.tensor != 0) {
      issue(locate("parallel.tensor"), "parallel.tensor",
            std::string(s.key) + " " + std::to_string(s.value) +
                " does not split evenly over parallel.tensor " + std::to_string(p.tensor),
            "use a parallel.tensor that divides it");
    }
  }
  if (usable("model.n_layers") && m.n_layers < p.pipeline) {
    issue(locate("parallel.pipeline"), "parallel.pipeline",
          "parallel.pipeline " + std::to_string(p.pipeline) + " stages for only " +
              std::to_string(m.n_layers) + " layers",
          "every stage needs at least one layer; use at most " + std::to_string(m.n_layers));
  }
}

int Loader::nearest_divisor(int n, int near) {
  int best = 1;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0 && std::abs(d - near) < std::abs(best - near)) best = d;
  }
  return best;
}

}  // namespace ft::recipe_internal
