#include "common/logging.hpp"

#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
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
#include "common/status.hpp"

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
             "Write the log to this file instead of stderr, appended; %h expands to the host name, %p to the pid, %% "
             "to %; a symbolic link or FIFO is refused (the log stays on stderr, saying why)")

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
  std::string refused;
  if (!file.empty() && level > 0) {
    const std::string path = expandPathPattern(file);
    if (path == "/dev/stdout") {
      s.out = stdout;
    } else if (path == "/dev/stderr") {
      s.out = stderr;
    } else {
      std::string why;
      const int fd = openAppend(path, &why);
      FILE* f = fd >= 0 ? fdopen(fd, "a") : nullptr;
      if (f != nullptr) {
        setvbuf(f, nullptr, _IOLBF, 0);
        s.out = f;
      } else {
        if (fd >= 0) close(fd);
        refused = "C4_DEBUG_FILE=" + file + ": " + (why.empty() ? std::string(strerror(errno)) : why) +
                  "; logging to standard error";
      }
    }
  }
  s.level.store(level);
  // Said once, where the log goes now (the lock is not held by the caller of init during it).
  if (!refused.empty() && level >= static_cast<int>(LogLevel::kWarn))
    fprintf(s.out, "%s:%d:%ld c4 WARN %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)), refused.c_str());
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

void DropLog::drop(const std::string& from, const std::string& why, int64_t nowMs) {
  flush(nowMs);
  if (windowStartMs_ < 0) windowStartMs_ = nowMs;
  if (++inWindow_ <= kVerbatim) {
    const char* more = inWindow_ == kVerbatim ? " (further drops in the next 10 s are counted, not logged)" : "";
    if (logEnabled(LogLevel::kWarn, subsys_))
      logMessage(LogLevel::kWarn, subsys_, __FILE__, __LINE__, "%s: dropped connection from %s: %s%s", who_.c_str(),
                 from.c_str(), why.c_str(), more);
    return;
  }
  // Folded: counted per source host (the port changes with every connection).
  const std::string host = from.substr(0, from.rfind(':'));
  ++foldedCount_;
  ++foldedTotal_;
  lastWhy_ = why;
  for (auto& [h, n] : folded_)
    if (h == host) {
      ++n;
      return;
    }
  folded_.emplace_back(host, 1);
}

void DropLog::flush(int64_t nowMs) {
  if (windowStartMs_ < 0 || (nowMs >= 0 && nowMs - windowStartMs_ < kWindowMs)) return;
  if (foldedCount_ > 0 && logEnabled(LogLevel::kWarn, subsys_)) {
    std::sort(folded_.begin(), folded_.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::string from;
    for (size_t i = 0; i < folded_.size() && i < 4; ++i)
      from += (i ? ", " : "") + folded_[i].first + " (" + std::to_string(folded_[i].second) + ")";
    if (folded_.size() > 4) from += strFormat(" and %zu more hosts", folded_.size() - 4);
    const int64_t spanS = nowMs >= 0 ? (nowMs - windowStartMs_) / 1000 : kWindowMs / 1000;
    logMessage(LogLevel::kWarn, subsys_, __FILE__, __LINE__,
               "%s: %llu more connections dropped in the last %lld s, from %s (the last: %s)", who_.c_str(),
               static_cast<unsigned long long>(foldedCount_), static_cast<long long>(spanS), from.c_str(),
               lastWhy_.c_str());
  }
  windowStartMs_ = -1;
  inWindow_ = 0;
  foldedCount_ = 0;
  folded_.clear();
}

std::string expandPathPattern(const std::string& pattern, int rank) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'h') {
      char h[256] = {0};
      gethostname(h, sizeof(h) - 1);
      if (char* dot = strchr(h, '.')) *dot = 0;  // the short name, as log lines say it
      out += h;
    } else if (c == 'p') {
      out += std::to_string(getpid());
    } else if (c == 'r' && rank >= 0) {
      out += std::to_string(rank);
    } else if (c == '%') {
      out += '%';
    } else {
      out += '%';
      out += c;
    }
  }
  return out;
}

int openAppend(const std::string& path, std::string* why) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int e = errno;
    *why = e == ELOOP ? "is a symbolic link, not followed" : e == ENXIO ? "is a FIFO nobody reads" : strerror(e);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) {
    close(fd);
    *why = "is not a regular file";
    return -1;
  }
  (void)fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);  // writes may block again (a full disk, a slow terminal)
  return fd;
}

}  // namespace c4
