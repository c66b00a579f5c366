#include "core/rma.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "common/clock.hpp"
#include "common/logging.hpp"
#include "common/params.hpp"
#include "common/status.hpp"
#include "core/comm.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

C4_PARAM_INT(RmaMapped, "C4_RMA_MAPPED", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "One-sided calls (ncclPutSignal) to ranks of the same host: 1 write through the mapping of the "
             "peer's window (ncclMemAlloc memory); 0 send them through the bootstrap's side channel, as to ranks "
             "of other hosts")

namespace {

constexpr uint32_t kTagRma = 0xC4A30001u;
constexpr uint32_t kRmaMagic = 0x52344d41u;  // "AM4R"
enum : uint32_t { kKindPut = 1, kKindSignal = 2, kKindFence = 3 };

/// The header of a one-sided message on the side channel; a put's data follows it.
struct RmaHdr {
  uint32_t magic;
  uint32_t kind;
  uint32_t window;  // Window::id
  uint32_t pad;
  uint64_t offset;
  uint64_t bytes;
};
static_assert(sizeof(RmaHdr) == 32, "RmaHdr has padding");

/// What each rank contributes to a registration (the bootstrap's allGather): where its buffer and
/// its signal block lie. Plain fields without padding, so nothing uninitialized goes on the wire.
struct Entry {
  uint64_t winId, winOff, size;
  uint64_t sigId, sigOff;
  int32_t winFd, sigFd;
  int32_t ok;  // 1: the buffer lies in one memAlloc allocation
  int32_t pad;
};
static_assert(sizeof(Entry) == 56, "Entry has padding");

MemRef winRef(const Entry& e) { return MemRef{e.winId, e.winFd, e.winOff}; }
MemRef sigRef(const Entry& e) { return MemRef{e.sigId, e.sigFd, e.sigOff}; }

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ...";
  return s;
}

}  // namespace

Rma::~Rma() {
  if (sigBlock_ != nullptr) (void)memFreeShared(sigBlock_);
}

Status Rma::ensureSignalBlock(int nranks) {
  if (sigBlock_ != nullptr) return Status::ok();
  C4_CHECK(memAllocShared(&sigBlock_, static_cast<size_t>(nranks) * kSlotBytes, /*internal=*/true));
  if (!memLookup(sigBlock_, static_cast<size_t>(nranks) * kSlotBytes, &sigRef_)) {
    (void)memFreeShared(sigBlock_);
    sigBlock_ = nullptr;
    return makeError(Code::kInternalError, "window: the signal block is not shareable");
  }
  consumed_.assign(static_cast<size_t>(nranks), 0);
  fencesSeen_.assign(static_cast<size_t>(nranks), 0);
  mapped_ = paramRmaMapped() != 0;
  return Status::ok();
}

