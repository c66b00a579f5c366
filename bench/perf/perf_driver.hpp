// The shared driver of c4-perf and the peer benchmarks: nccl-tests flags, the
// size sweep, data initialization and verification, timing, and the nccl-tests
// output table. A benchmark binary supplies a Backend (c4comm, MPI or Gloo)
// that runs one collective; everything else is here, so the three binaries
// print tables that compare line by line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"

namespace c4 {
namespace perf {

/// Command-line options (nccl-tests names and defaults, plus -C, -np and the
/// extras below).
struct Options {
  size_t minBytes = 32 << 20;                       // -b
  size_t maxBytes = 32 << 20;                       // -e
  size_t stepBytes = 1 << 20;                       // -i
  size_t stepFactor = 1;                            // -f (>1 wins over -i)
  int iters = 20;                                   // -n
  int warmup = 1;                                   // -w
  int check = 1;                                    // -c
  std::vector<RedOp> ops{RedOp::kSum};              // -o
  std::vector<DataType> types{DataType::kFloat32};  // -d
  int root = 0;                                     // -r
  int average = 1;                                  // -a: 0 rank 0, 1 average, 2 min, 3 max over ranks
  int blocking = 0;                                 // -z (accepted; host calls always block)
  int graph = 0;                                    // -G (accepted; no CUDA graphs on host memory)
  int registered = 0;                               // -R: 1 = buffers from the library's allocator
  int nonblocking =
      0;             // --nonblocking 1: c4-perf's communicators are non-blocking (calls go through the progress thread)
  int timeline = 0;  // --timeline 1: each timed iteration timed (and, with -c 1, checked) on its own; rank 0 prints it
  int device = -1;   // --device: 1 device buffers (CUDA), 0 host buffers, -1 device where the backend has a GPU
  Coll coll = Coll::kAllReduce;      // -C
  int np = 0;                        // -np: spawn this many local ranks (0: launcher or 1 rank)
  bool listParams = false;           // --list-params
  std::string glooAlgo = "default";  // --gloo-algo ring|bcube|default (c4-peer-gloo only)
};

/// Parses argv into *opts. Unknown flags and bad values fail with a message in
/// *err. `--help` sets *help.
bool parseOptions(int argc, char** argv, Options* opts, bool* help, std::string* err);
/// The flag reference printed by --help.
void printUsage(FILE* out, const char* prog);

/// The collective named as -C accepts it ("allreduce", ...), and back.
bool parseColl(const std::string& s, Coll* coll);
const char* collFlagName(Coll coll);
/// nccl-tests names ("float", "half", ..., "sum", ...), independent of
/// libc4comm.

/// Reduction of one double over all ranks (used for times and error counts).
enum class ReduceMode { kSum, kMin, kMax };

/// One communication library as seen by the driver. All calls are collective
/// over all ranks except unsupported().
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  /// Empty when (coll, dt, op) can run; otherwise why not (the sweep for it is
  /// skipped).
  virtual std::string unsupported(Coll coll, DataType dt, RedOp op) const { return ""; }
  /// Runs one collective with nccl-tests' arguments: `count` is the per-call
  /// count (elements per rank for allgather/gather/scatter/alltoall blocks and
  /// reducescatter results). For sendrecv each rank sends to rank+1 and
  /// receives from rank-1. Blocks until done.
  virtual Status run(Coll coll, const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) = 0;
  /// -R 1: a buffer from the library's own allocator (c4: ncclMemAlloc's, which collectives use
  /// zero-copy; MPI: MPI_Alloc_mem), or null if it has none. Freed with freeRegistered.
  virtual void* allocRegistered(size_t bytes) { return nullptr; }
  virtual void freeRegistered(void* p) {}
  /// What allocRegistered gives, for the header ("ncclMemAlloc", "MPI_Alloc_mem").
  virtual std::string registeredName() const { return ""; }
  /// Device buffers (--device): the GPU this rank uses, for the header ("" when it has none: the sweep
  /// then runs on host memory, or fails under --device 1).
  virtual std::string deviceName() const { return ""; }
  /// Device memory (null on failure), freed with freeDevice; copies to and from it, complete on return.
  virtual void* allocDevice(size_t bytes) { return nullptr; }
  virtual void freeDevice(void* p) {}
  virtual Status copyToDevice(void* device, const void* host, size_t bytes) {
    return Status(Code::kInvalidUsage, "no device buffers");
  }
  virtual Status copyToHost(void* host, const void* device, size_t bytes) {
    return Status(Code::kInvalidUsage, "no device buffers");
  }
  /// With device buffers run() may return once the call is enqueued on the backend's stream (as
  /// NCCL's calls do); this waits for everything enqueued. The timed loop ends with it, as nccl-tests'.
  virtual Status waitDevice() { return Status::ok(); }
  /// *v = reduction of *v over all ranks.
  virtual Status allReduceDouble(double* v, ReduceMode mode) = 0;
  /// Concatenates `bytes` from every rank into `all` (rank order).
  virtual Status allGatherBytes(const void* mine, void* all, size_t bytes) = 0;
};

/// Describes the run in the header (e.g. "c4comm 2.28.0", "Open MPI 4.1.4",
/// "gloo ring").
struct RunInfo {
  std::string program;  // e.g. "c4-perf"
  std::string library;  // printed as "# Library: ..."
  double initMs = 0;    // max over ranks of the communicator init time
  double spawnMs = -1;  // launch-to-ready time of all ranks when this program
                        // spawned them (-1: n/a)
};

/// Runs the sweep and prints the nccl-tests table on rank 0 to `out`. Returns
/// the process exit code: kExitOk, kExitFailed on a failed call (reported on
/// stderr), kExitWrong if any element was wrong.
int runBenchmark(const Options& opts, const RunInfo& info, Backend& backend, FILE* out);

/// Exit codes of the benchmarks.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // a call failed: the other ranks may be stuck
constexpr int kExitWrong = 2;   // completed, but some results were wrong

/// Forks `n` processes; child r runs body(r) and exits with its result. The
/// parent waits for all; when one fails (any code but kExitOk and kExitWrong,
/// or a signal) it terminates the others, so a dead rank does not leave the
/// rest hanging. `afterFork` runs in the parent once all children exist (e.g.
/// to close pipe ends). Returns 0 when every child exited 0, else the first
/// failing child's code (128+signal if killed).
int spawnRanks(int n, const std::function<int(int rank)>& body, const std::function<void()>& afterFork = {});

/// Seconds from a monotonic clock.
double nowSeconds();

}  // namespace perf
}  // namespace c4
