// libc4comm/gpu with CUDA (see gpu.hpp). The runtime is linked statically; the driver's functions
// that the runtime does not wrap (pointer attributes without a context, stream memory operations)
// come from cudaGetDriverEntryPointByVersion, so nothing links libcuda.so.1.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "gpu/gate_impl.hpp"
#include "gpu/gpu.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace c4 {
C4_PARAM_INT(Cuda, "C4_CUDA", nullptr, 1, 0, 1, kParamNone,
             "CUDA device buffers: 1 (default) finds GPUs and stages device buffers; 0 treats every buffer as "
             "host memory and never touches CUDA")
C4_PARAM_STR(CudaStreamWait, "C4_CUDA_STREAM_WAIT", nullptr, "auto", "auto|memop|kernel", kParamNone,
             "How a CUDA stream waits for a staged call: memop (cuStreamWaitValue32), kernel (a one-thread "
             "polling kernel) or auto (memop where the driver has it)")
C4_PARAM_INT(CudaStagingMin, "C4_CUDA_STAGING_MIN", nullptr, 1 << 20, 4096, INT64_C(1) << 40, kParamNone,
             "Smallest pinned host staging buffer a communicator allocates for device buffers (bytes; "
             "larger calls get the next power of two)")
}  // namespace c4

namespace c4::gpu {
namespace detail {

void* entryPoint(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    if (paramCuda() == 0) return r;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      C4_INFO(kLogInit, "CUDA: no usable driver or GPU; device buffers are not available");
      return r;
    }
    r.devices = n;
    r.pointerGetAttributes = reinterpret_cast<PointerGetAttributesFn>(entryPoint("cuPointerGetAttributes"));
    r.streamWaitValue32 = reinterpret_cast<StreamWaitValue32Fn>(entryPoint("cuStreamWaitValue32"));
    C4_INFO(kLogInit, "CUDA: %d GPU(s); stream memory operations %s", n,
            r.streamWaitValue32 ? "available" : "not available (a polling kernel waits instead)");
    return r;
  }();
  return d;
}

}  // namespace detail

using namespace detail;

const char* memName(Mem m) { return m == Mem::kDevice ? "device" : m == Mem::kPinned ? "pinned host" : "host"; }
bool built() { return true; }
int deviceCount() { return driver().devices; }

