#include "core/executor.hpp"

#include <algorithm>
#include <cstring>

#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "kernels/host/reduce.hpp"

namespace c4 {

C4_PARAM_INT(RecvReduce, "C4_RECV_REDUCE", nullptr, 1, 0, 1, kParamNone,
             "1: a reducing receive reduces in the transport as the data arrives where the transport can "
             "(Caps::reduceOnRecv); 0: every reducing receive lands in a host bounce buffer and is reduced when "
             "complete (the path transports without the capability take)")
C4_PARAM_INT(ExecStaging, "C4_EXEC_STAGING", nullptr, 0, 0, 1, kParamNone,
             "1: every send and receive goes through host bounce buffers, as for memory a transport cannot read or "
             "write directly (tests the staging path); 0: only where needed")
C4_PARAM_INT(Forward, "C4_FORWARD", nullptr, 1, 0, 1, kParamNone,
             "1: a send of what a reducing receive just produced leaves piece by piece as the pieces land, written "
             "in the same pass as the reduction where the transport can (shm; NCCL's recvReduceCopySend); 0: after "
             "the whole receive")

using sched::StepKind;

void ExecPlan::add(const ExecStep& s, const int32_t* depList, size_t ndeps) {
  ExecStep st = s;
  st.depBegin = static_cast<uint32_t>(deps.size());
  for (size_t i = 0; i < ndeps; ++i) deps.push_back(static_cast<uint32_t>(depList[i]));
  st.depEnd = static_cast<uint32_t>(deps.size());
  steps.push_back(st);
}

void buildPlan(const sched::Schedule& s, ExecPlan* plan) {
  plan->steps.clear();
  plan->deps.clear();
  plan->sigs.clear();
  plan->steps.reserve(s.steps.size());
  auto ref = [](const sched::Span& sp) { return BufRef{static_cast<BufBase>(sp.buf), sp.offset}; };
  for (const sched::Step& st : s.steps) {
    ExecStep e;
    e.kind = st.kind;
    e.peer = st.peer;
    switch (st.kind) {
      case StepKind::kSend:
        e.src = ref(st.src);
        e.bytes = st.src.bytes;
        e.peerReduces = st.peerReduces;
        break;
      case StepKind::kRecv:
        e.dst = ref(st.dst);
        e.bytes = st.dst.bytes;
        break;
      case StepKind::kRecvReduce:
      case StepKind::kCopy:
        e.src = ref(st.src);
        e.dst = ref(st.dst);
        e.bytes = st.dst.bytes;
        break;
      case StepKind::kReduce:
        e.src = ref(st.src);
        e.src2 = ref(st.src2);
        e.dst = ref(st.dst);
        e.bytes = st.dst.bytes;
        break;
    }
    plan->add(e, st.deps.data(), st.deps.size());
  }
}

Status Executor::bind(ExecContext* ctx, const ExecPlan* plan) {
  ctx_ = ctx;
  plan_ = plan;
  const size_t n = plan->steps.size();
  const int nranks = ctx->numRanks(), self = ctx->thisRank();
  initialRemaining_.assign(n, 0);
  initialLocal_.clear();
  peers_.clear();
  peerSlot_.assign(static_cast<size_t>(nranks), -1);

  // Successor lists (CSR) from the dependency lists.
  succBegin_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const ExecStep& s = plan->steps[i];
    initialRemaining_[i] = s.depEnd - s.depBegin;
    for (uint32_t d = s.depBegin; d < s.depEnd; ++d) {
      uint32_t dep = plan->deps[d];
      if (dep >= i) return makeError(Code::kInternalError, "plan step %zu depends on later step %u", i, dep);
      ++succBegin_[dep + 1];
    }
  }
  for (size_t i = 0; i < n; ++i) succBegin_[i + 1] += succBegin_[i];
  succ_.assign(plan->deps.size(), 0);
  std::vector<uint32_t> fill(succBegin_.begin(), succBegin_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    const ExecStep& s = plan->steps[i];
    for (uint32_t d = s.depBegin; d < s.depEnd; ++d) succ_[fill[plan->deps[d]]++] = static_cast<uint32_t>(i);
  }

