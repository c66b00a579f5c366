// libnccl.so.2: the NCCL 2.32 C API implemented over the c4 C++ API (include/c4comm/c4comm.hpp).
//
// Every entry point is defined as pncclXxx (the profiling interface) and exported a second time as
// ncclXxx, a weak alias, exactly as NCCL does: a profiler may define ncclXxx and forward to pncclXxx.
// Only nccl*/pnccl* symbols leave the library (nccl.map).
//
// Conventions:
//  * ncclComm_t is a c4::Comm* (reinterpret_cast both ways); ncclDataType_t, ncclRedOp_t,
//    ncclScalarResidence_t and ncclResult_t have the same values as their c4 counterparts
//    (static_asserts below), so they are cast, not translated.
//  * Arguments are checked here before the core sees them: a null handle or buffer, an invalid type,
//    operator, root or peer returns ncclInvalidArgument with the reason logged (C4_WARN) and kept
//    for ncclGetLastError. Failures reported by the core arrive as a c4::Status whose code maps 1:1.
//  * Functions the core cannot back yet log why and return ncclInvalidUsage (docs/api-coverage.md).
#include <nccl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "c4comm/c4comm.hpp"

// ---- the C ABI and the C++ API agree on every value ------------------------------------------
static_assert(NCCL_VERSION_CODE == 23203, "this binding implements the NCCL 2.32.3 ABI");
static_assert(sizeof(ncclUniqueId) == sizeof(c4::UniqueId), "unique id sizes differ");
static_assert(sizeof(ncclConfig_t) == 120 && offsetof(ncclConfig_t, nvlinkCentricSched) == 76 &&
                  offsetof(ncclConfig_t, nvlsHostMode) == 112,
              "ncclConfig_t must keep the v23100 layout");
static_assert(sizeof(ncclCollConfig_t) == 72 && offsetof(ncclCollConfig_t, launchCompletionEvent) == 64,
              "ncclCollConfig_t must keep the v23200 layout");
static_assert(static_cast<int>(ncclSuccess) == static_cast<int>(c4::Code::kSuccess), "result codes differ");
static_assert(static_cast<int>(ncclUnhandledCudaError) == static_cast<int>(c4::Code::kUnhandledCudaError), "");
static_assert(static_cast<int>(ncclSystemError) == static_cast<int>(c4::Code::kSystemError), "");
static_assert(static_cast<int>(ncclInternalError) == static_cast<int>(c4::Code::kInternalError), "");
static_assert(static_cast<int>(ncclInvalidArgument) == static_cast<int>(c4::Code::kInvalidArgument), "");
static_assert(static_cast<int>(ncclInvalidUsage) == static_cast<int>(c4::Code::kInvalidUsage), "");
static_assert(static_cast<int>(ncclRemoteError) == static_cast<int>(c4::Code::kRemoteError), "");
static_assert(static_cast<int>(ncclInProgress) == static_cast<int>(c4::Code::kInProgress), "");
static_assert(static_cast<int>(ncclTimeout) == static_cast<int>(c4::Code::kTimeout), "");
static_assert(static_cast<int>(ncclInt8) == static_cast<int>(c4::DataType::kInt8), "data types differ");
static_assert(static_cast<int>(ncclUint8) == static_cast<int>(c4::DataType::kUint8), "");
static_assert(static_cast<int>(ncclInt32) == static_cast<int>(c4::DataType::kInt32), "");
static_assert(static_cast<int>(ncclUint32) == static_cast<int>(c4::DataType::kUint32), "");
static_assert(static_cast<int>(ncclInt64) == static_cast<int>(c4::DataType::kInt64), "");
static_assert(static_cast<int>(ncclUint64) == static_cast<int>(c4::DataType::kUint64), "");
static_assert(static_cast<int>(ncclFloat16) == static_cast<int>(c4::DataType::kFloat16), "");
static_assert(static_cast<int>(ncclFloat32) == static_cast<int>(c4::DataType::kFloat32), "");
static_assert(static_cast<int>(ncclFloat64) == static_cast<int>(c4::DataType::kFloat64), "");
static_assert(static_cast<int>(ncclBfloat16) == static_cast<int>(c4::DataType::kBfloat16), "");
static_assert(static_cast<int>(ncclFloat8e4m3) == static_cast<int>(c4::DataType::kFloat8e4m3), "");
static_assert(static_cast<int>(ncclFloat8e5m2) == static_cast<int>(c4::DataType::kFloat8e5m2), "");
static_assert(static_cast<int>(ncclNumTypes) == c4::kNumDataTypes, "");
static_assert(static_cast<int>(ncclSum) == static_cast<int>(c4::RedOp::kSum), "reduction operators differ");
static_assert(static_cast<int>(ncclProd) == static_cast<int>(c4::RedOp::kProd), "");
static_assert(static_cast<int>(ncclMax) == static_cast<int>(c4::RedOp::kMax), "");
static_assert(static_cast<int>(ncclMin) == static_cast<int>(c4::RedOp::kMin), "");
static_assert(static_cast<int>(ncclAvg) == static_cast<int>(c4::RedOp::kAvg), "");
static_assert(static_cast<int>(ncclNumOps) == c4::kNumBuiltinOps, "");
static_assert(static_cast<int>(ncclScalarDevice) == static_cast<int>(c4::ScalarResidence::kDevice), "");
static_assert(static_cast<int>(ncclScalarHostImmediate) == static_cast<int>(c4::ScalarResidence::kHostImmediate), "");

