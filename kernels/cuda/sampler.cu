#include "kernels/cuda/sampler.h"

#include <cuda_runtime.h>

#include "kernels/cuda/counter_uniform.h"
#include "kernels/cuda/device_common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kBins = 256;  // 8 bits of the key per radix pass
constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------------------------------------
// Device helpers

// Order-preserving bits: a larger float has a larger key; -0 and +0 are one key, since the CPU
// compares them as equal (and then orders by id).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  if (f == 0.f) f = 0.f;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float KeyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k);
}

// exp(x - max) in units of 2^-40: integer sums are exact, so a row's masses do not depend on
// the order in which threads add them. Float exp, as the CPU sampler's Weight.
__device__ __forceinline__ uint64_t FixedWeight(float x, float max_x) {
  return static_cast<uint64_t>(static_cast<double>(expf(x - max_x)) * 0x1.0p40);
}

struct Best {
  float value;
  int32_t id;
};

// Larger value wins; the lower id among equal values (the CPU's Argmax).
__device__ __forceinline__ Best Better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.id < a.id)) ? b : a;
}

struct Shared {
  uint32_t count[kBins];
  unsigned long long mass[kBins];
  unsigned long long u64[kWarps];
  double f64[kWarps];
  Best best[kWarps];
  uint32_t warp_count[kWarps];
  uint32_t sel_bin;
  unsigned long long sel_before;
  int32_t sel_id;
  int32_t num_top;
  float top_value[kSamplerMaxTopLogprobs];
  int32_t top_id[kSamplerMaxTopLogprobs];
};

__device__ __forceinline__ int Lane() { return threadIdx.x % kWarpSize; }
__device__ __forceinline__ int WarpId() { return threadIdx.x / kWarpSize; }

// Block-wide reductions; every thread gets the result. The fixed butterfly and the fixed
// order over warps make the float ones deterministic too.
__device__ uint64_t BlockSumU64(uint64_t v, Shared& s) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  if (Lane() == 0) s.u64[WarpId()] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.u64[w];
  __syncthreads();
  return total;
}

__device__ double BlockSumF64(double v, Shared& s) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  if (Lane() == 0) s.f64[WarpId()] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.f64[w];
  __syncthreads();
  return total;
}

__device__ Best BlockBest(Best b, Shared& s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    b = Better(b, Best{__shfl_xor_sync(kFull, b.value, offset), __shfl_xor_sync(kFull, b.id, offset)});
  }
  if (Lane() == 0) s.best[WarpId()] = b;
  __syncthreads();
  Best total = s.best[0];
  for (int w = 1; w < kWarps; ++w) total = Better(total, s.best[w]);
  __syncthreads();
  return total;
}

__device__ float BlockMax(float v, Shared& s) {
  return BlockBest(Best{v, 0}, s).value;
}

// ---------------------------------------------------------------------------------------------
// The row as the sampler sees it

// The (biased, penalised) row under the mask: a rejected id reads as -inf, which is what the
// CPU writes before its penalties (and -inf stays -inf through them).
struct RowView {
  const float* src;      // [vocab] raw logits, or the scratch copy with bias and penalties
  const uint32_t* mask;  // [ceil(vocab / 32)]; null: every id allowed
  __device__ __forceinline__ float Effective(int i) const {
    if (mask != nullptr && ((mask[i >> 5] >> (i & 31)) & 1u) == 0) return -INFINITY;
    return src[i];
  }
};

// Values the selections order: the scaled candidates or the raw logits.
struct ScaledValues {
  RowView row;
  float inv_temperature;
  __device__ __forceinline__ float operator()(int i) const { return row.Effective(i) * inv_temperature; }
};

struct RawValues {
  const float* raw;  // [vocab]
  __device__ __forceinline__ float operator()(int i) const { return raw[i]; }
};

// A prefix of the order (value descending, id ascending) ending at (key, id), intersected with
// the min-p floor (itself a prefix).
struct KeptSet {
  bool bounded = false;
  uint32_t key = 0;
  int32_t id = 0;
  double min_p_log = -INFINITY;
  float max_value = 0.f;
  __device__ __forceinline__ bool Contains(float x, int i) const {
    const uint32_t k = OrderKey(x);
    if (bounded && (k < key || (k == key && i > id))) return false;
    return static_cast<double>(x) - static_cast<double>(max_value) >= min_p_log;
  }
};

