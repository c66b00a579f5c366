// TCP transport, sends: a message cut into pieces striped over the lanes, written with writev,
// acknowledged by the peer (or not, C4_TCP_ACK=0), and released sends kept safe from receives.
// (tcp_internal.hpp lists the parts; docs/tcp-transport.md describes the protocol.)
#include "tcp_internal.hpp"  // private to transports/tcp: not among the target's headers

namespace c4::transport::tcp {

void TcpConnection::queueData(TxFrame&& f) {
  const int i = pickLane();
  if (i < 0) return;  // no lane left: the connection has failed (retire)
  Sock& s = sock(i);
  const int64_t now = nowNs();
  if (!s.outstanding()) s.progressNs = now;
  s.lane.setBusy(true, now);
  s.txq.push_back(std::move(f));
}

void TcpConnection::queueCtl(Sock& s, uint32_t type, uint64_t offset, const std::string& payload) {
  if (!s.up() || s.silenced) return;
  TxFrame f;
  f.hdr.type = type;
  f.hdr.bytes = static_cast<uint32_t>(payload.size());
  f.hdr.offset = offset;
  f.ctl = payload;
  // Ahead of the data, so acknowledgements are not held up by megabytes of pieces; behind a frame
  // that is half written.
  auto pos = s.txq.begin();
  if (pos != s.txq.end() && pos->done > 0) ++pos;
  s.txq.insert(pos, std::move(f));
  s.lane.setBusy(true, nowNs());
  t_->activate(this);
}

Status TcpConnection::prepareRequest(Request* req) {
  if (initiator()) openLanes();
  if (!broken_.isOk()) {
    failRequest(req, broken_);
    return broken_;
  }
  if (!owes()) lastMoveMs_ = nowMs();
  return Status::ok();
}

Status TcpConnection::isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint) {
  const Status& ab = t_->abortStatus();
  if (ab.isOk() && broken_.isOk() && closed_.isOk() && sends_.size() >= t_->sendQueue()) return sendQueueFull();
  C4_CHECK(startSend("tcp", peer_, !ab.isOk() ? ab : (!broken_.isOk() ? broken_ : closed_), buf, bytes, req));
  C4_CHECK(prepareRequest(req));
  const size_t piece = t_->pieceBytes();
  const uint32_t n = piecesOf(bytes);
  const uint64_t seq = sendSeq_++;
  sends_.emplace_back();
  SendOp* op = &sends_.back();
  op->buf = buf.bytes();
  op->bytes = bytes;
  op->req = req;
  op->seq = seq;
  op->pieces = op->left = op->frames = n;
  ++sendsOwed_;
  if (acks()) {
    op->acked.assign((n + 63) / 64, 0);
    // Small sends are copied and complete once written: waiting for the acknowledgement would add
    // a round trip to every small operation. The copies are bounded per connection.
    if (bytes <= t_->eagerBytes() && eagerInUse_ + bytes <= t_->eagerLimit()) {
      op->copy.reset(new char[std::max<size_t>(bytes, 1)]);
      if (bytes) memcpy(op->copy.get(), buf.ptr, bytes);
      op->buf = op->copy.get();
      eagerInUse_ += bytes;
    }
  }
  for (uint32_t k = 0; k < n; ++k) {
    TxFrame f;
    f.op = op;
    f.piece = k;
    f.hdr.type = tcpwire::kData;
    f.hdr.seq = seq;
    f.hdr.offset = static_cast<uint64_t>(k) * piece;
    f.hdr.bytes = static_cast<uint32_t>(std::min(piece, bytes - f.hdr.offset));
    f.hdr.total = bytes;
    f.hdr.sig = sig;
    f.hdr.flags = op->copy ? tcpwire::kFlagEager : 0;
    queueData(std::move(f));
  }
  t_->activate(this);
  return Status::ok();
}

namespace {

// Saves piece k of a released send (SendOp::saved) unless it is saved already.
void savePiece(SendOp& op, uint32_t k, size_t pieceBytes, TcpTransportImpl* t);

}  // namespace