namespace {

constexpr unsigned int kConfigMagic = NCCL_API_MAGIC;
constexpr unsigned int kSimInfoMagic = 0x74685283;
// ncclConfig_t first appeared in NCCL 2.14; a smaller version code is not a config at all.
constexpr unsigned int kFirstConfigVersion = 21400;
// ncclCollConfig_t first appeared in NCCL 2.32.
constexpr unsigned int kFirstCollConfigVersion = 23200;

// ---- last error -------------------------------------------------------------------------------
// This layer finds some errors itself (null arguments, bad config, missing features); the core
// reports the others through Status and c4::lastError. ncclGetLastError shows the newer of the two.
// A fixed buffer: recording an error must not allocate (the error may be that memory ran out).
thread_local char tlsLastError[1024];
thread_local bool tlsLastErrorIsOurs = false;

void setLastError(const char* text, bool ours) {
  snprintf(tlsLastError, sizeof(tlsLastError), "%s", text);
  tlsLastErrorIsOurs = ours;
}

/// Logs and records a failure found in this layer; returns `code`.
ncclResult_t fail(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t code, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  c4::log(c4::LogKind::kWarn, "CALL", buf);
  setLastError(buf, true);
  return code;
}

/// Maps a core Status onto ncclResult_t (values are equal). The core has already logged it.
ncclResult_t fromStatus(const c4::Status& s) {
  if (!s.isOk() && s.code() != c4::Code::kInProgress) setLastError(s.message().c_str(), false);
  return static_cast<ncclResult_t>(s.code());
}

/// The integer a caller passed for an enum argument. Read through memcpy: a garbage value (say -1
/// for ncclRedOp_t) is outside the enum's range and must be rejected, not loaded as the enum.
template <typename E>
int rawEnum(const E* e) {
  static_assert(sizeof(E) == sizeof(int), "NCCL enums are int-sized");
  int v = 0;
  memcpy(&v, e, sizeof(v));
  return v;
}

c4::Comm* toC4(ncclComm_t comm) { return reinterpret_cast<c4::Comm*>(comm); }
ncclComm_t toNccl(c4::Comm* comm) { return reinterpret_cast<ncclComm_t>(comm); }
// Enum arguments are read as the raw int the caller passed (c4's enums have a fixed int type, so
// any value is representable); the core validates them with the other arguments.
c4::DataType toC4(const ncclDataType_t& dt) { return static_cast<c4::DataType>(rawEnum(&dt)); }
c4::RedOp toC4(const ncclRedOp_t& op) { return static_cast<c4::RedOp>(rawEnum(&op)); }
c4::UniqueId toC4(const ncclUniqueId& id) {
  c4::UniqueId out;
  memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

#define C4_NCCL_CHECK(expr)                               \
  do {                                                    \
    ncclResult_t c4_nccl_res_ = (expr);                   \
    if (c4_nccl_res_ != ncclSuccess) return c4_nccl_res_; \
  } while (0)

ncclResult_t checkPtr(const char* fn, const char* what, const void* p) {
  if (p == nullptr) return fail(ncclInvalidArgument, "%s: %s argument is NULL", fn, what);
  return ncclSuccess;
}

ncclResult_t checkComm(const char* fn, ncclComm_t comm) { return checkPtr(fn, "comm", comm); }

ncclResult_t checkType(const char* fn, const ncclDataType_t* dt) {
  int v = rawEnum(dt);
  if (!c4::isValidDataType(v)) {
    return fail(ncclInvalidArgument, "%s: invalid data type %d (expected 0..%d)", fn, v, c4::kNumDataTypes - 1);
  }
  return ncclSuccess;
}

/// Checks an int config field that must be NCCL_CONFIG_UNDEF_INT or within [lo, hi].
ncclResult_t checkConfigInt(const char* fn, const char* field, int v, int lo, int hi) {
  if (v != NCCL_CONFIG_UNDEF_INT && (v < lo || v > hi)) {
    return fail(ncclInvalidArgument, "%s: config->%s = %d is invalid (expected %d..%d or NCCL_CONFIG_UNDEF_INT)", fn,
                field, v, lo, hi);
  }
  return ncclSuccess;
}

/// Translates an ncclConfig_t into a c4::Config with NCCL's rules: the struct must come from
/// NCCL_CONFIG_INITIALIZER (magic, version), fields beyond the caller's `size` (an older layout)
/// and fields left at NCCL_CONFIG_UNDEF_* take defaults. A null config means all defaults.
ncclResult_t parseConfig(const char* fn, const ncclConfig_t* config, c4::Config* out) {
  *out = c4::Config{};
  if (config == nullptr) return ncclSuccess;
  if (config->magic != kConfigMagic) {
    return fail(ncclInvalidArgument,
                "%s: config was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x%x, expected 0x%x)", fn,
                config->magic, kConfigMagic);
  }
  if (config->version < kFirstConfigVersion) {
    return fail(ncclInvalidArgument, "%s: config version %u is invalid (expected an NCCL version code >= %u)", fn,
                config->version, kFirstConfigVersion);
  }
  // The oldest layout (2.14) ends after netName; anything smaller is corrupt.
  constexpr size_t kMinSize = offsetof(ncclConfig_t, netName) + sizeof(const char*);
  if (config->size < kMinSize) {
    return fail(ncclInvalidArgument, "%s: config size %zu is invalid (expected at least %zu)", fn, config->size,
                kMinSize);
  }
  // A caller built against a newer header passes a larger struct: its leading fields are ours.
  auto has = [config](size_t offset, size_t bytes) { return config->size >= offset + bytes; };
#define C4_CFG_HAS(f) has(offsetof(ncclConfig_t, f), sizeof(config->f))
  C4_NCCL_CHECK(checkConfigInt(fn, "blocking", config->blocking, 0, 1));
  C4_NCCL_CHECK(checkConfigInt(fn, "cgaClusterSize", config->cgaClusterSize, 0, INT_MAX));
  C4_NCCL_CHECK(checkConfigInt(fn, "minCTAs", config->minCTAs, 1, INT_MAX));
  C4_NCCL_CHECK(checkConfigInt(fn, "maxCTAs", config->maxCTAs, 1, INT_MAX));
  if (config->minCTAs != NCCL_CONFIG_UNDEF_INT && config->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      config->minCTAs > config->maxCTAs) {
    return fail(ncclInvalidArgument, "%s: config->minCTAs = %d is larger than config->maxCTAs = %d", fn,
                config->minCTAs, config->maxCTAs);
  }
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) out->blocking = config->blocking;
  if (C4_CFG_HAS(splitShare)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "splitShare", config->splitShare, 0, 1));
    if (config->splitShare != NCCL_CONFIG_UNDEF_INT) out->splitShare = config->splitShare;
  }
  if (C4_CFG_HAS(commName) && config->commName != NCCL_CONFIG_UNDEF_PTR) out->name = config->commName;
  if (C4_CFG_HAS(collnetEnable)) C4_NCCL_CHECK(checkConfigInt(fn, "collnetEnable", config->collnetEnable, 0, 1));
  if (C4_CFG_HAS(CTAPolicy)) {
    C4_NCCL_CHECK(
        checkConfigInt(fn, "CTAPolicy", config->CTAPolicy, 0, NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO));
  }
  if (C4_CFG_HAS(shrinkShare)) C4_NCCL_CHECK(checkConfigInt(fn, "shrinkShare", config->shrinkShare, 0, 1));
  if (C4_CFG_HAS(nvlsCTAs)) C4_NCCL_CHECK(checkConfigInt(fn, "nvlsCTAs", config->nvlsCTAs, 1, INT_MAX));
  if (C4_CFG_HAS(nChannelsPerNetPeer)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "nChannelsPerNetPeer", config->nChannelsPerNetPeer, 1, INT_MAX));
  }
  if (C4_CFG_HAS(nvlinkCentricSched)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "nvlinkCentricSched", config->nvlinkCentricSched, 0, 1));
  }
  // NCCL 2.29+: RMA contexts and signals, CUDA graph and launch ordering, host CFT and NVLS modes.
  if (C4_CFG_HAS(graphUsageMode))
    C4_NCCL_CHECK(checkConfigInt(fn, "graphUsageMode", config->graphUsageMode, 0, INT_MAX));
  if (C4_CFG_HAS(numRmaCtx)) C4_NCCL_CHECK(checkConfigInt(fn, "numRmaCtx", config->numRmaCtx, 1, INT_MAX));
  if (C4_CFG_HAS(maxP2pPeers)) C4_NCCL_CHECK(checkConfigInt(fn, "maxP2pPeers", config->maxP2pPeers, 0, INT_MAX));
  if (C4_CFG_HAS(graphStreamOrdering)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "graphStreamOrdering", config->graphStreamOrdering, 0, INT_MAX));
  }
  if (C4_CFG_HAS(launchOrderImplicit)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "launchOrderImplicit", config->launchOrderImplicit, 0, 1));
  }
  if (C4_CFG_HAS(numRmaSig)) C4_NCCL_CHECK(checkConfigInt(fn, "numRmaSig", config->numRmaSig, 1, INT_MAX));
  if (C4_CFG_HAS(rmaEagerInit)) C4_NCCL_CHECK(checkConfigInt(fn, "rmaEagerInit", config->rmaEagerInit, 0, 1));
  if (C4_CFG_HAS(hostCftMode)) {
    C4_NCCL_CHECK(checkConfigInt(fn, "hostCftMode", config->hostCftMode, ncclHostCftEnable, ncclHostCftFallback));
  }
  if (C4_CFG_HAS(nvlsHostMode)) C4_NCCL_CHECK(checkConfigInt(fn, "nvlsHostMode", config->nvlsHostMode, 0, INT_MAX));
