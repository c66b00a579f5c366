#include "core/progress.hpp"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "core/group.hpp"
#include "transports/idle.hpp"

namespace c4 {

namespace {
// Between jobs the thread yields on its queue this long (so a caller issuing back-to-back calls
// never waits for a wake-up), then blocks (waking for network data and at least every
// kIdleCheckMs, so the transports' checks and acknowledgements go on).
constexpr int64_t kSpinNs = 200000;
constexpr int64_t kIdleCheckMs = 20;
}  // namespace

ProgressEngine::ProgressEngine(Comm* comm) : comm_(comm) {}

ProgressEngine::~ProgressEngine() {
  stop();
  if (eventFd_ >= 0) close(eventFd_);
}

Status ProgressEngine::start() {
  eventFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (eventFd_ < 0) return sysError("progress thread: eventfd", errno);
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::exception& e) {
    return makeError(Code::kSystemError, "progress thread: cannot start a thread (%s)", e.what());
  }
  pthread_setname_np(thread_.native_handle(), "c4:progress");
  started_ = true;
  return Status::ok();
}

void ProgressEngine::wake() {
  if (!sleeping_.load(std::memory_order_acquire)) return;
  uint64_t one = 1;
  ssize_t n = write(eventFd_, &one, sizeof(one));
  (void)n;
}

void ProgressEngine::submit(const std::shared_ptr<Job>& job) {
  for (const OpDesc& op : job->ops)
    if (op.staged.slot != nullptr) job->tickets.push_back(op.staged);
  job->allStaged = !job->ops.empty() && job->tickets.size() == job->ops.size();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_.load() || !started_) {
      job->result = makeError(Code::kInvalidUsage, "rank %d: the communicator is shutting down; the call was not run",
                              comm_->rank);
      finish(*job);
      return;
    }
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    queue_.push_back(job);
  }
  wake();
}

bool ProgressEngine::runInline(const std::function<Status()>& fn, Status* out) {
  if (!started_ || pending() || stopping_.load()) return false;
  std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
  if (!drive.owns_lock() || pending()) return false;
  *out = fn();
  return true;
}

Status ProgressEngine::wait(Job& job) {
  // Spin and yield first: the job of a small call is done within microseconds.
  const int64_t start = detail::nowNs();
  for (int i = 0; !job.done.load(std::memory_order_acquire); ++i) {
    if ((i & 63) == 63 && detail::nowNs() - start > 2 * kSpinNs) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      doneCv_.wait_for(lk, std::chrono::milliseconds(1), [&] { return job.done.load(std::memory_order_acquire); });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    if (comm_->oversubscribed || (i & 15) == 15) sched_yield();
  }
  return job.result;
}

void ProgressEngine::drain() {
  if (!started_ || onThread()) return;
  while (pending()) {
    std::unique_lock<std::mutex> lk(mu_);
    sleepers_.fetch_add(1, std::memory_order_acq_rel);
    doneCv_.wait_for(lk, std::chrono::milliseconds(1), [&] { return !pending(); });
    sleepers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ProgressEngine::failQueued(const Status& st) {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    dropped.swap(queue_);
  }
  for (auto& j : dropped) {
    j->result = st;
    finish(*j);
    outstanding_.fetch_sub(1, std::memory_order_acq_rel);
  }
  std::lock_guard<std::mutex> g(mu_);
  doneCv_.notify_all();
}

void ProgressEngine::stop() {
  if (!started_) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_.exchange(true)) {
      // already stopping
    }
  }
  sleeping_.store(true);  // make sure the wake below is written
  wake();
  if (thread_.joinable() && !onThread()) thread_.join();
}

void ProgressEngine::run(Job& job) {
  switch (job.kind) {
    case Job::Kind::kInit: {
      job.result = comm_->init(job.nranks, job.id, job.rank, job.config);
      if (!job.result.isOk()) {
        C4_WARN(kLogInit, "rank %d/%d: init failed: %s", job.rank, job.nranks, job.result.toString().c_str());
        (void)comm_->fail(job.result);
      }
      break;
    }
    case Job::Kind::kOps: {
      Status f = comm_->failure();
      if (!f.isOk()) {
        job.result = f;
        break;
      }
      if (!job.tickets.empty()) {
        f = waitForStreams(job);
        if (!f.isOk()) {
          job.result = comm_->fail(f);
          break;
        }
      }
      std::vector<GroupItem> items(1);
      items[0].comm = comm_;
      items[0].ops = std::move(job.ops);
      job.result = runGroupItems(items);
      // Deferred calls that ran on their staging after all: their outputs back to the device
      // before the tickets let the streams go on.
      for (const gpu::StreamGate::Ticket& t : job.tickets) {
        if (!job.result.isOk()) break;
        Status st = comm_->gpuGate->finishDeferred(t);
        if (!st.isOk()) job.result = comm_->fail(st);
      }
      break;
    }
    case Job::Kind::kProbe:
      job.result = comm_->failure();
      if (job.result.isOk()) job.result = comm_->waitProbe(job.peer, &job.probe, job.waitMs);
      break;
    case Job::Kind::kRecvAny:
      job.result = comm_->failure();
      if (job.result.isOk()) job.result = comm_->recvAny(job.ops.at(0), &job.source);
      break;
    case Job::Kind::kCall: {
      job.result = comm_->failure();
      if (!job.result.isOk()) break;
      Status st = job.tickets.empty() ? Status::ok() : waitForStreams(job);
      if (st.isOk()) st = job.call();
      if (!st.isOk()) job.result = comm_->fail(st);
      break;
    }
  }
}

