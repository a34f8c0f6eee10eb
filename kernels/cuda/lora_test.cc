// The GPU LoRA update against a double reference and the CPU kernel (kernels/cpu/lora.h), over a
// batch mixing three adapters of different ranks and targets with base-model rows; a row's result
// alone equals its result in the batch. The argument checks run here without a GPU.
#include "kernels/cuda/lora.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/lora.h"
#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::Bf16ToFloat;
using testing::DeviceVector;

TEST(CudaLoraArgs, RefusedWithoutLaunching) {
  int32_t slot = 0;
  LoraSlotWeights table;
  float scratch = 0, out = 0;
  uint16_t x = 0;
  const LoraArgs ok{&x, 1, &out, 1, 0, &slot, &table, 1, 1, 1, 1, 1, &scratch, nullptr};
  EXPECT_STREQ(LoraArgsError(ok), "");
  LoraArgs a = ok;
  a.num_tokens = 0;
  a.x = nullptr;
  EXPECT_STREQ(LoraArgsError(a), "") << "an empty batch is a no-op";
  EXPECT_EQ(LoraShrinkExpand(a), 0);
  a = ok;
  a.x = nullptr;
  EXPECT_EQ(LoraShrinkExpand(a), static_cast<int>(cudaErrorInvalidValue));
  a = ok;
  a.max_rank = kMaxLoraRank + 1;
  EXPECT_EQ(std::string(LoraArgsError(a)), "max_rank outside 1..kMaxLoraRank");
  a = ok;
  a.out_offset = 1;
  EXPECT_NE(std::string(LoraArgsError(a)), "") << "column 1 of a 1-column output";
  a = ok;
  a.x_stride = 0;
  EXPECT_EQ(LoraShrinkExpand(a), static_cast<int>(cudaErrorInvalidValue));
}

struct HostAdapter {
  int32_t rank;
  float scale;
  std::vector<uint16_t> a, b_t;  // [rank, k], [rank, n] bf16
};

TEST(CudaLora, MatchesTheReferenceAndTheCpuKernelRowByRow) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int64_t k = 896, n = 640, out_stride = 1152, offset = 256;
  const int32_t tokens = 37, max_rank = 16;
  std::vector<HostAdapter> adapters;
  for (const auto& [rank, scale] : std::vector<std::pair<int32_t, float>>{{16, 2.f}, {4, 0.5f}, {8, 1.f}}) {
    adapters.push_back({rank, scale, testing::RandomBf16(size_t(rank) * k, rng, 0.05f),
                        testing::RandomBf16(size_t(rank) * n, rng, 0.05f)});
  }
  std::vector<int32_t> slot(tokens);
  for (int32_t t = 0; t < tokens; ++t) slot[t] = t % 5 == 4 ? -1 : t % 3;  // base-model rows among them
  const auto x = testing::RandomBf16(size_t(tokens) * k, rng);
  const auto base = testing::RandomVector(size_t(tokens) * out_stride, rng);
  std::vector<std::unique_ptr<DeviceVector<uint16_t>>> d_a, d_b;  // not movable: held by pointer
  std::vector<LoraSlotWeights> table;
  for (const HostAdapter& h : adapters) {
    d_a.push_back(std::make_unique<DeviceVector<uint16_t>>(h.a));
    d_b.push_back(std::make_unique<DeviceVector<uint16_t>>(h.b_t));
    table.push_back({d_a.back()->get(), d_b.back()->get(), h.rank, h.scale});
  }
  table.push_back({});  // a slot whose adapter does not target this projection
  DeviceVector<LoraSlotWeights> d_table(table);
  DeviceVector<int32_t> d_slot(slot);
  DeviceVector<uint16_t> d_x(x);
  DeviceVector<float> d_out(base), d_scratch(size_t(tokens) * max_rank);
  LoraArgs args{d_x.get(), k, d_out.get(), out_stride, offset, d_slot.get(), d_table.get(), int32_t(table.size()),
                tokens, k, n, max_rank, d_scratch.get(), nullptr};
  ASSERT_EQ(LoraShrinkExpand(args), 0);
  const auto out = d_out.ToHost();

  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = Bf16ToFloat(x[i]);
  std::vector<float> cpu = base;
  for (int32_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < out_stride; ++j) {
      const size_t at = size_t(t) * out_stride + j;
      if (slot[t] < 0 || j < offset || j >= offset + n) {
        ASSERT_EQ(out[at], base[at]) << "row " << t << " column " << j << " is not the update's";
        continue;
      }
      const HostAdapter& h = adapters[slot[t]];
      double ref = base[at];
      for (int32_t r = 0; r < h.rank; ++r) {
        double v = 0;
        for (int64_t i = 0; i < k; ++i) v += double(Bf16ToFloat(h.a[size_t(r) * k + i])) * xf[size_t(t) * k + i];
        ref += h.scale * v * Bf16ToFloat(h.b_t[size_t(r) * n + (j - offset)]);
      }
      ASSERT_NEAR(out[at], ref, 1e-4 * (1 + std::fabs(ref))) << "row " << t << " column " << j;
    }
    if (slot[t] >= 0) {  // the CPU engine's kernel on the same bf16 weights
      const HostAdapter& h = adapters[slot[t]];
      cpu::LoraWeights w;
      w.a_bf16 = h.a.data();
      w.b_t_bf16 = h.b_t.data();
      w.rank = h.rank;
      w.k = k;
      w.n = n;
      w.scale = h.scale;
      const int32_t row = t;
      cpu::LoraShrinkExpand(w, xf.data(), k, cpu.data() + offset, out_stride, &row, 1);
      for (int64_t j = offset; j < offset + n; ++j) {
        const size_t at = size_t(t) * out_stride + j;
        ASSERT_NEAR(out[at], cpu[at], 1e-4 * (1 + std::fabs(cpu[at]))) << "row " << t << " column " << j;
      }
    }
  }

  // Each row alone gets exactly what it got in the batch.
  for (int32_t t : {0, 1, 2, 4, 36}) {
    DeviceVector<int32_t> one_slot(std::vector<int32_t>{slot[t]});
    DeviceVector<uint16_t> one_x(std::vector<uint16_t>(x.begin() + size_t(t) * k, x.begin() + size_t(t + 1) * k));
    DeviceVector<float> one_out(std::vector<float>(base.begin() + size_t(t) * out_stride,
                                                   base.begin() + size_t(t + 1) * out_stride));
    LoraArgs alone = args;
    alone.x = one_x.get();
    alone.out = one_out.get();
    alone.token_slot = one_slot.get();
    alone.num_tokens = 1;
    ASSERT_EQ(LoraShrinkExpand(alone), 0);
    const auto got = one_out.ToHost();
    for (int64_t j = 0; j < out_stride; ++j) ASSERT_EQ(got[j], out[size_t(t) * out_stride + j]) << t << "," << j;
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
