// Shared-memory transport: see shm_transport.hpp for the overview and docs/shm-transport.md for
// the design, the protocol and the measurements behind the defaults.
#include "transports/shm/shm_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/process.hpp"
#include "common/status.hpp"
#include "kernels/host/reduce.hpp"
#include "transports/transport_util.hpp"

namespace c4::transport {

namespace {

constexpr uint64_t kSegmentMagic = 0x63346d68735f7631ull;  // "c4shm_v1"
constexpr uint64_t kProbeMagic = 0x70726f6265636d61ull;
constexpr size_t kHeaderBytes = 4096;
// Shared arena for one-shot small collectives (see HostArena), between the header
// page and the channels.
constexpr size_t kArenaBytes = 40960;
constexpr size_t kReasonBytes = 1024;
constexpr size_t kSlotHeaderBytes = 64;
// A channel starts with the receiver's control line, then a spare line so that the adjacent-line
// prefetcher does not pull the control line into the sender's cache with the first slot.
constexpr size_t kSlotsOffset = 128;
constexpr size_t kPageBytes = 4096;
// Ring slots sized automatically (C4_SHM_SLOT_BYTES=0) start at kMaxAutoSlot and halve until every
// channel of the host fits the budget: 2 GiB, or less where /dev/shm has less room. Below
// kMinAutoSlot the rings are not worth it: same-host peers then go over the network transport.
constexpr uint64_t kMaxAutoSlot = 512u << 10;
constexpr uint64_t kMinAutoSlot = 8u << 10;
constexpr uint64_t kHostRingBudget = uint64_t{2} << 30;

/// Bytes /dev/shm can still take (UINT64_MAX where it cannot be asked).
uint64_t shmFreeBytes() {
  struct statvfs v;
  if (statvfs("/dev/shm", &v) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

// Slot kinds. A message is either kFirst followed by kNext pieces (data in the ring), or one
// kSingle descriptor that the receiver answers by pulling from the sender's buffer.
enum SlotKind : uint32_t { kFirst = 1, kNext = 2, kSingle = 3 };

/// First page of every segment. Written by its owner; read by peers.
struct SegmentHeader {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  int32_t nranks;
  int32_t pad;
  uint64_t slotBytes;
  uint64_t numSlots;
  uint32_t aborted;  // set (release) once reason is written
  uint32_t closed;   // set (release) when the owner's transport is destroyed
  char reason[kReasonBytes];
  // The CPU the owner last ran on while idle, plus one (0: not known); see peerSharesCpu. On its
  // own line: the owner rewrites it while peers read the lines above.
  alignas(64) uint32_t cpu;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes, "header must fit its page");

/// Receiver-written control line of a channel.
struct ChannelCtl {
  uint64_t tail;        // slots consumed (released to the sender)
  uint64_t singleDone;  // single-copy messages fully pulled (acknowledges the sender's buffer)
};

/// Header of one ring slot; the payload follows it.
struct SlotHeader {
  uint64_t flag;        // n + 1 once the slot holds the n-th piece of the channel; written last
  uint64_t totalBytes;  // message size (kFirst, kSingle)
  OpSig sig;            // (kFirst, kSingle)
  uint32_t kind;        // SlotKind
  uint32_t pieceBytes;  // payload bytes in this slot
  uint64_t addr;        // sender's buffer address (kSingle)
  uint64_t pad;
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes, "slot header is one cache line");

template <class T>
T loadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <class T>
void storeRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

using detail::coarseNowMs;

using detail::nowNs;

/// One mapped segment. Ranks of one process share it through the registry, so a thread rank's
/// view of a peer stays valid even if that peer's transport is destroyed first.
struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base) munmap(base, bytes);
  }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base); }
  char* channel(int sender, size_t channelBytes) const {
    return static_cast<char*>(base) + kHeaderBytes + kArenaBytes + static_cast<size_t>(sender) * channelBytes;
  }
};

// Segments created in this process, by name (lets thread ranks share mappings without fds).
std::mutex& registryMu() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::string, std::weak_ptr<Mapping>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Mapping>>();
  return *r;
}

std::string segmentName(const std::string& tag, int rank) { return "/c4shm-" + tag + "-" + std::to_string(rank); }

/// What each rank publishes during setup (two rounds; unused fields are zero).
struct SetupInfo {
  uint64_t magic;
  uint64_t probeAddr;
  uint64_t slotBytes;
  uint64_t numSlots;
  int32_t pid;
  int32_t created;   // round 1: segment created and mapped
  int32_t mapped;    // round 2: every same-host peer's segment mapped
  int32_t cmaOk;     // round 2: process_vm_readv from a peer process worked (or nothing to probe)
  uint64_t process;  // processToken(): ranks of one process share mappings (equal pids may not)
  uint64_t pidNs;    // pidNamespaceId(): the pid is usable (CMA, process watch) only in the same one
};

class ShmTransport;

struct SendOp {
  const char* buf;
  size_t bytes;
  OpSig sig;
  Request* req;
  size_t off;
  bool started;
  bool single;
  size_t ready;  // bytes of buf that hold data: `bytes`, or up to what a forwarding receive produced
  uint64_t id;   // per connection, to find the forward of a receive (see irecvForward)
};

class ShmConnection;

struct RecvOp {
  char* dst;
  size_t bytes;
  OpSig sig;
  ReduceSpec red;
  bool hasRed;
  Request* req;
  size_t off;
  bool started;
  bool single;
  uint64_t addr;       // sender's buffer (single copy)
  ShmConnection* fwd;  // irecvForward: the connection the bytes go on to (null: a plain receive)
  uint64_t fwdId;      // the forward's SendOp::id there
};

struct AckWait {
  Request* req;
  uint64_t index;  // completes once the receiver's singleDone reaches it
};

class ShmConnection final : public Connection, public Forwarding {
 public:
  /// Ok unless the peer aborted, closed its transport or exited.
  Status health();
  ShmConnection(ShmTransport* t, int peer, int peerPid, bool sameProcess, std::shared_ptr<Mapping> peerSeg, char* out,
                char* in);

