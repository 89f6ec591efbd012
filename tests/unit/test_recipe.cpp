// Recipe loading and validation (lib/recipe) and read_hf_config (lib/ckpt/hf_config.cpp).
// Each kind of issue is asserted with its line, column, key and hint, since a user acts on
// exactly those; recipes are written to a fresh temporary folder per test.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "core/error.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"
#include "runtime/device.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using ft::CudaBackend;
using ft::Device;
using ft::DeviceOptions;
using ft::load_recipe;
using ft::Recipe;
using ft::RecipeIssue;
using ft::RecipeResult;
using ft::register_cuda_backend;

namespace {

// A scratch folder with a shard directory, removed at the end of the test.
struct Scratch {
  TempDir tmp;
  fs::path dir = tmp.path;
  std::string shards = (dir / "shards").string();

  Scratch() { fs::create_directories(shards); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = dir / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  // A valid recipe: the model sizes that are required without model.from, and data.train.
  // Lines 1-9, so tests that append know where their lines start (line 10).
  std::string base() const {
    return "run:\n"               // 1
           "  name: tiny\n"       // 2
           "model:\n"             // 3
           "  dim: 64\n"          // 4
           "  n_layers: 2\n"      // 5
           "  n_heads: 4\n"       // 6
           "  ffn_dim: 172\n"     // 7
           "  vocab_size: 256\n"  // 8
           "data: {train: " +
           shards + "}\n";  // 9
  }
  RecipeResult load(const std::string& yaml, const std::vector<std::string>& overrides = {},
                    int world_size = 1) const {
    // The format's own rules, including those for features this build cannot run yet.
    return load_recipe(write("recipe.yaml", yaml), overrides, world_size, /*refuse_unbuilt=*/false);
  }
};

// The issues about one key (a key may have several, e.g. parallel.tensor).
std::vector<RecipeIssue> issues_for(const RecipeResult& r, const std::string& key) {
  std::vector<RecipeIssue> out;
  for (const RecipeIssue& i : r.issues) {
    if (i.key_path == key) out.push_back(i);
  }
  return out;
}

// The single issue about `key`; fails the test (printing every issue) if there is not exactly one.
RecipeIssue issue_for(const RecipeResult& r, const std::string& key) {
  const std::vector<RecipeIssue> found = issues_for(r, key);
  std::string all;
  for (const RecipeIssue& i : r.issues) all += i.format() + "\n";
  INFO("looking for ", key, " among:\n", all);
  REQUIRE(found.size() == 1);
  return found[0];
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string all_issues(const RecipeResult& r) {
  std::string all;
  for (const RecipeIssue& i : r.issues) all += i.format() + "\n";
  return all;
}

// A config.json in the shape transformers writes for LlamaForCausalLM.
std::string hf_config_json(int hidden = 256, const std::string& extra = "") {
  return "{\n"
         "  \"architectures\": [\"LlamaForCausalLM\"],\n"
         "  \"model_type\": \"llama\",\n"
         "  \"hidden_size\": " +
         std::to_string(hidden) +
         ",\n"
         "  \"num_hidden_layers\": 3,\n"
         "  \"num_attention_heads\": 8,\n"
         "  \"num_key_value_heads\": 2,\n"
         "  \"intermediate_size\": 688,\n"
         "  \"vocab_size\": 1000,\n"
         "  \"max_position_embeddings\": 512,\n"
         "  \"rope_theta\": 500000.0,\n"
         "  \"rms_norm_eps\": 1e-06,\n" +
         extra +
         "  \"tie_word_embeddings\": true\n"
         "}\n";
}

}  // namespace

TEST_CASE("recipe: a minimal recipe resolves with defaults") {
  Scratch s;
  const RecipeResult r = s.load(s.base());
  INFO(all_issues(r));
  REQUIRE(r.ok());
  const Recipe& c = r.recipe;
  CHECK(c.source_path == (s.dir / "recipe.yaml").string());
  CHECK(c.model.dim == 64);
  CHECK(c.model.n_kv_heads == 4);  // defaults to n_heads, as in HF's LlamaConfig
  CHECK(c.data.train == s.shards);
  CHECK(c.training.steps == 100);
  CHECK(c.optimizer.lr == doctest::Approx(3e-4));
  // Derived defaults follow run.name and run.output_dir.
  CHECK(c.run.output_dir == "runs/tiny");
  CHECK(c.checkpoint.dir == "runs/tiny/checkpoints");
  CHECK(c.logging.metrics == "runs/tiny/metrics.jsonl");

  const RecipeResult out = s.load(s.base(), {"run.output_dir=out/x"});
  REQUIRE(out.ok());
  CHECK(out.recipe.checkpoint.dir == "out/x/checkpoints");
  CHECK(out.recipe.logging.metrics == "out/x/metrics.jsonl");
}

TEST_CASE("recipe: a section or key written twice") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "run: {seed: 1}\n"  // 10
                                "training:\n"       // 11
                                "  steps: 1\n"      // 12
                                "  steps: 2\n");    // 13
  const RecipeIssue section = issue_for(r, "run");
  CHECK(section.line == 10);
  CHECK(section.message == "section written twice (first at line 1)");
  const RecipeIssue key = issue_for(r, "training.steps");
  CHECK(key.line == 13);
  CHECK(key.message == "written twice (first at line 12)");
  CHECK(r.issues.size() == 2);
}

TEST_CASE("recipe: unknown keys and sections come with a did-you-mean") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "trainig:\n"           // 10
                                "  steps: 10\n"        // 11
                                "optimizer:\n"         // 12
                                "  lrr: 0.1\n"         // 13
                                "  warmup_steps: 3\n"  // 14
                                "  hidden_size: 3\n"   // 15
                                "seq_len: 3\n");       // 16
  CHECK(r.issues.size() == 5);

  const RecipeIssue section = issue_for(r, "trainig");
  CHECK(section.file == (s.dir / "recipe.yaml").string());
  CHECK(section.line == 10);
  CHECK(section.column == 1);
  CHECK(section.message == "unknown section");
  CHECK(section.hint == "did you mean training?");

  const RecipeIssue typo = issue_for(r, "optimizer.lrr");
  CHECK(typo.line == 13);
  CHECK(typo.column == 3);
  CHECK(typo.hint == "did you mean optimizer.lr?");

  // A key of another section is pointed there.
  const RecipeIssue moved = issue_for(r, "optimizer.warmup_steps");
  CHECK(moved.line == 14);
  CHECK(contains(moved.hint, "scheduler.warmup_steps"));
  CHECK(contains(moved.hint, "section scheduler"));

  // Hugging Face names are recognised and translated.
  const RecipeIssue hf = issue_for(r, "optimizer.hidden_size");
  CHECK(hf.hint == "did you mean model.dim? (hidden_size is config.json's name for it)");

  // A key written at the top level.
  const RecipeIssue top = issue_for(r, "seq_len");
  CHECK(top.line == 16);
  CHECK(top.hint == "did you mean data.seq_len? (keys go inside their section)");
}

TEST_CASE("recipe: nothing close to an unknown key lists the valid ones") {
  Scratch s;
  const RecipeResult r = s.load(s.base() + "runtime: {xyzzy: 1}\n");
  const RecipeIssue i = issue_for(r, "runtime.xyzzy");
  CHECK(i.line == 10);
  CHECK(i.column == 11);
  CHECK(
      i.hint ==
      "keys of runtime are device, threads, collective_timeout_s, communicator, tf32, gemm_algos");
}

TEST_CASE("recipe: wrong types name what was expected and what was found") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "training:\n"                          // 10
                                "  steps: \"ten\"\n"                   // 11 string for int
                                "  micro_batch_size: 2.5\n"            // 12 float for int
                                "  global_batch_size: [4]\n"           // 13 list for scalar
                                "  activation_checkpointing: maybe\n"  // 14
                                "optimizer:\n"                         // 15
                                "  lr: fast\n"                         // 16
                                "  betas: 0.9\n"                       // 17
                                "  name: [adamw]\n"                    // 18
                                "runtime:\n"                           // 19
                                "  threads:\n"                         // 20 no value
                                "run:\n"                               // 21 duplicate section
                                "  seed: 99999999999999999999999\n");  // 22
  auto check = [&](const char* key, int line, int column, const char* message) {
    const RecipeIssue i = issue_for(r, key);
    CHECK(i.line == line);
    CHECK(i.column == column);
    CHECK(i.message == message);
    CHECK(!i.hint.empty());
  };
  check("training.steps", 11, 10, "expected an integer, got the string \"ten\"");
  check("training.micro_batch_size", 12, 21, "expected an integer, got the number 2.5");
  check("training.global_batch_size", 13, 22, "expected an integer, got a list");
  check("training.activation_checkpointing", 14, 29,
        "expected true or false, got the string \"maybe\"");
  check("optimizer.lr", 16, 7, "expected a finite number, got the string \"fast\"");
  check("optimizer.betas", 17, 10, "expected a list of two numbers, got the number 0.9");
  check("optimizer.name", 18, 9, "expected one of adamw, got a list");
  check("runtime.threads", 20, 3, "expected an integer, got no value");
  CHECK(issue_for(r, "training.micro_batch_size").hint ==
        "this key counts whole units; write an integer such as 3");
  CHECK(issue_for(r, "optimizer.betas").hint == "e.g. betas: [0.9, 0.999]");
  CHECK(issue_for(r, "training.steps").hint == "e.g. steps: 100");
  // The second `run:` section is refused as a whole, so its bad seed is not reported.
  CHECK(issue_for(r, "run").line == 21);
  CHECK(r.issues.size() == 9);
}

