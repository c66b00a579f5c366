/*
 * c4comm: NCCL-compatible C API.
 *
 * Written for c4comm; binary-compatible with NCCL 2.32.3 (same type layouts, enum values, macros and
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
#include <stdint.h>

/* Version of the NCCL API this library is compatible with. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were coded X*1000+Y*100+Z, later ones X*10000+Y*100+Z. */
#define NCCL_VERSION_CODE 23203
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

/* CUDA stream and event handles. Same types as the CUDA runtime's, declared only when the runtime
 * headers have not declared them (driver_types.h guards itself with __DRIVER_TYPES_H__). Repeating an
 * identical typedef is valid C11/C++, so including cuda_runtime.h after this header also works. */
#if !defined(__DRIVER_TYPES_H__) && !defined(__CUDA_RUNTIME_H__) && !defined(C4_NCCL_CUDA_STREAM_T_)
#define C4_NCCL_CUDA_STREAM_T_
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
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
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* ---- configuration ------------------------------------------------------------------------- */

/* A config field left at one of these takes the library default. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
/* ncclCommSplit color of a rank that joins no new communicator. */
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f
/* The magic of every versioned struct (ncclConfig_t, ncclCollConfig_t, ncclEncryptionConfig_t). */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommWindowRegister flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04    /* register for GPU-initiated networking only */
#define NCCL_WIN_CFT_COUNTED 0x08 /* register for counted completion only */
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

/* ncclConfig_t.hostCftMode values. */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

/* ncclConfig_t.nvlsHostMode: NVLS components to disable (flags may be combined). */
typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* Per-communicator options (layout of NCCL 2.31, "v23100"; earlier layouts are prefixes of it).
 * Always start from NCCL_CONFIG_INITIALIZER: size, magic and version identify the layout the caller
 * was built with. c4comm uses blocking, splitShare and commName; the GPU tuning fields are validated
 * and ignored. */
typedef struct ncclConfig_v23100 {
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
  /* since 2.29 */
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;  /* ncclHostCftMode_t */
  int nvlsHostMode; /* ncclNvlsHostMode_t */
} ncclConfig_t;

/* clang-format off */
#define NCCL_CONFIG_INITIALIZER {                                 \
  sizeof(ncclConfig_t), /* size */                                \
  NCCL_API_MAGIC, /* magic */                                     \
  NCCL_VERSION_CODE, /* version */                                \
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
  NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                \
  NCCL_CONFIG_UNDEF_INT, /* graphUsageMode */                     \
  NCCL_CONFIG_UNDEF_INT, /* numRmaCtx */                          \
  NCCL_CONFIG_UNDEF_INT, /* maxP2pPeers */                        \
  NCCL_CONFIG_UNDEF_INT, /* graphStreamOrdering */                \
  NCCL_CONFIG_UNDEF_INT, /* launchOrderImplicit */                \
  NCCL_CONFIG_UNDEF_INT, /* numRmaSig */                          \
  NCCL_CONFIG_UNDEF_INT, /* rmaEagerInit */                       \
  NCCL_CONFIG_UNDEF_INT, /* hostCftMode */                        \
  NCCL_CONFIG_UNDEF_INT, /* nvlsHostMode */                       \
}

/* A vendor-specific option of one collective call (ncclCollConfig_t.ext): a NULL-terminated list.
 * c4comm reads none yet and ignores every vendor's (as NVIDIA's library does). */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

/* Options of one collective call (nccl*Config; layout "v23200"). Start from
 * NCCL_COLLCONFIG_INITIALIZER and set it alike on every rank. */
typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection; /* algorithm(s) this call may use; NULL or "": automatic */
  int forceAlgSelection;    /* 1 (default): a selection that cannot be met is an error */
  int CTAPolicy;
  uint64_t userProfilerTag; /* carried into the trace with the call's events */
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                             \
  sizeof(ncclCollConfig_t), /* size */                            \
  NCCL_API_MAGIC, /* magic */                                     \
  NCCL_VERSION_CODE, /* version */                                \
  NCCL_CONFIG_UNDEF_PTR, /* ext */                                \
  NCCL_CONFIG_UNDEF_INT, /* minCTAs */                            \
  NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                            \
  NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                           \
  NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                     \
  NCCL_CONFIG_UNDEF_PTR, /* algSelection */                       \
  1, /* forceAlgSelection */                                      \
  NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                          \
  0, /* userProfilerTag */                                        \
  NCCL_CONFIG_UNDEF_PTR, /* launchCompletionEvent */              \
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
    NCCL_VERSION_CODE,                                /* version */  \
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

/* An id for growing comm (ncclCommGrow), made on one rank of comm. One id at a time per
 * communicator; an id serves one grow. */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);

