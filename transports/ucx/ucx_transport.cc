#include "transports/ucx/ucx_transport.hpp"

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/process.hpp"
#include "common/status.hpp"
#include "transports/transport_util.hpp"

namespace c4::transport {
namespace {

using detail::nowMs;

// ---- wire ------------------------------------------------------------------------------------------

constexpr uint32_t kHdrMagic = 0x78753463u;  // "c4ux"
enum Kind : uint32_t { kInline = 0, kHeader = 1, kData = 2 };

/// First bytes of an inline message, and the whole of a header message.
struct WireHdr {
  uint32_t magic;
  uint32_t kind;   // kInline or kHeader
  uint64_t bytes;  // payload bytes of the message
  OpSig sig;
};
static_assert(sizeof(WireHdr) == 40, "wire layout");

// Tags: [63] control (an abort notice) | [62:61] kind | [60:37] sender's rank | [36:0] sequence number
// of the message in its direction. Every message has a tag of its own, so matching needs no ordering
// from UCX, and a receive posted for message k can only get message k.
constexpr int kSeqBits = 37;
constexpr int kRankBits = 24;
constexpr int kKindShift = 61;
constexpr ucp_tag_t kCtrlBit = ucp_tag_t{1} << 63;
constexpr ucp_tag_t kSeqMask = (ucp_tag_t{1} << kSeqBits) - 1;
// The first part of a message is inline (kind 0) or a header (1), never data (2): a receive for it
// matches the rank, the sequence, the control bit and the data bit.
constexpr ucp_tag_t kFirstMask = ~(ucp_tag_t{1} << kKindShift);
constexpr ucp_tag_t kExact = ~ucp_tag_t{0};
constexpr size_t kAbortBytes = 1024;
static_assert(kRankBits + kSeqBits + 3 == 64, "tag layout");

// A UCX operation may call its callback before the call that posts it returns (UCX documents this
// for UCP_OP_ATTR_FLAG_NO_IMM_CMPL), and the callback frees the request. So a request's slot holds
// kPosting during the call: the callback clears it, and only if it is still kPosting afterwards does
// it take the returned request (else that pointer is already freed). inFlight counts go up before.
char postingMark;
void* const kPosting = &postingMark;

/// Cancels a posted receive (its callback then runs with UCS_ERR_CANCELED); nothing while posting.
void cancelOp(ucp_worker_h w, void* op) {
  if (op != nullptr && op != kPosting) ucp_request_cancel(w, op);
}

ucp_tag_t tagOf(int rank, uint64_t seq, Kind k) {
  return (ucp_tag_t{k} << kKindShift) | (static_cast<ucp_tag_t>(rank) << kSeqBits) | (seq & kSeqMask);
}

const char* ucsText(ucs_status_t s) { return ucs_status_string(s); }

class UcxTransportImpl;
class UcxConnection;

/// A registration: the UCP memory handle that lets a zero-copy send or receive skip registering.
class UcxRegion : public MemRegion {
 public:
  UcxRegion(const void* base, size_t bytes, MemSpace space, ucp_mem_h memh)
      : MemRegion(base, bytes, space), memh_(memh) {}
  ucp_mem_h memh() const { return memh_; }

 private:
  ucp_mem_h memh_;
};

ucp_mem_h memhOf(const MemRef& ref) {
  const auto* r = dynamic_cast<const UcxRegion*>(ref.region);
  return r ? r->memh() : nullptr;
}

/// One isend: an inline message, or a header message and a data message.
struct SendMsg {
  UcxConnection* conn = nullptr;
  Request* req = nullptr;
  size_t bytes = 0;
  std::vector<char> wire;  // the inline message, or the header message
  int inFlight = 0;        // UCX operations not completed yet
  Status err;
  bool finished = false;  // req completed or failed
};

/// One irecv: the first message (inline, or the header) lands in `first`; a data message goes
/// straight to dst.
struct RecvMsg {
  UcxConnection* conn = nullptr;
  Request* req = nullptr;
  MemRef dst;
  size_t bytes = 0;
  OpSig sig;
  uint64_t seq = 0;
  std::vector<char> first;
  size_t firstLen = 0;
  void* firstOp = nullptr;  // UCX requests, for cancelling (null once completed)
  void* dataOp = nullptr;
  bool firstDone = false, dataDone = false, dataPosted = false;
  bool sizeMismatch = false;  // the payload was not the size posted: the header (when read) says why
  int inFlight = 0;
  Status err;
  bool finished = false;
};

class UcxConnection final : public Connection {
 public:
  /// `peerFailure`: UCX handles the peer's failure on the endpoint (UCP_ERR_HANDLING_MODE_PEER);
  /// `watchPid` > 0: the peer is that process of this host, watched by the transport instead.
  UcxConnection(UcxTransportImpl* t, int peer, bool peerFailure, int watchPid)
      : t_(t), peer_(peer), peerFailure_(peerFailure), watch_(watchPid) {}
  int peer() const override { return peer_; }
  Status isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint) override;
  Status irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) override;
  Status peek(bool* ready, OpSig* sig, size_t* bytes) override;
  std::string describeState() const override;

  Status open();  // creates the endpoint (first use)
  /// The connection is broken: its endpoint closes and every message of it fails with `st` once
  /// UCX has let go of its buffers.
  void fail(const Status& st);
  /// Completes what can be completed; drops finished messages.
  void sweep();
  bool busy() const { return !sends_.empty() || !recvs_.empty() || stashOp_ != nullptr; }
  /// Whether a request of this connection was failed (its error then stands for the connection).
  bool failedRequests() const { return failedRequests_; }
  /// The peer's process, where the transport watches it (pid() <= 0: not watched).
  const ProcessWatch& watch() const { return watch_; }

