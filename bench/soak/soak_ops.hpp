// c4-soak's operations: random collectives and point-to-point exchanges that every rank of a
// segment draws identically from a shared seed, and the rank-side runner that issues them and
// checks every element of every result against the references of soak_data.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace c4 {
namespace soak {

/// What one drawn operation is.
enum class OpKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,  ///< a batch of sends and receives between random pairs, in one group
  kGroup,     ///< several collectives (and sometimes a send/recv batch) in one group
};
constexpr int kNumOpKinds = 10;
/// "allreduce", ..., "sendrecv", "group".
const char* opKindName(OpKind k);

/// One collective call of an operation (the same on every rank).
struct CollCall {
  Coll coll = Coll::kAllReduce;
  DataType dt = DataType::kFloat32;
  int op = 0;        ///< RedOp value, or kPreMulSum (soak_data.hpp); reductions only
  size_t count = 0;  ///< as the API takes it (per-rank block for allgather, reducescatter, ...)
  int root = 0;      ///< rooted collectives
  bool inPlace = false;
  bool nullUnused = false;      ///< non-roots pass NULL for the buffer they do not use
  int shareMode = 0;            ///< 0: malloc buffers; 1: memAlloc on every rank (zero-copy); 2: on even ranks
  bool scalarOnDevice = false;  ///< premul-sum scalar by pointer (kDevice) instead of by value
  std::vector<int> scalarIdx;   ///< premul-sum: per-rank scalar index
  uint64_t seed = 0;
};

/// One message of a send/recv batch.
struct P2pMsg {
  int src = 0;
  int dst = 0;
  size_t count = 0;
  DataType dt = DataType::kUint8;
  uint64_t seed = 0;
};

/// One drawn operation.
struct OpSpec {
  OpKind kind = OpKind::kAllReduce;
  std::vector<CollCall> colls;
  std::vector<P2pMsg> msgs;
  uint64_t seed = 0;
  /// One line: "allreduce float16 prod count=1001 in-place", "group[3]: ...".
  std::string describe() const;
  /// Calls it makes on each rank (collectives, plus one for a send/recv batch).
  int calls() const { return static_cast<int>(colls.size()) + (msgs.empty() ? 0 : 1); }
};

/// Draws operation `index` of a segment: every rank gets the same one from the same arguments.
/// `maxBytes` bounds each buffer.
OpSpec drawOp(uint64_t segSeed, int index, int nranks, size_t maxBytes);

/// Faults the runner can plant to show that the checks catch them (c4-soak --inject).
enum class Inject : uint8_t {
  kNone,
  kWrong,  ///< flips a bit of one element of one result after the call returned
  kOob,    ///< writes one byte just past the end of one receive buffer
};

/// What running one operation on one rank found.
struct OpResult {
  Status status;                     ///< the first failed call (the communicator must be aborted)
  uint64_t bytesChecked = 0;         ///< result bytes compared on this rank
  int64_t wrong = 0;                 ///< wrong result elements, and input or unused buffers that changed
  int64_t outOfBounds = 0;           ///< guard bytes around buffers that changed
  std::vector<std::string> reports;  ///< the first few mismatches, one line each
};

/// Runs operations on one rank of a communicator.
class RankRunner {
 public:
  RankRunner(Comm* comm, int rank, int nranks, bool nonBlocking);
  /// Runs and checks `op`. `label` prefixes every report ("seg 3 op 17"). After a failed call
  /// (OpResult::status), abort the communicator before destroying the runner: the runner keeps the
  /// buffers of that call, which the library may still reach until then.
  OpResult run(const OpSpec& op, const std::string& label);
  /// Plants `what` into the next operation that has a result on this rank (once).
  void arm(Inject what) { inject_ = what; }
  bool armed() const { return inject_ != Inject::kNone; }

 private:
  Comm* comm_;
  int rank_;
  int nranks_;
  bool nonBlocking_;
  Inject inject_ = Inject::kNone;
  std::vector<std::shared_ptr<void>> abandoned_;  // what a failed call may still reach
};

}  // namespace soak
}  // namespace c4