#undef C4_CFG_HAS
  // cgaClusterSize, CTA counts, netName, trafficClass, collnet, CTA policy, NVLS and NVLink
  // scheduling tune GPU kernels and NCCL's network plugins; they are validated and then ignored.
  return ncclSuccess;
}

/// Checks the per-call options of nccl*Config (NCCL's rules as for ncclConfig_t: the struct comes
/// from NCCL_COLLCONFIG_INITIALIZER; fields past the caller's size take defaults). c4comm runs the
/// call as the plain one: the CTA fields tune GPU kernels (range-checked, ignored), vendor options
/// are other libraries' (ignored, as NVIDIA's library does), userProfilerTag only labels profiler
/// events. What it cannot honour is refused: an algorithm selection that must be met, and a launch
/// completion event (no kernel is launched for it to mark).
ncclResult_t checkCollConfig(const char* fn, const ncclCollConfig_t* config) {
  if (config == nullptr) return ncclSuccess;
  if (config->magic != kConfigMagic) {
    return fail(ncclInvalidArgument,
                "%s: config was not initialized with NCCL_COLLCONFIG_INITIALIZER (magic 0x%x, expected 0x%x)", fn,
                config->magic, kConfigMagic);
  }
  if (config->version < kFirstCollConfigVersion) {
    return fail(ncclInvalidArgument, "%s: config version %u is invalid (expected an NCCL version code >= %u)", fn,
                config->version, kFirstCollConfigVersion);
  }
  constexpr size_t kMinSize = offsetof(ncclCollConfig_t, launchCompletionEvent) + sizeof(cudaEvent_t);
  if (config->size < kMinSize) {
    return fail(ncclInvalidArgument, "%s: config size %zu is invalid (expected at least %zu)", fn, config->size,
                kMinSize);
  }
  int options = 0;
  for (const ncclConfigExt_t* e = config->ext; e != nullptr; e = e->next) {
    if (++options > 4096) return fail(ncclInvalidArgument, "%s: config->ext is circular (or over 4096 options)", fn);
  }
  C4_NCCL_CHECK(checkConfigInt(fn, "minCTAs", config->minCTAs, 1, INT_MAX));
  C4_NCCL_CHECK(checkConfigInt(fn, "maxCTAs", config->maxCTAs, 1, INT_MAX));
  if (config->minCTAs != NCCL_CONFIG_UNDEF_INT && config->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      config->minCTAs > config->maxCTAs) {
    return fail(ncclInvalidArgument, "%s: config->minCTAs = %d is larger than config->maxCTAs = %d", fn,
                config->minCTAs, config->maxCTAs);
  }
  C4_NCCL_CHECK(checkConfigInt(fn, "nvlsCTAs", config->nvlsCTAs, 1, INT_MAX));
  C4_NCCL_CHECK(checkConfigInt(fn, "cgaClusterSize", config->cgaClusterSize, 0, INT_MAX));
  C4_NCCL_CHECK(
      checkConfigInt(fn, "CTAPolicy", config->CTAPolicy, 0, NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO));
  if (config->forceAlgSelection != 0 && config->forceAlgSelection != 1) {
    return fail(ncclInvalidArgument, "%s: config->forceAlgSelection = %d is invalid (expected 0 or 1)", fn,
                config->forceAlgSelection);
  }
  if (config->algSelection != nullptr && config->algSelection[0] != '\0' && config->forceAlgSelection == 1) {
    return fail(ncclInvalidUsage,
                "%s: config->algSelection \"%s\": c4comm does not select algorithms per call yet (its tuner chooses; "
                "C4_ALGO sets one for every call); set forceAlgSelection = 0 to run with the tuner's choice",
                fn, config->algSelection);
  }
  if (config->launchCompletionEvent != nullptr) {
    return fail(ncclInvalidUsage,
                "%s: config->launchCompletionEvent is not supported by c4comm yet (docs/api-coverage.md)", fn);
  }
  return ncclSuccess;
}

// The configuration of a communicator made from a parent: a null config inherits the parent's
// (*out stays null), else it is parsed into *storage.
ncclResult_t childConfig(const char* fn, ncclConfig_t* config, c4::Config* storage, const c4::Config** out) {
  *out = nullptr;
  if (config == nullptr) return ncclSuccess;
  C4_NCCL_CHECK(parseConfig(fn, config, storage));
  *out = storage;
  return ncclSuccess;
}

/// What an entry point returns when an exception reached it (no exception crosses the C API):
/// ncclSystemError for exhausted memory or a failed system call (std::bad_alloc, std::system_error),
/// ncclInternalError for anything else; the reason goes to the log and ncclGetLastError. Called
/// from the handler of the entry point's function-try-block; allocates nothing it needs.
ncclResult_t fromException(const char* fn) noexcept {
  if (fn[0] == 'p') ++fn;  // pncclXxx: name the ncclXxx the caller called
  char buf[512];
  ncclResult_t code = ncclInternalError;
  try {
    throw;
  } catch (const std::bad_alloc&) {
    code = ncclSystemError;
    snprintf(buf, sizeof(buf), "%s: out of memory (std::bad_alloc); the call did not complete", fn);
  } catch (const std::system_error& e) {
    code = ncclSystemError;
    snprintf(buf, sizeof(buf), "%s: system error: %s; the call did not complete", fn, e.what());
  } catch (const std::exception& e) {
    snprintf(buf, sizeof(buf), "%s: internal error: %s; the call did not complete", fn, e.what());
  } catch (...) {
    snprintf(buf, sizeof(buf), "%s: internal error: an unknown exception; the call did not complete", fn);
  }
  setLastError(buf, true);
  try {
    c4::log(c4::LogKind::kWarn, "CALL", buf);
  } catch (...) {  // logging may allocate: the result code and ncclGetLastError still tell
  }
  return code;
}

/// Runs an entry point's body: no exception crosses the C API (fromException says what it was).
template <class F>
ncclResult_t guarded(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return fromException(fn);
  }
}

/// guarded() for an entry point that returns nothing (the error still goes to the log and
/// ncclGetLastError).
template <class F>
void guardedVoid(const char* fn, F&& body) noexcept {
  try {
    body();
  } catch (...) {
    (void)fromException(fn);
  }
}

}  // namespace

// ================================ entry points (pnccl*) =========================================

ncclResult_t pncclGetVersion(int* version) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkPtr("ncclGetVersion", "version", version));
    *version = c4::version();
    return ncclSuccess;
  });
}

const char* pncclGetErrorString(ncclResult_t result) {
  // NCCL's own texts: programs and tests compare against them.
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclTimeout:
      return "timeout";
    default:
      return "unknown result code";
  }
}

