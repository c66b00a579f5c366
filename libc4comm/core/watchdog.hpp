// Watchdog: the one place that decides "no progress for C4_TIMEOUT" (docs/architecture.md).
//
// Whatever drives a communicator's operations (the caller's thread, or its progress thread) bumps
// the progress counter when anything moves (a step completes, a peer's arena record appears) and
// calls idle() on the rounds where nothing did. idle() reads the clock every 16 calls and, once
// neither that counter nor the transports' byte counters moved for the timeout, returns an error
// naming what the running operation waits for (its path's description: ranks, lanes). The
// transports of a communicator do not time out on their own (Context::timeoutMs = 0); they only
// detect failures (a dead peer, a closed socket, a refused probe).
//
// Threading: moved(), enter() and leave() come from the driving thread; every field is an atomic
// so that another thread (C4D's health checks, a test) reads a consistent snapshot at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "c4comm/status.hpp"
#include "common/opsig.hpp"

namespace c4 {

class Watchdog {
 public:
  /// `timeoutMs` <= 0: never fires. `rank` names this rank in errors.
  void configure(int rank, int64_t timeoutMs);
  int64_t timeoutMs() const { return timeoutMs_; }

  /// Operation `sig` starts (the clock of "no progress" starts with it). No clock read here: small
  /// operations finish before their first idle round.
  void enter(const OpSig& sig) {
    active_.store(sig.seq + 1, std::memory_order_relaxed);
    enteredNs_.store(0, std::memory_order_relaxed);
    lastNs_.store(0, std::memory_order_relaxed);
    polls_ = 0;
  }
  /// The running operation ended.
  void leave() { active_.store(0, std::memory_order_relaxed); }
  /// Something moved (hot path: the driving thread is the only writer, so a plain increment of the
  /// atomic, no read-modify-write).
  void moved() { progress_.store(progress_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

  /// An idle round of the driving loop. `external` is a counter that grows whenever the transports
  /// moved bytes (Transport::progressCount summed); `what` names the wait ("AllReduce seq 3 ...") and
  /// `waitingOn` describes whom it waits for; both are only called when the watchdog fires.
  Status idle(uint64_t external, const std::function<std::string()>& what,
              const std::function<std::string()>& waitingOn);

  // ---- read by any thread ----
  /// Progress events so far (monotonic).
  uint64_t progressCount() const { return progress_.load(std::memory_order_relaxed); }
  /// CLOCK_MONOTONIC ns of the last progress the driving loop saw (0: none yet).
  int64_t lastProgressNs() const { return lastNs_.load(std::memory_order_relaxed); }
  /// The running operation's sequence number + 1 (0: none), and since when it waits (set at its
  /// first idle round: an operation that never waits costs no clock read).
  uint64_t activeSeq() const { return active_.load(std::memory_order_relaxed); }
  int64_t enteredNs() const { return enteredNs_.load(std::memory_order_relaxed); }
  /// How long the running operation has seen no progress, as of the last clock read of idle()
  /// (0 while it progresses; ns).
  int64_t stalledNs() const {
    const int64_t last = lastNs_.load(std::memory_order_relaxed), at = checkNs_.load(std::memory_order_relaxed);
    return active_.load(std::memory_order_relaxed) && last && at > last ? at - last : 0;
  }
  int64_t lastCheckNs() const { return checkNs_.load(std::memory_order_relaxed); }

 private:
  int rank_ = 0;
  int64_t timeoutMs_ = 0;
  std::atomic<uint64_t> progress_{0};
  std::atomic<uint64_t> active_{0};
  std::atomic<int64_t> enteredNs_{0};
  std::atomic<int64_t> lastNs_{0};
  std::atomic<int64_t> checkNs_{0};
  uint64_t seenProgress_ = 0, seenExternal_ = 0;
  uint32_t polls_ = 0;
};

}  // namespace c4
