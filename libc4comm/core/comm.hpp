// The communicator (c4::Comm) and the operations it runs.
//
// Execution is layered (docs/architecture.md, "The path of one call"):
//  - the API validates a call into an OpDesc and hands it to the communicator (submit); the router
//    (core/route.hpp) sends calls on CUDA memory to the device path (core/device_path.hpp), which
//    stages them in their streams' order, and queues or runs host calls;
//  - prepare*() turns it into a PreparedCall: the router picks the path (messages over the
//    transports, the one-shot arena, zero-copy) and the tuner, for messages, the algorithm and chunk;
//  - the path (an ExecPath) runs it against the communicator's ExecContext (connections,
//    progress, watchdog, tracer), polled by a driving loop: the caller's thread, or the
//    communicator's progress thread (core/progress.hpp) when it has one;
//  - observers (core/observer.hpp) see each call start, progress, idle and end: the watchdog
//    (which decides when nothing moved for C4_TIMEOUT), C4D, the tracer, C4P.
//
// Its parts: comm.cc (init, teardown, preparing calls, probes, registrations), comm_api.cc (the
// API's side: life cycle, communicators made from it, windows), route.cc (submit, the router),
// device_path.cc, drive.cc (the driving loop, one call's steps), comm_jobs.cc (the progress
// thread's jobs), call_observers.cc. Its state is private: the API (api.cc) and the driving loop
// use its methods; the device path and the observers' attachment are friends. The services it owns get narrow
// interfaces instead of Comm: ExecContext (paths), HealthHost (C4D), RmaHost (one-sided calls), ProgressHost (the
// progress thread).
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "core/bootstrap.hpp"
#include "core/call.hpp"
#include "core/comm_state.hpp"
#include "core/device_path.hpp"
#include "core/exec_context.hpp"
#include "core/executor.hpp"
#include "core/health.hpp"
#include "core/lane_planner.hpp"
#include "core/observer.hpp"
#include "core/oneshot.hpp"
#include "core/opdesc.hpp"
#include "core/progress.hpp"
#include "core/rma.hpp"
#include "core/route.hpp"
#include "core/tuner.hpp"
#include "core/watchdog.hpp"
#include "core/zerocopy.hpp"
#include "sched/schedule.hpp"
#include "trace/recorder.hpp"
#include "transports/transport.hpp"

namespace c4 {

class ExecPath;
struct GroupQueue;

/// A PreMulSum operator created on a communicator.
struct UserOp {
  bool live = false;
  DataType dtype = DataType::kFloat32;
  ScalarResidence residence = ScalarResidence::kHostImmediate;
  unsigned char value[8] = {0};   // the scalar, for kHostImmediate
  const void* pointer = nullptr;  // read at call time, for kDevice (host memory here)
};

struct Comm final : public ExecContext, public ProgressHost {
 public:
  Comm();
  ~Comm() override;

  /// Joins the communicator (bootstrap, transports). Blocking.
  Status init(int nranks, const UniqueId& id, int rank, const Config& config);