const char* pncclGetLastError(ncclComm_t comm) {
  if (!tlsLastErrorIsOurs) {
    const char* core = c4::lastError(toC4(comm));
    if (core != nullptr && core[0] != '\0') return core;
  }
  return tlsLastError;
}

void pncclResetDebugInit() {
  guardedVoid(__func__, [&] { c4::reloadLogConfig(); });
}

// ---- memory -------------------------------------------------------------------------------------

ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkPtr("ncclMemAlloc", "ptr", ptr));
    if (size == 0) return fail(ncclInvalidArgument, "ncclMemAlloc: size is 0");
    // Device memory where the process has a GPU (as NCCL's); elsewhere page-aligned host memory that
    // the ranks of a host can map (collectives on it run zero-copy, docs/shm-transport.md).
    C4_NCCL_CHECK(fromStatus(c4::memAllocPreferDevice(ptr, size)));
    return ncclSuccess;
  });
}

ncclResult_t pncclMemFree(void* ptr) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkPtr("ncclMemFree", "ptr", ptr));
    C4_NCCL_CHECK(fromStatus(c4::memFree(ptr)));
    return ncclSuccess;
  });
}

// ---- ids and communicators ----------------------------------------------------------------------

ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkPtr("ncclGetUniqueId", "uniqueId", uniqueId));
    c4::UniqueId id;
    C4_NCCL_CHECK(fromStatus(c4::getUniqueId(&id)));
    memcpy(uniqueId->internal, id.bytes, sizeof(uniqueId->internal));
    return ncclSuccess;
  });
}

namespace {

ncclResult_t initRank(const char* fn, ncclComm_t* comm, int nranks, const ncclUniqueId& commId, int rank,
                      const ncclConfig_t* config) {
  C4_NCCL_CHECK(checkPtr(fn, "comm", comm));
  if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks %d is invalid (expected >= 1)", fn, nranks);
  if (rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "%s: rank %d is out of range (expected 0..%d)", fn, rank, nranks - 1);
  }
  c4::Config cfg;
  C4_NCCL_CHECK(parseConfig(fn, config, &cfg));
  c4::Comm* c = nullptr;
  c4::Status s = c4::commInitRank(&c, nranks, toC4(commId), rank, cfg);
  // Non-blocking init hands out the communicator with ncclInProgress.
  if (s.isOk() || s.code() == c4::Code::kInProgress) *comm = toNccl(c);
  return fromStatus(s);
}

}  // namespace

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guarded(__func__,
                 [&]() -> ncclResult_t { return initRank("ncclCommInitRank", comm, nranks, commId, rank, nullptr); });
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return initRank("ncclCommInitRankConfig", comm, nranks, commId, rank, config);
  });
}

// Several ids only spread NCCL's bootstrap load over several roots. c4comm's bootstrap serves one
// communicator from one root, so commIds[0] is used: every rank passes the same list in the same
// order, and the process that created commIds[0] with ncclGetUniqueId is one of the ranks and keeps
// serving it.
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                       ncclConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommInitRankScalable";
    C4_NCCL_CHECK(checkPtr(fn, "commIds", commIds));
    if (nId < 1) return fail(ncclInvalidArgument, "%s: nId %d is invalid (expected >= 1)", fn, nId);
    return initRank(fn, newcomm, nranks, commIds[0], myrank, config);
  });
}

ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommInitAll";
    C4_NCCL_CHECK(checkPtr(fn, "comm", comm));
    if (ndev < 1) return fail(ncclInvalidArgument, "%s: ndev %d is invalid (expected >= 1)", fn, ndev);
    // Host communicators have no device; devlist only orders CUDA devices, so it is ignored.
    if (devlist != nullptr)
      c4::log(c4::LogKind::kInfo, "INIT", (std::string(fn) + ": devlist ignored for host communicators").c_str());
    static_assert(sizeof(ncclComm_t) == sizeof(c4::Comm*), "");
    return fromStatus(c4::commInitAll(reinterpret_cast<c4::Comm**>(comm), ndev));
  });
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommSplit";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "newcomm", newcomm));
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
      return fail(ncclInvalidArgument, "%s: color %d is invalid (expected >= 0 or NCCL_SPLIT_NOCOLOR)", fn, color);
    }
    c4::Config cfg;
    const c4::Config* cfgPtr = nullptr;
    C4_NCCL_CHECK(childConfig(fn, config, &cfg, &cfgPtr));
    c4::Comm* c = nullptr;
    c4::Status s = c4::commSplit(toC4(comm), color, key, &c, cfgPtr);
    if (s.isOk() || s.code() == c4::Code::kInProgress) *newcomm = toNccl(c);
    return fromStatus(s);
  });
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                             ncclConfig_t* config, int shrinkFlags) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommShrink";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "newcomm", newcomm));
    if (excludeRanksCount < 0) {
      return fail(ncclInvalidArgument, "%s: excludeRanksCount %d is negative", fn, excludeRanksCount);
    }
    if (excludeRanksCount > 0) C4_NCCL_CHECK(checkPtr(fn, "excludeRanksList", excludeRanksList));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
      return fail(ncclInvalidArgument, "%s: shrinkFlags 0x%x is invalid", fn, shrinkFlags);
    }
    c4::Config cfg;
    const c4::Config* cfgPtr = nullptr;
    C4_NCCL_CHECK(childConfig(fn, config, &cfg, &cfgPtr));
    c4::Comm* c = nullptr;
    c4::Status s =
        c4::commShrink(toC4(comm), excludeRanksList, excludeRanksCount, &c, cfgPtr, shrinkFlags == NCCL_SHRINK_ABORT);
    if (s.isOk() || s.code() == c4::Code::kInProgress) *newcomm = toNccl(c);
    return fromStatus(s);
  });
}

ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommRevoke";
    C4_NCCL_CHECK(checkComm(fn, comm));
    if (revokeFlags != NCCL_REVOKE_DEFAULT) {
      return fail(ncclInvalidArgument, "%s: revokeFlags 0x%x is invalid (must be NCCL_REVOKE_DEFAULT)", fn,
                  revokeFlags);
    }
    return fromStatus(c4::commRevoke(toC4(comm)));
  });
}

ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkComm("ncclCommFinalize", comm));
    return fromStatus(c4::commFinalize(toC4(comm)));
  });
}

// NCCL accepts a null communicator in destroy and abort (nothing to free).
ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    if (comm == nullptr) return ncclSuccess;
    return fromStatus(c4::commDestroy(toC4(comm)));
  });
}

ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    if (comm == nullptr) return ncclSuccess;
    return fromStatus(c4::commAbort(toC4(comm)));
  });
}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommGetAsyncError";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "asyncError", asyncError));
    c4::Status s = c4::commGetAsyncError(toC4(comm));
    *asyncError = fromStatus(s);  // also keeps the reason for ncclGetLastError
    return ncclSuccess;
  });
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkComm("ncclCommCount", comm));
    C4_NCCL_CHECK(checkPtr("ncclCommCount", "count", count));
    return fromStatus(c4::commCount(toC4(comm), count));
  });
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkComm("ncclCommCuDevice", comm));
    C4_NCCL_CHECK(checkPtr("ncclCommCuDevice", "device", device));
    return fromStatus(c4::commCuDevice(toC4(comm), device));
  });
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkComm("ncclCommUserRank", comm));
    C4_NCCL_CHECK(checkPtr("ncclCommUserRank", "rank", rank));
    return fromStatus(c4::commUserRank(toC4(comm), rank));
  });
}

