// Host kernels against a scalar reference written here: every dtype x op x instruction set, odd
// counts and byte offsets, aliasing, scale/divide/copy, and the narrow-float conversions checked
// exhaustively (decode) and at every rounding boundary (encode).
#include "kernels/host/reduce.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "c4comm/types.hpp"
#include "tests/common/not_applicable.hpp"

namespace c4::kernels {
namespace {

// avx512novbmi: the AVX-512 table without its AVX512-VBMI kernels (what Skylake-SP runs).
constexpr const char* kIsas[] = {"scalar", "avx2", "avx512", "avx512novbmi"};
constexpr size_t kCounts[] = {0, 1, 7, 31, 33, 1000, 4099};
constexpr size_t kByteOffsets[] = {0, 1, 4, 12};
constexpr DataType kAllTypes[] = {DataType::kInt8,     DataType::kUint8,      DataType::kInt32,
                                  DataType::kUint32,   DataType::kInt64,      DataType::kUint64,
                                  DataType::kFloat16,  DataType::kFloat32,    DataType::kFloat64,
                                  DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr KOp kAllOps[] = {KOp::kSum, KOp::kProd, KOp::kMax, KOp::kMin};

const char* opName(KOp op) {
  switch (op) {
    case KOp::kSum:
      return "sum";
    case KOp::kProd:
      return "prod";
    case KOp::kMax:
      return "max";
    case KOp::kMin:
      return "min";
  }
  return "?";
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- reference element semantics (independent of the library except for the narrow codecs, which
// have their own exhaustive tests below) ----

uint64_t loadBits(const uint8_t* p, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, size);  // little-endian x86/arm
  return v;
}

template <class T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

// fmax/fmin as documented: a NaN operand yields the other; equal values (+0 vs -0) yield b.
template <class F>
F refMax(F a, F b) {
  if (std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  return a > b ? a : b;
}
template <class F>
F refMin(F a, F b) {
  if (std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  return a < b ? a : b;
}

template <class T>
T refOp(T a, T b, KOp op) {
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case KOp::kSum:
        return wrapAdd(a, b);
      case KOp::kProd:
        return wrapMul(a, b);
      case KOp::kMax:
        return std::max(a, b);
      case KOp::kMin:
        return std::min(a, b);
    }
  } else {
    switch (op) {
      case KOp::kSum:
        return a + b;
      case KOp::kProd:
        return a * b;
      case KOp::kMax:
        return refMax(a, b);
      case KOp::kMin:
        return refMin(a, b);
    }
  }
  return a;
}

float decodeNarrow(DataType dt, uint64_t v) {
  switch (dt) {
    case DataType::kFloat16:
      return halfToFloat(static_cast<uint16_t>(v));
    case DataType::kBfloat16:
      return bf16ToFloat(static_cast<uint16_t>(v));
    case DataType::kFloat8e4m3:
      return fp8e4m3ToFloat(static_cast<uint8_t>(v));
    default:
      return fp8e5m2ToFloat(static_cast<uint8_t>(v));
  }
}
uint64_t encodeNarrow(DataType dt, float f) {
  switch (dt) {
    case DataType::kFloat16:
      return floatToHalf(f);
    case DataType::kBfloat16:
      return floatToBf16(f);
    case DataType::kFloat8e4m3:
      return floatToFp8e4m3(f);
    default:
      return floatToFp8e5m2(f);
  }
}

template <class T>
uint64_t toBits(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
T fromBits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

// Applies f(T a, T b) -> T on the native type of dt, given raw bits.
template <class Fn>
uint64_t onType(DataType dt, uint64_t a, uint64_t b, Fn fn) {
  switch (dt) {
    case DataType::kInt8:
      return toBits(fn(fromBits<int8_t>(a), fromBits<int8_t>(b)));
    case DataType::kUint8:
      return toBits(fn(fromBits<uint8_t>(a), fromBits<uint8_t>(b)));
    case DataType::kInt32:
      return toBits(fn(fromBits<int32_t>(a), fromBits<int32_t>(b)));
    case DataType::kUint32:
      return toBits(fn(fromBits<uint32_t>(a), fromBits<uint32_t>(b)));
    case DataType::kInt64:
      return toBits(fn(fromBits<int64_t>(a), fromBits<int64_t>(b)));
    case DataType::kUint64:
      return toBits(fn(fromBits<uint64_t>(a), fromBits<uint64_t>(b)));
    case DataType::kFloat32:
      return toBits(fn(fromBits<float>(a), fromBits<float>(b)));
    case DataType::kFloat64:
      return toBits(fn(fromBits<double>(a), fromBits<double>(b)));
    default:
      return encodeNarrow(dt, fn(decodeNarrow(dt, a), decodeNarrow(dt, b)));
  }
}

uint64_t refReduce(DataType dt, KOp op, uint64_t a, uint64_t b) {
  return onType(dt, a, b, [op](auto x, auto y) { return refOp(x, y, op); });
}

bool isNanBits(DataType dt, uint64_t v) {
  switch (dt) {
    case DataType::kFloat32:
      return std::isnan(fromBits<float>(v));
    case DataType::kFloat64:
      return std::isnan(fromBits<double>(v));
    case DataType::kFloat16:
    case DataType::kBfloat16:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return std::isnan(decodeNarrow(dt, v));
    default:
      return false;
  }
}

// Equal bits, or both NaN (which NaN comes out of a+b with two NaNs may differ between paths).
::testing::AssertionResult sameElement(DataType dt, uint64_t got, uint64_t want, size_t i) {
  if (got == want || (isNanBits(dt, want) && isNanBits(dt, got))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << dataTypeName(dt) << " element " << i << ": got 0x" << std::hex << got
                                       << ", want 0x" << want;
}

// Random raw element bits; floats get a sprinkle of special values.
uint64_t randomBits(DataType dt, std::mt19937_64& rng) {
  const size_t size = dataTypeSize(dt);
  uint64_t v = rng();
  if (dt == DataType::kFloat32 && rng() % 8 == 0) {
    static const float kSpecial[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -3e-39f, 1.0f, -2.5f};
    return toBits(kSpecial[rng() % std::size(kSpecial)]);
  }
  if (dt == DataType::kFloat32 && rng() % 2 == 0)
    return toBits(static_cast<float>(static_cast<int>(v % 2001) - 1000) / 7.0f);
  if (dt == DataType::kFloat64 && rng() % 8 == 0) {
    static const double kSpecial[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, 1.0, -2.5};
    return toBits(kSpecial[rng() % std::size(kSpecial)]);
  }
  if (dt == DataType::kFloat64 && rng() % 2 == 0)
    return toBits(static_cast<double>(static_cast<int>(v % 2001) - 1000) / 7.0);
  if (size == 8) return v;
  return v & ((uint64_t{1} << (8 * size)) - 1);
}

struct Buffer {
  // 64-byte aligned storage; data() is offset by `offset` bytes to test unaligned pointers.
  Buffer(size_t bytes, size_t offset) : raw(bytes + offset + 128) {
    const uintptr_t base = (reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t{63};
    ptr = reinterpret_cast<uint8_t*>(base) + offset;
  }
  uint8_t* data() { return ptr; }
  std::vector<uint8_t> raw;
  uint8_t* ptr;
};

void fillRandom(uint8_t* p, size_t count, DataType dt, std::mt19937_64& rng) {
  const size_t size = dataTypeSize(dt);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t v = randomBits(dt, rng);
    std::memcpy(p + i * size, &v, size);
  }
}

// The reason key (tests/common/not_applicable.hpp) of an instruction set this machine cannot run.
const char* isaSkipKey(const char* isa) {
  return std::strcmp(isa, "avx2") == 0 ? "cpu-lacks-avx2" : "cpu-lacks-avx512";
}

class IsaTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!setIsaForTesting(GetParam()))
      C4_NOT_APPLICABLE(isaSkipKey(GetParam()), GetParam() << ": " << isaUnavailableReason(GetParam()));
    ASSERT_STREQ(isaName(), GetParam());
  }
  void TearDown() override { ASSERT_TRUE(setIsaForTesting("auto")); }
};

// ---- reduce: every dtype x op, counts, byte offsets, aliasing ----

class ReduceTest : public ::testing::TestWithParam<std::tuple<const char*, DataType, KOp>> {
 protected:
  void SetUp() override {
    const char* isa = std::get<0>(GetParam());
    if (!setIsaForTesting(isa)) C4_NOT_APPLICABLE(isaSkipKey(isa), isa << ": " << isaUnavailableReason(isa));
  }
  void TearDown() override { ASSERT_TRUE(setIsaForTesting("auto")); }
};

TEST_P(ReduceTest, MatchesReference) {
  const auto [isa, dt, op] = GetParam();
  const size_t size = dataTypeSize(dt);
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 131 + static_cast<uint64_t>(op));
  enum Alias { kNone, kDstIsA, kDstIsB };
  for (size_t count : kCounts) {
    for (size_t offset : kByteOffsets) {
      for (Alias alias : {kNone, kDstIsA, kDstIsB}) {
        Buffer a(count * size, offset), b(count * size, (offset * 3) % 16), d(count * size, (offset + 5) % 16);
        fillRandom(a.data(), count, dt, rng);
        fillRandom(b.data(), count, dt, rng);
        std::vector<uint64_t> want(count);
        for (size_t i = 0; i < count; ++i) {
          want[i] = refReduce(dt, op, loadBits(a.data() + i * size, size), loadBits(b.data() + i * size, size));
        }
        uint8_t* dst = alias == kDstIsA ? a.data() : alias == kDstIsB ? b.data() : d.data();
        // Guard bytes after the output catch overruns of the tail handling.
        std::memset(dst + count * size, 0xA5, 16);
        reduce(dst, a.data(), b.data(), count, dt, op);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(sameElement(dt, loadBits(dst + i * size, size), want[i], i))
              << "isa=" << isa << " op=" << opName(op) << " count=" << count << " offset=" << offset
              << " alias=" << alias;
        }
        for (size_t i = 0; i < 16; ++i) ASSERT_EQ(dst[count * size + i], 0xA5) << "wrote past the end, count=" << count;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + dataTypeName(std::get<1>(info.param)) +
                                  "_" + opName(std::get<2>(info.param));
                         });

// fp8: every pair of the 256 values, every op: covers every rounding case of the vector encoders.
TEST_P(IsaTest, Fp8AllPairs) {
  for (DataType dt : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    std::vector<uint8_t> a(65536), b(65536), d(65536);
    for (size_t i = 0; i < 65536; ++i) {
      a[i] = static_cast<uint8_t>(i & 0xff);
      b[i] = static_cast<uint8_t>(i >> 8);
    }
    for (KOp op : kAllOps) {
      reduce(d.data(), a.data(), b.data(), a.size(), dt, op);
      for (size_t i = 0; i < 65536; ++i) {
        ASSERT_TRUE(sameElement(dt, d[i], refReduce(dt, op, a[i], b[i]), i)) << opName(op);
      }
    }
  }
}

// fp8 scale: every code times every scalar (the vector kernels broadcast the scalar separately).
TEST_P(IsaTest, Fp8ScaleAllPairs) {
  for (DataType dt : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    std::vector<uint8_t> src(256 + 37), dst(src.size());  // + a tail shorter than a vector
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    for (uint32_t s = 0; s < 256; ++s) {
      const uint8_t scalar = static_cast<uint8_t>(s);
      scale(dst.data(), src.data(), &scalar, src.size(), dt);
      for (size_t i = 0; i < src.size(); ++i) {
        ASSERT_TRUE(sameElement(dt, dst[i], refReduce(dt, KOp::kProd, src[i], scalar), i)) << "scalar " << s;
      }
    }
  }
}

// fp16/bf16: a million random pairs per op (many land on ties, subnormals and overflow).
TEST_P(IsaTest, Half16RandomPairs) {
  std::mt19937_64 rng(7);
  const size_t n = 1 << 20;
  std::vector<uint16_t> a(n), b(n), d(n);
  for (DataType dt : {DataType::kFloat16, DataType::kBfloat16}) {
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<uint16_t>(rng());
      // Keep exponents close half of the time so sums need rounding rather than return one input.
      b[i] = (i & 1) ? static_cast<uint16_t>(rng()) : static_cast<uint16_t>(a[i] ^ (rng() & 0x83ff));
    }
    for (KOp op : kAllOps) {
      reduce(d.data(), a.data(), b.data(), n, dt, op);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(sameElement(dt, d[i], refReduce(dt, op, a[i], b[i]), i)) << opName(op);
      }
    }
  }
}

// Every code decodes and re-encodes to itself through the vector path (x + -0 == x), bit for bit;
// fp16 NaNs included (both paths quiet them the same way).
TEST_P(IsaTest, NarrowRoundTripThroughKernels) {
  for (DataType dt : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    const size_t size = dataTypeSize(dt);
    const size_t n = size == 1 ? 256 : 65536;
    const uint64_t negZero = size == 1 ? 0x80 : 0x8000;
    std::vector<uint8_t> a(n * size), b(n * size), d(n * size);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(&a[i * size], &i, size);
      std::memcpy(&b[i * size], &negZero, size);
    }
    reduce(d.data(), a.data(), b.data(), n, dt, KOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t got = loadBits(&d[i * size], size);
      if (isNanBits(dt, i)) {
        ASSERT_TRUE(isNanBits(dt, got)) << dataTypeName(dt) << " code " << i;
        if (dt == DataType::kFloat16) {
          ASSERT_EQ(got, floatToHalf(halfToFloat(static_cast<uint16_t>(i))));
        }
      } else if (dt == DataType::kFloat8e5m2 && (i & 0x7f) == 0x7c) {
        ASSERT_EQ(got, i - 1) << "e5m2 inf saturates to the largest finite value";
      } else {
        ASSERT_EQ(got, i) << dataTypeName(dt);
      }
    }
  }
}

