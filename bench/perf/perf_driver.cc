#include "bench/perf/perf_driver.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>

#include "bench/perf/perf_data.hpp"

namespace c4 {
namespace perf {
namespace {

constexpr DataType kAllTypes[] = {DataType::kInt8,     DataType::kUint8,      DataType::kInt32,
                                  DataType::kUint32,   DataType::kInt64,      DataType::kUint64,
                                  DataType::kFloat16,  DataType::kFloat32,    DataType::kFloat64,
                                  DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
constexpr Coll kAllColls[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kBroadcast, Coll::kReduceScatter, Coll::kReduce,
                              Coll::kAlltoAll,  Coll::kGather,    Coll::kScatter,   Coll::kSend};

// A size with an optional binary suffix (K, M, G), as nccl-tests parses it.
bool parseSize(const std::string& s, size_t* out) {
  char* end = nullptr;
  errno = 0;
  double v = strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || v < 0) return false;
  double unit = 1;
  if (*end == 'K' || *end == 'k')
    unit = 1024.0, ++end;
  else if (*end == 'M' || *end == 'm')
    unit = 1024.0 * 1024, ++end;
  else if (*end == 'G' || *end == 'g')
    unit = 1024.0 * 1024 * 1024, ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v * unit);
  return true;
}

bool parseInt(const std::string& s, int* out) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  *out = static_cast<int>(v);
  return true;
}

bool parseTypeName(const std::string& s, DataType* dt) {
  for (DataType t : kAllTypes)
    if (s == c4::dataTypeName(t)) return *dt = t, true;
  // nccl-tests aliases.
  if (s == "fp16" || s == "float16") return *dt = DataType::kFloat16, true;
  if (s == "fp32" || s == "float32") return *dt = DataType::kFloat32, true;
  if (s == "fp64" || s == "float64") return *dt = DataType::kFloat64, true;
  if (s == "bf16") return *dt = DataType::kBfloat16, true;
  if (s == "char") return *dt = DataType::kInt8, true;
  if (s == "int") return *dt = DataType::kInt32, true;
  return false;
}

// nccl-tests' column formatting: as many decimals as fit in `width`, else an
// exponent.
std::string formatFloat(double value, int width) {
  int digits = 0;
  for (double v = 1; value >= v && digits < 40; v *= 10) ++digits;
  char buf[64];
  if (digits < width - 2)
    snprintf(buf, sizeof(buf), "%*.2f", width, value);
  else if (digits < width - 1)
    snprintf(buf, sizeof(buf), "%*.1f", width, value);
  else if (digits < width + 1)
    snprintf(buf, sizeof(buf), "%*.0f", width, value);
  else
    snprintf(buf, sizeof(buf), "%*.1e", width, value);
  return buf;
}

// Element counts of one call for a swept size, following nccl-tests'
// conventions.
struct Counts {
  size_t param;  // the count argument of the call
  size_t send;   // elements in the send buffer
  size_t recv;   // elements in the receive buffer
};

Counts countsFor(Coll coll, size_t count, int n) {
  const size_t per = count / static_cast<size_t>(n);
  switch (coll) {
    case Coll::kAllGather:
    case Coll::kGather:
      return {per, per, per * n};
    case Coll::kReduceScatter:
    case Coll::kScatter:
      return {per, per * n, per};
    case Coll::kAlltoAll:
      return {per, per * n, per * n};
    default:
      return {count, count, count};
  }
}

// algbw counts the bytes of the whole result; busbw scales it to what one link
// carries.
void bandwidth(Coll coll, size_t param, size_t ts, int n, double sec, double* algBw, double* busBw) {
  double bytes = static_cast<double>(param) * ts;
  double factor = 1;
  switch (coll) {
    case Coll::kAllReduce:
      factor = 2.0 * (n - 1) / n;
      break;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
    case Coll::kGather:
    case Coll::kScatter:
      bytes *= n;
      factor = static_cast<double>(n - 1) / n;
      break;
    default:
      break;
  }
  *algBw = sec > 0 ? bytes / 1.0e9 / sec : 0;
  *busBw = *algBw * factor;
}

bool hasRoot(Coll coll) {
  return coll == Coll::kBroadcast || coll == Coll::kReduce || coll == Coll::kGather || coll == Coll::kScatter;
}

// Frees with the backend that allocated (-R 1) or free().
struct BufferFree {
  Backend* registeredBy = nullptr;
  void operator()(void* p) const { registeredBy ? registeredBy->freeRegistered(p) : free(p); }
};
using Buffer = std::unique_ptr<char, BufferFree>;

Buffer allocBuffer(size_t bytes, Backend* registeredBy) {
  bytes = std::max<size_t>(bytes, 64);
  void* p = registeredBy ? registeredBy->allocRegistered(bytes) : nullptr;
  if (registeredBy && !p) return Buffer(nullptr, BufferFree{registeredBy});
  if (!registeredBy && posix_memalign(&p, 4096, bytes) != 0) return Buffer();
  memset(p, 0, bytes);  // fault the pages in before timing
  return Buffer(static_cast<char*>(p), BufferFree{registeredBy});
}

// Where one call reads and writes, out of place or in place (nccl-tests'
// in-place layouts).
struct Layout {
  char* send;
  char* recv;
};

class Sweep {
 public:
  Sweep(const Options& o, const RunInfo& info, Backend& b, FILE* out)
      : opts_(o), info_(info), be_(b), out_(out), rank_(b.rank()), n_(b.nranks()) {}

