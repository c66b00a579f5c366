#include "core/call_observers.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/logging.hpp"
#include "common/opsig.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "core/paths.hpp"

// The built-in observers' per-call hooks go inline into CallObservers' dispatch (below).
#define C4_HOT __attribute__((always_inline))

namespace c4 {

trace::Event callEvent(const PreparedCall& p, int nranks) {
  trace::Event e;
  e.type = trace::EventType::kOp;
  e.algo = p.traceAlgo;
  const OpDesc& op = p.op;
  e.bytes = nominalBytes(op, nranks);
  e.seq = static_cast<uint32_t>(p.sig.seq);
  e.peer = p.sig.root;
  e.coll = p.sig.coll;
  e.dtype = p.sig.dtype;
  e.redop = p.sig.op;
  e.flags =
      static_cast<uint8_t>((op.sendbuff == op.recvbuff ? trace::kFlagInPlace : 0) | (p.noop ? trace::kFlagNoop : 0) |
                           (p.kind == PathKind::kOneShot ? trace::kFlagNoEnd : 0));
  return e;
}

namespace {

/// C4_FAULT: the faults due before a collective (docs/c4d.md).
class FaultInjection final : public CallObserver {
 public:
  explicit FaultInjection(HealthMonitor& h) : h_(h) {}
  unsigned events() const override { return kStarted; }
  void started(PreparedCall& p) override {
    if (p.collective) h_.injectBefore(p.sig.seq);
  }

 private:
  HealthMonitor& h_;
};

/// The watchdog (core/watchdog.hpp): entered and left with each call, told of progress, asked on
/// idle rounds. Its timeout is the verdict the observers after it read.
class WatchdogObserver final : public CallObserver {
 public:
  WatchdogObserver(Watchdog& w, const Comm& c) : w_(w), c_(c) {}
  unsigned events() const override { return kStarted | kProgressed | kIdle | kFinished | kFailed; }
  C4_HOT void started(PreparedCall& p) override { w_.enter(p.sig); }
  C4_HOT void progressed(const PreparedCall&) override { w_.moved(); }
  Status idle(const PreparedCall& p, Status verdict) override {
    if (!verdict.isOk()) return verdict;
    return w_.idle(
        c_.transportProgress(), [&] { return what(p); }, [&] { return waitingOn(p); });
  }
  C4_HOT void finished(PreparedCall&, uint64_t) override { w_.leave(); }
  void failed(const Status&) override { w_.leave(); }

 private:
  static std::string what(const PreparedCall& p) {
    return p.probe ? std::string("receive from any source") : describeSig(p.sig);
  }
  std::string waitingOn(const PreparedCall& p) const {
    if (p.probe)
      return p.op.root == kAnySource ? strFormat("a send from any of the other %d rank(s)", c_.numRanks() - 1)
                                     : strFormat("a send from rank %d", p.op.root);
    return p.path ? p.path->waitingOn(&p) : std::string("a send from a peer");
  }
  Watchdog& w_;
  const Comm& c_;
};

/// C4D (core/health.hpp): the telemetry of every call, what a stalled call waits for, the
/// diagnosis when the watchdog fires, the explanation of a failure and the notice to the peers.
class HealthObserver final : public CallObserver {
 public:
  HealthObserver(HealthMonitor& h, const Watchdog& w, int64_t timeoutMs,
                 const std::vector<transport::Transport*>& peerTransport)
      : h_(h), w_(w), timeoutMs_(timeoutMs), peerTransport_(peerTransport), armed_(h.armed()) {}
  // No kProgressed: a stall report ends at the call's end, or at the first idle round that sees
  // the call moved again (so progress costs C4D nothing).
  unsigned events() const override { return kStarted | kIdle | kFinished | kFailed; }

