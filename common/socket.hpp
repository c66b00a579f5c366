// Small TCP socket helpers for the bootstrap and the tcp transport: address parsing and formatting, interface selection
// (C4_SOCKET_IFNAME semantics), listen/connect/accept, and send/recv of whole buffers with a
// deadline and an abort descriptor. Every socket is non-blocking and close-on-exec; every wait is a
// poll() with a timeout; system calls retry EINTR; writes never raise SIGPIPE.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/clock.hpp"
#include "common/params.hpp"

namespace c4 {

// Shared by the bootstrap and the tcp transport (which default to the same interface).
C4_PARAM_STR(SocketIfname, "C4_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "", {}, kParamNone,
             "Interfaces for bootstrap sockets: comma list of name prefixes; leading ^ excludes, leading = "
             "requires exact names (default: first up non-loopback non-docker interface, else loopback)")

}  // namespace c4

namespace c4::detail {

/// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  bool valid() const { return len > 0; }
  int family() const { return storage.ss_family; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  /// True if `other` is in the same subnet as this address under `prefixLen` bits.
  bool sameSubnet(const SockAddr& other, int prefixLen) const;
  /// "1.2.3.4:5", "[fe80::1%eth0]:5".
  std::string toString() const;
};

/// Parses "host:port" or "[ipv6]:port"; host may be a name (resolved, IPv4 preferred) or an
/// address literal. Port 0 is allowed (ephemeral).
Status parseHostPort(const std::string& hostPort, SockAddr* out);

/// Fixed-size wire form of a SockAddr (28 bytes, host byte order for family/port/scope).
struct WireAddr {
  uint16_t family = 0;  // 4 or 6 (0: none)
  uint16_t port = 0;
  uint32_t scopeId = 0;
  uint8_t addr[16] = {0};
  uint32_t reserved = 0;
};
static_assert(sizeof(WireAddr) == 28, "wire layout");
WireAddr toWire(const SockAddr& a);
/// Fails with kInvalidArgument on an unknown family.
Status fromWire(const WireAddr& w, SockAddr* out);

/// Owns a file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// One address of a network interface that is up.
struct NetIf {
  std::string name;
  SockAddr addr;
  int prefixLen = 0;
};

/// Every address (IPv4 and IPv6) of every interface that is up, in getifaddrs order. If getifaddrs
/// fails (out of file descriptors, say) the list is empty and `err` (optional) gets its errno.
std::vector<NetIf> listInterfaces(int* err = nullptr);

/// NCCL_SOCKET_IFNAME semantics: `spec` is a comma list of name prefixes; a leading '^' makes it an
/// exclude list; a leading '=' (after any '^') requires exact names. An empty spec matches all.
bool ifNameMatches(const std::string& name, const std::string& spec);

/// Chooses the address to listen on. With a non-empty `spec` (C4_SOCKET_IFNAME): the first
/// matching interface, IPv4 preferred over IPv6 (non-link-local first). Without: if `reach` is given,
/// loopback when reach is loopback, else an interface in reach's subnet; otherwise the first up
/// non-loopback, non-docker interface with an IPv4 address, then one with an IPv6 address, else
/// loopback. Fails with kSystemError if nothing matches (naming `specName`, the variable the spec
/// came from, the spec and what exists), or if the interfaces cannot be listed (naming the cause).
Status chooseInterface(const std::string& spec, const SockAddr* reach, NetIf* out,
                       const char* specName = "C4_SOCKET_IFNAME");

/// A listening socket bound to `addr` (port 0: ephemeral). *bound gets the actual address.
Status listenSocket(const SockAddr& addr, int backlog, bool reuseAddr, Fd* out, SockAddr* bound);

/// Connects to `addr`, retrying refused/unreachable attempts (backoff 1 ms doubling to 100 ms, as
/// the peer may not listen yet) until `deadlineMs`. Fails early if `abortFd` (>= 0) becomes
/// readable. The socket is non-blocking with TCP_NODELAY.
Status connectSocket(const SockAddr& addr, int64_t deadlineMs, int abortFd, Fd* out);

/// Accepts one pending connection without blocking; *out stays invalid when none is pending. On an
/// error `err` (optional) gets its errno.
Status acceptSocket(int listenFd, Fd* out, SockAddr* peer, int* err = nullptr);

/// Paces a listener through exhaustion. An accept that fails for lack of resources
/// (EMFILE/ENFILE: out of file descriptors; ENOBUFS/ENOMEM) leaves the connection queued, so the
/// listener stays readable and a loop polling it would spin at full CPU, logging every failure.
/// Through a guard such a failure pauses the listener (1 ms, doubling to 1 s while failures go on;
/// back to 1 ms after an accept succeeds): its owner leaves it out of the poll set until
/// resumeAtMs(). An episode ends when an accept finds the queue empty without failing. Lines about
/// failures and a full pending-connection table are printed whatever C4_DEBUG says, at most one per
/// 10 s (the first at once, naming the cause and the limit; later ones count what they stood for),
/// and an episode whose start was printed prints its end. One thread uses a guard.
class AcceptGuard {
 public:
  explicit AcceptGuard(std::string who) : who_(std::move(who)) {}
  /// acceptSocket, paced: ok with *out invalid when nothing is pending, while paused, or after a
  /// failure for lack of resources (logged here); other errors are returned.
  Status accept(int listenFd, Fd* out, SockAddr* peer);
  /// Whether the listener must stay out of the poll set now.
  bool paused(int64_t nowMs) const { return nowMs < resumeAtMs_; }
  /// When the pause ends (0: not paused); a poll timeout should not outlast it.
  int64_t resumeAtMs() const { return resumeAtMs_; }
  /// In an episode and no longer paused: the owner calls accept() again even if the listener is not
  /// readable. accept(2) takes a descriptor before it looks at the queue, so EMFILE does not mean a
  /// connection is waiting; without the retry an episode whose last failure met an empty queue would
  /// never see the queue empty without failing, and its end would go unreported.
  bool retryDue(int64_t nowMs) const { return failing_ && !paused(nowMs); }
  /// A connection was dropped because `limit` (a description: "4096 connections pending") is
  /// reached; logged like the failures.
  void limitReached(const std::string& limit);
  /// Failures and drops so far.
  uint64_t failures() const { return failures_; }
  uint64_t drops() const { return drops_; }