  int run();

 private:
  Layout layout(bool inPlace, const Counts& c, size_t ts) const;
  void initData(bool inPlace, const Counts& c, DataType dt, RedOp op, const Layout& l);
  int64_t checkData(const Counts& c, DataType dt, RedOp op, const Layout& l);
  Status runOnce(const Counts& c, DataType dt, RedOp op, const Layout& l);
  // Times one size and place; false on a failed call (already reported).
  bool benchOne(bool inPlace, const Counts& c, DataType dt, RedOp op, double* usec, int64_t* wrong);
  bool testType(DataType dt, RedOp op);
  void printHeader();
  void fail(const char* what, const Status& s) {
    fprintf(stderr, "%s: rank %d: %s failed: %s\n", info_.program.c_str(), rank_, what, s.message().c_str());
  }

  const Options& opts_;
  const RunInfo& info_;
  Backend& be_;
  FILE* out_;
  int rank_;
  int n_;
  int root_ = 0;
  Buffer sendBuf_, recvBuf_;
  // Device buffers (--device): the calls use these; sendBuf_/recvBuf_ are their host images, where
  // data is initialized and checked.
  bool device_ = false;
  std::unique_ptr<char, std::function<void(char*)>> devSend_, devRecv_;
  size_t bufBytes_ = 0;
  Layout deviceLayout(const Layout& host) const {
    auto map = [&](char* p) {
      return p >= recvBuf_.get() && p < recvBuf_.get() + bufBytes_ ? devRecv_.get() + (p - recvBuf_.get())
                                                                   : devSend_.get() + (p - sendBuf_.get());
    };
    return {map(host.send), map(host.recv)};
  }
  Status toDevice() {
    if (!device_) return Status::ok();
    Status s = be_.copyToDevice(devSend_.get(), sendBuf_.get(), bufBytes_);
    return s.isOk() ? be_.copyToDevice(devRecv_.get(), recvBuf_.get(), bufBytes_) : s;
  }
  Status toHost() { return device_ ? be_.copyToHost(recvBuf_.get(), devRecv_.get(), bufBytes_) : Status::ok(); }
  double bwSum_ = 0;
  int bwCount_ = 0;
  int failedTests_ = 0;
};

Layout Sweep::layout(bool inPlace, const Counts& c, size_t ts) const {
  if (!inPlace) return {sendBuf_.get(), recvBuf_.get()};
  char* buf = recvBuf_.get();
  char* mine = buf + static_cast<size_t>(rank_) * c.param * ts;
  switch (opts_.coll) {
    case Coll::kAllGather:
    case Coll::kGather:
      return {mine, buf};
    case Coll::kReduceScatter:
    case Coll::kScatter:
      return {buf, mine};
    default:
      return {buf, buf};
  }
}

void Sweep::initData(bool inPlace, const Counts& c, DataType dt, RedOp op, const Layout& l) {
  const size_t ts = dataTypeSize(dt);
  const bool red = collReduces(opts_.coll);
  // A pattern no input produces, so output that was never written is counted as
  // wrong.
  memset(recvBuf_.get(), 0xA5, std::max(c.send, c.recv) * ts);
  if (!inPlace) memset(sendBuf_.get(), 0, c.send * ts);
  fillInput(dt, op, red, rank_, 0, n_, l.send, c.send);
}

int64_t Sweep::checkData(const Counts& c, DataType dt, RedOp op, const Layout& l) {
  const size_t ts = dataTypeSize(dt);
  const size_t p = c.param;
  const int prev = (rank_ + n_ - 1) % n_;
  int64_t wrong = 0;
  switch (opts_.coll) {
    case Coll::kAllReduce:
      return countWrongReduced(dt, op, n_, 0, l.recv, p);
    case Coll::kReduce:
      return rank_ == root_ ? countWrongReduced(dt, op, n_, 0, l.recv, p) : 0;
    case Coll::kReduceScatter:
      return countWrongReduced(dt, op, n_, rank_ * p, l.recv, p);
    case Coll::kBroadcast:
      return countWrongCopied(dt, root_, 0, n_, l.recv, p);
    case Coll::kSend:
      return countWrongCopied(dt, prev, 0, n_, l.recv, p);
    case Coll::kScatter:
      return countWrongCopied(dt, root_, rank_ * p, n_, l.recv, p);
    case Coll::kAllGather:
      for (int r = 0; r < n_; ++r) wrong += countWrongCopied(dt, r, 0, n_, l.recv + r * p * ts, p);
      return wrong;
    case Coll::kGather:
      if (rank_ != root_) return 0;
      for (int r = 0; r < n_; ++r) wrong += countWrongCopied(dt, r, 0, n_, l.recv + r * p * ts, p);
      return wrong;
    case Coll::kAlltoAll:
      for (int r = 0; r < n_; ++r) wrong += countWrongCopied(dt, r, rank_ * p, n_, l.recv + r * p * ts, p);
      return wrong;
    default:
      return 0;
  }
}

Status Sweep::runOnce(const Counts& c, DataType dt, RedOp op, const Layout& l) {
  if (!device_) return be_.run(opts_.coll, l.send, l.recv, c.param, dt, op, root_);
  const Layout d = deviceLayout(l);
  return be_.run(opts_.coll, d.send, d.recv, c.param, dt, op, root_);
}

bool Sweep::benchOne(bool inPlace, const Counts& c, DataType dt, RedOp op, double* usec, int64_t* wrong) {
  const Layout l = layout(inPlace, c, dataTypeSize(dt));
  initData(inPlace, c, dt, op, l);
  Status s = toDevice();
  if (!s.isOk()) return fail("copy to the device", s), false;
  for (int i = 0; i < opts_.warmup; ++i) {
    s = runOnce(c, dt, op, l);
    if (!s.isOk()) return fail("warmup", s), false;
  }
  s = be_.waitDevice();
  if (!s.isOk()) return fail("warmup", s), false;
  // Start together; then a loop without barriers, as nccl-tests times it.
  double sync = 0;
  s = be_.allReduceDouble(&sync, ReduceMode::kSum);
  if (!s.isOk()) return fail("barrier", s), false;
  double t0 = nowSeconds();
  int64_t wrongEach = 0;
  double timed = 0;
  for (int i = 0; i < opts_.iters; ++i) {
    if (opts_.timeline && opts_.check) {
      initData(inPlace, c, dt, op, l);
      s = toDevice();
      if (!s.isOk()) return fail("copy to the device", s), false;
    }
    const double ti = nowSeconds();
    s = runOnce(c, dt, op, l);
    if (!s.isOk()) return fail(collFlagName(opts_.coll), s), false;
    if (!opts_.timeline) continue;
    s = be_.waitDevice();
    if (!s.isOk()) return fail(collFlagName(opts_.coll), s), false;
    const double dti = nowSeconds() - ti;
    timed += dti;
    if (opts_.check) {
      s = toHost();
      if (!s.isOk()) return fail("copy to the host", s), false;
    }
    const int64_t w = opts_.check ? checkData(c, dt, op, l) : 0;
    wrongEach += w;
    double alg = 0, bus = 0;
    bandwidth(opts_.coll, c.param, dataTypeSize(dt), n_, dti, &alg, &bus);
    if (rank_ == 0 || w != 0)
      printf("#  rank %d iteration %3d: %12.1f us  algbw %7.3f  busbw %7.3f GB/s  %s\n", rank_, i, dti * 1e6, alg, bus,
             opts_.check ? (w == 0 ? "right" : "WRONG") : "");
    fflush(stdout);
  }
  if (!opts_.timeline) {
    s = be_.waitDevice();  // device calls were only enqueued
    if (!s.isOk()) return fail(collFlagName(opts_.coll), s), false;
  }
  double t = (opts_.timeline ? timed : nowSeconds() - t0) / std::max(opts_.iters, 1) * 1e6;
  if (wrongEach != 0)
    return fail("timeline check", Status(Code::kInternalError, "wrong results in a timed iteration")), false;
  switch (opts_.average) {
    case 0:
      t = rank_ == 0 ? t : 0;
      s = be_.allReduceDouble(&t, ReduceMode::kSum);
      break;
    case 2:
      s = be_.allReduceDouble(&t, ReduceMode::kMin);
      break;
    case 3:
      s = be_.allReduceDouble(&t, ReduceMode::kMax);
      break;
    default:
      s = be_.allReduceDouble(&t, ReduceMode::kSum);
      t /= n_;
      break;
  }
  if (!s.isOk()) return fail("time reduction", s), false;
  *usec = t;
  *wrong = 0;
  if (opts_.check) {
    initData(inPlace, c, dt, op, l);
    s = toDevice();
    if (s.isOk()) s = runOnce(c, dt, op, l);
    if (s.isOk()) s = be_.waitDevice();
    if (s.isOk()) s = toHost();
    if (!s.isOk()) return fail(collFlagName(opts_.coll), s), false;
    double w = static_cast<double>(checkData(c, dt, op, l));
    s = be_.allReduceDouble(&w, ReduceMode::kSum);
    if (!s.isOk()) return fail("error count reduction", s), false;
    *wrong = static_cast<int64_t>(w);
  }
  return true;
}

bool Sweep::testType(DataType dt, RedOp op) {
  const size_t ts = dataTypeSize(dt);
  const bool red = collReduces(opts_.coll);
  const char* opLabel = red ? c4::redOpName(op) : "none";
  const int rootLabel = hasRoot(opts_.coll) ? root_ : -1;
  for (size_t size = opts_.minBytes; size <= opts_.maxBytes;
       size = opts_.stepFactor > 1 ? size * opts_.stepFactor : size + opts_.stepBytes) {
    Counts c = countsFor(opts_.coll, size / ts, n_);
    if (rank_ == 0)
      fprintf(out_, "%12zu  %12zu  %8s  %6s  %6d", std::max(c.send, c.recv) * ts, c.param, c4::dataTypeName(dt),
              opLabel, rootLabel);
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      double usec = 0;
      int64_t wrong = 0;
      if (!benchOne(inPlace != 0, c, dt, op, &usec, &wrong)) {
        if (rank_ == 0) fprintf(out_, "\n"), fflush(out_);
        return false;
      }
      double algBw, busBw;
      bandwidth(opts_.coll, c.param, ts, n_, usec * 1e-6, &algBw, &busBw);
      bwSum_ += busBw;
      ++bwCount_;
      if (wrong) ++failedTests_;
      if (rank_ == 0) {
        if (opts_.check)
          fprintf(out_, "  %7s  %6s  %6s  %6g", formatFloat(usec, 7).c_str(), formatFloat(algBw, 6).c_str(),
                  formatFloat(busBw, 6).c_str(), static_cast<double>(wrong));
        else
          fprintf(out_, "  %7s  %6s  %6s    N/A", formatFloat(usec, 7).c_str(), formatFloat(algBw, 6).c_str(),
                  formatFloat(busBw, 6).c_str());
      }
    }
    if (rank_ == 0) fprintf(out_, "\n"), fflush(out_);
    if (size == 0 && opts_.stepFactor > 1) break;
  }
  return true;
}

