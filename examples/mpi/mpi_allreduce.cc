// An MPI program that hands its collectives to c4comm: the C++ API on MPI_COMM_WORLD, and the NCCL
// C API on a communicator split from it. Each result is checked against MPI's own.
//   mpirun -np 4 build/bin/c4-mpi-example [count]
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/mpi.h"
#include "c4comm/mpi.hpp"

namespace {

int fail(int rank, const char* what, const char* why) {
  std::fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, why);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

bool sameAsMpi(const std::vector<float>& got, const std::vector<float>& in, MPI_Comm comm) {
  std::vector<float> want(in.size());
  MPI_Allreduce(in.data(), want.data(), static_cast<int>(in.size()), MPI_FLOAT, MPI_SUM, comm);
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > 1e-3f * std::fabs(want[i]) + 1e-3f) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const size_t count = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : (1u << 20) + 3;
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (i % 97));

  // Bad input is an error, not a hang or a crash.
  c4::Comm* none = nullptr;
  if (c4::commInitMPI(MPI_COMM_NULL, &none).code() != c4::Code::kInvalidArgument || none != nullptr)
    return fail(rank, "c4::commInitMPI(MPI_COMM_NULL)", "was not rejected");

  // C++: a communicator over MPI_COMM_WORLD.
  c4::Comm* world = nullptr;
  c4::Status st = c4::commInitMPI(MPI_COMM_WORLD, &world);
  if (!st.isOk()) return fail(rank, "c4::commInitMPI", st.message().c_str());
  st = c4::allReduce(in.data(), out.data(), count, c4::DataType::kFloat32, c4::RedOp::kSum, world);
  if (!st.isOk()) return fail(rank, "c4::allReduce", st.message().c_str());
  const bool worldOk = sameAsMpi(out, in, MPI_COMM_WORLD);

  // C (NCCL API): a communicator over the even or the odd ranks.
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  ncclComm_t nc = nullptr;
  if (c4CommInitMPI(&nc, half) != ncclSuccess) return fail(rank, "c4CommInitMPI", ncclGetLastError(nullptr));
  if (ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, nc, nullptr) != ncclSuccess)
    return fail(rank, "ncclAllReduce", ncclGetLastError(nc));
  int halfRank = -1, halfSize = 0;
  ncclCommUserRank(nc, &halfRank);
  ncclCommCount(nc, &halfSize);
  const bool halfOk = sameAsMpi(out, in, half);

  int ok = worldOk && halfOk, allOk = 0;
  MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::printf("rank %d/%d: world allreduce %s; half %d rank %d/%d allreduce %s\n", rank, size,
              worldOk ? "matches MPI" : "WRONG", rank % 2, halfRank, halfSize, halfOk ? "matches MPI" : "WRONG");
  if (rank == 0) std::printf("%s\n", allOk ? "c4comm over MPI: OK" : "c4comm over MPI: MISMATCH");
  ncclCommDestroy(nc);
  MPI_Comm_free(&half);
  (void)c4::commDestroy(world);
  MPI_Finalize();
  return allOk ? 0 : 1;
}