bool TcpConnection::detachSend(Request* req) {
  for (SendOp& op : sends_) {
    if (op.req != req || op.reqDone || op.done || !op.released || op.copy) continue;
    // Copying more than the socket buffers of a few lanes hold costs more than the wait
    // (autotuned buffers hold megabytes): then the send completes when acknowledged, as usual.
    if (static_cast<size_t>(op.left) * t_->pieceBytes() > kDetachBytes) return false;
    // Every piece a frame may still read: those not acknowledged (a re-send) and those with a
    // frame queued or half written on some lane.
    for (uint32_t k = 0; k < op.pieces; ++k)
      if (!testBit(op.acked, k)) savePiece(op, k, t_->pieceBytes(), t_);
    for (auto& sp : socks_)
      for (const TxFrame& f : sp->txq)
        if (f.op == &op) savePiece(op, f.piece, t_->pieceBytes(), t_);
    op.reqDone = true;
    --sendsOwed_;
    completeRequest(op.req);
    return true;
  }
  return false;
}

void TcpConnection::protect(const char* p, size_t n) {
  const size_t pb = t_->pieceBytes();
  for (SendOp& op : sends_) {
    if (!op.released || op.done || op.copy || op.bytes == 0) continue;
    const char* b = op.buf;
    if (p >= b + op.bytes || b >= p + n) continue;
    const size_t lo = p > b ? static_cast<size_t>(p - b) : 0;
    const size_t hi = std::min(op.bytes, static_cast<size_t>(p + n - b));
    for (size_t piece = lo / pb; piece * pb < hi; ++piece)
      if (!testBit(op.acked, static_cast<uint32_t>(piece))) savePiece(op, static_cast<uint32_t>(piece), pb, t_);
  }
}

namespace {

void savePiece(SendOp& op, uint32_t k, size_t pieceBytes, TcpTransportImpl* t) {
  if (op.bytes == 0) return;
  if (op.saved.empty()) op.saved.resize(op.pieces);
  if (op.saved[k]) return;
  const size_t len = std::min(pieceBytes, op.bytes - static_cast<size_t>(k) * pieceBytes);
#ifdef C4_TCP_MUTANT_NO_SAVE
  t->addSaved(len);  // the mutant of tests/tcp: counts, keeps nothing; a re-send sends what buf holds
  return;
#endif
  op.saved[k].reset(new char[len]);
  memcpy(op.saved[k].get(), op.buf + static_cast<size_t>(k) * pieceBytes, len);
  t->addSaved(len);
}

}  // namespace

void TcpConnection::popDone() {
  while (!recvs_.empty() && recvs_.front().done) {
    recvs_.pop_front();
    ++recvBase_;
  }
  while (!sends_.empty() && sends_.front().done) {
    sends_.pop_front();
    ++sendBase_;
  }
}

void TcpConnection::purge(SendOp* op) {
  auto drop = [op](std::deque<TxFrame>& q, bool startedToo) {
    for (auto it = q.begin(); it != q.end();) {
      if (it->op == op && (startedToo || it->done == 0)) {
        --op->frames;
        it = q.erase(it);
      } else {
        ++it;
      }
    }
  };
  for (auto& s : socks_) {
    drop(s->txq, false);
    drop(s->inflight, true);
  }
}

void TcpConnection::maybeCompleteSend(SendOp& op) {
  if (op.done || op.left != 0) return;
  purge(&op);
  // A frame of it still half written reads from its buffer: the send completes after it.
  if (op.frames != 0) return;
  op.done = true;
  if (!op.reqDone) {
    op.reqDone = true;
    --sendsOwed_;
    completeRequest(op.req);
  }
  if (op.copy) {
    eagerInUse_ -= op.bytes;
    op.copy.reset();
  }
}

void TcpConnection::flushAll() {
  for (auto& sp : socks_) {
    Sock& s = *sp;
    if (!s.wantOut && (!s.hsOut.empty() || (s.state == SockState::kUp && !s.txq.empty()))) flush(s);
  }
}

