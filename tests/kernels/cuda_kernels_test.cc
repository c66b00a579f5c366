// kernels/cuda on a GPU: every dtype x op x count x alignment against the host kernels bit for bit
// (NaN payloads aside), two outputs, in place, scale, divide, copy, stream order and bad arguments.
// Without a GPU the device tests skip (ctest label gpu; scripts/gpu-check.sh runs them on one), and
// CudaRuntime.* checks that the library still loads and answers.
#include "kernels/cuda/cuda_kernels.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "c4comm/types.hpp"
#include "kernels/host/reduce.hpp"
#include "tests/common/not_applicable.hpp"

namespace c4::kernels {
namespace {

constexpr DataType kAllTypes[] = {DataType::kInt8,     DataType::kUint8,      DataType::kInt32,
                                  DataType::kUint32,   DataType::kInt64,      DataType::kUint64,
                                  DataType::kFloat16,  DataType::kFloat32,    DataType::kFloat64,
                                  DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr size_t kCounts[] = {1, 3, 17, 1000, 4099, (size_t{1} << 20) + 7};
constexpr size_t kGuard = 64;  // bytes around every device output that must stay untouched

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

bool isNan(DataType dt, const unsigned char* p) {
  switch (dt) {
    case DataType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return std::isnan(halfToFloat(v));
    }
    case DataType::kBfloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return std::isnan(bf16ToFloat(v));
    }
    case DataType::kFloat8e4m3:
      return std::isnan(fp8e4m3ToFloat(*p));
    case DataType::kFloat8e5m2:
      return std::isnan(fp8e5m2ToFloat(*p));
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return std::isnan(v);
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return std::isnan(v);
    }
    default:
      return false;
  }
}

// Equal bits, or both NaN (a GPU returns its canonical NaN where x86 keeps a payload).
::testing::AssertionResult sameElements(DataType dt, const std::vector<unsigned char>& want,
                                        const std::vector<unsigned char>& got, size_t count) {
  const size_t es = dataTypeSize(dt);
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* w = want.data() + i * es;
    const unsigned char* g = got.data() + i * es;
    if (std::memcmp(w, g, es) == 0 || (isNan(dt, w) && isNan(dt, g))) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << count << " differs";
  }
  return ::testing::AssertionSuccess();
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::deviceCount() == 0)
      C4_NOT_APPLICABLE("no-gpu", "no CUDA GPU here (scripts/gpu-check.sh runs these on one)");
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : allocs_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A device buffer of `bytes` at byte offset `off` from a 256-byte aligned allocation, with kGuard
  // bytes of `fill` on both sides.
  unsigned char* deviceBuffer(size_t bytes, size_t off, unsigned char fill) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + off + 2 * kGuard), cudaSuccess);
    allocs_.push_back(p);
    // Everything on the test's own stream: a non-blocking stream does not wait for the legacy default
    // stream, on which cudaMemset and cudaMemcpy would leave work in flight.
    EXPECT_EQ(cudaMemsetAsync(p, fill, bytes + off + 2 * kGuard, stream_), cudaSuccess);
    return static_cast<unsigned char*>(p) + kGuard + off;
  }
  void upload(unsigned char* d, const std::vector<unsigned char>& h) {
    ASSERT_EQ(cudaMemcpyAsync(d, h.data(), h.size(), cudaMemcpyHostToDevice, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);  // h may go away
  }
  std::vector<unsigned char> download(const unsigned char* d, size_t bytes) {
    std::vector<unsigned char> h(bytes);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), d, bytes, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return h;
  }
  // The guard bytes around [d, d + bytes) still hold `fill`.
  ::testing::AssertionResult guardsIntact(const unsigned char* d, size_t bytes, unsigned char fill) {
    const std::vector<unsigned char> before = download(d - kGuard, kGuard), after = download(d + bytes, kGuard);
    for (size_t i = 0; i < kGuard; ++i)
      if (before[i] != fill || after[i] != fill) return ::testing::AssertionFailure() << "write outside the output";
    return ::testing::AssertionSuccess();
  }
  std::vector<unsigned char> randomBytes(size_t n) {
    std::vector<unsigned char> v(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = rng_();
      std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
    }
    return v;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocs_;
  std::mt19937_64 rng_{20261126};
};

struct Offsets {
  size_t dst, a, b;  // in elements (aligned when all equal)
};

