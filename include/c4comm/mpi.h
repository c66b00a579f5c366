/* C MPI interop for the NCCL-compatible API: build an ncclComm_t over an MPI communicator.
 * Link with -lc4comm_mpi (and libnccl.so.2 from c4comm, or libc4comm). */
#ifndef C4COMM_MPI_H_
#define C4COMM_MPI_H_

#include <mpi.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Creates a communicator over the processes of `mpiComm` (same rank numbers). Collective over
 *  `mpiComm`; MPI must be initialized. Either every process gets a communicator or every process
 *  gets an error: the rank where init failed returns that error (ncclGetLastError carries its
 *  reason, also logged), the others ncclRemoteError. `*comm` is set only on success. */
ncclResult_t c4CommInitMPI(ncclComm_t* comm, MPI_Comm mpiComm);
/** As c4CommInitMPI, with an ncclConfig_t (NCCL_CONFIG_INITIALIZER semantics; may be NULL). */
ncclResult_t c4CommInitMPIConfig(ncclComm_t* comm, MPI_Comm mpiComm, ncclConfig_t* config);

#ifdef __cplusplus
}
#endif

#endif /* C4COMM_MPI_H_ */
