// Transport interface (v2): how bytes move between two ranks.
//
// A Transport is created per communicator and rank (through the registry, transports/registry.hpp);
// it hands out one Connection per peer. A Connection carries messages in both directions. Messages
// in one direction are FIFO: the k-th irecv posted on a connection matches the k-th isend the peer
// posted on its connection to us. Every message carries the sender's OpSig and byte count; a receive
// whose expected OpSig or size differs fails with kInvalidUsage and a message naming both ranks and
// the difference.
//
// Buffers are MemRefs: an address, the memory space it lives in, and optionally the registration
// (registerMemory) that covers it. A transport states in Caps which spaces it reads and writes
// directly; the executor stages anything else through a host bounce buffer. Receive-with-reduction
// is a capability too (Caps::reduceOnRecv); without it the executor receives into scratch and
// reduces with the kernel of the buffer's space.
//
// A network connection carries its messages on lanes (transports/lane.hpp): one socket or queue
// pair each, with state, weight and statistics that any thread may read.
//
// Transport and Connection hold what every transport implements. What only some can do is a
// capability interface below them (LaneSetup, WaitSource, HostArena, CpuSharing on the transport;
// LaneControl, Forwarding, ReleasedSends, RateMeter on a connection), handed out by an accessor
// that answers nullptr where the transport has none; every method of an interface is required.
//
// Threading: everything but the Lane statistics is driven by one thread at a time (the one that
// drives the communicator: the caller, or its progress thread), which calls progress() repeatedly
// and reads Request::state. No call blocks for a peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/types.hpp"
#include "common/opsig.hpp"
#include "transports/lane.hpp"

namespace c4::transport {

/// Out-of-band collectives over all ranks of the communicator, used during setup only.
/// Implemented by core's bootstrap; blocking, with the bootstrap timeout.
class Oob {
 public:
  virtual ~Oob() = default;
  /// `data` holds nranks slices of `bytesPerRank`; this rank's slice is filled in on entry; on
  /// return every slice is filled.
  virtual Status allGather(void* data, size_t bytesPerRank) = 0;
  virtual Status barrier() = 0;
};

/// Where a buffer lives.
enum class MemSpace : uint8_t {
  kHost = 0,        ///< ordinary process memory (malloc, the stack)
  kHostShared = 1,  ///< host memory the ranks of a host map into each other (ncclMemAlloc)
  kCudaDevice = 2,  ///< CUDA device memory
  kCudaHost = 3,    ///< CUDA pinned host memory (cudaHostAlloc)
};
constexpr int kNumMemSpaces = 4;
/// A set of memory spaces (Caps::spaces).
constexpr uint32_t spaceBit(MemSpace s) { return 1u << static_cast<unsigned>(s); }
/// Every space a CPU can load and store.
constexpr uint32_t kHostSpaces =
    spaceBit(MemSpace::kHost) | spaceBit(MemSpace::kHostShared) | spaceBit(MemSpace::kCudaHost);
/// "host", "host-shared", "cuda-device", "cuda-host".
const char* memSpaceName(MemSpace s);

/// A registration of memory with one transport (registerMemory). Transports derive their own
/// (RDMA memory regions, CUDA IPC handles); the base class is what a no-op registration returns.
class MemRegion {
 public:
  MemRegion(const void* base, size_t bytes, MemSpace space) : base_(base), bytes_(bytes), space_(space) {}
  virtual ~MemRegion() = default;
  const void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  MemSpace space() const { return space_; }
  /// Whether [p, p + n) lies inside this region.
  bool covers(const void* p, size_t n) const {
    const auto* b = static_cast<const char*>(base_);
    const auto* q = static_cast<const char*>(p);
    return q >= b && n <= bytes_ && static_cast<size_t>(q - b) <= bytes_ - n;
  }

 private:
  const void* base_;
  size_t bytes_;
  MemSpace space_;
};

/// A buffer as the data path hands it to a transport: where it is, which memory space it lives in,
/// and (optional) the registration with this transport that covers it. A send only reads through
/// ptr; a receive writes.
struct MemRef {
  void* ptr = nullptr;
  MemSpace space = MemSpace::kHost;
  const MemRegion* region = nullptr;

