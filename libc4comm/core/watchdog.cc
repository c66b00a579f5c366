#include "core/watchdog.hpp"

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/status.hpp"

namespace c4 {

void Watchdog::configure(int rank, int64_t timeoutMs) {
  rank_ = rank;
  timeoutMs_ = timeoutMs;
}

Status Watchdog::idle(uint64_t external, const std::function<std::string()>& what,
                      const std::function<std::string()>& waitingOn) {
  // The clock is read every 16 idle rounds: cheap while spinning, within a sleep or two otherwise.
  if ((++polls_ & 15) != 1) return Status::ok();
  const int64_t now = detail::nowNs();
  checkNs_.store(now, std::memory_order_relaxed);
  const uint64_t p = progress_.load(std::memory_order_relaxed);
  if (enteredNs_.load(std::memory_order_relaxed) == 0) enteredNs_.store(now, std::memory_order_relaxed);
  if (p != seenProgress_ || external != seenExternal_ || lastNs_.load(std::memory_order_relaxed) == 0) {
    seenProgress_ = p;
    seenExternal_ = external;
    lastNs_.store(now, std::memory_order_relaxed);
    return Status::ok();
  }
  if (timeoutMs_ <= 0 || now - lastNs_.load(std::memory_order_relaxed) <= timeoutMs_ * 1000000LL) return Status::ok();
  const std::string w = what ? what() : std::string("the operation");
  const std::string on = waitingOn ? waitingOn() : std::string();
  Status st = makeError(Code::kRemoteError, "rank %d: %s made no progress for %lld ms (C4_TIMEOUT); waiting on %s",
                        rank_, w.c_str(), static_cast<long long>(timeoutMs_), on.empty() ? "?" : on.c_str());
  lastNs_.store(now, std::memory_order_relaxed);  // one error per timeout, not one per round
  return st;
}

}  // namespace c4