 private:
  bool report(const std::string& what);  // false: folded into the next line's count

  std::string who_;
  int64_t resumeAtMs_ = 0;
  int backoffMs_ = 0;
  uint64_t failures_ = 0, drops_ = 0;
  uint64_t unreported_ = 0;  // lines folded since the last one printed
  int64_t lastReportMs_ = 0;
  bool failing_ = false;          // in an episode of failures for lack of resources
  bool episodeReported_ = false;  // its start was printed
};

/// Sends / receives exactly `bytes` (blocking through poll until deadlineMs or abortFd readable).
/// Errors name `what`. A peer that closes mid-message is kRemoteError.
Status sendAll(int fd, const void* data, size_t bytes, int64_t deadlineMs, int abortFd, const std::string& what);
Status recvAll(int fd, void* data, size_t bytes, int64_t deadlineMs, int abortFd, const std::string& what);

/// Sends `sbytes` on sendFd while receiving `rbytes` on recvFd (both may be the same socket), so
/// that two ranks exchanging large buffers never deadlock on full socket buffers.
Status sendRecvAll(int sendFd, const void* sdata, size_t sbytes, int recvFd, void* rdata, size_t rbytes,
                   int64_t deadlineMs, int abortFd, const std::string& what);

/// Non-blocking partial I/O: *moved gets the byte count (0 if the call would block). EOF on read is
/// kRemoteError ("closed by peer").
Status readSome(int fd, void* data, size_t bytes, size_t* moved);
Status writeSome(int fd, const void* data, size_t bytes, size_t* moved);

/// Milliseconds left until deadlineMs, clamped to [0, INT32_MAX].
int msLeft(int64_t deadlineMs);

}  // namespace c4::detail
