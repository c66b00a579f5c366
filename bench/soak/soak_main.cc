// c4-soak: a long soak of c4comm. For a given duration it runs segments; each segment draws (from
// a seed all ranks share) a rank count (2-4), a transport (shm, tcp, auto), an algorithm, blocking
// or non-blocking, creates a communicator over that many of its rank processes, runs hundreds of
// random operations whose every result element is checked (soak_ops.hpp), and destroys it.
//
//   c4-soak --duration 1800 --json soak.json        # bench/soak/run.sh 1800
//
// The ranks are worker processes forked before any thread exists; each segment's rank 0 makes the
// unique id and this process (which never calls into c4comm) hands it to the others. It fails the
// run on a wrong result or a write out of bounds, a failed call, a hang (no rank reporting progress
// for --hang-timeout seconds: all ranks are killed), a rank that died, and a leak: after every
// segment each rank reports its resident set, live heap, open fds, threads and shared-memory
// mappings (docs/soak.md gives the bounds and why), and /dev/shm must hold nothing of the run at
// the end. Exit status 0 only when none of that happened.
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench/soak/soak_data.hpp"
#include "bench/soak/soak_ops.hpp"
#include "c4comm/c4comm.hpp"
#include "common/fdio.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define C4_SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define C4_SOAK_ASAN 1
#endif
#endif
#ifdef C4_SOAK_ASAN
// From <sanitizer/allocator_interface.h> (not installed with every compiler): bytes the sanitizer's
// allocator holds for the program, without its quarantine.
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace c4 {
namespace soak {
namespace {

constexpr const char* kProgram = "c4-soak";
#ifdef C4_SOAK_ASAN
constexpr const char* kRssNote = " (not checked under ASan)";
#else
constexpr const char* kRssNote = "";
#endif
constexpr int kMaxWorkers = 4;

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// ---- options -------------------------------------------------------------------------------------

struct Options {
  double duration = 60;  // seconds; no segment starts after it
  uint64_t seed = 0;     // 0: from the clock
  int minRanks = 2, maxRanks = 4;
  std::vector<std::string> transports{"shm", "tcp", "auto"};
  size_t maxBytes = 4u << 20;      // largest buffer of an operation
  int minOps = 100, maxOps = 400;  // operations per segment
  int nonblocking = -1;            // -1: mixed (a quarter of the segments), 0: never, 1: always
  bool randomAlgo = true;          // draw C4_ALGO, C4_LANES, C4_PROGRESS_THREAD per segment
  double progress = 5;             // seconds between progress lines
  double hangTimeout = 120;        // seconds without progress from a running rank
  int c4Timeout = 60;              // C4_TIMEOUT for the ranks (0: leave the environment's)
  double warmup = -1;              // seconds of warm-up for the leak baselines (-1: 20% of duration, at most 60)
  double rssBoundMiB = 8;          // resident set growth beyond the warm-up plateau
  double heapBoundKiB = 256;       // live heap growth beyond the warm-up plateau
  bool keepGoing = false;          // continue after wrong results
  std::string json;
  std::string traceDir;    // keep the ranks' traces here (default: a private directory, removed on a pass)
  std::string inject;      // wrong, oob, hang, fd-leak, heap-leak (hidden: show the checks work)
  std::string expectFail;  // hidden: exit 0 only if the run failed with this kind
  bool verbose = false;
};

void usage(FILE* out) {
  fprintf(out,
          "usage: %s [options]\n"
          "  --duration SEC        run segments for this long (default 60)\n"
          "  --seed N              master seed (default: from the clock; printed)\n"
          "  --ranks MIN-MAX       ranks per segment, 2..4 (default 2-4)\n"
          "  --transports LIST     comma list of shm,tcp,auto (default all)\n"
          "  --max-bytes N[K|M]    largest buffer of an operation (default 4M)\n"
          "  --ops MIN-MAX         operations per segment (default 100-400)\n"
          "  --nonblocking 0|1|mix non-blocking communicators: never, always, a quarter (default mix)\n"
          "  --fixed-config        leave C4_ALGO, C4_LANES, C4_PROGRESS_THREAD alone (default: drawn)\n"
          "  --progress SEC        seconds between progress lines (default 5)\n"
          "  --hang-timeout SEC    fail when a running rank reports nothing for this long (default 120)\n"
          "  --c4-timeout SEC      C4_TIMEOUT of the ranks (default 60; 0: the environment's)\n"
          "  --warmup SEC          leak baselines from this first part (default 20%% of the duration, <= 60)\n"
          "  --rss-bound MIB       resident set growth allowed past the warm-up plateau (default 8)\n"
          "  --heap-bound KIB      live heap growth allowed past the warm-up plateau (default 256)\n"
          "  --keep-going          do not stop at the first segment with wrong results\n"
          "  --json FILE           write a JSON summary (with the per-rank samples, for plot.py)\n"
          "  --trace-dir DIR       keep the ranks' c4comm traces in DIR (default: a private directory,\n"
          "                        removed when the run passes, kept and named when it fails)\n"
          "  --verbose             print every segment\n",
          kProgram);
}

bool parseSize(const char* s, size_t* out) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || v < 0) return false;
  if (*end == 'K' || *end == 'k')
    v *= 1024, ++end;
  else if (*end == 'M' || *end == 'm')
    v *= 1024 * 1024, ++end;
  else if (*end == 'G' || *end == 'g')
    v *= 1024.0 * 1024 * 1024, ++end;
  if (*end) return false;
  *out = static_cast<size_t>(v);
  return true;
}

bool parseRange(const char* s, int* lo, int* hi) {
  if (sscanf(s, "%d-%d", lo, hi) == 2) return *lo <= *hi;
  if (sscanf(s, "%d", lo) == 1) return *hi = *lo, true;
  return false;
}

bool parseOptions(int argc, char** argv, Options* o, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        *err = a + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "-h" || a == "--help") {
      usage(stdout);
      exit(0);
    } else if (a == "--keep-going") {
      o->keepGoing = true;
    } else if (a == "--verbose") {
      o->verbose = true;
    } else if (a == "--fixed-config") {
      o->randomAlgo = false;
    } else if (!(v = val())) {
      return false;
    } else if (a == "--duration") {
      o->duration = atof(v);
    } else if (a == "--seed") {
      o->seed = strtoull(v, nullptr, 0);
    } else if (a == "--ranks") {
      if (!parseRange(v, &o->minRanks, &o->maxRanks) || o->minRanks < 2 || o->maxRanks > kMaxWorkers)
        return *err = "--ranks: expected MIN-MAX within 2-4", false;
    } else if (a == "--transports") {
      o->transports.clear();
      std::string s = v;
      for (size_t p = 0; p <= s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        std::string t = s.substr(p, q - p);
        if (t != "shm" && t != "tcp" && t != "auto") return *err = "--transports: unknown '" + t + "'", false;
        if (std::find(o->transports.begin(), o->transports.end(), t) == o->transports.end()) o->transports.push_back(t);
        p = q + 1;
      }
    } else if (a == "--max-bytes") {
      if (!parseSize(v, &o->maxBytes) || o->maxBytes < 64) return *err = "--max-bytes: expected a size >= 64", false;
    } else if (a == "--ops") {
      if (!parseRange(v, &o->minOps, &o->maxOps) || o->minOps < 1) return *err = "--ops: expected MIN-MAX", false;
    } else if (a == "--nonblocking") {
      o->nonblocking = strcmp(v, "mix") == 0 ? -1 : atoi(v);
    } else if (a == "--progress") {
      o->progress = atof(v);
    } else if (a == "--hang-timeout") {
      o->hangTimeout = atof(v);
    } else if (a == "--c4-timeout") {
      o->c4Timeout = atoi(v);
    } else if (a == "--warmup") {
      o->warmup = atof(v);
    } else if (a == "--rss-bound") {
      o->rssBoundMiB = atof(v);
    } else if (a == "--heap-bound") {
      o->heapBoundKiB = atof(v);
    } else if (a == "--json") {
      o->json = v;
    } else if (a == "--trace-dir") {
      o->traceDir = v;
    } else if (a == "--inject") {
      o->inject = v;
      if (o->inject != "wrong" && o->inject != "oob" && o->inject != "hang" && o->inject != "fd-leak" &&
          o->inject != "heap-leak")
        return *err = "--inject: wrong, oob, hang, fd-leak or heap-leak", false;
    } else if (a == "--expect-fail") {
      o->expectFail = v;
    } else {
      return *err = "unknown option " + a, false;
    }
  }
  return true;
}

