// Paged attention against a naive double-precision causal GQA reference over contiguous K/V;
// scattered blocks equal contiguous blocks; a batch equals each sequence run alone.
#include "kernels/cpu/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"

namespace ferry::kernels::cpu {
namespace {

struct SeqCase {
  int context_len;  // tokens already cached
  int num_queries;  // new tokens this step
};

struct Shape {
  int num_heads, num_kv_heads, head_dim, block_size;
};

// All of a sequence's K/V (cached and new), contiguous: [total, num_kv_heads, head_dim].
struct SeqData {
  SeqCase c;
  std::vector<float> k, v;
  std::vector<float> q;  // [num_queries, num_heads, head_dim]
};

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<SeqData> MakeSeqs(const Shape& s, const std::vector<SeqCase>& cases, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SeqData> seqs;
  for (const SeqCase& c : cases) {
    const size_t total = c.context_len + c.num_queries;
    seqs.push_back({c, Random(total * s.num_kv_heads * s.head_dim, rng),
                    Random(total * s.num_kv_heads * s.head_dim, rng),
                    Random(size_t(c.num_queries) * s.num_heads * s.head_dim, rng)});
  }
  return seqs;
}

// Naive causal GQA in double for one sequence: [num_queries, num_heads, head_dim].
std::vector<double> Reference(const Shape& s, const SeqData& seq) {
  const int d = s.head_dim, group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(size_t(seq.c.num_queries) * s.num_heads * d);
  for (int i = 0; i < seq.c.num_queries; ++i) {
    const int num_keys = seq.c.context_len + i + 1;
    for (int h = 0; h < s.num_heads; ++h) {
      const float* q = &seq.q[(size_t(i) * s.num_heads + h) * d];
      const int kvh = h / group;
      std::vector<double> w(num_keys);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < num_keys; ++j) {
        const float* k = &seq.k[(size_t(j) * s.num_kv_heads + kvh) * d];
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += double(q[x]) * k[x];
        w[j] = dot / std::sqrt(double(d));
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int j = 0; j < num_keys; ++j) {
        const float* v = &seq.v[(size_t(j) * s.num_kv_heads + kvh) * d];
        for (int x = 0; x < d; ++x) out[(size_t(i) * s.num_heads + h) * d + x] += w[j] / sum * v[x];
      }
    }
  }
  return out;
}

// Runs the kernels on a batch: places blocks (shuffled or in order), writes cached K/V with
// WriteKvCache, then the step's new K/V, then attends. Returns out, [num_tokens, heads, dim].
std::vector<float> RunPaged(const Shape& s, const std::vector<SeqData>& seqs, bool shuffle,
                            uint32_t seed, KvDtype dtype = KvDtype::kFloat32) {
  const int bs = s.block_size;
  int max_blocks = 0, total_blocks = 0;
  for (const auto& q : seqs) {
    const int n = (q.c.context_len + q.c.num_queries + bs - 1) / bs;
    max_blocks = std::max(max_blocks, n);
    total_blocks += n;
  }
  // Spare blocks so ids are not dense, and a permutation so tables are non-contiguous.
  const int num_blocks = total_blocks * 2 + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (shuffle) std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  KvCacheShape cache{num_blocks, bs, s.num_kv_heads, s.head_dim, dtype};
  const size_t row = size_t(s.num_kv_heads) * s.head_dim;
  // NaN everywhere (as fp32, and as each bf16 half), so reading any slot that was not written
  // poisons the output.
  std::vector<uint32_t> k_cache(size_t(num_blocks) * bs * row, 0x7fc07fc0u), v_cache = k_cache;
  std::vector<int32_t> tables(seqs.size() * max_blocks, -1), query_start{0}, context_lens;
  std::vector<float> q_all, new_k, new_v;
  std::vector<int32_t> new_slots;
  int next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqData& seq = seqs[i];
    const int total = seq.c.context_len + seq.c.num_queries;
    for (int b = 0; b < (total + bs - 1) / bs; ++b) tables[i * max_blocks + b] = ids[next++];
    std::vector<int32_t> old_slots;
    for (int p = 0; p < total; ++p) {
      const int32_t slot = tables[i * max_blocks + p / bs] * bs + p % bs;
      (p < seq.c.context_len ? old_slots : new_slots).push_back(slot);
    }
    WriteKvCache(cache, seq.k.data(), seq.v.data(), old_slots.data(), old_slots.size(),
                 k_cache.data(), v_cache.data());
    new_k.insert(new_k.end(), seq.k.begin() + seq.c.context_len * row, seq.k.end());
    new_v.insert(new_v.end(), seq.v.begin() + seq.c.context_len * row, seq.v.end());
    q_all.insert(q_all.end(), seq.q.begin(), seq.q.end());
    query_start.push_back(query_start.back() + seq.c.num_queries);
    context_lens.push_back(seq.c.context_len);
  }
  WriteKvCache(cache, new_k.data(), new_v.data(), new_slots.data(), new_slots.size(),
               k_cache.data(), v_cache.data());
  std::vector<float> out(q_all.size(), NAN);
  PagedAttentionParams p;
  p.cache = cache;
  p.num_seqs = static_cast<int32_t>(seqs.size());
  p.num_heads = s.num_heads;
  p.max_blocks_per_seq = max_blocks;
  p.scale = 1.f / std::sqrt(float(s.head_dim));
  p.q = q_all.data();
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.block_tables = tables.data();
  p.query_start = query_start.data();
  p.context_lens = context_lens.data();
  p.out = out.data();
  PagedAttention(p);
  return out;
}

