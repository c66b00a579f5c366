// c4-kernels-bench: host reduction kernels against a plain scalar loop and against this machine's
// single-core memory bandwidth (STREAM-style add/triad and memcpy), in and beyond the caches.
//
//   c4-kernels-bench --benchmark_min_time=0.2
//
// bytes_per_second counts what the kernel must move: reduce and STREAM add/triad 3 arrays (2 reads,
// 1 write), copy and memcpy 2 (1 read, 1 write). Write-allocate traffic is not counted, as in STREAM.
// Names: reduce/<dtype>/<op>/<isa>/<bytes per array>; "c4" is the dispatched ISA, "scalar" the
// plain scalar loop (the library's scalar table).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/types.hpp"
#include "kernels/host/reduce.hpp"

namespace {

using c4::DataType;
using c4::kernels::KOp;

constexpr size_t kSmall = size_t{64} << 10;   // fits in L1/L2
constexpr size_t kLarge = size_t{256} << 20;  // 8x the 32 MiB L3

// Three page-aligned arrays of kLarge bytes shared by every benchmark (allocated once).
struct Arrays {
  Arrays() {
    for (auto*& p : ptr) {
      p = static_cast<uint8_t*>(std::aligned_alloc(4096, kLarge));
      if (p == nullptr) std::abort();
      std::memset(p, 0, kLarge);  // fault the pages in before timing
    }
  }
  uint8_t* ptr[3];
};

Arrays& arrays() {
  static Arrays a;
  return a;
}

// Small finite values of each type, so that float kernels never see NaN, inf or subnormals.
void fillValues(uint8_t* p, size_t bytes, DataType dt) {
  const size_t size = c4::dataTypeSize(dt);
  const size_t n = bytes / size;
  for (size_t i = 0; i < n; ++i) {
    const float f = 1.0f + static_cast<float>(i % 7) * 0.125f;
    uint64_t v = 0;
    switch (dt) {
      case DataType::kFloat16:
        v = c4::kernels::floatToHalf(f);
        break;
      case DataType::kBfloat16:
        v = c4::kernels::floatToBf16(f);
        break;
      case DataType::kFloat8e4m3:
        v = c4::kernels::floatToFp8e4m3(f);
        break;
      case DataType::kFloat8e5m2:
        v = c4::kernels::floatToFp8e5m2(f);
        break;
      case DataType::kFloat32:
        std::memcpy(&v, &f, 4);
        break;
      case DataType::kFloat64: {
        const double d = f;
        std::memcpy(&v, &d, 8);
        break;
      }
      default:
        v = 1 + i % 7;
        break;
    }
    std::memcpy(p + i * size, &v, size);
  }
}

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

void bmReduce(benchmark::State& state, DataType dt, KOp op, const char* isa, size_t bytes) {
  if (!c4::kernels::setIsaForTesting(isa)) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  Arrays& a = arrays();
  fillValues(a.ptr[0], bytes, dt);
  fillValues(a.ptr[1], bytes, dt);
  const size_t count = bytes / c4::dataTypeSize(dt);
  state.SetLabel(c4::kernels::isaName());
  for (auto _ : state) {
    c4::kernels::reduce(a.ptr[2], a.ptr[0], a.ptr[1], count, dt, op);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * static_cast<int64_t>(bytes));
  c4::kernels::setIsaForTesting("auto");
}

// STREAM add: c = a + b (3 arrays).
void bmStreamAdd(benchmark::State& state, size_t bytes) {
  Arrays& a = arrays();
  fillValues(a.ptr[0], bytes, DataType::kFloat32);
  fillValues(a.ptr[1], bytes, DataType::kFloat32);
  const float* __restrict x = reinterpret_cast<const float*>(a.ptr[0]);
  const float* __restrict y = reinterpret_cast<const float*>(a.ptr[1]);
  float* __restrict z = reinterpret_cast<float*>(a.ptr[2]);
  const size_t n = bytes / sizeof(float);
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * static_cast<int64_t>(bytes));
}

