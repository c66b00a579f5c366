// c4-sim's engine (docs/c4-sim.md): a discrete-event simulation in time of every rank's schedule
// (libc4comm/sched) on a fabric (libc4comm/planner's Topology), alpha-beta per message with
// per-link contention.
//
// Semantics are the executor's (sched/schedule.hpp, as sched/simulate.cc checks them): a step starts
// once its deps completed; a rank posts its sends to and receives from one peer in step order; the
// k-th send from A to B matches the k-th receive B posts from A, and the message moves once both are
// posted. Costs:
//  * between ranks of different hosts: the message is cut into pieces (CostModel::pieceBytes) dealt
//    round-robin over the connection's lanes, continuing from where the previous message on the
//    connection stopped (pieceBytes 0: an equal share per lane). Each lane's share is one transfer
//    that enters the lane alpha after the match, behind the lane's earlier transfers (a lane is a
//    FIFO stream), and then crosses the lane's path: the directed links C4P planned for it (or ECMP
//    hashing gave it). The message completes when its last share arrived;
//  * between ranks of one host: one transfer after alphaIntra, over two virtual links of
//    intraBytesPerSec: the sender's intra-host egress and the receiver's ingress;
//  * a local copy or reduce: bytes / memBytesPerSec, one at a time per rank (a copy onto itself is
//    free). Reductions of received data (kRecvReduce) overlap the transfer and cost nothing extra.
// Links are shared fluidly: every active transfer gets its max-min fair rate over the links it
// crosses (progressive filling), recomputed when transfers start or finish, over the connected set
// of transfers and links that the change can affect. Two bounds keep huge runs fast (CostModel::
// slack and exactLimit; exact wherever fewer than 1/slack transfers share a link and sets stay
// small; sim_model.cc's Engine and docs/c4-sim.md say what they give up).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"
#include "sched/schedule.hpp"

namespace c4::sim {

/// What fraction of a link's nominal rate its transfers get together, by how many share it: tcp
/// streams through a shaped (or real) link lose some to headers, acknowledgements, losses and
/// retransmissions, more when several streams compete. Measured per link rate by
/// bench/sim/calibrate.sh (docs/c4-sim.md, "Calibration").
struct LinkEfficiency {
  double bps = 0;                // links of this nominal rate (within 1%); 0: every link without its own entry
  std::vector<double> byShares;  // with 1, 2, 4, 8, ... transfers on the link; geometric in between, the last beyond
  /// The efficiency with `k` >= 1 transfers on the link.
  double at(size_t k) const;
};

/// The model's parameters: seconds and bytes per second.
struct CostModel {
  double alpha = 5e-6;             // per message between hosts: from the match to its first byte entering a lane
  double alphaIntra = 1e-6;        // per message between ranks of one host
  double intraBytesPerSec = 25e9;  // each rank's intra-host egress and ingress
  double memBytesPerSec = 50e9;    // local copies and reductions
  size_t pieceBytes = 512 << 10;   // striping granularity over lanes (C4_TCP_PIECE_BYTES); 0: equal shares
  /// When transfers only leave a link, the capacity they free is handed out once it is more than
  /// this fraction of the link (a link shared by fewer than 1/slack transfers: at once); a transfer
  /// starting on a link always re-fills it.
  double slack = 0.05;
  /// Where the set a change can affect holds more than this many transfers beyond those on the
  /// changed links, only the transfers on the changed links are re-filled (the others keep their
  /// rates; docs/c4-sim.md). 0: always exact.
  size_t exactLimit = 4096;
  /// Link efficiencies (empty: every link at its nominal rate). Intra-host transfers are not
  /// affected.
  std::vector<LinkEfficiency> efficiency;
};

/// One step, as much of it as timing needs.
struct SimStep {
  sched::StepKind kind = sched::StepKind::kCopy;
  bool free = false;  // a copy onto itself
  int32_t peer = -1;
  uint64_t bytes = 0;
  uint32_t depBegin = 0, depEnd = 0;  // range of Program::deps
};

/// One rank's schedule, compacted: no spans, deps flattened (a 1024-rank job keeps every rank's).
struct Program {
  std::vector<SimStep> steps;
  std::vector<int32_t> deps;
  size_t bytesSent() const;
};

/// Compacts a schedule (duplicate deps are dropped).
Program compile(const sched::Schedule& s);

/// Where the ranks sit and which links every lane of every connection crosses. Refers to the
/// topology, which must outlive it.
class Fabric {
 public:
  /// Rank r on host hostOf[r], using every port of its host. Connections between hosts get `lanes`
  /// lanes (0: the most ports a host has) placed by `mode` for `flows` (plan::makePlan: c4p plans
  /// them, ecmp and off hash seeded source ports). Pairs with no flow get lane l on port
  /// l mod ports and the first path.
  static Status build(const plan::Topology& topo, std::vector<int> hostOf, plan::Mode mode, int lanes, uint64_t seed,
                      std::vector<plan::Flow> flows, Fabric* out);

  const plan::Topology& topo() const { return *in_.topo; }
  int nranks() const { return static_cast<int>(hostOf_.size()); }
  int hostOf(int rank) const { return hostOf_[static_cast<size_t>(rank)]; }
  /// Lanes of the connection between two ranks of different hosts.
  int lanes(int src, int dst) const;
  /// The directed links lane `lane` crosses from src to dst (ranks on different hosts).
  void laneLinks(int src, int dst, int lane, std::vector<int>* out) const;
  const plan::Plan& plan() const { return plan_; }
  const plan::PlanInput& planInput() const { return in_; }

 private:
  plan::PlanInput in_;
  plan::Plan plan_;
  std::vector<int> hostOf_;
};

/// Bytes src sends dst over all programs (the planner's flows).
std::vector<plan::Flow> flowsOf(const std::vector<Program>& programs);

struct SimResult {
  double seconds = 0;  // when the last rank finished its last step
  size_t steps = 0;
  size_t messages = 0;
  size_t transfers = 0;           // lane shares
  double interBytes = 0;          // message bytes between hosts
  double intraBytes = 0;          // message bytes within hosts
  std::vector<double> linkBytes;  // per topology link: bytes that crossed it
  int busiestLink = -1;           // the topology link with the highest utilisation (-1: none carried anything)
  double busiestUtil = 0;         // its bytes over (capacity x seconds)
  size_t events = 0;              // processed events
  size_t rerates = 0;             // transfer rate changes
  size_t refills = 0;             // max-min fills (exact or bounded)
  size_t boundedRefills = 0;      // of those, bounded to the changed links (CostModel::exactLimit)
  size_t refilledTransfers = 0;   // transfers the fills covered, summed
};

/// Called about once a second during long runs with the fraction of steps completed.
using ProgressFn = std::function<void(double done)>;

/// Runs `programs` (one per rank) on `fabric`. kInvalidUsage on a schedule the executor could not
/// run: a bad dep or peer, unmatched messages, a matched send and receive of different sizes, a
/// deadlock (naming the rank and step).
Status simulate(const std::vector<Program>& programs, const Fabric& fabric, const CostModel& model, SimResult* out,
                const ProgressFn& progress = ProgressFn());

}  // namespace c4::sim
