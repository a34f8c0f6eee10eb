#include "worker/model/linear.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_int8.h"

namespace ferry::worker {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Row count whose primitive chooses the weight layout at load. oneDNN's brgemm matmul picks
// the same blocked layout for every m on the shapes measured (1..512); a primitive for another
// m that would want a different one is created with this layout forced instead.
constexpr int64_t kLayoutRows = 16;

// The bf16 matmul whose weight layout a [n, k] layer takes at load: bf16 activations of
// kLayoutRows rows, weights in the layout oneDNN picks, fp32 output. Throws dnnl::error where
// oneDNN has no bf16 matmul for this CPU.
dnnl::matmul::primitive_desc Bf16LayoutMatmul(int64_t n, int64_t k, const dnnl::engine& engine) {
  const dnnl::memory::desc src({kLayoutRows, k}, dt::bf16, tag::ab);
  const dnnl::memory::desc any({k, n}, dt::bf16, tag::any);
  const dnnl::memory::desc dst({kLayoutRows, n}, dt::f32, tag::ab);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, any, dst), engine);
}

}  // namespace

MatmulDtype ParseMatmulDtype(const std::string& dtype) {
  if (dtype == "float32") return MatmulDtype::kFloat32;
  if (dtype == "bfloat16") return MatmulDtype::kBfloat16;
  throw std::invalid_argument("unsupported CPU dtype " + dtype + " (float32 or bfloat16)");
}

Quantization ParseQuantization(const std::string& name) {
  if (name == "none" || name.empty()) return Quantization::kNone;
  if (name == "int8") return Quantization::kInt8;
  throw std::invalid_argument("unsupported quantization " + name + " (none or int8)");
}

const char* QuantizationName(Quantization q) { return q == Quantization::kInt8 ? "int8" : "none"; }

