#include "trace/recorder.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "common/clock.hpp"
#include "common/fdio.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"

namespace c4 {
namespace trace {

C4_PARAM_STR(Trace, "C4_TRACE", nullptr, "op", "0|off|none|op|1|step|2", kParamNone,
             "Event tracer level: 0 (off), op (one event per operation, the default: cheap enough to leave on), "
             "step (also every send/receive/local step); see docs/tracing.md")
C4_PARAM_INT(TraceBuffer, "C4_TRACE_BUFFER", nullptr, 65536, 16, int64_t{1} << 30, kParamNone,
             "Events kept per communicator in the trace ring (rounded up to a power of two; 40 bytes each); older "
             "events are overwritten")
C4_PARAM_STR(TraceDir, "C4_TRACE_DIR", nullptr, "", {}, kParamNone,
             "Where trace files are written (at finalize/destroy/abort, fatal signals, SIGUSR2, trace::flush); "
             "default $TMPDIR/c4trace-<uid>/<job> (TMPDIR: /tmp if unset; a directory private to the user, mode "
             "0700) with <job> = SLURM_JOB_ID, TORCHELASTIC_RUN_ID or the first communicator's tag")
C4_PARAM_INT(TraceKeepDays, "C4_TRACE_KEEP_DAYS", nullptr, 7, 0, 36500, kParamNone,
             "Job directories under the default trace directory untouched for this many days are removed when a "
             "process starts tracing there (never in a C4_TRACE_DIR); 0 = keep everything")
C4_PARAM_INT(TraceSignals, "C4_TRACE_SIGNALS", nullptr, 1, 0, 1, kParamNone,
             "1: dump traces on SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT/SIGTERM (then the previous handler runs) and on "
             "SIGUSR2 (on demand); 0: install no signal handler")
C4_PARAM_STR(TraceClock, "C4_TRACE_CLOCK", nullptr, "auto", "auto|tsc|monotonic", kParamNone,
             "Trace timestamps: auto (the TSC if invariant, else CLOCK_MONOTONIC), tsc, monotonic")
C4_PARAM_INT(TraceTestSkewNs, "C4_TRACE_TEST_SKEW_NS", nullptr, 0, -(int64_t{1} << 50), int64_t{1} << 50, kParamNone,
             "Testing only: ns added to this process's trace clock (checks that c4-trace recovers clock offsets)")

namespace detail {
bool gUseTsc = false;
}

namespace {

// ---- clock ----
std::once_flag gClockOnce;
std::atomic<int64_t> gSkewNs{0};  // test-only, re-read at each Recorder::init
uint64_t gAnchorTicks = 0;
int64_t gAnchorNs = 0;
// TSC ticks per ns; 0 until first needed (rateNow), so that init never waits for a calibration.
std::atomic<double> gTicksPerNs{1.0};

int64_t monoNs() { return ::c4::detail::nowNs(); }

bool tscInvariant() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8))) return true;
  // Some hypervisors hide the CPUID bit but the kernel still reports a constant, non-stop TSC.
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 5, "flags") != 0) continue;
    return line.find(" constant_tsc") != std::string::npos && line.find(" nonstop_tsc") != std::string::npos;
  }
#endif
  return false;
}

void calibrate() {
  gSkewNs.store(paramTraceTestSkewNs(), std::memory_order_relaxed);
  const std::string mode = paramTraceClock();
  bool tsc = false;
  if (mode == "tsc" || mode == "auto") tsc = tscInvariant();
  if (mode == "tsc" && !tsc) C4_WARN(kLogInit, "C4_TRACE_CLOCK=tsc: no invariant TSC here; using CLOCK_MONOTONIC");
  detail::gUseTsc = tsc;
  gAnchorTicks = ticks();
  gAnchorNs = clockNs();
  gTicksPerNs.store(tsc ? 0.0 : 1.0);
}

