// The seeded draw of the samplers, callable from host and device code alike. A copy of
// common/counter_uniform.h's CounterUniform (kernels/ depends on nothing of ours); the two are
// compared bit for bit on the host by worker/gpu/device_sampler_test.cc.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

namespace ferry::kernels::cuda {

FERRY_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1): 53 bits of splitmix64 applied twice over (seed, counter). No state, so a
// row's draw depends on nothing but its own seed and sample index.
FERRY_HOST_DEVICE inline double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace ferry::kernels::cuda
