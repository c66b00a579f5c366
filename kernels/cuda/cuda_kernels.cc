// kernels/cuda's public entry points: argument checks, then the launchers of device_kernels.cu.
#include "kernels/cuda/cuda_kernels.hpp"

#include <cuda_runtime_api.h>

#include "common/logging.hpp"
#include "kernels/cuda/launch.hpp"

namespace c4::kernels::cuda {
namespace {

bool validType(DataType dt, const char* what) {
  if (isValidDataType(static_cast<int>(dt))) return true;
  C4_WARN(kLogColl, "kernels::cuda::%s: invalid data type %d (expected 0..%d); nothing done", what,
          static_cast<int>(dt), kNumDataTypes - 1);
  return false;
}

bool validOp(KOp op) {
  const int o = static_cast<int>(op);
  if (o >= 0 && o < 4) return true;
  C4_WARN(kLogColl, "kernels::cuda::reduce: invalid op %d (expected 0..3); nothing done", o);
  return false;
}

cudaStream_t streamOf(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

Err reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, KOp op, void* stream) {
  return reduceCopy(dst, nullptr, a, b, count, dt, op, stream);
}

Err reduceCopy(void* dst0, void* dst1, const void* a, const void* b, size_t count, DataType dt, KOp op, void* stream) {
  if (count == 0) return kOk;
  if (!validType(dt, "reduce") || !validOp(op)) return cudaErrorInvalidValue;
  return detail::launchReduce(dst0, dst1, a, b, count, static_cast<int>(dt), static_cast<int>(op), streamOf(stream));
}

Err scale(void* dst, const void* src, const void* scalar, size_t count, DataType dt, void* stream) {
  if (count == 0) return kOk;
  if (!validType(dt, "scale")) return cudaErrorInvalidValue;
  if (scalar == nullptr) {
    C4_WARN(kLogColl, "kernels::cuda::scale: no scalar; nothing done");
    return cudaErrorInvalidValue;
  }
  return detail::launchScale(dst, src, scalar, count, static_cast<int>(dt), streamOf(stream));
}

Err divide(void* dst, const void* src, size_t count, DataType dt, int divisor, void* stream) {
  if (count == 0) return kOk;
  if (!validType(dt, "divide")) return cudaErrorInvalidValue;
  if (divisor == 0 && !isFloatType(dt)) {
    // As the host kernel: no trap on a bad divisor; report it and leave the values undivided.
    C4_WARN(kLogColl, "integer divide by zero in kernels::cuda::divide (%zu elements left undivided)", count);
    return dst == src ? kOk : copy(dst, src, count * dataTypeSize(dt), stream);
  }
  return detail::launchDivide(dst, src, count, static_cast<int>(dt), divisor, streamOf(stream));
}

Err copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return kOk;
  return detail::launchCopy(dst, src, bytes, streamOf(stream));
}

Err waitFlag(const volatile unsigned* flag, unsigned value, void* stream) {
  return detail::launchWaitFlag(flag, value, streamOf(stream));
}

const char* errorString(Err e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" / "no driver" error
    return 0;
  }
  return n;
}

}  // namespace c4::kernels::cuda
