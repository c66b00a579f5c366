#include "core/zerocopy.hpp"

#include <algorithm>
#include <cstring>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "transports/idle.hpp"

namespace c4 {

C4_PARAM_INT(ZeroCopy, "C4_ZEROCOPY", nullptr, 1, 0, 1, kParamNone,
             "1 = collectives whose buffers all ranks of one host allocated with ncclMemAlloc / c4::memAlloc read "
             "and write the peers' buffers in place (the zero-copy path); 0 = never (0 on any rank turns the path off "
             "for the whole communicator)")
C4_PARAM_INT(CudaIpc, "C4_CUDA_IPC", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "1 = collectives on device buffers (cudaMalloc memory) of ranks that all share one host run as kernels "
             "reading and writing the peers' buffers through CUDA IPC; 0 = always staged through host memory")

struct ZeroCopy::Record {
  uint64_t seq;  // written last (release)
  MemRef send;
  MemRef recv;
};
static_assert(sizeof(ZeroCopy::Record) <= 64, "one arena line");

// After the owner's doneSeq in the first arena line.
struct ZeroCopy::State {
  uint64_t seq;         // the last call whose share this rank wrote (release)
  uint64_t probeState;  // 0: not yet; kProbePublished: `probe` is valid; kProbeNone: no probe
  uint64_t capable;     // 0: not yet; kCapable: this rank mapped the next rank's probe; kIncapable
  MemRef probe;
  uint64_t deviceOpened;  // (seq + 1) << 1 | 1 if this rank opened every peer's device buffers of call seq
};
static_assert(sizeof(ZeroCopy::State) <= 56, "fits after doneSeq");

/// Where a rank's device buffers of one call lie (OneShot::deviceRecord).
struct DeviceRecord {
  uint64_t seq;                             // written last (release)
  int32_t device;                           // the buffers' GPU
  uint16_t sendRegistered, recvRegistered;  // 1: registered with commRegister (peers keep the mapping)
  gpu::IpcRef send;
  gpu::IpcRef recv;
  uint64_t sendAddr, recvAddr;  // for ranks of the same process, which use them as they are
  uint64_t process;             // the offering process (processToken()): equal pids in two pid
                                // namespaces of one host are not one process
};
static_assert(sizeof(DeviceRecord) <= OneShot::kDeviceRecordBytes, "fits its arena slot");

/// A rank's deregistrations of registered device memory and its acknowledgements of the peers'
/// (OneShot::deviceState).
constexpr size_t kMaxDeregRanks = (OneShot::kDeviceStateBytes - 16) / 8;
struct DeviceState {
  uint64_t deregCount;  // this rank's deregistrations so far (release)
  uint64_t pad;
  uint64_t ack[kMaxDeregRanks];  // ack[r]: rank r's deregistrations this rank has acknowledged
};
static_assert(sizeof(DeviceState) <= OneShot::kDeviceStateBytes, "fits its arena area");
constexpr uint64_t kAckForGood = ~uint64_t{0};  // the rank left: it holds no mapping any more

namespace {
uint64_t loadAcq(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void storeRel(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

constexpr uint64_t kProbeMagic = 0xc4d1ec7000000000ULL;
constexpr uint64_t kProbePublished = 1, kProbeNone = 2;
constexpr uint64_t kCapable = 1, kIncapable = 2;
// Reductions go block by block so that a block is still in L1 when it is copied to the peers.
constexpr size_t kBlockBytes = 16384;

struct Bytes {
  size_t send = 0, recv = 0;  // 0: the buffer is not used by this rank
};

Bytes bytesOf(const OpDesc& op, int rank, int n) {
  const size_t b = op.count * dataTypeSize(op.dtype);
  const size_t all = b * static_cast<size_t>(n);
  switch (op.coll) {
    case Coll::kAllReduce:
      return {b, b};
    case Coll::kReduceScatter:
      return {all, b};
    case Coll::kAllGather:
      return {b, all};
    case Coll::kBroadcast:
      return {rank == op.root ? b : 0, b};
    case Coll::kReduce:
      return {b, rank == op.root ? b : 0};
    case Coll::kAlltoAll:
      return {all, all};
    case Coll::kGather:
      return {b, rank == op.root ? all : 0};
    case Coll::kScatter:
      return {rank == op.root ? all : 0, b};
    default:
      return {};
  }
}

// Rank r's slice [*b, *e) of `count` elements, cut at cache-line multiples so that no two ranks
// write one line.
void sliceOf(int r, int n, size_t count, size_t es, size_t* b, size_t* e) {
  const size_t unit = std::max<size_t>(1, 64 / es);
  const size_t units = (count + unit - 1) / unit;
  *b = std::min(count, units * static_cast<size_t>(r) / static_cast<size_t>(n) * unit);
  *e = std::min(count, units * static_cast<size_t>(r + 1) / static_cast<size_t>(n) * unit);
}
}  // namespace

ZeroCopy::State* ZeroCopy::stateOf(int rank) const { return reinterpret_cast<State*>(os_->zeroCopyState(rank)); }

ZeroCopy::~ZeroCopy() {
  if (probePage_) (void)memFreeShared(probePage_);
}

Status ZeroCopy::init(ExecContext* ctx, const std::vector<PeerProcess>& procs, int64_t timeoutMs, OneShot* os,
                      transport::Transport* t, const std::unique_ptr<gpu::StreamGate>* gate,
                      std::function<bool(const void*, size_t)> registered) {
  ctx_ = ctx;
  gate_ = gate;
  registered_ = std::move(registered);
  procs_ = procs;
  timeoutMs_ = timeoutMs;
  os_ = os;
  t_ = t;
  rank_ = ctx->thisRank();
  nranks_ = ctx->numRanks();
  enabled_ = false;
  if (!os->arenasReady()) return Status::ok();
  enabled_ = true;
  in_.assign(static_cast<size_t>(nranks_), nullptr);
  out_.assign(static_cast<size_t>(nranks_), nullptr);
  deviceUnreachable_.assign(static_cast<size_t>(nranks_), 0);
  deregSeen_.assign(static_cast<size_t>(nranks_), 0);
  seen_.assign(static_cast<size_t>(nranks_), 0);

  // Probe: can this rank map the next rank's memory? (Opening /proc/<pid>/fd/<fd> needs the same
  // user and a dumpable process; ranks are alike, so one neighbour stands for all.) The page
  // stays until the communicator goes: the previous rank maps it whenever it gets here.
  State* mine = stateOf(rank_);
  if (paramZeroCopy() != 0 && memAllocShared(&probePage_, 64, /*internal=*/true).isOk()) {
    *static_cast<uint64_t*>(probePage_) = kProbeMagic ^ static_cast<uint64_t>(rank_);
    (void)memLookup(probePage_, 8, &mine->probe);
    storeRel(&mine->probeState, kProbePublished);
  } else {
    storeRel(&mine->probeState, kProbeNone);
  }
  const int next = (rank_ + 1) % nranks_;
  State* theirs = stateOf(next);
  watch_.reset();
  uint64_t ps;
  for (int idle = 1; (ps = loadAcq(&theirs->probeState)) == 0; ++idle) {
    if (ctx_->cancelled())
      return makeError(Code::kRemoteError, "rank %d: init cancelled (aborted or destroyed)", rank_);
    C4_CHECK(watch_.check(
        rank_, timeoutMs_, t_, next, OpSig(), [&] { return loadAcq(&theirs->probeState) != 0; },
        "the zero-copy probe at init"));
    transport::waitHint(idle);
  }
  bool ok = ps == kProbePublished && probePage_ != nullptr;
  std::string why = ok ? "" : "C4_ZEROCOPY=0 or no memfd";
  if (ok) {
    PeerMappings probe(1);
    char* q = nullptr;
    Status rs = probe.resolve(procs_[static_cast<size_t>(next)], theirs->probe, 8, &q);
    ok = rs.isOk() && *reinterpret_cast<uint64_t*>(q) == (kProbeMagic ^ static_cast<uint64_t>(next));
    if (!rs.isOk()) why = rs.message();
  }
  if (!ok && probePage_)
    C4_INFO(kLogInit, "rank %d: zero-copy path off: cannot map rank %d's memory (%s)", rank_, next, why.c_str());
  storeRel(&mine->capable, ok ? kCapable : kIncapable);
  return Status::ok();
}

Status ZeroCopy::awaitProbes() {
  watch_.reset();
  for (int r = 0; r < nranks_; ++r) {
    uint64_t c;
    for (int idle = 1; (c = loadAcq(&stateOf(r)->capable)) == 0; ++idle) {
      C4_CHECK(watch_.check(
          rank_, timeoutMs_, t_, r, OpSig(), [&] { return loadAcq(&stateOf(r)->capable) != 0; },
          "the zero-copy probe results"));
      transport::waitHint(idle);
    }
    if (c != kCapable) {
      allCapable_ = 0;
      return Status::ok();
    }
  }
  allCapable_ = 1;
  C4_INFO(kLogInit, "rank %d: zero-copy path on for buffers from ncclMemAlloc / c4::memAlloc (%d ranks, one host)",
          rank_, nranks_);
  return Status::ok();
}

bool ZeroCopy::mayDefer(const OpDesc& op, bool inPlace) const {
  if (!enabled_ || paramCudaIpc() == 0 || op.count == 0) return false;
  switch (op.coll) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kReduce:
      // Sum, product, min and max (Avg and PreMulSum scale, and the kernels run no scaling here).
      return static_cast<int>(op.op) >= 0 && static_cast<int>(op.op) < static_cast<int>(RedOp::kAvg);
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kGather:
    case Coll::kScatter:
      return true;
    case Coll::kAlltoAll:
      return !inPlace;
    default:
      return false;
  }
}

Status ZeroCopy::stageLate(const OpDesc& op) {
  if (!op.deferred) return Status::ok();
  if (!gate_ || !*gate_)
    return makeError(Code::kInternalError, "rank %d: a deferred device call without its gate", rank_);
  return (*gate_)->copyInputsNow(op.staged);
}

Status ZeroCopy::offerDevice(const OpDesc& op, const OpSig& sig, bool* offered) {
  const Bytes need = bytesOf(op, rank_, nranks_);
  DeviceRecord rec{};
  const bool ok = (!need.send || gpu::ipcExport(op.deviceSend, need.send, &rec.send)) &&
                  (!need.recv || gpu::ipcExport(op.deviceRecv, need.recv, &rec.recv));
  if (!ok) return stageLate(op);  // not CUDA IPC memory (VMM, managed): staged like any other call
  auto* r = reinterpret_cast<DeviceRecord*>(os_->deviceRecord(rank_, sig.seq + 1));
  storeRel(&r->seq, 0);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  r->device = (*gate_)->device();
  const bool keep = registeredMappings() && registered_;
  r->sendRegistered = keep && need.send && registered_(op.deviceSend, need.send) ? 1 : 0;
  r->recvRegistered = keep && need.recv && registered_(op.deviceRecv, need.recv) ? 1 : 0;
  r->send = rec.send;
  r->recv = rec.recv;
  r->sendAddr = reinterpret_cast<uintptr_t>(op.deviceSend);
  r->recvAddr = reinterpret_cast<uintptr_t>(op.deviceRecv);
  r->process = processToken();
  storeRel(&r->seq, sig.seq + 1);
  *offered = true;
  return Status::ok();
}

Status ZeroCopy::offer(const OpDesc& op, const OpSig& sig, bool* offered) {
  *offered = false;
  if (op.deferred) return offerDevice(op, sig, offered);
  if (!enabled_ || op.count == 0 || !memUserAllocations()) return Status::ok();
  switch (op.coll) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kReduce: {
      // PreMulSum and floating-point Avg scale each rank's input first: not here.
      const int opv = static_cast<int>(op.op);
      if (opv > static_cast<int>(RedOp::kAvg)) return Status::ok();
      if (opv == static_cast<int>(RedOp::kAvg) && isFloatType(op.dtype)) return Status::ok();
      break;
    }
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kGather:
    case Coll::kScatter:
    case Coll::kAlltoAll:
      break;
    default:
      return Status::ok();  // Send/Recv
  }
  const Bytes need = bytesOf(op, rank_, nranks_);
  Record rec{};
  if (need.send && !memLookup(op.sendbuff, need.send, &rec.send)) return Status::ok();
  if (need.recv && !memLookup(op.recvbuff, need.recv, &rec.recv)) return Status::ok();
  if (allCapable_ < 0) C4_CHECK(awaitProbes());
  if (allCapable_ == 0) return Status::ok();
  auto* r = reinterpret_cast<Record*>(os_->zeroCopyRecord(rank_, sig.seq + 1));
  storeRel(&r->seq, 0);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  r->send = rec.send;
  r->recv = rec.recv;
  storeRel(&r->seq, sig.seq + 1);
  *offered = true;
  return Status::ok();
}

void ZeroCopy::start(const OpDesc& op, const OpSig& sig, kernels::KOp kop) {
  sig_ = sig;
  op_ = op;
  kop_ = kop;
  device_ = op.deferred;
  std::fill(seen_.begin(), seen_.end(), 0);
  seen_[static_cast<size_t>(rank_)] = 1;
  const Bytes need = bytesOf(op, rank_, nranks_);
  const void* send = device_ ? op.deviceSend : op.sendbuff;
  void* recv = device_ ? op.deviceRecv : op.recvbuff;
  in_[static_cast<size_t>(rank_)] = need.send ? static_cast<const char*>(send) : nullptr;
  out_[static_cast<size_t>(rank_)] = need.recv ? static_cast<char*>(recv) : nullptr;
  phase_ = Phase::kDecide;
  watch_.reset();
}

Status ZeroCopy::decide(bool* decided, bool* fallback) {
  *decided = *fallback = false;
  for (int r = 0; r < nranks_; ++r) {
    if (seen_[static_cast<size_t>(r)]) continue;
    CallMode mode = CallMode::kNotYet;
    C4_CHECK(os_->peerMode(r, sig_, &mode));
    waitingFor_ = r;
    if (mode == CallMode::kNotYet)
      return watch_.check(rank_, 0, t_, r, sig_, [&] {
        // Announced meanwhile (or a mismatch): the next poll judges it.
        CallMode now = CallMode::kNotYet;
        return !os_->peerMode(r, sig_, &now).isOk() || now != CallMode::kNotYet;
      });
    if (mode != (device_ ? CallMode::kZeroCopyDevice : CallMode::kZeroCopy)) {
      // This peer runs the call through messages (or already did, without waiting for us).
      *decided = *fallback = true;
      return Status::ok();
    }
    seen_[static_cast<size_t>(r)] = 1;
    progressed_ = true;
  }
  *decided = true;
  return Status::ok();
}

Status ZeroCopy::resolvePeers() {
  const uint64_t seq = sig_.seq + 1;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    auto* rec = reinterpret_cast<Record*>(os_->zeroCopyRecord(r, seq));
    if (loadAcq(&rec->seq) != seq)
      return makeError(Code::kInternalError, "rank %d: rank %d offered %s for the zero-copy path without its record",
                       rank_, r, describeSig(sig_).c_str());
    const Bytes need = bytesOf(op_, r, nranks_);
    const PeerProcess& owner = procs_[static_cast<size_t>(r)];
    char* p = nullptr;
    if (need.send) C4_CHECK(maps_.resolve(owner, rec->send, need.send, &p));
    in_[static_cast<size_t>(r)] = need.send ? p : nullptr;
    p = nullptr;
    if (need.recv) C4_CHECK(maps_.resolve(owner, rec->recv, need.recv, &p));
    out_[static_cast<size_t>(r)] = need.recv ? p : nullptr;
  }
  return Status::ok();
}

