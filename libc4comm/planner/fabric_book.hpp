// The fabric service's books (docs/c4p.md "The fabric service"): every job on one fabric, its
// ranks, flows, lanes and plan, and its lease. A new job is planned on what the others leave (their
// planned bytes per link are its PlanInput::background), so jobs that would each pick the same spine
// alone take different ones. Pure logic over a topology: no sockets, no clock (the caller passes
// the time), no files; tools/c4-fabricd serves it and keeps it in SQLite. One thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "planner/fabric_wire.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"

namespace c4::plan {

/// One job the service keeps.
struct BookedJob {
  uint64_t id = 0, token = 0;
  wire::JobSpec spec;
  PlanInput input;  // spec's ranks, flows and lanes over the book's topology (input.topo points to it)
  Plan plan;
  int64_t registeredMs = 0, renewedMs = 0, leaseUntilMs = 0, leaseMs = 0;
  int64_t movedMs = -1;               // when the service last asked it to move lanes (-1: never)
  std::vector<wire::LaneMove> moves;  // asked for, not yet handed to the job (its next renewal takes them)
  std::string moveWhy;
};

/// What the service believes of a link (docs/c4p.md "Fabric health across jobs").
struct LinkHealth {
  enum class State { kOk, kSlow, kCut };
  State state = State::kOk;
  double capacity = 1;  // the share of its capacity planning counts on (kSlow: what was measured; kCut: ~0)
  int64_t sinceMs = 0, untilMs = 0;  // booked then, held until then (then believed well again)
  std::string by;                    // the job whose lanes found it
};
const char* linkStateName(LinkHealth::State s);

/// When the service moves running jobs' lanes (FabricBook::planMoves).
struct MovePolicy {
  int64_t minIntervalMs = 60000;  // a job is asked to move for a better fabric at most this often
  double minGain = 0.10;          // ... and only when the most loaded link it changes drops by this share
  int maxJobsTried = 4;           // jobs on the most loaded link re-planned per look (work bound)
};

class FabricBook {
 public:
  explicit FabricBook(Topology topo);
  FabricBook(const FabricBook&) = delete;
  FabricBook& operator=(const FabricBook&) = delete;

  const Topology& topology() const { return topo_; }
  /// Books a job under `id` (unused, not 0) and `token`, leased until nowMs + leaseMs: plans it on
  /// the others' load (spec.keep empty) or books spec.keep as it is (a job re-registering with a
  /// service that restarted: nothing moves). Errors: another fabric (topoHash), ranks or flows that
  /// do not fit the fabric, a kept plan that does not fit the job; the books are then unchanged.
  Status add(uint64_t id, uint64_t token, const wire::JobSpec& spec, int64_t nowMs, int64_t leaseMs,
             const BookedJob** out);
  /// Extends a job's lease to nowMs + leaseMs. Errors: no such job (*unknown set), a wrong token.
  Status renew(uint64_t id, uint64_t token, int64_t nowMs, int64_t leaseMs, bool* unknown);
  /// Drops a job. Errors: no such job (*unknown set), a wrong token (the job stays).
  Status release(uint64_t id, uint64_t token, bool* unknown);
  /// Drops the jobs whose lease ran out by nowMs; returns their ids. Links held bad until nowMs are
  /// believed well again.
  std::vector<uint64_t> expire(int64_t nowMs);
  /// A job's report (with its renewal): first the lanes of the connections it says changed replace
  /// the books' (checked as adoptPlan checks a plan; an error leaves the job's plan as it was),
  /// then its samples judge links: the fabric links (in the measured direction) of lanes it found
  /// slow or broken, less those of lanes of the same report running at least 80% of their
  /// connection's fastest, are booked slow (capacity: the lane's measured share, at most 0.5) or
  /// cut, for `holdMs`. *changed receives the links whose state changed. Errors: no such job, a
  /// wrong token; samples of lanes the books do not have are skipped.
  Status report(uint64_t id, uint64_t token, const wire::JobReport& r, int64_t nowMs, int64_t holdMs,
                std::vector<int>* changed);
  /// Moves running jobs' lanes, at most once per look: first every live lane that crosses a link
  /// booked slow or cut (in a direction it carries bytes) goes to the best path that avoids such
  /// links, if there is one; else, where re-planning one job (on the most loaded link or the most
  /// loaded switch-to-switch link, not asked within policy.minIntervalMs) on what the others leave
  /// makes the fabric better by policy.minGain, that job's changed lanes move. Better is
  /// lexicographic (the most loaded link, then the next...): the most loaded of the links the
  /// re-plan changes reads that much less. The books take the moves at once; the job gets them
  /// with its next renewal (takeMoves). Returns the ids of the jobs asked to move.
  std::vector<uint64_t> planMoves(int64_t nowMs, const MovePolicy& policy);
  /// The moves waiting for job `id` (cleared), and why.
  std::vector<wire::LaneMove> takeMoves(uint64_t id, std::string* why);
  /// The links booked slow or cut (index: link).
  const std::map<int, LinkHealth>& linkHealth() const { return health_; }
  /// Capacity factors for planning (PlanInput::capacity): 1 but where a link is booked bad.
  std::vector<double> capacity() const;
  const std::map<uint64_t, BookedJob>& jobs() const { return jobs_; }
  const BookedJob* find(uint64_t id) const;
  /// Bytes per directed link of every job's plan but `except`'s (0: all jobs).
  std::vector<double> load(uint64_t except = 0) const;
  /// Seconds the fabric's most loaded link needs for every job's bytes (load / capacity, the
  /// capacity as the books believe it).
  double fabricSeconds() const;
  /// The service's view as JSON (docs/c4p.md "Operator view"): every job (name, lease left, lanes
  /// and their paths), every link's load, most loaded first, and the fabric's bottleneck.
  std::string statusJson(int64_t nowMs) const;

 private:
  // The job's lanes that carry bytes over a link booked bad: (conn index, lane).
  std::vector<std::pair<size_t, int>> lanesOnBadLinks(const BookedJob& j) const;
  Topology topo_;
  std::map<uint64_t, BookedJob> jobs_;
  std::map<int, LinkHealth> health_;
};

}  // namespace c4::plan