Status ProgressEngine::waitForStreams(const Job& job) {
  // The caller's streams may have long work before the call: wait as long as it takes (a stream is
  // not a peer; C4_TIMEOUT is for the network), keeping the transports going, until an abort.
  int64_t sleepUs = 0;
  for (const gpu::StreamGate::Ticket& t : job.tickets) {
    for (;;) {
      bool ready = false;
      C4_CHECK(comm_->gpuGate->inputsReady(t, &ready));
      if (ready) break;
      if (comm_->state.abortPending())
        return makeError(Code::kInvalidUsage, "rank %d: aborted while waiting for a CUDA stream to reach a call",
                         comm_->rank);
      (void)comm_->progressTransports();
      comm_->rma.pollDevice(comm_);  // the stream may wait for signals (a one-sided wait before the call)
      if (sleepUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
      sleepUs = sleepUs < 50 ? sleepUs + 5 : 50;
    }
  }
  return Status::ok();
}

void ProgressEngine::finish(Job& job) {
  // In call order: a ticket completes the ones before it too (the streams wait for "at least").
  for (const gpu::StreamGate::Ticket& t : job.tickets) comm_->gpuGate->complete(t);
  if (!job.tickets.empty() && !job.result.isOk())
    C4_WARN(kLogColl, "rank %d: a call on device buffers failed; its outputs are not written: %s", comm_->rank,
            job.result.toString().c_str());
  job.done.store(true, std::memory_order_release);
}

void ProgressEngine::idle(int rounds) {
  // An abort asked for by another thread (commAbort, revoke) is carried out here, by the one
  // thread that drives the transports.
  if (comm_->state.abortPending()) {
    std::lock_guard<std::mutex> drive(driveMu_);
    (void)comm_->failure();
  }
  static thread_local int64_t idleSince = 0;
  if (rounds <= 1) idleSince = detail::nowNs();
  const int64_t idleNs = detail::nowNs() - idleSince;
  // The transports are driven only with the drive lock (a blocking call may run inline meanwhile).
  auto progress = [this] {
    std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
    if (!drive.owns_lock()) return;
    comm_->rma.pollDevice(comm_);  // streams waiting for signals (failed: released)
    if (comm_->transports.empty() || comm_->state.failed()) return;
    if (comm_->state.abortPending()) (void)comm_->failure();
    comm_->zeroCopy.serviceDeregistrations();  // a peer may wait for this rank to close a mapping
    Status st = comm_->progressTransports();
    if (!st.isOk()) (void)comm_->fail(st);
  };
  // Between jobs: yield for a while (the next call of a loop comes within microseconds; spinning
  // would keep the application's own thread, or a peer's, off the core), then block.
  if (idleNs < kSpinNs) {
    if ((rounds & 63) == 0) progress();
    sched_yield();
    return;
  }
  // Streams wait for signals this thread looks for: poll every 20 us rather than block.
  if (comm_->rma.devicePolling()) {
    progress();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return;
  }
  // Block: on the network transports' fds (data to acknowledge) and the wake-up eventfd.
  std::vector<pollfd> fds = comm_->waitFds;
  fds.push_back(pollfd{eventFd_, POLLIN, 0});
  sleeping_.store(true, std::memory_order_release);
  bool empty;
  {
    std::lock_guard<std::mutex> g(mu_);
    empty = queue_.empty();
  }
  // A transport whose fd signals only once armed is armed by the thread that drives it; where a
  // blocking call drives them inline meanwhile, it does its own waiting.
  bool armed = true;
  if (empty && !comm_->waitSources.empty()) {
    std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
    if (drive.owns_lock() && !comm_->state.failed())
      for (transport::WaitSource* w : comm_->waitSources) armed &= w->armWait();
  }
  if (empty && armed && !stopping_.load()) {
    timespec ts{0, kIdleCheckMs * 1000000};
    (void)ppoll(fds.data(), fds.size(), &ts, nullptr);
  }
  sleeping_.store(false, std::memory_order_release);
  uint64_t v;
  while (read(eventFd_, &v, sizeof(v)) > 0) {
  }
  progress();
}

void ProgressEngine::loop() {
  int rounds = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!queue_.empty()) {
        job = queue_.front();
        queue_.pop_front();
      } else if (stopping_.load()) {
        return;
      }
    }
    if (!job) {
      idle(++rounds);
      continue;
    }
    rounds = 0;
    {
      std::lock_guard<std::mutex> drive(driveMu_);
      run(*job);
    }
    finish(*job);
    outstanding_.fetch_sub(1, std::memory_order_acq_rel);
    if (sleepers_.load(std::memory_order_acquire) > 0) {
      std::lock_guard<std::mutex> g(mu_);
      doneCv_.notify_all();
    }
  }
}

}  // namespace c4
