// TCP transport: see tcp_transport.hpp for the overview and docs/tcp-transport.md for the protocol,
// the failure handling and the measurements behind the defaults.
#include "transports/tcp/tcp_transport.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "common/logging.hpp"
#include "common/siphash.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"
#include "transports/tcp/tcp_wire.hpp"
#include "transports/transport_util.hpp"

namespace c4::transport {

namespace tcpwire {

namespace {
void keyBytes(const uint64_t key[2], uint8_t out[16]) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(key[0] >> (8 * i));
    out[8 + i] = static_cast<uint8_t>(key[1] >> (8 * i));
  }
}
}  // namespace

uint64_t handshakeMac(const uint64_t key[2], bool acceptor, const Hello& hello, uint64_t acceptorNonce) {
  uint8_t k[16];
  keyBytes(key, k);
  SipHasher h(k);
  const char* role = acceptor ? "c4tcp-acceptor" : "c4tcp-initiator";
  h.update(role, strlen(role) + 1);
  h.update(&hello, sizeof(hello));
  h.update(&acceptorNonce, sizeof(acceptorNonce));
  return h.finish();
}

uint64_t tagHash(const uint64_t key[2], const char* tag, size_t len) {
  uint8_t k[16];
  keyBytes(key, k);
  SipHasher h(k);
  h.update("c4tcp-tag", 10);
  h.update(tag, len);
  return h.finish();
}

}  // namespace tcpwire

namespace {

using detail::Fd;
using detail::SockAddr;
using detail::WireAddr;
using tcpwire::FrameHdr;

constexpr uint64_t kSetupMagic = 0x3176706374346331ull;  // "1c4tcpv1"
constexpr int kMaxPorts = 8;
constexpr int kMaxLanes = 16;
constexpr size_t kHdrBytes = sizeof(FrameHdr);
constexpr size_t kRxBufBytes = 65536;
// A lane whose last piece was at least this large reads the next header alone and the payload
// straight into its destination (bulk mode); below, it reads greedily into its small buffer.
constexpr size_t kBulkBytes = 32768;
constexpr int kMaxIov = 64;
constexpr size_t kMaxAbortReason = 1024;
constexpr int64_t kCheckEveryMs = 20;
constexpr int64_t kEofGraceMs = 1000;

int64_t nowMs() { return detail::nowMs(); }
int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

uint64_t randomU64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    // getrandom only fails on ancient kernels; the nonce must still differ per connection.
    v = static_cast<uint64_t>(nowNs()) ^ (static_cast<uint64_t>(getpid()) << 32);
  }
  return v;
}

/// What each rank publishes at setup.
struct SetupRecord {
  uint64_t magic;
  int32_t ok;  // 0: this rank's setup failed (it logged why)
  int32_t nports;
  int32_t nlanes;
  int32_t pad;
  WireAddr addrs[kMaxPorts];
  char hostname[64];
};

// epoll tags: kind in the top byte.
constexpr uint64_t kTagListener = 1ull << 56;
constexpr uint64_t kTagIncoming = 2ull << 56;
constexpr uint64_t kTagLane = 3ull << 56;
constexpr uint64_t kTagKindMask = 0xffull << 56;

class TcpTransportImpl;
class TcpConnection;

struct SendOp {
  const char* buf;
  size_t bytes;
  Request* req;
  size_t piecesLeft;
  bool done;
};

struct RecvOp {
  char* dst;
  size_t bytes;
  OpSig sig;
  ReduceSpec red;
  bool hasRed;
  Request* req;
  size_t got;
  bool seen;  // some piece arrived (a 0-byte message is one empty piece)
  bool done;
};

struct TxPiece {
  SendOp* op;
  FrameHdr hdr;
  size_t done;  // bytes of header + payload written
};

/// A piece that arrived before its receive was posted.
struct UnexpPiece {
  uint64_t offset = 0;
  size_t bytes = 0;
  std::unique_ptr<char[]> data;
  bool complete = false;
};
struct UnexpMsg {
  OpSig sig;
  uint64_t total = 0;
  std::vector<std::unique_ptr<UnexpPiece>> pieces;
};

enum class LaneState { kIdle, kConnecting, kWaitChallenge, kUp, kClosed };
enum class RxDest { kNone, kDirect, kStaging, kUnexp, kAbort };

/// Whether two pieces carry the same message signature. (Not sigMatches: that asks whether a sent
/// signature fits an expected one, where a Send fits a Recv but not another Send.)
bool sameSig(const OpSig& a, const OpSig& b) {
  return a.seq == b.seq && a.count == b.count && a.root == b.root && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op;
}

struct Lane {
  TcpConnection* conn = nullptr;
  int index = 0;
  int localPort = 0;
  int remotePort = 0;
  LaneState state = LaneState::kIdle;
  Fd fd;
  int64_t sinceMs = 0;  // connect started
  uint32_t events = 0;  // registered epoll events
  SockAddr remote;
  std::string localText, remoteText;

  // Handshake (initiator side).
  tcpwire::Hello hello{};
  std::string hsOut;
  char hsIn[sizeof(tcpwire::Challenge)];
  size_t hsHave = 0;

  // Send side.
  std::deque<TxPiece> txq;
  bool wantOut = false;  // waiting for EPOLLOUT
  int64_t busySinceNs = 0;

  // Receive side.
  std::unique_ptr<char[]> rxbuf;
  size_t rxBeg = 0, rxEnd = 0;
  bool haveHdr = false;
  FrameHdr hdr{};
  RxDest dest = RxDest::kNone;
  char* destPtr = nullptr;
  size_t destGot = 0;
  UnexpPiece* unexp = nullptr;
  std::vector<char> staging;
  bool bulk = false;
  bool blocked = false;  // no room for an unexpected piece: stopped reading
  bool eof = false;
  int64_t eofMs = 0;

  TcpLaneStats stats;
  double weight = 1.0;
  double current = 0.0;  // smooth weighted round robin
};

class TcpConnection final : public Connection {
 public:
  TcpConnection(TcpTransportImpl* t, int peer, int nlanes);
  ~TcpConnection() override = default;

  int peer() const override { return peer_; }
  Status isend(const void* buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint = {}) override;
  Status irecv(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) override;
  Status peek(bool* ready, OpSig* sig, size_t* bytes) override;

  bool pending() const { return !sends_.empty() || !recvs_.empty(); }
  bool initiator() const;
  /// Opens every lane towards the peer (initiator side). Failures break the connection.
  void openLanes();
  /// Flushes queued output on every lane that can write now.
  void flushAll();
  /// Reads what the lane has (also called with data left in its buffer).
  void onReadable(Lane& l);
  void onWritable(Lane& l);
  /// Lanes stopped for lack of buffer room or with buffered input: read them again.
  void rxRetry();
  /// Timeouts, half-closed connections, liveness probes of a lower rank that never connected.
  void check(int64_t now);
  /// Fails every pending request with `st`, closes every lane, rejects later requests.
  void fail(const Status& st);
  /// Attaches an authenticated incoming socket as lane `lane` (acceptor side).
  void attach(int lane, Fd fd, const SockAddr& remote);
  const Status& broken() const { return broken_; }
  std::string peerText() const;
  std::string laneText(const Lane& l) const;
  std::vector<Lane>& lanes() { return lanes_; }
  const std::vector<Lane>& lanes() const { return lanes_; }
  Status setWeights(const std::vector<double>& w);
  void sendAbort(const std::string& reason);
  bool needRx = false;
  bool inActiveList = false;

 private:
  int pickLane();
  void flush(Lane& l);
  void laneError(Lane& l, const char* what, int err);
  void laneEof(Lane& l);
  /// Parses and dispatches input; false if the lane must stop (blocked, broken, closed).
  bool rxStep(Lane& l, size_t* budget);
  /// One non-blocking recv of up to `want` bytes into `to`, counted against *budget; 0 when nothing
  /// came (would block), or the lane hit end of file or an error (handled here).
  size_t receive(Lane& l, char* to, size_t want, size_t* budget);
  /// After a new request's arguments are checked: opens the lanes (lower rank), fails `req` if that
  /// broke the connection, restarts the stall clock when the connection was idle.
  Status prepareRequest(Request* req);
  bool startPiece(Lane& l);
  void finishPiece(Lane& l);
  void applyPiece(RecvOp& op, uint64_t offset, const char* data, size_t bytes);
  void noteRecvProgress(RecvOp& op);
  void popDone();
  Status matchError(const OpSig& sig, uint64_t total, const RecvOp& op) const;
  Status protocolError(const Lane& l, const std::string& what);
  void setEvents(Lane& l, uint32_t ev);
  void closeLane(Lane& l);
  void moved(Lane& l, size_t n, bool tx);
  /// Acceptor side, lanes missing and messages pending: connects to the peer's listening socket.
  /// Refused: the peer is gone, fail now. Accepted: it is alive (not at this operation yet).
  void probePeer(int64_t now);

