// Idle back-off for callers that poll transports (the executor's driving loop, the one-shot and
// zero-copy paths, tests): spin, then yield, then short sleeps, each phase measured in time.
#pragma once

#include <cstdint>

#include "common/params.hpp"
#include "transports/transport.hpp"

namespace c4::transport {

C4_PARAM_INT(ShmSpin, "C4_SHM_SPIN", nullptr, -1, -1, 10000000, kParamNone,
             "Microseconds an idle rank spins before it yields and then sleeps (-1: 250, or 0 when the "
             "machine's ranks outnumber its CPUs)")
C4_PARAM_INT(ShmSleepUs, "C4_SHM_SLEEP_US", nullptr, 50, 1, 1000000, kParamNone,
             "shm: longest sleep (us) in waitHint() when idle")

/// The spin phase of this process when C4_SHM_SPIN is not set (us).
constexpr int64_t kDefaultSpinUs = 250;

/// Sets the process's spin phase (`spinUs`, from C4_SHM_SPIN or the transport's choice) and reads
/// C4_SHM_SLEEP_US. Thread-safe; the shm transport calls it at setup.
void configureIdle(int64_t spinUs);

/// Back-off for a caller that polls Transport::progress(): call it after each round in which
/// nothing completed, with the number of consecutive such rounds (reset to 0 after any progress).
/// It spins (cpu pause) first, then sched_yield()s, then sleeps for growing intervals up to
/// C4_SHM_SLEEP_US, so idle ranks do not starve busy ones when ranks outnumber cores. Thread-safe.
void waitHint(int idleRounds);
/// waitHint's first phases without its sleep: spins or yields and returns 0, or, once the caller
/// should block, returns how long (us) without sleeping, so the caller can wait on file
/// descriptors instead (see WaitSource::waitFd). `spinNs` >= 0 replaces the process's spin
/// (C4_SHM_SPIN or its default) for this caller (Config::spinUs). With `peers` (the shm
/// transport's), a rank whose peer last ran on its own CPU yields instead of spinning
/// (CpuSharing::peerSharesCpu; checked with the clock, every 16 rounds).
long idleBackoffUs(int idleRounds, int64_t spinNs = -1, CpuSharing* peers = nullptr);
/// Overrides the spin phase chosen at setup: `oversubscribed` (more ranks than cores on this
/// machine, counting ranks of other network namespaces too) means no spinning. C4_SHM_SPIN wins.
void setOversubscribed(bool oversubscribed);

}  // namespace c4::transport
