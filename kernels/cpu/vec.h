// 16-lane fp32 vectors for the ISA-specialised kernels (impl_*.cc), written with GCC vector
// extensions so one source compiles to AVX-512 (one zmm) or AVX2 (two ymm) depending on the
// flags of the translation unit. Include only from impl_*.cc: everything here is internal
// linkage, so no AVX-512 copy of a function can be picked by the linker for AVX2 code.
#pragma once

#include <cstdint>
#include <cstring>

namespace ferry::kernels::cpu {
namespace {  // NOLINT: internal linkage on purpose (see above)

constexpr int kLanes = 16;

typedef float V16 __attribute__((vector_size(64)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef uint32_t U16x32 __attribute__((vector_size(64)));  // 16 lanes of uint32
typedef uint16_t U16x16 __attribute__((vector_size(32)));  // 16 lanes of uint16

inline V16 Splat(float x) { return V16{} + x; }

inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void Store(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }

// Widening bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits.
inline V16 LoadBf16(const uint16_t* p) {
  U16x16 h;
  std::memcpy(&h, p, sizeof(h));
  const U16x32 w = __builtin_convertvector(h, U16x32) << 16;
  V16 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

// Round to nearest even, NaN stays a quiet NaN (same as FloatToBf16 in worker/model).
inline void StoreBf16(uint16_t* p, V16 v) {
  U16x32 u;
  std::memcpy(&u, &v, sizeof(u));
  const U16x32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U16x32 quiet = (u >> 16) | 0x40u;
  const U16x32 bits = (v != v) ? quiet : rounded;
  const U16x16 h = __builtin_convertvector(bits, U16x16);
  std::memcpy(p, &h, sizeof(h));
}

inline float ReduceAdd(V16 v) {
  const V8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float ReduceMax(V16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) to ~2 ulp (Cephes expf): x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial in r,
// scaled by 2^n built in the exponent bits. Inputs are clamped to the normal range, so very
// negative x gives ~1e-38 rather than 0 (callers that need exact zeros mask them).
inline V16 Exp(V16 x) {
  const V16 hi = Splat(88.3762626647949f), lo = Splat(-87.3365447504019f);
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in the default mode.
  const V16 magic = Splat(12582912.f);
  const V16 n = (x * 1.44269504088896341f + magic) - magic;
  V16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V16 p = Splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.f;
  const I16 e = (__builtin_convertvector(n, I16) + 127) << 23;
  V16 scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

inline int64_t RoundUpLanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

}  // namespace
}  // namespace ferry::kernels::cpu
