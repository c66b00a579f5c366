// Helpers every transport's Connection uses the same way: request completion, argument checks of
// isend/irecv, and the error for a message that does not match the receive posted for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transports/transport.hpp"

namespace c4::transport {

/// Marks `req` pending for a new isend/irecv; if `st` (the connection's standing error) is an error,
/// fails the request with it instead. Returns `st`.
inline Status startRequest(Request* req, const Status& st) {
  req->state = Request::kPending;
  req->error = Status();
  if (!st.isOk()) {
    req->error = st;
    req->state = Request::kFailed;
  }
  return st;
}

inline void completeRequest(Request* r) { r->state = Request::kDone; }
inline void failRequest(Request* r, const Status& st) {
  r->error = st;
  r->state = Request::kFailed;
}

/// kInvalidArgument for a send of `bytes` > 0 from a null buffer; ok otherwise. `what` names the
/// transport in the message ("shm", "tcp").
Status checkSendArgs(const char* what, int peer, const void* buf, size_t bytes);
/// kInvalidArgument for a null destination, or a reduction that is not a whole number of elements
/// or has no local operand; ok otherwise.
Status checkRecvArgs(const char* what, int peer, const void* dst, size_t bytes, const ReduceSpec* red);

/// Ok if a message sent under `sent` with `sentBytes` may be received by a receive posted under
/// `expected` for `expectedBytes`; else kInvalidUsage naming both ranks and every difference (logged
/// once here). `peerText` describes the sender ("rank 1 (pid 7 on host)").
Status matchError(const char* what, int peer, const std::string& peerText, int self, const OpSig& sent,
                  uint64_t sentBytes, const OpSig& expected, uint64_t expectedBytes);

}  // namespace c4::transport
