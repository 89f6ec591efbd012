// ft's command line: parses it (CLI11), runs the command and maps errors to exit codes; the work
// is in lib/. main.cpp calls it; this file is compiled once for ft and the test tool ft_emu
// (CLI11 is a header-only library, and the largest part of the compile time of apps/).
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "apps/ft/cli_checks.h"
#include "apps/ft/commands.h"
#include "comm/device_comm.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"
#include "core/log.h"
#include "data/shard.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "runtime/device.h"

namespace {

// "ft help" prints the command list (as `ft --help`), "ft help train" one command's help; an
// unknown command is a usage error that still shows the list.
int print_help(CLI::App& app, const std::vector<std::string>& topic) {
  // Not app.help(): once `help` is parsed, that prints the help of the `help` subcommand.
  const std::string list = app.get_formatter()->make_help(&app, "ft", CLI::AppFormatMode::Normal);
  if (topic.empty()) {
    std::printf("%s", list.c_str());
    return 0;
  }
  for (auto* sub : app.get_subcommands({})) {
    if (sub->get_name() == topic[0]) {
      std::printf("%s", sub->help("ft").c_str());
      return 0;
    }
  }
  std::fprintf(stderr, "ft: no command '%s'\n%s", topic[0].c_str(), list.c_str());
  return 2;
}

}  // namespace

namespace ft::app {

// Thread-pool settings that must be in the environment before OpenBLAS and libgomp load, so ft
// sets them and re-executes itself once, before anything else (and before MPI_Init, so to a
// launcher it is the same process). Values set by the user or the site always win;
// FT_NO_REEXEC=1 turns this off.
//  - OPENBLAS_CORETYPE: see kernels::blas_better_coretype(), only when OpenBLAS misdetects the CPU.
//  - OMP_WAIT_POLICY=passive: OpenMP threads sleep between parallel regions instead of spinning,
//    so they do not take cores from OpenBLAS's own threads during GEMMs (measured: ~20% of all
//    cycles went to libgomp spinning on the bench shape with 2 cores).
//  - OPENBLAS_THREAD_TIMEOUT=4: the converse. OpenBLAS's idle threads spin 2^N cycles before
//    sleeping (default N = 28, ~0.1 s), so after every GEMM they hold cores that ft's OpenMP
//    kernels need; 4 is OpenBLAS's smallest N. Measured on the bench shape, 2 cores, with
//    OMP_WAIT_POLICY=passive already set: about 1-3% per step (fp32 1.45 -> 1.41 s, bf16
//    0.588 -> 0.583 s, medians of 3-6 interleaved runs), within the noise of one run.
void prepare_thread_environment(char** argv) {
  if (std::getenv("FT_NO_REEXEC")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    if (const char* core = ft::kernels::blas_better_coretype()) {
      setenv("OPENBLAS_CORETYPE", core, 1);
      changed = true;
    }
  }
  if (!std::getenv("OPENBLAS_THREAD_TIMEOUT")) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    changed = true;
  }
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    changed = true;
  }
  if (!changed) return;
  setenv("FT_NO_REEXEC", "1", 1);  // never loop
  execv("/proc/self/exe", argv);   // returns only on failure: then carry on as we are
}