int currentDevice() {
  if (deviceCount() == 0) return -1;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

PtrInfo pointerInfo(const void* p) {
  PtrInfo info;
  const Driver& d = driver();
  if (d.devices == 0 || p == nullptr) return info;
  if (d.pointerGetAttributes != nullptr) {
    // The driver's query needs no context and answers "not CUDA's" with zeroed attributes.
    unsigned memType = 0, isManaged = 0;
    int ordinal = -1;
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void* data[3] = {&memType, &isManaged, &ordinal};
    if (d.pointerGetAttributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return info;
    if (isManaged || memType == CU_MEMORYTYPE_DEVICE) {
      info.mem = Mem::kDevice;
      info.device = ordinal;
    } else if (memType == CU_MEMORYTYPE_HOST) {
      info.mem = Mem::kPinned;
      info.device = ordinal;
    }
    return info;
  }
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    info.mem = Mem::kDevice;
    info.device = a.device;
  } else if (a.type == cudaMemoryTypeHost) {
    info.mem = Mem::kPinned;
    info.device = a.device;
  }
  return info;
}

// ---- StreamGate ----

namespace {
/// cudaMemcpy2DAsync refuses pitches above the device's cudaDevAttrMaxPitch (2^31 - 1 on the GPUs
/// we know): rows further apart are copied one by one.
constexpr size_t kMax2DPitch = (size_t{1} << 31) - 1;

/// Enqueues `copies` between a slot's staging and the device on `s` (to the host: `toHost`), every
/// one of them even after a failure (a ticket's copies back must all be tried); the first error.
Status enqueueCopies(const Slot& slot, const std::vector<StreamGate::Copy>& copies, bool toHost, cudaStream_t s) {
  Status first;
  char* base = static_cast<char*>(slot.host);
  for (const StreamGate::Copy& c : copies) {
    if (!c.bytes) continue;
    // cudaMemcpyDefault: the device side may be pinned host memory (the rows of a pipelined piece
    // are staged whatever they are).
    cudaError_t e = cudaSuccess;
    if (c.rows > 1 && c.pitch <= kMax2DPitch) {
      e = toHost
              ? cudaMemcpy2DAsync(base + c.offset, c.bytes, c.device, c.pitch, c.bytes, c.rows, cudaMemcpyDefault, s)
              : cudaMemcpy2DAsync(c.device, c.pitch, base + c.offset, c.bytes, c.bytes, c.rows, cudaMemcpyDefault, s);
    } else {
      for (size_t r = 0; r < c.rows && e == cudaSuccess; ++r) {
        char* dev = static_cast<char*>(c.device) + r * c.pitch;
        char* host = base + c.offset + r * c.bytes;
        e = toHost ? cudaMemcpyAsync(host, dev, c.bytes, cudaMemcpyDefault, s)
                   : cudaMemcpyAsync(dev, host, c.bytes, cudaMemcpyDefault, s);
      }
    }
    if (e != cudaSuccess && first.isOk())
      first = cudaFailed(e, toHost ? "cudaMemcpyAsync(device to staging)" : "cudaMemcpyAsync(staging to device)");
  }
  return first;
}
}  // namespace

namespace {
/// cudaEventQuery that leaves no cudaErrorNotReady behind as the thread's last error (the runtime
/// may record it, as PyTorch assumes): a later cudaGetLastError (ours after a kernel launch, or the
/// application's on its own thread) would report it.
cudaError_t queryEvent(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) (void)cudaGetLastError();
  return q;
}
}  // namespace

Status StreamGate::Impl::acquire(size_t bytes, Slot** out) {
  Slot* reuse = nullptr;
  for (auto& s : slots) {
    if (s->reserved) continue;
    if (s->used) {
      const cudaError_t q = queryEvent(s->free);
      if (q == cudaErrorNotReady) continue;
      if (q != cudaSuccess) return cudaFailed(q, "cudaEventQuery(staging slot free)");
      s->used = false;
    }
    if (s->capacity >= bytes) {
      *out = s.get();
      return Status::ok();
    }
    // Freeing pinned memory may wait for the device, where a stream may wait for a flag that only
    // this thread's later calls lead to: while flags are unset, a larger slot is a new one.
    if (reuse == nullptr && flagsUnset.load(std::memory_order_acquire) == 0) reuse = s.get();
  }
  // A call that stages nothing (a one-sided call's slot) holds no host memory.
  size_t cap = bytes == 0 ? 0 : static_cast<size_t>(paramCudaStagingMin());
  while (cap < bytes) cap *= 2;
  if (reuse == nullptr) {
    auto s = std::make_unique<Slot>();
    C4_CUDA_TRY(cudaEventCreateWithFlags(&s->inputsReady, cudaEventDisableTiming));
    C4_CUDA_TRY(cudaEventCreateWithFlags(&s->free, cudaEventDisableTiming));
    slots.push_back(std::move(s));
    reuse = slots.back().get();
  } else if (reuse->host != nullptr) {
    freeHost(reuse);
  }
  if (cap > 0) C4_CHECK(allocHost(reuse, cap));
  *out = reuse;
  return Status::ok();
}