  TcpTransportImpl* t_;
  int peer_;
  std::vector<Lane> lanes_;
  std::deque<SendOp> sends_;
  std::deque<RecvOp> recvs_;
  uint64_t sendSeq_ = 0;
  uint64_t recvBase_ = 0;  // seq of recvs_.front()
  std::map<uint64_t, UnexpMsg> unexp_;
  size_t unexpBytes_ = 0;
  Status broken_;
  Status closed_;  // the peer closed every lane cleanly
  int64_t lastMoveMs_ = 0;
  bool opened_ = false;
  Fd probe_;                 // liveness probe in flight (non-blocking connect)
  int64_t lastProbeMs_ = 0;  // when the last probe started
};

class TcpTransportImpl final : public TcpTransport {
 public:
  explicit TcpTransportImpl(const Context& ctx);
  ~TcpTransportImpl() override;

  const char* name() const override { return "tcp"; }
  Caps caps() const override;
  bool canConnect(int peer) const override { return peer >= 0 && peer < nranks_ && peer != rank_; }
  int waitFd() const override { return ep_.get(); }
  Status connect(int peer, Connection** out) override;
  Status progress() override;
  void abort(const std::string& reason) override;
  Status peerHealth(int peer) override;

  int lanes() const override { return nlanes_; }
  std::vector<std::string> listenAddresses() const override;
  Status laneStats(int peer, std::vector<TcpLaneStats>* out) const override;
  Status setLaneWeights(int peer, const std::vector<double>& weights) override;

  Status setup(Oob* oob);

  // Shared with connections.
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int epfd() const { return ep_.get(); }
  size_t pieceBytes() const { return pieceBytes_; }
  size_t unexpectedLimit() const { return unexpLimit_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  const Status& abortStatus() const { return abortStatus_; }
  const char* peerHost(int peer) const { return records_[peer].hostname; }
  int64_t probeMs() const { return probeMs_; }
  /// Starts a liveness probe of `peer`: a non-blocking connect to probeTarget(peer). Returns the
  /// connect's errno (0: connected, EINPROGRESS: under way, ECONNREFUSED: nobody listens).
  int startProbe(int peer, Fd* out) const;
  /// The address a probe of `peer` goes to: its first listening address.
  bool probeAddr(int peer, SockAddr* a) const;
  std::string probeTarget(int peer) const;
  /// What a probe sends once connected, so the peer drops it quietly.
  tcpwire::Hello probeHello(int peer) const;
  const char* hostname() const { return hostname_; }
  void noteError(const Status& st) {
    if (firstError_.isOk()) firstError_ = st;
  }
  void activate(TcpConnection* c) {
    if (!c->inActiveList) {
      c->inActiveList = true;
      active_.push_back(c);
    }
  }
  /// Socket for lane `lane` to `peer`: bound to the planned local port / source port, connect
  /// started. Errors name the peer, lane and addresses.
  Status openLaneSocket(int peer, Lane& l);
  void tuneSocket(int fd) const;

 private:
  TcpConnection* conn(int peer);
  void onListener(int port);
  void onIncoming(uint64_t id, uint32_t ev);
  void dropIncoming(uint64_t id, const std::string& why);
  struct Incoming {
    Fd fd;
    SockAddr remote;
    int64_t sinceMs = 0;
    int stage = 0;  // 0: reading hello, 1: challenge sent, reading proof
    char in[sizeof(tcpwire::Hello)];
    size_t have = 0;
    tcpwire::Hello hello{};
    uint64_t nonce = 0;
    std::string out;
    bool probe = false;  // a peer's liveness probe: dropped without a warning
  };
  bool incomingStep(Incoming& in, std::string* why, bool* done);

  int rank_;
  int nranks_;
  std::string tag_;
  uint64_t key_[2];
  uint64_t tagHash_;
  std::function<LanePlan(int, int)> lanePlan_;
  int64_t timeoutMs_;
  int nlanes_;
  size_t pieceBytes_;
  int bufBytes_;
  size_t unexpLimit_;
  int64_t handshakeMs_;
  int64_t sportBase_;
  int64_t probeMs_;
  char hostname_[64] = {0};

  Fd ep_;
  std::vector<SockAddr> portAddrs_;  // bound listen addresses (port i)
  std::vector<std::string> portNames_;
  std::vector<Fd> listeners_;
  std::vector<SetupRecord> records_;
  std::vector<std::unique_ptr<TcpConnection>> conns_;
  std::vector<TcpConnection*> active_;
  std::map<uint64_t, Incoming> incoming_;
  uint64_t nextIncoming_ = 1;
  Status firstError_;
  Status abortStatus_;
  int64_t lastCheckMs_ = 0;

  friend class TcpConnection;
};

// ---------------------------------------------------------------------------------------------
// TcpConnection

TcpConnection::TcpConnection(TcpTransportImpl* t, int peer, int nlanes) : t_(t), peer_(peer), lanes_(nlanes) {
  for (int i = 0; i < nlanes; ++i) {
    Lane& l = lanes_[static_cast<size_t>(i)];
    l.conn = this;
    l.index = i;
    l.stats.lane = i;
    l.rxbuf.reset(new char[kRxBufBytes]);
  }
  lastMoveMs_ = nowMs();
}

bool TcpConnection::initiator() const { return t_->rank() < peer_; }

std::string TcpConnection::peerText() const { return strFormat("rank %d (host %s)", peer_, t_->peerHost(peer_)); }

std::string TcpConnection::laneText(const Lane& l) const {
  return strFormat("rank %d (host %s, lane %d of %zu, %s -> %s)", peer_, t_->peerHost(peer_), l.index, lanes_.size(),
                   l.localText.empty() ? "?" : l.localText.c_str(), l.remoteText.empty() ? "?" : l.remoteText.c_str());
}

void TcpConnection::setEvents(Lane& l, uint32_t ev) {
  if (!l.fd.valid() || ev == l.events) return;
  epoll_event e{};
  e.events = ev;
  e.data.u64 = kTagLane | (static_cast<uint64_t>(peer_) << 8) | static_cast<uint64_t>(l.index);
  int op = l.events == 0 && ev != 0 ? EPOLL_CTL_ADD : (ev == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD);
  if (epoll_ctl(t_->epfd(), op, l.fd.get(), &e) == 0) l.events = ev;
}

void TcpConnection::closeLane(Lane& l) {
  if (l.fd.valid()) {
    if (l.events) epoll_ctl(t_->epfd(), EPOLL_CTL_DEL, l.fd.get(), nullptr);
    l.events = 0;
    l.fd.reset();
  }
  if (l.busySinceNs) {
    l.stats.busyNs += static_cast<uint64_t>(nowNs() - l.busySinceNs);
    l.busySinceNs = 0;
  }
  l.state = LaneState::kClosed;
  l.stats.up = false;
  l.txq.clear();
  l.hsOut.clear();
  l.haveHdr = false;
  l.dest = RxDest::kNone;
  l.unexp = nullptr;
  l.blocked = false;
  l.wantOut = false;
}

void TcpConnection::openLanes() {
  if (opened_ || !broken_.isOk()) return;
  opened_ = true;
  for (Lane& l : lanes_) {
    Status st = t_->openLaneSocket(peer_, l);
    if (!st.isOk()) {
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    setEvents(l, EPOLLIN | EPOLLOUT);
  }
}

void TcpConnection::attach(int lane, Fd fd, const SockAddr& remote) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  l.fd = std::move(fd);
  l.remote = remote;
  l.remoteText = remote.toString();
  SockAddr local;
  local.len = sizeof(local.storage);
  if (getsockname(l.fd.get(), local.sa(), &local.len) == 0) l.localText = local.toString();
  l.stats.localAddr = l.localText;
  l.stats.remoteAddr = l.remoteText;
  l.state = LaneState::kUp;
  l.stats.up = true;
  l.eof = false;
  setEvents(l, EPOLLIN);
  C4_INFO(kLogNet, "tcp: rank %d accepted %s", t_->rank(), laneText(l).c_str());
  if (!l.txq.empty()) t_->activate(this);
}

Status TcpConnection::setWeights(const std::vector<double>& w) {
  if (w.size() != lanes_.size())
    return makeError(Code::kInvalidArgument, "tcp: %zu lane weights given for %zu lanes to rank %d", w.size(),
                     lanes_.size(), peer_);
  double sum = 0;
  for (double x : w) {
    if (!(x >= 0)) return makeError(Code::kInvalidArgument, "tcp: lane weights must be >= 0");
    sum += x;
  }
  if (sum <= 0) return makeError(Code::kInvalidArgument, "tcp: lane weights to rank %d are all 0", peer_);
  for (size_t i = 0; i < w.size(); ++i) {
    lanes_[i].weight = w[i];
    lanes_[i].stats.weight = w[i];
    lanes_[i].current = 0;
  }
  return Status::ok();
}

int TcpConnection::pickLane() {
  // Smooth weighted round robin (equal weights: plain round robin).
  double total = 0;
  int best = -1;
  for (Lane& l : lanes_) {
    if (l.weight <= 0) continue;
    l.current += l.weight;
    total += l.weight;
    if (best < 0 || l.current > lanes_[static_cast<size_t>(best)].current) best = l.index;
  }
  if (best < 0) return 0;
  lanes_[static_cast<size_t>(best)].current -= total;
  return best;
}

Status TcpConnection::prepareRequest(Request* req) {
  if (initiator()) openLanes();
  if (!broken_.isOk()) {
    failRequest(req, broken_);
    return broken_;
  }
  if (!pending()) lastMoveMs_ = nowMs();
  return Status::ok();
}

Status TcpConnection::isend(const void* buf, size_t bytes, const OpSig& sig, Request* req, SendHint) {
  const Status& ab = t_->abortStatus();
  C4_CHECK(startSend("tcp", peer_, !ab.isOk() ? ab : (!broken_.isOk() ? broken_ : closed_), buf, bytes, req));
  C4_CHECK(prepareRequest(req));
  const size_t piece = t_->pieceBytes();
  const size_t n = bytes == 0 ? 1 : (bytes + piece - 1) / piece;
  sends_.push_back(SendOp{static_cast<const char*>(buf), bytes, req, n, false});
  SendOp* op = &sends_.back();
  const uint64_t seq = sendSeq_++;
  for (size_t k = 0; k < n; ++k) {
    TxPiece p;
    p.op = op;
    p.done = 0;
    p.hdr = FrameHdr{};
    p.hdr.type = tcpwire::kData;
    p.hdr.seq = seq;
    p.hdr.offset = k * piece;
    p.hdr.bytes = static_cast<uint32_t>(std::min(piece, bytes - k * piece));
    p.hdr.total = bytes;
    p.hdr.sig = sig;
    Lane& l = lanes_[static_cast<size_t>(pickLane())];
    if (l.txq.empty() && l.busySinceNs == 0) l.busySinceNs = nowNs();
    l.txq.push_back(p);
  }
  t_->activate(this);
  return Status::ok();
}

Status TcpConnection::irecv(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) {
  const Status& ab = t_->abortStatus();
  C4_CHECK(startRecv("tcp", peer_, !ab.isOk() ? ab : broken_, dst, bytes, red, req));
  C4_CHECK(prepareRequest(req));
  const uint64_t seq = recvBase_ + recvs_.size();
  recvs_.push_back(
      RecvOp{static_cast<char*>(dst), bytes, sig, red ? *red : ReduceSpec{}, red != nullptr, req, 0, false, false});
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
      if (!pieces[i]->complete) {
        ++i;
        continue;
      }
      applyPiece(op, pieces[i]->offset, pieces[i]->data.get(), pieces[i]->bytes);
      unexpBytes_ -= pieces[i]->bytes;
      pieces[i] = std::move(pieces.back());
      pieces.pop_back();
    }
    if (pieces.empty()) unexp_.erase(it);
    needRx = true;         // room freed; a lane may have stopped for it
    noteRecvProgress(op);  // may pop op
  }
  // A lane that stopped reading (no room for unexpected data) may hold this very message's next
  // piece header: it can go straight to dst now, so the lane must resume even if nothing of the
  // message was buffered (without this, a 64 MiB receive posted late waited forever).
  for (const Lane& l : lanes_) needRx |= l.blocked;
  if (req->state == Request::kPending && !closed_.isOk()) {
    bool inFlight = false;
    for (const Lane& l : lanes_) inFlight |= l.haveHdr && l.hdr.seq == seq;
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
  if (it != unexp_.end() && !it->second.pieces.empty()) {
    *sig = it->second.sig;
    *bytes = it->second.total;
    *ready = true;
    return Status::ok();
  }
  for (const Lane& l : lanes_) {
    if (l.haveHdr && l.hdr.type == tcpwire::kData && l.hdr.seq == recvBase_) {
      *sig = l.hdr.sig;
      *bytes = l.hdr.total;
      *ready = true;
      return Status::ok();
    }
  }
  return Status::ok();
}

