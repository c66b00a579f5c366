// The monotonic clocks every layer uses (one definition; async-signal-safe, any thread).
#pragma once

#include <time.h>

#include <cstdint>

namespace c4::detail {

/// CLOCK_MONOTONIC in ns.
inline int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
/// CLOCK_MONOTONIC in ms.
inline int64_t nowMs() { return nowNs() / 1000000; }
/// CLOCK_MONOTONIC_COARSE in ms: a few ms of resolution, no vDSO clock read (liveness checks).
inline int64_t coarseNowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace c4::detail