  // UCX callbacks.
  static void onSend(void* request, ucs_status_t status, void* user);
  static void onFirst(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void onData(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void onStash(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_ep_h ep() const { return ep_; }
  /// closeEndpoint() gave up on an endpoint that cannot be closed: nothing is sent on it or flushed
  /// any more (a flush would wait for the peer that is gone).
  bool endpointAbandoned() const { return abandonedEp_; }
  /// UCX's transports on the endpoint's lanes ("sysv/memory cma/memory", "tcp/lo"), from
  /// ucp_ep_print_info; empty before the endpoint exists.
  std::string endpointTransports() const;
  const Status& standing() const { return standing_; }
  /// Starts a flush of the endpoint (what was sent reaches the peer) into flushOp.
  void flushEndpoint();
  /// Closes the endpoint, releasing whatever it still holds (closeOp: the close in flight). UCX
  /// closes an endpoint without peer-failure handling only by flushing it, which a peer that is
  /// gone never lets finish: such an endpoint stays open until the worker goes, and its sends that
  /// UCX still holds are abandoned (failed now; see abandoned_).
  void closeEndpoint();
  bool peerFailure() const { return peerFailure_; }
  void* flushOp = nullptr;
  void* closeOp = nullptr;
  int64_t closeAtMs = 0;  // peerGone() of an aborted peer: when closeEndpoint() gives up on its sends

 private:
  /// Checks a first message against the receive; on success an inline payload is copied to dst.
  Status consumeFirst(RecvMsg& m, const char* data, size_t len);
  Status postData(RecvMsg& m);
  void finishRecvIfDone(RecvMsg& m);

  UcxTransportImpl* t_;
  int peer_;
  bool peerFailure_;
  ProcessWatch watch_;
  ucp_ep_h ep_ = nullptr;
  bool abandonedEp_ = false;
  Status standing_;
  uint64_t sendSeq_ = 0, recvSeq_ = 0;
  std::list<SendMsg> sends_;
  std::list<RecvMsg> recvs_;
  // Sends failed while UCX still held them, on an endpoint that cannot be closed (no peer-failure
  // handling) to a peer that is gone: their payloads (every message larger than an inline one, whose
  // bytes are copied) go by rendezvous, which the receiver drives, and a receiver that exited, or
  // aborted and settled, asks for nothing more, so UCX does not touch their buffers again. Kept
  // (their callbacks' user data) until the worker is destroyed.
  std::list<SendMsg> abandoned_;
  // peek(): the next message's first part, taken out of UCX so that its header can be read.
  std::vector<char> stash_;
  size_t stashLen_ = 0;
  void* stashOp_ = nullptr;
  bool stashReady_ = false;
  RecvMsg* stashFor_ = nullptr;  // the receive the stash in flight belongs to
  bool failedRequests_ = false;
};

class UcxTransportImpl final : public Transport, public WaitSource {
 public:
  explicit UcxTransportImpl(const Context& ctx)
      : ctx_(ctx), inline_(static_cast<size_t>(paramUcxInlineBytes())), conns_(static_cast<size_t>(ctx.nranks)) {}
  ~UcxTransportImpl() override;

  Status setup();
  const char* name() const override { return "ucx"; }
  /// UCX's context and worker, and the worker's address (local: no exchange).
  Status startWorker(std::vector<char>* address);
  Caps caps() const override {
    Caps c;
    c.latencyUs = 6.0;
    c.bwGBps = 2.0;
    c.spaces = kHostSpaces;
    return c;
  }
  bool canConnect(int peer) const override { return peer >= 0 && peer < ctx_.nranks && peer != ctx_.rank; }
  Status connect(int peer, Connection** out) override;
  Status progress() override;
  uint64_t progressCount() const override { return progressCount_; }
  WaitSource* waitSource() override { return efd_ >= 0 ? this : nullptr; }
  // WaitSource
  int waitFd() const override { return efd_; }
  bool armWait() override { return ucp_worker_arm(worker_) != UCS_ERR_BUSY; }
  void abort(const std::string& reason) override;
  Status registerMemory(const void* base, size_t bytes, MemSpace space, std::unique_ptr<MemRegion>* out) override;
  Status deregisterMemory(MemRegion* region) override;
  Status peerHealth(int peer) override {
    UcxConnection* c = peer >= 0 && peer < ctx_.nranks ? conns_[static_cast<size_t>(peer)].get() : nullptr;
    return c ? c->standing() : Status::ok();
  }

  int rank() const { return ctx_.rank; }
  size_t inlineBytes() const { return inline_; }
  ucp_worker_h worker() const { return worker_; }
  const std::vector<char>& address(int peer) const { return addrs_[static_cast<size_t>(peer)]; }
  const Status& aborted() const { return abortStatus_; }
  void delivered() {
    ++progressCount_;
    lastProgressMs_ = nowMs();
  }
  /// Drives the worker until `done` or `ms` pass.
  template <class Done>
  void progressUntil(Done done, int64_t ms) {
    const int64_t until = nowMs() + ms;
    while (!done() && nowMs() < until) ucp_worker_progress(worker_);
  }

 private:
  void postAbortReceive();
  /// Flushes every healthy endpoint, for up to `ms`.
  void flushAll(int64_t ms);
  static void onAbortNotice(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  void shutdown(const Status& why);
  /// The peer is gone (it aborted, or its process `exited`): its connection fails with `why`, and
  /// its endpoint closes (forced), so that UCX gives up on the sends still in flight to it (a
  /// rendezvous send would otherwise wait for a receiver that no longer exists) and they fail now
  /// instead of when the timeout runs out. An endpoint that cannot be closed by force (no
  /// peer-failure handling) to a peer that aborted but lives gets kAbortGraceMs first: a payload
  /// the peer already asked for completes while it settles (see closeEndpoint()).
  static void peerGone(UcxConnection& c, const Status& why, bool exited);
  /// Fails the connections whose watched peer process exited (looked at every kWatchMs).
  void watchPeers();

  Context ctx_;
  size_t inline_;
  int peerFailure_ = static_cast<int>(paramUcxPeerFailure());
  // Per rank, from setup: its pid, and its pid namespace (0: unknown).
  std::vector<int64_t> pids_, pidNs_;
  bool watching_ = false;  // some peer is watched as a process
  int64_t lastWatchMs_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;  // the worker's event fd (UCP_FEATURE_WAKEUP): readable once armed and UCX has work
  std::vector<std::vector<char>> addrs_;
  std::vector<std::unique_ptr<UcxConnection>> conns_;
  std::vector<UcxConnection*> active_;
  Status abortStatus_;
  uint64_t progressCount_ = 0;
  int64_t lastProgressMs_ = 0;
  // The abort notices of peers: one receive for any of them, posted again after each.
  char abortBuf_[kAbortBytes];
  void* abortOp_ = nullptr;
  std::vector<std::pair<int, std::string>> notices_;  // (rank, reason) not handled yet
};

// ---- UCX's own messages after a peer died ----------------------------------------------------------

// Peers this process's ucx transports lost (exited, aborted, or their endpoints failed).
std::atomic<int> gPeersLost{0};

// When a peer dies, UCX reports what it could not finish with it, in words that alarm: a flush that
// timed out, the peer's shared memory gone (shmat), requests not returned to a memory pool when the
// context goes. This handler (first in UCX's chain, pushed with the first ucx transport) rewords
// those into c4comm's log with what they mean: an INFO line once a peer was lost, a WARN line
// before (c4comm has not seen the death yet). Every other UCX message goes on as UCX prints it.
ucs_log_func_rc_t afterDeathLog(const char* file, unsigned line, const char*, ucs_log_level_t level,
                                const ucs_log_component_config_t*, const char* message, va_list ap) {
  if (level > UCS_LOG_LEVEL_WARN) return UCS_LOG_FUNC_RC_CONTINUE;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  static const struct {
    const char* file;
    const char* meaning;
  } kKnown[] = {
      {"mpool.c", "requests UCX still held when it was torn down (sends to a peer that died are abandoned)"},
      {"flush.c", "a flush of an endpoint failed (its peer exited, or the network to it failed)"},
      {"mm_sysv.c", "a same-host peer's shared memory is gone (that peer exited)"},
      {"mm_posix.c", "a same-host peer's shared memory is gone (that peer exited)"},
      {"mm_ep.c", "a same-host peer's shared memory is gone (that peer exited)"},
      {"tcp_ep.c", "a tcp connection of UCX to a peer broke (it exited, or the network failed)"},
  };
  const char* meaning = nullptr;
  for (const auto& k : kKnown)
    if (strcmp(base, k.file) == 0) meaning = k.meaning;
  if (meaning == nullptr) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  vsnprintf(text, sizeof text, message, copy);
  va_end(copy);
  if (gPeersLost.load(std::memory_order_relaxed) > 0) {
    C4_INFO(kLogNet, "ucx: after a peer was lost, as expected: %s [UCX %s:%u: %s]", meaning, base, line, text);
  } else {
    C4_WARN(kLogNet, "ucx: %s [UCX %s:%u: %s]", meaning, base, line, text);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

void notePeerLost() { gPeersLost.fetch_add(1, std::memory_order_relaxed); }

// ---- connection ------------------------------------------------------------------------------------

void UcxConnection::onEpError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* c = static_cast<UcxConnection*>(arg);
  notePeerLost();
  c->fail(makeError(Code::kRemoteError,
                    "ucx: rank %d: the connection to rank %d failed: %s (rank %d exited or the "
                    "network between them failed)",
                    c->t_->rank(), c->peer_, ucsText(status), c->peer_));
}

Status UcxConnection::open() {
  if (ep_ || !standing_.isOk()) return standing_;
  const std::vector<char>& addr = t_->address(peer_);
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_USER_DATA;
  p.address = reinterpret_cast<const ucp_address_t*>(addr.data());
  p.err_mode = peerFailure_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  p.err_handler.cb = &UcxConnection::onEpError;
  p.err_handler.arg = this;
  p.user_data = this;
  ucs_status_t s = ucp_ep_create(t_->worker(), &p, &ep_);
  if (s != UCS_OK) {
    ep_ = nullptr;
    standing_ = makeError(
        Code::kSystemError, "ucx: rank %d: cannot open an endpoint to rank %d: %s%s", t_->rank(), peer_, ucsText(s),
        watch_.pid() > 0 ? " (over shared memory: has the peer closed its transport or exited?)" : "");
  }
  return standing_;
}

void UcxConnection::onSend(void* request, ucs_status_t status, void* user) {
  auto* m = static_cast<SendMsg*>(user);
  ucp_request_free(request);
  --m->inFlight;
  if (status == UCS_OK) {
    m->conn->t_->delivered();
  } else if (m->err.isOk()) {
    m->err = makeError(Code::kRemoteError, "ucx: rank %d: send of %zu bytes to rank %d failed: %s", m->conn->t_->rank(),
                       m->bytes, m->conn->peer_, ucsText(status));
  }
}

Status UcxConnection::isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint) {
  Status standing = t_->aborted().isOk() ? standing_ : t_->aborted();
  C4_CHECK(startSend("ucx", peer_, standing, buf, bytes, req));
  C4_CHECK(open());
  sends_.emplace_back();
  SendMsg& m = sends_.back();
  m.conn = this;
  m.req = req;
  m.bytes = bytes;
  const uint64_t seq = sendSeq_++;
  const bool inl = bytes <= t_->inlineBytes();
  WireHdr h{kHdrMagic, inl ? kInline : kHeader, bytes, sig};
  m.wire.resize(sizeof(h) + (inl ? bytes : 0));
  memcpy(m.wire.data(), &h, sizeof(h));
  if (inl && bytes) memcpy(m.wire.data() + sizeof(h), buf.ptr, bytes);
  auto post = [&](const void* data, size_t len, Kind k, ucp_mem_h memh) -> Status {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.send = &UcxConnection::onSend;
    p.user_data = &m;
    if (memh) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
    ++m.inFlight;  // before: onSend may run inside the call
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep_, data, len, tagOf(t_->rank(), seq, k), &p);
    if (UCS_PTR_IS_ERR(r)) {
      --m.inFlight;
      return makeError(Code::kRemoteError, "ucx: rank %d: send to rank %d failed: %s", t_->rank(), peer_,
                       ucsText(UCS_PTR_STATUS(r)));
    }
    return Status::ok();
  };
  Status st = post(m.wire.data(), m.wire.size(), inl ? kInline : kHeader, nullptr);
  if (st.isOk() && !inl) st = post(buf.ptr, bytes, kData, memhOf(buf));
  if (!st.isOk()) {
    m.err = st;
    fail(st);
  }
  return Status::ok();
}

void UcxConnection::onFirst(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* m = static_cast<RecvMsg*>(user);
  // The info lives in the request: read it before the request goes back to UCX.
  const size_t len = status == UCS_OK ? info->length : 0;
  ucp_request_free(request);
  m->firstOp = nullptr;
  --m->inFlight;
  if (status == UCS_ERR_CANCELED) return;
  if (status != UCS_OK) {
    if (m->err.isOk())
      m->err = makeError(status == UCS_ERR_MESSAGE_TRUNCATED ? Code::kInvalidUsage : Code::kRemoteError,
                         "ucx: rank %d: receive from rank %d failed: %s", m->conn->t_->rank(), m->conn->peer_,
                         ucsText(status));
    return;
  }
  m->firstDone = true;
  m->firstLen = len;
  m->conn->t_->delivered();
}

void UcxConnection::onData(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* m = static_cast<RecvMsg*>(user);
  // The info lives in the request: read it before the request goes back to UCX.
  const size_t len = status == UCS_OK ? info->length : 0;
  ucp_request_free(request);
  m->dataOp = nullptr;
  --m->inFlight;
  if (status == UCS_ERR_CANCELED) return;
  if (status != UCS_OK || len != m->bytes) {
    // A payload of another size than posted is the two calls disagreeing (a usage error), not the network.
    m->sizeMismatch = status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED;
    if (m->err.isOk())
      m->err = makeError(m->sizeMismatch ? Code::kInvalidUsage : Code::kRemoteError,
                         "ucx: rank %d: receive of %zu bytes from rank %d failed: %s (%zu bytes)", m->conn->t_->rank(),
                         m->bytes, m->conn->peer_, status == UCS_OK ? "short message" : ucsText(status),
                         status == UCS_OK ? len : 0);
    return;
  }
  m->dataDone = true;
  m->conn->t_->delivered();
}

Status UcxConnection::postData(RecvMsg& m) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxConnection::onData;
  p.user_data = &m;
  if (ucp_mem_h memh = memhOf(m.dst)) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  m.dataOp = kPosting;
  m.dataPosted = true;
  ++m.inFlight;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(t_->worker(), m.dst.ptr, m.bytes, tagOf(peer_, m.seq, kData), kExact, &p);
  if (UCS_PTR_IS_ERR(r)) {
    m.dataOp = nullptr;
    m.dataPosted = false;
    --m.inFlight;
    return makeError(Code::kSystemError, "ucx: rank %d: cannot post a receive from rank %d: %s", t_->rank(), peer_,
                     ucsText(UCS_PTR_STATUS(r)));
  }
  if (m.dataOp == kPosting) m.dataOp = r;
  return Status::ok();
}

Status UcxConnection::irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) {
  Status standing = t_->aborted().isOk() ? standing_ : t_->aborted();
  C4_CHECK(startRecv("ucx", peer_, standing, dst, bytes, red, req));
  if (red) return makeError(Code::kInvalidUsage, "ucx: irecv with reduction: the transport has no Caps::reduceOnRecv");
  C4_CHECK(open());
  recvs_.emplace_back();
  RecvMsg& m = recvs_.back();
  m.conn = this;
  m.req = req;
  m.dst = dst;
  m.bytes = bytes;
  m.sig = sig;
  m.seq = recvSeq_++;
  Status st;
  if (stashReady_) {
    // peek() took this message's first part out of UCX already.
    stashReady_ = false;
    m.firstDone = true;
    m.first.swap(stash_);
    m.firstLen = stashLen_;
  } else if (stashOp_ != nullptr) {
    // ... and it is still arriving: onStash hands it over.
    stashFor_ = &m;
    ++m.inFlight;
  } else {
    // The first part: an inline message, or the header of a large one (any kind, this sequence
    // number), into a buffer that fits the largest inline message.
    m.first.resize(sizeof(WireHdr) + t_->inlineBytes());
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &UcxConnection::onFirst;
    p.user_data = &m;
    m.firstOp = kPosting;
    ++m.inFlight;
    ucs_status_ptr_t r =
        ucp_tag_recv_nbx(t_->worker(), m.first.data(), m.first.size(), tagOf(peer_, m.seq, kInline), kFirstMask, &p);
    if (UCS_PTR_IS_ERR(r)) {
      m.firstOp = nullptr;
      --m.inFlight;
      st = makeError(Code::kSystemError, "ucx: rank %d: cannot post a receive from rank %d: %s", t_->rank(), peer_,
                     ucsText(UCS_PTR_STATUS(r)));
    } else if (m.firstOp == kPosting) {
      m.firstOp = r;
    }
  }
  // A large message's payload goes straight to dst: its receive is posted now, with the header's.
  if (st.isOk() && bytes > t_->inlineBytes()) st = postData(m);
  if (!st.isOk()) {
    m.err = st;
    fail(st);
  }
  return Status::ok();
}

Status UcxConnection::consumeFirst(RecvMsg& m, const char* data, size_t len) {
  WireHdr h;
  if (len < sizeof(h))
    return makeError(Code::kRemoteError, "ucx: rank %d: a message of %zu bytes from rank %d has no header", t_->rank(),
                     len, peer_);
  memcpy(&h, data, sizeof(h));
  const bool inl = h.kind == kInline;
  if (h.magic != kHdrMagic || (h.kind != kInline && h.kind != kHeader) || (inl && len != sizeof(h) + h.bytes) ||
      (!inl && len != sizeof(h)))
    return makeError(Code::kRemoteError, "ucx: rank %d: rank %d sent a malformed message header", t_->rank(), peer_);
  return matchError("ucx", peer_, "rank " + std::to_string(peer_), t_->rank(), h.sig, h.bytes, m.sig, m.bytes);
}

void UcxConnection::finishRecvIfDone(RecvMsg& m) {
  // A payload of the wrong size can fail the receive before its header is read (they race): the
  // header says why, naming both calls' sizes or signatures, which is what the caller must see.
  if (!m.finished && m.sizeMismatch && m.firstDone && m.firstLen != SIZE_MAX) {
    Status st = consumeFirst(m, m.first.data(), m.firstLen);
    m.firstLen = SIZE_MAX;
    m.err = st.isOk() ? m.err : st;
    fail(m.err);  // the stream is out of step with the peer's, as for a mismatch the header shows first
    return;
  }
  if (m.finished || !m.err.isOk() || !m.firstDone) return;
  if (m.req->state == Request::kPending && m.firstLen != SIZE_MAX) {
    // The first part arrived: check it once.
    Status st = consumeFirst(m, m.first.data(), m.firstLen);
    if (!st.isOk()) {
      m.err = st;
      fail(st);
      return;
    }
    WireHdr h;
    memcpy(&h, m.first.data(), sizeof(h));
    if (h.kind == kInline && m.bytes) memcpy(m.dst.ptr, m.first.data() + sizeof(h), m.bytes);
    m.firstLen = SIZE_MAX;  // checked
    if (h.kind == kHeader && !m.dataPosted) {
      Status d = postData(m);
      if (!d.isOk()) {
        m.err = d;
        fail(d);
        return;
      }
    }
  }
  if (m.dataPosted && !m.dataDone) return;
  m.finished = true;
  completeRequest(m.req);
}

void UcxConnection::onStash(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* c = static_cast<UcxConnection*>(user);
  // The info lives in the request: read it before the request goes back to UCX.
  const size_t len = status == UCS_OK ? info->length : 0;
  ucp_request_free(request);
  c->stashOp_ = nullptr;
  RecvMsg* m = c->stashFor_;
  c->stashFor_ = nullptr;
  if (m) --m->inFlight;
  if (status != UCS_OK) {
    Status st = makeError(Code::kRemoteError, "ucx: rank %d: receive from rank %d failed: %s", c->t_->rank(), c->peer_,
                          ucsText(status));
    if (m && m->err.isOk()) m->err = st;
    if (status != UCS_ERR_CANCELED) c->fail(st);
    return;
  }
  c->t_->delivered();
  if (m) {
    m->first.swap(c->stash_);
    m->firstLen = len;
    m->firstDone = true;
  } else {
    c->stashLen_ = len;
    c->stashReady_ = true;
  }
}

Status UcxConnection::peek(bool* ready, OpSig* sig, size_t* bytes) {
  *ready = false;
  if (!t_->aborted().isOk()) return t_->aborted();
  C4_CHECK(standing_);
  C4_CHECK(open());
  if (!recvs_.empty()) return Status::ok();  // never ready while receives are posted
  if (!stashReady_ && stashOp_ == nullptr) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(t_->worker(), tagOf(peer_, recvSeq_, kInline), kFirstMask, 1, &info);
    if (msg == nullptr) return Status::ok();
    if (info.length > sizeof(WireHdr) + t_->inlineBytes())
      return makeError(Code::kRemoteError, "ucx: rank %d: rank %d sent a first message of %zu bytes", t_->rank(), peer_,
                       info.length);
    stash_.resize(std::max<size_t>(info.length, 1));
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &UcxConnection::onStash;
    p.user_data = this;
    stashOp_ = kPosting;
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(t_->worker(), stash_.data(), info.length, msg, &p);
    if (UCS_PTR_IS_ERR(r)) {
      stashOp_ = nullptr;
      return makeError(Code::kSystemError, "ucx: rank %d: cannot receive a message from rank %d: %s", t_->rank(), peer_,
                       ucsText(UCS_PTR_STATUS(r)));
    }
    // An eager message that was all there completes inside the call (onStash ran: stashReady_).
    if (stashOp_ == kPosting) stashOp_ = r;
    C4_CHECK(t_->progress());
  }
  if (!stashReady_) return standing_;
  WireHdr h;
  if (stashLen_ < sizeof(h))
    return makeError(Code::kRemoteError, "ucx: rank %d: a message from rank %d has no header", t_->rank(), peer_);
  memcpy(&h, stash_.data(), sizeof(h));
  if (h.magic != kHdrMagic)
    return makeError(Code::kRemoteError, "ucx: rank %d: rank %d sent a malformed message header", t_->rank(), peer_);
  *ready = true;
  *sig = h.sig;
  *bytes = h.bytes;
  return Status::ok();
}

