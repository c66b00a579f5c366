// TCP transport, a connection's lanes: their sockets, striping weights, retirement and additions,
// lane and connection failures, the fault drills, and the periodic stall checks and probes.
// (tcp_internal.hpp lists the parts; docs/tcp-transport.md describes the protocol.)
#include "tcp_internal.hpp"  // private to transports/tcp: not among the target's headers

namespace c4::transport::tcp {

TcpConnection::TcpConnection(TcpTransportImpl* t, int peer, int nlanes) : t_(t), peer_(peer), nlanes_(nlanes) {
  for (int i = 0; i < nlanes; ++i) {
    auto s = std::make_unique<Sock>(i);
    s->conn = this;
    s->rxbuf.reset(new char[kRxBufBytes]);
    socks_.push_back(std::move(s));
  }
  lastMoveMs_ = nowMs();
}

bool TcpConnection::initiator() const { return t_->rank() < peer_; }

bool TcpConnection::acks() const { return t_->acks(); }

uint32_t TcpConnection::piecesOf(size_t bytes) const { return tcpwire::piecesOf(bytes, t_->pieceBytes()); }

std::string TcpConnection::peerText() const { return strFormat("rank %d (host %s)", peer_, t_->peerHost(peer_)); }

std::string TcpConnection::laneText(const Sock& s) const {
  return strFormat("rank %d (host %s, lane %d of %zu, %s -> %s%s%s)", peer_, t_->peerHost(peer_), s.index,
                   socks_.size(), s.localText.empty() ? "?" : s.localText.c_str(),
                   s.remoteText.empty() ? "?" : s.remoteText.c_str(), s.pathText.empty() ? "" : ", path ",
                   s.pathText.c_str());
}

int TcpConnection::liveLanes() const {
  int n = 0;
  for (const auto& s : socks_) n += s->live() && !s->placeholder;
  return n;
}

void TcpConnection::setEvents(Sock& s, uint32_t ev) {
  if (!s.fd.valid() || ev == s.events) return;
  if (s.silenced) ev = 0;
  if (s.muted) ev &= ~static_cast<uint32_t>(EPOLLOUT);
  epoll_event e{};
  e.events = ev;
  e.data.u64 = kTagLane | (static_cast<uint64_t>(peer_) << 8) | static_cast<uint64_t>(s.index);
  int op = s.events == 0 && ev != 0 ? EPOLL_CTL_ADD : (ev == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD);
  if (epoll_ctl(t_->epfd(), op, s.fd.get(), &e) == 0) s.events = ev;
}

void TcpConnection::closeSock(Sock& s) {
  if (s.fd.valid()) {
    if (s.events) epoll_ctl(t_->epfd(), EPOLL_CTL_DEL, s.fd.get(), nullptr);
    s.events = 0;
    s.fd.reset();
  }
  const int64_t now = nowNs();
  s.lane.setBusy(false, now);
  s.lane.setStalled(false, now);
  s.state = SockState::kClosed;
  s.txq.clear();
  s.inflight.clear();
  s.acksOut.clear();
  s.acksLater.clear();
  s.hsOut.clear();
  s.haveHdr = false;
  s.dest = RxDest::kNone;
  s.unexp = nullptr;
  s.blocked = false;
  s.wantOut = false;
  s.rxBeg = s.rxEnd = 0;
}

void TcpConnection::openLanes() {
  if (opened_ || !broken_.isOk()) return;
  opened_ = true;
  for (auto& sp : socks_) {
    Sock& s = *sp;
    Status st = t_->openLaneSocket(peer_, s, t_->planFor(peer_, s.index));
    if (!st.isOk()) {
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    setEvents(s, EPOLLIN | EPOLLOUT);
  }
}

bool TcpConnection::accepts(int lane) const {
  if (!broken_.isOk() || lane < 0 || lane > kMaxLaneIndex) return false;
  return lane >= numLanes() || socks_[static_cast<size_t>(lane)]->state == SockState::kIdle;
}

void TcpConnection::attach(int lane, Fd fd, const SockAddr& remote) {
  while (numLanes() <= lane) {
    // A lane the peer added: a placeholder (no weight) until its socket arrives.
    auto s = std::make_unique<Sock>(numLanes());
    s->conn = this;
    s->rxbuf.reset(new char[kRxBufBytes]);
    s->placeholder = true;
    s->lane.setWeight(0);
    socks_.push_back(std::move(s));
  }
  Sock& s = sock(lane);
  if (s.placeholder) {
    s.placeholder = false;
    s.lane.setWeight(1.0);
  }
  s.fd = std::move(fd);
  s.remote = remote;
  s.remoteText = remote.toString();
  SockAddr local;
  local.len = sizeof(local.storage);
  if (getsockname(s.fd.get(), local.sa(), &local.len) == 0) s.localText = local.toString();
  s.lane.setEndpoints(s.localPort, s.localText, s.remoteText);
  s.pathText = t_->planFor(peer_, s.index).label;
  s.state = SockState::kUp;
  s.lane.setState(LaneState::kUp);
  s.progressNs = nowNs();
  s.eof = false;
  setEvents(s, EPOLLIN);
  C4_INFO(kLogNet, "tcp: rank %d accepted %s", t_->rank(), laneText(s).c_str());
  sendNotices();
  if (!s.txq.empty()) t_->activate(this);
}

Status TcpConnection::setLaneWeights(const std::vector<double>& w) {
  if (w.size() != socks_.size())
    return makeError(Code::kInvalidArgument, "tcp: %zu lane weights given for %zu lanes to rank %d", w.size(),
                     socks_.size(), peer_);
  double live = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] >= 0) || w[i] > 1e12)
      return makeError(Code::kInvalidArgument, "tcp: lane weight %zu to rank %d is %g; weights must be in [0, 1e12]", i,
                       peer_, w[i]);
    if (!socks_[i]->live() && w[i] > 0)
      return makeError(Code::kInvalidArgument, "tcp: lane %zu to rank %d is %s; its weight must be 0", i, peer_,
                       laneStateName(socks_[i]->lane.state()));
    live += w[i];
  }
  if (live <= 0) return makeError(Code::kInvalidArgument, "tcp: lane weights to rank %d are all 0", peer_);
  for (size_t i = 0; i < w.size(); ++i) {
    socks_[i]->lane.setWeight(w[i]);
    socks_[i]->current = 0;
  }
  return Status::ok();
}

