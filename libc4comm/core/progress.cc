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

namespace c4 {

namespace {
// Between jobs the thread yields on its queue this long (so a caller issuing back-to-back calls
// never waits for a wake-up), then blocks (waking for network data and at least every
// kIdleCheckMs, so the transports' checks and acknowledgements go on).
constexpr int64_t kSpinNs = 200000;
constexpr int64_t kIdleCheckMs = 20;
}  // namespace

ProgressEngine::ProgressEngine(ProgressHost* host) : host_(host) {}

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
                              host_->thisRank());
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
    if (host_->sharesCores() || (i & 15) == 15) sched_yield();
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

void ProgressEngine::finish(Job& job) {
  // In call order: a ticket completes the ones before it too (the streams wait for "at least").
  if (!job.tickets.empty()) host_->releaseStreams(job);
  if (!job.tickets.empty() && !job.result.isOk())
    C4_WARN(kLogColl, "rank %d: a call on device buffers failed; its outputs are not written: %s", host_->thisRank(),
            job.result.toString().c_str());
  job.done.store(true, std::memory_order_release);
}

void ProgressEngine::idle(int rounds) {
  // An abort asked for by another thread (commAbort, revoke) is carried out here, by the one
  // thread that drives the transports.
  if (host_->abortRequested()) {
    std::lock_guard<std::mutex> drive(driveMu_);
    host_->takeAbort();
  }
  static thread_local int64_t idleSince = 0;
  if (rounds <= 1) idleSince = detail::nowNs();
  const int64_t idleNs = detail::nowNs() - idleSince;
  // The transports are driven only with the drive lock (a blocking call may run inline meanwhile).
  auto progress = [this] {
    std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
    if (drive.owns_lock()) host_->betweenJobs();
  };
  // Between jobs: yield for a while (the next call of a loop comes within microseconds; spinning
  // would keep the application's own thread, or a peer's, off the core), then block.
  if (idleNs < kSpinNs) {
    if ((rounds & 63) == 0) progress();
    sched_yield();
    return;
  }
  // Streams wait for signals this thread looks for: poll every 20 us rather than block.
  if (host_->signalsAwaited()) {
    progress();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return;
  }
  // Block: on the network transports' fds (data to acknowledge) and the wake-up eventfd.
  std::vector<pollfd> fds = host_->idleFds();
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
  if (empty) {
    std::unique_lock<std::mutex> drive(driveMu_, std::try_to_lock);
    if (drive.owns_lock()) armed = host_->armIdleWait();
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
      host_->runJob(*job);
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
