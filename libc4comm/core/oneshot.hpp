// One-shot small collectives for communicators whose ranks all share one host.
//
// Each rank owns an arena in shared memory (HostArena) that every rank maps. A one-shot
// collective publishes this rank's input into its arena with one release store, waits for every
// peer's publication of the same sequence number, and computes its result straight from the
// peers' arenas (reductions in rank order, so every rank gets bitwise-identical results). One
// hand-off of cache lines instead of a message exchange through the executor: this is the
// latency path (8-byte AllReduce).
//
// Arena of one rank:
//   [0, 64)        doneSeq: the last sequence number this rank finished (every collective);
//                  then 56 bytes of ZeroCopy state (zeroCopySeq, its probe; see zerocopy.cc)
//   announce[2]    {seq, mode, sig}: written by every collective at its start, slot seq % 2, so a
//                  one-shot rank detects a peer that is running a different call at once
//   zerocopy[2]      {seq, send, recv}: where this rank's buffers lie in shareable memory, for a
//                  call it offers to run on the zero-copy path (ZeroCopy), slot seq % 2
//   data[2]        {seq, bytes, payload}: written by one-shot collectives only, slot seq % 2
// Reuse rule: a rank rewrites data slot s % 2 only after every peer finished s - 2 (doneSeq),
// because a peer may still be reading it. Announcements are read seqlock-style (seq, fields, seq)
// and a peer whose announcement is already past s has finished s, so it matched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/trace.hpp"
#include "common/opsig.hpp"
#include "core/exec_context.hpp"
#include "core/opdesc.hpp"
#include "kernels/host/reduce.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// How a rank announced a call (OneShot::peerMode).
enum class CallMode : uint32_t {
  kNotYet = 0,          // the peer has not announced this call yet
  kOneShot = 1,         // through the arena (small calls)
  kMessages = 2,        // through the transports
  kZeroCopy = 3,        // offers the zero-copy path (core/zerocopy.hpp), else through the transports
  kPassed = 4,          // the peer is already past this call (so it did not wait for this rank)
  kZeroCopyDevice = 5,  // offers the zero-copy path on device buffers (CUDA IPC), else through the transports
};

/// Peer-liveness checks for a rank that polls shared memory for its peers, and a timeout for
/// waits outside an operation (the zero-copy probe); within an operation the watchdog decides.
class IdleWatch {
 public:
  void reset() { sinceNs_ = lastHealthNs_ = 0, polls_ = 0; }
  /// Call on every idle poll; reads the clock every 64 calls only. An error once `waitingFor` is
  /// found dead, or (timeoutMs > 0) once nothing moved for that long. The error names `rank`, the
  /// call (`sig`), or `what` if given.
  ///
  /// `arrived` reads again what the caller waits for (true: it is there now). A verdict stands
  /// only if that is still missing after the verdict was taken: the caller saw it missing before
  /// the check, and a peer may publish, finish the call and leave (close its transport, exit) in
  /// between; the first health check of a peer takes milliseconds, as shm sets up the connection
  /// then and faults in its two rings. A peer's stores to the arena come before its close or exit,
  /// and the arena stays mapped here, so whatever it published before it left is seen by this
  /// read: the caller polls again and uses it, rather than failing a call whose data are all there.
  template <class Arrived>
  Status check(int rank, int64_t timeoutMs, transport::Transport* t, int waitingFor, const OpSig& sig,
               const Arrived& arrived, const char* what = nullptr) {
    Status st = verdict(rank, timeoutMs, t, waitingFor, sig, what);
    if (st.isOk() || !arrived()) return st;
    return Status::ok();
  }

 private:
  Status verdict(int rank, int64_t timeoutMs, transport::Transport* t, int waitingFor, const OpSig& sig,
                 const char* what);

  int64_t sinceNs_ = 0, lastHealthNs_ = 0;
  uint32_t polls_ = 0;
};