/// The TSC rate measured against CLOCK_MONOTONIC from the process's clock anchor to now (a baseline
/// of at least 2 ms: good to ~1e-4; files also carry anchors with a long baseline). The first caller
/// may wait for the rest of the 2 ms, unless `mayWait` is false (a signal handler's dump): then the
/// rate is taken over whatever time passed and not kept.
double rateNow(bool mayWait) {
  double r = gTicksPerNs.load(std::memory_order_acquire);
  if (r > 0) return r;
  uint64_t t = ticks();
  int64_t ns = clockNs();
  if (mayWait) {
    while (ns - gAnchorNs < 2000000) {
      t = ticks();
      ns = clockNs();
    }
  } else if (ns <= gAnchorNs) {
    return 0;  // c4-trace then uses the file's anchors
  }
  r = static_cast<double>(t - gAnchorTicks) / static_cast<double>(ns - gAnchorNs);
  if (!mayWait) return r;
  if (!(r > 0.01 && r < 100)) {
    // Not a usable TSC after all; timestamps taken so far are lost to the conversion.
    C4_WARN(kLogInit, "trace: TSC calibration gave %g ticks/ns; using CLOCK_MONOTONIC", r);
    detail::gUseTsc = false;
    gAnchorTicks = ticks();
    gAnchorNs = clockNs();
    r = 1.0;
  }
  gTicksPerNs.store(r, std::memory_order_release);
  return r;
}

// ---- directory ----
std::mutex gDirMu;
std::string gDir;          // resolved once per process
std::string gDefaultBase;  // the per-user base when gDir is the default location, else ""
bool gBaseChecked = false;
std::atomic<bool> gDirRefused{false};  // the default base is not private: traces stay in memory

void copyStr(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string resolveDir(const std::string& firstTag) {
  std::lock_guard<std::mutex> g(gDirMu);
  if (!gDir.empty()) return gDir;
  std::string d = paramTraceDir();
  if (d.empty()) {
    std::string job;
    for (const char* v : {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
      const char* e = getenv(v);
      if (e && *e && job.empty()) job = e;
    }
    if (job.empty()) job = firstTag;
    for (char& c : job)
      if (c == '/' || c == '\0') c = '_';
    const char* tmp = getenv("TMPDIR");
    gDefaultBase = std::string(tmp && *tmp == '/' ? tmp : "/tmp") + "/c4trace-" + std::to_string(geteuid());
    d = gDefaultBase + "/" + job;
  }
  gDir = d;
  return gDir;
}

/// Removes the job directories of `base` untouched for C4_TRACE_KEEP_DAYS (their trace files, then
/// the directory; anything else in them keeps the directory).
void pruneOldJobs(const std::string& base) {
  const int64_t days = paramTraceKeepDays();
  if (days <= 0) return;
  DIR* d = opendir(base.c_str());
  if (!d) return;
  const time_t cutoff = time(nullptr) - static_cast<time_t>(days) * 86400;
  int removed = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string job = base + "/" + e->d_name;
    struct stat st;
    if (lstat(job.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_mtime >= cutoff) continue;
    if (DIR* jd = opendir(job.c_str())) {
      while (dirent* f = readdir(jd)) {
        const std::string name = f->d_name;
        const bool trace = name.size() > 4 && (name.compare(name.size() - 4, 4, ".c4t") == 0 ||
                                               name.find(".c4t.tmp") != std::string::npos);
        if (trace) unlink((job + "/" + name).c_str());
      }
      closedir(jd);
    }
    if (rmdir(job.c_str()) == 0) ++removed;
  }
  closedir(d);
  if (removed)
    C4_INFO(kLogInit, "trace: removed %d job director%s of %s older than %lld days (C4_TRACE_KEEP_DAYS)", removed,
            removed == 1 ? "y" : "ies", base.c_str(), static_cast<long long>(days));
}

/// The default base must be this user's own directory, not reachable by others: it is made 0700,
/// and one that already exists is refused (traces then stay in memory) unless it is a real
/// directory owned by this user with no group or other access.
Status checkPrivateBase(const std::string& base) {
  if (mkdir(base.c_str(), 0700) != 0 && errno != EEXIST)
    return makeError(Code::kSystemError, "trace: cannot create %s: %s", base.c_str(), strerror(errno));
  struct stat st;
  if (lstat(base.c_str(), &st) != 0)
    return makeError(Code::kSystemError, "trace: cannot inspect %s: %s", base.c_str(), strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
    return makeError(Code::kSystemError,
                     "trace: %s is not a private directory of this user (%s, owner %u, mode %03o; expected a "
                     "directory owned by uid %u, mode 0700): traces stay in memory; set C4_TRACE_DIR",
                     base.c_str(),
                     S_ISLNK(st.st_mode)   ? "a symbolic link"
                     : S_ISDIR(st.st_mode) ? "a directory"
                                           : "not a directory",
                     static_cast<unsigned>(st.st_uid), static_cast<unsigned>(st.st_mode & 0777),
                     static_cast<unsigned>(geteuid()));
  return Status::ok();
}

Status makeDirs(const std::string& dir) {
  mode_t mode = 0755;
  {
    std::lock_guard<std::mutex> g(gDirMu);
    if (!gDefaultBase.empty() && dir.compare(0, gDefaultBase.size(), gDefaultBase) == 0) {
      mode = 0700;
      if (!gBaseChecked) {
        gBaseChecked = true;
        Status st = checkPrivateBase(gDefaultBase);
        gDirRefused.store(!st.isOk());
        if (st.isOk()) pruneOldJobs(gDefaultBase);
      }
      if (gDirRefused.load())
        return makeError(Code::kSystemError, "trace: %s is not private to this user: traces stay in memory",
                         gDefaultBase.c_str());
    }
  }
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), mode) != 0 && errno != EEXIST)
      return makeError(Code::kSystemError, "trace: cannot create directory %s: %s", cur.c_str(), strerror(errno));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return makeError(Code::kSystemError, "trace: %s is not a directory", dir.c_str());
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return makeError(Code::kSystemError, "trace: cannot write into %s: %s", dir.c_str(), strerror(errno));
  return Status::ok();
}

