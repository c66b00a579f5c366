// Executor: runs one rank's part of any schedule over the connections of an ExecContext.
//
// Non-blocking: start() posts what can be posted, poll() advances; one thread may drive several
// executors (of different communicators) round-robin, which is how a group over several
// communicators of one process completes. Semantics are those documented in sched/schedule.hpp.
//
// Memory: every buffer of a call has a memory space. A send whose buffer the transport cannot read
// (Caps::spaces) goes out of a host bounce buffer; a receive it cannot write lands in one and is
// copied out; a reducing receive on a transport without Caps::reduceOnRecv (or C4_RECV_REDUCE=0)
// lands in one and is reduced with the kernel of the destination's space when complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"
#include "core/exec_context.hpp"
#include "kernels/host/reduce.hpp"
#include "sched/schedule.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// Where a step's bytes live: one of the call's buffers (bases are bound per call, so a plan is
/// built once and reused) or an absolute address (kAbsolute, base 0: point-to-point batches).
enum class BufBase : uint8_t { kInput = 0, kOutput = 1, kScratch = 2, kAbsolute = 3 };
constexpr int kNumBufBases = 4;

struct BufRef {
  BufBase base = BufBase::kAbsolute;
  uintptr_t offset = 0;
};

/// A step of a plan.
struct ExecStep {
  sched::StepKind kind = sched::StepKind::kCopy;
  int32_t peer = -1;
  BufRef src, src2, dst;
  size_t bytes = 0;
  bool peerReduces = false;           // kSend: the peer reduces what it receives (transport protocol hint)
  uint32_t depBegin = 0, depEnd = 0;  // range in ExecPlan::deps (indices of earlier steps)
  uint32_t sigIdx = UINT32_MAX;       // index in ExecPlan::sigs, or the plan's sig
};

/// A ready-to-run plan: steps plus dependencies. Built once per distinct operation and reused.
struct ExecPlan {
  std::vector<ExecStep> steps;
  std::vector<uint32_t> deps;
  OpSig sig;
  std::vector<OpSig> sigs;  // per-step signatures (point-to-point batches)
  DataType dtype = DataType::kFloat32;
  kernels::KOp op = kernels::KOp::kSum;
  bool singleCopy = true;  // plain receives may read the sender's buffer (see TuneResult)

  /// Appends a step; `deps` are indices of earlier steps.
  void add(const ExecStep& s, const int32_t* depList, size_t ndeps);
  const OpSig& sigOf(const ExecStep& s) const { return s.sigIdx < sigs.size() ? sigs[s.sigIdx] : sig; }
};

/// Translates a generated schedule into a plan (buffer-relative; no addresses yet).
void buildPlan(const sched::Schedule& s, ExecPlan* plan);

class Executor {
 public:
  /// Prepares to run `plan` in `ctx` (successor lists, per-peer post order, connections, which
  /// steps stage through host memory). Done once per plan; `plan` must outlive the executor and
  /// not change after bind.
  Status bind(ExecContext* ctx, const ExecPlan* plan);
  /// Starts a run with the call's buffers (indexed by BufBase; kAbsolute is ignored) and the memory
  /// space of each.
  Status start(const void* const bases[kNumBufBases], const transport::MemSpace spaces[kNumBufBases]);
  /// Advances; sets *done when every step completed. On failure the run is over (the caller
  /// fails the communicator, which aborts its transports so no request touches the buffers later).
  /// Reports progress to the context's watchdog; timing out is the watchdog's call.
  Status poll(bool* done);
  /// True if the last poll() made progress (used for back-off by the driver loop).
  bool madeProgress() const { return progressed_; }
  /// Whom the run waits for: ranks with sends or receives outstanding and their connections'
  /// state (the watchdog's error).
  std::string waitingOn() const;
  /// The peers with sends or receives outstanding, each with its connection's state (C4D).
  std::vector<std::pair<int, std::string>> waitingRanks() const;

