// The launchers device_kernels.cu defines, behind the checks of cuda_kernels.cc. Private to
// kernels/cuda. Arguments are already valid (dtype and op in range, count > 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace c4::kernels::cuda::detail {

cudaError_t launchReduce(void* dst0, void* dst1, const void* a, const void* b, size_t count, int dt, int op,
                         cudaStream_t stream);
cudaError_t launchScale(void* dst, const void* src, const void* scalar, size_t count, int dt, cudaStream_t stream);
cudaError_t launchDivide(void* dst, const void* src, size_t count, int dt, int divisor, cudaStream_t stream);
cudaError_t launchCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream);
cudaError_t launchWaitFlag(const volatile unsigned* flag, unsigned value, cudaStream_t stream);

}  // namespace c4::kernels::cuda::detail
