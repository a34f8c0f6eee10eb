#include "worker/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "worker/engine/guided_decoding.h"

namespace ferry::worker {
namespace {

// Below this temperature sampling is treated as greedy (dividing would overflow).
using ferry::kMinTemperature;  // below it, greedy (common/sampling_limits.h)

// Top-p halves the range holding the nucleus boundary until it is this small, then sorts it.
constexpr size_t kNucleusSortSize = 256;

// Top-k up to this k selects with a bounded heap, above it with nth_element.
constexpr size_t kHeapTopK = 256;

// Most likely first; lowest id first among equals, so the order is total and deterministic.
// A function object rather than a function so the std algorithms inline it.
struct MoreLikely {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

bool InRange(float v, float lo, float hi) { return v >= lo && v <= hi; }  // false for NaN

// exp(logit - max) in float (about 1e-7 relative error, twice as fast as double over a 150k
// vocab); callers sum the weights in double.
inline double Weight(float logit, float max_logit) { return std::exp(logit - max_logit); }

// Keeps in `heap` the k most likely candidates pushed so far, least likely at the front.
template <typename C>
void PushBounded(const C& cand, size_t k, std::vector<C>* heap) {
  if (heap->size() < k) {
    heap->push_back(cand);
    std::push_heap(heap->begin(), heap->end(), MoreLikely{});
  } else if (MoreLikely{}(cand, heap->front())) {
    std::pop_heap(heap->begin(), heap->end(), MoreLikely{});
    heap->back() = cand;
    std::push_heap(heap->begin(), heap->end(), MoreLikely{});
  }
}

}  // namespace

int32_t Argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: the first maximum wins
  }
  return best;
}

std::string CheckSamplingOptions(const SamplingOptions& o) {
  auto out_of = [](const char* name, double v, const char* range) {
    return std::string(name) + " " + std::to_string(v) + " outside " + range;
  };
  if (!(o.temperature >= 0.f)) return out_of("temperature", o.temperature, "[0, inf)");
  if (!(o.top_p > 0.f && o.top_p <= 1.f)) return out_of("top_p", o.top_p, "(0, 1]");
  if (o.top_k < 0) return out_of("top_k", o.top_k, "[0, vocab]");
  if (!InRange(o.min_p, 0.f, 1.f)) return out_of("min_p", o.min_p, "[0, 1]");
  if (!InRange(o.presence_penalty, -2.f, 2.f)) {
    return out_of("presence_penalty", o.presence_penalty, "[-2, 2]");
  }
  if (!InRange(o.frequency_penalty, -2.f, 2.f)) {
    return out_of("frequency_penalty", o.frequency_penalty, "[-2, 2]");
  }
  if (!(o.repetition_penalty > 0.f)) {
    return out_of("repetition_penalty", o.repetition_penalty, "(0, inf)");
  }
  if (o.logprobs < -1 || o.logprobs > kMaxLogprobs) {
    return out_of("logprobs", o.logprobs, "[-1, 20]");
  }
  for (const auto& [id, bias] : o.logit_bias) {
    if (id < 0) return out_of("logit_bias token id", id, "[0, vocab)");
    if (!InRange(bias, -100.f, 100.f)) return out_of("logit_bias value", bias, "[-100, 100]");
  }
  if (o.min_tokens < 0) return out_of("min_tokens", o.min_tokens, "[0, inf)");
  for (int32_t id : o.min_tokens_suppressed_ids) {
    if (id < 0) return out_of("min_tokens_suppressed_ids entry", id, "[0, vocab)");
  }
  return {};
}

// A new field changes the size: decide in ArgmaxSuffices whether it rules out the argmax, then
// update the size here (x86-64, libstdc++).
static_assert(sizeof(SamplingOptions) == 248, "SamplingOptions changed: does ArgmaxSuffices need the new field?");

bool ArgmaxSuffices(const SamplingOptions& o) {
  // top_p, top_k, min_p and seed only shape a draw, which greedy never makes.
  return o.temperature < kMinTemperature && !HasPenalties(o) && o.logprobs < 0 && o.logit_bias.empty() &&
         (o.min_tokens == 0 || o.min_tokens_suppressed_ids.empty()) && o.guided.kind == GuidedSpec::Kind::kNone &&
         o.allowed_token_ids.empty();
}

bool HasPenalties(const SamplingOptions& o) {
  return o.presence_penalty != 0.f || o.frequency_penalty != 0.f || o.repetition_penalty != 1.f;
}

// ---------------------------------------------------------------------------------------------
// TokenCounts

TokenCounts::Entry& TokenCounts::Find(int32_t token_id) {
  auto [it, inserted] = index_.try_emplace(token_id, static_cast<int32_t>(entries_.size()));
  if (inserted) entries_.push_back({token_id, 0, false});
  return entries_[it->second];
}