TEST_CASE("recipe: values out of range") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "training:\n"                     // 10
                                "  steps: 10\n"                   // 11
                                "  micro_batch_size: 0\n"         // 12
                                "  grad_clip: -1\n"               // 13
                                "optimizer:\n"                    // 14
                                "  lr: 0\n"                       // 15
                                "  betas: [0.9, 1.0]\n"           // 16
                                "  eps: -1e-8\n"                  // 17
                                "  weight_decay: -0.1\n"          // 18
                                "scheduler:\n"                    // 19
                                "  name: cosin\n"                 // 20
                                "parallel:\n"                     // 21
                                "  zero_stage: 4\n"               // 22
                                "runtime: {device: gpu}\n"        // 23
                                "checkpoint: {keep_last: 0}\n");  // 24
  INFO(all_issues(r));
  auto check = [&](const char* key, int line, const char* message) {
    const RecipeIssue i = issue_for(r, key);
    CHECK(i.line == line);
    CHECK(i.message == message);
  };
  check("training.micro_batch_size", 12, "0 is out of range: must be in [1, 16777216]");
  check("training.grad_clip", 13, "-1 is out of range: must be in [0, 1000000000]");
  check("optimizer.lr", 15, "0 is out of range: must be in (0, 10000000000]");
  check("optimizer.betas", 16, "beta2 = 1 is out of range: must be in [0, 1)");
  check("optimizer.eps", 17, "-1e-8 is out of range: must be in (0, 1]");
  check("optimizer.weight_decay", 18, "-0.1 is out of range: must be in [0, 100]");
  check("scheduler.name", 20, "\"cosin\" is not one of constant, linear, cosine");
  check("parallel.zero_stage", 22, "4 is out of range: must be in [0, 3]");
  check("runtime.device", 23, "\"gpu\" is not one of auto, cpu, cuda");
  check("checkpoint.keep_last", 24, "0 is out of range: must be in [1, 1000000]");
  CHECK(issue_for(r, "scheduler.name").hint == "did you mean cosine?");
  CHECK(issue_for(r, "optimizer.lr").hint == "e.g. lr: 0.0003");
  CHECK(issue_for(r, "parallel.zero_stage").column == 15);
  CHECK(r.issues.size() == 10);
}

TEST_CASE("recipe: every number has an upper bound too") {
  // A bucket of 1e-9 MiB (one element: ~150x slower steps) or 1e300 MiB (past size_t) was
  // accepted; every numeric key now has a range with both ends (DESIGN.md §5).
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "training: {steps: 10}\n"                             // 10
                                "parallel: {reduce_bucket_mb: 1e300}\n"               // 11
                                "checkpoint: {every_minutes: 1e300, keep_last: 2}\n"  // 12
                                "runtime: {collective_timeout_s: 1e300}\n");          // 13
  INFO(all_issues(r));
  CHECK(issue_for(r, "parallel.reduce_bucket_mb").message ==
        "1e300 is out of range: must be in [0.0009765625, 1048576]");
  CHECK(issue_for(r, "checkpoint.every_minutes").message ==
        "1e300 is out of range: must be in [0, 525600]");
  CHECK(issue_for(r, "runtime.collective_timeout_s").line == 13);
  CHECK(r.issues.size() == 3);
  const RecipeResult tiny = s.load(s.base() +
                                   "training: {steps: 10}\n"
                                   "parallel: {reduce_bucket_mb: 1e-9}\n");
  CHECK(issue_for(tiny, "parallel.reduce_bucket_mb").message ==
        "1e-9 is out of range: must be in [0.0009765625, 1048576]");
  using namespace ft::recipe_internal;
  for (const KeySpec& k : schema()) {
    if (k.kind != Kind::kInt && k.kind != Kind::kInt64 && k.kind != Kind::kFloat) continue;
    INFO(k.path);
    CHECK(k.range.hi.has_value());
  }
}

TEST_CASE("recipe: training.loss_chunk_tokens: 1024 by default, 0 one chunk, never negative") {
  Scratch s;
  const RecipeResult plain = s.load(s.base());
  REQUIRE(plain.ok());
  CHECK(plain.recipe.training.loss_chunk_tokens == 1024);
  const RecipeResult one = s.load(s.base(), {"training.loss_chunk_tokens=0"});
  REQUIRE(one.ok());
  CHECK(one.recipe.training.loss_chunk_tokens == 0);
  const RecipeResult negative = s.load(s.base(), {"training.loss_chunk_tokens=-1"});
  CHECK(issue_for(negative, "training.loss_chunk_tokens").message ==
        "-1 is out of range: must be in [0, 67108864]");
  CHECK(issue_for(negative, "training.loss_chunk_tokens").hint == "e.g. loss_chunk_tokens: 1024");
  const RecipeResult fraction = s.load(s.base(), {"training.loss_chunk_tokens=2.5"});
  CHECK(issue_for(fraction, "training.loss_chunk_tokens").message ==
        "expected an integer, got the number 2.5");
}

TEST_CASE("recipe: integers too large for their field") {
  Scratch s;
  const RecipeResult r = s.load(s.base() + "training: {steps: 99999999999999999999}\n",
                                {"model.dim=4294967296", "run.seed=-3"});
  CHECK(contains(issue_for(r, "training.steps").message, "too large"));
  CHECK(contains(issue_for(r, "model.dim").message, "at most 2147483647"));
  CHECK(issue_for(r, "run.seed").message == "-3 is out of range: must be >= 0");
}

TEST_CASE("recipe: missing required keys") {
  Scratch s;
  // No data.train; the model section lacks every size key but max_seq_len.
  const RecipeResult r = s.load(
      "run: {name: x}\n"
      "model:\n"
      "  max_seq_len: 4096\n");
  INFO(all_issues(r));
  const RecipeIssue train = issue_for(r, "data.train");
  CHECK(train.line == 0);  // there is no data section to point at
  CHECK(train.message == "is required but not set");
  for (const char* key :
       {"model.dim", "model.n_layers", "model.n_heads", "model.ffn_dim", "model.vocab_size"}) {
    const RecipeIssue i = issue_for(r, key);
    CHECK(i.line == 2);  // the model section's header
    CHECK(contains(i.hint, "model.from"));
  }
  CHECK(r.issues.size() == 6);

  // A malformed section is one issue, not one per key it should have held.
  const RecipeResult bad_section = s.load("model: 3\ndata: {train: " + s.shards + "}\n");
  REQUIRE(bad_section.issues.size() == 1);
  CHECK(bad_section.issues[0].key_path == "model");
  CHECK(bad_section.issues[0].message == "a section is a mapping of keys, got the number 3");

  // An empty value counts as missing.
  const RecipeResult r3 = s.load(s.base(), {"data.train="});
  CHECK(issue_for(r3, "data.train").message == "is required but not set");
}

TEST_CASE("recipe: rules across keys") {
  Scratch s;
  SUBCASE("dim divisible by n_heads") {
    const RecipeResult r = s.load(s.base(), {"model.n_heads=5"});
    const RecipeIssue i = issue_for(r, "model.n_heads");
    CHECK(i.file == "<command line>");
    CHECK(i.message == "model.dim 64 is not divisible by model.n_heads 5");
    CHECK(contains(i.hint, "e.g. 4"));
    CHECK(r.issues.size() == 1);
  }
  SUBCASE("head_dim even for RoPE") {
    const RecipeResult r = s.load(s.base(), {"model.dim=60", "model.n_heads=4"});
    const RecipeIssue i = issue_for(r, "model.n_heads");
    CHECK(i.message == "head_dim = dim / n_heads = 15 is odd");
    CHECK(contains(i.hint, "RoPE"));
  }
  SUBCASE("n_heads divisible by n_kv_heads") {
    const RecipeResult r = s.load(s.base(), {"model.n_kv_heads=3"});
    const RecipeIssue i = issue_for(r, "model.n_kv_heads");
    CHECK(i.message == "model.n_heads 4 is not divisible by model.n_kv_heads 3");
    CHECK(contains(i.hint, "n_kv_heads: 2"));
  }
  SUBCASE("seq_len within max_seq_len") {
    const RecipeResult r = s.load(s.base(), {"data.seq_len=4096"});
    const RecipeIssue i = issue_for(r, "data.seq_len");
    CHECK(i.message == "data.seq_len 4096 exceeds model.max_seq_len 2048");
  }
  SUBCASE("warmup within steps, min_lr within lr") {
    const RecipeResult r = s.load(s.base() +
                                  "training: {steps: 10}\n"                       // 10
                                  "scheduler: {warmup_steps: 11, min_lr: 0.1}\n"  // 11
                                  "optimizer: {lr: 0.01}\n");
    const RecipeIssue w = issue_for(r, "scheduler.warmup_steps");
    CHECK(w.line == 11);
    CHECK(w.column == 27);
    CHECK(w.message == "scheduler.warmup_steps 11 exceeds training.steps 10");
    const RecipeIssue m = issue_for(r, "scheduler.min_lr");
    CHECK(m.message == "scheduler.min_lr 0.1 exceeds optimizer.lr 0.01");
    CHECK(r.issues.size() == 2);
  }
  SUBCASE("warmup equal to steps is fine") {
    CHECK(s.load(s.base(), {"training.steps=5", "scheduler.warmup_steps=5"}).ok());
  }
  SUBCASE("evaluation needs data.valid") {
    const RecipeResult r = s.load(s.base(), {"training.eval_every_steps=5"});
    CHECK(contains(issue_for(r, "training.eval_every_steps").hint, "data.valid"));
    CHECK(s.load(s.base(), {"training.eval_every_steps=5", "data.valid=" + s.shards}).ok());
  }
  SUBCASE("a bad key does not set off the rules that read it") {
    // n_heads: 0 is out of range; dim % n_heads must not then be checked (nor divide by 0).
    const RecipeResult r = s.load(s.base(), {"model.n_heads=0"});
    CHECK(r.issues.size() == 1);
    CHECK(issue_for(r, "model.n_heads").message == "0 is out of range: must be in [1, 65536]");
  }
}

