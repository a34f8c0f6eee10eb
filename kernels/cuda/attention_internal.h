// Between the attention launchers' translation units only (not for callers): the tensor-core
// prefill kernel lives in its own file, PrefillAttention (prefill_attention.cu) checks the
// arguments once and dispatches on PrefillAttentionArgs::impl.
#pragma once

#include "kernels/cuda/paged_attention.h"

namespace ferry::kernels::cuda::internal {

// prefill_attention_tc.cu; arguments already checked by PrefillAttention.
int PrefillAttentionTensorCore(const PrefillAttentionArgs& args);

}  // namespace ferry::kernels::cuda::internal