void TcpConnection::applyPiece(RecvOp& op, uint64_t offset, const char* data, size_t bytes) {
  if (bytes) {
    if (op.hasRed)
      kernels::reduce(op.dst + offset, static_cast<const char*>(op.red.local) + offset, data,
                      bytes / dataTypeSize(op.red.dtype), op.red.dtype, op.red.op);
    else
      memcpy(op.dst + offset, data, bytes);
  }
  op.got += bytes;
  op.seen = true;
}

void TcpConnection::noteRecvProgress(RecvOp& op) {
  if (!op.done && op.seen && op.got == op.bytes) {
    op.done = true;
    completeRequest(op.req);
    popDone();
  }
}

void TcpConnection::popDone() {
  while (!recvs_.empty() && recvs_.front().done) {
    recvs_.pop_front();
    ++recvBase_;
  }
  while (!sends_.empty() && sends_.front().done) sends_.pop_front();
}

Status TcpConnection::matchError(const OpSig& sig, uint64_t total, const RecvOp& op) const {
  return transport::matchError("tcp", peer_, peerText(), t_->rank(), sig, total, op.sig, op.bytes);
}

Status TcpConnection::protocolError(const Lane& l, const std::string& what) {
  Status st = makeError(Code::kInvalidUsage, "tcp: protocol violation from %s to rank %d: %s", laneText(l).c_str(),
                        t_->rank(), what.c_str());
  C4_WARN(kLogNet, "%s", st.message().c_str());
  return st;
}

void TcpConnection::moved(Lane& l, size_t n, bool tx) {
  (tx ? l.stats.bytesSent : l.stats.bytesRecv) += n;
  if (n) lastMoveMs_ = nowMs();
}

void TcpConnection::laneError(Lane& l, const char* what, int err) {
  size_t n = sends_.size() + recvs_.size();
  Status st =
      makeError(Code::kRemoteError, "tcp: %s on the connection from rank %d to %s (%s) with %zu message(s) pending",
                what, t_->rank(), laneText(l).c_str(), strerror(err), n);
  C4_WARN(kLogNet, "%s", st.message().c_str());
  fail(st);
}