TEST_CASE("recipe: batch and layout rules use the world size") {
  Scratch s;
  const std::string yaml = s.base() +
                           "training: {micro_batch_size: 2, global_batch_size: 12}\n"  // 10
                           "parallel: {tensor: 2, pipeline: 1}\n";                     // 11
  // World 4: 2 data ranks, 2 × 2 = 4 samples per micro-step, 12 = 3 accumulation steps.
  CHECK(s.load(yaml, {}, 4).ok());
  // World 8: 4 data ranks, 8 per micro-step; 12 is not a multiple.
  const RecipeResult r = s.load(yaml, {}, 8);
  const RecipeIssue g = issue_for(r, "training.global_batch_size");
  CHECK(g.line == 10);
  CHECK(g.column == 52);
  CHECK(g.message ==
        "global_batch_size 12 is not divisible by micro_batch_size × data ranks = 2 × 4");
  CHECK(g.hint == "use a multiple of 8, e.g. 16");
  // World 3 cannot be split into tensor groups of 2.
  const RecipeResult r3 = s.load(yaml, {}, 3);
  const RecipeIssue t = issue_for(r3, "parallel.tensor");
  CHECK(t.line == 11);
  CHECK(t.message == "world size 3 is not divisible by tensor × pipeline = 2");
  // World 0 (unknown, as in ft validate): the smallest world, tensor × pipeline ranks.
  CHECK(s.load(yaml, {}, 0).ok());
  // Heads must split over tensor ranks; layers over pipeline stages.
  const RecipeResult r4 = s.load(yaml, {"parallel.tensor=8", "parallel.pipeline=3"}, 0);
  CHECK(issues_for(r4, "parallel.tensor").size() == 3);  // n_heads, n_kv_heads, ffn_dim
  CHECK(issue_for(r4, "parallel.pipeline").message ==
        "parallel.pipeline 3 stages for only 2 layers");
}

TEST_CASE("recipe: a YAML syntax error is one issue at its position") {
  Scratch s;
  const RecipeResult r = s.load(
      "run:\n"
      "  name: x\n"
      "optimizer:\n"
      "  betas: [0.9, 0.95\n"
      "  lr: 0.1\n");
  REQUIRE(r.issues.size() == 1);
  const RecipeIssue& i = r.issues[0];
  CHECK(i.line == 5);
  CHECK(i.column == 5);
  CHECK(contains(i.message, "YAML syntax error"));
  CHECK(i.key_path.empty());

  const RecipeResult list = s.load("- a\n- b\n");
  REQUIRE(list.issues.size() == 1);
  CHECK(contains(list.issues[0].message, "a recipe is a mapping of sections"));
}

TEST_CASE("recipe: unimplemented features are refused") {
  Scratch s;
  const RecipeResult r = s.load(s.base() + "training: {precision: fp16}\n", {"model.arch=gpt2"});
  const RecipeIssue arch = issue_for(r, "model.arch");
  CHECK(arch.message == "gpt2 is not implemented yet");
  CHECK(arch.hint == "use llama, qwen2, qwen3 or mistral");
  CHECK(r.issues.size() == 1);  // every precision trains
  CHECK(s.load(s.base(), {"training.precision=fp16"}).issues.empty());
  CHECK(s.load(s.base(), {"training.precision=bf16"}).issues.empty());
}

TEST_CASE("recipe: model.arch qwen2, qwen3, mistral; head_dim other than dim / n_heads") {
  Scratch s;
  for (const char* arch : {"model.arch=qwen2", "model.arch=qwen3", "model.arch=mistral"})
    CHECK(s.load(s.base(), {arch}).issues.empty());
  // 7 heads of 16 need not divide dim; an odd head_dim is refused as an odd quotient is.
  CHECK(s.load(s.base(), {"model.n_heads=7", "model.n_kv_heads=7", "model.head_dim=16"})
            .issues.empty());
  const RecipeResult odd = s.load(s.base(), {"model.head_dim=15"});
  CHECK(issue_for(odd, "model.head_dim").message == "head_dim 15 is odd");
  CHECK(issue_for(s.load(s.base(), {"model.n_heads=7"}), "model.n_heads").hint ==
        "each head gets dim / n_heads channels; pick n_heads dividing dim, e.g. 8, or set "
        "model.head_dim");
}

TEST_CASE("recipe: fp16 loss scaling keys: defaults, ranges, powers of two") {
  Scratch s;
  const RecipeResult plain = s.load(s.base());
  REQUIRE(plain.ok());
  const ft::TrainingConfig& t = plain.recipe.training;
  CHECK(t.loss_scale == 0);  // dynamic, as DeepSpeed's fp16.loss_scale 0
  CHECK(t.loss_scale_window == 1000);
  CHECK(t.initial_loss_scale == 65536);
  CHECK(t.min_loss_scale == 1);
  CHECK(t.loss_scale_hysteresis == 2);
  CHECK(t.max_skipped_steps == 100);
  CHECK(plain.warnings.empty());

  const RecipeResult r = s.load(s.base() +
                                "training:\n"                   // 10
                                "  loss_scale: 1000\n"          // 11
                                "  loss_scale_window: 0\n"      // 12
                                "  initial_loss_scale: 0\n"     // 13
                                "  min_loss_scale: 0.3\n"       // 14
                                "  loss_scale_hysteresis: 0\n"  // 15
                                "  max_skipped_steps: -1\n");   // 16
  INFO(all_issues(r));
  auto check = [&](const char* key, int line, const char* message, const char* hint) {
    const RecipeIssue i = issue_for(r, key);
    CHECK(i.line == line);
    CHECK(i.message == message);
    CHECK(i.hint == hint);
  };
  check("training.loss_scale", 11, "1000 is not a power of two",
        "scaling by a power of two is exact; use 512 or 1024");
  check("training.loss_scale_window", 12, "0 is out of range: must be in [1, 1e+15]",
        "e.g. loss_scale_window: 1000");
  check("training.initial_loss_scale", 13, "0 is out of range: must be in (0, 4294967296]",
        "e.g. initial_loss_scale: 65536");
  check("training.min_loss_scale", 14, "0.3 is not a power of two",
        "scaling by a power of two is exact; use 0.25 or 0.5");
  check("training.loss_scale_hysteresis", 15, "0 is out of range: must be in [1, 1000000]",
        "e.g. loss_scale_hysteresis: 2");
  check("training.max_skipped_steps", 16, "-1 is out of range: must be in [1, 1e+15]",
        "e.g. max_skipped_steps: 100");
  CHECK(r.issues.size() == 6);

  // Beyond 2^32 (Megatron's initial scale), and a negative static scale.
  const RecipeResult big =
      s.load(s.base(), {"training.initial_loss_scale=8589934592", "training.loss_scale=-2"});
  CHECK(issue_for(big, "training.initial_loss_scale").message ==
        "8589934592 is out of range: must be in (0, 4294967296]");
  CHECK(issue_for(big, "training.loss_scale").message ==
        "-2 is out of range: must be in [0, 4294967296]");
  // Powers of two below 1 and at the bound are fine.
  CHECK(s.load(s.base(), {"training.min_loss_scale=0.0078125",
                          "training.initial_loss_scale=4294967296", "training.loss_scale=1"})
            .ok());

  // The dynamic scale falls from initial_loss_scale to min_loss_scale, never below.
  const RecipeResult order = s.load(s.base() +
                                    "training: {initial_loss_scale: 1024, "
                                    "min_loss_scale: 2048}\n");
  const RecipeIssue i = issue_for(order, "training.min_loss_scale");
  CHECK(i.line == 10);
  CHECK(i.message == "training.min_loss_scale 2048 exceeds training.initial_loss_scale 1024");
  CHECK(contains(i.hint, "make min_loss_scale <= initial_loss_scale"));
  CHECK(order.issues.size() == 1);
  CHECK(s.load(s.base(), {"training.initial_loss_scale=4", "training.min_loss_scale=4"}).ok());
}

TEST_CASE("recipe: fp16 loss scaling keys act only with fp16, which one warning says") {
  Scratch s;
  // Set with fp32 (the default) or bf16: one line naming the keys set away from their defaults.
  const RecipeResult fp32 = s.load(s.base() +
                                   "training: {loss_scale_window: 200, "
                                   "min_loss_scale: 1, max_skipped_steps: 5}\n");
  INFO(all_issues(fp32));
  REQUIRE(fp32.ok());
  REQUIRE(fp32.warnings.size() == 1);
  CHECK(fp32.warnings[0] ==
        "training.loss_scale_window, training.max_skipped_steps act only "
        "with training.precision fp16; ignored in this fp32 run");
  const RecipeResult bf16 = s.load(s.base(), {"training.precision=bf16", "training.loss_scale=8"});
  REQUIRE(bf16.warnings.size() == 1);
  CHECK(bf16.warnings[0] ==
        "training.loss_scale acts only with training.precision fp16; "
        "ignored in this bf16 run");
  // A resolved recipe writes every key at its value: no warning when loaded again.
  const RecipeResult again =
      load_recipe(s.write("resolved.yaml", ft::recipe_to_yaml(s.load(s.base()).recipe)), {}, 1);
  INFO(all_issues(again));
  REQUIRE(again.ok());
  CHECK(again.warnings.empty());

  // With fp16 the keys' own errors show.
  const RecipeResult fp16 = s.load(s.base() +
                                   "training: {precision: fp16, loss_scale_window: 0, "
                                   "loss_scale: 64, initial_loss_scale: 1024}\n");
  CHECK(issue_for(fp16, "training.loss_scale_window").message ==
        "0 is out of range: must be in [1, 1e+15]");
  CHECK(fp16.issues.size() == 1);
  // A static scale ignores the dynamic keys: said once, for those without an error of their own.
  REQUIRE(fp16.warnings.size() == 1);
  CHECK(fp16.warnings[0] ==
        "training.initial_loss_scale acts only with dynamic loss scaling "
        "(training.loss_scale 0); ignored with the static scale 64");
}