Status TcpConnection::retireLane(int i, const std::string& why) {
  if (i < 0 || i >= numLanes())
    return makeError(Code::kInvalidArgument, "tcp: lane %d to rank %d out of range [0, %d)", i, peer_, numLanes());
  Sock& s = sock(i);
  if (!s.live())
    return makeError(Code::kInvalidUsage, "tcp: lane %d to rank %d is already %s", i, peer_,
                     laneStateName(s.lane.state()));
  if (liveLanes() <= 1)
    return makeError(Code::kInvalidUsage,
                     "tcp: lane %d is the last lane to rank %d in service; retiring it would "
                     "lose the connection",
                     i, peer_);
  if (!acks()) {
    // Without acknowledgements nothing written can be re-sent: the lane drains what it has and
    // closes once empty.
    s.lane.setRetiredWhy(why);
    s.lane.setState(LaneState::kDraining);
    s.lane.setWeight(0);
    std::vector<TxFrame> move;
    for (auto it = s.txq.begin(); it != s.txq.end();) {
      if (it->op && it->done == 0) {
        move.push_back(std::move(*it));
        it = s.txq.erase(it);
      } else {
        ++it;
      }
    }
    for (TxFrame& f : move) queueData(std::move(f));
    t_->activate(this);
    return Status::ok();
  }
  retire(s, why, true);
  return broken_;
}

Status TcpConnection::addLane(const LanePlan& plan, int* index) {
  if (!index) return makeError(Code::kInvalidArgument, "tcp: addLane: index is NULL");
  if (!initiator())
    return makeError(Code::kInvalidUsage,
                     "tcp: lanes between rank %d and rank %d are opened by rank %d (the lower one)", t_->rank(), peer_,
                     peer_);
  if (!broken_.isOk()) return broken_;
  if (numLanes() > kMaxLaneIndex)
    return makeError(Code::kInvalidUsage, "tcp: connection to rank %d already had %d lanes", peer_, numLanes());
  openLanes();
  auto sp = std::make_unique<Sock>(numLanes());
  sp->conn = this;
  sp->rxbuf.reset(new char[kRxBufBytes]);
  Sock& s = *sp;
  socks_.push_back(std::move(sp));
  Status st = t_->openLaneSocket(peer_, s, plan);
  if (!st.isOk()) {
    s.lane.setRetiredWhy(st.message());
    s.lane.setState(LaneState::kRetired);
    s.lane.setWeight(0);
    s.state = SockState::kClosed;
    return st;
  }
  setEvents(s, EPOLLIN | EPOLLOUT);
  *index = s.index;
  C4_INFO(kLogNet, "tcp: rank %d adds lane %d to %s", t_->rank(), s.index, peerText().c_str());
  return Status::ok();
}

