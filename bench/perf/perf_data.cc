#include "bench/perf/perf_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace c4 {
namespace perf {
namespace {

// A binary floating-point format narrower than float: sign, `ebits` exponent
// bits, `mbits` mantissa bits. `ieee` formats reserve the top exponent for
// inf/NaN; e4m3 (not ieee) uses only all-ones for NaN and saturates.
struct SmallFloat {
  int ebits;
  int mbits;
  bool ieee;
  double maxFinite;
};

constexpr SmallFloat kHalf{5, 10, true, 65504.0};
constexpr SmallFloat kBf16{8, 7, true, 3.3895313892515355e38};
constexpr SmallFloat kE4m3{4, 3, false, 448.0};
constexpr SmallFloat kE5m2{5, 2, true, 57344.0};

uint32_t encodeSmall(const SmallFloat& f, double v) {
  const int bias = (1 << (f.ebits - 1)) - 1;
  const uint32_t signBit = 1u << (f.ebits + f.mbits);
  const uint32_t expAllOnes = (1u << f.ebits) - 1;
  uint32_t sign = std::signbit(v) ? signBit : 0;
  if (std::isnan(v)) return f.ieee ? (sign | (expAllOnes << f.mbits) | (1u << (f.mbits - 1))) : (sign | (signBit - 1));
  double a = std::fabs(v);
  uint32_t maxBits = f.ieee ? (((expAllOnes - 1) << f.mbits) | ((1u << f.mbits) - 1)) : (signBit - 2);
  uint32_t infBits = f.ieee ? (expAllOnes << f.mbits) : maxBits;
  if (std::isinf(a)) return sign | infBits;
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);
  int exp = e - 1;  // a = 1.xxx * 2^exp
  const int minExp = 1 - bias;
  if (exp < minExp) {
    // Subnormal: a multiple of 2^(minExp - mbits). Rounding up to 2^mbits
    // yields the smallest normal.
    double q = std::nearbyint(std::ldexp(a, f.mbits - minExp));
    return sign | static_cast<uint32_t>(q);
  }
  double m = std::nearbyint((std::ldexp(a, -exp) - 1.0) * (1 << f.mbits));
  if (m >= (1 << f.mbits)) {
    m = 0;
    ++exp;
  }
  double rounded = std::ldexp(1.0 + m / (1 << f.mbits), exp);
  if (rounded > f.maxFinite) return sign | infBits;
  return sign | (static_cast<uint32_t>(exp + bias) << f.mbits) | static_cast<uint32_t>(m);
}

double decodeSmall(const SmallFloat& f, uint32_t bits) {
  const int bias = (1 << (f.ebits - 1)) - 1;
  const uint32_t expAllOnes = (1u << f.ebits) - 1;
  bool neg = (bits >> (f.ebits + f.mbits)) & 1;
  uint32_t ex = (bits >> f.mbits) & expAllOnes;
  uint32_t m = bits & ((1u << f.mbits) - 1);
  double v;
  if (f.ieee && ex == expAllOnes) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieee && ex == expAllOnes && m == (1u << f.mbits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (ex == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.mbits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(m) / (1 << f.mbits), static_cast<int>(ex) - bias);
  }
  return neg ? -v : v;
}

template <typename T>
T loadAs(const void* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void storeAs(void* p, T v) {
  memcpy(p, &v, sizeof(T));
}

template <typename T>
T wrapFromDouble(double v) {
  // Integers wrap modulo 2^bits like the reductions do; go through uint64 to
  // avoid UB.
  int64_t i = static_cast<int64_t>(std::llround(v));
  return static_cast<T>(static_cast<uint64_t>(i));
}

template <typename T>
T applyOp(RedOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case RedOp::kProd:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case RedOp::kMax:
        return std::max(a, b);
      case RedOp::kMin:
        return std::min(a, b);
      default:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case RedOp::kProd:
        return a * b;
      case RedOp::kMax:
        return std::max(a, b);
      case RedOp::kMin:
        return std::min(a, b);
      default:
        return a + b;
    }
  }
}

