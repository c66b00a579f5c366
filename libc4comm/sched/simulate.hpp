// An in-memory simulator of the executor: runs the schedules of all ranks in one process with the
// executor's semantics and checks the schedule contract. Used by the generator tests, tests of
// synthesized schedules and the tracer. Single-threaded; not for production data paths.
//
// Semantics simulated (see schedule.hpp):
//  * a step becomes ready when all its deps are complete;
//  * sends/receives to one peer are posted strictly in step-index order (a ready one waits for the
//    earlier ones to that peer to be posted);
//  * the k-th send from A to B matches the k-th receive B posts from A; when both are posted the
//    data moves and both complete (kRecvReduce: dst = src op incoming);
//  * local kCopy/kReduce run as soon as they are ready.
// Among ready steps the simulator picks in a seeded random order, so ordering bugs show up as
// different results across seeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "c4comm/status.hpp"
#include "sched/schedule.hpp"

namespace c4::sched {

/// Element-wise reduction of `bytes` bytes: dst = a op b. dst may equal a or b exactly.
using ReduceFn = std::function<void(void* dst, const void* a, const void* b, size_t bytes)>;

/// One rank's buffers. A null pointer means the buffer must not be touched. Input and output may
/// alias (in-place calls). A null scratch with a schedule that needs scratch gets a simulator-owned
/// area of scratchBytes.
struct SimBuffers {
  void* input = nullptr;
  size_t inputBytes = 0;
  void* output = nullptr;
  size_t outputBytes = 0;
  void* scratch = nullptr;
  size_t scratchBytes = 0;
};

struct SimOptions {
  /// Seed for the order in which ready steps run.
  uint64_t seed = 0;
  /// Check that every two steps of a rank touching overlapping bytes (one of them writing) are
  /// ordered by a dependency path. Costs O(steps^2 / 8) bytes per rank.
  bool checkHazards = true;
  /// Ranks with more steps than this skip the hazard check.
  size_t maxHazardSteps = 16384;
  /// The hazard check costs the sum over ranks of steps^2; beyond this much, it checks a spread of
  /// ranks whose cost fits (rank 0, the last rank, and every k-th: schedules are mostly alike
  /// across ranks). SIZE_MAX: every rank.
  size_t maxHazardWork = SIZE_MAX;
  /// CLOCK_MONOTONIC ns after which the run stops with kTimeout (0: never).
  int64_t deadlineNs = 0;
  /// Fail when a step reads scratch bytes no earlier step wrote.
  bool checkScratchInit = true;
};

/// What a run did.
struct SimStats {
  size_t steps = 0;            // all ranks
  size_t messages = 0;         // matched send/receive pairs
  size_t bytes = 0;            // bytes moved by messages
  size_t maxRankMessages = 0;  // most sends + receives posted by one rank
  /// Completion time in message hops: a local step costs 0, a message 1; a message starts when
  /// both ends are posted and its directed link has finished the previous message (so pipelined
  /// pieces queue on a link). The length of the critical path.
  int64_t hops = 0;
};

/// Checks one rank's schedule on its own: dep order, peers, byte counts, zero-byte messages,
/// in-step overlaps and (when `bufs` is given) buffer bounds and null buffers. kInvalidUsage on
/// failure, naming the rank and step.
Status validateSchedule(const Schedule& s, int rank, int nranks, const SimBuffers* bufs = nullptr);

/// Runs `scheds` (one per rank) over `bufs` (one per rank). Fails with kInvalidUsage naming the
/// rank, step and problem on a contract violation: a bad step (see validateSchedule), unmatched
/// messages or a size mismatch between a matched send and receive, a deadlock, a data race (two
/// unordered steps touching overlapping bytes), a read of uninitialized scratch. `reduce` may be
/// empty if no schedule reduces. `stats` is set only on success.
Status simulate(const std::vector<Schedule>& scheds, const std::vector<SimBuffers>& bufs, const ReduceFn& reduce,
                const SimOptions& opts = SimOptions(), SimStats* stats = nullptr);

/// "send to 3", "recvReduce from 1", "copy", ...
std::string describeStep(const Step& s);

}  // namespace c4::sched
