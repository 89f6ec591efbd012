// ft plan RECIPE [KEY=VALUE...] [--world N] [--json] [--cuda-sm SM]: per-rank memory and
// communication, counted by running each rank's setup and one step on a counting device
// (lib/train/plan.h), and an estimate of the step's time from those bytes, the links and the
// compute throughput (--gpus-per-node, --intra-node, --*-gbps, --latency-us, --tflops). One
// table per distinct rank role, then notes. Nothing is allocated, trained, read or written.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "apps/ft/commands.h"
#include "core/progress.h"
#include "recipe/recipe.h"
#include "runtime/device.h"
#include "train/plan.h"

namespace ft::app {
namespace {

std::string human_bytes(int64_t bytes) { return ft::human_bytes(double(bytes)); }

std::string ranks_word(const std::vector<int>& r) {
  return (r.size() == 1 ? "rank " : "ranks ") + format_rank_list(r);
}

// "data rank 0", "data ranks 0-1", over the ranks of a role.
std::string coordinate(const std::vector<int>& values, const char* what) {
  std::vector<int> v(values);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return std::string(what) + (v.size() == 1 ? " rank " : " ranks ") + format_rank_list(v);
}

// The node a role's ranks need the most host memory on (plan_host), and its ranks.
struct NodeNeed {
  int node = 0;
  int64_t bytes = 0;
  std::vector<int> ranks;
};
NodeNeed fullest_node(const MemoryPlan& plan, const std::vector<int>& role) {
  NodeNeed n;
  n.node = role.front() / plan.gpus_per_node;
  for (int k : role)
    if (plan.ranks[size_t(k)].host_node_bytes > n.bytes) {
      n.bytes = plan.ranks[size_t(k)].host_node_bytes;
      n.node = k / plan.gpus_per_node;
    }
  for (int k = n.node * plan.gpus_per_node;
       k < std::min(plan.world, (n.node + 1) * plan.gpus_per_node); ++k)
    n.ranks.push_back(k);
  return n;
}

bool host_fits(const NodeNeed& n, double host_mem_gb) {
  return host_mem_gb <= 0 || double(n.bytes) <= host_mem_gb * 1073741824.0;
}

nlohmann::ordered_json by_category(const RankPlan::ByCategory& by) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int c = 0; c < int(MemoryCategory::kCount); ++c)
    if (by[size_t(c)] != 0) j[memory_category_name(MemoryCategory(c))] = by[size_t(c)];
  return j;
}