  C4_HOT void started(PreparedCall& p) override {
    // Always on, a few stores (the trace's clock read when there is one).
    if (p.collective) {
      // One-shot calls (a few hundred ns) are not timed: two clock reads cost them ~8% (0 = unknown;
      // C4D judges stragglers from the timed collectives). With C4_FAULT, the delay just injected
      // must not count as time inside the call.
      const uint64_t t0 = p.kind == PathKind::kOneShot && !armed_ ? 0
                          : p.traceT0 && !armed_                  ? p.traceT0
                                                                  : trace::ticks();
      h_.telemetry().enter(p.sig.seq, t0);
    } else {
      h_.telemetry().setP2p(true, p.traceT0 ? p.traceT0 : trace::ticks());
    }
  }
  Status idle(const PreparedCall& p, Status verdict) override {
    // A probe waits for a send the user may never make: the watchdog's error is the whole story.
    if (p.probe || !h_.running()) return verdict;
    if (!verdict.isOk()) {
      // The watchdog fired: C4D says why, from every rank's state, and tells the others.
      reportStall(p);
      return h_.diagnoseHang(verdict, p.collective ? static_cast<int64_t>(p.sig.seq) : -1);
    }
    // Stalled for a second (or half the timeout): the heartbeats say whom this rank waits for.
    const int64_t stalled = w_.stalledNs();
    if (stallReported_ && stalled == 0) clearStall();  // it moved since the report
    if (stalled > std::min<int64_t>(1000, timeoutMs_ / 2) * 1000000LL &&
        (!stallReported_ || w_.lastCheckNs() - stallReportNs_ > 500000000LL))
      reportStall(p);
    if (h_.traceDue()) h_.drainTrace();
    // A long operation (a slow link) still refreshes the receive rates the heartbeats carry.
    if ((++idlePolls_ & 255) == 0) {
      const uint64_t now = trace::ticks();
      if (h_.publishDue(now)) h_.publish(now);
    }
    return verdict;
  }
  C4_HOT void finished(PreparedCall& p, uint64_t t1) override {
    // Telemetry, and (every half heartbeat) the peers' rates for the heartbeats.
    if (p.collective)
      h_.telemetry().leave(p.sig.seq, t1, p.op.count * dataTypeSize(p.op.dtype));
    else
      h_.telemetry().setP2p(false, t1);
    if (t1 && h_.publishDue(t1)) h_.publish(t1);
    if (stallReported_) clearStall();
    if (h_.traceDue()) h_.drainTrace();
  }
  Status explain(const Status& st) override { return h_.explainFailure(st); }
  void failed(const Status& st) override { h_.noteFailure(st); }  // the peers learn why first

 private:
  void clearStall() {
    h_.clearStall();
    stallReported_ = false;
  }
  /// Tells C4D whom the stalled call `p` waits for, and which of those links hold data that does
  /// not move (a lane with something queued or unacknowledged).
  void reportStall(const PreparedCall& p) {
    std::vector<int> ranks, stuck;
    std::vector<std::string> states;
    if (p.path)
      for (auto& w : p.path->waitingRanks(&p)) {
        ranks.push_back(w.first);
        states.push_back(std::move(w.second));
        transport::Transport* t = peerTransport_[static_cast<size_t>(w.first)];
        transport::Connection* conn = t && t->laneSetup() ? t->laneSetup()->existingConnection(w.first) : nullptr;
        bool busy = false;
        for (int l = 0; conn && l < conn->numLanes(); ++l) {
          const transport::Lane* ln = conn->lane(l);
          if (!ln || !ln->busy()) continue;
          busy = true;
          const transport::LaneSnapshot s = ln->snapshot();
          states.back() +=
              strFormat("; lane %d %s -> %s has data in flight", l, s.localAddr.c_str(), s.remoteAddr.c_str());
        }
        if (busy) stuck.push_back(w.first);
      }
    h_.reportStall(describeSig(p.sig), ranks, states, stuck, w_.stalledNs());
    stallReported_ = true;
    stallReportNs_ = w_.lastCheckNs();
  }

  HealthMonitor& h_;
  const Watchdog& w_;
  const int64_t timeoutMs_;
  const std::vector<transport::Transport*>& peerTransport_;  // per rank (the communicator's)
  const bool armed_;                                         // C4_FAULT set faults (they may delay a call's start)
  bool stallReported_ = false;                               // C4D has the running call's stall report
  int64_t stallReportNs_ = 0;
  uint32_t idlePolls_ = 0;  // idle rounds (C4D's rates during long calls)
};

/// The tracer's op events: recorded open as a call starts, completed in place as it ends
/// (trace::kFlagOpen), so a call that never ends is in the trace too.
class TraceObserver final : public CallObserver {
 public:
  TraceObserver(trace::Recorder& r, int rank, int nranks) : r_(r), rank_(rank), nranks_(nranks) {}
  unsigned events() const override { return kStarted | kFinished | kFailed; }
  C4_HOT void started(PreparedCall& p) override {
    if (p.traceT0) record(p, true, 0);
  }
  C4_HOT void finished(PreparedCall& p, uint64_t t1) override {
    if (p.traceT0) record(p, false, t1);
  }
  void failed(const Status& st) override { r_.error(static_cast<int>(st.code()), st.message(), -1); }

