// c4comm public C++ API.
//
// Threading: a communicator may be used by one thread at a time (like NCCL). Different
// communicators may be used concurrently from different threads. Group calls (groupStart/groupEnd)
// are per thread.
//
// Blocking: on host memory every collective has completed (results in recvbuff) when the call
// returns ok, including inside groupEnd() for calls made inside a group. `stream` is accepted for
// NCCL compatibility and ignored for host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "c4comm/export.hpp"
#include "c4comm/status.hpp"
#include "c4comm/types.hpp"

namespace c4 {

/// Opaque communicator.
///
/// Threading: one thread at a time calls into a communicator (several communicators may be used
/// from several threads, and one thread may drive several in a group). The exceptions are
/// commAbort, commRevoke and commGetAsyncError, which another thread may call while an operation
/// runs. A communicator with a progress thread (Config::blocking = 0, or C4_PROGRESS_THREAD=1)
/// runs its operations on that thread in call order; the trace functions may then be called
/// from the application's threads while it records.
struct Comm;

/// 128 bytes, layout-compatible with ncclUniqueId: root address, port and a random secret.
struct UniqueId {
  char bytes[128];
};

/// Per-communicator configuration (the subset of ncclConfig_t that applies to c4comm).
struct Config {
  /// Non-zero: calls block until done. Zero (NCCL's non-blocking communicators): the communicator
  /// gets a progress thread; init, collectives, point-to-point calls and groupEnd queue their work
  /// and return kInProgress, and commGetAsyncError reports kInProgress until everything queued is
  /// done (then ok, or the error). Buffers must not be touched until then.
  int blocking = 1;
  /// Name shown in logs and traces; may be empty.
  std::string name;
  /// Share resources with the parent in commSplit (accepted, not yet used).
  int splitShare = 0;
  /// Longest any wait of this communicator (bootstrap, a peer, a collective) may see no
  /// progress, in ms; 0: C4_TIMEOUT. C4_TIMEOUT, when set, wins (as NCCL's variables win over
  /// ncclConfig_t).
  int64_t timeoutMs = 0;
  /// How long an idle rank of this communicator spins before it yields and sleeps, in us (at most
  /// 60 s); -1: the default (C4_SHM_SPIN: 250, or 0 when ranks outnumber cores). C4_SHM_SPIN, when
  /// set, wins. Ranks that share their cores with compute threads (a PyTorch backend) want it short.
  int64_t spinUs = -1;
};

/// Version as NCCL encodes it (major*10000 + minor*100 + patch); reports 2.28-compatible.
C4_API int version();

/// Allocates `size` bytes (rounded up to a page) of zeroed host memory that the ranks of one host
/// can share (ncclMemAlloc). Collectives whose buffers every rank allocated this way run on the
/// zero-copy path when all ranks share one host: each rank reads and writes the peers' buffers in
/// place (docs/shm-transport.md, "Zero-copy path"). Usable like any other memory.
C4_API Status memAlloc(void** ptr, size_t size);
/// ncclMemAlloc: in a process that has a GPU (and C4_CUDA is not 0), `size` bytes of device memory
/// (cudaMalloc on the current GPU; collectives on it run on the device zero-copy path where all
/// ranks share one host, docs/cuda.md); elsewhere memAlloc's shareable host memory.
C4_API Status memAllocPreferDevice(void** ptr, size_t size);
/// Frees what memAlloc or memAllocPreferDevice returned (kInvalidArgument for anything else).
C4_API Status memFree(void* ptr);
/// True if [ptr, ptr + size) lies inside one live memAlloc allocation of this process.
C4_API bool memShareable(const void* ptr, size_t size);

/// ncclCommRegister: registers [buff, buff + size) with every transport of `comm` (RDMA memory
/// regions and CUDA IPC handles will live there; shm and tcp use host memory in place and keep
/// only the range). *handle is for commDeregister. kInvalidArgument for a NULL buff or handle or a
/// size of 0.
C4_API Status commRegister(Comm* comm, void* buff, size_t size, void** handle);
/// Releases what commRegister returned on the same communicator (kInvalidArgument for any other
/// handle, or one already released). commDestroy releases the registrations still held.
C4_API Status commDeregister(Comm* comm, void* handle);

/// Creates a unique id for a new communicator and starts the bootstrap root that serves it in
/// this process. The root address comes from C4_COMM_ID / NCCL_COMM_ID ("host:port") if set,
/// otherwise an interface chosen by C4_SOCKET_IFNAME / NCCL_SOCKET_IFNAME.
C4_API Status getUniqueId(UniqueId* id);

/// Creates rank `rank` of an `nranks` communicator. Blocks until all ranks joined or the
/// bootstrap timeout (C4_TIMEOUT) expired. *comm is set only on success.
C4_API Status commInitRank(Comm** comm, int nranks, const UniqueId& id, int rank, const Config& config = {});

/// Creates `n` ranks of one communicator inside this process (one thread per rank during init).
C4_API Status commInitAll(Comm** comms, int n, const Config& config = {});

/// Creates a communicator from launcher variables: torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK) or Slurm (SLURM_PROCID,
/// SLURM_NTASKS). Fails with kInvalidUsage, naming what is missing, when none is found.
C4_API Status commInitFromEnv(Comm** comm, const Config& config = {});

/// Splits `comm` by color (NCCL_SPLIT_NOCOLOR = -1: this rank joins none, *newcomm = nullptr),
/// ordering by (key, old rank). Collective over `comm`.
C4_API Status commSplit(Comm* comm, int color, int key, Comm** newcomm, const Config* config = nullptr);

/// ncclCommShrink: a new communicator of every rank of `comm` except the `nexclude` ranks listed
/// in `exclude` (ranks keep their order and close the gaps). Called by each rank that is left, not
/// by the excluded ones (which may be dead); they must all pass the same list. Works on a
/// communicator that failed (a peer died): the ranks agree over the bootstrap's point-to-point
/// links, which outlive a failure. `abortParent`: first fail `comm`, so that a call blocked on it
/// in another thread returns, and leave it usable for destroy only (NCCL_SHRINK_ABORT). A null
/// `config` inherits the parent's. Waits at most the parent's timeout for the others.
C4_API Status commShrink(Comm* comm, const int* exclude, int nexclude, Comm** newcomm, const Config* config = nullptr,
                         bool abortParent = false);

/// ncclCommGetUniqueId: an id for growing `comm` (commGrow), made on this rank, which then passes
/// it to commGrow as the only rank of `comm` that does. One id at a time per communicator (until a
/// commGrow consumed it: kInvalidUsage); an id serves one grow.
C4_API Status commGrowId(Comm* comm, UniqueId* id);
/// ncclCommGrow: a communicator of `nranks` ranks, those of `comm` keeping their ranks and new ones
/// taking [commCount(comm), nranks). Ranks of `comm` call it with rank -1 and id null, except the
/// one whose commGrowId made the id, which passes it (the id reaches the others over `comm`); a new
/// rank passes comm null, the id (handed to it out of band) and its rank. A null config inherits
/// the parent's (new ranks: defaults). Collective over `comm` and the new ranks.
C4_API Status commGrow(Comm* comm, int nranks, const UniqueId* id, int rank, Comm** newcomm,
                       const Config* config = nullptr);

/// ncclCommSuspend: until commResume, every call on `comm` but commResume, commCount, commUserRank,
/// commCuDevice, commMemStats, commFinalize, commDestroy and commAbort fails (kInvalidUsage).
/// `releaseMemory` (NCCL_SUSPEND_MEM) also frees what the communicator rebuilds when it needs it
/// again (cached plans, scratch buffers). Local: no other rank takes part.
C4_API Status commSuspend(Comm* comm, bool releaseMemory);
C4_API Status commResume(Comm* comm);
/// ncclCommMemStats: whether `comm` is suspended, and the bytes of GPU memory it holds (c4comm
/// holds none: device buffers are staged in pinned host memory, docs/cuda.md).
struct MemStats {
  uint64_t gpuSuspendable = 0;
  uint64_t gpuPersistent = 0;
  bool suspended = false;
};
C4_API Status commMemStats(const Comm* comm, MemStats* out);

/// Flushes outstanding work. The communicator stays valid for commDestroy only.
C4_API Status commFinalize(Comm* comm);
/// Frees the communicator (finalizes first if needed).
C4_API Status commDestroy(Comm* comm);
/// Aborts outstanding work on this rank, tells the peers, frees the communicator. Never hangs. May be
/// called while another thread is inside an operation on `comm` (that operation then fails).
C4_API Status commAbort(Comm* comm);
/// ncclCommRevoke (NCCL 2.28): stops the communicator's work. Operations in flight (also on other
/// threads, or queued on its progress thread) fail; once none runs any more the communicator is
/// quiescent: a blocking communicator's call returns then, a non-blocking one returns kInProgress
/// until then (commGetAsyncError too, then ok). Afterwards every call but commShrink, commFinalize,
/// commDestroy and commAbort fails with kInvalidUsage. Peers see this rank's connections abort.
C4_API Status commRevoke(Comm* comm);

/// Number of ranks, this rank, and device (-1 for host-only communicators).
C4_API Status commCount(const Comm* comm, int* count);
C4_API Status commUserRank(const Comm* comm, int* rank);
C4_API Status commCuDevice(const Comm* comm, int* device);
/// The first asynchronous error seen by the communicator (ok if none); kInProgress while a
/// non-blocking communicator's init or queued operations (or a revoke) are not done.
C4_API Status commGetAsyncError(Comm* comm);

/// Reason for the most recent failure of a c4 call in this thread ("" if none).
C4_API const char* lastError(const Comm* comm);

// ---- C4D: health checks and diagnosis (docs/c4d.md) ---------------------------------------------
/// One diagnosis: what went wrong, who is at fault, and why c4comm thinks so.
struct Diagnosis {
  /// "dead_rank", "noncomm_hang", "comm_hang", "comm_slow" or "noncomm_slow".
  std::string kind;
  std::vector<int> ranks;                  ///< the culprit ranks
  std::vector<std::string> hosts;          ///< their hosts
  std::vector<std::pair<int, int>> links;  ///< culprit peer pairs (sender, receiver), for links
  int64_t seq = -1;                        ///< the collective concerned (-1: none or point-to-point)
  double lateMs = 0;                       ///< noncomm_slow: how late the straggler arrives (median)
  double confidence = 0;                   ///< 0..1
  int reporter = -1;                       ///< the rank that made it
  std::string summary;                     ///< one sentence in plain words
  std::string evidence;                    ///< what it rests on
  std::string json;                        ///< the whole record, one line of JSON (C4_DIAG_FILE's format)
};
/// Called once per diagnosis this rank makes or receives, on a c4comm thread (the health thread
/// or the thread driving the communicator): keep it short, and do not call into `comm` from it.
using DiagnosisCallback = std::function<void(const Diagnosis&)>;
/// Registers (or, with an empty function, removes) the callback of `comm`. Any thread.
C4_API Status setDiagnosisCallback(Comm* comm, DiagnosisCallback cb);
/// Every diagnosis `comm` made or received so far, oldest first. Any thread.
C4_API Status getDiagnoses(const Comm* comm, std::vector<Diagnosis>* out);

// ---- reduction operators ---------------------------------------------------------------------
/// Creates a user op: each rank's input is multiplied by *scalar (of type dt) before a sum.
C4_API Status redOpCreatePreMulSum(RedOp* op, const void* scalar, DataType dt, ScalarResidence residence, Comm* comm);
C4_API Status redOpDestroy(RedOp op, Comm* comm);

// ---- collectives (counts in elements) ---------------------------------------------------------
C4_API Status allReduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, Comm* comm,
                        void* stream = nullptr);