void UcxConnection::fail(const Status& st) {
  if (standing_.isOk()) standing_ = st;
  for (SendMsg& m : sends_)
    if (m.err.isOk()) m.err = st;
  for (RecvMsg& m : recvs_) {
    if (m.err.isOk()) m.err = st;
    // Posted receives belong to the worker: cancel them (their callbacks then release dst).
    cancelOp(t_->worker(), m.firstOp);
    cancelOp(t_->worker(), m.dataOp);
  }
  cancelOp(t_->worker(), stashOp_);
}

void UcxConnection::flushEndpoint() {
  if (!ep_ || flushOp || abandonedEp_) return;
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_ep_flush_nbx(ep_, &p);
  if (UCS_PTR_IS_PTR(r)) flushOp = r;
}

void UcxConnection::closeEndpoint() {
  if (flushOp) {  // given up on: it completes inside UCX
    ucp_request_free(flushOp);
    flushOp = nullptr;
  }
  if (!ep_) return;
  if (!peerFailure_) {
    abandonedEp_ = true;
    for (auto it = sends_.begin(); it != sends_.end();) {
      auto next = std::next(it);
      if (it->inFlight > 0) {
        if (!it->finished) {
          it->finished = true;
          failRequest(it->req, it->err.isOk() ? standing_ : it->err);
          failedRequests_ = true;
        }
        abandoned_.splice(abandoned_.end(), sends_, it);
      }
      it = next;
    }
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
  ep_ = nullptr;
  if (UCS_PTR_IS_PTR(r)) closeOp = r;
}

void UcxConnection::sweep() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    SendMsg& m = *it;
    if (!m.finished && m.inFlight == 0) {
      m.finished = true;
      if (m.err.isOk()) {
        completeRequest(m.req);
      } else {
        failRequest(m.req, m.err);
        failedRequests_ = true;
      }
    }
    it = m.finished && m.inFlight == 0 ? sends_.erase(it) : std::next(it);
  }
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    RecvMsg& m = *it;
    finishRecvIfDone(m);
    if (!m.finished && !m.err.isOk() && m.inFlight == 0) {
      // Failed, and UCX no longer writes dst.
      m.finished = true;
      failRequest(m.req, m.err);
      failedRequests_ = true;
    }
    it = m.finished && m.inFlight == 0 ? recvs_.erase(it) : std::next(it);
  }
}

