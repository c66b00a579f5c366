// Collectives on CUDA device buffers (ctest label gpu; skipped without a GPU, run by
// scripts/gpu-check.sh on one): the whole collective matrix with 1, 2 and 4 ranks sharing one GPU
// (NVIDIA's NCCL refuses that; c4comm supports it), each call between an upload and a download on
// the same stream with no wait between; many calls in flight on one stream; the host not blocked
// by a busy stream; non-blocking communicators; buffers of mixed spaces refused; windows on device
// memory and their one-sided calls in stream order.
//
// The test process itself never touches CUDA (a CUDA context does not survive fork): the ranks are
// forked processes, and a GPU is detected by its device file.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/trace.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "tests/coll/coll_matrix.hpp"
#include "tests/coll/harness.hpp"
#include "tests/common/not_applicable.hpp"

namespace {

using c4test::Failures;

using c4test::haveGpuDevice;

#define SKIP_WITHOUT_GPU() \
  if (!haveGpuDevice())    \
  C4_NOT_APPLICABLE("no-gpu", "no CUDA GPU here (/dev/nvidia0); scripts/gpu-check.sh runs these on one")

std::string cudaWhy(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

// Device copies come from one arena, reset by release(): thousands of cases, and cudaMalloc/cudaFree
// (which synchronizes the device) for each would dominate the run.
class CudaMirror : public c4test::DeviceMirror {
 public:
  static constexpr size_t kArena = size_t{256} << 20;
  explicit CudaMirror(cudaStream_t s) {
    stream = s;
    if (cudaMalloc(&arena_, kArena) != cudaSuccess) arena_ = nullptr;
  }
  // The arena is not freed: the peers may keep it mapped (C4_CUDA_IPC_CACHE) until the
  // communicator goes, after this mirror, and CUDA leaves freeing an allocation another process has
  // open undefined. The rank's process ends right after (runForked), which frees it.
  ~CudaMirror() override { release(); }
  unsigned char* upload(const unsigned char* host, size_t bytes) override {
    void* d = nullptr;
    cudaError_t e = cudaSuccess;
    const size_t need = (bytes + 255) / 256 * 256 + 256;
    if (arena_ && used_ + need <= kArena) {
      d = static_cast<char*>(arena_) + used_;
      used_ += need;
    } else {
      e = cudaMalloc(&d, bytes ? bytes : 1);
      if (e == cudaSuccess) live_.push_back(d);
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream_());
    if (e != cudaSuccess && error_.empty()) error_ = cudaWhy("upload", e);
    return static_cast<unsigned char*>(d);
  }
  void download(unsigned char* host, const unsigned char* device, size_t bytes) override {
    const cudaError_t e = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_());
    if (e != cudaSuccess && error_.empty()) error_ = cudaWhy("download", e);
  }
  bool sync(std::string* why) override {
    const cudaError_t e = cudaStreamSynchronize(stream_());
    if (e != cudaSuccess && error_.empty()) error_ = cudaWhy("cudaStreamSynchronize", e);
    *why = error_;
    error_.clear();
    return why->empty();
  }
  void release() override {
    for (void* d : live_) cudaFree(d);
    live_.clear();
    used_ = 0;  // the stream was synchronized (sync()) before: nothing reads the arena any more
  }

 private:
  void* arena_ = nullptr;
  size_t used_ = 0;
  cudaStream_t stream_() const { return static_cast<cudaStream_t>(stream); }
  std::vector<void*> live_;
  std::string error_;
};

/// Rank r of `body`: GPU 0 (every rank shares it), a stream, a communicator (waited for when
/// non-blocking); after the body, the communicator and the stream are destroyed.
using RankBody = std::function<Failures(int rank, int n, c4::Comm* comm, cudaStream_t stream)>;
/// Runs in each forked rank before anything else (settings: setenv).
using RankSetup = std::function<void(int rank)>;

Failures asRank(int rank, int n, const c4::UniqueId& id, bool blocking, const RankBody& body, const RankSetup& setup) {
  if (setup) setup(rank);
  cudaStream_t s = nullptr;
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return {cudaWhy("rank setup", e)};
  c4::Config cfg;
  cfg.blocking = blocking ? 1 : 0;
  c4::Comm* comm = nullptr;
  c4::Status st = c4::commInitRank(&comm, n, id, rank, cfg);
  while (st.code() == c4::Code::kInProgress) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    st = c4::commGetAsyncError(comm);
  }
  if (!st.isOk()) return {"commInitRank: " + st.toString()};
  Failures f = body(rank, n, comm, s);
  c4::Status d = c4::commDestroy(comm);
  if (!d.isOk() && d.code() != c4::Code::kInProgress) f.push_back("commDestroy: " + d.toString());
  cudaStreamDestroy(s);
  return f;
}

/// Runs `body` on n forked ranks and expects every one to pass.
void runRanks(int n, bool blocking, const RankBody& body, int timeoutSec = 240, const RankSetup& setup = {}) {
  const auto outs = c4test::runForked(
      n, [&](int rank, int nranks, const c4::UniqueId& id) { return asRank(rank, nranks, id, blocking, body, setup); },
      timeoutSec);
  for (const auto& o : outs) EXPECT_FALSE(o.crashed || !o.detail.empty()) << "rank " << o.rank << ": " << o.detail;
}

