// Bootstrap implementation.
//
// Protocol (all integers in host byte order: ranks of one communicator share an architecture).
//  * Handshake, on every TCP connection (to the root, ring links, send/recv links). The acceptor
//    sends a Challenge {magic, version, nonceS}; the connector answers AuthReq {magic, role, rank,
//    nonceC, macC = SipHash(secret, "c4-client" nonceS role rank nonceC)}; the acceptor checks macC
//    and answers AuthResp {magic, macS = SipHash(secret, "c4-server" nonceS role rank nonceC)}; the
//    connector checks macS. Fresh random nonces on both sides: replaying an old exchange proves
//    nothing, and neither side talks to a party that does not hold the secret. This authenticates
//    connection set-up only; later bytes are not MAC'ed (an on-path attacker is out of scope).
//  * Root: after the handshake (role kRoleRoot) a rank sends Register {rank, nranks, ms left of its
//    timeout, RankInfo, listen address}. The root learns nranks from the first registration,
//    answers bad ones (duplicate rank, other nranks, rank out of range) with an error Reply, and
//    when all ranks registered closes its listener and sends everyone Reply{ok} + the table
//    {RankInfo, address} x nranks, then exits. If ranks are missing when the earliest registered
//    rank's timeout is about to expire (or after C4_BOOTSTRAP_TIMEOUT), it sends the registered
//    ranks an error Reply naming the missing ranks, and exits.
//  * Ring: rank r connects to r+1 (role kRoleRing) and is connected to by r-1. allGather is the
//    ring algorithm (n-1 steps; step s sends slice r-s and receives slice r-s-1, each with a header
//    {op, seq, bytes} that detects mismatched calls); barrier is an allGather of 0 bytes.
//  * send/recv: the first send to a peer opens a connection (role kRoleP2p) that carries frames
//    {magic, tag, bytes} + payload from this rank to that peer, in order.
//
// Threading: the root is a detached thread driving all its connections with poll() (a slow or
// hostile client cannot stall the others; each must finish its handshake and registration within
// C4_BOOTSTRAP_HANDSHAKE_TIMEOUT). Each Bootstrap owns one progress thread that accepts on the
// rank's listening socket, runs the server side of handshakes non-blockingly, hands the ring link
// to the caller and reads send/recv frames into per-(peer, tag) queues. The caller's threads do
// the connecting side, the ring collectives and sends. An eventfd, written once by abort() or the
// destructor and never drained, is part of every poll(), so abort() wakes every blocked call.
#include "core/bootstrap.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>

#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/siphash.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"
#include "core/bootstrap_wire.hpp"

namespace c4 {

namespace {
// C4_COMM_ID's syntax: host:port or [ipv6]:port with a port 1..65535 (the name is resolved at use).
bool checkHostPortSpec(const std::string& hp, std::string* why) {
  const bool v6 = !hp.empty() && hp[0] == '[';
  const size_t colon = v6 ? hp.find("]:") : hp.rfind(':');
  const size_t hostLen = v6 ? colon - 1 : colon;
  if (colon == std::string::npos || hostLen == 0) {
    *why = "expected host:port or [ipv6]:port";
    return false;
  }
  const std::string port = hp.substr(colon + (v6 ? 2 : 1));
  char* end = nullptr;
  const long p = strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 1 || p > 65535) {
    *why = "the port must be 1..65535";
    return false;
  }
  return true;
}
}  // namespace

// C4_SOCKET_IFNAME (paramSocketIfname) lives in common/socket.hpp: the tcp transport reads it too.
C4_PARAM_STR(CommId, "C4_COMM_ID", "NCCL_COMM_ID", "", checkHostPortSpec, kParamNone,
             "host:port of the bootstrap root; fixes the root address instead of an ephemeral port")
C4_PARAM_STR(Secret, "C4_SECRET", nullptr, "", {}, kParamNone,
             "Seed of the bootstrap secret when ids are derived (C4_COMM_ID, launcher init); default: the "
             "job key or address, which is not a security boundary")
C4_PARAM_INT(BootstrapTimeout, "C4_BOOTSTRAP_TIMEOUT", nullptr, 300000, 1, 604800000, kParamNone,
             "Milliseconds a bootstrap root serves before giving up on ranks that never arrive")
C4_PARAM_INT(BootstrapHandshakeTimeout, "C4_BOOTSTRAP_HANDSHAKE_TIMEOUT", nullptr, 5000, 1, 3600000, kParamNone,
             "Milliseconds an incoming bootstrap connection has to authenticate (and register) before it is "
             "dropped")