  for (size_t i = 0; i < n; ++i) {
    const ExecStep& s = plan->steps[i];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce) {
      if (s.peer < 0 || s.peer >= nranks || s.peer == self)
        return makeError(Code::kInternalError, "plan step %zu has invalid peer %d", i, s.peer);
      int32_t& slot = peerSlot_[static_cast<size_t>(s.peer)];
      if (slot < 0) {
        slot = static_cast<int32_t>(peers_.size());
        PeerQueue q;
        q.peer = s.peer;
        C4_CHECK(ctx->connection(s.peer, &q.conn));
        q.forwarding = q.conn->forwarding();
        q.releasedSends = q.conn->releasedSends();
        q.caps = ctx->capsOf(s.peer);
        q.transport = ctx->transportIndexOf(s.peer);
        q.lane = q.conn->numLanes() > 1 ? trace::kLaneStriped : 0;
        peers_.push_back(std::move(q));
      }
      auto& q = peers_[static_cast<size_t>(slot)];
      (s.kind == StepKind::kSend ? q.sends : q.recvs).push_back(static_cast<uint32_t>(i));
    } else if (initialRemaining_[i] == 0) {
      initialLocal_.push_back(static_cast<uint32_t>(i));
    }
  }
  stagingPlanned_ = false;
  remaining_.resize(n);
  reqs_.resize(n);
  inflight_.reserve(n);
  localReady_.reserve(n);
  return Status::ok();
}

Status Executor::planStaging() {
  using transport::MemSpace;
  using transport::spaceBit;
  const size_t n = plan_->steps.size();
  stage_.assign(n, Stage::kNone);
  stageOff_.assign(n, 0);
  const bool all = paramExecStaging() != 0;
  const bool recvReduce = paramRecvReduce() != 0;
  auto hostKernels = [](MemSpace sp) { return (transport::kHostSpaces & spaceBit(sp)) != 0; };
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const ExecStep& s = plan_->steps[i];
    const MemSpace src = spaces_[static_cast<int>(s.src.base)], dst = spaces_[static_cast<int>(s.dst.base)];
    if (s.kind == StepKind::kCopy || s.kind == StepKind::kReduce || (s.kind == StepKind::kRecvReduce) ||
        (s.kind == StepKind::kSend && all) || (s.kind == StepKind::kRecv && all)) {
      // Local work and staged copies run on the host kernels.
      const bool srcUsed = s.kind != StepKind::kRecv;
      const bool dstUsed = s.kind != StepKind::kSend;
      const MemSpace bad = srcUsed && !hostKernels(src) ? src : dst;
      if ((srcUsed && !hostKernels(src)) || (dstUsed && !hostKernels(dst)))
        return makeError(Code::kInvalidUsage,
                         "rank %d: step %zu of %s works on %s memory, for which this build has no copy or reduction "
                         "kernels",
                         ctx_->thisRank(), i, describeSig(plan_->sig).c_str(), transport::memSpaceName(bad));
    }
    if (s.kind != StepKind::kSend && s.kind != StepKind::kRecv && s.kind != StepKind::kRecvReduce) continue;
    const transport::Caps& caps = queueOf(s.peer).caps;
    Stage st = Stage::kNone;
    if (s.kind == StepKind::kSend) {
      if (all || !(caps.spaces & spaceBit(src))) st = Stage::kSend;
    } else if (s.kind == StepKind::kRecv) {
      if (all || !(caps.spaces & spaceBit(dst))) st = Stage::kRecv;
    } else if (all || !recvReduce || !caps.reduceOnRecv || !(caps.spaces & spaceBit(dst)) ||
               !(caps.spaces & spaceBit(src))) {
      st = Stage::kReduce;
    }
    if (st == Stage::kNone) continue;
    stage_[i] = st;
    stageOff_[i] = total;
    total += (s.bytes + 63) / 64 * 64;
  }
  if (staging_.size() < total) staging_.resize(total);
  for (int b = 0; b < kNumBufBases; ++b) planned_[b] = spaces_[b];
  stagingPlanned_ = true;
  findForwards();
  return Status::ok();
}

