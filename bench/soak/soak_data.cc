#include "bench/soak/soak_data.hpp"

#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include "bench/perf/perf_data.hpp"

namespace c4 {
namespace soak {

void patternBytes(uint64_t seed, size_t off, size_t len, void* dst) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  size_t w = off / 8;
  size_t skip = off % 8;
  while (len > 0) {
    uint64_t v = hash2(seed, w++);
    unsigned char b[8];
    memcpy(b, &v, 8);
    size_t take = std::min(len, 8 - skip);
    memcpy(d, b + skip, take);
    d += take;
    len -= take;
    skip = 0;
  }
}

namespace {

// Exactness is decided in a format wide enough that no candidate value, scaled input or subset sum
// of the tables below is rounded (products of a 53-bit scale and a 20-bit value, sums spanning 2^-5
// to 2^22 of 53-bit values: under 113 bits).
#if defined(__SIZEOF_FLOAT128__) && (defined(__x86_64__) || defined(__i386__))
using Exact = __float128;
#else
using Exact = long double;
static_assert(LDBL_MANT_DIG >= 113, "c4-soak needs a 113-bit floating-point type to prove its references exact");
#endif

constexpr int kMaxRanks = 4;
constexpr size_t kMaxTuples = 1024;
constexpr int kTupleDraws = 4096;

bool isUnsignedInt(DataType dt) { return dt == DataType::kUint8 || dt == DataType::kUint32 || dt == DataType::kUint64; }

int intBits(DataType dt) { return static_cast<int>(dataTypeSize(dt)) * 8; }

// Integers as 64-bit values: signed types sign-extended, unsigned zero-extended.
uint64_t loadInt(DataType dt, const unsigned char* p) {
  uint64_t v = 0;
  memcpy(&v, p, dataTypeSize(dt));  // little-endian hosts
  const int bits = intBits(dt);
  if (!isUnsignedInt(dt) && bits < 64 && (v >> (bits - 1)) & 1) v |= ~uint64_t{0} << bits;
  return v;
}

void storeInt(DataType dt, unsigned char* p, uint64_t v) { memcpy(p, &v, dataTypeSize(dt)); }

// True when x is exactly a finite element of dt.
bool representable(DataType dt, Exact x) {
  const double d = static_cast<double>(x);
  if (static_cast<Exact>(d) != x || !std::isfinite(d)) return false;
  unsigned char b[8];
  perf::storeElement(dt, b, d);
  return perf::loadElement(dt, b) == d;
}

double roundTo(DataType dt, double v) {
  unsigned char b[8];
  perf::storeElement(dt, b, v);
  return perf::loadElement(dt, b);
}

const std::vector<double>& floatScalars() {
  static const std::vector<double> s = {1, 2, -1, 0.5, 3, -1.5, 0.25};
  return s;
}
const std::vector<int64_t>& signedScalars() {
  static const std::vector<int64_t> s = {1, 2, -1, 3, -2};
  return s;
}
const std::vector<int64_t>& unsignedScalars() {
  static const std::vector<int64_t> s = {1, 2, 3};
  return s;
}

// Candidate values of one rank's input for the float tables; those dt cannot hold are dropped.
std::vector<double> palette(DataType dt, int op) {
  std::vector<double> base;
  if (op == static_cast<int>(RedOp::kProd)) {
    base = {0, 1, -1, 2, -2, 0.5, -0.5, 3, -3, 1.5, 0.25, 4, -4, 5, -7, 1.25};
  } else {
    base = {0, 1,  -1,   2,     -2,    0.5,  -0.5,  3,  -3,  4,     -4,     1.5, -1.5, 6,   -6,
            8, -8, 0.25, -0.25, 0.125, 1024, -1024, 96, -40, 12345, -65537, 1e6, 7,    -13, 0.75};
  }
  std::vector<double> out;
  for (double v : base)
    if (representable(dt, v)) out.push_back(v);
  return out;
}

// One per-element tuple of a float table: each rank's encoded input and the encoded result.
struct Tuple {
  unsigned char in[kMaxRanks][8];
  unsigned char out[8];
  double value;
};

struct Table {
  std::vector<Tuple> tuples;
};

// Every nonempty subset's sum (or product) of u[0..n) is exactly representable in dt; *full gets
// the value of the whole set.
bool subsetsExact(DataType dt, bool prod, const Exact* u, int n, Exact* full) {
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    Exact acc = prod ? Exact(1) : Exact(0);
    bool first = true;
    for (int r = 0; r < n; ++r) {
      if (!(mask & (1u << r))) continue;
      if (first) {
        acc = u[r];
        first = false;
      } else {
        acc = prod ? acc * u[r] : acc + u[r];
      }
    }
    if (!representable(dt, acc)) return false;
    if (mask == (1u << n) - 1) *full = acc;
  }
  return true;
}

// The table of (dt, op, nranks, scalars): tuples whose every partial result is exact (file comment
// in soak_data.hpp). Built from a fixed seed, so every rank builds the same one; cached.
std::shared_ptr<const Table> floatTable(DataType dt, int op, int n, const std::vector<int>& scalarIdx) {
  // Tables without per-rank scalars are built once, before the ranks fork (prebuildTables), so
  // that the ranks' heaps do not grow with them; premul-sum tables are built per call and freed.
  using Key = std::tuple<int, int, int>;
  static std::map<Key, std::shared_ptr<const Table>> cache;
  const Key key{static_cast<int>(dt), op, n};
  if (op != kPreMulSum) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }

