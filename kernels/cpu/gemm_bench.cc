// Gemm on Qwen2.5-0.5B's layer shapes: GFLOP/s per shape, row count and weight dtype
// (docs/benchmarks/cpu.md). Run: build/bin/ferry-gemm-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_int8.h"

namespace ferry::kernels::cpu {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"qkv", 1152, 896},     {"o_proj", 896, 896}, {"gate_up", 9728, 896},
                             {"down", 896, 4864},    {"lm_head", 151936, 896}};

void BM_Gemm(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const int64_t m = state.range(1);
  const bool bf16 = state.range(2) != 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(m * shape.k), w(shape.n * shape.k), out(m * shape.n);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng) * 0.02f;
  std::vector<uint16_t> w_bf16(PackedBf16Size(shape.n, shape.k));
  PackBf16(w.data(), shape.n, shape.k, w_bf16.data());
  GemmArgs args;
  args.x = x.data();
  args.weight = bf16 ? static_cast<const void*>(w_bf16.data()) : w.data();
  args.dtype = bf16 ? GemmWeight::kBfloat16Packed : GemmWeight::kFloat32;
  args.out = out.data();
  args.m = m;
  args.n = shape.n;
  args.k = shape.k;
  for (auto _ : state) {
    Gemm(args);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(shape.name) + (bf16 ? " bf16" : " fp32"));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * shape.n * shape.k,
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

BENCHMARK(BM_Gemm)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1, 16, 64, 256}, {0, 1}})
    ->ArgNames({"shape", "m", "bf16"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// W8A8: the activations' per-token quantization is timed with the product, as the worker runs it.
void BM_GemmInt8(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const int64_t m = state.range(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(m * shape.k), w(shape.n * shape.k), out(m * shape.n);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng) * 0.02f;
  const int64_t kp = Int8PaddedK(shape.k), np = Int8PaddedN(shape.n);
  std::vector<int8_t> qw(shape.n * kp), packed(PackedInt8Size(shape.n, shape.k)), qx(m * kp);
  std::vector<float> w_scale(np), x_scale(m);
  std::vector<int32_t> sums(np);
  QuantizeRowsInt8(w.data(), shape.n, shape.k, qw.data(), w_scale.data());
  PackInt8(qw.data(), shape.n, shape.k, packed.data(), sums.data());
  GemmInt8Args args;
  args.x = qx.data();
  args.x_scale = x_scale.data();
  args.weight = packed.data();
  args.w_scale = w_scale.data();
  args.w_sums = sums.data();
  args.out = out.data();
  args.m = m;
  args.n = shape.n;
  args.k = shape.k;
  for (auto _ : state) {
    QuantizeRowsInt8(x.data(), m, shape.k, qx.data(), x_scale.data());
    GemmInt8(args);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(shape.name) + (Int8UsesVnni() ? " int8 vnni" : " int8 avx2"));
  state.counters["GOP/s"] = benchmark::Counter(2.0 * m * shape.n * shape.k,
                                               benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}

BENCHMARK(BM_GemmInt8)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1, 16, 64, 256}})
    ->ArgNames({"shape", "m"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ferry::kernels::cpu

BENCHMARK_MAIN();