// ---- the pipe protocol between this process and its ranks ---------------------------------------

enum MsgType : uint32_t {
  kMsgPlan = 1,  // -> rank: run a segment
  kMsgId,        // -> rank: the segment's unique id (rank 0 made it)
  kMsgQuit,      // -> rank: exit
  kMsgIdOut,     // <- rank 0: the unique id it made (all zero: getUniqueId failed)
  kMsgText,      // <- rank: a report line (wrong value, failed call)
  kMsgDone,      // <- rank: the segment is over on this rank, with its counters and a sample
};

struct MsgHeader {
  uint32_t type;
  uint32_t len;
};

enum InjectCode : int32_t { kInjNone, kInjWrong, kInjOob, kInjHang, kInjFdLeak, kInjHeapLeak };

struct Plan {
  uint32_t segment;
  int32_t nranks;
  int32_t rank;
  int32_t ops;
  uint64_t seed;
  uint64_t maxBytes;
  int32_t blocking;
  int32_t progressThread;  // -1: leave unset
  int32_t lanes;           // 0: leave unset
  int32_t inject;
  int32_t injectOp;
  char transport[16];
  char algo[16];
};

// What a rank is doing, in memory shared with the parent (mapped before the fork): the watchdog
// reads it at any time, without a message, and names the operation a hung rank is in.
struct ProgressSlot {
  std::atomic<uint64_t> beats;  // one more before every step
  std::atomic<int32_t> segment;
  std::atomic<int32_t> op;  // -1: init; ops: destroy
  char desc[240];           // the step (may tear while written; only printed)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "progress slots are shared between processes");

struct Sample {
  int64_t rssKiB = 0;
  int64_t heapKiB = 0;
  int64_t fds = 0;
  int64_t threads = 0;
  int64_t shmMaps = 0;
};

struct Done {
  uint32_t segment;
  int32_t opsDone;
  int32_t errors;
  int32_t pad;
  uint64_t calls;
  uint64_t bytes;
  int64_t wrong;
  int64_t oob;
  uint64_t callsByKind[kNumOpKinds];
  double initMs;
  double runMs;
  double destroyMs;
  Sample sample;
};

bool sendMsg(int fd, uint32_t type, const void* p, size_t len) {
  // One write when it fits a pipe's atomic size, so lines from a rank never interleave.
  MsgHeader h{type, static_cast<uint32_t>(len)};
  std::string buf(reinterpret_cast<const char*>(&h), sizeof(h));
  if (len) buf.append(static_cast<const char*>(p), len);
  return writeAll(fd, buf.data(), buf.size());
}

// ---- a rank (worker process) ---------------------------------------------------------------------

int64_t countDir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

Sample takeSample() {
  Sample s;
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  s.rssKiB = resident * (sysconf(_SC_PAGESIZE) / 1024);
#ifdef C4_SOAK_ASAN
  s.heapKiB = static_cast<int64_t>(__sanitizer_get_current_allocated_bytes() / 1024);
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  s.heapKiB = static_cast<int64_t>((mi.uordblks + mi.hblkhd) / 1024);
#else
  s.heapKiB = -1;
#endif
  s.fds = countDir("/proc/self/fd") - 1;  // less the directory being read
  s.threads = countDir("/proc/self/task");
  // Shared memory the library maps (shm transport segments, memAlloc's memfds): none after destroy.
  if (FILE* f = fopen("/proc/self/maps", "r")) {
    char line[512];
    while (fgets(line, sizeof(line), f))
      if (strstr(line, "/dev/shm/") || strstr(line, "memfd:")) ++s.shmMaps;
    fclose(f);
  }
  return s;
}

class Worker {
 public:
  Worker(int index, int cmdFd, int repFd, ProgressSlot* slot) : index_(index), cmd_(cmdFd), rep_(repFd), slot_(slot) {}

  int main() {
    for (;;) {
      MsgHeader h;
      if (!readAll(cmd_, &h, sizeof(h))) return 0;  // the parent is gone
      std::vector<char> body(h.len);
      if (h.len && !readAll(cmd_, body.data(), h.len)) return 0;
      if (h.type == kMsgQuit) return 0;
      if (h.type == kMsgPlan && h.len == sizeof(Plan)) {
        Plan p;
        memcpy(&p, body.data(), sizeof(p));
        if (!segment(p)) return 3;
      }
    }
  }

 private:
  void text(const std::string& s) {
    std::string t = s.size() > 3800 ? s.substr(0, 3800) + "..." : s;
    if (!sendMsg(rep_, kMsgText, t.data(), t.size())) _exit(3);
  }
  void progress(uint32_t seg, int op, const std::string& desc) {
    slot_->segment.store(static_cast<int32_t>(seg), std::memory_order_relaxed);
    slot_->op.store(op, std::memory_order_relaxed);
    snprintf(slot_->desc, sizeof(slot_->desc), "%s", desc.c_str());
    slot_->beats.fetch_add(1, std::memory_order_release);
  }
  static void setOrUnset(const char* name, const std::string& v) {
    if (v.empty()) {
      unsetenv(name);
    } else {
      setenv(name, v.c_str(), 1);
    }
  }
  static Status wait(Comm* comm, Status st) {
    while (st.code() == Code::kInProgress) {
      st = commGetAsyncError(comm);
      if (st.code() == Code::kInProgress) usleep(50);
    }
    return st;
  }

