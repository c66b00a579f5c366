// C4P's planner (docs/c4p.md): assigns every lane of every network connection its local NIC port,
// the peer's port and a path through the fabric (hence the source port that steers it there), so
// that the job's flows load the most loaded link as little as possible.
//
// Input: the topology, where each rank sits (its host and which of the host's ports are its NIC
// ports, in the transport's order), the flows (bytes from rank to rank, e.g. one large AllReduce's
// schedules), and the lanes per connection. A connection joins two ranks a < b (a opens its lanes);
// each lane carries 1/lanes of the connection's bytes in each direction, both directions on the
// same path. Deterministic: every rank computes the same plan from the same input.
//
// Modes: c4p (greedy, largest connections first, each lane onto the candidate whose most loaded
// link ends up least loaded; then local search moving lanes off the bottleneck link, alone or in
// a chain of two; above the host-port bound, restarts from shuffled orders), ecmp (what
// hashing gives: each lane on port lane mod ports of both ends and a seeded random source port,
// its path the fabric's ECMP rule), off (the transport's defaults; nothing planned).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "c4comm/status.hpp"
#include "planner/topology.hpp"

namespace c4::plan {

enum class Mode { kOff, kEcmp, kC4p };
const char* modeName(Mode m);
/// "off", "ecmp", "c4p"; false for anything else.
bool parseMode(const std::string& s, Mode* out);

/// Where a rank sits: its host in the topology and, for each of its NIC ports (transport order),
/// the host's port index; and each NIC port's listening TCP port (0 if unknown: ECMP evaluation
/// then draws one).
struct RankPlace {
  int host = -1;
  std::vector<int> ports;
  std::vector<uint16_t> listenPorts;
};

/// Bytes rank src sends rank dst.
struct Flow {
  int src = 0, dst = 0;
  double bytes = 0;
};

struct PlanInput {
  const Topology* topo = nullptr;
  std::vector<RankPlace> ranks;
  std::vector<Flow> flows;
  int lanes = 2;
  Mode mode = Mode::kC4p;
  uint64_t seed = 1;         // ecmp's random source ports
  uint32_t portSalt = 0;     // offsets steering ports, so that communicators of one job differ
  PortRange sourcePorts;     // the source ports the transport can send from ({0,0}: any; RoCE: 49152-65535)
  int searchMoves = 100000;  // local-search moves at most (c4p)
  int restarts = 16;         // c4p above the host-port bound: greedy again from shuffled orders (0: never)
  /// Bytes per directed link (index: Topology link) that flows outside this input already put on
  /// the fabric (other jobs' lanes, as planned); empty: none. c4p and exhaustivePlan minimize the
  /// most loaded link counting them, so the job is placed on what the others leave; they are not
  /// moved. Plan::load stays this input's own bytes.
  std::vector<double> background;
  /// What each directed link (index: Topology link) still carries of its capacity, in (0, 1]: the
  /// fabric service's view of links that lanes found slow or cut (docs/c4p.md "Fabric health
  /// across jobs"); empty: every link at its capacity. c4p and replaceLane price a link's bytes at
  /// capacity x this, so a slowed link takes only the lanes nothing better can take.
  std::vector<double> capacity;
};

/// Seconds per byte on link `l` for this input (its capacity, times in.capacity[l] if set).
double secondsPerByte(const PlanInput& in, int l);

/// One lane's assignment. Ports index the ranks' NIC port lists (RankPlace::ports).
struct LaneChoice {
  int localPort = 0;        // port of the connection's lower rank (the one that opens lanes)
  int remotePort = 0;       // port of the higher rank
  int path = 0;             // among topo.numPaths(local, remote)
  int backPath = -1;        // the way back's path among numPaths(remote, local); -1: the same links
  uint16_t sourcePort = 0;  // first source port to bind (0: the kernel's)
  PortRange sourceRange;    // ports of the same path to try when that one is taken ({0,0}: none)
  bool retired = false;     // out of service (replaceLane): carries nothing
};

struct PlannedConn {
  int a = 0, b = 0;  // ranks, a < b
  double bytesAB = 0, bytesBA = 0;
  std::vector<LaneChoice> lanes;
};

class Plan {
 public:
  Mode mode = Mode::kOff;
  std::vector<PlannedConn> conns;
  /// Bytes per directed link (index: Topology link) the flows put on it.
  std::vector<double> load;