void Sweep::printHeader() {
  // Every rank describes itself; rank 0 prints all lines in rank order.
  constexpr size_t kLine = 256;
  char host[128] = {0};
  gethostname(host, sizeof(host) - 1);
  char mine[kLine] = {0};
  snprintf(mine, kLine, "#  Rank %2d Group %2d Pid %6d on %10s device %3d [none]\n", rank_, 0,
           static_cast<int>(getpid()), host, -1);
  std::vector<char> all(kLine * n_);
  Status s = be_.allGatherBytes(mine, all.data(), kLine);
  if (rank_ != 0) return;
  fprintf(out_, "# Collective test starting: %s %s\n", info_.program.c_str(), collFlagName(opts_.coll));
  const bool factor = opts_.stepFactor > 1;
  fprintf(out_,
          "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup "
          "iters: %d iters: %d agg iters: 1 "
          "validation: %d graph: %d\n",
          opts_.minBytes, opts_.maxBytes, factor ? opts_.stepFactor : opts_.stepBytes, factor ? "factor" : "bytes",
          opts_.warmup, opts_.iters, opts_.check, opts_.graph);
  if (opts_.blocking)
    fprintf(out_,
            "# Blocking Enabled: host collectives complete before "
            "returning (no extra barrier)\n");
  fprintf(out_, "# Library: %s\n", info_.library.c_str());
  if (opts_.registered) fprintf(out_, "# Buffers: registered (%s)\n", be_.registeredName().c_str());
  if (device_)
    fprintf(out_, "# Buffers: CUDA device memory (%s); calls ordered on a stream, timed to its end\n",
            be_.deviceName().c_str());
  if (info_.spawnMs >= 0)
    fprintf(out_,
            "# Init time: %.1f ms for %d ranks (slowest rank; %.1f ms from "
            "spawn to all ranks ready)\n",
            info_.initMs, n_, info_.spawnMs);
  else
    fprintf(out_, "# Init time: %.1f ms for %d ranks (slowest rank)\n", info_.initMs, n_);
  fprintf(out_, "#\n# Using devices\n");
  if (s.isOk()) {
    for (int r = 0; r < n_; ++r) fprintf(out_, "%s", &all[kLine * r]);
  } else {
    fprintf(out_, "%s", mine);
  }
  fprintf(out_, "#\n");
  fprintf(out_,
          "# %10s  %12s  %8s  %6s  %6s           out-of-place                  "
          "     in-place          \n",
          "", "", "", "", "");
  fprintf(out_, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size", "count", "type",
          "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  fprintf(out_, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)", "(elements)", "", "",
          "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(out_);
}

int Sweep::run() {
  root_ = opts_.root;
  if (hasRoot(opts_.coll) && (root_ < 0 || root_ >= n_)) {
    if (rank_ == 0) fprintf(stderr, "%s: root %d out of range for %d ranks\n", info_.program.c_str(), root_, n_);
    return kExitFailed;
  }
  if (opts_.coll == Coll::kSend) root_ = -1;
  // Every layout stays within maxBytes (rounded up to whole 8-byte elements).
  const size_t bytes = (opts_.maxBytes + 8) & ~size_t{7};
  Backend* reg = nullptr;
  if (opts_.registered) {
    if (be_.registeredName().empty()) {
      if (rank_ == 0)
        fprintf(stderr, "%s: -R 1: %s has no allocator of its own\n", info_.program.c_str(), info_.library.c_str());
      return kExitFailed;
    }
    reg = &be_;
  }
  sendBuf_ = allocBuffer(bytes, reg);
  recvBuf_ = allocBuffer(bytes, reg);
  if (!sendBuf_ || !recvBuf_) {
    fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes%s%s\n", info_.program.c_str(), rank_, bytes,
            reg ? " with " : "", reg ? be_.registeredName().c_str() : "");
    return kExitFailed;
  }
  bufBytes_ = std::max<size_t>(bytes, 64);
  device_ = opts_.device != 0 && !be_.deviceName().empty() && !opts_.registered;
  if (opts_.device == 1 && !device_) {
    fprintf(stderr, "%s: rank %d: --device 1: %s\n", info_.program.c_str(), rank_,
            opts_.registered ? "not with -R 1" : "no GPU (or a build without CUDA)");
    return kExitFailed;
  }
  if (device_) {
    auto freeDev = [this](char* p) { be_.freeDevice(p); };
    devSend_ = {static_cast<char*>(be_.allocDevice(bufBytes_)), freeDev};
    devRecv_ = {static_cast<char*>(be_.allocDevice(bufBytes_)), freeDev};
    if (!devSend_ || !devRecv_) {
      fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes of device memory\n", info_.program.c_str(), rank_,
              bufBytes_);
      return kExitFailed;
    }
  }
  printHeader();
  const bool red = collReduces(opts_.coll);
  const std::vector<RedOp> ops = red ? opts_.ops : std::vector<RedOp>{RedOp::kSum};
  for (DataType dt : opts_.types) {
    for (RedOp op : ops) {
      std::string why = be_.unsupported(opts_.coll, dt, op);
      if (!why.empty()) {
        if (rank_ == 0)
          fprintf(out_, "# skipped %s %s: %s\n", c4::dataTypeName(dt), red ? c4::redOpName(op) : "none", why.c_str());
        continue;
      }
      if (!testType(dt, op)) return kExitFailed;
    }
  }
  if (rank_ == 0) {
    fprintf(out_, "# %-20s : %d %s\n", "Out of bounds values", failedTests_, failedTests_ ? "FAILED" : "OK");
    fprintf(out_, "# %-20s : %g \n", "Avg bus bandwidth", bwCount_ ? bwSum_ / bwCount_ : 0.0);
    fprintf(out_, "#\n# Collective test concluded: %s\n#\n", info_.program.c_str());
    fflush(out_);
  }
  return failedTests_ ? kExitWrong : kExitOk;
}

}  // namespace