/// sendcount elements per rank; recvbuff holds nranks*sendcount.
C4_API Status allGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType dt, Comm* comm,
                        void* stream = nullptr);
C4_API Status broadcast(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm,
                        void* stream = nullptr);
/// sendbuff holds nranks*recvcount; recvbuff recvcount.
C4_API Status reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType dt, RedOp op, Comm* comm,
                            void* stream = nullptr);
C4_API Status reduce(const void* sendbuff, void* recvbuff, size_t count, DataType dt, RedOp op, int root, Comm* comm,
                     void* stream = nullptr);
/// count elements to each peer; both buffers hold nranks*count.
C4_API Status alltoAll(const void* sendbuff, void* recvbuff, size_t count, DataType dt, Comm* comm,
                       void* stream = nullptr);
/// count elements from each rank to root; recvbuff (root only) holds nranks*count.
C4_API Status gather(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm,
                     void* stream = nullptr);
/// sendbuff (root only) holds nranks*count; each rank receives count.
C4_API Status scatter(const void* sendbuff, void* recvbuff, size_t count, DataType dt, int root, Comm* comm,
                      void* stream = nullptr);
C4_API Status send(const void* sendbuff, size_t count, DataType dt, int peer, Comm* comm, void* stream = nullptr);
C4_API Status recv(void* recvbuff, size_t count, DataType dt, int peer, Comm* comm, void* stream = nullptr);

