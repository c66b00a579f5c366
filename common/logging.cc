#include "common/logging.hpp"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/params.hpp"

namespace c4 {

namespace {
// C4_DEBUG_SUBSYS: every name must be a subsystem (NCCL's own names arrive through NCCL_DEBUG_SUBSYS,
// where a refused value is only a warning).
bool checkSubsys(const std::string& spec, std::string* why);
// C4_DEBUG: a level, in any case (as NCCL_DEBUG).
constexpr const char* kLevelNames[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
int levelOf(const std::string& text) {
  for (int i = 1; i < 6; ++i)
    if (strcasecmp(text.c_str(), kLevelNames[i]) == 0) return i;
  return -1;
}
bool checkLevel(const std::string& text, std::string* why) {
  if (levelOf(text) > 0) return true;
  *why = "expected VERSION, WARN, INFO, ABORT or TRACE";
  return false;
}
}  // namespace

C4_PARAM_STR(Debug, "C4_DEBUG", "NCCL_DEBUG", "", checkLevel, kParamNone,
             "Log level: VERSION, WARN, INFO, ABORT or TRACE (default: none; refused settings are reported "
             "whatever the level)")
C4_PARAM_STR(DebugSubsys, "C4_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS",
             "INIT,COLL,P2P,SHM,NET,BOOTSTRAP,TUNING,ENV,SCHED,PLAN", checkSubsys, kParamNone,
             "Comma list of subsystems to log (INIT, COLL, P2P, SHM, NET, BOOTSTRAP, TUNING, ENV, ALLOC, CALL, PLAN, "
             "SCHED, ALL); a leading ^ excludes the listed ones")
C4_PARAM_STR(DebugFile, "C4_DEBUG_FILE", "NCCL_DEBUG_FILE", "", {}, kParamNone,
             "Write the log to this file instead of stderr; %h expands to the host name, %p to the pid")

namespace {

struct LogState {
  std::atomic<int> level{-1};  // -1: not initialized
  std::atomic<uint32_t> mask{0};
  std::mutex mu;
  FILE* out = stderr;
  char host[64] = {0};
  LogState() {
    gethostname(host, sizeof(host) - 1);
    if (char* dot = strchr(host, '.')) *dot = 0;
  }
};

LogState& state() {
  static LogState* s = new LogState();  // leaked: usable during static destruction
  return *s;
}

}  // namespace

namespace {

constexpr struct {
  const char* name;
  uint32_t bit;
} kSubsysNames[] = {{"INIT", kLogInit},   {"COLL", kLogColl},           {"P2P", kLogP2p},       {"SHM", kLogShm},
                    {"NET", kLogNet},     {"BOOTSTRAP", kLogBootstrap}, {"TUNING", kLogTuning}, {"ENV", kLogEnv},
                    {"ALLOC", kLogAlloc}, {"CALL", kLogCall},           {"SCHED", kLogSched},   {"PLAN", kLogPlan},
                    {"ALL", kLogAll}};

// Calls f(token, bit) for each name of a comma list (bit 0: unknown); true if the list is inverted.
template <typename F>
bool forEachSubsys(const std::string& spec, F f) {
  bool invert = !spec.empty() && spec[0] == '^';
  size_t pos = invert ? 1 : 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string tok = spec.substr(pos, end - pos);
    uint32_t bit = 0;
    for (auto& n : kSubsysNames)
      if (strcasecmp(tok.c_str(), n.name) == 0) bit = n.bit;
    f(tok, bit);
    pos = end + 1;
  }
  return invert;
}

bool checkSubsys(const std::string& spec, std::string* why) {
  std::string bad;
  forEachSubsys(spec, [&](const std::string& tok, uint32_t bit) {
    if (bit == 0 && bad.empty()) bad = tok;
  });
  if (bad.empty()) return true;
  *why = "unknown subsystem '" + bad + "'";
  return false;
}

}  // namespace

uint32_t logSubsysMask(const std::string& spec) {
  uint32_t mask = 0;
  bool invert = forEachSubsys(spec, [&](const std::string&, uint32_t bit) { mask |= bit; });
  return invert ? ~mask : mask;
}

namespace {

// The settings are read before the state's lock is taken: a refused value is reported through
// logMessage, which takes it.
struct LogConfig {
  std::string level = paramDebug();
  std::string subsys = paramDebugSubsys();
  std::string file = paramDebugFile();
};

void init(LogState& s, const LogConfig& cfg) {
  const int level = std::max(0, levelOf(cfg.level));
  s.mask.store(logSubsysMask(cfg.subsys));
  const std::string& file = cfg.file;
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
    LogConfig cfg;
    std::lock_guard<std::mutex> g(s.mu);
    if (s.level.load() < 0) init(s, cfg);
    lv = s.level.load();
  }
  if (static_cast<int>(level) > lv) return false;
  // Warnings are always shown when enabled, whatever the subsystem mask.
  return level == LogLevel::kWarn || (s.mask.load(std::memory_order_relaxed) & subsys) != 0;
}

void logReload() {
  LogState& s = state();
  LogConfig cfg;
  std::lock_guard<std::mutex> g(s.mu);
  if (s.out != stderr) fclose(s.out);
  s.out = stderr;
  init(s, cfg);
}

void logMessage(LogLevel level, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  (void)subsys;
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
            kLevelNames[static_cast<int>(level)], base, line, msg);
  else
    fprintf(s.out, "%s:%d:%ld c4 %s %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)),
            kLevelNames[static_cast<int>(level)], msg);
}

}  // namespace c4
