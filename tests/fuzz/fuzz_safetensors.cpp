// libFuzzer harness for the safetensors reader (not part of the default build).
//
// Contract under test: any byte string either opens (and every float tensor then reads) or
// throws ft::Error; anything else — a crash, a sanitizer report, another exception type — is a
// bug. Each input goes into one memfd, opened by path through /proc/self/fd, so the fuzzer
// never touches the disk.
//
// Build and run: scripts/fuzz.sh (all harnesses), or by hand (clang, from the repository root):
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib \
//     tests/fuzz/fuzz_safetensors.cpp lib/ckpt/safetensors.cpp lib/core/dtype.cpp \
//     -o /tmp/fuzz_safetensors
//   mkdir -p /tmp/st_corpus && /tmp/fuzz_safetensors -max_total_time=60 /tmp/st_corpus
// Seed the corpus with a few real files (e.g. ones written by the unit tests) to get past the
// JSON syntax quickly.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz_safetensors", 0);
  if (fd < 0) std::abort();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0 || (size > 0 && ::pwrite(fd, data, size, 0) != ssize_t(size)))
    std::abort();
  try {
    ft::SafetensorsFile f(path);
    for (const auto& [name, e] : f.entries()) {
      if (e.dtype != ft::DType::kF32 && e.dtype != ft::DType::kBF16 && e.dtype != ft::DType::kF16)
        continue;
      std::vector<float> out(size_t((e.end - e.begin) / ft::dtype_size(e.dtype)));
      f.read_f32(name, out.data(), out.size());
    }
  } catch (const ft::Error&) {
    // Rejecting malformed input is the expected outcome.
  }
  return 0;
}
