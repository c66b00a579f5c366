#include "transports/ibverbs/ibverbs_transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"
#include "transports/ibverbs/ib_verbs.hpp"
#include "transports/transport_util.hpp"

namespace c4::transport {
namespace {

using detail::nowMs;
using ib::IbPort;
using ib::Verbs;

// ---- wire ------------------------------------------------------------------------------------------

constexpr uint32_t kChunkMagic = 0x62693463u;  // "c4ib"
/// The head of every slot a sender writes.
struct ChunkHdr {
  uint32_t magic;
  uint32_t len;     // payload bytes in this chunk
  uint64_t msgSeq;  // the message's number in its direction (from 0)
  uint64_t offset;  // of this chunk in the message
  uint64_t total;   // bytes of the whole message
  OpSig sig;
  uint64_t pad;
};
static_assert(sizeof(ChunkHdr) == 64, "wire layout");

// Immediate data: [31:30] kind | [29:0] value.
constexpr uint32_t kImmData = 0u << 30;    // value: the slot written
constexpr uint32_t kImmCredit = 1u << 30;  // value: slots freed
constexpr uint32_t kImmAbort = 2u << 30;   // value 0: the reason is in the control area; 1: a LaneAddMsg there
constexpr uint32_t kImmPing = 3u << 30;    // a liveness probe (value 0); or, value 1 + i: lane i is retired
constexpr uint32_t kImmKind = 3u << 30;
constexpr size_t kCtrlBytes = 1024;     // per lane: the peer's abort reason lands here
constexpr int64_t kPingAfterMs = 1000;  // a lane with receives waiting and nothing heard probes its peer
constexpr int kPollBatch = 32;
constexpr uint16_t kRoceSportMin = 49152;  // IB_ROCE_UDP_ENCAP_VALID_PORT_MIN
constexpr uint32_t kInlineBytes = 256;     // asked for; the provider may grant less (or none)

// wr_id: lane id << 8 | what.
enum WrKind : uint64_t { kWrRecv = 1, kWrData = 2, kWrCredit = 3, kWrCtrl = 4 };

std::string hexQp(uint32_t qpn) { return strFormat("0x%06x", qpn); }

/// Per lane, what the peer needs to connect to it (exchanged in the second allGather).
struct QpInfo {
  uint32_t qpn;
  uint32_t psn;
  uint64_t ringAddr;  // its receive slots (then the control area)
  uint32_t rkey;
  uint16_t lid;
  uint8_t mtu;
  uint8_t ethernet;
  uint8_t gid[16];
  int32_t port;  // index into its ports
  uint32_t pad;
};
static_assert(sizeof(QpInfo) == 48, "wire layout");

/// A lane added after init (LaneControl::addLane), written into the peer's control area of a live
/// lane: the opener's request, then the peer's answer on the same lane.
struct LaneAddMsg {
  uint32_t magic;  // kLaneMagic
  uint32_t kind;   // kAddRequest, kAddAccept, kAddRefuse, kAddBooked
  int32_t lane;    // the new lane's index (the same at both ends)
  int32_t port;    // request: the receiver's port for it (-1: lane mod ports)
  uint16_t sourcePort;
  uint16_t pad[3];
  QpInfo qp;       // the sender's end of the new lane
  char why[160];   // a refusal's reason
  char path[192];  // request: C4P's path of the lane, for the peer's messages
};
constexpr uint32_t kLaneMagic = 0x6c346963u;
// kAddBooked: the opener could not make the lane on its side (retired there at once, its index
// taken); the peer books it retired too, so that both ends keep numbering lanes alike, and answers
// with kAddRefuse.
enum : uint32_t { kAddRequest = 1, kAddAccept = 2, kAddRefuse = 3, kAddBooked = 4 };
static_assert(sizeof(LaneAddMsg) < 1023, "fits a control area");

/// setup's allGather: whether the rank can use RDMA (else why), and its ports.
struct SetupHdr {
  int32_t ok;
  int32_t nports;
  int32_t lanes;
  int32_t pad;
  char why[240];
};
/// startLanes' allGather: the lower rank's plan of each lane (ports, RoCE source port).
struct PortPair {
  int16_t local, remote;
  uint16_t sourcePort;  // RoCE v2 UDP source port asked for (0: the device's choice)
  uint16_t pad;
};

struct Device {
  std::string name;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_comp_channel* channel = nullptr;  // the cq's events (waitFd); null: polled only
  unsigned unacked = 0;                 // events taken and not acknowledged yet
  int cqe = 0;                          // completion entries the lanes on it need
  int cqeCap = 0;                       // the queue's size
};

class IbConnection;

/// A registration (ncclCommRegister, Transport::registerMemory): one memory region per device this
/// transport uses, so that chunks of sends from inside it go to the NIC straight from the caller's
/// buffer (no copy into the staging slot). Only what the caller registers: an automatic cache of
/// arbitrary buffers would pin pages that free() and a later malloc() may hand to other data at the
/// same address, and RDMA would read the old pages.
class IbRegion : public MemRegion {
 public:
  IbRegion(const void* base, size_t bytes, MemSpace space) : MemRegion(base, bytes, space) {}
  std::vector<std::pair<const Device*, ibv_mr*>> mrs;
  uint32_t lkey(const Device* d) const {
    for (const auto& m : mrs)
      if (m.first == d) return m.second->lkey;
    return 0;
  }
};

struct SendMsg {
  Request* req = nullptr;
  const char* buf = nullptr;
  size_t bytes = 0;
  OpSig sig;
  uint64_t seq = 0;
  const IbRegion* region = nullptr;  // the registration covering buf: chunks go without a copy
  size_t posted = 0;                 // payload bytes handed to lanes
  int chunks = 0, acked = 0;
  bool started = false;  // its first chunk is out (a zero-byte message has one)
  bool finished = false;
};

struct RecvMsg {
  Request* req = nullptr;
  MemRef dst;
  size_t bytes = 0;
  OpSig sig;
  bool hasRed = false;
  ReduceSpec red;
  size_t got = 0;
  bool checked = false;
  std::set<uint64_t> offsets;  // of the chunks received: a chunk sent again after a lane failed counts once
};

/// A chunk on a lane, not credited by the peer yet: its staged copy (header and payload) is in the
/// lane's staging slot `slot`, from where it goes again if the lane fails.
struct Inflight {
  SendMsg* msg;
  uint32_t len;
  uint32_t slot;
  uint64_t offset;
};

/// A chunk to send again (its lane failed): where its staged copy is.
struct Resend {
  SendMsg* msg;
  uint64_t offset;
  uint32_t len;
  const char* payload;
};

struct IbLane {
  explicit IbLane(int index) : stats(index) {}
  Lane stats;
  IbConnection* conn = nullptr;
  int id = 0;  // index into the transport's lanes
  int port = 0;
  uint16_t sourcePort = 0;  // RoCE v2: the UDP source port asked for (0: the device's choice)
  std::string path;         // C4P's way through the fabric ("h0p0 -> leaf0 -> spine1 -> leaf1 -> h1p0"); "" unplanned
  Device* dev = nullptr;
  const IbPort* ip = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  char* mem = nullptr;  // [slots | ctrl | staging slots | staging ctrl]
  size_t memBytes = 0;
  // receive side
  std::deque<uint32_t> ready;  // slots written by the peer, in order
  uint32_t toCredit = 0;
  // send side
  QpInfo remote{};
  uint32_t credits = 0;
  uint32_t next = 0;  // the peer's next slot
  std::deque<Inflight> inflight;
  int sqFree = 0;
  uint32_t maxInline = 0;  // bytes a work request may carry inline (the provider copies them at post)
  uint32_t psn = 0;        // the first packet sequence number this end sends (random)
  bool pinging = false;
  bool up = false;  // connected (a lane added later is not, until the peer accepted it)
  bool failed = false;
};

class IbverbsTransport;

class IbConnection final : public Connection, public LaneControl {
 public:
  IbConnection(IbverbsTransport* t, int peer) : t_(t), peer_(peer) {}
  int peer() const override { return peer_; }
  Status isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint) override;
  Status irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) override;
  Status peek(bool* ready, OpSig* sig, size_t* bytes) override;
  int numLanes() const override { return static_cast<int>(lanes.size()); }
  const Lane* lane(int i) const override {
    return i >= 0 && i < numLanes() ? &lanes[static_cast<size_t>(i)]->stats : nullptr;
  }
  std::string describeState() const override;
  LaneControl* laneControl() override { return this; }

  // LaneControl (a lane added is a queue pair exchanged over a live lane)
  Status setLaneWeights(const std::vector<double>& w) override;
  Status retireLane(int i, const std::string& why) override;
  Status addLane(const LanePlan& plan, int* index) override;