TEST_CASE("recipe: paths must exist") {
  Scratch s;
  s.write("tok.model", "not really a tokenizer");
  const RecipeResult r =
      s.load(s.base() + "tokenizer: {path: " + s.shards + "}\n",  // 10: a folder, not a file
             {"data.valid=no/such/dir", "model.from=~/models/llama"});
  INFO(all_issues(r));
  // A folder is taken when it holds tokenizer.model or tokenizer.json; this one holds neither.
  CHECK(issue_for(r, "tokenizer.path")
            .message.rfind(s.shards + ": a folder without tokenizer.model or tokenizer.json", 0) ==
        0);
  CHECK(issue_for(r, "tokenizer.path").line == 10);
  const RecipeIssue valid = issue_for(r, "data.valid");
  CHECK(valid.message == "\"no/such/dir\" does not exist");
  CHECK(contains(valid.hint, "relative paths are resolved against the current directory"));
  CHECK(contains(issue_for(r, "model.from").hint, "~ is not expanded"));
  CHECK(r.issues.size() == 3);

  const RecipeResult ok = s.load(s.base(), {"tokenizer.path=" + (s.dir / "tok.model").string()});
  CHECK(ok.ok());
  // Relative paths are kept as written.
  const fs::path cwd = fs::current_path();
  fs::current_path(s.dir);
  const RecipeResult rel = s.load(s.base(), {"data.train=shards"});
  fs::current_path(cwd);
  REQUIRE(rel.ok());
  CHECK(rel.recipe.data.train == "shards");
}

TEST_CASE("recipe: overrides") {
  Scratch s;
  const RecipeResult r = s.load(s.base() + "training: {steps: 50}\n",
                                {"training.steps=20", "optimizer.betas=[0.9,0.95]",
                                 "run.name=from cli", "data.shuffle=false", "optimizer.lr=1e-3"});
  INFO(all_issues(r));
  REQUIRE(r.ok());
  CHECK(r.recipe.training.steps == 20);  // the command line wins over the file
  CHECK(r.recipe.optimizer.beta1 == doctest::Approx(0.9));
  CHECK(r.recipe.optimizer.beta2 == doctest::Approx(0.95));
  CHECK(r.recipe.run.name == "from cli");
  CHECK(r.recipe.run.output_dir == "runs/from cli");
  CHECK(r.recipe.data.shuffle == false);
  CHECK(r.recipe.optimizer.lr == doctest::Approx(1e-3));

  const RecipeResult bad = s.load(s.base(), {"training.stepz=3", "training.steps", "lr=0.1",
                                             "optimizer.betas=[0.9", "training.steps=abc"});
  CHECK(bad.issues.size() == 5);
  for (const RecipeIssue& i : bad.issues) {
    CHECK(i.file == "<command line>");
    CHECK(i.line == 0);
    CHECK(contains(i.format(), "<command line>: "));
  }
  const RecipeIssue unknown = issue_for(bad, "training.stepz");
  CHECK(unknown.message == "unknown key in override `training.stepz=3`");
  CHECK(unknown.hint == "did you mean training.steps?");
  CHECK(issue_for(bad, "lr").hint == "did you mean optimizer.lr?");
  CHECK(contains(issue_for(bad, "optimizer.betas").message, "cannot parse the value"));
  // "training.steps" appears twice: once malformed (no '='), once with a bad value.
  const std::vector<RecipeIssue> steps = issues_for(bad, "training.steps");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].message == "not a KEY=VALUE override");
  CHECK(steps[1].message == "expected an integer, got the string \"abc\"");
}

// Every field, compared one by one (independently of the schema table, so a key missing from the
// table or from recipe_to_yaml shows up here).
void check_same(const Recipe& a, const Recipe& b) {
  CHECK(a.run.name == b.run.name);
  CHECK(a.run.output_dir == b.run.output_dir);
  CHECK(a.run.seed == b.run.seed);
  CHECK(a.model.arch == b.model.arch);
  CHECK(a.model.from == b.model.from);
  CHECK(a.model.dim == b.model.dim);
  CHECK(a.model.n_layers == b.model.n_layers);
  CHECK(a.model.n_heads == b.model.n_heads);
  CHECK(a.model.n_kv_heads == b.model.n_kv_heads);
  CHECK(a.model.ffn_dim == b.model.ffn_dim);
  CHECK(a.model.vocab_size == b.model.vocab_size);
  CHECK(a.model.max_seq_len == b.model.max_seq_len);
  CHECK(a.model.rope_theta == b.model.rope_theta);  // exact: the text must round-trip
  CHECK(a.model.norm_eps == b.model.norm_eps);
  CHECK(a.model.tie_embeddings == b.model.tie_embeddings);
  CHECK(a.model.init_std == b.model.init_std);
  CHECK(a.adapter.type == b.adapter.type);
  CHECK(a.adapter.r == b.adapter.r);
  CHECK(a.adapter.alpha == b.adapter.alpha);
  CHECK(a.adapter.dropout == b.adapter.dropout);
  CHECK(a.adapter.target_modules == b.adapter.target_modules);
  CHECK(a.adapter.use_rslora == b.adapter.use_rslora);
  CHECK(a.adapter.init == b.adapter.init);
  CHECK(a.adapter.from == b.adapter.from);
  CHECK(a.adapter.modules_to_save == b.adapter.modules_to_save);
  CHECK(a.tokenizer.path == b.tokenizer.path);
  CHECK(a.data.train == b.data.train);
  CHECK(a.data.valid == b.data.valid);
  CHECK(a.data.seq_len == b.data.seq_len);
  CHECK(a.data.shuffle == b.data.shuffle);
  CHECK(a.data.prefetch == b.data.prefetch);
  CHECK(a.training.steps == b.training.steps);
  CHECK(a.training.micro_batch_size == b.training.micro_batch_size);
  CHECK(a.training.global_batch_size == b.training.global_batch_size);
  CHECK(a.training.precision == b.training.precision);
  CHECK(a.training.grad_clip == b.training.grad_clip);
  CHECK(a.training.activation_checkpointing == b.training.activation_checkpointing);
  CHECK(a.training.eval_every_steps == b.training.eval_every_steps);
  CHECK(a.training.eval_batches == b.training.eval_batches);
  CHECK(a.training.loss_scale == b.training.loss_scale);
  CHECK(a.training.loss_scale_window == b.training.loss_scale_window);
  CHECK(a.training.initial_loss_scale == b.training.initial_loss_scale);
  CHECK(a.training.min_loss_scale == b.training.min_loss_scale);
  CHECK(a.training.loss_scale_hysteresis == b.training.loss_scale_hysteresis);
  CHECK(a.training.max_skipped_steps == b.training.max_skipped_steps);
  CHECK(a.optimizer.name == b.optimizer.name);
  CHECK(a.optimizer.lr == b.optimizer.lr);
  CHECK(a.optimizer.beta1 == b.optimizer.beta1);
  CHECK(a.optimizer.beta2 == b.optimizer.beta2);
  CHECK(a.optimizer.eps == b.optimizer.eps);
  CHECK(a.optimizer.weight_decay == b.optimizer.weight_decay);
  CHECK(a.scheduler.name == b.scheduler.name);
  CHECK(a.scheduler.warmup_steps == b.scheduler.warmup_steps);
  CHECK(a.scheduler.min_lr == b.scheduler.min_lr);
  CHECK(a.parallel.tensor == b.parallel.tensor);
  CHECK(a.parallel.pipeline == b.parallel.pipeline);
  CHECK(a.parallel.zero_stage == b.parallel.zero_stage);
  CHECK(a.checkpoint.dir == b.checkpoint.dir);
  CHECK(a.checkpoint.every_steps == b.checkpoint.every_steps);
  CHECK(a.checkpoint.every_minutes == b.checkpoint.every_minutes);
  CHECK(a.checkpoint.keep_last == b.checkpoint.keep_last);
  CHECK(a.checkpoint.async == b.checkpoint.async);
  CHECK(a.logging.every_steps == b.logging.every_steps);
  CHECK(a.logging.metrics == b.logging.metrics);
  CHECK(a.runtime.device == b.runtime.device);
  CHECK(a.runtime.threads == b.runtime.threads);
}

