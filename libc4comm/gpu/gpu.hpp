// CUDA for the core, behind an interface that names no CUDA type (libc4comm/gpu): where a buffer
// lives, and the stream gate that runs a communicator's work on host staging in a CUDA stream's
// order. Built with CUDA (gpu_cuda.cc, the runtime linked statically: it loads the driver at first
// use, so a host without one runs the same library) or without (gpu_none.cc: every buffer is host
// memory and device work is refused).
//
// Stream order without blocking the host (docs/architecture.md, "device buffers are staged in the
// stream's order"): for a call on device buffers the caller's thread enqueues on the caller's stream
//   1. device -> pinned host copies of the inputs, an event "inputs ready" (stageInputs),
//   2. a wait until the communicator's completion counter reaches the call's ticket, pinned host ->
//      device copies of the outputs, an event "slot free" (stageOutputs),
// and hands the call, on the staging buffers, to the communicator's progress thread. That thread
// waits for "inputs ready", runs the collective on host memory like any other, and advances the
// counter (a store to pinned memory): the stream goes on and copies the results back. The wait is
// a stream memory operation (cuStreamWaitValue32) where the driver has them, else a one-thread
// kernel polling the counter. Inside a group the calls' step 1 is enqueued at each call and their
// step 2 at groupEnd: the group's job waits for every call's inputs, which on one stream must not
// sit behind another call's wait. Tickets complete in order (one progress thread per
// communicator); a ticket is completed whatever happens to its call (failure, abort), so no stream
// waits forever.
//
// Deferred calls (docs/cuda.md, "CUDA IPC"): where every rank of a communicator is on this host, a
// call on device buffers enqueues no copies at step 1, only "inputs ready"; the progress thread runs
// it on the device buffers themselves (each rank's kernels reading and writing the peers' buffers,
// mapped with CUDA IPC: runZeroCopy), or, where some rank cannot, copies the inputs into the staging
// slot itself (copyInputsNow) and the outputs back before the ticket completes (finishDeferred).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "c4comm/status.hpp"

namespace c4::gpu {

/// Where a buffer lives, as CUDA sees it.
enum class Mem : uint8_t {
  kHost = 0,    ///< ordinary (pageable) host memory, or CUDA is not here
  kPinned = 1,  ///< page-locked host memory registered with CUDA (cudaHostAlloc, cudaHostRegister)
  kDevice = 2,  ///< device memory, or managed memory
};
/// "host", "pinned host", "device".
const char* memName(Mem m);

struct PtrInfo {
  Mem mem = Mem::kHost;
  int device = -1;  // the GPU of device memory (-1: none)
};

/// Whether this build has CUDA support.
bool built();
/// GPUs this process can use: 0 without CUDA support, a driver or a GPU, or with C4_CUDA=0.
/// Read once; never fails.
int deviceCount();
/// The calling thread's current GPU (cudaGetDevice), -1 without GPUs. Creates no context.
int currentDevice();
/// Where p lives. Never fails: kHost for memory CUDA does not know (and always without a GPU). Does
/// not create a CUDA context.
PtrInfo pointerInfo(const void* p);

/// Device memory from cudaMalloc on the calling thread's current GPU (ncclMemAlloc in a process
/// with a GPU), and its release. kInvalidUsage without GPUs.
Status deviceAlloc(void** p, size_t bytes);
Status deviceFree(void* p);

/// A device buffer as another process of this host opens it with CUDA IPC. Plain data (it travels
/// through the host's shared arenas).
struct IpcRef {
  uint64_t id = 0;                ///< the allocation's id in its process (CUDA's buffer id, never reused); 0: none
  uint64_t off = 0;               ///< the buffer's offset in its allocation
  unsigned char handle[64] = {};  ///< cudaIpcMemHandle_t of the allocation
};
static_assert(sizeof(IpcRef) == 80, "IpcRef is plain data of a fixed size");

/// Whether [p, p + len) lies in one device allocation that CUDA IPC can share (cudaMalloc memory;
/// not managed, pinned host or cuMem/VMM memory); fills *ref. The allocation's handle is made once
/// and cached by its id.
bool ipcExport(const void* p, size_t len, IpcRef* ref);

/// One call of the device zero-copy path as this rank runs its share of it (StreamGate::runZeroCopy):
/// every rank's buffers mapped into this process (null: not used by that rank).
struct DeviceWork {
  int coll = 0;   ///< c4::Coll (AllReduce, ReduceScatter, Reduce, AllGather, Broadcast, AlltoAll out of
                  ///< place, Gather, Scatter)
  int dtype = 0;  ///< c4::DataType
  int op = 0;     ///< kernels::KOp (sum, prod, min, max)
  size_t count = 0;
  int root = 0, rank = 0, nranks = 1;
  size_t sliceBegin = 0, sliceEnd = 0;  ///< this rank's elements of an AllReduce or Reduce
  const char* const* in = nullptr;      ///< nranks entries
  char* const* out = nullptr;           ///< nranks entries
};

/// One communicator's staged, stream-ordered calls (see the top of this file). Thread use: stage*()
/// and cancel() on the calling thread; inputsReady() and complete() on the progress thread (complete() also on
/// failure paths); the destructor after the progress thread stopped.
class StreamGate {
 public:
  /// A call's claim: its staging slot and its place in the completion order. seq 0: staged inputs
  /// only (step 1), no ticket yet.
  struct Ticket {
    void* slot = nullptr;
    uint32_t seq = 0;
  };
  /// A copy between device memory and the staging buffer of one call: `bytes`, or `rows` rows of
  /// `bytes` each, `pitch` bytes apart on the device and back to back in the staging (a pipelined
  /// piece of an AllGather's output or a ReduceScatter's input: each rank's block holds a slice).
  struct Copy {
    void* device = nullptr;
    size_t offset = 0;  // into the staging buffer
    size_t bytes = 0;
    size_t rows = 1;
    size_t pitch = 0;
  };

