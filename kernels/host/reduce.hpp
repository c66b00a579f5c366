// Host reduction and copy kernels: one dispatch table for every (dtype, op), vectorized
// (AVX-512 / AVX2 chosen at run time, scalar fallback). fp16, bf16 and fp8 (e4m3, e5m2) are
// computed in float and rounded to nearest-even on store, as NCCL does on the device.
#pragma once

#include <cstddef>

#include "c4comm/types.hpp"

namespace c4::kernels {

/// Built-in element-wise ops a kernel implements. PreMulSum and Avg are composed from these by
/// the caller (scale, then kSum; or kSum, then divide).
enum class KOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };
/// The kernel op of a built-in RedOp (kSum, kProd, kMax, kMin share their values).
constexpr KOp toKOp(RedOp op) { return static_cast<KOp>(static_cast<int>(op)); }

/// dst[i] = a[i] op b[i] for i < count. dst may alias a or b exactly (not partially overlap); no
/// alignment needed. Thread-safe; no allocation. count == 0 is a no-op; an invalid dt/op logs a
/// warning and does nothing. Integer sum/prod wrap. Float max/min follow fmax/fmin on every ISA: a
/// NaN operand yields the other one (NaN only if both are); for equal operands (+0 vs -0) b wins.
void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, KOp op);

/// dst[i] = src[i] * scalar, where scalar is one element of type dt (read from `scalar`).
/// For integer types the product wraps as in C. dst may alias src.
void scale(void* dst, const void* src, const void* scalar, size_t count, DataType dt);

/// dst[i] = src[i] / divisor (integer division truncating toward zero for integer types; float
/// division for floating types). Used for ncclAvg on integers. dst may alias src. Signed types
/// wrap on MIN / -1; unsigned types take the divisor as uint64_t(int64_t(divisor)); an integer
/// divisor of 0 logs a warning and copies src unchanged.
void divide(void* dst, const void* src, size_t count, DataType dt, int divisor);

/// memcpy tuned for large copies (non-temporal stores above a threshold). dst and src must not
/// overlap.
void copy(void* dst, const void* src, size_t bytes);
/// copy() with non-temporal stores whatever the size (memcpy where the ISA has none), for one
/// block of a transfer too large for the caches. Fenced: a later flag store publishes the data.
void copyStreaming(void* dst, const void* src, size_t bytes);

/// Name of the instruction set the dispatch chose ("avx512", "avx2", "scalar"). The choice is made
/// once, at first use, from the CPU (__builtin_cpu_supports), capped by C4_KERNELS_ISA_MAX
/// (auto|avx512|avx2|scalar: the highest level the CPU is taken to have), and C4_KERNELS_ISA
/// (auto|avx512|avx2|scalar; a choice the CPU or the cap rules out falls back to the best allowed,
/// with a warning).
const char* isaName();

/// Null if `isa` ("scalar", "avx2", "avx512", "avx512novbmi") can run here, else why not: the CPU
/// lacks it, or C4_KERNELS_ISA_MAX caps it (a static string, for tests that cannot apply here).
const char* isaUnavailableReason(const char* isa);

/// Forces the instruction set for every later call ("scalar", "avx2", "avx512", "avx512novbmi" (the
/// AVX-512 kernels a CPU without AVX512-VBMI runs), or "auto" for the CPU's best). Returns false, changing nothing, if
/// this build or CPU cannot run it. For tests and benchmarks: not synchronized with calls running on other threads.
bool setIsaForTesting(const char* isa);

/// copy() switches to non-temporal stores at or above this many bytes (C4_COPY_NT_THRESHOLD; the
/// default is measured, see docs/kernels-performance.md). SIZE_MAX disables them.
size_t copyNonTemporalThreshold();
/// Overrides the threshold (tests, benchmarks). Not synchronized with concurrent copy() calls.
void setCopyNonTemporalThresholdForTesting(size_t bytes);

// Conversions used by the kernels and by tests' reference implementations. Scalar, exact, and
// bit-identical to the vector paths: fp16/fp8 NaNs decode to a quiet NaN of the same sign (bf16
// decodes by widening the bits, so a signaling NaN stays signaling until used); encoding
// rounds to nearest-even (subnormals included); fp16/bf16 overflow to inf and keep NaN payloads
// (quieted); fp8 saturates (inf too) to the largest finite value and encodes any NaN as 0x7f.
float halfToFloat(unsigned short h);
unsigned short floatToHalf(float f);
float bf16ToFloat(unsigned short b);
unsigned short floatToBf16(float f);
float fp8e4m3ToFloat(unsigned char v);
unsigned char floatToFp8e4m3(float f);  // saturating to +-448 like NCCL's __nv_cvt (satfinite)
float fp8e5m2ToFloat(unsigned char v);
unsigned char floatToFp8e5m2(float f);  // saturating to +-57344

}  // namespace c4::kernels