TEST_CASE("recipe: recipe_to_yaml round-trips every key") {
  Scratch s;
  s.write("tok.model", "x");
  fs::create_directories(s.dir / "valid");
  s.write("adapter/adapter_config.json",
          R"({"peft_type": "LORA", "r": 12, "lora_alpha": 0.3, "use_rslora": true,
              "target_modules": ["up_proj", "k_proj"], "ensure_weight_tying": true,
              "modules_to_save": ["lm_head", "embed_tokens"]})");
  s.write("adapter/adapter_model.safetensors", "");
  // Every key away from its default, with values that are awkward as text: a float that is not
  // exact in binary, a name that YAML would read as a number or null, a seed above 2^63.
  const std::vector<std::string> overrides = {"run.name=123",
                                              "run.output_dir=null dir/ok",
                                              "run.seed=18446744073709551615",
                                              "model.dim=96",
                                              "model.n_layers=3",
                                              "model.n_heads=6",
                                              "model.n_kv_heads=2",
                                              "model.ffn_dim=250",
                                              "model.vocab_size=300",
                                              "model.max_seq_len=1000",
                                              "model.rope_theta=123456.789",
                                              "model.norm_eps=3.3e-7",
                                              "model.tie_embeddings=true",
                                              "model.init_std=0.1",
                                              "adapter.type=lora",
                                              "adapter.r=12",
                                              "adapter.alpha=0.3",
                                              "adapter.dropout=0.05",
                                              "adapter.target_modules=[k_proj, up_proj]",
                                              "adapter.use_rslora=true",
                                              "adapter.init=gaussian",
                                              "adapter.from=" + (s.dir / "adapter").string(),
                                              "adapter.modules_to_save=[lm_head, embed_tokens]",
                                              "tokenizer.path=" + (s.dir / "tok.model").string(),
                                              "data.valid=" + (s.dir / "valid").string(),
                                              "data.seq_len=17",
                                              "data.shuffle=no",
                                              "data.prefetch=2",
                                              "training.steps=1234567890123",
                                              "training.micro_batch_size=3",
                                              "training.global_batch_size=9",
                                              "training.grad_clip=0.3",
                                              "training.activation_checkpointing=on",
                                              "training.loss_chunk_tokens=0",
                                              "training.eval_every_steps=7",
                                              "training.eval_batches=5",
                                              "training.loss_scale=256",
                                              "training.loss_scale_window=50",
                                              "training.initial_loss_scale=1024",
                                              "training.min_loss_scale=0.125",
                                              "training.loss_scale_hysteresis=3",
                                              "training.max_skipped_steps=7",
                                              "optimizer.lr=0.1",
                                              "optimizer.betas=[0.8, 0.9999]",
                                              "optimizer.eps=1e-12",
                                              "optimizer.weight_decay=0.01",
                                              "scheduler.name=cosine",
                                              "scheduler.warmup_steps=11",
                                              "scheduler.min_lr=1e-5",
                                              "parallel.zero_stage=3",
                                              "checkpoint.dir=\"~\"",
                                              "checkpoint.every_steps=13",
                                              "checkpoint.every_minutes=2.5",
                                              "checkpoint.keep_last=1",
                                              "checkpoint.async=true",
                                              "logging.every_steps=4",
                                              "logging.metrics=m.jsonl",
                                              "runtime.device=cpu",
                                              "runtime.threads=2"};
  const RecipeResult first = s.load(s.base(), overrides);
  INFO(all_issues(first));
  REQUIRE(first.ok());
  CHECK(first.recipe.run.name == "123");
  CHECK(first.recipe.checkpoint.dir == "~");
  CHECK(first.recipe.run.seed == 18446744073709551615ull);

  const std::string yaml = ft::recipe_to_yaml(first.recipe);
  INFO(yaml);
  CHECK(contains(yaml, "betas: [0.8, 0.9999]"));  // a flow list, as a person writes it
  CHECK(contains(yaml, "lr: 0.1"));               // shortest text, not 0.10000000000000001
  CHECK(contains(yaml, "target_modules: [k_proj, up_proj]"));  // in the order given
  CHECK(contains(yaml, "modules_to_save: [lm_head, embed_tokens]"));
  const RecipeResult second =
      load_recipe(s.write("resolved.yaml", yaml), {}, 1, /*refuse_unbuilt=*/false);
  INFO(all_issues(second));
  REQUIRE(second.ok());
  check_same(first.recipe, second.recipe);
  // Keys appear in schema order: sections as in DESIGN.md §5.
  CHECK(yaml.find("run:") < yaml.find("model:"));
  CHECK(yaml.find("model:") < yaml.find("adapter:"));
  CHECK(yaml.find("adapter:") < yaml.find("tokenizer:"));
  CHECK(yaml.find("checkpoint:") < yaml.find("logging:"));
  CHECK(yaml.find("logging:") < yaml.find("runtime:"));

  // The defaults round-trip as well (empty optional paths, derived directories).
  const RecipeResult plain = s.load(s.base());
  REQUIRE(plain.ok());
  const std::string plain_yaml = ft::recipe_to_yaml(plain.recipe);
  // Without an adapter the section is left out: resolved recipes read as before it existed.
  CHECK(!contains(plain_yaml, "adapter"));
  const RecipeResult again = load_recipe(s.write("plain.yaml", plain_yaml), {}, 1);
  INFO(all_issues(again));
  REQUIRE(again.ok());
  check_same(plain.recipe, again.recipe);

  // An adapter with its defaults: every key written, lists in flow style, and read back.
  const RecipeResult lora = s.load(s.base(), {"adapter.type=lora"});
  REQUIRE(lora.ok());
  const std::string lora_yaml = ft::recipe_to_yaml(lora.recipe);
  CHECK(contains(lora_yaml, "target_modules: [q_proj, v_proj]"));
  CHECK(contains(lora_yaml, "modules_to_save: []"));
  CHECK(contains(lora_yaml, "from: \"\""));
  const RecipeResult lora_again = load_recipe(s.write("lora.yaml", lora_yaml), {}, 1);
  INFO(all_issues(lora_again));
  REQUIRE(lora_again.ok());
  check_same(lora.recipe, lora_again.recipe);
}

TEST_CASE("recipe: model.from takes sizes from config.json") {
  Scratch s;
  const std::string hf = s.write("hf/config.json", hf_config_json());
  s.write("hf/model.safetensors", "");  // only its presence is checked at validation
  const std::string hf_dir = (s.dir / "hf").string();
  const std::string yaml =
      "model:\n"  // 1
      "  from: " +
      hf_dir +
      "\n"            // 2
      "  dim: 256\n"  // 3: agrees
      "data: {train: " +
      s.shards + ", seq_len: 128}\n";

  SUBCASE("sizes come from the file; agreeing recipe keys are fine") {
    const RecipeResult r = s.load(yaml);
    INFO(all_issues(r));
    REQUIRE(r.ok());
    const ft::ModelConfig& m = r.recipe.model;
    CHECK(m.from == hf_dir);
    CHECK(m.dim == 256);
    CHECK(m.n_layers == 3);
    CHECK(m.n_heads == 8);
    CHECK(m.n_kv_heads == 2);
    CHECK(m.ffn_dim == 688);
    CHECK(m.vocab_size == 1000);
    CHECK(m.max_seq_len == 512);
    CHECK(m.rope_theta == 500000.0);
    CHECK(m.norm_eps == 1e-6);
    CHECK(m.tie_embeddings == true);
    // The resolved recipe (with from and every size written out) loads again.
    const RecipeResult again =
        load_recipe(s.write("again.yaml", ft::recipe_to_yaml(r.recipe)), {}, 1);
    INFO(all_issues(again));
    CHECK(again.ok());
  }
  SUBCASE("a disagreeing recipe key is an issue naming both") {
    const RecipeResult r = s.load(yaml, {"model.n_kv_heads=4", "model.tie_embeddings=false"});
    const RecipeResult r2 =
        s.load("model:\n  from: " + hf_dir + "\n  dim: 512\ndata: {train: " + s.shards + "}\n");
    const RecipeIssue dim = issue_for(r2, "model.dim");
    CHECK(dim.line == 3);
    CHECK(dim.column == 8);
    CHECK(dim.message == "model.dim = 512 but " + hf + " has hidden_size 256");
    CHECK(dim.hint == "remove model.dim or make it match");
    CHECK(issue_for(r, "model.n_kv_heads").message ==
          "model.n_kv_heads = 4 but " + hf + " has num_key_value_heads 2");
    CHECK(contains(issue_for(r, "model.tie_embeddings").message, "tie_word_embeddings true"));
    CHECK(r.issues.size() == 2);
  }
  SUBCASE("weights ft cannot read: refused at validation, as train would") {
    s.write("bin/config.json", hf_config_json());
    s.write("bin/pytorch_model.bin", "");
    const RecipeResult r = s.load("model:\n  from: " + (s.dir / "bin").string() +
                                  "\ndata: {train: " + s.shards + "}\n");
    const RecipeIssue i = issue_for(r, "model.from");
    CHECK(i.message == (s.dir / "bin").string() +
                           " has no model.safetensors or model.safetensors.index.json (it holds "
                           "pytorch_model.bin)");
    CHECK(contains(i.hint, "ft reads safetensors only"));
    CHECK(r.issues.size() == 1);
  }
  SUBCASE("rules across keys see the sizes from config.json") {
    // max_position_embeddings is 512 in the file.
    const RecipeResult r = s.load(yaml, {"data.seq_len=1024"});
    const RecipeIssue i = issue_for(r, "data.seq_len");
    CHECK(i.message == "data.seq_len 1024 exceeds model.max_seq_len 512");
    // Tensor parallel 4 cannot split 2 KV heads; the issue points at parallel.tensor.
    const RecipeResult t = s.load(yaml, {"parallel.tensor=4"}, 4);
    CHECK(issue_for(t, "parallel.tensor").message ==
          "model.n_kv_heads 2 does not split evenly over parallel.tensor 4");
  }
  SUBCASE("a missing or malformed config.json is an issue naming the file") {
    fs::create_directories(s.dir / "empty");
    const RecipeResult r = s.load(s.base(), {"model.from=" + (s.dir / "empty").string()});
    const RecipeIssue i = issue_for(r, "model.from");
    CHECK(i.file == "<command line>");
    CHECK(contains(i.message, (s.dir / "empty" / "config.json").string()));
    CHECK(contains(i.hint, "a Hugging Face model folder of a family ft trains"));

    s.write("broken/config.json", "{\"hidden_size\": 12,");
    const RecipeResult b = s.load("model:\n  from: " + (s.dir / "broken").string() +
                                  "\ndata: {train: " + s.shards + "}\n");
    const RecipeIssue bi = issue_for(b, "model.from");
    CHECK(bi.line == 2);
    CHECK(bi.column == 9);
    CHECK(contains(bi.message, "not valid JSON"));
    CHECK(b.issues.size() == 1);  // sizes are not also reported missing
  }
}

