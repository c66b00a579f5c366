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
  /// Drops the jobs whose lease ran out by nowMs; returns their ids.
  std::vector<uint64_t> expire(int64_t nowMs);
  const std::map<uint64_t, BookedJob>& jobs() const { return jobs_; }
  const BookedJob* find(uint64_t id) const;
  /// Bytes per directed link of every job's plan but `except`'s (0: all jobs).
  std::vector<double> load(uint64_t except = 0) const;
  /// Seconds the fabric's most loaded link needs for every job's bytes (load / capacity).
  double fabricSeconds() const;
  /// The service's view as JSON (docs/c4p.md "Operator view"): every job (name, lease left, lanes
  /// and their paths), every link's load, most loaded first, and the fabric's bottleneck.
  std::string statusJson(int64_t nowMs) const;

 private:
  Topology topo_;
  std::map<uint64_t, BookedJob> jobs_;
};

}  // namespace c4::plan