Status StreamGate::Impl::allocHost(Slot* s, size_t cap) {
  if (alloc.alloc != nullptr && allocWorks) {
    void* p = nullptr;
    Status st = alloc.alloc(&p, cap);
    if (st.isOk()) {
      const cudaError_t e = cudaHostRegister(p, cap, cudaHostRegisterPortable);
      if (e == cudaSuccess) {
        s->host = p;
        s->capacity = cap;
        s->registered = true;
        return Status::ok();
      }
      (void)cudaGetLastError();
      alloc.free(p);
      st = makeError(Code::kUnhandledCudaError, "cudaHostRegister: %s", cudaGetErrorString(e));
    }
    C4_WARN(kLogInit, "CUDA: shareable staging memory is not available (%s); staging in cudaHostAlloc memory",
            st.message().c_str());
    allocWorks = false;
  }
  C4_CUDA_TRY(cudaHostAlloc(&s->host, cap, cudaHostAllocPortable));
  s->capacity = cap;
  s->registered = false;
  return Status::ok();
}

void StreamGate::Impl::freeHost(Slot* s) {
  if (s->host == nullptr) return;
  if (s->registered) {
    (void)cudaHostUnregister(s->host);
    alloc.free(s->host);
  } else {
    (void)cudaFreeHost(s->host);
  }
  (void)cudaGetLastError();
  s->host = nullptr;
  s->capacity = 0;
}

Status StreamGate::Impl::enqueueWaitAt(cudaStream_t s, uint32_t* word, uint32_t value) {
  if (memop) {
    const CUresult r = driver().streamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(word),
                                                  value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return Status::ok();
    C4_WARN(kLogInit, "CUDA: cuStreamWaitValue32 failed (error %d); streams wait with a polling kernel from now on",
            static_cast<int>(r));
    memop = false;
  }
  const kernels::cuda::Err e = kernels::cuda::waitFlag(word, value, s);
  if (e != 0) return cudaFailed(static_cast<cudaError_t>(e), "the stream's wait kernel");
  return Status::ok();
}

StreamGate::StreamGate(int device, std::unique_ptr<Impl> impl) : device_(device), impl_(std::move(impl)) {}

