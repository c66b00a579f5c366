// The device zero-copy path (gpu.hpp, "Deferred calls"; docs/cuda.md, "CUDA IPC"): device
// allocations exported and opened with CUDA IPC, and one rank's share of a call as kernels that
// read and write every rank's buffers in place. Which rank does what is core/zerocopy.cc's rule for
// host memory, so that both paths compute the same results in the same order.
#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>

#include "c4comm/types.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "gpu/gate_impl.hpp"
#include "gpu/gpu.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace c4 {
C4_PARAM_INT(CudaIpcCache, "C4_CUDA_IPC_CACHE", nullptr, 0, 0, 4096, kParamNone,
             "Peers' device allocations a communicator keeps mapped (CUDA IPC) between calls; 0 (default) maps "
             "them for each call and closes them after it. More saves the mapping on repeated buffers, but then a "
             "rank must not cudaFree a buffer it used in a call until every peer closed it (CUDA: undefined "
             "behaviour), which holds for buffers that live as long as the communicator")
}  // namespace c4

namespace c4::gpu {

using namespace detail;

Status deviceAlloc(void** p, size_t bytes) {
  if (deviceCount() == 0) return makeError(Code::kInvalidUsage, "CUDA: no GPU is usable in this process");
  RelaxedCapture relaxed;
  C4_CUDA_TRY(cudaMalloc(p, bytes));
  return Status::ok();
}

Status deviceFree(void* p) {
  if (deviceCount() == 0) return makeError(Code::kInvalidUsage, "CUDA: no GPU is usable in this process");
  RelaxedCapture relaxed;
  C4_CUDA_TRY(cudaFree(p));
  return Status::ok();
}

namespace {

/// The handles this process made, by allocation id (ids are never reused, so an entry never goes
/// stale; the oldest go first).
class ExportCache {
 public:
  bool find(uint64_t id, unsigned char* handle) {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->id != id) continue;
      memcpy(handle, it->handle, sizeof it->handle);
      entries_.splice(entries_.begin(), entries_, it);
      return true;
    }
    return false;
  }
  void add(uint64_t id, const unsigned char* handle) {
    std::lock_guard<std::mutex> g(mu_);
    entries_.push_front(Entry{id, {}});
    memcpy(entries_.front().handle, handle, sizeof entries_.front().handle);
    if (entries_.size() > kCapacity) entries_.pop_back();
  }

 private:
  static constexpr size_t kCapacity = 256;
  struct Entry {
    uint64_t id;
    unsigned char handle[64];
  };
  std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
};

ExportCache& exportCache() {
  static ExportCache* c = new ExportCache;  // never destroyed: exports may run during exit
  return *c;
}

}  // namespace

bool ipcExport(const void* p, size_t len, IpcRef* ref) {
  const Driver& d = driver();
  if (d.devices == 0 || d.pointerGetAttributes == nullptr || p == nullptr) return false;
  unsigned memType = 0, isManaged = 0, ipcCapable = 0;
  unsigned long long id = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  int ordinal = -1;
  CUpointer_attribute attrs[7] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[7] = {&memType, &isManaged, &ipcCapable, &id, &start, &size, &ordinal};
  if (d.pointerGetAttributes(7, attrs, data, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
  if (memType != CU_MEMORYTYPE_DEVICE || isManaged || !ipcCapable || id == 0 || start == 0) return false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (at < start || len > size || at - start > size - len) return false;
  ref->id = id;
  ref->off = at - start;
  if (exportCache().find(id, ref->handle)) return true;
  RelaxedCapture relaxed;
  DeviceScope scope(ordinal);
  cudaIpcMemHandle_t h;
  const cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(start));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    C4_INFO(kLogColl, "CUDA: cannot export the allocation at %p for IPC (%s); its calls are staged", p,
            cudaGetErrorString(e));
    return false;
  }
  static_assert(sizeof h == sizeof ref->handle, "cudaIpcMemHandle_t is 64 bytes");
  memcpy(ref->handle, &h, sizeof h);
  exportCache().add(id, ref->handle);
  return true;
}