void print_json(const MemoryPlan& plan, const std::vector<std::vector<int>>& roles,
                const std::string& recipe, const PlanLinks& links, double host_mem_gb) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["recipe"] = recipe;
  j["world"] = plan.world;
  j["data"] = plan.data;
  j["pipeline"] = plan.pipeline;
  j["tensor"] = plan.tensor;
  j["zero_stage"] = plan.zero_stage;
  j["micro_batch_size"] = plan.micro_batch;
  j["grad_accum_steps"] = plan.accum;
  j["seq_len"] = plan.seq_len;
  j["activation_checkpointing"] = plan.activation_checkpointing;
  j["model_params"] = plan.model_params;
  j["measured"] = "counting device: setup and one step";
  j["device"] = plan.device.cuda ? "cuda" : "cpu";
  if (plan.device.cuda) j["cuda_sm"] = plan.device.sm;
  j["links"] = {{"gpus_per_node", links.gpus_per_node},
                {"intra_node", links.intra_pcie ? "pcie" : "nvlink"},
                {"nvlink_gbps", links.nvlink_gbps},
                {"pcie_gbps", links.pcie_gbps},
                {"ib_gbps", links.ib_gbps},
                {"latency_us", links.latency_us},
                {"tflops", links.tflops}};
  if (host_mem_gb > 0) j["host_mem_gb"] = host_mem_gb;
  bool all_fit = true;
  j["roles"] = ordered_json::array();
  for (const auto& ranks : roles) {
    const RankPlan& r = plan.ranks[size_t(ranks.front())];
    ordered_json o;
    o["ranks"] = ranks;
    o["pipeline_stage"] = r.stage;
    o["layers"] = {r.first_layer, r.first_layer + r.num_layers};  // [first, end)
    o["embed"] = r.embed;
    o["head"] = r.head;
    o["holds"] = r.holds;
    o["param_elems"] = r.param_elems;
    o["trained_elems"] = r.trained_elems;
    o["params_bytes"] = r.params.bytes;
    o["grads_bytes"] = r.grads.bytes;
    o["optim_bytes"] = r.optim.bytes;
    o["activation_slots"] = r.slots;
    o["activation_bytes"] = r.activations.bytes;
    o["comm_buffer_bytes"] = r.comm_buffers.bytes;
    o["backend_bytes"] = r.backend.bytes;
    o["other_bytes"] = r.other_bytes;
    o["total_bytes"] = r.total_bytes;
    o["startup_bytes"] = r.startup_bytes;
    o["startup_how"] = r.startup_how;
    o["startup_params_bytes"] = r.startup_params_bytes;
    o["eval_bytes"] = r.eval_bytes;
    o["eval_micro_batches"] = r.eval_micro_batches;
    o["reference_bytes"] = r.reference_bytes;
    o["peak_bytes"] = r.peak_bytes;
    o["allocations"] = r.allocations;
    o["host_bytes"] = {{"pinned", r.host_pinned.bytes},
                       {"pageable", r.host_pageable.bytes},
                       {"peak", r.host_peak_bytes},
                       {"need", r.host_need_bytes},
                       {"pinned_by_category", by_category(r.host_pinned_by)},
                       {"pageable_by_category", by_category(r.host_pageable_by)}};
    const NodeNeed node = fullest_node(plan, ranks);
    o["host_node_bytes"] = node.bytes;
    if (host_mem_gb > 0) {
      o["host_fits"] = host_fits(node, host_mem_gb);
      all_fit = all_fit && host_fits(node, host_mem_gb);
    }
    o["sent_bytes_per_step"] = r.sent_bytes;
    o["sent_data_bytes"] = r.sent_data.bytes;
    o["sent_tensor_bytes"] = r.sent_tensor.bytes;
    o["sent_pipeline_bytes"] = r.sent_pipeline.bytes;
    o["sent_world_bytes"] = r.sent_world.bytes;
    const RankTime& t = r.time;
    ordered_json tj;
    tj["flops"] = t.flops;
    tj["compute_ms"] = t.compute_ms;
    tj["backward_window_ms"] = t.window_ms;
    tj["groups"] = ordered_json::array();
    for (const GroupTime& g : t.groups)
      tj["groups"].push_back({{"group", g.group},
                              {"size", g.size},
                              {"link", g.link},
                              {"gbps", g.gbps},
                              {"bytes", g.bytes},
                              {"calls", g.calls},
                              {"ms", g.ms},
                              {"hidden_ms", g.hidden_ms},
                              {"exposed_ms", g.exposed_ms}});
    tj["comm_ms"] = t.comm_ms;
    tj["hidden_ms"] = t.hidden_ms;
    tj["exposed_ms"] = t.exposed_ms;
    tj["step_ms"] = t.step_ms;
    o["time"] = std::move(tj);
    o["how"] = {{"params", r.params.how},
                {"grads", r.grads.how},
                {"optim", r.optim.how},
                {"activations", r.activations.how},
                {"comm_buffers", r.comm_buffers.how},
                {"backend", r.backend.how},
                {"host_pinned", r.host_pinned.how},
                {"host_pageable", r.host_pageable.how},
                {"sent_data", r.sent_data.how},
                {"sent_tensor", r.sent_tensor.how},
                {"sent_pipeline", r.sent_pipeline.how},
                {"sent_world", r.sent_world.how}};
    j["roles"].push_back(std::move(o));
  }
  if (host_mem_gb > 0) j["host_fits"] = all_fit;
  j["notes"] = plan.notes;
  std::printf("%s\n", j.dump(2).c_str());
}