Status Rma::registerWindow(Comm* c, void* buff, size_t size, Window** out) {
  C4_CHECK(ensureSignalBlock(c->nranks));
  Entry mine;
  memset(&mine, 0, sizeof(mine));
  MemRef ref;
  mine.ok = memLookup(buff, size, &ref) ? 1 : 0;
  mine.winId = ref.id;
  mine.winFd = ref.fd;
  mine.winOff = ref.off;
  mine.size = size;
  mine.sigId = sigRef_.id;
  mine.sigFd = sigRef_.fd;
  mine.sigOff = sigRef_.off;
  std::vector<Entry> all(static_cast<size_t>(c->nranks));
  all[static_cast<size_t>(c->rank)] = mine;
  Status st = c->bootstrap->allGather(all.data(), sizeof(Entry));
  if (!st.isOk())
    return makeError(st.code(), "rank %d: window registration (collective: every rank registers): %s", c->rank,
                     st.message().c_str());
  std::vector<int> bad;
  for (int r = 0; r < c->nranks; ++r)
    if (!all[static_cast<size_t>(r)].ok) bad.push_back(r);
  if (!bad.empty()) {
    if (!mine.ok && gpu::pointerInfo(buff).mem != gpu::Mem::kHost)
      return makeError(
          Code::kInvalidUsage,
          "rank %d: window [%p, +%zu) is CUDA memory (%s); windows and one-sided calls work on host memory "
          "from memAlloc only, not yet on device memory (docs/cuda.md)",
          c->rank, buff, size, gpu::memName(gpu::pointerInfo(buff).mem));
    if (!mine.ok)
      return makeError(Code::kInvalidArgument,
                       "rank %d: window [%p, +%zu) does not lie in one buffer from memAlloc (ncclMemAlloc): the other "
                       "ranks could not reach it",
                       c->rank, buff, size);
    return makeError(Code::kInvalidArgument,
                     "rank %d: window registration failed on rank(s) %s: their buffers do not lie in one buffer from "
                     "memAlloc (ncclMemAlloc)",
                     c->rank, rankList(bad).c_str());
  }
  if (peerSig_.empty())
    for (const Entry& e : all) peerSig_.push_back(sigRef(e));
  auto w = std::make_unique<Window>();
  w->id = nextWindowId_++;
  w->base = buff;
  w->size = size;
  for (const Entry& e : all) w->peers.push_back(Window::Peer{winRef(e), e.size});
  windows_.push_back(std::move(w));
  *out = windows_.back().get();
  C4_INFO(kLogInit, "rank %d: window %p registered (%zu bytes, %zu windows)", c->rank, buff, size, windows_.size());
  return Status::ok();
}

Status Rma::checkWindow(const char* fn, const Window* w) const {
  if (w == nullptr) return makeError(Code::kInvalidArgument, "%s: window is NULL", fn);
  for (const auto& mine : windows_)
    if (mine.get() == w) return Status::ok();
  return makeError(Code::kInvalidArgument,
                   "%s: window %p was not registered on this communicator (or was deregistered already)", fn,
                   static_cast<const void*>(w));
}

Window* Rma::findWindow(uint32_t id) const {
  for (const auto& w : windows_)
    if (w->id == id) return w.get();
  return nullptr;
}