void TcpConnection::onWritable(Sock& s) {
  if (s.state == SockState::kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(s.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      laneError(s, "connect failed (is the peer alive and listening?)", err);
      return;
    }
    SockAddr local;
    local.len = sizeof(local.storage);
    if (getsockname(s.fd.get(), local.sa(), &local.len) == 0) {
      s.localText = local.toString();
      s.lane.setEndpoints(s.localPort, s.localText, s.remoteText);
    }
    s.state = SockState::kWaitChallenge;
    s.hsOut.assign(reinterpret_cast<const char*>(&s.hello), sizeof(s.hello));
    setEvents(s, EPOLLIN);
    s.wantOut = false;
  } else if (s.wantOut) {
    s.wantOut = false;
    setEvents(s, EPOLLIN);
  }
  flush(s);
}

void TcpConnection::wrote(Sock& s, size_t n) {
  size_t left = n;
  bool sendsDone = false;
  while (left > 0 || (!s.txq.empty() && s.txq.front().done == s.txq.front().total())) {
    TxFrame& f = s.txq.front();
    const size_t take = std::min(f.total() - f.done, left);
    f.done += take;
    left -= take;
    if (f.done < f.total()) break;
    SendOp* op = f.op;
    if (!op) {
      s.txq.pop_front();
      continue;
    }
    s.lane.addPieces(1, f.resent ? 1 : 0);
    if (!acks()) {
      t_->noteMoved(f.hdr.bytes);
      s.txq.pop_front();
      --op->frames;
      --op->left;
      maybeCompleteSend(*op);
      sendsDone = true;
    } else if (op->left == 0 || testBit(op->acked, f.piece)) {
      // A copy of a piece the peer has already acknowledged (re-sent after a retirement).
      s.txq.pop_front();
      --op->frames;
      maybeCompleteSend(*op);
      sendsDone = true;
    } else {
      if (++op->written >= op->pieces && !op->reqDone) {
        if (op->copy) {
          op->reqDone = true;  // eager: every piece is out, the copy serves re-sends
          --sendsOwed_;
          completeRequest(op->req);
        } else if (!op->released) {
          op->released = true;  // its buffer may take this transport's receives (protect)
          op->req->released = true;
        }
      }
      s.inflight.push_back(std::move(f));
      s.txq.pop_front();
    }
  }
  if (sendsDone) popDone();
}