namespace {

using detail::Fd;
using detail::NetIf;
using detail::nowMs;
using detail::SockAddr;
using detail::WireAddr;

// The wire format and the checks of what arrives (core/bootstrap_wire.hpp).
using bootwire::AuthReq;
using bootwire::AuthResp;
using bootwire::Challenge;
using bootwire::decodeId;
using bootwire::describeRank;
using bootwire::encodeId;
using bootwire::FrameHdr;
using bootwire::FrameReader;
using bootwire::IdLayout;
using bootwire::kAuthMagic;
using bootwire::kChallengeMagic;
using bootwire::kFrameMagic;
using bootwire::kProtoVersion;
using bootwire::kRegisterMagic;
using bootwire::kReplyMagic;
using bootwire::kRingMagic;
using bootwire::kRoleP2p;
using bootwire::kRoleRing;
using bootwire::kRoleRoot;
using bootwire::proofMac;
using bootwire::RegisterMsg;
using bootwire::ReplyHdr;
using bootwire::RingHdr;
using bootwire::roleName;
using bootwire::Secret;
using bootwire::TableEntry;

constexpr size_t kMaxPendingConns = 4096;

Status randomBytes(void* buf, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return sysError("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::ok();
}

std::string hexOf(const uint8_t* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[p[i] >> 4], s += kHex[p[i] & 15];
  return s;
}

// "1,3-5,9"
std::string formatRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

// ---- server side of the handshake (non-blocking, used by the root and the rank progress thread) -

struct ServerConn {
  Fd fd;
  SockAddr peer;
  int64_t deadlineMs = 0;
  uint8_t nonce[16] = {0};
  AuthReq req{};
  size_t have = 0;
  bool authed = false;
};

// Accepts every pending connection on listenFd and sends each its challenge.
// Through `guard`: out of file descriptors, the listener pauses instead of spinning (AcceptGuard).
void acceptPending(int listenFd, int64_t handshakeMs, std::vector<std::unique_ptr<ServerConn>>* conns,
                   detail::AcceptGuard* guard, DropLog* drops, const char* who) {
  for (;;) {
    auto c = std::make_unique<ServerConn>();
    Status st = guard->accept(listenFd, &c->fd, &c->peer);
    if (!st.isOk()) {
      C4_WARN(kLogBootstrap, "%s: %s", who, st.message().c_str());
      return;
    }
    if (!c->fd.valid()) return;
    if (conns->size() >= kMaxPendingConns) {
      guard->limitReached(strFormat("%zu connections already pending authentication", conns->size()));
      continue;
    }
    Challenge ch{kChallengeMagic, kProtoVersion, {0}};
    size_t n = 0;
    if (!randomBytes(ch.nonce, 16).isOk() || !detail::writeSome(c->fd.get(), &ch, sizeof(ch), &n).isOk() ||
        n != sizeof(ch)) {
      drops->drop(c->peer.toString(), "could not send it the challenge", nowMs());
      continue;
    }
    memcpy(c->nonce, ch.nonce, 16);
    c->deadlineMs = nowMs() + handshakeMs;
    conns->push_back(std::move(c));
  }
}

// Advances the server side of the handshake. Sets *done once the peer proved the secret (and got
// our proof). A failure says why, for the caller's WARN.
Status serverAuthStep(ServerConn& c, const Secret& secret, bool* done) {
  *done = false;
  while (c.have < sizeof(AuthReq)) {
    size_t n = 0;
    C4_CHECK(detail::readSome(c.fd.get(), reinterpret_cast<char*>(&c.req) + c.have, sizeof(AuthReq) - c.have, &n));
    if (n == 0) return Status::ok();
    c.have += n;
    C4_CHECK(bootwire::checkAuthReqPrefix(c.req, c.have));
  }
  C4_CHECK(bootwire::checkAuthReq(c.req, secret, c.nonce));
  AuthResp resp{kAuthMagic, 0, proofMac(secret, true, c.nonce, c.req.role, c.req.rank, c.req.nonce)};
  size_t n = 0;
  C4_CHECK(detail::writeSome(c.fd.get(), &resp, sizeof(resp), &n));
  if (n != sizeof(resp)) return makeError(Code::kRemoteError, "does not read its socket");
  c.authed = true;
  *done = true;
  return Status::ok();
}

// Connecting side of the handshake (blocking until deadline / abort).
Status clientHandshake(int fd, const Secret& secret, uint32_t role, int32_t rank, int64_t deadlineMs, int abortFd,
                       const std::string& who) {
  Challenge ch;
  Status st = detail::recvAll(fd, &ch, sizeof(ch), deadlineMs, abortFd, "waiting for the challenge of " + who);
  if (!st.isOk()) return st;
  C4_CHECK(bootwire::checkChallenge(ch, who));
  AuthReq req;
  memset(&req, 0, sizeof(req));
  req.magic = kAuthMagic;
  req.role = role;
  req.rank = rank;
  req.version = kProtoVersion;
  C4_CHECK(randomBytes(req.nonce, 16));
  req.mac = proofMac(secret, false, ch.nonce, role, rank, req.nonce);
  C4_CHECK(detail::sendAll(fd, &req, sizeof(req), deadlineMs, abortFd, "sending our proof to " + who));
  AuthResp resp;
  st = detail::recvAll(fd, &resp, sizeof(resp), deadlineMs, abortFd, "waiting for the proof of " + who);
  if (!st.isOk()) {
    if (st.message().find("closed by peer") != std::string::npos)
      return makeError(Code::kRemoteError,
                       "%s rejected our proof of the secret (is the UniqueId from another communicator?)", who.c_str());
    return st;
  }
  return bootwire::checkAuthResp(resp, secret, ch.nonce, role, rank, req.nonce, who);
}

// ---- root ----------------------------------------------------------------------------------------

std::atomic<int> gActiveRoots{0};

struct RootConn : ServerConn {
  RegisterMsg reg{};
  size_t regHave = 0;
};

struct Root {
  Fd listen;
  SockAddr bound;
  Secret secret;
  std::string name;  // for logs: "bootstrap root <addr> comm <tag>"
  std::string removeFile;
  int64_t createdMs = 0;  // the lifetime counts from here
  int64_t lifetimeMs = 0;
  int64_t handshakeMs = 0;
};

Status sendReply(int fd, Code code, const void* payload, size_t bytes, int64_t deadlineMs, const std::string& what) {
  ReplyHdr h{kReplyMagic, static_cast<int32_t>(code), static_cast<uint32_t>(bytes), 0};
  std::vector<char> buf(sizeof(h) + bytes);
  memcpy(buf.data(), &h, sizeof(h));
  if (bytes) memcpy(buf.data() + sizeof(h), payload, bytes);
  return detail::sendAll(fd, buf.data(), buf.size(), deadlineMs, -1, what);
}

void sendErrorReply(int fd, const std::string& msg) {
  // Best effort and bounded: the peer is being dropped anyway.
  (void)sendReply(fd, Code::kInvalidUsage, msg.data(), msg.size(), nowMs() + 1000, "error reply");
}

void rootMain(std::unique_ptr<Root> root) {
  const char* who = root->name.c_str();
  const int64_t start = nowMs();
  const int64_t lifetimeDeadline = root->createdMs + root->lifetimeMs;
  int64_t failDeadline = INT64_MAX;  // set from the ranks' own timeouts
  int nranks = -1;
  int firstRank = -1;
  std::vector<std::unique_ptr<RootConn>> registered;  // by rank once nranks is known
  std::vector<std::unique_ptr<ServerConn>> accepted;  // raw accepts, moved into `pending`
  detail::AcceptGuard accepts(who);
  std::vector<std::unique_ptr<RootConn>> pending;
  std::vector<std::string> rejected;
  int arrived = 0;
  bool done = false;

  DropLog drops(who, kLogBootstrap);
  auto dropPending = [&](size_t i, const std::string& why) {
    drops.drop(pending[i]->peer.toString(), why, nowMs());
    pending.erase(pending.begin() + static_cast<long>(i));
  };

  while (!done) {
    const int64_t now = nowMs();
    drops.flush(now);
    const int64_t giveUp = std::min(lifetimeDeadline, failDeadline);
    if (now >= giveUp) break;
    int64_t wake = giveUp;
    for (auto& c : pending) wake = std::min(wake, c->deadlineMs);
    if (accepts.paused(now)) wake = std::min(wake, accepts.resumeAtMs());
    std::vector<pollfd> pfds;
    pfds.push_back({accepts.paused(now) ? -1 : root->listen.get(), POLLIN, 0});
    for (auto& c : pending) pfds.push_back({c->fd.get(), POLLIN, 0});
    int rc = ::poll(pfds.data(), pfds.size(), detail::msLeft(wake));
    if (rc < 0 && errno != EINTR) {
      C4_WARN(kLogBootstrap, "%s: poll: %s; giving up", who, strerror(errno));
      break;
    }
    // Service existing connections first (indices match pfds[1..]).
    const int64_t t = nowMs();
    for (size_t i = pending.size(); i-- > 0;) {
      RootConn& c = *pending[i];
      bool ready = rc > 0 && pfds[i + 1].revents != 0;
      if (!ready) {
        if (t >= c.deadlineMs)
          dropPending(i, strFormat("too slow: no %s within %lld ms", c.authed ? "registration" : "proof of the secret",
                                   static_cast<long long>(root->handshakeMs)));
        continue;
      }
      if (!c.authed) {
        bool ok = false;
        Status st = serverAuthStep(c, root->secret, &ok);
        if (!st.isOk()) {
          dropPending(i, st.message());
          continue;
        }
        if (!ok) continue;
        if (c.req.role != kRoleRoot) {
          dropPending(i, strFormat("authenticated but asked for role %s", roleName(c.req.role)));
          continue;
        }
      }
      while (c.regHave < sizeof(RegisterMsg)) {
        size_t n = 0;
        Status st = detail::readSome(c.fd.get(), reinterpret_cast<char*>(&c.reg) + c.regHave,
                                     sizeof(RegisterMsg) - c.regHave, &n);
        if (!st.isOk()) {
          dropPending(i, st.message());
          break;
        }
        if (n == 0) break;
        c.regHave += n;
      }
      if (i >= pending.size() || pending[i].get() != &c || c.regHave < sizeof(RegisterMsg)) continue;
      // A complete registration.
      std::unique_ptr<RootConn> conn = std::move(pending[i]);
      pending.erase(pending.begin() + static_cast<long>(i));
      const RegisterMsg& r = conn->reg;
      const std::string err = bootwire::checkRegistration(r, nranks, firstRank, [&](int k) -> const RankInfo* {
        return registered[static_cast<size_t>(k)] ? &registered[static_cast<size_t>(k)]->reg.info : nullptr;
      });
      if (!err.empty()) {
        C4_WARN(kLogBootstrap, "%s: rejected %s: %s", who, conn->peer.toString().c_str(), err.c_str());
        rejected.push_back(err);
        sendErrorReply(conn->fd.get(), "bootstrap root: " + err);
        continue;
      }
      if (nranks < 0) {
        nranks = r.nranks;
        firstRank = r.rank;
        registered.resize(nranks);
      }
      // Give up a little before the earliest rank does, so that it hears which ranks are missing.
      int64_t left = r.remainingMs;
      int64_t slack = std::min<int64_t>(1000, std::max<int64_t>(50, left / 10));
      failDeadline = std::min(failDeadline, t + std::max<int64_t>(0, left - slack));
      C4_TRACE(kLogBootstrap, "%s: rank %d/%d joined from %s", who, r.rank, nranks, conn->peer.toString().c_str());
      registered[r.rank] = std::move(conn);
      if (++arrived == nranks) done = true;
    }
    if (!done && ((rc > 0 && (pfds[0].revents & POLLIN)) || accepts.retryDue(t))) {
      accepted.clear();
      acceptPending(root->listen.get(), root->handshakeMs, &accepted, &accepts, &drops, who);
      for (auto& a : accepted) {
        auto c = std::make_unique<RootConn>();
        c->fd = std::move(a->fd);
        c->peer = a->peer;
        c->deadlineMs = a->deadlineMs;
        memcpy(c->nonce, a->nonce, 16);
        pending.push_back(std::move(c));
      }
    }
  }

  // Nobody else may reach this root once it stops serving: close the listener first, so that a
  // later root on the same fixed port can bind as soon as any rank has its answer.
  root->listen.reset();
  pending.clear();
  if (!root->removeFile.empty()) ::unlink(root->removeFile.c_str());
  const int64_t sendDeadline = nowMs() + std::max<int64_t>(root->handshakeMs, 1000);
  if (done) {
    std::vector<TableEntry> table(nranks);
    memset(static_cast<void*>(table.data()), 0, table.size() * sizeof(TableEntry));
    for (int r = 0; r < nranks; ++r) {
      table[r].info = registered[r]->reg.info;
      table[r].addr = registered[r]->reg.listen;
    }
    for (int r = 0; r < nranks; ++r) {
      Status st = sendReply(registered[r]->fd.get(), Code::kSuccess, table.data(), table.size() * sizeof(TableEntry),
                            sendDeadline, "table");
      if (!st.isOk()) C4_WARN(kLogBootstrap, "%s: sending the rank table to rank %d: %s", who, r, st.message().c_str());
    }
    C4_INFO(kLogBootstrap, "%s: served %d ranks in %lld ms", who, nranks, static_cast<long long>(nowMs() - start));
  } else {
    std::string msg;
    if (nranks < 0) {
      msg = "no rank joined";
    } else {
      std::vector<int> missing;
      for (int r = 0; r < nranks; ++r)
        if (!registered[r]) missing.push_back(r);
      msg = strFormat("%zu of %d ranks never arrived within %lld ms: missing rank%s %s", missing.size(), nranks,
                      static_cast<long long>(nowMs() - start), missing.size() == 1 ? "" : "s",
                      formatRanks(missing).c_str());
    }
    for (const std::string& r : rejected) msg += "; rejected: " + r;
    C4_WARN(kLogBootstrap, "%s: giving up: %s", who, msg.c_str());
    std::string text = "bootstrap root: " + msg;
    for (auto& c : registered)
      if (c) (void)sendReply(c->fd.get(), Code::kRemoteError, text.data(), text.size(), sendDeadline, "failure");
  }
  registered.clear();
  gActiveRoots.fetch_sub(1);
}

// Roots that no rank has reached yet wait here, all watched by one thread: an id that is never
// used (ncclGetUniqueId called for ids that are thrown away) costs a listening socket until
// C4_BOOTSTRAP_TIMEOUT, not a thread. A root's first connection gets it a serving thread of its own
// (rootMain). The watcher runs only while it has roots to watch.
class IdleRoots {
 public:
  static IdleRoots& get() {
    static IdleRoots* r = new IdleRoots();  // leaked: usable during static destruction
    return *r;
  }

  /// Takes `root` (gActiveRoots counted it already); an error if no thread can watch it.
  Status add(std::unique_ptr<Root> root) {
    std::lock_guard<std::mutex> g(mu_);
    roots_.push_back(std::move(root));
    if (running_) {
      uint64_t one = 1;
      (void)!write(wake_.get(), &one, sizeof(one));
      return Status::ok();
    }
    try {
      std::thread([this] { main(); }).detach();
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc for its state
      roots_.pop_back();
      return makeError(Code::kSystemError, "bootstrap root: cannot start a thread: %s", e.what());
    }
    running_ = true;
    return Status::ok();
  }

 private:
  IdleRoots() : wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    // A child of fork() has none of the parent's threads: it starts its own watcher for its roots.
    pthread_atfork(nullptr, nullptr, [] {
      IdleRoots& r = get();
      new (&r.mu_) std::mutex();
      for (auto& root : r.roots_) (void)root.release();  // the parent's: leave them alone
      r.roots_.clear();
      r.running_ = false;
    });
  }

  void main() {
    std::vector<pollfd> pfds;
    std::unique_lock<std::mutex> g(mu_);
    while (!roots_.empty()) {
      const int64_t now = nowMs();
      int64_t wake = INT64_MAX;
      pfds.assign(1, pollfd{wake_.get(), POLLIN, 0});
      for (auto& r : roots_) {
        pfds.push_back(pollfd{r->listen.get(), POLLIN, 0});
        wake = std::min(wake, r->createdMs + r->lifetimeMs);
      }
      g.unlock();
      (void)::poll(pfds.data(), pfds.size(), wake <= now ? 0 : detail::msLeft(wake));
      g.lock();
      if (pfds[0].revents) {
        uint64_t n;
        (void)!read(wake_.get(), &n, sizeof(n));
      }
      // pfds[1 + i] is roots_[i]: add() only appends while the lock is released.
      const int64_t t = nowMs();
      for (size_t i = pfds.size() - 1; i-- > 0;) {
        Root& r = *roots_[i];
        const bool reached = pfds[i + 1].revents != 0;
        if (!reached && t < r.createdMs + r.lifetimeMs) continue;
        std::unique_ptr<Root> root = std::move(roots_[i]);
        roots_.erase(roots_.begin() + static_cast<long>(i));
        if (!reached) {
          C4_INFO(kLogBootstrap, "%s: no rank came within %lld ms (C4_BOOTSTRAP_TIMEOUT): closed", root->name.c_str(),
                  static_cast<long long>(root->lifetimeMs));
          if (!root->removeFile.empty()) ::unlink(root->removeFile.c_str());
          gActiveRoots.fetch_sub(1);
          continue;
        }
        const std::string name = root->name;
        try {
          std::thread(rootMain, std::move(root)).detach();
        } catch (const std::exception& e) {  // the connection waits in vain; the ranks time out
          C4_WARN_ALWAYS(kLogBootstrap, "%s: cannot start its thread: %s; the root is closed", name.c_str(), e.what());
          gActiveRoots.fetch_sub(1);
        }
      }
    }
    running_ = false;
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<Root>> roots_;
  Fd wake_;
  bool running_ = false;
};

// Binds the root's listener synchronously (so errors reach the caller) and hands it to the idle
// roots' watcher.
Status startRoot(const SockAddr& bindAddr, bool fixedPort, const Secret& secret, const uint8_t tag[8],
                 const std::string& removeFile, SockAddr* bound) {
  auto root = std::make_unique<Root>();
  Status st = detail::listenSocket(bindAddr, 16384, fixedPort, &root->listen, &root->bound);
  if (!st.isOk() && fixedPort && errno == EADDRNOTAVAIL) {
    // The name of a fixed root address may resolve to an address that is not local (NAT, DNS
    // alias): listen on every address of that family instead, and say so (it exposes the root on
    // every interface, and a mistyped address would otherwise go unnoticed until ranks time out).
    C4_WARN_ALWAYS(kLogBootstrap,
                   "bootstrap root: %s (C4_COMM_ID/NCCL_COMM_ID) is not an address of this host; listening on port "
                   "%u of every %s address instead",
                   bindAddr.toString().c_str(), bindAddr.port(), bindAddr.family() == AF_INET6 ? "IPv6" : "IPv4");
    SockAddr any;
    any.storage.ss_family = static_cast<sa_family_t>(bindAddr.family());
    any.len = bindAddr.len;
    any.setPort(bindAddr.port());
    st = detail::listenSocket(any, 16384, true, &root->listen, &root->bound);
  }
  if (!st.isOk()) return makeError(st.code(), "bootstrap root: %s", st.message().c_str());
  root->secret = secret;
  root->removeFile = removeFile;
  root->lifetimeMs = std::max<int64_t>(1, paramBootstrapTimeout());
  root->handshakeMs = std::max<int64_t>(1, paramBootstrapHandshakeTimeout());
  root->name = "bootstrap root " + root->bound.toString() + " comm " + hexOf(tag, 8);
  root->createdMs = nowMs();
  const SockAddr addr = root->bound;
  gActiveRoots.fetch_add(1);
  Status added;
  try {
    added = IdleRoots::get().add(std::move(root));
  } catch (...) {  // out of memory
    gActiveRoots.fetch_sub(1);
    throw;
  }
  if (!added.isOk()) {
    gActiveRoots.fetch_sub(1);
    return added;
  }
  *bound = addr;
  return Status::ok();
}

void deriveFromSeed(const std::string& seed, const std::string& hostPort, Secret* secret, uint8_t tag[8]) {
  static const uint8_t kKey[16] = {'c', '4', 'c', 'o', 'm', 'm', '-', 'b', 'o', 'o', 't', '-', 's', 'e', 'e', 'd'};
  uint64_t parts[3];
  for (int i = 0; i < 3; ++i) {
    SipHasher h(kKey);
    uint8_t label = static_cast<uint8_t>(i);
    h.update(&label, 1);
    h.update(seed.data(), seed.size());
    if (i == 2) h.update(hostPort.data(), hostPort.size());  // the tag also depends on the address
    parts[i] = h.finish();
  }
  memcpy(secret->key, &parts[0], 8);
  memcpy(secret->key + 8, &parts[1], 8);
  memcpy(tag, &parts[2], 8);
}

Status uniqueIdForAddress(const std::string& hostPort, const std::string& seed, bool startRootHere,
                          const uint8_t* tagOverride, UniqueId* id) {
  SockAddr addr;
  C4_CHECK(detail::parseHostPort(hostPort, &addr));
  if (addr.port() == 0)
    return makeError(Code::kInvalidArgument, "bootstrap root address '%s' needs a port", hostPort.c_str());
  Secret secret;
  uint8_t tag[8];
  deriveFromSeed(seed, hostPort, &secret, tag);
  if (tagOverride) memcpy(tag, tagOverride, 8);
  if (startRootHere) {
    SockAddr bound;
    C4_CHECK(startRoot(addr, true, secret, tag, "", &bound));
  }
  encodeId(addr, secret, tag, id);
  return Status::ok();
}

Status getUniqueIdImpl(bool honorCommId, const std::string& removeFile, UniqueId* id) {
  if (id == nullptr) return makeError(Code::kInvalidArgument, "getUniqueId: id is null");
  uint8_t tag[8];
  C4_CHECK(randomBytes(tag, sizeof(tag)));
  std::string commId = paramCommId();
  if (!commId.empty() && honorCommId) {
    // Fixed root address: the id is still broadcast by the user, so the tag stays random (two
    // communicators made this way never share OS object names).
    std::string secret = paramSecret();
    return uniqueIdForAddress(commId, secret.empty() ? commId : secret, true, tag, id);
  }
  NetIf nif;
  C4_CHECK(detail::chooseInterface(paramSocketIfname(), nullptr, &nif, kC4ParamSocketIfname.setBy()));
  Secret secret;
  C4_CHECK(randomBytes(secret.key, sizeof(secret.key)));
  SockAddr bound;
  C4_CHECK(startRoot(nif.addr, false, secret, tag, removeFile, &bound));
  encodeId(bound, secret, tag, id);
  C4_INFO(kLogBootstrap, "bootstrap root listening on %s (%s) for comm %s", bound.toString().c_str(), nif.name.c_str(),
          hexOf(tag, 8).c_str());
  return Status::ok();
}

}  // namespace

// ---- public id functions ---------------------------------------------------------------------------

Status bootstrapGetUniqueId(UniqueId* id) { return getUniqueIdImpl(true, "", id); }

Status bootstrapUniqueIdForAddress(const std::string& hostPort, const std::string& secretSeed, bool startRoot,
                                   UniqueId* id) {
  if (id == nullptr) return makeError(Code::kInvalidArgument, "bootstrapUniqueIdForAddress: id is null");
  return uniqueIdForAddress(hostPort, secretSeed, startRoot, nullptr, id);
}

std::string commTagOf(const UniqueId& id) {
  IdLayout l;
  memcpy(&l, id.bytes, sizeof(l));
  return hexOf(l.tag, sizeof(l.tag));
}

namespace detail {

Status bootstrapEphemeralUniqueId(const std::string& rendezvousFile, UniqueId* id) {
  return getUniqueIdImpl(false, rendezvousFile, id);
}

Status uniqueIdRootAddress(const UniqueId& id, std::string* hostPort) {
  SockAddr a;
  C4_CHECK(decodeId(id, &a, nullptr));
  *hostPort = a.toString();
  return Status::ok();
}

int activeBootstrapRoots() { return gActiveRoots.load(); }

std::string commIdEnv() { return paramCommId(); }
std::string secretEnv() { return paramSecret(); }

}  // namespace detail

// ---- Bootstrap -------------------------------------------------------------------------------------

struct Bootstrap::Impl {
  int rank = 0;
  int nranks = 0;
  int64_t timeoutMs = 0;
  Secret secret;
  std::string prefix;  // "bootstrap rank r/n (comm tag)"
  std::vector<RankInfo> infos;
  std::vector<SockAddr> addrs;