void TcpConnection::laneEof(Lane& l) {
  l.eof = true;
  l.eofMs = nowMs();
  bool midFrame = l.haveHdr || l.rxBeg != l.rxEnd;
  std::string where = laneText(l);
  if (l.fd.valid()) {
    if (l.events) epoll_ctl(t_->epfd(), EPOLL_CTL_DEL, l.fd.get(), nullptr);
    l.events = 0;
  }
  l.state = LaneState::kClosed;
  l.stats.up = false;
  if (midFrame) {
    Status st = makeError(Code::kRemoteError,
                          "tcp: %s closed its connection to rank %d in the middle of a message (%zu pending)",
                          where.c_str(), t_->rank(), sends_.size() + recvs_.size());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
    return;
  }
  bool all = true;
  for (const Lane& x : lanes_) all &= x.eof;
  if (all && closed_.isOk())
    closed_ = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d", peerText().c_str(), t_->rank());
  if (!pending()) return;
  // Data comes before the close on each lane: once every lane is closed, nothing else arrives. A
  // pending send with pieces on a closed lane cannot finish either.
  bool stuckSend = !l.txq.empty();
  if (all || stuckSend) {
    Status st = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d with %zu message(s) pending",
                          all ? peerText().c_str() : where.c_str(), t_->rank(), sends_.size() + recvs_.size());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
  }
}

void TcpConnection::fail(const Status& st) {
  if (broken_.isOk()) broken_ = st;
  for (SendOp& op : sends_)
    if (!op.done) failRequest(op.req, st);
  for (RecvOp& op : recvs_)
    if (!op.done) failRequest(op.req, st);
  sends_.clear();
  recvs_.clear();
  unexp_.clear();
  unexpBytes_ = 0;
  for (Lane& l : lanes_) closeLane(l);
  t_->noteError(broken_);
}

void TcpConnection::sendAbort(const std::string& reason) {
  std::string r = reason.substr(0, kMaxAbortReason);
  for (Lane& l : lanes_) {
    if (l.state != LaneState::kUp || !l.fd.valid()) continue;
    // Only at a frame boundary; a half-written piece cannot be interrupted.
    if (!l.hsOut.empty() || (!l.txq.empty() && l.txq.front().done != 0)) continue;
    FrameHdr h{};
    h.type = tcpwire::kAbort;
    h.bytes = static_cast<uint32_t>(r.size());
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(r.data()), r.size()}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    (void)C4_SYSCALL_RETRY(sendmsg(l.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT));
  }
}

void TcpConnection::flushAll() {
  for (Lane& l : lanes_)
    if (!l.wantOut && (!l.hsOut.empty() || (l.state == LaneState::kUp && !l.txq.empty()))) flush(l);
}

void TcpConnection::onWritable(Lane& l) {
  if (l.state == LaneState::kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(l.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      laneError(l, "connect failed (is the peer alive and listening?)", err);
      return;
    }
    SockAddr local;
    local.len = sizeof(local.storage);
    if (getsockname(l.fd.get(), local.sa(), &local.len) == 0) {
      l.localText = local.toString();
      l.stats.localAddr = l.localText;
    }
    l.state = LaneState::kWaitChallenge;
    l.hsOut.assign(reinterpret_cast<const char*>(&l.hello), sizeof(l.hello));
    setEvents(l, EPOLLIN);
    l.wantOut = false;
  } else if (l.wantOut) {
    l.wantOut = false;
    setEvents(l, EPOLLIN);
  }
  flush(l);
}

