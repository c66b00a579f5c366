#include "transports/transport_util.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "kernels/host/reduce.hpp"

namespace c4::transport {

const char* memSpaceName(MemSpace s) {
  switch (s) {
    case MemSpace::kHost:
      return "host";
    case MemSpace::kHostShared:
      return "host-shared";
    case MemSpace::kCudaDevice:
      return "cuda-device";
    case MemSpace::kCudaHost:
      return "cuda-host";
  }
  return "?";
}

Status sendQueueFull() { return Status(Code::kInProgress, "send queue full"); }

void reduceInto(const ReduceSpec& red, char* dst, size_t offset, const void* incoming, size_t bytes) {
  kernels::reduce(dst + offset, red.local.bytes() + offset, incoming, bytes / dataTypeSize(red.dtype), red.dtype,
                  kernels::toKOp(red.op));
}

namespace {

Status checkSpace(const char* what, const char* dir, int peer, const MemRef& ref, uint32_t spaces) {
  if (spaces & spaceBit(ref.space)) return Status::ok();
  return makeError(Code::kInvalidUsage, "%s: %s rank %d with a buffer in %s memory, which this transport cannot %s",
                   what, dir, peer, memSpaceName(ref.space), dir[0] == 's' ? "read" : "write");
}

Status checkSendArgs(const char* what, int peer, const MemRef& buf, size_t bytes, uint32_t spaces) {
  if (bytes > 0 && buf.ptr == nullptr)
    return makeError(Code::kInvalidArgument, "%s: isend of %zu bytes to rank %d with a null buffer", what, bytes, peer);
  return checkSpace(what, "send to", peer, buf, spaces);
}

Status checkRecvArgs(const char* what, int peer, const MemRef& dst, size_t bytes, const ReduceSpec* red,
                     uint32_t spaces) {
  if (bytes > 0 && dst.ptr == nullptr)
    return makeError(Code::kInvalidArgument, "%s: irecv of %zu bytes from rank %d with a null buffer", what, bytes,
                     peer);
  if (red) {
    size_t es = dataTypeSize(red->dtype);
    const int op = static_cast<int>(red->op);
    if (es == 0 || bytes % es != 0 || (bytes > 0 && red->local.ptr == nullptr))
      return makeError(Code::kInvalidArgument,
                       "%s: irecv with reduction from rank %d: %zu bytes is not a whole number of %zu-byte elements "
                       "or local is null",
                       what, peer, bytes, es);
    if (op < 0 || op > static_cast<int>(RedOp::kMin))
      return makeError(Code::kInvalidArgument,
                       "%s: irecv with reduction from rank %d: operator %d is not sum, prod, "
                       "max or min",
                       what, peer, op);
    C4_CHECK(checkSpace(what, "reduce for", peer, red->local, spaces));
  }
  return checkSpace(what, "receive from", peer, dst, spaces);
}

/// Marks `req` pending, or failed with the first error of `standing` and `args`; returns that error.
Status startRequest(Request* req, const Status& standing, const Status& args) {
  const Status& st = !standing.isOk() ? standing : args;
  req->state = st.isOk() ? Request::kPending : Request::kFailed;
  req->error = st;
  return st;
}

}  // namespace

Status startSend(const char* what, int peer, const Status& standing, const MemRef& buf, size_t bytes, Request* req,
                 uint32_t spaces) {
  return startRequest(req, standing, standing.isOk() ? checkSendArgs(what, peer, buf, bytes, spaces) : Status());
}

Status startRecv(const char* what, int peer, const Status& standing, const MemRef& dst, size_t bytes,
                 const ReduceSpec* red, Request* req, uint32_t spaces) {
  return startRequest(req, standing, standing.isOk() ? checkRecvArgs(what, peer, dst, bytes, red, spaces) : Status());
}

Status matchError(const char* what, int peer, const std::string& peerText, int self, const OpSig& sent,
                  uint64_t sentBytes, const OpSig& expected, uint64_t expectedBytes) {
  bool sigOk = sigMatches(sent, expected);
  bool sizeOk = sentBytes == expectedBytes;
  if (sigOk && sizeOk) return Status::ok();
  std::string diff;
  if (!sigOk)
    diff = strFormat("rank %d sent %s but rank %d expected %s (%s)", peer, describeSig(sent).c_str(), self,
                     describeSig(expected).c_str(), diffSigs(sent, expected).c_str());
  if (!sizeOk) {
    if (!diff.empty()) diff += "; ";
    diff += strFormat("rank %d sent %llu bytes but rank %d expected %llu bytes", peer,
                      static_cast<unsigned long long>(sentBytes), self, static_cast<unsigned long long>(expectedBytes));
  }
  Status st = makeError(Code::kInvalidUsage, "%s: message from %s does not match the receive posted by rank %d: %s",
                        what, peerText.c_str(), self, diff.c_str());
  C4_WARN(std::string(what) == "shm" ? kLogShm : kLogNet, "%s", st.message().c_str());
  return st;
}

ProcessWatch::ProcessWatch(int pid) : pid_(pid) {
#ifdef SYS_pidfd_open
  if (pid <= 0) return;
  long fd = syscall(SYS_pidfd_open, pid, 0);
  pidfd_ = fd < 0 ? -1 : static_cast<int>(fd);
#endif
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool ProcessWatch::exited() const {
  if (pid_ <= 0) return false;
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    int r = C4_SYSCALL_RETRY(poll(&p, 1, 0));
    return r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
  }
  if (kill(pid_, 0) == -1 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid_);
  int fd = C4_SYSCALL_RETRY(open(path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) return false;
  char buf[512];
  ssize_t r = C4_SYSCALL_RETRY(read(fd, buf, sizeof(buf) - 1));
  close(fd);
  if (r <= 0) return false;
  buf[r] = 0;
  const char* paren = strrchr(buf, ')');
  return paren && (paren[2] == 'Z' || paren[2] == 'X');
}

}  // namespace c4::transport