  // Runs one segment; false when this process must stop (the parent is gone).
  bool segment(const Plan& p) {
    Done d{};
    d.segment = p.segment;
    const std::string seg = "seg " + std::to_string(p.segment);
    const std::string who = " (rank " + std::to_string(p.rank) + "/" + std::to_string(p.nranks) + ", worker " +
                            std::to_string(index_) + ")";
    setenv("C4_TRANSPORT", p.transport, 1);
    setOrUnset("C4_ALGO", p.algo);
    setOrUnset("C4_LANES", p.lanes > 0 ? std::to_string(p.lanes) : "");
    setOrUnset("C4_PROGRESS_THREAD", p.progressThread >= 0 ? std::to_string(p.progressThread) : "");

    // The unique id: rank 0 makes it and hands it through the parent.
    UniqueId id{};
    static const UniqueId kZero{};
    if (p.rank == 0) {
      Status st = getUniqueId(&id);
      if (!st.isOk()) {
        text(seg + who + ": getUniqueId failed: " + st.toString());
        d.errors = 1;
        id = kZero;
      }
      if (!sendMsg(rep_, kMsgIdOut, &id, sizeof(id))) return false;
    } else {
      MsgHeader h;
      if (!readAll(cmd_, &h, sizeof(h)) || h.type != kMsgId || h.len != sizeof(id) || !readAll(cmd_, &id, sizeof(id)))
        return false;
    }
    Comm* comm = nullptr;
    bool ok = memcmp(&id, &kZero, sizeof(id)) != 0;
    const double t0 = nowSec();
    if (ok) {
      progress(p.segment, -1, "commInitRank");
      Config cfg;
      cfg.blocking = p.blocking;
      Status st = commInitRank(&comm, p.nranks, id, p.rank, cfg);
      if (comm) st = wait(comm, st);
      if (!st.isOk()) {
        text(seg + who + ": commInitRank failed: " + st.toString());
        d.errors = 1;
        if (comm) (void)commAbort(comm);
        comm = nullptr;
        ok = false;
      }
    }
    const double t1 = nowSec();
    d.initMs = (t1 - t0) * 1e3;
    if (ok) {
      RankRunner runner(comm, p.rank, p.nranks, p.blocking == 0);
      for (int i = 0; i < p.ops; ++i) {
        OpSpec op = drawOp(p.seed, i, p.nranks, p.maxBytes);
        progress(p.segment, i, op.describe());
        if (i == p.injectOp) {
          if (p.inject == kInjWrong) runner.arm(Inject::kWrong);
          if (p.inject == kInjOob) runner.arm(Inject::kOob);
          if (p.inject == kInjHang) {
            progress(p.segment, i, "[injected hang] " + op.describe());
            for (;;) pause();
          }
        }
        OpResult r = runner.run(op, seg + " op " + std::to_string(i));
        for (const std::string& line : r.reports) text("WRONG: " + line + who);
        d.wrong += r.wrong;
        d.oob += r.outOfBounds;
        d.bytes += r.bytesChecked;
        if (!r.status.isOk()) {
          text("ERROR: " + r.status.toString() + who);
          d.errors = 1;
          break;
        }
        d.calls += static_cast<uint64_t>(op.calls());
        d.callsByKind[static_cast<int>(op.kind)] += static_cast<uint64_t>(op.calls());
        ++d.opsDone;
      }
      const double t2 = nowSec();
      d.runMs = (t2 - t1) * 1e3;
      progress(p.segment, p.ops, d.errors ? "commAbort" : "commDestroy");
      Status st;
      if (d.errors) {
        st = commAbort(comm);
      } else {
        if (p.blocking == 0) st = wait(comm, commFinalize(comm));
        Status ds = commDestroy(comm);
        if (st.isOk()) st = ds;
      }
      if (!st.isOk() && !d.errors) {
        text("ERROR: " + seg + who + ": commDestroy failed: " + st.toString());
        d.errors = 1;
      }
      d.destroyMs = (nowSec() - t2) * 1e3;
    }
    // Planted leaks (--inject): one fd, or 2 MiB of heap, per segment.
    if (p.inject == kInjFdLeak) (void)!open("/dev/null", O_RDONLY);
    if (p.inject == kInjHeapLeak) {
      void* leak = malloc(2u << 20);
      if (leak) memset(leak, 1, 2u << 20);
      leaked_.push_back(leak);
    }
    // Settled: two samples 20 ms apart that agree on fds and threads (a thread of the library that
    // is just ending, with what it closes, is not counted).
    d.sample = takeSample();
    for (int k = 0; k < 25; ++k) {
      usleep(20 * 1000);
      Sample again = takeSample();
      const bool same = again.fds == d.sample.fds && again.threads == d.sample.threads;
      d.sample = again;
      if (same) break;
    }
    return sendMsg(rep_, kMsgDone, &d, sizeof(d));
  }

  int index_;
  int cmd_;
  int rep_;
  ProgressSlot* slot_;
  std::vector<void*> leaked_;
};

// ---- the parent: plans segments, relays ids, watches, checks leaks -------------------------------

struct WorkerState {
  pid_t pid = -1;
  int cmd = -1;  // write end
  int rep = -1;  // read end
  std::vector<char> in;
  bool alive = true;
  int exitStatus = 0;
  // The running segment.
  bool busy = false;
  int rank = -1;
  double lastHeard = 0;
  uint64_t lastBeats = 0;
  // Samples after each segment, for the leak checks and the plot.
  struct Point {
    double t;
    uint32_t segment;
    Sample s;
  };
  std::vector<Point> samples;
  Sample base;  // maxima over the warm-up
  int nBase = 0;
  unsigned seen = 0;  // the kinds of segment it took part in (Parent::segBits)
  Sample worst;       // maxima after the warm-up
  int nAfter = 0;
};

struct Failure {
  std::string kind;  // wrong, oob, error, hang, crash, leak-fd, leak-threads, leak-shm, leak-rss, leak-heap
  std::string detail;
};

class Parent {
 public:
  explicit Parent(const Options& o) : o_(o) {}
  int run();

