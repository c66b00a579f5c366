// How a call on device buffers is staged through pinned host memory (core/device_path.hpp):
// where each buffer goes in the call's staging slot and which copies the stream makes, and how a
// large call is cut into pipelined pieces (docs/cuda.md, "Pipelined staging"). Pure functions of
// the call, so that every rank computes the same cut, and so that the layout is tested on a host
// without a GPU (tests/coll/staging_test.cc).
#pragma once

#include <cstddef>
#include <vector>

#include "core/opdesc.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

/// Staging slots are cut at this alignment.
constexpr size_t kStagingAlign = 256;

/// One side of a call as this rank uses it: its buffer and bytes (0: unused here), and whether it is
/// device memory (staged) or memory the host reads as it is (pinned host memory).
struct StagedSide {
  const void* p = nullptr;
  size_t bytes = 0;
  bool device = false;
};

/// What rank `rank` of `nranks` reads from sendbuff (*in) and writes to recvbuff (*out) in `op`
/// (bytes 0, pointer null: that buffer is not used at this rank, a non-root's).
void callExtents(const OpDesc& op, int rank, int nranks, StagedSide* in, StagedSide* out);

/// Where a staged call's buffers lie in its slot, and the stream's copies.
struct StagingPlan {
  size_t bytes = 0;        ///< the slot's size
  bool inStaged = false;   ///< the input is copied into the slot, at inOff
  bool outStaged = false;  ///< the output is copied back from the slot, at outOff
  size_t inOff = 0, outOff = 0;
  bool overlap = false;  ///< device input and output overlap (in place): one staged range
  std::vector<gpu::StreamGate::Copy> in, out;
};

/// The layout of `op` (op.devicePitch: a pipelined piece, see pieceOf) for rank `rank` of `nranks`.
/// Device extents that overlap (in place) share one staged range, so the call stays in place. A
/// piece of an AllGather or Gather (ReduceScatter or Scatter; AlltoAll: both) holds a slice of every
/// rank's block of its output (input): that side is staged as rows, even from pinned memory, which
/// the host path would take as contiguous.
StagingPlan planStaging(const OpDesc& op, int rank, int nranks, const StagedSide& in, const StagedSide& out);

/// planStaging of `op` for the buffers this rank uses in it (callExtents), whose input / output is
/// device memory (`inDevice`, `outDevice`; else pinned host memory).
StagingPlan stagingPlanOf(const OpDesc& op, int rank, int nranks, bool inDevice, bool outDevice);

/// How many pieces a collective on device buffers is staged in: 1 unless it moves at least twice
/// `pieceBytes` (0: never cut; counting every rank's block of an AllGather, ReduceScatter, AlltoAll,
/// Gather or Scatter) and is not `deferrable` (to the device zero-copy path); at most 16, each with
/// at least one 256-byte unit of each rank's block. Send/recv are not cut. Depends only on the call
/// and settings every rank shares.
size_t pipelinePieces(const OpDesc& op, int nranks, size_t pieceBytes, bool deferrable);

/// Piece i of n of a call: elements [b, e) of count, cut at 256-byte multiples. AllReduce, Broadcast
/// and Reduce: those elements of each buffer. The others: those of each rank's block of a buffer
/// that holds one per rank (AllGather's and Gather's output, ReduceScatter's and Scatter's input,
/// both of AlltoAll; devicePitch is the blocks' distance) and of the other buffer.
OpDesc pieceOf(const OpDesc& op, size_t i, size_t n);

}  // namespace c4
