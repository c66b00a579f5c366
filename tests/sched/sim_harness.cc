#include "sim_harness.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "common/status.hpp"

namespace c4::sched::test {
namespace {

template <typename T>
T applyOp(RedOp op, T a, T b) {
  switch (op) {
    case RedOp::kSum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      } else {
        return a + b;
      }
    case RedOp::kProd:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      } else {
        return a * b;
      }
    case RedOp::kMax:
      return a > b ? a : b;
    case RedOp::kMin:
      return a < b ? a : b;
    default:
      return a;
  }
}

template <typename T>
void reduceT(RedOp op, void* dst, const void* a, const void* b, size_t bytes) {
  const size_t n = bytes / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, static_cast<const char*>(a) + i * sizeof(T), sizeof(T));
    std::memcpy(&y, static_cast<const char*>(b) + i * sizeof(T), sizeof(T));
    T z = applyOp(op, x, y);
    std::memcpy(static_cast<char*>(dst) + i * sizeof(T), &z, sizeof(T));
  }
}

void fillInput(const CaseSpec& c, std::mt19937_64& rng, std::vector<uint8_t>* buf) {
  const size_t esz = dataTypeSize(c.dtype), n = buf->size() / esz;
  uint8_t* p = buf->data();
  for (size_t i = 0; i < n; ++i) {
    switch (c.dtype) {
      case DataType::kInt32: {
        int32_t v = static_cast<int32_t>(rng() % 101) - 50;
        std::memcpy(p + i * esz, &v, esz);
        break;
      }
      case DataType::kInt64: {
        int64_t v = static_cast<int64_t>(rng() % 101) - 50;
        if (c.op == RedOp::kProd) v = static_cast<int64_t>(rng() % 2000001) - 1000000;
        std::memcpy(p + i * esz, &v, esz);
        break;
      }
      case DataType::kFloat32: {
        float v;
        if (!c.exactValues) {
          v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
        } else if (c.op == RedOp::kSum) {
          v = static_cast<float>(static_cast<int>(rng() % 17) - 8);
        } else if (c.op == RedOp::kProd) {
          static const float kVals[] = {-2.0f, -1.0f, -0.5f, 0.5f, 1.0f, 2.0f};
          v = kVals[rng() % 6];
        } else {
          v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
        }
        std::memcpy(p + i * esz, &v, esz);
        break;
      }
      default:
        for (size_t b = 0; b < esz; ++b) p[i * esz + b] = static_cast<uint8_t>(rng());
        break;
    }
  }
}

}  // namespace

std::string describe(const CaseSpec& c) {
  return strFormat("%s/%s n=%d count=%zu chunk=%zu %s root=%d %s %s seed=%llu", collName(c.coll), algoName(c.algo),
                   c.nranks, c.count, c.chunkBytes, c.inPlace ? "in-place" : "out-of-place", c.root,
                   dataTypeName(c.dtype), redOpName(c.op), static_cast<unsigned long long>(c.seed));
}

ReduceFn makeReduce(DataType dt, RedOp op) {
  switch (dt) {
    case DataType::kInt32:
      return [op](void* d, const void* a, const void* b, size_t n) { reduceT<int32_t>(op, d, a, b, n); };
    case DataType::kInt64:
      return [op](void* d, const void* a, const void* b, size_t n) { reduceT<int64_t>(op, d, a, b, n); };
    case DataType::kFloat32:
      return [op](void* d, const void* a, const void* b, size_t n) { reduceT<float>(op, d, a, b, n); };
    default:
      return ReduceFn();
  }
}

bool hasInPlace(Coll c) { return c != Coll::kAlltoAll; }
bool isRooted(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}
bool isReducing(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce; }

