#include "core/oneshot.hpp"

#include <algorithm>
#include <cstring>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "trace/recorder.hpp"

namespace c4 {

C4_PARAM_INT(OneShotBytes, "C4_ONESHOT_BYTES", nullptr, 8192, 0, int64_t{1} << 30, kParamSameOnAllRanks,
             "Largest per-rank payload of a one-shot collective (all ranks on one host; 0 disables the path)")
C4_PARAM_INT(OneShotMaxRanks, "C4_ONESHOT_MAX_RANKS", nullptr, 8, 0, int64_t{1} << 24, kParamSameOnAllRanks,
             "Most ranks for which one-shot collectives are used")

namespace {
constexpr size_t kLine = 64;
constexpr int64_t kHealthEveryNs = 100 * 1000000LL;

using detail::nowNs;
uint64_t loadAcq(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void storeRel(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
}  // namespace

struct OneShot::Announce {
  uint64_t seq;
  uint32_t mode;
  uint32_t pad;
  OpSig sig;
  uint64_t pad2[3];
};
static_assert(sizeof(OneShot::Announce) == kLine, "one line");

// The payload starts right after this header, inside the same cache line: a reader of a tiny
// payload takes one line from the writer's cache.
struct OneShot::DataHdr {
  uint64_t seq;  // written last (release)
  uint32_t mode;
  uint32_t pad;
  OpSig sig;
  uint64_t bytes;
};
static_assert(sizeof(OneShot::DataHdr) == 48, "header then payload in the first line");
constexpr size_t kPayloadOff = sizeof(OneShot::DataHdr);

// Arena layout (offsets): done line, two announce lines, two zero-copy records, then two data
// slots; at the arena's end the device area (two device zero-copy records, the device state), so
// that the lines of a small call stay where they were before the device area existed.
namespace {
constexpr size_t kAnnounceOff = kLine;
constexpr size_t kZeroCopyOff = 3 * kLine;
constexpr size_t kDataOff = 5 * kLine;
constexpr size_t kDeviceAreaBytes = 2 * OneShot::kDeviceRecordBytes + OneShot::kDeviceStateBytes;
}  // namespace

void OneShot::init(ExecContext* ctx, int localRanks, transport::Transport* t) {
  ctx_ = ctx;
  t_ = t;
  rank_ = ctx->thisRank();
  nranks_ = ctx->numRanks();
  enabled_ = arenas_ready_ = false;
  int64_t maxBytes = std::max<int64_t>(0, paramOneShotBytes());
  // The arenas are used whenever all ranks share the host, even with the one-shot path off, so
  // that every call is announced: a peer configured differently then gets a clear error.
  if (!t || nranks_ < 2 || localRanks != nranks_) return;
  transport::HostArena* host = t->hostArena();
  size_t arena = host != nullptr ? host->arenaBytes() : 0;
  if (arena < kDataOff + 2 * (kLine + kLine) + kDeviceAreaBytes) return;
  deviceOff_ = (arena - kDeviceAreaBytes) / kLine * kLine;
  size_t slot = (deviceOff_ - kDataOff) / 2 / kLine * kLine;
  capacity_ = slot - kPayloadOff;
  maxBytes_ = std::min<size_t>(static_cast<size_t>(maxBytes), capacity_);
  arenas_.assign(static_cast<size_t>(nranks_), nullptr);
  for (int r = 0; r < nranks_; ++r) {
    arenas_[static_cast<size_t>(r)] = host->arena(r);
    if (!arenas_[static_cast<size_t>(r)]) return;
  }
  knownDone_.assign(static_cast<size_t>(nranks_), 0);
  announced_.assign(static_cast<size_t>(nranks_), 0);
  arenas_ready_ = true;
  enabled_ = maxBytes_ > 0 && nranks_ <= paramOneShotMaxRanks();
  if (enabled_)
    C4_INFO(kLogInit, "rank %d: one-shot collectives up to %zu bytes per rank over the shared arena", rank_, maxBytes_);
}

OneShot::Announce* OneShot::announceOf(int rank, uint64_t seq) const {
  return reinterpret_cast<Announce*>(arenas_[static_cast<size_t>(rank)] + kAnnounceOff + (seq % 2) * kLine);
}

OneShot::DataHdr* OneShot::dataOf(int rank, uint64_t seq) const {
  size_t slot = kPayloadOff + capacity_;
  return reinterpret_cast<DataHdr*>(arenas_[static_cast<size_t>(rank)] + kDataOff + (seq % 2) * slot);
}

uint64_t* OneShot::doneOf(int rank) const { return reinterpret_cast<uint64_t*>(arenas_[static_cast<size_t>(rank)]); }

char* OneShot::zeroCopyRecord(int rank, uint64_t seq) const {
  return arenas_[static_cast<size_t>(rank)] + kZeroCopyOff + (seq % 2) * kLine;
}

char* OneShot::deviceState(int rank) const {
  return arenas_[static_cast<size_t>(rank)] + deviceOff_ + 2 * kDeviceRecordBytes;
}

char* OneShot::deviceRecord(int rank, uint64_t seq) const {
  return arenas_[static_cast<size_t>(rank)] + deviceOff_ + (seq % 2) * kDeviceRecordBytes;
}

char* OneShot::zeroCopyState(int rank) const { return reinterpret_cast<char*>(doneOf(rank) + 1); }

size_t OneShot::publishedBytes(const OpDesc& op) const {
  size_t es = dataTypeSize(op.dtype);
  switch (op.coll) {
    case Coll::kReduceScatter:
      return op.count * es * static_cast<size_t>(nranks_);
    default:
      return op.count * es;
  }
}

bool OneShot::eligible(const OpDesc& op) const {
  if (!enabled_ || op.count == 0) return false;
  switch (op.coll) {
    case Coll::kAllReduce:
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kReduceScatter:
    case Coll::kReduce:
      return publishedBytes(op) <= maxBytes_;
    default:
      return false;
  }
}

void OneShot::announce(const OpSig& sig, CallMode mode) {
  if (!arenas_ready_) return;
  uint64_t seq = sig.seq + 1;
  Announce* a = announceOf(rank_, seq);
  // Seqlock write: readers check seq before and after reading the fields.
  storeRel(&a->seq, 0);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  a->mode = static_cast<uint32_t>(mode);
  a->sig = sig;
  storeRel(&a->seq, seq);
}

void OneShot::markDone(uint64_t seq) {
  if (arenas_ready_) storeRel(doneOf(rank_), seq + 1);
}

Status OneShot::start(const OpDesc& op, const OpSig& sig, const void* input, void* output, kernels::KOp kop,
                      const trace::Event* traceEvent) {
  seq_ = sig.seq + 1;
  sig_ = sig;
  op_ = op;
  kop_ = kop;
  input_ = input;
  output_ = output;
  std::fill(announced_.begin(), announced_.end(), 0);
  announced_[static_cast<size_t>(rank_)] = 1;
  phase_ = Phase::kWaitReuse;
  watch_.reset();
  tracePending_ = traceEvent != nullptr;
  if (tracePending_) traceEvent_ = *traceEvent;
  bool done = false;
  return poll(&done);
}

Status OneShot::peerMode(int peer, const OpSig& sig, CallMode* mode) const {
  *mode = CallMode::kNotYet;
  const uint64_t seq = sig.seq + 1;
  Announce* a = announceOf(peer, seq);
  uint64_t q = loadAcq(&a->seq);
  if (q == 0 || q < seq) {
    // The other parity slot may show that the peer is already past this call.
    if (loadAcq(&announceOf(peer, seq + 1)->seq) > seq) *mode = CallMode::kPassed;
    return Status::ok();
  }
  if (q > seq) {
    *mode = CallMode::kPassed;
    return Status::ok();
  }
  uint32_t m = a->mode;
  OpSig theirs = a->sig;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (loadAcq(&a->seq) != q) return Status::ok();  // rewritten while we read: look again later
  if (!sigMatches(theirs, sig))
    return makeError(Code::kInvalidUsage,
                     "rank %d and rank %d disagree on collective %llu: rank %d called %s but rank %d called %s (%s)",
                     rank_, peer, static_cast<unsigned long long>(sig.seq), peer, describeSig(theirs).c_str(), rank_,
                     describeSig(sig).c_str(), diffSigs(theirs, sig).c_str());
  *mode = static_cast<CallMode>(m);
  return Status::ok();
}

Status IdleWatch::verdict(int rank, int64_t timeoutMs, transport::Transport* t, int waitingFor, const OpSig& sig,
                          const char* what) {
  // The clock is read every 64 idle polls only: a cheap wait is the point of these paths.
  if ((++polls_ & 63) != 1) return Status::ok();
  int64_t now = nowNs();
  if (sinceNs_ == 0) {
    sinceNs_ = lastHealthNs_ = now;
    return Status::ok();
  }
  if (waitingFor >= 0 && now - lastHealthNs_ > kHealthEveryNs) {
    lastHealthNs_ = now;
    C4_CHECK(t->peerHealth(waitingFor));
  }
  if (timeoutMs > 0 && now - sinceNs_ > timeoutMs * 1000000LL)
    return makeError(Code::kRemoteError, "rank %d: %s made no progress for %lld ms (C4_TIMEOUT); waiting on rank %d",
                     rank, what ? what : describeSig(sig).c_str(), static_cast<long long>(timeoutMs), waitingFor);
  return Status::ok();
}

Status OneShot::poll(bool* done) {
  progressed_ = false;
  *done = false;
  if (phase_ == Phase::kWaitReuse) {
    // Data slot seq_ % 2 was last read at seq_ - 2: every peer must have finished that.
    uint64_t need = seq_ > 2 ? seq_ - 2 : 0;
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_ || knownDone_[static_cast<size_t>(r)] >= need) continue;
      knownDone_[static_cast<size_t>(r)] = loadAcq(doneOf(r));
      if (knownDone_[static_cast<size_t>(r)] < need) {
        waitingFor_ = r;
        return watch_.check(rank_, 0, t_, r, sig_, [&] { return loadAcq(doneOf(r)) >= need; });
      }
    }
    DataHdr* d = dataOf(rank_, seq_);
    size_t bytes = publishedBytes(op_);
    bool publishes = op_.coll != Coll::kBroadcast || rank_ == op_.root;
    if (publishes && bytes) memcpy(reinterpret_cast<char*>(d) + kPayloadOff, input_, bytes);
    d->bytes = publishes ? bytes : 0;
    d->mode = static_cast<uint32_t>(CallMode::kOneShot);
    d->sig = sig_;
    storeRel(&d->seq, seq_);
    phase_ = Phase::kWaitPeers;
    progressed_ = true;
    watch_.reset();
    if (tracePending_) {
      // Start fetching the first peer's line, then stamp and record while it travels.
      __builtin_prefetch(dataOf(rank_ == 0 ? 1 : 0, seq_));
      traceEvent_.t0 = traceEvent_.t1 = trace::ticks();
      ctx_->tracer().record(traceEvent_);
      tracePending_ = false;
    }
  }
  if (phase_ == Phase::kWaitPeers) {
    for (int r = 0; r < nranks_; ++r) {
      if (announced_[static_cast<size_t>(r)]) continue;
      // Fast path: the peer's data slot for this call (one line for tiny payloads).
      DataHdr* d = dataOf(r, seq_);
      if (loadAcq(&d->seq) == seq_) {
        if (!sigMatches(d->sig, sig_))
          return makeError(
              Code::kInvalidUsage,
              "rank %d and rank %d disagree on collective %llu: rank %d called %s but rank %d called %s (%s)", rank_, r,
              static_cast<unsigned long long>(sig_.seq), r, describeSig(d->sig).c_str(), rank_,
              describeSig(sig_).c_str(), diffSigs(d->sig, sig_).c_str());
        announced_[static_cast<size_t>(r)] = 1;
        progressed_ = true;
        continue;
      }
      // Not there: is the peer behind, or running something else?
      CallMode mode = CallMode::kNotYet;
      C4_CHECK(peerMode(r, sig_, &mode));
      if (mode == CallMode::kPassed && loadAcq(&dataOf(r, seq_)->seq) != seq_)
        return makeError(Code::kInvalidUsage,
                         "rank %d finished %s without publishing it for the one-shot path of rank %d: the ranks "
                         "disagree on this call",
                         r, describeSig(sig_).c_str(), rank_);
      if (mode != CallMode::kNotYet && mode != CallMode::kPassed && mode != CallMode::kOneShot)
        return makeError(Code::kInvalidUsage,
                         "rank %d runs %s through messages while rank %d uses the one-shot path: C4_ONESHOT_BYTES or "
                         "C4_ONESHOT_MAX_RANKS differ between ranks",
                         r, describeSig(sig_).c_str(), rank_);
      waitingFor_ = r;
      // A peer that publishes now, finishes the call and leaves while the check looks is no failure.
      return watch_.check(rank_, 0, t_, r, sig_, [&] { return loadAcq(&dataOf(r, seq_)->seq) == seq_; });
    }
    compute();
    // Every peer announced seq_, so each finished seq_ - 1.
    for (int r = 0; r < nranks_; ++r)
      knownDone_[static_cast<size_t>(r)] = std::max(knownDone_[static_cast<size_t>(r)], seq_ - 1);
    phase_ = Phase::kDone;
    progressed_ = true;
  }
  *done = phase_ == Phase::kDone;
  return Status::ok();
}

std::string OneShot::waitingOn() const {
  if (waitingFor_ < 0) return "ranks of the one-shot path";
  return strFormat(phase_ == Phase::kWaitReuse ? "rank %d (to finish the call before, one-shot path)"
                                               : "rank %d (to publish its input, one-shot path)",
                   waitingFor_);
}

void OneShot::compute() {
  const size_t es = dataTypeSize(op_.dtype);
  const size_t bytes = op_.count * es;
  auto payload = [this](int r) -> const char* { return reinterpret_cast<const char*>(dataOf(r, seq_)) + kPayloadOff; };
  char* out = static_cast<char*>(output_);
  switch (op_.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kReduceScatter: {
      if (op_.coll == Coll::kReduce && rank_ != op_.root) return;
      // Reduce in rank order from the published copies (never from recvbuff, which may alias
      // this rank's input), so every rank computes the same bits.
      size_t off = op_.coll == Coll::kReduceScatter ? static_cast<size_t>(rank_) * bytes : 0;
      if (nranks_ == 1) {
        memcpy(out, payload(0) + off, bytes);
        return;
      }
      kernels::reduce(out, payload(0) + off, payload(1) + off, op_.count, op_.dtype, kop_);
      for (int r = 2; r < nranks_; ++r) kernels::reduce(out, out, payload(r) + off, op_.count, op_.dtype, kop_);
      return;
    }
    case Coll::kAllGather:
      for (int r = 0; r < nranks_; ++r) {
        char* dst = out + static_cast<size_t>(r) * bytes;
        const char* src = r == rank_ ? static_cast<const char*>(input_) : payload(r);
        if (dst != src) memcpy(dst, src, bytes);
      }
      return;
    case Coll::kBroadcast: {
      const char* src = rank_ == op_.root ? static_cast<const char*>(input_) : payload(op_.root);
      if (out != src) memcpy(out, src, bytes);
      return;
    }
    default:
      return;
  }
}

}  // namespace c4
