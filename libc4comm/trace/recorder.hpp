// Tracer: a per-communicator ring of fixed-size events, its clock, and its dumps.
//
// Hot path (Recorder::record): one relaxed load of the head, five 8-byte stores into the slot and a
// release store of the head: no allocation, lock, atomic read-modify-write or system call. The
// communicator's driving thread is the only writer (c4comm's threading rule: one thread at a time
// per communicator). Readers (a dump from a signal handler or another thread, readEvents) copy the
// slots and then re-read the head: a slot the writer may have overwritten meanwhile is dropped, so
// a reader never reports a torn event.
//
// Clock: the TSC (rdtsc) when it is invariant, else CLOCK_MONOTONIC in ns. Events hold raw ticks;
// files carry two (ticks, CLOCK_MONOTONIC ns) anchors so c4-trace converts with a long baseline.
//
// File (one per rank and communicator, "<dir>/<tag>.r<rank>.c4t"): FileHeader (320 bytes), the
// events (trace::Event, 40 bytes each, oldest first), then the name table (NUL-terminated strings;
// an event's name id is its byte offset). Written to "<file>.tmp" and renamed, with open/write/
// close only, so the same code dumps from a fatal-signal handler.
#pragma once

#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "c4comm/status.hpp"
#include "c4comm/trace.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace c4 {
namespace trace {

// ---- clock ----

namespace detail {
extern bool gUseTsc;  // set once by initClock(), before any recorder exists
}
/// Chooses the clock (C4_TRACE_CLOCK) and calibrates the TSC once per process. Thread-safe.
void initClock();
/// The trace clock in ticks.
inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  if (detail::gUseTsc) return __rdtsc();
#endif
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
/// CLOCK_MONOTONIC in ns plus the test-only skew (C4_TRACE_TEST_SKEW_NS): the clock that trace
/// timestamps convert to and that clock alignment measures. Async-signal-safe.
int64_t clockNs();
/// C4_TRACE_TEST_SKEW_NS: what clockNs() adds to CLOCK_MONOTONIC (tests emulate other machines).
int64_t configuredSkewNs();
/// Ticks per ns from the process-start calibration (1.0 without the TSC).
double ticksPerNs();
/// Converts with the process anchor and calibration (for readEvents; files carry their own).
int64_t toNs(uint64_t t);

// ---- file format ----

// 2: Event::lane is the lane (kLaneStriped: several), Event::transport indexes FileHeader::transports.
constexpr uint32_t kFileVersion = 2;
constexpr char kFileMagic[8] = {'C', '4', 'T', 'R', 'A', 'C', 'E', '\0'};

/// Why a file was written (FileHeader::reason).
enum class DumpReason : uint32_t { kFinalize = 0, kDestroy = 1, kAbort = 2, kSignal = 3, kRequest = 4 };

/// Clock alignment to rank 0: offsetNs = rank 0's clockNs() - this rank's, measured at atNs (this
/// rank's clockNs()) with round-trip rttNs (the offset error is at most rttNs / 2).
struct ClockSample {
  int64_t offsetNs = 0;
  int64_t rttNs = 0;
  int64_t atNs = 0;
};

/// The 320-byte header of a trace file (little-endian; tools/c4-trace/c4trace/fmt.py mirrors it).
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t headerBytes;  // sizeof(FileHeader)
  uint32_t eventBytes;   // sizeof(Event)
  int32_t rank, nranks, pid;
  uint32_t level, reason;  // Level, DumpReason
  uint64_t firstIndex;     // ring index of the first event in the file
  uint64_t nEvents;        // events that follow the header
  uint64_t validFrom;      // events with a smaller ring index may be torn: readers skip them
  uint64_t totalEvents;    // events ever recorded (total - nEvents were overwritten)
  uint64_t anchorTicks0;   // (ticks, clockNs) when the recorder started ...
  int64_t anchorNs0;
  uint64_t anchorTicks1;  // ... and when the file was written
  int64_t anchorNs1;
  double ticksPerNs;  // process calibration (used if the anchors are too close)
  int64_t realtimeNs0;
  ClockSample clock[2];  // at init and at finalize
  uint32_t clockSamples;
  uint32_t namesBytes;  // bytes of the name table after the events
  char commTag[24];
  char commName[32];
  char host[64];
  char transports[24];  // the communicator's transports by index, comma-separated ("shm,tcp")
};
static_assert(sizeof(FileHeader) == 320, "trace FileHeader is 320 bytes");

// ---- recorder ----

/// What a recorder is told about its communicator.
struct RecorderInfo {
  int rank = 0;
  int nranks = 1;
  std::string commTag;
  std::string commName;
  std::string host;
};

class Recorder {
 public:
  Recorder() = default;
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Reads C4_TRACE / C4_TRACE_BUFFER / C4_TRACE_DIR, allocates and pre-faults the ring, registers
  /// for signal dumps. With C4_TRACE=0 nothing is allocated until setLevel() raises the level.
  Status init(const RecorderInfo& info);
  /// Current level (Level as int). The hot-path check.
  int level() const { return level_; }
  bool on() const { return level_ != 0; }
  /// True once the ring exists (some level above 0 was set): there is something to dump.
  bool allocated() const { return slots_ != nullptr; }
  /// Changes the level (allocates the ring on first need).
  Status setLevel(Level l);

