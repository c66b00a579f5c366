#include "common/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <memory>

#include "common/logging.hpp"
#include "common/status.hpp"

namespace c4::detail {

int msLeft(int64_t deadlineMs) {
  int64_t left = deadlineMs - nowMs();
  if (left < 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

// ---- SockAddr ----------------------------------------------------------------------------------

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

bool SockAddr::isLoopback() const {
  if (family() == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a)) return a.s6_addr[12] == 127;
  }
  return false;
}

bool SockAddr::sameSubnet(const SockAddr& other, int prefixLen) const {
  if (family() != other.family()) return false;
  const uint8_t* a;
  const uint8_t* b;
  int bits;
  if (family() == AF_INET) {
    a = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr);
    b = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(&other.storage)->sin_addr);
    bits = 32;
  } else if (family() == AF_INET6) {
    a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr.s6_addr;
    b = reinterpret_cast<const sockaddr_in6*>(&other.storage)->sin6_addr.s6_addr;
    bits = 128;
  } else {
    return false;
  }
  int n = std::min(std::max(prefixLen, 0), bits);
  for (int i = 0; i < n; ++i) {
    int byte = i / 8, bit = 7 - i % 8;
    if (((a[byte] >> bit) & 1) != ((b[byte] >> bit) & 1)) return false;
  }
  return true;
}

std::string SockAddr::toString() const {
  char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {0};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    const sockaddr_in6* s6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
    std::string h = host;
    if (s6->sin6_scope_id != 0) {
      char ifn[IF_NAMESIZE] = {0};
      h += "%";
      h += if_indextoname(s6->sin6_scope_id, ifn) ? ifn : std::to_string(s6->sin6_scope_id);
    }
    return "[" + h + "]:" + std::to_string(port());
  }
  return "<no address>";
}

Status parseHostPort(const std::string& hostPort, SockAddr* out) {
  std::string host, port;
  if (!hostPort.empty() && hostPort[0] == '[') {
    size_t close = hostPort.find(']');
    if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
      return makeError(Code::kInvalidArgument, "bad address '%s': expected [ipv6]:port", hostPort.c_str());
    host = hostPort.substr(1, close - 1);
    port = hostPort.substr(close + 2);
  } else {
    size_t colon = hostPort.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return makeError(Code::kInvalidArgument, "bad address '%s': expected host:port", hostPort.c_str());
    host = hostPort.substr(0, colon);
    port = hostPort.substr(colon + 1);
  }
  char* end = nullptr;
  long p = strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    return makeError(Code::kInvalidArgument, "bad port '%s' in address '%s'", port.c_str(), hostPort.c_str());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return makeError(Code::kInvalidArgument, "cannot resolve host '%s' of '%s': %s", host.c_str(), hostPort.c_str(),
                     gai_strerror(rc));
  const addrinfo* pick = res;
  for (const addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      pick = ai;
      break;
    }
  }
  SockAddr a;
  memcpy(&a.storage, pick->ai_addr, pick->ai_addrlen);
  a.len = pick->ai_addrlen;
  freeaddrinfo(res);
  if (a.family() != AF_INET && a.family() != AF_INET6)
    return makeError(Code::kInvalidArgument, "address '%s' is neither IPv4 nor IPv6", hostPort.c_str());
  a.setPort(static_cast<uint16_t>(p));
  *out = a;
  return Status::ok();
}

