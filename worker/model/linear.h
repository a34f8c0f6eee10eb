// Dense layers y = x W^T (+ bias) (+ y) for the CPU engine, in one of two numeric modes:
//  - kFloat32: fp32 weights (plain layout, kept in place) and activations. Exact; the parity
//    tests with transformers use it.
//  - kBfloat16: weights converted to bf16 once at load; activations rounded to bf16 per call;
//    fp32 accumulation and output.
// Two backends (MatmulBackend): oneDNN (on the Ferry backend's CPUs it is either slow or
// absent), and Ferry's own AVX2 kernel (kernels/cpu/gemm.h). oneDNN primitives are created once
// per call row count, from a bounded set (linear.cc CallRows), bf16 weights reordered into the
// blocked layout it picks.
// A row's result never depends on the other rows of the call (batch invariance): Ferry's kernel
// has one fixed order per element; where oneDNN's kernels for this CPU would break that, every
// oneDNN call runs at a fixed 16 rows (MatmulContext::row_tile_; rule and measurements in
// linear.cc and worker/model/README.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry::worker {

enum class MatmulDtype { kFloat32, kBfloat16 };

// Weight quantization of a layer (vLLM's --quantization): kInt8 is W8A8, weights per output
// channel at load, activations per token at run time, int32 sums (kernels/cpu/gemm_int8.h). Such
// a layer ignores MatmulDtype; the layers left unquantized (the LM head when asked) follow it.
enum class Quantization { kNone, kInt8 };
// "none" | "int8" -> Quantization; throws std::invalid_argument naming the value otherwise.
Quantization ParseQuantization(const std::string& name);
const char* QuantizationName(Quantization q);

// "float32" | "bfloat16" -> MatmulDtype; throws std::invalid_argument otherwise.
MatmulDtype ParseMatmulDtype(const std::string& dtype);

// Whether the bf16 path runs: oneDNN's bf16 matmul from AVX-512 on, Ferry's kernel below that;
// false only where FERRY_CPU_MATMUL=onednn forces oneDNN on a CPU without its bf16 matmul.
bool Bf16MatmulAvailable();
// "auto" -> "bfloat16" where available, else "float32" (as vLLM's --dtype auto picks the
// fastest dtype the device runs); any other name is returned as it is.
std::string ResolveMatmulDtype(const std::string& dtype);

// Who computes the matmuls: oneDNN, or Ferry's batch-invariant AVX2 kernel (kernels/cpu/gemm.h)
// where oneDNN would pad every fp32 call to 16 rows (no AVX-512) or has no bf16 matmul.
enum class MatmulBackend { kOneDnn, kFerry };
const char* MatmulBackendName(MatmulBackend backend);
// $FERRY_CPU_MATMUL ("ferry" or "onednn") when set, else the rule above for this CPU. Throws
// std::invalid_argument on another value.
MatmulBackend ChooseMatmulBackend(MatmulDtype dtype);

// Shared by every Linear of one model: the oneDNN engine and stream, and a grow-only bf16
// scratch for the activations of the current call. Not thread-safe (one model, one caller).
class MatmulContext {
 public:
  explicit MatmulContext(MatmulDtype dtype);
  ~MatmulContext();
  MatmulDtype dtype() const { return dtype_; }
  MatmulBackend backend() const { return backend_; }

 private:
  friend class Linear;
  struct Dnnl;
  MatmulDtype dtype_;
  MatmulBackend backend_;
  std::unique_ptr<Dnnl> dnnl_;
  std::vector<uint16_t> x_bf16_;  // [m, k] of the call in progress
  int64_t row_tile_ = 0;          // 0: one call per Forward; else fixed tiles of this many rows
  std::vector<float> x_pad_;      // [rows, k]: a padded call (a partial last tile), zero-padded
  std::vector<float> out_pad_;    // [rows, n]; rows <= 64 (or row_tile_)
  std::vector<float> x_rounded_;  // [m, k]: bf16 activations of a Ferry-kernel call, as fp32
  std::vector<int8_t> x_int8_;    // [m, Int8PaddedK(k)]: an int8 layer's quantized activations
  std::vector<float> x_scale_;    // [m]: their per-token scales
};