class OneShot {
 public:
  int numRanks() const { return nranks_; }
  /// Enables the path if every rank is on this host (`localRanks` of `ctx`'s ranks are) and `t`
  /// offers arenas. Reads C4_ONESHOT_BYTES.
  void init(ExecContext* ctx, int localRanks, transport::Transport* t);
  bool enabled() const { return enabled_; }
  /// True if this call runs one-shot. Depends only on the call's arguments (same on every rank).
  bool eligible(const OpDesc& op) const;
  /// Every collective announces itself (also those that run elsewhere, and count 0). A kZeroCopy
  /// announcement goes after this rank's direct record for the call (zeroCopyRecord) is written.
  void announce(const OpSig& sig, CallMode mode);
  /// How `peer` announced call `sig.seq` (kNotYet while it has not); an error if it announced a
  /// different call under that sequence number.
  Status peerMode(int peer, const OpSig& sig, CallMode* mode) const;
  /// Every rank's arena is mapped (all ranks on this host); the calls are announced.
  bool arenasReady() const { return arenas_ready_; }
  /// The zero-copy record of `rank` for call seq (slot seq % 2; 64 bytes), and the 56 bytes of
  /// zero-copy state after its doneSeq.
  char* zeroCopyRecord(int rank, uint64_t seq) const;
  /// Rank `rank`'s record of a call on device buffers (kDeviceRecordBytes).
  char* deviceRecord(int rank, uint64_t seq) const;
  static constexpr size_t kDeviceRecordBytes = 4 * 64;
  /// Rank `rank`'s device state (kDeviceStateBytes): its deregistrations of registered device
  /// memory, and its acknowledgements of the peers' (core/zerocopy.cc).
  char* deviceState(int rank) const;
  static constexpr size_t kDeviceStateBytes = 10 * 64;
  char* zeroCopyState(int rank) const;
  /// Starts a one-shot collective: `input` is what this rank publishes (already scaled for
  /// PreMulSum/Avg), `output` its recvbuff. `traceEvent` (null: not traced) is the call's op
  /// event without its time: it is stamped and recorded when this rank publishes its input,
  /// while the first peer's line is being fetched, so the clock read and the ring stores overlap
  /// the cache miss every one-shot call waits on anyway (a tenth of an 8-byte AllReduce
  /// otherwise). The trace marks it kFlagNoEnd; c4-trace ends it at the last rank's arrival.
  Status start(const OpDesc& op, const OpSig& sig, const void* input, void* output, kernels::KOp kop,
               const trace::Event* traceEvent);
  /// Advances; sets *done when the result is in the output.
  Status poll(bool* done);
  bool madeProgress() const { return progressed_; }
  /// Whom the running call waits for (the watchdog's error).
  std::string waitingOn() const;
  /// The rank it waits for (-1: none known).
  int waitingFor() const { return waitingFor_; }
  /// Records that this rank finished `seq` (every collective, after its result is complete).
  void markDone(uint64_t seq);

  /// Arena records (layout in the file comment).
  struct Announce;
  struct DataHdr;

 private:
  Announce* announceOf(int rank, uint64_t seq) const;
  DataHdr* dataOf(int rank, uint64_t seq) const;
  uint64_t* doneOf(int rank) const;
  size_t publishedBytes(const OpDesc& op) const;
  void compute();

  ExecContext* ctx_ = nullptr;
  transport::Transport* t_ = nullptr;
  bool arenas_ready_ = false;  // every rank's arena is mapped: calls are announced
  bool enabled_ = false;       // ... and small calls run one-shot
  int rank_ = 0, nranks_ = 1;
  size_t maxBytes_ = 0;
  size_t capacity_ = 0;
  size_t deviceOff_ = 0;  // the device area's offset in an arena (at its end)
  std::vector<char*> arenas_;
  std::vector<uint64_t> knownDone_;  // lower bound of each peer's doneSeq

  // The running call.
  enum class Phase { kIdle, kWaitReuse, kWaitPeers, kDone };
  Phase phase_ = Phase::kIdle;
  uint64_t seq_ = 0;  // sig.seq + 1 (0 means never)
  OpSig sig_;
  OpDesc op_;  // buffers unused: input_ and output_ are what this path reads and writes
  kernels::KOp kop_ = kernels::KOp::kSum;
  const void* input_ = nullptr;
  void* output_ = nullptr;
  std::vector<uint8_t> announced_;  // peer's data slot for this call seen
  int waitingFor_ = -1;
  bool progressed_ = false;
  IdleWatch watch_;
  bool tracePending_ = false;
  trace::Event traceEvent_;
};

}  // namespace c4
