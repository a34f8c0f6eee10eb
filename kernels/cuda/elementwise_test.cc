// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::Bf16ToFloat;
using testing::DeviceVector;

TEST(CudaSiluAndMul, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int inter : {128, 4864, 300}) {
    const int tokens = 19;
    const auto gate_up = testing::RandomVector(size_t(tokens) * 2 * inter, rng, 3.f);
    DeviceVector<float> d_in(gate_up);
    DeviceVector<uint16_t> d_out(size_t(tokens) * inter);
    ASSERT_EQ(SiluAndMul({d_in.get(), d_out.get(), tokens, inter, nullptr}), 0);
    const auto out = d_out.ToHost();
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < inter; ++i) {
        const double g = gate_up[size_t(t) * 2 * inter + i], u = gate_up[size_t(t) * 2 * inter + inter + i];
        const double ref = g / (1 + std::exp(-g)) * u;
        ASSERT_NEAR(Bf16ToFloat(out[size_t(t) * inter + i]), ref, testing::Bf16Tolerance(ref)) << t << "," << i;
      }
    }
  }
}

TEST(CudaEmbedding, CopiesRows) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed() + 1);
  const int vocab = 1000, hidden = 896;
  const auto table = testing::RandomBf16(size_t(vocab) * hidden, rng);
  const std::vector<int32_t> ids = {0, 999, 5, 5, 123};
  DeviceVector<uint16_t> d_table(table);
  DeviceVector<int32_t> d_ids(ids);
  DeviceVector<float> d_out(ids.size() * hidden);
  ASSERT_EQ(Embedding({d_ids.get(), d_table.get(), d_out.get(), int32_t(ids.size()), hidden, nullptr}), 0);
  const auto out = d_out.ToHost();
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int i = 0; i < hidden; ++i) ASSERT_EQ(out[t * hidden + i], Bf16ToFloat(table[size_t(ids[t]) * hidden + i]));
  }
}

TEST(CudaGatherVocabShards, DropsPadding) {
  FERRY_SKIP_WITHOUT_GPU();
  const int ranks = 3, rows = 4, vocab = 10, slice = 4;  // 12 padded columns
  std::vector<float> gathered(ranks * rows * slice);
  for (size_t i = 0; i < gathered.size(); ++i) gathered[i] = float(i);
  DeviceVector<float> d_in(gathered), d_out(rows * vocab);
  ASSERT_EQ(GatherVocabShards({d_in.get(), d_out.get(), ranks, rows, slice, vocab, nullptr}), 0);
  const auto out = d_out.ToHost();
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < vocab; ++c) {
      ASSERT_EQ(out[r * vocab + c], gathered[(c / slice * rows + r) * slice + c % slice]) << r << "," << c;
    }
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
