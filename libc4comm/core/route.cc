// The router (core/route.hpp): Comm::submit, the one entry of every collective and point-to-point
// call from the API; Comm::route and Comm::choosePath, the rules in order.
#include "core/route.hpp"

#include <memory>
#include <vector>

#include "common/params.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/paths.hpp"
#include "core/progress.hpp"

namespace c4 {

C4_PARAM_INT(CudaPipelineBytes, "C4_CUDA_PIPELINE_BYTES", nullptr, 8 << 20, 0, INT64_C(1) << 40, kParamSameOnAllRanks,
             "A staged collective on device buffers moving at least twice this many bytes (counting every rank's "
             "block of a buffer holding one per rank) runs as "
             "pieces of about this size (at most 16), each its own call, so that one piece's copies between the "
             "device and host memory overlap another's network transfer; 0 stages every call whole")

void GroupQueue::add(Comm* comm, const OpDesc& op) {
  try {
    if (items.empty() || items.back().comm != comm) items.push_back(GroupItem{comm, {}});
    items.back().ops.push_back(op);
  } catch (...) {
    threw = true;  // the exception goes on to the caller (the C API turns it into an error)
    throw;
  }
}

Status Comm::route(const OpDesc& op, bool inGroup, Routing* r) const {
  // 1. Host memory, or no GPU in this process (one load where none is: the count is read once).
  r->route = Route::kHost;
  if (gpu::deviceCount() == 0) return Status::ok();
  StagedSide in, out;
  callExtents(op, rank, nranks, &in, &out);
  const gpu::PtrInfo ii = in.bytes ? gpu::pointerInfo(in.p) : gpu::PtrInfo{};
  const gpu::PtrInfo oi = out.bytes ? gpu::pointerInfo(out.p) : gpu::PtrInfo{};
  const bool inCuda = in.bytes && ii.mem != gpu::Mem::kHost, outCuda = out.bytes && oi.mem != gpu::Mem::kHost;
  if (!inCuda && !outCuda) return Status::ok();

  // 2. What the device path refuses.
  const char* fn = collName(op.coll);
  if ((in.bytes && !inCuda) || (out.bytes && !outCuda))
    return makeError(Code::kInvalidArgument,
                     "%s: sendbuff is %s memory and recvbuff is %s memory; a call's buffers must all be reachable by "
                     "the GPU (device or pinned host memory) or all be host memory",
                     fn, in.bytes ? gpu::memName(ii.mem) : "unused", out.bytes ? gpu::memName(oi.mem) : "unused");
  int device = -1;
  for (const gpu::PtrInfo* pi : {&ii, &oi}) {
    if (pi->mem != gpu::Mem::kDevice) continue;
    if (device >= 0 && pi->device != device)
      return makeError(Code::kInvalidArgument, "%s: sendbuff is on GPU %d and recvbuff on GPU %d", fn, ii.device,
                       oi.device);
    device = pi->device;
  }
  C4_CHECK(DevicePath::refuseCapture(op.stream, fn));
  if (static_cast<int>(op.op) >= kNumBuiltinOps) {
    const UserOp& u = userOps[static_cast<size_t>(static_cast<int>(op.op) - kNumBuiltinOps)];
    if (u.residence == ScalarResidence::kDevice && gpu::pointerInfo(u.pointer).mem == gpu::Mem::kDevice)
      return makeError(Code::kInvalidUsage,
                       "%s: a PreMulSum operator whose scalar is in device memory is not supported yet on device "
                       "buffers (docs/cuda.md); create it with ncclScalarHostImmediate",
                       fn);
  }
  r->bufferGpu = device;
  // The gate's GPU: the buffers'; for pinned host memory alone, the communicator's (or the buffer's).
  const gpu::PtrInfo& pinned = inCuda ? ii : oi;
  r->gateGpu = device >= 0 ? device : cudaDevice >= 0 ? cudaDevice : pinned.device >= 0 ? pinned.device : 0;
  r->inDevice = ii.mem == gpu::Mem::kDevice;
  r->outDevice = oi.mem == gpu::Mem::kDevice;

  // 3. Pieces. Every rank cuts a call alike (the settings agree, init checks), inside a group or not
  // (NCCL lets one rank wrap a call in a group where another does not); a call that may be deferred
  // is not cut.
  r->pieces = pipelinePieces(op, nranks, static_cast<size_t>(paramCudaPipelineBytes()), zeroCopy.mayDefer(op, false));
  if (r->pieces > 1) {
    r->route = Route::kDevicePipelined;
    return Status::ok();
  }
  // 4. Deferred: every rank on this host and device memory alone; the progress thread runs it on the
  // device buffers themselves (CUDA IPC), or copies them to the staging itself if some rank cannot
  // (gpu.hpp, "Deferred calls"; core/zerocopy.hpp). A group's calls are staged.
  r->plan = stagingPlanOf(op, rank, nranks, r->inDevice, r->outDevice);
  const bool defer = !inGroup && op.devicePitch == 0 && (r->plan.inStaged || !in.bytes) &&
                     (r->plan.outStaged || !out.bytes) && zeroCopy.mayDefer(op, r->plan.overlap);
  // 5. Staged whole.
  r->route = defer ? Route::kDeviceDeferred : Route::kDeviceStaged;
  return Status::ok();
}

Status Comm::submit(const OpDesc& op, GroupQueue* group) {
  // Rules 1-5. Without a GPU every call is a host call: one load, and no Routing built or destroyed.
  if (gpu::deviceCount() > 0) {
    Routing r;
    C4_CHECK(route(op, group != nullptr, &r));
    if (r.route != Route::kHost) return device.submit(op, r, group);
  }
  if (group) {
    group->add(this, op);
    return Status::ok();
  }
  const bool p2p = op.coll == Coll::kSend || op.coll == Coll::kRecv;
  if (engine) {
    // Blocking, with nothing queued: on this thread, as without a progress thread.
    Status st;
    if (config.blocking && engine->runInline([&] { return p2p ? runP2p({op}) : runCollective(op); }, &st)) return st;
    auto job = std::make_shared<Job>();
    job->ops.push_back(op);
    return queueJob(job);
  }
  BusyScope busy(this);
  return p2p ? runP2p({op}) : runCollective(op);
}

Status Comm::choosePath(const OpDesc& op, PreparedCall* p) {
  // 6. One-shot: small, every rank on this host, the arena serves it.
  if (oneShot.eligible(op)) {
    p->kind = PathKind::kOneShot;
    p->path = oneShotPath_.get();
    // A deferred call on device buffers runs on its staging: its inputs are copied there now.
    if (op.deferred) C4_CHECK(zeroCopy.stageLate(op));
  } else {
    // 7. Zero-copy where this rank's buffers are shareable; the message plan stays the fallback in
    // case a peer does not offer (ZeroCopyPath decides at start; a deferred call that does not
    // offer has its inputs staged by then).
    bool offered = false;
    C4_CHECK(zeroCopy.offer(op, p->sig, &offered));
    // 8. Messages.
    p->kind = offered ? PathKind::kZeroCopy : PathKind::kMessages;
    p->path = offered ? zeroCopyPath_.get() : messagePath_.get();
  }
  oneShot.announce(p->sig, p->kind == PathKind::kOneShot    ? CallMode::kOneShot
                           : p->kind != PathKind::kZeroCopy ? CallMode::kMessages
                           : op.deferred                    ? CallMode::kZeroCopyDevice
                                                            : CallMode::kZeroCopy);
  return Status::ok();
}

}  // namespace c4