int TcpConnection::pickLane() {
  // Smooth weighted round robin over the lanes in service (equal weights: plain round robin).
  double total = 0;
  Sock* best = nullptr;
  for (auto& sp : socks_) {
    Sock& s = *sp;
    const double w = s.lane.weight();
    if (!s.live() || w <= 0) continue;
    s.current += w;
    total += w;
    if (!best || s.current > best->current) best = &s;
  }
  if (!best) {
    // Weights all 0 on the lanes left (the weighted ones were retired): any lane in service.
    for (auto& sp : socks_)
      if (sp->live() && !sp->placeholder) return sp->index;
    return -1;
  }
  best->current -= total;
  return best->index;
}

Status TcpConnection::protocolError(const Sock& s, const std::string& what) {
  Status st = makeError(Code::kInvalidUsage, "tcp: protocol violation from %s to rank %d: %s", laneText(s).c_str(),
                        t_->rank(), what.c_str());
  C4_WARN(kLogNet, "%s", st.message().c_str());
  return st;
}

void TcpConnection::moved(Sock& s, size_t n, bool tx) {
  if (tx)
    s.lane.addSent(n);
  else
    s.lane.addRecv(n);
  // Bytes on the socket are not progress for the watchdog (a write into the socket buffer of a
  // black-holed path succeeds, and a ping every second would keep a hang alive forever): only
  // pieces delivered count (noteMoved in finishPiece, in the acknowledgement handler, and, without
  // acknowledgements, once written).
  if (n) lastMoveMs_ = nowMs();
}

std::string TcpConnection::describeState() const {
  std::string out =
      strFormat("%zu send(s), %zu receive(s) pending with %s", sends_.size(), recvs_.size(), peerText().c_str());
  if (!broken_.isOk()) out += "; broken: " + broken_.message();
  for (const auto& sp : socks_) {
    const Sock& s = *sp;
    if (s.placeholder) continue;
    out += strFormat("; lane %d %s", s.index, laneStateName(s.lane.state()));
    if (s.state == SockState::kIdle)
      out += initiator() ? " (not opened)" : strFormat(" (rank %d never connected it)", peer_);
    else if (s.state == SockState::kConnecting || s.state == SockState::kWaitChallenge)
      out += " (handshake not finished)";
    if (s.lane.state() == LaneState::kUp)
      out += strFormat(" %zu piece(s) queued, %zu unacknowledged%s", s.txq.size(), s.inflight.size(),
                       s.blocked ? ", stopped reading (no room)" : "");
  }
  return out;
}

void TcpConnection::retire(Sock& s, const std::string& why, bool notify) {
  if (s.lane.state() == LaneState::kRetired) return;
  // The piece half read on it is dropped: its bit is not set, so the copy re-sent elsewhere counts.
  if (s.haveHdr && s.dest == RxDest::kUnexp && s.unexp) dropUnexpPiece(s.hdr.seq, s.unexp);
  std::vector<TxFrame> again;
  for (TxFrame& f : s.txq)
    if (f.op) again.push_back(std::move(f));
  for (TxFrame& f : s.inflight) again.push_back(std::move(f));
  s.txq.clear();
  s.inflight.clear();
  s.lane.setRetiredWhy(why);
  s.lane.setState(LaneState::kRetired);
  s.lane.setWeight(0);
  closeSock(s);
  C4_WARN(kLogNet, "tcp: rank %d retires %s: %s; %zu piece(s) it had not delivered go out on the other lanes",
          t_->rank(), laneText(s).c_str(), why.c_str(), again.size());
  if (liveLanes() == 0) {
    std::string lanes;
    for (const auto& o : socks_) {
      if (o->placeholder) continue;
      LaneSnapshot snap = o->lane.snapshot();
      lanes += strFormat("%slane %d: %s", lanes.empty() ? "" : "; ", o->index, snap.retiredWhy.c_str());
    }
    Status st =
        makeError(Code::kRemoteError, "tcp: no lane left between rank %d and %s with %zu message(s) pending (%s)",
                  t_->rank(), peerText().c_str(), sends_.size() + recvs_.size(), lanes.c_str());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
    return;
  }
  std::vector<SendOp*> finished;
  for (TxFrame& f : again) {
    SendOp* op = f.op;
    if (op->left == 0 || testBit(op->acked, f.piece)) {
      // Acknowledged meanwhile (by a copy on another lane): nothing to re-send.
      --op->frames;
      finished.push_back(op);
      continue;
    }
    f.done = 0;
    f.resent = true;
    queueData(std::move(f));
  }
  for (SendOp* op : finished) maybeCompleteSend(*op);
  popDone();
  if (notify) {
    // On a lane in service; if none is up yet (handshakes under way), on the first that comes up.
    notices_.emplace_back(s.index, why.substr(0, kMaxReason));
    sendNotices();
  }
  t_->activate(this);
}

