// Lanes: the paths one network connection carries its messages on (a TCP socket, an RDMA queue
// pair), each bound to a local NIC port and a source port that steers ECMP. "Lane" means only this
// in c4comm. A connection stripes the pieces of a message over its live lanes by weight; C4P sets
// the weights and retires or adds lanes, C4D reads the statistics.
//
// Threading: the transport's driving thread changes a lane; the state, the weight and every
// counter are atomics that any thread may read at any time (Lane::snapshot).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace c4::transport {

enum class LaneState : uint8_t {
  kConnecting = 0,  ///< opened, not carrying data yet
  kUp = 1,          ///< carrying data
  kDraining = 2,    ///< no new pieces; what it has queued still goes out
  kRetired = 3,     ///< out of service for good (error, stall, or retireLane); socket closed
};
const char* laneStateName(LaneState s);

/// A copy of one lane's state and counters, taken at one moment (Lane::snapshot).
struct LaneSnapshot {
  int index = 0;
  LaneState state = LaneState::kConnecting;
  double weight = 1.0;
  int localPort = -1;         ///< index into this rank's NIC ports
  std::string localAddr;      ///< "ip:port" of this end ("" before it is up)
  std::string remoteAddr;     ///< "ip:port" of the peer's end
  std::string retiredWhy;     ///< why it was retired ("" while in service)
  uint64_t bytesSent = 0;     ///< payload + headers handed to the kernel
  uint64_t bytesRecv = 0;     ///< payload + headers read from the kernel
  uint64_t piecesSent = 0;    ///< data frames written
  uint64_t piecesResent = 0;  ///< data frames written again after another lane was retired
  uint64_t busyNs = 0;        ///< time with data queued to send, or sent and not yet acknowledged
  uint64_t stallNs = 0;       ///< time with data queued that the kernel would not take (socket full)
  uint64_t errors = 0;        ///< errors seen on this lane (the one that retired it included)
};

/// One lane. Counters only grow.
class Lane {
 public:
  explicit Lane(int index = 0) : index_(index) {}
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  int index() const { return index_; }
  LaneState state() const { return state_.load(std::memory_order_acquire); }
  bool live() const {
    LaneState s = state();
    return s == LaneState::kUp || s == LaneState::kConnecting;
  }
  double weight() const { return weight_.load(std::memory_order_relaxed); }

  // Writers: the driving thread.
  void setState(LaneState s) { state_.store(s, std::memory_order_release); }
  void setWeight(double w) { weight_.store(w, std::memory_order_relaxed); }
  void setEndpoints(int localPort, const std::string& local, const std::string& remote);
  void setRetiredWhy(const std::string& why);
  void addSent(uint64_t n) { bytesSent_.fetch_add(n, std::memory_order_relaxed); }
  void addRecv(uint64_t n) { bytesRecv_.fetch_add(n, std::memory_order_relaxed); }
  void addPieces(uint64_t sent, uint64_t resent) {
    piecesSent_.fetch_add(sent, std::memory_order_relaxed);
    if (resent) piecesResent_.fetch_add(resent, std::memory_order_relaxed);
  }
  void addError() { errors_.fetch_add(1, std::memory_order_relaxed); }
  /// The lane has data queued to send (busy), or the kernel refuses more of it (stalled), from
  /// `nowNs` (CLOCK_MONOTONIC) on; false closes the interval and adds it to the counter.
  void setBusy(bool busy, int64_t nowNs) { toggle(&busySinceNs_, &busyNs_, busy, nowNs); }
  void setStalled(bool stalled, int64_t nowNs) { toggle(&stallSinceNs_, &stallNs_, stalled, nowNs); }
  bool busy() const { return busySinceNs_.load(std::memory_order_relaxed) != 0; }
  /// Since when the lane is stalled (CLOCK_MONOTONIC ns), or 0.
  int64_t stalledSinceNs() const { return stallSinceNs_.load(std::memory_order_relaxed); }

  /// Any thread. Busy and stall time include the interval still open.
  LaneSnapshot snapshot() const;

 private:
  static void toggle(std::atomic<int64_t>* since, std::atomic<uint64_t>* total, bool on, int64_t nowNs) {
    int64_t s = since->load(std::memory_order_relaxed);
    if (on && s == 0) {
      since->store(nowNs > 0 ? nowNs : 1, std::memory_order_relaxed);
    } else if (!on && s != 0) {
      total->fetch_add(static_cast<uint64_t>(nowNs > s ? nowNs - s : 0), std::memory_order_relaxed);
      since->store(0, std::memory_order_relaxed);
    }
  }

  int index_;
  std::atomic<LaneState> state_{LaneState::kConnecting};
  std::atomic<double> weight_{1.0};
  std::atomic<uint64_t> bytesSent_{0}, bytesRecv_{0}, piecesSent_{0}, piecesResent_{0}, busyNs_{0}, stallNs_{0},
      errors_{0};
  std::atomic<int64_t> busySinceNs_{0}, stallSinceNs_{0};
  mutable std::mutex mu_;  // the strings below
  int localPort_ = -1;
  std::string local_, remote_, retiredWhy_;
};

}  // namespace c4::transport