  // ---- the API's side (core/comm_api.cc): life cycle ----
  /// Starts the communicator: init on this thread, or as the first job of the progress thread it
  /// gets (non-blocking, C4_PROGRESS_THREAD, or GPUs present): then kInProgress where non-blocking.
  Status start(int nranks, const UniqueId& id, int rank, const Config& config);
  /// Ok, or why no call may run on it now (finalized, revoked, suspended, failed).
  Status usable();
  /// Returns once the calls queued on the progress thread are done (at once without one).
  void drain();
  /// Runs `fn` on the data path from the caller's thread: directly (marked driven), or with the
  /// progress thread's drive once its queue is empty.
  Status onDataPath(const std::function<Status()>& fn);
  /// A thread without the progress thread starts (stops) driving it, so that requestAbort (commAbort,
  /// commRevoke from another thread) knows whether it must wait. One thread at a time drives a
  /// communicator: plain stores, no read-modify-write on the hot path.
  void markDriven(bool on) {
    if (on) {
      busy.store(true, std::memory_order_seq_cst);
    } else {
      busy.store(false, std::memory_order_release);
    }
  }
  bool hasProgressThread() const { return engine != nullptr; }
  /// commFinalize: the trace's last clock sample and its file (queued where non-blocking).
  Status finalize();
  /// commDestroy and commAbort, before the communicator is deleted: C4D's goodbye, the progress
  /// thread stopped (its queue run first; aborted: failed), sends flushed (destroy), the trace
  /// written.
  void destroy();
  void abort();
  /// commRevoke: in-flight calls fail, later ones are refused; kInProgress (non-blocking) until
  /// no call runs.
  Status revoke();
  /// commGetAsyncError: the failure, kInProgress while calls are queued, or ok.
  Status asyncError();
  /// ncclCommCuDevice: the GPU its device buffers are staged for, else the caller's at init.
  int cuDevice() const;
  /// The arguments of a communicator's init made from this one (split, shrink, grow).
  struct Offspring {
    bool none = false;  // split with color -1: no communicator
    int nranks = 0;
    UniqueId id;
    int rank = 0;
    Config config;
  };
  /// Collective over this communicator: the new communicator's members agree on its id.
  Status split(int color, int key, const Config* config, Offspring* out);
  Status shrink(const int* exclude, int nexclude, const Config* config, bool abortParent, Offspring* out);
  Status makeGrowId(UniqueId* id);
  Status grow(int nranks, const UniqueId* id, int rank, const Config* config, Offspring* out);
  Status suspend(bool releaseMemory);
  Status resume();
  bool isSuspended() const { return suspended.load(std::memory_order_acquire); }
  /// `op` is a built-in operator or a live PreMulSum made on this communicator for `dt`.
  Status checkOp(RedOp op, DataType dt) const;
  RedOp createPreMulSum(const void* scalar, DataType dt, ScalarResidence residence);
  Status destroyOp(RedOp op);
  // Windows and one-sided calls (core/rma.hpp; on device windows in the stream's order through the
  // device path). `behindGroupCalls`: this communicator has calls queued in the caller's open group.
  Status registerWindow(void* buff, size_t size, Window** win);
  Status deregisterWindow(Window* win);
  Status windowBase(const Window* win, void** ptr) const;
  Status putSignal(const void* src, size_t bytes, int peer, Window* win, size_t offset, void* stream,
                   bool behindGroupCalls);
  Status signalPeer(int peer, void* stream, bool behindGroupCalls);
  Status waitSignal(int n, const int* peers, const int* counts, void* stream, bool behindGroupCalls);
  /// iprobe and probe on the driving thread (this one, or the progress thread: waited for either way).
  Status submitProbe(int peer, ProbeResult* out, int64_t waitMs);
  /// recvAny on the driving thread (waited for either way: the sender is the result).
  Status submitRecvAny(const OpDesc& op, int* source);
  /// A group's calls on this communicator at groupEnd: step 2 of the staged ones, cancelling them
  /// (the group runs nothing), the part handed to the progress thread, and waiting for it (sets
  /// *inProgress instead where non-blocking).
  Status finishStaging(std::vector<OpDesc>* ops);
  void cancelStaged(const std::vector<OpDesc>& ops);
  std::shared_ptr<Job> postGroupPart(std::vector<OpDesc>&& ops);
  Status waitGroupPart(Job& job, bool* inProgress);
  // C4D and the tracer.
  void setDiagnosisCallback(DiagnosisCallback cb);
  std::vector<Diagnosis> diagnoses() const;
  const trace::Recorder& tracer() const { return recorder; }

  // ---- taking calls (core/route.cc) ----
  /// A validated collective or point-to-point call: queued in `group` (an open group; null: none),
  /// or run (blocking) or queued (non-blocking) by its route.
  Status submit(const OpDesc& op, GroupQueue* group);