TEST_F(Cuda, ReduceMatchesTheHostKernelsForEveryTypeOpCountAndAlignment) {
  for (DataType dt : kAllTypes) {
    const size_t es = dataTypeSize(dt);
    for (int op = 0; op < 4; ++op) {
      for (size_t count : kCounts) {
        // Large counts once per (dtype, op): aligned; small ones with shared and mismatched offsets.
        const std::vector<Offsets> offs = count > 5000
                                              ? std::vector<Offsets>{{0, 0, 0}}
                                              : std::vector<Offsets>{{0, 0, 0}, {1, 1, 1}, {0, 1, 0}, {3, 0, 2}};
        for (const Offsets& o : offs) {
          const size_t bytes = count * es;
          const std::vector<unsigned char> a = randomBytes(bytes), b = randomBytes(bytes);
          std::vector<unsigned char> want(bytes);
          reduce(want.data(), a.data(), b.data(), count, dt, static_cast<KOp>(op));
          unsigned char* da = deviceBuffer(bytes, o.a * es, 0);
          unsigned char* db = deviceBuffer(bytes, o.b * es, 0);
          unsigned char* dd = deviceBuffer(bytes, o.dst * es, 0x5a);
          upload(da, a);
          upload(db, b);
          ASSERT_EQ(cuda::reduce(dd, da, db, count, dt, static_cast<KOp>(op), stream_), 0);
          CUDA_OK(cudaStreamSynchronize(stream_));
          ASSERT_TRUE(sameElements(dt, want, download(dd, bytes), count))
              << "dtype " << static_cast<int>(dt) << " op " << op << " count " << count << " offsets " << o.dst << "/"
              << o.a << "/" << o.b;
          ASSERT_TRUE(guardsIntact(dd, bytes, 0x5a));
        }
        for (void* p : allocs_) cudaFree(p);
        allocs_.clear();
      }
    }
  }
}

TEST_F(Cuda, ReduceCopyWritesBothOutputsAndReduceRunsInPlace) {
  for (DataType dt : {DataType::kFloat32, DataType::kBfloat16, DataType::kInt64, DataType::kFloat8e4m3}) {
    const size_t es = dataTypeSize(dt), count = 300001, bytes = count * es;
    const std::vector<unsigned char> a = randomBytes(bytes), b = randomBytes(bytes);
    std::vector<unsigned char> want(bytes);
    reduce(want.data(), a.data(), b.data(), count, dt, KOp::kSum);
    unsigned char* da = deviceBuffer(bytes, 0, 0);
    unsigned char* db = deviceBuffer(bytes, 0, 0);
    unsigned char* d0 = deviceBuffer(bytes, 0, 0x11);
    unsigned char* d1 = deviceBuffer(bytes, es, 0x22);  // the second output at another alignment
    upload(da, a);
    upload(db, b);
    ASSERT_EQ(cuda::reduceCopy(d0, d1, da, db, count, dt, KOp::kSum, stream_), 0);
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_TRUE(sameElements(dt, want, download(d0, bytes), count));
    EXPECT_TRUE(sameElements(dt, want, download(d1, bytes), count));
    EXPECT_TRUE(guardsIntact(d0, bytes, 0x11));
    EXPECT_TRUE(guardsIntact(d1, bytes, 0x22));
    // In place: a = a + b.
    ASSERT_EQ(cuda::reduce(da, da, db, count, dt, KOp::kSum, stream_), 0);
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_TRUE(sameElements(dt, want, download(da, bytes), count));
  }
}

TEST_F(Cuda, ScaleAndDivideMatchTheHostKernels) {
  for (DataType dt : kAllTypes) {
    const size_t es = dataTypeSize(dt);
    for (size_t count : {size_t{5}, size_t{100003}}) {
      const size_t bytes = count * es;
      const std::vector<unsigned char> x = randomBytes(bytes), s = randomBytes(8);
      unsigned char* dx = deviceBuffer(bytes, 0, 0);
      unsigned char* dd = deviceBuffer(bytes, 1 * es, 0x77);
      upload(dx, x);
      std::vector<unsigned char> want(bytes);
      scale(want.data(), x.data(), s.data(), count, dt);
      ASSERT_EQ(cuda::scale(dd, dx, s.data(), count, dt, stream_), 0);
      CUDA_OK(cudaStreamSynchronize(stream_));
      ASSERT_TRUE(sameElements(dt, want, download(dd, bytes), count)) << "scale dtype " << static_cast<int>(dt);
      for (int divisor : {3, -1, 8, 0}) {
        if (divisor == 0 && isFloatType(dt)) continue;
        divide(want.data(), x.data(), count, dt, divisor);
        ASSERT_EQ(cuda::divide(dd, dx, count, dt, divisor, stream_), 0);
        CUDA_OK(cudaStreamSynchronize(stream_));
        ASSERT_TRUE(sameElements(dt, want, download(dd, bytes), count))
            << "divide by " << divisor << ", dtype " << static_cast<int>(dt);
      }
      ASSERT_TRUE(guardsIntact(dd, bytes, 0x77));
    }
  }
}