std::string UcxConnection::endpointTransports() const {
  if (!ep_) return {};
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (!f) return {};
  ucp_ep_print_info(ep_, f);
  fclose(f);
  // Lines "#   lane[0]:  3:sysv/memory.0 md[2] -> ...": the token after the resource index.
  std::string out, all(text, len);
  free(text);
  for (size_t at = all.find("lane["); at != std::string::npos; at = all.find("lane[", at + 1)) {
    size_t b = all.find(':', at);
    if (b == std::string::npos) break;
    b = all.find_first_not_of(' ', b + 1);
    if (b == std::string::npos) break;
    const size_t colon = all.find(':', b), space = all.find_first_of(" \n", b);
    if (colon != std::string::npos && colon < space) b = colon + 1;
    std::string tl = all.substr(b, space == std::string::npos ? std::string::npos : space - b);
    if (const size_t dot = tl.rfind('.'); dot != std::string::npos && dot > tl.find('/')) tl.resize(dot);
    if (!tl.empty() && (" " + out + " ").find(" " + tl + " ") == std::string::npos)
      out += (out.empty() ? "" : " ") + tl;
  }
  return out;
}

std::string UcxConnection::describeState() const {
  size_t s = 0, r = 0;
  for (const SendMsg& m : sends_) s += !m.finished;
  for (const RecvMsg& m : recvs_) r += !m.finished;
  const std::string tls = endpointTransports();
  return strFormat("%zu send(s), %zu receive(s) pending with rank %d over ucx%s%s%s%s", s, r, peer_,
                   tls.empty() ? "" : " (", tls.c_str(), tls.empty() ? "" : ")",
                   standing_.isOk() ? "" : " (connection failed)");
}

