// Transport interface: how bytes move between two ranks.
//
// A Transport is created per communicator and rank; it hands out one Connection per peer. A
// Connection carries messages in both directions. Messages in one direction are FIFO: the k-th
// irecv posted on a connection matches the k-th isend the peer posted on its connection to us.
// Every message carries the sender's OpSig and byte count; a receive whose expected OpSig or size
// differs fails with kInvalidUsage and a message naming both ranks and the difference.
//
// Everything is non-blocking and single-threaded: the owner calls progress() repeatedly (from the
// thread that uses the communicator) and reads Request::state. No call blocks for a peer.
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
#include "kernels/host/reduce.hpp"

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

/// Completion record owned by the caller; must stay alive (and not move) until state != kPending.
struct Request {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  int state = kPending;
  Status error;  // set when state == kFailed
};

/// Receive with reduction: dst[i] = local[i] op incoming[i]. `local` may equal dst.
struct ReduceSpec {
  const void* local = nullptr;
  DataType dtype = DataType::kFloat32;
  kernels::KOp op = kernels::KOp::kSum;
};

/// What the sender knows about the matching receive; a transport may choose its protocol by it.
struct SendHint {
  // The receive is a plain copy and the plan prefers it done in one copy from the sender's buffer
  // where the transport can. False for data the receiver reduces and where streaming measured
  // faster (the planner decides; see TuneResult::singleCopy).
  bool singleCopy = true;
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual int peer() const = 0;
  /// Queues `bytes` from buf to the peer. buf must stay valid and unmodified until req is done.
  virtual Status isend(const void* buf, size_t bytes, const OpSig& sig, Request* req, SendHint hint = {}) = 0;
  /// Queues a receive of exactly `bytes` into dst (or, with red, reduced into dst as data arrives,
  /// in pieces, in order). dst must stay valid until req is done.
  virtual Status irecv(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req) = 0;
  /// MPI_Iprobe for this connection: whether the first bytes (header) of the next incoming message
  /// that no posted receive claims have arrived, and if so its signature and size. Consumes
  /// nothing: an irecv posted next receives that very message. Never ready while receives are
  /// posted. Opens the lanes of a network connection where this rank opens them (so that the
  /// peer can send at all). Fails if the connection is broken or the transport aborted.
  virtual Status peek(bool* ready, OpSig* sig, size_t* bytes) = 0;

  /// Receive-and-forward, NCCL's recvReduceCopySend / recvCopySend. True if this transport can run
  /// irecvForward(..., to, ...) for a forwarded message of `bytes` sent with `hint`.
  virtual bool canForward(const Connection* to, size_t bytes, SendHint hint) const { return false; }
  /// irecv(dst, bytes, sig, red, req), plus a send of dst's bytes to `to` as this rank's next message
  /// on that connection (`toSig`, completing `toReq`) that leaves piece by piece as the pieces land
  /// (reduced, with `red`), instead of after the whole receive. Where the forward buffer has room,
  /// each piece is written to dst and to `to`'s peer in the same pass over the incoming data, so
  /// the forward costs no separate copy. Only where canForward(to, bytes, hint) said so.
  virtual Status irecvForward(void* dst, size_t bytes, const OpSig& sig, const ReduceSpec* red, Request* req,
                              Connection* to, const OpSig& toSig, Request* toReq) {
    return Status(Code::kInternalError, "this transport cannot forward a receive");
  }
};

/// What a transport can do, and its cost model for the tuner: time(bytes) = latencyUs + bytes/bwGBps.
struct Caps {
  double latencyUs = 10.0;
  double bwGBps = 1.0;
  // Plain (non-reducing) messages above this size go in one copy straight from the sender's buffer,
  // so cutting them into pipeline chunks only adds handshakes (SIZE_MAX: never).
  size_t singleCopyBytes = SIZE_MAX;
  bool sameHostOnly = false;
  bool deviceMemory = false;
};

/// Where one lane of a network connection goes out (C4P's hook; see Context::lanePlan).
struct LanePlan {
  int localPort = -1;       // index into this rank's NIC ports (-1: lane mod ports)
  uint16_t sourcePort = 0;  // local TCP/UDP source port to bind (0: the kernel chooses)
};

/// Facts every transport needs at setup. Vectors are indexed by rank.
struct Context {
  int rank = 0;
  int nranks = 1;
  std::string commTag;            // unique per communicator (hex); use it to name OS objects
  std::vector<uint64_t> hostIds;  // same host id => same host
  std::vector<int32_t> pids;
  Oob* oob = nullptr;          // collective over all ranks during setup (allGather, barrier)
  int64_t timeoutMs = 300000;  // give up on a silent peer after this long (C4_TIMEOUT)
  // 128-bit key derived from the UniqueId secret; network transports prove it on every connection.
  uint64_t authKey[2] = {0, 0};
  // Optional: the plan for lane `lane` to `peer` (called once per lane when it is opened, on the
  // thread that drives the transport). Unset: the transport's default (lane mod ports, port 0).
  std::function<LanePlan(int peer, int lane)> lanePlan;
};

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
  /// Tells every connected peer that this rank is aborting (best effort, never blocks), and fails
  /// all pending requests with `reason`.
  virtual void abort(const std::string& reason) = 0;

  /// Optional: a shared arena of hostArenaBytes() per rank, readable and writable by every rank
  /// of this host and zeroed at setup (one-shot small collectives use it). nullptr when the
  /// transport has none or `rank` is not on this host.
  virtual char* hostArena(int rank) { return nullptr; }
  virtual size_t hostArenaBytes() const { return 0; }
  /// Ok while `peer` is alive and has not aborted or closed; else an error naming it. May make a
  /// system call: callers rate-limit it.
  virtual Status peerHealth(int peer) { return Status::ok(); }

  /// A file descriptor that polls readable when progress() may have work (network data arrived, a
  /// blocked socket became writable), for callers that block while idle; -1 if the transport has
  /// none (shared memory is only polled).
  virtual int waitFd() const { return -1; }

  /// Idle back-off (see shm's idleBackoffUs): publishCpu() tells the peers which CPU this rank
  /// runs on (cheap: call it whenever the rank starts waiting); peerSharesCpu() publishes too and
  /// says whether a peer reachable through this transport last reported this very CPU, so that
  /// spinning while waiting for it would only keep it off the CPU.
  virtual void publishCpu() {}
  virtual bool peerSharesCpu() { return false; }
  /// A diagnosis the transport wants in the trace (e.g. it moved this rank to another CPU), once;
  /// empty if none. Polled by the communicator while it is idle.
  virtual std::string takeNote() { return {}; }
};

}  // namespace c4::transport