  MemRef() = default;
  MemRef(void* p, MemSpace s = MemSpace::kHost, const MemRegion* r = nullptr) : ptr(p), space(s), region(r) {}
  MemRef(const void* p, MemSpace s = MemSpace::kHost, const MemRegion* r = nullptr)
      : ptr(const_cast<void*>(p)), space(s), region(r) {}
  char* bytes() const { return static_cast<char*>(ptr); }
  /// The same buffer `off` bytes further (same space and registration).
  MemRef at(size_t off) const { return MemRef(bytes() + off, space, region); }
};

/// Where one lane of a network connection goes out (C4P's hook; see Context::lanePlan).
struct LanePlan {
  int localPort = -1;       // index into this rank's NIC ports (-1: lane mod ports)
  int remotePort = -1;      // index into the peer's NIC ports (-1: localPort mod the peer's ports)
  uint16_t sourcePort = 0;  // local TCP/UDP source port to bind (0: the kernel chooses)
  // Where sourcePort is taken (another communicator or process bound it), the other ports of this
  // range that lead the same way are tried in turn; {0, 0}: sourcePort only.
  uint16_t sourcePortLo = 0, sourcePortHi = 0;
  // The lane's way through the fabric as the planner sees it ("h1p1 -> leaf0 -> spine1 -> leaf1 ->
  // h2p1"), for messages about the lane; empty: unknown.
  std::string label;
};

/// Completion record owned by the caller; must stay alive (and not move) until state != kPending.
struct Request {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  int state = kPending;
  Status error;  // set when state == kFailed
  // A send on a transport with Caps::releasesSends: set (while state is still kPending) once the
  // transport no longer needs the send's buffer unchanged against writes by its *own* receives:
  // those keep what a re-send needs. Anything else may write the buffer only once state == kDone.
  bool released = false;
};

/// Receive with reduction (Caps::reduceOnRecv): dst[i] = local[i] op incoming[i]. `local` may equal
/// dst. `op` is one of kSum, kProd, kMax, kMin (Avg and PreMulSum are scaled before they get here).
struct ReduceSpec {
  MemRef local;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
};

/// What the sender knows about the matching receive; a transport may choose its protocol by it.
struct SendHint {
  // The receive is a plain copy and the plan prefers it done in one copy from the sender's buffer
  // where the transport can. False for data the receiver reduces and where streaming measured
  // faster (the planner decides; see TuneResult::singleCopy).
  bool singleCopy = true;
};

/// isend's answer when the connection's bounded send queue is full: nothing was queued and `req` is
/// untouched; call progress() and try again. Not an error (Code::kInProgress).
Status sendQueueFull();
inline bool isQueueFull(const Status& st) { return st.code() == Code::kInProgress; }

class Forwarding;
class LaneControl;
class ReleasedSends;
class RateMeter;

/// One peer's connection. The core interface below is what every transport implements; what only
/// some can do is a capability interface (Forwarding, LaneControl, ReleasedSends, RateMeter) that
/// the connection hands out where it has it and core asks for (nullptr: not offered).
class Connection {
 public:
  virtual ~Connection() = default;
  virtual int peer() const = 0;
  /// Queues `bytes` from buf to the peer. buf must stay valid and unmodified until req is done. May
  /// answer sendQueueFull() (see there) instead of queueing.
  virtual Status isend(const MemRef& buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint = {}) = 0;
  /// Queues a receive of exactly `bytes` into dst, or, with `red` (only where Caps::reduceOnRecv),
  /// reduced into dst as data arrives, in pieces; each byte is reduced exactly once. dst must stay
  /// valid until req is done.
  virtual Status irecv(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) = 0;
  /// MPI_Iprobe for this connection: whether the first bytes (header) of the next incoming message
  /// that no posted receive claims have arrived, and if so its signature and size. Consumes
  /// nothing: an irecv posted next receives that very message. Never ready while receives are
  /// posted. Opens the lanes of a network connection where this rank opens them (so that the
  /// peer can send at all). Fails if the connection is broken or the transport aborted.
  virtual Status peek(bool* ready, OpSig* sig, size_t* bytes) = 0;
  /// What this connection is doing, for a watchdog's error: pending messages, lanes and their
  /// state ("1 send, 2 receives pending; lane 0 up, lane 1 never connected by rank 3"). Driving
  /// thread.
  virtual std::string describeState() const = 0;