// The prefix that ends first in the order.
__device__ __forceinline__ KeptSet Shorter(KeptSet a, uint32_t key, int32_t id) {
  if (!a.bounded || key > a.key || (key == a.key && id < a.id)) {
    a.bounded = true;
    a.key = key;
    a.id = id;
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Selection without a sort

// Radix selection, most significant byte first, in descending key order: the key T of the
// element where the running count (kByMass: fixed-point weight) first reaches `need`, and the
// count (mass) of the elements with a larger key. Needs 0 < need <= the row's total.
template <bool kByMass, typename Values>
__device__ void RadixSelect(const Values& values, int vocab, uint64_t need, float max_value, Shared& s,
                            uint32_t* key_out, uint64_t* before_out) {
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t before = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      s.count[b] = 0;
      s.mass[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = values(i);
      const uint32_t k = OrderKey(x);
      if ((k & prefix_mask) != prefix) continue;
      const uint32_t bin = (k >> shift) & 0xffu;
      if constexpr (kByMass) {
        const uint64_t w = FixedWeight(x, max_value);
        if (w != 0) atomicAdd(&s.mass[bin], static_cast<unsigned long long>(w));
      } else {
        atomicAdd(&s.count[bin], 1u);
      }
    }
    __syncthreads();
    if (WarpId() == 0) {
      // Lane l holds bins 255 - 8l ... 248 - 8l: a scan over lanes walks the bins downwards.
      const int lane = Lane();
      uint64_t local = 0;
      for (int j = 0; j < 8; ++j) {
        const int bin = kBins - 1 - 8 * lane - j;
        local += kByMass ? s.mass[bin] : s.count[bin];
      }
      uint64_t inclusive = local;
      for (int offset = 1; offset < kWarpSize; offset <<= 1) {
        const uint64_t t = __shfl_up_sync(kFull, inclusive, offset);
        if (lane >= offset) inclusive += t;
      }
      const uint64_t exclusive = inclusive - local;
      if (before + exclusive < need && before + inclusive >= need) {  // exactly one lane
        uint64_t acc = before + exclusive;
        for (int j = 0; j < 8; ++j) {
          const int bin = kBins - 1 - 8 * lane - j;
          const uint64_t v = kByMass ? s.mass[bin] : s.count[bin];
          if (acc + v >= need) {
            s.sel_bin = static_cast<uint32_t>(bin);
            s.sel_before = acc;
            break;
          }
          acc += v;
        }
      }
    }
    __syncthreads();
    prefix |= s.sel_bin << shift;
    prefix_mask |= 0xffu << shift;
    before = s.sel_before;
  }
  __syncthreads();
  *key_out = prefix;
  *before_out = before;
}

// The element of the row, in id order, whose interval [prefix, prefix + weight) holds the
// offset target(total weight). Each thread sums its own contiguous chunk of ids, one block scan
// orders the chunks, and the one thread whose chunk holds the offset walks it: one pass, exact
// (integer weights), so the same element whatever the thread layout. Needs target < total.
template <typename WeightFn, typename TargetFn>
__device__ int32_t FindInIdOrder(const WeightFn& weight, const TargetFn& target, int vocab, Shared& s) {
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, static_cast<int>(threadIdx.x) * chunk), end = min(vocab, begin + chunk);
  uint64_t mine = 0;
  for (int i = begin; i < end; ++i) mine += weight(i);
  uint64_t inclusive = mine;
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const uint64_t t = __shfl_up_sync(kFull, inclusive, offset);
    if (Lane() >= offset) inclusive += t;
  }
  if (Lane() == kWarpSize - 1) s.u64[WarpId()] = inclusive;
  __syncthreads();
  uint64_t low = inclusive - mine, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < WarpId()) low += s.u64[w];
    total += s.u64[w];
  }
  const uint64_t u = target(total);
  if (mine != 0 && low <= u && u < low + mine) {
    for (int i = begin; i < end; ++i) {
      low += weight(i);
      if (u < low) {
        s.sel_id = i;
        break;
      }
    }
  }
  __syncthreads();
  const int32_t id = s.sel_id;
  __syncthreads();
  return id;
}

// The id of the rank-th (1-based) element with this key, in id order: equal values are ordered
// by id, as the CPU's MoreLikely. Needs rank <= the number of such elements.
template <typename Values>
__device__ int32_t NthEqualId(const Values& values, int vocab, uint32_t key, uint64_t rank, Shared& s) {
  return FindInIdOrder([&](int i) -> uint64_t { return OrderKey(values(i)) == key ? 1 : 0; },
                       [rank](uint64_t) { return rank - 1; }, vocab, s);
}

