// One-sided communication (NCCL 2.29's host RMA: ncclCommWindowRegister, ncclPutSignal, ncclSignal,
// ncclWaitSignal) over the shared mappings of memAlloc memory (core/memory.hpp).
//
// A window is registered collectively: every rank contributes the buffer it registers, and learns
// where every other rank's buffer lies (its allocation id, the memfd and the offset). Each rank also
// owns a signal block: one 64-byte slot per rank, slot s counting the signals rank s sent it, in a
// shareable allocation made at the first registration. A put maps the peer's window allocation (on
// first use), copies the data in, then adds one to the peer's slot with release ordering; a wait
// loads its own slots with acquire ordering until they reach what it waits for. No transport,
// thread or message is involved, so the target takes no part: it is one-sided.
//
// A peer on another host (or every peer, with C4_RMA_MAPPED=0) cannot be mapped: a put to it is one
// message on the bootstrap's side channel (header and data, to the peer's tag kTagRma), which the
// peer's bootstrap thread receives into memory without the peer doing anything, so the put never
// waits for its target either. The target applies what arrived (copies the data into its window,
// counts the signal) whenever it looks for signals (waitSignal) and before a window goes
// (deregistration sends and awaits a fence on the same ordered channel), which is when NCCL's
// contract makes the data visible. Messages from one rank apply in the order it sent them.
//
// Windows on CUDA device memory (docs/cuda.md, "Windows on device memory"): every rank's buffer is
// device memory CUDA IPC can share (cudaMalloc, ncclMemAlloc with a GPU); a communicator's windows
// are all on device memory or all on host memory. Each rank exports its buffer's IPC handle at
// registration and registers it for collectives too (commRegister: the peers keep their mappings of
// it between calls). One-sided calls then run in their stream's order on the progress thread
// (core/api.cc): a put to a peer of this host copies from the source buffer into the peer's window,
// mapped with CUDA IPC (kept until the window or the peer's registration goes), and signals; a put
// to a peer of another host is copied to the host first (the stream does it) and goes through the
// side channel, and the target copies it into its device window when it applies it. Signals stay in
// host memory (the slots above). A wait is no job: its stream waits for a flag of the StreamGate
// (so waits on different streams hold nothing else up), which the driving thread sets once the
// signals arrived (pollDevice, on every idle poll), applying what came through the side channel.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "c4comm/status.hpp"
#include "core/bootstrap.hpp"
#include "core/memory.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

/// What one-sided calls need of their communicator, handed over at its init (core/comm.cc fills it):
/// the side channel carries registration's exchanges and the puts to peers it does not map.
struct RmaHost : RankDirectory {
  int64_t timeoutMs = 0;            // C4_TIMEOUT: the longest wait for a peer
  std::function<Status()> failure;  // Ok, or the error of the failed communicator
  std::function<bool()> failed;
  std::function<Status(const Status&)> fail;  // fails the communicator (driving thread)
  /// Releases a commRegister registration (a device window's, for collectives).
  std::function<Status(void* reg)> deregister;
  /// The communicator's StreamGate (null until its first call on device memory).
  std::function<gpu::StreamGate*()> gate;
  /// Wakes the progress thread (null: the communicator has none).
  std::function<void()> nudge;
};

/// One collective window registration (c4::Window of the public API).
struct Window {
  uint32_t id = 0;       // the n-th registration of the communicator: the same on every rank
  void* base = nullptr;  // this rank's buffer
  size_t size = 0;
  bool device = false;  // the buffers are CUDA device memory (every rank's; the communicator has a StreamGate)
  void* reg = nullptr;  // a device window's commRegister registration (Comm::Registration)
  struct Peer {
    MemRef ref;  // host memory: where the rank's buffer lies in its allocation
    uint64_t size = 0;
    // device memory:
    gpu::IpcRef ipc;       // the buffer's CUDA IPC handle
    uint64_t process = 0;  // processToken() of its process
    uint64_t addr = 0;     // its address there (a rank of this process uses it as it is)
    int gpu = -1;          // its GPU
  };
  std::vector<Peer> peers;  // per rank, this one included
};

/// A communicator's windows and signals. Registration is collective (over the bootstrap); puts,
/// signals and waits are local. Thread use: one thread at a time per communicator, as for calls.
class Rma {
 public:
  Rma() = default;
  ~Rma();
  Rma(const Rma&) = delete;
  Rma& operator=(const Rma&) = delete;
  /// The communicator, once its init has the ranks and the side channel (before any one-sided call).
  void bind(RmaHost host) { h_ = std::move(host); }

  /// Runs a function on the communicator's data path (the drive held, nothing queued): core/api.cc.
  using OnPath = std::function<Status(const std::function<Status()>&)>;
  /// Collective; blocks on the other ranks without the drive (their deregistrations are answered
  /// meanwhile). A device window: `prep` says whether this rank got ready for it (its StreamGate
  /// and `reg`, the buffer's registration for collectives, which the window then owns; it is
  /// deregistered when the registration fails); a failure there fails it on every rank.
  Status registerWindow(void* buff, size_t size, const Status& prep, void* reg, const OnPath& onPath, Window** out);
  /// Collective, likewise. Once it returns (even with an error), this rank holds no mapping of a
  /// peer's device window; after an error the peers may still hold this rank's (free it after
  /// commDestroy).
  Status deregisterWindow(Window* w, const OnPath& onPath);
  /// Ok if `w` is a live window of this communicator, else kInvalidArgument naming `fn`.
  Status checkWindow(const char* fn, const Window* w) const;
  /// Ok if a put of `bytes` at `offset` of `peer`'s buffer of `w` is possible, else why not.
  Status checkPut(size_t bytes, int peer, const Window* w, size_t offset) const;
  /// Ok if `peer` is a rank and a window exists (so the signal blocks are known), else why not.
  Status checkPeer(const char* fn, int peer) const;
  /// Ok if the descriptors of a wait are valid; `target` (optional): the signals it waits for per rank.
  Status checkWait(int n, const int* peers, const int* counts, std::vector<uint64_t>* target = nullptr) const;
  /// Whether `peer` is reached through the side channel (another host, or C4_RMA_MAPPED=0).
  bool viaNetwork(int peer) const;
  /// Whether the communicator's windows are on device memory: its one-sided calls run in their
  /// streams' order (core/api.cc).
  bool deviceMode() const { return deviceWindows_ > 0; }