void TcpConnection::flush(Lane& l) {
  if (!l.fd.valid()) return;
  while (!l.hsOut.empty()) {
    ssize_t n = C4_SYSCALL_RETRY(send(l.fd.get(), l.hsOut.data(), l.hsOut.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.wantOut = true;
        setEvents(l, EPOLLIN | EPOLLOUT);
        return;
      }
      laneError(l, "handshake send failed", errno);
      return;
    }
    l.hsOut.erase(0, static_cast<size_t>(n));
  }
  if (l.state != LaneState::kUp) return;
  // At most this much per call, as a receive takes at most 8 MiB per readable lane: against a
  // peer that drains as fast as we send, one call would otherwise send a whole message before
  // the caller (its timeouts, other connections, a test watching the progress) runs again. The
  // next progress() call goes on (the lane is not waiting for EPOLLOUT).
  size_t budget = 8u << 20;
  while (!l.txq.empty() && budget > 0) {
    iovec iov[kMaxIov];
    int niov = 0;
    for (size_t i = 0; i < l.txq.size() && niov + 2 <= kMaxIov; ++i) {
      TxPiece& p = l.txq[i];
      if (p.done < kHdrBytes) {
        iov[niov++] = {reinterpret_cast<char*>(&p.hdr) + p.done, kHdrBytes - p.done};
        if (p.hdr.bytes) iov[niov++] = {const_cast<char*>(p.op->buf + p.hdr.offset), p.hdr.bytes};
      } else {
        size_t off = p.done - kHdrBytes;
        iov[niov++] = {const_cast<char*>(p.op->buf + p.hdr.offset + off), p.hdr.bytes - off};
      }
      if (p.hdr.bytes >= kBulkBytes) break;  // one large piece per call: the kernel takes no more anyway
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(niov);
    ssize_t n = C4_SYSCALL_RETRY(sendmsg(l.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.wantOut = true;
        setEvents(l, EPOLLIN | EPOLLOUT);
        return;
      }
      int err = errno;
      laneError(l, err == EPIPE ? "the peer closed the connection (EPIPE)" : "send failed", err);
      return;
    }
    moved(l, static_cast<size_t>(n), true);
    budget -= std::min(budget, static_cast<size_t>(n));
    size_t left = static_cast<size_t>(n);
    while (left > 0 || (!l.txq.empty() && l.txq.front().done == kHdrBytes + l.txq.front().hdr.bytes)) {
      TxPiece& p = l.txq.front();
      size_t need = kHdrBytes + p.hdr.bytes - p.done;
      size_t take = std::min(need, left);
      p.done += take;
      left -= take;
      if (p.done < kHdrBytes + p.hdr.bytes) break;
      ++l.stats.piecesSent;
      SendOp* op = p.op;
      l.txq.pop_front();
      if (--op->piecesLeft == 0) {
        op->done = true;
        completeRequest(op->req);
      }
    }
    popDone();
  }
  if (l.txq.empty() && l.busySinceNs) {
    l.stats.busyNs += static_cast<uint64_t>(nowNs() - l.busySinceNs);
    l.busySinceNs = 0;
  }
}

bool TcpConnection::startPiece(Lane& l) {
  const FrameHdr& h = l.hdr;
  if (h.type == tcpwire::kAbort) {
    if (h.bytes > kMaxAbortReason) {
      fail(protocolError(l, "abort reason too long"));
      return false;
    }
    l.staging.resize(std::max<size_t>(h.bytes, 1));
    l.dest = RxDest::kAbort;
    l.destPtr = l.staging.data();
    l.destGot = 0;
    return true;
  }
  if (h.type != tcpwire::kData) {
    fail(protocolError(l, strFormat("unknown frame type 0x%08x", h.type)));
    return false;
  }
  if (h.offset > h.total || h.bytes > h.total - h.offset || (h.bytes == 0 && h.total != 0) || h.bytes > (64u << 20)) {
    fail(protocolError(
        l, strFormat("piece [%llu, +%u) of a %llu-byte message out of range", static_cast<unsigned long long>(h.offset),
                     h.bytes, static_cast<unsigned long long>(h.total))));
    return false;
  }
  if (h.seq < recvBase_) {
    fail(protocolError(l,
                       strFormat("piece of message %llu, which is complete", static_cast<unsigned long long>(h.seq))));
    return false;
  }
  const uint64_t idx = h.seq - recvBase_;
  l.destGot = 0;
  l.unexp = nullptr;
  if (idx < recvs_.size()) {
    RecvOp& op = recvs_[idx];
    Status me = matchError(h.sig, h.total, op);
    if (!me.isOk()) {
      fail(me);
      return false;
    }
    if (op.hasRed) {
      if (h.bytes % dataTypeSize(op.red.dtype) != 0) {
        fail(protocolError(l, "piece is not a whole number of elements"));
        return false;
      }
      if (l.staging.size() < h.bytes) l.staging.resize(h.bytes);
      l.dest = RxDest::kStaging;
      l.destPtr = l.staging.data();
    } else {
      l.dest = RxDest::kDirect;
      l.destPtr = op.dst + h.offset;
    }
    return true;
  }
  // Not posted yet: buffer it (at least one piece, so a small limit cannot stall everything).
  if (unexpBytes_ > 0 && unexpBytes_ + h.bytes > t_->unexpectedLimit()) {
    if (!l.blocked) {
      l.blocked = true;
      setEvents(l, l.wantOut ? static_cast<uint32_t>(EPOLLOUT) : 0u);
      C4_TRACE(kLogNet, "tcp: rank %d stops reading %s: %zu unexpected bytes buffered", t_->rank(), laneText(l).c_str(),
               unexpBytes_);
    }
    return false;
  }
  UnexpMsg& m = unexp_[h.seq];
  if (m.pieces.empty()) {
    m.sig = h.sig;
    m.total = h.total;
  } else if (!sameSig(h.sig, m.sig) || m.total != h.total) {
    fail(protocolError(l, strFormat("pieces of message %llu disagree on its signature (%s, %llu bytes, offset %llu vs "
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
  p->data.reset(new char[std::max<size_t>(h.bytes, 1)]);
  l.unexp = p.get();
  l.dest = RxDest::kUnexp;
  l.destPtr = p->data.get();
  m.pieces.push_back(std::move(p));
  unexpBytes_ += h.bytes;
  return true;
}

void TcpConnection::finishPiece(Lane& l) {
  const FrameHdr h = l.hdr;
  l.haveHdr = false;
  RxDest d = l.dest;
  l.dest = RxDest::kNone;
  l.bulk = h.bytes >= kBulkBytes;
  if (d == RxDest::kAbort) {
    std::string reason(l.staging.data(), h.bytes);
    Status st = makeError(Code::kRemoteError, "tcp: %s aborted (%s)", peerText().c_str(), reason.c_str());
    C4_WARN(kLogNet, "%s", st.message().c_str());
    fail(st);
    return;
  }
  if (d == RxDest::kUnexp) {
    l.unexp->complete = true;
    l.unexp = nullptr;
    const uint64_t idx = h.seq - recvBase_;
    if (idx >= recvs_.size()) return;
    // The receive was posted while this piece was being read: hand it over now.
    RecvOp& op = recvs_[idx];
    auto it = unexp_.find(h.seq);
    auto& pieces = it->second.pieces;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i]->complete && pieces[i]->offset == h.offset) {
        applyPiece(op, pieces[i]->offset, pieces[i]->data.get(), pieces[i]->bytes);
        unexpBytes_ -= pieces[i]->bytes;
        pieces[i] = std::move(pieces.back());
        pieces.pop_back();
        break;
      }
    }
    if (pieces.empty()) unexp_.erase(it);
    needRx = true;
    noteRecvProgress(op);
    return;
  }
  RecvOp& op = recvs_[h.seq - recvBase_];
  if (d == RxDest::kStaging) {
    applyPiece(op, h.offset, l.staging.data(), h.bytes);
  } else {
    op.got += h.bytes;
    op.seen = true;
  }
  noteRecvProgress(op);
}

size_t TcpConnection::receive(Lane& l, char* to, size_t want, size_t* budget) {
  ssize_t n = C4_SYSCALL_RETRY(recv(l.fd.get(), to, want, MSG_DONTWAIT));
  if (n == 0) {
    laneEof(l);
    return 0;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    int err = errno;
    laneError(l, err == ECONNRESET ? "connection reset" : "receive failed", err);
    return 0;
  }
  moved(l, static_cast<size_t>(n), false);
  *budget -= std::min(*budget, static_cast<size_t>(n));
  return static_cast<size_t>(n);
}

bool TcpConnection::rxStep(Lane& l, size_t* budget) {
  if (!l.haveHdr) {
    size_t avail = l.rxEnd - l.rxBeg;
    if (avail < kHdrBytes) {
      if (l.rxBeg > 0) {
        memmove(l.rxbuf.get(), l.rxbuf.get() + l.rxBeg, avail);
        l.rxBeg = 0;
        l.rxEnd = avail;
      }
      // Bulk mode: take the header alone so the payload lands in its destination directly.
      size_t want = l.bulk ? kHdrBytes - avail : kRxBufBytes - l.rxEnd;
      const size_t n = receive(l, l.rxbuf.get() + l.rxEnd, want, budget);
      if (n == 0) return false;
      l.rxEnd += n;
      return true;
    }
    memcpy(&l.hdr, l.rxbuf.get() + l.rxBeg, kHdrBytes);
    l.rxBeg += kHdrBytes;
    l.haveHdr = true;
    l.dest = RxDest::kNone;
  }
  if (l.dest == RxDest::kNone && !startPiece(l)) return false;
  const size_t need = l.hdr.bytes - l.destGot;
  size_t avail = l.rxEnd - l.rxBeg;
  if (avail > 0 || need == 0) {
    size_t take = std::min(avail, need);
    if (take) memcpy(l.destPtr + l.destGot, l.rxbuf.get() + l.rxBeg, take);
    l.rxBeg += take;
    l.destGot += take;
    if (l.rxBeg == l.rxEnd) l.rxBeg = l.rxEnd = 0;
  } else if (need >= kBulkBytes / 4) {
    const size_t n = receive(l, l.destPtr + l.destGot, need, budget);
    if (n == 0) return false;
    l.destGot += n;
  } else {
    const size_t n = receive(l, l.rxbuf.get(), kRxBufBytes, budget);
    if (n == 0) return false;
    l.rxBeg = 0;
    l.rxEnd = n;
  }
  if (l.destGot == l.hdr.bytes) finishPiece(l);
  return broken_.isOk();
}

void TcpConnection::onReadable(Lane& l) {
  if (!l.fd.valid() || l.eof) return;
  if (l.state == LaneState::kWaitChallenge) {
    const size_t want = sizeof(tcpwire::Challenge);
    ssize_t n = C4_SYSCALL_RETRY(recv(l.fd.get(), l.hsIn + l.hsHave, want - l.hsHave, MSG_DONTWAIT));
    if (n == 0) {
      Status st =
          makeError(Code::kRemoteError,
                    "tcp: %s closed lane %d during the handshake (it exited, or it rejected our proof of the key: "
                    "same UniqueId? see its log)",
                    peerText().c_str(), l.index);
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) laneError(l, "handshake receive failed", errno);
      return;
    }
    l.hsHave += static_cast<size_t>(n);
    if (l.hsHave < want) return;
    tcpwire::Challenge ch;
    memcpy(&ch, l.hsIn, sizeof(ch));
    if (ch.magic != tcpwire::kChallengeMagic || ch.mac != tcpwire::handshakeMac(t_->key_, true, l.hello, ch.nonce)) {
      Status st = makeError(Code::kRemoteError,
                            "tcp: %s failed to prove the communicator key on lane %d (impostor or stale endpoint at "
                            "%s); refusing it",
                            peerText().c_str(), l.index, l.remoteText.c_str());
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
    tcpwire::Proof pr{tcpwire::kProofMagic, 0, tcpwire::handshakeMac(t_->key_, false, l.hello, ch.nonce)};
    l.hsOut.append(reinterpret_cast<const char*>(&pr), sizeof(pr));
    l.state = LaneState::kUp;
    l.stats.up = true;
    C4_INFO(kLogNet, "tcp: rank %d connected %s", t_->rank(), laneText(l).c_str());
    flush(l);
    return;
  }
  if (l.state != LaneState::kUp || l.blocked) return;
  size_t budget = 8u << 20;  // then other lanes get their turn
  while (budget > 0 && l.fd.valid() && rxStep(l, &budget)) {
  }
}

void TcpConnection::rxRetry() {
  needRx = false;
  for (Lane& l : lanes_) {
    if (!broken_.isOk()) return;
    if (l.state != LaneState::kUp || !l.fd.valid()) continue;
    if (l.blocked) {
      l.blocked = false;
      setEvents(l, l.wantOut ? static_cast<uint32_t>(EPOLLIN | EPOLLOUT) : static_cast<uint32_t>(EPOLLIN));
    }
    if (l.haveHdr || l.rxEnd > l.rxBeg) onReadable(l);
  }
}

void TcpConnection::check(int64_t now) {
  if (!broken_.isOk()) return;
  // A lane the peer closed while others stay open for long: it is not shutting down cleanly.
  for (Lane& l : lanes_) {
    if (l.eof && pending() && now - l.eofMs > std::min<int64_t>(kEofGraceMs, t_->timeoutMs())) {
      Status st = makeError(Code::kRemoteError, "tcp: %s closed its connection to rank %d with %zu message(s) pending",
                            laneText(l).c_str(), t_->rank(), sends_.size() + recvs_.size());
      C4_WARN(kLogNet, "%s", st.message().c_str());
      fail(st);
      return;
    }
  }
  if (!pending()) {
    lastMoveMs_ = now;
    probe_.reset();
    return;
  }
  if (!initiator() && t_->probeMs() > 0 && now - lastMoveMs_ >= t_->probeMs()) {
    bool down = false;
    for (const Lane& l : lanes_) down = down || l.state != LaneState::kUp;
    if (down) probePeer(now);
    if (!broken_.isOk()) return;
  }
  if (now - lastMoveMs_ <= t_->timeoutMs()) return;
  std::string down;
  for (const Lane& l : lanes_) {
    if (l.state == LaneState::kUp) continue;
    if (!down.empty()) down += ", ";
    down += std::to_string(l.index);
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
                   t_->rank(), down.c_str(), peerText().c_str(), lanes_.front().remoteText.c_str(),
                   static_cast<long long>(t_->timeoutMs()));
  } else {
    st = makeError(Code::kRemoteError,
                   "tcp: no progress for %lld ms on %zu pending message(s) between rank %d and %s over %zu lane(s) "
                   "(timeout C4_TIMEOUT=%lld ms)",
                   static_cast<long long>(now - lastMoveMs_), sends_.size() + recvs_.size(), t_->rank(),
                   peerText().c_str(), lanes_.size(), static_cast<long long>(t_->timeoutMs()));
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

// ---------------------------------------------------------------------------------------------
// TcpTransportImpl

TcpTransportImpl::TcpTransportImpl(const Context& ctx)
    : rank_(ctx.rank),
      nranks_(ctx.nranks),
      tag_(ctx.commTag),
      key_{ctx.authKey[0], ctx.authKey[1]},
      tagHash_(tcpwire::tagHash(ctx.authKey, ctx.commTag.data(), ctx.commTag.size())),
      lanePlan_(ctx.lanePlan),
      timeoutMs_(ctx.timeoutMs > 0 ? ctx.timeoutMs : 300000),
      nlanes_(static_cast<int>(paramLanes())),
      pieceBytes_(static_cast<size_t>(std::max<int64_t>(4096, std::min<int64_t>(paramTcpPieceBytes(), 64 << 20))) &
                  ~size_t{4095}),
      bufBytes_(static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(paramTcpBufBytes(), 1 << 30)))),
      unexpLimit_(static_cast<size_t>(std::max<int64_t>(0, paramTcpUnexpectedBytes()))),
      handshakeMs_(
          std::max<int64_t>(1, std::min<int64_t>(paramTcpHandshakeMs(), ctx.timeoutMs > 0 ? ctx.timeoutMs : 300000))),
      sportBase_(paramTcpSportBase()),
      probeMs_(std::max<int64_t>(0, paramTcpProbeMs())) {
  if (gethostname(hostname_, sizeof(hostname_) - 1) != 0) strcpy(hostname_, "?");
}

TcpTransportImpl::~TcpTransportImpl() {
  // Closing the sockets tells every peer (EOF); nothing here waits.
  conns_.clear();
  incoming_.clear();
}

Caps TcpTransportImpl::caps() const {
  Caps c;
  // Measured on loopback, 2 ranks on 2 shared cores (docs/tcp-transport.md): an 8-byte AllReduce
  // (one exchange) takes ~6.5 us; 64 MiB AllReduce runs at ~3-4 GB/s busbw.
  c.latencyUs = 6.5;
  c.bwGBps = 3.0;
  c.singleCopyBytes = SIZE_MAX;
  c.sameHostOnly = false;
  c.deviceMemory = false;
  return c;
}

void TcpTransportImpl::tuneSocket(int fd) const {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (bufBytes_ > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufBytes_, sizeof(bufBytes_));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufBytes_, sizeof(bufBytes_));
  }
}