WireAddr toWire(const SockAddr& a) {
  WireAddr w;
  if (a.family() == AF_INET) {
    w.family = 4;
    memcpy(w.addr, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
  } else if (a.family() == AF_INET6) {
    const sockaddr_in6* s6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    w.family = 6;
    w.scopeId = s6->sin6_scope_id;
    memcpy(w.addr, &s6->sin6_addr, 16);
  }
  w.port = a.port();
  return w;
}

Status fromWire(const WireAddr& w, SockAddr* out) {
  SockAddr a;
  if (w.family == 4) {
    sockaddr_in* s = reinterpret_cast<sockaddr_in*>(&a.storage);
    s->sin_family = AF_INET;
    memcpy(&s->sin_addr, w.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else if (w.family == 6) {
    sockaddr_in6* s = reinterpret_cast<sockaddr_in6*>(&a.storage);
    s->sin6_family = AF_INET6;
    memcpy(&s->sin6_addr, w.addr, 16);
    s->sin6_scope_id = w.scopeId;
    a.len = sizeof(sockaddr_in6);
  } else {
    return makeError(Code::kInvalidArgument, "unknown address family %u", w.family);
  }
  a.setPort(w.port);
  *out = a;
  return Status::ok();
}

// ---- Fd ----------------------------------------------------------------------------------------

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released even then.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

// ---- interfaces --------------------------------------------------------------------------------

std::vector<NetIf> listInterfaces(int* err) {
  std::vector<NetIf> out;
  ifaddrs* ifs = nullptr;
  if (err) *err = 0;
  if (getifaddrs(&ifs) != 0) {
    if (err) *err = errno;
    return out;
  }
  // Released however this returns (the vector's growth may throw).
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owner(ifs, freeifaddrs);
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    NetIf n;
    n.name = i->ifa_name;
    n.addr.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&n.addr.storage, i->ifa_addr, n.addr.len);
    n.addr.setPort(0);
    if (i->ifa_netmask) {
      const uint8_t* m =
          fam == AF_INET ? reinterpret_cast<const uint8_t*>(&reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr)
                         : reinterpret_cast<sockaddr_in6*>(i->ifa_netmask)->sin6_addr.s6_addr;
      int bytes = fam == AF_INET ? 4 : 16;
      for (int b = 0; b < bytes; ++b) n.prefixLen += __builtin_popcount(m[b]);
    }
    out.push_back(n);
  }
  return out;
}

bool ifNameMatches(const std::string& name, const std::string& spec) {
  if (spec.empty()) return true;
  size_t pos = 0;
  bool exclude = false, exact = false;
  if (spec[pos] == '^') exclude = true, ++pos;
  if (pos < spec.size() && spec[pos] == '=') exact = true, ++pos;
  bool matched = false;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string tok = spec.substr(pos, end - pos);
    if (!tok.empty()) {
      if (exact ? name == tok : name.compare(0, tok.size(), tok) == 0) matched = true;
    }
    pos = end + 1;
  }
  return exclude ? !matched : matched;
}

namespace {

bool isLinkLocal6(const SockAddr& a) {
  return a.family() == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
}

// Best address among `cands` (already filtered by name): IPv4, then routable IPv6, then link-local.
const NetIf* pickBest(const std::vector<const NetIf*>& cands) {
  for (const NetIf* n : cands)
    if (n->addr.family() == AF_INET) return n;
  for (const NetIf* n : cands)
    if (!isLinkLocal6(n->addr)) return n;
  return cands.empty() ? nullptr : cands.front();
}

std::string describe(const std::vector<NetIf>& ifs) {
  std::string s;
  for (const NetIf& n : ifs) s += (s.empty() ? "" : ", ") + n.name + "=" + n.addr.toString();
  return s.empty() ? "none" : s;
}

}  // namespace

Status chooseInterface(const std::string& spec, const SockAddr* reach, NetIf* out, const char* specName) {
  int err = 0;
  std::vector<NetIf> ifs = listInterfaces(&err);
  // Not "no usable interface": the cause (out of file descriptors, typically) is what to fix.
  if (err != 0) return sysError("listing the network interfaces (getifaddrs)", err);
  std::vector<const NetIf*> cands;
  if (!spec.empty()) {
    for (const NetIf& n : ifs)
      if (ifNameMatches(n.name, spec)) cands.push_back(&n);
    const NetIf* best = pickBest(cands);
    if (!best)
      return makeError(Code::kSystemError, "no interface matches %s='%s' (interfaces: %s)", specName, spec.c_str(),
                       describe(ifs).c_str());
    *out = *best;
    return Status::ok();
  }
  if (reach && reach->valid()) {
    for (const NetIf& n : ifs) {
      bool ok = reach->isLoopback() ? n.addr.isLoopback() && n.addr.family() == reach->family()
                                    : !n.addr.isLoopback() && n.addr.sameSubnet(*reach, n.prefixLen);
      if (ok) {
        *out = n;
        return Status::ok();
      }
    }
  }
  for (const NetIf& n : ifs)
    if (!n.addr.isLoopback() && n.name.compare(0, 6, "docker") != 0 && n.name != "lo") cands.push_back(&n);
  const NetIf* best = pickBest(cands);
  if (!best) {
    cands.clear();
    for (const NetIf& n : ifs)
      if (n.addr.isLoopback()) cands.push_back(&n);
    best = pickBest(cands);
  }
  if (!best)
    return makeError(Code::kSystemError, "no usable network interface (interfaces: %s)", describe(ifs).c_str());
  *out = *best;
  return Status::ok();
}

// ---- sockets -----------------------------------------------------------------------------------

