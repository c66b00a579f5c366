// C4D's heartbeat as it arrives from a peer over the bootstrap's side channel (core/health.cc,
// docs/c4d.md): one JSON object. parseHeartbeat is the pure reading of those bytes; the health
// monitor applies the result. It depends on c4_common, core/diagnose.hpp's types and nlohmann-json
// only, so the fuzz target (tests/fuzz) runs exactly this code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/status.hpp"
#include "core/diagnose.hpp"

namespace c4 {

/// What one heartbeat says, its times converted to the receiver's clock.
struct Heartbeat {
  bool bye = false;  ///< the peer leaves in order (destroy, abort); nothing below is set
  /// It says where the peer stands (the fields down to stuckTo): a periodic heartbeat. A diagnosis
  /// or failure notice sent between heartbeats does not, and must not erase what the last said.
  bool hasState = false;
  uint64_t entered = 0, left = 0;  ///< collective seq + 1 it entered / left last
  int64_t enteredAtNs = 0, leftAtNs = 0;
  bool inP2p = false;
  std::string inside;       ///< a blocking library call it waits in that is no collective ("" = none)
  int64_t stalledAtNs = 0;  ///< since when its running operation made no progress (0: it does not)
  std::vector<int> waitingOn, stuckTo;
  bool hasFailed = false;
  std::string failed;  ///< why its communicator failed
  struct Op {
    uint64_t seq;
    int64_t enterNs;  ///< when it entered collective `seq`
    int64_t gapNs;    ///< its time outside c4comm before it (-1: unknown)
  };
  std::vector<Op> ops;  ///< to the reporter: arrivals at recent collectives
  bool hasRates = false;
  std::vector<PeerRate> rates;  ///< to the reporter: its network peers' receive rates
  bool hasDiag = false;
  Diagnosis diag;        ///< a diagnosis it made (every rank adopts it)
  bool failing = false;  ///< with the diagnosis: its communicator fails of it
  int64_t sentNs = -1;   ///< when it was sent, in the sender's clock (-1: the sender did not say)
};

/// Reads a heartbeat of rank `from` that arrived at `nowNs`. *heard says whether it is a heartbeat
/// at all (a JSON object of version 1: the peer is alive even if a field is malformed). Fails when
/// it is not one, or with the reason when a field is malformed; then `out` is unspecified.
Status parseHeartbeat(const char* data, size_t bytes, int from, int64_t nowNs, Heartbeat* out, bool* heard);

/// Takes a heartbeat's delivery delay out of its times. A peer reports ages, which parseHeartbeat
/// turns into this rank's clock as "arrival - age": a heartbeat that waited D in sockets, queues and
/// the receiver's tick makes every time it carries D late. The reporter compares arrival times of
/// ranks whose heartbeats wait differently, so a rank whose heartbeats waited longer looked like a
/// straggler (a false noncomm_slow on a loaded CI machine, where the 50 ms health tick and
/// scheduling add up). With the sender's send time, arrival - sent = clock offset + D; the least of
/// it over the last window or two is the offset plus the least delay, and what a heartbeat exceeds
/// that by is its own extra delay, taken out of its times. One per peer.
class HeartbeatDelay {
 public:
  explicit HeartbeatDelay(int64_t windowNs = 10'000'000'000) : windowNs_(windowNs) {}
  /// Moves hb's times earlier by its delay beyond the least seen; returns that amount (0 when the
  /// sender sent no time).
  int64_t align(int64_t arrivedNs, Heartbeat* hb);

 private:
  int64_t windowNs_;
  int64_t windowStartNs_ = 0;
  int64_t least_ = INT64_MAX, leastBefore_ = INT64_MAX;  // this window's and the previous one's
};

}  // namespace c4
