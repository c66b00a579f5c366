// MPI interop: a c4comm communicator over the processes of an MPI communicator. Rank 0 creates the
// unique id and MPI broadcasts it (with a flag, so a failure there cannot leave the others waiting
// in init); after init one MPI_Allreduce makes success collective: if any rank failed, every rank
// destroys what it built and returns an error.
#include <mpi.h>

#include <cstring>
#include <string>

#include "c4comm/c4comm.hpp"
#include "c4comm/mpi.h"
#include "c4comm/mpi.hpp"

namespace c4 {
namespace {

Status mpiError(const char* what, int err) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(err, text, &len);
  return Status(Code::kSystemError, std::string("commInitMPI: ") + what + " failed: " + text);
}

/// Checks that MPI can be used on `mpiComm`; fills rank and size.
Status mpiRankSize(MPI_Comm mpiComm, int* rank, int* size) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return Status(Code::kInvalidUsage,
                  "commInitMPI: MPI is not initialized (call MPI_Init first) or already finalized");
  if (mpiComm == MPI_COMM_NULL) return Status(Code::kInvalidArgument, "commInitMPI: mpiComm is MPI_COMM_NULL");
  int err = MPI_Comm_rank(mpiComm, rank);
  if (err != MPI_SUCCESS) return mpiError("MPI_Comm_rank", err);
  err = MPI_Comm_size(mpiComm, size);
  if (err != MPI_SUCCESS) return mpiError("MPI_Comm_size", err);
  return Status::ok();
}

/// What rank 0 broadcasts: whether it created an id, and the id.
struct IdMessage {
  int32_t ok;
  char id[sizeof(UniqueId::bytes)];
};

/// Rank 0 runs `makeId`; every rank receives the outcome. On rank 0 a failure keeps its own status.
template <typename MakeId>
Status shareId(MPI_Comm mpiComm, int rank, char* id, MakeId makeId) {
  IdMessage msg{};
  Status made;
  if (rank == 0) {
    made = makeId(msg.id);
    msg.ok = made.isOk() ? 1 : 0;
  }
  int err = MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, mpiComm);
  if (err != MPI_SUCCESS) return mpiError("MPI_Bcast of the unique id", err);
  if (!msg.ok) {
    return rank == 0
               ? made
               : Status(Code::kRemoteError, "commInitMPI: MPI rank 0 could not create the unique id (see its log)");
  }
  std::memcpy(id, msg.id, sizeof(msg.id));
  return Status::ok();
}

/// Makes init collective: returns ok only if every rank's `mine` is ok.
Status agree(MPI_Comm mpiComm, int rank, const Status& mine) {
  int ok = mine.isOk() ? 1 : 0, all = 0;
  int err = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mpiComm);
  if (err != MPI_SUCCESS) return mpiError("MPI_Allreduce of the init outcome", err);
  if (!mine.isOk()) return mine;
  if (!all) {
    return Status(Code::kRemoteError, "commInitMPI: communicator init failed on another MPI rank (see its log); rank " +
                                          std::to_string(rank) + " gave up its communicator too");
  }
  return Status::ok();
}

}  // namespace

Status commInitMPI(MPI_Comm mpiComm, Comm** comm, const Config& config) {
  if (comm == nullptr) return Status(Code::kInvalidArgument, "commInitMPI: comm is null");
  int rank = 0, size = 0;
  Status st = mpiRankSize(mpiComm, &rank, &size);
  if (!st.isOk()) return st;
  UniqueId id;
  st = shareId(mpiComm, rank, id.bytes, [](char* out) {
    UniqueId made;
    Status s = getUniqueId(&made);
    if (s.isOk()) std::memcpy(out, made.bytes, sizeof(made.bytes));
    return s;
  });
  if (!st.isOk()) return st;
  Comm* made = nullptr;
  st = commInitRank(&made, size, id, rank, config);
  Status all = agree(mpiComm, rank, st);
  if (!all.isOk()) {
    if (made != nullptr) (void)commAbort(made);
    return all;
  }
  *comm = made;
  return Status::ok();
}

}  // namespace c4

extern "C" ncclResult_t c4CommInitMPIConfig(ncclComm_t* comm, MPI_Comm mpiComm, ncclConfig_t* config) {
  if (comm == nullptr) return ncclInvalidArgument;
  int rank = 0, size = 0;
  c4::Status st = c4::mpiRankSize(mpiComm, &rank, &size);
  if (!st.isOk()) return static_cast<ncclResult_t>(st.code());
  ncclUniqueId id;
  static_assert(sizeof(id.internal) == sizeof(c4::UniqueId::bytes), "unique id size");
  st = c4::shareId(mpiComm, rank, id.internal, [](char* out) {
    ncclUniqueId made;
    ncclResult_t r = ncclGetUniqueId(&made);
    if (r != ncclSuccess) return c4::Status(static_cast<c4::Code>(r), ncclGetLastError(nullptr));
    std::memcpy(out, made.internal, sizeof(made.internal));
    return c4::Status::ok();
  });
  if (!st.isOk()) return static_cast<ncclResult_t>(st.code());
  ncclComm_t made = nullptr;
  ncclResult_t r =
      config ? ncclCommInitRankConfig(&made, size, id, rank, config) : ncclCommInitRank(&made, size, id, rank);
  c4::Status mine =
      r == ncclSuccess ? c4::Status::ok() : c4::Status(static_cast<c4::Code>(r), ncclGetLastError(nullptr));
  c4::Status all = c4::agree(mpiComm, rank, mine);
  if (!all.isOk()) {
    if (made != nullptr) (void)ncclCommAbort(made);
    return static_cast<ncclResult_t>(all.code());
  }
  *comm = made;
  return ncclSuccess;
}

extern "C" ncclResult_t c4CommInitMPI(ncclComm_t* comm, MPI_Comm mpiComm) {
  return c4CommInitMPIConfig(comm, mpiComm, nullptr);
}
