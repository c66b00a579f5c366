#include "transports/lane.hpp"

#include "common/clock.hpp"

namespace c4::transport {

const char* laneStateName(LaneState s) {
  switch (s) {
    case LaneState::kConnecting:
      return "connecting";
    case LaneState::kUp:
      return "up";
    case LaneState::kDraining:
      return "draining";
    case LaneState::kRetired:
      return "retired";
  }
  return "?";
}

void Lane::setEndpoints(int localPort, const std::string& local, const std::string& remote) {
  std::lock_guard<std::mutex> g(mu_);
  localPort_ = localPort;
  if (!local.empty()) local_ = local;
  if (!remote.empty()) remote_ = remote;
}

void Lane::setRetiredWhy(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  retiredWhy_ = why;
}

LaneSnapshot Lane::snapshot() const {
  LaneSnapshot s;
  s.index = index_;
  s.state = state();
  s.weight = weight();
  {
    std::lock_guard<std::mutex> g(mu_);
    s.localPort = localPort_;
    s.localAddr = local_;
    s.remoteAddr = remote_;
    s.retiredWhy = retiredWhy_;
  }
  s.bytesSent = bytesSent_.load(std::memory_order_relaxed);
  s.bytesRecv = bytesRecv_.load(std::memory_order_relaxed);
  s.piecesSent = piecesSent_.load(std::memory_order_relaxed);
  s.piecesResent = piecesResent_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  const int64_t now = detail::nowNs();
  const int64_t busy = busySinceNs_.load(std::memory_order_relaxed);
  const int64_t stall = stallSinceNs_.load(std::memory_order_relaxed);
  s.busyNs = busyNs_.load(std::memory_order_relaxed) + static_cast<uint64_t>(busy && now > busy ? now - busy : 0);
  s.stallNs = stallNs_.load(std::memory_order_relaxed) + static_cast<uint64_t>(stall && now > stall ? now - stall : 0);
  return s;
}

}  // namespace c4::transport