void TcpConnection::sendNotices() {
  if (notices_.empty()) return;
  for (auto& o : socks_) {
    if (!o->up() || o->silenced) continue;
    for (const auto& n : notices_) queueCtl(*o, tcpwire::kRetire, static_cast<uint64_t>(n.first), n.second);
    notices_.clear();
    return;
  }
}

void TcpConnection::laneError(Sock& s, const char* what, int err) {
  s.lane.addError();
  const std::string text = strFormat("%s (%s)", what, strerror(err));
  if (acks() && liveLanes() > 1) {
    retire(s, text, true);
    return;
  }
  Status st = makeError(Code::kRemoteError, "tcp: %s on the connection from rank %d to %s with %zu message(s) pending",
                        text.c_str(), t_->rank(), laneText(s).c_str(), sends_.size() + recvs_.size());
  C4_WARN(kLogNet, "%s", st.message().c_str());
  fail(st);
}

void TcpConnection::laneEof(Sock& s) {
  s.eof = true;
  s.eofMs = nowMs();
  const bool midFrame = s.haveHdr || s.rxBeg != s.rxEnd;
  const std::string where = laneText(s);
  if (acks() && (midFrame || owes()) && liveLanes() > 1) {
    // The peer closed this lane (it retired it, or the socket broke at its end): the others go on.
    if (midFrame) s.lane.addError();
    retire(s, midFrame ? "the peer closed it in the middle of a piece" : "the peer closed it", false);
    return;
  }
  if (s.fd.valid()) {
    if (s.events) epoll_ctl(t_->epfd(), EPOLL_CTL_DEL, s.fd.get(), nullptr);
    s.events = 0;
  }
  s.state = SockState::kClosed;
  s.lane.setRetiredWhy("closed by the peer");
  s.lane.setState(LaneState::kRetired);
  if (midFrame) {
    Status st = makeError(Code::kRemoteError,
                          "tcp: %s closed its connection to rank %d in the middle of a message (%zu pending)",
                          where.c_str(), t_->rank(), sends_.size() + recvs_.size());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
    return;
  }
  bool all = true;
  for (const auto& x : socks_) all &= x->eof || x->placeholder || x->lane.state() == LaneState::kRetired;
  if (all && closed_.isOk())
    closed_ = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d", peerText().c_str(), t_->rank());
  if (!owes()) {
    if (all) dropEager();  // the peer closed cleanly: nobody waits for these copies
    return;
  }
  // Data comes before the close on each lane: once every lane is closed, nothing else arrives. A
  // pending send with pieces on a closed lane cannot finish either.
  bool stuckSend = s.outstanding();
  if (all || stuckSend) {
    Status st = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d with %zu message(s) pending",
                          all ? peerText().c_str() : where.c_str(), t_->rank(), sends_.size() + recvs_.size());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
  }
}

void TcpConnection::dropEager() {
  // Only sends whose requests completed are left (owes() is false): forget them and their frames.
  for (auto& s : socks_) {
    s->txq.clear();
    s->inflight.clear();
  }
  sends_.clear();
  eagerInUse_ = 0;
}

void TcpConnection::fail(const Status& st) {
  if (broken_.isOk()) broken_ = st;
  // An eager send whose request completed already has no request to fail any more.
  for (SendOp& op : sends_)
    if (!op.reqDone) failRequest(op.req, st);
  for (RecvOp& op : recvs_)
    if (!op.done) failRequest(op.req, st);
  sends_.clear();
  eagerInUse_ = 0;
  sendsOwed_ = 0;
  recvs_.clear();
  unexp_.clear();
  unexpBytes_ = 0;
  for (auto& s : socks_) {
    closeSock(*s);
    if (s->lane.state() != LaneState::kRetired) {
      s->lane.setRetiredWhy(st.message());
      s->lane.setState(LaneState::kRetired);
    }
  }
  t_->noteError(broken_);
}