Status StreamGate::create(int device, const HostAllocator& staging, std::unique_ptr<StreamGate>* out) {
  if (deviceCount() == 0) return makeError(Code::kInvalidUsage, "CUDA: no GPU is usable in this process");
  RelaxedCapture relaxed;
  DeviceScope scope(device);
  if (!scope.ok()) return makeError(Code::kUnhandledCudaError, "CUDA: cannot make GPU %d current", device);
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->alloc = staging;
  void* counter = nullptr;
  C4_CUDA_TRY(cudaHostAlloc(&counter, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(counter, 0, 64);
  impl->counter = static_cast<volatile uint32_t*>(counter);
  void* dev = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&dev, counter, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(counter);
    return cudaFailed(e, "cudaHostGetDevicePointer(completion counter)");
  }
  impl->counterDevice = static_cast<uint32_t*>(dev);
  const std::string want = paramCudaStreamWait();
  impl->memop = driver().streamWaitValue32 != nullptr && want != "kernel";
  if (want == "memop" && !impl->memop)
    C4_WARN(kLogInit, "C4_CUDA_STREAM_WAIT=memop: the driver has no cuStreamWaitValue32; a polling kernel waits");
  out->reset(new StreamGate(device, std::move(impl)));
  C4_INFO(kLogInit, "CUDA: GPU %d, device buffers staged through pinned host memory; streams wait by %s", device,
          (*out)->waitKind());
  return Status::ok();
}

StreamGate::~StreamGate() {
  if (!impl_) return;
  RelaxedCapture relaxed;
  // Nothing may wait for a ticket or a flag that will never complete; then let every stream pass
  // its copies and waits before their memory goes.
  __atomic_store_n(const_cast<uint32_t*>(impl_->counter), impl_->issued, __ATOMIC_RELEASE);
  for (size_t i = 0; i < impl_->flagUse.size(); ++i)
    (void)impl_->storeFlag(static_cast<uint32_t>(i), impl_->flagUse[i].value);
  DeviceScope scope(device_);
  impl_->releaseWork();
  std::lock_guard<std::mutex> g(impl_->mu);
  for (auto& u : impl_->flagUse) {
    if (u.busy && !u.retired) (void)cudaEventSynchronize(u.passed);
    if (u.reached) (void)cudaEventDestroy(u.reached);
    if (u.passed) (void)cudaEventDestroy(u.passed);
  }
  if (impl_->flags) (void)cudaFreeHost(const_cast<uint32_t*>(impl_->flags));
  for (auto& s : impl_->slots) {
    if (s->reserved) (void)cudaEventSynchronize(s->inputsReady);
    if (s->used) (void)cudaEventSynchronize(s->free);
    impl_->freeHost(s.get());
    if (s->inputsReady) (void)cudaEventDestroy(s->inputsReady);
    if (s->free) (void)cudaEventDestroy(s->free);
  }
  (void)cudaFreeHost(const_cast<uint32_t*>(impl_->counter));
  (void)cudaGetLastError();
}

bool StreamGate::capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

const char* StreamGate::waitKind() const { return impl_->memop ? "memop" : "kernel"; }

Status StreamGate::stageInputs(void* stream, size_t bytes, const std::vector<Copy>& in, const std::vector<Copy>& out,
                               void** host, Ticket* pending, bool deferred) {
  RelaxedCapture relaxed;
  DeviceScope scope(device_);
  if (!scope.ok()) return makeError(Code::kUnhandledCudaError, "CUDA: cannot make GPU %d current", device_);
  std::lock_guard<std::mutex> g(impl_->mu);
  Slot* slot = nullptr;
  C4_CHECK(impl_->acquire(bytes, &slot));
  const auto s = static_cast<cudaStream_t>(stream);
  if (!deferred) C4_CHECK(enqueueCopies(*slot, in, true, s));
  C4_CUDA_TRY(cudaEventRecord(slot->inputsReady, s));
  slot->reserved = true;
  slot->stream = s;
  slot->deferred = deferred;
  slot->copiedIn = false;
  if (deferred) slot->in = in;
  slot->out = out;
  *host = slot->host;
  pending->slot = slot;
  pending->seq = 0;
  return Status::ok();
}

Status StreamGate::stageOutputs(Ticket* pending) {
  RelaxedCapture relaxed;
  DeviceScope scope(device_);
  if (!scope.ok()) return makeError(Code::kUnhandledCudaError, "CUDA: cannot make GPU %d current", device_);
  std::lock_guard<std::mutex> g(impl_->mu);
  auto* slot = static_cast<Slot*>(pending->slot);
  const uint32_t seq = impl_->issued + 1;
  Status st = impl_->enqueueWait(slot->stream, seq);
  if (!st.isOk()) return st;  // no ticket: the caller cancels the slot
  // From here the ticket exists: the stream waits for it, so it must complete whatever follows.
  impl_->issued = seq;
  pending->seq = seq;
  slot->reserved = false;
  slot->used = true;
  if (!slot->deferred) st = enqueueCopies(*slot, slot->out, false, slot->stream);
  const cudaError_t e = cudaEventRecord(slot->free, slot->stream);
  if (e != cudaSuccess && st.isOk()) st = cudaFailed(e, "cudaEventRecord(staging slot free)");
  return st;
}

void StreamGate::cancel(const Ticket& pending) {
  RelaxedCapture relaxed;
  DeviceScope scope(device_);
  std::lock_guard<std::mutex> g(impl_->mu);
  auto* slot = static_cast<Slot*>(pending.slot);
  if (!slot->reserved) return;
  slot->reserved = false;
  // Free once the stream has passed its input copies.
  slot->used = cudaEventRecord(slot->free, slot->stream) == cudaSuccess;
  if (!slot->used) {
    (void)cudaGetLastError();
    (void)cudaStreamSynchronize(slot->stream);
  }
}

Status StreamGate::inputsReady(const Ticket& t, bool* ready) {
  RelaxedCapture relaxed;
  // The progress thread asks: its current device must be the gate's (no context on another GPU).
  thread_local int current = -1;
  if (current != device_ && cudaSetDevice(device_) == cudaSuccess) current = device_;
  const cudaError_t q = queryEvent(static_cast<Slot*>(t.slot)->inputsReady);
  *ready = q == cudaSuccess;
  if (q == cudaSuccess || q == cudaErrorNotReady) return Status::ok();
  return cudaFailed(q, "the stream before a staged call (cudaEventQuery)");
}

bool StreamGate::Impl::storeFlag(uint32_t id, uint32_t value) {
  auto* word = const_cast<uint32_t*>(flags + id);
  uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  while (static_cast<int32_t>(value - cur) > 0) {
    if (__atomic_compare_exchange_n(word, &cur, value, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) return true;
  }
  return false;
}

bool StreamGate::Impl::flagIsSet(uint32_t id) const {
  const uint32_t cur = __atomic_load_n(const_cast<const uint32_t*>(flags + id), __ATOMIC_ACQUIRE);
  return static_cast<int32_t>(cur - flagUse[id].value) >= 0;
}

Status StreamGate::waitFlag(void* stream, Flag* out) {
  RelaxedCapture relaxed;
  DeviceScope scope(device_);
  if (!scope.ok()) return makeError(Code::kUnhandledCudaError, "CUDA: cannot make GPU %d current", device_);
  std::lock_guard<std::mutex> g(impl_->mu);
  Impl& im = *impl_;
  if (im.flags == nullptr) {
    void* p = nullptr;
    C4_CUDA_TRY(cudaHostAlloc(&p, kMaxFlags * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p, 0, kMaxFlags * sizeof(uint32_t));
    void* dev = nullptr;
    const cudaError_t e = cudaHostGetDevicePointer(&dev, p, 0);
    if (e != cudaSuccess) {
      (void)cudaFreeHost(p);
      return cudaFailed(e, "cudaHostGetDevicePointer(flags)");
    }
    im.flagUse.resize(kMaxFlags);
    im.flagsDevice = static_cast<uint32_t*>(dev);
    im.flags = static_cast<volatile uint32_t*>(p);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  for (uint32_t i = 0; i < kMaxFlags; ++i) {
    Impl::FlagUse& u = im.flagUse[i];
    if (u.retired) continue;
    if (u.busy) {
      if (!im.flagIsSet(i)) continue;
      const cudaError_t q = queryEvent(u.passed);
      if (q == cudaErrorNotReady) continue;
      if (q != cudaSuccess) return cudaFailed(q, "cudaEventQuery(flag passed)");
      u.busy = false;
    }
    if (u.reached == nullptr) C4_CUDA_TRY(cudaEventCreateWithFlags(&u.reached, cudaEventDisableTiming));
    if (u.passed == nullptr) C4_CUDA_TRY(cudaEventCreateWithFlags(&u.passed, cudaEventDisableTiming));
    // The word holds u.value (its last use was set): the next use waits for one more.
    const uint32_t value = u.value + 1;
    C4_CUDA_TRY(cudaEventRecord(u.reached, s));
    C4_CHECK(im.enqueueWaitAt(s, im.flagsDevice + i, value));
    // From here the stream waits for `value`: whatever follows, someone must store it.
    u.value = value;
    u.busy = true;
    const cudaError_t e = cudaEventRecord(u.passed, s);
    if (e != cudaSuccess) {
      (void)im.storeFlag(i, value);  // let the stream go; without its event the word is not used again
      u.retired = true;
      return cudaFailed(e, "cudaEventRecord(flag passed)");
    }
    im.flagsUnset.fetch_add(1, std::memory_order_acq_rel);
    *out = Flag{i, value};
    return Status::ok();
  }
  return makeError(Code::kInvalidUsage,
                   "CUDA: %u one-sided waits are outstanding on this communicator's streams (the most there may be)",
                   kMaxFlags);
}

void StreamGate::setFlag(const Flag& f) {
  // No lock (gate_impl.hpp): the flag was handed out, so its word and state exist.
  if (impl_->flags == nullptr || f.id >= kMaxFlags) return;
  if (impl_->storeFlag(f.id, f.value)) impl_->flagsUnset.fetch_sub(1, std::memory_order_acq_rel);
}

bool StreamGate::flagReached(const Flag& f) const {
  if (impl_->flags == nullptr || f.id >= kMaxFlags) return true;
  return queryEvent(impl_->flagUse[f.id].reached) != cudaErrorNotReady;
}

void StreamGate::complete(const Ticket& t) {
  auto* counter = const_cast<uint32_t*>(impl_->counter);
  uint32_t cur = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
  while (static_cast<int32_t>(cur - t.seq) < 0 &&
         !__atomic_compare_exchange_n(counter, &cur, t.seq, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
}

// ---- deferred calls: the progress thread's copies ----

Status StreamGate::Impl::workStream(cudaStream_t* s) {
  if (work == nullptr) {
    // The progress thread's current device must be the gate's (inputsReady set it, but say so).
    C4_CUDA_TRY(cudaSetDevice(device));
    C4_CUDA_TRY(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    C4_CUDA_TRY(cudaEventCreateWithFlags(&workDone, cudaEventDisableTiming));
  }
  *s = work;
  return Status::ok();
}

Status StreamGate::Impl::drainWork(const char* what) {
  C4_CUDA_TRY(cudaEventRecord(workDone, work));
  // Poll rather than block in the driver: another rank's progress thread may share this core.
  for (int i = 0;; ++i) {
    const cudaError_t q = queryEvent(workDone);
    if (q == cudaSuccess) return Status::ok();
    if (q != cudaErrorNotReady) return cudaFailed(q, what);
    if (i > 64) std::this_thread::yield();
  }
}

void StreamGate::Impl::releaseWork() {
  if (work == nullptr) return;
  if (temp != nullptr) (void)cudaFreeAsync(temp, work);  // it came from cudaMallocAsync on this stream
  temp = nullptr;
  (void)cudaStreamSynchronize(work);
  for (const detail::IpcMap& m : maps) (void)cudaIpcCloseMemHandle(m.base);
  maps.clear();
  tempBytes = 0;
  (void)cudaEventDestroy(workDone);
  (void)cudaStreamDestroy(work);
  work = nullptr;
  (void)cudaGetLastError();
}

Status StreamGate::copySync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  RelaxedCapture relaxed;
  DeviceScope scope(device_);  // a caller's thread keeps its current GPU
  if (!scope.ok()) return makeError(Code::kUnhandledCudaError, "CUDA: cannot make GPU %d current", device_);
  cudaStream_t s = nullptr;
  C4_CHECK(impl_->workStream(&s));
  C4_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  return impl_->drainWork("a one-sided copy (cudaMemcpyAsync)");
}

bool StreamGate::deferred(const Ticket& t) const {
  return t.slot != nullptr && static_cast<const Slot*>(t.slot)->deferred;
}

Status StreamGate::copyInputsNow(const Ticket& t) {
  RelaxedCapture relaxed;
  auto* slot = static_cast<Slot*>(t.slot);
  if (!slot->deferred || slot->copiedIn) return Status::ok();
  cudaStream_t s = nullptr;
  C4_CHECK(impl_->workStream(&s));
  C4_CHECK(enqueueCopies(*slot, slot->in, true, s));
  slot->copiedIn = true;
  return impl_->drainWork("copying a call's inputs to the host (cudaMemcpyAsync)");
}

Status StreamGate::finishDeferred(const Ticket& t) {
  RelaxedCapture relaxed;
  auto* slot = static_cast<Slot*>(t.slot);
  if (!slot->deferred || !slot->copiedIn) return Status::ok();
  cudaStream_t s = nullptr;
  C4_CHECK(impl_->workStream(&s));
  C4_CHECK(enqueueCopies(*slot, slot->out, false, s));
  return impl_->drainWork("copying a call's outputs to the device (cudaMemcpyAsync)");
}

}  // namespace c4::gpu
