// libFuzzer harness for config.json reading (read_hf_config_located) and the RoPE table built
// from what it accepts (not part of the default build).
//
// Contract under test: any byte string as config.json either throws ft::Error (a UsageError
// naming the file) or gives a ModelConfig whose RoPE, when its type is implemented, yields an
// inverse-frequency table of finite positive floats for the model's head_dim (when that is a
// whole even number), so that an accepted file never trains with inf or NaN angles. Anything
// else (a crash, a sanitizer report, another exception type, a non-finite table) is a bug.
// read_hf_config takes a folder, so each input is written to config.json in a per-process
// folder under /dev/shm (memory, not disk).
//
// Build and run (clang, from the repository root):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib -I. \
//     tests/fuzz/fuzz_hf_config.cpp lib/ckpt/hf_config.cpp lib/model/rope.cpp \
//     -o /tmp/fuzz_hf_config
//   mkdir -p /tmp/hf_corpus
//   /tmp/fuzz_hf_config -max_total_time=300 /tmp/hf_corpus tests/fuzz/corpus/hf_config
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/hf.h"
#include "core/error.h"
#include "model/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/dev/shm/fuzz_hf_config." + std::to_string(::getpid());
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  {
    std::ofstream out(dir + "/config.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  ft::HfConfigRead r;
  try {
    r = ft::read_hf_config_located(dir);
  } catch (const ft::Error&) {
    return 0;  // rejecting malformed input is the expected outcome
  }
  if (!ft::is_rope_type(r.model.rope_type)) {
    if (r.unsupported.empty()) std::abort();  // an unknown type must be reported
    return 0;
  }
  const ft::ModelConfig& m = r.model;
  if (!ft::heads_whole(m) || ft::head_dim_of(m) % 2 != 0) return 0;  // refused elsewhere
  {
    const int head_dim = ft::head_dim_of(m);
    if (head_dim > (1 << 16)) return 0;  // keeps the table small; the math is per entry
    const std::vector<float> inv = ft::rope_inv_freq(m, head_dim);
    for (float f : inv) {
      if (!std::isfinite(f) || !(f > 0)) {
        std::fprintf(stderr, "non-finite or non-positive inv_freq %g (head_dim %d)\n", f, head_dim);
        std::abort();
      }
    }
  }
  return 0;
}
