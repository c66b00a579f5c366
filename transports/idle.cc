#include "transports/idle.hpp"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "common/clock.hpp"

namespace c4::transport {

namespace {
constexpr int64_t kYieldNs = 250000;  // see idleBackoffUs

std::atomic<int64_t> gSpinNs{kDefaultSpinUs * 1000};
std::atomic<int> gMaxSleepUs{50};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace

void configureIdle(int64_t spinUs) {
  gSpinNs.store(std::max<int64_t>(0, spinUs) * 1000, std::memory_order_relaxed);
  gMaxSleepUs.store(static_cast<int>(std::max<int64_t>(1, paramShmSleepUs())), std::memory_order_relaxed);
}

long idleBackoffUs(int idleRounds, int64_t spinNs, CpuSharing* peers) {
  // Spin, then yield, then sleep, each phase measured in time. A sleep costs about 100 us here
  // whatever is asked (timer slack), so both earlier phases outlast one sleep of a peer:
  //  - spinning (ranks with cores to themselves): a rank that gave up sooner made its peer wait long
  //    enough to sleep too, and the two then took turns sleeping on every call (8 KiB AllGather at
  //    57 us instead of 3.4 us for whole runs);
  //  - yielding (also when ranks outnumber cores, where there is no spinning): yield hands the core
  //    to a runnable peer; 16 yields and then sleeps made 4 ranks on 2 cores take 10 to 30 us for an
  //    8-byte AllReduce in two runs of three, 250 us of yields none (docs/shm-transport.md).
  thread_local int64_t idleSinceNs = 0;
  thread_local int phase = 0;      // 0 spin, 1 yield, 2 sleep
  thread_local int sleepFrom = 0;  // the idle round at which sleeping started
  if (spinNs < 0) spinNs = gSpinNs.load(std::memory_order_relaxed);
  if (idleRounds <= 1) {
    // Keep this rank's CPU fresh for the peers' checks below (the call waits anyway).
    if (peers) peers->publishCpu();
    idleSinceNs = detail::nowNs();
    phase = spinNs > 0 ? 0 : 1;
  }
  if (phase < 2) {
    if ((idleRounds & 15) == 0) {  // the clock is read every 16 rounds
      const int64_t idleNs = detail::nowNs() - idleSinceNs;
      phase = idleNs < spinNs ? 0 : idleNs < spinNs + kYieldNs ? 1 : 2;
      // A peer on this very CPU cannot make progress while this rank spins: yield to it at once.
      // (Two fresh ranks often start on one CPU until the scheduler spreads them, a few ms later;
      // spinning, they took 250 us turns: 0.5 ms per 64 KiB Broadcast instead of 1.5 us.)
      if (phase == 0 && peers && peers->peerSharesCpu()) phase = 1;
      sleepFrom = idleRounds;
    }
    if (phase == 0) {
      cpuRelax();
      return 0;
    }
    if (phase == 1) {
      sched_yield();
      return 0;
    }
  }
  int k = std::min((idleRounds - sleepFrom) / 4, 16);
  return std::min<long>(1L << k, gMaxSleepUs.load(std::memory_order_relaxed));
}

void waitHint(int idleRounds) {
  long us = idleBackoffUs(idleRounds);
  if (us == 0) return;
  timespec ts{0, us * 1000};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

void setOversubscribed(bool oversubscribed) {
  if (paramShmSpin() >= 0) return;
  if (oversubscribed) gSpinNs.store(0, std::memory_order_relaxed);
}

}  // namespace c4::transport