// ---- registration -------------------------------------------------------------------------------

ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommRegister";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "buff", buff));
    C4_NCCL_CHECK(checkPtr(fn, "handle", handle));
    if (size == 0) return fail(ncclInvalidArgument, "%s: size is 0", fn);
    // Registered with every transport of the communicator (a range for shm and tcp, which use host
    // memory in place; RDMA memory regions and CUDA IPC handles later).
    return fromStatus(c4::commRegister(toC4(comm), buff, size, handle));
  });
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommDeregister";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "handle", handle));
    return fromStatus(c4::commDeregister(toC4(comm), handle));
  });
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommWindowRegister";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "buff", buff));
    C4_NCCL_CHECK(checkPtr(fn, "win", win));
    if (size == 0) return fail(ncclInvalidArgument, "%s: size is 0", fn);
    constexpr int kKnown =
        NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING | NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED;
    if ((winFlags & ~kKnown) != 0) return fail(ncclInvalidArgument, "%s: winFlags 0x%x has unknown bits", fn, winFlags);
    // Collective: the ranks learn where each other's buffers lie (they must come from ncclMemAlloc).
    c4::Window* w = nullptr;
    C4_NCCL_CHECK(fromStatus(c4::windowRegister(toC4(comm), buff, size, winFlags, &w)));
    *win = reinterpret_cast<ncclWindow_t>(w);
    return ncclSuccess;
  });
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommWindowDeregister";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "win", win));
    return fromStatus(c4::windowDeregister(toC4(comm), reinterpret_cast<c4::Window*>(win)));
  });
}

ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclWinGetUserPtr";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "win", win));
    C4_NCCL_CHECK(checkPtr(fn, "outUserPtr", outUserPtr));
    return fromStatus(c4::windowUserPtr(toC4(comm), reinterpret_cast<c4::Window*>(win), outUserPtr));
  });
}

// ---- user reduction operators -------------------------------------------------------------------

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclRedOpCreatePreMulSum";
    C4_NCCL_CHECK(checkPtr(fn, "op", op));
    C4_NCCL_CHECK(checkPtr(fn, "scalar", scalar));
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkType(fn, &datatype));
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
      return fail(ncclInvalidArgument, "%s: residence %d is invalid", fn, static_cast<int>(residence));
    }
    c4::RedOp out = c4::RedOp::kSum;
    C4_NCCL_CHECK(fromStatus(c4::redOpCreatePreMulSum(&out, scalar, toC4(datatype),
                                                      static_cast<c4::ScalarResidence>(residence), toC4(comm))));
    *op = static_cast<ncclRedOp_t>(out);
    return ncclSuccess;
  });
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclRedOpDestroy";
    C4_NCCL_CHECK(checkComm(fn, comm));
    if (static_cast<int>(op) < static_cast<int>(ncclNumOps)) {
      return fail(ncclInvalidArgument, "%s: operator %d is built in, not one from ncclRedOpCreatePreMulSum", fn,
                  static_cast<int>(op));
    }
    return fromStatus(c4::redOpDestroy(toC4(op), toC4(comm)));
  });
}

// ---- collectives --------------------------------------------------------------------------------

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::allReduce(sendbuff, recvbuff, count, toC4(datatype), toC4(op), toC4(comm), stream));
  });
}

ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::allGather(sendbuff, recvbuff, sendcount, toC4(datatype), toC4(comm), stream));
  });
}

ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::broadcast(sendbuff, recvbuff, count, toC4(datatype), root, toC4(comm), stream));
  });
}

// The deprecated in-place form: buff is both the source (on root) and the destination.
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::broadcast(buff, buff, count, toC4(datatype), root, toC4(comm), stream));
  });
}

ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::reduce(sendbuff, recvbuff, count, toC4(datatype), toC4(op), root, toC4(comm), stream));
  });
}

ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::reduceScatter(sendbuff, recvbuff, recvcount, toC4(datatype), toC4(op), toC4(comm), stream));
  });
}

ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::alltoAll(sendbuff, recvbuff, count, toC4(datatype), toC4(comm), stream));
  });
}

ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::gather(sendbuff, recvbuff, count, toC4(datatype), root, toC4(comm), stream));
  });
}

ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::scatter(sendbuff, recvbuff, count, toC4(datatype), root, toC4(comm), stream));
  });
}

// ---- point to point -----------------------------------------------------------------------------

ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::send(sendbuff, count, toC4(datatype), peer, toC4(comm), stream));
  });
}

ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    return fromStatus(c4::recv(recvbuff, count, toC4(datatype), peer, toC4(comm), stream));
  });
}

// ---- groups -------------------------------------------------------------------------------------

ncclResult_t pncclGroupStart() {
  return guarded(__func__, [&] { return fromStatus(c4::groupStart()); });
}

ncclResult_t pncclGroupEnd() {
  return guarded(__func__, [&] { return fromStatus(c4::groupEnd()); });
}

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclGroupSimulateEnd";
    C4_NCCL_CHECK(checkPtr(fn, "simInfo", simInfo));
    if (simInfo->magic != kSimInfoMagic) {
      return fail(ncclInvalidArgument,
                  "%s: simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER (magic 0x%x, expected 0x%x)", fn,
                  simInfo->magic, kSimInfoMagic);
    }
    double us = 0;
    c4::Status s = c4::groupSimulateEnd(&us);
    if (s.isOk()) simInfo->estimatedTime = static_cast<float>(us);
    return fromStatus(s);
  });
}

// ---- collectives with per-call options (NCCL 2.32) ---------------------------------------------

ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                  const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclAllReduceConfig", config));
    return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  });
}

ncclResult_t pncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclBroadcastConfig", config));
    return pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

ncclResult_t pncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                               const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclReduceConfig", config));
    return pncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  });
}

ncclResult_t pncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclAllGatherConfig", config));
    return pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  });
}

ncclResult_t pncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclReduceScatterConfig", config));
    return pncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  });
}

ncclResult_t pncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclAlltoAllConfig", config));
    return pncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
  });
}

ncclResult_t pncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclGatherConfig", config));
    return pncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

ncclResult_t pncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkCollConfig("ncclScatterConfig", config));
    return pncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

