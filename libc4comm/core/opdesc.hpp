// One call as the user made it (shared by the communicator and its paths).
#pragma once

#include <cstddef>

#include "c4comm/types.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

/// One call as the user made it, validated.
struct OpDesc {
  Coll coll = Coll::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;  // root for rooted collectives, peer for Send/Recv
  /// The caller's stream (cudaStream_t; host calls ignore it), where device-memory calls will be
  /// ordered.
  void* stream = nullptr;
  /// The operation's sequence number on its communicator (collectives: OpSig::seq; point-to-point:
  /// per peer and direction), set when it is prepared.
  uint64_t seq = 0;
  /// A call on device buffers, staged (libc4comm/gpu/gpu.hpp): the buffers above are the pinned host
  /// staging, and the caller's stream waits for this ticket. No slot: an ordinary host call.
  gpu::StreamGate::Ticket staged{};
  /// A deferred staged call (gpu.hpp): its device buffers (null where this rank uses none), which
  /// the device zero-copy path reads and writes in place of the staging above.
  bool deferred = false;
  const void* deviceSend = nullptr;
  void* deviceRecv = nullptr;
  /// A pipelined piece on device memory of a collective whose buffer holds a block per rank
  /// (AllGather, Gather: the output; ReduceScatter, Scatter: the input; AlltoAll: both;
  /// core/staging.hpp, pieceOf): that buffer holds the piece's slice of every rank's block, blocks
  /// this many bytes apart. 0: the buffers are contiguous.
  size_t devicePitch = 0;
};

/// The bytes a collective moves as nccl-tests counts them (its size): the whole gathered or
/// scattered buffer for the collectives with a block per rank, the buffer otherwise.
inline size_t nominalBytes(const OpDesc& op, int nranks) {
  const size_t es = dataTypeSize(op.dtype);
  switch (op.coll) {
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
    case Coll::kGather:
    case Coll::kScatter:
      return op.count * es * static_cast<size_t>(nranks);
    default:
      return op.count * es;
  }
}

}  // namespace c4
