// Schedule files (docs/schedules.md): a schedule written by hand or synthesized by tools/c4-synth,
// loaded, checked (structure, data availability, dependency cycles, then the schedule simulator on
// real data) and registered beside the built-in generators. A loaded schedule is an algorithm like
// ring or tree: generate() builds any rank's steps from it for any element count and chunk size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "sched/schedule.hpp"

namespace c4::sched {

/// One step of a schedule file.
struct FileStep {
  enum class Op : uint8_t { kSend, kRecv, kSendPartial, kRecvReduce };
  Op op = Op::kSend;
  int32_t peer = -1;
  int32_t chunk = -1;
  std::vector<int32_t> deps;  // explicit, indices into the rank's steps as the file lists them
};

/// A loaded, checked schedule file.
struct ScheduleFile {
  std::string source;  // path (or what parse() was told)
  std::string name;    // the file's "name"
  std::string label;   // "file:NAME", the algorithm's name in logs
  uint64_t hash = 0;   // FNV-1a of the file's bytes
  Coll coll = Coll::kAllGather;
  int nranks = 0;
  int chunks = 1;  // per block
  bool hasTopology = false;
  uint64_t topologyHash = 0;
  std::vector<std::string> hosts;  // topology host of each rank (empty: not given)
  /// Each rank's steps in the order they run (the file's order, stably sorted so that explicit
  /// deps come first); deps are rewritten to that order.
  std::vector<std::vector<FileStep>> ranks;
  // From the load-time simulation, for the tuner's cost model:
  int64_t depth = 0;          // messages on the critical path (SimStats::hops)
  double sendFraction = 0;    // most bytes one rank sends, over the collective's nominal bytes
  double reduceFraction = 0;  // most bytes one rank reduces, over the same
};

/// "send", "recv", "send-partial", "recv-reduce".
const char* fileOpName(FileStep::Op op);

/// Parses and checks a schedule file's text (every check of docs/schedules.md, the simulation
/// included); `source` names it in errors. kInvalidUsage naming the rank and step on failure.
/// `deadlineNs` (CLOCK_MONOTONIC, 0: none): the check stops there with kInvalidUsage saying so.
/// The simulation's hazard check samples ranks where checking all would cost too much.
Status parseScheduleFile(const std::string& text, const std::string& source, ScheduleFile* out, int64_t deadlineNs = 0);
/// Reads `path` (a regular file of at most C4_SCHEDULE_FILE_MAX_BYTES) and parses it.
Status loadScheduleFile(const std::string& path, ScheduleFile* out);
/// The file's "nranks" and "collective" (as written), read without parsing its steps (cheap for a
/// file of thousands of ranks): whether it is worth loading for a communicator.
Status peekScheduleFile(const std::string& path, int* nranks, std::string* collective);

/// Rank args.rank's schedule from `f` (args.coll and args.nranks must match the file; chunkBytes
/// pipelines each chunk's transfers in pieces). kInvalidArgument on a mismatch.
Result<Schedule> buildFromFile(const ScheduleFile& f, const CollArgs& args);

/// Registers a loaded schedule as an algorithm (id >= kNumAlgos) and returns its id; a file with the
/// same hash registered before returns that id. Thread-safe. At most 247 schedules per process (ids 5..0xfb;
/// trace::Event::algo codes the rest).
Result<Algo> registerSchedule(std::shared_ptr<const ScheduleFile> f);
/// The schedule behind a registered id (null for the built-in algorithms).
std::shared_ptr<const ScheduleFile> registeredSchedule(Algo a);
/// How many schedules are registered (ids kNumAlgos .. kNumAlgos + n - 1).
int numRegisteredSchedules();
/// Loads (once per process per path and content) and registers a file.
Result<Algo> loadAndRegister(const std::string& path, int64_t deadlineNs = 0);

}  // namespace c4::sched
