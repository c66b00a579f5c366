// The zero-copy path: collectives on shareable buffers (c4::memAlloc / ncclMemAlloc) of ranks that
// all share one host read and write each other's buffers in place, with no staging copy.
//
// A rank whose buffers for a call are all shareable writes where they lie (its record in
// the arena, OneShot::zeroCopyRecord) and announces the call as CallMode::kZeroCopy. At start it
// reads every peer's announcement: if all offered, the call runs zero-copy; if any did not (plain
// buffers, C4_ZEROCOPY=0, or the peer is already past the call), every rank falls back to the
// message path, so all ranks agree without an extra exchange. A rank whose buffers are not
// shareable does not wait at all.
//
// Running zero-copy, each rank computes its share of the result from the peers' mapped buffers
// (AllReduce: one slice of the vector, reduced from every input and written to every output),
// publishes zeroCopySeq, and returns once every peer has: after that nobody reads or writes its
// buffers. See docs/shm-transport.md, "Zero-copy path".
#pragma once

#include <cstdint>
#include <vector>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"
#include "core/memory.hpp"
#include "core/oneshot.hpp"
#include "core/opdesc.hpp"
#include "kernels/host/reduce.hpp"

namespace c4 {

class ZeroCopy {
 public:
  /// When every rank is on this host: publishes a probe page in this rank's arena, waits for the
  /// next rank's, maps it and publishes whether that worked (no collective: each rank waits only
  /// for its neighbour, which publishes before it waits). Otherwise a no-op.
  Status init(ExecContext* ctx, const std::vector<int32_t>& pids, int64_t timeoutMs, OneShot* oneShot,
              transport::Transport* t);
  ~ZeroCopy();
  bool enabled() const { return enabled_; }

  /// At prepare: *offered if this rank offers call `sig` (its buffers for `op` are shareable, the
  /// op runs here, and every rank can map its neighbour's memory: the first such call waits for
  /// all ranks' probe results); then its record is written and the caller announces kZeroCopy.
  Status offer(const OpDesc& op, const OpSig& sig, bool* offered);
  /// Starts an offered call. `kop`: the reduction (Avg only on integers, divided afterwards).
  void start(const OpDesc& op, const OpSig& sig, kernels::KOp kop);
  /// Advances. *fallback: a peer did not offer, run the call on the message path instead.
  Status poll(bool* done, bool* fallback);
  bool madeProgress() const { return progressed_; }
  /// Whom the running call waits for (the watchdog's error).
  std::string waitingOn() const;
  /// The rank it waits for (-1: none known).
  int waitingFor() const { return waitingFor_; }

  /// Where a rank's buffers of one call lie (arena record, file comment).
  struct Record;
  /// This rank's zero-copy state in its arena (zeroCopySeq and the probe).
  struct State;

 private:
  State* stateOf(int rank) const;
  /// Waits until every rank published its probe result; sets allCapable_.
  Status awaitProbes();
  Status decide(bool* decided, bool* fallback);
  Status resolvePeers();
  void compute();

  ExecContext* ctx_ = nullptr;
  std::vector<int32_t> pids_;
  int64_t timeoutMs_ = 0;  // for the blocking waits of the probe (not the calls: the watchdog)
  OneShot* os_ = nullptr;
  transport::Transport* t_ = nullptr;
  bool enabled_ = false;
  int allCapable_ = -1;  // -1 not known yet, 0 some rank cannot map its neighbour, 1 all can
  void* probePage_ = nullptr;
  int rank_ = 0, nranks_ = 1;
  PeerMappings maps_;

  enum class Phase { kDecide, kWaitPeers, kDone };
  Phase phase_ = Phase::kDone;
  OpSig sig_;
  OpDesc op_;  // the running call
  kernels::KOp kop_ = kernels::KOp::kSum;
  std::vector<const char*> in_;  // every rank's input, in this address space (null: unused)
  std::vector<char*> out_;       // every rank's output
  std::vector<uint8_t> seen_;
  bool progressed_ = false;
  int waitingFor_ = -1;
  IdleWatch watch_;
};

}  // namespace c4