  /// The connection between ranks x and y (either order), or nullptr.
  const PlannedConn* find(int x, int y) const;
  /// Seconds the most loaded link needs for its bytes (load / capacity); 0 with no flows.
  double maxLinkSeconds(const Topology& t) const;
  /// That link (-1 if none).
  int bottleneck(const Topology& t) const;
  /// Seconds the most loaded host port link needs: what no plan can beat (the ideal, when the
  /// fabric itself does not oversubscribe), counting in.background on those links.
  static double hostBoundSeconds(const Topology& t, const PlanInput& in);
  /// Recomputes `load` from the lane choices (a connection's bytes split over its live lanes).
  void computeLoad(const PlanInput& in);
  /// The plan, one line per lane: "rank 0 -> rank 1 lane 0: h0p0 -> spine1 -> h1p1 sport 25000".
  std::string describe(const PlanInput& in) const;
  /// Per-link load lines, most loaded first: "leaf0->spine1  3.2 MB  25.6 ms  100%".
  std::string describeLoad(const Topology& t, int maxLines = 0) const;

 private:
  std::unordered_map<uint64_t, size_t> index_;
  friend Status makePlan(const PlanInput& in, Plan* out);
  friend Status exhaustivePlan(const PlanInput& in, Plan* out, int64_t maxCombos);
  friend Status adoptPlan(const PlanInput& in, const std::vector<PlannedConn>& conns, Plan* out);
  friend Status replaceLane(const PlanInput&, Plan*, int, int, int, const std::vector<char>&, bool, bool*, LaneChoice*);
  friend Status moveLane(const PlanInput&, Plan*, int, int, int, const LaneChoice&);
};

/// Plans by in.mode. Errors: a rank without a host or ports, a flow naming an unknown rank,
/// steering ranges exhausted, a chosen path whose steering ranges lie outside in.sourcePorts.
Status makePlan(const PlanInput& in, Plan* out);
/// A plan made elsewhere (the fabric service's, a job's kept plan), checked against the input
/// before anything uses it: exactly the connections the flows need, each with at least one lane
/// in service, every port, path and source port within what the ranks and the fabric have. The
/// connections' bytes are the input's (what the plan says of them is ignored). Errors name the
/// first thing that does not fit.
Status adoptPlan(const PlanInput& in, const std::vector<PlannedConn>& conns, Plan* out);
/// Re-planning one lane: lane `lane` of the connection (a, b) leaves service (retired, carrying
/// nothing from now on; the others carry its share), and a new lane is chosen for the connection:
/// the candidate whose most loaded link ends up least loaded, never crossing a link marked in
/// `avoid` (indexed by link; may be empty), and with `spareOnly` only one whose links carry none of
/// the plan's load in the directions it would use (a spare path). The new lane is appended to the
/// connection (its index: the connection's lane count before) and the loads updated. False in
/// *found when no candidate qualifies (the lane is retired all the same).
Status replaceLane(const PlanInput& in, Plan* plan, int a, int b, int lane, const std::vector<char>& avoid,
                   bool spareOnly, bool* found, LaneChoice* out);
/// Marks the directed links of lane `lane` of (a, b) (both directions, host ports excluded) in
/// *marks (resized to the link count): the fabric links a failed lane may have failed on.
void markLaneLinks(const PlanInput& in, const Plan& plan, int a, int b, int lane, std::vector<char>* marks);
/// Moving one lane where someone else chose (the fabric service): lane `lane` of the connection
/// (a, b) leaves service and `choice` is appended (its index: the connection's lane count before),
/// the loads updated. Errors (the plan unchanged): no such connection, a lane out of range or
/// already retired, a choice whose ports, path or source port the ranks and the fabric do not have.
Status moveLane(const PlanInput& in, Plan* plan, int a, int b, int lane, const LaneChoice& choice);
/// The directed links lane `l` of connection `c` crosses from a to b (fromA), or back; host
/// ports included.
void laneLinks(const PlanInput& in, const PlannedConn& c, const LaneChoice& l, bool fromA, std::vector<int>* links);
/// "h0p1 -> leaf0 -> spine1 -> leaf1 -> h2p1" for lane `lane` of (a, b).
std::string lanePath(const PlanInput& in, const Plan& plan, int a, int b, int lane);

/// Seconds the most loaded link needs for the plan's bytes and in.background's together.
double fabricSeconds(const PlanInput& in, const Plan& plan);

/// The optimum (least fabricSeconds) by trying every combination of lane choices; for small
/// instances only (fails when there are more than maxCombos combinations).
Status exhaustivePlan(const PlanInput& in, Plan* out, int64_t maxCombos = 20000000);

}  // namespace c4::plan