  // ---- running operations on the driving thread (the caller's, or the progress thread's) ----
  /// Runs a collective to completion.
  Status runCollective(const OpDesc& op);
  /// Runs a batch of point-to-point ops (all posted together).
  Status runP2p(const std::vector<OpDesc>& ops);
  /// One look at the connections of `peer` (or every peer, kAnySource) for a point-to-point
  /// message; checks the probed peers' health every 100 ms while none is there.
  Status probe(int peer, ProbeResult* out);
  /// iprobe and probe (c4comm.hpp): probe() until a message is there (idleWait between tries), for
  /// up to waitMs (0: one look), or (waitMs < 0) up to the timeout and then an error. Errors fail
  /// the communicator.
  Status waitProbe(int peer, ProbeResult* out, int64_t waitMs);
  /// recvAny (c4comm.hpp): waits for a send from any peer, then receives it like `op` from its sender.
  Status recvAny(const OpDesc& op, int* source);
  /// The tuner's modelled time of `op` (microseconds), with the algorithm it would choose.
  double estimateUs(const OpDesc& op) const;

  Status prepareCollective(const OpDesc& op, PreparedCall* out);
  Status prepareP2p(const std::vector<OpDesc>& ops, PreparedCall* out);
  /// The batch's sends to this rank pair with its receives from it, in call order (same count and
  /// type). Checked before any operation of a group starts, so that a mistake fails only the call
  /// (kInvalidUsage), not the communicator.
  Status checkSelfPairs(const std::vector<OpDesc>& ops) const;
  /// Starts / advances a prepared call on its path.
  Status startPrepared(PreparedCall* p);
  Status pollPrepared(PreparedCall* p, bool* done, bool* progressed);
  /// After a prepared op completes: epilogue (integer Avg division), trace, watchdog.
  void finish(PreparedCall* p);
  /// An idle round of the running call `p` (nothing moved): the communicator's own chores, then
  /// the observers' verdict (the watchdog's timeout, with C4D's diagnosis).
  Status watchIdle(const PreparedCall* p);
  /// Clock alignment to rank 0 for the trace (which: 0 at init, 1 at finalize); a failure only
  /// leaves the sample out. Collective over the communicator.
  void traceClockSync(int which, int64_t timeoutMs);

  /// Connection to `peer` through the transport that reaches it.
  Status connection(int peer, transport::Connection** out) override;
  /// Advances every transport.
  Status progressTransports();
  /// Before the transports close (destroy, finalize): progresses until sends already reported
  /// complete are acknowledged (bounded by C4_TIMEOUT, at most 60 s). Not after a failure or abort.
  void flushSends();
  /// Back-off after `idleRounds` consecutive polls without progress: spin, yield, then block up to
  /// C4_SHM_SLEEP_US, on the network transports' wait fds when there are any (so arriving data
  /// wakes the rank at once) or in a sleep.
  void idleWait(int idleRounds);
  /// Records the first asynchronous error, tells peers (abort of transports). Only on the driving
  /// thread while an operation may run; other threads use requestAbort(). `explain`: C4D may add
  /// its diagnosis (waiting up to 0.5 s for the side channel's evidence). Returns the error
  /// recorded (the communicator's first).
  Status fail(const Status& st, bool explain = true);
  /// From any thread: makes the driving thread fail the communicator with `st` at its next poll
  /// (or does it now if no operation runs), so transports are only ever touched by one thread.
  void requestAbort(const Status& st);
  /// From any thread, while init runs on another (a nonblocking init): its waits for the peers end
  /// at once and init fails, so that an abort or destroy does not wait for C4_TIMEOUT. A no-op
  /// once init completed.
  void cancelInit();
  /// init was cancelled (ExecContext: the zero-copy probe's wait ends).
  bool cancelled() const override { return cancelled_.load(std::memory_order_acquire); }
  /// Ok, or the error every call on a failed communicator returns.
  Status failure();

