// FERRY_ATTENTION_IMPL parsing (host only: runs without a GPU).
#include "worker/gpu/attention_impl.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ferry::worker::gpu {
namespace {

using kernels::cuda::DecodeImpl;
using kernels::cuda::PrefillImpl;

TEST(AttentionImpl, DefaultsAreTheNewKernels) {
  const AttentionImpls want{PrefillImpl::kTensorCore, DecodeImpl::kPrefetch};
  EXPECT_EQ(ParseAttentionImpls(""), want);
  EXPECT_EQ(ParseAttentionImpls("new"), want);
  EXPECT_EQ(AttentionImpls{}, want);
}

TEST(AttentionImpl, OldAndPerKernelChoices) {
  EXPECT_EQ(ParseAttentionImpls("old"), (AttentionImpls{PrefillImpl::kSimt, DecodeImpl::kBaseline}));
  EXPECT_EQ(ParseAttentionImpls("prefill=simt"), (AttentionImpls{PrefillImpl::kSimt, DecodeImpl::kPrefetch}));
  EXPECT_EQ(ParseAttentionImpls("decode=baseline"),
            (AttentionImpls{PrefillImpl::kTensorCore, DecodeImpl::kBaseline}));
  EXPECT_EQ(ParseAttentionImpls("decode=baseline,prefill=tensor_core"),
            (AttentionImpls{PrefillImpl::kTensorCore, DecodeImpl::kBaseline}));
  EXPECT_EQ(ParseAttentionImpls("prefill=simt,decode=prefetch"),
            (AttentionImpls{PrefillImpl::kSimt, DecodeImpl::kPrefetch}));
}

TEST(AttentionImpl, ToStringParsesBack) {
  for (PrefillImpl p : {PrefillImpl::kTensorCore, PrefillImpl::kSimt}) {
    for (DecodeImpl d : {DecodeImpl::kPrefetch, DecodeImpl::kBaseline}) {
      const AttentionImpls impls{p, d};
      EXPECT_EQ(ParseAttentionImpls(ToString(impls)), impls) << ToString(impls);
    }
  }
  EXPECT_EQ(ToString({}), "prefill=tensor_core,decode=prefetch");
}

// The message names the variable, the value and the allowed values.
void ExpectRefused(const std::string& value, const std::string& why) {
  try {
    ParseAttentionImpls(value);
    ADD_FAILURE() << "accepted '" << value << "'";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("FERRY_ATTENTION_IMPL='" + value + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
    EXPECT_NE(msg.find("prefill=tensor_core|simt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decode=prefetch|baseline"), std::string::npos) << msg;
  }
}

TEST(AttentionImpl, RefusesUnknownValues) {
  ExpectRefused("tensorcore", "unknown part 'tensorcore'");
  ExpectRefused("NEW", "unknown part 'NEW'");
  ExpectRefused("prefill=wmma", "unknown part 'prefill=wmma'");
  ExpectRefused("prefill=simt,", "unknown part ''");
  ExpectRefused("prefill=simt, decode=baseline", "unknown part ' decode=baseline'");
  ExpectRefused("new,old", "unknown part 'new'");
  ExpectRefused("prefill=simt,prefill=tensor_core", "prefill given twice");
  ExpectRefused("decode=prefetch,decode=baseline", "decode given twice");
}

TEST(AttentionImpl, ReadsTheEnvironment) {
  ASSERT_EQ(setenv(kAttentionImplEnv, "old", 1), 0);
  EXPECT_EQ(AttentionImplsFromEnv(), (AttentionImpls{PrefillImpl::kSimt, DecodeImpl::kBaseline}));
  ASSERT_EQ(setenv(kAttentionImplEnv, "bogus", 1), 0);
  EXPECT_THROW(AttentionImplsFromEnv(), std::invalid_argument);
  ASSERT_EQ(unsetenv(kAttentionImplEnv), 0);
  EXPECT_EQ(AttentionImplsFromEnv(), AttentionImpls{});
}

}  // namespace
}  // namespace ferry::worker::gpu
