// C4D: health checks, diagnosis and fail-fast (docs/c4d.md).
//
// Three parts, per communicator:
//  - Telemetry (always on): the driving thread stamps each collective's entry and exit (sequence
//    number, trace-clock ticks, bytes) into atomics and a small ring; a few stores per call.
//  - HealthMonitor: a thread that keeps a mesh of heartbeats over the bootstrap's authenticated
//    point-to-point links (independent of the data path): every C4_HEARTBEAT_MS each rank tells
//    every other where it is (operation entered / left, how long ago, whom it waits for, its
//    network peers' receive rates). A link that closes without a goodbye is a dead rank; a
//    heartbeat missing for C4_HEARTBEAT_TIMEOUT marks a rank unresponsive.
//  - Diagnosis (core/diagnose.hpp): when the watchdog fires, or a transport fails, the monitor
//    classifies from the ranks' states (communication hang, non-communication hang, dead rank);
//    the reporter (the lowest live rank) watches for slow links and stragglers. Each diagnosis is
//    a JSON record sent to the log, C4_DIAG_FILE, the trace (via the driving thread) and the
//    callback of setDiagnosisCallback; a hang or death fails the communicator on every survivor.
//
// Threading: Telemetry's writers are the driving thread; everything else is guarded by mu_ or
// atomic. The monitor never touches a transport: the driving thread publishes what the monitor
// needs (publish(), stall reports) at most every half heartbeat period.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "common/params.hpp"
#include "core/bootstrap.hpp"
#include "core/diagnose.hpp"
#include "transports/transport.hpp"

