// TCP transport, receives: frames read off the lanes, matched to posted receives (or kept until one
// is posted), copied or reduced into place once per piece, and C4D's receive rate.
// (tcp_internal.hpp lists the parts; docs/tcp-transport.md describes the protocol.)
#include "tcp_internal.hpp"  // private to transports/tcp: not among the target's headers

namespace c4::transport::tcp {

/// Whether `piece` of a message (its bitmap `bits`) was received already (a copy re-sent after a
/// lane was retired): each piece is counted and reduced once. The mutant build of tests/tcp
/// (C4_TCP_MUTANT_DOUBLE_COUNT) forgets, to prove that the lane-kill tests catch a piece counted or
/// reduced twice.
inline bool seenPiece(const std::vector<uint64_t>& bits, uint32_t piece) {
#ifdef C4_TCP_MUTANT_DOUBLE_COUNT
  (void)bits;
  (void)piece;
  return false;
#else
  return testBit(bits, piece);
#endif
}
inline bool seenPiece(const tcpwire::PieceSet& seen, uint32_t piece) {
#ifdef C4_TCP_MUTANT_DOUBLE_COUNT
  (void)seen;
  (void)piece;
  return false;
#else
  return seen.has(piece);
#endif
}

/// Whether two pieces carry the same message signature. (Not sigMatches: that asks whether a sent
/// signature fits an expected one, where a Send fits a Recv but not another Send.)
bool sameSig(const OpSig& a, const OpSig& b) {
  return a.seq == b.seq && a.count == b.count && a.root == b.root && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op;
}

Status TcpConnection::irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) {
  const Status& ab = t_->abortStatus();
  C4_CHECK(startRecv("tcp", peer_, !ab.isOk() ? ab : broken_, dst, bytes, red, req));
  C4_CHECK(prepareRequest(req));
  const uint64_t seq = recvBase_ + recvs_.size();
  const uint32_t n = piecesOf(bytes);
  recvs_.push_back(RecvOp{dst.bytes(), bytes, sig, red ? *red : ReduceSpec{}, red != nullptr, req, n, 0,
                          std::vector<uint64_t>((n + 63) / 64, 0), false});
  RecvOp& op = recvs_.back();
  auto it = unexp_.find(seq);
  if (it != unexp_.end()) {
    UnexpMsg& m = it->second;
    Status me = matchError(m.sig, m.total, op);
    if (!me.isOk()) {
      fail(me);
      return Status::ok();  // the request failed; progress() reports it
    }
    auto& pieces = m.pieces;
    for (size_t i = 0; i < pieces.size();) {
      UnexpPiece& p = *pieces[i];
      if (!p.complete) {
        ++i;
        continue;
      }
      applyPiece(op, static_cast<uint32_t>(p.offset / t_->pieceBytes()), p.offset, p.data.get(), p.bytes);
      unexpBytes_ -= p.bytes;
      recycle(std::move(p.data));
      pieces[i] = std::move(pieces.back());
      pieces.pop_back();
    }
    if (pieces.empty()) unexp_.erase(it);
    needRx = true;              // room freed; a lane may have stopped for it
    noteRecvProgress(op, seq);  // may pop op
  }
  // A lane that stopped reading (no room for unexpected data) may hold this very message's next
  // piece header: it can go straight to dst now, so the lane must resume even if nothing of the
  // message was buffered (without this, a 64 MiB receive posted late waited forever).
  for (const auto& s : socks_) needRx |= s->blocked;
  if (req->state == Request::kPending && !closed_.isOk()) {
    bool inFlight = false;
    for (const auto& s : socks_) inFlight |= s->haveHdr && s->hdr.type == tcpwire::kData && s->hdr.seq == seq;
    if (!inFlight) {
      fail(closed_);
      return Status::ok();
    }
  }
  t_->activate(this);
  return Status::ok();
}