template <typename T>
void reduceTyped(RedOp op, void* inout, const void* in, size_t n) {
  T* o = static_cast<T*>(inout);
  const T* x = static_cast<const T*>(in);
  // Separate loops per op so the compiler vectorizes them.
  switch (op) {
    case RedOp::kProd:
      for (size_t i = 0; i < n; ++i) o[i] = applyOp<T>(RedOp::kProd, o[i], x[i]);
      break;
    case RedOp::kMax:
      for (size_t i = 0; i < n; ++i) o[i] = applyOp<T>(RedOp::kMax, o[i], x[i]);
      break;
    case RedOp::kMin:
      for (size_t i = 0; i < n; ++i) o[i] = applyOp<T>(RedOp::kMin, o[i], x[i]);
      break;
    default:
      for (size_t i = 0; i < n; ++i) o[i] = applyOp<T>(RedOp::kSum, o[i], x[i]);
      break;
  }
}

void reduceGeneric(DataType dt, RedOp op, void* inout, const void* in, size_t n) {
  const size_t ts = dataTypeSize(dt);
  char* o = static_cast<char*>(inout);
  const char* x = static_cast<const char*>(in);
  for (size_t i = 0; i < n; ++i) {
    // Reduce in float, round once to the element type (what a host kernel
    // does).
    float a = static_cast<float>(loadElement(dt, o + i * ts));
    float b = static_cast<float>(loadElement(dt, x + i * ts));
    storeElement(dt, o + i * ts, applyOp<float>(op, a, b));
  }
}

bool isSignedOrFloat(DataType dt) {
  return !(dt == DataType::kUint8 || dt == DataType::kUint32 || dt == DataType::kUint64);
}

// Unit roundoff of each float type (2^-precision).
double unitRoundoff(DataType dt) {
  switch (dt) {
    case DataType::kFloat16:
      return std::ldexp(1.0, -11);
    case DataType::kFloat32:
      return std::ldexp(1.0, -24);
    case DataType::kFloat64:
      return std::ldexp(1.0, -53);
    case DataType::kBfloat16:
      return std::ldexp(1.0, -8);
    case DataType::kFloat8e4m3:
      return std::ldexp(1.0, -4);
    case DataType::kFloat8e5m2:
      return std::ldexp(1.0, -3);
    default:
      return 0.0;
  }
}

// inputValue depends on the index only through index % period, so expected
// values are tabulated.
size_t valuePeriod(DataType dt, RedOp op, bool reducing, int nranks) {
  if (!reducing) return dataTypeSize(dt) == 1 ? 251 : 1021;
  return op == RedOp::kProd ? 3 * static_cast<size_t>(nranks) : 9;
}

// The expected value of one reduced element as the element type would hold it
// (integers), or as an exact double with a tolerance (floats).
struct Expected {
  unsigned char bits[8];     // exact expected element (integers, and exact float cases)
  unsigned char altBits[8];  // second accepted element (integer average without
                             // wrap-around)
  double value;
  double tol;
  bool exact;
};

Expected expectedReduced(DataType dt, RedOp op, int nranks, size_t index) {
  Expected e{};
  if (!isFloatType(dt)) {
    // Exact modular arithmetic in 64 bits, truncated to the element width by
    // storeElement.
    uint64_t acc = 0;
    int64_t mn = 0, mx = 0;
    double exactSum = 0;
    for (int r = 0; r < nranks; ++r) {
      int64_t v = static_cast<int64_t>(inputValue(dt, op, true, r, index, nranks));
      exactSum += static_cast<double>(v);
      if (r == 0) {
        acc = static_cast<uint64_t>(v);
        mn = mx = v;
      } else {
        acc = op == RedOp::kProd ? acc * static_cast<uint64_t>(v) : acc + static_cast<uint64_t>(v);
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
    }
    double result;
    if (op == RedOp::kMin) {
      result = static_cast<double>(mn);
    } else if (op == RedOp::kMax) {
      result = static_cast<double>(mx);
    } else {
      // Truncate the wrapped accumulator to the element width and read it back
      // with its sign.
      storeElement(dt, e.bits, static_cast<double>(static_cast<int64_t>(acc)));
      result = loadElement(dt, e.bits);
      if (op == RedOp::kAvg) result = std::trunc(result / nranks);
    }
    storeElement(dt, e.bits, result);
    storeElement(dt, e.altBits, op == RedOp::kAvg ? std::trunc(exactSum / nranks) : result);
    e.exact = true;
    return e;
  }
  double acc = 0, sumAbs = 0;
  for (int r = 0; r < nranks; ++r) {
    double v = inputValue(dt, op, true, r, index, nranks);
    sumAbs += std::fabs(v);
    if (r == 0) {
      acc = v;
    } else {
      switch (op) {
        case RedOp::kProd:
          acc *= v;
          break;
        case RedOp::kMax:
          acc = std::max(acc, v);
          break;
        case RedOp::kMin:
          acc = std::min(acc, v);
          break;
        default:
          acc += v;
          break;
      }
    }
  }
  const double u = unitRoundoff(dt);
  if (op == RedOp::kSum) {
    e.tol = (nranks + 1) * u * sumAbs;
  } else if (op == RedOp::kAvg) {
    acc /= nranks;
    e.tol = (nranks + 1) * u * sumAbs / nranks + 2 * u * std::fabs(acc);
  }
  e.value = acc;
  e.exact = (op == RedOp::kProd || op == RedOp::kMin || op == RedOp::kMax);
  storeElement(dt, e.bits, acc);
  memcpy(e.altBits, e.bits, sizeof(e.bits));
  return e;
}

}  // namespace