  void fail(const Status& st);
  bool busy() const { return !sends.empty() || !recvs.empty(); }
  void pump();

  IbverbsTransport* t_;
  int peer_;
  std::vector<IbLane*> lanes;
  std::deque<std::unique_ptr<SendMsg>> sends;
  std::deque<RecvMsg> recvs;
  std::deque<Resend> resend;  // chunks of failed lanes, to go again on the others
  // Once a lane failed, chunks may come out of message order (a re-sent chunk behind a later
  // message's on the same lane): chunks of later messages are copied aside instead of blocking their
  // lane, and taken when their message's turn comes.
  bool reordered = false;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<char>> stash;  // (message, offset) -> chunk
  std::vector<double> weights, credit;  // striping weights, and the smooth weighted round robin's state
  uint64_t sendSeq = 0, recvSeq = 0;
  size_t rr = 0;  // next lane to stripe onto
  Status standing;
  int64_t lastHeardMs = 0;
  bool inActiveList = false;
  int adding = -1;  // the lane this (opening) end added and the peer has not answered yet

 private:
  bool pumpRecv();
  bool pumpSend();
  IbLane* pickLane();
  const ChunkHdr* head(IbLane* l) const;
  void consume(IbLane* l);
  bool deliver(const ChunkHdr* h);  // a chunk of the current message; false: the connection failed
};

class IbverbsTransport final : public Transport, public LaneSetup, public WaitSource {
 public:
  explicit IbverbsTransport(const Context& ctx) : ctx_(ctx) {}
  ~IbverbsTransport() override;
  const char* name() const override { return "ibverbs"; }
  Caps caps() const override {
    Caps c;
    c.latencyUs = 5;
    c.bwGBps = 10;
    c.reduceOnRecv = true;
    // RoCE v2 lanes are steered by the flow label, which sets a UDP source port of 49152 and up.
    bool roce = !ports_.empty();
    for (const IbPort& p : ports_) roce &= p.ethernet;
    if (roce) {
      c.sourcePortLo = kRoceSportMin;
      c.sourcePortHi = 65535;
    }
    return c;
  }
  bool canConnect(int peer) const override { return peer >= 0 && peer < ctx_.nranks && peer != ctx_.rank; }
  Status connect(int peer, Connection** out) override;
  Connection* existingConnection(int peer) override {
    return started_ && canConnect(peer) ? conns_[static_cast<size_t>(peer)].get() : nullptr;
  }
  Status progress() override;
  uint64_t progressCount() const override { return progressCount_; }
  bool sendsPending() const override {
    // Chunks the peer has not credited, and credits not sent yet: a communicator being destroyed
    // progresses until they are done, so that no queue pair goes while its peer still needs it.
    for (const auto& l : lanes_)
      if (!l->failed && (!l->inflight.empty() || l->toCredit > 0)) return true;
    for (const auto& c : conns_)
      if (c && !c->resend.empty()) return true;
    return false;
  }
  void abort(const std::string& reason) override;
  LaneSetup* laneSetup() override { return this; }
  WaitSource* waitSource() override { return this; }

  // WaitSource
  int waitFd() const override { return epfd_; }
  bool armWait() override;
  // LaneSetup
  int lanesPerConnection() const override { return lanesPer_; }
  /// RoCE: each port's IP address (its GID's), as a topology file lists host ports; without a port
  /// number, since every RoCE v2 connection goes to UDP port 4791. InfiniBand: the port's name.
  std::vector<std::string> portAddresses() const override {
    std::vector<std::string> out;
    for (const IbPort& p : ports_)
      out.push_back(!p.ethernet                                ? p.name()
                    : p.gidText.find(':') == std::string::npos ? p.gidText
                                                               : "[" + p.gidText + "]");
    return out;
  }

  /// Loads libibverbs, finds the ports, and tells every rank every rank's outcome (collective).
  Status setup();
  /// Makes and connects every queue pair, each on the ports the lane plan gives (collective).
  Status startLanes() override;

  // For the connections.
  const Verbs* v = nullptr;
  size_t slotBytes = 0;
  uint32_t slots = 0;
  uint64_t progressCount_ = 0;
  /// Writes a chunk of m (`len` bytes at `offset`, from `src`) into the peer's next slot on l.
  Status postData(IbLane* l, SendMsg* m, uint64_t offset, size_t len, const char* src, bool again);
  Status postCtrl(IbLane* l, uint32_t imm, WrKind kind, const std::string& text = {});
  /// Lane l is out of service (`why`): its queue pair goes to the error state, its uncredited
  /// chunks go again on the connection's other lanes, and the peer is told (`tellPeer`); the
  /// connection fails only with its last lane.
  void laneFailed(IbLane* l, const std::string& why, bool tellPeer = true);
  /// LaneControl::addLane of c (the lower rank's end): the lane's queue pair is made on the planned
  /// port and its address sent over a live lane; the lane joins once the peer answered.
  Status addLane(IbConnection* c, const LanePlan& plan, int* index);
  Status faultDrill(int peer, int lane, LaneFault fault) override;
  Status registerMemory(const void* base, size_t bytes, MemSpace space, std::unique_ptr<MemRegion>* out) override;
  Status deregisterMemory(MemRegion* region) override;
  char* staging(IbLane* l, uint32_t slot) const { return l->mem + slots * slotBytes + kCtrlBytes + slot * slotBytes; }
  void markActive(IbConnection* c) {
    if (!c->inActiveList) {
      c->inActiveList = true;
      active_.push_back(c);
    }
  }
  std::string peerText(int peer) const { return strFormat("rank %d", peer); }
  int rank() const { return ctx_.rank; }
  const Context& ctx() const { return ctx_; }
  Status aborted_;

 private:
  Status openDevice(const std::string& name, Device** out);
  Status makeLane(IbConnection* c, int index, int port);
  Status makeCq(Device* d);
  /// The lane's queue pair, in INIT with its receives posted; *q: what the peer needs to connect.
  Status createQp(IbLane* l, QpInfo* q);
  /// What the peer needs to connect to lane l's queue pair.
  QpInfo laneInfo(const IbLane* l) const;
  /// A lane after startLanes (addLane, or the peer's request): made, its queue pair in INIT. On
  /// failure (or `injectFailure`: C4_IB_FAULT_ADD_LANE) the lane stays booked at `index`, retired.
  Status makeLaterLane(IbConnection* c, int index, int port, IbLane** out, bool injectFailure = false);
  /// A lane made without a queue pair, retired at once: its index stays taken.
  void retireUnmade(IbLane* l, const std::string& why);
  Status connectLane(IbLane* l);
  /// A lane-control message (addLane's request, the answer) arrived in l's control area.
  void onLaneAddMsg(IbLane* l);
  Status postRecv(IbLane* l);
  void onCompletion(const ibv_wc& wc);

  Context ctx_;
  std::vector<IbPort> ports_;
  std::vector<int32_t> peerPorts_;  // every rank's port count (setup)
  bool started_ = false;            // startLanes ran: the connections and their queue pairs exist
  int lanesPer_ = 1;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<IbLane>> lanes_;
  std::vector<std::unique_ptr<IbConnection>> conns_;
  std::vector<IbConnection*> active_;
  int epfd_ = -1;  // the devices' completion channels (waitFd)
  std::mt19937 rng_{std::random_device{}() ^ static_cast<uint32_t>(getpid()) ^ static_cast<uint32_t>(detail::nowNs())};
};

// ---- setup -------------------------------------------------------------------------------------------

IbverbsTransport::~IbverbsTransport() {
  if (v == nullptr) return;
  for (auto& l : lanes_) {
    if (l->qp) v->destroyQp(l->qp);
    if (l->mr) v->deregMr(l->mr);
    free(l->mem);
  }
  for (auto& d : devices_) {
    // ibv_destroy_cq waits until every event taken from the channel was acknowledged.
    if (d->cq && d->unacked) v->ackCqEvents(d->cq, d->unacked);
    if (d->cq) v->destroyCq(d->cq);
    if (d->channel) v->destroyCompChannel(d->channel);
    if (d->pd) v->deallocPd(d->pd);
    if (d->ctx) v->closeDevice(d->ctx);
  }
  if (epfd_ >= 0) close(epfd_);
}

Status IbverbsTransport::openDevice(const std::string& name, Device** out) {
  for (auto& d : devices_)
    if (d->name == name) {
      *out = d.get();
      return Status::ok();
    }
  int n = 0;
  ibv_device** list = v->getDeviceList(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list && i < n && !ctx; ++i)
    if (name == v->getDeviceName(list[i])) ctx = v->openDevice(list[i]);
  if (list) v->freeDeviceList(list);
  if (ctx == nullptr)
    return makeError(Code::kSystemError, "ibverbs: cannot open %s: %s", name.c_str(), strerror(errno));
  auto d = std::make_unique<Device>();
  d->name = name;
  d->ctx = ctx;
  d->pd = v->allocPd(ctx);
  if (d->pd == nullptr) {
    v->closeDevice(ctx);
    return makeError(Code::kSystemError, "ibverbs: ibv_alloc_pd on %s: %s", name.c_str(), strerror(errno));
  }
  devices_.push_back(std::move(d));
  *out = devices_.back().get();
  return Status::ok();
}