// The time estimate of a role: a row per group that sends, then the step.
void print_time(const RankTime& t) {
  std::printf("  time per step      predicted: compute %.2f ms (%.3g TFLOP); communication:\n",
              t.compute_ms, t.flops / 1e12);
  if (!t.groups.empty())
    std::printf("    %-19s %-18s %11s %7s %10s %10s %10s\n", "group", "link", "sent", "calls", "ms",
                "hidden ms", "exposed ms");
  for (const GroupTime& g : t.groups) {
    char link[64];
    std::snprintf(link, sizeof link, "%s %g GB/s", g.link.c_str(), g.gbps);
    const std::string name = g.group + " (" + std::to_string(g.size) + ")";
    std::printf("    %-19s %-18s %11s %7lld %10.2f %10.2f %10.2f\n", name.c_str(), link,
                human_bytes(g.bytes).c_str(), (long long)g.calls, g.ms, g.hidden_ms, g.exposed_ms);
  }
  std::printf(
      "  step               %.2f ms = compute %.2f + exposed %.2f (communication %.2f ms, "
      "hidden %.2f under a backward of %.2f)\n",
      t.step_ms, t.compute_ms, t.exposed_ms, t.comm_ms, t.hidden_ms, t.window_ms);
}

void print_tables(const MemoryPlan& plan, const std::vector<std::vector<int>>& roles,
                  const Recipe& r, const std::string& recipe, double host_mem_gb) {
  const ModelConfig& m = r.model;
  std::printf("ft plan: %s on %d rank%s = %d data × %d pipeline × %d tensor; ZeRO stage %d\n",
              recipe.c_str(), plan.world, plan.world == 1 ? "" : "s", plan.data, plan.pipeline,
              plan.tensor, plan.zero_stage);
  std::printf(
      "model: %.2fM parameters (%d layers, dim %d, %d heads / %d kv heads, ffn %d, vocab "
      "%d%s), %s on %s\n",
      double(plan.model_params) / 1e6, m.n_layers, m.dim, m.n_heads, m.n_kv_heads, m.ffn_dim,
      m.vocab_size, m.tie_embeddings ? ", tied embeddings" : "", r.training.precision.c_str(),
      plan.device.cuda ? ("cuda (sm_" + std::to_string(plan.device.sm) + ")").c_str() : "cpu");
  if (r.adapter.enabled()) {
    std::string targets;
    for (const std::string& t : r.adapter.targets()) targets += (targets.empty() ? "" : ", ") + t;
    const std::string held = r.adapter.type == "qlora"
                                 ? "its blocks' matrices in NF4, the rest " + r.training.precision
                                 : r.training.precision + " only";
    std::printf("adapter: %s r %d on %s; the base frozen (%s)\n", r.adapter.type.c_str(),
                r.adapter.r, targets.c_str(), held.c_str());
  }
  // DPO: a sample is a preference pair, two rows of seq_len tokens.
  const bool dpo = r.training.objective == "dpo";
  const char* sample = dpo ? "pair" : "sample";
  std::printf(
      "step: %d %ss%s of %d tokens = %d data rank%s × %d micro-batch%s × %d %s%s; "
      "activation checkpointing %s\n",
      r.training.global_batch_size, sample, dpo ? " (2 rows each)" : "", plan.seq_len, plan.data,
      plan.data == 1 ? "" : "s", plan.accum, plan.accum == 1 ? "" : "es", plan.micro_batch, sample,
      plan.micro_batch == 1 ? "" : "s", plan.activation_checkpointing ? "on" : "off");
  if (dpo)
    std::printf("dpo: %s loss, beta %g, reference %s\n", r.dpo.loss.c_str(), r.dpo.beta,
                r.dpo.reference == "base"
                    ? "base (a forward pass with the adapter off in every step)"
                    : "initial (computed once before step 1, kept in run.output_dir)");

  for (const auto& ranks : roles) {
    const RankPlan& p = plan.ranks[size_t(ranks.front())];
    std::vector<int> ds, ts;
    for (int k : ranks) {
      ds.push_back(plan.ranks[size_t(k)].data_rank);
      ts.push_back(plan.ranks[size_t(k)].tensor_rank);
    }
    std::printf("\n%s (%s, pipeline stage %d, %s)\n", ranks_word(ranks).c_str(),
                coordinate(ds, "data").c_str(), p.stage, coordinate(ts, "tensor").c_str());
    std::printf("  holds: %s\n", p.holds.c_str());
    auto row = [](const char* name, int64_t bytes, const std::string& how) {
      std::printf("  %-17s %11s   %s\n", name, human_bytes(bytes).c_str(), how.c_str());
    };
    row("parameters", p.params.bytes, p.params.how);
    row("gradients", p.grads.bytes, p.grads.how);
    row("optimizer state", p.optim.bytes, p.optim.how);
    row("activations", p.activations.bytes, p.activations.how);
    row("comm buffers", p.comm_buffers.bytes, p.comm_buffers.how);
    if (plan.device.cuda)
      row("cuda backend", p.backend.bytes, p.backend.how);
    else if (p.backend.bytes)
      row("backend", p.backend.bytes, p.backend.how);
    if (p.other_bytes)
      row("other", p.other_bytes, "allocations that say nothing of what they are for (a bug)");
    row("total", p.total_bytes,
        "the step's peak, the sum of the above (" + std::to_string(p.allocations) +
            " allocations counted)");
    if (p.startup_bytes > 0)
      row("startup", p.startup_bytes,
          p.startup_how +
              (p.startup_bytes > p.total_bytes ? ": this is the peak" : " (below the step)"));
    if (p.eval_bytes > 0)
      row("evaluation", p.eval_bytes,
          "while a validation batch runs after the step (" + std::to_string(p.eval_micro_batches) +
              " forward-only micro-batches)" +
              (p.eval_bytes > std::max(p.total_bytes, p.startup_bytes)
                   ? ": this is the peak"
                   : " (not above the step or start-up)"));
    if (p.reference_bytes > 0)
      row("dpo reference", p.reference_bytes,
          std::string("while the reference's log-probabilities are computed before step 1 (") +
              "forward only)" +
              (p.reference_bytes > std::max({p.total_bytes, p.startup_bytes, p.eval_bytes})
                   ? ": this is the peak"
                   : " (not above the step)"));
    row("host pinned", p.host_pinned.bytes, p.host_pinned.how);
    row("host pageable", p.host_pageable.bytes, p.host_pageable.how);
    {
      const NodeNeed node = fullest_node(plan, ranks);
      std::string how = "pinned and pageable live at once";
      if (!plan.device.cuda)
        how += "; with the device's (host memory on the CPU) " + human_bytes(p.host_need_bytes);
      how += "; node " + std::to_string(node.node) + " (" + ranks_word(node.ranks) + ") needs " +
             human_bytes(node.bytes);
      if (host_mem_gb > 0) {
        char g[48];
        std::snprintf(g, sizeof g, "%g GiB", host_mem_gb);
        how += host_fits(node, host_mem_gb) ? std::string(", within --host-mem-gb ") + g
                                            : std::string(": DOES NOT FIT --host-mem-gb ") + g;
      }
      row("host peak", p.host_peak_bytes, how);
    }
    row("sent per step", p.sent_bytes, "data + tensor + pipeline + world:");
    row("  data", p.sent_data.bytes, p.sent_data.how);
    row("  tensor", p.sent_tensor.bytes, p.sent_tensor.how);
    row("  pipeline", p.sent_pipeline.bytes, p.sent_pipeline.how);
    row("  world", p.sent_world.bytes, p.sent_world.how);
    print_time(p.time);
  }

  std::printf("\nNotes\n");
  for (const auto& n : plan.notes) std::printf("  - %s\n", n.c_str());
}

