// The tcp transport's internals, shared by its parts (docs/tcp-transport.md):
//   tcp_lanes.cc    a connection's lanes: their sockets, retirement, failures, the stall checks;
//   tcp_send.cc     sends: striping pieces over the lanes, writing, acknowledgements, released sends;
//   tcp_recv.cc     receives: reading frames, matching, reducing, the pieces that came early;
//   tcp_setup.cc    the transport: listening, the handshake, connections, progress, abort.
// Nothing outside transports/tcp includes it: the interface is tcp_transport.hpp.
#pragma once

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
#include "transports/tcp/tcp_transport.hpp"
#include "transports/tcp/tcp_wire.hpp"
#include "transports/transport_util.hpp"

namespace c4::transport::tcp {

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
  // C4D's receive rate (RateMeter::receiveRate): from the first piece read off a socket into the
  // posted receive to the last, and the bytes after the first.
  int64_t rateFirstNs = 0, rateLastNs = 0;
  uint64_t rateBytes = 0;
};

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

class TcpConnection final : public Connection, public LaneControl, public ReleasedSends, public RateMeter {
 public:
  /// A receive of this transport is about to write [p, p + n): saves the pieces there that
  /// released sends of this connection still need for a re-send (SendOp::saved).
  void protect(const char* p, size_t n);
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
  std::string describeState() const override;
  LaneControl* laneControl() override { return this; }
  ReleasedSends* releasedSends() override { return acks() ? this : nullptr; }  // Caps::releasesSends
  const RateMeter* rateMeter() const override { return this; }

  // LaneControl
  Status setLaneWeights(const std::vector<double>& w) override;
  Status retireLane(int i, const std::string& why) override;
  Status addLane(const LanePlan& plan, int* index) override;
  // ReleasedSends
  bool detachSend(Request* req) override;
  // RateMeter
  void receiveRate(uint64_t* bytes, uint64_t* ns) const override;

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
  /// The fault drill on lane `lane` (LaneSetup::faultDrill).
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
  Status connect(int peer, Connection** out) override;
  Connection* existingConnection(int peer) override;
  Status progress() override;
  void abort(const std::string& reason) override;
  Status peerHealth(int peer) override;

  LaneSetup* laneSetup() override { return this; }
  WaitSource* waitSource() override { return this; }

  // LaneSetup
  std::vector<std::string> portAddresses() const override;
  int lanesPerConnection() const override { return nlanes_; }
  Status startLanes() override { return Status::ok(); }  // lanes open lazily, on first use
  Status faultDrill(int peer, int lane, LaneFault fault) override;
  // WaitSource
  int waitFd() const override { return ep_.get(); }
  bool armWait() override { return true; }  // epoll signals without arming

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

}  // namespace c4::transport::tcp
