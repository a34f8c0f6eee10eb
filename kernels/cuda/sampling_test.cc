// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/sampling.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::DeviceVector;

int32_t ReferenceArgmax(const float* row, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

TEST(CudaArgmax, FirstMaximumWins) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int vocab : {2048, 151936, 7}) {
    const int rows = 9;
    auto logits = testing::RandomVector(size_t(rows) * vocab, rng);
    // Ties: row 1 has its maximum twice, row 2 is constant, row 3's maximum is the last id.
    logits[size_t(vocab) + vocab / 2] = 100.f;
    logits[size_t(vocab) + vocab - 1] = 100.f;
    for (int i = 0; i < vocab; ++i) logits[size_t(2) * vocab + i] = -3.f;
    logits[size_t(3) * vocab + vocab - 1] = 1000.f;
    DeviceVector<float> d_logits(logits);
    DeviceVector<int32_t> d_out(rows);
    ASSERT_EQ(Argmax({d_logits.get(), d_out.get(), rows, vocab, nullptr}), 0);
    const auto out = d_out.ToHost();
    for (int r = 0; r < rows; ++r) EXPECT_EQ(out[r], ReferenceArgmax(logits.data() + size_t(r) * vocab, vocab)) << r;
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