double loadElement(DataType dt, const void* p) {
  switch (dt) {
    case DataType::kInt8:
      return loadAs<int8_t>(p);
    case DataType::kUint8:
      return loadAs<uint8_t>(p);
    case DataType::kInt32:
      return loadAs<int32_t>(p);
    case DataType::kUint32:
      return loadAs<uint32_t>(p);
    case DataType::kInt64:
      return static_cast<double>(loadAs<int64_t>(p));
    case DataType::kUint64:
      return static_cast<double>(loadAs<uint64_t>(p));
    case DataType::kFloat16:
      return decodeSmall(kHalf, loadAs<uint16_t>(p));
    case DataType::kFloat32:
      return loadAs<float>(p);
    case DataType::kFloat64:
      return loadAs<double>(p);
    case DataType::kBfloat16:
      return decodeSmall(kBf16, loadAs<uint16_t>(p));
    case DataType::kFloat8e4m3:
      return decodeSmall(kE4m3, loadAs<uint8_t>(p));
    case DataType::kFloat8e5m2:
      return decodeSmall(kE5m2, loadAs<uint8_t>(p));
  }
  return 0.0;
}

void storeElement(DataType dt, void* p, double v) {
  switch (dt) {
    case DataType::kInt8:
      storeAs(p, wrapFromDouble<int8_t>(v));
      break;
    case DataType::kUint8:
      storeAs(p, wrapFromDouble<uint8_t>(v));
      break;
    case DataType::kInt32:
      storeAs(p, wrapFromDouble<int32_t>(v));
      break;
    case DataType::kUint32:
      storeAs(p, wrapFromDouble<uint32_t>(v));
      break;
    case DataType::kInt64:
      storeAs(p, wrapFromDouble<int64_t>(v));
      break;
    case DataType::kUint64:
      storeAs(p, wrapFromDouble<uint64_t>(v));
      break;
    case DataType::kFloat16:
      storeAs(p, static_cast<uint16_t>(encodeSmall(kHalf, v)));
      break;
    case DataType::kFloat32:
      storeAs(p, static_cast<float>(v));
      break;
    case DataType::kFloat64:
      storeAs(p, v);
      break;
    case DataType::kBfloat16:
      storeAs(p, static_cast<uint16_t>(encodeSmall(kBf16, v)));
      break;
    case DataType::kFloat8e4m3:
      storeAs(p, static_cast<uint8_t>(encodeSmall(kE4m3, v)));
      break;
    case DataType::kFloat8e5m2:
      storeAs(p, static_cast<uint8_t>(encodeSmall(kE5m2, v)));
      break;
  }
}

void reduceInto(DataType dt, RedOp op, void* inout, const void* in, size_t n) {
  switch (dt) {
    case DataType::kInt8:
      return reduceTyped<int8_t>(op, inout, in, n);
    case DataType::kUint8:
      return reduceTyped<uint8_t>(op, inout, in, n);
    case DataType::kInt32:
      return reduceTyped<int32_t>(op, inout, in, n);
    case DataType::kUint32:
      return reduceTyped<uint32_t>(op, inout, in, n);
    case DataType::kInt64:
      return reduceTyped<int64_t>(op, inout, in, n);
    case DataType::kUint64:
      return reduceTyped<uint64_t>(op, inout, in, n);
    case DataType::kFloat32:
      return reduceTyped<float>(op, inout, in, n);
    case DataType::kFloat64:
      return reduceTyped<double>(op, inout, in, n);
    default:
      return reduceGeneric(dt, op, inout, in, n);
  }
}