// ---- growing, suspending (NCCL 2.30) ------------------------------------------------------------

ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommGetUniqueId";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "uniqueId", uniqueId));
    c4::UniqueId id;
    C4_NCCL_CHECK(fromStatus(c4::commGrowId(toC4(comm), &id)));
    memcpy(uniqueId->internal, id.bytes, sizeof(uniqueId->internal));
    return ncclSuccess;
  });
}

ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommGrow";
    C4_NCCL_CHECK(checkPtr(fn, "newcomm", newcomm));
    if (nRanks < 1) return fail(ncclInvalidArgument, "%s: nRanks %d is invalid (expected >= 1)", fn, nRanks);
    c4::Config cfg;
    const c4::Config* cfgPtr = nullptr;
    C4_NCCL_CHECK(childConfig(fn, config, &cfg, &cfgPtr));
    c4::UniqueId id;
    if (uniqueId != nullptr) id = toC4(*uniqueId);
    c4::Comm* c = nullptr;
    c4::Status s = c4::commGrow(toC4(comm), nRanks, uniqueId ? &id : nullptr, rank, &c, cfgPtr);
    if (s.isOk() || s.code() == c4::Code::kInProgress) *newcomm = toNccl(c);
    return fromStatus(s);
  });
}

ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommSuspend";
    C4_NCCL_CHECK(checkComm(fn, comm));
    if ((flags & ~NCCL_SUSPEND_MEM) != 0)
      return fail(ncclInvalidArgument, "%s: flags 0x%x has unknown bits", fn, flags);
    return fromStatus(c4::commSuspend(toC4(comm), (flags & NCCL_SUSPEND_MEM) != 0));
  });
}

ncclResult_t pncclCommResume(ncclComm_t comm) {
  return guarded(__func__, [&]() -> ncclResult_t {
    C4_NCCL_CHECK(checkComm("ncclCommResume", comm));
    return fromStatus(c4::commResume(toC4(comm)));
  });
}

ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclCommMemStats";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkPtr(fn, "value", value));
    c4::MemStats st;
    C4_NCCL_CHECK(fromStatus(c4::commMemStats(toC4(comm), &st)));
    switch (rawEnum(&stat)) {
      case ncclStatGpuMemSuspend:
        *value = st.gpuSuspendable;
        return ncclSuccess;
      case ncclStatGpuMemSuspended:
        *value = st.suspended ? 1 : 0;
        return ncclSuccess;
      case ncclStatGpuMemPersist:
        *value = st.gpuPersistent;
        return ncclSuccess;
      case ncclStatGpuMemTotal:
        *value = st.gpuSuspendable + st.gpuPersistent;
        return ncclSuccess;
      default:
        return fail(ncclInvalidArgument, "%s: stat %d is not an ncclCommMemStat_t", fn, rawEnum(&stat));
    }
  });
}

// ---- one-sided (NCCL 2.29) ------------------------------------------------------------------------

namespace {

/// sigIdx, ctx and flags must be 0 (NCCL 2.29-2.32 document them so).
ncclResult_t checkSignalArgs(const char* fn, int sigIdx, int ctx, unsigned int flags) {
  if (sigIdx != 0) return fail(ncclInvalidArgument, "%s: sigIdx %d is invalid (must be 0)", fn, sigIdx);
  if (ctx != 0) return fail(ncclInvalidArgument, "%s: ctx %d is invalid (must be 0)", fn, ctx);
  if (flags != 0) return fail(ncclInvalidArgument, "%s: flags 0x%x is invalid (must be 0)", fn, flags);
  return ncclSuccess;
}

}  // namespace

ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                            ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclPutSignal";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkType(fn, &datatype));
    C4_NCCL_CHECK(checkPtr(fn, "peerWin", peerWin));
    if (count > 0) C4_NCCL_CHECK(checkPtr(fn, "localbuff", localbuff));
    C4_NCCL_CHECK(checkSignalArgs(fn, sigIdx, ctx, flags));
    const size_t elem = c4::dataTypeSize(toC4(datatype));
    if (count > SIZE_MAX / elem) return fail(ncclInvalidArgument, "%s: count %zu overflows the byte size", fn, count);
    return fromStatus(c4::putSignal(localbuff, count * elem, peer, reinterpret_cast<c4::Window*>(peerWin),
                                    peerWinOffset, toC4(comm), stream));
  });
}

ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclSignal";
    C4_NCCL_CHECK(checkComm(fn, comm));
    C4_NCCL_CHECK(checkSignalArgs(fn, sigIdx, ctx, flags));
    return fromStatus(c4::signalPeer(peer, toC4(comm), stream));
  });
}

ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclWaitSignal";
    C4_NCCL_CHECK(checkComm(fn, comm));
    if (nDesc < 0) return fail(ncclInvalidArgument, "%s: nDesc %d is negative", fn, nDesc);
    if (nDesc > 0) C4_NCCL_CHECK(checkPtr(fn, "signalDescs", signalDescs));
    std::vector<int> peers(static_cast<size_t>(nDesc)), counts(static_cast<size_t>(nDesc));
    for (int i = 0; i < nDesc; ++i) {
      const ncclWaitSignalDesc_t& d = signalDescs[i];
      C4_NCCL_CHECK(checkSignalArgs(fn, d.sigIdx, d.ctx, 0));
      peers[static_cast<size_t>(i)] = d.peer;
      counts[static_cast<size_t>(i)] = d.opCnt;
    }
    return fromStatus(c4::waitSignal(nDesc, peers.data(), counts.data(), toC4(comm), stream));
  });
}

// ---- TCP encryption (NCCL 2.32) -------------------------------------------------------------------

ncclResult_t pncclSetEncryption(const ncclEncryptionConfig_t* config) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclSetEncryption";
    C4_NCCL_CHECK(checkPtr(fn, "config", config));
    if (config->magic != kConfigMagic) {
      return fail(ncclInvalidArgument,
                  "%s: config was not initialized with NCCL_ENCRYPTION_CONFIG_INITIALIZER (magic 0x%x, expected 0x%x)",
                  fn, config->magic, kConfigMagic);
    }
    if (config->size < sizeof(ncclEncryptionConfig_t)) {
      return fail(ncclInvalidArgument, "%s: config size %zu is invalid (expected %zu)", fn, config->size,
                  sizeof(ncclEncryptionConfig_t));
    }
    if (config->mode == NCCL_ENCRYPTION_MODE_NONE) return ncclSuccess;  // plaintext: what c4comm's sockets are
    if (config->mode != NCCL_ENCRYPTION_MODE_PSK)
      return fail(ncclInvalidArgument, "%s: mode %d is not an ncclEncryptionMode_t", fn, config->mode);
    return fail(ncclInvalidUsage,
                "%s: TLS (NCCL_ENCRYPTION_MODE_PSK) is not implemented by c4comm: its tcp transport and bootstrap are "
                "plaintext (the bootstrap authenticates ranks with the unique id's key, docs/api-coverage.md)",
                fn);
  });
}

// ---- parameters (NCCL 2.32): c4comm's registry of settings (docs/params.md) --------------------------
// A handle is the parameter's name, interned for the library's life; values are read at each call,
// as the library reads them.

struct ncclParamHandle {
  std::string key;
};

namespace {

std::mutex gParamMu;
std::map<std::string, std::unique_ptr<ncclParamHandle>>& paramHandles() {
  static auto* handles = new std::map<std::string, std::unique_ptr<ncclParamHandle>>();  // never freed: see above
  return *handles;
}

ncclResult_t paramRead(const char* fn, ncclParamHandle_t h, std::string* text, bool* isInt, int64_t* num) {
  C4_NCCL_CHECK(checkPtr(fn, "handle", h));
  return fromStatus(c4::paramValue(h->key.c_str(), text, isInt, num));
}

template <typename T>
ncclResult_t paramGetInt(const char* fn, ncclParamHandle_t h, T* out) {
  C4_NCCL_CHECK(checkPtr(fn, "out", out));
  std::string text;
  bool isInt = false;
  int64_t v = 0;
  C4_NCCL_CHECK(paramRead(fn, h, &text, &isInt, &v));
  if (!isInt) return fail(ncclInvalidArgument, "%s: %s is a text parameter ('%s')", fn, h->key.c_str(), text.c_str());
  const bool fits = std::is_signed<T>::value
                        ? v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                              v <= static_cast<int64_t>(std::numeric_limits<T>::max())
                        : v >= 0 && static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!fits)
    return fail(ncclInvalidArgument, "%s: %s = %lld does not fit", fn, h->key.c_str(), static_cast<long long>(v));
  *out = static_cast<T>(v);
  return ncclSuccess;
}