  // ---- lane statistics (transports/lane.hpp); every connection has at least one lane ----
  /// Lanes this connection has had (retired ones included; indices are never reused). A transport
  /// without lanes of its own reports one. Any thread.
  virtual int numLanes() const { return 1; }
  /// The lane `i` (0 <= i < numLanes()), or nullptr where the transport keeps no statistics. The
  /// object lives as long as the connection. Its statistics may be read from any thread.
  virtual const Lane* lane(int i) const { return nullptr; }

  // ---- capabilities: nullptr where this connection has none ----
  virtual Forwarding* forwarding() { return nullptr; }
  virtual LaneControl* laneControl() { return nullptr; }
  virtual ReleasedSends* releasedSends() { return nullptr; }
  virtual const RateMeter* rateMeter() const { return nullptr; }
};

/// Receive-and-forward, NCCL's recvReduceCopySend / recvCopySend (shm).
class Forwarding {
 public:
  /// True if irecvForward(..., to, ...) can run for a forwarded message of `bytes` sent with `hint`.
  virtual bool canForward(const Connection* to, size_t bytes, SendHint hint) const = 0;
  /// irecv(dst, bytes, sig, red, req), plus a send of dst's bytes to `to` as this rank's next message
  /// on that connection (`toSig`, completing `toReq`) that leaves piece by piece as the pieces land
  /// (reduced, with `red`), instead of after the whole receive. Where the forward buffer has room,
  /// each piece is written to dst and to `to`'s peer in the same pass over the incoming data, so
  /// the forward costs no separate copy. Only where canForward(to, bytes, hint) said so.
  virtual Status irecvForward(const MemRef& dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req,
                              Connection* to, const OpSig& toSig, Request* toReq) = 0;

 protected:
  ~Forwarding() = default;
};

/// A connection that stripes its messages over several lanes and changes them while it runs (tcp,
/// ibverbs; C4P steers through it).
class LaneControl {
 public:
  /// Striping weights of later messages: lane i gets pieces in proportion to weights[i] (>= 0, one
  /// per lane, not all of the live lanes 0; retired lanes must get 0).
  virtual Status setLaneWeights(const std::vector<double>& weights) = 0;
  /// Takes lane `i` out of service: nothing new is striped onto it and what it carried that the
  /// peer did not acknowledge goes out again on the other lanes; its socket is closed. Fails when it
  /// is the last live lane (the connection would be lost) or out of range. `why` goes to the log.
  virtual Status retireLane(int i, const std::string& why) = 0;
  /// Opens one more lane (where this rank opens lanes; the peer accepts it) with `plan`; *index
  /// receives its index. It carries data once up.
  virtual Status addLane(const LanePlan& plan, int* index) = 0;

 protected:
  ~LaneControl() = default;
};

/// Sends released before they are done (Caps::releasesSends, tcp with acknowledgements).
class ReleasedSends {
 public:
  /// A released send (Request::released) whose caller is done with its buffer: the transport
  /// copies what a re-send may still need and completes the request now (state kDone); it then
  /// never reads the buffer again. False (nothing done) if the transport cannot, or `req` is not
  /// such a send. Driving thread.
  virtual bool detachSend(Request* req) = 0;

 protected:
  ~ReleasedSends() = default;
};

/// C4D's receive rate (tcp).
class RateMeter {
 public:
  /// Bytes of messages from the peer after their first piece came, and the time from that piece to
  /// their end, summed over the messages large enough to tell (cumulative). Unlike lane busy time
  /// it does not count the wait for a late sender or a late receiver, so a slow rate means a slow
  /// path. Driving thread.
  virtual void receiveRate(uint64_t* bytes, uint64_t* ns) const = 0;