  Fd listen;
  Fd wakeFd;  // eventfd: written by abort() / the destructor, never drained
  std::atomic<bool> aborted{false};
  int cancelFd = -1;  // the creator's: readable once it cancels (create's cancelFd); not owned
  Fd ringWakeFd;      // eventfd: written by abort() and interruptCollectives(), never drained
  std::atomic<bool> ringInterrupted{false};
  std::atomic<bool> stopping{false};
  std::thread progress;

  // Ring (caller threads, under ringMu).
  std::mutex ringMu;
  Fd ringNext;
  uint64_t ringSeq = 0;

  // Shared with the progress thread, under mu.
  std::mutex mu;
  std::condition_variable cv;
  Fd ringPrev;  // handed over by the progress thread
  std::map<std::pair<int, uint32_t>, std::deque<std::vector<char>>> inbox;
  std::vector<int> inboundOpen;         // per peer: open send/recv connections from it
  std::vector<std::string> peerErrors;  // per peer: why its send/recv stream broke ("" = fine)

  // Outgoing send/recv links (caller threads, under sendMu[peer]).
  std::unique_ptr<std::mutex[]> sendMu;
  std::vector<Fd> sendFds;

  ~Impl() { shutdown(); }

  void shutdown() {
    stopping.store(true);
    wake();
    if (progress.joinable()) progress.join();
  }
  void wake() {
    post(wakeFd);
    post(ringWakeFd);
  }
  static void post(const Fd& fd) {  // makes the eventfd readable for good
    if (!fd.valid()) return;
    uint64_t one = 1;
    ssize_t rc = C4_SYSCALL_RETRY(::write(fd.get(), &one, sizeof(one)));
    (void)rc;  // only fails when the counter would overflow: it is readable then anyway
  }
  Status abortedError(const char* op) const {
    return makeError(Code::kRemoteError, "%s: %s: aborted", prefix.c_str(), op);
  }
  /// Every blocked and later call fails fast (Bootstrap::abort, or the creator's cancelFd).
  void abortCalls() {
    {
      std::lock_guard<std::mutex> g(mu);  // pairs with the predicate checks of waiting recvs
      aborted.store(true);
    }
    wake();
    cv.notify_all();
  }
  int64_t deadline() const { return nowMs() + timeoutMs; }