namespace c4 {
/// C4_FAULT's syntax (parseFaults), for the parameter registry.
bool checkFaultSpec(const std::string& text, std::string* why);

C4_PARAM_INT(Health, "C4_HEALTH", nullptr, 1, 0, 1, kParamNone,
             "C4D health checks: 1 = heartbeats over the bootstrap side channel, diagnosis of hangs, deaths and "
             "slowdowns (docs/c4d.md); 0 = off (the watchdog alone names whom an operation waits for)")
C4_PARAM_INT(HeartbeatMs, "C4_HEARTBEAT_MS", nullptr, 1000, 50, 600000, kParamNone,
             "C4D: milliseconds between a rank's heartbeats")
C4_PARAM_INT(HeartbeatTimeout, "C4_HEARTBEAT_TIMEOUT", nullptr, 10000, 100, 86400000, kParamNone,
             "C4D: milliseconds without a heartbeat after which a rank counts as unresponsive")
C4_PARAM_STR(DiagFile, "C4_DIAG_FILE", nullptr, "", {}, kParamNone,
             "C4D: file the diagnosis records are appended to, one JSON object per line (%h = host, %p = pid, "
             "%r = rank, %% = %; a symbolic link is not followed); empty = none (they still go to the log and the "
             "trace)")
C4_PARAM_INT(StragglerMs, "C4_STRAGGLER_MS", nullptr, 100, 1, 3600000, kParamNone,
             "C4D: a rank that arrives at collectives this many milliseconds (median) after the others, in most "
             "of at least 8 recent ones, is reported as a straggler")
C4_PARAM_INT(SlowLinkPercent, "C4_SLOW_LINK_PERCENT", nullptr, 25, 1, 99, kParamNone,
             "C4D: a pair of ranks on different hosts whose receive rate stays below this percentage of the fast "
             "pairs' for 3 looks is reported as a slow link (or a slow node when all of a rank's pairs are)")
C4_PARAM_STR(Fault, "C4_FAULT", nullptr, "", checkFaultSpec, kParamNone,
             "C4D fault injection for tests (docs/c4d.md): kind:key=value,...;... with kind delay, kill, stop, "
             "stall or drop; inert unless set")

/// What C4D needs of its communicator, handed over at start (core/comm.cc fills it): who the ranks
/// are, the bootstrap's side channel the heartbeats ride on, the connections' lanes (their rates
/// for the heartbeats, C4_FAULT's drills), a way to fail the communicator and the tracer's notes.
struct HealthHost : RankDirectory {
  std::string tag;  // the communicator's (diagnosis records)
  /// The lanes of the transport that reaches `peer` (null: it has none, or no transport does).
  std::function<transport::LaneSetup*(int peer)> lanesTo;
  /// The connection to `peer`, opened if it is not yet (C4_FAULT's drills).
  std::function<Status(int peer, transport::Connection** out)> connect;
  /// From the health thread: the driving thread fails the communicator with `st` (Comm::requestAbort).
  std::function<void(const Status&)> requestAbort;
  /// Notes in the trace (on the driving thread: drainTrace).
  std::function<void(const std::string&)> traceNote;
};

/// What the driving thread records of each collective (always on).
class Telemetry {
 public:
  static constexpr int kHistory = 64;
  /// Collective `seq` starts at `ticks` (trace clock; 0: not timed, as the one-shot path's).
  void enter(uint64_t seq, uint64_t ticks) {
    Slot& s = ring_[seq % kHistory];
    s.tag.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.enter.store(ticks, std::memory_order_relaxed);
    s.leave.store(0, std::memory_order_relaxed);
    s.p2p.store(p2pTotal_, std::memory_order_relaxed);
    s.tag.store(seq + 1, std::memory_order_release);
    enteredTicks_.store(ticks, std::memory_order_relaxed);
    entered_.store(seq + 1, std::memory_order_release);
  }
  /// It ended at `ticks`, having moved `bytes` (nominal).
  void leave(uint64_t seq, uint64_t ticks, uint64_t bytes) {
    ring_[seq % kHistory].leave.store(ticks, std::memory_order_relaxed);
    leftTicks_.store(ticks, std::memory_order_relaxed);
    left_.store(seq + 1, std::memory_order_release);
    bytes_.store(bytes_.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  }

  // ---- any thread ----
  /// A point-to-point batch starts (true) or ends at `ticks` (0: not timed). Its time counts as
  /// inside c4comm: a rank waiting in a send/receive between collectives is no straggler.
  void setP2p(bool on, uint64_t ticks) {
    p2p_.store(on, std::memory_order_relaxed);
    if (on) {
      p2pSince_ = ticks;
    } else if (p2pSince_ && ticks > p2pSince_) {
      p2pTotal_ += ticks - p2pSince_;
      p2pSince_ = 0;
    }
  }
  bool inP2p() const { return p2p_.load(std::memory_order_relaxed); }
  /// A blocking library call that is no collective (window registration, split, shrink) starts
  /// (`what`: a string literal) or ends (null): a rank waiting in it is inside c4comm.
  void setInside(const char* what) { inside_.store(what, std::memory_order_relaxed); }
  const char* inside() const { return inside_.load(std::memory_order_relaxed); }
  uint64_t entered() const { return entered_.load(std::memory_order_acquire); }  // seq + 1, 0: none
  uint64_t left() const { return left_.load(std::memory_order_acquire); }
  uint64_t enteredTicks() const { return enteredTicks_.load(std::memory_order_relaxed); }
  uint64_t leftTicks() const { return leftTicks_.load(std::memory_order_relaxed); }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  struct Op {
    uint64_t seq;
    uint64_t enter, leave;  // ticks; leave 0: not ended
    uint64_t p2p;           // ticks spent in point-to-point batches before it (cumulative)
  };
  /// The recent operations whose records are consistent, oldest first.
  std::vector<Op> history() const;

 private:
  struct Slot {
    std::atomic<uint64_t> tag{0}, enter{0}, leave{0}, p2p{0};
  };
  Slot ring_[kHistory];
  std::atomic<uint64_t> entered_{0}, left_{0}, enteredTicks_{0}, leftTicks_{0}, bytes_{0};
  std::atomic<bool> p2p_{false};
  std::atomic<const char*> inside_{nullptr};
  uint64_t p2pSince_ = 0, p2pTotal_ = 0;  // driving thread
};

/// A fault C4_FAULT injects (docs/c4d.md). Parsed at init; inert unless set.
struct FaultSpec {
  enum Kind { kDelay, kKill, kStop, kStall, kDrop } kind = kDelay;
  int rank = -1;    // the rank that misbehaves (-1: every rank)
  int64_t op = -1;  // before collective `op` (-1: every collective from `from` on)
  int64_t from = 0;
  int64_t ms = 0;  // delay
  int peer = -1;   // stall, drop: the connection to this peer (-1: every peer)
  int lane = -1;   // stall: this lane (-1: every lane)
};
/// Parses C4_FAULT's syntax; kInvalidArgument naming the bad part.
Status parseFaults(const std::string& text, std::vector<FaultSpec>* out);

class HealthMonitor {
 public:
  HealthMonitor();
  ~HealthMonitor();

  /// Parses C4_FAULT and joins the process's health thread (after the transports are up). Without
  /// heartbeats (one rank, C4_HEALTH=0) only the faults are armed.
  Status start(HealthHost host);
  /// Leaves the health thread; `goodbye` (destroy, abort) tells the peers this rank leaves in
  /// order, so its closing links are not a death. Idempotent.
  void stop(const char* goodbye);

  Telemetry& telemetry() { return telemetry_; }
  bool running() const { return running_; }

