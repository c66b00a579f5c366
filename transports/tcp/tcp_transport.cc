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

namespace {

using detail::Fd;
using detail::SockAddr;
using detail::WireAddr;
using tcpwire::AckEntry;
using tcpwire::FrameHdr;

constexpr uint64_t kSetupMagic = 0x3276706374346331ull;  // "1c4tcpv2"
constexpr int kMaxPorts = 8;
constexpr int kMaxLanes = 16;       // C4_LANES
constexpr int kMaxLaneIndex = 255;  // lanes added later take new indices; the epoll tag has 8 bits
constexpr size_t kHdrBytes = sizeof(FrameHdr);
constexpr size_t kRxBufBytes = 65536;
// A lane whose last piece was at least this large reads the next header alone and the payload
// straight into its destination (bulk mode); below, it reads greedily into its small buffer.
constexpr size_t kBulkBytes = 32768;
constexpr size_t kBulkLookahead = 256;
constexpr int kMaxIov = 64;
using tcpwire::kMaxAckEntries;
using tcpwire::kMaxReason;
constexpr size_t kMaxLaterAcks = 64;        // deferred acknowledgements of eager pieces per lane
constexpr size_t kAckBatch = 1;             // pieces acknowledged together within one burst of reading
constexpr size_t kDetachBytes = 8u << 20;   // detachSend copies at most this much of a send
constexpr size_t kRateMinBytes = 1u << 20;  // receiveRate counts messages from this size on
constexpr int64_t kCheckEveryMs = 20;
constexpr int64_t kEofGraceMs = 1000;

using detail::nowMs;
using detail::nowNs;

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
  int32_t ack;  // C4_TCP_ACK
  uint64_t pieceBytes;
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

/// Bits of a piece bitmap.
inline bool testBit(const std::vector<uint64_t>& b, uint32_t i) { return (b[i >> 6] >> (i & 63)) & 1u; }
inline void setBit(std::vector<uint64_t>& b, uint32_t i) { b[i >> 6] |= uint64_t{1} << (i & 63); }

struct SendOp {
  const char* buf = nullptr;
  size_t bytes = 0;
  Request* req = nullptr;
  uint64_t seq = 0;
  uint32_t pieces = 0;
  uint32_t left = 0;    // pieces not acknowledged yet (acks on) / not written yet (acks off)
  uint32_t frames = 0;  // frames of it on lanes (queued, half written or awaiting their ack)
  std::vector<uint64_t> acked;
  bool done = false;             // finished: acknowledged (or written, acks off); leaves sends_
  bool reqDone = false;          // req completed (an eager send completes before its acknowledgement)
  uint32_t written = 0;          // frames of it written whole (re-sent copies included)
  std::unique_ptr<char[]> copy;  // eager: the transport's copy, which re-sent pieces come from
  // Released (Request::released): every piece was written once, and a receive of this transport
  // may overwrite buf. Before it does, the pieces still unacknowledged there are saved (protect),
  // and a re-send comes from the saved copy.
  bool released = false;
  std::vector<std::unique_ptr<char[]>> saved;  // per piece, or empty
  const char* pieceData(uint32_t piece, uint64_t offset) const {
    return piece < saved.size() && saved[piece] ? saved[piece].get() : buf + offset;
  }
};

struct RecvOp {
  char* dst;
  size_t bytes;
  OpSig sig;
  ReduceSpec red;
  bool hasRed;
  Request* req;
  uint32_t pieces;
  uint32_t got;
  std::vector<uint64_t> bits;  // pieces received (each counted and reduced once)
  bool done;
  // C4D's receive rate (Connection::receiveRate): from the first piece read off a socket into the
  // posted receive to the last, and the bytes after the first.
  int64_t rateFirstNs = 0, rateLastNs = 0;
  uint64_t rateBytes = 0;
};

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

/// A frame queued on a lane: a piece of a SendOp, or a control frame (op null) with its payload.
struct TxFrame {
  SendOp* op = nullptr;
  FrameHdr hdr{};
  std::string ctl;
  size_t done = 0;  // bytes of header + payload written
  bool resent = false;
  uint32_t piece = 0;
  size_t total() const { return kHdrBytes + hdr.bytes; }
  const char* payload() const { return op ? op->pieceData(piece, hdr.offset) : ctl.data(); }
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
  tcpwire::PieceSet seen;  // pieces received whole
};

/// The connection state of one lane's socket (the Lane holds what others may read).
enum class SockState { kIdle, kConnecting, kWaitChallenge, kUp, kClosed };
enum class RxDest { kNone, kDirect, kStaging, kUnexp, kDiscard, kCtl };

/// Whether two pieces carry the same message signature. (Not sigMatches: that asks whether a sent
/// signature fits an expected one, where a Send fits a Recv but not another Send.)
bool sameSig(const OpSig& a, const OpSig& b) {
  return a.seq == b.seq && a.count == b.count && a.root == b.root && a.coll == b.coll && a.dtype == b.dtype &&
         a.op == b.op;
}

/// One lane's socket and its queues.
struct Sock {
  explicit Sock(int i) : index(i), lane(i) {}
  TcpConnection* conn = nullptr;
  int index = 0;
  Lane lane;  // state, weight, statistics
  int localPort = 0;
  int remotePort = 0;
  SockState state = SockState::kIdle;
  Fd fd;
  int64_t sinceMs = 0;  // connect started
  uint32_t events = 0;  // registered epoll events
  SockAddr remote;
  std::string localText, remoteText;
  std::string pathText;  // the planner's label of its way through the fabric (LanePlan::label)