// ---- probing and receive from any source (MPI_Iprobe, MPI_ANY_SOURCE; not in NCCL) ------------
/// `peer` argument of iprobe: any rank but this one.
constexpr int kAnySource = -1;
/// What iprobe found.
struct ProbeResult {
  bool ready = false;                   // a message is there
  int source = -1;                      // its sender
  size_t count = 0;                     // its element count, as the sender passed it to send
  DataType dtype = DataType::kFloat32;  // its type, as the sender passed it
};
/// Non-blocking: whether the next send from `peer` (or, with kAnySource, from any other rank,
/// taken round-robin) has arrived, without receiving it; the recv that follows gets that very
/// message. Messages of 0 elements are never sent, so never found. Sends to this rank itself
/// are not seen (they pair with receives in a group). Fails, and fails the communicator, once a
/// probed peer died or aborted (checked every 100 ms while nothing is found).
C4_API Status iprobe(int peer, Comm* comm, ProbeResult* out);
/// Blocking iprobe (MPI_Probe): waits for such a message with the communicator's idle policy
/// (spin, then short sleeps). waitMs >= 0: gives up after that long with out->ready false and ok;
/// waitMs < 0: waits up to C4_TIMEOUT, then fails (and fails the communicator).
C4_API Status probe(int peer, Comm* comm, ProbeResult* out, int64_t waitMs = -1);
/// Blocking receive of the first send to arrive from any other rank (MPI_Recv with
/// MPI_ANY_SOURCE); *source is set to its sender. As with recv, count and type must be those of
/// the send. Not inside a group (the sender is only known as it arrives). Fails after C4_TIMEOUT
/// without a message from any rank, and at once if a peer died or aborted.
C4_API Status recvAny(void* recvbuff, size_t count, DataType dt, int* source, Comm* comm, void* stream = nullptr);