namespace {

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool aborted(int abortFd) {
  if (abortFd < 0) return false;
  pollfd p{abortFd, POLLIN, 0};
  return C4_SYSCALL_RETRY(::poll(&p, 1, 0)) > 0;
}

Status abortedError(const std::string& what) { return makeError(Code::kRemoteError, "%s: aborted", what.c_str()); }

// Waits until fd is ready for `events`, the deadline passes, or abortFd is readable.
Status waitFd(int fd, short events, int64_t deadlineMs, int abortFd, const std::string& what, int64_t startMs) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {abortFd, POLLIN, 0}};
    int rc = ::poll(p, abortFd >= 0 ? 2 : 1, msLeft(deadlineMs));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return sysError(("poll for " + what).c_str(), errno);
    }
    if (abortFd >= 0 && (p[1].revents & POLLIN)) return abortedError(what);
    if (rc > 0 && p[0].revents) return Status::ok();
    if (nowMs() >= deadlineMs)
      return makeError(Code::kRemoteError, "%s: timed out after %lld ms", what.c_str(),
                       static_cast<long long>(nowMs() - startMs));
  }
}

}  // namespace

Status listenSocket(const SockAddr& addr, int backlog, bool reuseAddr, Fd* out, SockAddr* bound) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return sysError("socket", errno);
  if (reuseAddr) {
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (::bind(fd.get(), addr.sa(), addr.len) != 0)
    return makeError(Code::kSystemError, "bind to %s: %s", addr.toString().c_str(), strerror(errno));
  if (::listen(fd.get(), backlog) != 0) return sysError("listen", errno);
  SockAddr b;
  b.len = sizeof(b.storage);
  if (::getsockname(fd.get(), b.sa(), &b.len) != 0) return sysError("getsockname", errno);
  *bound = b;
  *out = std::move(fd);
  return Status::ok();
}

Status connectSocket(const SockAddr& addr, int64_t deadlineMs, int abortFd, Fd* out) {
  const int64_t start = nowMs();
  const std::string what = "connect to " + addr.toString();
  int backoffMs = 1;
  for (;;) {
    if (aborted(abortFd)) return abortedError(what);
    Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return sysError("socket", errno);
    tune(fd.get());
    int rc = ::connect(fd.get(), addr.sa(), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      // A connect interrupted by a signal continues asynchronously, like EINPROGRESS.
      C4_CHECK(waitFd(fd.get(), POLLOUT, deadlineMs, abortFd, what, start));
      socklen_t len = sizeof(err);
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      *out = std::move(fd);
      return Status::ok();
    }
    bool retry = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
                 err == ECONNRESET || err == EAGAIN;
    if (!retry) return makeError(Code::kSystemError, "%s: %s", what.c_str(), strerror(err));
    if (nowMs() + backoffMs >= deadlineMs)
      return makeError(Code::kRemoteError, "%s: %s for %lld ms (nobody listening there?)", what.c_str(), strerror(err),
                       static_cast<long long>(nowMs() - start));
    // The listener may not exist yet (e.g. a fixed C4_COMM_ID root that starts later): back off,
    // waking early on abort.
    pollfd p{abortFd, POLLIN, 0};
    C4_SYSCALL_RETRY(::poll(&p, abortFd >= 0 ? 1 : 0, backoffMs));
    backoffMs = std::min(backoffMs * 2, 100);
  }
}

