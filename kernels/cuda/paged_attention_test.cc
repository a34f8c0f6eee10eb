// Runs only where a GPU is present; on CPU-only machines it reports a skip.
// Decode (flash-decoding, several split counts) and prefill (ragged, causal, with cached
// context) against attention computed in double from the same bf16 cache, each for every
// kernel (DecodeImpl, PrefillImpl). Decode's kernels and the SIMT prefill are held to one bf16
// ulp; the tensor-core prefill consumes q and the probabilities as bf16 (paged_attention.h),
// so its reference rounds q to bf16 first and its bound adds the probabilities' rounding.
#include "kernels/cuda/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/test_util.h"

namespace ferry::kernels::cuda {
namespace {

using testing::Bf16ToFloat;
using testing::DeviceVector;

struct Geometry {
  int heads, kv_heads, head_dim, block_size;
};

// A random bf16 cache and, per sequence, a scrambled block table covering `lens` positions.
struct PagedCache {
  Geometry g;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  std::vector<uint16_t> k, v;          // [num_blocks, block_size, kv_heads, head_dim]
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]

  PagedCache(const Geometry& geometry, const std::vector<int>& lens, std::mt19937& rng) : g(geometry) {
    int total = 0;
    for (int len : lens) {
      const int n = (len + g.block_size - 1) / g.block_size;
      total += n;
      max_blocks_per_seq = std::max(max_blocks_per_seq, n);
    }
    max_blocks_per_seq += 2;  // unused columns: the kernels must honour the row stride
    num_blocks = total + 3;
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    block_tables.assign(lens.size() * max_blocks_per_seq, 0);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int b = 0; b < (lens[s] + g.block_size - 1) / g.block_size; ++b) {
        block_tables[s * max_blocks_per_seq + b] = pool[next++];
      }
    }
    const size_t elems = size_t(num_blocks) * g.block_size * g.kv_heads * g.head_dim;
    k = testing::RandomBf16(elems, rng);
    v = testing::RandomBf16(elems, rng);
  }

  size_t Offset(int seq, int pos, int kv_head) const {
    const int block = block_tables[seq * max_blocks_per_seq + pos / g.block_size];
    return ((size_t(block) * g.block_size + pos % g.block_size) * g.kv_heads + kv_head) * g.head_dim;
  }

  // Attention of one query row (head `head`) over positions [0, visible) of sequence `seq`.
  // abs_out (when given): sum_p w_p |v_p| / sum_p w_p per dim, which bounds the effect of a
  // relative error in every probability.
  std::vector<double> Attend(const float* q, int seq, int head, int visible, double scale,
                             std::vector<double>* abs_out = nullptr) const {
    const int kv_head = head / (g.heads / g.kv_heads);
    std::vector<double> scores(visible), out(g.head_dim, 0.0);
    double max_score = -INFINITY;
    for (int p = 0; p < visible; ++p) {
      const size_t off = Offset(seq, p, kv_head);
      double dot = 0;
      for (int d = 0; d < g.head_dim; ++d) dot += double(q[d]) * Bf16ToFloat(k[off + d]);
      scores[p] = dot * scale;
      max_score = std::max(max_score, scores[p]);
    }
    double sum = 0;
    if (abs_out != nullptr) abs_out->assign(g.head_dim, 0.0);
    for (int p = 0; p < visible; ++p) {
      const double w = std::exp(scores[p] - max_score);
      sum += w;
      const size_t off = Offset(seq, p, kv_head);
      for (int d = 0; d < g.head_dim; ++d) out[d] += w * Bf16ToFloat(v[off + d]);
      if (abs_out != nullptr) {
        for (int d = 0; d < g.head_dim; ++d) (*abs_out)[d] += w * std::fabs(Bf16ToFloat(v[off + d]));
      }
    }
    for (double& o : out) o /= sum;
    if (abs_out != nullptr) {
      for (double& a : *abs_out) a /= sum;
    }
    return out;
  }
};

// extra (when given): per-dim additions to the bound (the tensor-core kernel's rounding of P).
void ExpectClose(const std::vector<uint16_t>& got, size_t offset, const std::vector<double>& ref, const char* what,
                 int seq, int head, const std::vector<double>* extra = nullptr) {
  for (size_t d = 0; d < ref.size(); ++d) {
    const double bound = testing::Bf16Tolerance(ref[d]) + 1e-4 + (extra != nullptr ? (*extra)[d] : 0.0);
    ASSERT_NEAR(Bf16ToFloat(got[offset + d]), ref[d], bound)
        << what << " seq " << seq << " head " << head << " dim " << d;
  }
}

// Groups (heads / kv_heads) 2, 7, 7, 1, 8, 8; block sizes 8 to 32, so key tiles of 64 span
// several cache blocks.
const Geometry kGeometries[] = {{4, 2, 16, 16}, {14, 2, 64, 16}, {7, 1, 64, 16},
                                {8, 8, 64, 32}, {8, 1, 64, 16},  {16, 2, 16, 8}};