  /// Appends one event (see the file comment). With one writer (the thread that drives the
  /// communicator) no lock is taken; once setShared(true) (a progress thread drives it while the
  /// caller records spans and notes), writers take a spin lock around the same stores.
  void record(const Event& e) {
    if (shared_.load(std::memory_order_relaxed)) {
      while (writing_.exchange(true, std::memory_order_acquire)) {
      }
      store(e);
      writing_.store(false, std::memory_order_release);
      return;
    }
    store(e);
  }
  /// Records `e` (an operation that has begun) and returns its ring index for complete().
  uint64_t recordOpen(const Event& e) {
    if (shared_.load(std::memory_order_relaxed)) {
      while (writing_.exchange(true, std::memory_order_acquire)) {
      }
      const uint64_t h = head_.load(std::memory_order_relaxed);
      store(e);
      writing_.store(false, std::memory_order_release);
      return h;
    }
    const uint64_t h = head_.load(std::memory_order_relaxed);
    store(e);
    return h;
  }
  /// Rewrites the event recordOpen() returned `index` for with its final version, unless the ring
  /// has overwritten it since. (A reader copying that very slot meanwhile may see the old and the new
  /// words mixed, both of the same operation.)
  void complete(uint64_t index, const Event& e) {
    const bool shared = shared_.load(std::memory_order_relaxed);
    if (shared) {
      while (writing_.exchange(true, std::memory_order_acquire)) {
      }
    }
    if (slots_ && head_.load(std::memory_order_relaxed) - index < capacity_) {
      std::atomic<uint64_t>* s = slots_ + (index & mask_) * kWords;
      uint64_t w[kWords];
      __builtin_memcpy(w, &e, sizeof(w));
      for (size_t i = 0; i < kWords; ++i) s[i].store(w[i], std::memory_order_relaxed);
    }
    if (shared) writing_.store(false, std::memory_order_release);
  }
  /// Several threads will record from now on (see record()).
  void setShared(bool shared) { shared_.store(shared, std::memory_order_relaxed); }
  /// Names the communicator's transports by index (Event::transport), e.g. "shm,tcp".
  void setTransports(const std::string& names);
  /// Adds `text` to the name table (bounded; not for a hot path); returns its id (0 = "").
  /// `maxLen` bounds the bytes kept (a C4D record, docs/c4d.md, keeps up to 4 KiB).
  uint32_t intern(const char* text, size_t maxLen = 255);
  /// Records kError / kDiag at now().
  void error(int code, const std::string& message, int peer);
  void note(const std::string& text);
  /// Records a kPlan event (C4P); [t0, t1] in ticks (t1 = t0 for an instant; 0: now).
  void plan(PlanEvent what, const std::string& text, int peer = -1, int lane = 0, uint64_t bytes = 0, uint64_t t0 = 0,
            uint64_t t1 = 0);

  void setClock(int which, const ClockSample& s);
  const ClockSample& clock(int which) const { return clock_[which]; }

  /// Writes the file (see the file comment); *path receives its name. Not from a signal handler.
  Status dump(DumpReason why, std::string* path = nullptr);
  /// The async-signal-safe dump (open/write/rename/close only); false if it failed.
  bool dumpRaw(DumpReason why);
  /// Events still in the ring, oldest first, in ticks; *dropped = older events overwritten.
  void snapshot(std::vector<Event>* out, uint64_t* dropped) const;
  uint64_t totalEvents() const { return head_.load(std::memory_order_acquire); }
  const char* path() const { return path_; }

 private:
  static constexpr size_t kWords = sizeof(Event) / 8;
  void store(const Event& e) {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    std::atomic<uint64_t>* s = slots_ + (h & mask_) * kWords;
    uint64_t w[kWords];
    __builtin_memcpy(w, &e, sizeof(w));
    for (size_t i = 0; i < kWords; ++i) s[i].store(w[i], std::memory_order_relaxed);
    head_.store(h + 1, std::memory_order_release);
  }
  static constexpr size_t kNamesBytes = 64 * 1024;
  Status allocate();

  std::atomic<uint64_t>* slots_ = nullptr;  // capacity_ * kWords words
  size_t capacity_ = 0;
  uint64_t mask_ = 0;
  std::atomic<uint64_t> head_{0};
  int level_ = 0;
  int rank_ = 0, nranks_ = 1;
  uint64_t anchorTicks_ = 0;
  int64_t anchorNs_ = 0, realtimeNs_ = 0;
  ClockSample clock_[2];
  int clockSamples_ = 0;
  char path_[512] = {0};
  char tag_[24] = {0};
  char name_[32] = {0};
  char host_[64] = {0};
  char transports_[24] = {0};
  std::atomic<bool> shared_{false};
  std::atomic<bool> writing_{false};
  std::mutex namesMu_;  // writers of the name table; readers use namesUsed_
  char* names_ = nullptr;
  std::atomic<uint32_t> namesUsed_{0};
  int registrySlot_ = -1;
};

/// The trace directory of this process (C4_TRACE_DIR or the default; created on first dump).
std::string directory();
/// Installs the fatal-signal and SIGUSR2 handlers once per process (C4_TRACE_SIGNALS).
void installSignalHandlers();
/// Dumps every live recorder with the async-signal-safe writer. Returns how many were written.
int dumpAllRaw(DumpReason why);
/// Names for logs and the report.
const char* levelName(int level);

}  // namespace trace
}  // namespace c4