Status ZeroCopy::poll(bool* done, bool* fallback) {
  progressed_ = false;
  *done = *fallback = false;
  if (phase_ == Phase::kDecide) {
    bool decided = false;
    C4_CHECK(decide(&decided, fallback));
    if (!decided) {
      // The rank waited for may be deregistering device memory and waiting for this rank to close
      // its mappings first: answer (no mapping of this call is open yet).
      serviceDeregistrations();
      return Status::ok();
    }
    if (*fallback) {
      if (device_) C4_CHECK(stageLate(op_));
      phase_ = Phase::kDone;
      progressed_ = true;
      return Status::ok();
    }
    progressed_ = true;
    watch_.reset();
    if (device_) {
      bool opened = false;
      resolveDevicePeers(&opened);
      storeRel(&stateOf(rank_)->deviceOpened, ((sig_.seq + 1) << 1) | (opened ? 1 : 0));
      phase_ = Phase::kAgreeDevice;
    } else {
      C4_CHECK(resolvePeers());
      compute();
      storeRel(&stateOf(rank_)->seq, sig_.seq + 1);
      phase_ = Phase::kWaitPeers;
    }
  }
  if (phase_ == Phase::kAgreeDevice) {
    bool decided = false, allOpened = false;
    C4_CHECK(agreeDevice(&decided, &allOpened));
    if (!decided) return Status::ok();
    progressed_ = true;
    watch_.reset();
    if (!allOpened) {
      // Some rank cannot reach a peer's GPU memory: every rank runs the call on its staging.
      (*gate_)->ipcTrim();
      C4_CHECK(stageLate(op_));
      phase_ = Phase::kDone;
      *fallback = true;
      return Status::ok();
    }
    C4_CHECK(computeDevice());
    storeRel(&stateOf(rank_)->seq, sig_.seq + 1);
    phase_ = Phase::kWaitPeers;
  }
  if (phase_ == Phase::kWaitPeers) {
    // Every rank has written its share into our output and read what it needed of our input.
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_ || loadAcq(&stateOf(r)->seq) > sig_.seq) continue;
      waitingFor_ = r;
      serviceDeregistrations();  // this rank's kernels are done (runZeroCopy waited for them)
      // A peer that finishes its share now and leaves while the check looks is no failure.
      return watch_.check(rank_, 0, t_, r, sig_, [&] { return loadAcq(&stateOf(r)->seq) > sig_.seq; });
    }
    phase_ = Phase::kDone;
    progressed_ = true;
  }
  *done = phase_ == Phase::kDone;
  return Status::ok();
}