void divideInPlace(DataType dt, void* buf, size_t n, int divisor) {
  const size_t ts = dataTypeSize(dt);
  char* b = static_cast<char*>(buf);
  if (dt == DataType::kFloat32) {
    float* f = static_cast<float*>(buf);
    for (size_t i = 0; i < n; ++i) f[i] /= divisor;
    return;
  }
  if (dt == DataType::kFloat64) {
    double* d = static_cast<double*>(buf);
    for (size_t i = 0; i < n; ++i) d[i] /= divisor;
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    double v = loadElement(dt, b + i * ts);
    storeElement(dt, b + i * ts, isFloatType(dt) ? v / divisor : std::trunc(v / divisor));
  }
}

bool collReduces(Coll coll) {
  return coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
}

double inputValue(DataType dt, RedOp op, bool reducing, int rank, size_t index, int nranks) {
  const bool sgn = isSignedOrFloat(dt);
  if (!reducing) {
    const size_t m = valuePeriod(dt, op, false, nranks);
    double v = static_cast<double>((index % m * 7 + static_cast<size_t>(rank) * 13) % m);
    return sgn ? v - static_cast<double>(m / 2) : v;
  }
  if (op == RedOp::kProd) {
    // One rank contributes 2 and the others +-1, so every product is exactly
    // +-2.
    if (index % static_cast<size_t>(nranks) == static_cast<size_t>(rank)) return 2.0;
    return (sgn && (index + static_cast<size_t>(rank)) % 3 == 0) ? -1.0 : 1.0;
  }
  double v = static_cast<double>((index % 9 * 7 + static_cast<size_t>(rank) * 13) % 9);
  return sgn ? v - 4.0 : v;
}

void fillInput(DataType dt, RedOp op, bool reducing, int rank, size_t firstIndex, int nranks, void* buf, size_t n) {
  const size_t ts = dataTypeSize(dt);
  const size_t period = valuePeriod(dt, op, reducing, nranks);
  std::vector<unsigned char> table(period * ts);
  for (size_t k = 0; k < period; ++k) storeElement(dt, &table[k * ts], inputValue(dt, op, reducing, rank, k, nranks));
  char* b = static_cast<char*>(buf);
  size_t k = firstIndex % period;
  for (size_t i = 0; i < n; ++i) {
    memcpy(b + i * ts, &table[k * ts], ts);
    if (++k == period) k = 0;
  }
}

int64_t countWrongReduced(DataType dt, RedOp op, int nranks, size_t firstIndex, const void* got, size_t n) {
  const size_t ts = dataTypeSize(dt);
  const size_t period = valuePeriod(dt, op, true, nranks);
  std::vector<Expected> table(period);
  for (size_t k = 0; k < period; ++k) table[k] = expectedReduced(dt, op, nranks, k);
  const char* g = static_cast<const char*>(got);
  int64_t wrong = 0;
  size_t k = firstIndex % period;
  for (size_t i = 0; i < n; ++i) {
    const Expected& e = table[k];
    const char* p = g + i * ts;
    if (e.exact) {
      wrong += (memcmp(p, e.bits, ts) != 0 && memcmp(p, e.altBits, ts) != 0) ? 1 : 0;
    } else {
      double v = loadElement(dt, p);
      wrong += (std::isnan(v) || std::fabs(v - e.value) > e.tol) ? 1 : 0;
    }
    if (++k == period) k = 0;
  }
  return wrong;
}

int64_t countWrongCopied(DataType dt, int srcRank, size_t firstIndex, int nranks, const void* got, size_t n) {
  const size_t ts = dataTypeSize(dt);
  const size_t period = valuePeriod(dt, RedOp::kSum, false, nranks);
  std::vector<unsigned char> table(period * ts);
  for (size_t k = 0; k < period; ++k)
    storeElement(dt, &table[k * ts], inputValue(dt, RedOp::kSum, false, srcRank, k, nranks));
  const char* g = static_cast<const char*>(got);
  int64_t wrong = 0;
  size_t k = firstIndex % period;
  for (size_t i = 0; i < n; ++i) {
    wrong += memcmp(g + i * ts, &table[k * ts], ts) != 0 ? 1 : 0;
    if (++k == period) k = 0;
  }
  return wrong;
}

}  // namespace perf
}  // namespace c4