TEST_CASE("recipe: read_hf_config defaults and refusals") {
  Scratch s;
  // Older configs have neither num_key_value_heads nor rope_theta nor tie_word_embeddings.
  s.write("old/config.json",
          "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
          " \"intermediate_size\": 100, \"vocab_size\": 50, \"max_position_embeddings\": 128,"
          " \"rms_norm_eps\": 1e-5}");
  const ft::ModelConfig m = ft::read_hf_config((s.dir / "old").string());
  CHECK(m.n_kv_heads == 4);
  CHECK(m.rope_theta == 10000.0);
  CHECK(m.tie_embeddings == false);
  CHECK(m.arch == "llama");

  s.write("mistral/config.json", hf_config_json(256,
                                                "  \"rope_scaling\": {\"type\": \"linear\"},\n"
                                                "  \"hidden_act\": \"gelu\",\n"
                                                "  \"num_hidden_layers\": 2.5,\n"));
  std::string what;
  try {
    ft::read_hf_config((s.dir / "mistral").string());
  } catch (const ft::Error& e) {
    what = e.what();
  }
  // Every problem in one message: the user fixes the file in one pass.
  CHECK(contains(what, "rope_scaling"));
  CHECK(contains(what, "hidden_act"));
  CHECK(contains(what, "num_hidden_layers"));

  s.write("gpt/config.json",
          "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"]}");
  CHECK_THROWS_WITH_AS(
      ft::read_hf_config((s.dir / "gpt").string()),
      doctest::Contains("model_type is \"gpt2\"; implemented: LlamaForCausalLM (llama)"),
      ft::Error);
}

TEST_CASE("recipe: every issue is reported at once, in file order, then the command line") {
  Scratch s;
  const RecipeResult r = s.load(
      "run:\n"                    // 1
      "  nme: x\n"                // 2
      "model:\n"                  // 3
      "  dim: 64\n"               // 4
      "  n_layers: 2\n"           // 5
      "  n_heads: 3\n"            // 6: 64 % 3
      "  ffn_dim: 172\n"          // 7
      "  vocab_size: 256\n"       // 8
      "training: {steps: -1}\n",  // 9
      {"optimizer.lr=-1"});
  INFO(all_issues(r));
  REQUIRE(r.issues.size() == 5);
  CHECK(r.issues[0].key_path == "run.nme");
  CHECK(r.issues[1].key_path == "model.n_heads");
  CHECK(r.issues[2].key_path == "training.steps");
  CHECK(r.issues[3].key_path == "data.train");  // no position: after the located ones
  CHECK(r.issues[4].key_path == "optimizer.lr");
  CHECK(r.issues[4].file == "<command line>");

  std::string what;
  try {
    ft::load_recipe_or_throw((s.dir / "recipe.yaml").string(), {"optimizer.lr=-1"});
  } catch (const ft::UsageError& e) {
    what = e.what();
    CHECK(e.code() == ft::ExitCode::kUsage);
  }
  CHECK(contains(what, r.issues[0].format() + "\n"));
  CHECK(contains(what, "5 problems in recipe "));
}

TEST_CASE("recipe: RecipeIssue::format") {
  RecipeIssue i{"r.yaml", 3, 7, "model.dim", "expected an integer", "e.g. dim: 256"};
  CHECK(i.format() == "r.yaml:3:7: model.dim: expected an integer (hint: e.g. dim: 256)");
  i.hint.clear();
  CHECK(i.format() == "r.yaml:3:7: model.dim: expected an integer");
  RecipeIssue cli{"<command line>", 0, 0, "training.stepz", "unknown key", "did you mean x?"};
  CHECK(cli.format() == "<command line>: training.stepz: unknown key (hint: did you mean x?)");
}

TEST_CASE("recipe: derived sizes") {
  Recipe r;
  r.parallel.tensor = 2;
  r.parallel.pipeline = 2;
  r.training.micro_batch_size = 3;
  r.training.global_batch_size = 24;
  CHECK(ft::data_parallel_size(r, 8) == 2);
  CHECK(ft::grad_accum_steps(r, 8) == 4);
  CHECK(ft::grad_accum_steps(r, 4) == 8);
  CHECK_THROWS_AS(ft::data_parallel_size(r, 6), ft::Error);
  CHECK_THROWS_AS(ft::grad_accum_steps(r, 12), ft::Error);  // 3 data ranks: 24 % (3 × 3) != 0
}

TEST_CASE("recipe: what this build cannot run is refused, so validate and train agree") {
  Scratch s;
  const std::string path = s.write("recipe.yaml", s.base() +
                                                      "runtime: {device: cuda}\n"             // 10
                                                      "parallel: {tensor: 2, pipeline: 2}\n"  // 11
                                                      "checkpoint: {every_steps: 10}\n");     // 12
  RecipeResult res = load_recipe(path, {"checkpoint.every_minutes=5"}, 0);
  std::vector<std::string> keys;
  for (const auto& i : res.issues) keys.push_back(i.key_path);
  // Without a CUDA backend (none is registered in the unit tests) only the CUDA device is
  // refused: periodic checkpoints are built.
  REQUIRE(keys == std::vector<std::string>{"runtime.device"});
  CHECK(res.issues[0].line == 10);
  {
    // With one (a stand-in here: the recipe never asks it anything), device: cuda is the
    // trainer's question (is a GPU there?), not the recipe's: nothing is refused.
    static const CudaBackend stand_in{
        [] { return std::string("stand-in"); },
        [](const DeviceOptions&) { return std::unique_ptr<Device>(); },
        [] { return std::string("stand-in"); }};
    register_cuda_backend(&stand_in);
    const RecipeResult with = load_recipe(path, {"checkpoint.every_minutes=5"}, 0);
    register_cuda_backend(nullptr);
    CHECK(with.issues.empty());
  }
  // The same recipe is fine as far as the format goes (world 4 = tensor 2 x pipeline 2).
  CHECK(load_recipe(path, {}, 4, /*refuse_unbuilt=*/false).ok());
}

TEST_CASE("recipe: data.pack on a CUDA device needs the fused attention kernel's shapes") {
  Scratch s;
  std::string yaml = s.base();  // its line 9 is "data: {train: ...}": packed there
  yaml.insert(yaml.rfind('}'), ", pack: true");
  const std::string path = s.write("recipe.yaml", yaml);
  // A stand-in CUDA backend whose GPU is usable or not (auto then means the CPU).
  static const CudaBackend usable{[] { return std::string(); },
                                  [](const DeviceOptions&) { return std::unique_ptr<Device>(); },
                                  [] { return std::string("stand-in"); }};
  static const CudaBackend no_gpu{[] { return std::string("no GPU here"); },
                                  [](const DeviceOptions&) { return std::unique_ptr<Device>(); },
                                  [] { return std::string("stand-in"); }};
  auto load_with = [&](const CudaBackend* b, std::vector<std::string> overrides) {
    register_cuda_backend(b);
    RecipeResult res = load_recipe(path, overrides, 0);
    register_cuda_backend(nullptr);
    return res;
  };
  // fp32 at head dim 16 (dim 64 / 4 heads) on runtime.device: cuda: the first step's attention
  // would refuse the segments; the recipe check says so at data.pack, naming the keys.
  const RecipeResult cuda = load_with(&no_gpu, {"runtime.device=cuda"});
  const RecipeIssue i = issue_for(cuda, "data.pack");
  CHECK(cuda.issues.size() == 1);
  CHECK(i.line == 9);
  CHECK(contains(i.message, "runtime.device: cuda"));
  CHECK(contains(i.message, "fused attention kernel"));
  CHECK(contains(i.message, "training.precision fp32"));
  CHECK(contains(i.message, "head dim 16 (model.dim 64 / model.n_heads 4)"));
  CHECK(contains(i.hint, "training.precision: bf16"));
  CHECK(contains(i.hint, "data.pack: false"));
  // bf16 alone is not enough at head dim 16; an explicit head_dim is named as such.
  CHECK(contains(
      issue_for(load_with(&no_gpu, {"runtime.device=cuda", "training.precision=bf16"}), "data.pack")
          .message,
      "training.precision bf16 and head dim 16"));
  CHECK(contains(
      issue_for(load_with(&no_gpu, {"runtime.device=cuda", "model.head_dim=32"}), "data.pack")
          .message,
      "and model.head_dim 32"));
  // The shapes the kernel takes: bf16 or fp16 at head dim 64 (dim 256 / 4) or 128.
  CHECK(
      load_with(&no_gpu, {"runtime.device=cuda", "training.precision=bf16", "model.dim=256"}).ok());
  CHECK(load_with(&no_gpu, {"runtime.device=cuda", "training.precision=fp16", "model.head_dim=128"})
            .ok());
  // auto: refused where a usable GPU is here (ft train would take it), not where there is none.
  const RecipeResult with_gpu = load_with(&usable, {});
  CHECK(contains(issue_for(with_gpu, "data.pack").message,
                 "runtime.device: auto, and a usable GPU is here"));
  CHECK(load_with(&no_gpu, {}).ok());
  // The CPU, or no packing, or a build without a CUDA backend (runtime.device: auto is the CPU).
  CHECK(load_with(&usable, {"runtime.device=cpu"}).ok());
  CHECK(load_with(&usable, {"data.pack=false"}).ok());
  CHECK(load_with(nullptr, {}).ok());
}