  auto t = std::make_shared<Table>();
  const bool prod = op == static_cast<int>(RedOp::kProd);
  Exact scale[kMaxRanks];
  for (int r = 0; r < n; ++r) {
    scale[r] = Exact(1);
    // Avg multiplies every input by 1/n rounded to dt (as NCCL and c4comm do); premul by the rank's scalar.
    if (op == static_cast<int>(RedOp::kAvg)) scale[r] = roundTo(dt, 1.0 / n);
    if (op == kPreMulSum) scale[r] = floatScalars()[static_cast<size_t>(scalarIdx[static_cast<size_t>(r)])];
  }
  const std::vector<double> pal = palette(dt, prod ? static_cast<int>(RedOp::kProd) : static_cast<int>(RedOp::kSum));
  auto add = [&](const double* v) {
    Exact u[kMaxRanks];
    for (int r = 0; r < n; ++r) {
      u[r] = static_cast<Exact>(v[r]) * scale[r];
      if (!representable(dt, u[r])) return;
    }
    Exact full = 0;
    if (!subsetsExact(dt, prod, u, n, &full)) return;
    Tuple tu{};
    for (int r = 0; r < n; ++r) perf::storeElement(dt, tu.in[r], v[r]);
    tu.value = static_cast<double>(full);
    perf::storeElement(dt, tu.out, tu.value);
    t->tuples.push_back(tu);
  };
  const double zeros[kMaxRanks] = {0, 0, 0, 0};
  add(zeros);  // always valid: the table is never empty
  uint64_t h = 0x5eed0000ull ^ (static_cast<uint64_t>(dt) << 8) ^ (static_cast<uint64_t>(op) << 16) ^
               (static_cast<uint64_t>(n) << 24);
  const int draws = op == kPreMulSum ? kTupleDraws / 4 : kTupleDraws;
  for (int k = 0; k < draws && t->tuples.size() < kMaxTuples; ++k) {
    double v[kMaxRanks];
    for (int r = 0; r < n; ++r) v[r] = pal[hash2(h, static_cast<uint64_t>(k * kMaxRanks + r)) % pal.size()];
    add(v);
  }
  if (op != kPreMulSum) cache.emplace(key, t);
  return t;
}

// The finite, non-negative-zero element of dt drawn from hash h (min/max inputs).
void randomFinite(DataType dt, uint64_t h, unsigned char* out) {
  const size_t es = dataTypeSize(dt);
  for (int k = 0;; ++k) {
    memcpy(out, &h, es);
    double v = perf::loadElement(dt, out);
    bool negZero = v == 0 && std::signbit(v);
    if (std::isfinite(v) && !negZero) return;
    h = mix64(h + static_cast<uint64_t>(k) + 1);
  }
}

}  // namespace

void prebuildTables(int minRanks, int maxRanks) {
  for (int n = minRanks; n <= maxRanks; ++n)
    for (int d = 0; d < kNumDataTypes; ++d)
      if (isFloatType(static_cast<DataType>(d)))
        for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kAvg})
          (void)floatTable(static_cast<DataType>(d), static_cast<int>(op), n, {});
}

