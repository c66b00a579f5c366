// libc4comm/gpu without CUDA: every buffer is host memory; device work is refused.
#include "common/status.hpp"
#include "gpu/gpu.hpp"

namespace c4::gpu {

struct StreamGate::Impl {};

const char* memName(Mem m) { return m == Mem::kDevice ? "device" : m == Mem::kPinned ? "pinned host" : "host"; }
bool built() { return false; }
int deviceCount() { return 0; }
int currentDevice() { return -1; }
PtrInfo pointerInfo(const void*) { return PtrInfo{}; }
Status deviceAlloc(void**, size_t) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA: no device memory");
}
Status deviceFree(void*) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA: no device memory");
}
bool ipcExport(const void*, size_t, IpcRef*) { return false; }

StreamGate::StreamGate(int device, std::unique_ptr<Impl> impl) : device_(device), impl_(std::move(impl)) {}
StreamGate::~StreamGate() = default;

Status StreamGate::create(int, const HostAllocator&, std::unique_ptr<StreamGate>*) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA: device buffers are not supported");
}
Status StreamGate::stageInputs(void*, size_t, const std::vector<Copy>&, const std::vector<Copy>&, void**, Ticket*,
                               bool) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
Status StreamGate::stageOutputs(Ticket*) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
void StreamGate::cancel(const Ticket&) {}
Status StreamGate::inputsReady(const Ticket&, bool* ready) {
  *ready = true;
  return Status::ok();
}
void StreamGate::complete(const Ticket&) {}
Status StreamGate::waitFlag(void*, Flag*) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
void StreamGate::setFlag(const Flag&) {}
bool StreamGate::flagReached(const Flag&) const { return true; }
bool StreamGate::deferred(const Ticket&) const { return false; }
Status StreamGate::copyInputsNow(const Ticket&) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
Status StreamGate::finishDeferred(const Ticket&) { return Status::ok(); }
void StreamGate::ipcCloseRegistered(int) {}
Status StreamGate::ipcOpen(int, const IpcRef&, size_t, char**, bool) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
Status StreamGate::peerAccess(int) { return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA"); }
void StreamGate::ipcTrim() {}
Status StreamGate::copySync(void*, const void*, size_t) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
Status StreamGate::runZeroCopy(const DeviceWork&) {
  return makeError(Code::kInvalidUsage, "this c4comm was built without CUDA");
}
bool StreamGate::capturing(void*) { return false; }
const char* StreamGate::waitKind() const { return "none"; }

}  // namespace c4::gpu
