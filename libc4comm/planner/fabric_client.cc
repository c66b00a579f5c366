#include "planner/fabric_client.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"

namespace c4::plan {

namespace {

uint64_t randomNonce() {
  uint64_t v = 0;
  while (v == 0) {
    if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v)))
      v = static_cast<uint64_t>(detail::nowNs()) * 0x9E3779B97F4A7C15ull;
  }
  return v;
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status waitFd(int fd, short events, int64_t deadlineNs, const char* what, const std::string& addr) {
  for (;;) {
    const int64_t left = deadlineNs - detail::nowNs();
    if (left <= 0) return makeError(Code::kTimeout, "fabric service %s: no answer in time (%s)", addr.c_str(), what);
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 1000)));
    if (r > 0) return Status::ok();
    if (r < 0 && errno != EINTR)
      return makeError(Code::kSystemError, "fabric service %s: poll: %s", addr.c_str(), strerror(errno));
  }
}

}  // namespace

Status readKeyFile(const std::string& path, wire::Key* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return makeError(Code::kInvalidArgument, "key file %s: %s", path.c_str(), strerror(errno));
  detail::Fd guard(fd);
  struct stat sb;
  if (fstat(fd, &sb) != 0) return makeError(Code::kSystemError, "key file %s: %s", path.c_str(), strerror(errno));
  if (!S_ISREG(sb.st_mode)) return makeError(Code::kInvalidArgument, "key file %s is not a regular file", path.c_str());
  if (sb.st_mode & 077)
    return makeError(Code::kInvalidArgument,
                     "key file %s can be read or written by others than its owner (mode %03o): chmod 600 it",
                     path.c_str(), static_cast<unsigned>(sb.st_mode & 0777));
  if (sb.st_size > 4096)
    return makeError(Code::kInvalidArgument, "key file %s has %lld bytes (at most 4096)", path.c_str(),
                     static_cast<long long>(sb.st_size));
  std::string secret(static_cast<size_t>(sb.st_size), '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = read(fd, &secret[got], secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return makeError(Code::kSystemError, "key file %s: short read", path.c_str());
    got += static_cast<size_t>(n);
  }
  Status st = wire::keyFromSecret(secret, out);
  if (!st.isOk()) return makeError(st.code(), "key file %s: %s", path.c_str(), st.message().c_str());
  return Status::ok();
}

FabricClient::~FabricClient() {
  if (fd_ >= 0) close(fd_);
}

Status FabricClient::connect(const std::string& hostPort, const wire::Key& key, int64_t timeoutMs,
                             std::unique_ptr<FabricClient>* out) {
  const int64_t deadline = detail::nowNs() + timeoutMs * 1000000;
  detail::SockAddr addr;
  Status st = detail::parseHostPort(hostPort, &addr);
  if (!st.isOk())
    return makeError(Code::kInvalidArgument, "fabric service %s: %s", hostPort.c_str(), st.message().c_str());
  std::unique_ptr<FabricClient> c(new FabricClient());
  c->addr_ = hostPort;
  c->fd_ = socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd_ < 0)
    return makeError(Code::kSystemError, "fabric service %s: socket: %s", hostPort.c_str(), strerror(errno));
  const int one = 1;
  setsockopt(c->fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // One attempt: a refused connection (no service there) fails at once rather than retrying.
  if (::connect(c->fd_, addr.sa(), addr.len) != 0) {
    if (errno != EINPROGRESS)
      return makeError(Code::kRemoteError, "fabric service %s: connect: %s", hostPort.c_str(), strerror(errno));
    C4_CHECK(waitFd(c->fd_, POLLOUT, deadline, "connect", hostPort));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c->fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0)
      return makeError(Code::kRemoteError, "fabric service %s: connect: %s", hostPort.c_str(), strerror(err));
  }
  char g[wire::kGreetingBytes];
  C4_CHECK(c->recvAll(g, sizeof(g), deadline));
  wire::Greeting theirs;
  st = wire::parseGreeting(g, sizeof(g), &theirs);
  if (!st.isOk()) return makeError(st.code(), "fabric service %s: %s", hostPort.c_str(), st.message().c_str());
  wire::Greeting mine;
  mine.nonce = randomNonce();
  C4_CHECK(c->sendAll(wire::encodeGreeting(mine), deadline));
  c->session_.key = key;
  c->session_.serviceNonce = theirs.nonce;
  c->session_.jobNonce = mine.nonce;
  *out = std::move(c);
  return Status::ok();
}

Status FabricClient::sendAll(const std::string& bytes, int64_t deadlineNs) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      C4_CHECK(waitFd(fd_, POLLOUT, deadlineNs, "send", addr_));
      continue;
    }
    return makeError(Code::kRemoteError, "fabric service %s: send: %s", addr_.c_str(), strerror(errno));
  }
  return Status::ok();
}

Status FabricClient::recvAll(void* p, size_t n, int64_t deadlineNs) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = recv(fd_, static_cast<char*>(p) + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0)
      return makeError(Code::kRemoteError,
                       "fabric service %s closed the connection (a wrong key, or not a fabric service)", addr_.c_str());
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      C4_CHECK(waitFd(fd_, POLLIN, deadlineNs, "receive", addr_));
      continue;
    }
    return makeError(Code::kRemoteError, "fabric service %s: recv: %s", addr_.c_str(), strerror(errno));
  }
  return Status::ok();
}

Status FabricClient::call(const wire::Request& req, wire::Reply* reply, int64_t timeoutMs) {
  if (fd_ < 0) return makeError(Code::kInvalidUsage, "fabric service %s: the connection is closed", addr_.c_str());
  const int64_t deadline = detail::nowNs() + timeoutMs * 1000000;
  Status st = [&]() -> Status {
    const std::string payload = wire::encodeRequest(req);
    if (payload.size() > wire::kMaxFrameBytes)
      return makeError(Code::kInvalidArgument, "fabric service %s: a request of %zu bytes (at most %zu)", addr_.c_str(),
                       payload.size(), wire::kMaxFrameBytes);
    C4_CHECK(sendAll(wire::sealFrame(session_, wire::Dir::kToService, sendSeq_++, payload), deadline));
    char hb[wire::kHeaderBytes];
    C4_CHECK(recvAll(hb, sizeof(hb), deadline));
    wire::FrameHeader h;
    Status s = wire::parseFrameHeader(hb, sizeof(hb), wire::kMaxFrameBytes, &h);
    if (!s.isOk()) return makeError(Code::kRemoteError, "fabric service %s: %s", addr_.c_str(), s.message().c_str());
    std::string body(h.length, '\0');
    C4_CHECK(recvAll(&body[0], body.size(), deadline));
    if (!wire::frameAuthentic(session_, wire::Dir::kToJob, recvSeq_++, h, body.data()))
      return makeError(Code::kRemoteError,
                       "fabric service %s: a reply that does not carry the key's signature (another key, or not the "
                       "service)",
                       addr_.c_str());
    s = wire::parseReply(body, reply);
    if (!s.isOk()) return makeError(Code::kRemoteError, "fabric service %s: %s", addr_.c_str(), s.message().c_str());
    return Status::ok();
  }();
  if (!st.isOk()) {
    close(fd_);
    fd_ = -1;
  }
  return st;
}

}  // namespace c4::plan
