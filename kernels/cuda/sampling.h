// Token selection on the GPU. Reference: worker/engine/sampler (Argmax: the first maximum, i.e.
// the lowest id among equal logits).
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

struct ArgmaxArgs {
  const float* logits;  // [num_rows, vocab]
  int32_t* out;         // [num_rows]
  int32_t num_rows;
  int32_t vocab;
  void* stream;
};

// out[r] = the lowest index of the largest logit of row r.
int Argmax(const ArgmaxArgs& args);

}  // namespace ferry::kernels::cuda