const char* collFlagName(Coll coll) {
  switch (coll) {
    case Coll::kAllReduce:
      return "allreduce";
    case Coll::kAllGather:
      return "allgather";
    case Coll::kBroadcast:
      return "broadcast";
    case Coll::kReduceScatter:
      return "reducescatter";
    case Coll::kReduce:
      return "reduce";
    case Coll::kAlltoAll:
      return "alltoall";
    case Coll::kGather:
      return "gather";
    case Coll::kScatter:
      return "scatter";
    case Coll::kSend:
      return "sendrecv";
    default:
      return "unknown";
  }
}

bool parseColl(const std::string& s, Coll* coll) {
  std::string k;
  for (char ch : s)
    if (ch != '_' && ch != '-') k += static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  for (Coll c : kAllColls)
    if (k == collFlagName(c)) return *coll = c, true;
  return false;
}

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

void printUsage(FILE* out, const char* prog) {
  fprintf(out,
          "usage: %s [flags]   (nccl-tests flags; sizes take K/M/G suffixes)\n"
          "  -C, --collective <name>   "
          "allreduce|allgather|broadcast|reducescatter|reduce|alltoall|gather|\n"
          "                            scatter|sendrecv (default allreduce)\n"
          "  -b, --minbytes <size>     smallest size in bytes (default 32M)\n"
          "  -e, --maxbytes <size>     largest size in bytes (default 32M)\n"
          "  -i, --stepbytes <size>    add this between sizes (default 1M)\n"
          "  -f, --stepfactor <n>      multiply by this between sizes (wins over "
          "-i)\n"
          "  -n, --iters <n>           timed iterations per size (default 20)\n"
          "  -w, --warmup_iters <n>    untimed iterations before each timing "
          "(default 1)\n"
          "  -c, --check <0/1>         verify results (default 1)\n"
          "  -o, --op <op>             sum|prod|min|max|avg|all (default sum)\n"
          "  -d, --datatype <type>     "
          "float|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|double|\n"
          "                            f8e4m3|f8e5m2|all (default float)\n"
          "  -r, --root <rank>         root of broadcast/reduce/gather/scatter "
          "(default 0)\n"
          "  -a, --average <0-3>       time across ranks: 0 rank 0, 1 average, 2 "
          "min, 3 max (default 1)\n"
          "  -z, --blocking <0/1>      accepted (host collectives always block)\n"
          "  -G, --cudagraph <n>       accepted (ignored on host memory)\n"
          "  --nonblocking <0/1>       c4-perf: 1 = non-blocking communicators (Config::blocking = 0): every\n"
          "                            call is queued on the progress thread and waited for with\n"
          "                            commGetAsyncError (default 0)\n"
          "  --timeline <0/1>          c4-perf: 1 = time each timed iteration on its own and print it (rank 0);\n"
          "                            with -c 1 every iteration's result is checked too (default 0)\n"
          "  --device <0/1>            c4-perf: 1 = CUDA device buffers, each call on a stream (nccl-tests'\n"
          "                            way); 0 = host buffers; default: device where a GPU is, else host\n"
          "  -R, --local_register <0/1>  1: buffers from the library's allocator (c4: ncclMemAlloc,\n"
          "                            zero-copy on one host; MPI: MPI_Alloc_mem) (default 0)\n"
          "  -t, --nthreads / -g, --ngpus <1>   accepted when 1\n"
          "  -np <N>                   spawn N local ranks (otherwise a launcher's "
          "ranks, or 1 rank)\n"
          "  --list-params             print every c4comm parameter and exit "
          "(c4-perf)\n"
          "  --gloo-algo <a>           ring|bcube|default allreduce algorithm "
          "(c4-peer-gloo)\n"
          "  -h, --help                this text\n",
          prog);
}

