// The device path (core/device_path.hpp): staging, pieces and deferral of calls on CUDA memory.
#include "core/device_path.hpp"

#include <memory>
#include <utility>
#include <vector>

#include "common/params.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/memory.hpp"
#include "core/progress.hpp"

namespace c4 {

// Off by default: on the H100 host measured (docs/performance.md, "CUDA") it was as often slower as faster.
C4_PARAM_INT(CudaSharedStaging, "C4_CUDA_SHARED_STAGING", nullptr, 0, 0, 1, kParamNone,
             "Stage device buffers in shareable host memory registered with CUDA (1: calls staged on every rank "
             "of a host run on the zero-copy path) or in cudaHostAlloc memory (0, default)")

Status DevicePath::refuseCapture(void* stream, const char* fn) {
  if (!gpu::StreamGate::capturing(stream)) return Status::ok();
  return makeError(Code::kInvalidUsage,
                   "%s: the stream is being captured into a CUDA graph; c4comm calls on device memory cannot be "
                   "captured (their host side runs at the call, not at each replay; docs/cuda.md)",
                   fn);
}

Status DevicePath::ensureGate(int create, int buffers, const char* fn) {
  // Staged calls run on the progress thread (every communicator has one where GPUs are).
  if (!c_->engine)
    return makeError(Code::kInternalError, "%s: rank %d's communicator has no progress thread for device buffers", fn,
                     c_->rank);
  if (!gate_) {
    // Staging in shareable host memory (C4_CUDA_SHARED_STAGING=1): where every rank of a host stages
    // a call, it runs on the zero-copy path (docs/cuda.md).
    gpu::StreamGate::HostAllocator staging;
    if (paramCudaSharedStaging() != 0) {
      staging.alloc = [](void** p, size_t bytes) { return memAllocShared(p, bytes); };
      staging.free = [](void* p) { (void)memFreeShared(p); };
    }
    return gpu::StreamGate::create(create, staging, &gate_);
  }
  if (buffers >= 0 && buffers != gate_->device())
    return makeError(Code::kInvalidArgument,
                     "%s: the buffers are on GPU %d but rank %d's communicator works on GPU %d (its first call on "
                     "device buffers)",
                     fn, buffers, c_->rank, gate_->device());
  return Status::ok();
}

Status DevicePath::stage(OpDesc* op, const StagingPlan& plan, bool defer) {
  StagedSide in, out;
  callExtents(*op, c_->rank, c_->nranks, &in, &out);
  void* host = nullptr;
  C4_CHECK(gate_->stageInputs(op->stream, plan.bytes, plan.in, plan.out, &host, &op->staged, defer));
  if (defer) {
    op->deferred = true;
    op->deviceSend = in.bytes ? in.p : nullptr;
    op->deviceRecv = out.bytes ? const_cast<void*>(out.p) : nullptr;
  }
  char* h = static_cast<char*>(host);
  if (plan.inStaged) op->sendbuff = h + plan.inOff;
  if (plan.outStaged) op->recvbuff = h + plan.outOff;
  // Buffers this rank does not use (a non-root's) may be device pointers the host must not touch.
  if (!in.bytes && op->sendbuff && gpu::pointerInfo(op->sendbuff).mem == gpu::Mem::kDevice) op->sendbuff = nullptr;
  if (!out.bytes && op->recvbuff && gpu::pointerInfo(op->recvbuff).mem == gpu::Mem::kDevice) op->recvbuff = nullptr;
  return Status::ok();
}

Status DevicePath::submit(const OpDesc& callOp, const Routing& r, GroupQueue* group) {
  C4_CHECK(ensureGate(r.gateGpu, r.bufferGpu, collName(callOp.coll)));
  if (r.route == Route::kDevicePipelined) return submitPieces(callOp, r, group);
  std::vector<OpDesc> ops(1, callOp);
  C4_CHECK(stage(&ops[0], r.plan, r.route == Route::kDeviceDeferred));
  if (group) {
    try {
      group->add(c_, ops[0]);  // step 2 at groupEnd
    } catch (...) {
      gate_->cancel(ops[0].staged);
      throw;
    }
    return Status::ok();
  }
  return queueStaged(&ops);
}

Status DevicePath::submitPieces(const OpDesc& callOp, const Routing& r, GroupQueue* group) {
  // Every piece's inputs are copied on the stream first, then each piece's wait and copies back;
  // each piece is its own job, so the stream copies piece i back while the progress thread runs
  // piece i + 1 and the stream still copies later pieces' inputs. Inside a group the pieces join it
  // as calls of their own (step 2 at groupEnd, like any call there: the same cut, without the
  // overlap).
  std::vector<OpDesc> ops;
  ops.reserve(r.pieces);
  Status st;
  for (size_t i = 0; i < r.pieces && st.isOk(); ++i) {
    ops.push_back(pieceOf(callOp, i, r.pieces));
    OpDesc& piece = ops.back();
    st = stage(&piece, stagingPlanOf(piece, c_->rank, c_->nranks, r.inDevice, r.outDevice), false);
    if (!st.isOk()) ops.pop_back();
  }
  if (!st.isOk()) {
    cancel(ops);
    return st;
  }
  if (!group) return queueStaged(&ops);
  size_t added = 0;
  try {
    for (const OpDesc& op : ops) {
      group->add(c_, op);
      ++added;
    }
  } catch (...) {
    for (size_t i = added; i < ops.size(); ++i) gate_->cancel(ops[i].staged);
    throw;
  }
  return Status::ok();
}

Status DevicePath::queueStaged(std::vector<OpDesc>* ops) {
  for (size_t i = 0; i < ops->size(); ++i) {
    auto job = std::make_shared<Job>();
    job->ops.push_back((*ops)[i]);
    Status st = finishStaging(&job->ops);
    if (!st.isOk()) {
      // The communicator failed (finishStaging says so): the calls not yet handed over go too.
      for (size_t j = i + 1; j < ops->size(); ++j) gate_->cancel((*ops)[j].staged);
      return st;
    }
    c_->engine->submit(job);
  }
  return Status::ok();
}

Status DevicePath::finishStaging(std::vector<OpDesc>* ops) {
  Status first;
  for (OpDesc& op : *ops) {
    if (op.staged.slot == nullptr || op.staged.seq != 0) continue;
    if (!first.isOk()) {
      gate_->cancel(op.staged);
      op.staged = {};
      continue;
    }
    Status st = gate_->stageOutputs(&op.staged);
    if (st.isOk()) continue;
    if (op.staged.seq != 0) {
      gate_->complete(op.staged);
    } else {
      gate_->cancel(op.staged);
    }
    op.staged = {};
    first = c_->fail(st);
  }
  return first;
}

void DevicePath::cancel(const std::vector<OpDesc>& ops) {
  for (const OpDesc& op : ops)
    if (op.staged.slot != nullptr && op.staged.seq == 0) gate_->cancel(op.staged);
}

Status DevicePath::submitOneSided(void* stream, const void* src, size_t stageBytes,
                                  std::function<Status(const void* staged)> run) {
  std::vector<gpu::StreamGate::Copy> in;
  if (stageBytes > 0) in.push_back({const_cast<void*>(src), 0, stageBytes});
  void* host = nullptr;
  gpu::StreamGate::Ticket t;
  C4_CHECK(gate_->stageInputs(stream, stageBytes, in, {}, &host, &t, /*deferred=*/stageBytes == 0));
  // Step 2 as for any staged call (its failure completes or cancels the ticket, fails the communicator).
  std::vector<OpDesc> step2(1);
  step2[0].staged = t;
  C4_CHECK(finishStaging(&step2));
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kCall;
  const void* staged = stageBytes > 0 ? host : nullptr;
  job->call = [run = std::move(run), staged] { return run(staged); };
  job->tickets.push_back(step2[0].staged);
  c_->engine->submit(job);
  return Status::ok();
}

Status DevicePath::finishDeferred(const std::vector<gpu::StreamGate::Ticket>& tickets) {
  for (const gpu::StreamGate::Ticket& t : tickets) C4_CHECK(gate_->finishDeferred(t));
  return Status::ok();
}

void DevicePath::release(const std::vector<gpu::StreamGate::Ticket>& tickets) {
  for (const gpu::StreamGate::Ticket& t : tickets) gate_->complete(t);
}

}  // namespace c4