  void* scratch(size_t bytes);
  /// Frees what is rebuilt on demand: cached plans and the scratch buffer (commSuspend).
  void releaseCaches();

  /// A buffer registered with every transport (commRegister).
  struct Registration {
    void* buff = nullptr;
    size_t size = 0;
    std::vector<std::unique_ptr<transport::MemRegion>> regions;  // per transport
  };
  /// Registers [buff, buff + size) with every transport (driving thread). The communicator owns
  /// the registration until deregisterMemory or its destruction.
  Status registerMemory(void* buff, size_t size, Registration** out);
  /// kInvalidArgument for a handle this communicator did not hand out (or already released).
  Status deregisterMemory(Registration* reg);
  /// Whether [p, p + len) lies inside one registration of this communicator (driving thread).
  bool registeredRange(const void* p, size_t len) const;
  // ---- ExecContext ----
  int thisRank() const override { return rank; }
  int numRanks() const override { return nranks; }
  transport::Caps capsOf(int peer) const override;
  uint8_t transportIndexOf(int peer) const override;
  Status progress() override { return progressTransports(); }
  uint64_t transportProgress() const override;
  trace::Recorder& tracer() override { return recorder; }
  Watchdog& watchdog() override { return watchdog_; }
  // ---- ProgressHost (core/comm_jobs.cc) ----
  void runJob(Job& job) override;
  void betweenJobs() override;
  bool abortRequested() const override { return state.abortPending(); }
  void takeAbort() override { takeAbortRequest(); }
  bool signalsAwaited() const override { return rma.devicePolling(); }
  const std::vector<pollfd>& idleFds() const override { return waitFds; }
  bool armIdleWait() override;
  void releaseStreams(const Job& job) override;
  bool sharesCores() const override { return oversubscribed; }

 private:
  // The communicator's own parts, which share its state (docs/architecture.md, "a service gets
  // what it needs of the communicator").
  friend class DevicePath;
  friend class CallObservers;

  /// The router's rules 1-5 for `op` (core/route.hpp); an error for buffers it refuses.
  Status route(const OpDesc& op, bool inGroup, Routing* out) const;
  /// The router's rules 6-8 (core/route.hpp): the path of a collective being prepared (p->sig set).
  Status choosePath(const OpDesc& op, PreparedCall* p);
  /// Runs `job` on the progress thread: waits for it (blocking communicators, or `forceWait`) or
  /// returns kInProgress (non-blocking: commGetAsyncError reports the outcome).
  Status queueJob(const std::shared_ptr<Job>& job, bool forceWait = false);
  /// Writes the trace file (if it ever traced); a failure is logged, never returned.
  void dumpTrace(trace::DumpReason why);
  Rma::OnPath windowPath();
  Status checkStreamOneSided(const char* fn, void* stream, bool behindGroupCalls);

  // ---- identity ----
  int rank = 0;
  int nranks = 0;
  Config config;
  std::string tag;
  int localRanks = 1;                               // ranks on this host
  bool oversubscribed = false;                      // more ranks than cores on this machine (any network namespace)
  std::vector<pollfd> waitFds;                      // WaitSource::waitFd of the transports in use
  std::vector<transport::WaitSource*> waitSources;  // theirs (armWait before blocking)
  transport::CpuSharing* cpuSharing = nullptr;      // same-host peers (idle back-off asks it)
  int64_t timeoutMs = 0;                            // Config::timeoutMs or C4_TIMEOUT
  int64_t spinNs = -1;                              // Config::spinUs in ns; -1: the transport's (C4_SHM_SPIN)

  std::unique_ptr<Bootstrap> bootstrap;
  std::vector<RankInfo> peers;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<transport::Transport*> peerTransport;  // per rank, null if unreachable
  std::vector<uint8_t> peerTransportIndex;           // per rank: index in transports

