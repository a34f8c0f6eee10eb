// Checkpoints already quantized to int8 by llm-compressor / compressed-tensors, as vLLM loads
// them: config.json's quantization_config with quant_method "compressed-tensors", format
// "int-quantized" (or "naive-quantized"), one scheme for the Linear layers:
//   weights           int, 8 bits, symmetric, strategy "channel", static
//   input_activations int, 8 bits, symmetric, strategy "token", dynamic
// Each quantized layer stores "<module>.weight" as I8 [out, in] and "<module>.weight_scale" as
// [out, 1] floats (w ~ weight * weight_scale); modules named in "ignore" (exact names, or "re:"
// regular expressions matched against the whole name) keep float weights. That is W8A8 as
// kernels/cpu/gemm_int8.h computes it: the checkpoint's int8 values and scales are used as they
// are, the activations quantized per token at run time.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ferry::worker {

struct Int8CheckpointScheme {
  std::vector<std::string> ignore;
  // module: a Linear's name, "model.layers.3.mlp.down_proj" or "lm_head".
  bool Quantized(const std::string& module) const;
};

// The scheme of <dir>/config.json; nullopt when it has no quantization_config. Throws
// std::runtime_error naming the field, its value and what Ferry runs when the checkpoint is
// quantized some other way.
std::optional<Int8CheckpointScheme> LoadInt8CheckpointScheme(const std::string& dir);

}  // namespace ferry::worker