// ---- registry of live recorders (for signal dumps) ----
constexpr int kMaxRecorders = 4096;
std::atomic<Recorder*> gRegistry[kMaxRecorders];
std::atomic<int> gDumpers{0};
std::atomic<int> gInFatal{0};

// ---- async-signal-safe helpers (and c4::writeAll of common/fdio.hpp) ----
bool pwriteAll(int fd, const void* data, size_t bytes, off_t off) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t k = pwrite(fd, p, bytes, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    off += k;
    bytes -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

void initClock() { std::call_once(gClockOnce, calibrate); }

int64_t clockNs() { return monoNs() + gSkewNs.load(std::memory_order_relaxed); }

int64_t configuredSkewNs() { return paramTraceTestSkewNs(); }

double ticksPerNs() { return rateNow(true); }

int64_t toNs(uint64_t t) {
  return gAnchorNs + static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(t - gAnchorTicks)) / rateNow(true));
}

std::string directory() {
  std::lock_guard<std::mutex> g(gDirMu);
  return gDir.empty() ? paramTraceDir() : gDir;
}

const char* levelName(int level) { return level == 0 ? "0" : level == 1 ? "op" : "step"; }

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

/// `bytes` of zeroed, populated memory, 2 MiB-aligned so that the kernel can back it with huge
/// pages; nullptr (errno set) on failure. Freed with unmapRing.
void* mapRing(size_t bytes) {
  const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = start + len, rawEnd = base + len + kHugePage;
  if (rawEnd > end) munmap(reinterpret_cast<void*>(end), rawEnd - end);
  void* mem = reinterpret_cast<void*>(start);
  (void)madvise(mem, len, MADV_HUGEPAGE);  // advisory: small pages still work
#ifdef MADV_POPULATE_WRITE
  if (madvise(mem, len, MADV_POPULATE_WRITE) != 0)
#endif
    memset(mem, 0, len);  // older kernels: touch every page
  return mem;
}

void unmapRing(void* mem, size_t bytes) {
  if (mem) munmap(mem, (bytes + kHugePage - 1) / kHugePage * kHugePage);
}
}  // namespace

