#include "worker/gpu/attention_impl.h"

#include <cstdlib>
#include <stdexcept>

namespace ferry::worker::gpu {
namespace {

using kernels::cuda::DecodeImpl;
using kernels::cuda::PrefillImpl;

constexpr const char* kAllowed =
    "allowed: new (the default), old, or a comma list of prefill=tensor_core|simt and decode=prefetch|baseline";

[[noreturn]] void Refuse(std::string_view value, const std::string& why) {
  throw std::invalid_argument(std::string(kAttentionImplEnv) + "='" + std::string(value) + "': " + why + "; " +
                              kAllowed);
}

}  // namespace

AttentionImpls ParseAttentionImpls(std::string_view value) {
  AttentionImpls impls;
  if (value.empty() || value == "new") return impls;
  if (value == "old") return {PrefillImpl::kSimt, DecodeImpl::kBaseline};
  bool seen_prefill = false, seen_decode = false;
  size_t begin = 0;
  while (begin <= value.size()) {
    const size_t comma = value.find(',', begin);
    const size_t end = comma == std::string_view::npos ? value.size() : comma;
    const std::string_view part = value.substr(begin, end - begin);
    if (part == "prefill=tensor_core" || part == "prefill=simt") {
      if (seen_prefill) Refuse(value, "prefill given twice");
      seen_prefill = true;
      impls.prefill = part == "prefill=simt" ? PrefillImpl::kSimt : PrefillImpl::kTensorCore;
    } else if (part == "decode=prefetch" || part == "decode=baseline") {
      if (seen_decode) Refuse(value, "decode given twice");
      seen_decode = true;
      impls.decode = part == "decode=baseline" ? DecodeImpl::kBaseline : DecodeImpl::kPrefetch;
    } else {
      Refuse(value, "unknown part '" + std::string(part) + "'");
    }
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return impls;
}

AttentionImpls AttentionImplsFromEnv() {
  const char* value = std::getenv(kAttentionImplEnv);
  return ParseAttentionImpls(value == nullptr ? std::string_view() : std::string_view(value));
}

std::string ToString(const AttentionImpls& impls) {
  return std::string(impls.prefill == PrefillImpl::kSimt ? "prefill=simt" : "prefill=tensor_core") +
         (impls.decode == DecodeImpl::kBaseline ? ",decode=baseline" : ",decode=prefetch");
}

}  // namespace ferry::worker::gpu