std::string ZeroCopy::waitingOn() const {
  if (waitingFor_ < 0) return "ranks of the zero-copy path";
  return strFormat(phase_ == Phase::kDecide        ? "rank %d (to announce the call, zero-copy path)"
                   : phase_ == Phase::kAgreeDevice ? "rank %d (to open its peers' device buffers, zero-copy path)"
                                                   : "rank %d (to finish its share, zero-copy path)",
                   waitingFor_);
}

void ZeroCopy::compute() {
  const size_t es = dataTypeSize(op_.dtype);
  const size_t n = static_cast<size_t>(nranks_);
  const size_t me = static_cast<size_t>(rank_);
  const size_t root = static_cast<size_t>(op_.root);
  const size_t count = op_.count;
  const size_t bytes = count * es;
  const size_t blockElems = kBlockBytes / es;
  alignas(64) static thread_local char tmp[kBlockBytes];  // one L1 block
  // acc = every rank's input at byte offset `at`, `cnt` elements, starting with our own (acc may
  // alias it), so that acc may be our output even in place.
  const size_t first = me == 0 ? 1 : 0;
  auto reduceAll = [&](char* acc, size_t at, size_t cnt) {
    kernels::reduce(acc, in_[me] + at, in_[first] + at, cnt, op_.dtype, kop_);
    for (size_t k = 0; k < n; ++k)
      if (k != me && k != first) kernels::reduce(acc, acc, in_[k] + at, cnt, op_.dtype, kop_);
  };
  switch (op_.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce: {
      // Reduce this rank's slice, then copy it to every output. In place, a peer's output block
      // is its input block, already read when the copy overwrites it.
      size_t b, e;
      sliceOf(rank_, nranks_, count, es, &b, &e);
      const bool toAll = op_.coll == Coll::kAllReduce;
      // Beyond the caches, the peers' copies go out with streaming stores (no read for ownership;
      // C4_COPY_NT_THRESHOLD).
      const bool stream = bytes >= kernels::copyNonTemporalThreshold();
      for (size_t x = b; x < e; x += blockElems) {
        const size_t cnt = std::min(blockElems, e - x);
        const size_t off = x * es;
        // AllReduce accumulates in our own output; Reduce in a local block (the root's output
        // is remote, and in place also its input).
        char* acc = toAll || me == root ? out_[me] + off : tmp;
        reduceAll(acc, off, cnt);
        if (toAll) {
          for (size_t k = 0; k < n; ++k) {
            if (k == me) continue;
            if (stream)
              kernels::copyStreaming(out_[k] + off, acc, cnt * es);
            else
              memcpy(out_[k] + off, acc, cnt * es);
          }
        } else if (me != root) {
          memcpy(out_[root] + off, acc, cnt * es);
        }
      }
      return;
    }
    case Coll::kReduceScatter:
      // Our block of every input into our output (in place it is our input's own block).
      for (size_t x = 0; x < count; x += blockElems)
        reduceAll(out_[me] + x * es, me * bytes + x * es, std::min(blockElems, count - x));
      return;
    case Coll::kAllGather:
      // Pull every block into our own output.
      for (size_t k = 0; k < n; ++k) {
        char* dst = out_[me] + k * bytes;
        if (dst != in_[k]) kernels::copy(dst, in_[k], bytes);
      }
      return;
    case Coll::kBroadcast: {
      const bool inPlace = out_[root] == in_[root];
      if (n == 2 && inPlace) {
        // Two ranks, in place: the root pushes the second half while the other pulls the first.
        size_t half = bytes / 2 / 64 * 64;
        if (me == root)
          kernels::copy(out_[1 - root] + half, in_[root] + half, bytes - half);
        else
          kernels::copy(out_[me], in_[root], half);
        return;
      }
      if (out_[me] != in_[root]) kernels::copy(out_[me], in_[root], bytes);
      return;
    }
    case Coll::kAlltoAll: {
      // Pairwise exchange: for ranks i < j, block j of i's input goes to block i of j's output and
      // back. Nobody else touches those two blocks, so one rank can swap them through an L1
      // block, in place or not (each side may alias its input and output). The pair belongs to
      // the rank it is nearer to around the ring; a pair half-way round is split in halves.
      auto exchange = [&](size_t i, size_t j, size_t from, size_t to) {
        for (size_t off = from; off < to; off += kBlockBytes) {
          const size_t len = std::min(kBlockBytes, to - off);
          memcpy(tmp, in_[i] + j * bytes + off, len);                        // i's block for j
          memcpy(out_[i] + j * bytes + off, in_[j] + i * bytes + off, len);  // j's block for i
          memcpy(out_[j] + i * bytes + off, tmp, len);
        }
      };
      if (out_[me] + me * bytes != in_[me] + me * bytes)
        kernels::copy(out_[me] + me * bytes, in_[me] + me * bytes, bytes);
      const size_t half = bytes / 2 / 64 * 64;
      for (size_t d = 1; d < n; ++d) {
        const size_t k = (me + d) % n;  // the pair (me, k), d steps ahead of me
        const size_t i = std::min(me, k), j = std::max(me, k);
        if (2 * d < n) {
          exchange(i, j, 0, bytes);  // nearer to me going forward: mine
        } else if (2 * d == n) {
          if (me == i)
            exchange(i, j, 0, half);  // half-way: lower rank the first half
          else
            exchange(i, j, half, bytes);
        }
      }
      return;
    }
    case Coll::kGather: {
      // Push our block into the root's output (in place at the root it is there already).
      char* dst = out_[root] + me * bytes;
      if (dst != in_[me]) kernels::copy(dst, in_[me], bytes);
      return;
    }
    case Coll::kScatter: {
      // Pull our block from the root's input.
      const char* src = in_[root] + me * bytes;
      if (out_[me] != src) kernels::copy(out_[me], src, bytes);
      return;
    }
    default:
      return;
  }
}

