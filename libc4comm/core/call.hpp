// One call as a communicator runs it (PreparedCall), and the cached plan of a repeated collective:
// what the paths (core/paths.hpp), the driving loops and the call observers (core/observer.hpp)
// share.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/executor.hpp"
#include "core/opdesc.hpp"
#include "core/tuner.hpp"
#include "sched/schedule.hpp"
#include "trace/recorder.hpp"
#include "transports/transport.hpp"

namespace c4 {

class ExecPath;

/// A plan built for one distinct operation (coll, dtype, count, root) and the executor bound to
/// it; cached, so a repeated call only rebinds buffers.
struct CachedPlan {
  ExecPlan plan;
  Executor exec;
  size_t schedScratch = 0;  // bytes of scratch the schedule uses (aligned)
  sched::Algo algo = sched::Algo::kRing;
};

/// What runs one call: the path the tuner chose, the executor (message path), the call's buffers.
/// A probe (waitProbe: waiting for a send to arrive) is a call without a path.
struct PreparedCall {
  ExecPath* path = nullptr;  // null for no-op calls and probes
  PathKind kind = PathKind::kMessages;
  Executor* exec = nullptr;  // the message path's (also the zero-copy path's fallback)
  const void* bases[kNumBufBases] = {nullptr, nullptr, nullptr, nullptr};
  transport::MemSpace spaces[kNumBufBases] = {transport::MemSpace::kHost, transport::MemSpace::kHost,
                                              transport::MemSpace::kHost, transport::MemSpace::kHost};
  OpDesc op;
  OpSig sig;
  kernels::KOp kop = kernels::KOp::kSum;
  bool collective = false;
  bool noop = false;
  bool probe = false;                    // a wait for a send from op.root (kAnySource: any peer)
  bool postDivide = false;               // integer Avg: divide the result by nranks afterwards
  uint8_t traceAlgo = trace::kAlgoNone;  // what ran (trace::Event::algo)
  uint64_t traceT0 = 0;                  // trace clock at prepare; 0: not traced here
  bool traceOneShot = false;             // traced, and OneShot records the event (see there)
  std::unique_ptr<CachedPlan> owned;     // point-to-point batches are built per call
  // Ring indices of its open op events (Recorder::complete): the first, then the others (a
  // point-to-point batch has one per send and receive).
  uint32_t traceOpen = 0;
  uint64_t traceFirst = 0;
  std::vector<uint64_t> traceMore;
};

/// The op event of a prepared collective, without its times (the tracer's record of it).
trace::Event callEvent(const PreparedCall& p, int nranks);

}  // namespace c4