 private:
  struct PeerQueue {
    int peer = -1;
    transport::Connection* conn = nullptr;
    transport::Forwarding* forwarding = nullptr;  // conn's capabilities, or null
    transport::ReleasedSends* releasedSends = nullptr;
    transport::Caps caps;
    std::vector<uint32_t> sends, recvs;  // step indices in post order
    size_t nextSend = 0, nextRecv = 0;
    uint8_t transport = 0;  // trace::Event::transport
    uint8_t lane = 0;       // trace::Event::lane (kLaneStriped for several lanes)
  };
  /// How a network step meets its buffers.
  enum class Stage : uint8_t {
    kNone = 0,    // straight from / into the call's buffer
    kSend = 1,    // copied into the bounce buffer, sent from there
    kRecv = 2,    // received into the bounce buffer, copied out
    kReduce = 3,  // received into the bounce buffer, reduced into dst
  };
  Status complete(uint32_t idx);
  /// Send `idx` was released (Request::released): its successors that releaseMeets count it done.
  void release(uint32_t idx);
  /// Whether a released send `send` meets step `succ`'s dependency on it (see executor.cc).
  bool releaseMeets(uint32_t send, uint32_t succ) const;
  Status postReady();
  /// Posts receive `idx`, fused with its forward when that is the next send to its peer and waits
  /// only for this receive.
  Status postRecv(uint32_t idx);
  /// Finds forward_ for every reducing receive of the plan.
  void findForwards();
  /// Decides stage_ for every network step from its buffer's space and the transport's caps.
  Status planStaging();
  Status runLocal(uint32_t idx);
  /// A staged receive finished: copy or reduce it out of the bounce buffer.
  void unstage(uint32_t idx);
  /// Records step `idx` (level step) that began at `t0` (trace ticks) and ended now.
  void traceStep(uint32_t idx, uint64_t t0);
  PeerQueue& queueOf(int peer) { return peers_[static_cast<size_t>(peerSlot_[static_cast<size_t>(peer)])]; }

  void* addr(const BufRef& r) const {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(bases_[static_cast<int>(r.base)]) + r.offset);
  }
  transport::MemRef ref(const BufRef& r) const { return transport::MemRef(addr(r), spaces_[static_cast<int>(r.base)]); }

  ExecContext* ctx_ = nullptr;
  const ExecPlan* plan_ = nullptr;
  const void* bases_[kNumBufBases] = {nullptr, nullptr, nullptr, nullptr};
  transport::MemSpace spaces_[kNumBufBases] = {transport::MemSpace::kHost, transport::MemSpace::kHost,
                                               transport::MemSpace::kHost, transport::MemSpace::kHost};
  std::vector<uint32_t> initialRemaining_;
  std::vector<uint32_t> initialLocal_;
  std::vector<uint32_t> remaining_;  // unfinished deps per step
  std::vector<uint8_t> released_;    // per send: released (Request::released) and counted so
  size_t releasedRun_ = 0;           // sends released in this run
  std::vector<uint32_t> succBegin_, succ_;
  std::vector<transport::Request> reqs_;
  std::vector<uint32_t> inflight_;  // posted, not yet complete
  std::vector<uint32_t> localReady_;
  std::vector<PeerQueue> peers_;
  std::vector<int32_t> peerSlot_;  // rank -> index in peers_ or -1
  // Per receive-reduce step: the send that forwards what it produces (its source is the receive's
  // destination and it depends on it) where the transport can stream it on as it lands
  // (Forwarding::irecvForward); kNoForward otherwise.
  static constexpr uint32_t kNoForward = UINT32_MAX;
  std::vector<uint32_t> forward_;
  std::vector<Stage> stage_;                        // per step
  std::vector<size_t> stageOff_;                    // per staged step: its region of staging_
  std::vector<char> staging_;                       // host bounce buffers of the staged steps
  transport::MemSpace planned_[kNumBufBases] = {};  // spaces the staging decisions were made for
  bool stagingPlanned_ = false;
  size_t completed_ = 0;
  bool progressed_ = false;
  bool traceSteps_ = false;          // this run records steps (trace level step)
  std::vector<uint64_t> postTicks_;  // per step: when it was posted (trace ticks)
};

}  // namespace c4