Status StreamGate::ipcOpen(int peer, const IpcRef& ref, size_t len, char** out, bool registered) {
  RelaxedCapture relaxed;
  Impl& im = *impl_;
  cudaStream_t s = nullptr;
  C4_CHECK(im.workStream(&s));  // makes the gate's GPU current on this thread
  for (auto it = im.maps.begin(); it != im.maps.end(); ++it) {
    if (it->peer != peer || it->id != ref.id) continue;
    it->registered |= registered;
    im.maps.splice(im.maps.begin(), im.maps, it);
    *out = it->base + ref.off;
    return Status::ok();
  }
  cudaIpcMemHandle_t h;
  memcpy(&h, ref.handle, sizeof h);
  void* base = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess)
    return makeError(Code::kUnhandledCudaError, "CUDA: cannot open rank %d's device buffer on GPU %d (%s: %s)", peer,
                     device_, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)len;  // the exporter checked that the buffer lies inside its allocation
  im.maps.push_front(IpcMap{peer, ref.id, static_cast<char*>(base), registered});
  *out = static_cast<char*>(base) + ref.off;
  return Status::ok();
}

Status StreamGate::peerAccess(int device) {
  if (device == device_) return Status::ok();
  RelaxedCapture relaxed;
  cudaStream_t s = nullptr;
  C4_CHECK(impl_->workStream(&s));  // makes the gate's GPU current on this thread
  int can = 0;
  C4_CUDA_TRY(cudaDeviceCanAccessPeer(&can, device_, device));
  if (!can) return makeError(Code::kInvalidUsage, "CUDA: GPU %d cannot access GPU %d's memory", device_, device);
  const cudaError_t e = cudaDeviceEnablePeerAccess(device, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return Status::ok();
  }
  C4_CUDA_TRY(e);
  return Status::ok();
}

namespace {
/// Closes the mappings `drop` picks, once this process's device work on them is done.
template <typename Pred>
void closeMaps(StreamGate::Impl& im, int device, Pred drop) {
  RelaxedCapture relaxed;
  DeviceScope scope(device);  // also from a thread other than the progress thread (commDeregister)
  bool synced = false;
  for (auto it = im.maps.begin(); it != im.maps.end();) {
    if (!drop(*it)) {
      ++it;
      continue;
    }
    if (!synced && im.work != nullptr) (void)cudaStreamSynchronize(im.work);  // nothing of ours still reads it
    synced = true;
    (void)cudaIpcCloseMemHandle(it->base);
    it = im.maps.erase(it);
  }
  (void)cudaGetLastError();
}
}  // namespace

void StreamGate::ipcTrim() {
  // Registered buffers stay; of the others, the C4_CUDA_IPC_CACHE most recently used.
  size_t kept = 0;
  const size_t keep = static_cast<size_t>(paramCudaIpcCache());
  closeMaps(*impl_, device_, [&](const IpcMap& m) { return !m.registered && ++kept > keep; });
}

void StreamGate::ipcCloseRegistered(int peer) {
  closeMaps(*impl_, device_, [&](const IpcMap& m) { return m.registered && (peer < 0 || m.peer == peer); });
}

namespace {

/// Kernel launches of one call; the first error is kept.
struct Launcher {
  cudaStream_t s;
  DataType dt;
  kernels::KOp op;
  kernels::cuda::Err err = kernels::cuda::kOk;
  void reduce(void* dst, const void* a, const void* b, size_t n) {
    if (err == kernels::cuda::kOk) err = kernels::cuda::reduce(dst, a, b, n, dt, op, s);
  }
  void reduceCopy(void* d0, void* d1, const void* a, const void* b, size_t n) {
    if (err == kernels::cuda::kOk) err = kernels::cuda::reduceCopy(d0, d1, a, b, n, dt, op, s);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (err == kernels::cuda::kOk && dst != src) err = kernels::cuda::copy(dst, src, bytes, s);
  }
};

}  // namespace