Recorder::~Recorder() {
  if (registrySlot_ >= 0) {
    gRegistry[registrySlot_].store(nullptr, std::memory_order_seq_cst);
    // A signal dump may be reading this ring right now: wait for it (bounded, never hang).
    for (int i = 0; i < 1000 && gDumpers.load(std::memory_order_seq_cst) > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  unmapRing(slots_, capacity_ * sizeof(Event));
  free(names_);
}

Status Recorder::init(const RecorderInfo& info) {
  initClock();
  // Testing: a process (e.g. a forked test rank) may set C4_TRACE_TEST_SKEW_NS after the clock started.
  const int64_t skew = paramTraceTestSkewNs();
  const int64_t oldSkew = gSkewNs.exchange(skew);
  if (skew != oldSkew) gAnchorNs += skew - oldSkew;
  rank_ = info.rank;
  nranks_ = info.nranks;
  copyStr(tag_, sizeof(tag_), info.commTag);
  copyStr(name_, sizeof(name_), info.commName);
  copyStr(host_, sizeof(host_), info.host);
  anchorTicks_ = ticks();
  anchorNs_ = clockNs();
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  realtimeNs_ = static_cast<int64_t>(rt.tv_sec) * 1000000000LL + rt.tv_nsec;

  const std::string lv = paramTrace();  // one of its choices (the registry refuses others)
  Level want = Level::kOp;
  if (lv == "0" || lv == "off" || lv == "none") {
    want = Level::kOff;
  } else if (lv == "step" || lv == "2") {
    want = Level::kStep;
  }
  const std::string dir = resolveDir(info.commTag);
  std::string path = dir + "/" + info.commTag + ".r" + std::to_string(info.rank) + ".c4t";
  copyStr(path_, sizeof(path_), path);
  if (want == Level::kOff) return Status::ok();
  C4_CHECK(setLevel(want));
  static std::once_flag announce;
  std::call_once(announce, [&] {
    C4_INFO(kLogInit, "trace: level %s, %zu events per communicator, files in %s (%s clock)", levelName(level_),
            capacity_, dir.c_str(), detail::gUseTsc ? "tsc" : "monotonic");
  });
  return Status::ok();
}

Status Recorder::allocate() {
  if (slots_) return Status::ok();
  int64_t want = std::max<int64_t>(16, paramTraceBuffer());
  size_t cap = 16;
  while (cap < static_cast<size_t>(want) && cap < (size_t{1} << 30)) cap <<= 1;
  // Pre-faulted, so the hot path never takes a page fault (letting the ring fault in as it fills cost
  // one fault per ~100 events: +20 ns per 8-byte AllReduce until the first wrap). In 4 KiB pages
  // that was 0.7 to 1 ms of every rank's init, so the ring asks for transparent huge pages: two
  // faults instead of ~640.
  void* mem = mapRing(cap * sizeof(Event));
  if (mem == nullptr)
    return makeError(Code::kSystemError, "rank %d: trace: cannot map %zu bytes for %zu events: %s", rank_,
                     cap * sizeof(Event), cap, strerror(errno));
  names_ = static_cast<char*>(calloc(1, kNamesBytes));
  if (!names_) {
    unmapRing(mem, cap * sizeof(Event));
    return makeError(Code::kSystemError, "rank %d: trace: cannot allocate the name table", rank_);
  }
  namesUsed_.store(1, std::memory_order_release);  // id 0 is ""
  static_assert(sizeof(std::atomic<uint64_t>) == 8, "atomic words are plain words");
  slots_ = static_cast<std::atomic<uint64_t>*>(mem);
  capacity_ = cap;
  mask_ = cap - 1;
  Status st = makeDirs(directory());
  if (!st.isOk()) {
    // Printed whatever C4_DEBUG says (a trace the user expects would silently not exist), once per
    // process and directory.
    static std::mutex* mu = new std::mutex();
    static auto* told = new std::set<std::string>();
    std::lock_guard<std::mutex> g(*mu);
    if (told->insert(directory()).second)
      C4_WARN_ALWAYS(kLogInit, "rank %d: %s (traces stay in memory and are not written)", rank_, st.message().c_str());
  }
  for (int i = 0; i < kMaxRecorders; ++i) {
    Recorder* expected = nullptr;
    if (gRegistry[i].compare_exchange_strong(expected, this)) {
      registrySlot_ = i;
      break;
    }
  }
  installSignalHandlers();
  return Status::ok();
}

Status Recorder::setLevel(Level l) {
  int v = static_cast<int>(l);
  if (v < 0 || v > 2)
    return makeError(Code::kInvalidArgument, "trace level %d: expected 0 (off), 1 (op) or 2 (step)", v);
  if (v > 0) C4_CHECK(allocate());
  level_ = v;
  return Status::ok();
}

uint32_t Recorder::intern(const char* text, size_t maxLen) {
  if (!names_ || !text || !*text) return 0;
  std::lock_guard<std::mutex> g(namesMu_);
  // Deduplicate by scanning only when the table is small; otherwise append (bounded by the table).
  const uint32_t used = namesUsed_.load(std::memory_order_relaxed);
  if (used <= 8192) {
    for (uint32_t off = 1; off < used;) {
      if (strcmp(names_ + off, text) == 0) return off;
      off += static_cast<uint32_t>(strlen(names_ + off)) + 1;
    }
  }
  const size_t len = std::min<size_t>(strlen(text), maxLen);
  if (used + len + 1 > kNamesBytes) return 0;
  memcpy(names_ + used, text, len);
  names_[used + len] = '\0';
  namesUsed_.store(used + static_cast<uint32_t>(len) + 1, std::memory_order_release);
  return used;
}

void Recorder::error(int code, const std::string& message, int peer) {
  if (!level_) return;
  Event e;
  e.type = EventType::kError;
  e.t0 = e.t1 = ticks();
  e.bytes = static_cast<uint64_t>(code);
  e.seq = intern(message.c_str());
  e.peer = peer;
  record(e);
}

void Recorder::setTransports(const std::string& names) {
  const size_t n = std::min(names.size(), sizeof(transports_) - 1);
  memcpy(transports_, names.data(), n);
  transports_[n] = 0;
}

void Recorder::note(const std::string& text) {
  if (!level_) return;
  Event e;
  e.type = EventType::kDiag;
  e.t0 = e.t1 = ticks();
  // C4D's records are whole JSON objects: cut, c4-trace could not read them.
  e.seq = intern(text.c_str(), text.compare(0, 4, "C4D ") == 0 ? 4096 : 255);
  record(e);
}

void Recorder::plan(PlanEvent what, const std::string& text, int peer, int lane, uint64_t bytes, uint64_t t0,
                    uint64_t t1) {
  if (!level_) return;
  Event e;
  e.type = EventType::kPlan;
  e.redop = static_cast<uint8_t>(what);
  e.t0 = t0 != 0 ? t0 : ticks();
  e.t1 = t1 != 0 ? t1 : e.t0;
  e.peer = peer;
  e.lane = static_cast<uint8_t>(std::min(lane, 254));
  e.bytes = bytes;
  e.seq = intern(text.c_str());
  record(e);
}

void Recorder::setClock(int which, const ClockSample& s) {
  clock_[which] = s;
  clockSamples_ = std::max(clockSamples_, which + 1);
}

bool Recorder::dumpRaw(DumpReason why) {
  if (!slots_ || !path_[0]) return false;
  char tmp[sizeof(path_) + 8];
  size_t n = strlen(path_);
  memcpy(tmp, path_, n);
  memcpy(tmp + n, ".tmp", 5);
  if (gDirRefused.load(std::memory_order_relaxed)) return false;
  // Never through a link planted at the temporary name, never into an existing file: the stale
  // name goes first, then the file is created anew (O_EXCL does not follow a link), readable by
  // its owner only; rename() replaces a link at the final name, it does not write through it.
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const uint64_t head = head_.load(std::memory_order_acquire);
  // The slot at head - capacity is the one the writer refills next: never read it.
  const uint64_t first = head >= capacity_ ? head - capacity_ + 1 : 0;
  FileHeader h;
  memset(static_cast<void*>(&h), 0, sizeof(h));
  memcpy(h.magic, kFileMagic, sizeof(h.magic));
  h.version = kFileVersion;
  h.headerBytes = sizeof(FileHeader);
  h.eventBytes = sizeof(Event);
  h.rank = rank_;
  h.nranks = nranks_;
  h.pid = static_cast<int32_t>(getpid());
  h.level = static_cast<uint32_t>(level_);
  h.reason = static_cast<uint32_t>(why);
  h.firstIndex = first;
  h.nEvents = head - first;
  h.anchorTicks0 = anchorTicks_;
  h.anchorNs0 = anchorNs_;
  h.ticksPerNs = rateNow(false);  // signal-safe: no waiting, no locks
  h.realtimeNs0 = realtimeNs_;
  h.clock[0] = clock_[0];
  h.clock[1] = clock_[1];
  h.clockSamples = static_cast<uint32_t>(clockSamples_);
  memcpy(h.commTag, tag_, sizeof(h.commTag));
  memcpy(h.commName, name_, sizeof(h.commName));
  memcpy(h.host, host_, sizeof(h.host));
  memcpy(h.transports, transports_, sizeof(h.transports));
  bool ok = writeAll(fd, &h, sizeof(h));
  // Events [first, head) in at most two contiguous pieces of the ring.
  for (uint64_t i = first; ok && i < head;) {
    const uint64_t slot = i & mask_;
    const uint64_t run = std::min<uint64_t>(head - i, capacity_ - slot);
    ok = writeAll(fd, slots_ + slot * kWords, run * sizeof(Event));
    i += run;
  }
  const uint64_t head2 = head_.load(std::memory_order_acquire);
  const uint32_t namesBytes = names_ ? namesUsed_.load(std::memory_order_acquire) : 0;
  if (ok && namesBytes) ok = writeAll(fd, names_, namesBytes);
  h.validFrom = std::max(first, head2 >= capacity_ ? head2 - capacity_ + 1 : 0);
  h.totalEvents = head;
  h.namesBytes = namesBytes;
  h.anchorTicks1 = ticks();
  h.anchorNs1 = clockNs();
  if (ok) ok = pwriteAll(fd, &h, sizeof(h), 0);
  while (close(fd) != 0 && errno == EINTR) {
  }
  if (ok) ok = rename(tmp, path_) == 0;
  if (!ok) unlink(tmp);
  return ok;
}

Status Recorder::dump(DumpReason why, std::string* path) {
  if (!slots_) return makeError(Code::kInvalidUsage, "rank %d: tracing was never enabled (C4_TRACE=0)", rank_);
  C4_CHECK(makeDirs(directory()));
  gDumpers.fetch_add(1);
  bool ok = dumpRaw(why);
  int err = errno;
  gDumpers.fetch_sub(1);
  if (!ok) return makeError(Code::kSystemError, "rank %d: cannot write trace file %s: %s", rank_, path_, strerror(err));
  if (path) *path = path_;
  return Status::ok();
}

void Recorder::snapshot(std::vector<Event>* out, uint64_t* dropped) const {
  out->clear();
  if (!slots_) {
    if (dropped) *dropped = 0;
    return;
  }
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t first = head >= capacity_ ? head - capacity_ + 1 : 0;
  out->resize(head - first);
  for (uint64_t i = first; i < head; ++i) {
    uint64_t w[kWords];
    const std::atomic<uint64_t>* s = slots_ + (i & mask_) * kWords;
    for (size_t k = 0; k < kWords; ++k) w[k] = s[k].load(std::memory_order_relaxed);
    memcpy(&(*out)[i - first], w, sizeof(Event));
  }
  const uint64_t head2 = head_.load(std::memory_order_acquire);
  const uint64_t valid = head2 >= capacity_ ? head2 - capacity_ + 1 : 0;
  if (valid > first) out->erase(out->begin(), out->begin() + static_cast<ptrdiff_t>(std::min(valid, head) - first));
  if (dropped) *dropped = head - out->size();
}

int dumpAllRaw(DumpReason why) {
  gDumpers.fetch_add(1);
  int n = 0;
  for (int i = 0; i < kMaxRecorders; ++i) {
    Recorder* r = gRegistry[i].load(std::memory_order_seq_cst);
    if (r && r->dumpRaw(why)) ++n;
  }
  gDumpers.fetch_sub(1);
  return n;
}

// ---- signals ----
namespace {
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM};
struct sigaction gOld[65];

void chain(int sig, siginfo_t* info, void* ctx) {
  struct sigaction& old = gOld[sig];
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) old.sa_sigaction(sig, info, ctx);
    return;
  }
  if (old.sa_handler == SIG_IGN) return;
  if (old.sa_handler == SIG_DFL) {
    if (sig == SIGUSR2) return;  // on-demand dump only: do not terminate
    // Restore the default and re-raise: delivered when this handler returns (the signal is blocked now).
    sigaction(sig, &old, nullptr);
    raise(sig);
    return;
  }
  old.sa_handler(sig);
}

void onSignal(int sig, siginfo_t* info, void* ctx) {
  const int savedErrno = errno;
  if (sig == SIGUSR2) {
    dumpAllRaw(DumpReason::kRequest);
  } else if (gInFatal.fetch_add(1) == 0) {
    dumpAllRaw(DumpReason::kSignal);
  }
  errno = savedErrno;
  chain(sig, info, ctx);
}
}  // namespace

void installSignalHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (paramTraceSignals() == 0) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = onSignal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : kFatalSignals) sigaction(sig, &sa, &gOld[sig]);
    sigaction(SIGUSR2, &sa, &gOld[SIGUSR2]);
  });
}

}  // namespace trace
}  // namespace c4
