// c4-peer-gloo: the c4-perf sweep through Gloo collectives, for a line-by-line
// comparison.
//
//   c4-peer-gloo -np 4 -C allreduce -b 1M -e 64M -f 2 [--gloo-algo
//   ring|bcube|default]
//
// Ranks are forked locally and meet through a gloo::rendezvous::FileStore in a
// fresh temporary directory (under a PrefixStore); the transport is Gloo's TCP
// device on 127.0.0.1. Launched mode (one process per rank, e.g. across netlab
// hosts): RANK and WORLD_SIZE from the environment, C4_GLOO_STORE names a
// directory every rank can reach (an empty one per run), C4_GLOO_HOSTNAME the
// local address Gloo binds (default 127.0.0.1). Mapping (nccl-tests semantics on top of Gloo):
//   allreduce gloo::allreduce (algorithm from --gloo-algo), allgather
//   gloo::allgather, broadcast gloo::broadcast, reduce gloo::reduce, alltoall
//   gloo::alltoall (in place: through a scratch copy), gather gloo::gather,
//   scatter gloo::scatter, sendrecv UnboundBuffer send/recv (in place: through
//   a scratch copy), reducescatter gloo::ReduceScatterHalvingDoubling (Gloo's
//   only reduce-scatter; it works in place on the full buffer, so out of place
//   includes a copy in and the block's copy out; no bfloat16/fp8). avg is a sum
//   followed by a local division. Native types reduce with Gloo's own kernels
//   (gloo::sum<T> ...), half/bfloat16/fp8 with the shared reference kernels in
//   bench/perf/perf_data.cc.
#include <dirent.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench/perf/perf_data.hpp"
#include "bench/perf/perf_driver.hpp"

namespace c4 {
namespace perf {
namespace {

constexpr const char* kProgram = "c4-peer-gloo";
constexpr uint64_t kSendRecvSlot = 0x4334;

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
using RawReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn glooNativeFn(RedOp op) {
  switch (op) {
    case RedOp::kProd:
      return static_cast<RawReduceFn>(&gloo::product<T>);
    case RedOp::kMax:
      return static_cast<RawReduceFn>(&gloo::max<T>);
    case RedOp::kMin:
      return static_cast<RawReduceFn>(&gloo::min<T>);
    default:
      return static_cast<RawReduceFn>(&gloo::sum<T>);
  }
}

// c = a op b for n elements, in the element types Gloo has no kernels for.
ReduceFn referenceFn(DataType dt, RedOp op) {
  return [dt, op](void* c, const void* a, const void* b, size_t n) {
    const size_t bytes = n * dataTypeSize(dt);
    if (c == b) {
      reduceInto(dt, op, c, a, n);  // every op here commutes
      return;
    }
    if (c != a) memcpy(c, a, bytes);
    reduceInto(dt, op, c, b, n);
  };
}

ReduceFn reduceFn(DataType dt, RedOp op) {
  switch (dt) {
    case DataType::kInt8:
      return glooNativeFn<int8_t>(op);
    case DataType::kUint8:
      return glooNativeFn<uint8_t>(op);
    case DataType::kInt32:
      return glooNativeFn<int32_t>(op);
    case DataType::kUint32:
      return glooNativeFn<uint32_t>(op);
    case DataType::kInt64:
      return glooNativeFn<int64_t>(op);
    case DataType::kUint64:
      return glooNativeFn<uint64_t>(op);
    case DataType::kFloat32:
      return glooNativeFn<float>(op);
    case DataType::kFloat64:
      return glooNativeFn<double>(op);
    case DataType::kFloat16:
      return glooNativeFn<gloo::float16>(op);
    default:
      return referenceFn(dt, op);
  }
}

// Gloo's typed option setters only need the element size; these stand-ins carry
// it.
template <size_t kSize>
struct Elem;
template <>
struct Elem<1> {
  using T = uint8_t;
};
template <>
struct Elem<2> {
  using T = uint16_t;
};
template <>
struct Elem<4> {
  using T = uint32_t;
};
template <>
struct Elem<8> {
  using T = uint64_t;
};

template <typename F>
Status bySize(size_t ts, F&& f) {
  switch (ts) {
    case 1:
      return f(static_cast<Elem<1>::T*>(nullptr));
    case 2:
      return f(static_cast<Elem<2>::T*>(nullptr));
    case 4:
      return f(static_cast<Elem<4>::T*>(nullptr));
    default:
      return f(static_cast<Elem<8>::T*>(nullptr));
  }
}

// The old-style reduce-scatter is an object bound to one buffer; it is rebuilt
// when the buffer, count, type or op change.
struct ReduceScatterCache {
  void* ptr = nullptr;
  size_t count = 0;
  DataType dt = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  std::unique_ptr<gloo::Algorithm> alg;
};

template <typename T>
std::unique_ptr<gloo::Algorithm> makeReduceScatter(const std::shared_ptr<gloo::Context>& ctx, void* ptr, size_t perRank,
                                                   int n, RedOp op) {
  const gloo::ReductionFunction<T>* fn = op == RedOp::kProd  ? gloo::ReductionFunction<T>::product
                                         : op == RedOp::kMax ? gloo::ReductionFunction<T>::max
                                         : op == RedOp::kMin ? gloo::ReductionFunction<T>::min
                                                             : gloo::ReductionFunction<T>::sum;
  std::vector<T*> ptrs{static_cast<T*>(ptr)};
  std::vector<int> recvElems(static_cast<size_t>(n), static_cast<int>(perRank));
  return std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(ctx, ptrs, static_cast<int>(perRank * n), recvElems,
                                                                 fn);
}

class GlooBackend : public Backend {
 public:
  GlooBackend(std::shared_ptr<gloo::Context> ctx, const std::string& algo) : ctx_(std::move(ctx)) {
    algo_ = algo == "ring"    ? gloo::AllreduceOptions::Algorithm::RING
            : algo == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                              : gloo::AllreduceOptions::Algorithm::UNSPECIFIED;
  }
  int rank() const override { return ctx_->rank; }
  int nranks() const override { return ctx_->size; }