// ---- scale ----

TEST_P(IsaTest, ScaleAllTypes) {
  std::mt19937_64 rng(11);
  for (DataType dt : kAllTypes) {
    const size_t size = dataTypeSize(dt);
    for (size_t count : kCounts) {
      for (bool inPlace : {false, true}) {
        Buffer src(count * size, 3), dst(count * size, 1);
        fillRandom(src.data(), count, dt, rng);
        uint64_t scalar = randomBits(dt, rng);
        std::vector<uint64_t> want(count);
        for (size_t i = 0; i < count; ++i) {
          want[i] = onType(dt, loadBits(src.data() + i * size, size), scalar,
                           [](auto x, auto y) { return refOp(x, y, KOp::kProd); });
        }
        uint8_t* out = inPlace ? src.data() : dst.data();
        scale(out, src.data(), &scalar, count, dt);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(sameElement(dt, loadBits(out + i * size, size), want[i], i)) << "count=" << count;
        }
      }
    }
  }
}

// ---- divide ----

template <class T>
T refIntDiv(T x, int d) {
  if constexpr (std::is_signed_v<T>) {
    if (d == -1) return static_cast<T>(uint64_t{0} - static_cast<uint64_t>(x));
    return static_cast<T>(static_cast<int64_t>(x) / d);
  } else {
    return static_cast<T>(static_cast<uint64_t>(x) / static_cast<uint64_t>(static_cast<int64_t>(d)));
  }
}