Status Rma::deregisterWindow(Comm* c, Window* w) {
  C4_CHECK(checkWindow("windowDeregister", w));
  // Collective. What the peers of the side channel sent before they got here is applied first: each
  // sends a fence after its puts on the same ordered channel, and this rank waits for every fence.
  ++fencesSent_;
  bool remote = false;
  for (int p = 0; p < c->nranks; ++p) {
    if (p == c->rank || !viaNetwork(c, p)) continue;
    remote = true;
    C4_CHECK(sendRemote(c, p, kKindFence, 0, 0, nullptr, 0));
  }
  const int64_t start = detail::nowNs();
  for (int p = 0; remote && p < c->nranks; ++p) {
    if (p == c->rank || !viaNetwork(c, p)) continue;
    while (fencesSeen_[static_cast<size_t>(p)] < fencesSent_) {
      C4_CHECK(drainRemote(c));
      if (fencesSeen_[static_cast<size_t>(p)] >= fencesSent_) break;
      C4_CHECK(c->failure());
      if ((detail::nowNs() - start) / 1000000 > c->timeoutMs)
        return makeError(Code::kTimeout, "rank %d: window deregistration: rank %d did not deregister within %lld ms",
                         c->rank, p, static_cast<long long>(c->timeoutMs));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Once every rank is here, no put into this window is in flight any more.
  Status st = c->bootstrap->barrier();
  if (!st.isOk())
    return makeError(st.code(), "rank %d: window deregistration (collective: every rank deregisters): %s", c->rank,
                     st.message().c_str());
  windows_.erase(std::find_if(windows_.begin(), windows_.end(), [w](const auto& p) { return p.get() == w; }));
  return Status::ok();
}

Status Rma::checkPeer(const char* fn, Comm* c, int peer) const {
  if (peer < 0 || peer >= c->nranks)
    return makeError(Code::kInvalidArgument, "%s: peer %d is not a rank of the communicator (0..%d)", fn, peer,
                     c->nranks - 1);
  if (sigBlock_ == nullptr)
    return makeError(Code::kInvalidUsage, "%s: no window was registered on this communicator yet", fn);
  return Status::ok();
}

bool Rma::viaNetwork(const Comm* c, int peer) const {
  if (peer == c->rank) return false;
  if (!mapped_) return true;
  return c->peers[static_cast<size_t>(peer)].hostId != c->peers[static_cast<size_t>(c->rank)].hostId;
}

Status Rma::sendRemote(Comm* c, int peer, uint32_t kind, uint32_t window, uint64_t offset, const void* data,
                       size_t bytes) {
  RmaHdr h{kRmaMagic, kind, window, 0, offset, bytes};
  Status st = c->bootstrap->sendParts(peer, kTagRma, &h, sizeof(h), data, bytes, c->timeoutMs);
  if (!st.isOk())
    return makeError(st.code(), "rank %d: one-sided message to rank %d: %s", c->rank, peer, st.message().c_str());
  return Status::ok();
}

Status Rma::drainRemote(Comm* c) {
  std::vector<std::pair<int, std::vector<char>>> msgs;
  c->bootstrap->take(kTagRma, &msgs);
  auto* slots = static_cast<char*>(sigBlock_);
  for (auto& [from, msg] : msgs) {
    RmaHdr h;
    if (from < 0 || from >= c->nranks || msg.size() < sizeof(h))
      return makeError(Code::kRemoteError, "rank %d: a malformed one-sided message (%zu bytes) from rank %d", c->rank,
                       msg.size(), from);
    memcpy(&h, msg.data(), sizeof(h));
    if (h.magic != kRmaMagic || msg.size() - sizeof(h) != h.bytes)
      return makeError(Code::kRemoteError, "rank %d: a malformed one-sided message from rank %d", c->rank, from);
    if (h.kind == kKindFence) {
      ++fencesSeen_[static_cast<size_t>(from)];
      continue;
    }
    if (h.kind == kKindPut && h.bytes > 0) {
      const Window* w = findWindow(h.window);
      if (w == nullptr || h.offset > w->size || h.bytes > w->size - h.offset)
        return makeError(Code::kRemoteError,
                         "rank %d: rank %d put %llu bytes at offset %llu of window %u, which this rank does not hold "
                         "(or not that far)",
                         c->rank, from, static_cast<unsigned long long>(h.bytes),
                         static_cast<unsigned long long>(h.offset), h.window);
      memcpy(static_cast<char*>(w->base) + h.offset, msg.data() + sizeof(h), h.bytes);
    } else if (h.kind != kKindPut && h.kind != kKindSignal) {
      return makeError(Code::kRemoteError, "rank %d: a one-sided message of unknown kind %u from rank %d", c->rank,
                       h.kind, from);
    }
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(slots + static_cast<size_t>(from) * kSlotBytes), 1,
                       __ATOMIC_RELEASE);
  }
  return Status::ok();
}

Status Rma::resolve(Comm* c, int peer, const MemRef& ref, uint64_t extra, size_t bytes, char** out) {
  MemRef at = ref;
  at.off += extra;
  Status st = maps_.resolve(c->peers[static_cast<size_t>(peer)].pid, at, bytes, out);
  if (!st.isOk())
    return makeError(st.code(), "rank %d: cannot map rank %d's memory: %s", c->rank, peer, st.message().c_str());
  return Status::ok();
}

Status Rma::put(Comm* c, const void* src, size_t bytes, int peer, const Window* w, size_t offset) {
  C4_CHECK(checkWindow("putSignal", w));
  C4_CHECK(checkPeer("putSignal", c, peer));
  const Window::Peer& dst = w->peers[static_cast<size_t>(peer)];
  if (offset > dst.size || bytes > dst.size - offset)
    return makeError(Code::kInvalidArgument,
                     "putSignal: %zu bytes at offset %zu do not fit rank %d's window of %llu bytes", bytes, offset,
                     peer, static_cast<unsigned long long>(dst.size));
  if (viaNetwork(c, peer)) return sendRemote(c, peer, kKindPut, w->id, offset, src, bytes);
  if (bytes > 0) {
    char* to = nullptr;
    C4_CHECK(resolve(c, peer, dst.ref, offset, bytes, &to));
    memcpy(to, src, bytes);
  }
  return signal(c, peer);
}

Status Rma::signal(Comm* c, int peer) {
  C4_CHECK(checkPeer("signal", c, peer));
  if (viaNetwork(c, peer)) return sendRemote(c, peer, kKindSignal, 0, 0, nullptr, 0);
  char* slot = nullptr;
  C4_CHECK(resolve(c, peer, peerSig_[static_cast<size_t>(peer)], static_cast<uint64_t>(c->rank) * kSlotBytes,
                   sizeof(uint64_t), &slot));
  // Release: the peer that sees the new count (acquire) sees the data copied before it.
  __atomic_fetch_add(reinterpret_cast<uint64_t*>(slot), 1, __ATOMIC_RELEASE);
  return Status::ok();
}

Status Rma::wait(Comm* c, int n, const int* peers, const int* counts) {
  if (sigBlock_ == nullptr)
    return makeError(Code::kInvalidUsage, "waitSignal: no window was registered on this communicator yet");
  std::vector<uint64_t> target(static_cast<size_t>(c->nranks), 0);
  for (int i = 0; i < n; ++i) {
    const int p = peers[i];
    if (p < 0 || p >= c->nranks)
      return makeError(Code::kInvalidArgument, "waitSignal: descriptor %d: peer %d is not a rank (0..%d)", i, p,
                       c->nranks - 1);
    if (counts[i] < 0)
      return makeError(Code::kInvalidArgument, "waitSignal: descriptor %d: count %d is negative", i, counts[i]);
    target[static_cast<size_t>(p)] += static_cast<uint64_t>(counts[i]);
  }
  auto* slots = static_cast<char*>(sigBlock_);
  auto have = [&](int p) {
    return __atomic_load_n(reinterpret_cast<uint64_t*>(slots + static_cast<size_t>(p) * kSlotBytes), __ATOMIC_ACQUIRE);
  };
  const int64_t start = detail::nowNs();
  uint32_t rounds = 0;
  for (int p = 0; p < c->nranks; ++p) {
    const size_t sp = static_cast<size_t>(p);
    if (target[sp] == 0) continue;
    const uint64_t want = consumed_[sp] + target[sp];
    const bool remote = viaNetwork(c, p);
    while (have(p) < want) {
      if (remote) {
        C4_CHECK(drainRemote(c));
        if (have(p) >= want) break;
      }
      ++rounds;
      if (rounds < 2000) continue;  // spin first: a same-host put lands within microseconds
      if ((rounds & 63) == 0) {
        C4_CHECK(c->failure());
        const int64_t waitedMs = (detail::nowNs() - start) / 1000000;
        if (waitedMs > c->timeoutMs)
          return makeError(Code::kTimeout,
                           "rank %d: waitSignal: waited %lld ms for %llu signal(s) from rank %d, %llu arrived "
                           "(C4_TIMEOUT)",
                           c->rank, static_cast<long long>(waitedMs), static_cast<unsigned long long>(target[sp]), p,
                           static_cast<unsigned long long>(have(p) - consumed_[sp]));
      }
      if (rounds < 20000) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  for (int p = 0; p < c->nranks; ++p) consumed_[static_cast<size_t>(p)] += target[static_cast<size_t>(p)];
  return Status::ok();
}

}  // namespace c4
