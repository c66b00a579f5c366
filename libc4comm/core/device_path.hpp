// The device path: calls on CUDA memory (device or pinned host buffers), as the router sends them
// (core/route.hpp, routes 3-5). Such a call runs in its stream's order through the communicator's
// StreamGate (gpu/gpu.hpp), in two steps:
//  1. at the call: the stream copies the inputs into a staging slot of pinned host memory (none for
//     a deferred call) and the call's buffers become the staging;
//  2. at once, or at groupEnd for a group's calls: the stream waits for the call's ticket, then
//     copies the outputs back.
// The progress thread runs the staged call on the host paths once the stream reached it
// (core/comm_jobs.cc), and completes its ticket. A pipelined call is cut into pieces, each its own
// call with its own slot and ticket, so that one piece's copies overlap another's transfer. A
// deferred call runs on the device buffers themselves (the zero-copy path through CUDA IPC), or on
// its staging if a peer cannot; then finishDeferred copies its outputs back.
// One-sided calls on device windows (core/rma.hpp) go through the same gate (submitOneSided).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "c4comm/status.hpp"
#include "core/opdesc.hpp"
#include "core/route.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

struct Comm;
struct GroupQueue;
struct Job;

class DevicePath {
 public:
  explicit DevicePath(Comm* c) : c_(c) {}
  DevicePath(const DevicePath&) = delete;
  DevicePath& operator=(const DevicePath&) = delete;

  /// Carries out a device route of `op` (Comm::route decided it): step 1 on the stream, then the
  /// call is queued in `group` (step 2 at groupEnd) or, with step 2, on the progress thread. The
  /// caller returns at once: the call runs when its stream gets there.
  Status submit(const OpDesc& op, const Routing& r, GroupQueue* group);
  /// A one-sided call on device windows in `stream`'s order: the stream reaches it (copying
  /// `stageBytes` of `src`, device memory, into a staging slot), then waits while the progress
  /// thread runs `run` (given the staged copy, or null).
  Status submitOneSided(void* stream, const void* src, size_t stageBytes,
                        std::function<Status(const void* staged)> run);
  /// Step 2 of the staged calls among `ops` (the stream's wait for their tickets, the copies back).
  /// A call whose step 2 fails cannot run: its ticket (if it got one) completes, the communicator
  /// fails, and the remaining calls are cancelled. Returns the first error.
  Status finishStaging(std::vector<OpDesc>* ops);
  /// Gives back the staging of calls that will not run (step 1 only: a group that fails first).
  void cancel(const std::vector<OpDesc>& ops);
  /// The communicator's StreamGate, made for GPU `create` at its first call on CUDA memory;
  /// `buffers` (-1: none) is the GPU of the call's device buffers, which must be the gate's.
  Status ensureGate(int create, int buffers, const char* fn);
  /// kInvalidUsage where `stream` is being captured into a CUDA graph: a call on device memory runs
  /// its host side at the call (or on the progress thread), not at each replay of the graph.
  static Status refuseCapture(void* stream, const char* fn);

  // ---- on the progress thread (core/comm_jobs.cc) ----
  /// Whether the inputs of the call of `t` are on the host (its stream reached it).
  Status inputsReady(const gpu::StreamGate::Ticket& t, bool* ready) { return gate_->inputsReady(t, ready); }
  /// Deferred calls of `tickets` that ran on their staging after all: their outputs back to the
  /// device, before the tickets let the streams go on.
  Status finishDeferred(const std::vector<gpu::StreamGate::Ticket>& tickets);
  /// Lets the streams waiting for `tickets` go on.
  void release(const std::vector<gpu::StreamGate::Ticket>& tickets);

  gpu::StreamGate* gate() const { return gate_.get(); }
  /// Where the gate lives (the zero-copy path reads it when a deferred call runs).
  std::unique_ptr<gpu::StreamGate>* gateSlot() { return &gate_; }

 private:
  /// Step 1 of one call (or piece) with layout `plan`: its inputs staged, its buffers rewritten to
  /// the staging (op->staged names the slot).
  Status stage(OpDesc* op, const StagingPlan& plan, bool defer);
  Status submitPieces(const OpDesc& callOp, const Routing& r, GroupQueue* group);
  /// Step 2 of `ops`, then each its own job on the progress thread.
  Status queueStaged(std::vector<OpDesc>* ops);

  Comm* c_;
  std::unique_ptr<gpu::StreamGate> gate_;
};

}  // namespace c4