TEST_CASE("recipe: the vocabulary must split over the tensor ranks (no silent padding)") {
  Scratch s;
  RecipeResult res = s.load(s.base(), {"parallel.tensor=2", "model.vocab_size=255"}, 2);
  REQUIRE(res.issues.size() == 1);
  CHECK(res.issues[0].key_path == "parallel.tensor");
  CHECK(res.issues[0].message ==
        "model.vocab_size 255 does not split evenly over parallel.tensor 2");
  CHECK(s.load(s.base(), {"parallel.tensor=2"}, 2).ok());  // vocab 256
}

TEST_CASE("recipe: adapter: none by default; names as a YAML list, one name, or an override") {
  Scratch s;
  const RecipeResult plain = s.load(s.base());
  REQUIRE(plain.ok());
  CHECK(plain.recipe.adapter.type == "none");
  CHECK(!plain.recipe.adapter.enabled());
  CHECK(plain.recipe.adapter.target_modules == std::vector<std::string>{"q_proj", "v_proj"});

  const RecipeResult block = s.load(s.base() +
                                    "adapter:\n"            // 10
                                    "  type: lora\n"        // 11
                                    "  r: 16\n"             // 12
                                    "  alpha: 32\n"         // 13
                                    "  dropout: 0.1\n"      // 14
                                    "  target_modules:\n"   // 15
                                    "    - o_proj\n"        // 16
                                    "    - q_proj\n"        // 17
                                    "  use_rslora: true\n"  // 18
                                    "  init: gaussian\n");  // 19
  INFO(all_issues(block));
  REQUIRE(block.ok());
  const ft::AdapterConfig& a = block.recipe.adapter;
  CHECK(a.type == "lora");
  CHECK(a.r == 16);
  CHECK(a.alpha == 32);
  CHECK(a.dropout == doctest::Approx(0.1));
  CHECK(a.target_modules == std::vector<std::string>{"o_proj", "q_proj"});  // as given
  CHECK(a.use_rslora);
  CHECK(a.init == "gaussian");
  CHECK(a.modules_to_save.empty());

  const std::string lora = s.base() + "adapter: {type: lora, target_modules: [k_proj, v_proj]}\n";
  CHECK(s.load(lora).recipe.adapter.target_modules == std::vector<std::string>{"k_proj", "v_proj"});
  // PEFT's string form: one name alone is a list of one, in the file and on the command line.
  const RecipeResult all = s.load(s.base() + "adapter: {type: lora, target_modules: all-linear}\n");
  REQUIRE(all.ok());
  CHECK(all.recipe.adapter.target_modules == std::vector<std::string>{"all-linear"});
  CHECK(all.recipe.adapter.targets().size() == 7);
  const RecipeResult cli =
      s.load(lora, {"adapter.target_modules=all-linear", "adapter.modules_to_save=[lm_head]"});
  REQUIRE(cli.ok());
  CHECK(cli.recipe.adapter.target_modules == std::vector<std::string>{"all-linear"});
  CHECK(cli.recipe.adapter.modules_to_save == std::vector<std::string>{"lm_head"});
  CHECK(s.load(lora, {"adapter.target_modules=[gate_proj,up_proj,down_proj]"})
            .recipe.adapter.target_modules ==
        std::vector<std::string>{"gate_proj", "up_proj", "down_proj"});
}

TEST_CASE("recipe: adapter: wrong values, names and lists") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                "adapter:\n"                                 // 10
                                "  type: lora\n"                             // 11
                                "  r: 0\n"                                   // 12
                                "  alpha: 0\n"                               // 13
                                "  dropout: 1\n"                             // 14
                                "  target_modules: [q_proj, lm_head]\n"      // 15
                                "  init: xavier\n"                           // 16
                                "  modules_to_save: [lm_head, lm_head]\n");  // 17
  INFO(all_issues(r));
  CHECK(issue_for(r, "adapter.r").message == "0 is out of range: must be in [1, 4096]");
  CHECK(issue_for(r, "adapter.alpha").message == "0 is out of range: must be in (0, 1000000]");
  CHECK(issue_for(r, "adapter.dropout").message == "1 is out of range: must be in [0, 1)");
  CHECK(issue_for(r, "adapter.init").message == "\"xavier\" is not one of kaiming, gaussian");
  // The issue points at the name in the list.
  const RecipeIssue head = issue_for(r, "adapter.target_modules");
  CHECK(head.line == 15);
  CHECK(head.column == 28);
  CHECK(head.message == "LoRA on lm_head is not supported");
  CHECK(head.hint == "use adapter.modules_to_save: [lm_head] to train it whole");
  const RecipeIssue twice = issue_for(r, "adapter.modules_to_save");
  CHECK(twice.line == 17);
  CHECK(twice.column == 30);
  CHECK(twice.message == "lm_head is listed twice");
  CHECK(r.issues.size() == 6);

  const std::string lora = s.base() + "adapter: {type: lora}\n";
  auto only = [&](const std::vector<std::string>& overrides, const std::string& key) {
    const RecipeResult res = s.load(lora, overrides);
    INFO(all_issues(res));
    CHECK(res.issues.size() == 1);
    return issue_for(res, key);
  };
  const RecipeIssue typo = only({"adapter.target_modules=[q_prj]"}, "adapter.target_modules");
  CHECK(typo.message ==
        "\"q_prj\" is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
        "all-linear");
  CHECK(typo.hint == "did you mean q_proj?");
  CHECK(only({"adapter.target_modules=[model.layers.0.mlp]"}, "adapter.target_modules").hint ==
        "e.g. target_modules: [q_proj, v_proj]");
  CHECK(only({"adapter.target_modules=[embed_tokens]"}, "adapter.target_modules").hint ==
        "use adapter.modules_to_save: [embed_tokens] to train it whole");
  CHECK(
      only({"adapter.target_modules=[v_proj, q_proj, v_proj]"}, "adapter.target_modules").message ==
      "v_proj is listed twice");
  const RecipeIssue none = only({"adapter.target_modules=[]"}, "adapter.target_modules");
  CHECK(none.message == "names no module");
  CHECK(contains(none.hint, "[all-linear]"));
  CHECK(only({"adapter.target_modules="}, "adapter.target_modules").message == "names no module");
  const RecipeIssue mixed =
      only({"adapter.target_modules=[all-linear, q_proj]"}, "adapter.target_modules");
  CHECK(mixed.message == "all-linear names every linear layer and stands alone");
  CHECK(only({"adapter.modules_to_save=[norm]"}, "adapter.modules_to_save").message ==
        "\"norm\" is not one of embed_tokens, lm_head");
  // Lists of names, not of other things.
  CHECK(only({"adapter.target_modules={q_proj: 1}"}, "adapter.target_modules").message ==
        "expected a list of names, got a mapping");
  CHECK(only({"adapter.target_modules=[q_proj, [v_proj]]"}, "adapter.target_modules").message ==
        "expected a list of names, got a list holding a list");
  CHECK(only({"adapter.type=lora_plus"}, "adapter.type").message ==
        "\"lora_plus\" is not one of none, lora, qlora");
}

TEST_CASE("recipe: adapter keys set while adapter.type is none") {
  Scratch s;
  const RecipeResult r = s.load(s.base() +
                                    "adapter:\n"                      // 10
                                    "  r: 16\n"                       // 11
                                    "  target_modules: [lm_head]\n",  // 12
                                {"adapter.use_rslora=true"});
  INFO(all_issues(r));
  const RecipeIssue rank = issue_for(r, "adapter.r");
  CHECK(rank.line == 11);
  CHECK(rank.message == "adapter.r is set but adapter.type is none");
  CHECK(rank.hint == "set adapter.type: lora");
  // Said once per key: the bad name is not reported as well.
  CHECK(issue_for(r, "adapter.target_modules").message ==
        "adapter.target_modules is set but adapter.type is none");
  CHECK(issue_for(r, "adapter.use_rslora").file == "<command line>");
  CHECK(r.issues.size() == 3);
  // type: none written out, alone, is fine.
  CHECK(s.load(s.base() + "adapter: {type: none}\n").ok());
}