 private:
  void record(PreparedCall& p, bool open, uint64_t endTicks) {
    const uint64_t t1 = open ? p.traceT0 : endTicks ? endTicks : trace::ticks();
    auto put = [&](trace::Event& e, size_t k) {
      e.t0 = p.traceT0;
      e.t1 = t1;
      if (open) {
        e.flags |= trace::kFlagOpen;
        const uint64_t at = r_.recordOpen(e);
        if (p.traceOpen++ == 0) {
          p.traceFirst = at;  // a collective's one event: no allocation
        } else {
          p.traceMore.push_back(at);
        }
      } else if (k < p.traceOpen) {
        r_.complete(k == 0 ? p.traceFirst : p.traceMore[k - 1], e);
      } else {
        r_.record(e);
      }
    };
    if (p.collective) {
      trace::Event e = callEvent(p, nranks_);
      put(e, 0);
      return;
    }
    // A point-to-point batch: one event per send/receive (self copies included), same interval.
    if (!p.owned) return;
    trace::Event e;
    e.type = trace::EventType::kOp;
    e.algo = p.traceAlgo;
    const ExecPlan& plan = p.owned->plan;
    for (size_t k = 0; k < plan.steps.size(); ++k) {
      const ExecStep& s = plan.steps[k];
      e.bytes = s.bytes;
      e.peer = s.kind == sched::StepKind::kCopy ? rank_ : s.peer;
      e.coll = static_cast<uint8_t>(s.kind == sched::StepKind::kRecv ? Coll::kRecv : Coll::kSend);
      const OpSig& sig = plan.sigOf(s);
      e.seq = static_cast<uint32_t>(sig.seq);
      e.dtype = sig.dtype;
      e.flags = 0;
      put(e, k);
    }
  }
  trace::Recorder& r_;
  const int rank_, nranks_;
};

/// C4P: between calls, the lanes' striping weights follow their throughput, and a retired or slow
/// lane moves (core/lane_planner.hpp).
class LanePlanObserver final : public CallObserver {
 public:
  explicit LanePlanObserver(LanePlanner& l) : l_(l) {}
  unsigned events() const override { return kFinished; }
  void finished(PreparedCall&, uint64_t) override { l_.rebalance(); }

 private:
  LanePlanner& l_;
};

}  // namespace

struct CallObservers::Builtins {
  std::optional<FaultInjection> faults;
  std::optional<WatchdogObserver> watchdog;
  std::optional<HealthObserver> health;
  std::optional<TraceObserver> trace;
  std::optional<LanePlanObserver> lanes;
};

CallObservers::CallObservers() = default;
CallObservers::~CallObservers() = default;

void CallObservers::attachBuiltins(Comm* c) {
  b_ = std::make_unique<Builtins>();
  if (c->health->armed()) b_->faults.emplace(*c->health);
  b_->watchdog.emplace(c->watchdog(), *c);
  b_->health.emplace(*c->health, c->watchdog(), c->timeoutMs, c->peerTransport);
  b_->trace.emplace(c->recorder, c->rank, c->nranks);
  if (c->lanePlanner.active()) b_->lanes.emplace(c->lanePlanner);
}

void CallObservers::add(std::unique_ptr<CallObserver> o) {
  const unsigned ev = o->events();
  CallObserver* raw = o.get();
  owned_.push_back(std::move(o));
  if (ev & CallObserver::kStarted) started_.push_back(raw);
  if (ev & CallObserver::kProgressed) progressed_.push_back(raw);
  if (ev & CallObserver::kIdle) idle_.push_back(raw);
  if (ev & CallObserver::kFinished) finished_.push_back(raw);
  if (ev & CallObserver::kFailed) failed_.push_back(raw);
}

size_t CallObservers::size() const {
  size_t n = owned_.size();
  if (b_)
    n += b_->faults.has_value() + b_->watchdog.has_value() + b_->health.has_value() + b_->trace.has_value() +
         b_->lanes.has_value();
  return n;
}

void CallObservers::started(PreparedCall& p) {
  if (b_) {
    if (b_->faults) b_->faults->started(p);
    b_->watchdog->started(p);
    b_->health->started(p);
    b_->trace->started(p);
  }
  for (CallObserver* o : started_) o->started(p);
}

void CallObservers::progressed(const PreparedCall& p) {
  if (b_) b_->watchdog->progressed(p);
  for (CallObserver* o : progressed_) o->progressed(p);
}

Status CallObservers::idle(const PreparedCall& p) {
  Status verdict;
  if (b_) {
    verdict = b_->watchdog->idle(p, std::move(verdict));
    verdict = b_->health->idle(p, std::move(verdict));
  }
  for (CallObserver* o : idle_) verdict = o->idle(p, std::move(verdict));
  return verdict;
}

void CallObservers::finished(PreparedCall& p, uint64_t endTicks) {
  if (b_) {
    b_->watchdog->finished(p, endTicks);
    b_->health->finished(p, endTicks);
    b_->trace->finished(p, endTicks);
    if (b_->lanes) b_->lanes->finished(p, endTicks);
  }
  for (CallObserver* o : finished_) o->finished(p, endTicks);
}

Status CallObservers::explain(Status st) {
  if (b_) st = b_->health->explain(st);
  for (CallObserver* o : failed_) st = o->explain(st);
  return st;
}

void CallObservers::failed(const Status& st) {
  if (b_) {
    b_->watchdog->failed(st);
    b_->health->failed(st);
    b_->trace->failed(st);
  }
  for (CallObserver* o : failed_) o->failed(st);
}

}  // namespace c4
