// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", 2014): a
// small, fully specified generator, so that initialisation and data order are identical on every
// platform and standard library (std's distributions are implementation-defined). Reference
// scripts (tests/ref/llama_ref.py) reproduce it bit for bit.
#pragma once

#include <cstdint>

namespace ft {

// The splitmix64 output for state z (the state advances by the golden-ratio increment first).
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A splitmix64 stream.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    const uint64_t out = splitmix64(state);
    state += 0x9E3779B97F4A7C15ull;
    return out;
  }
  double uniform() { return double((next() >> 11) + 1) * (1.0 / 9007199254740993.0); }  // (0, 1)
};

}  // namespace ft