int premulScalarCount(DataType dt) {
  if (isFloatType(dt)) return static_cast<int>(floatScalars().size());
  return static_cast<int>(isUnsignedInt(dt) ? unsignedScalars().size() : signedScalars().size());
}

std::string formatElement(DataType dt, const void* p) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  char buf[96];
  if (!isFloatType(dt)) {
    uint64_t v = loadInt(dt, b);
    if (isUnsignedInt(dt)) {
      snprintf(buf, sizeof(buf), "%" PRIu64, v);
    } else {
      snprintf(buf, sizeof(buf), "%" PRId64, static_cast<int64_t>(v));
    }
    return buf;
  }
  uint64_t bits = 0;
  memcpy(&bits, b, dataTypeSize(dt));
  snprintf(buf, sizeof(buf), "%.17g (0x%0*" PRIx64 ")", perf::loadElement(dt, b),
           static_cast<int>(2 * dataTypeSize(dt)), bits);
  return buf;
}

struct ReduceData::Impl {
  enum class Kind { kInt, kFloatTable, kFloatMinMax };
  DataType dt;
  int op;
  int n;
  uint64_t seed;
  size_t es;
  Kind kind;
  // Integers: inputs drawn uniformly from [lo, hi] (ranged) or from all bit patterns (min/max).
  bool ranged = false;
  bool isSigned = false;
  int64_t lo = 0;
  uint64_t span = 0;  // hi - lo + 1
  int64_t intScalar[kMaxRanks] = {1, 1, 1, 1};
  std::shared_ptr<const Table> table;
  std::vector<int> scalarIdx;

  uint64_t rankSeed(int r) const { return hash2(seed, static_cast<uint64_t>(r) + 1); }

  uint64_t intValue(int r, size_t i) const {
    uint64_t h = hash2(rankSeed(r), i);
    if (!ranged) return loadInt(dt, reinterpret_cast<const unsigned char*>(&h));
    return static_cast<uint64_t>(lo) + h % span;
  }
  const Tuple& tupleAt(size_t i) const { return table->tuples[hash2(seed, i) % table->tuples.size()]; }
};

ReduceData::ReduceData(DataType dt, int op, int nranks, const std::vector<int>& scalarIdx, uint64_t seed)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.dt = dt;
  m.op = op;
  m.n = nranks;
  m.seed = seed;
  m.es = dataTypeSize(dt);
  m.scalarIdx = scalarIdx;
  const bool minmax = op == static_cast<int>(RedOp::kMin) || op == static_cast<int>(RedOp::kMax);
  if (isFloatType(dt)) {
    m.kind = minmax ? Impl::Kind::kFloatMinMax : Impl::Kind::kFloatTable;
    if (!minmax) m.table = floatTable(dt, op, nranks, scalarIdx);
    return;
  }
  m.kind = Impl::Kind::kInt;
  m.isSigned = !isUnsignedInt(dt);
  if (minmax) return;
  m.ranged = true;
  const int bits = intBits(dt);
  // The largest magnitude of the type (2^(bits-1) - 1 signed, 2^bits - 1 unsigned).
  const uint64_t maxMag =
      m.isSigned ? (uint64_t{1} << (bits - 1)) - 1 : (bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1);
  uint64_t mag = 0;
  if (op == static_cast<int>(RedOp::kProd)) {
    // |v|^4 stays inside the type: 3^4 = 81, 150^4 = 5.1e8, 30000^4 = 8.1e17 (signed);
    // 3^4, 250^4 = 3.9e9, 60000^4 = 1.3e19 (unsigned).
    mag = bits == 8 ? 3 : bits == 32 ? (m.isSigned ? 150 : 250) : (m.isSigned ? 30000 : 60000);
  } else if (op == kPreMulSum) {
    for (int r = 0; r < nranks; ++r) {
      const auto& s = m.isSigned ? signedScalars() : unsignedScalars();
      m.intScalar[r] = s[static_cast<size_t>(scalarIdx[static_cast<size_t>(r)])];
    }
    mag = maxMag / (3 * static_cast<uint64_t>(nranks));  // |scalar| <= 3
  } else {
    mag = maxMag / static_cast<uint64_t>(nranks);  // sum and avg: no wrap-around
  }
  m.lo = m.isSigned ? -static_cast<int64_t>(mag) : 0;
  m.span = m.isSigned ? 2 * mag + 1 : mag + 1;
}

