// Runs only where a GPU is present; on CPU-only machines it reports a skip.
#include "kernels/cuda/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::DeviceVector;

// Bitwise equal to the CPU kernel with a bf16 cache (both round to nearest even); skipped
// slots (-1) and slots never written keep their old contents.
TEST(CudaWriteKvCache, MatchesCpuKernel) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int head_dim : {16, 64}) {
    for (int kv_heads : {1, 2}) {
      const int num_blocks = 9, block_size = 16, tokens = 50;
      const int64_t row = int64_t{kv_heads} * head_dim, stride = 3 * row + 4;  // like a fused QKV row
      const size_t cache_elems = size_t(num_blocks) * block_size * row;
      std::vector<int32_t> slots(num_blocks * block_size);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(tokens);
      slots[3] = -1;
      const auto qkv = testing::RandomVector(tokens * stride, rng);
      const auto k_init = testing::RandomBf16(cache_elems, rng), v_init = testing::RandomBf16(cache_elems, rng);
      DeviceVector<float> d_qkv(qkv);
      DeviceVector<int32_t> d_slots(slots);
      DeviceVector<uint16_t> d_k(k_init), d_v(v_init);
      WriteKvCacheArgs args{d_qkv.get() + row, d_qkv.get() + 2 * row, d_slots.get(), d_k.get(), d_v.get(), tokens,
                            kv_heads, head_dim, stride, nullptr};
      ASSERT_EQ(WriteKvCache(args), 0);
      std::vector<uint16_t> k_ref = k_init, v_ref = v_init;
      const cpu::KvCacheShape shape{num_blocks, block_size, kv_heads, head_dim, cpu::KvDtype::kBfloat16};
      cpu::WriteKvCache(shape, qkv.data() + row, qkv.data() + 2 * row, slots.data(), tokens, k_ref.data(),
                        v_ref.data(), stride);
      EXPECT_EQ(d_k.ToHost(), k_ref) << "head_dim " << head_dim << " kv_heads " << kv_heads;
      EXPECT_EQ(d_v.ToHost(), v_ref) << "head_dim " << head_dim << " kv_heads " << kv_heads;
    }
  }
}

}  // namespace
}  // namespace ferry::kernels::cuda
