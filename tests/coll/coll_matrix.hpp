// The collective test matrix run by one rank: every collective x dtype x op x count x in/out of
// place, checked against a host reference. Reductions use small integer-valued inputs so that
// sums, products, max and min are exact in every type (fp8 included); Avg and PreMulSum are
// compared with a per-type tolerance (see tolerance()). Data-movement collectives compare bytes.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "kernels/host/reduce.hpp"
#include "tests/coll/harness.hpp"

namespace c4test {

using c4::Coll;
using c4::DataType;
using c4::RedOp;

constexpr DataType kAllTypes[] = {DataType::kInt8,     DataType::kUint8,      DataType::kInt32,
                                  DataType::kUint32,   DataType::kInt64,      DataType::kUint64,
                                  DataType::kFloat16,  DataType::kFloat32,    DataType::kFloat64,
                                  DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};

inline bool isUnsigned(DataType dt) {
  return dt == DataType::kUint8 || dt == DataType::kUint32 || dt == DataType::kUint64;
}

/// Stores a (small, integer-valued or scaled) number as one element of dt.
inline void storeValue(DataType dt, void* p, double v) {
  switch (dt) {
    case DataType::kInt8:
      *static_cast<int8_t*>(p) = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case DataType::kUint8:
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case DataType::kInt32:
      *static_cast<int32_t*>(p) = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case DataType::kUint32:
      *static_cast<uint32_t*>(p) = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case DataType::kInt64:
      *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case DataType::kUint64:
      *static_cast<uint64_t*>(p) = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    case DataType::kFloat16:
      *static_cast<uint16_t*>(p) = c4::kernels::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      *static_cast<uint16_t*>(p) = c4::kernels::floatToBf16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      *static_cast<float*>(p) = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      *static_cast<double*>(p) = v;
      break;
    case DataType::kFloat8e4m3:
      *static_cast<uint8_t*>(p) = c4::kernels::floatToFp8e4m3(static_cast<float>(v));
      break;
    case DataType::kFloat8e5m2:
      *static_cast<uint8_t*>(p) = c4::kernels::floatToFp8e5m2(static_cast<float>(v));
      break;
  }
}

inline double loadValue(DataType dt, const void* p) {
  switch (dt) {
    case DataType::kInt8:
      return *static_cast<const int8_t*>(p);
    case DataType::kUint8:
      return *static_cast<const uint8_t*>(p);
    case DataType::kInt32:
      return *static_cast<const int32_t*>(p);
    case DataType::kUint32:
      return *static_cast<const uint32_t*>(p);
    case DataType::kInt64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case DataType::kUint64:
      return static_cast<double>(*static_cast<const uint64_t*>(p));
    case DataType::kFloat16:
      return c4::kernels::halfToFloat(*static_cast<const uint16_t*>(p));
    case DataType::kBfloat16:
      return c4::kernels::bf16ToFloat(*static_cast<const uint16_t*>(p));
    case DataType::kFloat32:
      return *static_cast<const float*>(p);
    case DataType::kFloat64:
      return *static_cast<const double*>(p);
    case DataType::kFloat8e4m3:
      return c4::kernels::fp8e4m3ToFloat(*static_cast<const uint8_t*>(p));
    case DataType::kFloat8e5m2:
      return c4::kernels::fp8e5m2ToFloat(*static_cast<const uint8_t*>(p));
  }
  return 0;
}

/// Relative tolerance for results that are not exact (Avg, PreMulSum).
inline double tolerance(DataType dt) {
  switch (dt) {
    case DataType::kFloat64:
      return 1e-12;
    case DataType::kFloat32:
      return 1e-6;
    case DataType::kFloat16:
      return 2e-3;
    case DataType::kBfloat16:
      return 1.6e-2;
    case DataType::kFloat8e4m3:
      return 0.13;
    case DataType::kFloat8e5m2:
      return 0.26;
    default:
      return 0;  // integers: exact
  }
}

/// Input value of `rank` at element i for reduction op `op` (small integers, exact everywhere).
inline double inputValue(RedOp op, DataType dt, int rank, size_t i) {
  bool u = isUnsigned(dt);
  switch (op) {
    case RedOp::kProd: {
      int k = static_cast<int>((static_cast<size_t>(rank) + i) % 3);
      return k == 0 ? 1 : k == 1 ? 2 : (u ? 1 : -1);
    }
    case RedOp::kMax:
    case RedOp::kMin: {
      int v = static_cast<int>((static_cast<size_t>(rank) * 31 + i * 17) % 11);
      return u ? v : v - 5;
    }
    default: {
      int v = static_cast<int>((static_cast<size_t>(rank) * 7 + i * 13) % 3);
      return u ? v : v - 1;
    }
  }
}

/// Reference of a reduction over ranks at element i, rounded as the type stores it.
inline double reference(RedOp op, DataType dt, int nranks, size_t i, const std::vector<double>& scalars) {
  bool premul = static_cast<int>(op) >= c4::kNumBuiltinOps;
  double acc = 0;
  for (int r = 0; r < nranks; ++r) {
    double v = inputValue(premul ? RedOp::kSum : op, dt, r, i);
    if (premul) v *= scalars[static_cast<size_t>(r)];
    if (r == 0) {
      acc = v;
      continue;
    }
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
  if (op == RedOp::kAvg) acc = c4::isFloatType(dt) ? acc / nranks : std::trunc(acc / nranks);
  // Integer products wrap like the hardware: store through the type and read back.
  unsigned char tmp[8];
  storeValue(dt, tmp, acc);
  return loadValue(dt, tmp);
}

/// Distinct byte pattern for data-movement checks: rank r, byte j of its buffer.
inline unsigned char patternByte(int r, size_t j) {
  return static_cast<unsigned char>((static_cast<size_t>(r) * 131 + j * 7 + (j >> 8) * 3 + 1) & 0xff);
}

/// C4_TEST_QUICK=1 (the sanitizer pass of scripts/test.sh): the same cases, with the counts
/// trimmed to {0, 1, 1009} plus one 256 KiB size, enough to cross every protocol threshold.
inline bool quickMatrix() {
  const char* q = getenv("C4_TEST_QUICK");
  return q && *q && *q != '0';
}

/// Runs the matrix on device buffers (tests/coll/cuda_coll_test.cc): the runner fills and checks host
/// buffers as always; the mirror gives each a device copy, uploaded on `stream` before the call and
/// downloaded on the same stream after it, with no wait between (the call must keep stream order).
struct DeviceMirror {
  virtual ~DeviceMirror() = default;
  /// A device copy of [host, host + bytes), uploaded on the stream; its address.
  virtual unsigned char* upload(const unsigned char* host, size_t bytes) = 0;
  /// Enqueues the copy of a device buffer back into host memory on the stream.
  virtual void download(unsigned char* host, const unsigned char* device, size_t bytes) = 0;
  /// Waits for the stream; false (with a reason) when CUDA failed.
  virtual bool sync(std::string* why) = 0;
  /// Frees the device copies made since the last release.
  virtual void release() = 0;
  void* stream = nullptr;
};

struct MatrixOptions {
  std::vector<size_t> counts = quickMatrix() ? std::vector<size_t>{0, 1, 1009} : std::vector<size_t>{0, 1, 1009, 70001};
  size_t bigBytes = quickMatrix() ? (256u << 10) : (3u << 20);  // one large size, for a subset (see run())
  bool allTypesForMovement = true;
  /// Buffers from c4::memAlloc (shareable: the zero-copy path runs where every rank has them):
  /// 0 none, 1 every rank, 2 even ranks only (so every call falls back to messages).
  int shareable = 0;
  /// Also check how many calls ran zero-copy (trace events): every eligible call when every rank
  /// is shareable, none otherwise. The test turns one-shot off, so every nonzero count counts.
  bool checkZeroCopy = false;
  /// Device buffers and the mirror's stream for every call (null: host buffers).
  DeviceMirror* device = nullptr;
  /// With device buffers: every call that has a device zero-copy form (CUDA IPC; not Avg,
  /// PreMulSum or in-place AlltoAll) counts for checkZeroCopy.
  bool deviceZeroCopy = false;

  /// Applies the quick trim to options a test set itself.
  MatrixOptions& trimmedIfQuick() {
    if (quickMatrix()) {
      counts.erase(std::remove_if(counts.begin(), counts.end(), [](size_t c) { return c > 1009; }), counts.end());
      bigBytes = std::min<size_t>(bigBytes, 256u << 10);
    }
    return *this;
  }
};

class MatrixRunner {
 public:
  MatrixRunner(c4::Comm* comm, int rank, int nranks) : comm_(comm), rank_(rank), n_(nranks) {}

  Failures run(const MatrixOptions& opt);
  /// Calls that should have run zero-copy so far (MatrixOptions::checkZeroCopy).
  size_t zeroCopyExpected() const { return zeroCopyExpected_; }

  /// Runs one case; records failures (capped) and returns false on failure.
  bool runCase(Coll coll, DataType dt, RedOp op, size_t count, bool inPlace, int root);

 private:
  void fail(const std::string& what);
  std::string caseName(Coll coll, DataType dt, RedOp op, size_t count, bool inPlace, int root) const;

  c4::Comm* comm_;
  int rank_, n_;
  MatrixOptions opt_;
  size_t zeroCopyExpected_ = 0;
  Failures failures_;
  int failCount_ = 0;
};

}  // namespace c4test
