// The jobs a communicator's progress thread runs (core/progress.hpp: Job, ProgressHost), and what
// the thread does between them.
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "core/drive.hpp"
#include "core/progress.hpp"

namespace c4 {

Status Comm::queueJob(const std::shared_ptr<Job>& job, bool forceWait) {
  engine->submit(job);
  if (config.blocking || forceWait) return engine->wait(*job);
  return Status(Code::kInProgress, "operation queued on a non-blocking communicator");
}

void Comm::runJob(Job& job) {
  switch (job.kind) {
    case Job::Kind::kInit: {
      job.result = init(job.nranks, job.id, job.rank, job.config);
      if (!job.result.isOk()) {
        C4_WARN(kLogInit, "rank %d/%d: init failed: %s", job.rank, job.nranks, job.result.toString().c_str());
        (void)fail(job.result);
      }
      break;
    }
    case Job::Kind::kOps: {
      Status f = failure();
      if (!f.isOk()) {
        job.result = f;
        break;
      }
      if (!job.tickets.empty()) {
        f = waitForStreams(job);
        if (!f.isOk()) {
          job.result = fail(f);
          break;
        }
      }
      std::vector<GroupItem> items(1);
      items[0].comm = this;
      items[0].ops = std::move(job.ops);
      job.result = runGroupItems(items);
      // Deferred calls that ran on their staging after all: their outputs back to the device
      // before the tickets let the streams go on.
      if (job.result.isOk() && !job.tickets.empty()) {
        Status st = device.finishDeferred(job.tickets);
        if (!st.isOk()) job.result = fail(st);
      }
      break;
    }
    case Job::Kind::kProbe:
      job.result = failure();
      if (job.result.isOk()) job.result = waitProbe(job.peer, &job.probe, job.waitMs);
      break;
    case Job::Kind::kRecvAny:
      job.result = failure();
      if (job.result.isOk()) job.result = recvAny(job.ops.at(0), &job.source);
      break;
    case Job::Kind::kCall: {
      job.result = failure();
      if (!job.result.isOk()) break;
      Status st = job.tickets.empty() ? Status::ok() : waitForStreams(job);
      if (st.isOk()) st = job.call();
      if (!st.isOk()) job.result = fail(st);
      break;
    }
  }
}

Status Comm::waitForStreams(const Job& job) {
  // The caller's streams may have long work before the call: wait as long as it takes (a stream is
  // not a peer; C4_TIMEOUT is for the network), keeping the transports going, until an abort.
  int64_t sleepUs = 0;
  for (const gpu::StreamGate::Ticket& t : job.tickets) {
    for (;;) {
      bool ready = false;
      C4_CHECK(device.inputsReady(t, &ready));
      if (ready) break;
      if (state.abortPending())
        return makeError(Code::kInvalidUsage, "rank %d: aborted while waiting for a CUDA stream to reach a call", rank);
      (void)progressTransports();
      rma.pollDevice();  // the stream may wait for signals (a one-sided wait before the call)
      if (sleepUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
      sleepUs = sleepUs < 50 ? sleepUs + 5 : 50;
    }
  }
  return Status::ok();
}

void Comm::betweenJobs() {
  rma.pollDevice();  // streams waiting for signals (failed: released)
  if (transports.empty() || state.failed()) return;
  if (state.abortPending()) (void)failure();
  zeroCopy.serviceDeregistrations();  // a peer may wait for this rank to close a mapping
  Status st = progressTransports();
  if (!st.isOk()) (void)fail(st);
}

bool Comm::armIdleWait() {
  if (state.failed()) return true;
  bool armed = true;
  for (transport::WaitSource* w : waitSources) armed &= w->armWait();
  return armed;
}

void Comm::releaseStreams(const Job& job) { device.release(job.tickets); }

}  // namespace c4