Status TcpConnection::peek(bool* ready, OpSig* sig, size_t* bytes) {
  *ready = false;
  const Status& ab = t_->abortStatus();
  if (!ab.isOk()) return ab;
  if (initiator()) openLanes();  // the peer cannot send before they are up
  t_->activate(this);
  if (!broken_.isOk()) return broken_;
  if (!recvs_.empty()) return Status::ok();
  // The next message is recvBase_. Any of its pieces may come first, on any lane; each carries the
  // signature and size. A piece is in unexp_ once its header was read, or still in a lane's header
  // if that lane stopped reading for lack of room for unexpected data.
  auto it = unexp_.find(recvBase_);
  if (it != unexp_.end() && (!it->second.pieces.empty() || it->second.seen.known)) {
    *sig = it->second.sig;
    *bytes = it->second.total;
    *ready = true;
    return Status::ok();
  }
  for (const auto& s : socks_) {
    if (s->haveHdr && s->hdr.type == tcpwire::kData && s->hdr.seq == recvBase_) {
      *sig = s->hdr.sig;
      *bytes = s->hdr.total;
      *ready = true;
      return Status::ok();
    }
  }
  return Status::ok();
}

std::unique_ptr<char[]> TcpConnection::takeBuffer() {
  if (!spare_.empty()) {
    std::unique_ptr<char[]> b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }
  return std::unique_ptr<char[]>(new char[t_->pieceBytes()]);
}

void TcpConnection::recycle(std::unique_ptr<char[]>&& b) {
  // As many as the unexpected-data bound holds, plus one being read per lane.
  const size_t keep = t_->unexpectedLimit() / t_->pieceBytes() + socks_.size() + 1;
  if (b && spare_.size() < std::min<size_t>(keep, 256)) spare_.push_back(std::move(b));
}

bool TcpConnection::countPiece(RecvOp& op, uint32_t piece) {
  if (seenPiece(op.bits, piece)) return false;
  setBit(op.bits, piece);
  ++op.got;
  return true;
}

bool TcpConnection::applyPiece(RecvOp& op, uint32_t piece, uint64_t offset, const char* data, size_t bytes) {
  if (seenPiece(op.bits, piece)) return false;  // a copy that arrived twice (re-sent after a lane was retired)
  if (bytes) {
    t_->protect(op.dst + offset, bytes);
    if (op.hasRed)
      reduceInto(op.red, op.dst, offset, data, bytes);
    else
      memcpy(op.dst + offset, data, bytes);
  }
  return countPiece(op, piece);
}

void TcpConnection::noteRate(RecvOp& op, size_t bytes) {
  if (op.bytes < kRateMinBytes) return;
  const int64_t now = detail::nowNs();
  if (op.rateFirstNs == 0) {
    op.rateFirstNs = now;  // the window opens once the first piece is in
    return;
  }
  op.rateBytes += bytes;
  op.rateLastNs = now;
}

void TcpConnection::receiveRate(uint64_t* bytes, uint64_t* ns) const {
  *bytes = rateBytes_;
  *ns = rateNs_;
}

void TcpConnection::noteRecvProgress(RecvOp& op, uint64_t seq) {
  if (op.done || op.got != op.pieces) return;
  op.done = true;
  if (op.rateBytes > 0 && op.rateLastNs > op.rateFirstNs) {
    rateBytes_ += op.rateBytes;
    rateNs_ += static_cast<uint64_t>(op.rateLastNs - op.rateFirstNs);
  }
  completeRequest(op.req);
  // Another copy of one of its pieces may still be arriving straight into dst on some lane: from
  // now on dst belongs to the caller, so that copy goes to the sink.
  for (auto& sp : socks_) {
    Sock& s = *sp;
    if (s.haveHdr && s.hdr.type == tcpwire::kData && s.hdr.seq == seq && s.dest == RxDest::kDirect) {
      if (sink_.size() < s.hdr.bytes) sink_.resize(s.hdr.bytes);
      s.dest = RxDest::kDiscard;
      s.destPtr = sink_.data();
    }
  }
  popDone();
}

void TcpConnection::dropUnexpPiece(uint64_t seq, UnexpPiece* p) {
  auto it = unexp_.find(seq);
  if (it == unexp_.end()) return;
  auto& pieces = it->second.pieces;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].get() != p) continue;
    unexpBytes_ -= pieces[i]->bytes;
    recycle(std::move(pieces[i]->data));
    pieces[i] = std::move(pieces.back());
    pieces.pop_back();
    break;
  }
  // Whole pieces stay for the receive; an emptied entry of a completed message goes.
  if (pieces.empty() && (seq < recvBase_ || !it->second.seen.known)) unexp_.erase(it);
  needRx = true;
}

