#include "common/logging.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/params.hpp"

namespace c4 {

C4_PARAM_STR(Debug, "C4_DEBUG", "NCCL_DEBUG", "", "Log level: VERSION, WARN, INFO, ABORT or TRACE (default: none)")
C4_PARAM_STR(DebugSubsys, "C4_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS",
             "INIT,COLL,P2P,SHM,NET,BOOTSTRAP,TUNING,ENV,SCHED,PLAN",
             "Comma list of subsystems to log (INIT, COLL, P2P, SHM, NET, BOOTSTRAP, TUNING, ENV, ALLOC, CALL, PLAN, "
             "SCHED, ALL); a leading ^ excludes the listed ones")
C4_PARAM_STR(DebugFile, "C4_DEBUG_FILE", "NCCL_DEBUG_FILE", "",
             "Write the log to this file instead of stderr; %h expands to the host name, %p to the pid")

namespace {

struct LogState {
  std::atomic<int> level{-1};  // -1: not initialized
  std::atomic<uint32_t> mask{0};
  std::mutex mu;
  FILE* out = stderr;
  char host[64] = {0};
};

LogState& state() {
  static LogState* s = new LogState();  // leaked: usable during static destruction
  return *s;
}

}  // namespace

uint32_t logSubsysMask(const std::string& spec) {
  static const struct {
    const char* name;
    uint32_t bit;
  } kNames[] = {{"INIT", kLogInit},   {"COLL", kLogColl},           {"P2P", kLogP2p},       {"SHM", kLogShm},
                {"NET", kLogNet},     {"BOOTSTRAP", kLogBootstrap}, {"TUNING", kLogTuning}, {"ENV", kLogEnv},
                {"ALLOC", kLogAlloc}, {"CALL", kLogCall},           {"SCHED", kLogSched},   {"PLAN", kLogPlan},
                {"ALL", kLogAll}};
  bool invert = !spec.empty() && spec[0] == '^';
  uint32_t mask = 0;
  size_t pos = invert ? 1 : 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string tok = spec.substr(pos, end - pos);
    for (auto& n : kNames)
      if (strcasecmp(tok.c_str(), n.name) == 0) mask |= n.bit;
    pos = end + 1;
  }
  return invert ? ~mask : mask;
}

namespace {

void init(LogState& s) {
  std::string lv = paramDebug();
  int level = 0;
  if (strcasecmp(lv.c_str(), "VERSION") == 0)
    level = 1;
  else if (strcasecmp(lv.c_str(), "WARN") == 0)
    level = 2;
  else if (strcasecmp(lv.c_str(), "INFO") == 0)
    level = 3;
  else if (strcasecmp(lv.c_str(), "ABORT") == 0)
    level = 4;
  else if (strcasecmp(lv.c_str(), "TRACE") == 0)
    level = 5;
  gethostname(s.host, sizeof(s.host) - 1);
  if (char* dot = strchr(s.host, '.')) *dot = 0;
  s.mask.store(logSubsysMask(paramDebugSubsys()));
  std::string file = paramDebugFile();
  if (!file.empty() && level > 0) {
    std::string path;
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') {
        path += s.host;
        ++i;
      } else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') {
        path += std::to_string(getpid());
        ++i;
      } else {
        path += file[i];
      }
    }
    if (FILE* f = fopen(path.c_str(), "a")) {
      setvbuf(f, nullptr, _IOLBF, 0);
      s.out = f;
    }
  }
  s.level.store(level);
}

// Read the settings when the library loads, before the program starts threads: a process that
// forks while another thread is inside a lazy first initialization would otherwise hand its child
// a lock nobody will ever release.
struct EagerInit {
  EagerInit() { (void)logEnabled(LogLevel::kNone, 0); }
} gEagerInit;

}  // namespace

bool logEnabled(LogLevel level, uint32_t subsys) {
  LogState& s = state();
  int lv = s.level.load(std::memory_order_relaxed);
  if (lv < 0) {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.level.load() < 0) init(s);
    lv = s.level.load();
  }
  if (static_cast<int>(level) > lv) return false;
  // Warnings are always shown when enabled, whatever the subsystem mask.
  return level == LogLevel::kWarn || (s.mask.load(std::memory_order_relaxed) & subsys) != 0;
}

void logReload() {
  LogState& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.out != stderr) fclose(s.out);
  s.out = stderr;
  init(s);
}

void logMessage(LogLevel level, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  (void)subsys;
  static const char* kNames[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  LogState& s = state();
  va_list ap;
  va_start(ap, fmt);
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  std::lock_guard<std::mutex> g(s.mu);
  if (level == LogLevel::kTrace)
    fprintf(s.out, "%s:%d:%ld c4 %s %s:%d %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)),
            kNames[static_cast<int>(level)], base, line, msg);
  else
    fprintf(s.out, "%s:%d:%ld c4 %s %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)),
            kNames[static_cast<int>(level)], msg);
}

}  // namespace c4