uint64_t refDivide(DataType dt, uint64_t v, int d) {
  switch (dt) {
    case DataType::kInt8:
      return toBits(refIntDiv(fromBits<int8_t>(v), d));
    case DataType::kUint8:
      return toBits(refIntDiv(fromBits<uint8_t>(v), d));
    case DataType::kInt32:
      return toBits(refIntDiv(fromBits<int32_t>(v), d));
    case DataType::kUint32:
      return toBits(refIntDiv(fromBits<uint32_t>(v), d));
    case DataType::kInt64:
      return toBits(refIntDiv(fromBits<int64_t>(v), d));
    case DataType::kUint64:
      return toBits(refIntDiv(fromBits<uint64_t>(v), d));
    case DataType::kFloat32:
      return toBits(fromBits<float>(v) / static_cast<float>(d));
    case DataType::kFloat64:
      return toBits(fromBits<double>(v) / static_cast<double>(d));
    default:
      return encodeNarrow(dt, decodeNarrow(dt, v) / static_cast<float>(d));
  }
}

TEST_P(IsaTest, DivideAllTypes) {
  std::mt19937_64 rng(13);
  const int kDivisors[] = {1, 2, 3, 7, 8, 24, 255, 256, 1000003, 2147483647, -1, -3};
  for (DataType dt : kAllTypes) {
    const size_t size = dataTypeSize(dt);
    for (int divisor : kDivisors) {
      for (size_t count : kCounts) {
        Buffer src(count * size, 1), dst(count * size, 0);
        fillRandom(src.data(), count, dt, rng);
        // Extremes: INT_MIN, INT_MAX, 0, -1 of the type.
        const uint64_t extremes[] = {uint64_t{1} << (8 * size - 1), (uint64_t{1} << (8 * size - 1)) - 1, 0,
                                     ~uint64_t{0}};
        for (size_t i = 0; i < std::min<size_t>(count, 4); ++i) std::memcpy(src.data() + i * size, &extremes[i], size);
        std::vector<uint64_t> want(count);
        for (size_t i = 0; i < count; ++i) want[i] = refDivide(dt, loadBits(src.data() + i * size, size), divisor);
        divide(dst.data(), src.data(), count, dt, divisor);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(sameElement(dt, loadBits(dst.data() + i * size, size), want[i], i))
              << "divisor=" << divisor << " count=" << count;
        }
        divide(src.data(), src.data(), count, dt, divisor);  // in place
        for (size_t i = 0; i < count; ++i)
          ASSERT_TRUE(sameElement(dt, loadBits(src.data() + i * size, size), want[i], i));
      }
    }
  }
}