// ---- transport -------------------------------------------------------------------------------------

Status UcxTransportImpl::startWorker(std::vector<char>* address) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return makeError(Code::kSystemError, "ucx: cannot read UCX's configuration: %s", ucsText(s));
  // A dead peer on a transport without a connection to lose (shared memory) is found by
  // keepalive; UCX's default period is too long for a collective library: 1 s unless set.
  if (getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // WAKEUP: the worker's event fd (waitFd), so that an idle rank blocks until UCX has work
  // instead of sleeping through it.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.name = "c4comm";
  installUcxLogHandler();
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    return makeError(Code::kSystemError, "ucx: rank %d: UCX could not be initialized: %s", ctx_.rank, ucsText(s));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    return makeError(Code::kSystemError, "ucx: rank %d: cannot create a UCX worker: %s", ctx_.rank, ucsText(s));
  }
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // polled only, as before
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(worker_, &addr, &len);
  if (s != UCS_OK) return makeError(Code::kSystemError, "ucx: rank %d: no worker address: %s", ctx_.rank, ucsText(s));
  address->assign(reinterpret_cast<const char*>(addr), reinterpret_cast<const char*>(addr) + len);
  ucp_worker_release_address(worker_, addr);
  return Status::ok();
}

Status UcxTransportImpl::setup() {
  // Every rank takes part in the exchanges whatever happens here: a rank whose UCX cannot start
  // tells the others (a length of kFailed), so all fail together instead of waiting for it (under
  // C4_TRANSPORT=auto they then fall back to the next transport together).
  std::vector<char> mine;
  Status local = startWorker(&mine);
  constexpr uint64_t kFailed = ~uint64_t{0};
  const size_t n = static_cast<size_t>(ctx_.nranks);
  // Per rank: its address's length, its pid and its pid namespace.
  std::vector<uint64_t> facts(3 * n, 0);
  uint64_t* f = &facts[3 * static_cast<size_t>(ctx_.rank)];
  f[0] = local.isOk() ? mine.size() : kFailed;
  f[1] = static_cast<uint64_t>(getpid());
  f[2] = pidNamespaceId();
  C4_CHECK(ctx_.oob->allGather(facts.data(), 3 * sizeof(uint64_t)));
  if (!local.isOk()) return local;
  std::vector<uint64_t> lens(n);
  pids_.resize(n);
  pidNs_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    lens[r] = facts[3 * r];
    pids_[r] = static_cast<int64_t>(facts[3 * r + 1]);
    pidNs_[r] = static_cast<int64_t>(facts[3 * r + 2]);
  }
  for (size_t r = 0; r < n; ++r)
    if (lens[r] == kFailed) return makeError(Code::kRemoteError, "ucx: rank %zu could not start UCX (see its log)", r);
  const size_t len = mine.size();
  // The addresses, over the bootstrap (authenticated): their lengths (above), then the padded addresses.
  const uint64_t most = *std::max_element(lens.begin(), lens.end());
  if (most > (1u << 20))
    return makeError(Code::kRemoteError, "ucx: rank %d: a worker address of %llu bytes", ctx_.rank,
                     static_cast<unsigned long long>(most));
  std::vector<char> all(n * most, 0);
  memcpy(all.data() + static_cast<size_t>(ctx_.rank) * most, mine.data(), len);
  C4_CHECK(ctx_.oob->allGather(all.data(), most));
  addrs_.resize(n);
  for (size_t r = 0; r < n; ++r) addrs_[r].assign(all.data() + r * most, all.data() + r * most + lens[r]);
  postAbortReceive();
  lastProgressMs_ = nowMs();
  C4_INFO(kLogNet, "ucx: rank %d ready (worker address %zu bytes, inline up to %zu bytes)", ctx_.rank, len, inline_);
  return Status::ok();
}