// A layer's weights as an int8 checkpoint stores them (compressed_tensors.h): w ~ values * scale.
struct Int8Weights {
  std::vector<float> values;  // [n, k] integers in [-128, 127], as floats (exact)
  std::vector<float> scale;   // [n] per output channel, finite and >= 0
};

class Linear {
 public:
  // weight: [n, k] row-major (Hugging Face's [out_features, in_features]); bias: [n] or empty.
  // accumulate: Forward adds into out (the residual stream) instead of overwriting it.
  // quantization kInt8: the weights are quantized here and the fp32 ones released.
  Linear(MatmulContext* context, std::vector<float> weight, int64_t n, int64_t k,
         std::vector<float> bias, bool accumulate, Quantization quantization = Quantization::kNone);
  // An int8 layer with the checkpoint's own values and scales (no requantization). Throws
  // std::invalid_argument naming the row, column and value outside int8 or a bad scale.
  Linear(MatmulContext* context, Int8Weights weights, int64_t n, int64_t k, std::vector<float> bias,
         bool accumulate);
  ~Linear();
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  Quantization quantization() const { return quantization_; }
  // The fp32 weights, [n, k]; nullptr in bf16 and int8 modes (converted and released).
  // Both modes run through oneDNN; a row's result does not depend on how many rows share a call.
  const float* fp32_weight() const { return weight_f32_.empty() ? nullptr : weight_f32_.data(); }
  // Bytes the weights occupy.
  int64_t weight_bytes() const;

  // oneDNN primitives created so far (one per call row count; at most 30 per layer).
  int64_t num_primitives() const;

  // out = x W^T + bias, or out += x W^T when accumulating.
  void Forward(const float* x,  // [m, k]
               float* out,      // [m, n]
               int64_t m);

 private:
  struct Primitives;
  // Takes q ([n, Int8PaddedK(k)]) and scale ([n]) as the int8 weights.
  void SetInt8(const std::vector<int8_t>& q, std::vector<float> scale);
  // One call of the int8 kernel over m rows (activations quantized per row first).
  void RunInt8(const float* x,  // [m, k]
               float* out,      // [m, n]
               int64_t m);
  // One call of Ferry's kernel over m rows.
  void RunFerry(const float* x,  // [m, k]
                float* out,      // [m, n]
                int64_t m);
  // One oneDNN call over the first m rows of a zero-padded copy of `rows` >= m rows.
  void RunPadded(const float* x,  // [m, k]
                 float* out,      // [m, n]
                 int64_t m, int64_t rows);
  // One oneDNN call over m rows (its primitive is created on first use).
  void Run(const float* x,  // [m, k]
           float* out,      // [m, n]
           int64_t m);

  MatmulContext* context_;
  int64_t n_ = 0;
  int64_t k_ = 0;
  bool accumulate_ = false;
  Quantization quantization_ = Quantization::kNone;
  std::vector<int8_t> weight_int8_;    // PackInt8's layout; kInt8 only
  std::vector<float> int8_scale_;      // [Int8PaddedN(n)] per output channel; kInt8 only
  std::vector<int32_t> int8_sums_;     // [Int8PaddedN(n)] PackInt8's column sums; kInt8 only
  std::vector<float> weight_f32_;      // [n, k]; kFloat32 only
  std::vector<uint16_t> weight_bf16_;  // [n, k] as kernels::cpu::PackBf16 lays it out; Ferry + bf16 only
  std::vector<float> bias_;        // [n] or empty
  std::unique_ptr<Primitives> prims_;  // oneDNN backend: its weights + per-m primitives
};

}  // namespace ferry::worker