// int8/uint8: every value by every divisor 1..300; int32: values around multiples of large divisors,
// where a wrong float rounding would cross an integer.
TEST_P(IsaTest, DivideIntegersExhaustive) {
  std::vector<int8_t> s8(256), d8(256);
  std::vector<uint8_t> u8(256), e8(256);
  for (int i = 0; i < 256; ++i) {
    s8[i] = static_cast<int8_t>(i);
    u8[i] = static_cast<uint8_t>(i);
  }
  for (int d = 1; d <= 300; ++d) {
    divide(d8.data(), s8.data(), 256, DataType::kInt8, d);
    divide(e8.data(), u8.data(), 256, DataType::kUint8, d);
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(d8[i], static_cast<int8_t>(s8[i] / d));
      ASSERT_EQ(e8[i], static_cast<uint8_t>(u8[i] / d));
    }
  }
  std::mt19937_64 rng(17);
  std::vector<int32_t> s32;
  std::vector<uint32_t> u32;
  std::vector<int> divs;
  for (int k = 0; k < 20000; ++k) {
    const int d = static_cast<int>(rng() % 2147483647u) + 1;
    const int64_t q = static_cast<int64_t>(rng() % (2147483647u / static_cast<uint32_t>(d) + 1));
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t x = q * d + delta;
      if (x >= INT32_MIN && x <= INT32_MAX) {
        s32.push_back(static_cast<int32_t>(x));
        s32.push_back(static_cast<int32_t>(-x));
        u32.push_back(static_cast<uint32_t>(x) * 2u + 1u);
        divs.push_back(d);
      }
    }
  }
  // One divisor per call: group values by divisor.
  for (size_t i = 0; i + 1 < divs.size(); i += 3) {
    const int d = divs[i];
    int32_t in[6], out[6];
    uint32_t uin[3], uout[3];
    for (int j = 0; j < 6; ++j) in[j] = s32[std::min(2 * i + j, s32.size() - 1)];
    for (int j = 0; j < 3; ++j) uin[j] = u32[std::min(i + j, u32.size() - 1)];
    divide(out, in, 6, DataType::kInt32, d);
    divide(uout, uin, 3, DataType::kUint32, d);
    for (int j = 0; j < 6; ++j) ASSERT_EQ(out[j], in[j] / d) << in[j] << " / " << d;
    for (int j = 0; j < 3; ++j) ASSERT_EQ(uout[j], uin[j] / static_cast<uint32_t>(d)) << uin[j] << " / " << d;
  }
}