/// The collective matrix on device buffers of one rank (tests/coll/coll_matrix.cc). `zeroCopy`:
/// every call with a device zero-copy form must have run on it (trace); `checkZeroCopy` alone: none.
Failures deviceMatrix(int rank, int nranks, c4::Comm* comm, cudaStream_t s, bool zeroCopy = false,
                      bool checkZeroCopy = false) {
  CudaMirror mirror(s);
  c4test::MatrixOptions opt;
  opt.device = &mirror;
  opt.deviceZeroCopy = zeroCopy;
  opt.checkZeroCopy = zeroCopy || checkZeroCopy;
  return c4test::MatrixRunner(comm, rank, nranks).run(opt);
}

class CudaColl : public ::testing::TestWithParam<int> {};

// Every collective x dtype x op x count x in/out of place on device buffers, against the host
// reference (tests/coll/coll_matrix.cc).
TEST_P(CudaColl, MatrixOnDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  runRanks(
      n, true, [](int rank, int nranks, c4::Comm* comm, cudaStream_t s) { return deviceMatrix(rank, nranks, comm, s); },
      600);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaColl, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

// The device zero-copy path (CUDA IPC, docs/cuda.md): one-shot off, so that every call with a
// device form runs on it; the trace must show each of them zero-copy, and every result (and the
// guard bytes around every buffer) must be right. "cached": mappings kept between calls.
class CudaIpc : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CudaIpc, MatrixRunsZeroCopyOnDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  const int n = std::get<0>(GetParam());
  const bool cached = std::get<1>(GetParam());
  runRanks(
      n, true,
      [](int rank, int nranks, c4::Comm* comm, cudaStream_t s) { return deviceMatrix(rank, nranks, comm, s, true); },
      600,
      [cached](int) {
        setenv("C4_ONESHOT_BYTES", "0", 1);
        setenv("C4_TRACE", "op", 1);
        setenv("C4_CUDA_IPC_CACHE", cached ? "16" : "0", 1);
      });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaIpc, ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& i) {
                           return std::to_string(std::get<0>(i.param)) + "ranks" +
                                  (std::get<1>(i.param) ? "Cached" : "MappedPerCall");
                         });

// C4_CUDA_IPC=0 everywhere: every call staged through host memory, as before the zero-copy path.
TEST(CudaIpcOff, MatrixStagedThroughHostMemory) {
  SKIP_WITHOUT_GPU();
  runRanks(
      2, true,
      // None may run zero-copy.
      [](int rank, int nranks, c4::Comm* comm, cudaStream_t s) {
        return deviceMatrix(rank, nranks, comm, s, false, true);
      },
      600,
      [](int) {
        setenv("C4_ONESHOT_BYTES", "0", 1);
        setenv("C4_TRACE", "op", 1);
        setenv("C4_CUDA_IPC", "0", 1);
      });
}