 protected:
  ~RateMeter() = default;
};

/// Fault drills of LaneSetup::faultDrill (tests, C4_FAULT).
enum class LaneFault {
  /// The socket is reset, as a crashed NIC or a firewall would: the error retires the lane at both
  /// ends.
  kReset,
  /// This end stops reading and writing it while the socket stays open, as a cut cable would: both
  /// ends find it by its stall (C4_TCP_LANE_STALL_MS) and retire it.
  kSilent,
  /// This end keeps reading it but writes nothing more, as a path black-holed in one direction
  /// would: the peer's pieces arrive and are counted, their acknowledgements never do, so the peer
  /// retires the lane and sends those pieces again on another (each must still count once).
  kMute,
};

/// What a transport can do, and its cost model for the tuner: time(bytes) = latencyUs + bytes/bwGBps.
struct Caps {
  double latencyUs = 10.0;
  double bwGBps = 1.0;
  // Plain (non-reducing) messages above this size go in one copy straight from the sender's buffer,
  // so cutting them into pipeline chunks only adds handshakes (SIZE_MAX: never).
  size_t singleCopyBytes = SIZE_MAX;
  /// Reaches only ranks of this host (the registry creates it only where it helps).
  bool sameHostOnly = false;
  /// The memory spaces isend reads and irecv writes directly (spaceBit set); the executor stages
  /// other buffers through host memory.
  uint32_t spaces = kHostSpaces;
  /// irecv accepts a ReduceSpec (reduces incoming data into dst as it arrives).
  bool reduceOnRecv = false;
  /// Sends set Request::released before they are done (see there): a receive of this transport
  /// may overwrite such a send's buffer from then on (a write-after-read dependency is met).
  bool releasesSends = false;
  /// The source ports a lane can be steered with (LanePlan::sourcePort): C4P picks only from
  /// [sourcePortLo, sourcePortHi]. 0, 0: any (tcp binds what it is given). RoCE v2 (ibverbs):
  /// 49152-65535, the ports a flow label maps to.
  uint16_t sourcePortLo = 0, sourcePortHi = 0;
};

/// Facts every transport needs at setup. Vectors are indexed by rank.
struct Context {
  int rank = 0;
  int nranks = 1;
  std::string commTag;            // unique per communicator (hex); use it to name OS objects
  std::vector<uint64_t> hostIds;  // same host id => same host
  // A rank's pid where this process can use it (same host and pid namespace), else 0: another
  // host, or a pid namespace where its pid would name another process (containers of one pod).
  std::vector<int32_t> pids;
  std::vector<uint64_t> processes;  // processToken() per rank: equal only within one process
  Oob* oob = nullptr;               // collective over all ranks during setup (allGather, barrier)
  // Give up on a pending request that sees no progress for this long; 0: never (a communicator's
  // watchdog decides, with C4_TIMEOUT, and names what it waited for). Standalone users (tests) set it.
  int64_t timeoutMs = 300000;
  // 128-bit key derived from the UniqueId secret; network transports prove it on every connection.
  uint64_t authKey[2] = {0, 0};
  // Optional: the plan for lane `lane` to `peer` (called once per lane when it is opened, on the
  // thread that drives the transport). Unset: the transport's default (lane mod ports, port 0).
  std::function<LanePlan(int peer, int lane)> lanePlan;
};

class LaneSetup;
class HostArena;
class WaitSource;
class CpuSharing;

/// A transport: one per communicator and rank. The core interface below is what every transport
/// implements; what only some can do is a capability interface (LaneSetup, HostArena, WaitSource,
/// CpuSharing) that the transport hands out where it has it and core asks for (nullptr: not
/// offered). A transport class implements the capability interfaces it offers and returns itself.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual Caps caps() const = 0;
  /// True if this transport can reach `peer` (e.g. shm: same host id).
  virtual bool canConnect(int peer) const = 0;
  /// Returns the connection to `peer`, creating it on first use. Owned by the transport.
  virtual Status connect(int peer, Connection** out) = 0;
  /// Advances all pending requests. Fails if a peer died, aborted, or broke the protocol; the
  /// affected requests are failed too.
  virtual Status progress() = 0;
  /// Grows whenever the transport delivers data (bytes received, or acknowledged by the peer; slots
  /// consumed); a watchdog reads it to tell a slow operation from a stuck one. Control traffic and
  /// writes a peer may never read (a socket buffer on a dead path) do not count. Driving thread.
  virtual uint64_t progressCount() const = 0;
  /// Tells every connected peer that this rank is aborting (best effort, never blocks), and fails
  /// all pending requests with `reason`.
  virtual void abort(const std::string& reason) = 0;
  /// Ok while `peer` is alive and has not aborted or closed; else an error naming it. May make a
  /// system call: callers rate-limit it. A transport that cannot tell answers ok.
  virtual Status peerHealth(int peer) { return Status::ok(); }
  /// Whether sends the caller already saw complete (eager or detached) still wait for the peer's
  /// acknowledgement; a communicator being destroyed progresses until they do (bounded), so that
  /// closing its sockets cannot cut data the peer has not read. Driving thread.
  virtual bool sendsPending() const { return false; }

