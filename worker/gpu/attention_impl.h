// Which attention kernels the GPU engine runs (kernels/cuda/paged_attention.h), chosen at start
// by the environment variable FERRY_ATTENTION_IMPL, so the first device run can time the new
// kernels against the first ones (ferry-gpu-bench --attention new,old) and keep the faster.
//
//   unset, "" or "new"   prefill=tensor_core, decode=prefetch (the default)
//   "old"                prefill=simt, decode=baseline
//   a comma list of prefill=tensor_core|simt and decode=prefetch|baseline; a part left out keeps
//   its default, e.g. "prefill=simt" or "decode=baseline,prefill=tensor_core"
// Anything else is refused at start, naming the variable, the value and the allowed values.
#pragma once

#include <string>
#include <string_view>

#include "kernels/cuda/paged_attention.h"

namespace ferry::worker::gpu {

inline constexpr const char* kAttentionImplEnv = "FERRY_ATTENTION_IMPL";

struct AttentionImpls {
  kernels::cuda::PrefillImpl prefill = kernels::cuda::PrefillImpl::kTensorCore;
  kernels::cuda::DecodeImpl decode = kernels::cuda::DecodeImpl::kPrefetch;
  bool operator==(const AttentionImpls&) const = default;
};

// Throws std::invalid_argument naming FERRY_ATTENTION_IMPL, the value and the allowed values.
AttentionImpls ParseAttentionImpls(std::string_view value);
// ParseAttentionImpls of the environment variable (defaults when unset).
AttentionImpls AttentionImplsFromEnv();
// "prefill=tensor_core,decode=prefetch": parses back to the same choice.
std::string ToString(const AttentionImpls& impls);

}  // namespace ferry::worker::gpu
