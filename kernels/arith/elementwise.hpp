// Element-wise arithmetic shared by the host kernels (kernels/host) and the CUDA kernels
// (kernels/cuda): the narrow-float codecs (fp16, bf16, fp8 e4m3/e5m2) and the four reduction ops,
// written once as __host__ __device__ functions. A GPU computes exactly what the host's scalar
// kernels compute, so device results are checked bit for bit against the host (tests/kernels), and
// the host's vector paths are checked bit for bit against these (reduce_simd.inc mirrors them).
//
// Semantics: integers wrap (sum, prod); floats follow IEEE round-to-nearest-even; max/min follow
// fmax/fmin (a NaN operand yields the other one; NaN only if both are; for equal operands, +0 vs -0,
// b wins); narrow floats are computed in float and rounded to nearest-even on store, as NCCL does
// on the device; fp16/bf16 overflow to inf and keep NaN payloads (quieted); fp8 saturates to its
// largest finite value (inf too) and encodes any NaN as 0x7f.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define C4_HD __host__ __device__ __forceinline__
#define C4_UNROLL _Pragma("unroll")
#else
#define C4_HD inline
#define C4_UNROLL
#endif

namespace c4::kernels::arith {

C4_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

C4_HD float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

/// Rounds a non-negative float (bits `abs`, not NaN) to the nearest-even value of a format with
/// kBias and kMan mantissa bits; returns the format's code without sign and without clamping (a
/// result past the largest finite code means overflow).
template <int kBias, int kMan>
C4_HD uint32_t roundMagnitude(uint32_t abs) {
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 - kBias + 1) << 23;  // 2^(1-bias)
  if (abs < kMinNormal) {
    // Adding 2^(24-bias-man) makes the float's ulp equal the format's subnormal step, so the FPU's
    // own round-to-nearest-even does the rounding; the low bits are then the subnormal code (a
    // carry into 2^man is the smallest normal, which is also the right code). Needs denormals kept
    // (no flush to zero): the default of g++ and of nvcc without --use_fast_math.
    constexpr uint32_t kMagic = static_cast<uint32_t>(127 + 24 - kBias - kMan) << 23;
    return floatBits(bitsFloat(abs) + bitsFloat(kMagic)) - kMagic;
  }
  constexpr int kShift = 23 - kMan;
  const uint32_t r = (abs + ((1u << (kShift - 1)) - 1) + ((abs >> kShift) & 1)) >> kShift;
  return r - (static_cast<uint32_t>(127 - kBias) << kMan);
}

C4_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return bitsFloat(sign | 0x7f800000 | (man << 13) | (man != 0 ? 0x400000 : 0));
  if (exp == 0) return bitsFloat(sign | floatBits(static_cast<float>(man) * 0x1p-24f));
  return bitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

C4_HD uint16_t floatToHalf(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t sign = (b >> 16) & 0x8000;
  const uint32_t abs = b & 0x7fffffff;
  // NaN: quiet it and keep the top of the payload, as F16C's vcvtps2ph does.
  if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00 | ((abs >> 13) & 0x3ff));
  uint32_t r = roundMagnitude<15, 10>(abs);
  if (r > 0x7c00) r = 0x7c00;  // overflow is inf for IEEE half
  return static_cast<uint16_t>(sign | r);
}

C4_HD float bf16ToFloat(uint16_t v) { return bitsFloat(static_cast<uint32_t>(v) << 16); }

C4_HD uint16_t floatToBf16(float f) {
  const uint32_t b = floatBits(f);
  if ((b & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

C4_HD float fp8e4m3ToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80) << 24;
  const uint32_t em = v & 0x7f;
  if (em == 0x7f) return bitsFloat(sign | 0x7fc00000);  // e4m3 has no inf; S.1111.111 is NaN
  const uint32_t exp = em >> 3;
  const uint32_t man = em & 7;
  if (exp == 0) return bitsFloat(sign | floatBits(static_cast<float>(man) * 0x1p-9f));
  return bitsFloat(sign | ((exp + 120) << 23) | (man << 20));
}

C4_HD uint8_t floatToFp8e4m3(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t abs = b & 0x7fffffff;
  if (abs > 0x7f800000) return 0x7f;
  uint32_t r = roundMagnitude<7, 3>(abs);
  if (r > 0x7e) r = 0x7e;  // satfinite: +-448
  return static_cast<uint8_t>(((b >> 24) & 0x80) | r);
}

C4_HD float fp8e5m2ToFloat(uint8_t v) { return halfToFloat(static_cast<uint16_t>(v << 8)); }

C4_HD uint8_t floatToFp8e5m2(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t abs = b & 0x7fffffff;
  if (abs > 0x7f800000) return 0x7f;
  uint32_t r = roundMagnitude<15, 2>(abs);
  if (r > 0x7b) r = 0x7b;  // satfinite: +-57344 (inf included)
  return static_cast<uint8_t>(((b >> 24) & 0x80) | r);
}

// ---- element families: Elem is the stored type, Value the type arithmetic is done in ----

template <class T>
struct Int {
  using Elem = T;
  using Value = T;
  using U = std::make_unsigned_t<T>;
  static C4_HD T decode(T v) { return v; }
  static C4_HD T encode(T v) { return v; }
  // Unsigned arithmetic wraps without UB; the conversion back is modular (GCC/Clang/nvcc, and C++20).
  static C4_HD T add(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
  static C4_HD T mul(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b))); }
  static C4_HD T max(T a, T b) { return a > b ? a : b; }
  static C4_HD T min(T a, T b) { return a < b ? a : b; }
};