// ---- device buffers ----

void ZeroCopy::resolveDevicePeers(bool* ok) {
  *ok = false;
  const uint64_t seq = sig_.seq + 1;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    auto* rec = reinterpret_cast<const DeviceRecord*>(os_->deviceRecord(r, seq));
    if (loadAcq(&rec->seq) != seq) {
      C4_WARN(kLogColl, "rank %d: rank %d offered %s on device buffers without its record; the call is staged", rank_,
              r, describeSig(sig_).c_str());
      return;
    }
    const Bytes need = bytesOf(op_, r, nranks_);
    if (deviceUnreachable_[static_cast<size_t>(r)]) return;  // said once (below)
    char* p = nullptr;
    Status st;
    if (rec->process == processToken()) {
      // A rank of this process: its buffers are addresses here already.
      st = (*gate_)->peerAccess(rec->device);
      in_[static_cast<size_t>(r)] = need.send ? reinterpret_cast<const char*>(rec->sendAddr) : nullptr;
      out_[static_cast<size_t>(r)] = need.recv ? reinterpret_cast<char*>(rec->recvAddr) : nullptr;
    } else {
      if (need.send) st = (*gate_)->ipcOpen(r, rec->send, need.send, &p, rec->sendRegistered != 0);
      in_[static_cast<size_t>(r)] = need.send ? p : nullptr;
      p = nullptr;
      if (st.isOk() && need.recv) st = (*gate_)->ipcOpen(r, rec->recv, need.recv, &p, rec->recvRegistered != 0);
      out_[static_cast<size_t>(r)] = need.recv ? p : nullptr;
    }
    if (!st.isOk()) {
      // Not again for this peer: every later call on device buffers is staged at once.
      deviceUnreachable_[static_cast<size_t>(r)] = 1;
      C4_WARN(kLogColl, "rank %d: %s; calls on device buffers with rank %d are staged through host memory", rank_,
              st.message().c_str(), r);
      return;
    }
  }
  *ok = true;
}