 private:
  void fail(const std::string& kind, const std::string& detail) {
    failures_.push_back({kind, detail});
    fprintf(stderr, "%s: FAIL (%s): %s\n", kProgram, kind.c_str(), detail.c_str());
  }
  bool hasFailure(const std::string& prefix) const {
    for (const Failure& f : failures_)
      if (f.kind.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
  }
  bool spawn();
  void startSegment();
  void handle(int w, uint32_t type, const char* body, uint32_t len);
  void pump(int timeoutMs);
  void checkLeaks(int w);
  void killAll();
  void quitAll();
  void printProgress();
  void checkDevShm();
  void writeJson(double elapsed, bool pass);
  double elapsed() const { return nowSec() - t0_; }
  /// What worker w reports doing: "op 17 [allreduce ...]".
  std::string doing(int w) const {
    const ProgressSlot& sl = slots_[w];
    char desc[sizeof(sl.desc)];
    memcpy(desc, sl.desc, sizeof(desc));
    desc[sizeof(desc) - 1] = 0;
    const int op = sl.op.load(std::memory_order_relaxed);
    return (op < 0 ? std::string("init") : "op " + std::to_string(op)) + " [" + desc + "]";
  }

  Options o_;
  double t0_ = 0;
  double warmup_ = 0;
  uint64_t rng_ = 0;
  std::vector<WorkerState> w_;
  ProgressSlot* slots_ = nullptr;  // one per worker, shared with it
  int segTransport_ = 0;           // index in o_.transports of the running segment's
  unsigned required_ = 0;          // the segBits every worker must have seen before its warm-up ends
  /// Bits of the running segment for a worker of rank `rank`: rank 0, its transport, blocking or not.
  unsigned segBits(int rank) const {
    return (rank == 0 ? 1u : 0u) | (2u << segTransport_) | (plan_.blocking ? 32u : 64u);
  }
  std::vector<Failure> failures_;
  std::set<std::string> shmBefore_;
  std::vector<std::string> ids_;  // hex of every unique id of the run
  std::vector<std::string> shmLeft_, shmOthers_;
  // The running segment.
  bool running_ = false;
  Plan plan_{};
  std::vector<int> members_;  // workers by rank
  int pendingDone_ = 0;
  double segStart_ = 0;
  std::string segDesc_;
  // Totals.
  uint64_t segments_ = 0, calls_ = 0, bytes_ = 0;
  int64_t wrong_ = 0, oob_ = 0, errors_ = 0;
  uint64_t callsByKind_[kNumOpKinds] = {};
  std::map<std::string, uint64_t> segsBy_;
  double segWall_ = 0;  // seconds spent in segments (for the op-rate estimate)
  uint64_t segCalls_ = 0;
  double lastProgress_ = 0;
  bool stop_ = false;
};

volatile sig_atomic_t gSignal = 0;
void onSignal(int sig) { gSignal = sig; }

uint64_t nextRand(uint64_t* s) { return mix64(*s += 0x9e3779b97f4a7c15ull); }

std::string hexOf(const void* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  const unsigned char* b = static_cast<const unsigned char*>(p);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[b[i] >> 4], s += kHex[b[i] & 15];
  return s;
}

std::set<std::string> listDevShm() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, "c4", 2) == 0) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