void UcxTransportImpl::onAbortNotice(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* t = static_cast<UcxTransportImpl*>(user);
  // The info lives in the request: read it before the request goes back to UCX.
  const size_t len = status == UCS_OK ? info->length : 0;
  ucp_request_free(request);
  t->abortOp_ = nullptr;
  if (status != UCS_OK) return;  // cancelled at shutdown
  // The sender's rank leads the notice (the tag's copy of it is not reliable in every UCX release).
  int32_t from = -1;
  const size_t n = std::min(len, kAbortBytes);
  if (n >= sizeof(from)) {
    memcpy(&from, t->abortBuf_, sizeof(from));
    t->notices_.emplace_back(from, std::string(t->abortBuf_ + sizeof(from), n - sizeof(from)));
  }
  if (t->abortStatus_.isOk()) t->postAbortReceive();
}

void UcxTransportImpl::postAbortReceive() {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &UcxTransportImpl::onAbortNotice;
  p.user_data = this;
  // A notice already here completes inside the call, and onAbortNotice posts the next receive.
  abortOp_ = kPosting;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, abortBuf_, kAbortBytes, kCtrlBit, kCtrlBit, &p);
  if (abortOp_ == kPosting) abortOp_ = UCS_PTR_IS_PTR(r) ? r : nullptr;
}