  // Handshake (initiator side).
  tcpwire::Hello hello{};
  std::string hsOut;
  char hsIn[sizeof(tcpwire::Challenge)];
  size_t hsHave = 0;

  // Send side.
  std::deque<TxFrame> txq;          // to write, in order
  std::deque<TxFrame> inflight;     // data frames written, awaiting their acknowledgement
  std::vector<AckEntry> acksOut;    // pieces received on this lane, to acknowledge on it now
  std::vector<AckEntry> acksLater;  // eager pieces: acknowledged with the next frame on this lane
  bool wantOut = false;             // waiting for EPOLLOUT
  double current = 0.0;             // smooth weighted round robin
  int64_t progressNs = 0;           // its pieces were last acknowledged, or it had none outstanding
  int64_t lastAckNs = 0;            // an acknowledgement last arrived on it
  bool peerPaused = false;          // the peer stopped reading it for lack of room (not a stall)
  int64_t pingNs = 0;               // a kPing last went out on it
  int64_t suspectNs = 0;            // since when it looks stalled (0: it does not)
  int64_t heldSinceNs = 0;          // since when its next piece waits for its receive (0: none)

  // Receive side.
  std::unique_ptr<char[]> rxbuf;
  size_t rxBeg = 0, rxEnd = 0;
  bool haveHdr = false;
  FrameHdr hdr{};
  RxDest dest = RxDest::kNone;
  char* destPtr = nullptr;
  size_t destGot = 0;
  uint32_t piece = 0;  // index of the data piece being read
  UnexpPiece* unexp = nullptr;
  std::vector<char> staging;
  bool bulk = false;
  bool blocked = false;  // no room for an unexpected piece: stopped reading
  bool pausedSent = false;
  bool eof = false;
  int64_t eofMs = 0;
  bool silenced = false;  // breakLane(kSilent): neither read nor written any more
  bool muted = false;     // breakLane(kMute): read, never written any more