  int peer() const override { return peer_; }
  Status isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint = {}) override;
  Status irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) override;
  Status peek(bool* ready, OpSig* sig, size_t* bytes) override;
  const Lane* lane(int i) const override { return i == 0 ? &lane_ : nullptr; }
  Forwarding* forwarding() override { return this; }
  // Forwarding
  bool canForward(const Connection* to, size_t bytes, SendHint hint) const override;
  Status irecvForward(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req,
                      Connection* to, const OpSig& toSig, Request* toReq) override;
  std::string describeState() const override {
    return strFormat("%zu send(s), %zu receive(s) pending with %s over shared memory%s%s", sends_.size() + acks_.size(),
                     recvs_.size(), peerText().c_str(),
                     broken_.isOk() ? "" : "; broken: ", broken_.isOk() ? "" : broken_.message().c_str());
  }

  bool pending() const { return !sends_.empty() || !acks_.empty() || !recvs_.empty(); }
  /// One pass over both directions; true if anything moved. Failures break the connection.
  bool progressOnce();
  /// Called when a pass moved nothing while requests are pending: abort flags, liveness, timeout.
  void checkStalled(int64_t now);
  /// Fails every pending request with `st` and rejects later ones.
  void fail(const Status& st);
  const Status& broken() const { return broken_; }
  bool inActiveList = false;

 private:
  char* slotAt(char* channel, uint64_t n) const;
  /// Appends a receive (with its forward's connection and SendOp::id, or null and 0).
  void queueRecv(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req, ShmConnection* fwd,
                 uint64_t fwdId);
  /// True if a message of `bytes` sent with `hint` goes by single copy.
  bool sendsSingle(size_t bytes, SendHint hint) const;
  /// Forwarding (irecvForward) as seen from the forward's connection: the pending send `id`, or
  /// null once it is gone (sent or failed).
  SendOp* findSend(uint64_t id);
  /// The payload of the next outbound slot if `f` may put its piece at `off` there now (it is first
  /// in line, has sent everything before `off`, and the ring has room); else null.
  char* forwardSlot(SendOp& f, size_t off);
  /// Publishes the next piece of `op` (`n` bytes, already in the next outbound slot's payload).
  void publishPiece(SendOp& op, size_t n);
  /// Hands the bytes a forwarding receive has produced so far (its `off`) to its forward.
  static void advanceForward(const RecvOp& op);
  /// One piece of a receive: dst = incoming (or reduced), and into the forward's slot if it has one.
  void consumePiece(RecvOp& op, const char* src, size_t n);
  bool progressSend();
  bool progressRecv();
  bool pullSingle(RecvOp& op);
  Status matchError(const SlotHeader& h, const RecvOp& op) const;
  Status protocolError(const char* what) const;
  std::string peerText() const;
  bool peerExited();

  ShmTransport* t_;
  int peer_;
  int peerPid_;
  bool samePid_;
  ProcessWatch watch_;  // the peer's process (not watched in this very process)
  std::shared_ptr<Mapping> peerSeg_;
  SegmentHeader* peerHdr_;
  ChannelCtl* outCtl_;  // in the peer's segment, written by the peer
  char* out_;           // channel rank -> peer (in the peer's segment)
  ChannelCtl* inCtl_;   // in our segment, written by us
  char* in_;            // channel peer -> rank (in our segment)

  // Send side.
  uint64_t sent_ = 0;       // slots filled
  uint64_t tailCache_ = 0;  // last seen outCtl_->tail
  uint64_t singles_ = 0;    // single-copy descriptors posted
  uint64_t sendIds_ = 0;    // SendOp::id of the last send queued
  std::deque<SendOp> sends_;
  std::deque<AckWait> acks_;
  // Receive side.
  uint64_t consumed_ = 0;    // slots consumed (mirrors inCtl_->tail)
  uint64_t singleDone_ = 0;  // mirrors inCtl_->singleDone
  std::deque<RecvOp> recvs_;

  Status broken_;
  Lane lane_{0};              // the one lane: the ring pair (statistics only)
  int64_t stallSinceMs_ = 0;  // 0: not known to be stalled
  int64_t lastLivenessMs_ = 0;
};

class ShmTransport final : public Transport, public HostArena, public CpuSharing {
 public:
  explicit ShmTransport(const Context& ctx);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }
  Caps caps() const override;
  bool canConnect(int peer) const override;
  Status connect(int peer, Connection** out) override;
  Status progress() override;
  void abort(const std::string& reason) override;
  Status peerHealth(int peer) override;
  uint64_t progressCount() const override { return moved_; }
  HostArena* hostArena() override { return this; }
  CpuSharing* cpuSharing() override { return this; }

  // HostArena
  char* arena(int rank) override {
    if (rank < 0 || rank >= nranks_ || segs_.size() != static_cast<size_t>(nranks_) || !segs_[rank]) return nullptr;
    return static_cast<char*>(segs_[rank]->base) + kHeaderBytes;
  }
  size_t arenaBytes() const override { return kArenaBytes; }
  // CpuSharing
  void publishCpu() override { (void)ownCpu(); }
  bool peerSharesCpu() override;
  std::string takeNote() override { return std::move(note_); }

  Status setup();

  // Shared with connections.
  int rank() const { return rank_; }
  uint64_t slotBytes() const { return slotBytes_; }
  uint64_t numSlots() const { return numSlots_; }
  size_t payloadBytes() const { return slotBytes_ - kSlotHeaderBytes; }
  bool singleCopyTo(bool samePid) const { return singleCopy_ && (samePid || cmaOk_); }
  size_t singleThreshold(bool samePid) const { return samePid ? localCopyThreshold_ : singleThreshold_; }
  size_t cmaPiece() const { return cmaPiece_; }
  size_t cmaChunk() const { return cmaChunk_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  int64_t livenessMs() const { return livenessMs_; }
  const char* hostname() const { return hostname_; }
  const Status& abortStatus() const { return abortStatus_; }
  char* staging();
  void noteError(const Status& st) {
    if (firstError_.isOk()) firstError_ = st;
  }
  void activate(ShmConnection* c) {
    if (!c->inActiveList) {
      c->inActiveList = true;
      active_.push_back(c);
    }
  }

 private:
  int localRanks() const;
  /// Publishes and returns this thread's CPU plus one (0: unknown).
  uint32_t ownCpu();
  /// Called while this rank shares `cpu` with lower rank `peer` (see peerSharesCpu).
  void spreadFrom(int cpu, int peer);

  int rank_;
  int nranks_;
  std::string tag_;
  std::vector<uint64_t> hostIds_;
  Oob* oob_;
  int64_t timeoutMs_;
  int pid_;
  char hostname_[64] = {0};

  uint64_t slotBytes_;
  uint64_t numSlots_;
  size_t channelBytes_ = 0;
  size_t segmentBytes_ = 0;
  bool singleCopy_;
  bool cmaOk_ = false;
  bool spread_ = false;        // C4_SHM_SPREAD, and no more local ranks than CPUs
  int64_t sharedSinceNs_ = 0;  // since when this rank shares its CPU with a lower rank (0: not)
  int64_t lastMoveNs_ = 0;
  std::string note_;  // for takeNote
  size_t singleThreshold_;
  size_t localCopyThreshold_;
  size_t cmaPiece_;
  size_t cmaChunk_;
  int64_t livenessMs_;

  std::string name_;
  bool created_ = false;
  bool unlinked_ = false;
  std::shared_ptr<Mapping> own_;
  std::vector<std::shared_ptr<Mapping>> segs_;  // by rank; null for other hosts
  std::vector<int32_t> pids_;                   // by rank: usable here, else 0 (another pid namespace)
  std::vector<char> sameProcess_;               // by rank: a rank of this very process
  std::vector<std::unique_ptr<ShmConnection>> conns_;
  std::vector<ShmConnection*> active_;  // connections that may have pending requests
  std::vector<char> staging_;
  Status firstError_;
  Status abortStatus_;
  uint64_t probeWord_;
  uint64_t moved_ = 0;  // rounds in which a connection moved data (progressCount)
};