TEST_F(Cuda, CopyAnySizeAndAlignment) {
  const size_t sizes[] = {1, 15, 16, 17, 4099, (size_t{1} << 24) + 5};
  const std::pair<size_t, size_t> offs[] = {{0, 0}, {3, 3}, {1, 2}, {0, 8}};
  for (size_t bytes : sizes) {
    for (auto [od, os] : offs) {
      const std::vector<unsigned char> src = randomBytes(bytes);
      unsigned char* ds = deviceBuffer(bytes, os, 0);
      unsigned char* dd = deviceBuffer(bytes, od, 0x33);
      upload(ds, src);
      ASSERT_EQ(cuda::copy(dd, ds, bytes, stream_), 0);
      CUDA_OK(cudaStreamSynchronize(stream_));
      ASSERT_EQ(download(dd, bytes), src) << bytes << " bytes, offsets " << od << "/" << os;
      ASSERT_TRUE(guardsIntact(dd, bytes, 0x33));
    }
  }
}

// Work on one stream runs in order: the kernels see what was enqueued before them, and what is
// enqueued after sees their results, with no host synchronization in between.
TEST_F(Cuda, KernelsFollowTheirStreamsOrder) {
  const size_t count = size_t{1} << 22, bytes = count * 4;
  unsigned char* acc = deviceBuffer(bytes, 0, 0);
  unsigned char* one = deviceBuffer(bytes, 0, 0);
  std::vector<int32_t> ones(count, 1);
  CUDA_OK(cudaMemsetAsync(acc, 0, bytes, stream_));
  CUDA_OK(cudaMemcpyAsync(one, ones.data(), bytes, cudaMemcpyHostToDevice, stream_));
  constexpr int kSteps = 50;
  for (int i = 0; i < kSteps; ++i)
    ASSERT_EQ(cuda::reduce(acc, acc, one, count, DataType::kInt32, KOp::kSum, stream_), 0);
  std::vector<int32_t> got(count);
  CUDA_OK(cudaMemcpyAsync(got.data(), acc, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], kSteps) << "element " << i;
}

TEST_F(Cuda, BadArgumentsAreRefusedAndNothingRuns) {
  unsigned char* d = deviceBuffer(64, 0, 0x44);
  EXPECT_EQ(cuda::reduce(d, d, d, 16, static_cast<DataType>(12), KOp::kSum, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::reduce(d, d, d, 16, DataType::kFloat32, static_cast<KOp>(4), stream_), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::scale(d, d, nullptr, 16, DataType::kFloat32, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::reduce(nullptr, nullptr, nullptr, 0, DataType::kFloat32, KOp::kSum, stream_), 0);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(guardsIntact(d, 64, 0x44));
  const std::vector<unsigned char> still = download(d, 64);
  for (unsigned char c : still) ASSERT_EQ(c, 0x44);
}

// Runs everywhere: the statically linked CUDA runtime loads the driver at first use, so a host
// without one (CI) gets "no device", not a crash, and the kernels' entry points fail cleanly.
TEST(CudaRuntime, AHostWithoutAGpuGetsErrorsNotCrashes) {
  const int n = cuda::deviceCount();
  ASSERT_GE(n, 0);
  if (n > 0) C4_NOT_APPLICABLE("has-gpu", "this host has " << n << " GPU(s); the no-GPU path runs in CI");
  unsigned char host[64] = {};
  const cuda::Err e = cuda::reduce(host, host, host, 16, DataType::kFloat32, KOp::kSum, nullptr);
  EXPECT_NE(e, 0);
  EXPECT_NE(std::string(cuda::errorString(e)), "");
}

}  // namespace
}  // namespace c4::kernels