TEST(KernelsDivide, IntegerDivideByZeroLeavesValues) {
  int32_t v[3] = {5, -7, 9}, out[3] = {};
  divide(out, v, 3, DataType::kInt32, 0);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], -7);
  EXPECT_EQ(out[2], 9);
}

// ---- copy ----

TEST_P(IsaTest, CopyAllSizesAndOffsets) {
  std::mt19937_64 rng(19);
  const size_t saved = copyNonTemporalThreshold();
  for (size_t threshold : {size_t{1}, SIZE_MAX}) {
    setCopyNonTemporalThresholdForTesting(threshold);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{255}, size_t{4099},
                         size_t{1} << 20, (size_t{1} << 20) + 77}) {
      for (size_t off : {0, 1, 17}) {
        Buffer src(bytes, off), dst(bytes, (off + 9) % 64);
        for (size_t i = 0; i < bytes; ++i) src.data()[i] = static_cast<uint8_t>(rng());
        std::memset(dst.data() + bytes, 0x5A, 16);
        copy(dst.data(), src.data(), bytes);
        ASSERT_EQ(std::memcmp(dst.data(), src.data(), bytes), 0) << "bytes=" << bytes << " off=" << off;
        for (size_t i = 0; i < 16; ++i) ASSERT_EQ(dst.data()[bytes + i], 0x5A);
      }
    }
  }
  setCopyNonTemporalThresholdForTesting(saved);
}

