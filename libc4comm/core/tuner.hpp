// Tuner: picks an algorithm and a pipelining chunk size for a collective from its size, the rank
// count and the transports' cost model. C4_ALGO / NCCL_ALGO override the algorithm ("ring", or a
// per-collective list "allreduce:tree,broadcast:ring"); C4_CHUNK_SIZE overrides the chunk.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "sched/schedule.hpp"
#include "transports/transport.hpp"

namespace c4 {

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
  /// `bytes` is the collective's size as nccl-tests counts it (the larger of input and output).
  TuneResult choose(Coll coll, size_t bytes) const;
  /// Estimated time in microseconds of `algo` for this size (the cost model the choice uses).
  double estimateUs(sched::Algo algo, Coll coll, size_t bytes) const;

 private:
  static constexpr double kReduceGBps = 10.0;
  int nranks_ = 1;
  int nhosts_ = 1;
  transport::Caps caps_;
  std::array<int, kNumColls> forced_{};  // -1: no override, else an Algo
  size_t chunkOverride_ = 0;
};

}  // namespace c4