  bool placeholder = false;  // acceptor side: a lane index the peer has not connected yet
  bool live() const { return lane.live(); }
  bool up() const { return state == SockState::kUp && lane.state() == LaneState::kUp; }
  bool outstanding() const {
    if (!inflight.empty()) return true;
    for (const TxFrame& f : txq)
      if (f.op) return true;
    return false;
  }
};

class TcpConnection final : public Connection {
 public:
  /// A receive of this transport is about to write [p, p + n): saves the pieces there that
  /// released sends of this connection still need for a re-send (SendOp::saved).
  void protect(const char* p, size_t n);
  bool detachSend(Request* req) override;
  TcpConnection(TcpTransportImpl* t, int peer, int nlanes);
  ~TcpConnection() override = default;

  int peer() const override { return peer_; }
  Status isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint = {}) override;
  Status irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) override;
  Status peek(bool* ready, OpSig* sig, size_t* bytes) override;
  int numLanes() const override { return static_cast<int>(socks_.size()); }
  const Lane* lane(int i) const override {
    return i >= 0 && i < numLanes() ? &socks_[static_cast<size_t>(i)]->lane : nullptr;
  }
  Status setLaneWeights(const std::vector<double>& w) override;
  Status retireLane(int i, const std::string& why) override;
  Status addLane(const LanePlan& plan, int* index) override;
  std::string describeState() const override;
  bool receiveRate(uint64_t* bytes, uint64_t* ns) const override;

  /// Work outstanding: messages to send (eager ones until acknowledged) or receive.
  bool pending() const { return !sends_.empty() || !recvs_.empty(); }
  /// Sends not acknowledged yet on a connection that still works.
  bool sendsPending() const { return broken_.isOk() && !sends_.empty(); }
  /// Requests not completed yet: what a failure would fail. (An eager send's request is complete
  /// before its acknowledgement; if the peer closes cleanly, its copy is simply dropped.)
  bool owes() const { return sendsOwed_ > 0 || !recvs_.empty(); }
  bool initiator() const;
  /// Opens the initial lanes towards the peer (initiator side). Failures break the connection.
  void openLanes();
  /// Flushes queued output on every lane that can write now.
  void flushAll();
  /// Reads what the lane has (also called with data left in its buffer).
  void onReadable(Sock& s);
  void onWritable(Sock& s);
  /// Lanes stopped for lack of buffer room or with buffered input: read them again.
  void rxRetry();
  /// Queues and writes the acknowledgements gathered on `s`.
  void ackLane(Sock& s);
  /// Queues the acknowledgements gathered on each lane (once per progress round); with `later`,
  /// the deferred ones of eager pieces too.
  void sendAcks(bool later = false);
  bool acksDeferred() const {
    for (const auto& s : socks_)
      if (!s->acksLater.empty()) return true;
    return false;
  }
  /// Timeouts, stalled lanes, half-closed connections, liveness probes of a lower rank.
  void check(int64_t now);
  /// Fails every pending request with `st`, closes every lane, rejects later requests.
  void fail(const Status& st);
  /// Attaches an authenticated incoming socket as lane `lane` (acceptor side).
  void attach(int lane, Fd fd, const SockAddr& remote);
  /// Whether an incoming lane `lane` may be attached (acceptor side).
  bool accepts(int lane) const;
  const Status& broken() const { return broken_; }
  std::string peerText() const;
  std::string laneText(const Sock& s) const;
  Sock& sock(int i) { return *socks_[static_cast<size_t>(i)]; }
  const std::vector<std::unique_ptr<Sock>>& socks() const { return socks_; }
  void sendAbort(const std::string& reason);
  /// breakLane (see TcpTransport).
  Status breakLane(int lane, LaneFault fault);
  bool needRx = false;
  bool needAck = false;
  bool inActiveList = false;

 private:
  bool acks() const;
  /// A live lane to put the next piece on (smooth weighted round robin), or -1.
  int pickLane();
  /// Queues a data frame on a lane (the weighted choice), keeping the busy clock.
  void queueData(TxFrame&& f);
  /// Queues a control frame ahead of the data on `s` (behind a frame half written).
  void queueCtl(Sock& s, uint32_t type, uint64_t offset, const std::string& payload);
  void flush(Sock& s);
  /// After `n` bytes were written on `s`: completes frames, moves pieces to inflight.
  void wrote(Sock& s, size_t n);
  /// Takes `s` out of service: its unacknowledged pieces go out on the other lanes, its socket is
  /// closed, the peer is told (notify) and the connection fails if no lane is left.
  void retire(Sock& s, const std::string& why, bool notify);
  /// An error on `s`: retires it (acks on) or fails the connection (acks off).
  void laneError(Sock& s, const char* what, int err);
  void laneEof(Sock& s);
  /// Parses and dispatches input; false if the lane must stop (blocked, broken, closed).
  bool rxStep(Sock& s, size_t* budget);
  /// One non-blocking recv of up to `want` bytes into `to`, counted against *budget; 0 when nothing
  /// came (would block), or the lane hit end of file or an error (handled here).
  size_t receive(Sock& s, char* to, size_t want, size_t* budget);
  /// After a new request's arguments are checked: opens the lanes (lower rank), fails `req` if that
  /// broke the connection, restarts the stall clock when the connection was idle.
  Status prepareRequest(Request* req);
  bool startPiece(Sock& s);
  bool startCtl(Sock& s);
  void finishPiece(Sock& s);
  void finishCtl(Sock& s);
  void onAck(Sock& s, const AckEntry* e, size_t n);
  /// Drops the frames of a finished send from every lane's queues.
  void purge(SendOp* op);
  /// Completes `op` once every piece is acknowledged (written, acks off) and no frame of it is
  /// half written. The caller pops finished sends (popDone) afterwards.
  void maybeCompleteSend(SendOp& op);
  /// Piece `piece` of `op`: reduced or copied from `data` unless it was received before. True if new.
  bool applyPiece(RecvOp& op, uint32_t piece, uint64_t offset, const char* data, size_t bytes);
  bool countPiece(RecvOp& op, uint32_t piece);
  /// A receive completed: lanes still reading a copy of one of its pieces read it into a sink.
  void noteRecvProgress(RecvOp& op, uint64_t seq);
  /// A piece of `bytes` counted into `op` (receive rate, C4D).
  void noteRate(RecvOp& op, size_t bytes);
  void popDone();
  /// Tells the peer of the lanes this rank retired, on a lane in service (once one is up).
  void sendNotices();
  /// The peer closed every lane with only eager sends unacknowledged: drop them.
  void dropEager();
  void dropUnexpPiece(uint64_t seq, UnexpPiece* p);
  Status matchError(const OpSig& sig, uint64_t total, const RecvOp& op) const;
  Status protocolError(const Sock& s, const std::string& what);
  void setEvents(Sock& s, uint32_t ev);
  void closeSock(Sock& s);
  void moved(Sock& s, size_t n, bool tx);
  int liveLanes() const;
  /// Acceptor side, lanes missing and messages pending: connects to the peer's listening socket.
  /// Refused: the peer is gone, fail now. Accepted: it is alive (not at this operation yet).
  void probePeer(int64_t now);
  uint32_t piecesOf(size_t bytes) const;
  /// A buffer of one piece for unexpected data: a spare one, or a new one. Reused rather than freed
  /// (recycle): allocations of a piece's size are mmapped, and every new one faulted its pages in.
  std::unique_ptr<char[]> takeBuffer();
  void recycle(std::unique_ptr<char[]>&& b);

  TcpTransportImpl* t_;
  int peer_;
  int nlanes_;
  std::vector<std::unique_ptr<Sock>> socks_;
  std::deque<SendOp> sends_;
  std::deque<RecvOp> recvs_;
  uint64_t sendSeq_ = 0;
  uint64_t sendBase_ = 0;                // seq of sends_.front()
  uint64_t recvBase_ = 0;                // seq of recvs_.front()
  uint64_t rateBytes_ = 0, rateNs_ = 0;  // receiveRate
  std::map<uint64_t, UnexpMsg> unexp_;
  size_t unexpBytes_ = 0;
  std::vector<char> sink_;                            // payload of duplicate pieces
  std::vector<std::pair<int, std::string>> notices_;  // lane retirements the peer has not been told of
  std::vector<std::unique_ptr<char[]>> spare_;        // buffers of unexpected pieces, kept for reuse
  size_t eagerInUse_ = 0;                             // bytes of eager copies held
  size_t sendsOwed_ = 0;                              // sends whose request has not completed
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
  Connection* existingConnection(int peer) override;
  Status progress() override;
  void abort(const std::string& reason) override;
  Status peerHealth(int peer) override;

  int lanes() const override { return nlanes_; }
  std::vector<std::string> listenAddresses() const override;
  std::vector<std::string> portAddresses() const override { return listenAddresses(); }
  int lanesPerConnection() const override { return nlanes_; }
  Status breakLane(int peer, int lane, LaneFault fault) override;

  Status setup(Oob* oob);

  // Shared with connections.
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int epfd() const { return ep_.get(); }
  size_t pieceBytes() const { return pieceBytes_; }
  size_t unexpectedLimit() const { return unexpLimit_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  bool acks() const { return acks_; }
  /// A receive is about to write [p, p + n): every connection saves what its released sends
  /// there still need for a re-send (SendOp::saved).
  void protect(const char* p, size_t n);
  uint64_t savedBytes() const override { return savedBytes_; }
  bool sendsPending() const override {
    for (const auto& c : conns_)
      if (c && c->sendsPending()) return true;
    return false;
  }
  void addSaved(size_t n) { savedBytes_ += n; }
  int64_t stallNs() const { return stallMs_ * 1000000; }
  size_t sendQueue() const { return sendQueue_; }
  size_t eagerBytes() const { return eagerBytes_; }
  int64_t unexpectedWaitNs() const { return unexpWaitNs_; }
  size_t eagerLimit() const { return eagerLimit_; }
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
  void noteMoved(size_t n) { moved_ += n; }
  uint64_t progressCount() const override { return moved_; }
  void activate(TcpConnection* c) {
    if (!c->inActiveList) {
      c->inActiveList = true;
      active_.push_back(c);
    }
  }
  /// Socket for lane `s` to `peer` with `plan`: bound to the planned local port / source port,
  /// connect started. Errors name the peer, lane and addresses.
  Status openLaneSocket(int peer, Sock& s, const LanePlan& plan);
  /// The plan of lane `lane` to `peer`: Context::lanePlan, else the default.
  LanePlan planFor(int peer, int lane) const;
  void tuneSocket(int fd) const;

 private:
  TcpConnection* conn(int peer);
  void onListener(int port);
  void setListenerPaused(int port, bool paused);
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
  bool acks_;
  int64_t stallMs_;
  size_t sendQueue_;
  size_t eagerBytes_;
  size_t eagerLimit_;
  int64_t unexpWaitNs_;
  char hostname_[64] = {0};

  Fd ep_;
  std::vector<SockAddr> portAddrs_;  // bound listen addresses (port i)
  std::vector<std::string> portNames_;
  std::vector<Fd> listeners_;
  std::vector<detail::AcceptGuard> accepts_;  // per listener: paused out of file descriptors
  std::vector<bool> listenerPaused_;          // left out of the epoll set until its guard resumes
  bool anyListenerPaused_ = false;
  std::vector<SetupRecord> records_;
  std::vector<std::unique_ptr<TcpConnection>> conns_;
  uint64_t savedBytes_ = 0;  // protect(): bytes of released sends saved before a receive overwrote them
  std::vector<TcpConnection*> active_;
  std::map<uint64_t, Incoming> incoming_;
  std::unique_ptr<DropLog> drops_;  // incoming connections dropped (strangers), folded
  uint64_t nextIncoming_ = 1;
  Status firstError_;
  Status abortStatus_;
  int64_t lastCheckMs_ = 0;
  uint64_t moved_ = 0;  // bytes moved (progressCount)

  friend class TcpConnection;
};