  // ---- the driving thread ----
  /// True when publish() is due (one relaxed load and a compare).
  bool publishDue(uint64_t nowTicks) const { return nowTicks >= nextPublish_.load(std::memory_order_relaxed); }
  /// Copies the network peers' receive rates and lanes for the heartbeats (every half period).
  void publish(uint64_t nowTicks);
  /// The running operation `what` made no progress for a while: whom it waits for and, per rank,
  /// its connection's state.
  void reportStall(const std::string& what, const std::vector<int>& waitingOn, const std::vector<std::string>& states,
                   const std::vector<int>& stuckTo, int64_t stalledNs);
  /// The stall ended (the operation progressed or ended).
  void clearStall();
  /// The watchdog fired (collective `seq`, or -1 for point-to-point): classifies from the ranks'
  /// states, records the diagnosis, tells the peers (who fail too), and returns `st` with the
  /// diagnosis appended.
  Status diagnoseHang(const Status& st, int64_t seq);
  /// A failure from elsewhere (a transport saw a peer die or a connection break): waits up to
  /// 0.5 s for the side channel's evidence (a closed link, a gone process, a peer's diagnosis) and
  /// returns `st` with the diagnosis appended, or `st` if there is none.
  Status explainFailure(const Status& st);
  /// The communicator failed with `st`: tells the peers at once, so that this rank exiting
  /// afterwards is not taken for a death. Once.
  void noteFailure(const Status& st);
  /// Diagnoses waiting to be recorded in the trace (the recorder's writer is the driving thread).
  bool traceDue() const { return traceDue_.load(std::memory_order_relaxed); }
  void drainTrace();
  /// Whether C4_FAULT set faults, and runs those due before collective `seq`.
  bool armed() const { return !faults_.empty(); }
  void injectBefore(uint64_t seq);

  // ---- any thread ----
  void setCallback(DiagnosisCallback cb);
  /// Every diagnosis this rank made or received, oldest first.
  std::vector<Diagnosis> diagnoses() const;

 private:
  struct Peer;
  // The health thread, every 50 ms.
  void tick(int64_t nowNs);
  /// Takes the peers' messages. `failing`: this rank fails already (the driving thread explains
  /// it), so a peer's fatal diagnosis is recorded but does not fail it again.
  void receive(int64_t nowNs, bool failing);
  static bool isFatal(const Diagnosis& d);
  /// Per rank, why it is gone ("" = no evidence): its side-channel stream ended without a goodbye,
  /// or its process is gone and its stream was read to the end. Taken before receive() takes the
  /// messages, so a goodbye that came before the end always wins. `silentOnly`: look for the process
  /// only of ranks silent for two heartbeat periods.
  std::vector<std::string> deathEvidence(int64_t nowNs, bool silentOnly);
  void checkLinks(int64_t nowNs, const std::vector<std::string>& gone);
  void sendHeartbeats(int64_t nowNs);
  void sendTo(int rank, const std::string& payload);
  void analyzeSlow(int64_t nowNs);
  /// Logs `d`, appends it to C4_DIAG_FILE (`mine`: this rank made it), queues it for the trace and
  /// calls the callback.
  void record(Diagnosis& d, bool mine);
  /// Sends `d` to every peer (`failing`: this rank fails because of it, and so should they).
  void broadcast(const Diagnosis& d, bool failing);
  /// Fails the communicator with `d` (once).
  void failComm(const Diagnosis& d, bool fromPeer);
  Status annotate(const Status& st, const Diagnosis& d, bool fromPeer) const;
  RankView viewOf(int r, int64_t nowNs) const;  // under mu_
  bool isReporter() const;                      // under mu_
  int64_t nowNs() const;

  HealthHost host_;
  Telemetry telemetry_;
  std::vector<FaultSpec> faults_;
  std::atomic<bool> running_{false};
  int64_t periodMs_ = 1000, timeoutMs_ = 10000;
  std::string diagPath_;
  std::atomic<uint64_t> nextPublish_{~uint64_t{0}};  // never while not running
  int64_t nextBeatNs_ = 0;                           // health thread
  uint64_t hbSeq_ = 0;                               // health thread
  int64_t ratesLoggedNs_ = 0;                        // health thread

  mutable std::mutex mu_;  // everything below
  std::vector<Peer> peers_;
  std::vector<PeerRate> rates_;  // this rank's network peers (publish)
  std::vector<int> waitingOn_;   // the stall report
  std::vector<std::string> stallStates_;
  std::vector<int> stuckTo_;
  std::string stallWhat_;
  bool failNoticeSent_ = false;
  int64_t stallSinceNs_ = 0;
  std::string failedWith_;  // the communicator failed (diagnosed, or explained as far as possible)
  std::vector<Diagnosis> emitted_;
  std::vector<std::string> traceQueue_;
  std::atomic<bool> traceDue_{false};
  DiagnosisCallback callback_;
  SlowDetector slow_;
};

}  // namespace c4
