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
//
// Device buffers (docs/cuda.md, "CUDA IPC"): a deferred call (gpu.hpp) offers its CUDA IPC handles
// instead (CallMode::kZeroCopyDevice, its record in OneShot::deviceRecord). Once every rank offered,
// each opens its peers' buffers and publishes whether it could; only if all could does the call
// run, as kernels of each rank's share (StreamGate::runZeroCopy), else every rank copies its inputs
// to its staging and runs the message path. A deferred call that is not offered, or falls back,
// has its inputs copied to staging before anything reads them.
//
// Mappings of a peer's buffers live for one call, unless the peer registered the buffer
// (commRegister): then they are kept until the peer deregisters it. A deregistration counts up in
// the rank's device state in the arena and waits until every peer acknowledged it, each having
// closed its mappings of that rank's registered buffers first (serviceDeregistrations, from every
// progress loop), so a buffer is never freed while another process has it open.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"
#include "common/process.hpp"
#include "core/memory.hpp"
#include "core/oneshot.hpp"
#include "core/opdesc.hpp"
#include "gpu/gpu.hpp"
#include "kernels/host/reduce.hpp"

namespace c4 {

class ZeroCopy {
 public:
  /// When every rank is on this host: publishes a probe page in this rank's arena, waits for the
  /// next rank's, maps it and publishes whether that worked (no collective: each rank waits only
  /// for its neighbour, which publishes before it waits). Otherwise a no-op.
  Status init(ExecContext* ctx, const std::vector<PeerProcess>& procs, int64_t timeoutMs, OneShot* oneShot,
              transport::Transport* t, const std::unique_ptr<gpu::StreamGate>* gate,
              std::function<bool(const void*, size_t)> registered);
  ~ZeroCopy();
  bool enabled() const { return enabled_; }
  /// Whether a call on device buffers may be deferred (gpu.hpp) to offer the device zero-copy path:
  /// every rank is on this host, C4_CUDA_IPC=1, and the path has a form for the call (not
  /// Send/Recv, Avg or PreMulSum, in-place AlltoAll). Depends on this rank's settings only: the
  /// offer decides with the peers.
  bool mayDefer(const OpDesc& op, bool inPlace) const;
  /// This rank deregistered device memory (the driving thread): waits (up to the timeout) until every
  /// peer closed its mappings of this rank's registered buffers. An error names a peer that did not.
  Status deviceDeregistered();
  /// Closes this rank's mappings of registered buffers whose owner deregistered one, and
  /// acknowledges it. Cheap when nothing changed; called from the communicator's progress loops.
  void serviceDeregistrations();
  /// serviceDeregistrations one call in 64 (the hot progress loops).
  void pollDeregistrations() {
    if ((++serviceTick_ & 63) == 0) serviceDeregistrations();
  }
  /// The communicator goes: closes every mapping of registered buffers and acknowledges every
  /// peer's deregistrations for good.
  void closeDevice();

  /// At prepare: *offered if this rank offers call `sig` (its buffers for `op` are shareable, the
  /// op runs here, and every rank can map its neighbour's memory: the first such call waits for
  /// all ranks' probe results); then its record is written and the caller announces kZeroCopy.
  Status offer(const OpDesc& op, const OpSig& sig, bool* offered);
  /// Starts an offered call. `kop`: the reduction (Avg only on integers, divided afterwards).
  void start(const OpDesc& op, const OpSig& sig, kernels::KOp kop);
  /// A deferred call (gpu.hpp) that will not run on the device zero-copy path (not offered, or on
  /// the one-shot path): its inputs go to its staging now, before anything reads them. Others: no-op.
  Status stageLate(const OpDesc& op);
  /// Advances. *fallback: a peer did not offer, run the call on the message path instead (a
  /// deferred call's inputs are in its staging by then).
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
  // Device buffers.
  Status offerDevice(const OpDesc& op, const OpSig& sig, bool* offered);
  /// Opens the peers' device buffers; *ok false where one cannot be (nothing fails: the ranks agree
  /// to fall back).
  void resolveDevicePeers(bool* ok);
  /// Whether every rank could open its peers' buffers (*decided false while some has not said).
  Status agreeDevice(bool* decided, bool* allOk);
  Status computeDevice();

  ExecContext* ctx_ = nullptr;
  std::vector<PeerProcess> procs_;  // per rank
  int64_t timeoutMs_ = 0;           // for the blocking waits of the probe (not the calls: the watchdog)
  OneShot* os_ = nullptr;
  transport::Transport* t_ = nullptr;
  const std::unique_ptr<gpu::StreamGate>* gate_ = nullptr;
  bool enabled_ = false;
  int allCapable_ = -1;  // -1 not known yet, 0 some rank cannot map its neighbour, 1 all can
  void* probePage_ = nullptr;
  int rank_ = 0, nranks_ = 1;
  PeerMappings maps_;

  enum class Phase { kDecide, kAgreeDevice, kWaitPeers, kDone };
  bool device_ = false;  // the running call is on device buffers
  Phase phase_ = Phase::kDone;
  OpSig sig_;
  OpDesc op_;  // the running call
  kernels::KOp kop_ = kernels::KOp::kSum;
  std::vector<const char*> in_;  // every rank's input, in this address space (null: unused)
  std::vector<char*> out_;       // every rank's output
  std::vector<uint8_t> seen_;
  std::vector<uint8_t> deviceUnreachable_;               // peers whose device buffers this rank could not open
  std::function<bool(const void*, size_t)> registered_;  // whether a buffer is registered with this communicator
  bool deviceClosed_ = false;                            // closeDevice ran: the acks stay "for good"
  std::vector<uint64_t> deregSeen_;                      // each peer's deregistrations acknowledged
  uint32_t serviceTick_ = 0;
  /// Registered buffers keep their mappings where the arena has room for every rank's acknowledgement.
  bool registeredMappings() const;
  bool progressed_ = false;
  int waitingFor_ = -1;
  IdleWatch watch_;
};

}  // namespace c4