// ---- one-sided: windows, put with signal, wait for signals (NCCL 2.29's host RMA) ----------------
/// A window: a buffer every rank of a communicator registered in the same collective call.
struct Window;
/// ncclCommWindowRegister: collective; every rank registers its buffer, in the same order on every
/// rank. Host memory: `buff` must lie in one memAlloc allocation (so the ranks of its host can map
/// it). CUDA device memory (cudaMalloc, memAllocPreferDevice): every rank's buffer is device memory,
/// and the communicator's one-sided calls run in their streams' order (docs/cuda.md); one
/// communicator's windows are all on host or all on device memory. Fails on every rank
/// (kInvalidArgument naming the ranks) when one rank's buffer is not acceptable.
C4_API Status windowRegister(Comm* comm, void* buff, size_t size, int flags, Window** win);
/// ncclCommWindowDeregister: collective (no rank writes into it afterwards; on device memory, no
/// peer holds a mapping of it any more, so it may be freed).
C4_API Status windowDeregister(Comm* comm, Window* win);
/// ncclWinGetUserPtr: the buffer this rank registered.
C4_API Status windowUserPtr(const Comm* comm, const Window* win, void** ptr);
/// ncclPutSignal: writes `bytes` of `src` at byte `offset` of `peer`'s buffer of window `win`, then
/// adds one to peer's signal from this rank. When peer sees the signal (waitSignal) the data is
/// there, and so is that of every earlier put to it. A host-memory window: runs when called (inside
/// a group too) and returns when `src` may be reused. A device-memory window: `src` is device (or
/// pinned) memory, and the put runs in `stream`'s order (a cudaStream_t; null: the legacy default
/// stream): later work on the stream may reuse `src`; the host is not blocked.
C4_API Status putSignal(const void* src, size_t bytes, int peer, Window* win, size_t offset, Comm* comm,
                        void* stream = nullptr);
