// Logging filtered by level and subsystem, like NCCL's: C4_DEBUG=WARN|INFO|TRACE (NCCL_DEBUG too),
// C4_DEBUG_SUBSYS=INIT,COLL,... (a leading ^ excludes), C4_DEBUG_FILE=path with %h (host) and %p (pid).
#pragma once

#include <cstdint>
#include <string>

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
