// C++ MPI interop: build a c4comm communicator over the processes of an MPI communicator.
// Link with c4comm::c4comm_mpi (libc4comm_mpi.so), built when MPI is found.
#pragma once

#include <mpi.h>

#include "c4comm/c4comm.hpp"
#include "c4comm/export.hpp"

namespace c4 {

/// Creates a communicator whose ranks are the processes of `mpiComm` with the same rank numbers.
/// Collective over `mpiComm` (every process must call it; MPI must be initialized). Rank 0 creates
/// the unique id and broadcasts it with MPI; afterwards MPI is used once more to agree on success,
/// so either every process gets a communicator or every process gets an error (the failed ranks'
/// reasons are logged where they occurred). `*comm` is set only on success.
C4_API Status commInitMPI(MPI_Comm mpiComm, Comm** comm, const Config& config = {});

}  // namespace c4