Status ZeroCopy::agreeDevice(bool* decided, bool* allOk) {
  *decided = false;
  *allOk = true;
  const uint64_t seq = sig_.seq + 1;
  for (int r = 0; r < nranks_; ++r) {
    const uint64_t v = loadAcq(&stateOf(r)->deviceOpened);
    if ((v >> 1) < seq) {
      waitingFor_ = r;
      return watch_.check(rank_, 0, t_, r, sig_, [&] { return (loadAcq(&stateOf(r)->deviceOpened) >> 1) >= seq; });
    }
    // No rank gets to a later call before every rank has read this one's (its decide waits for
    // our announcement of the next call).
    if ((v >> 1) == seq && (v & 1) == 0) *allOk = false;
  }
  *decided = true;
  return Status::ok();
}

Status ZeroCopy::computeDevice() {
  gpu::DeviceWork w;
  w.coll = static_cast<int>(op_.coll);
  w.dtype = static_cast<int>(op_.dtype);
  w.op = static_cast<int>(kop_);
  w.count = op_.count;
  w.root = op_.root;
  w.rank = rank_;
  w.nranks = nranks_;
  if (op_.coll == Coll::kAllReduce || op_.coll == Coll::kReduce)
    sliceOf(rank_, nranks_, op_.count, dataTypeSize(op_.dtype), &w.sliceBegin, &w.sliceEnd);
  w.in = in_.data();
  w.out = out_.data();
  Status st = (*gate_)->runZeroCopy(w);
  (*gate_)->ipcTrim();
  return st;
}

