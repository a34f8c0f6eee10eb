// ferry.v1.SpeculativeMethod <-> ferry::SpeculativeMethod (common/speculative.h), for the adapters.
#pragma once

#include "common/speculative.h"
#include "ferry/v1/sampling.pb.h"

namespace ferry {

static_assert(static_cast<int>(SpeculativeMethod::kDefault) == ferry::v1::SPECULATIVE_METHOD_DEFAULT);
static_assert(static_cast<int>(SpeculativeMethod::kNone) == ferry::v1::SPECULATIVE_METHOD_NONE);
static_assert(static_cast<int>(SpeculativeMethod::kNgram) == ferry::v1::SPECULATIVE_METHOD_NGRAM);
static_assert(static_cast<int>(SpeculativeMethod::kDraftModel) == ferry::v1::SPECULATIVE_METHOD_DRAFT_MODEL);
static_assert(ferry::v1::SpeculativeMethod_MAX == ferry::v1::SPECULATIVE_METHOD_DRAFT_MODEL,
              "a ferry.v1.SpeculativeMethod value without a ferry::SpeculativeMethod");

inline ferry::v1::SpeculativeMethod ToProto(SpeculativeMethod method) {
  return static_cast<ferry::v1::SpeculativeMethod>(method);
}
// A value outside the enum (a newer client's, or a corrupt message) is nullopt: refused by the caller.
inline std::optional<SpeculativeMethod> FromProto(int method) {
  if (!ferry::v1::SpeculativeMethod_IsValid(method)) return std::nullopt;
  return static_cast<SpeculativeMethod>(method);
}

}  // namespace ferry
