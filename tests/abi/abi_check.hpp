// What the ABI runtime tests (abi_allreduce.cc, abi_nccl_new.cc) share: failure counting per rank
// and the pipes that carry ids between the forked ranks. Include after the nccl.h under test.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

#include "common/fdio.hpp"

namespace abi {

inline int gRank = -1;     // the rank this process runs (-1: the parent)
inline int gFailures = 0;  // failed checks in this process

using c4::readAll;
using c4::writeAll;

}  // namespace abi

#define EXPECT(cond, ...)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "[rank %d] FAIL %s:%d: ", ::abi::gRank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                                \
      fprintf(stderr, "\n");                                                       \
      ++::abi::gFailures;                                                          \
    }                                                                              \
  } while (0)

/// Checks an NCCL call; on failure reports it and returns from the calling (void) function.
#define NCCL_OK(call)                                                                                       \
  do {                                                                                                      \
    ncclResult_t r_ = (call);                                                                               \
    if (r_ != ncclSuccess) {                                                                                \
      fprintf(stderr, "[rank %d] FAIL %s:%d: %s -> %d (%s): %s\n", ::abi::gRank, __FILE__, __LINE__, #call, \
              static_cast<int>(r_), ncclGetErrorString(r_), ncclGetLastError(nullptr));                     \
      ++::abi::gFailures;                                                                                   \
      return;                                                                                               \
    }                                                                                                       \
  } while (0)