Status IbverbsTransport::makeLane(IbConnection* c, int index, int port) {
  auto l = std::make_unique<IbLane>(index);
  l->conn = c;
  l->id = static_cast<int>(lanes_.size());
  l->port = port;
  l->ip = &ports_[static_cast<size_t>(port)];
  C4_CHECK(openDevice(l->ip->device, &l->dev));
  l->memBytes = 2 * (slots * slotBytes + kCtrlBytes);
  if (posix_memalign(reinterpret_cast<void**>(&l->mem), 4096, l->memBytes) != 0)
    return makeError(Code::kSystemError, "ibverbs: out of memory for a lane's %zu bytes of slots", l->memBytes);
  memset(l->mem, 0, l->memBytes);
  l->mr = v->regMr(l->dev->pd, l->mem, l->memBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (l->mr == nullptr)
    return makeError(Code::kSystemError,
                     "ibverbs: ibv_reg_mr of %zu bytes on %s: %s (ulimit -l, the locked-memory limit, may be too low)",
                     l->memBytes, l->dev->name.c_str(), strerror(errno));
  l->sqFree = static_cast<int>(2 * slots + 4);
  l->dev->cqe += 2 * l->sqFree;
  c->lanes.push_back(l.get());
  lanes_.push_back(std::move(l));
  return Status::ok();
}

Status IbverbsTransport::postRecv(IbLane* l) {
  ibv_recv_wr wr{};
  wr.wr_id = (static_cast<uint64_t>(l->id) << 8) | kWrRecv;
  wr.num_sge = 0;
  ibv_recv_wr* bad = nullptr;
  int rc = ibv_post_recv(l->qp, &wr, &bad);
  if (rc != 0) return makeError(Code::kSystemError, "ibverbs: ibv_post_recv: %s", strerror(rc));
  return Status::ok();
}

Status IbverbsTransport::makeCq(Device* d) {
  // Room for twice the lanes made so far: replacement lanes (addLane) join without a resize.
  d->cqeCap = std::max(2 * d->cqe, 16);
  // A completion channel, so that an idle rank blocks until a completion instead of sleeping
  // through it (waitFd, armWait); without one the queue is only polled.
  d->channel = v->createCompChannel(d->ctx);
  if (d->channel != nullptr) {
    const int fl = fcntl(d->channel->fd, F_GETFL);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (fl < 0 || fcntl(d->channel->fd, F_SETFL, fl | O_NONBLOCK) != 0 || epfd_ < 0 ||
        epoll_ctl(epfd_, EPOLL_CTL_ADD, d->channel->fd, &ev) != 0) {
      v->destroyCompChannel(d->channel);
      d->channel = nullptr;
    }
  }
  d->cq = v->createCq(d->ctx, d->cqeCap, nullptr, d->channel, 0);
  if (d->cq == nullptr)
    return makeError(Code::kSystemError, "ibverbs: ibv_create_cq(%d) on %s: %s", d->cqeCap, d->name.c_str(),
                     strerror(errno));
  return Status::ok();
}

bool IbverbsTransport::armWait() {
  if (epfd_ < 0 || !aborted_.isOk()) return true;
  bool idle = true;
  for (auto& d : devices_) {
    if (d->channel == nullptr || d->cq == nullptr) continue;
    // Take the events of earlier wake-ups (the channel stays readable until they are read), then
    // ask for the next one and look once more: a completion that came before the request raises
    // no event, so one found now means "do not block".
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (v->getCqEvent(d->channel, &cq, &ctx) == 0) ++d->unacked;
    if (d->unacked >= 64) {
      v->ackCqEvents(d->cq, d->unacked);
      d->unacked = 0;
    }
    if (ibv_req_notify_cq(d->cq, 0) != 0) continue;  // blocking stays bounded by the caller's timeout
    ibv_wc wcs[kPollBatch];
    const int k = ibv_poll_cq(d->cq, kPollBatch, wcs);
    for (int i = 0; i < k; ++i) onCompletion(wcs[i]);
    if (k != 0) idle = false;
  }
  return idle;
}

Status IbverbsTransport::createQp(IbLane* l, QpInfo* q) {
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = l->dev->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = static_cast<uint32_t>(l->sqFree);
  qa.cap.max_recv_wr = static_cast<uint32_t>(l->sqFree);
  qa.cap.max_send_sge = 2;  // a chunk's header from the staging slot, its payload from a registration
  qa.cap.max_inline_data = kInlineBytes;
  qa.cap.max_recv_sge = 1;
  l->qp = v->createQp(l->dev->pd, &qa);
  if (l->qp == nullptr) {  // a provider without inline data refuses the request
    qa.cap.max_inline_data = 0;
    l->qp = v->createQp(l->dev->pd, &qa);
  }
  l->maxInline = l->qp ? qa.cap.max_inline_data : 0;
  if (l->qp == nullptr)
    return makeError(Code::kSystemError, "ibverbs: ibv_create_qp on %s: %s", l->ip->name().c_str(), strerror(errno));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(l->ip->port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  int rc = v->modifyQp(l->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0)
    return makeError(Code::kSystemError, "ibverbs: queue pair on %s to INIT: %s", l->ip->name().c_str(), strerror(rc));
  for (int k = 0; k < l->sqFree; ++k) C4_CHECK(postRecv(l));
  // Random: rxe (and hardware) reuse the numbers of destroyed queue pairs, and a packet a peer
  // retries towards an old one would be taken by its successor if both started from the same PSN
  // (a stray credit there overwrote slots still unread: seen as a message out of sequence).
  l->psn = static_cast<uint32_t>(rng_()) & 0xffffff;
  *q = laneInfo(l);
  return Status::ok();
}

QpInfo IbverbsTransport::laneInfo(const IbLane* l) const {
  QpInfo q{};
  q.qpn = l->qp->qp_num;
  q.psn = l->psn;
  q.ringAddr = reinterpret_cast<uint64_t>(l->mem);
  q.rkey = l->mr->rkey;
  q.lid = l->ip->lid;
  q.mtu = static_cast<uint8_t>(l->ip->mtu);
  q.ethernet = l->ip->ethernet;
  memcpy(q.gid, l->ip->gid.raw, 16);
  q.port = l->port;
  return q;
}

Status IbverbsTransport::makeLaterLane(IbConnection* c, int index, int port, IbLane** out, bool injectFailure) {
  C4_CHECK(makeLane(c, index, port));
  IbLane* l = c->lanes.back();
  Device* d = l->dev;
  Status st;
  if (injectFailure)
    st = makeError(Code::kSystemError,
                   "ibverbs: rank %d: the queue pair of lane %d to rank %d was not made "
                   "(C4_IB_FAULT_ADD_LANE)",
                   ctx_.rank, index, c->peer());
  else if (d->cq == nullptr)
    st = makeCq(d);
  else if (d->cqe > d->cqeCap)
    st = makeError(Code::kInvalidUsage,
                   "ibverbs: rank %d: no room for another lane's completions on %s (%d of %d entries; lanes are "
                   "replaced, not added without end)",
                   ctx_.rank, d->name.c_str(), d->cqe, d->cqeCap);
  QpInfo mine;
  if (st.isOk()) st = createQp(l, &mine);
  if (!st.isOk()) {
    retireUnmade(l, st.message());
    return st;
  }
  *out = l;
  return Status::ok();
}

void IbverbsTransport::retireUnmade(IbLane* l, const std::string& why) {
  // Never connected, so no completion of it can come: retired at once, its index kept taken.
  if (l->qp == nullptr) l->dev->cqe -= 2 * l->sqFree;
  l->failed = true;
  l->stats.setRetiredWhy(why);
  l->stats.setState(LaneState::kRetired);
}

Status IbverbsTransport::connectLane(IbLane* l) {
  const QpInfo& r = l->remote;
  const std::string what = strFormat("lane %d to rank %d (%s qp %s -> qp %s)", l->stats.index(), l->conn->peer(),
                                     l->ip->name().c_str(), hexQp(l->qp->qp_num).c_str(), hexQp(r.qpn).c_str());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(l->ip->mtu, r.mtu));
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn & 0xffffff;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = static_cast<uint8_t>(l->ip->port);
  a.ah_attr.dlid = r.lid;
  if (l->ip->ethernet || r.ethernet) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(l->ip->gidIndex);
    a.ah_attr.grh.hop_limit = 64;
    // RoCE v2's UDP source port (what ECMP hashes) follows the flow label where one is set: the
    // kernel's rdma_flow_label_to_udp_sport (rxe since 5.17; mlx5) makes 49152 | (label & 0x3fff)
    // ^ (label >> 14): a label below 2^14 gives 49152 + label.
    if (l->sourcePort >= kRoceSportMin) a.ah_attr.grh.flow_label = l->sourcePort - kRoceSportMin;
  }
  int rc = v->modifyQp(l->qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return makeError(Code::kSystemError, "ibverbs: %s: to RTR: %s", what.c_str(), strerror(rc));
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = static_cast<uint8_t>(paramIbTimeout());
  s.retry_cnt = static_cast<uint8_t>(paramIbRetryCnt());
  s.rnr_retry = 7;
  s.sq_psn = l->psn;  // what the peer was told (QpInfo::psn)
  s.max_rd_atomic = 1;
  rc = v->modifyQp(
      l->qp, &s,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return makeError(Code::kSystemError, "ibverbs: %s: to RTS: %s", what.c_str(), strerror(rc));
  l->credits = slots;
  l->up = true;
  l->stats.setEndpoints(l->port,
                        l->ip->name() + " " + l->ip->gidText + " qp " + hexQp(l->qp->qp_num) +
                            (l->sourcePort >= kRoceSportMin ? " udp " + std::to_string(l->sourcePort) : std::string()),
                        ib::gidText(*reinterpret_cast<const ibv_gid*>(r.gid)) + " qp " + hexQp(r.qpn));
  l->stats.setState(LaneState::kUp);
  C4_INFO(kLogNet, "ibverbs: rank %d: lane %d to rank %d: %s %s qp %s -> %s qp %s, udp source port %s%s%s", ctx_.rank,
          l->stats.index(), l->conn->peer(), l->ip->name().c_str(), l->ip->gidText.c_str(),
          hexQp(l->qp->qp_num).c_str(), ib::gidText(*reinterpret_cast<const ibv_gid*>(r.gid)).c_str(),
          hexQp(r.qpn).c_str(),
          l->sourcePort >= kRoceSportMin ? std::to_string(l->sourcePort).c_str() : "(the device's)",
          l->path.empty() ? "" : "; C4P path ", l->path.c_str());
  return Status::ok();
}

Status IbverbsTransport::setup() {
  const int n = ctx_.nranks, me = ctx_.rank;
  lanesPer_ = static_cast<int>(paramIbQpsPerConnection());
  slotBytes = static_cast<size_t>(paramIbSlotBytes());
  slots = static_cast<uint32_t>(paramIbSlots());
  // Can this rank do it at all? Every rank learns every other's answer, so that a rank without a
  // device fails every rank at once (and under auto all fall back together).
  Status mine = ib::loadVerbs(&v);
  if (mine.isOk()) mine = ib::discoverPorts(*v, &ports_);
  std::vector<SetupHdr> g0(static_cast<size_t>(n));
  SetupHdr& h = g0[static_cast<size_t>(me)];
  h.ok = mine.isOk();
  h.nports = static_cast<int32_t>(ports_.size());
  h.lanes = lanesPer_;
  snprintf(h.why, sizeof(h.why), "%s", mine.message().c_str());
  C4_CHECK(ctx_.oob->allGather(g0.data(), sizeof(SetupHdr)));
  if (!mine.isOk()) return mine;
  for (int r = 0; r < n; ++r) {
    const SetupHdr& g = g0[static_cast<size_t>(r)];
    if (!g.ok)
      return makeError(Code::kRemoteError, "ibverbs: rank %d cannot use RDMA: %s", r,
                       std::string(g.why, strnlen(g.why, sizeof(g.why))).c_str());
  }
  for (const SetupHdr& r : g0) peerPorts_.push_back(r.nports);
  // The devices' completion channels join it as their queues are made (startLanes); core reads
  // waitFd() before that.
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  return Status::ok();
}

Status IbverbsTransport::startLanes() {
  if (started_) return Status::ok();
  started_ = true;
  const int n = ctx_.nranks, me = ctx_.rank;
  // 1. Each lane's ports and source port: the plan of the pair's lower rank (C4P has planned by
  //    now), which the higher one follows.
  const size_t slice1 = sizeof(PortPair) * static_cast<size_t>(n) * static_cast<size_t>(lanesPer_);
  std::vector<char> g1(slice1 * static_cast<size_t>(n), 0);
  auto pairs = [&](int r) { return reinterpret_cast<PortPair*>(g1.data() + slice1 * static_cast<size_t>(r)); };
  for (int p = 0; p < n; ++p)
    for (int l = 0; l < lanesPer_; ++l) {
      PortPair& pp = pairs(me)[p * lanesPer_ + l];
      pp.local = pp.remote = -1;
      pp.sourcePort = 0;
      if (p > me && ctx_.lanePlan) {
        const LanePlan plan = ctx_.lanePlan(p, l);
        pp.local = static_cast<int16_t>(plan.localPort);
        pp.remote = static_cast<int16_t>(plan.remotePort);
        if (plan.sourcePort >= kRoceSportMin) pp.sourcePort = plan.sourcePort;
      }
      if (p > me && pp.sourcePort == 0 && paramIbSourcePortBase() > 0)
        pp.sourcePort = static_cast<uint16_t>(std::min<int64_t>(paramIbSourcePortBase() + l, 65535));
    }
  C4_CHECK(ctx_.oob->allGather(g1.data(), slice1));
  // 2. Queue pairs for every peer, their lanes on the ports the lower rank planned. What fails
  //    here on one rank is told to every rank with the addresses (an ok flag before them), and the
  //    last step is an exchange of ok flags, not a barrier: no rank waits for one that gave up.
  const size_t qpBytes = sizeof(QpInfo) * static_cast<size_t>(n) * static_cast<size_t>(lanesPer_);
  const size_t slice2 = sizeof(SetupHdr) + qpBytes;
  std::vector<char> g2(slice2 * static_cast<size_t>(n), 0);
  auto hdr2 = [&](int r) { return reinterpret_cast<SetupHdr*>(g2.data() + slice2 * static_cast<size_t>(r)); };
  auto info = [&](int r, int p, int l) {
    return reinterpret_cast<QpInfo*>(g2.data() + slice2 * static_cast<size_t>(r) + sizeof(SetupHdr)) + p * lanesPer_ +
           l;
  };
  auto build = [&]() -> Status {
    conns_.resize(static_cast<size_t>(n));
    const int np = static_cast<int>(ports_.size());
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      conns_[static_cast<size_t>(p)] = std::make_unique<IbConnection>(this, p);
      IbConnection* c = conns_[static_cast<size_t>(p)].get();
      const int theirPorts = peerPorts_[static_cast<size_t>(p)];
      for (int l = 0; l < lanesPer_; ++l) {
        int port;
        if (me < p) {
          port = pairs(me)[p * lanesPer_ + l].local;
        } else {
          const PortPair& pp = pairs(p)[me * lanesPer_ + l];
          const int theirs = pp.local >= 0 ? pp.local % theirPorts : l % theirPorts;
          port = pp.remote >= 0 ? pp.remote : theirs;
        }
        if (port < 0) port = l;
        C4_CHECK(makeLane(c, l, port % np));
        // Both directions of the lane leave from the source port the lower rank's plan asked for.
        c->lanes.back()->sourcePort = (me < p ? pairs(me)[p * lanesPer_ + l] : pairs(p)[me * lanesPer_ + l]).sourcePort;
        if (ctx_.lanePlan) c->lanes.back()->path = ctx_.lanePlan(p, l).label;
      }
    }
    for (auto& d : devices_) C4_CHECK(makeCq(d.get()));
    for (auto& lp : lanes_) C4_CHECK(createQp(lp.get(), info(me, lp->conn->peer(), lp->stats.index())));
    return Status::ok();
  };
  // Every rank's outcome, told to every rank (an exchange that is also a barrier).
  auto agree = [&](const Status& st, SetupHdr* mineHdr, const std::function<SetupHdr*(int)>& of, void* data,
                   size_t bytes, const char* what) -> Status {
    mineHdr->ok = st.isOk();
    snprintf(mineHdr->why, sizeof(mineHdr->why), "%s", st.message().c_str());
    C4_CHECK(ctx_.oob->allGather(data, bytes));
    if (!st.isOk()) return st;
    for (int r = 0; r < n; ++r)
      if (!of(r)->ok)
        return makeError(Code::kRemoteError, "ibverbs: rank %d could not %s: %s", r, what,
                         std::string(of(r)->why, strnlen(of(r)->why, sizeof(of(r)->why))).c_str());
    return Status::ok();
  };
  C4_CHECK(agree(build(), hdr2(me), hdr2, g2.data(), slice2, "set up its queue pairs"));
  Status connected;
  for (auto& lp : lanes_) {
    lp->remote = *info(lp->conn->peer(), me, lp->stats.index());
    if (connected.isOk()) connected = connectLane(lp.get());
  }
  // Nobody writes before every queue pair is ready to receive.
  std::vector<SetupHdr> g3(static_cast<size_t>(n));
  C4_CHECK(agree(
      connected, &g3[static_cast<size_t>(me)], [&](int r) { return &g3[static_cast<size_t>(r)]; }, g3.data(),
      sizeof(SetupHdr), "connect its queue pairs"));
  const int64_t now = nowMs();
  for (auto& c : conns_)
    if (c) c->lastHeardMs = now;
  C4_INFO(kLogNet, "ibverbs: rank %d: %d queue pair(s) per peer over %zu port(s) (%s ...), %u slots of %zu bytes each",
          me, lanesPer_, ports_.size(), ports_.empty() ? "" : ports_[0].name().c_str(), slots, slotBytes);
  return Status::ok();
}

// ---- data path ---------------------------------------------------------------------------------------

Status IbverbsTransport::postData(IbLane* l, SendMsg* m, uint64_t offset, size_t len, const char* src, bool again) {
  const uint32_t slot = l->next;
  char* stage = staging(l, slot);
  auto* h = reinterpret_cast<ChunkHdr*>(stage);
  h->magic = kChunkMagic;
  h->len = static_cast<uint32_t>(len);
  h->msgSeq = m->seq;
  h->offset = offset;
  h->total = m->bytes;
  h->sig = m->sig;
  h->pad = 0;
  // From a registration the payload goes straight from the caller's buffer (a second gather
  // entry); else it is copied into the staging slot behind the header.
  const uint32_t regKey = m->region != nullptr && len > 0 ? m->region->lkey(l->dev) : 0;
  ibv_sge sge[2] = {};
  sge[0].addr = reinterpret_cast<uint64_t>(stage);
  sge[0].lkey = l->mr->lkey;
  int nsge = 1;
  if (regKey != 0) {
    sge[0].length = sizeof(ChunkHdr);
    sge[1].addr = reinterpret_cast<uint64_t>(src);
    sge[1].length = static_cast<uint32_t>(len);
    sge[1].lkey = regKey;
    nsge = 2;
  } else {
    if (len) memcpy(stage + sizeof(ChunkHdr), src, len);
    sge[0].length = static_cast<uint32_t>(sizeof(ChunkHdr) + len);
  }
  const uint32_t wireBytes = static_cast<uint32_t>(sizeof(ChunkHdr) + len);
  ibv_send_wr wr{};
  wr.wr_id = (static_cast<uint64_t>(l->id) << 8) | kWrData;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | (wireBytes <= l->maxInline ? IBV_SEND_INLINE : 0);
  wr.imm_data = htonl(kImmData | slot);
  wr.wr.rdma.remote_addr = l->remote.ringAddr + slot * slotBytes;
  wr.wr.rdma.rkey = l->remote.rkey;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(l->qp, &wr, &bad);
  if (rc != 0)
    return makeError(Code::kSystemError, "ibverbs: lane %d to rank %d: ibv_post_send: %s", l->stats.index(),
                     l->conn->peer(), strerror(rc));
  l->next = (slot + 1) % slots;
  --l->credits;
  --l->sqFree;
  l->inflight.push_back({m, static_cast<uint32_t>(len), slot, offset});
  if (!again) {
    m->posted += len;
    ++m->chunks;
    m->started = true;
  }
  l->stats.addSent(wireBytes);
  l->stats.addPieces(1, again ? 1 : 0);
  return Status::ok();
}

Status IbverbsTransport::postCtrl(IbLane* l, uint32_t imm, WrKind kind, const std::string& text) {
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.wr_id = (static_cast<uint64_t>(l->id) << 8) | kind;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  if (!text.empty()) {  // written into the peer's control area
    char* stage = l->mem + 2 * slots * slotBytes + kCtrlBytes;
    const size_t n = std::min(text.size(), kCtrlBytes - 1);
    memcpy(stage, text.data(), n);
    stage[n] = 0;
    sge.addr = reinterpret_cast<uint64_t>(stage);
    sge.length = static_cast<uint32_t>(n + 1);
    sge.lkey = l->mr->lkey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.wr.rdma.remote_addr = l->remote.ringAddr + slots * slotBytes;
    wr.wr.rdma.rkey = l->remote.rkey;
  } else {
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.num_sge = 0;
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(l->qp, &wr, &bad);
  if (rc != 0)
    return makeError(Code::kSystemError, "ibverbs: lane %d to rank %d: ibv_post_send: %s", l->stats.index(),
                     l->conn->peer(), strerror(rc));
  --l->sqFree;
  return Status::ok();
}

void IbverbsTransport::laneFailed(IbLane* l, const std::string& why, bool tellPeer) {
  if (l->failed) return;
  l->failed = true;
  IbConnection* c = l->conn;
  l->stats.addError();
  l->stats.setRetiredWhy(why);
  l->stats.setState(LaneState::kRetired);
  l->stats.setBusy(false, detail::nowNs());
  // Its outstanding work requests flush; whatever the peer still writes there is lost (and sent
  // again by the peer, whom we tell).
  if (l->qp != nullptr) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)v->modifyQp(l->qp, &a, IBV_QP_STATE);
  }
  c->reordered = true;
  // A chunk sent from a registration was not staged: it goes again from the caller's buffer, which
  // stays valid until its send completes (after every chunk is credited).
  for (const Inflight& f : l->inflight)
    c->resend.push_back({f.msg, f.offset, f.len,
                         f.msg->region != nullptr ? f.msg->buf + f.offset : staging(l, f.slot) + sizeof(ChunkHdr)});
  const size_t again = l->inflight.size();
  l->inflight.clear();
  l->credits = 0;
  if (c->adding == l->stats.index()) c->adding = -1;
  IbLane* live = nullptr;
  for (IbLane* x : c->lanes)
    if (!x->failed && x->up && live == nullptr) live = x;
  if (live == nullptr) {
    c->fail(makeError(Code::kRemoteError,
                      "ibverbs: rank %d: lane %d to rank %d (%s), its last, failed: %s; C4_IB_TIMEOUT=%lld, "
                      "C4_IB_RETRY_CNT=%lld",
                      ctx_.rank, l->stats.index(), c->peer(), l->ip->name().c_str(), why.c_str(),
                      static_cast<long long>(paramIbTimeout()), static_cast<long long>(paramIbRetryCnt())));
    return;
  }
  C4_WARN(kLogNet,
          "ibverbs: rank %d: lane %d to rank %d (%s%s%s) retired: %s; %zu chunk(s) go again on the other lanes",
          ctx_.rank, l->stats.index(), c->peer(), l->ip->name().c_str(), l->path.empty() ? "" : ", C4P path ",
          l->path.c_str(), why.c_str(), again);
  if (tellPeer && live->sqFree > 0)
    (void)postCtrl(live, kImmPing | static_cast<uint32_t>(1 + l->stats.index()), kWrCtrl);
  markActive(c);
}

