// Logging filtered by level and subsystem, like NCCL's: C4_DEBUG=WARN|INFO|TRACE (NCCL_DEBUG too),
// C4_DEBUG_SUBSYS=INIT,COLL,... (a leading ^ excludes), C4_DEBUG_FILE=path with %h (host) and %p (pid).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace c4 {

enum class LogLevel : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

/// Subsystems (bit flags).
enum LogSubsys : uint32_t {
  kLogInit = 1u << 0,
  kLogColl = 1u << 1,
  kLogP2p = 1u << 2,
  kLogShm = 1u << 3,
  kLogNet = 1u << 4,
  kLogBootstrap = 1u << 5,
  kLogTuning = 1u << 6,
  kLogEnv = 1u << 7,
  kLogAlloc = 1u << 8,
  kLogCall = 1u << 9,
  kLogSched = 1u << 10,
  kLogPlan = 1u << 11,
  kLogAll = ~0u,
};

/// True if a message at `level` for `subsys` would be printed (cheap; use to skip formatting).
bool logEnabled(LogLevel level, uint32_t subsys);
/// Prints one line: "host:pid:tid c4 LEVEL message". Thread-safe.
void logMessage(LogLevel level, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
/// The subsystem bits of a comma list of names ("INIT,NET"; a leading ^ inverts; unknown names
/// add nothing).
uint32_t logSubsysMask(const std::string& spec);
/// Re-reads C4_DEBUG* (tests use it after setenv).
void logReload();

/// A file name pattern with %h (short host name), %p (pid), %r (`rank`; kept as is when rank < 0) and
/// %% (a percent sign) expanded; any other %x stays as written.
std::string expandPathPattern(const std::string& pattern, int rank = -1);

/// Opens `path` for appending the way c4comm writes its files (C4_DEBUG_FILE, C4_DIAG_FILE): never
/// through a symbolic link at the final name, never blocking on a FIFO, only a regular file or a
/// character device (/dev/null, a terminal); created 0644. -1 with *why set otherwise.
int openAppend(const std::string& path, std::string* why);

/// Warnings about connections a listener dropped (strangers: junk, a wrong secret, a handshake too
/// slow), folded so that a flood or a slowloris on a job's ports cannot fill its log: the first
/// kVerbatim of each 10 s window are logged as they come; the rest are counted and summarized once
/// the window is over ("412 more connections dropped in the last 10 s, from 10.0.0.7 (400),
/// 10.0.0.9 (12)"), at the next drop, at flush() or at destruction. One per listener; not
/// thread-safe (its owner's thread).
class DropLog {
 public:
  static constexpr int kVerbatim = 3;
  static constexpr int64_t kWindowMs = 10000;
  DropLog(std::string who, uint32_t subsys) : who_(std::move(who)), subsys_(subsys) {}
  ~DropLog() { flush(); }
  DropLog(const DropLog&) = delete;
  DropLog& operator=(const DropLog&) = delete;
  /// A connection from `from` ("host:port") was dropped because `why`. `nowMs`: the monotonic clock.
  void drop(const std::string& from, const std::string& why, int64_t nowMs);
  /// Logs the summary of the folded drops if the window is over (`nowMs` < 0: whatever the time).
  void flush(int64_t nowMs = -1);
  /// Drops folded into a summary so far (tests).
  uint64_t folded() const { return foldedTotal_; }

 private:
  std::string who_;
  uint32_t subsys_;
  int64_t windowStartMs_ = -1;
  int inWindow_ = 0;  // drops logged or folded in this window
  uint64_t foldedTotal_ = 0;
  std::vector<std::pair<std::string, uint64_t>> folded_;  // by source host, this window
  uint64_t foldedCount_ = 0;
  std::string lastWhy_;
};

}  // namespace c4

#define C4_LOG(level, subsys, ...)                                                        \
  do {                                                                                    \
    if (::c4::logEnabled(::c4::LogLevel::level, (subsys)))                                \
      ::c4::logMessage(::c4::LogLevel::level, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define C4_WARN(subsys, ...) C4_LOG(kWarn, subsys, __VA_ARGS__)
/// A warning printed whatever C4_DEBUG says: for what the user must not miss (a refused setting, a
/// fallback that changes what the program exposes). Rare by construction: never on a hot path.
#define C4_WARN_ALWAYS(subsys, ...) ::c4::logMessage(::c4::LogLevel::kWarn, (subsys), __FILE__, __LINE__, __VA_ARGS__)
#define C4_INFO(subsys, ...) C4_LOG(kInfo, subsys, __VA_ARGS__)
#define C4_TRACE(subsys, ...) C4_LOG(kTrace, subsys, __VA_ARGS__)