  /// Registers [base, base + bytes) of `space` for use in MemRefs (ncclCommRegister): RDMA memory
  /// regions and CUDA IPC handles live in the region. The default registers nothing (the region
  /// only remembers the range): shm and tcp read every host space directly.
  virtual Status registerMemory(const void* base, size_t bytes, MemSpace space, std::unique_ptr<MemRegion>* out) {
    *out = std::make_unique<MemRegion>(base, bytes, space);
    return Status::ok();
  }
  /// Releases a registration (the caller then destroys it). No request may still use it.
  virtual Status deregisterMemory(MemRegion* region) { return Status::ok(); }

  // ---- capabilities: nullptr where this transport has none ----
  virtual LaneSetup* laneSetup() { return nullptr; }
  virtual HostArena* hostArena() { return nullptr; }
  virtual WaitSource* waitSource() { return nullptr; }
  virtual CpuSharing* cpuSharing() { return nullptr; }
};

/// A network transport whose connections run on lanes over NIC ports (tcp, ibverbs): what C4P plans
/// with, and the fault drills.
class LaneSetup {
 public:
  /// This rank's NIC ports ("ip:port", the port it listens on there), in the order that
  /// LanePlan::localPort and remotePort index.
  virtual std::vector<std::string> portAddresses() const = 0;
  /// Lanes each connection opens at first (C4_LANES; the planner plans that many).
  virtual int lanesPerConnection() const = 0;
  /// Collective (ctx.oob), once, after the transport was created and C4P planned (from here on
  /// Context::lanePlan answers with the plan): a transport that opens every lane at communicator
  /// creation opens them here, so that they go where the plan says; one that opens lanes lazily
  /// returns ok. No connection exists before. Standalone users (tests) call it right after
  /// creating the transport.
  virtual Status startLanes() = 0;
  /// The connection to `peer` if one exists (connect() made it, or the peer opened it), else
  /// nullptr; creates and opens nothing: what C4P and C4D read the lanes of. Driving thread.
  virtual Connection* existingConnection(int peer) = 0;
  /// Fault drill `fault` on lane `lane` of the connection to `peer` (tests and C4_FAULT; no
  /// protocol notice to the peer). Fails where there is no such lane in service or no such drill.
  virtual Status faultDrill(int peer, int lane, LaneFault fault) = 0;

 protected:
  ~LaneSetup() = default;
};

/// A shared arena per rank of this host (shm): readable and writable by every rank of the host and
/// zeroed at setup; one-shot small collectives and zero-copy announcements use it.
class HostArena {
 public:
  /// The arena of `rank`, arenaBytes() long; nullptr when `rank` is not on this host.
  virtual char* arena(int rank) = 0;
  virtual size_t arenaBytes() const = 0;

 protected:
  ~HostArena() = default;
};

/// A file descriptor to block on while idle (tcp, ibverbs, ucx; shared memory is only polled).
class WaitSource {
 public:
  /// Polls readable when progress() may have work (network data arrived, a blocked socket became
  /// writable).
  virtual int waitFd() const = 0;
  /// Called by the driving thread right before it blocks on waitFd() (after a progress() that
  /// completed nothing): false when work is pending already, so the caller must not block (UCX's
  /// worker, whose event fd signals only once armed). Driving thread.
  virtual bool armWait() = 0;

 protected:
  ~WaitSource() = default;
};

/// Idle back-off (transports/idle.hpp) among the ranks of a host (shm).
class CpuSharing {
 public:
  /// Tells the peers which CPU this rank runs on (cheap: call it whenever the rank starts waiting).
  virtual void publishCpu() = 0;
  /// Publishes too, and says whether a peer reachable through this transport last reported this
  /// very CPU, so that spinning while waiting for it would only keep it off the CPU.
  virtual bool peerSharesCpu() = 0;
  /// A diagnosis for the trace (e.g. this rank was moved to another CPU), once; empty if none.
  /// Polled by the communicator while it is idle.
  virtual std::string takeNote() = 0;

 protected:
  ~CpuSharing() = default;
};

}  // namespace c4::transport