Status StreamGate::runZeroCopy(const DeviceWork& w) {
  RelaxedCapture relaxed;
  Impl& im = *impl_;
  cudaStream_t s = nullptr;
  C4_CHECK(im.workStream(&s));
  const auto dt = static_cast<DataType>(w.dtype);
  const size_t es = dataTypeSize(dt);
  const size_t n = static_cast<size_t>(w.nranks), me = static_cast<size_t>(w.rank), root = static_cast<size_t>(w.root);
  const size_t bytes = w.count * es;
  (void)cudaGetLastError();  // nothing earlier on this thread is taken for a launch failure below
  Launcher k{s, dt, static_cast<kernels::KOp>(w.op)};
  // acc = every rank's input from byte `at`, `cnt` elements, starting with our own and then rank
  // `first` (as core/zerocopy.cc), so that acc may be our own input (in place).
  const size_t first = me == 0 ? 1 : 0;
  auto reduceAll = [&](char* acc, size_t at, size_t cnt) {
    k.reduce(acc, w.in[me] + at, w.in[first] + at, cnt);
    for (size_t r = 0; r < n; ++r)
      if (r != me && r != first) k.reduce(acc, acc, w.in[r] + at, cnt);
  };
  switch (static_cast<Coll>(w.coll)) {
    case Coll::kAllReduce: {
      // Our slice of every input, reduced into our output and into every peer's.
      const size_t off = w.sliceBegin * es, cnt = w.sliceEnd - w.sliceBegin;
      if (cnt == 0) break;
      if (n == 2) {
        // One pass: read both inputs, write both outputs (the least memory traffic there is).
        const size_t peer = 1 - me;
        k.reduceCopy(w.out[me] + off, w.out[peer] + off, w.in[me] + off, w.in[peer] + off, cnt);
        break;
      }
      reduceAll(w.out[me] + off, off, cnt);
      for (size_t r = 0; r < n; ++r)
        if (r != me) k.copy(w.out[r] + off, w.out[me] + off, cnt * es);
      break;
    }
    case Coll::kReduce: {
      const size_t off = w.sliceBegin * es, cnt = w.sliceEnd - w.sliceBegin;
      if (cnt == 0) break;
      if (me == root) {
        reduceAll(w.out[me] + off, off, cnt);
        break;
      }
      // In place the root's output is its input, which the sum still reads: reduce aside, then copy.
      // Stream-ordered: cudaFree/cudaMalloc would synchronize the device, whose streams may wait
      // right now for a ticket only this thread completes.
      if (im.tempBytes < cnt * es) {
        if (im.temp != nullptr) (void)cudaFreeAsync(im.temp, s);
        im.temp = nullptr;
        im.tempBytes = 0;
        const cudaError_t e = cudaMallocAsync(&im.temp, cnt * es, s);
        if (e != cudaSuccess) {
          im.temp = nullptr;
          (void)im.drainWork("a zero-copy kernel");
          return makeError(Code::kUnhandledCudaError, "CUDA: no device scratch of %zu bytes for a Reduce: %s", cnt * es,
                           cudaGetErrorString(e));
        }
        im.tempBytes = cnt * es;
      }
      char* acc = static_cast<char*>(im.temp);
      reduceAll(acc, off, cnt);
      k.copy(w.out[root] + off, acc, cnt * es);
      break;
    }
    case Coll::kReduceScatter:
      // Our block of every input into our output (in place it is our input's own block).
      if (w.count > 0) reduceAll(w.out[me], me * bytes, w.count);
      break;
    case Coll::kAllGather:
      for (size_t r = 0; r < n; ++r) k.copy(w.out[me] + r * bytes, w.in[r], bytes);
      break;
    case Coll::kBroadcast:
      k.copy(w.out[me], w.in[root], bytes);
      break;
    case Coll::kAlltoAll:
      // Out of place only (the caller's rule): pull our block from every input.
      for (size_t r = 0; r < n; ++r) k.copy(w.out[me] + r * bytes, w.in[r] + me * bytes, bytes);
      break;
    case Coll::kGather:
      k.copy(w.out[root] + me * bytes, w.in[me], bytes);
      break;
    case Coll::kScatter:
      k.copy(w.out[me], w.in[root] + me * bytes, bytes);
      break;
    default:
      return makeError(Code::kInternalError, "CUDA: collective %d has no device zero-copy form", w.coll);
  }
  // Whatever went wrong, the kernels already launched finish before this returns: the call's
  // buffers (ours and the peers') are not touched after it.
  Status drained = im.drainWork("a zero-copy kernel");
  if (k.err != kernels::cuda::kOk)
    return makeError(Code::kUnhandledCudaError, "CUDA: a zero-copy kernel failed to launch: %s",
                     kernels::cuda::errorString(k.err));
  return drained;
}

}  // namespace c4::gpu