Status UcxTransportImpl::connect(int peer, Connection** out) {
  if (!canConnect(peer))
    return makeError(Code::kInvalidArgument, "ucx: rank %d cannot connect to rank %d", ctx_.rank, peer);
  if (!abortStatus_.isOk()) return abortStatus_;
  auto& c = conns_[static_cast<size_t>(peer)];
  if (!c) {
    // C4_UCX_PEER_FAILURE=1: a peer of this host whose pid this rank can see is watched as a
    // process, which leaves UCX free to use shared memory with it (UCX 1.13 has no shared-memory
    // transport that handles peer failure); any other peer's endpoint handles it in UCX.
    const size_t me = static_cast<size_t>(ctx_.rank), p = static_cast<size_t>(peer);
    const bool local = ctx_.hostIds.size() == pids_.size() && ctx_.hostIds[me] == ctx_.hostIds[p] && pidNs_[me] != 0 &&
                       pidNs_[me] == pidNs_[p];
    const bool handled = peerFailure_ == 2 || (peerFailure_ == 1 && !local);
    const int watchPid = peerFailure_ == 1 && local && pids_[p] != pids_[me] ? static_cast<int>(pids_[p]) : -1;
    watching_ |= watchPid > 0;
    c = std::make_unique<UcxConnection>(this, peer, handled, watchPid);
  }
  C4_CHECK(c->open());
  *out = c.get();
  return Status::ok();
}

Status UcxTransportImpl::progress() {
  if (!abortStatus_.isOk()) return abortStatus_;
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
  }
  for (auto& [from, reason] : notices_) {
    if (from < 0 || from >= ctx_.nranks || !conns_[static_cast<size_t>(from)]) continue;
    peerGone(*conns_[static_cast<size_t>(from)],
             makeError(Code::kRemoteError, "ucx: rank %d: rank %d aborted: %s", ctx_.rank, from, reason.c_str()),
             /*exited=*/false);
  }
  notices_.clear();
  if (watching_) watchPeers();
  // A broken connection is reported once the requests it failed are failed (never while UCX may
  // still write a buffer its caller would then free).
  Status first;
  bool pending = false;
  for (auto& c : conns_) {
    if (!c) continue;
    if (c->closeOp && ucp_request_check_status(c->closeOp) != UCS_INPROGRESS) {
      ucp_request_free(c->closeOp);
      c->closeOp = nullptr;
    }
    if (c->closeAtMs != 0 && nowMs() >= c->closeAtMs) {
      c->closeAtMs = 0;
      c->closeEndpoint();
    }
    c->sweep();
    pending |= c->busy();
    if (first.isOk() && !c->standing().isOk() && c->failedRequests() && !c->busy()) first = c->standing();
  }
  // Standalone use (tests): give up on work that sees no progress for ctx.timeoutMs.
  if (pending && ctx_.timeoutMs > 0 && nowMs() - lastProgressMs_ > ctx_.timeoutMs) {
    for (auto& c : conns_)
      if (c && c->busy())
        c->fail(makeError(Code::kRemoteError, "ucx: rank %d: no progress for %lld ms; %s", ctx_.rank,
                          static_cast<long long>(ctx_.timeoutMs), c->describeState().c_str()));
    lastProgressMs_ = nowMs();
  }
  return first;
}

void UcxTransportImpl::peerGone(UcxConnection& c, const Status& why, bool exited) {
  // An aborting rank settles for up to 0.5 s (flush) + 2 s (shutdown): its receives that had
  // asked for a payload finish meanwhile.
  constexpr int64_t kAbortGraceMs = 3000;
  notePeerLost();
  c.fail(why);
  if (c.peerFailure() || exited)
    c.closeEndpoint();
  else if (c.closeAtMs == 0)
    c.closeAtMs = nowMs() + kAbortGraceMs;
}

void UcxTransportImpl::watchPeers() {
  // As often as the shm transport looks (C4_SHM_LIVENESS_MS's default). Idle connections too: a
  // receive from any source only peeks at them, and must still fail naming a peer that died.
  constexpr int64_t kWatchMs = 100;
  const int64_t now = nowMs();
  if (now - lastWatchMs_ < kWatchMs) return;
  lastWatchMs_ = now;
  for (auto& c : conns_) {
    if (!c || c->watch().pid() <= 0 || (!c->busy() && !c->standing().isOk()) || !c->watch().exited()) continue;
    if (!c->standing().isOk()) {  // failed already (it aborted, say): nothing of it is pending any more
      c->closeAtMs = 0;
      c->closeEndpoint();
      continue;
    }
    peerGone(*c,
             makeError(Code::kRemoteError, "ucx: rank %d: rank %d (pid %d on this host) exited", ctx_.rank, c->peer(),
                       c->watch().pid()),
             /*exited=*/true);
  }
}