Status TcpConnection::matchError(const OpSig& sig, uint64_t total, const RecvOp& op) const {
  return transport::matchError("tcp", peer_, peerText(), t_->rank(), sig, total, op.sig, op.bytes);
}

bool TcpConnection::startCtl(Sock& s) {
  const FrameHdr& h = s.hdr;  // checked by startPiece (tcpwire::checkFrame)
  s.staging.resize(std::max<size_t>({s.staging.size(), h.bytes, 1}));
  s.dest = RxDest::kCtl;
  s.destPtr = s.staging.data();
  s.destGot = 0;
  return true;
}

bool TcpConnection::startPiece(Sock& s) {
  const FrameHdr& h = s.hdr;
  uint32_t piece = 0;
  Status bad = tcpwire::checkFrame(h, tcpwire::FrameRules{t_->pieceBytes(), acks()}, &piece);
  if (!bad.isOk()) {
    fail(protocolError(s, bad.message()));
    return false;
  }
  if (h.type != tcpwire::kData) return startCtl(s);
  s.piece = piece;
  s.destGot = 0;
  s.unexp = nullptr;
  auto discard = [&] {
    if (sink_.size() < h.bytes) sink_.resize(h.bytes);
    s.dest = RxDest::kDiscard;
    s.destPtr = sink_.data();
    return true;
  };
  if (h.seq < recvBase_) {
    if (!acks()) {
      fail(protocolError(
          s, strFormat("piece of message %llu, which is complete", static_cast<unsigned long long>(h.seq))));
      return false;
    }
    return discard();  // a re-sent copy of a message already received
  }
  const uint64_t idx = h.seq - recvBase_;
  if (idx < recvs_.size()) {
    s.heldSinceNs = 0;
    RecvOp& op = recvs_[idx];
    Status me = matchError(h.sig, h.total, op);
    if (!me.isOk()) {
      fail(me);
      return false;
    }
    if (seenPiece(op.bits, s.piece)) return discard();
    if (op.hasRed) {
      if (h.bytes % dataTypeSize(op.red.dtype) != 0) {
        fail(protocolError(s, "piece is not a whole number of elements"));
        return false;
      }
      if (s.staging.size() < h.bytes) s.staging.resize(h.bytes);
      s.dest = RxDest::kStaging;
      s.destPtr = s.staging.data();
    } else {
      t_->protect(op.dst + h.offset, h.bytes);
      s.dest = RxDest::kDirect;
      s.destPtr = op.dst + h.offset;
    }
    return true;
  }
  auto found = unexp_.find(h.seq);
  if (found != unexp_.end() && found->second.seen.known && seenPiece(found->second.seen, s.piece)) return discard();
  // The receive of the next message is often about to be posted: an in-place collective posts it
  // once the acknowledgement of an earlier send from the same buffer arrives, maybe on another lane
  // this very round. A large piece waits a moment in the socket (this lane is read again at the
  // next progress round) rather than being copied through the heap; then it is buffered anyway,
  // so an acknowledgement queued behind it on this lane cannot be held up for long.
  if (h.bytes >= kBulkBytes && h.seq == recvBase_ + recvs_.size() && t_->unexpectedWaitNs() > 0) {
    const int64_t now = nowNs();
    if (s.heldSinceNs == 0) s.heldSinceNs = now;
    if (now - s.heldSinceNs < t_->unexpectedWaitNs()) {
      needRx = true;
      return false;
    }
  }
  s.heldSinceNs = 0;
  // Not posted yet: buffer it (at least one piece, so a small limit cannot stall everything).
  if (unexpBytes_ > 0 && unexpBytes_ + h.bytes > t_->unexpectedLimit()) {
    if (!s.blocked) {
      s.blocked = true;
      setEvents(s, s.wantOut ? static_cast<uint32_t>(EPOLLOUT) : 0u);
      C4_TRACE(kLogNet, "tcp: rank %d stops reading %s: %zu unexpected bytes buffered", t_->rank(), laneText(s).c_str(),
               unexpBytes_);
      if (acks() && !s.pausedSent) {
        queueCtl(s, tcpwire::kPause, 0, "");
        s.pausedSent = true;
      }
    }
    return false;
  }
  UnexpMsg& m = unexp_[h.seq];
  if (!m.seen.known) {
    m.sig = h.sig;
    m.total = h.total;
    m.seen.known = true;
  } else if (!sameSig(h.sig, m.sig) || m.total != h.total) {
    fail(protocolError(s, strFormat("pieces of message %llu disagree on its signature (%s, %llu bytes, offset %llu vs "
                                    "%s, %llu bytes; receives posted up to %llu)",
                                    static_cast<unsigned long long>(h.seq), describeSig(h.sig).c_str(),
                                    static_cast<unsigned long long>(h.total), static_cast<unsigned long long>(h.offset),
                                    describeSig(m.sig).c_str(), static_cast<unsigned long long>(m.total),
                                    static_cast<unsigned long long>(recvBase_ + recvs_.size()))));
    return false;
  }
  auto p = std::make_unique<UnexpPiece>();
  p->offset = h.offset;
  p->bytes = h.bytes;
  p->data = takeBuffer();
  s.unexp = p.get();
  s.dest = RxDest::kUnexp;
  s.destPtr = p->data.get();
  m.pieces.push_back(std::move(p));
  unexpBytes_ += h.bytes;
  return true;
}

