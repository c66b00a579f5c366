// Schedule IR: algorithms are data. A generator turns (collective, ranks, count, algorithm, chunk
// size) into this rank's ordered list of steps; one Executor runs any schedule.
//
// Contract between generators and the executor:
//  * Steps are in a topological order: every dep index is lower than the step's own index.
//  * A step starts only when all its deps have completed. A step that writes a region must depend
//    (directly or transitively) on every earlier step that reads or writes an overlapping region,
//    including sends still reading it (write-after-read).
//  * Send and receive steps to/from one peer are posted in index order; the k-th send this rank
//    posts to P matches the k-th receive P posts from this rank, and both have the same byte count.
//    Zero-byte sends/receives are never emitted (both sides skip them consistently). A send's
//    peerReduces says whether that matching receive is a kRecvReduce.
//  * Buffers: kInput is the caller's sendbuff, kOutput its recvbuff, kScratch a communicator-owned
//    area of `scratchBytes`. In-place calls alias kInput and kOutput as NCCL defines (AllReduce,
//    Broadcast, Reduce: same pointer; AllGather: input == output + rank*count; ReduceScatter:
//    output == input + rank*count; Gather at the root: input == output + root*count; Scatter at the
//    root: output == input + root*count); a schedule must be correct both aliased and not, unless
//    CollArgs::aliased is false (disjoint buffers only: no dependencies between them). AlltoAll
//    is never given aliased buffers (the communicator works from a copy when the caller aliases). Non-root
//    ranks never touch kOutput of Reduce/Gather nor kInput of Broadcast/Scatter (those pointers may
//    be null there).
//  * AllReduce results are bitwise identical on every rank (each element is reduced in one order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"

namespace c4::sched {

enum class BufId : uint8_t { kInput = 0, kOutput = 1, kScratch = 2 };

/// A byte range of one buffer.
struct Span {
  BufId buf = BufId::kInput;
  size_t offset = 0;
  size_t bytes = 0;
};

enum class StepKind : uint8_t {
  kSend,        // send `src` to `peer`
  kRecv,        // receive from `peer` into `dst` (dst.bytes bytes)
  kRecvReduce,  // receive from `peer`; dst = src op incoming (src may equal dst; same byte count)
  kCopy,        // dst = src (local; a copy onto itself is a no-op)
  kReduce,      // dst = src op src2 (local)
};

struct Step {
  StepKind kind = StepKind::kCopy;
  int32_t peer = -1;
  Span src;
  Span src2;
  Span dst;
  std::vector<int32_t> deps;
  // kSend only: the matching receive is a kRecvReduce. Transports pick their protocol by it (shm
  // reads a plain receive straight from the sender's buffer, but streams a reduced one through its
  // ring so the receiver reduces out of shared slots). The simulator checks it against the peer.
  bool peerReduces = false;
};

/// An algorithm: an id in the algorithm registry. The built-in generators have the ids below; ids
/// from kNumAlgos on are schedules loaded from files (sched/schedule_file.hpp, registerSchedule),
/// so the set is open: the tuner, the plan cache and the tracer take any registered id.
enum class Algo : uint8_t { kRing = 0, kTree = 1, kRhd = 2, kDirect = 3, kHier = 4 };
constexpr int kNumAlgos = 5;  // built-in
/// Built-in and registered algorithms (ids 0 .. numAlgos() - 1).
int numAlgos();
/// "ring", "tree", "rhd", "direct", "hier"; "file:NAME" for a loaded schedule.
const char* algoName(Algo a);
/// Parses a built-in algorithm's name (case-insensitive; "RING", "Tree", "rhd"/"halvingdoubling",
/// "direct"/"pat", "hier"/"hierarchical").
bool parseAlgo(const std::string& name, Algo* out);

/// Everything a generator needs. Counts are elements.
struct CollArgs {
  Coll coll = Coll::kAllReduce;
  int rank = 0;
  int nranks = 1;
  size_t count = 0;  // per NCCL's argument: AllGather sendcount, ReduceScatter recvcount, AlltoAll per-peer
  DataType dtype = DataType::kFloat32;
  int root = 0;
  bool reduces = false;         // true for AllReduce, ReduceScatter, Reduce
  size_t chunkBytes = 1 << 20;  // pipelining granularity chosen by the tuner (rounded to elements)
  // Whether the call's input and output may alias (in place). False only when the caller's buffers
  // are known to be disjoint: the schedule then has no write-after-read dependencies between them
  // (a receive into the output need not wait for a send of the input), and must not be run in place.
  bool aliased = true;
  // Host index of every rank (same value = same host); empty: all on one host. Only the
  // hierarchical generators read it.
  std::vector<int32_t> hostOf;
};

struct Schedule {
  std::vector<Step> steps;
  size_t scratchBytes = 0;
  Algo algo = Algo::kRing;
};

/// True if `algo` has a generator for this collective and rank count.
bool supports(Algo algo, Coll coll, int nranks);
/// Builds this rank's schedule. Fails with kInvalidArgument if unsupported.
Result<Schedule> generate(Algo algo, const CollArgs& args);

/// Input and output sizes in bytes of a collective for one rank (as a caller must provide).
size_t inputBytes(const CollArgs& a);
size_t outputBytes(const CollArgs& a);

}  // namespace c4::sched
