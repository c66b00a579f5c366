// Helpers every transport's Connection uses the same way: request completion, argument checks of
// isend/irecv, and the error for a message that does not match the receive posted for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/transport.hpp"

namespace c4::transport {

inline void completeRequest(Request* r) { r->state = Request::kDone; }

/// Drops from a transport's list of active connections (order does not matter) those `busy`
/// says have nothing left to do, clearing their `inActiveList` mark.
template <class Conn, class Busy>
void pruneActive(std::vector<Conn*>* active, Busy busy) {
  for (size_t i = 0; i < active->size();) {
    Conn* c = (*active)[i];
    if (busy(*c)) {
      ++i;
      continue;
    }
    c->inActiveList = false;
    (*active)[i] = active->back();
    active->pop_back();
  }
}
inline void failRequest(Request* r, const Status& st) {
  r->error = st;
  r->state = Request::kFailed;
}

/// Starts `req` for a new isend: pending, or failed (and that status returned) if the connection
/// has a standing error `standing` or the arguments are bad (`bytes` > 0 from a null buffer, a
/// memory space outside `spaces`, the transport's Caps::spaces). `what` names the transport in
/// messages ("shm", "tcp").
Status startSend(const char* what, int peer, const Status& standing, const MemRef& buf, size_t bytes, Request* req,
                 uint32_t spaces = kHostSpaces);
/// The same for an irecv; bad arguments also include a reduction that is not a whole number of
/// elements, has no local operand or an operator other than sum, prod, max, min.
Status startRecv(const char* what, int peer, const Status& standing, const MemRef& dst, size_t bytes,
                 const ReduceSpec* red, Request* req, uint32_t spaces = kHostSpaces);

/// dst[offset + i] = red.local[offset + i] op incoming[i] for `bytes` bytes (whole elements), with
/// the host kernels (the transport reads and writes host memory).
void reduceInto(const ReduceSpec& red, char* dst, size_t offset, const void* incoming, size_t bytes);

/// Ok if a message sent under `sent` with `sentBytes` may be received by a receive posted under
/// `expected` for `expectedBytes`; else kInvalidUsage naming both ranks and every difference (logged
/// once here). `peerText` describes the sender ("rank 1 (pid 7 on host)").
Status matchError(const char* what, int peer, const std::string& peerText, int self, const OpSig& sent,
                  uint64_t sentBytes, const OpSig& expected, uint64_t expectedBytes);

/// Another process of this host (same pid namespace), watched for its exit: a pidfd where the
/// kernel has them, else kill(pid, 0) and /proc/<pid>/stat (a zombie still answers kill). Shared
/// memory and UCX's shared-memory transports have no connection to lose: this is how they learn
/// that a peer died.
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(int pid);
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  int pid() const { return pid_; }
  /// True once the process is gone (or a zombie). A system call or two: callers rate-limit it.
  bool exited() const;

 private:
  int pid_ = -1;
  int pidfd_ = -1;
};

}  // namespace c4::transport