void Executor::findForwards() {
  const size_t n = plan_->steps.size();
  forward_.assign(n, kNoForward);
  if (paramForward() == 0) return;
  for (size_t i = 0; i < n; ++i) {
    const ExecStep& s = plan_->steps[i];
    if (s.kind != StepKind::kSend || stage_[i] != Stage::kNone) continue;
    for (uint32_t d = s.depBegin; d < s.depEnd; ++d) {
      const uint32_t r = plan_->deps[d];
      const ExecStep& rs = plan_->steps[r];
      // Receives that reduce only: a plain chain (Broadcast at 4 ranks) measured slower fused.
      if (rs.kind != StepKind::kRecvReduce || stage_[r] != Stage::kNone || forward_[r] != kNoForward ||
          rs.bytes != s.bytes || rs.dst.base != s.src.base || rs.dst.offset != s.src.offset)
        continue;
      const transport::Forwarding* from = queueOf(rs.peer).forwarding;
      const transport::Connection* to = queueOf(s.peer).conn;
      if (from != nullptr && from->canForward(to, s.bytes, transport::SendHint{plan_->singleCopy && !s.peerReduces})) {
        forward_[r] = static_cast<uint32_t>(i);
        break;
      }
    }
  }
}

Status Executor::start(const void* const bases[kNumBufBases], const transport::MemSpace spaces[kNumBufBases]) {
  bool replan = !stagingPlanned_;
  for (int b = 0; b < kNumBufBases; ++b) {
    bases_[b] = bases[b];
    spaces_[b] = spaces ? spaces[b] : transport::MemSpace::kHost;
    replan |= spaces_[b] != planned_[b];
  }
  bases_[static_cast<int>(BufBase::kAbsolute)] = nullptr;
  if (replan) C4_CHECK(planStaging());
  std::copy(initialRemaining_.begin(), initialRemaining_.end(), remaining_.begin());
  for (transport::Request& r : reqs_) {
    r.state = transport::Request::kPending;
    r.released = false;
    if (!r.error.isOk()) r.error = Status::ok();
  }
  released_.assign(plan_->steps.size(), 0);
  releasedRun_ = 0;
  inflight_.clear();
  localReady_.assign(initialLocal_.begin(), initialLocal_.end());
  for (PeerQueue& q : peers_) q.nextSend = q.nextRecv = 0;
  completed_ = 0;
  traceSteps_ = ctx_->tracer().level() >= static_cast<int>(trace::Level::kStep);
  if (traceSteps_) postTicks_.resize(plan_->steps.size());
  return postReady();
}

Status Executor::runLocal(uint32_t idx) {
  const ExecStep& s = plan_->steps[idx];
  void* dst = addr(s.dst);
  const void* src = addr(s.src);
  const uint64_t t0 = traceSteps_ ? trace::ticks() : 0;
  if (s.kind == StepKind::kCopy) {
    if (dst != src && s.bytes) kernels::copy(dst, src, s.bytes);
  } else {
    size_t esize = dataTypeSize(plan_->dtype);
    kernels::reduce(dst, src, addr(s.src2), s.bytes / esize, plan_->dtype, plan_->op);
  }
  if (traceSteps_) traceStep(idx, t0);
  return complete(idx);
}

void Executor::unstage(uint32_t idx) {
  const ExecStep& s = plan_->steps[idx];
  const char* in = staging_.data() + stageOff_[idx];
  if (!s.bytes) return;
  if (stage_[idx] == Stage::kRecv)
    kernels::copy(addr(s.dst), in, s.bytes);
  else if (stage_[idx] == Stage::kReduce)
    kernels::reduce(addr(s.dst), addr(s.src), in, s.bytes / dataTypeSize(plan_->dtype), plan_->dtype, plan_->op);
}

bool Executor::releaseMeets(uint32_t send, uint32_t succ) const {
  // Every step after a send writes what it read (write after read). A receive that the send's own
  // transport writes straight into the call's buffer keeps what a re-send of the send needs
  // (Caps::releasesSends); anything else waits until the send is done.
  const ExecStep& r = plan_->steps[succ];
  if (r.kind != StepKind::kRecv && r.kind != StepKind::kRecvReduce) return false;
  if (stage_[send] != Stage::kNone || stage_[succ] != Stage::kNone || forward_[succ] != kNoForward) return false;
  const PeerQueue& qs = peers_[static_cast<size_t>(peerSlot_[static_cast<size_t>(plan_->steps[send].peer)])];
  const PeerQueue& qr = peers_[static_cast<size_t>(peerSlot_[static_cast<size_t>(r.peer)])];
  return qs.caps.releasesSends && qs.transport == qr.transport;
}

void Executor::release(uint32_t idx) {
  released_[idx] = 1;
  ++releasedRun_;
  for (uint32_t k = succBegin_[idx]; k < succBegin_[idx + 1]; ++k) {
    const uint32_t s = succ_[k];
    if (releaseMeets(idx, s)) --remaining_[s];  // a receive: postReady posts it at 0
  }
  progressed_ = true;
}

