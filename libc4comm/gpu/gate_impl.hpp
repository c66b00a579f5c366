// libc4comm/gpu with CUDA, inside: the driver entry points, the helpers of every CUDA call, and the
// StreamGate's state (gpu_cuda.cc: staging and stream order; ipc_cuda.cc: the device zero-copy path).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.hpp"
#include "gpu/gpu.hpp"

namespace c4::gpu::detail {

using PointerGetAttributesFn = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
using StreamWaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);

/// The driver's functions the runtime does not wrap, found once (none where CUDA is off or absent).
struct Driver {
  int devices = 0;
  PointerGetAttributesFn pointerGetAttributes = nullptr;
  StreamWaitValue32Fn streamWaitValue32 = nullptr;
};
const Driver& driver();

inline Status cudaFailed(cudaError_t e, const char* what) {
  (void)cudaGetLastError();
  return makeError(Code::kUnhandledCudaError, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

#define C4_CUDA_TRY(expr)                                \
  do {                                                   \
    const cudaError_t e_ = (expr);                       \
    if (e_ != cudaSuccess) return cudaFailed(e_, #expr); \
  } while (0)

/// Makes `device` current for a scope, as NCCL does for its calls, and restores the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) {
      ok_ = cudaSetDevice(device) == cudaSuccess;
      if (!ok_) (void)cudaGetLastError();
      changed_ = ok_ && prev_ >= 0;
    }
  }
  ~DeviceScope() {
    if (changed_) (void)cudaSetDevice(prev_);
  }
  bool ok() const { return ok_; }

 private:
  int prev_ = -1;
  bool ok_ = true;
  bool changed_ = false;
};

/// Relaxed stream-capture mode for this thread while the scope lasts: a CUDA graph captured in
/// global mode on some stream of the process must not make our own, unrelated calls (allocation,
/// event queries) fail. NCCL does the same.
class RelaxedCapture {
 public:
  RelaxedCapture() {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
      ok_ = false;
    }
  }
  ~RelaxedCapture() {
    if (ok_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = true;
};

/// One staging slot: pinned host memory and the events of the call holding it.
struct Slot {
  void* host = nullptr;
  size_t capacity = 0;
  bool registered = false;  // from the gate's allocator, registered with cudaHostRegister
  cudaEvent_t inputsReady = nullptr;
  cudaEvent_t free = nullptr;
  bool reserved = false;              // between stageInputs and stageOutputs (or cancel)
  bool used = false;                  // "free" was recorded: reusable once it has completed
  cudaStream_t stream = nullptr;      // of the call holding it
  std::vector<StreamGate::Copy> in;   // a deferred call's input copies (progress thread, on demand)
  std::vector<StreamGate::Copy> out;  // its step 2's copies
  bool deferred = false;              // the copies are the progress thread's (see gpu.hpp)
  bool copiedIn = false;              // copyInputsNow ran: finishDeferred copies the outputs back
};

/// A peer's allocation mapped here with cudaIpcOpenMemHandle.
struct IpcMap {
  int peer;
  uint64_t id;
  char* base;
  bool registered;  // the peer registered the buffer: kept until ipcCloseRegistered
};

}  // namespace c4::gpu::detail

namespace c4::gpu {

struct StreamGate::Impl {
  using Slot = detail::Slot;
  int device = 0;
  volatile uint32_t* counter = nullptr;  // pinned, mapped: the progress thread writes, streams read
  uint32_t* counterDevice = nullptr;     // its device address
  bool memop = false;
  StreamGate::HostAllocator alloc;  // staging from the caller (registered), or cudaHostAlloc
  bool allocWorks = true;           // false once registering the caller's memory failed
  uint32_t issued = 0;              // the last ticket handed out (the calling thread's)
  std::mutex mu;                    // slots: stage*() on the calling thread against the destructor
  std::vector<std::unique_ptr<Slot>> slots;
  // Flags (waitFlag): kMaxFlags words of pinned mapped memory, made at the first waitFlag (under
  // mu; setFlag takes no lock: it may run while the caller's thread holds mu in a CUDA call that
  // waits for room in a stream held up by that very flag).
  struct FlagUse {
    uint32_t value = 0;             // the last value waited for; the flag is set once its word reaches it
    bool busy = false;              // a stream waits for it, or has not passed it yet
    bool retired = false;           // its wait could not be followed by its event: never used again
    cudaEvent_t reached = nullptr;  // the stream got to the wait
    cudaEvent_t passed = nullptr;   // the stream went past it
  };
  volatile uint32_t* flags = nullptr;
  uint32_t* flagsDevice = nullptr;
  std::vector<FlagUse> flagUse;
  std::atomic<int> flagsUnset{0};  // waits enqueued and not yet set: slots are not freed meanwhile
  /// Stores `value` into flag `id` unless its word is there already (wrapping compare); lock-free.
  /// Whether this call set it.
  bool storeFlag(uint32_t id, uint32_t value);
  /// Whether flag `id`'s word has reached its last value.
  bool flagIsSet(uint32_t id) const;

  // The progress thread's own (created at its first use there, released by the destructor).
  cudaStream_t work = nullptr;  // deferred copies and zero-copy kernels
  cudaEvent_t workDone = nullptr;
  std::list<detail::IpcMap> maps;  // most recently used first
  void* temp = nullptr;            // device scratch of a Reduce's non-root rank
  size_t tempBytes = 0;

  Status acquire(size_t bytes, Slot** out);
  Status allocHost(Slot* s, size_t cap);
  void freeHost(Slot* s);
  Status enqueueWait(cudaStream_t s, uint32_t seq) { return enqueueWaitAt(s, counterDevice, seq); }
  /// The stream waits until the word at `word` (device address of pinned mapped memory) reaches
  /// `value` (wrapping compare).
  Status enqueueWaitAt(cudaStream_t s, uint32_t* word, uint32_t value);
  /// The work stream (and the progress thread's current device), made on first use.
  Status workStream(cudaStream_t* s);
  /// Waits until everything enqueued on the work stream is done (polling, yielding the core).
  Status drainWork(const char* what);
  /// Closes the IPC mappings and frees the progress thread's own resources (destructor).
  void releaseWork();
};

}  // namespace c4::gpu