// STREAM triad: c = a + s * b (3 arrays).
void bmStreamTriad(benchmark::State& state, size_t bytes) {
  Arrays& a = arrays();
  fillValues(a.ptr[0], bytes, DataType::kFloat32);
  fillValues(a.ptr[1], bytes, DataType::kFloat32);
  const float* __restrict x = reinterpret_cast<const float*>(a.ptr[0]);
  const float* __restrict y = reinterpret_cast<const float*>(a.ptr[1]);
  float* __restrict z = reinterpret_cast<float*>(a.ptr[2]);
  const size_t n = bytes / sizeof(float);
  const float s = 3.0f;
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) z[i] = x[i] + s * y[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * static_cast<int64_t>(bytes));
}

void bmMemcpy(benchmark::State& state, size_t bytes) {
  Arrays& a = arrays();
  for (auto _ : state) {
    std::memcpy(a.ptr[2], a.ptr[0], bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(bytes));
}

// c4 copy with non-temporal stores forced on (nt) or off (temporal, i.e. memcpy).
void bmCopy(benchmark::State& state, size_t bytes, bool nonTemporal) {
  Arrays& a = arrays();
  const size_t saved = c4::kernels::copyNonTemporalThreshold();
  c4::kernels::setCopyNonTemporalThresholdForTesting(nonTemporal ? 1 : SIZE_MAX);
  for (auto _ : state) {
    c4::kernels::copy(a.ptr[2], a.ptr[0], bytes);
    benchmark::ClobberMemory();
  }
  c4::kernels::setCopyNonTemporalThresholdForTesting(saved);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(bytes));
}

std::string sizeName(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

void registerAll() {
  const DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
                             DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
                             DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
  for (size_t bytes : {kSmall, kLarge}) {
    const std::string sz = sizeName(bytes);
    benchmark::RegisterBenchmark(("stream_add/float/" + sz).c_str(), bmStreamAdd, bytes);
    benchmark::RegisterBenchmark(("stream_triad/float/" + sz).c_str(), bmStreamTriad, bytes);
    benchmark::RegisterBenchmark(("memcpy/" + sz).c_str(), bmMemcpy, bytes);
    for (DataType dt : kTypes) {
      const bool fp8 = dt == DataType::kFloat8e4m3 || dt == DataType::kFloat8e5m2;
      const bool allOps = dt == DataType::kFloat32 || dt == DataType::kInt32 || fp8;
      for (KOp op : {KOp::kSum, KOp::kProd, KOp::kMax, KOp::kMin}) {
        if (op != KOp::kSum && !allOps) continue;
        // fp8 has its own code per ISA level (and a VBMI-only decode); the others show the best.
        for (const char* isa : {"auto", "scalar", "avx2", "avx512novbmi"}) {
          if (!fp8 && std::strcmp(isa, "auto") != 0 && std::strcmp(isa, "scalar") != 0) continue;
          if (fp8 && op != KOp::kSum && std::strcmp(isa, "auto") != 0) continue;
          const std::string name = std::string("reduce/") + c4::dataTypeName(dt) + "/" + opName(op) + "/" +
                                   (std::strcmp(isa, "auto") == 0 ? "c4" : isa) + "/" + sz;
          benchmark::RegisterBenchmark(name.c_str(), bmReduce, dt, op, isa, bytes);
        }
      }
    }
  }
  // Where non-temporal stores start to pay off for copy().
  for (size_t bytes : {size_t{1} << 20, size_t{8} << 20, size_t{32} << 20, size_t{64} << 20, kLarge}) {
    const std::string sz = sizeName(bytes);
    benchmark::RegisterBenchmark(("copy/temporal/" + sz).c_str(), bmCopy, bytes, false);
    benchmark::RegisterBenchmark(("copy/nontemporal/" + sz).c_str(), bmCopy, bytes, true);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  registerAll();
  benchmark::AddCustomContext("c4_kernels_isa", c4::kernels::isaName());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