// The device `ft train` would use. `cuda` plans for CUDA even where no GPU or backend is
// present (planning ahead for a GPU machine is the point); `auto` plans for CUDA only when this
// executable has a CUDA backend and it finds a usable GPU, the same probe `ft train` makes.
PlanDevice plan_device(const Recipe& r, int sm) {
  PlanDevice d;
  d.sm = sm;
  if (r.runtime.device == "cuda") {
    d.cuda = true;
    d.why = "runtime.device: cuda";
  } else if (r.runtime.device == "auto") {
    const CudaBackend* b = cuda_backend();
    if (!b) {
      d.why = "runtime.device: auto, and this build has no CUDA backend";
    } else if (const std::string reason = b->unusable_reason(); !reason.empty()) {
      d.why = "runtime.device: auto, and no usable GPU here: " + reason;
    } else {
      d.cuda = true;
      d.why = "runtime.device: auto, and a usable GPU is here";
    }
  } else {
    d.why = "runtime.device: " + r.runtime.device;
  }
  return d;
}

}  // namespace

int cmd_plan(const PlanArgs& a) {
  // Settings this build cannot run yet (a CUDA device) do not change the
  // plan: they are not refused here (refuse_unbuilt = false). The data and tokenizer paths play
  // no part in a plan, nor do model.from's weights (its config.json alone gives the sizes, so a
  // plan answers before the download): problems with them are not reported.
  RecipeResult res = load_recipe(a.recipe, a.overrides, a.world, /*refuse_unbuilt=*/false);
  const std::set<std::string> irrelevant = {"data.train", "data.valid", "tokenizer.path"};
  std::vector<RecipeIssue> issues;
  for (const RecipeIssue& i : res.issues)
    if (!irrelevant.count(i.key_path) && !i.weight_files) issues.push_back(i);
  if (!issues.empty()) {
    for (const RecipeIssue& i : issues) std::fprintf(stderr, "%s\n", i.format().c_str());
    std::fprintf(stderr, "ft plan: %zu %s in %s (with --world %d)\n", issues.size(),
                 issues.size() == 1 ? "problem" : "problems", a.recipe.c_str(), a.world);
    return 2;
  }
  MemoryPlan plan = plan_memory(res.recipe, a.world, plan_device(res.recipe, a.cuda_sm));
  PlanLinks links;
  links.gpus_per_node = a.gpus_per_node;
  links.intra_pcie = a.intra_node == "pcie";
  links.nvlink_gbps = a.nvlink_gbps;
  links.pcie_gbps = a.pcie_gbps;
  links.ib_gbps = a.ib_gbps;
  links.latency_us = a.latency_us;
  links.tflops = a.tflops;
  plan_times(plan, res.recipe, links);
  plan_host(plan, a.gpus_per_node);
  const auto roles = plan_roles(plan);
  if (a.json)
    print_json(plan, roles, a.recipe, links, a.host_mem_gb);
  else
    print_tables(plan, roles, res.recipe, a.recipe, a.host_mem_gb);
  // A node that would not hold its ranks' host memory is said on stderr too (the plan is still
  // printed, exit 0): under --json it is not lost in the object.
  for (const auto& ranks : roles)
    if (const NodeNeed node = fullest_node(plan, ranks); !host_fits(node, a.host_mem_gb)) {
      std::fprintf(stderr,
                   "ft plan: node %d (%s) needs %s of host memory, more than --host-mem-gb %g\n",
                   node.node, ranks_word(node.ranks).c_str(), human_bytes(node.bytes).c_str(),
                   a.host_mem_gb);
      break;
    }
  return 0;
}

}  // namespace ft::app