std::vector<std::string> TcpTransportImpl::listenAddresses() const {
  std::vector<std::string> out;
  for (const SockAddr& a : portAddrs_) out.push_back(a.toString());
  return out;
}

Status TcpTransportImpl::laneStats(int peer, std::vector<TcpLaneStats>* out) const {
  out->clear();
  if (peer < 0 || peer >= nranks_)
    return makeError(Code::kInvalidArgument, "tcp: laneStats of rank %d out of [0, %d)", peer, nranks_);
  const TcpConnection* c = conns_.empty() ? nullptr : conns_[static_cast<size_t>(peer)].get();
  if (!c) return Status::ok();
  for (const Lane& l : c->lanes()) {
    TcpLaneStats s = l.stats;
    if (l.busySinceNs) s.busyNs += static_cast<uint64_t>(nowNs() - l.busySinceNs);
    out->push_back(s);
  }
  return Status::ok();
}

Status TcpTransportImpl::setLaneWeights(int peer, const std::vector<double>& weights) {
  if (!canConnect(peer))
    return makeError(Code::kInvalidArgument, "tcp: setLaneWeights for rank %d (not a peer of rank %d)", peer, rank_);
  return conn(peer)->setWeights(weights);
}

TcpConnection* TcpTransportImpl::conn(int peer) {
  auto& c = conns_[static_cast<size_t>(peer)];
  if (!c) c = std::make_unique<TcpConnection>(this, peer, nlanes_);
  return c.get();
}

bool TcpTransportImpl::probeAddr(int peer, SockAddr* a) const {
  return detail::fromWire(records_[static_cast<size_t>(peer)].addrs[0], a).isOk();
}

std::string TcpTransportImpl::probeTarget(int peer) const {
  SockAddr a;
  return probeAddr(peer, &a) ? a.toString() : "?";
}