bool Parent::spawn() {
  fflush(stdout);
  fflush(stderr);
  w_.resize(static_cast<size_t>(o_.maxRanks));
  void* shared =
      mmap(nullptr, sizeof(ProgressSlot) * w_.size(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return fprintf(stderr, "%s: mmap: %s\n", kProgram, strerror(errno)), false;
  slots_ = new (shared) ProgressSlot[w_.size()]();
  for (int i = 0; i < o_.maxRanks; ++i) {
    int c[2], r[2];
    if (pipe(c) != 0 || pipe(r) != 0) return fprintf(stderr, "%s: pipe: %s\n", kProgram, strerror(errno)), false;
    pid_t pid = fork();
    if (pid < 0) return fprintf(stderr, "%s: fork: %s\n", kProgram, strerror(errno)), false;
    if (pid == 0) {
      close(c[1]);
      close(r[0]);
      for (int k = 0; k < i; ++k) {
        close(w_[static_cast<size_t>(k)].cmd);
        close(w_[static_cast<size_t>(k)].rep);
      }
      signal(SIGINT, SIG_IGN);  // the parent decides when the ranks stop
      // Large buffers come from mmap and go back at free: the resident set then measures what is
      // kept, not the high-water mark of the heap (glibc's dynamic threshold would keep every
      // size once freed). docs/soak.md.
      mallopt(M_MMAP_THRESHOLD, 256 << 10);
      mallopt(M_TRIM_THRESHOLD, 1 << 20);
      Worker wk(i, c[0], r[1], &slots_[i]);
      int rc = wk.main();
      fflush(stdout);
      fflush(stderr);
      // exit, not _exit: LeakSanitizer checks the rank at exit. C4_SOAK_QUICK_EXIT=1 skips the
      // static destructors, so that a heap profiler sees what global state kept at the end.
      const char* quick = getenv("C4_SOAK_QUICK_EXIT");
      if (quick && *quick == '1') _exit(rc);
      exit(rc);
    }
    close(c[0]);
    close(r[1]);
    WorkerState& ws = w_[static_cast<size_t>(i)];
    ws.pid = pid;
    ws.cmd = c[1];
    ws.rep = r[0];
  }
  return true;
}

void Parent::startSegment() {
  const int n = o_.minRanks + static_cast<int>(nextRand(&rng_) % static_cast<uint64_t>(o_.maxRanks - o_.minRanks + 1));
  std::vector<int> order(w_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[nextRand(&rng_) % i]);
  // The first segments make each worker rank 0 once (rank 0 makes the unique id, which creates the
  // library's process-wide bootstrap watcher): the leak baselines then hold it early.
  if (segments_ < w_.size()) std::swap(order[0], *std::find(order.begin(), order.end(), static_cast<int>(segments_)));
  members_.assign(order.begin(), order.begin() + n);

  Plan p{};
  p.segment = static_cast<uint32_t>(segments_);
  p.nranks = n;
  p.seed = nextRand(&rng_);
  p.maxBytes = o_.maxBytes;
  p.ops = o_.minOps + static_cast<int>(nextRand(&rng_) % static_cast<uint64_t>(o_.maxOps - o_.minOps + 1));
  // Near the end, fewer operations so the run ends close to its duration (from the rate so far).
  if (segWall_ > 1 && segCalls_ > 0) {
    const double rate = static_cast<double>(segCalls_) / segWall_ / 1.3;  // calls per op, roughly
    const double left = std::max(0.0, o_.duration - elapsed());
    p.ops = std::max(std::min(p.ops, 20), std::min(p.ops, static_cast<int>(rate * left)));
  }
  segTransport_ = static_cast<int>(nextRand(&rng_) % o_.transports.size());
  const std::string tr = o_.transports[static_cast<size_t>(segTransport_)];
  snprintf(p.transport, sizeof(p.transport), "%s", tr.c_str());
  p.blocking = o_.nonblocking == 1 ? 0 : o_.nonblocking == 0 ? 1 : (nextRand(&rng_) % 4 == 0 ? 0 : 1);
  p.progressThread = -1;
  if (o_.randomAlgo) {
    static const char* kAlgos[] = {"", "", "ring", "tree", "rhd", "direct"};
    snprintf(p.algo, sizeof(p.algo), "%s", kAlgos[nextRand(&rng_) % 6]);
    p.lanes = 1 + static_cast<int>(nextRand(&rng_) % 3);
    if (p.blocking) p.progressThread = nextRand(&rng_) % 4 == 0 ? 1 : 0;
  }
  plan_ = p;
  char desc[200];
  snprintf(desc, sizeof(desc), "%d ranks (workers", n);
  segDesc_ = desc;
  for (int m : members_) segDesc_ += " " + std::to_string(m);
  snprintf(desc, sizeof(desc), "), %s, %s%s%s, lanes %d%s, %d ops, seed 0x%016" PRIx64, p.transport,
           p.blocking ? "blocking" : "non-blocking", p.algo[0] ? ", algo " : "", p.algo, p.lanes,
           p.progressThread == 1 ? ", progress thread" : "", p.ops, p.seed);
  segDesc_ += desc;
  if (o_.verbose) printf("[soak %6.1fs] segment %" PRIu64 ": %s\n", elapsed(), segments_, segDesc_.c_str());
  segsBy_["transport " + tr] += 1;
  segsBy_["ranks " + std::to_string(n)] += 1;
  segsBy_[p.blocking ? "blocking" : "non-blocking"] += 1;

  running_ = true;
  pendingDone_ = n;
  segStart_ = nowSec();
  for (int r = 0; r < n; ++r) {
    WorkerState& ws = w_[static_cast<size_t>(members_[static_cast<size_t>(r)])];
    Plan q = p;
    q.rank = r;
    q.inject = kInjNone;
    q.injectOp = -1;
    // Planted faults: in the first segment on its last rank (wrong, oob), on rank 1 (hang), or in
    // every segment on worker 0 (leaks).
    if (segments_ == 0 && r == n - 1 && (o_.inject == "wrong" || o_.inject == "oob")) {
      q.inject = o_.inject == "wrong" ? kInjWrong : kInjOob;
      q.injectOp = p.ops / 2;
    }
    if (segments_ == 0 && r == 1 && o_.inject == "hang") q.inject = kInjHang, q.injectOp = p.ops / 3;
    if (members_[static_cast<size_t>(r)] == 0 && o_.inject == "fd-leak") q.inject = kInjFdLeak;
    if (members_[static_cast<size_t>(r)] == 0 && o_.inject == "heap-leak") q.inject = kInjHeapLeak;
    ws.busy = true;
    ws.rank = r;
    ws.lastHeard = nowSec();
    if (!sendMsg(ws.cmd, kMsgPlan, &q, sizeof(q)))
      fail("crash", "worker " + std::to_string(members_[static_cast<size_t>(r)]) + " cannot be reached");
  }
}

void Parent::handle(int w, uint32_t type, const char* body, uint32_t len) {
  WorkerState& ws = w_[static_cast<size_t>(w)];
  ws.lastHeard = nowSec();
  switch (type) {
    case kMsgIdOut: {
      if (len != sizeof(UniqueId)) break;
      ids_.push_back(hexOf(body, len));
      for (int m : members_)
        if (m != w) sendMsg(w_[static_cast<size_t>(m)].cmd, kMsgId, body, len);
      break;
    }
    case kMsgText: {
      std::string line(body, len);
      fprintf(stderr, "%s: %s\n", kProgram, line.c_str());
      break;
    }
    case kMsgDone: {
      if (len != sizeof(Done)) break;
      Done d;
      memcpy(&d, body, sizeof(d));
      ws.busy = false;
      --pendingDone_;
      if (ws.rank == 0) calls_ += d.calls;  // every rank makes the same calls
      bytes_ += d.bytes;
      wrong_ += d.wrong;
      oob_ += d.oob;
      errors_ += d.errors;
      for (int k = 0; k < kNumOpKinds; ++k) callsByKind_[k] += ws.rank == 0 ? d.callsByKind[k] : 0;
      if (ws.rank == 0) segCalls_ += d.calls;
      const std::string who = "segment " + std::to_string(d.segment) + " (" + segDesc_ + "), rank " +
                              std::to_string(ws.rank) + " (worker " + std::to_string(w) + ")";
      if (d.wrong) fail("wrong", who + ": " + std::to_string(d.wrong) + " wrong element(s)");
      if (d.oob) fail("oob", who + ": " + std::to_string(d.oob) + " guard byte(s) written out of bounds");
      if (d.errors) fail("error", who + ": a call failed (above)");
      ws.samples.push_back({elapsed(), d.segment, d.sample});
      if (o_.verbose)
        printf(
            "[soak %6.1fs]   worker %d: %d ops, init %.0f ms, run %.0f ms, destroy %.0f ms, rss %.1f MiB, heap %" PRId64
            " KiB, fds %" PRId64 ", threads %" PRId64 "\n",
            elapsed(), w, d.opsDone, d.initMs, d.runMs, d.destroyMs, static_cast<double>(d.sample.rssKiB) / 1024,
            d.sample.heapKiB, d.sample.fds, d.sample.threads);
      checkLeaks(w);
      ws.seen |= segBits(ws.rank);
      break;
    }
    default:
      break;
  }
}

// Leak checks on worker w's latest sample (bounds in docs/soak.md).
void Parent::checkLeaks(int w) {
  WorkerState& ws = w_[static_cast<size_t>(w)];
  const WorkerState::Point& pt = ws.samples.back();
  const Sample& s = pt.s;
  const std::string who = "worker " + std::to_string(w) + " after segment " + std::to_string(pt.segment);
  if (s.shmMaps > 0 && !hasFailure("leak-shm"))
    fail("leak-shm", who + ": " + std::to_string(s.shmMaps) + " shared-memory mapping(s) left after destroy");
  // The warm-up: the first warmup_ seconds, at least this worker's first two samples, and until it
  // took part in every kind of segment (as rank 0, over each transport, blocking and not): the
  // library creates some process-wide objects once, on first use (a bootstrap watcher's eventfd, a
  // few KiB of heap), and those belong in the baseline. The sample of the segment that completes
  // the set is still counted as warm-up (seen is updated after this check).
  if (pt.t <= warmup_ || ws.nBase < 2 || (ws.seen & required_) != required_) {
    ws.base.rssKiB = std::max(ws.base.rssKiB, s.rssKiB);
    ws.base.heapKiB = std::max(ws.base.heapKiB, s.heapKiB);
    ws.base.fds = std::max(ws.base.fds, s.fds);
    ws.base.threads = std::max(ws.base.threads, s.threads);
    ++ws.nBase;
    return;
  }
  ++ws.nAfter;
  ws.worst.rssKiB = std::max(ws.worst.rssKiB, s.rssKiB);
  ws.worst.heapKiB = std::max(ws.worst.heapKiB, s.heapKiB);
  ws.worst.fds = std::max(ws.worst.fds, s.fds);
  ws.worst.threads = std::max(ws.worst.threads, s.threads);
  char buf[300];
  if (s.fds > ws.base.fds && !hasFailure("leak-fd")) {
    snprintf(buf, sizeof(buf), ": %" PRId64 " open fds, %" PRId64 " after the warm-up (any growth fails)", s.fds,
             ws.base.fds);
    fail("leak-fd", who + buf);
  }
  if (s.threads > ws.base.threads && !hasFailure("leak-threads")) {
    snprintf(buf, sizeof(buf), ": %" PRId64 " threads, %" PRId64 " after the warm-up (any growth fails)", s.threads,
             ws.base.threads);
    fail("leak-threads", who + buf);
  }
  if (s.heapKiB >= 0 && s.heapKiB > ws.base.heapKiB + static_cast<int64_t>(o_.heapBoundKiB) &&
      !hasFailure("leak-heap")) {
    snprintf(buf, sizeof(buf), ": live heap %" PRId64 " KiB, %" PRId64 " KiB at most in the warm-up (bound +%.0f KiB)",
             s.heapKiB, ws.base.heapKiB, o_.heapBoundKiB);
    fail("leak-heap", who + buf);
  }
#ifndef C4_SOAK_ASAN
  if (s.rssKiB > ws.base.rssKiB + static_cast<int64_t>(o_.rssBoundMiB * 1024) && !hasFailure("leak-rss")) {
    snprintf(buf, sizeof(buf), ": resident %.1f MiB, %.1f MiB at most in the warm-up (bound +%.0f MiB)",
             static_cast<double>(s.rssKiB) / 1024, static_cast<double>(ws.base.rssKiB) / 1024, o_.rssBoundMiB);
    fail("leak-rss", who + buf);
  }
#endif
}

void Parent::pump(int timeoutMs) {
  std::vector<pollfd> pfds;
  std::vector<int> which;
  for (size_t i = 0; i < w_.size(); ++i)
    if (w_[i].alive) {
      pfds.push_back(pollfd{w_[i].rep, POLLIN, 0});
      which.push_back(static_cast<int>(i));
    }
  if (pfds.empty()) return;
  int k = poll(pfds.data(), pfds.size(), timeoutMs);
  if (k <= 0) return;
  for (size_t j = 0; j < pfds.size(); ++j) {
    if (!(pfds[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const int w = which[j];
    WorkerState& ws = w_[static_cast<size_t>(w)];
    if (!ws.alive) continue;  // killed while handling an earlier one
    char buf[65536];
    ssize_t r = read(ws.rep, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      // The rank exited or died.
      ws.alive = false;
      close(ws.rep);
      int st = 0;
      waitpid(ws.pid, &st, 0);
      ws.exitStatus = st;
      ws.pid = -1;
      if (!stop_ || ws.busy) {
        std::string how = WIFSIGNALED(st) ? std::string("killed by signal ") + strsignal(WTERMSIG(st))
                                          : "exited with status " + std::to_string(WEXITSTATUS(st));
        fail("crash", "worker " + std::to_string(w) + (ws.busy ? " (rank " + std::to_string(ws.rank) + ")" : "") + " " +
                          how +
                          (ws.busy ? " during segment " + std::to_string(plan_.segment) + ", in " + doing(w) : ""));
        killAll();
      } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        fail("crash", "worker " + std::to_string(w) + " ended with " +
                          (WIFSIGNALED(st) ? std::string("signal ") + strsignal(WTERMSIG(st))
                                           : "status " + std::to_string(WEXITSTATUS(st))) +
                          " (a sanitizer report above?)");
      }
      continue;
    }
    ws.in.insert(ws.in.end(), buf, buf + r);
    size_t off = 0;
    while (ws.in.size() - off >= sizeof(MsgHeader)) {
      MsgHeader h;
      memcpy(&h, ws.in.data() + off, sizeof(h));
      if (ws.in.size() - off - sizeof(h) < h.len) break;
      handle(w, h.type, ws.in.data() + off + sizeof(h), h.len);
      off += sizeof(h) + h.len;
    }
    ws.in.erase(ws.in.begin(), ws.in.begin() + static_cast<long>(off));
  }
}

void Parent::killAll() {
  for (WorkerState& ws : w_)
    if (ws.alive && ws.pid > 0) kill(ws.pid, SIGKILL);
  for (WorkerState& ws : w_) {
    if (!ws.alive) continue;
    int st = 0;
    if (ws.pid > 0) waitpid(ws.pid, &st, 0);
    ws.alive = false;
    close(ws.rep);
    ws.pid = -1;
  }
  stop_ = true;
  running_ = false;
}

void Parent::quitAll() {
  stop_ = true;
  for (WorkerState& ws : w_)
    if (ws.alive) (void)sendMsg(ws.cmd, kMsgQuit, nullptr, 0);
  const double deadline = nowSec() + 30;
  while (nowSec() < deadline && std::any_of(w_.begin(), w_.end(), [](const WorkerState& s) { return s.alive; }))
    pump(100);
  for (size_t i = 0; i < w_.size(); ++i)
    if (w_[i].alive) fail("hang", "worker " + std::to_string(i) + " did not exit within 30 s of being told to");
  killAll();
  for (WorkerState& ws : w_)
    if (ws.cmd >= 0) close(ws.cmd), ws.cmd = -1;
}

std::string gib(uint64_t b) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(b) / (1u << 30));
  return buf;
}

void Parent::printProgress() {
  char buf[512];
  snprintf(buf, sizeof(buf),
           "[soak %6.0fs] %" PRIu64 " segments, %" PRIu64 " calls, %s checked, %" PRId64 " wrong, %" PRId64
           " out-of-bounds, %" PRId64 " errors",
           elapsed(), segments_, calls_, gib(bytes_).c_str(), wrong_, oob_, errors_);
  std::string line = buf;
  line += " | rss MiB";
  for (const WorkerState& ws : w_)
    line += ws.samples.empty() ? " -" : " " + std::to_string(ws.samples.back().s.rssKiB / 1024);
  line += " heap KiB";
  for (const WorkerState& ws : w_)
    line += ws.samples.empty() ? " -" : " " + std::to_string(ws.samples.back().s.heapKiB);
  line += " fds";
  for (const WorkerState& ws : w_) line += ws.samples.empty() ? " -" : " " + std::to_string(ws.samples.back().s.fds);
  printf("%s\n", line.c_str());
  fflush(stdout);
}

void Parent::checkDevShm() {
  // Entries of this run: c4* names not there before that carry one of this run's ids (the shm
  // transport names its segments by the communicator's tag, hex of bytes of the unique id).
  // Others' (a concurrent job's) are only reported. A grace period lets unlinks land.
  for (int k = 0; k < 20; ++k) {
    shmLeft_.clear();
    shmOthers_.clear();
    for (const std::string& e : listDevShm()) {
      if (shmBefore_.count(e)) continue;
      bool ours = false;
      size_t a = e.find('-'), b = e.rfind('-');
      std::string tag = a != std::string::npos && b > a ? e.substr(a + 1, b - a - 1) : "";
      for (const std::string& id : ids_)
        for (size_t pos = id.find(tag); !tag.empty() && pos != std::string::npos; pos = id.find(tag, pos + 1))
          if (pos % 2 == 0) ours = true;
      (ours ? shmLeft_ : shmOthers_).push_back(e);
    }
    if (shmLeft_.empty() && shmOthers_.empty()) break;
    usleep(100 * 1000);
  }
  for (const std::string& e : shmLeft_) fail("leak-shm", "/dev/shm/" + e + " left behind by this run");
  for (const std::string& e : shmOthers_)
    fprintf(stderr, "%s: note: /dev/shm/%s appeared during the run but carries none of its ids (another job?)\n",
            kProgram, e.c_str());
}

void jsonStr(FILE* f, const std::string& s) {
  fputc('"', f);
  for (char c : s) {
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc(c, f);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      fprintf(f, "\\u%04x", c);
    } else {
      fputc(c, f);
    }
  }
  fputc('"', f);
}

void Parent::writeJson(double secs, bool pass) {
  FILE* f = fopen(o_.json.c_str(), "w");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", kProgram, o_.json.c_str(), strerror(errno));
    return;
  }
  fprintf(f, "{\n  \"program\": \"c4-soak\",\n  \"result\": \"%s\",\n", pass ? "pass" : "fail");
  fprintf(f, "  \"seed\": \"0x%016" PRIx64 "\",\n  \"duration_s\": %.1f,\n  \"requested_s\": %.1f,\n", o_.seed, secs,
          o_.duration);
  fprintf(f, "  \"segments\": %" PRIu64 ",\n  \"calls\": %" PRIu64 ",\n  \"bytes_checked\": %" PRIu64 ",\n", segments_,
          calls_, bytes_);
  fprintf(f, "  \"wrong\": %" PRId64 ",\n  \"out_of_bounds\": %" PRId64 ",\n  \"errors\": %" PRId64 ",\n", wrong_, oob_,
          errors_);
  fprintf(f, "  \"hang\": %s,\n", hasFailure("hang") ? "true" : "false");
  fprintf(f, "  \"calls_by_kind\": {");
  for (int k = 0; k < kNumOpKinds; ++k)
    fprintf(f, "%s\"%s\": %" PRIu64, k ? ", " : "", opKindName(static_cast<OpKind>(k)), callsByKind_[k]);
  fprintf(f, "},\n  \"segments_by\": {");
  bool first = true;
  for (const auto& kv : segsBy_) {
    fprintf(f, "%s", first ? "" : ", ");
    jsonStr(f, kv.first);
    fprintf(f, ": %" PRIu64, kv.second);
    first = false;
  }
  fprintf(f, "},\n  \"failures\": [");
  for (size_t i = 0; i < failures_.size(); ++i) {
    fprintf(f, "%s{\"kind\": ", i ? ", " : "");
    jsonStr(f, failures_[i].kind);
    fprintf(f, ", \"detail\": ");
    jsonStr(f, failures_[i].detail);
    fprintf(f, "}");
  }
  fprintf(f, "],\n  \"leak\": {\n    \"warmup_s\": %.1f,\n    \"rss_bound_mib\": %.1f,\n    \"rss_checked\": %s,\n",
          warmup_, o_.rssBoundMiB,
#ifdef C4_SOAK_ASAN
          "false"
#else
          "true"
#endif
  );
  fprintf(f, "    \"heap_bound_kib\": %.0f,\n    \"dev_shm_left\": [", o_.heapBoundKiB);
  for (size_t i = 0; i < shmLeft_.size(); ++i) {
    fprintf(f, "%s", i ? ", " : "");
    jsonStr(f, shmLeft_[i]);
  }
  fprintf(f, "],\n    \"workers\": [\n");
  for (size_t i = 0; i < w_.size(); ++i) {
    const WorkerState& ws = w_[i];
    fprintf(f,
            "      {\"worker\": %zu, \"segments\": %zu, \"checked_samples\": %d, \"warmup\": {\"rss_kib\": %" PRId64
            ", \"heap_kib\": %" PRId64 ", \"fds\": %" PRId64 ", \"threads\": %" PRId64
            "}, \"after\": {\"rss_kib\": %" PRId64 ", \"heap_kib\": %" PRId64 ", \"fds\": %" PRId64
            ", \"threads\": %" PRId64 "}}%s\n",
            i, ws.samples.size(), ws.nAfter, ws.base.rssKiB, ws.base.heapKiB, ws.base.fds, ws.base.threads,
            ws.worst.rssKiB, ws.worst.heapKiB, ws.worst.fds, ws.worst.threads, i + 1 < w_.size() ? "," : "");
  }
  fprintf(f,
          "    ]\n  },\n  \"sample_fields\": [\"t_s\", \"worker\", \"segment\", \"rss_kib\", \"heap_kib\", \"fds\", "
          "\"threads\", \"shm_maps\"],\n  \"samples\": [");
  first = true;
  for (size_t i = 0; i < w_.size(); ++i)
    for (const WorkerState::Point& p : w_[i].samples) {
      fprintf(f, "%s\n    [%.2f, %zu, %u, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
              first ? "" : ",", p.t, i, p.segment, p.s.rssKiB, p.s.heapKiB, p.s.fds, p.s.threads, p.s.shmMaps);
      first = false;
    }
  fprintf(f, "\n  ]\n}\n");
  fclose(f);
}