template <class V>
struct FloatOps {
  static C4_HD V add(V a, V b) { return a + b; }
  static C4_HD V mul(V a, V b) { return a * b; }
  // fmax/fmin semantics (a NaN operand yields the other), written exactly as the vector code.
  static C4_HD V max(V a, V b) { return b != b ? a : (a > b ? a : b); }
  static C4_HD V min(V a, V b) { return b != b ? a : (a < b ? a : b); }
};

template <class T>
struct Float : FloatOps<T> {
  using Elem = T;
  using Value = T;
  static C4_HD T decode(T v) { return v; }
  static C4_HD T encode(T v) { return v; }
};

struct Half : FloatOps<float> {
  using Elem = uint16_t;
  using Value = float;
  static C4_HD float decode(uint16_t v) { return halfToFloat(v); }
  static C4_HD uint16_t encode(float v) { return floatToHalf(v); }
};

struct Bf16 : FloatOps<float> {
  using Elem = uint16_t;
  using Value = float;
  static C4_HD float decode(uint16_t v) { return bf16ToFloat(v); }
  static C4_HD uint16_t encode(float v) { return floatToBf16(v); }
};

struct E4m3 : FloatOps<float> {
  using Elem = uint8_t;
  using Value = float;
  static C4_HD float decode(uint8_t v) { return fp8e4m3ToFloat(v); }
  static C4_HD uint8_t encode(float v) { return floatToFp8e4m3(v); }
};

struct E5m2 : FloatOps<float> {
  using Elem = uint8_t;
  using Value = float;
  static C4_HD float decode(uint8_t v) { return fp8e5m2ToFloat(v); }
  static C4_HD uint8_t encode(float v) { return floatToFp8e5m2(v); }
};

/// The reduction ops, in KOp's order (kernels/host/reduce.hpp).
enum class Op : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

template <class F, Op kOp>
C4_HD typename F::Value combine(typename F::Value a, typename F::Value b) {
  if constexpr (kOp == Op::kSum) return F::add(a, b);
  if constexpr (kOp == Op::kProd) return F::mul(a, b);
  if constexpr (kOp == Op::kMax) return F::max(a, b);
  if constexpr (kOp == Op::kMin) return F::min(a, b);
}

/// One stored element: a op b, decoded, combined and encoded.
template <class F, Op kOp>
C4_HD typename F::Elem reduceElem(typename F::Elem a, typename F::Elem b) {
  return F::encode(combine<F, kOp>(F::decode(a), F::decode(b)));
}

/// x * s (PreMulSum's scaling), s already decoded.
template <class F>
C4_HD typename F::Elem scaleElem(typename F::Elem x, typename F::Value s) {
  return F::encode(F::mul(F::decode(x), s));
}

/// Division of one element by a non-zero divisor (ncclAvg): floats divide in their Value type;
/// integers truncate toward zero; signed MIN / -1 wraps; unsigned types take the divisor as
/// uint64_t(int64_t(divisor)), as the host kernels do.
template <class F>
C4_HD typename F::Elem divideElem(typename F::Elem x, int divisor) {
  using E = typename F::Elem;
  using V = typename F::Value;
  if constexpr (std::is_floating_point_v<V>) {
    return F::encode(F::decode(x) / static_cast<V>(divisor));
  } else if constexpr (std::is_signed_v<E>) {
    return divisor == -1 ? static_cast<E>(uint64_t{0} - static_cast<uint64_t>(x))
                         : static_cast<E>(static_cast<int64_t>(x) / divisor);
  } else {
    return static_cast<E>(static_cast<uint64_t>(x) / static_cast<uint64_t>(static_cast<int64_t>(divisor)));
  }
}

}  // namespace c4::kernels::arith