int TcpTransportImpl::startProbe(int peer, Fd* out) const {
  SockAddr a;
  if (!probeAddr(peer, &a)) return EINVAL;
  Fd fd(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  int err = ::connect(fd.get(), a.sa(), a.len) == 0 ? 0 : errno;
  if (err == EINTR) err = EINPROGRESS;
  if (err == 0 || err == EINPROGRESS) *out = std::move(fd);
  return err;
}

tcpwire::Hello TcpTransportImpl::probeHello(int peer) const {
  return tcpwire::Hello{tcpwire::kProbeMagic, tcpwire::kVersion, tagHash_, rank_, peer, -1, nlanes_, 0};
}

Status TcpTransportImpl::connect(int peer, Connection** out) {
  if (!canConnect(peer))
    return makeError(Code::kInvalidArgument, "tcp: rank %d cannot connect to rank %d (out of range or itself)", rank_,
                     peer);
  TcpConnection* c = conn(peer);
  if (c->initiator()) c->openLanes();
  *out = c;
  return Status::ok();
}

Status TcpTransportImpl::openLaneSocket(int peer, Lane& l) {
  const SetupRecord& pr = records_[static_cast<size_t>(peer)];
  LanePlan plan;
  if (lanePlan_) plan = lanePlan_(peer, l.index);
  int lp = plan.localPort >= 0 ? plan.localPort : l.index % static_cast<int>(portAddrs_.size());
  if (lp >= static_cast<int>(portAddrs_.size()))
    return makeError(Code::kInvalidArgument, "tcp: lane plan for lane %d to rank %d names local port %d of %zu",
                     l.index, peer, lp, portAddrs_.size());
  uint16_t sport = plan.sourcePort;
  if (sport == 0 && sportBase_ > 0) {
    int64_t p = sportBase_ + (static_cast<int64_t>(rank_) * nranks_ + peer) * nlanes_ + l.index;
    if (p > 65535)
      return makeError(Code::kInvalidArgument,
                       "tcp: C4_TCP_SPORT_BASE=%lld gives source port %lld for lane %d from rank %d to rank %d (> "
                       "65535)",
                       static_cast<long long>(sportBase_), static_cast<long long>(p), l.index, rank_, peer);
    sport = static_cast<uint16_t>(p);
  }
  l.localPort = lp;
  l.stats.localPort = lp;
  l.remotePort = lp % pr.nports;
  C4_CHECK(detail::fromWire(pr.addrs[l.remotePort], &l.remote));
  l.remoteText = l.remote.toString();
  l.stats.remoteAddr = l.remoteText;
  SockAddr local = portAddrs_[static_cast<size_t>(lp)];
  local.setPort(sport);
  if (local.family() != l.remote.family())
    return makeError(Code::kInvalidUsage,
                     "tcp: lane %d from rank %d (%s) to rank %d (%s): address families differ; choose matching "
                     "C4_TCP_PORTS / C4_SOCKET_IFNAME",
                     l.index, rank_, local.toString().c_str(), peer, l.remoteText.c_str());
  Fd fd(::socket(local.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return sysError("tcp: socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
#ifdef IP_BIND_ADDRESS_NO_PORT
  if (sport == 0) setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
#endif
  tuneSocket(fd.get());
  if (::bind(fd.get(), local.sa(), local.len) != 0) {
    int err = errno;
    return makeError(err == EADDRINUSE ? Code::kInvalidUsage : Code::kSystemError,
                     "tcp: rank %d cannot bind lane %d to rank %d to local address %s: %s%s", rank_, l.index, peer,
                     local.toString().c_str(), strerror(err),
                     err == EADDRINUSE ? " (source port taken: change C4_TCP_SPORT_BASE or the lane plan)" : "");
  }
  int rc = ::connect(fd.get(), l.remote.sa(), l.remote.len);
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
    int err = errno;
    return makeError(Code::kRemoteError, "tcp: rank %d cannot connect lane %d to rank %d (host %s) at %s from %s: %s",
                     rank_, l.index, peer, pr.hostname, l.remoteText.c_str(), local.toString().c_str(), strerror(err));
  }
  l.hello =
      tcpwire::Hello{tcpwire::kHelloMagic, tcpwire::kVersion, tagHash_, rank_, peer, l.index, nlanes_, randomU64()};
  l.fd = std::move(fd);
  l.state = LaneState::kConnecting;
  l.sinceMs = nowMs();
  l.hsHave = 0;
  l.eof = false;
  return Status::ok();
}

Status TcpTransportImpl::setup(Oob* oob) {
  Status local;
  if (nlanes_ < 1 || nlanes_ > kMaxLanes)
    local = makeError(Code::kInvalidArgument, "tcp: C4_LANES=%d must be in [1, %d]", nlanes_, kMaxLanes);
  ep_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (local.isOk() && !ep_.valid()) local = sysError("tcp: epoll_create1", errno);

  // NIC ports: C4_TCP_PORTS entries (interface name prefixes or IP literals), else the bootstrap's choice.
  std::vector<std::string> specs;
  std::string portsSpec = paramTcpPorts();
  for (size_t pos = 0; pos <= portsSpec.size() && !portsSpec.empty();) {
    size_t end = portsSpec.find(',', pos);
    if (end == std::string::npos) end = portsSpec.size();
    std::string s = portsSpec.substr(pos, end - pos);
    if (!s.empty()) specs.push_back(s);
    pos = end + 1;
  }
  if (specs.size() > static_cast<size_t>(kMaxPorts) && local.isOk())
    local = makeError(Code::kInvalidArgument, "tcp: C4_TCP_PORTS lists %zu ports; at most %d", specs.size(), kMaxPorts);
  if (local.isOk()) {
    if (specs.empty()) specs.push_back("");
    for (const std::string& s : specs) {
      SockAddr a;
      std::string name;
      in6_addr tmp;
      if (!s.empty() && (inet_pton(AF_INET, s.c_str(), &tmp) == 1 || inet_pton(AF_INET6, s.c_str(), &tmp) == 1)) {
        Status st = detail::parseHostPort(s.find(':') != std::string::npos ? "[" + s + "]:0" : s + ":0", &a);
        if (!st.isOk()) {
          local = st;
          break;
        }
        name = s;
      } else {
        detail::NetIf nif;
        Status st = detail::chooseInterface(s.empty() ? paramSocketIfname() : s, nullptr, &nif);
        if (!st.isOk()) {
          local = makeError(st.code(), "tcp: rank %d: NIC port '%s': %s", rank_, s.c_str(), st.message().c_str());
          break;
        }
        a = nif.addr;
        name = nif.name;
      }
      a.setPort(0);
      Fd lfd;
      SockAddr bound;
      Status st = detail::listenSocket(a, 512, true, &lfd, &bound);
      if (!st.isOk()) {
        local = makeError(st.code(), "tcp: rank %d: listen on %s (%s): %s", rank_, a.toString().c_str(), name.c_str(),
                          st.message().c_str());
        break;
      }
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u64 = kTagListener | listeners_.size();
      if (epoll_ctl(ep_.get(), EPOLL_CTL_ADD, lfd.get(), &e) != 0) {
        local = sysError("tcp: epoll_ctl", errno);
        break;
      }
      listeners_.push_back(std::move(lfd));
      portAddrs_.push_back(bound);
      portNames_.push_back(name);
    }
  }

  records_.assign(static_cast<size_t>(nranks_), SetupRecord{});
  SetupRecord& mine = records_[static_cast<size_t>(rank_)];
  mine = SetupRecord{};
  mine.magic = kSetupMagic;
  mine.ok = local.isOk() ? 1 : 0;
  mine.nports = static_cast<int32_t>(portAddrs_.size());
  mine.nlanes = nlanes_;
  for (size_t i = 0; i < portAddrs_.size(); ++i) mine.addrs[i] = detail::toWire(portAddrs_[i]);
  memcpy(mine.hostname, hostname_, sizeof(mine.hostname) - 1);
  if (!local.isOk()) C4_WARN(kLogNet, "%s", local.message().c_str());
  C4_CHECK(oob->allGather(records_.data(), sizeof(SetupRecord)));
  if (!local.isOk()) return local;
  for (int r = 0; r < nranks_; ++r) {
    const SetupRecord& rec = records_[static_cast<size_t>(r)];
    if (rec.magic != kSetupMagic)
      return makeError(Code::kInvalidUsage, "tcp: rank %d published no tcp setup record (different c4comm build?)", r);
    if (!rec.ok)
      return makeError(Code::kRemoteError, "tcp: setup failed on rank %d (host %s); see its log", r,
                       std::string(rec.hostname, strnlen(rec.hostname, sizeof(rec.hostname))).c_str());
    if (rec.nlanes != nlanes_)
      return makeError(Code::kInvalidUsage,
                       "tcp: rank %d uses C4_LANES=%d but rank %d uses %d; set it alike on all ranks", r, rec.nlanes,
                       rank_, nlanes_);
    if (rec.nports < 1 || rec.nports > kMaxPorts)
      return makeError(Code::kInvalidUsage, "tcp: rank %d published %d NIC ports", r, rec.nports);
  }
  for (SetupRecord& rec : records_) rec.hostname[sizeof(rec.hostname) - 1] = 0;
  conns_.resize(static_cast<size_t>(nranks_));
  std::string ports;
  for (size_t i = 0; i < portAddrs_.size(); ++i)
    ports += (i ? ", " : "") + portNames_[i] + "=" + portAddrs_[i].toString();
  C4_INFO(kLogNet,
          "tcp: rank %d ready: %d lane(s) per peer, ports [%s], piece %zu B, socket buffers %s, unexpected "
          "limit %zu B per peer",
          rank_, nlanes_, ports.c_str(), pieceBytes_, bufBytes_ ? std::to_string(bufBytes_).c_str() : "autotuned",
          unexpLimit_);
  return Status::ok();
}

void TcpTransportImpl::onListener(int port) {
  for (int k = 0; k < 64; ++k) {
    Fd fd;
    SockAddr remote;
    Status st = detail::acceptSocket(listeners_[static_cast<size_t>(port)].get(), &fd, &remote);
    if (!st.isOk()) {
      C4_WARN(kLogNet, "tcp: rank %d: accept on %s: %s", rank_,
              portAddrs_[static_cast<size_t>(port)].toString().c_str(), st.message().c_str());
      return;
    }
    if (!fd.valid()) return;
    tuneSocket(fd.get());
    uint64_t id = nextIncoming_++;
    Incoming& in = incoming_[id];
    in.fd = std::move(fd);
    in.remote = remote;
    in.sinceMs = nowMs();
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = kTagIncoming | id;
    if (epoll_ctl(ep_.get(), EPOLL_CTL_ADD, in.fd.get(), &e) != 0) {
      dropIncoming(id, strFormat("epoll_ctl: %s", strerror(errno)));
      continue;
    }
  }
}

void TcpTransportImpl::dropIncoming(uint64_t id, const std::string& why) {
  auto it = incoming_.find(id);
  if (it == incoming_.end()) return;
  if (it->second.probe) {
    C4_TRACE(kLogNet, "tcp: rank %d: %s, closed", rank_, why.c_str());
  } else {
    C4_WARN(kLogNet, "tcp: rank %d dropped an incoming connection from %s: %s", rank_,
            it->second.remote.toString().c_str(), why.c_str());
  }
  if (it->second.fd.valid()) epoll_ctl(ep_.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
  incoming_.erase(it);
}

bool TcpTransportImpl::incomingStep(Incoming& in, std::string* why, bool* done) {
  *done = false;
  while (!in.out.empty()) {
    ssize_t n = C4_SYSCALL_RETRY(send(in.fd.get(), in.out.data(), in.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;  // tiny message: retried on the next event
      *why = strFormat("send: %s", strerror(errno));
      return false;
    }
    in.out.erase(0, static_cast<size_t>(n));
  }
  const size_t want = in.stage == 0 ? sizeof(tcpwire::Hello) : sizeof(tcpwire::Proof);
  ssize_t n = C4_SYSCALL_RETRY(recv(in.fd.get(), in.in + in.have, want - in.have, MSG_DONTWAIT));
  if (n == 0) {
    *why = "closed before completing the handshake";
    return false;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    *why = strFormat("receive: %s", strerror(errno));
    return false;
  }
  in.have += static_cast<size_t>(n);
  if (in.have < want) return true;
  in.have = 0;
  if (in.stage == 0) {
    memcpy(&in.hello, in.in, sizeof(in.hello));
    const tcpwire::Hello& h = in.hello;
    if (h.magic == tcpwire::kProbeMagic) {
      in.probe = true;
      *why = strFormat("liveness probe from rank %d", h.from);
      return false;
    }
    if (h.magic != tcpwire::kHelloMagic) {
      *why = "not a c4comm tcp lane (bad magic)";
      return false;
    }
    if (h.version != tcpwire::kVersion) {
      *why = strFormat("protocol version %u, this rank speaks %u", h.version, tcpwire::kVersion);
      return false;
    }
    if (h.tagHash != tagHash_) {
      *why = "for another communicator (or a different key)";
      return false;
    }
    if (h.to != rank_ || h.from < 0 || h.from >= rank_ || h.lane < 0 || h.lane >= nlanes_ || h.nlanes != nlanes_) {
      *why = strFormat("bad lane identity (from rank %d to rank %d, lane %d of %d)", h.from, h.to, h.lane, h.nlanes);
      return false;
    }
    in.nonce = randomU64();
    tcpwire::Challenge ch{tcpwire::kChallengeMagic, 0, in.nonce, tcpwire::handshakeMac(key_, true, h, in.nonce)};
    in.out.assign(reinterpret_cast<const char*>(&ch), sizeof(ch));
    in.stage = 1;
    return incomingStep(in, why, done);
  }
  tcpwire::Proof pr;
  memcpy(&pr, in.in, sizeof(pr));
  if (pr.magic != tcpwire::kProofMagic || pr.mac != tcpwire::handshakeMac(key_, false, in.hello, in.nonce)) {
    *why = strFormat("failed the proof of the communicator key (claims rank %d lane %d)", in.hello.from, in.hello.lane);
    return false;
  }
  *done = true;
  return true;
}

void TcpTransportImpl::onIncoming(uint64_t id, uint32_t ev) {
  auto it = incoming_.find(id);
  if (it == incoming_.end()) return;
  Incoming& in = it->second;
  std::string why;
  bool done = false;
  if (!incomingStep(in, &why, &done)) {
    dropIncoming(id, why);
    return;
  }
  (void)ev;
  if (!done) return;
  const int from = in.hello.from, lane = in.hello.lane;
  TcpConnection* c = conn(from);
  Lane& l = c->lanes()[static_cast<size_t>(lane)];
  if (!c->broken().isOk() || l.state != LaneState::kIdle) {
    dropIncoming(id, strFormat("lane %d from rank %d is %s", lane, from,
                               c->broken().isOk() ? "already connected" : "on a failed connection"));
    return;
  }
  epoll_ctl(ep_.get(), EPOLL_CTL_DEL, in.fd.get(), nullptr);
  Fd fd = std::move(in.fd);
  SockAddr remote = in.remote;
  incoming_.erase(it);
  c->attach(lane, std::move(fd), remote);
}

Status TcpTransportImpl::progress() {
  if (!abortStatus_.isOk()) return abortStatus_;
  for (size_t i = 0; i < active_.size(); ++i) active_[i]->flushAll();
  epoll_event evs[64];
  for (int round = 0; round < 4; ++round) {
    int n = C4_SYSCALL_RETRY(epoll_wait(ep_.get(), evs, 64, 0));
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      uint64_t kind = tag & kTagKindMask;
      if (kind == kTagListener) {
        onListener(static_cast<int>(tag & 0xff));
      } else if (kind == kTagIncoming) {
        onIncoming(tag & ~kTagKindMask, evs[i].events);
      } else if (kind == kTagLane) {
        int peer = static_cast<int>((tag & ~kTagKindMask) >> 8);
        int lane = static_cast<int>(tag & 0xff);
        TcpConnection* c = conns_[static_cast<size_t>(peer)].get();
        if (!c || !c->broken().isOk()) continue;
        Lane& l = c->lanes()[static_cast<size_t>(lane)];
        if (!l.fd.valid()) continue;
        if (evs[i].events & (EPOLLOUT | EPOLLERR)) {
          if (l.state == LaneState::kConnecting || l.wantOut) c->onWritable(l);
        }
        if (!c->broken().isOk() || !l.fd.valid()) continue;
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) c->onReadable(l);
        if (c->pending()) activate(c);
      }
    }
    if (n < 64) break;
  }
  for (size_t i = 0; i < active_.size(); ++i)
    if (active_[i]->needRx) active_[i]->rxRetry();

  const int64_t now = nowMs();
  if (now - lastCheckMs_ >= kCheckEveryMs) {
    lastCheckMs_ = now;
    for (size_t i = 0; i < active_.size(); ++i) active_[i]->check(now);
    for (auto it = incoming_.begin(); it != incoming_.end();) {
      auto next = std::next(it);
      if (now - it->second.sinceMs > handshakeMs_)
        dropIncoming(it->first, strFormat("no proof of the communicator key within %lld ms (C4_TCP_HANDSHAKE_MS)",
                                          static_cast<long long>(handshakeMs_)));
      it = next;
    }
  }
  pruneActive(&active_, [](const TcpConnection& c) {
    bool txLeft = false;
    for (const Lane& l : c.lanes()) txLeft |= !l.txq.empty() || !l.hsOut.empty();
    return c.pending() || txLeft || c.needRx;
  });
  return firstError_;
}

void TcpTransportImpl::abort(const std::string& reason) {
  if (abortStatus_.isOk())
    abortStatus_ = makeError(Code::kRemoteError, "tcp: rank %d aborted: %s", rank_, reason.c_str());
  for (auto& c : conns_) {
    if (!c) continue;
    c->sendAbort(reason);
    c->fail(abortStatus_);
  }
  for (Fd& l : listeners_) l.reset();
  incoming_.clear();
}

Status TcpTransportImpl::peerHealth(int peer) {
  if (!canConnect(peer)) return Status::ok();
  const TcpConnection* c = conns_[static_cast<size_t>(peer)].get();
  if (!c) return Status::ok();
  return c->broken();
}

}  // namespace

Status createTcpTransport(const Context& ctx, std::unique_ptr<Transport>* out) {
  if (!ctx.oob || ctx.nranks < 1 || ctx.rank < 0 || ctx.rank >= ctx.nranks || ctx.commTag.empty())
    return makeError(Code::kInvalidArgument, "tcp: bad context (rank %d of %d, tag '%s', oob %s)", ctx.rank, ctx.nranks,
                     ctx.commTag.c_str(), ctx.oob ? "set" : "null");
  auto t = std::make_unique<TcpTransportImpl>(ctx);
  C4_CHECK(t->setup(ctx.oob));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace c4::transport