ReduceData::~ReduceData() = default;

void ReduceData::fill(int rank, size_t first, size_t count, void* dst) const {
  const Impl& m = *impl_;
  unsigned char* d = static_cast<unsigned char*>(dst);
  switch (m.kind) {
    case Impl::Kind::kInt:
      for (size_t k = 0; k < count; ++k) storeInt(m.dt, d + k * m.es, m.intValue(rank, first + k));
      break;
    case Impl::Kind::kFloatTable:
      for (size_t k = 0; k < count; ++k) memcpy(d + k * m.es, m.tupleAt(first + k).in[rank], m.es);
      break;
    case Impl::Kind::kFloatMinMax:
      for (size_t k = 0; k < count; ++k) randomFinite(m.dt, hash2(m.rankSeed(rank), first + k), d + k * m.es);
      break;
  }
}

void ReduceData::expected(size_t i, unsigned char* out) const {
  const Impl& m = *impl_;
  switch (m.kind) {
    case Impl::Kind::kFloatTable:
      memcpy(out, m.tupleAt(i).out, m.es);
      return;
    case Impl::Kind::kFloatMinMax: {
      const bool isMax = m.op == static_cast<int>(RedOp::kMax);
      unsigned char cur[8];
      double best = 0;
      for (int r = 0; r < m.n; ++r) {
        randomFinite(m.dt, hash2(m.rankSeed(r), i), cur);
        double v = perf::loadElement(m.dt, cur);
        if (r == 0 || (isMax ? v > best : v < best)) {
          best = v;
          memcpy(out, cur, m.es);
        }
      }
      return;
    }
    case Impl::Kind::kInt:
      break;
  }
  // Integers, in 64 bits (signed or unsigned as the type); no result leaves the type's range.
  uint64_t acc = 0;
  for (int r = 0; r < m.n; ++r) {
    uint64_t v = m.intValue(r, i);
    if (m.op == kPreMulSum) v = v * static_cast<uint64_t>(m.intScalar[r]);
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (m.op) {
      case static_cast<int>(RedOp::kProd):
        acc *= v;
        break;
      case static_cast<int>(RedOp::kMax):
        if (m.isSigned ? static_cast<int64_t>(v) > static_cast<int64_t>(acc) : v > acc) acc = v;
        break;
      case static_cast<int>(RedOp::kMin):
        if (m.isSigned ? static_cast<int64_t>(v) < static_cast<int64_t>(acc) : v < acc) acc = v;
        break;
      default:
        acc += v;
        break;
    }
  }
  if (m.op == static_cast<int>(RedOp::kAvg)) {
    // Integer Avg: the sum divided by n, truncated toward zero.
    acc = m.isSigned ? static_cast<uint64_t>(static_cast<int64_t>(acc) / m.n) : acc / static_cast<uint64_t>(m.n);
  }
  storeInt(m.dt, out, acc);
}

bool ReduceData::matches(size_t i, const unsigned char* got) const {
  unsigned char want[8];
  expected(i, want);
  if (memcmp(want, got, impl_->es) == 0) return true;
  if (!isFloatType(impl_->dt)) return false;
  // -0 and +0 are the same result.
  double a = perf::loadElement(impl_->dt, want), b = perf::loadElement(impl_->dt, got);
  return a == 0 && b == 0;
}

std::string ReduceData::format(const unsigned char* p) const { return formatElement(impl_->dt, p); }

void ReduceData::scalar(int rank, unsigned char* out) const {
  const Impl& m = *impl_;
  const size_t idx = static_cast<size_t>(m.scalarIdx[static_cast<size_t>(rank)]);
  if (isFloatType(m.dt)) {
    perf::storeElement(m.dt, out, floatScalars()[idx]);
  } else {
    storeInt(m.dt, out, static_cast<uint64_t>(m.isSigned ? signedScalars()[idx] : unsignedScalars()[idx]));
  }
}

}  // namespace soak
}  // namespace c4
