// Scalar conversions between float and the narrow float formats (fp16, bf16, fp8 e4m3/e5m2).
// Private to kernels/host. The vector paths (reduce_simd.inc) implement the same algorithms with
// vector operations; tests check the two bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace c4::kernels::detail {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

/// Rounds a non-negative float (bits `abs`, not NaN) to the nearest-even value of a format with
/// kBias and kMan mantissa bits; returns the format's code without sign and without clamping (a
/// result past the largest finite code means overflow).
template <int kBias, int kMan>
inline uint32_t roundMagnitude(uint32_t abs) {
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 - kBias + 1) << 23;  // 2^(1-bias)
  if (abs < kMinNormal) {
    // Adding 2^(24-bias-man) makes the float's ulp equal the format's subnormal step, so the FPU's
    // own round-to-nearest-even does the rounding; the low bits are then the subnormal code (a
    // carry into 2^man is the smallest normal, which is also the right code).
    constexpr uint32_t kMagic = static_cast<uint32_t>(127 + 24 - kBias - kMan) << 23;
    return floatBits(bitsFloat(abs) + bitsFloat(kMagic)) - kMagic;
  }
  constexpr int kShift = 23 - kMan;
  const uint32_t r = (abs + ((1u << (kShift - 1)) - 1) + ((abs >> kShift) & 1)) >> kShift;
  return r - (static_cast<uint32_t>(127 - kBias) << kMan);
}

inline float halfToFloatImpl(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return bitsFloat(sign | 0x7f800000 | (man << 13) | (man != 0 ? 0x400000 : 0));
  if (exp == 0) return bitsFloat(sign | floatBits(static_cast<float>(man) * 0x1p-24f));
  return bitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t floatToHalfImpl(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t sign = (b >> 16) & 0x8000;
  const uint32_t abs = b & 0x7fffffff;
  // NaN: quiet it and keep the top of the payload, as F16C's vcvtps2ph does.
  if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00 | ((abs >> 13) & 0x3ff));
  uint32_t r = roundMagnitude<15, 10>(abs);
  if (r > 0x7c00) r = 0x7c00;  // overflow is inf for IEEE half
  return static_cast<uint16_t>(sign | r);
}

inline float bf16ToFloatImpl(uint16_t v) { return bitsFloat(static_cast<uint32_t>(v) << 16); }

inline uint16_t floatToBf16Impl(float f) {
  const uint32_t b = floatBits(f);
  if ((b & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

inline float fp8e4m3ToFloatImpl(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80) << 24;
  const uint32_t em = v & 0x7f;
  if (em == 0x7f) return bitsFloat(sign | 0x7fc00000);  // e4m3 has no inf; S.1111.111 is NaN
  const uint32_t exp = em >> 3;
  const uint32_t man = em & 7;
  if (exp == 0) return bitsFloat(sign | floatBits(static_cast<float>(man) * 0x1p-9f));
  return bitsFloat(sign | ((exp + 120) << 23) | (man << 20));
}

inline uint8_t floatToFp8e4m3Impl(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t abs = b & 0x7fffffff;
  if (abs > 0x7f800000) return 0x7f;
  uint32_t r = roundMagnitude<7, 3>(abs);
  if (r > 0x7e) r = 0x7e;  // satfinite: +-448
  return static_cast<uint8_t>(((b >> 24) & 0x80) | r);
}

inline float fp8e5m2ToFloatImpl(uint8_t v) { return halfToFloatImpl(static_cast<uint16_t>(v << 8)); }

inline uint8_t floatToFp8e5m2Impl(float f) {
  const uint32_t b = floatBits(f);
  const uint32_t abs = b & 0x7fffffff;
  if (abs > 0x7f800000) return 0x7f;
  uint32_t r = roundMagnitude<15, 2>(abs);
  if (r > 0x7b) r = 0x7b;  // satfinite: +-57344 (inf included)
  return static_cast<uint8_t>(((b >> 24) & 0x80) | r);
}

}  // namespace c4::kernels::detail