  void progressMain();
  Status ringExchange(uint32_t op, void* data, size_t bytesPerRank);
};

namespace {

// Incoming send/recv stream being parsed by the progress thread.
struct InStream {
  Fd fd;
  int peer = -1;
  FrameReader frames;
};

}  // namespace

void Bootstrap::Impl::progressMain() {
  std::vector<std::unique_ptr<ServerConn>> hs;
  std::vector<std::unique_ptr<InStream>> streams;
  const int64_t handshakeMs = std::max<int64_t>(1, paramBootstrapHandshakeTimeout());
  const std::string who = prefix;
  DropLog drops(who, kLogBootstrap);
  auto drop = [&](size_t i, const std::string& why) {
    drops.drop(hs[i]->peer.toString(), why, nowMs());
    hs.erase(hs.begin() + static_cast<long>(i));
  };
  auto streamFailed = [&](size_t i, const std::string& why) {
    int peer = streams[i]->peer;
    {
      std::lock_guard<std::mutex> g(mu);
      if (--inboundOpen[peer] == 0 && peerErrors[peer].empty()) peerErrors[peer] = why;
    }
    cv.notify_all();
    streams.erase(streams.begin() + static_cast<long>(i));
  };
  std::vector<pollfd> pfds;
  detail::AcceptGuard accepts(who);
  for (;;) {
    int64_t wakeAt = INT64_MAX;
    for (auto& c : hs) wakeAt = std::min(wakeAt, c->deadlineMs);
    const bool paused = accepts.paused(nowMs());
    if (paused) wakeAt = std::min(wakeAt, accepts.resumeAtMs());
    pfds.clear();
    pfds.push_back({wakeFd.get(), POLLIN, 0});
    pfds.push_back({paused ? -1 : listen.get(), POLLIN, 0});
    for (auto& c : hs) pfds.push_back({c->fd.get(), POLLIN, 0});
    for (auto& s : streams) pfds.push_back({s->fd.get(), POLLIN, 0});
    pfds.push_back({cancelFd, POLLIN, 0});  // ignored while -1
    int rc = ::poll(pfds.data(), pfds.size(), wakeAt == INT64_MAX ? -1 : detail::msLeft(wakeAt));
    if (rc < 0) {
      if (errno == EINTR) continue;
      C4_WARN(kLogBootstrap, "%s: progress thread: poll: %s; stopping", who.c_str(), strerror(errno));
      return;
    }
    if (pfds.back().revents) {
      abortCalls();  // the creator cancelled (an abort during a nonblocking init)
      return;
    }
    if (pfds[0].revents) return;  // abort or destruction: every call fails fast from now on
    const size_t nHs = hs.size();
    const int64_t t = nowMs();
    drops.flush(t);
    // Streams (after the handshakes in pfds), newest first so erasing keeps indices valid.
    for (size_t i = streams.size(); i-- > 0;) {
      if (pfds[2 + nHs + i].revents == 0) continue;
      InStream& s = *streams[i];
      std::string fail;
      for (;;) {
        size_t room = 0, n = 0;
        char* to = s.frames.next(&room);
        Status st = detail::readSome(s.fd.get(), to, room, &n);
        if (st.isOk() && n > 0) st = s.frames.advance(n);
        if (!st.isOk()) {
          fail = st.message();
          break;
        }
        if (n == 0) break;
        if (s.frames.ready()) {
          uint32_t tag = 0;
          std::vector<char> payload;
          s.frames.take(&tag, &payload);
          {
            std::lock_guard<std::mutex> g(mu);
            inbox[{s.peer, tag}].push_back(std::move(payload));
          }
          cv.notify_all();
        }
      }
      if (!fail.empty())
        streamFailed(i, strFormat("its send/recv connection to rank %d broke: %s", rank, fail.c_str()));
    }
    for (size_t i = nHs; i-- > 0;) {
      ServerConn& c = *hs[i];
      if (pfds[2 + i].revents == 0) {
        if (t >= c.deadlineMs)
          drop(i, strFormat("too slow: no proof of the secret within %lld ms", static_cast<long long>(handshakeMs)));
        continue;
      }
      bool ok = false;
      Status st = serverAuthStep(c, secret, &ok);
      if (!st.isOk()) {
        drop(i, st.message());
        continue;
      }
      if (!ok) continue;
      const int peer = c.req.rank;
      const int prev = (rank - 1 + nranks) % nranks;
      if (peer < 0 || peer >= nranks) {
        drop(i, strFormat("authenticated but claims rank %d of %d", peer, nranks));
      } else if (c.req.role == kRoleRing && peer == prev) {
        bool dup;
        {
          std::lock_guard<std::mutex> g(mu);
          dup = ringPrev.valid();
          if (!dup) ringPrev = std::move(c.fd);
        }
        if (dup) {
          // The caller may be using the established link: never swap it under its feet.
          drop(i, strFormat("rank %d opened a second ring link", peer));
          continue;
        }
        cv.notify_all();
        hs.erase(hs.begin() + static_cast<long>(i));
      } else if (c.req.role == kRoleP2p) {
        auto s = std::make_unique<InStream>();
        s->fd = std::move(c.fd);
        s->peer = peer;
        {
          std::lock_guard<std::mutex> g(mu);
          ++inboundOpen[peer];
          peerErrors[peer].clear();
        }
        streams.push_back(std::move(s));
        hs.erase(hs.begin() + static_cast<long>(i));
      } else {
        drop(i,
             strFormat("rank %d asked for role %s, which this rank does not serve to it", peer, roleName(c.req.role)));
      }
    }
    if ((pfds[1].revents & POLLIN) || accepts.retryDue(nowMs()))
      acceptPending(listen.get(), handshakeMs, &hs, &accepts, &drops, who.c_str());
  }
}

Status Bootstrap::create(const UniqueId& id, int rank, int nranks, const RankInfo& mine, int64_t timeoutMs,
                         std::unique_ptr<Bootstrap>* out, int cancelFd) {
  const int64_t start = nowMs();
  if (out == nullptr) return makeError(Code::kInvalidArgument, "Bootstrap::create: out is null");
  if (nranks <= 0 || rank < 0 || rank >= nranks)
    return makeError(Code::kInvalidArgument, "Bootstrap::create: rank %d of nranks %d is out of range", rank, nranks);
  if (timeoutMs <= 0)
    return makeError(Code::kInvalidArgument, "Bootstrap::create: timeoutMs %lld <= 0",
                     static_cast<long long>(timeoutMs));
  const int64_t deadline = start + timeoutMs;
  auto impl = std::make_unique<Impl>();
  SockAddr rootAddr;
  C4_CHECK(decodeId(id, &rootAddr, &impl->secret));
  impl->rank = rank;
  impl->nranks = nranks;
  impl->timeoutMs = timeoutMs;
  impl->cancelFd = cancelFd;
  impl->prefix = strFormat("bootstrap rank %d/%d comm %s", rank, nranks, commTagOf(id).c_str());
  const char* pfx = impl->prefix.c_str();
  impl->inboundOpen.assign(nranks, 0);
  impl->peerErrors.assign(nranks, "");
  impl->sendMu.reset(new std::mutex[nranks]);
  impl->sendFds.resize(nranks);

  // 1. Listen where the others can reach us, and start serving incoming connections.
  NetIf nif;
  C4_CHECK(detail::chooseInterface(paramSocketIfname(), &rootAddr, &nif, kC4ParamSocketIfname.setBy()));
  SockAddr myAddr;
  Status st = detail::listenSocket(nif.addr, 4096, false, &impl->listen, &myAddr);
  if (!st.isOk()) return makeError(st.code(), "%s: %s", pfx, st.message().c_str());
  impl->wakeFd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wakeFd.valid()) return sysError("eventfd", errno);
  impl->ringWakeFd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->ringWakeFd.valid()) return sysError("eventfd", errno);
  try {
    impl->progress = std::thread([p = impl.get()] { p->progressMain(); });
  } catch (const std::system_error& e) {
    return makeError(Code::kSystemError, "%s: cannot start the progress thread: %s", pfx, e.what());
  }

  // 2. Join through the root.
  const std::string rootWho = "the bootstrap root at " + rootAddr.toString();
  Fd rootFd;
  // Until the ring is up, every wait also ends when the creator cancels (impl->wakeFd: the progress
  // thread posts it then).
  const int abortFd = impl->wakeFd.get();
  st = detail::connectSocket(rootAddr, deadline, abortFd, &rootFd);
  if (!st.isOk()) return makeError(st.code(), "%s: %s", pfx, st.message().c_str());
  st = clientHandshake(rootFd.get(), impl->secret, kRoleRoot, rank, deadline, abortFd, rootWho);
  if (!st.isOk()) return makeError(st.code(), "%s: %s", pfx, st.message().c_str());
  RegisterMsg reg;
  memset(static_cast<void*>(&reg), 0, sizeof(reg));
  reg.magic = kRegisterMagic;
  reg.rank = rank;
  reg.nranks = nranks;
  reg.remainingMs = static_cast<uint32_t>(std::min<int64_t>(detail::msLeft(deadline), UINT32_MAX));
  reg.info = mine;
  reg.listen = detail::toWire(myAddr);
  C4_CHECK(detail::sendAll(rootFd.get(), &reg, sizeof(reg), deadline, abortFd, impl->prefix + ": registering"));
  ReplyHdr rh;
  st = detail::recvAll(rootFd.get(), &rh, sizeof(rh), deadline, abortFd, "waiting for " + rootWho);
  if (!st.isOk()) {
    if (impl->aborted.load()) return impl->abortedError("joining");
    if (st.message().find("timed out") != std::string::npos)
      return makeError(Code::kRemoteError,
                       "%s: timed out after %lld ms waiting for %s to report all %d ranks (the root did not say which "
                       "ranks are missing)",
                       pfx, static_cast<long long>(nowMs() - start), rootWho.c_str(), nranks);
    return makeError(st.code(), "%s: %s", pfx, st.message().c_str());
  }
  C4_CHECK(bootwire::checkReplyHdr(rh, pfx, rootWho));
  std::vector<char> body(rh.bytes);
  C4_CHECK(
      detail::recvAll(rootFd.get(), body.data(), body.size(), deadline, abortFd, impl->prefix + ": reading the reply"));
  rootFd.reset();
  C4_CHECK(bootwire::decodeReply(rh, body, nranks, pfx, &impl->infos, &impl->addrs));

  // 3. Ring: connect to the next rank, wait for the previous one.
  if (nranks > 1) {
    const int next = (rank + 1) % nranks;
    const std::string nextWho = strFormat("rank %d at %s", next, impl->addrs[next].toString().c_str());
    st = detail::connectSocket(impl->addrs[next], deadline, impl->wakeFd.get(), &impl->ringNext);
    if (st.isOk())
      st = clientHandshake(impl->ringNext.get(), impl->secret, kRoleRing, rank, deadline, impl->wakeFd.get(), nextWho);
    if (!st.isOk()) return makeError(st.code(), "%s: ring link to %s: %s", pfx, nextWho.c_str(), st.message().c_str());
    std::unique_lock<std::mutex> lk(impl->mu);
    const int prev = (rank - 1 + nranks) % nranks;
    while (!impl->ringPrev.valid()) {
      if (impl->aborted.load()) return impl->abortedError("waiting for the ring link");
      if (impl->cv.wait_until(lk, std::chrono::steady_clock::now() +
                                      std::chrono::milliseconds(detail::msLeft(deadline))) == std::cv_status::timeout &&
          !impl->ringPrev.valid() && nowMs() >= deadline)
        return makeError(Code::kRemoteError, "%s: timed out after %lld ms waiting for the ring link from rank %d (%s)",
                         pfx, static_cast<long long>(nowMs() - start), prev, describeRank(impl->infos[prev]).c_str());
    }
  }
  C4_INFO(kLogBootstrap, "%s: joined in %lld ms, listening on %s (%s)", pfx, static_cast<long long>(nowMs() - start),
          myAddr.toString().c_str(), nif.name.c_str());
  out->reset(new Bootstrap(std::move(impl)));
  return Status::ok();
}

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Bootstrap::~Bootstrap() = default;

