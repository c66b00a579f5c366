// Tuner: picks an algorithm and a pipelining chunk size for a collective from its size, the rank
// count and the transports' cost model. C4_ALGO / NCCL_ALGO override the algorithm ("ring", or a
// per-collective list "allreduce:tree,broadcast:ring"); C4_CHUNK_SIZE overrides the chunk.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "sched/schedule.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// How a call runs (core/paths.hpp).
enum class PathKind : uint8_t {
  kMessages = 0,  // a schedule over the transports (the executor)
  kOneShot = 1,   // the shared arena of small calls (one host)
  kZeroCopy = 2,  // straight between the ranks' shared buffers (ncclMemAlloc, one host)
};
const char* pathName(PathKind k);

/// A schedule file kept for one collective.
struct ScheduleChoice {
  sched::Algo algo = sched::Algo::kRing;
  Coll coll = Coll::kAllReduce;  // the file's (its rank count is the communicator's)
  std::string path;
};

struct TuneResult {
  sched::Algo algo = sched::Algo::kRing;
  size_t chunkBytes = 0;
  // Plain receives may be served in one copy from the sender's buffer (SendHint::singleCopy).
  bool singleCopy = false;
  std::string why;  // one line for C4_DEBUG=INFO
};

class Tuner {
 public:
  /// Reads the overrides; `caps` is the cost model of the slowest transport in use.
  Status init(int nranks, int nhosts, const transport::Caps& caps);
  /// For ranks on several hosts: the host index of every rank and the cost models inside a host
  /// (`intra`) and between hosts (`inter`). Makes the hierarchical algorithms candidates; without
  /// it every rank pair is modelled with init's caps.
  void setHosts(const std::vector<int32_t>& hostOf, const transport::Caps& intra, const transport::Caps& inter);
  /// The host map given to setHosts (empty if none), for the generators.
  const std::vector<int32_t>& hostOf() const { return hostOf_; }
  /// `bytes` is the collective's size as nccl-tests counts it (the larger of input and output).
  TuneResult choose(Coll coll, size_t bytes) const;
  /// Estimated time in microseconds of `algo` for this size (the cost model the choice uses).
  double estimateUs(sched::Algo algo, Coll coll, size_t bytes) const;
  /// Loads and registers the schedule files of C4_SCHEDULE_FILE (docs/schedules.md) and keeps those
  /// for this communicator: same rank count, and no topology or `topoHash` (the hash of
  /// C4_TOPO_FILE; `haveTopo` false without one). A file that fails to load is an error.
  Status loadSchedules(bool haveTopo, uint64_t topoHash, int64_t timeoutMs);
  /// Drops kept schedules whose file places rank r on another topology host than `rankHosts[r]`
  /// (C4P's placement; empty: unknown, nothing dropped).
  void checkScheduleHosts(const std::vector<std::string>& rankHosts);
  /// A hash of the kept schedules' contents (0: none), which ranks compare.
  uint64_t schedulesHash() const;
  /// The kept schedule of a collective (nullptr if none).
  const ScheduleChoice* scheduleFor(Coll coll) const;
  /// Every kept schedule (C4P plans the connections they use).
  const std::vector<ScheduleChoice>& schedules() const { return schedules_; }

 private:
  double hierAllReduceUs(size_t bytes) const;

  static constexpr double kReduceGBps = 10.0;
  int nranks_ = 1;
  int nhosts_ = 1;
  transport::Caps caps_;
  std::vector<int32_t> hostOf_;
  transport::Caps intra_, inter_;
  int ranksPerHost_ = 0;                   // when every host has the same number of ranks, else 0
  std::array<int, kNumColls> forced_{};    // -1: no override, else an Algo
  std::vector<ScheduleChoice> schedules_;  // C4_SCHEDULE_FILE, one per collective at most
  size_t chunkOverride_ = 0;
};

}  // namespace c4
