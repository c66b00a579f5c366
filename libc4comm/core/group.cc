#include "core/group.hpp"

#include <memory>

#include "common/logging.hpp"
#include "common/status.hpp"

namespace c4 {

namespace {
struct CommWork {
  Comm* comm = nullptr;
  std::vector<OpDesc> colls;
  std::vector<OpDesc> p2p;
  size_t nextColl = 0;
  bool p2pStarted = false;
  std::unique_ptr<PreparedCall> cur;  // null when idle

  bool finished() const { return !cur && nextColl == colls.size() && (p2p.empty() || p2pStarted); }

  // Prepares and starts the next piece of work; skips no-ops. Leaves cur null when all is done.
  Status startNext() {
    while (!cur) {
      auto p = std::make_unique<PreparedCall>();
      if (nextColl < colls.size()) {
        C4_CHECK(comm->prepareCollective(colls[nextColl++], p.get()));
      } else if (!p2p.empty() && !p2pStarted) {
        p2pStarted = true;
        C4_CHECK(comm->prepareP2p(p2p, p.get()));
      } else {
        return Status::ok();
      }
      if (p->noop) {
        comm->finish(p.get());
        continue;
      }
      C4_CHECK(comm->startPrepared(p.get()));
      cur = std::move(p);
    }
    return Status::ok();
  }
};

}  // namespace

Status runGroupItems(std::vector<GroupItem>& items) {
  std::vector<CommWork> work;
  for (GroupItem& it : items) {
    C4_CHECK(it.comm->failure());
    CommWork* w = nullptr;
    for (CommWork& l : work)
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
  for (CommWork& l : work) C4_CHECK(l.comm->checkSelfPairs(l.p2p));
  auto failAll = [&work](const Status& st) {
    Status first;
    for (CommWork& l : work) {
      l.comm->watchdog().leave();
      Status f = l.comm->fail(st);
      if (first.isOk()) first = f;  // with C4D's diagnosis, if it had one
    }
    return first.isOk() ? st : first;
  };
  for (CommWork& l : work) {
    Status st = l.startNext();
    if (!st.isOk()) return failAll(st);
  }
  int idle = 0;
  while (true) {
    bool allDone = true, progressed = false;
    for (CommWork& l : work) {
      if (!l.cur) continue;
      allDone = false;
      bool done = false, moved = false;
      Status st = l.comm->pollPrepared(l.cur.get(), &done, &moved);
      if (!st.isOk()) return failAll(st);
      progressed |= moved;
      if (done) {
        l.comm->finish(l.cur.get());
        l.cur.reset();
        st = l.startNext();
        if (!st.isOk()) return failAll(st);
        progressed = true;
      }
    }
    if (allDone) break;
    // Back-off (spin, yield, then short blocking waits), tuned to whether ranks outnumber cores.
    // Blocking on one communicator's wait fds is enough: the wait is bounded by C4_SHM_SLEEP_US.
    if (progressed) {
      idle = 0;
    } else {
      // Each communicator's watchdog decides whether its call is stuck.
      for (CommWork& l : work) {
        if (!l.cur) continue;
        Status st = l.comm->watchIdle(l.cur.get());
        if (!st.isOk()) return failAll(st);
      }
      for (CommWork& l : work) {
        if (l.cur) {
          l.comm->idleWait(++idle);
          break;
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace c4