int Bootstrap::rank() const { return impl_->rank; }
int Bootstrap::nranks() const { return impl_->nranks; }
const std::vector<RankInfo>& Bootstrap::rankInfo() const { return impl_->infos; }

void Bootstrap::abort() { impl_->abortCalls(); }

void Bootstrap::interruptCollectives() {
  impl_->ringInterrupted.store(true);
  Impl::post(impl_->ringWakeFd);
}

Status Bootstrap::Impl::ringExchange(uint32_t op, void* data, size_t bytesPerRank) {
  const char* opName = op == 1 ? "allGather" : "barrier";
  if (aborted.load()) return abortedError(opName);
  auto interruptedError = [&] {
    return makeError(Code::kRemoteError, "%s: %s: the communicator failed, its bootstrap collectives are off",
                     prefix.c_str(), opName);
  };
  if (ringInterrupted.load()) return interruptedError();
  if (nranks == 1) return Status::ok();
  std::lock_guard<std::mutex> g(ringMu);
  Fd* prevFd;
  {
    std::lock_guard<std::mutex> g2(mu);
    prevFd = &ringPrev;
  }
  const uint64_t seq = ++ringSeq;
  const int64_t dl = deadline();
  const int prev = (rank - 1 + nranks) % nranks;
  const int next = (rank + 1) % nranks;
  char* base = static_cast<char*>(data);
  std::vector<char> sbuf(sizeof(RingHdr) + bytesPerRank), rbuf(sizeof(RingHdr) + bytesPerRank);
  RingHdr h{kRingMagic, op, seq, bytesPerRank};
  memcpy(sbuf.data(), &h, sizeof(h));
  for (int s = 0; s < nranks - 1; ++s) {
    const int sendIdx = (rank - s + nranks) % nranks;
    const int recvIdx = (rank - s - 1 + nranks) % nranks;
    if (bytesPerRank) memcpy(sbuf.data() + sizeof(h), base + sendIdx * bytesPerRank, bytesPerRank);
    Status st = detail::sendRecvAll(ringNext.get(), sbuf.data(), sbuf.size(), prevFd->get(), rbuf.data(), rbuf.size(),
                                    dl, ringWakeFd.get(),
                                    strFormat("%s: %s #%llu step %d (to rank %d, from rank %d)", prefix.c_str(), opName,
                                              static_cast<unsigned long long>(seq), s, next, prev));
    if (!st.isOk()) {
      if (aborted.load()) return abortedError(opName);
      if (ringInterrupted.load()) return interruptedError();
      return st;
    }
    RingHdr in;
    memcpy(&in, rbuf.data(), sizeof(in));
    C4_CHECK(bootwire::checkRingHdr(in, op, opName, seq, bytesPerRank, prefix, prev));
    if (bytesPerRank) memcpy(base + recvIdx * bytesPerRank, rbuf.data() + sizeof(in), bytesPerRank);
  }
  return Status::ok();
}

