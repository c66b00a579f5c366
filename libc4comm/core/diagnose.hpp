// C4D's classifiers: pure functions of the ranks' states, so tests drive them with made-up views
// (tests/health) and the monitor (core/health.hpp) feeds them what the heartbeats said.
//
// Classes (docs/c4d.md):
//  - dead_rank:     a rank's process is gone (its side-channel link closed without a goodbye, or
//                   its pid is gone on this host), or it went silent inside an operation;
//  - noncomm_hang:  a rank never entered the operation the others wait in (or never posted the
//                   matching send/receive): its last operation and how long ago;
//  - comm_hang:     every rank entered it and a peer pair made no progress: the pair, its lanes;
//  - comm_slow:     a peer pair (link) or all of a rank's pairs (node) receive far slower than the
//                   others, from per-pair receive rates;
//  - noncomm_slow:  a rank that arrives late at most collectives (a compute straggler) and by how
//                   much.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace c4 {

/// What this rank knows of rank `rank` (from its heartbeats and the side channel's links).
struct RankView {
  int rank = -1;
  std::string host;
  int pid = 0;
  bool known = false;  ///< a heartbeat came
  bool gone = false;   ///< its process is gone (link closed without goodbye, or pid gone)
  std::string goneWhy;
  bool leftInOrder = false;  ///< it said goodbye (destroy, abort)
  bool unresponsive = false;
  int64_t silentMs = 0;  ///< since its last heartbeat (or since start)
  uint64_t entered = 0;  ///< collective seq + 1 it entered last (0: none)
  uint64_t left = 0;     ///< collective seq + 1 it left last
  int64_t enteredAgoMs = 0, leftAgoMs = 0;
  bool inP2p = false;     ///< inside a point-to-point batch
  std::string inside;     ///< a blocking library call that is no collective it waits in ("" = none)
  int64_t stalledMs = 0;  ///< its running operation made no progress for this long (0: not stalled)
  std::vector<int> waitingOn;
  std::vector<int> stuckTo;  ///< ranks it has data in flight to that does not move (lanes busy)
  std::string failed;        ///< its communicator failed with this ("" if not)
};

struct HangInput {
  int self = 0;
  int nranks = 0;
  int64_t seq = -1;  ///< the collective this rank is stuck in (seq), or -1 (point-to-point)
  std::string what;  ///< "AllReduce seq 5 count 1024 float sum"
  std::vector<int> waitingOn;
  std::vector<std::string> states;  ///< per waitingOn: the connection's state (lanes)
  std::vector<int> stuckTo;         ///< ranks this rank has data in flight to that does not move
  std::vector<RankView> ranks;      ///< index = rank (self included)
  int64_t heartbeatTimeoutMs = 0;
};

/// Classifies a hang seen by `in.self`. Always returns a diagnosis (at worst a comm_hang on the
/// ranks it waits for, with low confidence).
Diagnosis classifyHang(const HangInput& in);

/// A failure a transport reported: a dead_rank when some rank is gone, else nothing (kind "").
Diagnosis classifyFailure(int self, const std::string& error, const std::vector<RankView>& ranks);

/// One network peer's receive rate as this rank measured it (bytes of messages that flowed once
/// started, over the time they took), cumulative, and its lanes.
struct PeerRate {
  int peer = -1;  ///< the sender
  uint64_t bytes = 0;
  uint64_t ns = 0;
  int lanesUp = 0, lanesRetired = 0;
  std::string lanes;  ///< "local -> remote" of the lanes in service, ", "-separated
};

/// The reporter's detector of slowdowns (comm_slow, noncomm_slow). Not thread-safe (the monitor
/// holds its lock).
class SlowDetector {
 public:
  struct Config {
    int64_t stragglerMs = 100;
    int slowPercent = 25;
    int64_t windowMs = 10000;  ///< rates are compared over this window
    int confirmations = 3;     ///< consecutive analyses that must agree
    int64_t repeatMs = 60000;  ///< the same finding is reported again only after this long
    int minOps = 8;
    uint64_t minBytes = 4u << 20;  ///< a pair counts once it received this much in the window
  };
  void configure(const Config& c) { cfg_ = c; }
  /// Rank `r` entered collective `seq` at `enterNs` (this rank's clock), `gapNs` after it left the
  /// collective before (time outside c4comm; -1: unknown). A rank that arrives late only because
  /// the previous collective ended late there (the last hop of a ring) is no straggler: lateness
  /// counts only as far as its time outside c4comm exceeds the others'.
  void addOp(int r, uint64_t seq, int64_t enterNs, int64_t gapNs = -1);
  /// Receiver `r`'s cumulative rates per sender.
  void addRates(int r, int64_t nowNs, const std::vector<PeerRate>& rates);
  /// Findings of this look (each reported once per repeatMs). `live[r]`: rank r still counts.
  /// `hostOf` names hosts in the records.
  std::vector<Diagnosis> analyze(int64_t nowNs, const std::vector<bool>& live, const std::vector<std::string>& hostOf);
  /// The receive rates the last analyze() compared ("sender->receiver MB/s, ..."; "" if none).
  const std::string& lastRates() const { return lastRates_; }

 private:
  struct Sample {
    int64_t t;
    uint64_t bytes, ns;
  };
  Config cfg_;
  struct Arrival {
    int64_t enter, gap;
  };
  std::map<int, std::map<uint64_t, Arrival>> enters_;           // rank -> seq -> arrival
  std::map<std::pair<int, int>, std::vector<Sample>> samples_;  // (sender, receiver)
  std::map<std::pair<int, int>, std::string> lanes_;
  std::map<std::string, int> streak_;        // finding key -> consecutive looks
  std::map<std::string, int64_t> reported_;  // finding key -> when
  std::string lastRates_;
};

/// The record of `d` as one line of JSON (C4_DIAG_FILE, the trace, Diagnosis::json).
std::string diagnosisJson(const Diagnosis& d, const std::string& commTag, int rank, int nranks);

}  // namespace c4