Status IbverbsTransport::registerMemory(const void* base, size_t bytes, MemSpace space,
                                        std::unique_ptr<MemRegion>* out) {
  if ((spaceBit(space) & kHostSpaces) == 0 || base == nullptr || bytes == 0) {
    *out = std::make_unique<MemRegion>(base, bytes, space);  // nothing to register: sends copy
    return Status::ok();
  }
  auto r = std::make_unique<IbRegion>(base, bytes, space);
  for (auto& d : devices_) {
    // Read by the NIC only (the send side): no write access, so read-only pages register too.
    ibv_mr* mr = v->regMr(d->pd, const_cast<void*>(base), bytes, 0);
    if (mr == nullptr) {
      const int e = errno;
      for (auto& m : r->mrs) v->deregMr(m.second);
      return makeError(Code::kSystemError,
                       "ibverbs: registering %zu bytes at %p on %s: %s (ulimit -l, the locked-memory limit, may be "
                       "too low)",
                       bytes, base, d->name.c_str(), strerror(e));
    }
    r->mrs.push_back({d.get(), mr});
  }
  *out = std::move(r);
  return Status::ok();
}

Status IbverbsTransport::deregisterMemory(MemRegion* region) {
  auto* r = dynamic_cast<IbRegion*>(region);
  if (r == nullptr) return Status::ok();
  Status st;
  for (auto& m : r->mrs)
    if (v->deregMr(m.second) != 0 && st.isOk())
      st = makeError(Code::kSystemError, "ibverbs: ibv_dereg_mr: %s", strerror(errno));
  r->mrs.clear();
  return st;
}

