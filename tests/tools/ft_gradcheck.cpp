// Test tool: runs ft's forward and backward on the first global batch of a recipe (the path
// `ft train` takes for step 0: loader, token weight 1/count, the same micro-batch schedule) and
// writes the loss and every parameter gradient (HF names) to a safetensors file, so that a
// PyTorch reference script can compare them tensor by tensor.
//   ft_gradcheck RECIPE OUT.safetensors [KEY=VALUE ...]
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "model/llama.h"
#include "parallel/pipeline.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  using namespace ft;
  run_shard_check_if_child(argc, argv);  // the loader checks shards in a child (data/shard.h)
  if (argc < 3) {
    std::fprintf(stderr, "usage: ft_gradcheck RECIPE OUT.safetensors [KEY=VALUE ...]\n");
    return 2;
  }
  try {
    std::vector<std::string> overrides(argv + 3, argv + argc);
    Recipe r = load_recipe_or_throw(argv[1], overrides);
    configure_threads(r.runtime.threads);
    auto dev = make_device(r.runtime.device);
    LlamaModel model(r.model, dev.get(), r.training.activation_checkpointing);
    if (!r.model.from.empty()) {  // read on the host, then copied to the device
      std::vector<std::vector<float>> host = model.flat_params().to_host();
      std::vector<float*> ptrs;
      for (auto& g : host) ptrs.push_back(g.data());
      load_hf_weights(r.model.from, model.layout(), ptrs);
      model.flat_params().from_host(host);
    } else {
      model.init_random(r.run.seed, r.model.init_std);
    }

    LoaderOptions lo;
    lo.dir = r.data.train;
    lo.seq_len = r.data.seq_len;
    lo.shuffle = r.data.shuffle;
    lo.seed = r.run.seed;
    lo.global_batch = r.training.global_batch_size;
    lo.rank_count = r.training.global_batch_size;
    lo.prefetch = 1;
    lo.expected_vocab = r.model.vocab_size;
    DataLoader loader(lo);
    StepSamples b = loader.next();
    double count = 0;
    for (uint8_t m : b.mask) count += m;
    // The trainer's own micro-batch loop (one stage: forward and backward per micro-batch).
    model.flat_params().zero_grads();
    PipelineSchedule schedule(model, nullptr, dev.get());
    const double loss_sum = schedule.train_step(b, r.training.micro_batch_size, float(1.0 / count));
    const float loss = float(loss_sum / count);
    std::printf("loss %.9g over %.0f tokens\n", loss_sum / count, count);

    std::vector<SafetensorsTensorOut> out;
    out.push_back({"loss", DType::kF32, {1}, &loss});
    const auto& groups = model.layout().groups();
    std::vector<std::vector<float>> grads(groups.size());  // copied to the host
    for (size_t g = 0; g < groups.size(); ++g) {
      grads[g].resize(model.flat_params().grads()[g].size());
      model.flat_params().grads()[g].download(grads[g].data(), grads[g].size());
      for (const auto& e : groups[g].entries)
        out.push_back({e.name, DType::kF32, e.shape, grads[g].data() + e.offset});
    }
    write_safetensors(argv[2], out);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ft_gradcheck: %s\n", e.what());
    return int(e.code());
  }
}
