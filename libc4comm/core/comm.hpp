// The communicator (c4::Comm) and the operations it runs.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "core/bootstrap.hpp"
#include "core/executor.hpp"
#include "core/oneshot.hpp"
#include "core/opdesc.hpp"
#include "core/tuner.hpp"
#include "core/zerocopy.hpp"
#include "sched/schedule.hpp"
#include "trace/recorder.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// A PreMulSum operator created on a communicator.
struct UserOp {
  bool live = false;
  DataType dtype = DataType::kFloat32;
  ScalarResidence residence = ScalarResidence::kHostImmediate;
  unsigned char value[8] = {0};   // the scalar, for kHostImmediate
  const void* pointer = nullptr;  // read at call time, for kDevice (host memory here)
};

struct Comm {
  Comm();
  ~Comm();

  /// Joins the communicator (bootstrap, transports). Blocking.
  Status init(int nranks, const UniqueId& id, int rank, const Config& config);

  /// Runs a collective to completion (blocking), or only builds it (see prepare/Executor).
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

  /// A plan built for one distinct operation (coll, dtype, count, root) and the executor bound
  /// to it; cached, so a repeated call only rebinds buffers.
  struct CachedPlan {
    ExecPlan plan;
    Executor exec;
    size_t schedScratch = 0;  // bytes of scratch the schedule uses (aligned)
    sched::Algo algo = sched::Algo::kRing;
  };
  /// What runs one call: an executor (cached or owned) plus the call's buffers.
  struct Prepared {
    Executor* exec = nullptr;  // message path; null for one-shot and no-op calls
    bool oneShot = false;      // runs through the shared arena (see OneShot)
    bool zeroCopy = false;     // offered to the zero-copy path, not fallen back (see ZeroCopy)
    const void* bases[kNumBufBases] = {nullptr, nullptr, nullptr, nullptr};
    OpDesc op;
    OpSig sig;
    kernels::KOp kop = kernels::KOp::kSum;
    bool collective = false;
    bool noop = false;
    bool postDivide = false;               // integer Avg: divide the result by nranks afterwards
    uint8_t traceAlgo = trace::kAlgoNone;  // what ran (trace::Event::algo)
    uint64_t traceT0 = 0;                  // trace clock at prepare; 0: not traced here
    bool traceOneShot = false;             // traced, and OneShot records the event (see there)
    std::unique_ptr<CachedPlan> owned;     // point-to-point batches are built per call
  };
  Status prepareCollective(const OpDesc& op, Prepared* out);
  Status prepareP2p(const std::vector<OpDesc>& ops, Prepared* out);
  /// Starts / advances a prepared call on whichever path it takes.
  Status startPrepared(Prepared* p);
  Status pollPrepared(Prepared* p, bool* done, bool* progressed);
  /// After a prepared op completes: epilogue (integer Avg division).
  void finish(Prepared* p);
  /// The op event of a prepared collective, without its times.
  trace::Event opEvent(const Prepared* p) const;
  /// Records the op event(s) of a completed prepared call (level op and above).
  void traceOp(const Prepared* p);
  /// Clock alignment to rank 0 for the trace (which: 0 at init, 1 at finalize); a failure only
  /// leaves the sample out. Collective over the communicator.
  void traceClockSync(int which, int64_t timeoutMs);

  /// Connection to `peer` through the transport that reaches it.
  Status connection(int peer, transport::Connection** out);
  /// Advances every transport.
  Status progressTransports();
  /// Back-off after `idleRounds` consecutive polls without progress: spin, yield, then block up to
  /// C4_SHM_SLEEP_US, on the network transports' wait fds when there are any (so arriving data
  /// wakes the rank at once) or in a sleep.
  void idleWait(int idleRounds);
  /// Records the first asynchronous error, tells peers (abort of transports).
  void fail(const Status& st);
  /// Ok, or the error every call on a failed communicator returns.
  Status failure();

  void* scratch(size_t bytes);

  // ---- identity ----
  int rank = 0;
  int nranks = 0;
  Config config;
  std::string tag;
  int localRanks = 1;                            // ranks on this host
  bool oversubscribed = false;                   // more ranks than cores on this machine (any network namespace)
  std::vector<pollfd> waitFds;                   // Transport::waitFd of the transports in use
  transport::Transport* shmTransport = nullptr;  // same-host peers (idle back-off asks it)
  int64_t timeoutMs = 0;                         // Config::timeoutMs or C4_TIMEOUT
  int64_t spinNs = -1;                           // Config::spinUs in ns; -1: the transport's (C4_SHM_SPIN)

  std::unique_ptr<Bootstrap> bootstrap;
  std::vector<RankInfo> peers;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<transport::Transport*> peerTransport;  // per rank, null if unreachable

  // ---- state ----
  uint64_t collSeq = 0;
  std::vector<uint64_t> p2pSendSeq, p2pRecvSeq;
  std::vector<UserOp> userOps;  // RedOp value kNumBuiltinOps + i
  std::mutex errMu;
  Status asyncError;
  std::atomic<bool> failed{false};
  bool finalized = false;
  uint32_t shrinks = 0;  // commShrink calls on this communicator (each has its own bootstrap tag)

  Tuner tuner;
  OneShot oneShot;
  ZeroCopy zeroCopy;
  trace::Recorder tracer;

 private:
  struct CacheKey {
    int coll, dtype, root;
    size_t count;
    bool operator<(const CacheKey& o) const {
      return std::tie(coll, dtype, root, count) < std::tie(o.coll, o.dtype, o.root, o.count);
    }
  };
  /// The cached plan for `args`, built (tuned, generated, bound) on a miss.
  Result<CachedPlan*> cachedPlan(const sched::CollArgs& args, size_t nominalBytes);

  std::map<CacheKey, std::pair<std::unique_ptr<CachedPlan>, std::list<CacheKey>::iterator>> cache_;
  std::list<CacheKey> lru_;
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  int probeNext_ = 0;          // where a probe of any source starts (round-robin)
  int64_t probeHealthMs_ = 0;  // last peer health check of probe()
};

/// How long any wait (bootstrap, a peer, a collective) may see no progress, in ms: C4_TIMEOUT if
/// set, else config.timeoutMs if positive, else C4_TIMEOUT's default.
int64_t commTimeoutMs(const Config& config = {});

/// Live-communicator registry, so a destroyed or bogus pointer is an error, not a crash.
void registerComm(Comm* c);
void unregisterComm(Comm* c);
bool isLiveComm(const Comm* c);

}  // namespace c4