  /// A put into a host-memory window, when called.
  Status put(const void* src, size_t bytes, int peer, const Window* w, size_t offset);
  /// A put into a device-memory window, on the progress thread once the stream reached it: `src`
  /// is device or pinned memory, or, to a peer through the side channel, host memory (the stream
  /// staged device memory there).
  Status putDevice(const void* src, size_t bytes, int peer, const Window* w, size_t offset);
  Status signal(int peer);
  /// A wait on host-memory windows: blocks until the signals arrived.
  Status wait(int n, const int* peers, const int* counts);
  /// A wait on device-memory windows: `stream` waits for a flag that pollDevice sets once the
  /// signals arrived; returns at once. The API thread.
  Status waitDevice(int n, const int* peers, const int* counts, void* stream);
  /// The driving thread, on every idle poll (a call's, the progress thread's, a stream wait's):
  /// while streams wait, applies what came through the side channel (every 50 us at most) and
  /// releases the streams whose signals arrived. A wait longer than the communicator's timeout from
  /// when its stream got there fails it (its stream goes on); a failed communicator releases every
  /// waiting stream. One load where nothing waits.
  void pollDevice();
  /// Whether streams wait for signals (the progress thread then polls instead of sleeping).
  bool devicePolling() const { return pendingCount_.load(std::memory_order_relaxed) != 0; }

 private:
  /// The first registration: this rank's signal block.
  Status ensureSignalBlock(int nranks);
  /// The address of `bytes` at `ref` in rank `peer`'s memory (mapped on first use).
  Status resolve(int peer, const MemRef& ref, uint64_t extra, size_t bytes, char** out);
  /// The address here of `bytes` at `offset` of rank `peer`'s device window buffer (mapped with CUDA
  /// IPC, kept as a registered buffer's mapping).
  Status resolveDevice(int peer, const Window* w, size_t offset, size_t bytes, char** out);
  /// Copies into this rank's window `w` (host or device memory).
  Status writeLocal(const Window* w, size_t offset, const void* src, size_t bytes);
  /// Waits until `bytes` more to `peer` fit its window (C4_RMA_WINDOW_BYTES of what it has not
  /// applied yet), taking the credits it sent back; kTimeout after C4_TIMEOUT.
  Status awaitCredit(int peer, uint64_t bytes);
  /// Sends one message (put, signal or fence) to a peer through the side channel.
  Status sendRemote(int peer, uint32_t kind, uint32_t window, uint64_t offset, const void* data, size_t bytes);
  /// Applies every one-sided message that arrived through the side channel.
  Status drainRemote();
  /// Fences that arrived from `peer` (under drainMu_).
  uint64_t fencesFrom(int peer);
  Window* findWindow(uint32_t id) const;

  RmaHost h_;
  static constexpr size_t kSlotBytes = 64;
  void* sigBlock_ = nullptr;        // this rank's slots (memAlloc memory)
  MemRef sigRef_;                   // where it lies
  std::vector<MemRef> peerSig_;     // every rank's signal block (learnt at the first registration)
  std::vector<uint64_t> consumed_;  // per source rank: signals earlier waits consumed
  std::vector<std::unique_ptr<Window>> windows_;
  uint32_t nextWindowId_ = 0;
  int deviceWindows_ = 0;                  // live windows on device memory
  std::atomic<bool> remoteDevice_{false};  // a device window was registered and a peer is through the side channel
  int64_t lastDrainNs_ = 0;                // pollDevice's last look at the side channel
  std::mutex drainMu_;                     // drainRemote: the API thread (deregistration) and the driving thread
  struct PendingWait {
    gpu::StreamGate::Flag flag;
    std::vector<std::pair<int, uint64_t>> want;  // (peer, slot value) all of which must be reached
    int64_t startNs = 0;                         // when the stream got to the wait (0: not yet)
  };
  std::mutex pendingMu_;
  std::vector<PendingWait> pending_;
  std::atomic<size_t> pendingCount_{0};
  bool mapped_ = true;                // C4_RMA_MAPPED: same-host peers through the mapping
  std::vector<uint64_t> fencesSeen_;  // per rank: fences that arrived through the side channel
  // Flow control of the side channel, per rank (bytes of puts and signals, headers included):
  std::vector<uint64_t> sent_;        // this rank sent to it
  std::vector<uint64_t> credited_;    // of those, it said it applied (kTagRmaCredit)
  std::vector<uint64_t> applied_;     // it sent to this rank, and this rank applied (under drainMu_)
  std::vector<uint64_t> creditSent_;  // of those, this rank told it
  uint64_t windowBytes_ = 0;          // C4_RMA_WINDOW_BYTES
  uint64_t fencesSent_ = 0;           // deregistrations so far (each sends one fence per remote peer)
  PeerMappings maps_{1024};
};

}  // namespace c4