// ---- registered device buffers: mappings kept until their owner deregisters ----

bool ZeroCopy::registeredMappings() const { return enabled_ && static_cast<size_t>(nranks_) <= kMaxDeregRanks; }

void ZeroCopy::serviceDeregistrations() {
  // After closeDevice every ack says "for good": a later deregistration of a peer must not lower it.
  // Without a GPU in this process no rank of the host maps device memory of ours or theirs here
  // (and host calls, whose idle polls come here, pay one load).
  if (gpu::deviceCount() == 0 || !registeredMappings() || deviceClosed_) return;
  auto* mine = reinterpret_cast<DeviceState*>(os_->deviceState(rank_));
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    const uint64_t c = loadAcq(&reinterpret_cast<DeviceState*>(os_->deviceState(r))->deregCount);
    if (c <= deregSeen_[static_cast<size_t>(r)]) continue;
    if (gate_ && *gate_) (*gate_)->ipcCloseRegistered(r);
    deregSeen_[static_cast<size_t>(r)] = c;
    storeRel(&mine->ack[r], c);
  }
}

Status ZeroCopy::deviceDeregistered() {
  if (!registeredMappings()) return Status::ok();
  auto* mine = reinterpret_cast<DeviceState*>(os_->deviceState(rank_));
  const uint64_t c = loadAcq(&mine->deregCount) + 1;
  storeRel(&mine->deregCount, c);
  const int64_t deadline = detail::nowMs() + timeoutMs_;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    const uint64_t* ack = &reinterpret_cast<DeviceState*>(os_->deviceState(r))->ack[rank_];
    for (int idle = 1; loadAcq(ack) < c; ++idle) {
      // A peer deregistering at the same time waits for us as we wait for it.
      serviceDeregistrations();
      if (detail::nowMs() > deadline)
        return makeError(Code::kSystemError,
                         "rank %d: rank %d did not release its mappings of this rank's registered device memory "
                         "within %lld ms of the deregistration (is its process stuck outside c4comm?); the buffer "
                         "must not be freed while it may still be mapped there",
                         rank_, r, static_cast<long long>(timeoutMs_));
      transport::waitHint(idle);
    }
  }
  return Status::ok();
}

void ZeroCopy::closeDevice() {
  if (!registeredMappings()) return;
  deviceClosed_ = true;
  if (gate_ && *gate_) (*gate_)->ipcCloseRegistered(-1);
  auto* mine = reinterpret_cast<DeviceState*>(os_->deviceState(rank_));
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_) storeRel(&mine->ack[r], kAckForGood);
}

}  // namespace c4
