#include "transports/transport_util.hpp"

#include "common/logging.hpp"
#include "common/status.hpp"

namespace c4::transport {

namespace {

Status checkSendArgs(const char* what, int peer, const void* buf, size_t bytes) {
  if (bytes > 0 && buf == nullptr)
    return makeError(Code::kInvalidArgument, "%s: isend of %zu bytes to rank %d with a null buffer", what, bytes, peer);
  return Status::ok();
}

Status checkRecvArgs(const char* what, int peer, const void* dst, size_t bytes, const ReduceSpec* red) {
  if (bytes > 0 && dst == nullptr)
    return makeError(Code::kInvalidArgument, "%s: irecv of %zu bytes from rank %d with a null buffer", what, bytes,
                     peer);
  if (red) {
    size_t es = dataTypeSize(red->dtype);
    if (es == 0 || bytes % es != 0 || (bytes > 0 && red->local == nullptr))
      return makeError(Code::kInvalidArgument,
                       "%s: irecv with reduction from rank %d: %zu bytes is not a whole number of %zu-byte elements "
                       "or local is null",
                       what, peer, bytes, es);
  }
  return Status::ok();
}

/// Marks `req` pending, or failed with the first error of `standing` and `args`; returns that error.
Status startRequest(Request* req, const Status& standing, const Status& args) {
  const Status& st = !standing.isOk() ? standing : args;
  req->state = st.isOk() ? Request::kPending : Request::kFailed;
  req->error = st;
  return st;
}

}  // namespace

Status startSend(const char* what, int peer, const Status& standing, const void* buf, size_t bytes, Request* req) {
  return startRequest(req, standing, standing.isOk() ? checkSendArgs(what, peer, buf, bytes) : Status());
}

Status startRecv(const char* what, int peer, const Status& standing, const void* dst, size_t bytes,
                 const ReduceSpec* red, Request* req) {
  return startRequest(req, standing, standing.isOk() ? checkRecvArgs(what, peer, dst, bytes, red) : Status());
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

}  // namespace c4::transport
