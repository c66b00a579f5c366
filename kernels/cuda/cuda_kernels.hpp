// Reduction and copy kernels on CUDA device memory (kernels/cuda): the same (dtype, op) table as
// the host kernels (kernels/host/reduce.hpp), with the same element arithmetic
// (kernels/arith/elementwise.hpp), so the results match the host's bit for bit.
//
// Every function enqueues one kernel on `stream` (a cudaStream_t; null is the legacy default
// stream) and returns at once; the pointers must be device memory (or memory the device can reach:
// managed, mapped pinned host memory) of the current device. No alignment is needed: where every
// pointer has the same offset from a 16-byte boundary the body moves in 16-byte accesses, else
// element by element. dst may alias a source exactly (not partially overlap). count == 0 enqueues
// nothing. The functions return a CUDA runtime error code (cudaError_t; 0 is success) and log a
// warning for invalid arguments (cudaErrorInvalidValue).
//
// This header needs no CUDA headers; the library links the CUDA runtime statically, which loads the
// driver (libcuda.so.1) at first use, so a host without a GPU runs it and deviceCount() says 0.
#pragma once

#include <cstddef>

#include "c4comm/types.hpp"
#include "kernels/host/reduce.hpp"

namespace c4::kernels::cuda {

/// A cudaError_t value.
using Err = int;
constexpr Err kOk = 0;

/// dst[i] = a[i] op b[i].
Err reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, KOp op, void* stream);

/// dst0[i] = dst1[i] = a[i] op b[i] in one pass: a ring step that reduces into the output and into
/// the buffer the next step sends from. dst1 may be null (then as reduce).
Err reduceCopy(void* dst0, void* dst1, const void* a, const void* b, size_t count, DataType dt, KOp op, void* stream);

/// dst[i] = src[i] * scalar; scalar is one element of dt in host memory, read at the call.
Err scale(void* dst, const void* src, const void* scalar, size_t count, DataType dt, void* stream);

/// dst[i] = src[i] / divisor, as kernels::divide (ncclAvg). An integer divisor of 0 logs a warning
/// and copies src unchanged.
Err divide(void* dst, const void* src, size_t count, DataType dt, int divisor, void* stream);

/// dst = src, bytes bytes, with 16-byte accesses where dst and src share their offset from a
/// 16-byte boundary, else through cudaMemcpyAsync (device to device).
Err copy(void* dst, const void* src, size_t bytes, void* stream);

/// Enqueues a wait on `stream` until (int32_t)(*flag - value) >= 0, *flag being host memory the
/// device can read (pinned and mapped) that another thread advances: one thread of one block polls
/// it (with __nanosleep back-off). The fallback of stream memory operations (cuStreamWaitValue32)
/// where the driver has none.
Err waitFlag(const volatile unsigned* flag, unsigned value, void* stream);

/// The CUDA runtime's text for an error code.
const char* errorString(Err e);

/// GPUs this process can use; 0 when there is no driver or no GPU (never fails).
int deviceCount();

}  // namespace c4::kernels::cuda