void TcpConnection::sendAbort(const std::string& reason) {
  std::string r = reason.substr(0, kMaxReason);
  for (auto& sp : socks_) {
    Sock& s = *sp;
    if (s.state != SockState::kUp || !s.fd.valid() || s.silenced || s.muted) continue;
    // Only at a frame boundary; a half-written piece cannot be interrupted.
    if (!s.hsOut.empty() || (!s.txq.empty() && s.txq.front().done != 0)) continue;
    FrameHdr h{};
    h.type = tcpwire::kAbort;
    h.bytes = static_cast<uint32_t>(r.size());
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(r.data()), r.size()}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    (void)C4_SYSCALL_RETRY(sendmsg(s.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT));
  }
}

Status TcpConnection::breakLane(int lane, LaneFault fault) {
  if (lane < 0 || lane >= numLanes() || !sock(lane).up() || sock(lane).silenced || sock(lane).muted)
    return makeError(Code::kInvalidArgument, "tcp: fault drill: lane %d to rank %d is not in service", lane, peer_);
  Sock& s = sock(lane);
  C4_WARN(kLogNet, "tcp: rank %d breaks %s (fault drill, %s)", t_->rank(), laneText(s).c_str(),
          fault == LaneFault::kSilent ? "silent: no more reads or writes"
          : fault == LaneFault::kMute ? "mute: read, no more writes"
                                      : "reset");
  if (fault == LaneFault::kSilent) {
    setEvents(s, 0);
    s.silenced = true;
    return Status::ok();
  }
  if (fault == LaneFault::kMute) {
    setEvents(s, EPOLLIN);
    s.wantOut = false;
    s.muted = true;
    return Status::ok();
  }
  linger lg{1, 0};  // close() sends a reset
  setsockopt(s.fd.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  s.lane.addError();
  if (acks() && liveLanes() > 1) {
    retire(s, "broken by a fault drill", false);
  } else {
    Status st = makeError(Code::kRemoteError, "tcp: rank %d broke %s (fault drill)", t_->rank(), laneText(s).c_str());
    fail(st);
  }
  return Status::ok();
}

void TcpConnection::check(int64_t now) {
  if (!broken_.isOk()) return;
  if (acksDeferred()) {
    sendAcks(true);
    flushAll();
  }
  // A lane the peer closed while others stay open for long: it is not shutting down cleanly (with
  // acknowledgements such a lane was retired instead).
  for (auto& sp : socks_) {
    Sock& s = *sp;
    const int64_t grace = t_->timeoutMs() > 0 ? std::min<int64_t>(kEofGraceMs, t_->timeoutMs()) : kEofGraceMs;
    if (!acks() && s.eof && owes() && now - s.eofMs > grace) {
      Status st = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d with %zu message(s) pending",
                            laneText(s).c_str(), t_->rank(), sends_.size() + recvs_.size());
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
  }
  if (acks()) {
    // A lane whose pieces go unacknowledged while another lane's are acknowledged is stalled (a cut
    // cable, a black-holed path): retire it. If no lane delivers, the peer itself is slow or gone;
    // that is the timeout's call, not a lane's.
    const int64_t nowN = nowNs();
    for (auto& sp : socks_) {
      Sock& s = *sp;
      if (!s.live() || s.state != SockState::kUp) continue;
      if (!s.outstanding() || s.peerPaused) {
        s.progressNs = nowN;
        s.suspectNs = 0;
        continue;
      }
      if (nowN - s.progressNs < t_->stallNs()) {
        s.suspectNs = 0;
        continue;
      }
      const Sock* other = nullptr;
      for (const auto& o : socks_)
        if (o.get() != &s && o->live() && o->lastAckNs > s.progressNs) other = o.get();
      if (!other) {
        // No other lane has delivered since: those with nothing outstanding are asked whether the
        // peer still reads them (their answer counts as delivery at the next check).
        for (auto& o : socks_) {
          if (o.get() == &s || !o->up() || o->silenced || o->outstanding()) continue;
          if (nowN - o->pingNs < t_->stallNs() / 2) continue;
          o->pingNs = nowN;
          queueCtl(*o, tcpwire::kPing, 0, "");
        }
        s.suspectNs = 0;
        continue;
      }
      // The evidence must hold a while: after a pause of the peer's (it computed, it was not in
      // c4comm) the acknowledgements of all lanes come at once, one lane's a moment before another's.
      if (s.suspectNs == 0) {
        s.suspectNs = nowN;
        continue;
      }
      if (nowN - s.suspectNs < std::max<int64_t>(2 * kCheckEveryMs * 1000000, t_->stallNs() / 4)) continue;
      size_t pieces = s.inflight.size();
      for (const TxFrame& f : s.txq) pieces += f.op != nullptr;
      s.lane.addError();
      retire(s,
             strFormat("stalled: %zu piece(s) unacknowledged for %lld ms while lane %d delivered", pieces,
                       static_cast<long long>((nowN - s.progressNs) / 1000000), other->index),
             true);
      if (!broken_.isOk()) return;
    }
  }
  if (!owes()) {
    lastMoveMs_ = now;
    probe_.reset();
    return;
  }
  if (!initiator() && t_->probeMs() > 0 && now - lastMoveMs_ >= t_->probeMs()) {
    bool down = false;
    for (const auto& s : socks_) down = down || (s->state == SockState::kIdle && !s->placeholder);
    if (down) probePeer(now);
    if (!broken_.isOk()) return;
  }
  // Inside a communicator its watchdog decides (timeoutMs 0); standalone, the transport does.
  if (t_->timeoutMs() <= 0 || now - lastMoveMs_ <= t_->timeoutMs()) return;
  std::string down;
  for (const auto& s : socks_) {
    if (s->state == SockState::kUp || s->placeholder || s->lane.state() == LaneState::kRetired) continue;
    if (!down.empty()) down += ", ";
    down += std::to_string(s->index);
  }
  Status st;
  if (!down.empty() && !initiator()) {
    st = makeError(Code::kRemoteError,
                   "tcp: %s never connected lane(s) %s to rank %d within %lld ms (C4_TIMEOUT) with %zu message(s) "
                   "pending; is it alive, and did it reach this operation?",
                   peerText().c_str(), down.c_str(), t_->rank(), static_cast<long long>(t_->timeoutMs()),
                   sends_.size() + recvs_.size());
  } else if (!down.empty()) {
    st = makeError(Code::kRemoteError,
                   "tcp: rank %d could not complete the handshake of lane(s) %s with %s at %s within %lld ms "
                   "(C4_TIMEOUT); the peer does not answer",
                   t_->rank(), down.c_str(), peerText().c_str(), socks_.front()->remoteText.c_str(),
                   static_cast<long long>(t_->timeoutMs()));
  } else {
    st = makeError(Code::kRemoteError,
                   "tcp: no progress for %lld ms on %zu pending message(s) between rank %d and %s over %d lane(s) "
                   "(timeout C4_TIMEOUT=%lld ms)",
                   static_cast<long long>(now - lastMoveMs_), sends_.size() + recvs_.size(), t_->rank(),
                   peerText().c_str(), liveLanes(), static_cast<long long>(t_->timeoutMs()));
  }
  C4_WARN(kLogNet, "%s", st.message().c_str());
  fail(st);
}

void TcpConnection::probePeer(int64_t now) {
  int err = 0;
  if (!probe_.valid()) {
    if (lastProbeMs_ != 0 && now - lastProbeMs_ < t_->probeMs()) return;
    lastProbeMs_ = now;
    err = t_->startProbe(peer_, &probe_);
    if (err == EINPROGRESS) return;  // the answer comes at a later check
  } else {
    pollfd p{probe_.get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) {
      if (now - lastProbeMs_ > 5 * t_->probeMs()) probe_.reset();  // no answer (host down?): try again
      return;
    }
    socklen_t len = sizeof(err);
    if (getsockopt(probe_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err == 0 && probe_.valid()) {
    // Alive and listening, not at this operation yet: say what this was (so it is dropped quietly).
    const tcpwire::Hello h = t_->probeHello(peer_);
    ssize_t n = ::send(probe_.get(), &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    C4_TRACE(kLogNet, "tcp: rank %d: %s is alive (liveness probe); still waiting for its lanes", t_->rank(),
             peerText().c_str());
  }
  probe_.reset();
  if (err != ECONNREFUSED) return;  // unreachable or timed out proves nothing: C4_TIMEOUT decides
  Status st = makeError(Code::kRemoteError,
                        "tcp: %s refuses connections at its listening address %s: its process exited or it left the "
                        "communicator (liveness probe after %lld ms without its lanes; %zu message(s) pending)",
                        peerText().c_str(), t_->probeTarget(peer_).c_str(), static_cast<long long>(now - lastMoveMs_),
                        sends_.size() + recvs_.size());
  C4_WARN(kLogNet, "%s", st.message().c_str());
  fail(st);
}

}  // namespace c4::transport::tcp