Status IbverbsTransport::faultDrill(int peer, int lane, LaneFault fault) {
  if (!started_ || !canConnect(peer) || lane < 0 || lane >= conns_[static_cast<size_t>(peer)]->numLanes())
    return makeError(Code::kInvalidArgument, "ibverbs: no lane %d to rank %d", lane, peer);
  if (fault != LaneFault::kReset)
    return makeError(Code::kInvalidUsage, "ibverbs: only the reset drill (the queue pair to the error state) exists");
  // As a NIC fault would: the queue pair errs, its work requests flush, and the flush retires it.
  IbLane* l = conns_[static_cast<size_t>(peer)]->lanes[static_cast<size_t>(lane)];
  if (l->failed || l->qp == nullptr)
    return makeError(Code::kInvalidUsage, "ibverbs: lane %d to rank %d is retired already", lane, peer);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  const int rc = v->modifyQp(l->qp, &a, IBV_QP_STATE);
  if (rc != 0) return makeError(Code::kSystemError, "ibverbs: queue pair to the error state: %s", strerror(rc));
  return Status::ok();
}

void IbverbsTransport::onCompletion(const ibv_wc& wc) {
  const size_t id = static_cast<size_t>(wc.wr_id >> 8);
  if (id >= lanes_.size()) return;
  IbLane* l = lanes_[id].get();
  const auto kind = static_cast<WrKind>(wc.wr_id & 0xff);
  if (kind != kWrRecv) ++l->sqFree;
  if (kind == kWrCtrl) l->pinging = false;
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status == IBV_WC_WR_FLUSH_ERR && (l->failed || !aborted_.isOk())) return;
    laneFailed(l, strFormat("completion error: %s (status %d, vendor error 0x%x) on a %s", v->wcStatusStr(wc.status),
                            static_cast<int>(wc.status), wc.vendor_err,
                            kind == kWrRecv   ? "receive"
                            : kind == kWrData ? "data write"
                                              : "control message"));
    return;
  }
  if (kind != kWrRecv) return;
  IbConnection* c = l->conn;
  c->lastHeardMs = nowMs();
  const uint32_t imm = ntohl(wc.imm_data);
  Status st = postRecv(l);
  if (!st.isOk()) {
    laneFailed(l, st.message());
    return;
  }
  switch (imm & kImmKind) {
    case kImmData:
      l->ready.push_back(imm & ~kImmKind);
      l->stats.addRecv(wc.byte_len);
      ++progressCount_;
      break;
    case kImmCredit: {
      uint32_t k = imm & ~kImmKind;
      l->credits += k;
      ++progressCount_;
      for (; k > 0 && !l->inflight.empty(); --k) {
        Inflight f = l->inflight.front();
        l->inflight.pop_front();
        ++f.msg->acked;
      }
      if (l->inflight.empty()) l->stats.setBusy(false, detail::nowNs());
      break;
    }
    case kImmAbort: {
      if ((imm & ~kImmKind) == 1) {
        onLaneAddMsg(l);
        break;
      }
      const char* text = l->mem + slots * slotBytes;
      c->fail(makeError(Code::kRemoteError, "ibverbs: rank %d aborted: %.*s", c->peer(), static_cast<int>(kCtrlBytes),
                        text));
      break;
    }
    default: {  // a ping, or the peer retired a lane
      const uint32_t retired = imm & ~kImmKind;
      if (retired > 0 && retired <= c->lanes.size())
        laneFailed(c->lanes[retired - 1], strFormat("rank %d retired it", c->peer()), false);
      break;
    }
  }
  markActive(c);
}

