/*
 * c4comm: NCCL-compatible C API.
 *
 * Written for c4comm; binary-compatible with NCCL 2.28.9 (same type layouts, enum values, macros and
 * function signatures), so a program built against this header or NVIDIA's runs on libnccl.so.2 from
 * either project. Every ncclXxx function has a pncclXxx twin (the profiling interface): ncclXxx is a
 * weak alias of pncclXxx, so a profiler can interpose ncclXxx and forward to pncclXxx.
 *
 * Unlike NVIDIA's header this one does not need the CUDA headers: cudaStream_t is declared here as
 * the same opaque pointer type unless cuda_runtime.h (driver_types.h) was included first. Define
 * C4_NCCL_INCLUDE_CUDA before including this header to pull in <cuda_runtime.h> as NVIDIA's does.
 * c4comm accepts host memory everywhere; a null stream is fine for host buffers.
 *
 * Coverage (what is implemented, partial or not yet): docs/api-coverage.md.
 */
#ifndef NCCL_H_
#define NCCL_H_

#ifdef C4_NCCL_INCLUDE_CUDA
#include <cuda_runtime.h>
#endif

#include <limits.h>
#include <stddef.h>

/* Version of the NCCL API this library is compatible with. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were coded X*1000+Y*100+Z, later ones X*10000+Y*100+Z. */
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

/* CUDA stream handle. Same type as the CUDA runtime's, declared only when the runtime headers have
 * not declared it (driver_types.h guards itself with __DRIVER_TYPES_H__). Repeating an identical
 * typedef is valid C11/C++, so including cuda_runtime.h after this header also works. */
#if !defined(__DRIVER_TYPES_H__) && !defined(__CUDA_RUNTIME_H__) && !defined(C4_NCCL_CUDA_STREAM_T_)
#define C4_NCCL_CUDA_STREAM_T_
typedef struct CUstream_st* cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- handles ------------------------------------------------------------------------------- */

/* A communicator (one rank of it). */
typedef struct ncclComm* ncclComm_t;
/* A registered memory window. */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* Identifies a communicator during init: created once by ncclGetUniqueId, shared with all ranks. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ---- result codes -------------------------------------------------------------------------- */

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* ---- configuration ------------------------------------------------------------------------- */

/* A config field left at one of these takes the library default. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
/* ncclCommSplit color of a rank that joins no new communicator. */
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy values. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags: shrink the parent as is, or abort its pending work first. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (must be NCCL_REVOKE_DEFAULT). */
#define NCCL_REVOKE_DEFAULT 0x00

/* Per-communicator options (layout of NCCL 2.28, "v22800"). Always start from
 * NCCL_CONFIG_INITIALIZER: size, magic and version identify the layout the caller was built with.
 * c4comm uses blocking, splitShare and commName; the GPU tuning fields are validated and ignored. */
typedef struct ncclConfig_v22800 {
  size_t size;          /* sizeof(ncclConfig_t) as the caller saw it */
  unsigned int magic;   /* 0xcafebeef */
  unsigned int version; /* NCCL_VERSION code of the caller's header */
  int blocking;         /* 1 (default): calls block; 0: calls may return ncclInProgress */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare; /* 1: ncclCommSplit children share the parent's resources */
  int trafficClass;
  const char* commName; /* shown in logs and traces */
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

/* clang-format off */
#define NCCL_CONFIG_INITIALIZER {                                 \
  sizeof(ncclConfig_t), /* size */                                \
  0xcafebeef, /* magic */                                         \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */ \
  NCCL_CONFIG_UNDEF_INT, /* blocking */                           \
  NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                     \
  NCCL_CONFIG_UNDEF_INT, /* minCTAs */                            \
  NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                            \
  NCCL_CONFIG_UNDEF_PTR, /* netName */                            \
  NCCL_CONFIG_UNDEF_INT, /* splitShare */                         \
  NCCL_CONFIG_UNDEF_INT, /* trafficClass */                       \
  NCCL_CONFIG_UNDEF_PTR, /* commName */                           \
  NCCL_CONFIG_UNDEF_INT, /* collnetEnable */                      \
  NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                          \
  NCCL_CONFIG_UNDEF_INT, /* shrinkShare */                        \
  NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                           \
  NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */                \
  NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                 \
}