// ---------------------------------------------------------------------------------------------
// ShmConnection

ShmConnection::ShmConnection(ShmTransport* t, int peer, int peerPid, bool sameProcess, std::shared_ptr<Mapping> peerSeg,
                             char* out, char* in)
    : t_(t),
      peer_(peer),
      peerPid_(peerPid),
      samePid_(sameProcess),
      watch_(samePid_ ? -1 : peerPid),
      peerSeg_(std::move(peerSeg)),
      peerHdr_(peerSeg_->header()),
      outCtl_(reinterpret_cast<ChannelCtl*>(out)),
      out_(out),
      inCtl_(reinterpret_cast<ChannelCtl*>(in)),
      in_(in) {
  // One connection object per peer for the transport's life, so both rings start at zero.
  lane_.setEndpoints(0, "shm", strFormat("pid %d", peerPid_));
  lane_.setState(LaneState::kUp);
}

std::string ShmConnection::peerText() const {
  return strFormat("rank %d (pid %d on %s)", peer_, peerPid_, t_->hostname());
}

char* ShmConnection::slotAt(char* channel, uint64_t n) const {
  return channel + kSlotsOffset + (n % t_->numSlots()) * t_->slotBytes();
}

Status ShmConnection::isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint) {
  const Status& ab = t_->abortStatus();
  C4_CHECK(startSend("shm", peer_, !ab.isOk() ? ab : broken_, buf, bytes, req));
  // Single copy: the receiver reads straight from buf. Between processes only where the plan asks
  // for it: a receive that reduces would need CMA into staging and a second pass, slower than
  // reducing out of the ring's shared slots (docs/shm-transport.md). Within a process the reader
  // reduces straight from buf, which always wins.
  sends_.push_back(SendOp{buf.bytes(), bytes, sig, req, 0, false, sendsSingle(bytes, hint), bytes, ++sendIds_});
  t_->activate(this);
  return Status::ok();
}

void ShmConnection::queueRecv(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req,
                              ShmConnection* fwd, uint64_t fwdId) {
  recvs_.push_back(RecvOp{static_cast<char*>(dst), bytes, sig, red ? *red : ReduceSpec{}, red != nullptr, req, 0, false,
                          false, 0, fwd, fwdId});
}

bool ShmConnection::sendsSingle(size_t bytes, SendHint hint) const {
  return bytes > t_->singleThreshold(samePid_) && t_->singleCopyTo(samePid_) && (samePid_ || hint.singleCopy);
}

Status ShmConnection::irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) {
  const Status& ab = t_->abortStatus();
  C4_CHECK(startRecv("shm", peer_, !ab.isOk() ? ab : broken_, dst, bytes, red, req));
  queueRecv(dst.ptr, bytes, sig, red, req, nullptr, 0);
  t_->activate(this);
  return Status::ok();
}

Status ShmConnection::peek(bool* ready, OpSig* sig, size_t* bytes) {
  *ready = false;
  const Status& ab = t_->abortStatus();
  if (!ab.isOk()) return ab;
  if (!broken_.isOk()) return broken_;
  if (!recvs_.empty()) return Status::ok();
  // The sender writes a message's first slot (kFirst or kSingle) whole before it publishes the
  // flag, so a published flag means header and signature are there.
  const auto* h = reinterpret_cast<const SlotHeader*>(slotAt(in_, consumed_));
  if (loadAcquire(&h->flag) != consumed_ + 1) return Status::ok();
  if (h->kind != kFirst && h->kind != kSingle) {
    Status st = protocolError("expected the first piece of a message");
    fail(st);
    return st;
  }
  *sig = h->sig;
  *bytes = h->totalBytes;
  *ready = true;
  return Status::ok();
}

// Forwarding. The forward is an ordinary streamed send queued on `to` whose data is not there
// yet: SendOp::ready says how much of it the receive has produced, and progressSend sends no
// further. While the forward is first in line on `to` and has sent everything so far, the receive
// writes each incoming piece straight into `to`'s next slot as well as into dst (consumePiece),
// which saves the separate copy of dst into the slot. Otherwise the piece goes to dst only and
// progressSend copies it on later. A receive whose connection breaks leaves its forward waiting;
// the transport's error ends the run (progress() returns it).
bool ShmConnection::canForward(const Connection* to, size_t bytes, SendHint hint) const {
  const auto* c = dynamic_cast<const ShmConnection*>(to);
  return c && c->t_ == t_ && !c->sendsSingle(bytes, hint);
}

Status ShmConnection::irecvForward(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red,
                                   Request* req, Connection* to, const OpSig& toSig, Request* toReq) {
  auto* f = dynamic_cast<ShmConnection*>(to);
  if (!f || f->t_ != t_)
    return makeError(Code::kInternalError, "shm: rank %d cannot forward a receive from rank %d to another transport",
                     t_->rank(), peer_);
  const Status& ab = t_->abortStatus();
  C4_CHECK(startSend("shm", f->peer_, !ab.isOk() ? ab : f->broken_, dst, bytes, toReq));
  Status st = startRecv("shm", peer_, !ab.isOk() ? ab : broken_, dst, bytes, red, req);
  if (!st.isOk()) {
    failRequest(toReq, st);
    return st;
  }
  f->sends_.push_back(SendOp{dst.bytes(), bytes, toSig, toReq, 0, false, false, 0, ++f->sendIds_});
  queueRecv(dst.ptr, bytes, sig, red, req, f, f->sendIds_);
  t_->activate(f);
  t_->activate(this);
  return Status::ok();
}

SendOp* ShmConnection::findSend(uint64_t id) {
  for (SendOp& s : sends_) {
    if (s.id == id) return &s;
    if (s.id > id) break;
  }
  return nullptr;
}

char* ShmConnection::forwardSlot(SendOp& f, size_t off) {
  if (!broken_.isOk() || &sends_.front() != &f || f.off != off) return nullptr;
  if (sent_ - tailCache_ >= t_->numSlots()) {
    tailCache_ = loadAcquire(&outCtl_->tail);
    if (sent_ - tailCache_ >= t_->numSlots()) return nullptr;
  }
  return slotAt(out_, sent_) + kSlotHeaderBytes;
}