void TcpConnection::finishCtl(Sock& s) {
  const FrameHdr h = s.hdr;
  s.haveHdr = false;
  s.dest = RxDest::kNone;
  // s.bulk stays as the last piece set it: acknowledgements between large pieces must not make
  // the next piece go through the small buffer.
  switch (h.type) {
    case tcpwire::kAbort: {
      std::string reason(s.staging.data(), h.bytes);
      Status st = makeError(Code::kRemoteError, "tcp: %s aborted (%s)", peerText().c_str(), reason.c_str());
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    case tcpwire::kAck:
      onAck(s, reinterpret_cast<const AckEntry*>(s.staging.data()), h.bytes / sizeof(AckEntry));
      return;
    case tcpwire::kRetire: {
      if (h.offset >= static_cast<uint64_t>(numLanes())) {
        fail(protocolError(
            s, strFormat("retirement of lane %llu of %d", static_cast<unsigned long long>(h.offset), numLanes())));
        return;
      }
      Sock& r = sock(static_cast<int>(h.offset));
      if (&r == &s) {
        fail(protocolError(s, "a lane retired in a frame on itself"));
        return;
      }
      retire(r, strFormat("retired by %s: %s", peerText().c_str(), std::string(s.staging.data(), h.bytes).c_str()),
             false);
      return;
    }
    case tcpwire::kPause:
      s.peerPaused = true;
      return;
    case tcpwire::kResume:
      s.peerPaused = false;
      s.progressNs = nowNs();
      return;
    case tcpwire::kPing:
      queueCtl(s, tcpwire::kPong, 0, "");
      return;
    case tcpwire::kPong:
      // The peer reads this lane: as good as an acknowledgement for telling a stalled lane.
      s.lastAckNs = nowNs();
      if (!s.outstanding()) s.progressNs = s.lastAckNs;
      return;
    default:
      return;
  }
}

void TcpConnection::finishPiece(Sock& s) {
  const FrameHdr h = s.hdr;
  const uint32_t piece = s.piece;
  s.haveHdr = false;
  RxDest d = s.dest;
  s.dest = RxDest::kNone;
  s.bulk = h.bytes >= kBulkBytes;
  if (acks()) {
    // Acknowledged on the lane it came by (duplicates too: the first acknowledgement may be lost).
    // The sender of an eager piece does not wait for it: its acknowledgement rides along with the
    // next frame on this lane (or goes within kCheckEveryMs), costing no segment of its own.
    if (h.flags & tcpwire::kFlagEager) {
      s.acksLater.push_back(AckEntry{h.seq, piece, 0});
      if (s.acksLater.size() >= kMaxLaterAcks) needAck = true;
    } else {
      s.acksOut.push_back(AckEntry{h.seq, piece, 0});
      needAck = true;
    }
  }
  if (d == RxDest::kDiscard) return;
  t_->noteMoved(h.bytes);
  if (d == RxDest::kUnexp) {
    UnexpPiece* p = s.unexp;
    s.unexp = nullptr;
    p->complete = true;
    if (h.seq < recvBase_) {
      dropUnexpPiece(h.seq, p);  // the message completed from another copy meanwhile
      return;
    }
    const uint64_t idx = h.seq - recvBase_;
    if (idx >= recvs_.size()) {
      UnexpMsg& m = unexp_[h.seq];
      if (seenPiece(m.seen, piece))
        dropUnexpPiece(h.seq, p);
      else
        m.seen.add(piece);
      return;
    }
    // The receive was posted while this piece was being read: hand it over now.
    RecvOp& op = recvs_[idx];
    if (applyPiece(op, piece, p->offset, p->data.get(), p->bytes)) noteRate(op, p->bytes);
    dropUnexpPiece(h.seq, p);
    noteRecvProgress(op, h.seq);
    return;
  }
  if (h.seq < recvBase_) return;  // completed from another copy while this one was staged
  RecvOp& op = recvs_[h.seq - recvBase_];
  const bool counted =
      d == RxDest::kStaging ? applyPiece(op, piece, h.offset, s.staging.data(), h.bytes) : countPiece(op, piece);
  if (counted) noteRate(op, h.bytes);
  noteRecvProgress(op, h.seq);
}

size_t TcpConnection::receive(Sock& s, char* to, size_t want, size_t* budget) {
  ssize_t n = C4_SYSCALL_RETRY(recv(s.fd.get(), to, want, MSG_DONTWAIT));
  if (n == 0) {
    laneEof(s);
    return 0;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    int err = errno;
    laneError(s, err == ECONNRESET ? "connection reset" : "receive failed", err);
    return 0;
  }
  moved(s, static_cast<size_t>(n), false);
  *budget -= std::min(*budget, static_cast<size_t>(n));
  return static_cast<size_t>(n);
}

bool TcpConnection::rxStep(Sock& s, size_t* budget) {
  if (!s.haveHdr) {
    size_t avail = s.rxEnd - s.rxBeg;
    if (avail < kHdrBytes) {
      if (s.rxBeg > 0) {
        memmove(s.rxbuf.get(), s.rxbuf.get() + s.rxBeg, avail);
        s.rxBeg = 0;
        s.rxEnd = avail;
      }
      // Bulk mode: take the header (and a little more: a control frame behind it, such as an
      // acknowledgement, then needs no read of its own) so the payload lands in its destination
      // directly; at most kBulkLookahead bytes of a piece are copied from the buffer.
      size_t want = s.bulk ? kHdrBytes + kBulkLookahead - avail : kRxBufBytes - s.rxEnd;
      const size_t n = receive(s, s.rxbuf.get() + s.rxEnd, want, budget);
      if (n == 0) return false;
      s.rxEnd += n;
      return true;
    }
    memcpy(&s.hdr, s.rxbuf.get() + s.rxBeg, kHdrBytes);
    s.rxBeg += kHdrBytes;
    s.haveHdr = true;
    s.dest = RxDest::kNone;
  }
  if (s.dest == RxDest::kNone && !startPiece(s)) return false;
  const size_t need = s.hdr.bytes - s.destGot;
  size_t avail = s.rxEnd - s.rxBeg;
  if (avail > 0 || need == 0) {
    size_t take = std::min(avail, need);
    if (take) memcpy(s.destPtr + s.destGot, s.rxbuf.get() + s.rxBeg, take);
    s.rxBeg += take;
    s.destGot += take;
    if (s.rxBeg == s.rxEnd) s.rxBeg = s.rxEnd = 0;
  } else if (need >= kBulkBytes / 4 || (s.bulk && s.dest == RxDest::kCtl)) {
    // Large payloads, and a control frame between large pieces, go straight to their destination.
    const size_t n = receive(s, s.destPtr + s.destGot, need, budget);
    if (n == 0) return false;
    s.destGot += n;
  } else {
    const size_t n = receive(s, s.rxbuf.get(), kRxBufBytes, budget);
    if (n == 0) return false;
    s.rxBeg = 0;
    s.rxEnd = n;
  }
  if (s.destGot == s.hdr.bytes) {
    if (s.dest == RxDest::kCtl)
      finishCtl(s);
    else
      finishPiece(s);
  }
  return broken_.isOk() && s.fd.valid();
}

void TcpConnection::onReadable(Sock& s) {
  if (!s.fd.valid() || s.eof || s.silenced) return;
  if (s.state == SockState::kWaitChallenge) {
    const size_t want = sizeof(tcpwire::Challenge);
    ssize_t n = C4_SYSCALL_RETRY(recv(s.fd.get(), s.hsIn + s.hsHave, want - s.hsHave, MSG_DONTWAIT));
    if (n == 0) {
      Status st =
          makeError(Code::kRemoteError,
                    "tcp: %s closed lane %d during the handshake (it exited, or it rejected our proof of the key: "
                    "same UniqueId? see its log)",
                    peerText().c_str(), s.index);
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) laneError(s, "handshake receive failed", errno);
      return;
    }
    s.hsHave += static_cast<size_t>(n);
    if (s.hsHave < want) return;
    tcpwire::Challenge ch;
    memcpy(&ch, s.hsIn, sizeof(ch));
    if (!tcpwire::challengeValid(t_->key_, s.hello, ch)) {
      Status st = makeError(Code::kRemoteError,
                            "tcp: %s failed to prove the communicator key on lane %d (impostor or stale endpoint at "
                            "%s); refusing it",
                            peerText().c_str(), s.index, s.remoteText.c_str());
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    tcpwire::Proof pr{tcpwire::kProofMagic, 0, tcpwire::handshakeMac(t_->key_, false, s.hello, ch.nonce)};
    s.hsOut.append(reinterpret_cast<const char*>(&pr), sizeof(pr));
    s.state = SockState::kUp;
    s.lane.setState(LaneState::kUp);
    s.progressNs = nowNs();
    C4_INFO(kLogNet, "tcp: rank %d connected %s", t_->rank(), laneText(s).c_str());
    sendNotices();
    flush(s);
    return;
  }
  if (s.state != SockState::kUp || s.blocked) return;
  size_t budget = 8u << 20;  // then other lanes get their turn
  while (budget > 0 && s.fd.valid() && rxStep(s, &budget)) {
    // Acknowledge large pieces as they come, not at the end of the burst (up to 8 MiB later): a
    // send that must complete before its buffer is written again (in-place collectives) waits for it.
    if (s.acksOut.size() >= kAckBatch) ackLane(s);
  }
  if (!s.acksOut.empty()) ackLane(s);
}

void TcpConnection::ackLane(Sock& s) {
  if (!s.up() || s.silenced) {
    s.acksOut.clear();
    return;
  }
  for (size_t i = 0; i < s.acksOut.size(); i += kMaxAckEntries) {
    const size_t m = std::min(kMaxAckEntries, s.acksOut.size() - i);
    queueCtl(s, tcpwire::kAck, 0,
             std::string(reinterpret_cast<const char*>(s.acksOut.data() + i), m * sizeof(AckEntry)));
  }
  s.acksOut.clear();
  if (!s.wantOut) flush(s);
}

void TcpConnection::rxRetry() {
  needRx = false;
  for (auto& sp : socks_) {
    Sock& s = *sp;
    if (!broken_.isOk()) return;
    if (s.state != SockState::kUp || !s.fd.valid() || s.silenced) continue;
    if (s.blocked) {
      s.blocked = false;
      setEvents(s, s.wantOut ? static_cast<uint32_t>(EPOLLIN | EPOLLOUT) : static_cast<uint32_t>(EPOLLIN));
    }
    if (s.haveHdr || s.rxEnd > s.rxBeg) onReadable(s);
    if (s.pausedSent && !s.blocked && s.fd.valid()) {
      queueCtl(s, tcpwire::kResume, 0, "");
      s.pausedSent = false;
    }
  }
}

}  // namespace c4::transport::tcp