// Fixed-point mass of the kept set.
__device__ uint64_t KeptMass(const ScaledValues& values, int vocab, const KeptSet& kept, Shared& s) {
  uint64_t mass = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = values(i);
    if (kept.Contains(x, i)) mass += FixedWeight(x, kept.max_value);
  }
  return BlockSumU64(mass, s);
}

// ---------------------------------------------------------------------------------------------
// One row

// Bias entries sorted by id: the first of each run adds the run in order (the CPU's sequence of
// += over logit_bias, then -inf for suppressed ids). Penalty entries have distinct ids.
__device__ void ApplyEntries(float* row, const SamplerRowParams& p, const uint32_t* arena) {
  const auto* bias = reinterpret_cast<const SamplerBias*>(arena + p.bias_offset);
  for (int j = threadIdx.x; j < p.num_bias; j += kThreads) {
    const int32_t id = bias[j].token_id;
    if (j > 0 && bias[j - 1].token_id == id) continue;
    float x = row[id];
    for (int k = j; k < p.num_bias && bias[k].token_id == id; ++k) x = __fadd_rn(x, bias[k].bias);
    row[id] = x;
  }
  __syncthreads();
  const auto* penalty = reinterpret_cast<const SamplerPenalty*>(arena + p.penalty_offset);
  const float r = p.repetition_penalty;
  for (int j = threadIdx.x; j < p.num_penalties; j += kThreads) {
    const SamplerPenalty e = penalty[j];
    float x = row[e.token_id];
    // The _rn intrinsics keep nvcc from contracting into an FMA the host code does not use.
    if (r != 1.f) x = x > 0.f ? __fdiv_rn(x, r) : __fmul_rn(x, r);
    if (e.num_generated > 0) {
      x = __fsub_rn(x, __fadd_rn(p.presence_penalty,
                                 __fmul_rn(p.frequency_penalty, static_cast<float>(e.num_generated))));
    }
    row[e.token_id] = x;
  }
  __syncthreads();
}

// top-k, then top-p over the top-k mass, then min-p, then the draw. max_value: the largest
// scaled value (finite).
__device__ int32_t DrawToken(const ScaledValues& values, int vocab, const SamplerRowParams& p, float max_value,
                             Shared& s) {
  KeptSet kept;
  kept.max_value = max_value;
  uint32_t key = 0;
  uint64_t before = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    const uint64_t k = static_cast<uint64_t>(p.top_k);
    RadixSelect<false>(values, vocab, k, max_value, s, &key, &before);
    kept = Shorter(kept, key, NthEqualId(values, vocab, key, k - before, s));
  }
  if (p.top_p < 1.f) {
    const uint64_t mass = KeptMass(values, vocab, kept, s);  // >= 2^40: the largest is kept
    // ceil: the CPU keeps the shortest prefix whose mass is >= top_p * mass.
    uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * static_cast<double>(mass)));
    if (target == 0) target = 1;        // a top_p so small that the product rounds to 0
    if (target > mass) target = mass;   // double rounding of a product near the mass
    RadixSelect<true>(values, vocab, target, max_value, s, &key, &before);
    const uint64_t w = FixedWeight(KeyValue(key), max_value);  // > 0: the bin reached the target
    kept = Shorter(kept, key, NthEqualId(values, vocab, key, (target - before + w - 1) / w, s));
  }
  kept.min_p_log = p.min_p_log;
  // The draw: u in [0, kept mass), the kept tokens laid out in id order. The mass is >= 2^40
  // (the most likely token is always kept).
  const double uniform = CounterUniform(p.seed, p.sample_index);
  return FindInIdOrder(
      [&](int i) -> uint64_t {
        const float x = values(i);
        return kept.Contains(x, i) ? FixedWeight(x, max_value) : 0;
      },
      [uniform](uint64_t total) {
        const uint64_t u = static_cast<uint64_t>(uniform * static_cast<double>(total));
        return u < total ? u : total - 1;  // the double product rounded up to the total
      },
      vocab, s);
}