// ---------------------------------------------------------------------------------------------
// TcpConnection

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

bool TcpConnection::receiveRate(uint64_t* bytes, uint64_t* ns) const {
  *bytes = rateBytes_;
  *ns = rateNs_;
  return true;
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
    return makeError(Code::kInvalidArgument, "tcp: breakLane: lane %d to rank %d is not in service", lane, peer_);
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
    retire(s, "broken by breakLane (fault drill)", false);
  } else {
    Status st = makeError(Code::kRemoteError, "tcp: rank %d broke %s (fault drill)", t_->rank(), laneText(s).c_str());
    fail(st);
  }
  return Status::ok();
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

// ---------------------------------------------------------------------------------------------
// TcpTransportImpl

TcpTransportImpl::TcpTransportImpl(const Context& ctx)
    : rank_(ctx.rank),
      nranks_(ctx.nranks),
      tag_(ctx.commTag),
      key_{ctx.authKey[0], ctx.authKey[1]},
      tagHash_(tcpwire::tagHash(ctx.authKey, ctx.commTag.data(), ctx.commTag.size())),
      lanePlan_(ctx.lanePlan),
      timeoutMs_(std::max<int64_t>(0, ctx.timeoutMs)),
      nlanes_(static_cast<int>(paramLanes())),
      pieceBytes_(static_cast<size_t>(std::max<int64_t>(4096, std::min<int64_t>(paramTcpPieceBytes(), 64 << 20))) &
                  ~size_t{4095}),
      // -1 (auto): 1 MiB with acknowledgements, which bounds what a send holds unacknowledged at
      // an operation's end (detachSend copies it), the kernel's autotuning without.
      bufBytes_(static_cast<int>(paramTcpBufBytes() < 0 ? (paramTcpAck() != 0 ? 1 << 20 : 0)
                                                        : std::min<int64_t>(paramTcpBufBytes(), 1 << 30))),
      unexpLimit_(static_cast<size_t>(std::max<int64_t>(0, paramTcpUnexpectedBytes()))),
      handshakeMs_(std::max<int64_t>(
          1, ctx.timeoutMs > 0 ? std::min<int64_t>(paramTcpHandshakeMs(), ctx.timeoutMs) : paramTcpHandshakeMs())),
      sportBase_(paramTcpSportBase()),
      probeMs_(std::max<int64_t>(0, paramTcpProbeMs())),
      acks_(paramTcpAck() != 0),
      stallMs_(std::max<int64_t>(1, paramTcpLaneStallMs())),
      sendQueue_(static_cast<size_t>(std::max<int64_t>(1, paramTcpSendQueue()))),
      eagerBytes_(static_cast<size_t>(std::max<int64_t>(0, paramTcpEagerBytes()))),
      eagerLimit_(static_cast<size_t>(std::max<int64_t>(0, paramTcpEagerLimit()))),
      unexpWaitNs_(std::max<int64_t>(0, paramTcpUnexpectedWaitUs()) * 1000) {
  if (gethostname(hostname_, sizeof(hostname_) - 1) != 0) strcpy(hostname_, "?");
}