INSTANTIATE_TEST_SUITE_P(Isas, IsaTest, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return std::string(info.param); });

// The CPU's flags as the kernel reports them (what tools/check_suites.py reads too), so that the
// dispatch is checked against a source other than the __builtin_cpu_supports it uses itself.
std::string cpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return " " + line.substr(line.find(':') + 1) + " ";
  return "";
}

bool hasFlags(const std::string& flags, std::initializer_list<const char*> want) {
  for (const char* f : want)
    if (flags.find(std::string(" ") + f + " ") == std::string::npos) return false;
  return true;
}

// auto is the best level the CPU has, capped by C4_KERNELS_ISA_MAX (its ctest runs set it to avx2
// and scalar: on a CPU with AVX-512 they run the suite as a CPU without it would).
TEST(KernelsDispatch, AutoPicksTheBestTheCpuHasUnderTheCap) {
  ASSERT_TRUE(setIsaForTesting("auto"));
  const std::string best = isaName();
  EXPECT_FALSE(setIsaForTesting("sse9"));
  EXPECT_FALSE(setIsaForTesting(nullptr));
  EXPECT_NE(isaUnavailableReason("sse9"), nullptr);
  EXPECT_EQ(best, isaName());
  const std::string flags = cpuFlags();
#if defined(__x86_64__)
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
#endif
  const char* capEnv = std::getenv("C4_KERNELS_ISA_MAX");
  const std::string cap = capEnv != nullptr ? capEnv : "auto";
  const bool has512 = hasFlags(flags, {"avx512f", "avx512bw", "avx512dq", "avx512vl"});
  const bool has2 = hasFlags(flags, {"avx2", "fma", "f16c"});
  std::string want = "scalar";
  if (has2 && cap != "scalar") want = "avx2";
  if (has2 && has512 && cap != "scalar" && cap != "avx2") want = "avx512";
  EXPECT_EQ(best, want) << "flags:" << flags.substr(0, 200) << "... cap " << cap;
  // Every level above the one chosen says why it cannot run here; every level up to it runs.
  EXPECT_EQ(isaUnavailableReason("scalar"), nullptr);
  const bool run2 = want != "scalar", run512 = want == "avx512";
  EXPECT_EQ(isaUnavailableReason("avx2") == nullptr, run2);
  EXPECT_EQ(isaUnavailableReason("avx512") == nullptr, run512);
  EXPECT_EQ(isaUnavailableReason("avx512novbmi") == nullptr, run512);
  if (!run512) {
    const std::string why = isaUnavailableReason("avx512");
    EXPECT_NE(why.find(has512 ? "C4_KERNELS_ISA_MAX" : "the CPU lacks AVX-512"), std::string::npos) << why;
  }
  if (!run2) {
    const std::string why = isaUnavailableReason("avx2");
    EXPECT_NE(why.find(has2 ? "C4_KERNELS_ISA_MAX" : "the CPU lacks AVX2"), std::string::npos) << why;
  }
}

TEST(KernelsDispatch, InvalidArgumentsDoNothing) {
  int32_t a[2] = {1, 2}, b[2] = {3, 4}, d[2] = {7, 7};
  reduce(d, a, b, 2, static_cast<DataType>(99), KOp::kSum);
  reduce(d, a, b, 2, DataType::kInt32, static_cast<KOp>(9));
  EXPECT_EQ(d[0], 7);
  EXPECT_EQ(d[1], 7);
}

// ---- conversions: exhaustive decode against a from-the-definition reference ----

double refDecode(uint32_t code, int expBits, int manBits, int bias) {
  const uint32_t sign = code >> (expBits + manBits);
  const uint32_t exp = (code >> manBits) & ((1u << expBits) - 1);
  const uint32_t man = code & ((1u << manBits) - 1);
  const double s = sign ? -1.0 : 1.0;
  if (exp == 0) return s * std::ldexp(static_cast<double>(man), 1 - bias - manBits);
  return s * std::ldexp(static_cast<double>((1u << manBits) | man), static_cast<int>(exp) - bias - manBits);
}

void expectSameFloat(float got, double want, uint32_t code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << std::hex << code;
  } else {
    EXPECT_EQ(static_cast<double>(got), want) << std::hex << "code 0x" << code;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << std::hex << "code 0x" << code;
  }
}

