#include "core/drive.hpp"

#include <memory>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/paths.hpp"
#include "kernels/host/reduce.hpp"

namespace c4 {

// ---- one call's steps, on the driving thread ----

Status Comm::startPrepared(PreparedCall* p) {
  observers.started(*p);
  return p->noop ? Status::ok() : p->path->start(p);
}

Status Comm::pollPrepared(PreparedCall* p, bool* done, bool* progressed) {
  if (p->noop) {
    *done = *progressed = true;
    return Status::ok();
  }
  C4_CHECK(p->path->poll(p, done, progressed));
  if (*progressed) observers.progressed(*p);
  return Status::ok();
}

Status Comm::watchIdle(const PreparedCall* p) {
  // A peer deregistering device memory waits for this rank to close its mappings of it, while this
  // rank may wait for that peer (to enter this call, say): answer here, or both wait. The zero-copy
  // path answers itself where it may (not while it holds this call's mappings).
  if (p->kind != PathKind::kZeroCopy) zeroCopy.serviceDeregistrations();
  // Streams of this rank may wait for one-sided signals (windows on device memory) meanwhile.
  rma.pollDevice();
  // A path that waits on shared memory alone (one-shot) polls no transport: take an abort or a
  // revoke from another thread here, so the call fails at once rather than at the timeout.
  if (state.abortPending()) {
    takeAbortRequest();
    if (state.failed()) return state.error();
  }
  return observers.idle(*p);
}

void Comm::finish(PreparedCall* p) {
  // The end of a call is timed unless it is an untraced one-shot call (see HealthObserver).
  const uint64_t t1 = p->traceT0 || p->kind != PathKind::kOneShot ? trace::ticks() : 0;
  observers.finished(*p, t1);
  if (p->collective) oneShot.markDone(p->sig.seq);
  if (!p->postDivide) return;
  const OpDesc& op = p->op;
  if (op.coll == Coll::kReduce && rank != op.root) return;
  kernels::divide(op.recvbuff, op.recvbuff, op.count, op.dtype, nranks);
}

// ---- the loop ----

namespace {

/// A communicator's calls in a group: its collectives in call order, then its point-to-point
/// operations as one batch.
struct GroupWork {
  Comm* comm = nullptr;
  PreparedCall* cur = nullptr;  // the running call; null when idle
  std::vector<OpDesc> colls;
  std::vector<OpDesc> p2p;
  size_t nextColl = 0;
  bool p2pStarted = false;
  std::unique_ptr<PreparedCall> owned;

  // Prepares and starts the next call; finishes no-ops at once. Leaves cur null when all is done.
  Status startNext() {
    while (!cur) {
      owned = std::make_unique<PreparedCall>();
      PreparedCall* p = owned.get();
      if (nextColl < colls.size()) {
        C4_CHECK(comm->prepareCollective(colls[nextColl++], p));
      } else if (!p2p.empty() && !p2pStarted) {
        p2pStarted = true;
        C4_CHECK(comm->prepareP2p(p2p, p));
      } else {
        owned.reset();
        return Status::ok();
      }
      C4_CHECK(comm->startPrepared(p));
      if (p->noop) {
        comm->finish(p);
        continue;
      }
      cur = p;
    }
    return Status::ok();
  }
};

/// One call that is already running.
struct OneCall {
  Comm* comm = nullptr;
  PreparedCall* cur = nullptr;
  Status startNext() { return Status::ok(); }
};

/// Fails every communicator of the drive; returns the first's error (with C4D's diagnosis, if it
/// had one).
template <class Work>
Status failAll(Work* work, size_t n, const Status& st) {
  Status first;
  for (size_t i = 0; i < n; ++i) {
    Status f = work[i].comm->fail(st);
    if (first.isOk()) first = f;
  }
  return first.isOk() ? st : first;
}

/// The driving loop: polls each communicator's running call in turn; a call that ends is
/// finished and the communicator's next one started. When nothing moved, each communicator's
/// idle round (its observers: the watchdog decides whether its call is stuck), then back-off
/// (spin, yield, short blocking waits, tuned to whether ranks outnumber cores). Blocking on one
/// communicator's wait fds is enough: the wait is bounded by C4_SHM_SLEEP_US.
// Inlined into each caller, so that the single call's loop (n = 1) folds to what a loop written
// for one call would be.
template <class Work>
__attribute__((always_inline)) inline Status drive(Work* work, size_t n) {
  int idle = 0;
  while (true) {
    bool allDone = true, progressed = false;
    for (size_t i = 0; i < n; ++i) {
      Work& w = work[i];
      if (!w.cur) continue;
      allDone = false;
      bool done = false, moved = false;
      Status st = w.comm->pollPrepared(w.cur, &done, &moved);
      if (!st.isOk()) return failAll(work, n, st);
      progressed |= moved;
      if (done) {
        w.comm->finish(w.cur);
        w.cur = nullptr;
        st = w.startNext();
        if (!st.isOk()) return failAll(work, n, st);
        progressed = true;
      }
    }
    if (allDone) return Status::ok();
    if (progressed) {
      idle = 0;
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!work[i].cur) continue;
      Status st = work[i].comm->watchIdle(work[i].cur);
      if (!st.isOk()) return failAll(work, n, st);
    }
    for (size_t i = 0; i < n; ++i) {
      if (work[i].cur) {
        work[i].comm->idleWait(++idle);
        break;
      }
    }
  }
}

}  // namespace

Status runCall(Comm* comm, PreparedCall* p) {
  Status st = comm->startPrepared(p);
  if (!st.isOk()) return comm->fail(st);
  OneCall w;
  w.comm = comm;
  w.cur = p;
  return drive(&w, 1);
}

Status runGroupItems(std::vector<GroupItem>& items) {
  std::vector<GroupWork> work;
  for (GroupItem& it : items) {
    C4_CHECK(it.comm->failure());
    GroupWork* w = nullptr;
    for (GroupWork& l : work)
      if (l.comm == it.comm) w = &l;
    if (!w) {
      work.emplace_back();
      w = &work.back();
      w->comm = it.comm;
    }
    for (const OpDesc& op : it.ops)
      (op.coll == Coll::kSend || op.coll == Coll::kRecv ? w->p2p : w->colls).push_back(op);
  }
  // Usage mistakes found before anything starts fail the call, not the communicators.
  for (GroupWork& l : work) C4_CHECK(l.comm->checkSelfPairs(l.p2p));
  for (GroupWork& l : work) {
    Status st = l.startNext();
    if (!st.isOk()) return failAll(work.data(), work.size(), st);
  }
  return drive(work.data(), work.size());
}

}  // namespace c4