  std::string unsupported(Coll coll, DataType dt, RedOp op) const override {
    if (coll == Coll::kReduceScatter &&
        (dt == DataType::kBfloat16 || dt == DataType::kFloat8e4m3 || dt == DataType::kFloat8e5m2))
      return "gloo's ReduceScatterHalvingDoubling has no bfloat16/fp8 "
             "reduction";
    return "";
  }

  Status run(Coll coll, const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) override {
    try {
      return runImpl(coll, const_cast<void*>(send), static_cast<char*>(recv), count, dt, op, root);
    } catch (const std::exception& e) {
      return Status(Code::kRemoteError, std::string("gloo ") + collFlagName(coll) + ": " + e.what());
    }
  }

  Status allReduceDouble(double* v, ReduceMode mode) override {
    try {
      gloo::AllreduceOptions o(ctx_);
      o.setOutput(v, 1);
      o.setReduceFunction(glooNativeFn<double>(mode == ReduceMode::kMin   ? RedOp::kMin
                                               : mode == ReduceMode::kMax ? RedOp::kMax
                                                                          : RedOp::kSum));
      gloo::allreduce(o);
      return Status();
    } catch (const std::exception& e) {
      return Status(Code::kRemoteError, std::string("gloo allreduce(double): ") + e.what());
    }
  }

  Status allGatherBytes(const void* mine, void* all, size_t bytes) override {
    try {
      gloo::AllgatherOptions o(ctx_);
      o.setInput(static_cast<uint8_t*>(const_cast<void*>(mine)), bytes);
      o.setOutput(static_cast<uint8_t*>(all), bytes * static_cast<size_t>(ctx_->size));
      gloo::allgather(o);
      return Status();
    } catch (const std::exception& e) {
      return Status(Code::kRemoteError, std::string("gloo allgather(bytes): ") + e.what());
    }
  }