// Log-softmax of the raw logits: the token's and the top n (n <= 20), most likely first.
__device__ void WriteLogprobs(const float* raw, int vocab, float raw_max, int n, SamplerResult* out, Shared& s) {
  double sum = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) sum += static_cast<double>(expf(raw[i] - raw_max));
  const double log_z = static_cast<double>(raw_max) + log(BlockSumF64(sum, s));
  if (threadIdx.x == 0) out->logprob = static_cast<float>(static_cast<double>(raw[out->token_id]) - log_z);
  if (n <= 0) return;
  const RawValues values{raw};
  uint32_t key = 0;
  uint64_t before = 0;
  RadixSelect<false>(values, vocab, static_cast<uint64_t>(n), 0.f, s, &key, &before);
  const int32_t last_id = NthEqualId(values, vocab, key, static_cast<uint64_t>(n) - before, s);
  if (threadIdx.x == 0) s.num_top = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint32_t k = OrderKey(raw[i]);
    if (k > key || (k == key && i <= last_id)) {
      const int slot = atomicAdd(&s.num_top, 1);  // exactly n elements pass
      s.top_value[slot] = raw[i];
      s.top_id[slot] = i;
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int a = 1; a < n; ++a) {  // insertion sort of <= 20: most likely first, ties by id
    const Best x{s.top_value[a], s.top_id[a]};
    int b = a;
    for (; b > 0 && Better(Best{s.top_value[b - 1], s.top_id[b - 1]}, x).id == x.id; --b) {
      s.top_value[b] = s.top_value[b - 1];
      s.top_id[b] = s.top_id[b - 1];
    }
    s.top_value[b] = x.value;
    s.top_id[b] = x.id;
  }
  for (int a = 0; a < n; ++a) {
    out->top_ids[a] = s.top_id[a];
    out->top_logprobs[a] = static_cast<float>(static_cast<double>(s.top_value[a]) - log_z);
  }
}

struct KernelParams {
  const float* __restrict__ logits;  // [*, vocab]
  const SamplerRowParams* __restrict__ params;
  const uint32_t* arena;
  float* scratch;  // [num_rows, vocab]
  SamplerResult* out;
  int vocab;
};

// One block per row.
__global__ void __launch_bounds__(kThreads) SampleKernel(KernelParams kp) {
  __shared__ Shared s;
  const int vocab = kp.vocab;
  const SamplerRowParams p = kp.params[blockIdx.x];
  const float* raw = kp.logits + static_cast<int64_t>(p.logits_row) * vocab;
  const float* src = raw;
  if (p.num_bias > 0 || p.num_penalties > 0) {
    float* row = kp.scratch + static_cast<int64_t>(blockIdx.x) * vocab;
    for (int i = threadIdx.x; i < vocab; i += kThreads) row[i] = raw[i];
    __syncthreads();
    ApplyEntries(row, p, kp.arena);
    src = row;
  }
  const ScaledValues values{RowView{src, p.mask_offset >= 0 ? kp.arena + p.mask_offset : nullptr},
                            p.is_greedy ? 1.f : p.inv_temperature};
  const bool logprobs = p.num_top_logprobs >= 0;
  Best best{-INFINITY, vocab};  // loses to any element, -inf included (by id)
  float raw_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    best = Better(best, Best{values(i), i});
    if (logprobs) raw_max = fmaxf(raw_max, raw[i]);
  }
  best = BlockBest(best, s);
  if (logprobs) raw_max = BlockMax(raw_max, s);
  int32_t token = 0;  // an all-NaN row, or nothing left to draw from: id 0, as the CPU's Argmax
  if (best.id < vocab && (p.is_greedy || best.value == -INFINITY)) {
    token = best.id;
  } else if (best.id < vocab) {
    token = DrawToken(values, vocab, p, best.value, s);
  }
  SamplerResult* out = kp.out + blockIdx.x;
  if (threadIdx.x == 0) {  // every field written: a result's bytes depend on the row alone
    out->token_id = token;
    out->logprob = 0.f;
    for (int j = 0; j < kSamplerMaxTopLogprobs; ++j) {
      out->top_ids[j] = -1;
      out->top_logprobs[j] = 0.f;
    }
  }
  if (logprobs) WriteLogprobs(raw, vocab, raw_max, p.num_top_logprobs, out, s);
}

}  // namespace

int Sample(const SampleArgs& args) {
  if (args.num_rows == 0) return 0;
  if (args.num_rows < 0 || args.logits == nullptr || args.params == nullptr || args.arena == nullptr ||
      args.scratch == nullptr || args.out == nullptr || args.vocab < 1 || args.vocab > kSamplerMaxVocab) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  SampleKernel<<<args.num_rows, kThreads, 0, static_cast<cudaStream_t>(args.stream)>>>(
      KernelParams{args.logits, args.params, args.arena, args.scratch, args.out, args.vocab});
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::kernels::cuda
