// c4-peer-mpi: the c4-perf sweep through MPI collectives, for a line-by-line
// comparison.
//
//   c4-peer-mpi -np 4 -C allreduce -b 1M -e 64M -f 2    # re-executes itself
//   under mpirun mpirun -np 4 c4-peer-mpi -C allreduce ...            # or run
//   it under mpirun directly
//
// Mapping (nccl-tests semantics on top of MPI):
//   allreduce MPI_Allreduce, allgather MPI_Allgather, broadcast MPI_Bcast (out
//   of place: the root copies send to recv first), reducescatter
//   MPI_Reduce_scatter_block (in place: MPI_IN_PLACE, then the block moves to
//   the rank's offset as NCCL places it), reduce MPI_Reduce, alltoall
//   MPI_Alltoall, gather MPI_Gather, scatter MPI_Scatter, sendrecv MPI_Sendrecv
//   (in place: MPI_Sendrecv_replace). avg is MPI_SUM followed by a local
//   division. half, bfloat16 and fp8 have no MPI type: they move as 16/8-bit
//   integers and reduce with user-defined MPI_Ops.
// C bindings only (the deprecated C++ bindings add nothing here and warn).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/perf/perf_data.hpp"
#include "bench/perf/perf_driver.hpp"

namespace c4 {
namespace perf {
namespace {

constexpr const char* kProgram = "c4-peer-mpi";

bool nativeMpiType(DataType dt) {
  return !(dt == DataType::kFloat16 || dt == DataType::kBfloat16 || dt == DataType::kFloat8e4m3 ||
           dt == DataType::kFloat8e5m2);
}

MPI_Datatype mpiType(DataType dt) {
  switch (dt) {
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUint8:
      return MPI_UINT8_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kUint32:
      return MPI_UINT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kUint64:
      return MPI_UINT64_T;
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return MPI_UINT16_T;
    default:
      return MPI_UINT8_T;
  }
}

// User reductions for the types MPI lacks, one function per (type, op).
template <int kDt, int kOp>
void userReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduceInto(static_cast<DataType>(kDt), static_cast<RedOp>(kOp), inout, in, static_cast<size_t>(*len));
}

template <int kDt>
void createUserOps(MPI_Op ops[kNumBuiltinOps]) {
  MPI_Op_create(&userReduce<kDt, 0>, 1, &ops[0]);
  MPI_Op_create(&userReduce<kDt, 1>, 1, &ops[1]);
  MPI_Op_create(&userReduce<kDt, 2>, 1, &ops[2]);
  MPI_Op_create(&userReduce<kDt, 3>, 1, &ops[3]);
  ops[4] = ops[0];  // avg: sum, then divide
}

std::string mpiError(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(what) + ": " + std::string(msg, len);
}

class MpiBackend : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
    // Errors come back as codes instead of aborting, so they can be reported
    // like c4's.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    for (int d = 0; d < kNumDataTypes; ++d)
      for (int o = 0; o < kNumBuiltinOps; ++o) userOps_[d][o] = MPI_OP_NULL;
    createUserOps<static_cast<int>(DataType::kFloat16)>(userOps_[static_cast<int>(DataType::kFloat16)]);
    createUserOps<static_cast<int>(DataType::kBfloat16)>(userOps_[static_cast<int>(DataType::kBfloat16)]);
    createUserOps<static_cast<int>(DataType::kFloat8e4m3)>(userOps_[static_cast<int>(DataType::kFloat8e4m3)]);
    createUserOps<static_cast<int>(DataType::kFloat8e5m2)>(userOps_[static_cast<int>(DataType::kFloat8e5m2)]);
  }
  ~MpiBackend() override {
    for (auto& row : userOps_)
      for (int o = 0; o < 4; ++o)
        if (row[o] != MPI_OP_NULL) MPI_Op_free(&row[o]);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  std::string unsupported(Coll coll, DataType dt, RedOp op) const override { return ""; }

  void* allocRegistered(size_t bytes) override {
    void* p = nullptr;
    if (bytes > static_cast<size_t>(INT64_MAX)) return nullptr;
    return MPI_Alloc_mem(static_cast<MPI_Aint>(bytes), MPI_INFO_NULL, &p) == MPI_SUCCESS ? p : nullptr;
  }
  void freeRegistered(void* p) override { MPI_Free_mem(p); }
  std::string registeredName() const override { return "MPI_Alloc_mem"; }

  Status run(Coll coll, const void* send, void* recv, size_t count, DataType dt, RedOp op, int root) override {
    if (count > static_cast<size_t>(INT32_MAX) / static_cast<size_t>(nranks_))
      return Status(Code::kInvalidArgument, "count exceeds MPI's int counts");
    const int n = static_cast<int>(count);
    const MPI_Datatype t = mpiType(dt);
    const MPI_Op mop = mpiOp(dt, op);
    const size_t bytes = count * dataTypeSize(dt);
    const bool inPlace = send == recv;
    void* sb = const_cast<void*>(send);
    char* rb = static_cast<char*>(recv);
    int rc = MPI_SUCCESS;
    switch (coll) {
      case Coll::kAllReduce:
        rc = MPI_Allreduce(inPlace ? MPI_IN_PLACE : sb, rb, n, t, mop, MPI_COMM_WORLD);
        if (rc == MPI_SUCCESS && op == RedOp::kAvg) divideInPlace(dt, rb, count, nranks_);
        break;
      case Coll::kAllGather:
        // In place, this rank's block already sits at its offset in recv.
        rc = MPI_Allgather(sb == rb + rank_ * bytes ? MPI_IN_PLACE : sb, n, t, rb, n, t, MPI_COMM_WORLD);
        break;
      case Coll::kBroadcast:
        if (rank_ == root && !inPlace) memcpy(rb, send, bytes);
        rc = MPI_Bcast(rb, n, t, root, MPI_COMM_WORLD);
        break;
      case Coll::kReduceScatter: {
        char* mine = static_cast<char*>(sb) + rank_ * bytes;
        if (mine == rb) {
          // NCCL leaves the result at the rank's offset of the full buffer; MPI
          // at its start.
          rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, sb, n, t, mop, MPI_COMM_WORLD);
          if (rc == MPI_SUCCESS && rank_ != 0) memmove(mine, sb, bytes);
        } else {
          rc = MPI_Reduce_scatter_block(sb, rb, n, t, mop, MPI_COMM_WORLD);
        }
        if (rc == MPI_SUCCESS && op == RedOp::kAvg) divideInPlace(dt, rb, count, nranks_);
        break;
      }
      case Coll::kReduce:
        rc = MPI_Reduce(inPlace && rank_ == root ? MPI_IN_PLACE : sb, rb, n, t, mop, root, MPI_COMM_WORLD);
        if (rc == MPI_SUCCESS && op == RedOp::kAvg && rank_ == root) divideInPlace(dt, rb, count, nranks_);
        break;
      case Coll::kAlltoAll:
        rc = MPI_Alltoall(inPlace ? MPI_IN_PLACE : sb, n, t, rb, n, t, MPI_COMM_WORLD);
        break;
      case Coll::kGather:
        rc = MPI_Gather(rank_ == root && sb == rb + rank_ * bytes ? MPI_IN_PLACE : sb, n, t, rb, n, t, root,
                        MPI_COMM_WORLD);
        break;
      case Coll::kScatter:
        rc = MPI_Scatter(sb, n, t, rank_ == root && rb == static_cast<char*>(sb) + rank_ * bytes ? MPI_IN_PLACE : rb, n,
                         t, root, MPI_COMM_WORLD);
        break;
      case Coll::kSend: {
        const int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
        if (inPlace)
          rc = MPI_Sendrecv_replace(rb, n, t, next, 0, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
          rc = MPI_Sendrecv(sb, n, t, next, 0, rb, n, t, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
      }
      default:
        return Status(Code::kInvalidArgument, "unsupported collective");
    }
    if (rc != MPI_SUCCESS) return Status(Code::kRemoteError, mpiError(rc, collFlagName(coll)));
    return Status();
  }

  Status allReduceDouble(double* v, ReduceMode mode) override {
    MPI_Op op = mode == ReduceMode::kMin ? MPI_MIN : mode == ReduceMode::kMax ? MPI_MAX : MPI_SUM;
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status() : Status(Code::kRemoteError, mpiError(rc, "MPI_Allreduce(double)"));
  }

  Status allGatherBytes(const void* mine, void* all, size_t bytes) override {
    int rc =
        MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status() : Status(Code::kRemoteError, mpiError(rc, "MPI_Allgather(bytes)"));
  }

 private:
  MPI_Op mpiOp(DataType dt, RedOp op) const {
    if (!nativeMpiType(dt)) return userOps_[static_cast<int>(dt)][static_cast<int>(op)];
    switch (op) {
      case RedOp::kProd:
        return MPI_PROD;
      case RedOp::kMax:
        return MPI_MAX;
      case RedOp::kMin:
        return MPI_MIN;
      default:
        return MPI_SUM;
    }
  }

  int rank_ = 0;
  int nranks_ = 1;
  MPI_Op userOps_[kNumDataTypes][kNumBuiltinOps];
};

// -np N outside a launcher: run again as `mpirun -np N <this binary> <the other
// flags>`.
int reexecUnderMpirun(int argc, char** argv, int np) {
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(np), "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  // Open MPI runs as shipped (vader with its CMA single copy), so the comparison is against its
  // best shared-memory path. Where the machine forbids CMA, C4_MPI_NO_CMA=1 makes vader copy
  // through shared memory instead. C4_MPIRUN_ARGS adds more (e.g. "--mca btl self,tcp").
  if (getenv("C4_MPI_NO_CMA")) {
    args.insert(args.end(), {"--mca", "btl_vader_single_copy_mechanism", "none"});
  }
  if (const char* extra = getenv("C4_MPIRUN_ARGS")) {
    std::string e = extra, w;
    for (size_t i = 0; i <= e.size(); ++i) {
      if (i == e.size() || e[i] == ' ') {
        if (!w.empty()) args.push_back(w);
        w.clear();
      } else {
        w += e[i];
      }
    }
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(len > 0 ? std::string(self, static_cast<size_t>(len)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-np" || a == "--np") {
      ++i;
      continue;
    }
    if (a.rfind("--np=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(&a[0]);
  cargs.push_back(nullptr);
  fflush(stdout);
  execvp("mpirun", cargs.data());
  fprintf(stderr, "%s: cannot run mpirun: %s\n", kProgram, strerror(errno));
  return 1;
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
  const bool launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
  if (opts.np > 0 && !launched) return reexecUnderMpirun(argc, argv, opts.np);

  double t0 = nowSeconds();
  MPI_Init(&argc, &argv);
  double initMs = (nowSeconds() - t0) * 1e3;
  int rc;
  {
    MpiBackend backend;
    RunInfo info;
    info.program = kProgram;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string l(lib, static_cast<size_t>(len));
    info.library = l.substr(0, l.find_first_of(",\n"));
    if (!backend.allReduceDouble(&initMs, ReduceMode::kMax).isOk()) initMs = -1;
    info.initMs = initMs;
    rc = runBenchmark(opts, info, backend, stdout);
  }
  if (rc == 1) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return rc;
}

}  // namespace
}  // namespace perf
}  // namespace c4

int main(int argc, char** argv) { return c4::perf::main(argc, argv); }