int run_command_line(int argc, char** argv) {
  CLI::App app{
      "ft: fine-tune transformer language models from a YAML recipe.\n"
      "Quick start:  ft train recipes/quickstart.yaml\n"
      "Exit codes: 0 done, 1 runtime failure, 2 usage or recipe error, 3 a rank hung (collective\n"
      "watchdog), 75 stopped on a signal after a checkpoint, 130/143 stopped at once by a second\n"
      "Ctrl-C/SIGTERM"};
  app.name("ft");
  app.footer(
      "Recipes, data format, metrics, checkpoints and every contract: DESIGN.md at the root of\n"
      "ft's source tree; a user's guide: README.md beside it.");
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");

  TrainArgs train;
  auto* t = app.add_subcommand("train", "Train a model from a recipe");
  t->add_option("recipe", train.recipe, "Recipe YAML file")->required()->check(CLI::ExistingFile);
  t->add_option("overrides", train.overrides, "Dotted recipe overrides, e.g. training.steps=20");
  t->add_option("--resume", train.resume,
                "auto: continue from the newest complete checkpoint in checkpoint.dir if there is "
                "one (default); never: start afresh (refuses a checkpoint.dir that already holds "
                "checkpoints unless checkpoint.overwrite=true); PATH: resume from that checkpoint "
                "(a step folder, or a checkpoint dir with `latest`)");
  t->add_option("--nproc", train.nproc,
                "Start and supervise N local ranks (ft runs mpirun itself); the layout comes from "
                "parallel.*")
      ->check(CLI::Range(1, 1 << 20));
  t->footer(
      "Recipe sections: run, model, adapter, tokenizer, data, training, dpo, optimizer,\n"
      "scheduler, parallel, checkpoint, logging, runtime. `ft validate RECIPE` prints every key\n"
      "with its resolved value and meaning. training.objective: dpo trains on preference pairs\n"
      "(ft tokenize --format preference). Overrides use dotted paths: ft train r.yaml "
      "training.steps=50 "
      "optimizer.lr=1e-3\n"
      "Outputs: <run.output_dir>/recipe.yaml (resolved recipe) and logging.metrics (JSON Lines,\n"
      "default <run.output_dir>/metrics.jsonl).\n"
      "Checkpoints: checkpoint.every_steps / every_minutes (and at the end) into checkpoint.dir\n"
      "(default <run.output_dir>/checkpoints), async with checkpoint.async, keep_last kept. They\n"
      "resume under any layout. Ctrl-C, SIGTERM or SIGUSR1 (to any rank, or to ft --nproc):\n"
      "finish the step, save, exit 75; the same command then continues. A second Ctrl-C or\n"
      "SIGTERM stops at once (130/143). ft inspect / ft export read checkpoints.\n"
      "One job per run: run.output_dir and checkpoint.dir are locked while it trains (ft.lock);\n"
      "a second ft train on them is refused, naming the host and pid of the first.\n"
      "FT_PROFILE=1 (environment): time every op and device copy; rank 0 prints a table by op\n"
      "family (seconds, share of step time, calls) at the end of the run.");

  ValidateArgs validate;
  auto* v = app.add_subcommand("validate",
                               "Check a recipe; print the resolved recipe or every error at once");
  v->add_option("recipe", validate.recipe, "Recipe YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  v->add_option("overrides", validate.overrides, "Dotted recipe overrides, e.g. model.dim=512");
  v->add_option("--world", validate.world,
                "Check for a job of N ranks (as srun -n N or mpirun -np N starts it), one per "
                "node (default: the smallest world the layout needs)")
      ->check(CLI::Range(1, 1 << 20));
  v->add_option("--nproc", validate.nproc,
                "Check for `ft train --nproc N`: N ranks on this machine, sharing its memory")
      ->check(CLI::Range(1, 1 << 20));
  v->add_option("--resume", validate.resume,
                "As ft train's --resume: auto (default), never, or a checkpoint PATH");
  v->footer(
      "Checks the recipe (every problem at once, with file, line and key), then what ft train\n"
      "would refuse at its start-up on this machine: the run folder in use by another job, the\n"
      "device, memory (ft plan's peak per rank), the checkpoint --resume would take, the\n"
      "tokenizer and every shard, the output folders, runtime.communicator. Same messages as\n"
      "ft train; nothing is created or written. Exit 0 when ft train would start, 2 otherwise.");

  TokenizeArgs tok;
  auto* k = app.add_subcommand("tokenize", "Tokenize text or JSONL files into HDF5 token shards");
  k->add_option("--tokenizer", tok.tokenizer,
                "SentencePiece .model, tokenizer.json, or a Hugging Face folder holding one")
      ->required()
      ->check(CLI::ExistingPath);
  k->add_option("--input", tok.inputs, "Input files (text or JSONL)")
      ->required()
      ->expected(1, -1)
      ->check(CLI::ExistingFile);
  k->add_option("--output", tok.output, "Output shard folder")->required();
  k->add_option("--format", tok.format,
                "text | jsonl | chat | alpaca | preference | auto (by extension: .jsonl/.json "
                "→ jsonl). text: documents are separated by blank lines; jsonl: one document "
                "per line, in --field; chat: one conversation per line, {\"messages\": "
                "[{\"role\", \"content\"}]} or ShareGPT {\"conversations\": [{\"from\", "
                "\"value\"}]}; alpaca: {\"instruction\", \"input\", \"output\"} per line. "
                "chat and alpaca render with the tokenizer folder's chat template and write a "
                "loss_mask that trains on the assistant's tokens only. preference: "
                "{\"prompt\", \"chosen\", \"rejected\"} per line, as strings or message "
                "lists (or no prompt: chosen and rejected whole conversations that start with "
                "it), into pairs for DPO (ft-preference shards)")
      ->check(CLI::IsMember({"auto", "text", "jsonl", "chat", "alpaca", "preference"}));
  k->add_option("--field", tok.field, "JSONL field holding the text (default: text)");
  k->add_flag("--train-on-prompt", tok.train_on_prompt,
              "chat/alpaca: train on every token of the conversation, not only the "
              "assistant's (writes no loss_mask); not with preference");
  k->add_flag("--allow-no-trainable", tok.allow_no_trainable,
              "chat/alpaca: keep an input file none of whose conversations has assistant content "
              "to train on (by default such a file is an error, exit 2: it would add only "
              "padding)");
  k->add_option("--shard-tokens", tok.shard_tokens, "Tokens per shard file (default 16Mi)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  // The bound of the recipe's runtime.threads: more than any machine has cores.
  k->add_option("--threads", tok.threads, "Tokenizer threads, 0 to 1024 (default 0: all cores)")
      ->check(integer_in(0, 1024));

  InspectArgs insp;
  auto* i = app.add_subcommand("inspect", "Summarise a shard folder, checkpoint or HF folder");
  i->add_option("path", insp.path, "Folder to inspect")->required();
  i->add_option("--seq-len", insp.seq_len,
                "Shard folders: how data.pack would pack them into windows of this many tokens "
                "(a preference folder: the pairs DPO training would cut and drop at this "
                "data.seq_len)")
      ->check(integer_in(1, kMaxInspectSeqLen));
  i->add_option("--pack-overflow", insp.pack_overflow,
                "With --seq-len: documents longer than a window are split (default) or dropped")
      ->check(one_of({"split", "drop"}));
  i->footer(
      "A Hugging Face folder: its config.json and tensors (whether they load as model.from), its\n"
      "tokenizer (whether ft reads it) and chat template (whether ft's Jinja subset renders it),\n"
      "and so what ft can do with it. Exit code 1 when the weights cannot be used as model.from,\n"
      "or a checkpoint is damaged or incomplete.");

  PlanArgs plan_args;
  auto* plan =
      app.add_subcommand("plan", "Per-rank memory and communication estimate for a recipe");
  plan->add_option("recipe", plan_args.recipe, "Recipe YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  plan->add_option("overrides", plan_args.overrides,
                   "Dotted recipe overrides, e.g. parallel.zero_stage=3");
  plan->add_option("--world", plan_args.world,
                   "Ranks of the run (data × pipeline × tensor; default 1)")
      ->check(CLI::Range(1, 1 << 20));
  plan->add_flag("--json", plan_args.json,
                 "Print the plan as JSON (one object per distinct rank role)");
  plan->add_option("--cuda-sm", plan_args.cuda_sm,
                   "With runtime.device cuda: the GPU's compute capability, e.g. 80 (A100) or 90 "
                   "(H100; default), which sets the cuBLASLt workspace")
      ->check(CLI::Range(80, 200));
  plan->add_option("--gpus-per-node", plan_args.gpus_per_node,
                   "GPUs per node: rank r is on node r / N; a group within a node uses the "
                   "intra-node link, one spanning nodes InfiniBand (default 8)")
      ->check(CLI::Range(1, 1 << 20));
  plan->add_option("--intra-node", plan_args.intra_node,
                   "The link between GPUs of a node: nvlink (default) or pcie")
      ->check(CLI::IsMember({"nvlink", "pcie"}));
  plan->add_option("--nvlink-gbps", plan_args.nvlink_gbps,
                   "NVLink bus bandwidth per GPU, GB/s (default 450: H100 SXM, NVLink 4)")
      ->check(finite_in(0, 1e6, true));
  plan->add_option("--pcie-gbps", plan_args.pcie_gbps,
                   "PCIe bus bandwidth per GPU, GB/s (default 50: Gen5 x16)")
      ->check(finite_in(0, 1e6, true));
  plan->add_option("--ib-gbps", plan_args.ib_gbps,
                   "InfiniBand bus bandwidth per GPU, GB/s (default 40: one 400 Gb/s NDR "
                   "port per GPU)")
      ->check(finite_in(0, 1e6, true));
  plan->add_option("--latency-us", plan_args.latency_us,
                   "Time of a collective call besides its bytes, microseconds (default 20)")
      ->check(finite_in(0, 1e9));
  plan->add_option("--tflops", plan_args.tflops,
                   "Achieved compute throughput per GPU, TFLOP/s (default 400: bf16 on an H100 "
                   "at ~40% of its 989 peak)")
      ->check(finite_in(0, 1e9, true));
  plan->add_option("--host-mem-gb", plan_args.host_mem_gb,
                   "Host memory of a node, GiB: flags a role whose node (its --gpus-per-node "
                   "ranks' host memory summed) needs more")
      ->check(finite_in(0, 1e9, true));
  plan->footer(
      "Prints, per distinct rank role, the device memory for parameters, gradients, optimizer\n"
      "state, activations and communication buffers, the host memory (pinned and pageable) next\n"
      "to it, and the bytes each rank sends per step, with what each holds (DESIGN.md §3\n"
      "describes the layouts), and an estimate of the step's time: compute, and communication\n"
      "per link, hidden under the backward or exposed (DESIGN.md §4). Memory and bytes are\n"
      "counted by running the rank's setup and one step on a counting device. With model.from,\n"
      "the folder's config.json is all a plan reads: it answers before the weights are\n"
      "downloaded.");

  ExportArgs export_args;
  auto* exp = app.add_subcommand("export", "Write a Hugging Face folder from a checkpoint");
  exp->add_option(
         "checkpoint", export_args.checkpoint,
         "Checkpoint step folder (step_*), or checkpoint.dir (exports what `latest` names)")
      ->required();
  exp->add_option("--output,-o", export_args.output, "Hugging Face folder to write")->required();
  exp->add_option("--dtype", export_args.dtype,
                  "Tensor dtype of the output: f32 (default), bf16, f16")
      ->check(one_of({"f32", "bf16", "f16"}));
  exp->add_option("--max-shard-size", export_args.max_shard_size,
                  "Largest safetensors file before splitting into model-0000K-of-0000N files with "
                  "an index: bytes, or 500MB, 5GB (default), 2GiB; from 1 byte to 1000TB")
      ->check(byte_size());
  exp->add_flag("--overwrite", export_args.overwrite, "Replace a non-empty output folder");
  exp->add_flag("--merge", export_args.merge,
                "A checkpoint of an adapter run: write the model with the adapter merged into "
                "its base (W + scale·B·A), not the adapter folder");
  exp->footer(
      "Writes a folder transformers loads as the checkpoint's class, by model.arch\n(" +
      implemented_archs(&ArchSpec::hf_class) +
      ")\nand ft takes as model.from: config.json, model.safetensors (or shards plus\n"
      "model.safetensors.index.json), and the checkpoint's tokenizer when the recipe named\n"
      "one: its tokenizer.json with a tokenizer_config.json (the model folder's chat template\n"
      "and special tokens carried over), or its tokenizer.model with tokenizer.json,\n"
      "tokenizer_config.json and special_tokens_map.json; generation_config.json with the\n"
      "special token ids. The folder appears only when complete (written as DIR.tmp-<pid>,\n"
      "then renamed).\n"
      "A checkpoint of an adapter run (adapter.type lora) holds the adapter alone. Exported as\n"
      "is, it gives a PEFT adapter folder (adapter_config.json, adapter_model.safetensors in\n"
      "--dtype, and the tokenizer files) that PeftModel.from_pretrained, vLLM (--enable-lora)\n"
      "and llama.cpp's convert_lora_to_gguf.py apply to the base; with --merge, the model folder\n"
      "above with the adapter merged in, the base read from the run's model.from (or, for a\n"
      "seeded base, drawn again).");

  GenerateArgs gen;
  auto* g =
      app.add_subcommand("generate", "Generate text from a Hugging Face folder or checkpoint");
  g->add_option("source", gen.source,
                "Hugging Face model folder, checkpoint step folder (step_*), or checkpoint.dir "
                "(what `latest` names)")
      ->required();
  g->add_option("--prompt,-p", gen.prompt, "The prompt text")->required();
  g->add_flag("--chat", gen.chat,
              "Render the prompt as a user message with the tokenizer's chat template (and a "
              "generation prompt); stop at the template's end-of-turn token too");
  g->add_option("--system", gen.system, "With --chat: a system message before the prompt");
  g->add_option("--max-new-tokens,-n", gen.max_new_tokens,
                "Tokens to generate at most (default 128; the model's max_seq_len bounds them too)")
      ->check(integer_in(1, kMaxNewTokens));
  g->add_option("--temperature", gen.temperature, "0: greedy (default); above 0: sample")
      ->check(finite_in(0, kMaxTemperature));
  g->add_option("--top-p", gen.top_p,
                "Sample from the most likely tokens holding this much probability (default 1: "
                "all)")
      ->check(finite_in(0, 1, /*open_lo=*/true));
  g->add_option("--seed", gen.seed, "Sampling seed: the same seed, the same text (default 0)")
      ->check(integer_in(0, UINT64_MAX));
  g->add_option("--tokenizer", gen.tokenizer,
                "Tokenizer file or folder (default: the source's; a checkpoint with --chat needs "
                "the Hugging Face folder holding the chat template)");
  g->add_option("--adapter", gen.adapter,
                "A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors; "
                "ft export of an adapter checkpoint writes one) applied to the Hugging Face "
                "source, its base");
  g->add_option("--device", gen.device, "auto (default), cpu or cuda")
      ->check(one_of({"auto", "cpu", "cuda"}));
  g->add_option("--dtype", gen.dtype, "Compute dtype: f32 (default), bf16, f16")
      ->check(one_of({"f32", "bf16", "f16"}));
  g->add_flag("--json", gen.json,
              "Print one JSON object: prompt_ids, ids (the stop token included), text, stop "
              "(eos, end_of_turn or length)");
  g->add_flag("--ignore-eos", gen.ignore_eos, "Do not stop at EOS or end of turn");
  g->add_flag("--no-bos", gen.no_bos, "No BOS token before a plain (non --chat) prompt");
  g->footer(
      "Greedy by default (the most likely token each step); --temperature T with --top-p P and\n"
      "--seed S samples. A KV cache keeps each token's keys and values, so every new token is one\n"
      "pass of one row. Stops at eos_token_id (generation_config.json, config.json, the\n"
      "tokenizer's), with --chat at the template's end-of-turn token, or at --max-new-tokens.\n"
      "The text goes to stdout as it is made; model, speed and why it stopped to stderr.\n"
      "A checkpoint of an adapter run generates with its adapter on its base (the run's\n"
      "model.from, checked to hold the same weights, or its seeded initialisation), as the\n"
      "ft export --merge folder would; --adapter DIR applies a PEFT folder to an HF source.");

  PlotArgs plot_args;
  auto* pl =
      app.add_subcommand("plot", "Draw runs' metrics (loss, lr, throughput, ...) as SVG or PNG");
  pl->add_option("runs", plot_args.runs,
                 "Run folders (run.output_dir, holding metrics.jsonl) or metrics .jsonl files; "
                 "several are overlaid, one colour each")
      ->required()
      ->expected(1, -1);
  pl->add_option("--output,-o", plot_args.output,
                 "The picture to write: FILE.svg (written by ft) or FILE.png (drawn with cairo, "
                 "libcairo.so.2)")
      ->required();
  pl->add_option("--smooth", plot_args.smooth,
                 "Smoothing of the bold loss curve, as TensorBoard's: the weight of a debiased "
                 "exponential moving average, 0 (none) to 0.999 (default 0.6)")
      ->check(finite_in(0, 0.999));
  pl->add_option("--width", plot_args.width, "Picture width in pixels (default 1200)")
      ->check(integer_in(kMinPlotPixels, kMaxPlotPixels));
  pl->add_option("--height", plot_args.height,
                 "Picture height in pixels (default: 300 a row of panels, and the legend)")
      ->check(integer_in(kMinPlotPixels, kMaxPlotPixels));
  pl->add_option("--labels", plot_args.labels,
                 "The runs' names in the legend, comma-separated or the flag repeated, in the "
                 "order given (default: "
                 "each run's folder name)")
      ->delimiter(',');
  pl->footer(
      "Panels, two to a row, each drawn only when some run has its metric: loss (raw, faint;\n"
      "smoothed, bold; evaluation loss dashed with dots), learning rate, throughput (tokens/s),\n"
      "model TFLOP/s per device, gradient norm (before clipping) and peak device memory (GiB),\n"
      "against the step. A y axis whose values span three decades or more is logarithmic.\n"
      "metrics.jsonl as DESIGN.md §7 writes it: a resumed run's repeated steps count once (the\n"
      "last line), an fp16 step's null is no point; a line that is not JSON is an error naming\n"
      "file:line (exit 2), but a cut-short last line (a killed run) is left out with a warning.\n"
      "The SVG's panels and curves carry data- attributes (the value range and pixel box; the\n"
      "run, metric and kind) so that a program can read the drawn points back.");

  std::vector<std::string> help_topic;
  auto* h = app.add_subcommand("help", "Show help for ft or one command");
  h->add_option("command", help_topic, "Command name");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    std::printf("ft %s (backends: %s)\n", FT_VERSION, ft::built_backends().c_str());
    return 0;
  }
  try {
    if (t->parsed()) return cmd_train(train);
    if (v->parsed()) return cmd_validate(validate);
    if (k->parsed()) return cmd_tokenize(tok);
    if (i->parsed()) return cmd_inspect(insp);
    if (plan->parsed()) return cmd_plan(plan_args);
    if (h->parsed()) return print_help(app, help_topic);
    if (exp->parsed()) return cmd_export(export_args);
    if (g->parsed()) return cmd_generate(gen);
    if (pl->parsed()) return cmd_plot(plot_args);
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const ft::Error& e) {
    std::fprintf(stderr, "ft: error: %s\n", e.what());
    ft::note_job_cause(e.what());
    return int(e.code());
  } catch (const std::bad_alloc&) {
    const char* msg =
        "out of memory (an allocation failed); `ft plan` shows what a run needs, and a smaller "
        "model, micro-batch or sequence, or more ranks, needs less";
    std::fprintf(stderr, "ft: error: %s\n", msg);
    ft::note_job_cause(msg);
    return 1;
  } catch (const std::exception& e) {
    // Every failure a user can cause is an ft::Error with a message written for them; anything
    // else reaching here is a bug, said as one (without a library's error code).
    std::string what = e.what();
    if (const auto* j = dynamic_cast<const nlohmann::json::exception*>(&e))
      what = ft::json_error_words(*j);
    const std::string msg =
        "internal error (a bug in ft: please report it with the command, its output and `ft "
        "--version`): " +
        ft::excerpt(what, 300);
    std::fprintf(stderr, "ft: error: %s\n", msg.c_str());
    ft::note_job_cause(msg);
    return 1;
  }
}

}  // namespace ft::app