int Parent::run() {
  if (o_.seed == 0) {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o_.seed = mix64(static_cast<uint64_t>(ts.tv_nsec) ^ (static_cast<uint64_t>(ts.tv_sec) << 20) ^
                    static_cast<uint64_t>(getpid()));
  }
  rng_ = o_.seed;
  warmup_ = o_.warmup >= 0 ? o_.warmup : std::min(60.0, 0.2 * o_.duration);
  required_ = 1u | (o_.nonblocking != 1 ? 32u : 0u) | (o_.nonblocking != 0 ? 64u : 0u);
  for (size_t t = 0; t < o_.transports.size(); ++t) required_ |= 2u << t;
  if (o_.c4Timeout > 0) setenv("C4_TIMEOUT", std::to_string(o_.c4Timeout).c_str(), 1);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, onSignal);
  signal(SIGTERM, onSignal);
  shmBefore_ = listDevShm();
  printf("[soak] %s: %.0f s, seed 0x%016" PRIx64
         ", %d-%d ranks over %zu transport(s), buffers up to %zu bytes, "
         "%d-%d ops per segment, C4_TIMEOUT=%s, hang after %.0f s, leak warm-up %.0f s, bounds: rss +%.0f MiB%s, "
         "heap +%.0f KiB, fds/threads +0, shm maps 0\n",
         kProgram, o_.duration, o_.seed, o_.minRanks, o_.maxRanks, o_.transports.size(), o_.maxBytes, o_.minOps,
         o_.maxOps, getenv("C4_TIMEOUT") ? getenv("C4_TIMEOUT") : "(default)", o_.hangTimeout, warmup_, o_.rssBoundMiB,
         kRssNote, o_.heapBoundKiB);
  fflush(stdout);
  // Every communicator leaves a trace (C4_TRACE, docs/tracing.md): thousands in a long soak, so
  // they go to a directory of this run.
  std::string traceDir = o_.traceDir;
  bool ownTraceDir = false;
  if (traceDir.empty()) {
    char tmpl[] = "/tmp/c4soak-traces-XXXXXX";
    if (mkdtemp(tmpl)) traceDir = tmpl, ownTraceDir = true;
  }
  if (!traceDir.empty()) setenv("C4_TRACE_DIR", traceDir.c_str(), 1);
  prebuildTables(o_.minRanks, o_.maxRanks);
  t0_ = nowSec();
  lastProgress_ = t0_;
  if (!spawn()) return 1;

  while (!stop_) {
    if (gSignal) {
      fail("interrupted", std::string("signal ") + strsignal(gSignal));
      killAll();
      break;
    }
    if (!running_) {
      const bool failed =
          !failures_.empty() && !(o_.keepGoing && !hasFailure("error") && !hasFailure("crash") && !hasFailure("hang"));
      if (elapsed() >= o_.duration || failed) break;
      startSegment();
      continue;
    }
    pump(100);
    if (stop_) break;
    if (running_ && pendingDone_ == 0) {
      running_ = false;
      ++segments_;
      segWall_ += nowSec() - segStart_;
    }
    const double now = nowSec();
    // The watchdog: a rank of the running segment that made no step for hangTimeout.
    for (int m : members_) {
      WorkerState& ws = w_[static_cast<size_t>(m)];
      const uint64_t beats = slots_[m].beats.load(std::memory_order_acquire);
      if (beats != ws.lastBeats) ws.lastBeats = beats, ws.lastHeard = now;
      if (!running_ || !ws.busy || now - ws.lastHeard < o_.hangTimeout) continue;
      std::string detail = "segment " + std::to_string(plan_.segment) + " (" + segDesc_ + "): no progress for " +
                           std::to_string(static_cast<int>(now - ws.lastHeard)) + " s;";
      for (int k : members_) {
        const WorkerState& x = w_[static_cast<size_t>(k)];
        detail += " rank " + std::to_string(x.rank) + " (worker " + std::to_string(k) + ") " +
                  (x.busy ? "in " + doing(k) + " for " + std::to_string(static_cast<int>(now - x.lastHeard)) + " s;"
                          : "done;");
      }
      fail("hang", detail + " killing every rank");
      killAll();
      break;
    }
    if (o_.progress > 0 && now - lastProgress_ >= o_.progress) {
      printProgress();
      lastProgress_ = now;
    }
  }
  const double secs = elapsed();
  quitAll();
  checkDevShm();

  const bool pass = failures_.empty();
  // The checks' own test (--expect-fail): the planted fault must fail the run, as exactly this kind.
  const bool caught = !o_.expectFail.empty() && hasFailure(o_.expectFail);
  const int rc = o_.expectFail.empty() ? (pass ? 0 : 1) : (caught ? 0 : 1);
  if (ownTraceDir && rc == 0) {
    nftw(
        traceDir.c_str(), [](const char* path, const struct stat*, int, FTW*) { return remove(path); }, 16,
        FTW_DEPTH | FTW_PHYS);
  } else if (!traceDir.empty()) {
    printf("[soak] the ranks' traces are in %s (c4-trace report DIR/<comm>)\n", traceDir.c_str());
  }
  printProgress();
  std::string kinds;
  for (int k = 0; k < kNumOpKinds; ++k)
    kinds += std::string(k ? ", " : "") + opKindName(static_cast<OpKind>(k)) + " " + std::to_string(callsByKind_[k]);
  printf("[soak] calls by kind: %s\n", kinds.c_str());
  std::string by;
  for (const auto& kv : segsBy_) by += (by.empty() ? "" : ", ") + kv.first + ": " + std::to_string(kv.second);
  printf("[soak] segments by %s\n", by.c_str());
  int64_t rssGrowth = 0, heapGrowth = 0, fdGrowth = 0, thrGrowth = 0;
  for (const WorkerState& ws : w_) {
    if (!ws.nAfter) continue;
    rssGrowth = std::max(rssGrowth, ws.worst.rssKiB - ws.base.rssKiB);
    heapGrowth = std::max(heapGrowth, ws.worst.heapKiB - ws.base.heapKiB);
    fdGrowth = std::max(fdGrowth, ws.worst.fds - ws.base.fds);
    thrGrowth = std::max(thrGrowth, ws.worst.threads - ws.base.threads);
  }
  std::string kindsFailed;
  for (const Failure& f : failures_)
    if (kindsFailed.find(f.kind) == std::string::npos) kindsFailed += (kindsFailed.empty() ? "" : ",") + f.kind;
  printf("c4-soak: %s: %.0f s, %" PRIu64 " segments, %" PRIu64 " calls, %s checked, %" PRId64 " wrong, %" PRId64
         " out-of-bounds, %" PRId64 " errors, %s; leaks past warm-up: rss %+.1f MiB%s, heap %+" PRId64
         " KiB, fds %+" PRId64 ", threads %+" PRId64 ", /dev/shm %s; seed 0x%016" PRIx64 "\n",
         pass ? "PASS" : ("FAIL (" + kindsFailed + ")").c_str(), secs, segments_, calls_, gib(bytes_).c_str(), wrong_,
         oob_, errors_, hasFailure("hang") ? "HANG" : "no hang", static_cast<double>(rssGrowth) / 1024, kRssNote,
         heapGrowth, fdGrowth, thrGrowth, shmLeft_.empty() ? "clean" : "NOT clean", o_.seed);
  if (!o_.json.empty()) writeJson(secs, pass);
  fflush(stdout);
  if (!o_.expectFail.empty())
    printf("c4-soak: expected failure '%s' %s\n", o_.expectFail.c_str(), caught ? "detected" : "NOT detected");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // glibc's per-thread cache keeps freed chunks counted as in use, so the live heap of a rank would
  // creep up by up to a few hundred KiB as it meets new sizes: run with it off (once, by re-executing
  // with the tunable set), and the live heap after destroy is flat to within a few KiB (docs/soak.md).
  const char* tun = getenv("GLIBC_TUNABLES");
  if (!tun || !strstr(tun, "glibc.malloc.tcache_count")) {
    std::string v = tun && *tun ? std::string(tun) + ":" : "";
    v += "glibc.malloc.tcache_count=0";
    setenv("GLIBC_TUNABLES", v.c_str(), 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "%s: note: re-executing with GLIBC_TUNABLES=%s failed (%s); the live heap will be noisier\n",
            kProgram, v.c_str(), strerror(errno));
  }
#endif
  Options o;
  std::string err;
  if (!parseOptions(argc, argv, &o, &err)) {
    fprintf(stderr, "%s: %s\n", kProgram, err.c_str());
    usage(stderr);
    return 2;
  }
  if (o.minRanks > o.maxRanks) return fprintf(stderr, "%s: bad --ranks\n", kProgram), 2;
  Parent p(o);
  return p.run();
}

}  // namespace soak
}  // namespace c4

int main(int argc, char** argv) { return c4::soak::main(argc, argv); }
