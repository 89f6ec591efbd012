// Loader benchmark, driven by scripts/bench_loader.sh.
//
//   ft_bench_loader write DIR TOKENS [SHARD_TOKENS] [VOCAB]
//       synthetic shards (random documents of 50..2000 tokens) through ShardWriter; far faster
//       than tokenizing real text, which is beside the point here.
//   ft_bench_loader read DIR SEQ_LEN BATCH SECONDS [shuffle|noshuffle] [PREFETCH]
//       streams steps through DataLoader for about SECONDS; prints samples/s, tokens/s and the
//       process's peak RSS (VmHWM), which must stay small whatever the data size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenize.h"

namespace {

using Clock = std::chrono::steady_clock;

// Peak resident set size in KiB, from /proc/self/status.
long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

int write_cmd(int argc, char** argv) {
  const std::string dir = argv[2];
  const uint64_t total = std::strtoull(argv[3], nullptr, 10);
  const uint64_t shard_tokens = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 16u << 20;
  const int64_t vocab = argc > 5 ? std::atoll(argv[5]) : 32000;
  std::filesystem::create_directories(dir);
  ft::ShardAttributes attrs;
  attrs.vocab_size = vocab;
  attrs.bos_id = 1;
  attrs.eos_id = 2;
  attrs.tokenizer_sha256 = std::string(64, '0');
  const auto t0 = Clock::now();
  uint64_t rng = 88172645463325252ull, written = 0;
  std::vector<int32_t> doc;
  for (int64_t shard = 0; written < total; ++shard) {
    ft::ShardWriter w((std::filesystem::path(dir) / ft::shard_file_name(shard)).string(), attrs);
    while (w.num_tokens() < shard_tokens && written < total) {
      uint64_t n = 50 + xorshift(rng) % 1951;
      n = std::min<uint64_t>({n, total - written, shard_tokens - w.num_tokens()});
      doc.resize(n);
      doc[0] = 1;
      for (uint64_t i = 1; i < n; ++i) doc[i] = int32_t(3 + xorshift(rng) % uint64_t(vocab - 3));
      w.add_document(doc);
      written += n;
    }
    w.close();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("wrote %llu tokens to %s in %.1f s\n", (unsigned long long)written, dir.c_str(),
              secs);
  return 0;
}

int read_cmd(int argc, char** argv) {
  ft::LoaderOptions o;
  o.dir = argv[2];
  o.seq_len = std::atoi(argv[3]);
  o.global_batch = std::atoll(argv[4]);
  o.rank_count = o.global_batch;
  const double seconds = std::atof(argv[5]);
  o.shuffle = argc > 6 ? std::strcmp(argv[6], "noshuffle") != 0 : true;
  o.prefetch = argc > 7 ? std::atoi(argv[7]) : 4;
  o.seed = 7;
  const long rss_before = peak_rss_kib();
  const auto t0 = Clock::now();
  ft::DataLoader loader(o);
  const double open_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();
  uint64_t samples = 0, checksum = 0;
  double elapsed = 0;
  while (elapsed < seconds) {
    ft::StepSamples b = loader.next();
    samples += uint64_t(b.count);
    checksum += uint64_t(b.targets[0]);  // touch the data so nothing is optimised away
    elapsed = std::chrono::duration<double>(Clock::now() - t1).count();
  }
  std::printf("set: %llu samples per epoch at seq_len %d (opened and validated in %.2f s)\n",
              (unsigned long long)loader.samples_per_epoch(), o.seq_len, open_s);
  std::printf("read: shuffle=%s batch=%lld prefetch=%d: %llu samples in %.1f s\n",
              o.shuffle ? "yes" : "no", (long long)o.global_batch, o.prefetch,
              (unsigned long long)samples, elapsed);
  std::printf("samples/s: %.0f\ntokens/s: %.0f\n", double(samples) / elapsed,
              double(samples) * o.seq_len / elapsed);
  std::printf("peak RSS: %.1f MiB (%.1f MiB before opening the loader) [checksum %llu]\n",
              peak_rss_kib() / 1024.0, rss_before / 1024.0, (unsigned long long)checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ft::run_shard_check_if_child(argc, argv);  // the loader checks shards in a child (data/shard.h)
  try {
    if (argc >= 4 && std::strcmp(argv[1], "write") == 0) return write_cmd(argc, argv);
    if (argc >= 6 && std::strcmp(argv[1], "read") == 0) return read_cmd(argc, argv);
  } catch (const ft::Error& e) {
    std::fprintf(stderr, "ft_bench_loader: %s\n", e.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: ft_bench_loader write DIR TOKENS [SHARD_TOKENS] [VOCAB]\n"
      "       ft_bench_loader read DIR SEQ_LEN BATCH SECONDS [shuffle|noshuffle] [PREFETCH]\n");
  return 2;
}