/// ncclSignal: adds one to peer's signal from this rank, after every earlier put to it (in
/// `stream`'s order where the communicator's windows are device memory).
C4_API Status signalPeer(int peer, Comm* comm, void* stream = nullptr);
/// ncclWaitSignal: waits until `counts[i]` more signals came from `peers[i]` (for each i) than earlier
/// waits consumed, then consumes them. Fails with kTimeout after the communicator's timeout without
/// one, and at once when the communicator failed (a peer died). Where the communicator's windows are
/// device memory, `stream` waits (later work on it sees the data) and the host returns at once;
/// failures then go to commGetAsyncError.
C4_API Status waitSignal(int n, const int* peers, const int* counts, Comm* comm, void* stream = nullptr);

/// Group calls: operations issued between groupStart and groupEnd are executed together at
/// groupEnd (batched point-to-point, aggregated collectives, several communicators at once).
C4_API Status groupStart();
C4_API Status groupEnd();
/// ncclGroupSimulateEnd: ends the group like groupEnd but runs nothing; *estimatedUs is the
/// tuner's modelled time of what the group holds (per communicator the sum of its operations,
/// communicators in parallel; each with the algorithm the tuner would choose). The model is the
/// alpha-beta-gamma one the tuner chooses by (docs/architecture.md), not a measurement.
C4_API Status groupSimulateEnd(double* estimatedUs);

/// One environment variable the library reads (docs/params.md). The C4_ name wins over the NCCL_
/// alias.
struct ParamDesc {
  std::string env;          ///< "C4_TIMEOUT"
  std::string ncclEnv;      ///< "NCCL_..." alias, or ""
  std::string defaultText;  ///< the default as written in the registry
  std::string help;
  bool isString = false;
  std::string accepts;          ///< what it accepts: "1..31536000", "0 or 4096..1073741824", "0|op|step", "" (any text)
  bool sameOnAllRanks = false;  ///< must be the same on every rank (checked at communicator init)
};
/// Every parameter of this build, sorted by name (`c4-perf --list-params`). Any thread.
C4_API std::vector<ParamDesc> params();
/// The value in effect of the parameter named `name` (its C4_ or NCCL_ name) as the library reads
/// it: *text, and for an integer parameter *isInteger = true and *number. An unset or refused
/// setting gives the default. kInvalidArgument for a name no parameter has. Any thread.
C4_API Status paramValue(const char* name, std::string* text, bool* isInteger, int64_t* number);

/// Severity of a line written into c4comm's log.
enum class LogKind : int { kWarn = 2, kInfo = 3 };
/// Writes `message` into c4comm's log (C4_DEBUG, C4_DEBUG_SUBSYS, C4_DEBUG_FILE) as subsystem
/// `subsys` ("INIT", "COLL", "CALL", ...; unknown names log as CALL), for bindings and applications
/// that want their lines beside the library's. Thread-safe.
C4_API void log(LogKind kind, const char* subsys, const char* message);
/// Re-reads C4_DEBUG, C4_DEBUG_SUBSYS and C4_DEBUG_FILE (ncclResetDebugInit).
C4_API void reloadLogConfig();

}  // namespace c4