 private:
  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  Status runImpl(Coll coll, void* send, char* recv, size_t count, DataType dt, RedOp op, int root) {
    const size_t ts = dataTypeSize(dt);
    const size_t bytes = count * ts;
    const int me = ctx_->rank, n = ctx_->size;
    const bool inPlace = send == recv;
    char* sb = static_cast<char*>(send);
    switch (coll) {
      case Coll::kAllReduce:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::AllreduceOptions o(ctx_);
          o.setAlgorithm(algo_);
          if (!inPlace) o.setInput(reinterpret_cast<T*>(sb), count);
          o.setOutput(reinterpret_cast<T*>(recv), count);
          o.setReduceFunction(reduceFn(dt, op));
          gloo::allreduce(o);
          if (op == RedOp::kAvg) divideInPlace(dt, recv, count, n);
          return Status();
        });
      case Coll::kAllGather:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::AllgatherOptions o(ctx_);
          o.setInput(reinterpret_cast<T*>(sb), count);
          o.setOutput(reinterpret_cast<T*>(recv), count * n);
          gloo::allgather(o);
          return Status();
        });
      case Coll::kBroadcast:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::BroadcastOptions o(ctx_);
          o.setRoot(root);
          if (me == root && !inPlace) o.setInput(reinterpret_cast<T*>(sb), count);
          o.setOutput(reinterpret_cast<T*>(recv), count);
          gloo::broadcast(o);
          return Status();
        });
      case Coll::kReduce:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::ReduceOptions o(ctx_);
          o.setRoot(root);
          if (!inPlace) o.setInput(reinterpret_cast<T*>(sb), count);
          o.setOutput(reinterpret_cast<T*>(recv), count);
          o.setReduceFunction(reduceFn(dt, op));
          gloo::reduce(o);
          if (op == RedOp::kAvg && me == root) divideInPlace(dt, recv, count, n);
          return Status();
        });
      case Coll::kAlltoAll:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          char* in = sb;
          if (inPlace) in = static_cast<char*>(memcpy(scratch(bytes * n), sb, bytes * n));
          gloo::AlltoallOptions o(ctx_);
          o.setInput(reinterpret_cast<T*>(in), count * n);
          o.setOutput(reinterpret_cast<T*>(recv), count * n);
          gloo::alltoall(o);
          return Status();
        });
      case Coll::kGather:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::GatherOptions o(ctx_);
          o.setRoot(root);
          o.setInput(reinterpret_cast<T*>(sb), count);
          if (me == root) o.setOutput(reinterpret_cast<T*>(recv), count * n);
          gloo::gather(o);
          return Status();
        });
      case Coll::kScatter:
        return bySize(ts, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          gloo::ScatterOptions o(ctx_);
          o.setRoot(root);
          if (me == root) {
            std::vector<T*> ins;
            for (int r = 0; r < n; ++r) ins.push_back(reinterpret_cast<T*>(sb + r * bytes));
            o.setInputs(ins, count);
          }
          o.setOutput(reinterpret_cast<T*>(recv), count);
          gloo::scatter(o);
          return Status();
        });
      case Coll::kSend: {
        const int next = (me + 1) % n, prev = (me + n - 1) % n;
        char* out = inPlace ? static_cast<char*>(memcpy(scratch(bytes), sb, bytes)) : sb;
        if (bytes == 0) return Status();
        auto sbuf = ctx_->createUnboundBuffer(out, bytes);
        auto rbuf = ctx_->createUnboundBuffer(recv, bytes);
        rbuf->recv(prev, kSendRecvSlot);
        sbuf->send(next, kSendRecvSlot);
        rbuf->waitRecv();
        sbuf->waitSend();
        return Status();
      }
      case Coll::kReduceScatter: {
        // In place the full buffer is `send` and the result belongs at this
        // rank's block of it.
        char* work = inPlace || recv == sb + me * bytes ? sb : scratch(bytes * n);
        if (work != sb) memcpy(work, sb, bytes * n);
        Status s = reduceScatter(work, count, dt, op);
        if (!s.isOk()) return s;
        char* dst = recv;
        if (dst != work) memmove(dst, work, bytes);
        if (op == RedOp::kAvg) divideInPlace(dt, dst, count, n);
        return Status();
      }
      default:
        return Status(Code::kInvalidArgument, "unsupported collective");
    }
  }

  Status reduceScatter(void* work, size_t perRank, DataType dt, RedOp op) {
    if (perRank == 0) return Status();
    ReduceScatterCache& c = rsCache_;
    if (!c.alg || c.ptr != work || c.count != perRank || c.dt != dt || c.op != op) {
      c.alg.reset();
      const int n = ctx_->size;
      switch (dt) {
        case DataType::kInt8:
          c.alg = makeReduceScatter<int8_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kUint8:
          c.alg = makeReduceScatter<uint8_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kInt32:
          c.alg = makeReduceScatter<int32_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kUint32:
          c.alg = makeReduceScatter<uint32_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kInt64:
          c.alg = makeReduceScatter<int64_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kUint64:
          c.alg = makeReduceScatter<uint64_t>(ctx_, work, perRank, n, op);
          break;
        case DataType::kFloat16:
          c.alg = makeReduceScatter<gloo::float16>(ctx_, work, perRank, n, op);
          break;
        case DataType::kFloat32:
          c.alg = makeReduceScatter<float>(ctx_, work, perRank, n, op);
          break;
        case DataType::kFloat64:
          c.alg = makeReduceScatter<double>(ctx_, work, perRank, n, op);
          break;
        default:
          return Status(Code::kInvalidArgument, "no gloo reduce-scatter for this type");
      }
      c.ptr = work;
      c.count = perRank;
      c.dt = dt;
      c.op = op;
    }
    c.alg->run();
    return Status();
  }

  std::shared_ptr<gloo::Context> ctx_;
  gloo::AllreduceOptions::Algorithm algo_;
  std::vector<char> scratch_;
  ReduceScatterCache rsCache_;
};