class CudaDecodeAttention : public ::testing::TestWithParam<DecodeImpl> {};

TEST_P(CudaDecodeAttention, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(testing::TestSeed());
  const std::vector<int> lens = {1, 17, 64, 65, 300, 0, 1000, 3001};  // 0: a padding row
  for (const Geometry& g : kGeometries) {
    PagedCache cache(g, lens, rng);
    const int num_seqs = static_cast<int>(lens.size());
    const int64_t q_stride = int64_t{g.heads + 2 * g.kv_heads} * g.head_dim, out_stride = int64_t{g.heads} * g.head_dim;
    const auto q = testing::RandomVector(num_seqs * q_stride, rng);
    DeviceVector<float> d_q(q);
    DeviceVector<uint16_t> d_k(cache.k), d_v(cache.v);
    DeviceVector<int32_t> d_tables(cache.block_tables), d_lens(std::vector<int32_t>(lens.begin(), lens.end()));
    const float scale = 1.f / std::sqrt(float(g.head_dim));
    for (int splits : {1, 3, ChooseDecodeSplits(num_seqs, g.kv_heads, 132, 3001), kMaxDecodeSplits}) {
      DeviceVector<float> workspace(DecodeWorkspaceFloats(num_seqs, g.heads, g.head_dim, splits));
      DeviceVector<uint16_t> d_out(std::vector<uint16_t>(num_seqs * out_stride, 0x7fc0));  // NaN: unwritten
      DecodeAttentionArgs args{d_q.get(), d_k.get(), d_v.get(), d_tables.get(), d_lens.get(), d_out.get(),
                               workspace.get(), num_seqs, g.heads, g.kv_heads, g.head_dim, g.block_size,
                               cache.max_blocks_per_seq, splits, q_stride, out_stride, scale, nullptr,
                               GetParam()};
      ASSERT_EQ(DecodeAttention(args), 0);
      const auto out = d_out.ToHost();
      for (int s = 0; s < num_seqs; ++s) {
        for (int h = 0; h < g.heads; ++h) {
          std::vector<double> ref(g.head_dim, 0.0);
          if (lens[s] > 0) ref = cache.Attend(q.data() + s * q_stride + h * g.head_dim, s, h, lens[s], scale);
          SCOPED_TRACE("head_dim " + std::to_string(g.head_dim) + " splits " + std::to_string(splits));
          ExpectClose(out, s * out_stride + h * g.head_dim, ref, "decode", s, h);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, CudaDecodeAttention,
                         ::testing::Values(DecodeImpl::kPrefetch, DecodeImpl::kBaseline),
                         [](const auto& info) { return info.param == DecodeImpl::kPrefetch ? "Prefetch" : "Baseline"; });

struct PrefillCase {
  int context;      // tokens already cached
  int num_queries;  // tokens computed this step
};

// The tensor-core kernel's reference input: q as the kernel rounds it.
std::vector<float> RoundedToBf16(std::vector<float> v) {
  for (float& x : v) x = Bf16ToFloat(testing::FloatToBf16(x));
  return v;
}

class CudaPrefillAttention : public ::testing::TestWithParam<PrefillImpl> {};

TEST_P(CudaPrefillAttention, MatchesReference) {
  FERRY_SKIP_WITHOUT_GPU();
  const bool tensor_core = GetParam() == PrefillImpl::kTensorCore;
  std::mt19937 rng(testing::TestSeed() + 1);
  // Partial query tiles (37, 5, 33, 70), tiles and key chunks crossing cache blocks (contexts 20,
  // 7, 513), a long context (2000), a sequence of one query.
  const std::vector<PrefillCase> cases = {{0, 1},    {0, 37}, {20, 5}, {100, 16},
                                          {0, 130},  {513, 33}, {7, 1}, {2000, 70}};
  for (const Geometry& g : kGeometries) {
    std::vector<int> lens;
    std::vector<int32_t> query_start = {0}, context_lens, tile_seq, tile_query;
    for (size_t s = 0; s < cases.size(); ++s) {
      lens.push_back(cases[s].context + cases[s].num_queries);
      query_start.push_back(query_start.back() + cases[s].num_queries);
      context_lens.push_back(cases[s].context);
      for (int q0 = 0; q0 < cases[s].num_queries; q0 += kPrefillQueryTile) {
        tile_seq.push_back(static_cast<int32_t>(s));
        tile_query.push_back(q0);
      }
    }
    PagedCache cache(g, lens, rng);
    const int num_tokens = query_start.back();
    const int64_t q_stride = int64_t{g.heads + 2 * g.kv_heads} * g.head_dim, out_stride = int64_t{g.heads} * g.head_dim;
    const auto q = testing::RandomVector(num_tokens * q_stride, rng);
    DeviceVector<float> d_q(q);
    DeviceVector<uint16_t> d_k(cache.k), d_v(cache.v);
    DeviceVector<uint16_t> d_out(std::vector<uint16_t>(num_tokens * out_stride, 0x7fc0));
    DeviceVector<int32_t> d_tables(cache.block_tables), d_qs(query_start), d_ctx(context_lens), d_ts(tile_seq),
        d_tq(tile_query);
    const float scale = 1.f / std::sqrt(float(g.head_dim));
    PrefillAttentionArgs args{d_q.get(), d_k.get(), d_v.get(), d_tables.get(), d_qs.get(), d_ctx.get(), d_ts.get(),
                              d_tq.get(), d_out.get(), static_cast<int32_t>(tile_seq.size()), g.heads, g.kv_heads,
                              g.head_dim, g.block_size, cache.max_blocks_per_seq, q_stride, out_stride, scale,
                              nullptr, GetParam()};
    ASSERT_EQ(PrefillAttention(args), 0);
    const auto out = d_out.ToHost();
    const auto q_ref = tensor_core ? RoundedToBf16(q) : q;
    for (size_t s = 0; s < cases.size(); ++s) {
      for (int i = 0; i < cases[s].num_queries; ++i) {
        const int row = query_start[s] + i;
        for (int h = 0; h < g.heads; ++h) {
          std::vector<double> abs_weighted;
          const auto ref = cache.Attend(q_ref.data() + row * q_stride + h * g.head_dim, static_cast<int>(s), h,
                                        cases[s].context + i + 1, scale, &abs_weighted);
          // Each bf16 probability is within 2^-9 (relative) of its fp32 value, so P V moves by at
          // most 2^-9 * sum w |v| / sum w; twice that allows for the fp32 sums and exp2f.
          for (double& a : abs_weighted) a = std::ldexp(a, -8);
          SCOPED_TRACE("head_dim " + std::to_string(g.head_dim) + " group " + std::to_string(g.heads / g.kv_heads) +
                       " query " + std::to_string(i));
          ExpectClose(out, row * out_stride + h * g.head_dim, ref, "prefill", static_cast<int>(s), h,
                      tensor_core ? &abs_weighted : nullptr);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, CudaPrefillAttention,
                         ::testing::Values(PrefillImpl::kTensorCore, PrefillImpl::kSimt),
                         [](const auto& info) { return info.param == PrefillImpl::kTensorCore ? "TensorCore" : "Simt"; });

// The launchers refuse what they cannot run before touching the device (runs without a GPU).
TEST(CudaAttention, RefusesArgumentsWithoutLaunching) {
  alignas(16) static float q[64];
  alignas(16) static uint16_t cache[64], out[64];
  PrefillAttentionArgs prefill{q, cache, cache, nullptr, nullptr, nullptr, nullptr, nullptr, out, 1, 2, 1, 64, 16,
                               1, 64, 129, 0.125f, nullptr, PrefillImpl::kTensorCore};
  // An odd out_stride: the tensor-core kernel stores bf16 pairs as one 4-byte word.
  EXPECT_EQ(PrefillAttention(prefill), static_cast<int>(cudaErrorInvalidValue));
  prefill.out_stride = 128;
  prefill.impl = static_cast<PrefillImpl>(7);
  EXPECT_EQ(PrefillAttention(prefill), static_cast<int>(cudaErrorInvalidValue));
  prefill.impl = PrefillImpl::kTensorCore;
  prefill.head_dim = 128;
  EXPECT_EQ(PrefillAttention(prefill), static_cast<int>(cudaErrorInvalidValue));
  DecodeAttentionArgs decode{q, cache, cache, nullptr, nullptr, out, nullptr, 1, 2, 1, 64, 16, 1, 1, 64, 128,
                             0.125f, nullptr, static_cast<DecodeImpl>(7)};
  EXPECT_EQ(DecodeAttention(decode), static_cast<int>(cudaErrorInvalidValue));
}

TEST(CudaAttention, RejectsUncompiledHeadDim) {
  EXPECT_FALSE(AttentionSupported(128, 8, 8));
  EXPECT_FALSE(AttentionSupported(64, 18, 2));  // group 9 > kMaxAttentionGroup
  EXPECT_TRUE(AttentionSupported(64, 14, 2));
  EXPECT_GE(ChooseDecodeSplits(1, 2, 132, 512), 2);
  EXPECT_EQ(ChooseDecodeSplits(256, 2, 132, 512), 1);
  EXPECT_LE(ChooseDecodeSplits(1, 1, 132, 100000), kMaxDecodeSplits);
}

}  // namespace
}  // namespace ferry::kernels::cuda