bool parseOptions(int argc, char** argv, Options* o, bool* help, std::string* err) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string val;
    bool hasVal = false;
    size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      hasVal = true;
    }
    if (a == "-h" || a == "--help") {
      *help = true;
      continue;
    }
    if (a == "--list-params") {
      o->listParams = true;
      continue;
    }
    auto need = [&](std::string* v) {
      if (hasVal) return *v = val, true;
      if (i + 1 >= argc) return *err = "missing value for " + a, false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    auto is = [&](const char* s, const char* l) { return a == s || (l && a == l); };
    if (is("-b", "--minbytes") || is("-e", "--maxbytes") || is("-i", "--stepbytes")) {
      size_t sz;
      if (!need(&v)) return false;
      if (!parseSize(v, &sz)) return *err = "bad size '" + v + "' for " + a, false;
      (a == "-b" || a == "--minbytes" ? o->minBytes : a == "-e" || a == "--maxbytes" ? o->maxBytes : o->stepBytes) = sz;
      continue;
    }
    struct IntFlag {
      const char* s;
      const char* l;
      int* dst;
    };
    int stepFactor = -1, nthreads = 1, ngpus = 1, ignored = 0;
    const IntFlag ints[] = {{"-f", "--stepfactor", &stepFactor},
                            {"-n", "--iters", &o->iters},
                            {"-w", "--warmup_iters", &o->warmup},
                            {"-c", "--check", &o->check},
                            {"-r", "--root", &o->root},
                            {"-a", "--average", &o->average},
                            {"-z", "--blocking", &o->blocking},
                            {"-G", "--cudagraph", &o->graph},
                            {"-R", "--local_register", &o->registered},
                            {"--nonblocking", "--nonblocking", &o->nonblocking},
                            {"--timeline", "--timeline", &o->timeline},
                            {"--device", "--device", &o->device},
                            {"-t", "--nthreads", &nthreads},
                            {"-g", "--ngpus", &ngpus},
                            {"-np", "--np", &o->np},
                            {"-m", "--agg_iters", &ignored},
                            {"-p", "--parallel_init", &ignored},
                            {"-T", "--timeout", &ignored}};
    bool matched = false;
    for (const IntFlag& f : ints) {
      if (!is(f.s, f.l)) continue;
      matched = true;
      if (!need(&v)) return false;
      if (!parseInt(v, f.dst)) return *err = "bad integer '" + v + "' for " + a, false;
    }
    if (matched) {
      if (stepFactor >= 0) o->stepFactor = static_cast<size_t>(stepFactor);
      if (nthreads != 1 || ngpus != 1) return *err = "only -t 1 -g 1 (one rank per process) is supported", false;
      continue;
    }
    if (is("-o", "--op")) {
      if (!need(&v)) return false;
      o->ops.clear();
      if (v == "all") {
        o->ops.assign(std::begin(kAllOps), std::end(kAllOps));
        continue;
      }
      for (RedOp op : kAllOps)
        if (v == c4::redOpName(op)) o->ops.push_back(op);
      if (o->ops.empty()) return *err = "unknown op '" + v + "'", false;
      continue;
    }
    if (is("-d", "--datatype")) {
      if (!need(&v)) return false;
      o->types.clear();
      if (v == "all") {
        o->types.assign(std::begin(kAllTypes), std::end(kAllTypes));
        continue;
      }
      DataType dt;
      if (!parseTypeName(v, &dt)) return *err = "unknown datatype '" + v + "'", false;
      o->types.push_back(dt);
      continue;
    }
    if (is("-C", "--collective")) {
      if (!need(&v)) return false;
      if (!parseColl(v, &o->coll)) return *err = "unknown collective '" + v + "'", false;
      continue;
    }
    if (is("--gloo-algo", nullptr)) {
      if (!need(&v)) return false;
      if (v != "ring" && v != "bcube" && v != "default") return *err = "--gloo-algo must be ring|bcube|default", false;
      o->glooAlgo = v;
      continue;
    }
    *err = "unknown flag '" + a + "' (see --help)";
    return false;
  }
  if (o->minBytes > o->maxBytes) return *err = "minbytes is larger than maxbytes", false;
  if (o->stepFactor <= 1 && o->stepBytes == 0) return *err = "stepbytes must be > 0 when stepfactor <= 1", false;
  if (o->iters < 1 || o->warmup < 0) return *err = "iters must be >= 1 and warmup >= 0", false;
  if (o->average < 0 || o->average > 3) return *err = "average must be 0..3", false;
  if (o->registered < 0 || o->registered > 1) return *err = "-R must be 0 or 1", false;
  if (o->np < 0) return *err = "-np must be >= 1", false;
  return true;
}

int spawnRanks(int n, const std::function<int(int rank)>& body, const std::function<void()>& afterFork) {
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "fork of rank %d failed: %s\n", r, strerror(errno));
      for (pid_t p : pids) kill(p, SIGTERM);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return 1;
    }
    if (pid == 0) {
      int rc = body(r);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  if (afterFork) afterFork();
  int result = kExitOk;
  bool stopping = false;
  size_t alive = pids.size();
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    int rank = static_cast<int>(it - pids.begin());
    *it = -1;
    --alive;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code != kExitOk && (result == kExitOk || result == kExitWrong)) result = code;
    if (code != kExitOk && code != kExitWrong && !stopping) {
      stopping = true;
      fprintf(stderr, "rank %d (pid %d) %s %d; stopping the other ranks\n", rank, static_cast<int>(pid),
              WIFEXITED(status) ? "exited with" : "was killed by signal", WIFEXITED(status) ? code : code - 128);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGTERM);
    }
  }
  return result;
}

int runBenchmark(const Options& opts, const RunInfo& info, Backend& backend, FILE* out) {
  Sweep sweep(opts, info, backend, out);
  return sweep.run();
}

}  // namespace perf
}  // namespace c4
