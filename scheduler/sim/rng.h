// The sim's random source: our own samplers over mt19937_64 bits, so traces
// are the same on every standard library (std::*_distribution algorithms are
// unspecified). Shared by the workload generator and the trace family.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace ferry::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() {  // (0, 1)
    return (static_cast<double>(gen_() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Exponential(double rate) { return -std::log(Uniform()) / rate; }
  double Normal() {
    return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(2.0 * std::numbers::pi * Uniform());
  }
  // Marsaglia-Tsang; shape > 0, scale 1.
  double Gamma(double shape) {
    if (shape < 1.0) return Gamma(shape + 1.0) * std::pow(Uniform(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x = Normal(), v = 1.0 + c * x;
      if (v <= 0) continue;
      v = v * v * v;
      if (std::log(Uniform()) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }
  uint64_t Bits() { return gen_(); }

 private:
  std::mt19937_64 gen_;
};

}  // namespace ferry::sim