void TcpConnection::flush(Sock& s) {
  if (!s.fd.valid() || s.silenced || s.muted) return;
  while (!s.hsOut.empty()) {
    ssize_t n = C4_SYSCALL_RETRY(send(s.fd.get(), s.hsOut.data(), s.hsOut.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        s.wantOut = true;
        setEvents(s, EPOLLIN | EPOLLOUT);
        return;
      }
      laneError(s, "handshake send failed", errno);
      return;
    }
    s.hsOut.erase(0, static_cast<size_t>(n));
  }
  if (s.state != SockState::kUp) return;
  // Re-sent copies whose piece was acknowledged meanwhile (the peer had it after all) go unsent.
  if (acks()) {
    bool dropped = false;
    for (auto it = s.txq.begin(); it != s.txq.end();) {
      if (it->resent && it->done == 0 && it->op && (it->op->left == 0 || testBit(it->op->acked, it->piece))) {
        SendOp* op = it->op;
        --op->frames;
        it = s.txq.erase(it);
        maybeCompleteSend(*op);
        dropped = true;
      } else {
        ++it;
      }
    }
    if (dropped) popDone();
  }
  // Deferred acknowledgements ride along with whatever this lane writes now.
  if (!s.acksLater.empty() && !s.txq.empty()) {
    std::string payload(reinterpret_cast<const char*>(s.acksLater.data()), s.acksLater.size() * sizeof(AckEntry));
    s.acksLater.clear();
    queueCtl(s, tcpwire::kAck, 0, payload);
  }
  // At most this much per call, as a receive takes at most 8 MiB per readable lane: against a
  // peer that drains as fast as we send, one call would otherwise send a whole message before
  // the caller (its timeouts, other connections, a test watching the progress) runs again. The
  // next progress() call goes on (the lane is not waiting for EPOLLOUT).
  size_t budget = 8u << 20;
  while (!s.txq.empty() && budget > 0 && s.fd.valid()) {
    iovec iov[kMaxIov];
    int niov = 0;
    for (size_t i = 0; i < s.txq.size() && niov + 2 <= kMaxIov; ++i) {
      TxFrame& f = s.txq[i];
      if (f.done < kHdrBytes) {
        iov[niov++] = {reinterpret_cast<char*>(&f.hdr) + f.done, kHdrBytes - f.done};
        if (f.hdr.bytes) iov[niov++] = {const_cast<char*>(f.payload()), f.hdr.bytes};
      } else {
        size_t off = f.done - kHdrBytes;
        iov[niov++] = {const_cast<char*>(f.payload() + off), f.hdr.bytes - off};
      }
      if (f.hdr.bytes >= kBulkBytes) break;  // one large piece per call: the kernel takes no more anyway
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(niov);
    ssize_t n = C4_SYSCALL_RETRY(sendmsg(s.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        s.wantOut = true;
        s.lane.setStalled(true, nowNs());
        setEvents(s, EPOLLIN | EPOLLOUT);
        return;
      }
      int err = errno;
      laneError(s, err == EPIPE ? "the peer closed the connection (EPIPE)" : "send failed", err);
      return;
    }
    s.lane.setStalled(false, nowNs());
    moved(s, static_cast<size_t>(n), true);
    budget -= std::min(budget, static_cast<size_t>(n));
    wrote(s, static_cast<size_t>(n));
  }
  if (!s.outstanding()) s.lane.setBusy(false, nowNs());  // busy until what it carried is acknowledged
  if (s.lane.state() == LaneState::kDraining && s.txq.empty()) {
    // retireLane without acknowledgements: what it had is out; now it closes.
    s.lane.setState(LaneState::kRetired);
    closeSock(s);
  }
}

void TcpConnection::onAck(Sock& s, const AckEntry* e, size_t n) {
  const int64_t now = nowNs();
  s.lastAckNs = now;
  s.progressNs = now;
  bool finished = false;
  for (size_t k = 0; k < n; ++k) {
    const AckEntry a = e[k];
    if (a.seq >= sendSeq_) {
      fail(protocolError(s, strFormat("acknowledgement of message %llu, which was never sent",
                                      static_cast<unsigned long long>(a.seq))));
      return;
    }
    if (a.seq < sendBase_) continue;  // a duplicate acknowledgement of a finished send
    SendOp& op = sends_[a.seq - sendBase_];
    if (a.piece >= op.pieces) {
      fail(protocolError(s, strFormat("acknowledgement of piece %u of a %u-piece message", a.piece, op.pieces)));
      return;
    }
    if (op.done || testBit(op.acked, a.piece)) continue;
    setBit(op.acked, a.piece);
    --op.left;
    t_->noteMoved(std::min(t_->pieceBytes(), op.bytes - static_cast<size_t>(a.piece) * t_->pieceBytes()));
    // Its frame waits in this lane's inflight queue, almost always at the front.
    for (auto it = s.inflight.begin(); it != s.inflight.end(); ++it) {
      if (it->op == &op && it->piece == a.piece) {
        --op.frames;
        s.inflight.erase(it);
        break;
      }
    }
    if (op.left == 0) {
      maybeCompleteSend(op);
      finished = true;
    }
  }
  if (!s.outstanding()) s.lane.setBusy(false, nowNs());
  if (finished) popDone();
}

void TcpConnection::sendAcks(bool later) {
  needAck = false;
  for (auto& sp : socks_) {
    Sock& s = *sp;
    if (later || s.acksLater.size() >= kMaxLaterAcks) {
      s.acksOut.insert(s.acksOut.end(), s.acksLater.begin(), s.acksLater.end());
      s.acksLater.clear();
    }
    if (s.acksOut.empty()) continue;
    for (size_t i = 0; i < s.acksOut.size(); i += kMaxAckEntries) {
      const size_t m = std::min(kMaxAckEntries, s.acksOut.size() - i);
      queueCtl(s, tcpwire::kAck, 0,
               std::string(reinterpret_cast<const char*>(s.acksOut.data() + i), m * sizeof(AckEntry)));
    }
    s.acksOut.clear();
  }
}

}  // namespace c4::transport::tcp