static bool OneDnnBf16MatmulAvailable() {
  // Asks oneDNN for the primitive the bf16 path builds: it has one from AVX-512 on, none on an
  // AVX2-only CPU (or under ONEDNN_MAX_CPU_ISA=AVX2).
  static const bool available = [] {
    try {
      Bf16LayoutMatmul(64, 64, dnnl::engine(dnnl::engine::kind::cpu, 0));
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

// Through oneDNN where it has a bf16 matmul, else through Ferry's own kernel (kernels/cpu/gemm.h):
// unavailable only when FERRY_CPU_MATMUL=onednn forces oneDNN on a CPU where it has none.
bool Bf16MatmulAvailable() {
  return ChooseMatmulBackend(MatmulDtype::kBfloat16) == MatmulBackend::kFerry || OneDnnBf16MatmulAvailable();
}

const char* MatmulBackendName(MatmulBackend backend) {
  return backend == MatmulBackend::kFerry ? "ferry" : "onednn";
}

std::string ResolveMatmulDtype(const std::string& dtype) {
  if (dtype != "auto") return dtype;
  return Bf16MatmulAvailable() ? "bfloat16" : "float32";
}

struct MatmulContext::Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

namespace {

// Rows per oneDNN call so that a row's result never depends on the other rows of its call
// (0: all rows in one call). Measured with linear_batch_invariance_test under each
// ONEDNN_MAX_CPU_ISA (worker/model/README.md): the AVX-512 (fp32) and AVX-512 BF16 (bf16)
// kernels reduce every row in one order whatever the row count; the AMX and VNNI bf16 kernels
// and the AVX2 fp32 ones do not, but with every call at exactly 16 rows (the last tile padded)
// they do. 16 rows is AMX's tile height: decode up to 16 sequences costs what it did untiled,
// prefill keeps most of AMX's speed (docs/benchmarks/cpu.md).
constexpr int64_t kInvariantRowTile = 16;

int64_t RowTileFor(MatmulDtype dtype) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto has = [isa](dnnl::cpu_isa want) {
    const auto bits = static_cast<unsigned>(want);
    return (isa & bits) == bits;
  };
  if (dtype == MatmulDtype::kFloat32) return has(dnnl::cpu_isa::avx512_core) ? 0 : kInvariantRowTile;
  if (has(dnnl::cpu_isa::avx512_core_amx)) return kInvariantRowTile;
  return has(dnnl::cpu_isa::avx512_core_bf16) ? 0 : kInvariantRowTile;
}

}  // namespace

MatmulBackend ChooseMatmulBackend(MatmulDtype dtype) {
  const char* forced = std::getenv("FERRY_CPU_MATMUL");
  if (forced != nullptr && *forced != '\0') {
    const std::string name = forced;
    if (name == "ferry") return MatmulBackend::kFerry;
    if (name == "onednn") return MatmulBackend::kOneDnn;
    throw std::invalid_argument("FERRY_CPU_MATMUL=" + name + " is not one of ferry, onednn");
  }
  // Ferry's kernel where oneDNN would pad every call to 16 fp32 rows (no AVX-512) or has no
  // bf16 matmul at all; oneDNN where it is batch-invariant by itself or has AMX.
  if (dtype == MatmulDtype::kFloat32) {
    return RowTileFor(dtype) == 0 ? MatmulBackend::kOneDnn : MatmulBackend::kFerry;
  }
  return OneDnnBf16MatmulAvailable() ? MatmulBackend::kOneDnn : MatmulBackend::kFerry;
}

MatmulContext::MatmulContext(MatmulDtype dtype)
    : dtype_(dtype),
      backend_(ChooseMatmulBackend(dtype)),
      dnnl_(std::make_unique<Dnnl>()),
      row_tile_(RowTileFor(dtype)) {}

MatmulContext::~MatmulContext() = default;

// The weights in oneDNN's layout and one primitive per call row count (CallRows), each created
// on first use (~0.3 ms) and kept: about 47 KB of JIT code each, so their number must be bounded.
struct Linear::Primitives {
  dnnl::memory::desc weights_md;
  dnnl::memory weights;
  dnnl::memory bias;  // empty when the layer has none
  std::unordered_map<int64_t, dnnl::matmul> by_rows;
};

Linear::Linear(MatmulContext* context, std::vector<float> weight, int64_t n, int64_t k,
               std::vector<float> bias, bool accumulate, Quantization quantization)
    : context_(context), n_(n), k_(k), accumulate_(accumulate), quantization_(quantization),
      bias_(std::move(bias)) {
  if (static_cast<int64_t>(weight.size()) != n * k) {
    throw std::invalid_argument("Linear: weight has " + std::to_string(weight.size()) +
                                " values, expected " + std::to_string(n * k));
  }
  if (quantization == Quantization::kInt8) {
    std::vector<int8_t> q(n * kernels::cpu::Int8PaddedK(k));
    std::vector<float> scale(n);
    kernels::cpu::QuantizeRowsInt8(weight.data(), n, k, q.data(), scale.data());
    std::vector<float>().swap(weight);
    SetInt8(q, std::move(scale));
    return;
  }
  if (context->backend() == MatmulBackend::kFerry) {
    // fp32 kept in place ([n, k] is the kernel's layout); bf16 converted and packed once.
    if (context->dtype() == MatmulDtype::kFloat32) {
      weight_f32_ = std::move(weight);
    } else {
      weight_bf16_.resize(kernels::cpu::PackedBf16Size(n, k));
      kernels::cpu::PackBf16(weight.data(), n, k, weight_bf16_.data());
    }
    return;
  }
  MatmulContext::Dnnl& d = *context->dnnl_;
  prims_ = std::make_unique<Primitives>();
  if (!bias_.empty()) {
    prims_->bias = dnnl::memory({{1, n}, dt::f32, tag::ab}, d.engine);
    std::memcpy(prims_->bias.get_data_handle(), bias_.data(), n * sizeof(float));
  }
  if (context->dtype() == MatmulDtype::kFloat32) {
    // The exact path keeps the plain [n, k] weights (oneDNN's {k, n} in tag ba) in place: no
    // second copy, and fp32_weight() can serve them (a tied embedding).
    weight_f32_ = std::move(weight);
    prims_->weights_md = dnnl::memory::desc({k, n}, dt::f32, tag::ba);
    prims_->weights = dnnl::memory(prims_->weights_md, d.engine, weight_f32_.data());
    return;
  }
  // [n, k] row-major is oneDNN's {k, n} weights in tag ba.
  std::vector<uint16_t> plain(weight.size());
  kernels::cpu::ConvertToBf16(weight.data(), plain.data(), n * k);
  std::vector<float>().swap(weight);
  dnnl::memory plain_mem({{k, n}, dt::bf16, tag::ba}, d.engine, plain.data());
  dnnl::matmul::primitive_desc pd;
  try {
    pd = Bf16LayoutMatmul(n, k, d.engine);
  } catch (const dnnl::error& e) {
    // oneDNN 2.6 has bf16 matmul only from AVX-512 on (ONEDNN_MAX_CPU_ISA=AVX2 reproduces this);
    // reached only when FERRY_CPU_MATMUL=onednn forces it where Ferry's kernel would run.
    throw std::runtime_error(std::string("bfloat16 matmul through oneDNN is not available on this CPU (oneDNN: ") +
                             e.what() + "; it needs AVX-512): unset FERRY_CPU_MATMUL=onednn, or run the worker "
                             "with --dtype float32");
  }
  prims_->weights_md = pd.weights_desc();
  prims_->weights = dnnl::memory(prims_->weights_md, d.engine);
  dnnl::reorder(plain_mem, prims_->weights).execute(d.stream, plain_mem, prims_->weights);
  d.stream.wait();
}

Linear::Linear(MatmulContext* context, Int8Weights weights, int64_t n, int64_t k, std::vector<float> bias,
               bool accumulate)
    : context_(context), n_(n), k_(k), accumulate_(accumulate), quantization_(Quantization::kInt8),
      bias_(std::move(bias)) {
  if (static_cast<int64_t>(weights.values.size()) != n * k || static_cast<int64_t>(weights.scale.size()) != n) {
    throw std::invalid_argument("Linear: int8 weights have " + std::to_string(weights.values.size()) + " values and " +
                                std::to_string(weights.scale.size()) + " scales, expected " + std::to_string(n * k) +
                                " and " + std::to_string(n));
  }
  const int64_t kp = kernels::cpu::Int8PaddedK(k);
  std::vector<int8_t> q(n * kp, 0);
  for (int64_t r = 0; r < n; ++r) {
    if (!std::isfinite(weights.scale[r]) || weights.scale[r] < 0.f) {
      throw std::invalid_argument("Linear: int8 weight scale of row " + std::to_string(r) + " is " +
                                  std::to_string(weights.scale[r]) + " (want finite, >= 0)");
    }
    for (int64_t c = 0; c < k; ++c) {
      const float v = weights.values[r * k + c];
      if (!(v >= -128.f && v <= 127.f) || v != std::nearbyint(v)) {
        throw std::invalid_argument("Linear: int8 weight [" + std::to_string(r) + ", " + std::to_string(c) + "] = " +
                                    std::to_string(v) + " is not an integer in [-128, 127]");
      }
      q[r * kp + c] = static_cast<int8_t>(v);
    }
  }
  SetInt8(q, std::move(weights.scale));
}

void Linear::SetInt8(const std::vector<int8_t>& q, std::vector<float> scale) {
  namespace kc = kernels::cpu;
  int8_scale_ = std::move(scale);
  int8_scale_.resize(kc::Int8PaddedN(n_), 0.f);
  weight_int8_.resize(kc::PackedInt8Size(n_, k_));
  int8_sums_.resize(kc::Int8PaddedN(n_));
  kc::PackInt8(q.data(), n_, k_, weight_int8_.data(), int8_sums_.data());
}

Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

int64_t Linear::weight_bytes() const {
  if (prims_ == nullptr) {
    return static_cast<int64_t>(weight_f32_.size() * sizeof(float) + weight_bf16_.size() * sizeof(uint16_t) +
                                weight_int8_.size() + int8_scale_.size() * sizeof(float) +
                                int8_sums_.size() * sizeof(int32_t));
  }
  return static_cast<int64_t>(prims_->weights_md.get_size());
}

namespace {

// Rows of the next oneDNN call over `rest` rows when a row's result does not depend on the row
// count (row_tile_ 0). One primitive per distinct count would grow without bound under serving
// (decode batch sizes and prefill chunks take any value up to --max-num-batched-tokens: a soak
// grew the worker by 0.4 MB/s), so calls take one of 30 counts: 1..16 exact, 17..64 padded up to
// a multiple of 4 (at most 3 rows computed for nothing), and more split into calls of 256, 128
// and 64 rows, largest first (one more call costs one more pass over the weights: on the 2-core
// dev VM about what 4 rows of compute cost). A result above `rest` means: pad to that many.
int64_t CallRows(int64_t rest) {
  if (rest >= 256) return 256;
  if (rest >= 128) return 128;
  if (rest > 64) return 64;
  if (rest <= 16) return rest;
  return (rest + 3) / 4 * 4;
}

}  // namespace

// On the oneDNN backend both dtypes go through oneDNN matmul, in calls of a bounded set of row
// counts (CallRows) or in fixed 16-row tiles (RowTileFor), so that a row's result does not depend
// on the number of rows (tested bitwise) and batching never changes it. OpenBLAS's sgemm did not
// have that property (it takes a gemv path for one row).
void Linear::Forward(const float* x, float* out, int64_t m) {
  if (m == 0) return;
  if (quantization_ == Quantization::kInt8) return RunInt8(x, out, m);
  if (context_->backend() == MatmulBackend::kFerry) return RunFerry(x, out, m);
  const int64_t tile = context_->row_tile_;
  for (int64_t i = 0; i < m;) {
    const int64_t rest = m - i;
    // Fixed-size tiles: every call runs the one primitive for `tile` rows, so a row's result
    // cannot depend on how many rows came with it. The last, partial tile is padded with zeros.
    const int64_t rows = tile != 0 ? tile : CallRows(rest);
    if (rows > rest) return RunPadded(x + i * k_, out + i * n_, rest, rows);
    Run(x + i * k_, out + i * n_, rows);
    i += rows;
  }
}

void Linear::RunPadded(const float* x, float* out, int64_t m, int64_t rows) {
  std::vector<float>& xp = context_->x_pad_;
  std::vector<float>& op = context_->out_pad_;
  if (static_cast<int64_t>(xp.size()) < rows * k_) xp.resize(rows * k_);
  if (static_cast<int64_t>(op.size()) < rows * n_) op.resize(rows * n_);
  std::memcpy(xp.data(), x, m * k_ * sizeof(float));
  // Only the padding rows; their results are computed and dropped: any finite values do.
  std::fill(xp.begin() + m * k_, xp.begin() + rows * k_, 0.f);
  if (accumulate_) std::memcpy(op.data(), out, m * n_ * sizeof(float));
  Run(xp.data(), op.data(), rows);
  std::memcpy(out, op.data(), m * n_ * sizeof(float));
}

int64_t Linear::num_primitives() const { return prims_ == nullptr ? 0 : static_cast<int64_t>(prims_->by_rows.size()); }

// Batch-invariant by construction: per-row quantization and exact int32 sums (gemm_int8.h).
void Linear::RunInt8(const float* x, float* out, int64_t m) {
  namespace kc = kernels::cpu;
  std::vector<int8_t>& qx = context_->x_int8_;
  std::vector<float>& sx = context_->x_scale_;
  if (static_cast<int64_t>(qx.size()) < m * kc::Int8PaddedK(k_)) qx.resize(m * kc::Int8PaddedK(k_));
  if (static_cast<int64_t>(sx.size()) < m) sx.resize(m);
  kc::QuantizeRowsInt8(x, m, k_, qx.data(), sx.data());
  kc::GemmInt8Args args;
  args.x = qx.data();
  args.x_scale = sx.data();
  args.weight = weight_int8_.data();
  args.w_scale = int8_scale_.data();
  args.w_sums = int8_sums_.data();
  args.bias = bias_.empty() ? nullptr : bias_.data();
  args.out = out;
  args.m = m;
  args.n = n_;
  args.k = k_;
  args.accumulate = accumulate_;
  kc::GemmInt8(args);
}

// Ferry's kernel is batch-invariant by construction (kernels/cpu/gemm.h): one call, no tiles.
void Linear::RunFerry(const float* x, float* out, int64_t m) {
  kernels::cpu::GemmArgs args;
  args.x = x;
  if (context_->dtype() == MatmulDtype::kBfloat16) {
    // As oneDNN's bf16 matmul: activations rounded to bf16, products and sums in fp32.
    std::vector<float>& rounded = context_->x_rounded_;
    if (static_cast<int64_t>(rounded.size()) < m * k_) rounded.resize(m * k_);
    kernels::cpu::RoundToBf16(x, rounded.data(), m * k_);
    args.x = rounded.data();
    args.weight = weight_bf16_.data();
    args.dtype = kernels::cpu::GemmWeight::kBfloat16Packed;
  } else {
    args.weight = weight_f32_.data();
    args.dtype = kernels::cpu::GemmWeight::kFloat32;
  }
  args.bias = bias_.empty() ? nullptr : bias_.data();
  args.out = out;
  args.m = m;
  args.n = n_;
  args.k = k_;
  args.accumulate = accumulate_;
  kernels::cpu::Gemm(args);
}

void Linear::Run(const float* x, float* out, int64_t m) {
  MatmulContext::Dnnl& d = *context_->dnnl_;
  const bool bf16 = context_->dtype() == MatmulDtype::kBfloat16;
  const dnnl::memory::desc src_md({m, k_}, bf16 ? dt::bf16 : dt::f32, tag::ab);
  const dnnl::memory::desc dst_md({m, n_}, dt::f32, tag::ab);
  auto it = prims_->by_rows.find(m);
  if (it == prims_->by_rows.end()) {
    dnnl::primitive_attr attr;
    if (accumulate_) {
      dnnl::post_ops ops;
      ops.append_sum(1.f);
      attr.set_post_ops(ops);
    }
    const dnnl::memory::desc bias_md =
        bias_.empty() ? dnnl::memory::desc() : dnnl::memory::desc({1, n_}, dt::f32, tag::ab);
    const dnnl::memory::desc any({k_, n_}, bf16 ? dt::bf16 : dt::f32, tag::any);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, bf16 ? any : prims_->weights_md, bias_md, dst_md),
                                    attr, d.engine);
    if (pd.weights_desc() != prims_->weights_md) {
      pd = dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(src_md, prims_->weights_md, bias_md, dst_md), attr, d.engine);
    }
    it = prims_->by_rows.emplace(m, dnnl::matmul(pd)).first;
  }
  void* src_data = const_cast<float*>(x);
  if (bf16) {
    std::vector<uint16_t>& x_bf16 = context_->x_bf16_;
    if (static_cast<int64_t>(x_bf16.size()) < m * k_) x_bf16.resize(m * k_);
    kernels::cpu::ConvertToBf16(x, x_bf16.data(), m * k_);
    src_data = x_bf16.data();
  }
  dnnl::memory src(src_md, d.engine, src_data);
  dnnl::memory dst(dst_md, d.engine, out);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, prims_->weights}, {DNNL_ARG_DST, dst}};
  if (!bias_.empty()) args.emplace(DNNL_ARG_BIAS, prims_->bias);
  it->second.execute(d.stream, args);
  d.stream.wait();
}

}  // namespace ferry::worker