Status IbverbsTransport::connect(int peer, Connection** out) {
  if (!canConnect(peer)) return makeError(Code::kInvalidArgument, "ibverbs: no connection to rank %d", peer);
  if (!aborted_.isOk()) return aborted_;
  if (!started_)
    return makeError(Code::kInternalError, "ibverbs: rank %d: connection to rank %d before startLanes", ctx_.rank,
                     peer);
  *out = conns_[static_cast<size_t>(peer)].get();
  return Status::ok();
}

Status IbverbsTransport::progress() {
  if (!aborted_.isOk()) return aborted_;
  ibv_wc wcs[kPollBatch];
  for (auto& d : devices_) {
    if (d->cq == nullptr) continue;  // opened, but no lane of it got so far as a queue pair
    for (;;) {
      const int k = ibv_poll_cq(d->cq, kPollBatch, wcs);
      if (k < 0) return makeError(Code::kSystemError, "ibverbs: ibv_poll_cq on %s failed (%d)", d->name.c_str(), k);
      for (int i = 0; i < k; ++i) onCompletion(wcs[i]);
      if (k < kPollBatch) break;
    }
  }
  const int64_t now = nowMs();
  Status first;
  for (size_t i = 0; i < active_.size(); ++i) {
    IbConnection* c = active_[i];
    c->pump();
    if (!c->standing.isOk() && first.isOk()) first = c->standing;
    if (c->standing.isOk() && !c->recvs.empty() && now - c->lastHeardMs > kPingAfterMs) {
      // Receives wait and the peer said nothing for a while: probe it. A dead peer fails the probe
      // (retries exhausted: C4_IB_TIMEOUT x C4_IB_RETRY_CNT) and with it the connection.
      C4_INFO(kLogNet, "ibverbs: rank %d: probing rank %d (receives wait, nothing heard for %lld ms)", ctx_.rank,
              c->peer(), static_cast<long long>(now - c->lastHeardMs));
      for (IbLane* l : c->lanes)
        if (!l->failed && l->up && !l->pinging && l->sqFree > 0 && postCtrl(l, kImmPing, kWrCtrl).isOk())
          l->pinging = true;
      c->lastHeardMs = now;
    }
    if (c->standing.isOk() && c->busy() && ctx_.timeoutMs > 0 && now - c->lastHeardMs > ctx_.timeoutMs)
      c->fail(makeError(Code::kRemoteError, "ibverbs: rank %d: nothing from rank %d for %lld ms", ctx_.rank, c->peer(),
                        static_cast<long long>(ctx_.timeoutMs)));
  }
  pruneActive(&active_, [](const IbConnection& c) {
    if (c.busy()) return true;
    for (const IbLane* l : c.lanes)
      if (!l->ready.empty() || l->toCredit > 0) return true;
    return false;
  });
  return first;
}

void IbverbsTransport::abort(const std::string& reason) {
  if (!aborted_.isOk()) return;
  const std::string text = strFormat("rank %d: %s", ctx_.rank, reason.c_str());
  for (auto& c : conns_) {
    if (!c) continue;
    for (IbLane* l : c->lanes)
      if (!l->failed && l->sqFree > 0) (void)postCtrl(l, kImmAbort, kWrCtrl, reason);
  }
  const Status st = makeError(Code::kRemoteError, "ibverbs: %s", text.c_str());
  for (auto& c : conns_)
    if (c) c->fail(st);
  aborted_ = st;
}

// ---- connection ----------------------------------------------------------------------------------------

void IbConnection::fail(const Status& st) {
  if (standing.isOk()) standing = st;
  for (auto& m : sends)
    if (!m->finished) {
      m->finished = true;
      failRequest(m->req, st);
    }
  sends.clear();
  for (auto& r : recvs) failRequest(r.req, st);
  recvs.clear();
  resend.clear();
  stash.clear();
  for (IbLane* l : lanes) {
    l->inflight.clear();
    l->ready.clear();
  }
}

Status IbConnection::isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint) {
  const Status standingNow = !t_->aborted_.isOk() ? t_->aborted_ : standing;
  C4_CHECK(startSend("ibverbs", peer_, standingNow, buf, bytes, req));
  auto m = std::make_unique<SendMsg>();
  m->req = req;
  m->buf = buf.bytes();
  m->bytes = bytes;
  m->sig = sig;
  m->seq = sendSeq++;
  const auto* reg = dynamic_cast<const IbRegion*>(buf.region);
  if (reg != nullptr && bytes > 0 && reg->covers(buf.ptr, bytes)) m->region = reg;
  sends.push_back(std::move(m));
  t_->markActive(this);
  return Status::ok();
}

Status IbConnection::irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) {
  const Status standingNow = !t_->aborted_.isOk() ? t_->aborted_ : standing;
  C4_CHECK(startRecv("ibverbs", peer_, standingNow, dst, bytes, red, req));
  RecvMsg r;
  r.req = req;
  r.dst = dst;
  r.bytes = bytes;
  r.sig = sig;
  if (red) {
    r.hasRed = true;
    r.red = *red;
  }
  recvs.push_back(r);
  t_->markActive(this);
  return Status::ok();
}

const ChunkHdr* IbConnection::head(IbLane* l) const {
  if (l->ready.empty()) return nullptr;
  return reinterpret_cast<const ChunkHdr*>(l->mem + static_cast<size_t>(l->ready.front()) * t_->slotBytes);
}

