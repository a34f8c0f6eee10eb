// The seeded draw Ferry's samplers and random checkpoints use: uniform in [0, 1) from a
// counter-based generator (splitmix64 over the pair), so a value depends on nothing but its own
// seed and counter. kernels/cuda/counter_uniform.h is the device's copy (kernels/ depends on
// nothing of ours); worker/gpu/device_sampler_test.cc compares the two bit for bit.
#pragma once

#include <cstdint>

namespace ferry {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline double CounterUniform(uint64_t seed, uint64_t counter) {
  // Two rounds so (seed, counter) and (seed + 1, counter - 1)-like pairs do not collide.
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random bits -> [0, 1)
}

}  // namespace ferry