Status Bootstrap::allGather(void* data, size_t bytesPerRank) {
  if (data == nullptr && bytesPerRank > 0) return makeError(Code::kInvalidArgument, "allGather: data is null");
  return impl_->ringExchange(1, data, bytesPerRank);
}

Status Bootstrap::barrier() { return impl_->ringExchange(2, nullptr, 0); }

Status Bootstrap::broadcast(uint32_t tag, std::string* data) {
  constexpr uint64_t kMaxBytes = 256u << 20;
  const int n = nranks(), r = rank();
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if ((r & mask) == 0) continue;
    // The parent: r without its lowest set bit.
    uint64_t bytes = 0;
    C4_CHECK(recv(r - mask, tag, &bytes, sizeof(bytes)));
    if (bytes > kMaxBytes)
      return makeError(Code::kInternalError, "bootstrap broadcast: %llu bytes from rank %d (at most %llu)",
                       static_cast<unsigned long long>(bytes), r - mask, static_cast<unsigned long long>(kMaxBytes));
    data->assign(static_cast<size_t>(bytes), '\0');
    if (bytes) C4_CHECK(recv(r - mask, tag, &(*data)[0], data->size()));
    break;
  }
  if (r == 0 && data->size() > kMaxBytes)
    return makeError(Code::kInvalidArgument, "bootstrap broadcast: %zu bytes (at most %llu)", data->size(),
                     static_cast<unsigned long long>(kMaxBytes));
  // The children: r plus each lower bit.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (r + mask >= n) continue;
    const uint64_t bytes = data->size();
    C4_CHECK(send(r + mask, tag, &bytes, sizeof(bytes)));
    if (bytes) C4_CHECK(send(r + mask, tag, data->data(), data->size()));
  }
  return Status::ok();
}

