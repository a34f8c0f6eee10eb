// CudaModel's per-layer weights, shared by cuda_model.cc (forward) and cuda_weights.cc
// (loading). Not for other users.
#pragma once

#include "worker/gpu/cuda_model.h"

namespace ferry::worker::gpu {

// One decoder layer as this rank holds it (ShardPlan), bf16 weights [out, in] row-major.
struct CudaModel::Layer {
  DeviceBuffer input_norm;  // [hidden] fp32
  DeviceBuffer post_norm;   // [hidden] fp32
  DeviceBuffer qkv;         // [(q_heads + 2 * kv_heads) * d, hidden]: this rank's q, k, v rows
  DeviceBuffer qkv_bias;    // [(q_heads + 2 * kv_heads) * d] fp32; empty without ModelConfig::qkv_bias
  DeviceBuffer q_norm;      // [d] fp32; empty without ModelConfig::qk_norm
  DeviceBuffer k_norm;      // [d] fp32
  DeviceBuffer o_proj;      // [hidden, q_heads * d]
  DeviceBuffer gate_up;     // [2 * inter, hidden]: gate rows, then up rows
  DeviceBuffer down;        // [hidden, inter]
};

}  // namespace ferry::worker::gpu