  /// Where staging memory comes from: cudaHostAlloc by default, or the caller's allocator (the core
  /// passes shareable host memory, so that a call staged on every rank of a host runs on the
  /// zero-copy path), which the gate then registers with CUDA (cudaHostRegister).
  struct HostAllocator {
    Status (*alloc)(void** p, size_t bytes) = nullptr;
    void (*free)(void* p) = nullptr;
  };
  /// A gate for GPU `device`. kUnhandledCudaError where CUDA fails; kInvalidUsage without CUDA.
  static Status create(int device, const HostAllocator& staging, std::unique_ptr<StreamGate>* out);
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  /// Step 1 of a call on `stream` (a cudaStream_t): reserves `bytes` of pinned host memory (*host),
  /// enqueues the `in` copies (device to staging) and "inputs ready", and keeps `out` for step 2.
  /// `deferred`: the copies are kept, not enqueued (see the top of this file). *pending names the
  /// slot (seq 0). On error nothing is reserved.
  Status stageInputs(void* stream, size_t bytes, const std::vector<Copy>& in, const std::vector<Copy>& out, void** host,
                     Ticket* pending, bool deferred = false);
  /// Step 2: enqueues the wait for a new ticket, the `out` copies (staging to device; none for a
  /// deferred call) and "slot free" on the stream of step 1; *pending becomes the ticket. Once its
  /// seq is set the ticket must be completed, even when this returns an error.
  Status stageOutputs(Ticket* pending);
  /// Gives back a slot whose call will not run (step 1 done, step 2 not): nothing waits for it.
  void cancel(const Ticket& pending);
  /// A stream wait the host releases (one-sided waits, core/rma.hpp): the stream waits until the
  /// flag is set. Independent of tickets, so waits on different streams do not order each other.
  struct Flag {
    uint32_t id = 0;
    uint32_t value = 0;
  };
  static constexpr uint32_t kMaxFlags = 1024;
  /// Enqueues on `stream` a wait for a new flag (a word of pinned mapped memory, used again once its
  /// stream has passed it). kInvalidUsage while kMaxFlags flags are unset or not yet passed.
  Status waitFlag(void* stream, Flag* out);
  /// Releases the stream waiting for `f`. Any thread, no lock; a flag set already is left alone.
  void setFlag(const Flag& f);
  /// Whether `f`'s stream has got to its wait (the time it waits for a peer counts from there).
  bool flagReached(const Flag& f) const;
  /// Whether the ticket's inputs have reached the staging buffer (an error: the stream failed).
  Status inputsReady(const Ticket& t, bool* ready);
  /// The ticket's call is over (done or failed): its stream goes on. Idempotent; any thread.
  void complete(const Ticket& t);

  // The progress thread's side of deferred calls (after inputsReady said ready).
  /// Whether the ticket's call is deferred.
  bool deferred(const Ticket& t) const;
  /// Copies a deferred call's inputs into its staging slot now (it runs on the host path after all),
  /// so that finishDeferred copies its outputs back. Waits for the copies.
  Status copyInputsNow(const Ticket& t);
  /// Before a deferred call's ticket completes, after the call succeeded: copies its outputs back
  /// from the staging slot if copyInputsNow ran. Waits for the copies.
  Status finishDeferred(const Ticket& t);
  /// The address in this process of [ref.off, ref.off + len) of rank `peer`'s allocation, mapped
  /// with CUDA IPC (or found mapped) until ipcTrim, or, `registered` (the peer registered the
  /// buffer with commRegister), until ipcCloseRegistered. Fails where the allocation cannot be
  /// opened here (another GPU without peer access, for one).
  Status ipcOpen(int peer, const IpcRef& ref, size_t len, char** out, bool registered = false);
  /// Closes the mappings of rank `peer`'s registered buffers (-1: every peer's), after this rank's
  /// device work is done: the peer deregistered one (or leaves), and may free it.
  void ipcCloseRegistered(int peer);
  /// Lets this gate's GPU reach GPU `device`'s memory (a rank of the same process there):
  /// cudaDeviceEnablePeerAccess where it is another GPU; fails where they cannot.
  Status peerAccess(int device);
  /// After a call's kernels are done (or it did not run them): closes the mappings of unregistered
  /// buffers beyond the C4_CUDA_IPC_CACHE most recently used (all of them by default; CUDA forbids
  /// freeing an exported allocation that another process still has open).
  void ipcTrim();
  /// Copies `bytes` between any two buffers CUDA reaches (device memory of this process or mapped
  /// from a peer's, pinned or pageable host memory) on the gate's own stream, and waits for it. The
  /// one-sided calls' copies (core/rma.hpp): on the progress thread, or on a thread holding the
  /// communicator's drive with nothing queued. Never on the legacy default stream, which a caller's
  /// stream waiting for a ticket would hold up.
  Status copySync(void* dst, const void* src, size_t bytes);
  /// This rank's share of a device zero-copy call (kernels on the gate's own stream), waited for:
  /// once it returns, this rank reads and writes no buffer of the call any more.
  Status runZeroCopy(const DeviceWork& w);
  /// Whether `stream` is being captured into a CUDA graph (a staged call cannot be: its host side
  /// runs once, at the call, while a graph's wait would pass on every replay without it).
  static bool capturing(void* stream);
  /// The GPU this gate serves.
  int device() const { return device_; }
  /// "memop" or "kernel": how streams wait.
  const char* waitKind() const;

  struct Impl;

 private:
  StreamGate(int device, std::unique_ptr<Impl> impl);
  int device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace c4::gpu
