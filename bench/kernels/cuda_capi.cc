// A C entry point to kernels/cuda for bench/kernels/cuda_kernels_bench.py (ctypes), so that the
// benchmark times our kernels and torch's on the same tensors, streams and card in one process.
#include <cstddef>

#include "c4comm/types.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

extern "C" {

__attribute__((visibility("default"))) int c4_bench_cuda_reduce(void* dst0, void* dst1, const void* a, const void* b,
                                                                size_t count, int dt, int op, void* stream) {
  return c4::kernels::cuda::reduceCopy(dst0, dst1, a, b, count, static_cast<c4::DataType>(dt),
                                       static_cast<c4::kernels::KOp>(op), stream);
}

__attribute__((visibility("default"))) int c4_bench_cuda_copy(void* dst, const void* src, size_t bytes, void* stream) {
  return c4::kernels::cuda::copy(dst, src, bytes, stream);
}

__attribute__((visibility("default"))) const char* c4_bench_cuda_error(int e) {
  return c4::kernels::cuda::errorString(e);
}
}
