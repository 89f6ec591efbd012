// libFuzzer harness for the checkpoint manifest and rank record readers (lib/ckpt/checkpoint.h:
// parse_manifest, parse_rank_json; not part of the default build).
//
// Contract under test: any byte string either parses into a manifest that passes every range
// check, or throws ft::Error; anything else — a crash, a sanitizer report (UBSan's float-to-int
// conversion was the finding that started this), a hang, another exception type — is a bug. An
// accepted manifest is then checked here again, independently of the reader, and a piece
// read through it must fail cleanly (no shard files exist in the fake step folder). Nothing
// touches the disk but failed opens: the text is parsed in memory.
//
// Build and run: scripts/fuzz.sh [SECONDS] checkpoint_manifest; or by hand (clang, from the
// repository root; the readers need none of the writer's sources):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined \
//     -fno-sanitize-recover=undefined -Ilib \
//     tests/fuzz/fuzz_checkpoint_manifest.cpp lib/ckpt/folders.cpp lib/ckpt/io.cpp \
//     lib/ckpt/manifest.cpp lib/ckpt/reshard.cpp lib/model/layout.cpp lib/model/rope.cpp \
//     lib/optim/loss_scaler.cpp lib/core/log.cpp -lz -o /tmp/fuzz_checkpoint_manifest
//   mkdir -p /tmp/cm_corpus && /tmp/fuzz_checkpoint_manifest -max_total_time=300 \
//     /tmp/cm_corpus tests/fuzz/corpus/checkpoint_manifest
// The seed corpus holds the manifest.json and rank_*.json files of a small real run (data 2 x
// tensor 2, step 10: the harness's folder is named step_00000010, so the step check passes).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "model/layout.h"

namespace {

// The invariants an accepted manifest promises, checked without the reader's code.
void check_accepted(const ft::ckpt::Manifest& m) {
  if (m.step != 10 || m.world < 1 || m.world != m.data * m.tensor * m.pipeline) std::abort();
  if (m.optimizer_step < 0 || m.tokens < 0 || m.zero_stage < 0 || m.zero_stage > 3) std::abort();
  if (const auto& ls = m.loss_scaler;
      ls && !(std::isfinite(ls->scale) && ls->scale > 0 && ls->hysteresis_left >= 1 &&
              ls->clean_steps >= 0 && ls->consecutive_skipped >= 0 &&
              ls->consecutive_skipped <= ls->total_skipped))
    std::abort();
  const ft::ParamLayout saved(m.model, m.tensor);
  if (saved.total_numel() > (uint64_t(1) << 40)) std::abort();
  if (m.shards.size() != size_t(m.world)) std::abort();
  for (const auto& p : m.pieces) {
    if (p.group < 0 || size_t(p.group) >= saved.groups().size()) std::abort();
    if (p.tensor_rank < 0 || p.tensor_rank >= m.tensor) std::abort();
    if (p.begin >= p.end || p.end > saved.groups()[size_t(p.group)].numel) std::abort();
    bool in_a_shard = false;
    for (const auto& s : m.shards)
      if (s.file == p.file && p.offset + (p.end - p.begin) * 4 <= s.bytes) in_a_shard = true;
    if (!in_a_shard || p.file.find('/') != std::string::npos) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ft::ckpt::Manifest m =
        ft::ckpt::parse_manifest(text, "/nonexistent/ft_fuzz/step_00000010");
    check_accepted(m);
    // A read through an accepted manifest: the shard files do not exist, so every piece read
    // must end in Error (never an allocation sized by a damaged number).
    // (Pieces of up to 1M elements: the caller sizes `out`, from the recipe's model in a run.)
    if (!m.pieces.empty() && m.pieces.front().end - m.pieces.front().begin <= (1u << 20)) {
      const auto& p = m.pieces.front();
      std::vector<float> out(p.end - p.begin);
      ft::ckpt::read_range(m, p.state, p.group, m.tensor, p.tensor_rank, p.begin, p.end,
                           out.data());
      std::abort();  // read a file that does not exist
    }
  } catch (const ft::Error&) {
    // Rejecting malformed input is the expected outcome.
  }
  try {
    const ft::ckpt::RankRecord r =
        ft::ckpt::parse_rank_json(text, "/nonexistent/ft_fuzz/step_00000010/rank_00000.json");
    if (r.file.empty() || r.file.find('/') != std::string::npos || !r.pieces.is_array())
      std::abort();
  } catch (const ft::Error&) {
  }
  return 0;
}