const std::vector<Shape> kShapes = {
    {1, 1, 8, 4}, {4, 2, 16, 16}, {14, 2, 64, 16}, {8, 8, 32, 1}, {6, 1, 128, 32}};
// Mixed batch: a fresh prefill, a prefill chunk after cached tokens, decodes at block
// boundaries and mid-block.
const std::vector<SeqCase> kBatch = {{0, 21}, {16, 1}, {37, 5}, {15, 1}, {0, 1}, {64, 17}};

TEST(PagedAttentionTest, MatchesNaiveReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "heads " << s.num_heads << "/" << s.num_kv_heads
                                    << " dim " << s.head_dim << " block " << s.block_size);
    const auto seqs = MakeSeqs(s, kBatch, 7);
    const auto out = RunPaged(s, seqs, /*shuffle=*/true, 11);
    size_t offset = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto want = Reference(s, seqs[i]);
      for (size_t e = 0; e < want.size(); ++e) {
        ASSERT_NEAR(out[offset + e], want[e], 2e-5 * (1 + std::abs(want[e])))
            << "seq " << i << " element " << e;
      }
      offset += want.size();
    }
    EXPECT_EQ(offset, out.size());
  }
}

TEST(PagedAttentionTest, ScatteredBlocksEqualContiguous) {
  for (const Shape& s : kShapes) {
    const auto seqs = MakeSeqs(s, kBatch, 8);
    // Same arithmetic in the same order, only addresses differ: results are bit-identical.
    EXPECT_EQ(RunPaged(s, seqs, /*shuffle=*/true, 1), RunPaged(s, seqs, /*shuffle=*/false, 0));
    EXPECT_EQ(RunPaged(s, seqs, /*shuffle=*/true, 1), RunPaged(s, seqs, /*shuffle=*/true, 2));
  }
}

TEST(PagedAttentionTest, BatchedEqualsSingle) {
  for (const Shape& s : kShapes) {
    const auto seqs = MakeSeqs(s, kBatch, 9);
    const auto batched = RunPaged(s, seqs, /*shuffle=*/true, 3);
    std::vector<float> singles;
    for (const SeqData& seq : seqs) {
      const auto one = RunPaged(s, {seq}, /*shuffle=*/true, 4);
      singles.insert(singles.end(), one.begin(), one.end());
    }
    EXPECT_EQ(batched, singles);
  }
}

// K/V rounded to bf16 the way a bf16 cache stores them.
SeqData RoundKvToBf16(SeqData seq) {
  for (auto* kv : {&seq.k, &seq.v}) {
    for (float& x : *kv) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) << 16;
      std::memcpy(&x, &u, 4);
    }
  }
  return seq;
}

class BothIsasTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { SetIsaForTesting(GetParam()); }
  void TearDown() override { SetIsaForTesting(Isa::kAvx512); }
};

// A bf16 cache attends over bf16-rounded K/V in fp32: the reference on rounded K/V matches.
TEST_P(BothIsasTest, Bf16CacheMatchesReferenceOnRoundedKv) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "heads " << s.num_heads << "/" << s.num_kv_heads
                                    << " dim " << s.head_dim << " block " << s.block_size);
    const auto seqs = MakeSeqs(s, kBatch, 12);
    const auto out = RunPaged(s, seqs, /*shuffle=*/true, 13, KvDtype::kBfloat16);
    size_t offset = 0;
    for (const SeqData& seq : seqs) {
      const auto want = Reference(s, RoundKvToBf16(seq));
      for (size_t e = 0; e < want.size(); ++e) {
        ASSERT_NEAR(out[offset + e], want[e], 2e-5 * (1 + std::abs(want[e]))) << "element " << e;
      }
      offset += want.size();
    }
    // Batch independence holds for bf16 too.
    std::vector<float> singles;
    for (const SeqData& seq : seqs) {
      const auto one = RunPaged(s, {seq}, /*shuffle=*/true, 4, KvDtype::kBfloat16);
      singles.insert(singles.end(), one.begin(), one.end());
    }
    EXPECT_EQ(out, singles);
  }
}

// Each ISA copy matches the reference (the other tests run on the detected ISA only).
TEST_P(BothIsasTest, Fp32MatchesReference) {
  const Shape s{14, 2, 64, 16};
  const auto seqs = MakeSeqs(s, kBatch, 14);
  const auto out = RunPaged(s, seqs, /*shuffle=*/true, 15);
  size_t offset = 0;
  for (const SeqData& seq : seqs) {
    const auto want = Reference(s, seq);
    for (size_t e = 0; e < want.size(); ++e) {
      ASSERT_NEAR(out[offset + e], want[e], 2e-5 * (1 + std::abs(want[e]))) << "element " << e;
    }
    offset += want.size();
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, BothIsasTest, ::testing::Values(Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

TEST(PagedAttentionTest, NegativeSlotIsSkipped) {
  KvCacheShape cache{2, 2, 1, 2};
  std::vector<float> k{1, 2, 3, 4}, v{5, 6, 7, 8};
  std::vector<float> k_cache(8, 0.f), v_cache(8, 0.f);
  const std::vector<int32_t> slots{-1, 3};
  WriteKvCache(cache, k.data(), v.data(), slots.data(), 2, k_cache.data(), v_cache.data());
  EXPECT_EQ(k_cache, (std::vector<float>{0, 0, 0, 0, 0, 0, 3, 4}));
  EXPECT_EQ(v_cache, (std::vector<float>{0, 0, 0, 0, 0, 0, 7, 8}));
}

}  // namespace
}  // namespace ferry::kernels::cpu