Status Executor::complete(uint32_t idx) {
  ++completed_;
  progressed_ = true;
  for (uint32_t k = succBegin_[idx]; k < succBegin_[idx + 1]; ++k) {
    uint32_t s = succ_[k];
    if (released_[idx] && releaseMeets(idx, s)) continue;  // counted at release
    if (--remaining_[s] == 0) {
      StepKind kind = plan_->steps[s].kind;
      if (kind == StepKind::kCopy || kind == StepKind::kReduce) localReady_.push_back(s);
    }
  }
  return Status::ok();
}

Status Executor::postReady() {
  // Local steps first: they may unblock sends.
  while (!localReady_.empty()) {
    uint32_t idx = localReady_.back();
    localReady_.pop_back();
    C4_CHECK(runLocal(idx));
  }
  for (PeerQueue& q : peers_) {
    while (q.nextSend < q.sends.size() && remaining_[q.sends[q.nextSend]] == 0) {
      uint32_t idx = q.sends[q.nextSend];
      const ExecStep& s = plan_->steps[idx];
      if (traceSteps_) postTicks_[idx] = trace::ticks();
      transport::MemRef src = ref(s.src);
      if (stage_[idx] == Stage::kSend) {
        char* b = staging_.data() + stageOff_[idx];
        if (s.bytes) kernels::copy(b, src.ptr, s.bytes);
        src = transport::MemRef(b);
      }
      Status st = q.conn->isend(src, s.bytes, plan_->sigOf(s), &reqs_[idx],
                                transport::SendHint{plan_->singleCopy && !s.peerReduces});
      if (transport::isQueueFull(st)) break;  // back-pressure: posted again after the next progress
      C4_CHECK(st);
      ++q.nextSend;
      inflight_.push_back(idx);
      progressed_ = true;
    }
    while (q.nextRecv < q.recvs.size() && remaining_[q.recvs[q.nextRecv]] == 0)
      C4_CHECK(postRecv(q.recvs[q.nextRecv++]));
  }
  return Status::ok();
}

Status Executor::postRecv(uint32_t idx) {
  const ExecStep& s = plan_->steps[idx];
  transport::Connection* conn = queueOf(s.peer).conn;
  const uint64_t t = traceSteps_ ? trace::ticks() : 0;
  if (traceSteps_) postTicks_[idx] = t;
  if (stage_[idx] != Stage::kNone) {
    // Into the bounce buffer; copied or reduced out when complete (unstage).
    C4_CHECK(conn->irecv(transport::MemRef(staging_.data() + stageOff_[idx]), s.bytes, plan_->sigOf(s), nullptr,
                         &reqs_[idx]));
    inflight_.push_back(idx);
    progressed_ = true;
    return Status::ok();
  }
  transport::ReduceSpec red;
  if (s.kind == StepKind::kRecvReduce) {
    red.local = ref(s.src);
    red.dtype = plan_->dtype;
    red.op = static_cast<RedOp>(plan_->op);
  }
  const transport::ReduceSpec* redp = s.kind == StepKind::kRecvReduce ? &red : nullptr;
  // The forward rides along if it is next in line to its peer and waits for nothing else (it
  // depends on this receive, so its count of unfinished deps is at least 1).
  const uint32_t f = forward_[idx];
  PeerQueue* fq = f == kNoForward || remaining_[f] != 1 ? nullptr : &queueOf(plan_->steps[f].peer);
  if (fq && fq->nextSend < fq->sends.size() && fq->sends[fq->nextSend] == f) {
    ++fq->nextSend;
    if (traceSteps_) postTicks_[f] = t;
    C4_CHECK(queueOf(s.peer).forwarding->irecvForward(ref(s.dst), s.bytes, plan_->sigOf(s), redp, &reqs_[idx], fq->conn,
                                                      plan_->sigOf(plan_->steps[f]), &reqs_[f]));
    inflight_.push_back(f);
  } else {
    C4_CHECK(conn->irecv(ref(s.dst), s.bytes, plan_->sigOf(s), redp, &reqs_[idx]));
  }
  inflight_.push_back(idx);
  progressed_ = true;
  return Status::ok();
}