void IbConnection::consume(IbLane* l) {
  l->ready.pop_front();
  ++l->toCredit;
}

Status IbConnection::peek(bool* ready, OpSig* sig, size_t* bytes) {
  *ready = false;
  if (!t_->aborted_.isOk()) return t_->aborted_;
  if (!standing.isOk()) return standing;
  if (!recvs.empty()) return Status::ok();
  auto it = stash.lower_bound({recvSeq, 0});
  if (it != stash.end() && it->first.first == recvSeq) {
    const auto* h = reinterpret_cast<const ChunkHdr*>(it->second.data());
    *ready = true;
    *sig = h->sig;
    *bytes = h->total;
    return Status::ok();
  }
  for (IbLane* l : lanes) {
    const ChunkHdr* h = head(l);
    if (h && h->magic == kChunkMagic && h->msgSeq == recvSeq) {
      *ready = true;
      *sig = h->sig;
      *bytes = h->total;
      return Status::ok();
    }
  }
  return Status::ok();
}

bool IbConnection::deliver(const ChunkHdr* h) {
  RecvMsg& r = recvs.front();
  if (!r.checked) {
    Status m = matchError("ibverbs", peer_, t_->peerText(peer_), t_->rank(), h->sig, h->total, r.sig, r.bytes);
    if (!m.isOk()) {
      fail(m);  // the message cannot be received in order any more
      return false;
    }
    r.checked = true;
  }
  if (!r.offsets.insert(h->offset).second) return true;  // sent again after a lane failed: once is enough
  const char* payload = reinterpret_cast<const char*>(h) + sizeof(ChunkHdr);
  if (h->len) {
    if (r.hasRed)
      reduceInto(r.red, r.dst.bytes(), h->offset, payload, h->len);
    else
      memcpy(r.dst.bytes() + h->offset, payload, h->len);
  }
  r.got += h->len;
  if (r.got == r.bytes) {
    completeRequest(r.req);
    recvs.pop_front();
    ++recvSeq;
  }
  return true;
}

bool IbConnection::pumpRecv() {
  bool moved = false;
  for (bool again = true; again && standing.isOk();) {
    again = false;
    // Chunks copied aside, when their message's turn has come.
    while (!recvs.empty() && standing.isOk()) {
      auto it = stash.lower_bound({recvSeq, 0});
      if (it == stash.end() || it->first.first != recvSeq) break;
      std::vector<char> chunk = std::move(it->second);
      stash.erase(it);
      if (!deliver(reinterpret_cast<const ChunkHdr*>(chunk.data()))) return moved;
      moved = again = true;
    }
    for (IbLane* l : lanes) {
      while (standing.isOk()) {
        const ChunkHdr* h = head(l);
        if (h == nullptr) break;
        if (h->magic != kChunkMagic || h->len > t_->slotBytes - sizeof(ChunkHdr) || h->offset + h->len > h->total) {
          fail(makeError(Code::kRemoteError, "ibverbs: rank %d: a malformed chunk from rank %d on lane %d", t_->rank(),
                         peer_, l->stats.index()));
          return moved;
        }
        if (h->msgSeq < recvSeq) {  // a message received whole already: a chunk sent again
          consume(l);
          moved = true;
          continue;
        }
        if (h->msgSeq == recvSeq && !recvs.empty()) {
          if (!deliver(h)) return moved;
          consume(l);
          moved = again = true;
          continue;
        }
        if (reordered && h->msgSeq > recvSeq) {  // a later message's, ahead of a re-sent chunk
          const char* p = reinterpret_cast<const char*>(h);
          stash.emplace(std::make_pair(h->msgSeq, h->offset), std::vector<char>(p, p + sizeof(ChunkHdr) + h->len));
          consume(l);
          moved = again = true;
          continue;
        }
        break;  // a later message's, or nobody receives yet
      }
    }
  }
  // Credits back for what was copied out.
  for (IbLane* l : lanes)
    if (l->toCredit > 0 && !l->failed && l->sqFree > 0 && standing.isOk()) {
      if (t_->postCtrl(l, kImmCredit | l->toCredit, kWrCredit).isOk()) l->toCredit = 0;
    }
  return moved;
}

IbLane* IbConnection::pickLane() {
  // Smooth weighted round robin over the lanes that can take a chunk now (credits and send-queue
  // room; two entries stay for credits and control messages).
  if (weights.size() != lanes.size()) weights.assign(lanes.size(), 1.0);
  if (credit.size() != lanes.size()) credit.assign(lanes.size(), 0.0);
  double total = 0;
  IbLane* best = nullptr;
  size_t bi = 0;
  for (size_t i = 0; i < lanes.size(); ++i) {
    IbLane* l = lanes[i];
    if (l->failed || weights[i] <= 0 || l->credits == 0 || l->sqFree <= 2) continue;
    credit[i] += weights[i];
    total += weights[i];
    if (best == nullptr || credit[i] > credit[bi]) best = l, bi = i;
  }
  if (best) credit[bi] -= total;
  return best;
}

bool IbConnection::pumpSend() {
  bool moved = false;
  // Chunks of failed lanes first, from their staged copies.
  while (!resend.empty() && standing.isOk()) {
    IbLane* pick = pickLane();
    if (pick == nullptr) return moved;
    const Resend r = resend.front();
    Status st = t_->postData(pick, r.msg, r.offset, r.len, r.payload, true);
    if (!st.isOk()) {
      t_->laneFailed(pick, st.message());
      continue;
    }
    resend.pop_front();
    pick->stats.setBusy(true, detail::nowNs());
    moved = true;
  }
  // Every chunk of a message goes out before any of the next: the receiver takes each lane's
  // chunks in order, so a later message's chunk ahead of an earlier one's would block that lane.
  for (auto& mp : sends) {
    SendMsg* m = mp.get();
    if (m->started && m->posted == m->bytes) continue;
    while (standing.isOk() && (!m->started || m->posted < m->bytes)) {
      IbLane* pick = pickLane();
      if (pick == nullptr) return moved;
      const size_t len = std::min(m->bytes - m->posted, t_->slotBytes - sizeof(ChunkHdr));
      Status st = t_->postData(pick, m, m->posted, len, m->buf + m->posted, false);
      if (!st.isOk()) {
        t_->laneFailed(pick, st.message());
        continue;
      }
      pick->stats.setBusy(true, detail::nowNs());
      moved = true;
    }
    break;  // a message still has chunks to go
  }
  return moved;
}

Status IbConnection::setLaneWeights(const std::vector<double>& w) {
  if (w.size() != lanes.size())
    return makeError(Code::kInvalidArgument, "ibverbs: %zu weights for %zu lanes", w.size(), lanes.size());
  double live = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] < 0 || (lanes[i]->failed && w[i] > 0))
      return makeError(Code::kInvalidArgument, "ibverbs: weight %g for lane %zu (%s)", w[i], i,
                       lanes[i]->failed ? "retired" : "negative");
    if (!lanes[i]->failed) live += w[i];
  }
  if (live <= 0) return makeError(Code::kInvalidArgument, "ibverbs: every live lane would get weight 0");
  weights = w;
  for (size_t i = 0; i < lanes.size(); ++i) lanes[i]->stats.setWeight(w[i]);
  credit.assign(lanes.size(), 0.0);
  return Status::ok();
}

Status IbConnection::retireLane(int i, const std::string& why) {
  if (i < 0 || i >= numLanes()) return makeError(Code::kInvalidArgument, "ibverbs: no lane %d to rank %d", i, peer_);
  IbLane* l = lanes[static_cast<size_t>(i)];
  if (l->failed) return makeError(Code::kInvalidUsage, "ibverbs: lane %d to rank %d is retired already", i, peer_);
  int live = 0;
  for (const IbLane* x : lanes) live += !x->failed && x->up;
  if (live <= 1 && l->up)
    return makeError(Code::kInvalidUsage, "ibverbs: lane %d is the last live lane to rank %d (the connection would go)",
                     i, peer_);
  t_->laneFailed(l, why, true);
  return Status::ok();
}

Status IbConnection::addLane(const LanePlan& plan, int* index) { return t_->addLane(this, plan, index); }