void ShmConnection::publishPiece(SendOp& op, size_t n) {
  auto* h = reinterpret_cast<SlotHeader*>(slotAt(out_, sent_));
  if (!op.started) {
    h->totalBytes = op.bytes;
    h->sig = op.sig;
    h->kind = kFirst;
    op.started = true;
  } else {
    h->kind = kNext;
  }
  h->pieceBytes = static_cast<uint32_t>(n);
  storeRelease(&h->flag, ++sent_);
  op.off += n;
  lane_.addSent(n);
  stallSinceMs_ = 0;  // a forwarding receive on another connection may have written it
  if (op.off == op.bytes) {
    completeRequest(op.req);  // eager: the data now lives in the peer's ring
    sends_.pop_front();
  }
}

void ShmConnection::advanceForward(const RecvOp& op) {
  if (!op.fwd) return;
  if (SendOp* f = op.fwd->findSend(op.fwdId)) f->ready = op.off;
}

// Blocks of a fused piece: reduced into dst, then copied to the forward's slot while in L1.
constexpr size_t kForwardBlock = 16384;

void ShmConnection::consumePiece(RecvOp& op, const char* src, size_t n) {
  char* dst = op.dst + op.off;
  const char* local = op.hasRed ? op.red.local.bytes() + op.off : nullptr;
  const size_t es = op.hasRed ? dataTypeSize(op.red.dtype) : 1;
  SendOp* f = op.fwd ? op.fwd->findSend(op.fwdId) : nullptr;
  char* slot = f ? op.fwd->forwardSlot(*f, op.off) : nullptr;
  if (slot) {
    for (size_t b = 0; b < n; b += kForwardBlock) {
      const size_t m = std::min(kForwardBlock, n - b);
      if (op.hasRed)
        kernels::reduce(dst + b, local + b, src + b, m / es, op.red.dtype, kernels::toKOp(op.red.op));
      else
        memcpy(dst + b, src + b, m);
      memcpy(slot + b, dst + b, m);
    }
  } else if (op.hasRed) {
    kernels::reduce(dst, local, src, n / es, op.red.dtype, kernels::toKOp(op.red.op));
  } else {
    memcpy(dst, src, n);
  }
  op.off += n;
  lane_.addRecv(n);
  if (!f) return;
  f->ready = op.off;
  if (slot) op.fwd->publishPiece(*f, n);  // may complete and drop f
}

bool ShmConnection::progressSend() {
  bool moved = false;
  const uint64_t slots = t_->numSlots();
  const size_t payload = t_->payloadBytes();
  while (!sends_.empty()) {
    if (sent_ - tailCache_ >= slots) {
      tailCache_ = loadAcquire(&outCtl_->tail);
      if (sent_ - tailCache_ >= slots) break;
    }
    SendOp& op = sends_.front();
    auto* h = reinterpret_cast<SlotHeader*>(slotAt(out_, sent_));
    if (op.single) {
      h->totalBytes = op.bytes;
      h->sig = op.sig;
      h->kind = kSingle;
      h->pieceBytes = 0;
      h->addr = reinterpret_cast<uint64_t>(op.buf);
      storeRelease(&h->flag, ++sent_);
      acks_.push_back(AckWait{op.req, ++singles_});
      sends_.pop_front();
      moved = true;
      continue;
    }
    const size_t n = std::min(payload, op.ready - op.off);
    if (n == 0 && op.off < op.bytes) break;  // a forward waiting for its receive
    if (n) memcpy(reinterpret_cast<char*>(h) + kSlotHeaderBytes, op.buf + op.off, n);
    publishPiece(op, n);
    moved = true;
  }
  if (!acks_.empty()) {
    uint64_t done = loadAcquire(&outCtl_->singleDone);
    while (!acks_.empty() && acks_.front().index <= done) {
      completeRequest(acks_.front().req);
      acks_.pop_front();
      moved = true;
    }
  }
  return moved;
}

Status ShmConnection::protocolError(const char* what) const {
  Status st = makeError(Code::kInvalidUsage, "shm: protocol violation from %s to rank %d: %s", peerText().c_str(),
                        t_->rank(), what);
  C4_WARN(kLogShm, "%s", st.message().c_str());
  return st;
}

Status ShmConnection::matchError(const SlotHeader& h, const RecvOp& op) const {
  return transport::matchError("shm", peer_, peerText(), t_->rank(), h.sig, h.totalBytes, op.sig, op.bytes);
}

bool ShmConnection::pullSingle(RecvOp& op) {
  const size_t es = op.hasRed ? dataTypeSize(op.red.dtype) : 1;
  const size_t budget = t_->cmaChunk();
  size_t done = 0;
  while (op.off < op.bytes && done < budget) {
    size_t n = std::min(op.bytes - op.off, op.hasRed ? t_->cmaPiece() : budget);
    char* dst = op.dst + op.off;
    const char* local = op.hasRed ? op.red.local.bytes() + op.off : nullptr;
    if (samePid_) {
      const char* src = reinterpret_cast<const char*>(op.addr) + op.off;
      if (op.hasRed)
        kernels::reduce(dst, local, src, n / es, op.red.dtype, kernels::toKOp(op.red.op));
      else
        kernels::copy(dst, src, n);
    } else {
      char* to = op.hasRed ? t_->staging() : dst;
      size_t got = 0;
      while (got < n) {
        iovec liov{to + got, n - got};
        iovec riov{reinterpret_cast<void*>(op.addr + op.off + got), n - got};
        ssize_t r = C4_SYSCALL_RETRY(process_vm_readv(peerPid_, &liov, 1, &riov, 1, 0));
        if (r <= 0) {
          int err = r < 0 ? errno : EIO;
          Status st = makeError(Code::kRemoteError,
                                "shm: rank %d could not read %zu bytes of a %zu-byte message from the buffer of %s "
                                "(process_vm_readv: %s); the peer probably died or freed the buffer",
                                t_->rank(), n - got, op.bytes, peerText().c_str(), strerror(err));
          C4_WARN(kLogShm, "%s", st.message().c_str());
          fail(st);
          return false;
        }
        got += static_cast<size_t>(r);
      }
      if (op.hasRed) kernels::reduce(dst, local, to, n / es, op.red.dtype, kernels::toKOp(op.red.op));
    }
    op.off += n;
    done += n;
    lane_.addRecv(n);
  }
  return true;
}

