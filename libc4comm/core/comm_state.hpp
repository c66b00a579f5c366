// A communicator's health, in one vocabulary (docs/architecture.md, "One word per state"):
//  - failed:  an error of its own, a peer's, an expired timeout or an abort took effect; the first
//             error is kept and every later call returns it (ncclCommGetAsyncError);
//  - abort pending: another thread asked the driving thread to fail it (requestAbort), so that
//             only one thread ever touches the transports; the driving thread takes it at its
//             next poll;
//  - revoked: the application revoked it (commRevoke); calls other than shrink, finalize and
//             destroy are refused. A revoked communicator has not failed.
// Any thread may read it. Reads on the hot path are single acquire loads.
#pragma once

#include <atomic>
#include <mutex>

#include "c4comm/status.hpp"

namespace c4 {

class CommState {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// The error it failed with; ok while it has not failed.
  Status error() const {
    if (!failed()) return Status::ok();
    std::lock_guard<std::mutex> g(mu_);
    return error_;
  }
  /// Records `st` as the communicator's error unless one is recorded already. True if this call
  /// recorded it; *first receives the error recorded (this one or the earlier).
  bool setFailed(const Status& st, Status* first) {
    std::lock_guard<std::mutex> g(mu_);
    if (!failed_.load(std::memory_order_relaxed)) {
      error_ = st;
      failed_.store(true, std::memory_order_release);
      *first = st;
      return true;
    }
    *first = error_;
    return false;
  }

  /// Asks the driving thread to fail the communicator with `why` (the first request's reason is
  /// kept while it has not been taken).
  void requestAbort(const Status& why) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (abortWhy_.isOk()) abortWhy_ = why;
    }
    abortPending_.store(true, std::memory_order_release);
  }
  bool abortPending() const { return abortPending_.load(std::memory_order_acquire); }
  /// The driving thread takes a pending abort: true, with its reason, once per request.
  bool takeAbort(Status* why) {
    std::lock_guard<std::mutex> g(mu_);
    if (!abortPending_.load(std::memory_order_relaxed)) return false;
    abortPending_.store(false, std::memory_order_relaxed);
    *why = abortWhy_;
    return true;
  }

  /// Revokes it; true for the call that did (later ones find it revoked).
  bool revoke() { return !revoked_.exchange(true, std::memory_order_acq_rel); }
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  Status error_;     // guarded by mu_; set once, with failed_
  Status abortWhy_;  // guarded by mu_
  std::atomic<bool> failed_{false};
  std::atomic<bool> abortPending_{false};
  std::atomic<bool> revoked_{false};
};

}  // namespace c4