Status IbverbsTransport::addLane(IbConnection* c, const LanePlan& plan, int* index) {
  if (!c->standing.isOk()) return c->standing;
  if (c->peer() < ctx_.rank)
    return makeError(Code::kInvalidUsage,
                     "ibverbs: rank %d: lanes to rank %d are added by rank %d, the lower rank, which plans them",
                     ctx_.rank, c->peer(), c->peer());
  if (c->adding >= 0)
    return makeError(Code::kInvalidUsage, "ibverbs: rank %d: lane %d to rank %d is still being added", ctx_.rank,
                     c->adding, c->peer());
  IbLane* ctl = nullptr;
  for (IbLane* x : c->lanes)
    if (!x->failed && x->up && x->sqFree > 2 && ctl == nullptr) ctl = x;
  if (ctl == nullptr)
    return makeError(Code::kRemoteError, "ibverbs: rank %d: no live lane to rank %d to add one through", ctx_.rank,
                     c->peer());
  const int np = static_cast<int>(ports_.size());
  const int idx = c->numLanes();
  const int port = plan.localPort >= 0 ? plan.localPort % np : idx % np;
  IbLane* l = nullptr;
  Status made = makeLaterLane(c, idx, port, &l, paramIbFaultAddLane() != 0);
  if (!made.isOk()) {
    // Booked and retired here: the peer books it too (else the ends would number later lanes
    // differently, and it would refuse every later request). Its answer ends the add.
    LaneAddMsg b{};
    b.magic = kLaneMagic;
    b.kind = kAddBooked;
    b.lane = idx;
    snprintf(b.why, sizeof(b.why), "%s", made.message().c_str());
    if (postCtrl(ctl, kImmAbort | 1, kWrCtrl, std::string(reinterpret_cast<const char*>(&b), sizeof(b))).isOk())
      c->adding = idx;
    return made;
  }
  if (plan.sourcePort >= kRoceSportMin)
    l->sourcePort = plan.sourcePort;
  else if (paramIbSourcePortBase() > 0)
    l->sourcePort = static_cast<uint16_t>(std::min<int64_t>(paramIbSourcePortBase() + idx, 65535));
  l->path = plan.label;
  LaneAddMsg m{};
  m.magic = kLaneMagic;
  m.kind = kAddRequest;
  m.lane = idx;
  m.port = plan.remotePort;
  m.sourcePort = l->sourcePort;
  m.qp = laneInfo(l);
  snprintf(m.path, sizeof(m.path), "%s", l->path.c_str());
  Status st = postCtrl(ctl, kImmAbort | 1, kWrCtrl, std::string(reinterpret_cast<const char*>(&m), sizeof(m)));
  if (!st.isOk()) {
    laneFailed(l, "its request could not be sent: " + st.message(), false);
    return st;
  }
  c->adding = idx;
  *index = idx;
  C4_INFO(kLogNet, "ibverbs: rank %d: adding lane %d to rank %d on %s (asked through lane %d)", ctx_.rank, idx,
          c->peer(), l->ip->name().c_str(), ctl->stats.index());
  return Status::ok();
}

void IbverbsTransport::onLaneAddMsg(IbLane* via) {
  IbConnection* c = via->conn;
  LaneAddMsg m;
  memcpy(&m, via->mem + slots * slotBytes, sizeof(m));
  if (m.magic != kLaneMagic) {
    c->fail(makeError(Code::kRemoteError, "ibverbs: rank %d: rank %d sent a malformed lane-control message", ctx_.rank,
                      c->peer()));
    return;
  }
  m.why[sizeof(m.why) - 1] = 0;
  m.path[sizeof(m.path) - 1] = 0;
  if (m.kind == kAddBooked) {
    // The peer (the lower rank) could not make its end: book the index here, retired, and say so.
    LaneAddMsg a{};
    a.magic = kLaneMagic;
    a.lane = m.lane;
    a.kind = kAddRefuse;
    const std::string why = strFormat("rank %d could not make its end: %s", c->peer(), m.why);
    Status st;
    if (c->peer() > ctx_.rank)
      st = makeError(Code::kInvalidUsage, "rank %d is not the lower rank of the pair", c->peer());
    else if (m.lane != c->numLanes())
      st = makeError(Code::kInvalidUsage, "lane %d booked, lane %d expected", m.lane, c->numLanes());
    // On the port of the lane the message came by: its device is open and has its completion queue
    // (a placeholder on another port could open a device that has none, which progress() polls).
    if (st.isOk()) st = makeLane(c, m.lane, via->port);
    if (st.isOk()) {
      retireUnmade(c->lanes.back(), why);
      C4_WARN(kLogNet, "ibverbs: rank %d: lane %d to rank %d booked retired: %s", ctx_.rank, m.lane, c->peer(),
              why.c_str());
    } else {
      C4_WARN(kLogNet, "ibverbs: rank %d: could not book lane %d of rank %d: %s", ctx_.rank, m.lane, c->peer(),
              st.message().c_str());
    }
    snprintf(a.why, sizeof(a.why), "booked retired");
    Status sent = postCtrl(via, kImmAbort | 1, kWrCtrl, std::string(reinterpret_cast<const char*>(&a), sizeof(a)));
    if (!sent.isOk()) laneFailed(via, "the answer to a lane booking could not be sent: " + sent.message());
    return;
  }
  if (m.kind == kAddRequest) {
    // The peer (the lower rank) adds a lane: make this end, connect it, and answer with its address.
    // It sends nothing on the lane until the peer grants its credits (the peer's end is not ready
    // to receive before it has the answer).
    LaneAddMsg a{};
    a.magic = kLaneMagic;
    a.lane = m.lane;
    IbLane* l = nullptr;
    Status st;
    const int np = static_cast<int>(ports_.size());
    if (c->peer() > ctx_.rank)
      st = makeError(Code::kInvalidUsage, "rank %d is not the lower rank of the pair", c->peer());
    else if (m.lane != c->numLanes())
      st = makeError(Code::kInvalidUsage, "lane %d asked for, lane %d expected", m.lane, c->numLanes());
    if (st.isOk()) st = makeLaterLane(c, m.lane, m.port >= 0 ? m.port % np : m.lane % np, &l);
    if (st.isOk()) {
      l->sourcePort = m.sourcePort;
      l->path = m.path;
      l->remote = m.qp;
      st = connectLane(l);
    }
    if (st.isOk()) {
      l->credits = 0;
      a.kind = kAddAccept;
      a.qp = laneInfo(l);
    } else {
      a.kind = kAddRefuse;
      snprintf(a.why, sizeof(a.why), "%s", st.message().c_str());
      if (l != nullptr) laneFailed(l, "could not be added: " + st.message(), false);
      C4_WARN(kLogNet, "ibverbs: rank %d: refused lane %d from rank %d: %s", ctx_.rank, m.lane, c->peer(),
              st.message().c_str());
    }
    Status sent = postCtrl(via, kImmAbort | 1, kWrCtrl, std::string(reinterpret_cast<const char*>(&a), sizeof(a)));
    if (!sent.isOk()) laneFailed(via, "the answer to a lane request could not be sent: " + sent.message());
    return;
  }
  // The answer to this end's request.
  if (m.lane != c->adding || m.lane < 0 || m.lane >= c->numLanes()) {
    C4_WARN(kLogNet, "ibverbs: rank %d: rank %d answered for lane %d, which is not being added", ctx_.rank, c->peer(),
            m.lane);
    return;
  }
  IbLane* l = c->lanes[static_cast<size_t>(m.lane)];
  c->adding = -1;
  if (m.kind != kAddAccept) {
    laneFailed(l, strFormat("rank %d refused it: %s", c->peer(), m.why), false);
    return;
  }
  l->remote = m.qp;
  Status st = connectLane(l);
  // Both ends are ready to receive now: the peer may send on the lane (its credits: every slot here).
  if (st.isOk()) st = postCtrl(l, kImmCredit | slots, kWrCredit);
  if (!st.isOk()) laneFailed(l, "could not be connected: " + st.message());
  markActive(c);
}

void IbConnection::pump() {
  if (!standing.isOk()) return;
  pumpRecv();
  pumpSend();
  while (!sends.empty()) {
    SendMsg* m = sends.front().get();
    if (!(m->started && m->posted == m->bytes && m->acked == m->chunks)) break;
    completeRequest(m->req);
    m->finished = true;
    sends.pop_front();
  }
}

std::string IbConnection::describeState() const {
  std::string s = strFormat("%zu send(s), %zu receive(s) pending", sends.size(), recvs.size());
  if (!resend.empty() || !stash.empty())
    s += strFormat(", %zu chunk(s) to send again, %zu set aside", resend.size(), stash.size());
  for (const IbLane* l : lanes)
    s += strFormat("; lane %d (%s): %s, %u credit(s), %zu chunk(s) unacknowledged, %zu waiting", l->stats.index(),
                   l->ip->name().c_str(), l->failed ? "failed" : "up", l->credits, l->inflight.size(), l->ready.size());
  return s;
}

}  // namespace

bool ibverbsAutoEnabled() { return paramIbDisable() == 0; }

Status createIbverbsTransport(const Context& ctx, std::unique_ptr<Transport>* out) {
  auto t = std::make_unique<IbverbsTransport>(ctx);
  C4_CHECK(t->setup());
  *out = std::move(t);
  return Status::ok();
}

}  // namespace c4::transport
