// c4-perf: nccl-tests-style benchmark of c4comm collectives on host memory, or on CUDA device
// memory where a GPU is (--device; each call ordered on a stream, as nccl-tests runs NCCL).
//
//   c4-perf -C allreduce -np 4 -b 8 -e 64M -f 2        # spawns 4 local ranks
//   mpirun -np 4 c4-perf -C allgather -b 1M -e 1G -f 2  # ranks from a launcher
//   (commInitFromEnv) c4-perf --list-params                               #
//   every C4_/NCCL_ parameter
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/perf/perf_driver.hpp"
#include "c4comm/c4comm.hpp"
#include "common/fdio.hpp"

#if defined(C4_PERF_CUDA)
#include <cuda_runtime.h>
#endif

namespace c4 {
namespace perf {
namespace {

constexpr const char* kProgram = "c4-perf";

Status withContext(const Status& s, const char* what) {
  if (s.isOk()) return s;
  return Status(s.code(), std::string(what) + ": " + s.toString());
}

/// The rank's index among the ranks of its host (launchers' variables; else its rank).
int localRank(int rank) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (getenv(v) && *getenv(v)) return atoi(getenv(v));
  return rank;
}

class C4Backend : public Backend {
 public:
  C4Backend(Comm* comm, int wantDevice) : comm_(comm) {
    (void)commUserRank(comm, &rank_);
    (void)commCount(comm, &nranks_);
#if defined(C4_PERF_CUDA)
    // Ranks share the host's GPUs round robin (several per GPU where ranks outnumber them).
    int count = 0;
    if (wantDevice != 0 && cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
      const int device = localRank(rank_) % count;
      cudaDeviceProp prop{};
      if (cudaSetDevice(device) == cudaSuccess && cudaStreamCreate(&stream_) == cudaSuccess &&
          cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        deviceName_ = "GPU " + std::to_string(device) + " " + prop.name;
    }
    (void)cudaGetLastError();
#else
    (void)wantDevice;
#endif
  }
  ~C4Backend() override {
#if defined(C4_PERF_CUDA)
    if (stream_) cudaStreamDestroy(stream_);
#endif
  }

  std::string deviceName() const override { return deviceName_; }
#if defined(C4_PERF_CUDA)
  void* allocDevice(size_t bytes) override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void freeDevice(void* p) override { cudaFree(p); }
  Status copyToDevice(void* device, const void* host, size_t bytes) override {
    return cudaCheck(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_), "copy to the device");
  }
  Status copyToHost(void* host, const void* device, size_t bytes) override {
    Status s = cudaCheck(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), "copy to the host");
    return s.isOk() ? waitDevice() : s;
  }
  Status waitDevice() override {
    if (!stream_) return Status::ok();
    Status s = cudaCheck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (!s.isOk()) return s;
    // A staged call that failed reports on the communicator.
    s = commGetAsyncError(comm_);
    return s.code() == Code::kInProgress ? Status::ok() : s;
  }
  static Status cudaCheck(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    return Status(Code::kUnhandledCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  }
#endif
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  Status run(Coll coll, const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) override {
    Status st = issue(coll, send, recv, count, dt, op, root);
    // A non-blocking communicator queued the call: wait for it as an application would.
    while (st.code() == Code::kInProgress) st = commGetAsyncError(comm_);
    return st;
  }

  Status issue(Coll coll, const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) {
    switch (coll) {
      case Coll::kAllReduce:
        return withContext(allReduce(send, recv, count, dt, op, comm_, stream()), "allReduce");
      case Coll::kAllGather:
        return withContext(allGather(send, recv, count, dt, comm_, stream()), "allGather");
      case Coll::kBroadcast:
        return withContext(broadcast(send, recv, count, dt, root, comm_, stream()), "broadcast");
      case Coll::kReduceScatter:
        return withContext(reduceScatter(send, recv, count, dt, op, comm_, stream()), "reduceScatter");
      case Coll::kReduce:
        return withContext(reduce(send, recv, count, dt, op, root, comm_, stream()), "reduce");
      case Coll::kAlltoAll:
        return withContext(alltoAll(send, recv, count, dt, comm_, stream()), "alltoAll");
      case Coll::kGather:
        return withContext(gather(send, recv, count, dt, root, comm_, stream()), "gather");
      case Coll::kScatter:
        return withContext(scatter(send, recv, count, dt, root, comm_, stream()), "scatter");
      case Coll::kSend: {
        // nccl-tests' sendrecv: a ring shift, send to the next rank and receive
        // from the previous.
        const int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
        Status s = withContext(groupStart(), "groupStart");
        if (!s.isOk()) return s;
        Status ss = withContext(c4::send(send, count, dt, next, comm_, stream()), "send");
        Status rs = withContext(c4::recv(recv, count, dt, prev, comm_, stream()), "recv");
        Status es = withContext(groupEnd(), "groupEnd");
        return !ss.isOk() ? ss : !rs.isOk() ? rs : es;
      }
      default:
        return Status(Code::kInvalidArgument, "unsupported collective");
    }
  }

  void* allocRegistered(size_t bytes) override {
    void* p = nullptr;
    return memAlloc(&p, bytes).isOk() ? p : nullptr;
  }
  void freeRegistered(void* p) override { (void)memFree(p); }
  std::string registeredName() const override { return "ncclMemAlloc"; }

  Status allReduceDouble(double* v, ReduceMode mode) override {
    RedOp op = mode == ReduceMode::kMin ? RedOp::kMin : mode == ReduceMode::kMax ? RedOp::kMax : RedOp::kSum;
    return run(Coll::kAllReduce, v, v, 1, DataType::kFloat64, op, 0);
  }

  Status allGatherBytes(const void* mine, void* all, size_t bytes) override {
    return run(Coll::kAllGather, mine, all, bytes, DataType::kUint8, RedOp::kSum, 0);
  }

 private:
#if defined(C4_PERF_CUDA)
  void* stream() const { return stream_; }
  cudaStream_t stream_ = nullptr;
#else
  void* stream() const { return nullptr; }
#endif
  Comm* comm_;
  int rank_ = 0;
  int nranks_ = 1;
  std::string deviceName_;
};

// One line per parameter, tab-separated (tools/gen_params_md.py writes docs/params.md from it).
int listParams() {
  std::vector<ParamDesc> all = params();
  printf("# %zu c4comm parameters (the C4_ name wins over the NCCL_ alias); tab-separated:\n", all.size());
  printf("# env\tNCCL alias\tdefault\taccepts\tsame on every rank\thelp\n");
  for (const ParamDesc& p : all) {
    std::string def = p.isString ? "\"" + p.defaultText + "\"" : p.defaultText;
    printf("%s\t%s\t%s\t%s\t%s\t%s\n", p.env.c_str(), p.ncclEnv.empty() ? "-" : p.ncclEnv.c_str(), def.c_str(),
           p.accepts.empty() ? "any text" : p.accepts.c_str(), p.sameOnAllRanks ? "yes" : "no", p.help.c_str());
  }
  return 0;
}

std::string libraryName() {
  int v = version();
  char buf[64];
  snprintf(buf, sizeof(buf), "c4comm %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  return buf;
}

// Runs the sweep on an initialized communicator and destroys it.
int benchAndDestroy(const Options& opts, RunInfo info, Comm* comm, double initMs, double spawnMs) {
  C4Backend backend(comm, opts.device);
  // The slowest rank's init time is the communicator's.
  double t = initMs, s = spawnMs;
  if (!backend.allReduceDouble(&t, ReduceMode::kMax).isOk() || !backend.allReduceDouble(&s, ReduceMode::kMax).isOk()) {
    fprintf(stderr, "%s: rank %d: reducing init times failed: %s\n", kProgram, backend.rank(), lastError(comm));
    (void)commAbort(comm);
    return 1;
  }
  info.initMs = t;
  info.spawnMs = s;
  int rc = runBenchmark(opts, info, backend, stdout);
  Status ds = rc == 1 ? commAbort(comm) : commDestroy(comm);
  if (!ds.isOk() && rc == 0) {
    fprintf(stderr, "%s: rank %d: commDestroy failed: %s\n", kProgram, backend.rank(), ds.toString().c_str());
    rc = 1;
  }
  return rc;
}

// What rank 0 hands the others: the id and the moment it started creating the
// communicator (all local ranks share CLOCK_MONOTONIC, so the slowest rank's
// ready time minus this is the communicator's total init time).
struct Handoff {
  UniqueId id;
  double start;
};

int runSpawned(const Options& opts, const RunInfo& info) {
  const int n = opts.np;
  std::vector<int> readFd(n, -1), writeFd(n, -1);
  for (int r = 1; r < n; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      fprintf(stderr, "%s: pipe: %s\n", kProgram, strerror(errno));
      return 1;
    }
    readFd[r] = fds[0];
    writeFd[r] = fds[1];
  }
  auto closeAll = [&](bool reads, bool writes, int keep) {
    for (int r = 1; r < n; ++r) {
      if (reads && r != keep && readFd[r] >= 0) close(readFd[r]);
      if (writes && writeFd[r] >= 0) close(writeFd[r]);
    }
  };
  const double spawnStart = nowSeconds();
  auto body = [&](int rank) -> int {
    Handoff h{};
    if (rank == 0) {
      closeAll(true, false, -1);
      h.start = nowSeconds();
      Status s = getUniqueId(&h.id);
      if (!s.isOk()) {
        fprintf(stderr, "%s: rank 0: getUniqueId failed: %s\n", kProgram, s.toString().c_str());
        return 1;
      }
      for (int r = 1; r < n; ++r)
        if (!writeAll(writeFd[r], &h, sizeof(h))) {
          fprintf(stderr, "%s: rank 0: handing the id to rank %d failed: %s\n", kProgram, r, strerror(errno));
          return 1;
        }
      closeAll(false, true, -1);
    } else {
      closeAll(true, true, rank);
      if (!readAll(readFd[rank], &h, sizeof(h))) {
        fprintf(stderr, "%s: rank %d: no id from rank 0 (it exited?)\n", kProgram, rank);
        return 1;
      }
      close(readFd[rank]);
    }
    Comm* comm = nullptr;
    Config cfg;
    cfg.blocking = opts.nonblocking ? 0 : 1;
    Status s = commInitRank(&comm, n, h.id, rank, cfg);
    while (s.code() == Code::kInProgress) s = commGetAsyncError(comm);
    if (!s.isOk()) {
      fprintf(stderr, "%s: rank %d: commInitRank failed: %s\n", kProgram, rank, s.toString().c_str());
      return 1;
    }
    const double ready = nowSeconds();
    return benchAndDestroy(opts, info, comm, (ready - h.start) * 1e3, (ready - spawnStart) * 1e3);
  };
  return spawnRanks(n, body, [&] { closeAll(true, true, -1); });
}

bool underLauncher() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK", "PMI_RANK"})
    if (getenv(v) && *getenv(v)) return true;
  return false;
}

int main(int argc, char** argv) {
  Options opts;
  bool help = false;
  std::string err;
  if (!parseOptions(argc, argv, &opts, &help, &err)) {
    fprintf(stderr, "%s: %s\n", kProgram, err.c_str());
    return 1;
  }
  if (help) return printUsage(stdout, kProgram), 0;
  if (opts.listParams) return listParams();
  RunInfo info;
  info.program = kProgram;
  info.library = libraryName();

  if (underLauncher()) {
    if (opts.np > 0) fprintf(stderr, "%s: ignoring -np %d: ranks come from the launcher\n", kProgram, opts.np);
    double t0 = nowSeconds();
    Comm* comm = nullptr;
    Status s = commInitFromEnv(&comm);
    if (!s.isOk()) {
      fprintf(stderr, "%s: commInitFromEnv failed: %s\n", kProgram, s.toString().c_str());
      return 1;
    }
    return benchAndDestroy(opts, info, comm, (nowSeconds() - t0) * 1e3, -1);
  }
  if (opts.np > 1) return runSpawned(opts, info);

  // One rank in this process.
  double t0 = nowSeconds();
  UniqueId id;
  Comm* comm = nullptr;
  Status s = getUniqueId(&id);
  if (s.isOk()) s = commInitRank(&comm, 1, id, 0);
  if (!s.isOk()) {
    fprintf(stderr, "%s: creating a 1-rank communicator failed: %s\n", kProgram, s.toString().c_str());
    return 1;
  }
  return benchAndDestroy(opts, info, comm, (nowSeconds() - t0) * 1e3, -1);
}

}  // namespace
}  // namespace perf
}  // namespace c4

int main(int argc, char** argv) { return c4::perf::main(argc, argv); }