Status Bootstrap::send(int peer, uint32_t tag, const void* data, size_t bytes) {
  return send(peer, tag, data, bytes, impl_->timeoutMs);
}

void Bootstrap::take(uint32_t tag, std::vector<std::pair<int, std::vector<char>>>* out) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.mu);
  for (auto it = m.inbox.begin(); it != m.inbox.end();) {
    if (it->first.second != tag) {
      ++it;
      continue;
    }
    for (auto& msg : it->second) out->emplace_back(it->first.first, std::move(msg));
    it = m.inbox.erase(it);
  }
}

std::string Bootstrap::peerAddress(int peer) const {
  if (peer < 0 || peer >= impl_->nranks) return std::string();
  return impl_->addrs[static_cast<size_t>(peer)].toString();
}

std::string Bootstrap::peerStreamError(int peer) const {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.nranks) return "no such rank";
  std::lock_guard<std::mutex> g(m.mu);
  return m.inboundOpen[static_cast<size_t>(peer)] == 0 ? m.peerErrors[static_cast<size_t>(peer)] : std::string();
}

bool Bootstrap::peerStreamOpen(int peer) const {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.nranks) return false;
  std::lock_guard<std::mutex> g(m.mu);
  return m.inboundOpen[static_cast<size_t>(peer)] > 0;
}

Status Bootstrap::send(int peer, uint32_t tag, const void* data, size_t bytes, int64_t timeoutMs) {
  return sendParts(peer, tag, nullptr, 0, data, bytes, timeoutMs);
}