TcpTransportImpl::~TcpTransportImpl() {
  if (savedBytes_ > 0)
    C4_INFO(kLogNet, "tcp: rank %d saved %llu B of released sends before its receives overwrote them", rank_,
            static_cast<unsigned long long>(savedBytes_));
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
  c.spaces = kHostSpaces;
  c.reduceOnRecv = true;
  c.lanes = true;
  c.releasesSends = acks_;
  return c;
}

void TcpTransportImpl::protect(const char* p, size_t n) {
  if (!acks_ || n == 0) return;
  for (auto& c : conns_)
    if (c) c->protect(p, n);
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

Status TcpTransportImpl::breakLane(int peer, int lane, LaneFault fault) {
  if (!canConnect(peer) || conns_.empty() || !conns_[static_cast<size_t>(peer)])
    return makeError(Code::kInvalidArgument, "tcp: breakLane: no connection from rank %d to rank %d", rank_, peer);
  return conns_[static_cast<size_t>(peer)]->breakLane(lane, fault);
}

LanePlan TcpTransportImpl::planFor(int peer, int lane) const { return lanePlan_ ? lanePlan_(peer, lane) : LanePlan{}; }

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

Connection* TcpTransportImpl::existingConnection(int peer) {
  if (peer < 0 || static_cast<size_t>(peer) >= conns_.size()) return nullptr;
  return conns_[static_cast<size_t>(peer)].get();
}

Status TcpTransportImpl::openLaneSocket(int peer, Sock& l, const LanePlan& plan) {
  const SetupRecord& pr = records_[static_cast<size_t>(peer)];
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
  if (plan.remotePort >= pr.nports)
    return makeError(Code::kInvalidArgument, "tcp: lane plan for lane %d to rank %d names its port %d of %d", l.index,
                     peer, plan.remotePort, pr.nports);
  l.localPort = lp;
  l.remotePort = plan.remotePort >= 0 ? plan.remotePort : lp % pr.nports;
  l.pathText = plan.label;
  C4_CHECK(detail::fromWire(pr.addrs[l.remotePort], &l.remote));
  l.remoteText = l.remote.toString();
  l.lane.setEndpoints(lp, "", l.remoteText);
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
  // A planned source port taken by another socket: the other ports of its range lead the same way.
  int rcBind = ::bind(fd.get(), local.sa(), local.len);
  if (rcBind != 0 && errno == EADDRINUSE && plan.sourcePort != 0 && plan.sourcePortHi > plan.sourcePortLo &&
      sport >= plan.sourcePortLo && sport <= plan.sourcePortHi) {
    const int span = plan.sourcePortHi - plan.sourcePortLo + 1;
    for (int k = 1; k < std::min(span, 256) && rcBind != 0 && errno == EADDRINUSE; ++k) {
      local.setPort(static_cast<uint16_t>(plan.sourcePortLo + (sport - plan.sourcePortLo + k) % span));
      rcBind = ::bind(fd.get(), local.sa(), local.len);
    }
  }
  if (rcBind != 0) {
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
  l.state = SockState::kConnecting;
  l.lane.setState(LaneState::kConnecting);
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
        Status st = detail::chooseInterface(s.empty() ? paramSocketIfname() : s, nullptr, &nif,
                                            s.empty() ? kC4ParamSocketIfname.setBy() : "C4_TCP_PORTS");
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
      accepts_.emplace_back(strFormat("tcp: rank %d: listener %s", rank_, bound.toString().c_str()));
      listenerPaused_.push_back(false);
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
  mine.ack = acks_ ? 1 : 0;
  mine.pieceBytes = pieceBytes_;
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
    if (rec.ack != mine.ack)
      return makeError(Code::kInvalidUsage,
                       "tcp: rank %d uses C4_TCP_ACK=%d but rank %d uses %d; set it alike on all ranks", r, rec.ack,
                       rank_, mine.ack);
    if (rec.pieceBytes != pieceBytes_)
      return makeError(Code::kInvalidUsage,
                       "tcp: rank %d cuts messages into %llu-byte pieces (C4_TCP_PIECE_BYTES) but rank %d into %zu; "
                       "set it alike on all ranks",
                       r, static_cast<unsigned long long>(rec.pieceBytes), rank_, pieceBytes_);
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
          "limit %zu B per peer, acknowledgements %s (lane stall %lld ms)",
          rank_, nlanes_, ports.c_str(), pieceBytes_, bufBytes_ ? std::to_string(bufBytes_).c_str() : "autotuned",
          unexpLimit_, acks_ ? "on" : "off", static_cast<long long>(stallMs_));
  return Status::ok();
}

void TcpTransportImpl::setListenerPaused(int port, bool paused) {
  const size_t i = static_cast<size_t>(port);
  epoll_event e{};
  e.events = paused ? 0u : static_cast<uint32_t>(EPOLLIN);
  e.data.u64 = kTagListener | i;
  if (epoll_ctl(ep_.get(), EPOLL_CTL_MOD, listeners_[i].get(), &e) != 0) return;
  listenerPaused_[i] = paused;
  anyListenerPaused_ = std::find(listenerPaused_.begin(), listenerPaused_.end(), true) != listenerPaused_.end();
}

void TcpTransportImpl::onListener(int port) {
  detail::AcceptGuard& guard = accepts_[static_cast<size_t>(port)];
  for (int k = 0; k < 64; ++k) {
    Fd fd;
    SockAddr remote;
    Status st = guard.accept(listeners_[static_cast<size_t>(port)].get(), &fd, &remote);
    if (!st.isOk()) {
      C4_WARN(kLogNet, "tcp: rank %d: accept on %s: %s", rank_,
              portAddrs_[static_cast<size_t>(port)].toString().c_str(), st.message().c_str());
      return;
    }
    if (!fd.valid()) {
      // Out of file descriptors: the listener stays readable; leave it out of the epoll set (a
      // thread blocked on waitFd() would spin) until the guard's pause ends (progress()).
      if (guard.paused(nowMs())) setListenerPaused(port, true);
      return;
    }
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
    if (!drops_) drops_ = std::make_unique<DropLog>(strFormat("tcp: rank %d", rank_), kLogNet);
    drops_->drop(it->second.remote.toString(), why, nowMs());
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
    *why = tcpwire::checkHello(h, tcpwire::HelloExpect{tagHash_, rank_, nlanes_, kMaxLaneIndex}, &in.probe);
    if (!why->empty()) return false;
    in.nonce = randomU64();
    tcpwire::Challenge ch{tcpwire::kChallengeMagic, 0, in.nonce, tcpwire::handshakeMac(key_, true, h, in.nonce)};
    in.out.assign(reinterpret_cast<const char*>(&ch), sizeof(ch));
    in.stage = 1;
    return incomingStep(in, why, done);
  }
  tcpwire::Proof pr;
  memcpy(&pr, in.in, sizeof(pr));
  if (!tcpwire::proofValid(key_, in.hello, in.nonce, pr)) {
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
  if (!c->accepts(lane)) {
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
  if (drops_) drops_->flush(nowMs());  // only once a stranger was dropped
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
        if (!c || !c->broken().isOk() || lane >= c->numLanes()) continue;
        Sock& l = c->sock(lane);
        if (!l.fd.valid()) continue;
        if (evs[i].events & (EPOLLOUT | EPOLLERR)) {
          if (l.state == SockState::kConnecting || l.wantOut) c->onWritable(l);
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
  // Acknowledgements of what this round received go out at once (ahead of queued data).
  for (size_t i = 0; i < active_.size(); ++i) {
    if (!active_[i]->needAck) continue;
    active_[i]->sendAcks();
    active_[i]->flushAll();
  }

  const int64_t now = nowMs();
  if (anyListenerPaused_)
    for (size_t i = 0; i < listeners_.size(); ++i)
      if (listenerPaused_[i] && !accepts_[i].paused(now)) {
        setListenerPaused(static_cast<int>(i), false);
        if (accepts_[i].retryDue(now)) onListener(static_cast<int>(i));  // the queue may be empty
      }
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
    for (const auto& s : c.socks()) txLeft |= !s->txq.empty() || !s->hsOut.empty();
    return c.pending() || txLeft || c.needRx || c.needAck || c.acksDeferred();
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