TEST(KernelsConvert, HalfDecodeAll) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const bool special = ((c >> 10) & 0x1f) == 0x1f;
    double want = refDecode(c, 5, 10, 15);
    if (special) want = (c & 0x3ff) ? NAN : ((c & 0x8000) ? -INFINITY : INFINITY);
    expectSameFloat(halfToFloat(static_cast<uint16_t>(c)), want, c);
    if (special && (c & 0x3ff)) {
      // Quiet NaN, same sign, payload kept in the top mantissa bits (what F16C produces).
      const uint32_t bits = bitsOf(halfToFloat(static_cast<uint16_t>(c)));
      EXPECT_EQ(bits, ((c & 0x8000u) << 16) | 0x7fc00000u | ((c & 0x3ffu) << 13));
    }
  }
}

TEST(KernelsConvert, Bf16DecodeAll) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const bool special = ((c >> 7) & 0xff) == 0xff;
    double want = refDecode(c, 8, 7, 127);
    if (special) want = (c & 0x7f) ? NAN : ((c & 0x8000) ? -INFINITY : INFINITY);
    expectSameFloat(bf16ToFloat(static_cast<uint16_t>(c)), want, c);
    EXPECT_EQ(bitsOf(bf16ToFloat(static_cast<uint16_t>(c))), c << 16);
  }
}

TEST(KernelsConvert, Fp8DecodeAll) {
  for (uint32_t c = 0; c < 256; ++c) {
    // e4m3 (OCP/NVIDIA "fn"): no inf, S.1111.111 is NaN, max 448.
    double want = (c & 0x7f) == 0x7f ? NAN : refDecode(c, 4, 3, 7);
    expectSameFloat(fp8e4m3ToFloat(static_cast<uint8_t>(c)), want, c);
    // e5m2: IEEE-like, inf and NaN at exponent 31.
    const bool special = ((c >> 2) & 0x1f) == 0x1f;
    want = refDecode(c, 5, 2, 15);
    if (special) want = (c & 3) ? NAN : ((c & 0x80) ? -INFINITY : INFINITY);
    expectSameFloat(fp8e5m2ToFloat(static_cast<uint8_t>(c)), want, c);
  }
  EXPECT_EQ(fp8e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3ToFloat(0x01), 0x1p-9f);
  EXPECT_EQ(fp8e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_EQ(fp8e5m2ToFloat(0x01), 0x1p-16f);
}

// ---- conversions: encode against nearest-even over the format's value list ----

struct Format {
  const char* name;
  uint32_t codes;  // number of codes
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
  bool satfinite;
  uint32_t nanCode;  // 0 = keep-payload NaN (fp16/bf16: check isnan only)
};

float decHalf(uint32_t c) { return halfToFloat(static_cast<uint16_t>(c)); }
uint32_t encHalf(float f) { return floatToHalf(f); }
float decBf16(uint32_t c) { return bf16ToFloat(static_cast<uint16_t>(c)); }
uint32_t encBf16(float f) { return floatToBf16(f); }
float decE4m3(uint32_t c) { return fp8e4m3ToFloat(static_cast<uint8_t>(c)); }
uint32_t encE4m3(float f) { return floatToFp8e4m3(f); }
float decE5m2(uint32_t c) { return fp8e5m2ToFloat(static_cast<uint8_t>(c)); }
uint32_t encE5m2(float f) { return floatToFp8e5m2(f); }

const Format kFormats[] = {
    {"fp16", 65536, decHalf, encHalf, false, 0},
    {"bf16", 65536, decBf16, encBf16, false, 0},
    {"e4m3", 256, decE4m3, encE4m3, true, 0x7f},
    {"e5m2", 256, decE5m2, encE5m2, true, 0x7f},
};

class EncodeTest : public ::testing::TestWithParam<Format> {
 protected:
  void SetUp() override {
    const Format& f = GetParam();
    signBit_ = f.codes == 256 ? 0x80 : 0x8000;
    // Non-negative finite values in code order (= value order for sign-magnitude formats).
    for (uint32_t c = 0; c < signBit_; ++c) {
      const float v = f.decode(c);
      if (std::isfinite(v)) values_.push_back({static_cast<double>(v), c});
    }
  }

  // Nearest-even reference, from the value list and the decoded (already verified) values.
  uint32_t reference(float x) const {
    const Format& f = GetParam();
    const uint32_t sign = std::signbit(x) ? signBit_ : 0;
    const double ax = std::fabs(static_cast<double>(x));
    const auto& last = values_.back();
    const double ulpMax = last.first - values_[values_.size() - 2].first;
    if (ax >= last.first) {
      if (f.satfinite) return sign | last.second;
      // Past the largest finite value: RNE against a virtual next value (the inf code, even).
      return ax >= last.first + ulpMax / 2 ? (sign | (last.second + 1)) : (sign | last.second);
    }
    auto hi = std::lower_bound(values_.begin(), values_.end(), std::make_pair(ax, uint32_t{0}));
    if (hi->first == ax) return sign | hi->second;
    auto lo = hi - 1;
    const double dl = ax - lo->first, dh = hi->first - ax;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }

  void check(float x) const {
    const Format& f = GetParam();
    const uint32_t got = f.encode(x);
    if (std::isnan(x)) {
      if (f.nanCode) {
        ASSERT_EQ(got, f.nanCode) << f.name;
      } else {
        ASSERT_TRUE(std::isnan(f.decode(got))) << f.name;
      }
      return;
    }
    ASSERT_EQ(got, reference(x)) << f.name << " x=" << x << std::hex << " bits=0x" << bitsOf(x);
  }

  uint32_t signBit_ = 0;
  std::vector<std::pair<double, uint32_t>> values_;
};

TEST_P(EncodeTest, RoundTripEveryCode) {
  const Format& f = GetParam();
  for (uint32_t c = 0; c < f.codes; ++c) {
    const float v = f.decode(c);
    if (std::isnan(v)) continue;
    if (std::isinf(v) && f.satfinite) continue;  // e5m2 inf saturates on the way back
    ASSERT_EQ(f.encode(v), c) << f.name;
  }
}

TEST_P(EncodeTest, TiesAndNeighborsAtEveryBoundary) {
  for (size_t i = 0; i + 1 < values_.size(); ++i) {
    const double mid = (values_[i].first + values_[i + 1].first) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // the midpoint is exactly a float for these formats
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY), static_cast<float>(values_[i].first)}) {
      check(x);
      check(-x);
    }
  }
  // Overflow boundary: midpoint between the max and the next (virtual) value, and beyond.
  const double ulpMax = values_.back().first - values_[values_.size() - 2].first;
  const float over = static_cast<float>(values_.back().first + ulpMax / 2);
  for (float x : {over, std::nextafter(over, 0.0f), std::nextafter(over, INFINITY), 2 * over, 1e30f,
                  std::numeric_limits<float>::max(), INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f,
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min()}) {
    check(x);
  }
}

