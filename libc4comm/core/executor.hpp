// Executor: runs one rank's part of any schedule over the communicator's connections.
//
// Non-blocking: start() posts what can be posted, poll() advances; one thread may drive several
// executors (of different communicators) round-robin, which is how a group over several
// communicators of one process completes. Semantics are those documented in sched/schedule.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"
#include "sched/schedule.hpp"
#include "transports/transport.hpp"

namespace c4 {

struct Comm;

/// A step with its buffers resolved to addresses.
struct ExecStep {
  sched::StepKind kind = sched::StepKind::kCopy;
  int32_t peer = -1;
  const void* src = nullptr;
  const void* src2 = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
  uint32_t depBegin = 0, depEnd = 0;  // range in ExecPlan::deps (indices of earlier steps)
  uint32_t sigIdx = UINT32_MAX;       // index in ExecPlan::sigs, or the plan's sig
};

/// A resolved, ready-to-run schedule: steps plus successor lists and per-peer post order.
struct ExecPlan {
  std::vector<ExecStep> steps;
  std::vector<uint32_t> deps;
  OpSig sig;
  std::vector<OpSig> sigs;  // per-step signatures (point-to-point batches)
  DataType dtype = DataType::kFloat32;
  kernels::KOp op = kernels::KOp::kSum;

  /// Appends a step; `deps` are indices of earlier steps.
  void add(const ExecStep& s, const int32_t* depList, size_t ndeps);
  const OpSig& sigOf(const ExecStep& s) const { return s.sigIdx < sigs.size() ? sigs[s.sigIdx] : sig; }
};

/// Resolves a generated schedule against concrete buffers.
void buildPlan(const sched::Schedule& s, const void* input, void* output, void* scratch, ExecPlan* plan);

class Executor {
 public:
  /// Binds to `comm` (for connections, timeout and back-off); `plan` must outlive the run.
  Status start(Comm* comm, const ExecPlan* plan);
  /// Advances; sets *done when every step completed. On failure the run is over (no request of
  /// this run is left pending in a way that could touch the caller's buffers later, because the
  /// communicator aborts its transports).
  Status poll(bool* done);
  /// True if the last poll() made progress (used for back-off by the driver loop).
  bool madeProgress() const { return progressed_; }

 private:
  struct PeerQueue {
    int peer = -1;
    transport::Connection* conn = nullptr;
    std::vector<uint32_t> sends, recvs;  // step indices in post order
    size_t nextSend = 0, nextRecv = 0;
  };
  Status complete(uint32_t idx);
  Status postReady();
  Status runLocal(uint32_t idx);
  std::string pendingSummary() const;

  Comm* comm_ = nullptr;
  const ExecPlan* plan_ = nullptr;
  std::vector<uint32_t> remaining_;    // unfinished deps per step
  std::vector<uint32_t> succBegin_, succ_;
  std::vector<transport::Request> reqs_;
  std::vector<uint32_t> inflight_;     // posted, not yet complete
  std::vector<uint32_t> localReady_;
  std::vector<PeerQueue> peers_;
  std::vector<int32_t> peerSlot_;      // rank -> index in peers_ or -1
  size_t completed_ = 0;
  bool progressed_ = false;
  int64_t lastProgressNs_ = 0;
};

}  // namespace c4