void TokenCounts::Reset(const std::vector<int32_t>& token_ids, int32_t num_generated) {
  entries_.clear();
  index_.clear();
  const size_t num_prompt = token_ids.size() - static_cast<size_t>(num_generated);
  for (size_t i = 0; i < token_ids.size(); ++i) {
    Entry& e = Find(token_ids[i]);
    if (i < num_prompt) {
      e.in_prompt = true;
    } else {
      ++e.num_generated;
    }
  }
}

void TokenCounts::AddGenerated(int32_t token_id) { ++Find(token_id).num_generated; }

void ApplyPenalties(float* logits, const SamplingOptions& o, const TokenCounts& counts) {
  const float r = o.repetition_penalty;
  for (const TokenCounts::Entry& e : counts.entries()) {
    float& x = logits[e.token_id];
    // Every entry occurred in the prompt or the output, which is what repetition looks at.
    if (r != 1.f) x = x > 0.f ? x / r : x * r;
    if (e.num_generated > 0) {
      x -= o.presence_penalty + o.frequency_penalty * static_cast<float>(e.num_generated);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sampler

SampleResult Sampler::Sample(const float* logits, int32_t vocab, const SamplingOptions& options,
                             const TokenCounts* history, int32_t sample_index, const TokenMask* allowed) {
  SampleResult out;
  const float* x = logits;
  const bool suppress = sample_index < options.min_tokens && !options.min_tokens_suppressed_ids.empty();
  if (!options.logit_bias.empty() || suppress) {
    penalized_.assign(logits, logits + vocab);
    for (const auto& [id, bias] : options.logit_bias) {
      if (id < vocab) penalized_[static_cast<size_t>(id)] += bias;  // ids are checked against the vocab
    }
    if (suppress) {
      for (int32_t id : options.min_tokens_suppressed_ids) {
        if (id < vocab) penalized_[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
      }
    }
    x = penalized_.data();
  }
  if (allowed != nullptr) {
    if (x == logits) penalized_.assign(logits, logits + vocab);
    MaskDisallowed(logits, vocab, *allowed, /*biased=*/x != logits);
    x = penalized_.data();
  }
  if (history != nullptr && HasPenalties(options) && !history->entries().empty()) {
    if (x == logits) penalized_.assign(logits, logits + vocab);
    ApplyPenalties(penalized_.data(), options, *history);
    x = penalized_.data();
  }
  if (options.temperature < kMinTemperature) {
    out.token_id = Argmax(x, vocab);
  } else {
    const float inv_t = 1.f / options.temperature;
    candidates_.resize(vocab);
    for (int32_t i = 0; i < vocab; ++i) candidates_[i] = {x[i] * inv_t, i};
    out.token_id = Draw(vocab, options, sample_index);
  }
  if (options.logprobs >= 0) {
    FillLogprobs(logits, vocab, std::min({options.logprobs, kMaxLogprobs, vocab}), &out);
  }
  return out;
}

// candidates_[0, vocab) hold the scaled logits in id order.
int32_t Sampler::Draw(int32_t vocab, const SamplingOptions& o, int32_t sample_index) {
  Candidate* c = candidates_.data();
  float max_logit = c[0].logit;
  for (int32_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, c[i].logit);
  size_t keep = static_cast<size_t>(vocab);
  if (o.top_k > 0 && o.top_k < vocab) keep = SelectTopK(static_cast<size_t>(o.top_k), vocab);
  // Top-p's mass is over the top-k set, so it is taken before min-p shrinks that set.
  double target = -1;
  if (o.top_p < 1.f) {
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += Weight(c[i].logit, max_logit);
    target = o.top_p * total;
  }
  // p < min_p * max p <=> logit - max < log(min_p); the max token always survives. Both the
  // nucleus and the min-p set are most-likely prefixes, so applying min-p after top-p keeps
  // the shorter one: find the nucleus inside the min-p set, or keep all of that set.
  if (o.min_p > 0.f) {
    const double floor = std::log(double{o.min_p});
    auto above = [&](const Candidate& a) { return a.logit - double{max_logit} >= floor; };
    keep = static_cast<size_t>(std::partition(c, c + keep, above) - c);
  }
  if (target >= 0) keep = NucleusSize(keep, max_logit, target);

  weights_.resize(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    weights_[i] = Weight(c[i].logit, max_logit);
    total += weights_[i];
  }
  const double u = CounterUniform(o.seed, static_cast<uint64_t>(sample_index)) * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += weights_[i];
    if (u < acc) return c[i].id;
  }
  // u landed on the rounding slack at the top: the last candidate that can be drawn at all.
  for (size_t i = keep; i-- > 0;) {
    if (weights_[i] > 0) return c[i].id;
  }
  return c[0].id;
}

// Moves the k most likely of candidates_[0, vocab) to the front; returns k. A small k (the
// usual 20-50) is found with a bounded heap, which rejects most tokens with one comparison.
size_t Sampler::SelectTopK(size_t k, int32_t vocab) {
  Candidate* c = candidates_.data();
  if (k > kHeapTopK) {
    std::nth_element(c, c + k, c + vocab, MoreLikely{});
    return k;
  }
  top_.clear();
  for (int32_t i = 0; i < vocab; ++i) PushBounded(c[i], k, &top_);
  const Candidate kth = top_.front();  // the least likely of the top k
  std::partition(c, c + vocab, [&](const Candidate& a) { return !MoreLikely{}(kth, a); });
  return k;
}

// Reorders candidates_[0, end) so that [0, n) is the smallest most-likely prefix whose mass
// exp(logit - max_logit) reaches target, and returns n (end when the whole range falls short).
// Bisects by rank with nth_element, summing only the upper half each round, so a flat
// distribution costs O(end) expected rather than a full sort; only the last bracket is sorted.
size_t Sampler::NucleusSize(size_t end, float max_logit, double target) {
  Candidate* c = candidates_.data();
  auto mass_of = [&](size_t from, size_t to) {
    double m = 0;
    for (size_t i = from; i < to; ++i) m += Weight(c[i].logit, max_logit);
    return m;
  };
  // Invariant: [0, lo) are kept, more likely than [lo, hi), with mass `before` < target; the
  // boundary is in (lo, hi].
  size_t lo = 0, hi = end;
  double before = 0;
  // The first cut is at kNucleusSortSize: a peaked distribution's nucleus is usually inside.
  for (bool first = true; hi - lo > kNucleusSortSize; first = false) {
    const size_t mid = first ? kNucleusSortSize : lo + (hi - lo) / 2;
    std::nth_element(c + lo, c + mid, c + hi, MoreLikely{});
    const double upper = mass_of(lo, mid);
    if (before + upper >= target) {
      hi = mid;
    } else {
      before += upper;
      lo = mid;
    }
  }
  std::sort(c + lo, c + hi, MoreLikely{});
  for (size_t i = lo; i < hi; ++i) {
    before += Weight(c[i].logit, max_logit);
    if (before >= target) return i + 1;
  }
  return hi;  // rounding of the chunked sums fell short by an ulp: keep the bracket
}

// penalized_ holds the (biased) logits. A token the constraint rejects would make a text it
// rejects, so it is never sampled; -inf stays -inf through penalties and temperature. A word
// at a time: inside a JSON string nearly every token is allowed, elsewhere few are.
void Sampler::MaskDisallowed(const float* logits, int32_t vocab, const TokenMask& allowed, bool biased) {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  const std::vector<uint64_t>& words = allowed.words();
  for (size_t w = 0; w < words.size(); ++w) {
    const size_t base = w * 64;
    const size_t end = std::min(base + 64, static_cast<size_t>(vocab));
    uint64_t rejected = ~words[w];
    if (end - base < 64) rejected &= (uint64_t{1} << (end - base)) - 1;
    for (; rejected != 0; rejected &= rejected - 1) penalized_[base + static_cast<size_t>(std::countr_zero(rejected))] = kNever;
  }
  // Raw logits are finite: only a bias of -inf or min_tokens can have taken every allowed token.
  if (!biased) return;
  for (int32_t i = 0; i < vocab; ++i) {
    if (penalized_[static_cast<size_t>(i)] != kNever) return;
  }
  for (int32_t i = 0; i < vocab; ++i) {
    if (allowed.Test(i)) penalized_[static_cast<size_t>(i)] = logits[i];
  }
}

SampleResult Sampler::Score(const float* logits, int32_t vocab, int32_t token_id, int32_t num_top) {
  SampleResult out;
  out.token_id = token_id;
  FillLogprobs(logits, vocab, std::min({num_top, kMaxLogprobs, vocab}), &out);
  const float mine = logits[token_id];
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits, logits + vocab, [mine](float l) { return l > mine; }));
  return out;
}

// Log-softmax of the raw logits: the sampled token's, and the num_top most likely via a
// bounded heap (O(vocab log num_top), no vocab-sized buffer).
void Sampler::FillLogprobs(const float* logits, int32_t vocab, int32_t num_top,
                           SampleResult* out) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += Weight(logits[i], max_logit);
  const double log_z = max_logit + std::log(sum);
  out->logprob = static_cast<float>(logits[out->token_id] - log_z);
  top_.clear();
  if (num_top <= 0) return;
  for (int32_t i = 0; i < vocab; ++i) PushBounded(Candidate{logits[i], i}, size_t(num_top), &top_);
  std::sort_heap(top_.begin(), top_.end(), MoreLikely{});  // most likely first
  out->top_logprobs.reserve(top_.size());
  for (const Candidate& t : top_) {
    out->top_logprobs.emplace_back(t.id, static_cast<float>(t.logit - log_z));
  }
}

}  // namespace ferry::worker