void removeDir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

int runRank(const Options& opts, int rank, int nranks, const std::string& storeDir, double spawnStart,
            const std::string& hostname = "127.0.0.1") {
  try {
    const double t0 = nowSeconds();
    gloo::rendezvous::FileStore fileStore(storeDir);
    gloo::rendezvous::PrefixStore store("c4-peer-gloo", fileStore);
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    ctx->setTimeout(std::chrono::seconds(600));
    ctx->connectFullMesh(store, device);
    const double ready = nowSeconds();
    GlooBackend backend(ctx, opts.glooAlgo);
    RunInfo info;
    info.program = kProgram;
    info.library = std::string("gloo ") + std::to_string(GLOO_VERSION_MAJOR) + "." +
                   std::to_string(GLOO_VERSION_MINOR) + "." + std::to_string(GLOO_VERSION_PATCH) + " (tcp on " +
                   hostname + ", allreduce algorithm: " + opts.glooAlgo + ")";
    double initMs = (ready - t0) * 1e3, spawnMs = spawnStart >= 0 ? (ready - spawnStart) * 1e3 : -1;
    if (!backend.allReduceDouble(&initMs, ReduceMode::kMax).isOk() ||
        !backend.allReduceDouble(&spawnMs, ReduceMode::kMax).isOk())
      return 1;
    info.initMs = initMs;
    info.spawnMs = spawnMs;
    return runBenchmark(opts, info, backend, stdout);
  } catch (const std::exception& e) {
    fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  Options opts;
  bool help = false;
  std::string err;
  if (!parseOptions(argc, argv, &opts, &help, &err)) {
    fprintf(stderr, "%s: %s\n", kProgram, err.c_str());
    return 1;
  }
  if (help) return printUsage(stdout, kProgram), 0;
  if (opts.listParams) {
    fprintf(stderr, "%s: --list-params belongs to c4-perf\n", kProgram);
    return 1;
  }
  if (getenv("RANK") && getenv("WORLD_SIZE")) {
    const char* store = getenv("C4_GLOO_STORE");
    if (!store || !*store) {
      fprintf(stderr, "%s: launched with RANK/WORLD_SIZE: set C4_GLOO_STORE to a directory all ranks share\n",
              kProgram);
      return 1;
    }
    const char* host = getenv("C4_GLOO_HOSTNAME");
    return runRank(opts, atoi(getenv("RANK")), atoi(getenv("WORLD_SIZE")), store, -1,
                   host && *host ? host : "127.0.0.1");
  }
  const char* tmp = getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/c4-peer-gloo-XXXXXX";
  if (!mkdtemp(&templ[0])) {
    fprintf(stderr, "%s: mkdtemp %s: %s\n", kProgram, templ.c_str(), strerror(errno));
    return 1;
  }
  const int n = std::max(opts.np, 1);
  const double spawnStart = nowSeconds();
  int rc = n == 1 ? runRank(opts, 0, 1, templ, -1)
                  : spawnRanks(n, [&](int rank) { return runRank(opts, rank, n, templ, spawnStart); });
  removeDir(templ);
  return rc;
}

}  // namespace
}  // namespace perf
}  // namespace c4

int main(int argc, char** argv) { return c4::perf::main(argc, argv); }