thread_local std::string tlsParamStr, tlsParamValue;
thread_local std::vector<std::string> tlsParamKeys;
thread_local std::vector<const char*> tlsParamKeyPtrs;

}  // namespace

ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclParamBind";
    C4_NCCL_CHECK(checkPtr(fn, "out", out));
    C4_NCCL_CHECK(checkPtr(fn, "key", key));
    std::string text;
    bool isInt = false;
    int64_t v = 0;
    C4_NCCL_CHECK(fromStatus(c4::paramValue(key, &text, &isInt, &v)));
    std::lock_guard<std::mutex> g(gParamMu);
    auto& slot = paramHandles()[key];
    if (!slot) slot.reset(new ncclParamHandle{key});
    *out = slot.get();
    return ncclSuccess;
  });
}

#define C4_PARAM_GET(Suffix, T)                                                            \
  ncclResult_t pncclParamGet##Suffix(ncclParamHandle_t h, T* out) {                        \
    return guarded(__func__, [&] { return paramGetInt("ncclParamGet" #Suffix, h, out); }); \
  }
C4_PARAM_GET(I8, int8_t)
C4_PARAM_GET(I16, int16_t)
C4_PARAM_GET(I32, int32_t)
C4_PARAM_GET(I64, int64_t)
C4_PARAM_GET(U8, uint8_t)
C4_PARAM_GET(U16, uint16_t)
C4_PARAM_GET(U32, uint32_t)
C4_PARAM_GET(U64, uint64_t)
#undef C4_PARAM_GET

ncclResult_t pncclParamGetStr(ncclParamHandle_t h, const char** out) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclParamGetStr";
    C4_NCCL_CHECK(checkPtr(fn, "out", out));
    bool isInt = false;
    int64_t v = 0;
    C4_NCCL_CHECK(paramRead(fn, h, &tlsParamStr, &isInt, &v));
    *out = tlsParamStr.c_str();
    return ncclSuccess;
  });
}

ncclResult_t pncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclParamGet";
    C4_NCCL_CHECK(checkPtr(fn, "len", len));
    if (maxLen < 0) return fail(ncclInvalidArgument, "%s: maxLen %d is negative", fn, maxLen);
    std::string text;
    bool isInt = false;
    int64_t v = 0;
    C4_NCCL_CHECK(paramRead(fn, h, &text, &isInt, &v));
    const void* src = isInt ? static_cast<const void*>(&v) : static_cast<const void*>(text.data());
    const size_t bytes = isInt ? sizeof(v) : text.size();
    *len = static_cast<int>(bytes);
    if (bytes > static_cast<size_t>(maxLen))
      return fail(ncclInvalidArgument, "%s: %s takes %zu bytes, more than maxLen %d", fn, h->key.c_str(), bytes,
                  maxLen);
    if (bytes > 0) {
      C4_NCCL_CHECK(checkPtr(fn, "out", out));
      memcpy(out, src, bytes);
    }
    return ncclSuccess;
  });
}

ncclResult_t pncclParamGetParameter(const char* key, const char** value, int* valueLen) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclParamGetParameter";
    C4_NCCL_CHECK(checkPtr(fn, "key", key));
    C4_NCCL_CHECK(checkPtr(fn, "value", value));
    C4_NCCL_CHECK(checkPtr(fn, "valueLen", valueLen));
    bool isInt = false;
    int64_t v = 0;
    C4_NCCL_CHECK(fromStatus(c4::paramValue(key, &tlsParamValue, &isInt, &v)));
    *value = tlsParamValue.c_str();
    *valueLen = static_cast<int>(tlsParamValue.size());
    return ncclSuccess;
  });
}

ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  return guarded(__func__, [&]() -> ncclResult_t {
    const char* fn = "ncclParamGetAllParameterKeys";
    C4_NCCL_CHECK(checkPtr(fn, "table", table));
    C4_NCCL_CHECK(checkPtr(fn, "tableLen", tableLen));
    // Both names of each parameter: its C4_ name and its NCCL_ alias where it has one.
    tlsParamKeys.clear();
    for (const c4::ParamDesc& p : c4::params()) {
      tlsParamKeys.push_back(p.env);
      if (!p.ncclEnv.empty()) tlsParamKeys.push_back(p.ncclEnv);
    }
    tlsParamKeyPtrs.clear();
    for (const std::string& k : tlsParamKeys) tlsParamKeyPtrs.push_back(k.c_str());
    *table = tlsParamKeyPtrs.data();
    *tableLen = static_cast<int>(tlsParamKeyPtrs.size());
    return ncclSuccess;
  });
}

void pncclParamDumpAll() {
  guardedVoid(__func__, [&] {
    for (const c4::ParamDesc& p : c4::params()) {
      std::string text;
      bool isInt = false;
      int64_t v = 0;
      if (!c4::paramValue(p.env.c_str(), &text, &isInt, &v).isOk()) continue;
      const std::string line = p.env + (p.ncclEnv.empty() ? "" : " (" + p.ncclEnv + ")") + " = " + text;
      c4::log(c4::LogKind::kInfo, "ENV", line.c_str());
    }
  });
}

// ---- NCCL's device API (nccl_device.h, 2.28) ------------------------------------------------------
// Host entry points of the device-side communication API (kernels that load, store and signal
// across ranks through ncclDevComm). c4comm has no device API yet (docs/api-coverage.md): creating a
// device communicator or its resources fails with ncclInvalidUsage. The team queries answer for the
// communicator as it is: the world team, and a load/store-accessible (LSA) team of this rank alone.
// Programs linked against NVIDIA's library reference these (PyTorch does), so they must exist for
// LD_PRELOAD of this library to work. Types as nccl_device/core.h declares them (opaque here).
extern "C" {
struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;
struct ncclDevCommRequirements;
struct ncclDevComm;
struct ncclDevResourceRequirements;
struct ncclLsaBarrierHandle;
struct ncclGinBarrierHandle;
struct ncclLLA2AHandle;
}

namespace {

ncclResult_t noDeviceApi(const char* fn) {
  return fail(ncclInvalidUsage,
              "%s: the NCCL device API (nccl_device.h) is not implemented by c4comm "
              "(docs/api-coverage.md)",
              fn);
}

ncclTeam_t teamOf(ncclComm_t comm, bool world) {
  ncclTeam_t t{1, 0, 1};
  int n = 1, r = 0;
  if (comm != nullptr && c4::commCount(toC4(comm), &n).isOk() && c4::commUserRank(toC4(comm), &r).isOk() && world)
    t = ncclTeam_t{n, r, 1};
  return t;
}

}  // namespace