bool ShmConnection::progressRecv() {
  bool moved = false;
  const size_t payload = t_->payloadBytes();
  while (!recvs_.empty()) {
    RecvOp& op = recvs_.front();
    if (!op.single) {
      auto* h = reinterpret_cast<SlotHeader*>(slotAt(in_, consumed_));
      if (loadAcquire(&h->flag) != consumed_ + 1) break;
      if (!op.started) {
        if (h->kind != kFirst && h->kind != kSingle) {
          fail(protocolError("expected the first piece of a message"));
          return true;
        }
        Status st = matchError(*h, op);
        if (!st.isOk()) {
          fail(st);
          return true;
        }
        op.started = true;
        if (h->kind == kSingle) {
          op.single = true;
          op.addr = h->addr;
          storeRelease(&inCtl_->tail, ++consumed_);
          moved = true;
          continue;
        }
      } else if (h->kind != kNext) {
        fail(protocolError("expected the next piece of a message"));
        return true;
      }
      size_t n = h->pieceBytes;
      if (n > payload || n > op.bytes - op.off || (n == 0 && op.bytes != 0)) {
        fail(protocolError("piece size out of range"));
        return true;
      }
      if (n) consumePiece(op, reinterpret_cast<const char*>(h) + kSlotHeaderBytes, n);
      storeRelease(&inCtl_->tail, ++consumed_);
      moved = true;
    } else {
      if (!pullSingle(op)) return true;
      advanceForward(op);
      moved = true;
      if (op.off < op.bytes) break;  // budget spent; other connections get their turn
      storeRelease(&inCtl_->singleDone, ++singleDone_);
    }
    if (op.off == op.bytes) {
      completeRequest(op.req);
      recvs_.pop_front();
    }
  }
  return moved;
}

bool ShmConnection::progressOnce() {
  if (!broken_.isOk()) return false;
  bool moved = progressSend();
  if (broken_.isOk()) moved |= progressRecv();
  if (moved) stallSinceMs_ = 0;
  return moved;
}

bool ShmConnection::peerExited() { return watch_.exited(); }

Status ShmConnection::health() {
  if (loadAcquire(&peerHdr_->aborted)) {
    char reason[kReasonBytes];
    memcpy(reason, peerHdr_->reason, sizeof(reason));
    reason[sizeof(reason) - 1] = 0;
    return makeError(Code::kRemoteError, "shm: %s aborted (%s)", peerText().c_str(), reason);
  }
  if (loadAcquire(&peerHdr_->closed))
    return makeError(Code::kRemoteError, "shm: %s closed its transport", peerText().c_str());
  if (peerExited()) return makeError(Code::kRemoteError, "shm: %s exited", peerText().c_str());
  return Status::ok();
}

uint32_t ShmTransport::ownCpu() {
  const int cpu = sched_getcpu();  // rdpid or the vDSO: about 2 ns
  if (cpu < 0 || !own_) return 0;
  const uint32_t mine = static_cast<uint32_t>(cpu) + 1;
  uint32_t* own = &own_->header()->cpu;
  if (__atomic_load_n(own, __ATOMIC_RELAXED) != mine) __atomic_store_n(own, mine, __ATOMIC_RELAXED);
  return mine;
}

bool ShmTransport::peerSharesCpu() {
  const uint32_t mine = ownCpu();
  if (mine == 0 || segs_.size() != static_cast<size_t>(nranks_)) return false;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_ || !segs_[r]) continue;
    if (__atomic_load_n(&segs_[r]->header()->cpu, __ATOMIC_RELAXED) == mine) {
      if (r < rank_ && spread_) spreadFrom(static_cast<int>(mine) - 1, r);
      return true;
    }
  }
  sharedSinceNs_ = 0;
  return false;
}

// How long a rank shares its CPU with a lower rank before it moves (see spreadFrom).
constexpr int64_t kShareBeforeMoveNs = 200000;

void ShmTransport::spreadFrom(int cpu, int peer) {
  // Yielding keeps both ranks going, but the scheduler took ~8 ms here to spread two fresh ranks
  // that started on one CPU (every call meanwhile cost a context switch: 8-byte AllReduce 2 to
  // 3 us instead of 0.6). The higher rank of the pair moves itself to a CPU no local rank reports,
  // within its own affinity mask, and restores the mask at once: the kernel migrates it on the
  // first call and leaves it there on the second. At most once per 100 ms.
  const int64_t now = nowNs();
  if (sharedSinceNs_ == 0) {
    sharedSinceNs_ = now;
    return;
  }
  if (now - sharedSinceNs_ < kShareBeforeMoveNs || (lastMoveNs_ != 0 && now - lastMoveNs_ < 100000000)) return;
  sharedSinceNs_ = 0;
  lastMoveNs_ = now;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return;
  std::vector<bool> taken(CPU_SETSIZE, false);
  taken[static_cast<size_t>(cpu)] = true;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_ || !segs_[r]) continue;
    const uint32_t c = __atomic_load_n(&segs_[r]->header()->cpu, __ATOMIC_RELAXED);
    if (c > 0 && c <= CPU_SETSIZE) taken[c - 1] = true;
  }
  for (int i = 1; i < CPU_SETSIZE; ++i) {
    const int target = (cpu + i) % CPU_SETSIZE;
    if (!CPU_ISSET(target, &mask) || taken[static_cast<size_t>(target)]) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(target, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return;
    (void)sched_setaffinity(0, sizeof(mask), &mask);
    char text[160];
    snprintf(text, sizeof(text), "shm: rank %d shared CPU %d with rank %d for 0.2 ms while waiting: moved to CPU %d",
             rank_, cpu, peer, sched_getcpu());
    C4_INFO(kLogShm, "%s", text);
    note_ = text;
    (void)ownCpu();
    return;
  }
}

Status ShmTransport::peerHealth(int peer) {
  Connection* c = nullptr;
  C4_CHECK(connect(peer, &c));
  return static_cast<ShmConnection*>(c)->health();
}

void ShmConnection::checkStalled(int64_t now) {
  if (!broken_.isOk() || !pending()) return;
  if (stallSinceMs_ == 0) {
    stallSinceMs_ = now;
    lastLivenessMs_ = now;
  }
  size_t n = sends_.size() + acks_.size() + recvs_.size();
  if (loadAcquire(&peerHdr_->aborted)) {
    char reason[kReasonBytes];
    memcpy(reason, peerHdr_->reason, sizeof(reason));
    reason[sizeof(reason) - 1] = 0;
    Status st = makeError(Code::kRemoteError, "shm: %s aborted (%s); rank %d fails %zu pending message(s) with it",
                          peerText().c_str(), reason, t_->rank(), n);
    C4_WARN(kLogShm, "%s", st.message().c_str());
    fail(st);
    return;
  }
  bool closed = loadAcquire(&peerHdr_->closed) != 0;
  bool exited = false;
  if (!closed && now - lastLivenessMs_ >= t_->livenessMs()) {
    lastLivenessMs_ = now;
    exited = peerExited();
  }
  if (closed || exited) {
    // Everything the peer wrote before it went away is visible now: drain it before judging.
    if (progressOnce() || !broken_.isOk()) return;
    Status st = makeError(Code::kRemoteError, "shm: %s %s with %zu message(s) to or from rank %d pending",
                          peerText().c_str(), closed ? "closed its transport" : "exited", n, t_->rank());
    C4_WARN(kLogShm, "%s", st.message().c_str());
    fail(st);
    return;
  }
  // Inside a communicator its watchdog decides (timeoutMs 0); standalone, the transport does.
  if (t_->timeoutMs() > 0 && now - stallSinceMs_ > t_->timeoutMs()) {
    Status st = makeError(Code::kRemoteError,
                          "shm: no progress for %lld ms on %zu pending message(s) between rank %d and %s "
                          "(timeout C4_TIMEOUT=%lld ms)",
                          static_cast<long long>(now - stallSinceMs_), n, t_->rank(), peerText().c_str(),
                          static_cast<long long>(t_->timeoutMs()));
    C4_WARN(kLogShm, "%s", st.message().c_str());
    fail(st);
  }
}