// Pipelined staging (docs/cuda.md): with 64 KiB pieces every larger collective of the matrix runs
// as several staged pieces, each copied back while the next runs; every result and guard byte must
// be right. Then many pipelined calls in flight on
// one stream, and an AllGather and a ReduceScatter in place in 16 pieces (their rows copied 2D).
TEST(CudaPipeline, MatrixInPieces) {
  SKIP_WITHOUT_GPU();
  runRanks(
      3, true,
      [](int rank, int nranks, c4::Comm* comm, cudaStream_t s) -> Failures {
        Failures f = deviceMatrix(rank, nranks, comm, s);
        // 16 pieces of 64 KiB each, 16 calls queued before any wait.
        constexpr size_t kCount = 256 * 1024;
        constexpr int kCalls = 16;
        float* buf = nullptr;
        if (cudaMalloc(&buf, kCalls * kCount * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
        std::vector<float> host(kCalls * kCount);
        for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(rank + i % 13);
        cudaMemcpyAsync(buf, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, s);
        for (int c = 0; c < kCalls; ++c) {
          c4::Status st = c4::allReduce(buf + c * kCount, buf + c * kCount, kCount, c4::DataType::kFloat32,
                                        c4::RedOp::kSum, comm, s);
          if (!st.isOk()) f.push_back("allReduce " + std::to_string(c) + ": " + st.toString());
        }
        cudaMemcpyAsync(host.data(), buf, host.size() * sizeof(float), cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
        for (size_t i = 0; i < host.size() && f.empty(); ++i) {
          const float want = static_cast<float>(3 + 3 * (i % 13));
          if (host[i] != want) f.push_back("element " + std::to_string(i) + " is " + std::to_string(host[i]));
        }
        // In place: AllGather of each rank's block of buf, then ReduceScatter of it.
        const size_t r = static_cast<size_t>(rank), n = static_cast<size_t>(nranks);
        for (size_t i = 0; i < n * kCount; ++i) host[i] = static_cast<float>(i / kCount == r ? r * 7 + i % 11 : -1);
        cudaMemcpyAsync(buf, host.data(), n * kCount * sizeof(float), cudaMemcpyHostToDevice, s);
        c4::Status st = c4::allGather(buf + r * kCount, buf, kCount, c4::DataType::kFloat32, comm, s);
        if (st.isOk())
          st = c4::reduceScatter(buf, buf + r * kCount, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
        if (!st.isOk()) f.push_back("allGather/reduceScatter in place: " + st.toString());
        cudaMemcpyAsync(host.data(), buf, n * kCount * sizeof(float), cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
        for (size_t i = 0; i < n * kCount && f.empty(); ++i) {
          const size_t b = i / kCount;  // block b: rank b's after the AllGather; this rank's: n times it
          const float want = static_cast<float>(b == r ? n * (b * 7 + i % 11) : b * 7 + i % 11);
          if (host[i] != want)
            f.push_back("allGather/reduceScatter element " + std::to_string(i) + " is " + std::to_string(host[i]));
        }
        cudaFree(buf);
        return f;
      },
      600,
      [](int) {
        setenv("C4_CUDA_IPC", "0", 1);
        setenv("C4_CUDA_PIPELINE_BYTES", "65536", 1);
      });
}

// Ranks that cannot all take the device path: the deferred calls copy their inputs to staging
// themselves and run on the host path, with the right results. "pinned": rank 1's buffers are
// pinned host memory (no CUDA IPC); "vmm": rank 1's buffers are stream-ordered pool memory, which
// legacy CUDA IPC cannot export.
class CudaIpcFallback : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaIpcFallback, EveryRankFallsBackAndIsRight) {
  SKIP_WITHOUT_GPU();
  const std::string mode = GetParam();
  runRanks(
      3, true,
      [mode](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
        constexpr size_t kCount = (1 << 20) + 3;
        const size_t bytes = kCount * sizeof(float);
        float* send = nullptr;
        float* recv = nullptr;
        cudaError_t e = cudaSuccess;
        bool pinned = false;
        if (rank == 1 && mode == "pinned") {
          e = cudaHostAlloc(reinterpret_cast<void**>(&send), bytes, cudaHostAllocDefault);
          if (e == cudaSuccess) e = cudaHostAlloc(reinterpret_cast<void**>(&recv), n * bytes, cudaHostAllocDefault);
          pinned = true;
        } else if (rank == 1 && mode == "vmm") {
          void* p = nullptr;
          e = cudaMallocAsync(&p, (n + 1) * bytes, s);  // stream-ordered pool memory: not legacy-IPC capable
          if (e == cudaSuccess) e = cudaStreamSynchronize(s);
          send = static_cast<float*>(p);
          recv = send + kCount;
        } else {
          e = cudaMalloc(&send, bytes);
          if (e == cudaSuccess) e = cudaMalloc(&recv, n * bytes);
        }
        if (e != cudaSuccess) return {cudaWhy("allocation", e)};
        std::vector<float> host(kCount), all(n * kCount);
        for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(rank * 1000 + i % 251);
        cudaMemcpyAsync(send, host.data(), bytes, cudaMemcpyDefault, s);
        Failures f;
        c4::Status st = c4::allReduce(send, recv, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
        if (!st.isOk()) f.push_back("allReduce: " + st.toString());
        st = c4::allGather(send, recv + 0, kCount, c4::DataType::kFloat32, comm, s);
        if (!st.isOk()) f.push_back("allGather: " + st.toString());
        cudaMemcpyAsync(all.data(), recv, n * bytes, cudaMemcpyDefault, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
        for (int r = 0; r < n && f.empty(); ++r)
          for (size_t i = 0; i < kCount; ++i)
            if (all[r * kCount + i] != static_cast<float>(r * 1000 + i % 251)) {
              f.push_back("allGather block " + std::to_string(r) + " element " + std::to_string(i) + " is " +
                          std::to_string(all[r * kCount + i]));
              break;
            }
        // The AllReduce's result was overwritten by the AllGather: run it once more, alone.
        st = c4::allReduce(send, recv, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
        if (!st.isOk()) f.push_back("allReduce: " + st.toString());
        cudaMemcpyAsync(all.data(), recv, bytes, cudaMemcpyDefault, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
        for (size_t i = 0; i < kCount && f.empty(); ++i) {
          const float want = static_cast<float>(3000 + 3 * (i % 251));
          if (all[i] != want) f.push_back("allReduce element " + std::to_string(i) + " is " + std::to_string(all[i]));
        }
        // Every call fell back (rank 1's buffers cannot be shared): none ran on the zero-copy path,
        // and all three ran (the trace, C4_TRACE=op).
        std::vector<c4::trace::Event> events;
        uint64_t dropped = 0;
        st = c4::trace::readEvents(comm, &events, &dropped);
        size_t ops = 0, zeroCopy = 0;
        for (const c4::trace::Event& ev : events) {
          ops += ev.type == c4::trace::EventType::kOp;
          zeroCopy += ev.type == c4::trace::EventType::kOp && ev.algo == c4::trace::kAlgoZeroCopy;
        }
        if (!st.isOk() || ops < 3 || zeroCopy != 0)
          f.push_back("trace: " + st.toString() + ", " + std::to_string(ops) + " calls, " + std::to_string(zeroCopy) +
                      " zero-copy (expected 3 or more, none zero-copy)");
        if (pinned) {
          cudaFreeHost(send);
          cudaFreeHost(recv);
        } else if (rank == 1 && mode == "vmm") {
          cudaFreeAsync(send, s);
          cudaStreamSynchronize(s);
        } else {
          cudaFree(send);
          cudaFree(recv);
        }
        return f;
      },
      240, [](int) { setenv("C4_TRACE", "op", 1); });
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaIpcFallback, ::testing::Values("pinned", "vmm"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Registered device buffers (commRegister): the peers keep their mappings between calls, and drop
// them when the owner deregisters, before the owner frees the memory. Every rank deregisters at
// the same time once (each waits for the others' acknowledgement while acknowledging theirs), then
// rank 1 late; the buffers are then freed and new ones (maybe at the same addresses) are used.
TEST(CudaIpcRegistered, MappingsLiveUntilTheOwnerDeregisters) {
  SKIP_WITHOUT_GPU();
  runRanks(
      3, true,
      [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
        constexpr size_t kCount = 1 << 20;
        Failures f;
        auto roundTrip = [&](float* buf, int calls, const char* what) {
          std::vector<float> host(kCount);
          for (int c = 0; c < calls && f.empty(); ++c) {
            for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(rank + c + i % 5);
            cudaMemcpyAsync(buf, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, s);
            c4::Status st = c4::allReduce(buf, buf, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
            if (!st.isOk()) f.push_back(std::string(what) + ": allReduce: " + st.toString());
            cudaMemcpyAsync(host.data(), buf, kCount * sizeof(float), cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
            for (size_t i = 0; i < kCount; ++i) {
              const float want = static_cast<float>(3 + 3 * (c + static_cast<int>(i % 5)));
              if (host[i] != want) {
                f.push_back(std::string(what) + ": call " + std::to_string(c) + " element " + std::to_string(i) +
                            " is " + std::to_string(host[i]));
                break;
              }
            }
          }
        };
        for (int round = 0; round < 2 && f.empty(); ++round) {
          float* a = nullptr;
          float* b = nullptr;
          if (cudaMalloc(&a, kCount * sizeof(float)) != cudaSuccess ||
              cudaMalloc(&b, kCount * sizeof(float)) != cudaSuccess)
            return {"cudaMalloc"};
          void* ha = nullptr;
          void* hb = nullptr;
          c4::Status st = c4::commRegister(comm, a, kCount * sizeof(float), &ha);
          if (st.isOk()) st = c4::commRegister(comm, b, kCount * sizeof(float), &hb);
          if (!st.isOk()) return {"commRegister: " + st.toString()};
          roundTrip(a, 10, "registered a");
          roundTrip(b, 10, "registered b");
          // Round 1: rank 1 deregisters late; the others wait for it.
          if (round == 1 && rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
          st = c4::commDeregister(comm, ha);
          if (st.isOk()) st = c4::commDeregister(comm, hb);
          if (!st.isOk()) f.push_back("commDeregister: " + st.toString());
          cudaFree(a);
          cudaFree(b);
          // New buffers, not registered (perhaps at the old addresses): mapped afresh for each call.
          float* c = nullptr;
          if (cudaMalloc(&c, kCount * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
          roundTrip(c, 3, "after deregistration");
          cudaFree(c);
        }
        return f;
      },
      300, [](int) { setenv("C4_ONESHOT_BYTES", "0", 1); });
}

// ncclMemAlloc's C++ form gives device memory in a process with a GPU, memFree frees it, and a
// collective on it runs (on the device zero-copy path with 2 ranks).
TEST(CudaMem, AllocPreferDeviceIsDeviceMemory) {
  SKIP_WITHOUT_GPU();
  runRanks(2, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    Failures f;
    void* p = nullptr;
    c4::Status st = c4::memAllocPreferDevice(&p, 4096 * sizeof(int32_t));
    if (!st.isOk()) return {"memAllocPreferDevice: " + st.toString()};
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice)
      f.push_back("memAllocPreferDevice did not return device memory");
    std::vector<int32_t> host(4096, rank + 1);
    cudaMemcpyAsync(p, host.data(), 4096 * sizeof(int32_t), cudaMemcpyHostToDevice, s);
    st = c4::allReduce(p, p, 4096, c4::DataType::kInt32, c4::RedOp::kSum, comm, s);
    if (!st.isOk()) f.push_back("allReduce: " + st.toString());
    cudaMemcpyAsync(host.data(), p, 4096 * sizeof(int32_t), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    if (host[0] != 3 || host[4095] != 3) f.push_back("wrong sum on memAllocPreferDevice memory");
    st = c4::memFree(p);
    if (!st.isOk()) f.push_back("memFree: " + st.toString());
    int32_t* other = nullptr;
    cudaMalloc(&other, 64);
    st = c4::memFree(other);  // not ours: refused, not freed
    if (st.code() != c4::Code::kInvalidArgument) f.push_back("memFree of a plain cudaMalloc pointer: " + st.toString());
    cudaFree(other);
    return f;
  });
}

// Many calls in flight on one stream before anyone waits: each call's staging, ticket and copies
// stay in order, and every result is right.
TEST(CudaCollStream, ManyCallsInFlightOnOneStream) {
  SKIP_WITHOUT_GPU();
  runRanks(2, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    constexpr int kCalls = 64;
    constexpr size_t kCount = 4099;
    std::vector<float*> bufs(kCalls);
    std::vector<float> host(kCount);
    for (int c = 0; c < kCalls; ++c) {
      if (cudaMalloc(&bufs[c], kCount * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
      for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(rank + c + i % 7);
      // Upload, reduce in place, all on the stream: nothing waits until the end.
      cudaMemcpyAsync(bufs[c], host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, s);
      c4::Status st = c4::allReduce(bufs[c], bufs[c], kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
      if (!st.isOk()) return {"allReduce " + std::to_string(c) + ": " + st.toString()};
    }
    Failures f;
    for (int c = 0; c < kCalls && f.empty(); ++c) {
      cudaMemcpyAsync(host.data(), bufs[c], kCount * sizeof(float), cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      for (size_t i = 0; i < kCount; ++i) {
        const float want = static_cast<float>(0 + 1 + 2 * (c + static_cast<int>(i % 7)));
        if (host[i] != want) {
          f.push_back("call " + std::to_string(c) + " element " + std::to_string(i) + ": " + std::to_string(host[i]) +
                      ", expected " + std::to_string(want));
          break;
        }
      }
    }
    for (float* b : bufs) cudaFree(b);
    return f;
  });
}

// A call on a stream that is busy (a kernel waits for the host) returns at once: the host is not
// blocked; the collective runs when the stream gets there.
TEST(CudaCollStream, TheHostIsNotBlockedByABusyStream) {
  SKIP_WITHOUT_GPU();
  runRanks(2, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    unsigned* flag = nullptr;
    float* buf = nullptr;
    constexpr size_t kCount = 1 << 20;
    if (cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(unsigned), cudaHostAllocMapped) != cudaSuccess ||
        cudaMalloc(&buf, kCount * sizeof(float)) != cudaSuccess)
      return {"allocation"};
    *flag = 0;
    std::vector<float> host(kCount, static_cast<float>(rank + 1));
    cudaMemcpyAsync(buf, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, s);
    if (c4::kernels::cuda::waitFlag(flag, 1, s) != 0) return {"waitFlag launch"};
    const auto t0 = std::chrono::steady_clock::now();
    c4::Status st = c4::allReduce(buf, buf, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Failures f;
    if (!st.isOk()) f.push_back("allReduce: " + st.toString());
    if (ms > 1000) f.push_back("allReduce blocked the host for " + std::to_string(ms) + " ms behind a busy stream");
    if (cudaStreamQuery(s) != cudaErrorNotReady) f.push_back("the stream was not busy: the test proves nothing");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);  // the kernel ends; the collective can start
    cudaMemcpyAsync(host.data(), buf, kCount * sizeof(float), cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
    for (size_t i = 0; i < kCount && f.empty(); ++i)
      if (host[i] != 3.0f) f.push_back("element " + std::to_string(i) + " is " + std::to_string(host[i]));
    cudaFree(buf);
    cudaFreeHost(flag);
    return f;
  });
}

// Non-blocking communicators: init and calls may return kInProgress; the stream still orders
// everything and commGetAsyncError ends at success.
TEST(CudaCollStream, NonBlockingCommunicator) {
  SKIP_WITHOUT_GPU();
  runRanks(2, false, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    constexpr size_t kCount = 100003;
    double* buf = nullptr;
    if (cudaMalloc(&buf, kCount * sizeof(double)) != cudaSuccess) return {"cudaMalloc"};
    std::vector<double> host(kCount);
    for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<double>(rank * 10 + i % 5);
    cudaMemcpyAsync(buf, host.data(), kCount * sizeof(double), cudaMemcpyHostToDevice, s);
    Failures f;
    c4::Status st = c4::allReduce(buf, buf, kCount, c4::DataType::kFloat64, c4::RedOp::kMax, comm, s);
    if (!st.isOk() && st.code() != c4::Code::kInProgress) f.push_back("allReduce: " + st.toString());
    cudaMemcpyAsync(host.data(), buf, kCount * sizeof(double), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (size_t i = 0; i < kCount && f.empty(); ++i)
      if (host[i] != static_cast<double>(10 + i % 5)) f.push_back("element " + std::to_string(i) + " wrong");
    for (int k = 0; k < 10000; ++k) {
      st = c4::commGetAsyncError(comm);
      if (st.code() != c4::Code::kInProgress) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!st.isOk()) f.push_back("commGetAsyncError: " + st.toString());
    cudaFree(buf);
    return f;
  });
}

// ---- windows on device memory: one-sided calls in stream order (docs/cuda.md) ----

/// Rounds of every rank putting a block into every other rank's device window, all in stream order
/// with no host wait between: wait for the peers' "ready" (they read the last round), upload the
/// source, put to each peer, wait for each peer's put, download the window; then check it and
/// signal "ready". Then collectives on the window's memory (registered for them) and the window
/// goes. Returns what went wrong.
Failures windowRounds(int rank, int n, c4::Comm* comm, cudaStream_t s, const char* how) {
  constexpr size_t kBlock = size_t{1} << 18;  // floats: 1 MiB per rank
  const size_t bytes = kBlock * sizeof(float) * static_cast<size_t>(n);
  Failures f;
  void* winMem = nullptr;
  float* src = nullptr;
  c4::Status st = c4::memAllocPreferDevice(&winMem, bytes);
  if (!st.isOk()) return {std::string(how) + ": memAllocPreferDevice: " + st.toString()};
  if (cudaMalloc(&src, kBlock * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
  c4::Window* w = nullptr;
  st = c4::windowRegister(comm, winMem, bytes, 0, &w);
  if (!st.isOk()) return {std::string(how) + ": windowRegister: " + st.toString()};
  std::vector<int> peers, ones;
  for (int p = 0; p < n; ++p)
    if (p != rank) {
      peers.push_back(p);
      ones.push_back(1);
    }
  std::vector<float> host(kBlock), got(kBlock * static_cast<size_t>(n));
  for (int round = 0; round < 4 && f.empty(); ++round) {
    if (round > 0) st = c4::waitSignal(static_cast<int>(peers.size()), peers.data(), ones.data(), comm, s);
    for (size_t i = 0; i < kBlock; ++i) host[i] = static_cast<float>(rank * 1000 + round + static_cast<int>(i % 7));
    cudaMemcpyAsync(src, host.data(), kBlock * sizeof(float), cudaMemcpyHostToDevice, s);
    for (int p : peers)
      if (st.isOk())
        st = c4::putSignal(src, kBlock * sizeof(float), p, w, static_cast<size_t>(rank) * kBlock * sizeof(float), comm,
                           s);
    if (st.isOk()) st = c4::waitSignal(static_cast<int>(peers.size()), peers.data(), ones.data(), comm, s);
    if (!st.isOk()) {
      f.push_back(std::string(how) + ": round " + std::to_string(round) + ": " + st.toString());
      break;
    }
    cudaMemcpyAsync(got.data(), winMem, bytes, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back(std::string(how) + ": cudaStreamSynchronize");
    for (int q : peers) {
      for (size_t i = 0; i < kBlock && f.empty(); ++i) {
        const float want = static_cast<float>(q * 1000 + round + static_cast<int>(i % 7));
        const float have = got[static_cast<size_t>(q) * kBlock + i];
        if (have != want)
          f.push_back(std::string(how) + ": round " + std::to_string(round) + ": rank " + std::to_string(q) +
                      "'s block, element " + std::to_string(i) + " is " + std::to_string(have) + ", expected " +
                      std::to_string(want));
      }
    }
    for (int p : peers)
      if (st.isOk()) st = c4::signalPeer(p, comm, s);
    if (!st.isOk()) f.push_back(std::string(how) + ": signalPeer: " + st.toString());
  }
  // Let every peer read its last round before the window is used for collectives.
  if (f.empty()) st = c4::waitSignal(static_cast<int>(peers.size()), peers.data(), ones.data(), comm, s);
  // Collectives on the window's memory: it is registered for them (the peers keep their mappings).
  auto* buf = static_cast<float*>(winMem);
  for (int c = 0; c < 3 && f.empty() && st.isOk(); ++c) {
    std::vector<float> v(kBlock, static_cast<float>(rank + c));
    cudaMemcpyAsync(buf, v.data(), kBlock * sizeof(float), cudaMemcpyHostToDevice, s);
    st = c4::allReduce(buf, buf, kBlock, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    cudaMemcpyAsync(v.data(), buf, kBlock * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    const float want = static_cast<float>(n * (n - 1) / 2 + n * c);
    if (st.isOk() && (v[0] != want || v[kBlock - 1] != want))
      f.push_back(std::string(how) + ": allReduce on the window: " + std::to_string(v[0]) + ", expected " +
                  std::to_string(want));
  }
  if (!st.isOk()) f.push_back(std::string(how) + ": " + st.toString());
  st = c4::commGetAsyncError(comm);
  if (!st.isOk()) f.push_back(std::string(how) + ": commGetAsyncError: " + st.toString());
  st = c4::windowDeregister(comm, w);
  cudaFree(src);
  if (!st.isOk()) {
    // A peer may still map it: left to the process's end.
    f.push_back(std::string(how) + ": windowDeregister: " + st.toString());
    return f;
  }
  st = c4::memFree(winMem);  // every peer closed its mapping: freeing is safe
  if (!st.isOk()) f.push_back(std::string(how) + ": memFree: " + st.toString());
  return f;
}

// Puts into peers' device windows with CUDA IPC (mapped), and through host memory and the side
// channel as to ranks of another host (C4_RMA_MAPPED=0): the data is right, nothing waits on the
// host, and the window is usable for collectives.
class CudaWindow : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaWindow, PutSignalWaitInStreamOrder) {
  SKIP_WITHOUT_GPU();
  const std::string how = GetParam();
  runRanks(
      3, true,
      [how](int rank, int n, c4::Comm* comm, cudaStream_t s) { return windowRounds(rank, n, comm, s, how.c_str()); },
      240, [how](int) { setenv("C4_RMA_MAPPED", how == "mapped" ? "1" : "0", 1); });
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaWindow, ::testing::Values("mapped", "sideChannel"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Ranks of one process (commInitAll, a thread each): a put uses the peer's device address as it is.
TEST(CudaWindowOneProcess, PutSignalWaitBetweenThreads) {
  SKIP_WITHOUT_GPU();
  const auto outs = c4test::runForked(
      1,
      [](int, int, const c4::UniqueId&) -> Failures {
        constexpr int kRanks = 2;
        if (cudaSetDevice(0) != cudaSuccess) return {"cudaSetDevice"};
        c4::Comm* comms[kRanks] = {};
        c4::Status st = c4::commInitAll(comms, kRanks, c4::Config{});
        if (!st.isOk()) return {"commInitAll: " + st.toString()};
        std::vector<Failures> fs(kRanks);
        std::vector<std::thread> ts;
        for (int r = 0; r < kRanks; ++r)
          ts.emplace_back([&, r] {
            cudaStream_t s = nullptr;
            if (cudaSetDevice(0) != cudaSuccess ||
                cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
              fs[static_cast<size_t>(r)] = {"stream"};
              return;
            }
            fs[static_cast<size_t>(r)] = windowRounds(r, kRanks, comms[r], s, "one process");
            cudaStreamDestroy(s);
          });
        for (auto& t : ts) t.join();
        Failures f;
        for (int r = 0; r < kRanks; ++r) {
          for (const auto& m : fs[static_cast<size_t>(r)]) f.push_back("rank " + std::to_string(r) + ": " + m);
          st = c4::commDestroy(comms[r]);
          if (!st.isOk()) f.push_back("commDestroy: " + st.toString());
        }
        return f;
      },
      240);
  for (const auto& o : outs) EXPECT_FALSE(o.crashed || !o.detail.empty()) << o.detail;
}

// Waits and puts on different streams do not order each other (as in NCCL): each rank waits for
// its peer's signal on one stream and only then, on another stream, puts to the peer. A wait that
// held the communicator's progress thread would deadlock both ranks here.
TEST(CudaWindowStreams, AWaitOnOneStreamDoesNotHoldAPutOnAnother) {
  SKIP_WITHOUT_GPU();
  runRanks(2, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    Failures f;
    constexpr size_t kBytes = 1 << 20;
    void* win = nullptr;
    void* src = nullptr;
    cudaStream_t s2 = nullptr;
    if (cudaMalloc(&win, kBytes) != cudaSuccess || cudaMalloc(&src, kBytes) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) != cudaSuccess)
      return {"allocation"};
    cudaMemsetAsync(src, 0x10 + rank, kBytes, s2);
    c4::Window* w = nullptr;
    c4::Status st = c4::windowRegister(comm, win, kBytes, 0, &w);
    if (!st.isOk()) return {"windowRegister: " + st.toString()};
    const int peer = 1 - rank, one = 1;
    st = c4::waitSignal(1, &peer, &one, comm, s);  // s waits; the host goes on
    if (st.isOk()) st = c4::putSignal(src, kBytes, peer, w, 0, comm, s2);
    if (!st.isOk()) f.push_back(st.toString());
    std::vector<unsigned char> got(kBytes);
    cudaMemcpyAsync(got.data(), win, kBytes, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaStreamSynchronize(s2) != cudaSuccess)
      f.push_back("cudaStreamSynchronize");
    if (got[0] != 0x10 + peer || got[kBytes - 1] != 0x10 + peer) f.push_back("the peer's put is not there");
    st = c4::commGetAsyncError(comm);
    if (!st.isOk()) f.push_back("commGetAsyncError: " + st.toString());
    st = c4::windowDeregister(comm, w);
    if (!st.isOk()) f.push_back("windowDeregister: " + st.toString());
    cudaFree(win);
    cudaFree(src);
    cudaStreamDestroy(s2);
    return f;
  });
}

// What a window on device memory refuses, clearly and on every rank, leaving the communicator
// usable: a window mixing device and host memory across ranks, host and device windows on one
// communicator, a put from pageable memory into a device window, a put from device memory into a
// host window.
TEST(CudaWindowErrors, ClearErrorsOnEveryRank) {
  SKIP_WITHOUT_GPU();
  runRanks(2, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    Failures f;
    constexpr size_t kBytes = 1 << 16;
    void* dev = nullptr;
    void* hostMem = nullptr;
    if (cudaMalloc(&dev, kBytes) != cudaSuccess) return {"cudaMalloc"};
    c4::Status st = c4::memAlloc(&hostMem, kBytes);  // shareable host memory even with a GPU
    if (!st.isOk()) return {"memAlloc: " + st.toString()};
    c4::Window* w = nullptr;
    // Rank 0 device memory, rank 1 host memory: refused on both.
    st = c4::windowRegister(comm, rank == 0 ? dev : hostMem, kBytes, 0, &w);
    if (st.code() != c4::Code::kInvalidArgument || st.message().find("device memory") == std::string::npos)
      f.push_back("a window of device and host memory: " + st.toString());
    // A host window, then a device window on the same communicator: refused on both.
    c4::Window* hw = nullptr;
    st = c4::windowRegister(comm, hostMem, kBytes, 0, &hw);
    if (!st.isOk()) return {"host windowRegister: " + st.toString()};
    st = c4::windowRegister(comm, dev, kBytes, 0, &w);
    if (st.code() != c4::Code::kInvalidUsage) f.push_back("a device window beside a host window: " + st.toString());
    st = c4::putSignal(dev, 64, 1 - rank, hw, 0, comm, s);
    if (st.code() != c4::Code::kInvalidUsage)
      f.push_back("a put from device memory into a host window: " + st.toString());
    st = c4::windowDeregister(comm, hw);
    if (!st.isOk()) f.push_back("host windowDeregister: " + st.toString());
    // Now a device window: a put from pageable memory is refused, one from device memory runs.
    st = c4::windowRegister(comm, dev, kBytes, 0, &w);
    if (!st.isOk()) return {"device windowRegister: " + st.toString()};
    std::vector<char> pageable(64, 1);
    st = c4::putSignal(pageable.data(), 64, 1 - rank, w, 0, comm, s);
    if (st.code() != c4::Code::kInvalidArgument) f.push_back("a put from pageable memory: " + st.toString());
    st = c4::putSignal(dev, 64, 1 - rank, w, kBytes - 32, comm, s);
    if (st.code() != c4::Code::kInvalidArgument) f.push_back("a put past the window's end: " + st.toString());
    const int peer = 1 - rank, one = 1;
    std::vector<unsigned char> bytes(64, static_cast<unsigned char>(0x40 + rank));
    cudaMemcpyAsync(static_cast<char*>(dev) + 1024, bytes.data(), 64, cudaMemcpyHostToDevice, s);
    st = c4::putSignal(static_cast<char*>(dev) + 1024, 64, peer, w, 0, comm, s);
    if (st.isOk()) st = c4::waitSignal(1, &peer, &one, comm, s);
    if (!st.isOk()) f.push_back("a valid put after the refused ones: " + st.toString());
    cudaMemcpyAsync(bytes.data(), dev, 64, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize");
    if (bytes[0] != 0x40 + peer || bytes[63] != 0x40 + peer)
      f.push_back("the valid put's data did not arrive: " + std::to_string(bytes[0]));
    // In a group: a one-sided call after a collective of the same communicator is refused (it would
    // run first); before it, it runs.
    float* one4 = reinterpret_cast<float*>(static_cast<char*>(dev) + 4096);
    if (!c4::groupStart().isOk()) return {"groupStart"};
    st = c4::allReduce(one4, one4, 4, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    c4::Status late = c4::signalPeer(peer, comm, s);
    c4::Status end = c4::groupEnd();
    if (late.code() != c4::Code::kInvalidUsage)
      f.push_back("a signal after a collective in a group: " + late.toString());
    if (!st.isOk() || !end.isOk()) f.push_back("the group's allReduce: " + st.toString() + " / " + end.toString());
    if (!c4::groupStart().isOk()) return {"groupStart"};
    st = c4::signalPeer(peer, comm, s);
    c4::Status ar = c4::allReduce(one4, one4, 4, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    end = c4::groupEnd();
    if (!st.isOk() || !ar.isOk() || !end.isOk())
      f.push_back("a signal before a collective in a group: " + st.toString() + " / " + ar.toString() + " / " +
                  end.toString());
    st = c4::waitSignal(1, &peer, &one, comm, s);
    if (!st.isOk()) f.push_back("waitSignal after the group: " + st.toString());
    if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize");
    st = c4::commGetAsyncError(comm);
    if (!st.isOk()) f.push_back("commGetAsyncError: " + st.toString());
    st = c4::windowDeregister(comm, w);
    if (!st.isOk()) f.push_back("device windowDeregister: " + st.toString());
    cudaFree(dev);
    (void)c4::memFree(hostMem);
    return f;
  });
}

// Device and (pageable) host buffers in one call: a clear error, nothing staged, and the
// communicator goes on working.
TEST(CudaCollErrors, MixedSpacesAreRefused) {
  SKIP_WITHOUT_GPU();
  runRanks(1, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    Failures f;
    float* dev = nullptr;
    if (cudaMalloc(&dev, 1024 * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
    std::vector<float> host(1024, 1.0f);
    c4::Status st = c4::allReduce(dev, host.data(), 1024, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    if (st.code() != c4::Code::kInvalidArgument || st.message().find("device") == std::string::npos ||
        st.message().find("host") == std::string::npos)
      f.push_back("device send + host recv: " + st.toString());
    st = c4::allGather(host.data(), dev, 256, c4::DataType::kFloat32, comm, s);
    if (st.code() != c4::Code::kInvalidArgument) f.push_back("host send + device recv: " + st.toString());
    // Still usable.
    cudaMemcpyAsync(dev, host.data(), 1024 * sizeof(float), cudaMemcpyHostToDevice, s);
    st = c4::allReduce(dev, dev, 1024, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    if (!st.isOk()) f.push_back("a valid call after the refused ones: " + st.toString());
    cudaMemcpyAsync(host.data(), dev, 1024 * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    if (host[0] != 1.0f || host[1023] != 1.0f) f.push_back("wrong result after the refused calls");
    cudaFree(dev);
    return f;
  });
}

// One rank passes device memory, the other pageable host memory, to a call large enough to be
// pipelined (which NCCL does not allow at all): the first cuts it into pieces, the second does not,
// so the ranks disagree on the call. Both must fail (the device rank through its communicator's
// asynchronous error, its stream released) within the timeout, not hang.
TEST(CudaCollErrors, DeviceOnOneRankPageableOnAnotherFailsNotHangs) {
  SKIP_WITHOUT_GPU();
  runRanks(
      2, true,
      [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
        constexpr size_t kCount = size_t{8} << 20;  // 32 MiB of floats: 16 pieces of 2 MiB on rank 0
        Failures f;
        std::vector<float> host(kCount, 1.0f);
        float* dev = nullptr;
        if (rank == 0 && cudaMalloc(&dev, kCount * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
        float* buf = rank == 0 ? dev : host.data();
        const auto t0 = std::chrono::steady_clock::now();
        c4::Status st = c4::allReduce(buf, buf, kCount, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
        if (rank == 0 && st.isOk()) {
          if (cudaStreamSynchronize(s) != cudaSuccess) f.push_back("cudaStreamSynchronize failed");
          for (int k = 0; k < 600; ++k) {
            st = c4::commGetAsyncError(comm);
            if (!st.isOk() && st.code() != c4::Code::kInProgress) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
        const double s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (st.isOk())
          f.push_back("the ranks disagreed on the call and rank " + std::to_string(rank) + " saw no error");
        if (s_ > 90) f.push_back("the error took " + std::to_string(s_) + " s");
        if (dev) cudaFree(dev);
        return f;
      },
      180,
      [](int) {
        setenv("C4_CUDA_IPC", "0", 1);
        setenv("C4_CUDA_PIPELINE_BYTES", "2097152", 1);
        setenv("C4_TIMEOUT", "20", 1);
      });
}

// A call on a stream being captured into a CUDA graph fails clearly (its host side could not run
// at each replay), leaves the capture usable, and the communicator goes on working.
TEST(CudaCollErrors, GraphCaptureIsRefused) {
  SKIP_WITHOUT_GPU();
  runRanks(1, true, [](int rank, int n, c4::Comm* comm, cudaStream_t s) -> Failures {
    Failures f;
    float* dev = nullptr;
    if (cudaMalloc(&dev, 4096 * sizeof(float)) != cudaSuccess) return {"cudaMalloc"};
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) return {"cudaStreamBeginCapture"};
    c4::Status st = c4::allReduce(dev, dev, 4096, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (st.code() != c4::Code::kInvalidUsage || st.message().find("graph") == std::string::npos)
      f.push_back("allReduce during capture: " + st.toString());
    if (end != cudaSuccess) f.push_back(cudaWhy("cudaStreamEndCapture", end));
    if (graph) cudaGraphDestroy(graph);
    std::vector<float> host(4096, 2.0f);
    cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, s);
    st = c4::allReduce(dev, dev, 4096, c4::DataType::kFloat32, c4::RedOp::kSum, comm, s);
    if (!st.isOk()) f.push_back("allReduce after the capture: " + st.toString());
    cudaMemcpyAsync(host.data(), dev, host.size() * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    if (host[0] != 2.0f || host[4095] != 2.0f) f.push_back("wrong result after the capture");
    cudaFree(dev);
    return f;
  });
}

}  // namespace
