// The communicator's side of C4P (docs/c4p.md): at init, reads the topology (C4_TOPO_FILE, else a
// flat model of the ranks' NIC ports), finds where every rank sits, takes the flows of the
// schedules the communicator will run for large AllReduces, plans every lane (libc4comm/planner),
// and answers the network transport's Context::lanePlan with the plan. All ranks compute the same
// plan from the same inputs; init checks that they agree on the file and the mode.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/params.hpp"
#include "transports/transport.hpp"

namespace c4 {

C4_PARAM_STR(Planner, "C4_PLANNER", nullptr, "c4p", "c4p|ecmp|off", kParamSameOnAllRanks,
             "C4P lane planning: c4p (plan ports and paths from the topology), ecmp (seeded random source ports, as "
             "hashing gives: the baseline), off (the transport's defaults)")
C4_PARAM_STR(TopoFile, "C4_TOPO_FILE", nullptr, "", {}, kParamNone,
             "C4P: the fabric's topology JSON (tools/netlab writes it); empty: a flat model of the ranks' NIC ports "
             "(all paths equal)")
C4_PARAM_INT(PlanSeed, "C4_PLAN_SEED", nullptr, 1, INT64_MIN, INT64_MAX, kParamNone,
             "C4P: seed of C4_PLANNER=ecmp's random source ports")
C4_PARAM_INT(PlanBytes, "C4_PLAN_BYTES", nullptr, 67108864, 1, int64_t{1} << 40, kParamNone,
             "C4P: the AllReduce size whose schedules give the flows the lanes are planned for")
C4_PARAM_STR(PlannerService, "C4_PLANNER_SERVICE", nullptr, "", {}, kParamSameOnAllRanks,
             "C4P: host:port of the fabric service (c4-fabricd) that plans every job on the fabric together; empty: "
             "the job plans alone. Needs C4_TOPO_FILE (the service's fabric) and C4_PLANNER_KEY_FILE")
C4_PARAM_STR(PlannerKeyFile, "C4_PLANNER_KEY_FILE", nullptr, "", {}, kParamNone,
             "C4P: the fabric service's shared key: a file of at least 16 bytes of secret that only its owner can read "
             "(chmod 600)")
C4_PARAM_INT(PlannerServiceMs, "C4_PLANNER_SERVICE_MS", nullptr, 2000, 1, 600000, kParamNone,
             "C4P: how long communicator init waits for the fabric service (connect, register, reply) before the job "
             "plans alone, in ms")
C4_PARAM_INT(PlannerLeaseMs, "C4_PLANNER_LEASE_MS", nullptr, 30000, 1000, 86400000, kParamNone,
             "C4P: the lease the job asks of the fabric service; the job renews it every third of it (the renewals "
             "carry its lanes' reports and bring the service's lane moves), and the service frees the job's links "
             "when it runs out (a job that died)")
C4_PARAM_INT(RebalanceMs, "C4_REBALANCE_MS", nullptr, 200, 0, 86400000, kParamNone,
             "C4P: between operations, at most this often, striping weights follow each lane's measured throughput "
             "and retired lanes are replaced on healthy paths; 0 = never")

namespace plan {
class Plan;
class Topology;
struct PlanInput;
}  // namespace plan

class Tuner;
class Bootstrap;
namespace trace {
class Recorder;
}

class LanePlanner {
 public:
  LanePlanner();
  ~LanePlanner();
  /// The hook to put in transport::Context::lanePlan before the transports are created; answers
  /// defaults until init() has planned.
  std::function<transport::LanePlan(int peer, int lane)> hook();
  /// Reads C4_TOPO_FILE once for the communicator (schedule files match its hash before init
  /// plans on it). Sets `hash` and returns true where a file is set and loads; false otherwise (an
  /// unreadable file fails init() where C4P plans).
  bool readTopology(uint64_t* hash);
  /// Plans the lanes of `net` (the network transport, may be null: nothing to plan). Collective
  /// over `oob`: every rank calls it. With C4_PLANNER_SERVICE, rank 0 registers the job with the
  /// fabric service and hands its plan to the others; a service that is down, slow or refusing is
  /// a warning, and the job plans alone. `hostOf[r]` numbers the ranks' hosts. Once C4P has placed the
  /// ranks on a C4_TOPO_FILE fabric, the tuner drops schedule files made for other hosts
  /// (Tuner::checkScheduleHosts) before the flows to plan are taken from its choice.
  Status init(int rank, int nranks, Bootstrap* oob, const std::vector<int32_t>& hostOf, transport::Transport* net,
              Tuner& tuner, trace::Recorder* recorder);
  /// Whether there is a plan to keep (init planned lanes, and C4_REBALANCE_MS > 0 or the fabric
  /// service planned them).
  bool active() const { return active_; }
  /// Stops talking to the fabric service (renewals; releases the job): before the bootstrap goes.
  void stop();
  /// Between operations, on the driving thread: at most every C4_REBALANCE_MS, sets each planned
  /// connection's striping weights from its lanes' measured throughput (bytes per busy second,
  /// smoothed; a lane keeps at least 5% so that it is still measured), replaces a retired lane
  /// (this rank opens the connection's lanes) by a new one on a path that avoids the retired
  /// lane's fabric links, and moves a lane that stays well below its peers onto a spare path when
  /// the fabric has one. Traces what it did and what each lane carried (trace::PlanEvent). Planned
  /// by the fabric service: makes the lane moves the service asked for (the rank that opens the
  /// connection opens the new lane, and retires the old one once the new one is up), and reports lane replacements and
  /// samples (with verdicts: slow, broken) to rank 0, which renews the job with them.
  void rebalance();

 private:
  struct State;
  /// The plan for lane `lane` of the connection to `peer` (defaults where nothing is planned).
  static transport::LanePlan planFor(const State& s, int peer, int lane);
  /// rebalance()'s parts: the look at the lanes (every C4_REBALANCE_MS), the fabric service's moves
  /// (taken from rank 0 and made), this rank's report for the service (to rank 0).
  static void look(State& s);
  static void applyMoves(State& s);
  static void finishMoves(State& s);
  static void sendReport(State& s, int64_t nowNs);
  std::shared_ptr<State> s_;
  bool active_ = false;
};

}  // namespace c4