/* Makes an nRanks communicator of comm's ranks (same ranks) and new ones. Ranks of comm pass
 * rank = -1 and uniqueId = NULL, except the one that made the id, which passes it; a new rank passes
 * comm = NULL, the id and its rank (comm's size or above). config NULL: comm's (new ranks: default). */
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
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

/* ncclCommSuspend flags. */
#define NCCL_SUSPEND_MEM 0x01 /* release what can be reallocated at resume */

/* Suspends comm (no calls on it until ncclCommResume) and, with NCCL_SUSPEND_MEM, frees what it can
 * reallocate. */
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);

ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* ncclCommMemStats statistics. */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* GPU memory that suspending frees (bytes) */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended, else 0 */
  ncclStatGpuMemPersist = 2,   /* GPU memory that suspending keeps (bytes) */
  ncclStatGpuMemTotal = 3      /* all GPU memory the communicator holds (bytes) */
} ncclCommMemStat_t;

ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);

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

/* The buffer a window of this rank was registered with. */
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

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

/* ---- collectives with per-call options (config NULL: as the plain call) ------------------------- */

ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                              const ncclCollConfig_t* config);
ncclResult_t pncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                               const ncclCollConfig_t* config);

ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                     const ncclCollConfig_t* config);
ncclResult_t pncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t* config);

ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

/* ---- point to point (the peer posts the matching call with the same count and type) ------------ */

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

/* ---- one-sided: writes into a peer's window (ncclCommWindowRegister) and signals ------------------ */

/* Writes count elements of localbuff at byte peerWinOffset of peer's window peerWin (the handle
 * peer's ncclCommWindowRegister returned, as this rank got it from its own registration of the same
 * collective call), then adds one to peer's signal (sigIdx, ctx). flags must be 0. */
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
                           size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                            ncclComm_t comm, cudaStream_t stream);

/* Adds one to peer's signal (sigIdx, ctx) without data. */
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);

/* Waits for opCnt signals from peer on (sigIdx, ctx). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* Returns when every descriptor's signals arrived (and consumes them); the data of the puts they
 * signal is then in this rank's windows. */
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream);

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

/* ---- TCP encryption -------------------------------------------------------------------------- */

typedef enum {
  NCCL_ENCRYPTION_MODE_NONE = 0, /* plaintext */
  NCCL_ENCRYPTION_MODE_PSK = 1   /* TLS with a pre-shared key */
} ncclEncryptionMode_t;

/* Layout "v23200"; start from NCCL_ENCRYPTION_CONFIG_INITIALIZER. */
typedef struct ncclEncryptionConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode; /* ncclEncryptionMode_t */
  const char* psk;
} ncclEncryptionConfig_t;

/* clang-format off */
#define NCCL_ENCRYPTION_CONFIG_INITIALIZER {                      \
  sizeof(ncclEncryptionConfig_t), /* size */                      \
  NCCL_API_MAGIC, /* magic */                                     \
  NCCL_VERSION_CODE, /* version */                                \
  NCCL_ENCRYPTION_MODE_NONE, /* mode */                           \
  NCCL_CONFIG_UNDEF_PTR, /* psk */                                \
}
/* clang-format on */

/* Sets how later communicators encrypt their TCP sockets. */
ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t* config);
ncclResult_t pncclSetEncryption(const ncclEncryptionConfig_t* config);

/* ---- parameters (the settings of docs/params.md, by C4_ or NCCL_ name) ------------------------- */

typedef struct ncclParamHandle* ncclParamHandle_t;

/* A handle for the parameter named key (valid for the life of the library). */
ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key);
ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key);

/* The value in effect as an integer of the given width (ncclInvalidArgument if it does not fit, or
 * for a text parameter). */
ncclResult_t ncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t pncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t ncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t pncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t ncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t pncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t ncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t pncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t ncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t pncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t ncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t pncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t ncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t pncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t ncclParamGetU64(ncclParamHandle_t h, uint64_t* out);
ncclResult_t pncclParamGetU64(ncclParamHandle_t h, uint64_t* out);

/* The value in effect as text; valid until this thread's next ncclParamGetStr. */
ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out);
ncclResult_t pncclParamGetStr(ncclParamHandle_t h, const char** out);

/* The value as bytes: an integer's int64_t, a text's characters (no terminator). *len gets the
 * value's size; ncclInvalidArgument if it exceeds maxLen (nothing is copied then). */
ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);
ncclResult_t pncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);

/* The value of key as text (valueLen: its length); valid until this thread's next call. */
ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen);
ncclResult_t pncclParamGetParameter(const char* key, const char** value, int* valueLen);

/* Every key ncclParamBind accepts; the table is valid until this thread's next call. */
ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen);
ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen);

/* Logs every parameter and its value. */
void ncclParamDumpAll(void);
void pncclParamDumpAll(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