Status Bootstrap::sendParts(int peer, uint32_t tag, const void* head, size_t headBytes, const void* data, size_t bytes,
                            int64_t timeoutMs) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.nranks)
    return makeError(Code::kInvalidArgument, "%s: send to rank %d of %d", m.prefix.c_str(), peer, m.nranks);
  if ((data == nullptr && bytes > 0) || (head == nullptr && headBytes > 0))
    return makeError(Code::kInvalidArgument, "%s: send: data is null", m.prefix.c_str());
  if (m.aborted.load()) return m.abortedError("send");
  if (peer == m.rank) {
    {
      std::vector<char> msg(headBytes + bytes);
      if (headBytes) memcpy(msg.data(), head, headBytes);
      if (bytes) memcpy(msg.data() + headBytes, data, bytes);
      std::lock_guard<std::mutex> g(m.mu);
      m.inbox[{peer, tag}].push_back(std::move(msg));
    }
    m.cv.notify_all();
    return Status::ok();
  }
  std::lock_guard<std::mutex> g(m.sendMu[peer]);
  const int64_t dl = nowMs() + timeoutMs;
  const std::string who = strFormat("rank %d at %s", peer, m.addrs[peer].toString().c_str());
  Fd& fd = m.sendFds[peer];
  if (!fd.valid()) {
    Fd nfd;
    Status st = detail::connectSocket(m.addrs[peer], dl, m.wakeFd.get(), &nfd);
    if (st.isOk()) st = clientHandshake(nfd.get(), m.secret, kRoleP2p, m.rank, dl, m.wakeFd.get(), who);
    if (!st.isOk()) {
      if (m.aborted.load()) return m.abortedError("send");
      return makeError(st.code(), "%s: send (tag %u) to %s: %s", m.prefix.c_str(), tag, who.c_str(),
                       st.message().c_str());
    }
    fd = std::move(nfd);
  }
  FrameHdr h{kFrameMagic, tag, headBytes + bytes};
  std::string what =
      strFormat("%s: send of %zu bytes (tag %u) to %s", m.prefix.c_str(), headBytes + bytes, tag, who.c_str());
  Status st;
  if (headBytes + bytes <= 64 * 1024) {
    // One write for small messages.
    std::vector<char> buf(sizeof(h) + headBytes + bytes);
    memcpy(buf.data(), &h, sizeof(h));
    if (headBytes) memcpy(buf.data() + sizeof(h), head, headBytes);
    if (bytes) memcpy(buf.data() + sizeof(h) + headBytes, data, bytes);
    st = detail::sendAll(fd.get(), buf.data(), buf.size(), dl, m.wakeFd.get(), what);
  } else {
    std::vector<char> first(sizeof(h) + headBytes);
    memcpy(first.data(), &h, sizeof(h));
    if (headBytes) memcpy(first.data() + sizeof(h), head, headBytes);
    st = detail::sendAll(fd.get(), first.data(), first.size(), dl, m.wakeFd.get(), what);
    if (st.isOk()) st = detail::sendAll(fd.get(), data, bytes, dl, m.wakeFd.get(), what);
  }
  if (!st.isOk()) {
    fd.reset();  // a partial frame poisons the stream; the next send reconnects
    if (m.aborted.load()) return m.abortedError("send");
  }
  return st;
}

Status Bootstrap::recv(int peer, uint32_t tag, void* data, size_t bytes, int64_t timeoutMs) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.nranks)
    return makeError(Code::kInvalidArgument, "%s: recv from rank %d of %d", m.prefix.c_str(), peer, m.nranks);
  int from = peer;
  return recvAny({peer}, tag, &from, data, bytes, timeoutMs);
}

Status Bootstrap::recvAny(const std::vector<int>& from, uint32_t tag, int* peer, void* data, size_t bytes,
                          int64_t timeoutMs) {
  Impl& m = *impl_;
  for (int p : from)
    if (p < 0 || p >= m.nranks)
      return makeError(Code::kInvalidArgument, "%s: recv from rank %d of %d", m.prefix.c_str(), p, m.nranks);
  if (from.empty()) return makeError(Code::kInvalidArgument, "%s: recv from no rank", m.prefix.c_str());
  if (data == nullptr && bytes > 0)
    return makeError(Code::kInvalidArgument, "%s: recv: data is null", m.prefix.c_str());
  const int64_t start = nowMs();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs >= 0 ? timeoutMs : m.timeoutMs);
  std::unique_lock<std::mutex> lk(m.mu);
  // The lowest rank of `from` with a message waiting, or -1.
  auto ready = [&]() {
    int best = -1;
    for (int p : from) {
      auto it = m.inbox.find(std::make_pair(p, tag));
      if (it != m.inbox.end() && !it->second.empty() && (best < 0 || p < best)) best = p;
    }
    return best;
  };
  for (;;) {
    if (m.aborted.load()) return m.abortedError("recv");
    const int p = ready();
    if (p >= 0) {
      auto it = m.inbox.find(std::make_pair(p, tag));
      std::vector<char> msg = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) m.inbox.erase(it);
      lk.unlock();
      *peer = p;
      if (msg.size() != bytes)
        return makeError(Code::kInvalidUsage, "%s: recv from rank %d (tag %u) expected %zu bytes, rank %d sent %zu",
                         m.prefix.c_str(), p, tag, bytes, p, msg.size());
      if (bytes) memcpy(data, msg.data(), bytes);
      return Status::ok();
    }
    for (int q : from)
      if (m.inboundOpen[q] == 0 && !m.peerErrors[q].empty())
        return makeError(Code::kRemoteError, "%s: recv from rank %d (tag %u): %s", m.prefix.c_str(), q, tag,
                         m.peerErrors[q].c_str());
    if (m.cv.wait_until(lk, until) == std::cv_status::timeout && std::chrono::steady_clock::now() >= until) {
      if (ready() >= 0) continue;
      const int q = from.size() == 1 ? from[0] : -1;
      return makeError(Code::kRemoteError, "%s: recv of %zu bytes from %s (tag %u) timed out after %lld ms%s",
                       m.prefix.c_str(), bytes,
                       q >= 0 ? strFormat("rank %d", q).c_str() : strFormat("any of %zu ranks", from.size()).c_str(),
                       tag, static_cast<long long>(nowMs() - start),
                       q >= 0 && m.inboundOpen[q] == 0 ? " (that rank never connected to this one)" : "");
    }
  }
}

Status clockSyncToRank0(Bootstrap& b, int rounds, int64_t timeoutMs, int64_t (*clockNs)(), ClockOffset* out) {
  // A tag of its own: pings and pongs never mix with other side-channel traffic.
  constexpr uint32_t kTagClock = 0xC10C0000u;
  const int rank = b.rank(), n = b.nranks();
  rounds = std::max(1, rounds);
  ClockOffset best;
  best.atNs = clockNs();
  const std::vector<RankInfo>& infos = b.rankInfo();
  auto sharesClock = [&](int p) { return infos[static_cast<size_t>(p)].clockId == infos[0].clockId; };
  if (rank == 0) {
    // Serve pings as they come: every rank's rounds run at once.
    std::vector<int> owed(static_cast<size_t>(n - 1), rounds);  // pings still due from rank p + 1
    std::vector<int> from;
    for (int p = 1; p < n; ++p)
      if (!sharesClock(p)) from.push_back(p);
    while (!from.empty()) {
      int64_t t0 = 0;
      int p = -1;
      C4_CHECK(b.recvAny(from, kTagClock, &p, &t0, sizeof(t0), timeoutMs));
      int64_t t12[2];
      t12[0] = clockNs();
      t12[1] = clockNs();
      C4_CHECK(b.send(p, kTagClock, t12, sizeof(t12)));
      if (--owed[static_cast<size_t>(p - 1)] == 0) from.erase(std::find(from.begin(), from.end(), p));
    }
    *out = best;
    return Status::ok();
  }
  if (sharesClock(rank)) {
    *out = best;  // rank 0's clock itself
    return Status::ok();
  }
  best.rttNs = INT64_MAX;
  for (int k = 0; k < rounds; ++k) {
    const int64_t t0 = clockNs();
    C4_CHECK(b.send(0, kTagClock, &t0, sizeof(t0)));
    int64_t t12[2];
    C4_CHECK(b.recv(0, kTagClock, t12, sizeof(t12), timeoutMs));
    const int64_t t3 = clockNs();
    const int64_t rtt = (t3 - t0) - (t12[1] - t12[0]);
    if (rtt < best.rttNs) {
      best.rttNs = rtt;
      best.offsetNs = ((t12[0] - t0) + (t12[1] - t3)) / 2;
      best.atNs = t3;
    }
  }
  *out = best;
  return Status::ok();
}

}  // namespace c4