void ShmConnection::fail(const Status& st) {
  if (broken_.isOk()) {
    broken_ = st;
    lane_.addError();
    lane_.setRetiredWhy(st.message());
    lane_.setState(LaneState::kRetired);
  }
  for (SendOp& op : sends_) failRequest(op.req, st);
  for (AckWait& a : acks_) failRequest(a.req, st);
  for (RecvOp& op : recvs_) failRequest(op.req, st);
  sends_.clear();
  acks_.clear();
  recvs_.clear();
  t_->noteError(broken_);
}

// ---------------------------------------------------------------------------------------------
// ShmTransport

ShmTransport::ShmTransport(const Context& ctx)
    : rank_(ctx.rank),
      nranks_(ctx.nranks),
      tag_(ctx.commTag),
      hostIds_(ctx.hostIds),
      oob_(ctx.oob),
      timeoutMs_(std::max<int64_t>(0, ctx.timeoutMs)),
      pid_(getpid()),
      slotBytes_(static_cast<uint64_t>(paramShmSlotBytes())),
      numSlots_(static_cast<uint64_t>(paramShmSlots())),
      singleCopy_(paramShmCma() != 0),
      singleThreshold_(paramShmCmaThreshold() < 0 ? SIZE_MAX : static_cast<size_t>(paramShmCmaThreshold())),
      localCopyThreshold_(static_cast<size_t>(std::max<int64_t>(0, paramShmLocalCopyThreshold()))),
      cmaPiece_(static_cast<size_t>(std::max<int64_t>(4096, paramShmCmaPiece())) & ~size_t{63}),
      cmaChunk_(static_cast<size_t>(std::max<int64_t>(65536, paramShmCmaChunk())) & ~size_t{63}),
      livenessMs_(std::max<int64_t>(1, paramShmLivenessMs())),
      probeWord_(kProbeMagic ^ static_cast<uint64_t>(ctx.rank)) {
  if (gethostname(hostname_, sizeof(hostname_) - 1) != 0) strcpy(hostname_, "?");
  if (hostIds_.size() != static_cast<size_t>(nranks_)) hostIds_.assign(nranks_, 0);
}

ShmTransport::~ShmTransport() {
  if (own_) storeRelease(&own_->header()->closed, 1u);
  conns_.clear();
  if (created_ && !unlinked_) shm_unlink(name_.c_str());
  if (own_) {
    std::lock_guard<std::mutex> g(registryMu());
    auto it = registry().find(name_);
    if (it != registry().end() && it->second.lock() == own_) registry().erase(it);
  }
}

int ShmTransport::localRanks() const {
  int n = 0;
  for (int r = 0; r < nranks_; ++r) n += hostIds_[r] == hostIds_[rank_];
  return n;
}

bool ShmTransport::canConnect(int peer) const {
  return peer >= 0 && peer < nranks_ && hostIds_[peer] == hostIds_[rank_] && segs_.size() == size_t(nranks_) &&
         segs_[peer] != nullptr;
}

Caps ShmTransport::caps() const {
  Caps c;
  // Measured on 2 cores (docs/shm-transport.md): 8-byte half round trip 0.24 us; large messages are
  // DRAM-bound at 7-8 GB/s with single copy and ~5-7 GB/s through the ring.
  c.latencyUs = 0.3;
  c.bwGBps = singleCopy_ && cmaOk_ ? 8.0 : 5.0;
  if (singleCopy_) {
    bool allSamePid = true;
    for (int r = 0; r < nranks_; ++r)
      if (hostIds_[r] == hostIds_[rank_] && (r >= static_cast<int>(sameProcess_.size()) || !sameProcess_[r]))
        allSamePid = false;
    if (allSamePid) {
      c.singleCopyBytes = localCopyThreshold_;
    } else if (cmaOk_) {
      c.singleCopyBytes = singleThreshold_;
    }
  }
  c.sameHostOnly = true;
  c.spaces = kHostSpaces;
  c.reduceOnRecv = true;
  return c;
}

char* ShmTransport::staging() {
  if (staging_.size() < cmaPiece_) staging_.resize(cmaPiece_);
  return staging_.data();
}

