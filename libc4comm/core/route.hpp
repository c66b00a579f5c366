// The router: how every call runs, decided in one place (core/route.cc) by rules read in order.
//
// A call's route is decided in two steps, because its facts become known at two times:
//  - At the call, on the caller's thread (Comm::route, from Comm::submit): where its buffers are.
//     1. Host memory (or no GPU in this process): the host route. Inside a group the call waits
//        for groupEnd; with a progress thread it is a job there (blocking calls with nothing queued
//        run inline); else the caller's thread drives it.
//     2. CUDA memory (device, or pinned host memory) mixed with host memory, on two GPUs, on a
//        stream being captured, or with a PreMulSum scalar in device memory: refused.
//     3. CUDA memory moving at least twice C4_CUDA_PIPELINE_BYTES, that could not be deferred:
//        pipelined, cut into pieces staged as calls of their own (core/staging.hpp).
//     4. CUDA memory, outside a group, every rank on this host and the collective one the device
//        zero-copy path runs: deferred (the progress thread runs it on the device buffers through
//        CUDA IPC, or stages it late where a rank cannot).
//     5. Other CUDA memory: staged whole through pinned host memory in the stream's order.
//     Routes 3-5 are the device path (core/device_path.hpp): the staged call then runs on the
//     progress thread on one of the paths below, like a host call.
//  - When the call starts on the driving thread (Comm::choosePath, from prepareCollective): which
//    path runs it (core/paths.hpp).
//     6. Small enough for the one-shot arena (every rank on this host): one-shot.
//     7. This rank's buffers are shareable (ncclMemAlloc, or a deferred call's device buffers):
//        zero-copy, offered to the peers; where one does not offer, every rank runs the call on
//        messages instead (ZeroCopyPath, at start) and a deferred call is staged after all
//        (DevicePath::finishDeferred copies its outputs back).
//     8. Else messages: the executor over the transports, with the tuner's algorithm and chunk.
//    Point-to-point batches always run on messages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/staging.hpp"

namespace c4 {

/// Where a call goes at submission (rules 1-5 above).
enum class Route : uint8_t {
  kHost,             ///< host buffers: the driving thread prepares and runs it
  kDevicePipelined,  ///< CUDA memory, cut into pieces, each staged
  kDeviceDeferred,   ///< CUDA memory, run on the device buffers by the progress thread where it can
  kDeviceStaged,     ///< CUDA memory, staged whole through pinned host memory
};

/// The router's decision for one call, with what the device path needs to carry it out.
struct Routing {
  Route route = Route::kHost;
  int gateGpu = -1;        ///< device routes: the GPU whose StreamGate stages the call
  int bufferGpu = -1;      ///< the GPU of its device buffers (-1: pinned host memory alone)
  bool inDevice = false;   ///< the input this rank reads is device memory (else pinned host memory)
  bool outDevice = false;  ///< the same for the output
  size_t pieces = 1;       ///< kDevicePipelined: how many
  StagingPlan plan;        ///< kDeviceStaged, kDeviceDeferred: the staging slot's layout
};

}  // namespace c4