/* Result of ncclGroupSimulateEnd (layout "v22200"). Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic; /* 0x74685283 */
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                    \
  {                                                                  \
    sizeof(ncclSimInfo_t),                            /* size */     \
    0x74685283,                                       /* magic */    \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */  \
    NCCL_UNDEF_FLOAT                                  /* estimated */ \
  }
/* clang-format on */

/* ---- reduction operators, data types -------------------------------------------------------- */

/* The dummy enum only measures how wide an enum is, so that ncclMaxRedOp is the largest value that
 * fits without changing sizeof(ncclRedOp_t). */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Number of built-in operators; user operators (ncclRedOpCreatePreMulSum) start here. */
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives: device memory read while the collective runs,
 * or host memory read before the create call returns. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* ---- memory -------------------------------------------------------------------------------- */

/* Allocates memory suited to registration; may round size up. c4comm host-only builds return
 * page-aligned host memory. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
/* Frees memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ---- version, ids, init -------------------------------------------------------------------- */

/* Stores the library's NCCL_VERSION code in *version. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Creates a new unique id; call once, then hand the id to every rank before they init. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Creates rank `rank` of an nranks communicator with options (config may be NULL). Blocks until all
 * ranks joined (unless config->blocking == 0). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);

/* Creates rank `rank` of an nranks communicator with default options. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* Creates all ndev ranks of one communicator in this process; comm must hold ndev handles. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* Flushes outstanding work; afterwards the communicator is only good for ncclCommDestroy. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Frees the communicator's local resources. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Aborts outstanding work and frees the communicator. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops in-flight work so that the communicator can be destroyed, split or shrunk. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Splits comm by color (NCCL_SPLIT_NOCOLOR: *newcomm = NULL), ranks ordered by key. config NULL:
 * inherit the parent's. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);

/* Creates a communicator without the ranks in excludeRanksList (flags: NCCL_SHRINK_*). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                             ncclConfig_t* config, int shrinkFlags);

/* Like ncclCommInitRankConfig with nId unique ids (the same list, in the same order, on every rank). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                       ncclConfig_t* config);

/* ---- errors and queries -------------------------------------------------------------------- */

/* A fixed text for each result code. Never NULL. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The reason for the last failure in this thread ("" if none). Valid until the next failure. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Re-reads the logging environment variables (NCCL_DEBUG, ...). */
__attribute__((deprecated("ncclResetDebugInit is outside the supported NCCL API"))) void ncclResetDebugInit(void);
__attribute__((deprecated("pncclResetDebugInit is outside the supported NCCL API"))) void pncclResetDebugInit(void);

/* Stores the communicator's first asynchronous error (ncclSuccess if none) in *asyncError. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/* Number of ranks. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/* CUDA device of the communicator (-1 for host-only communicators). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

/* This rank. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ---- buffer registration ------------------------------------------------------------------- */

/* Registers a buffer for zero-copy use; *handle is passed to ncclCommDeregister. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* Registers a memory window (collective; flags NCCL_WIN_*). */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- user reduction operators -------------------------------------------------------------- */

/* Creates an operator that multiplies each rank's input by *scalar (of `datatype`) and sums. Only
 * for collectives on comm with that datatype. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* Destroys an operator made by ncclRedOpCreatePreMulSum on the same comm. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- collectives (counts in elements; every rank of comm calls each one) ----------------------- */

/* Reduces count elements of every rank's sendbuff into root's recvbuff (unused elsewhere). */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream);

/* In-place broadcast of buff from root (deprecated form of ncclBroadcast). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);

/* Copies count elements of root's sendbuff into every rank's recvbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream);

/* Reduces count elements across ranks; every rank gets the result. In place if sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t stream);

/* sendbuff holds nranks*recvcount elements; rank i receives block i of the reduction. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* recvbuff (nranks*sendcount elements) receives rank i's sendbuff at offset i*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);

/* Block j of sendbuff goes to rank j; block i of recvbuff comes from rank i (count elements each). */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream);

/* Root's recvbuff receives rank i's count elements at offset i*count. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);

/* Rank i receives block i (count elements) of root's sendbuff. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream);

/* ---- point to point (the peer posts the matching call with the same count and type) ------------ */

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

/* ---- groups -------------------------------------------------------------------------------- */

/* Calls between ncclGroupStart and ncclGroupEnd run together at ncclGroupEnd (needed for sends and
 * receives that depend on each other, and for driving several communicators from one thread). */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Estimates the group's run time instead of running it. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