Status acceptSocket(int listenFd, Fd* out, SockAddr* peer, int* err) {
  SockAddr a;
  a.len = sizeof(a.storage);
  int fd = C4_SYSCALL_RETRY(::accept4(listenFd, a.sa(), &a.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (fd < 0) {
    const int e = errno;
    // ECONNABORTED & co: the connection died in the queue; nothing to accept now.
    if (e == EAGAIN || e == EWOULDBLOCK || e == ECONNABORTED || e == EPROTO) return Status::ok();
    if (err) *err = e;
    return sysError("accept", e);
  }
  tune(fd);
  out->reset(fd);
  if (peer) *peer = a;
  return Status::ok();
}

namespace {
constexpr int64_t kAcceptReportEveryMs = 10000;
constexpr int kAcceptMaxBackoffMs = 1000;
}  // namespace

Status AcceptGuard::accept(int listenFd, Fd* out, SockAddr* peer) {
  const int64_t now = nowMs();
  if (paused(now)) return Status::ok();
  int err = 0;
  Status st = acceptSocket(listenFd, out, peer, &err);
  if (st.isOk()) {
    if (out->valid()) {
      backoffMs_ = 0;  // progress: the next failure pauses briefly again
    } else if (failing_) {
      // The queue is empty and nothing failed: the episode is over.
      failing_ = false;
      if (episodeReported_)
        C4_WARN_ALWAYS(kLogNet, "%s: accepting connections again (%llu accept(s) failed for lack of resources so far)",
                       who_.c_str(), static_cast<unsigned long long>(failures_));
    }
    return st;
  }
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return st;
  ++failures_;
  backoffMs_ = backoffMs_ == 0 ? 1 : std::min(backoffMs_ * 2, kAcceptMaxBackoffMs);
  resumeAtMs_ = now + backoffMs_;
  std::string what = "accept: " + std::string(strerror(err));
  if (err == EMFILE) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    what += strFormat(" (this process has reached its limit of %llu open files, ulimit -n)",
                      static_cast<unsigned long long>(rl.rlim_cur));
  } else if (err == ENFILE) {
    what += " (the system-wide limit of open files, fs.file-max)";
  }
  const bool reported = report(what + "; new connections wait in the queue, accepts paused up to 1 s at a time");
  if (!failing_) episodeReported_ = reported;
  failing_ = true;
  return Status::ok();
}

void AcceptGuard::limitReached(const std::string& limit) {
  ++drops_;
  report("dropping new connections: " + limit);
}

bool AcceptGuard::report(const std::string& what) {
  const int64_t now = nowMs();
  if (lastReportMs_ != 0 && now - lastReportMs_ < kAcceptReportEveryMs) {
    ++unreported_;
    return false;
  }
  if (unreported_ > 0)
    C4_WARN_ALWAYS(kLogNet, "%s: %s (and %llu more like it in the last %lld s)", who_.c_str(), what.c_str(),
                   static_cast<unsigned long long>(unreported_), static_cast<long long>((now - lastReportMs_) / 1000));
  else
    C4_WARN_ALWAYS(kLogNet, "%s: %s", who_.c_str(), what.c_str());
  unreported_ = 0;
  lastReportMs_ = now;
  return true;
}

Status readSome(int fd, void* data, size_t bytes, size_t* moved) {
  *moved = 0;
  if (bytes == 0) return Status::ok();
  ssize_t n = C4_SYSCALL_RETRY(::read(fd, data, bytes));  // read(): also works on pipes
  if (n > 0) {
    *moved = static_cast<size_t>(n);
    return Status::ok();
  }
  if (n == 0) return makeError(Code::kRemoteError, "connection closed by peer");
  if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
  return makeError(Code::kRemoteError, "read: %s", strerror(errno));
}

Status writeSome(int fd, const void* data, size_t bytes, size_t* moved) {
  *moved = 0;
  if (bytes == 0) return Status::ok();
  ssize_t n = C4_SYSCALL_RETRY(::send(fd, data, bytes, MSG_NOSIGNAL));
  if (n >= 0) {
    *moved = static_cast<size_t>(n);
    return Status::ok();
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
  return makeError(Code::kRemoteError, "send: %s", strerror(errno));
}

Status sendRecvAll(int sendFd, const void* sdata, size_t sbytes, int recvFd, void* rdata, size_t rbytes,
                   int64_t deadlineMs, int abortFd, const std::string& what) {
  const int64_t start = nowMs();
  const char* sp = static_cast<const char*>(sdata);
  char* rp = static_cast<char*>(rdata);
  size_t sent = 0, got = 0;
  // Optimistic first attempt: small messages usually complete without a poll.
  for (;;) {
    if (sent < sbytes) {
      size_t n = 0;
      Status st = writeSome(sendFd, sp + sent, sbytes - sent, &n);
      if (!st.isOk()) return makeError(st.code(), "%s: %s", what.c_str(), st.message().c_str());
      sent += n;
    }
    if (got < rbytes) {
      size_t n = 0;
      Status st = readSome(recvFd, rp + got, rbytes - got, &n);
      if (!st.isOk()) return makeError(st.code(), "%s: %s", what.c_str(), st.message().c_str());
      got += n;
    }
    if (sent == sbytes && got == rbytes) return Status::ok();
    pollfd p[3];
    int np = 0, si = -1, ri = -1, ai = -1;
    if (sent < sbytes) si = np, p[np++] = {sendFd, POLLOUT, 0};
    if (got < rbytes) ri = np, p[np++] = {recvFd, POLLIN, 0};
    if (abortFd >= 0) ai = np, p[np++] = {abortFd, POLLIN, 0};
    int rc = ::poll(p, np, msLeft(deadlineMs));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return sysError(("poll for " + what).c_str(), errno);
    }
    if (ai >= 0 && (p[ai].revents & POLLIN)) return abortedError(what);
    (void)si;
    (void)ri;
    if (rc == 0 && nowMs() >= deadlineMs)
      return makeError(Code::kRemoteError, "%s: timed out after %lld ms (%zu of %zu bytes sent, %zu of %zu received)",
                       what.c_str(), static_cast<long long>(nowMs() - start), sent, sbytes, got, rbytes);
  }
}

Status sendAll(int fd, const void* data, size_t bytes, int64_t deadlineMs, int abortFd, const std::string& what) {
  return sendRecvAll(fd, data, bytes, -1, nullptr, 0, deadlineMs, abortFd, what);
}

Status recvAll(int fd, void* data, size_t bytes, int64_t deadlineMs, int abortFd, const std::string& what) {
  return sendRecvAll(-1, nullptr, 0, fd, data, bytes, deadlineMs, abortFd, what);
}

}  // namespace c4::detail