::testing::AssertionResult runCase(const CaseSpec& c, SimStats* stats) {
  const int n = c.nranks;
  const size_t esz = dataTypeSize(c.dtype);
  const size_t blockBytes = c.count * esz;
  std::vector<Schedule> scheds(n);
  std::vector<CollArgs> args(n);
  for (int r = 0; r < n; ++r) {
    CollArgs& a = args[r];
    a.coll = c.coll;
    a.rank = r;
    a.nranks = n;
    a.count = c.count;
    a.dtype = c.dtype;
    a.root = c.root;
    a.reduces = isReducing(c.coll);
    a.chunkBytes = c.chunkBytes;
    a.hostOf = c.hostOf;
    a.aliased = c.planAliased >= 0 ? c.planAliased != 0 : c.inPlace && hasInPlace(c.coll);
    Result<Schedule> s = generate(c.algo, a);
    if (!s.isOk())
      return ::testing::AssertionFailure() << describe(c) << ": generate failed: " << s.status().toString();
    scheds[r] = s.take();
  }
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 12345);
  std::vector<std::vector<uint8_t>> in(n), inStore(n), outStore(n);
  std::vector<SimBuffers> bufs(n);
  for (int r = 0; r < n; ++r) {
    const size_t inB = inputBytes(args[r]), outB = outputBytes(args[r]);
    in[r].resize(inB);
    fillInput(c, rng, &in[r]);
    SimBuffers& sb = bufs[r];
    sb.inputBytes = inB;
    sb.outputBytes = outB;
    const bool alias = c.inPlace && hasInPlace(c.coll) && inB > 0 && outB > 0;
    if (alias && outB >= inB) {
      // Output holds input: same pointer (AllReduce, Broadcast, Reduce) or output + rank*count.
      outStore[r].assign(outB, 0xA5);
      const size_t off = outB == inB ? 0 : static_cast<size_t>(r) * blockBytes;
      std::memcpy(outStore[r].data() + off, in[r].data(), inB);
      sb.output = outStore[r].data();
      sb.input = outStore[r].data() + off;
    } else if (alias) {
      // Input holds output: output == input + rank*count (ReduceScatter, Scatter).
      inStore[r] = in[r];
      sb.input = inStore[r].data();
      sb.output = inStore[r].data() + static_cast<size_t>(r) * blockBytes;
    } else {
      inStore[r] = in[r];
      outStore[r].assign(outB, 0xA5);
      sb.input = inB > 0 ? inStore[r].data() : nullptr;
      sb.output = outB > 0 ? outStore[r].data() : nullptr;
    }
  }
  const ReduceFn reduce = makeReduce(c.dtype, c.op);
  SimOptions opts;
  opts.seed = c.seed;
  Status st = simulate(scheds, bufs, reduce, opts, stats);
  if (!st.isOk()) return ::testing::AssertionFailure() << describe(c) << ": " << st.toString();

  // Reference results.
  auto reduceAll = [&](size_t off, size_t bytes) {
    std::vector<uint8_t> acc(in[0].begin() + off, in[0].begin() + off + bytes);
    for (int q = 1; q < n; ++q) reduce(acc.data(), acc.data(), in[q].data() + off, bytes);
    return acc;
  };
  std::vector<std::vector<uint8_t>> expect(n);
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t>& e = expect[r];
    switch (c.coll) {
      case Coll::kAllReduce:
        e = reduceAll(0, blockBytes);
        break;
      case Coll::kReduce:
        if (r == c.root) e = reduceAll(0, blockBytes);
        break;
      case Coll::kReduceScatter:
        e = reduceAll(static_cast<size_t>(r) * blockBytes, blockBytes);
        break;
      case Coll::kBroadcast:
        e = in[c.root];
        break;
      case Coll::kAllGather:
        for (int q = 0; q < n; ++q) e.insert(e.end(), in[q].begin(), in[q].end());
        break;
      case Coll::kGather:
        if (r == c.root) {
          for (int q = 0; q < n; ++q) e.insert(e.end(), in[q].begin(), in[q].end());
        }
        break;
      case Coll::kScatter: {
        auto b = in[c.root].begin() + static_cast<std::ptrdiff_t>(r * blockBytes);
        e.assign(b, b + static_cast<std::ptrdiff_t>(blockBytes));
        break;
      }
      case Coll::kAlltoAll:
        for (int q = 0; q < n; ++q) {
          auto b = in[q].begin() + static_cast<std::ptrdiff_t>(r * blockBytes);
          e.insert(e.end(), b, b + static_cast<std::ptrdiff_t>(blockBytes));
        }
        break;
      default:
        return ::testing::AssertionFailure() << "unexpected collective";
    }
    if (e.size() != bufs[r].outputBytes) {
      return ::testing::AssertionFailure() << describe(c) << ": rank " << r << " reference has " << e.size()
                                           << " bytes, output " << bufs[r].outputBytes;
    }
    const uint8_t* got = static_cast<const uint8_t*>(bufs[r].output);
    if (c.exactValues || c.dtype != DataType::kFloat32) {
      for (size_t i = 0; i < e.size(); ++i) {
        if (got[i] != e[i]) {
          return ::testing::AssertionFailure()
                 << describe(c) << ": rank " << r << " output element " << i / esz << " differs from the reference";
        }
      }
    } else {
      for (size_t i = 0; i < e.size() / 4; ++i) {
        float g, x;
        std::memcpy(&g, got + 4 * i, 4);
        std::memcpy(&x, e.data() + 4 * i, 4);
        if (!(std::fabs(g - x) <= 1e-4f * (1.0f + std::fabs(x)))) {
          return ::testing::AssertionFailure()
                 << describe(c) << ": rank " << r << " output element " << i << " is " << g << ", reference " << x;
        }
      }
    }
    // Out of place, the caller's input must be left alone.
    if (!inStore[r].empty() && bufs[r].input == inStore[r].data() && !(c.inPlace && hasInPlace(c.coll))) {
      if (inStore[r] != in[r])
        return ::testing::AssertionFailure() << describe(c) << ": rank " << r << " input modified";
    }
  }
  if (c.coll == Coll::kAllReduce && blockBytes > 0) {
    for (int r = 1; r < n; ++r) {
      if (std::memcmp(bufs[r].output, bufs[0].output, blockBytes) != 0) {
        return ::testing::AssertionFailure() << describe(c) << ": rank " << r << " result differs bitwise from rank 0";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace c4::sched::test
