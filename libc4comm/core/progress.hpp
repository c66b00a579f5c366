// ProgressEngine: a communicator's progress thread (C4_PROGRESS_THREAD=1, or a communicator created
// with Config::blocking = 0; device memory will need it too).
//
// The API turns every call on such a communicator into a Job and queues it; the thread runs the
// jobs one after another, in call order, with the same driving loop the caller's thread uses
// otherwise (core/drive.hpp), so paths, transports, the watchdog and the tracer see one driving
// thread. A blocking call waits for its job (spin, yield, then sleep); a non-blocking one returns
// kInProgress and commGetAsyncError reports kInProgress until every queued job is done. Between
// jobs the thread keeps the network transports progressing (acknowledgements, probes), so a peer's
// sends complete even while this rank's application is busy elsewhere.
//
// Threading: submit(), wait(), pending(), drain() and stop() from any thread; everything else of
// the communicator's data path only on the progress thread.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "core/opdesc.hpp"

namespace c4 {

struct Job;

/// What a progress thread needs of the communicator it drives (Comm implements it): the jobs run,
/// and what goes on between them.
class ProgressHost {
 public:
  virtual ~ProgressHost() = default;
  /// Runs `job` (the drive held): its outcome in job.result.
  virtual void runJob(Job& job) = 0;
  /// Between jobs, the drive held: streams waiting for one-sided signals, an abort another thread
  /// asked for, peers waiting for this rank to close a mapping, the transports (their
  /// acknowledgements and lane checks).
  virtual void betweenJobs() = 0;
  /// Another thread asked for an abort (cheap; any thread).
  virtual bool abortRequested() const = 0;
  /// Carries out a requested abort (the drive held).
  virtual void takeAbort() = 0;
  /// Streams wait for one-sided signals this thread must look for: poll, do not block.
  virtual bool signalsAwaited() const = 0;
  /// The network transports' wait fds (data that arrives wakes a blocked thread).
  virtual const std::vector<pollfd>& idleFds() const = 0;
  /// Arms the transports whose fds signal only once armed (the drive held); false: events are
  /// already pending (do not block).
  virtual bool armIdleWait() = 0;
  /// The job is over: the streams its staged calls hold go on.
  virtual void releaseStreams(const Job& job) = 0;
  /// Ranks outnumber this machine's cores (yield while waiting).
  virtual bool sharesCores() const = 0;
  virtual int thisRank() const = 0;
};

/// One call (or one group's part) for the progress thread.
struct Job {
  enum class Kind { kInit, kOps, kProbe, kRecvAny, kCall };
  Kind kind = Kind::kOps;
  std::vector<OpDesc> ops;  // kOps: collectives in call order, then point-to-point (one batch); kRecvAny: one
  // kInit
  int nranks = 0, rank = 0;
  UniqueId id;
  Config config;
  // kProbe
  int peer = 0;
  int64_t waitMs = 0;
  ProbeResult probe;
  // kRecvAny
  int source = -1;
  // kCall: run once the streams of `tickets` reached it (a one-sided call on device windows); an
  // error fails the communicator.
  std::function<Status()> call;

  // Staged calls on device buffers among ops (filled by submit): the job waits for their inputs
  // and, however it ends, completes them so their streams go on.
  std::vector<gpu::StreamGate::Ticket> tickets;
  bool allStaged = false;  // every op is staged (set at submit: running the job moves ops away)

  Status result;
  std::atomic<bool> done{false};
};

class ProgressEngine {
 public:
  explicit ProgressEngine(ProgressHost* host);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  /// Starts the thread (named "c4:progress").
  Status start();
  /// Queues `job`. After stop() the job fails at once.
  void submit(const std::shared_ptr<Job>& job);
  /// A blocking call with nothing queued before it runs on the caller's thread, with the thread's
  /// drive lock held (no hand-off, so no added latency): returns false, having run nothing, when
  /// jobs are queued or running (the call must go behind them: submit it).
  bool runInline(const std::function<Status()>& fn, Status* out);
  /// Blocks until `job` is done; its result.
  Status wait(Job& job);
  /// True while a job is queued or running.
  bool pending() const { return outstanding_.load(std::memory_order_acquire) != 0; }
  /// Blocks until no job is queued or running.
  void drain();
  /// Fails the queued jobs that have not started with `st` (a revoked or aborted communicator).
  void failQueued(const Status& st);
  /// Runs the queue to its end, stops the thread and joins it. Idempotent.
  void stop();
  /// Makes the thread look at its work now if it sleeps (a stream started waiting for signals).
  void nudge() { wake(); }
  /// The calling thread is the progress thread.
  bool onThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void loop();
  /// A job is over (run, failed or dropped): its staged calls' streams go on; it is marked done.
  void finish(Job& job);
  /// Between jobs: keeps the transports going, takes abort requests, waits for work.
  void idle(int rounds);
  void wake();

  ProgressHost* host_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable doneCv_;  // waiters of jobs that sleep
  std::mutex driveMu_;              // held by whoever drives the communicator (a job, an inline call)
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<uint64_t> outstanding_{0};  // queued + running
  std::atomic<bool> stopping_{false};
  std::atomic<bool> sleeping_{false};  // the thread blocks in idle(): submit() must wake it
  std::atomic<int> sleepers_{0};       // waiters asleep on doneCv_
  int eventFd_ = -1;
  bool started_ = false;
};

}  // namespace c4