TEST_P(EncodeTest, RandomFloats) {
  std::mt19937 rng(23);
  for (int i = 0; i < 1 << 20; ++i) check(floatOf(static_cast<uint32_t>(rng())));
  // And values inside the format's range.
  std::uniform_real_distribution<double> frac(-1.0, 1.0);
  for (int i = 0; i < 1 << 20; ++i) {
    check(static_cast<float>(frac(rng) * values_.back().first * (i % 3 == 0 ? 1e-3 : 1.0)));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EncodeTest, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(KernelsConvert, KnownEdgeCases) {
  // Saturation like __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...).
  EXPECT_EQ(floatToFp8e4m3(1e6f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(floatToFp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(464.0f), 0x7e);  // would round to 480 (NaN code) without saturation
  EXPECT_EQ(floatToFp8e4m3(NAN), 0x7f);
  EXPECT_EQ(floatToFp8e5m2(INFINITY), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(-65536.0f), 0xfb);
  EXPECT_EQ(floatToFp8e5m2(NAN), 0x7f);
  // Ties to even.
  EXPECT_EQ(floatToFp8e4m3(1.0625f), 0x38);   // between 1.0 (0x38) and 1.125 (0x39)
  EXPECT_EQ(floatToFp8e4m3(1.1875f), 0x3a);   // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(floatToFp8e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(floatToFp8e4m3(0x3p-10f), 0x02);  // 1.5 subnormal steps: ties to 2
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);   // tie between 65504 and 2^16 goes to inf
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(floatToHalf(0x1.8p-24f), 0x0002);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(1.00390625f), 0x3f80);  // 1 + 2^-8: tie, to even
  EXPECT_EQ(floatToBf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8: tie, to even (up)
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(floatToBf16(floatOf(0x7f800001)), 0x7fc0);  // signaling NaN comes out quiet
  EXPECT_EQ(floatToHalf(floatOf(0xffc00000)), 0xfe00);
}

}  // namespace
}  // namespace c4::kernels
