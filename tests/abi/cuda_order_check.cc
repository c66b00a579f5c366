// Our nccl.h must coexist with the CUDA runtime headers in either order: cudaStream_t is declared
// once by whichever comes first, as the same type. Compile-only (part of abi_layout).
#ifdef C4_CUDA_FIRST
#include <cuda_runtime.h>
#include C4_OUR_NCCL_H
#else
#include C4_OUR_NCCL_H
#include <cuda_runtime.h>
#endif

#include <type_traits>

static_assert(std::is_same<cudaStream_t, CUstream_st*>::value, "cudaStream_t must be CUstream_st*");
static_assert(std::is_same<decltype(&ncclAllReduce), ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t,
                                                                      ncclRedOp_t, ncclComm_t, cudaStream_t)>::value,
              "ncclAllReduce must take a cudaStream_t");