Status ShmTransport::setup() {
  if (slotBytes_ == 0) {
    // Every channel may be used (AlltoAll): n^2 rings on the host, plus each rank's header and
    // arena, must fit the budget. The pages are only touched when a channel is first used, so a
    // /dev/shm too small for them (a container's is often 64 MiB) would otherwise end in SIGBUS.
    const uint64_t n = static_cast<uint64_t>(std::max(1, localRanks()));
    const uint64_t free = shmFreeBytes();
    const uint64_t fixed = n * (kHeaderBytes + kArenaBytes);
    const uint64_t room = free == UINT64_MAX ? kHostRingBudget : free / 4 * 3;  // leave some to others
    const uint64_t budget = std::min(kHostRingBudget, room > fixed ? room - fixed : 0);
    const uint64_t fit = budget / (n * n * std::max<uint64_t>(1, numSlots_)) / kPageBytes * kPageBytes;
    uint64_t want = kMaxAutoSlot;
    while (want > kMinAutoSlot && want > fit) want /= 2;
    if (want > fit) want = 0;
    // Collective: the ranks of a host share one /dev/shm but look at it at different moments, and
    // must use the same slots: every rank takes the smallest its host's ranks found.
    std::vector<uint64_t> fits(static_cast<size_t>(nranks_), 0);
    fits[static_cast<size_t>(rank_)] = want;
    C4_CHECK(oob_->allGather(fits.data(), sizeof(uint64_t)));
    for (int r = 0; r < nranks_; ++r)
      if (hostIds_[r] == hostIds_[rank_]) want = std::min(want, fits[static_cast<size_t>(r)]);
    int first = rank_;  // the host's lowest rank says it once
    for (int r = rank_ - 1; r >= 0; --r)
      if (hostIds_[r] == hostIds_[rank_]) first = r;
    if (want == 0) {
      // No segment at all: the transport reaches no peer, and the network transport carries the
      // same-host peers (core/comm.cc adds one wherever a peer is left unreached).
      const std::string msg = strFormat(
          "shm: /dev/shm has %llu MiB free, too little for the rings of %llu local ranks (at least %llu MiB); "
          "ranks of this host talk over the network transport (make /dev/shm larger, e.g. docker --shm-size)",
          static_cast<unsigned long long>(free == UINT64_MAX ? 0 : free >> 20), static_cast<unsigned long long>(n),
          static_cast<unsigned long long>((n * n * numSlots_ * kMinAutoSlot + fixed) / 3 * 4 / (1u << 20) + 1));
      if (first == rank_) {
        C4_WARN(kLogShm, "%s", msg.c_str());
      } else {
        C4_INFO(kLogShm, "%s", msg.c_str());
      }
      return Status::ok();
    }
    slotBytes_ = want;
    if (slotBytes_ < (32u << 10) && first == rank_)
      C4_INFO(kLogShm, "shm: rank %d: /dev/shm has %llu MiB free: ring slots of %llu KiB", rank_,
              static_cast<unsigned long long>(free >> 20), static_cast<unsigned long long>(slotBytes_ >> 10));
  }
  if (slotBytes_ < 2 * kSlotHeaderBytes || slotBytes_ % 64 != 0 || slotBytes_ > (64u << 20))
    return makeError(Code::kInvalidArgument, "shm: C4_SHM_SLOT_BYTES=%llu must be a multiple of 64 in [128, 64M]",
                     static_cast<unsigned long long>(slotBytes_));
  if (numSlots_ < 2 || numSlots_ > 4096)
    return makeError(Code::kInvalidArgument, "shm: C4_SHM_SLOTS=%llu must be in [2, 4096]",
                     static_cast<unsigned long long>(numSlots_));
  channelBytes_ = (kSlotsOffset + numSlots_ * slotBytes_ + kPageBytes - 1) / kPageBytes * kPageBytes;
  segmentBytes_ = kHeaderBytes + kArenaBytes + static_cast<size_t>(nranks_) * channelBytes_;
  name_ = segmentName(tag_, rank_);

  // 1. Create our segment. Pages stay untouched (sparse) until a channel is used.
  Status local;
  int fd = C4_SYSCALL_RETRY(shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (fd < 0) {
    local = sysError(strFormat("shm: rank %d: shm_open(%s)", rank_, name_.c_str()).c_str(), errno);
  } else {
    created_ = true;
    void* base = MAP_FAILED;
    if (C4_SYSCALL_RETRY(ftruncate(fd, static_cast<off_t>(segmentBytes_))) != 0) {
      local =
          sysError(strFormat("shm: rank %d: ftruncate(%s, %zu)", rank_, name_.c_str(), segmentBytes_).c_str(), errno);
    } else {
      base = mmap(nullptr, segmentBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED)
        local = sysError(strFormat("shm: rank %d: mmap(%s)", rank_, name_.c_str()).c_str(), errno);
    }
    close(fd);
    if (base != MAP_FAILED) {
      own_ = std::make_shared<Mapping>();
      own_->base = base;
      own_->bytes = segmentBytes_;
      SegmentHeader* h = own_->header();
      h->pid = pid_;
      h->rank = rank_;
      h->nranks = nranks_;
      h->slotBytes = slotBytes_;
      h->numSlots = numSlots_;
      storeRelease(&h->magic, kSegmentMagic);
      std::lock_guard<std::mutex> g(registryMu());
      registry()[name_] = own_;
    }
  }

  // Setup is collective: every rank takes part in both rounds even after a local failure.
  std::vector<SetupInfo> info(nranks_);
  SetupInfo& mine = info[rank_];
  memset(&mine, 0, sizeof(mine));
  mine.magic = kSegmentMagic;
  mine.probeAddr = reinterpret_cast<uint64_t>(&probeWord_);
  mine.slotBytes = slotBytes_;
  mine.numSlots = numSlots_;
  mine.pid = pid_;
  mine.process = processToken();
  mine.pidNs = pidNamespaceId();
  mine.created = local.isOk() ? 1 : 0;
  Status st = oob_->allGather(info.data(), sizeof(SetupInfo));
  if (!st.isOk()) return st;  // the destructor unlinks
  // A peer's pid is used (CMA, its process watch) only where it names that peer here.
  pids_.resize(nranks_);
  sameProcess_.resize(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    pids_[r] = info[r].pidNs != 0 && info[r].pidNs == mine.pidNs ? info[r].pid : 0;
    sameProcess_[r] = info[r].process == mine.process;
  }

  // 2. Map every same-host peer's segment now so that ours can be unlinked at the end of setup.
  segs_.assign(nranks_, nullptr);
  int cmaOk = 1;
  bool probed = false;
  if (local.isOk()) {
    for (int r = 0; r < nranks_ && local.isOk(); ++r) {
      if (hostIds_[r] != hostIds_[rank_]) continue;
      if (r == rank_) {
        segs_[r] = own_;
        continue;
      }
      if (!info[r].created) {
        local = makeError(Code::kRemoteError, "shm: rank %d (pid %d) could not create its segment", r, info[r].pid);
        break;
      }
      if (info[r].slotBytes != slotBytes_ || info[r].numSlots != numSlots_) {
        local = makeError(Code::kInvalidUsage,
                          "shm: rank %d uses C4_SHM_SLOT_BYTES=%llu C4_SHM_SLOTS=%llu but rank %d uses %llu and %llu; "
                          "set them alike on all ranks",
                          r, static_cast<unsigned long long>(info[r].slotBytes),
                          static_cast<unsigned long long>(info[r].numSlots), rank_,
                          static_cast<unsigned long long>(slotBytes_), static_cast<unsigned long long>(numSlots_));
        break;
      }
      std::string peerName = segmentName(tag_, r);
      if (sameProcess_[r]) {
        std::lock_guard<std::mutex> g(registryMu());
        auto it = registry().find(peerName);
        if (it != registry().end()) segs_[r] = it->second.lock();
        if (!segs_[r]) local = makeError(Code::kInternalError, "shm: rank %d's segment is not registered", r);
        continue;
      }
      int pfd = C4_SYSCALL_RETRY(shm_open(peerName.c_str(), O_RDWR | O_CLOEXEC, 0));
      if (pfd < 0) {
        local = sysError(strFormat("shm: rank %d: shm_open(%s) of rank %d", rank_, peerName.c_str(), r).c_str(), errno);
        break;
      }
      struct stat sb;
      void* base = MAP_FAILED;
      if (fstat(pfd, &sb) != 0 || static_cast<size_t>(sb.st_size) != segmentBytes_) {
        local = makeError(Code::kInvalidUsage, "shm: rank %d's segment %s has an unexpected size", r, peerName.c_str());
      } else {
        base = mmap(nullptr, segmentBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        if (base == MAP_FAILED) local = sysError(strFormat("shm: mmap of rank %d's segment", r).c_str(), errno);
      }
      close(pfd);
      if (base == MAP_FAILED) break;
      auto m = std::make_shared<Mapping>();
      m->base = base;
      m->bytes = segmentBytes_;
      SegmentHeader* h = m->header();
      if (loadAcquire(&h->magic) != kSegmentMagic || h->pid != info[r].pid || h->rank != r) {
        local = makeError(Code::kInvalidUsage, "shm: segment %s does not belong to rank %d (pid %d)", peerName.c_str(),
                          r, info[r].pid);
        break;
      }
      segs_[r] = std::move(m);
      if (pids_[r] == 0) {
        // Another pid namespace: its pid names another process here (or none); no CMA with it.
        cmaOk = 0;
        probed = true;
        C4_INFO(kLogShm, "shm: rank %d: rank %d is in another pid namespace: large messages use the ring", rank_, r);
      }
      if (!probed) {
        // One cross-process read tells whether CMA is permitted (seccomp, ptrace scope, namespaces).
        probed = true;
        uint64_t got = 0;
        iovec liov{&got, sizeof(got)};
        iovec riov{reinterpret_cast<void*>(info[r].probeAddr), sizeof(got)};
        ssize_t n = C4_SYSCALL_RETRY(process_vm_readv(pids_[r], &liov, 1, &riov, 1, 0));
        if (n != static_cast<ssize_t>(sizeof(got)) || got != (kProbeMagic ^ static_cast<uint64_t>(r))) {
          cmaOk = 0;
          C4_INFO(kLogShm, "shm: rank %d cannot use CMA with rank %d (pid %d): %s; large messages use the ring", rank_,
                  r, info[r].pid, n < 0 ? strerror(errno) : "unexpected data");
        }
      }
    }
  }

  // 3. Second round: everyone has mapped everything (or failed); then our name can go.
  std::vector<SetupInfo> info2(nranks_);
  memset(info2.data(), 0, sizeof(SetupInfo) * nranks_);
  info2[rank_].mapped = local.isOk() ? 1 : 0;
  info2[rank_].cmaOk = cmaOk;
  st = oob_->allGather(info2.data(), sizeof(SetupInfo));
  if (created_ && !unlinked_) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
  if (!st.isOk()) return st;
  if (!local.isOk()) {
    C4_WARN(kLogShm, "%s", local.message().c_str());
    return local;
  }
  cmaOk_ = true;
  for (int r = 0; r < nranks_; ++r) {
    if (hostIds_[r] != hostIds_[rank_]) continue;
    if (!info2[r].mapped) return makeError(Code::kRemoteError, "shm: setup failed on rank %d; see its log", r);
    cmaOk_ = cmaOk_ && info2[r].cmaOk;
  }
  conns_.resize(nranks_);

  int local_ = localRanks();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  int64_t spinUs = paramShmSpin();
  if (spinUs < 0) spinUs = local_ > cpus ? 0 : kDefaultSpinUs;
  spread_ = paramShmSpread() != 0 && local_ <= cpus;
  configureIdle(spinUs);
  C4_INFO(kLogShm,
          "shm: rank %d ready: %d local ranks, %llu slots x %llu B, single copy %s (between processes above %s B, "
          "within a process above %zu B), spin %lld us",
          rank_, local_, static_cast<unsigned long long>(numSlots_), static_cast<unsigned long long>(slotBytes_),
          !singleCopy_ ? "off" : (cmaOk_ ? "cma" : "same-process only"),
          singleThreshold_ == SIZE_MAX ? "never" : std::to_string(singleThreshold_).c_str(), localCopyThreshold_,
          static_cast<long long>(spinUs));
  return Status::ok();
}

Status ShmTransport::connect(int peer, Connection** out) {
  if (!canConnect(peer))
    return makeError(Code::kInvalidArgument, "shm: rank %d cannot reach rank %d (not on this host or out of range)",
                     rank_, peer);
  if (!conns_[peer]) {
    std::shared_ptr<Mapping> seg = segs_[peer];
    char* out = seg->channel(rank_, channelBytes_);
    char* in = own_->channel(peer, channelBytes_);
    // Fault both rings in now (the first call with this peer is the warm-up), not one page at a
    // time inside the first large transfers. MADV_POPULATE_WRITE allocates without writing, so it
    // is safe while the peer already uses the ring. Best effort: older kernels lack it.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    // Where /dev/shm ran out of room since setup, this fails (EFAULT) instead of a SIGBUS later.
    for (char* ring : {out, in}) {
      if (madvise(ring, channelBytes_, MADV_POPULATE_WRITE) == 0 || errno == EINVAL) continue;
      const int e = errno;
      return makeError(Code::kSystemError,
                       "shm: rank %d: /dev/shm has no room for the ring %s rank %d (%zu bytes, %llu MiB free): %s; "
                       "make /dev/shm larger or set C4_SHM_SLOT_BYTES smaller",
                       rank_, ring == out ? "to" : "from", peer, channelBytes_,
                       static_cast<unsigned long long>(shmFreeBytes() >> 20), strerror(e));
    }
    conns_[peer] = std::make_unique<ShmConnection>(this, peer, pids_[peer], sameProcess_[peer], seg, out, in);
  }
  *out = conns_[peer].get();
  return Status::ok();
}

Status ShmTransport::progress() {
  if (!abortStatus_.isOk()) return abortStatus_;
  int64_t now = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    ShmConnection* c = active_[i];
    if (c->progressOnce()) {
      ++moved_;
    } else if (c->pending()) {
      if (now == 0) now = coarseNowMs();
      c->checkStalled(now);
    }
  }
  pruneActive(&active_, [](const ShmConnection& c) { return c.pending(); });
  return firstError_;
}

void ShmTransport::abort(const std::string& reason) {
  if (abortStatus_.isOk())
    abortStatus_ = makeError(Code::kRemoteError, "shm: rank %d aborted: %s", rank_, reason.c_str());
  if (own_) {
    SegmentHeader* h = own_->header();
    if (!loadAcquire(&h->aborted)) {
      size_t n = std::min(reason.size(), kReasonBytes - 1);
      memcpy(h->reason, reason.data(), n);
      h->reason[n] = 0;
      storeRelease(&h->aborted, 1u);
    }
  }
  for (auto& c : conns_)
    if (c) c->fail(abortStatus_);
}

}  // namespace

Status createShmTransport(const Context& ctx, std::unique_ptr<Transport>* out) {
  if (!ctx.oob || ctx.nranks < 1 || ctx.rank < 0 || ctx.rank >= ctx.nranks || ctx.commTag.empty())
    return makeError(Code::kInvalidArgument, "shm: bad context (rank %d of %d, tag '%s', oob %s)", ctx.rank, ctx.nranks,
                     ctx.commTag.c_str(), ctx.oob ? "set" : "null");
  auto t = std::make_unique<ShmTransport>(ctx);
  C4_CHECK(t->setup());
  *out = std::move(t);
  return Status::ok();
}

}  // namespace c4::transport