extern "C" {
ncclResult_t pncclDevCommCreate(ncclComm_t, const ncclDevCommRequirements*, ncclDevComm*) {
  return noDeviceApi("ncclDevCommCreate");
}
ncclResult_t pncclDevCommDestroy(ncclComm_t, const ncclDevComm*) { return noDeviceApi("ncclDevCommDestroy"); }
ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle*, ncclDevResourceRequirements*) {
  return noDeviceApi("ncclLsaBarrierCreateRequirement");
}
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle*,
                                              ncclDevResourceRequirements*) {
  return noDeviceApi("ncclGinBarrierCreateRequirement");
}
ncclResult_t pncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle*, ncclDevResourceRequirements*) {
  return noDeviceApi("ncclLLA2ACreateRequirement");
}
// Slots of the low-latency all-to-all's buffer: none without the device API.
int pncclLLA2ACalcSlots(int, int) { return 0; }
ncclTeam_t pncclTeamWorld(ncclComm_t comm) { return teamOf(comm, true); }
ncclTeam_t pncclTeamLsa(ncclComm_t comm) { return teamOf(comm, false); }
// With an LSA team of one, the rail team (one rank per LSA team) is the world.
ncclTeam_t pncclTeamRail(ncclComm_t comm) { return teamOf(comm, true); }
int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  return teamOf(comm, true).rank + (rank - team.rank) * team.stride;
}
int pncclTeamRankToLsa(ncclComm_t, ncclTeam_t team, int rank) { return (rank - team.rank) * team.stride; }
// NVIDIA's internal twin of ncclResetDebugInit (no profiling alias).
void ncclResetDebugInitInternal() { c4::reloadLogConfig(); }
}

// ================================ ncclXxx = weak alias of pncclXxx ==============================

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define C4_NCCL_ALIAS(fn) extern "C" decltype(p##fn) fn __attribute__((weak, alias("p" #fn)));
C4_NCCL_ALIAS(ncclGetVersion)
C4_NCCL_ALIAS(ncclGetErrorString)
C4_NCCL_ALIAS(ncclGetLastError)
C4_NCCL_ALIAS(ncclResetDebugInit)
C4_NCCL_ALIAS(ncclMemAlloc)
C4_NCCL_ALIAS(ncclMemFree)
C4_NCCL_ALIAS(ncclGetUniqueId)
C4_NCCL_ALIAS(ncclCommInitRank)
C4_NCCL_ALIAS(ncclCommInitRankConfig)
C4_NCCL_ALIAS(ncclCommInitRankScalable)
C4_NCCL_ALIAS(ncclCommInitAll)
C4_NCCL_ALIAS(ncclCommSplit)
C4_NCCL_ALIAS(ncclCommShrink)
C4_NCCL_ALIAS(ncclCommRevoke)
C4_NCCL_ALIAS(ncclCommFinalize)
C4_NCCL_ALIAS(ncclCommDestroy)
C4_NCCL_ALIAS(ncclCommAbort)
C4_NCCL_ALIAS(ncclCommGetAsyncError)
C4_NCCL_ALIAS(ncclCommCount)
C4_NCCL_ALIAS(ncclCommCuDevice)
C4_NCCL_ALIAS(ncclCommUserRank)
C4_NCCL_ALIAS(ncclCommRegister)
C4_NCCL_ALIAS(ncclCommDeregister)
C4_NCCL_ALIAS(ncclCommWindowRegister)
C4_NCCL_ALIAS(ncclCommWindowDeregister)
C4_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
C4_NCCL_ALIAS(ncclRedOpDestroy)
C4_NCCL_ALIAS(ncclAllReduce)
C4_NCCL_ALIAS(ncclAllGather)
C4_NCCL_ALIAS(ncclBroadcast)
C4_NCCL_ALIAS(ncclBcast)
C4_NCCL_ALIAS(ncclReduce)
C4_NCCL_ALIAS(ncclReduceScatter)
C4_NCCL_ALIAS(ncclAlltoAll)
C4_NCCL_ALIAS(ncclGather)
C4_NCCL_ALIAS(ncclScatter)
C4_NCCL_ALIAS(ncclSend)
C4_NCCL_ALIAS(ncclRecv)
C4_NCCL_ALIAS(ncclGroupStart)
C4_NCCL_ALIAS(ncclGroupEnd)
C4_NCCL_ALIAS(ncclGroupSimulateEnd)
C4_NCCL_ALIAS(ncclWinGetUserPtr)
C4_NCCL_ALIAS(ncclAllReduceConfig)
C4_NCCL_ALIAS(ncclBroadcastConfig)
C4_NCCL_ALIAS(ncclReduceConfig)
C4_NCCL_ALIAS(ncclAllGatherConfig)
C4_NCCL_ALIAS(ncclReduceScatterConfig)
C4_NCCL_ALIAS(ncclAlltoAllConfig)
C4_NCCL_ALIAS(ncclGatherConfig)
C4_NCCL_ALIAS(ncclScatterConfig)
C4_NCCL_ALIAS(ncclCommGetUniqueId)
C4_NCCL_ALIAS(ncclCommGrow)
C4_NCCL_ALIAS(ncclCommSuspend)
C4_NCCL_ALIAS(ncclCommResume)
C4_NCCL_ALIAS(ncclCommMemStats)
C4_NCCL_ALIAS(ncclPutSignal)
C4_NCCL_ALIAS(ncclSignal)
C4_NCCL_ALIAS(ncclWaitSignal)
C4_NCCL_ALIAS(ncclSetEncryption)
C4_NCCL_ALIAS(ncclParamBind)
C4_NCCL_ALIAS(ncclParamGetI8)
C4_NCCL_ALIAS(ncclParamGetI16)
C4_NCCL_ALIAS(ncclParamGetI32)
C4_NCCL_ALIAS(ncclParamGetI64)
C4_NCCL_ALIAS(ncclParamGetU8)
C4_NCCL_ALIAS(ncclParamGetU16)
C4_NCCL_ALIAS(ncclParamGetU32)
C4_NCCL_ALIAS(ncclParamGetU64)
C4_NCCL_ALIAS(ncclParamGetStr)
C4_NCCL_ALIAS(ncclParamGet)
C4_NCCL_ALIAS(ncclParamGetParameter)
C4_NCCL_ALIAS(ncclParamGetAllParameterKeys)
C4_NCCL_ALIAS(ncclParamDumpAll)
C4_NCCL_ALIAS(ncclDevCommCreate)
C4_NCCL_ALIAS(ncclDevCommDestroy)
C4_NCCL_ALIAS(ncclLsaBarrierCreateRequirement)
C4_NCCL_ALIAS(ncclGinBarrierCreateRequirement)
C4_NCCL_ALIAS(ncclLLA2ACreateRequirement)
C4_NCCL_ALIAS(ncclLLA2ACalcSlots)
C4_NCCL_ALIAS(ncclTeamWorld)
C4_NCCL_ALIAS(ncclTeamLsa)
C4_NCCL_ALIAS(ncclTeamRail)
C4_NCCL_ALIAS(ncclTeamRankToWorld)
C4_NCCL_ALIAS(ncclTeamRankToLsa)
#undef C4_NCCL_ALIAS
#pragma GCC diagnostic pop
