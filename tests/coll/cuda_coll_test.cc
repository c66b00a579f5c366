// Collectives on CUDA device buffers (ctest label gpu; skipped without a GPU, run by
// scripts/gpu-check.sh on one): the whole collective matrix with 1, 2 and 4 ranks sharing one GPU
// (NVIDIA's NCCL refuses that; c4comm supports it), each call between an upload and a download on
// the same stream with no wait between; many calls in flight on one stream; the host not blocked
// by a busy stream; non-blocking communicators; buffers of mixed spaces refused.
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

namespace {

using c4test::Failures;

bool haveGpu() { return access("/dev/nvidia0", F_OK) == 0; }

#define SKIP_WITHOUT_GPU() \
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU here (/dev/nvidia0); scripts/gpu-check.sh runs these on one"

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

// Pipelined staging (docs/cuda.md): with 64 KiB pieces every larger AllReduce, Broadcast and Reduce
// of the matrix runs as several staged pieces, each copied back while the next runs; every result
// and guard byte must be right. Then many pipelined calls in flight on one stream.
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