  // ---- state ----
  uint64_t collSeq = 0;
  std::vector<uint64_t> p2pSendSeq, p2pRecvSeq;
  std::vector<UserOp> userOps;    // RedOp value kNumBuiltinOps + i
  CommState state;                // failed, abort pending, revoked (core/comm_state.hpp)
  std::atomic<bool> busy{false};  // a thread runs an operation on it (caller-driven mode)
  bool finalized = false;
  std::atomic<bool> suspended{false};  // commSuspend until commResume
  uint32_t shrinks = 0;                // commShrink calls on this communicator (each has its own bootstrap tag)
  bool growIdPending = false;          // commGrowId made growId; no commGrow consumed it yet
  UniqueId growId;
  Rma rma;  // windows and signals (one-sided calls)

  /// Calls on CUDA memory, and their StreamGate (created at the first such call): declared before
  /// the engine, so that the engine's thread is gone when the gate releases the streams and frees
  /// the staging.
  DevicePath device{this};
  int cudaDevice = -1;  // the caller's current GPU at init (ncclCommCuDevice); -1 without GPUs
  /// The progress thread (C4_PROGRESS_THREAD, or a non-blocking communicator); null: the caller
  /// drives every operation on its own thread.
  std::unique_ptr<ProgressEngine> engine;

  Tuner tuner;
  LanePlanner lanePlanner;  // C4P: the network transport's lane plan
  OneShot oneShot;
  ZeroCopy zeroCopy;
  trace::Recorder recorder;
  /// C4D: telemetry (always), heartbeats and diagnosis (core/health.hpp).
  std::unique_ptr<HealthMonitor> health;
  /// What watches every call (core/observer.hpp), attached at init (core/call_observers.hpp).
  CallObservers observers;

  struct CacheKey {
    int coll, dtype, root;
    size_t count;
    bool aliased;
    int sched;  // the registered schedule (C4_SCHEDULE_FILE) the tuner takes for coll, else -1
    bool operator<(const CacheKey& o) const {
      return std::tie(coll, dtype, root, count, aliased, sched) <
             std::tie(o.coll, o.dtype, o.root, o.count, o.aliased, o.sched);
    }
  };
  /// The cached plan for `args`, built (tuned, generated, bound) on a miss.
  Result<CachedPlan*> cachedPlan(const sched::CollArgs& args, size_t nominalBytes);
  /// Performs a requested abort (driving thread).
  void takeAbortRequest();
  /// Waits until the inputs of the job's staged calls are on the host (their streams reached them).
  Status waitForStreams(const Job& job);

  std::map<CacheKey, std::pair<std::unique_ptr<CachedPlan>, std::list<CacheKey>::iterator>> cache_;
  std::list<CacheKey> lru_;
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  int probeNext_ = 0;          // where a probe of any source starts (round-robin)
  int64_t probeHealthMs_ = 0;  // last peer health check of probe()
  Watchdog watchdog_;
  std::vector<transport::Caps> caps_;  // per transport
  std::unique_ptr<ExecPath> messagePath_, oneShotPath_, zeroCopyPath_;
  std::map<Registration*, std::unique_ptr<Registration>> registrations_;  // live commRegister handles
  int cancelFd_ = -1;                   // eventfd, readable once cancelInit() was called
  std::atomic<bool> cancelled_{false};  // cancelInit() was called before init completed
  std::atomic<bool> initDone_{false};   // init completed
};

/// How long any wait (bootstrap, a peer, a collective) may see no progress, in ms: C4_TIMEOUT if
/// set, else config.timeoutMs if positive, else C4_TIMEOUT's default.
int64_t commTimeoutMs(const Config& config = {});

/// Live-communicator registry, so a destroyed or bogus pointer is an error, not a crash.
void registerComm(Comm* c);
void unregisterComm(Comm* c);
bool isLiveComm(const Comm* c);

}  // namespace c4
