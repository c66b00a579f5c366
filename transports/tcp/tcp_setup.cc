// TCP transport, the transport: setup (listening on every NIC port, the rank exchange), incoming
// lanes and their handshake, connections, the progress loop, abort and peer health.
// (tcp_internal.hpp lists the parts; docs/tcp-transport.md describes the protocol.)
#include "tcp_internal.hpp"  // private to transports/tcp: not among the target's headers

namespace c4::transport::tcp {

uint64_t randomU64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    // getrandom only fails on ancient kernels; the nonce must still differ per connection.
    v = static_cast<uint64_t>(nowNs()) ^ (static_cast<uint64_t>(getpid()) << 32);
  }
  return v;
}

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

std::vector<std::string> TcpTransportImpl::portAddresses() const {
  std::vector<std::string> out;
  for (const SockAddr& a : portAddrs_) out.push_back(a.toString());
  return out;
}

Status TcpTransportImpl::faultDrill(int peer, int lane, LaneFault fault) {
  if (!canConnect(peer) || conns_.empty() || !conns_[static_cast<size_t>(peer)])
    return makeError(Code::kInvalidArgument, "tcp: fault drill: no connection from rank %d to rank %d", rank_, peer);
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

}  // namespace c4::transport::tcp

namespace c4::transport {

Status createTcpTransport(const Context& ctx, std::unique_ptr<Transport>* out) {
  if (!ctx.oob || ctx.nranks < 1 || ctx.rank < 0 || ctx.rank >= ctx.nranks || ctx.commTag.empty())
    return makeError(Code::kInvalidArgument, "tcp: bad context (rank %d of %d, tag '%s', oob %s)", ctx.rank, ctx.nranks,
                     ctx.commTag.c_str(), ctx.oob ? "set" : "null");
  auto t = std::make_unique<tcp::TcpTransportImpl>(ctx);
  C4_CHECK(t->setup(ctx.oob));
  *out = std::move(t);
  return Status::ok();
}

}  // namespace c4::transport