Status Executor::poll(bool* done) {
  progressed_ = false;
  C4_CHECK(ctx_->progress());
  for (size_t i = 0; i < inflight_.size();) {
    uint32_t idx = inflight_[i];
    transport::Request& r = reqs_[idx];
    if (r.state == transport::Request::kPending) {
      if (r.released && !released_[idx] && plan_->steps[idx].kind == StepKind::kSend) release(idx);
      ++i;
      continue;
    }
    if (r.state == transport::Request::kFailed) return r.error;
    inflight_[i] = inflight_.back();
    inflight_.pop_back();
    if (stage_[idx] == Stage::kRecv || stage_[idx] == Stage::kReduce) unstage(idx);
    if (traceSteps_) traceStep(idx, postTicks_[idx]);
    C4_CHECK(complete(idx));
  }
  C4_CHECK(postReady());
  // Everything else is done and only released sends wait for their acknowledgements: the call
  // is over for this rank. The transport keeps what a re-send may need and completes them
  // (ReleasedSends::detachSend), so the run does not wait for the peer's last reads.
  if (releasedRun_ > 0 && completed_ < plan_->steps.size()) {
    size_t pending = 0;
    for (uint32_t idx : inflight_) pending += released_[idx] && reqs_[idx].state == transport::Request::kPending;
    if (pending > 0 && completed_ + pending == plan_->steps.size()) {
      for (uint32_t idx : inflight_)
        if (released_[idx] && reqs_[idx].state == transport::Request::kPending)
          if (transport::ReleasedSends* rs = queueOf(plan_->steps[idx].peer).releasedSends)
            (void)rs->detachSend(&reqs_[idx]);
      for (size_t i = 0; i < inflight_.size();) {
        const uint32_t idx = inflight_[i];
        if (reqs_[idx].state != transport::Request::kDone) {
          ++i;
          continue;
        }
        inflight_[i] = inflight_.back();
        inflight_.pop_back();
        if (traceSteps_) traceStep(idx, postTicks_[idx]);
        C4_CHECK(complete(idx));
      }
    }
  }
  *done = completed_ == plan_->steps.size();
  if (progressed_) ctx_->watchdog().moved();
  return Status::ok();
}

void Executor::traceStep(uint32_t idx, uint64_t t0) {
  const ExecStep& s = plan_->steps[idx];
  const OpSig& sig = plan_->sigOf(s);
  trace::Event e;
  e.type = trace::EventType::kStep;
  e.t0 = t0;
  e.t1 = trace::ticks();
  e.bytes = s.bytes;
  e.seq = static_cast<uint32_t>(sig.seq);
  e.coll = sig.coll;
  e.dtype = static_cast<uint8_t>(plan_->dtype);
  e.redop = static_cast<uint8_t>(s.kind);  // sched::StepKind and trace::StepKind share values
  if (s.peer >= 0 && s.peer != ctx_->thisRank()) {
    const PeerQueue& q = peers_[static_cast<size_t>(peerSlot_[static_cast<size_t>(s.peer)])];
    e.peer = s.peer;
    e.lane = q.lane;
    e.transport = q.transport;
  }
  ctx_->tracer().record(e);
}

std::string Executor::waitingOn() const {
  std::string out;
  int shown = 0;
  for (const PeerQueue& q : peers_) {
    size_t sendsLeft = 0, recvsLeft = 0;
    for (uint32_t idx : q.sends) sendsLeft += reqs_[idx].state != transport::Request::kDone;
    for (uint32_t idx : q.recvs) recvsLeft += reqs_[idx].state != transport::Request::kDone;
    if (sendsLeft + recvsLeft == 0) continue;
    if (shown++ < 8) {
      if (!out.empty()) out += ", ";
      out += strFormat("rank %d (%zu sends, %zu receives outstanding", q.peer, sendsLeft, recvsLeft);
      const std::string state = q.conn ? q.conn->describeState() : std::string();
      if (!state.empty() && shown <= 2) out += "; " + state;
      out += ")";
    }
  }
  if (shown > 8) out += strFormat(" and %d more peers", shown - 8);
  return out.empty() ? "local steps" : out;
}

std::vector<std::pair<int, std::string>> Executor::waitingRanks() const {
  std::vector<std::pair<int, std::string>> out;
  for (const PeerQueue& q : peers_) {
    bool left = false;
    for (uint32_t idx : q.sends) left |= reqs_[idx].state != transport::Request::kDone;
    for (uint32_t idx : q.recvs) left |= reqs_[idx].state != transport::Request::kDone;
    if (left) out.emplace_back(q.peer, q.conn ? q.conn->describeState() : std::string());
  }
  return out;
}

}  // namespace c4
