// Shared by the CUDA kernel tests: skip without a GPU, device buffers, bf16 on the host,
// random inputs. Every test compares against a reference computed in double on the host.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace ferry::kernels::cuda::testing {

inline bool HasGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define FERRY_SKIP_WITHOUT_GPU() \
  if (!::ferry::kernels::cuda::testing::HasGpu()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or 0)"

// A device copy of a host vector; copied back with ToHost.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n) : size_(n) { FERRY_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) {
    FERRY_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceVector() { cudaFree(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> out(size_);
    FERRY_CUDA_CHECK(cudaDeviceSynchronize());
    FERRY_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_;
};

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even (finite inputs).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline std::vector<float> RandomVector(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Tolerance for a bf16 result of an fp32 computation: one bf16 ulp of the reference.
inline double Bf16Tolerance(double ref) { return std::ldexp(std::fabs(ref), -7) + 1e-6; }

inline std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::vector<uint16_t> v(n);
  std::normal_distribution<float> dist(0.f, scale);
  for (auto& x : v) x = FloatToBf16(dist(rng));
  return v;
}

// A fresh seed per run (the GPU check runs on fresh random inputs), printed so a failure can be
// replayed with FERRY_TEST_SEED.
inline uint32_t TestSeed() {
  static const uint32_t seed = [] {
    const char* env = std::getenv("FERRY_TEST_SEED");
    const uint32_t s = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("FERRY_TEST_SEED=%u\n", s);
    return s;
  }();
  return seed;
}

}  // namespace ferry::kernels::cuda::testing