TEST_CASE("recipe: adapter.from: a PEFT folder whose adapter the recipe describes") {
  Scratch s;
  const std::string dir = (s.dir / "peft").string();
  const std::string config = dir + "/adapter_config.json";
  // As PEFT's save_pretrained writes it (target_modules a set, in any order).
  auto write_config = [&](const std::string& extra) {
    s.write("peft/adapter_config.json",
            "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": 16, "
            "\"lora_alpha\": 32, \"lora_dropout\": 0.05, \"bias\": \"none\", "
            "\"use_dora\": false, \"modules_to_save\": null, \"rank_pattern\": {}, "
            "\"alpha_pattern\": {}, \"layers_to_transform\": null, " +
                extra + "}");
  };
  const std::string lora = s.base() +
                           "adapter:\n"      // 10
                           "  type: lora\n"  // 11
                           "  r: 16\n"       // 12
                           "  alpha: 32\n"   // 13
                           "  from: " +
                           dir + "\n";  // 14
  fs::create_directories(dir);

  SUBCASE("both files must be there") {
    const RecipeIssue i = issue_for(s.load(lora), "adapter.from");
    CHECK(i.line == 14);
    CHECK(i.message == dir + " has no adapter_config.json or adapter_model.safetensors");
    write_config("\"target_modules\": [\"v_proj\", \"q_proj\"]");
    s.write("peft/adapter_model.bin", "");
    const RecipeIssue bin = issue_for(s.load(lora), "adapter.from");
    CHECK(bin.message == dir + " has no adapter_model.safetensors");
    CHECK(contains(bin.hint, "ft reads safetensors only"));
  }
  s.write("peft/adapter_model.safetensors", "");  // only its presence is checked at validation

  SUBCASE("agreeing: the same modules in any order; all-linear as the list it stood for") {
    write_config("\"target_modules\": [\"v_proj\", \"q_proj\"]");
    const RecipeResult r = s.load(lora);
    INFO(all_issues(r));
    CHECK(r.ok());
    write_config(
        "\"target_modules\": [\"down_proj\", \"up_proj\", \"gate_proj\", \"o_proj\", "
        "\"v_proj\", \"k_proj\", \"q_proj\"], \"use_rslora\": false");
    CHECK(s.load(lora, {"adapter.target_modules=all-linear"}).ok());
    write_config("\"target_modules\": \"all-linear\"");
    CHECK(s.load(lora, {"adapter.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                        "down_proj]"})
              .ok());
    // peft 0.21 writes all-linear as the modules' whole paths, every layer's.
    write_config(
        "\"target_modules\": [\"model.layers.1.self_attn.v_proj\", "
        "\"model.layers.0.self_attn.q_proj\", \"model.layers.1.self_attn.q_proj\", "
        "\"model.layers.0.self_attn.v_proj\"]");
    CHECK(s.load(lora).ok());
    write_config("\"target_modules\": [\"model.layers.0.self_attn.q_proj\", \"k_proj\"]");
    CHECK(issue_for(s.load(lora), "adapter.target_modules").message ==
          "adapter.target_modules = [q_proj, v_proj] (its default) but " + config +
              " has target_modules [\"model.layers.0.self_attn.q_proj\",\"k_proj\"]");
  }
  SUBCASE("disagreeing: an issue naming both values and the file") {
    write_config("\"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\"], \"use_rslora\": true");
    const RecipeResult r = s.load(lora, {"adapter.r=8", "adapter.alpha=16"});
    INFO(all_issues(r));
    const RecipeIssue rank = issue_for(r, "adapter.r");
    CHECK(rank.file == "<command line>");  // where it was written last
    CHECK(rank.message == "adapter.r = 8 but " + config + " has r 16");
    CHECK(rank.hint == "make adapter.r match the adapter it continues");
    CHECK(issue_for(r, "adapter.alpha").message ==
          "adapter.alpha = 16 but " + config + " has lora_alpha 32");
    // Keys the recipe does not write are compared at their defaults, at adapter.from.
    const RecipeIssue targets = issue_for(r, "adapter.target_modules");
    CHECK(targets.line == 14);
    CHECK(targets.message == "adapter.target_modules = [q_proj, v_proj] (its default) but " +
                                 config + " has target_modules [\"q_proj\",\"k_proj\",\"v_proj\"]");
    CHECK(issue_for(r, "adapter.use_rslora").message ==
          "adapter.use_rslora = false (its default) but " + config + " has use_rslora true");
    CHECK(r.issues.size() == 4);
    // A file without use_rslora (PEFT before rsLoRA) reads as false.
    write_config("\"target_modules\": [\"q_proj\", \"v_proj\"]");
    CHECK(s.load(lora).ok());
    CHECK(issue_for(s.load(lora, {"adapter.use_rslora=true"}), "adapter.use_rslora").message ==
          "adapter.use_rslora = true but " + config + " has no use_rslora");
  }
  SUBCASE("what the file asks for beyond a plain LoRA is refused by name") {
    write_config(
        "\"target_modules\": [\"q_proj\", \"v_proj\"], \"use_dora\": true, \"bias\": \"all\", "
        "\"trainable_token_indices\": [7], \"rank_pattern\": {\"q_proj\": 4}");
    const RecipeResult r = s.load(lora);
    INFO(all_issues(r));
    const std::vector<RecipeIssue> from = issues_for(r, "adapter.from");
    REQUIRE(from.size() == 4);
    CHECK(from[0].message == config + ": use_dora is true; DoRA is not built in this ft");
    CHECK(from[0].hint == "continue an adapter saved without use_dora (PEFT's default)");
    CHECK(from[1].message == config + ": bias is \"all\"; ft's LoRA trains no biases");
    CHECK(from[2].message ==
          config + ": trainable_token_indices is [7]; ft does not train single embedding rows");
    CHECK(from[3].message ==
          config + ": rank_pattern is {\"q_proj\":4}; ft's LoRA has one r for every module");
    CHECK(r.issues.size() == 4);
    s.write("peft/adapter_config.json", "{\"peft_type\": \"PREFIX_TUNING\", \"r\": 16}");
    CHECK(issue_for(s.load(lora), "adapter.from").message ==
          config + ": peft_type is \"PREFIX_TUNING\"; ft continues LORA adapters only");
  }
  SUBCASE("modules_to_save: embed_tokens and lm_head, as the recipe's; tied, only tied") {
    // PEFT's names or module paths, compared with the recipe's as sets.
    write_config(
        "\"target_modules\": [\"q_proj\", \"v_proj\"], "
        "\"modules_to_save\": [\"lm_head\", \"model.embed_tokens\"]");
    CHECK(s.load(lora, {"adapter.modules_to_save=[embed_tokens, lm_head]"}).ok());
    const RecipeResult none = s.load(lora);
    const RecipeIssue differ = issue_for(none, "adapter.modules_to_save");
    CHECK(differ.line == 14);  // not written: at adapter.from
    CHECK(differ.message == "adapter.modules_to_save = [] (its default) but " + config +
                                " has modules_to_save [\"lm_head\",\"model.embed_tokens\"]");
    CHECK(differ.hint == "make adapter.modules_to_save match the adapter it continues");
    CHECK(none.issues.size() == 1);
    write_config("\"target_modules\": [\"q_proj\", \"v_proj\"], \"modules_to_save\": [\"norm\"]");
    const RecipeIssue other = issue_for(s.load(lora), "adapter.from");
    CHECK(other.message == config +
                               ": modules_to_save is [\"norm\"]; ft trains embed_tokens and "
                               "lm_head whole, nothing else");
    // Tied embeddings: PEFT trains the shared table only with ensure_weight_tying (it then saves
    // the list it rewrote, the embedding's path for lm_head); any list of the recipe names it.
    write_config(
        "\"target_modules\": [\"q_proj\", \"v_proj\"], \"modules_to_save\": [\"lm_head\"]");
    const RecipeResult untied =
        s.load(lora, {"model.tie_embeddings=true", "adapter.modules_to_save=[lm_head]"});
    INFO(all_issues(untied));
    CHECK(contains(issue_for(untied, "adapter.from").message,
                   config + ": modules_to_save is [\"lm_head\"] on a model with tied embeddings, "
                            "without ensure_weight_tying: true"));
    CHECK(untied.issues.size() == 1);
    write_config(
        "\"target_modules\": [\"q_proj\", \"v_proj\"], \"ensure_weight_tying\": true, "
        "\"modules_to_save\": [\"model.embed_tokens\"]");
    CHECK(s.load(lora, {"model.tie_embeddings=true", "adapter.modules_to_save=[lm_head]"}).ok());
    CHECK(!s.load(lora, {"adapter.modules_to_save=[lm_head]"}).ok());  // untied: not the same
  }
  SUBCASE("a malformed adapter_config.json is one issue naming the file") {
    s.write("peft/adapter_config.json", "{\"r\": 16,");
    const RecipeResult r = s.load(lora);
    CHECK(contains(issue_for(r, "adapter.from").message, config + ": not valid JSON"));
    CHECK(r.issues.size() == 1);
    s.write("peft/adapter_config.json", "[16]");
    CHECK(contains(issue_for(s.load(lora), "adapter.from").message,
                   "expected a JSON object at the top level"));
  }
}

TEST_CASE(
    "recipe: qlora with modules_to_save; the layouts that would split NF4 blocks are refused") {
  Scratch s;
  const std::string path = s.write("recipe.yaml", s.base() +
                                                      "adapter:\n"                        // 10
                                                      "  type: qlora\n"                   // 11
                                                      "  modules_to_save: [lm_head]\n");  // 12
  // The format allows it.
  CHECK(load_recipe(path, {}, 1, /*refuse_unbuilt=*/false).ok());
  const RecipeResult r = load_recipe(path, {}, 1);
  INFO(all_issues(r));
  CHECK(r.ok());  // both are built
  // QLoRA quantizes each block whole on the rank holding it: no tensor slices, no ZeRO-3 shards.
  const RecipeResult t =
      load_recipe(path, {"parallel.tensor=2", "training.global_batch_size=2"}, 2);
  INFO(all_issues(t));
  CHECK(issue_for(t, "parallel.tensor").message ==
        "qlora holds each block's NF4 weights whole on its rank, and tensor parallelism splits "
        "them");
  CHECK(t.issues.size() == 1);
  const RecipeResult z =
      load_recipe(path, {"parallel.zero_stage=3", "training.global_batch_size=2"}, 2);
  INFO(all_issues(z));
  CHECK(issue_for(z, "parallel.zero_stage").hint.find("zero_stage: 2 or less") !=
        std::string::npos);
  CHECK(z.issues.size() == 1);
  CHECK(load_recipe(path, {"parallel.zero_stage=2", "training.global_batch_size=2"}, 2).ok());
  CHECK(load_recipe(path,
                    {"adapter.type=lora", "parallel.tensor=2", "training.global_batch_size=2"}, 2)
            .ok());
}