void UcxTransportImpl::shutdown(const Status& why) {
  for (auto& c : conns_) {
    if (!c) continue;
    c->fail(why);
    c->closeEndpoint();
  }
  cancelOp(worker_, abortOp_);
  // Until UCX lets go of every buffer (bounded: these are local operations).
  auto settled = [this] {
    for (auto& c : conns_) {
      if (!c) continue;
      if (c->closeOp && ucp_request_check_status(c->closeOp) != UCS_INPROGRESS) {
        ucp_request_free(c->closeOp);
        c->closeOp = nullptr;
      }
      c->sweep();
      if (c->busy() || c->closeOp) return false;
    }
    return abortOp_ == nullptr;
  };
  progressUntil(settled, 2000);
}

void UcxTransportImpl::flushAll(int64_t ms) {
  for (auto& c : conns_)
    if (c) c->flushEndpoint();
  progressUntil(
      [this] {
        for (auto& c : conns_)
          if (c && c->flushOp && ucp_request_check_status(c->flushOp) == UCS_INPROGRESS) return false;
        return true;
      },
      ms);
  for (auto& c : conns_)
    if (c && c->flushOp && ucp_request_check_status(c->flushOp) != UCS_INPROGRESS) {
      ucp_request_free(c->flushOp);
      c->flushOp = nullptr;
    }
}

void UcxTransportImpl::abort(const std::string& reason) {
  if (!abortStatus_.isOk() || worker_ == nullptr) return;
  // Tell the peers (best effort, bounded), then fail everything here.
  std::vector<void*> notes;
  std::string notice(sizeof(int32_t), '\0');
  const int32_t me = ctx_.rank;
  memcpy(&notice[0], &me, sizeof(me));
  notice += reason.substr(0, kAbortBytes - sizeof(me));
  // Every peer with an endpoint hears it, also one whose connection this rank failed already (a
  // mismatched message fails the connection, not the endpoint: that peer may still be sending).
  for (auto& c : conns_) {
    if (!c || !c->ep() || c->endpointAbandoned()) continue;
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_send_nbx(c->ep(), notice.data(), notice.size(),
                                          kCtrlBit | (static_cast<ucp_tag_t>(ctx_.rank) << kSeqBits), &p);
    if (UCS_PTR_IS_PTR(r)) notes.push_back(r);
  }
  flushAll(500);
  for (void* r : notes) ucp_request_free(r);
  abortStatus_ = makeError(Code::kRemoteError, "ucx: rank %d aborted: %s", ctx_.rank, reason.c_str());
  shutdown(abortStatus_);
}

UcxTransportImpl::~UcxTransportImpl() {
  if (worker_) {
    // What was sent reaches the peers first (a peer that is gone cannot hold this up for more than
    // a moment); then the endpoints close, releasing anything left.
    flushAll(2000);
    shutdown(makeError(Code::kRemoteError, "ucx: rank %d: the transport was destroyed", ctx_.rank));
    // The worker first: it may still call back into the abandoned sends its endpoints held.
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    conns_.clear();
  }
  if (context_) ucp_cleanup(context_);
}

Status UcxTransportImpl::registerMemory(const void* base, size_t bytes, MemSpace space,
                                        std::unique_ptr<MemRegion>* out) {
  if (!(kHostSpaces & spaceBit(space))) {
    // Device memory reaches this transport only staged through host memory: nothing to register.
    *out = std::make_unique<UcxRegion>(base, bytes, space, nullptr);
    return Status::ok();
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(base);
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  if (bytes > 0) {
    ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK)
      return makeError(Code::kSystemError, "ucx: rank %d: cannot register %zu bytes: %s", ctx_.rank, bytes, ucsText(s));
  }
  *out = std::make_unique<UcxRegion>(base, bytes, space, memh);
  return Status::ok();
}

Status UcxTransportImpl::deregisterMemory(MemRegion* region) {
  auto* r = dynamic_cast<UcxRegion*>(region);
  if (r && r->memh()) {
    ucs_status_t s = ucp_mem_unmap(context_, r->memh());
    if (s != UCS_OK) return makeError(Code::kSystemError, "ucx: rank %d: cannot deregister: %s", ctx_.rank, ucsText(s));
  }
  return Status::ok();
}

}  // namespace

bool ucxComponentsReachRdma(const std::vector<std::pair<std::string, unsigned>>& components) {
  for (const auto& [name, mds] : components)
    if (name == "ib" && mds > 0) return true;
  return false;
}

bool ucxAutoEnabled() {
  if (paramUcxAuto() == 0) return false;
  static const bool rdma = [] {
    std::vector<std::pair<std::string, unsigned>> found;
    uct_component_h* list = nullptr;
    unsigned n = 0;
    if (uct_query_components(&list, &n) != UCS_OK) return false;
    for (unsigned i = 0; i < n; ++i) {
      uct_component_attr_t a{};
      a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
      if (uct_component_query(list[i], &a) == UCS_OK) found.emplace_back(a.name, a.md_resource_count);
    }
    uct_release_component_list(list);
    const bool yes = ucxComponentsReachRdma(found);
    C4_INFO(kLogNet, "ucx: UCX %s an RDMA device%s", yes ? "reaches" : "reaches no",
            yes ? ": a candidate between hosts under C4_TRANSPORT=auto (after ibverbs)" : "");
    return yes;
  }();
  return rdma;
}

void installUcxLogHandler() {
  static std::once_flag pushed;
  std::call_once(pushed, [] { ucs_log_push_handler(afterDeathLog); });
}

Status createUcxTransport(const Context& ctx, std::unique_ptr<Transport>* out) {
  if (ctx.nranks > (1 << kRankBits))
    return makeError(Code::kInvalidArgument, "ucx: %d ranks; the transport's tags hold at most %d", ctx.nranks,
                     1 << kRankBits);
  auto t = std::make_unique<UcxTransportImpl>(ctx);
  C4_CHECK(t->setup());
  *out = std::move(t);
  return Status::ok();
}

}  // namespace c4::transport
