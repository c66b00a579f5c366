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
#include "core/progress.hpp"
#include "core/zerocopy.hpp"
#include "gpu/gpu.hpp"

namespace c4 {

C4_PARAM_INT(RmaMapped, "C4_RMA_MAPPED", nullptr, 1, 0, 1, kParamSameOnAllRanks,
             "One-sided calls (ncclPutSignal) to ranks of the same host: 1 write through the mapping of the "
             "peer's window (ncclMemAlloc memory); 0 send them through the bootstrap's side channel, as to ranks "
             "of other hosts")
C4_PARAM_INT(RmaWindowBytes, "C4_RMA_WINDOW_BYTES", nullptr, 64 << 20, 4096, int64_t{1} << 40, kParamNone,
             "One-sided puts through the side channel (to ranks of other hosts) that one rank may have sent to "
             "another and that the target has not applied yet, in bytes; a put beyond waits for the target to "
             "apply (its waitSignal), up to C4_TIMEOUT. Bounds the target's buffer")

namespace {

constexpr uint32_t kTagRma = 0xC4A30001u;
constexpr uint32_t kTagRmaCredit = 0xC4A30002u;  // target -> sender: bytes applied so far (uint64_t)
constexpr uint32_t kRmaMagic = 0x52344d41u;      // "AM4R"
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
  int32_t ok;     // 1: the peers can reach the buffer (below)
  int32_t space;  // 0: host memory (ok: in one memAlloc allocation); 1: device memory (ok: CUDA IPC exports it)
  uint64_t process, addr;  // device memory: processToken() and the address in that process
  int32_t gpu;
  int32_t prepOk;  // 0: this rank could not get ready for a device window (its message is its own)
  gpu::IpcRef ipc;
};
static_assert(sizeof(Entry) == 160, "Entry has padding");

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
  sent_.assign(static_cast<size_t>(nranks), 0);
  credited_.assign(static_cast<size_t>(nranks), 0);
  applied_.assign(static_cast<size_t>(nranks), 0);
  creditSent_.assign(static_cast<size_t>(nranks), 0);
  mapped_ = paramRmaMapped() != 0;
  windowBytes_ = static_cast<uint64_t>(paramRmaWindowBytes());
  return Status::ok();
}

Status Rma::registerWindow(void* buff, size_t size, const Status& prep, void* reg, const OnPath& onPath, Window** out) {
  // The registration for collectives is the window's from here: deregistered on any failure.
  bool keepReg = false;
  struct DropReg {
    const RmaHost& h;
    void* reg;
    const OnPath& onPath;
    const bool& keep;
    ~DropReg() {
      if (reg != nullptr && !keep) (void)onPath([this] { return h.deregister(reg); });
    }
  } dropReg{h_, reg, onPath, keepReg};
  C4_CHECK(ensureSignalBlock(h_.nranks));
  Entry mine;
  memset(static_cast<void*>(&mine), 0, sizeof(mine));  // no padding (static_assert), but plainly zero
  const gpu::PtrInfo where = gpu::pointerInfo(buff);
  mine.prepOk = prep.isOk() ? 1 : 0;
  if (where.mem == gpu::Mem::kDevice) {
    mine.space = 1;
    mine.ok = prep.isOk() && gpu::ipcExport(buff, size, &mine.ipc) ? 1 : 0;
    mine.process = processToken();
    mine.addr = reinterpret_cast<uintptr_t>(buff);
    mine.gpu = where.device;
  } else {
    MemRef ref;
    mine.ok = memLookup(buff, size, &ref) ? 1 : 0;
    mine.winId = ref.id;
    mine.winFd = ref.fd;
    mine.winOff = ref.off;
  }
  mine.size = size;
  mine.sigId = sigRef_.id;
  mine.sigFd = sigRef_.fd;
  mine.sigOff = sigRef_.off;
  std::vector<Entry> all(static_cast<size_t>(h_.nranks));
  all[static_cast<size_t>(h_.rank)] = mine;
  Status st = h_.sideChannel->allGather(all.data(), sizeof(Entry));
  if (!st.isOk())
    return makeError(st.code(), "rank %d: window registration (collective: every rank registers): %s", h_.rank,
                     st.message().c_str());
  // Every rank decides from the same entries (and the same windows so far), so all fail alike.
  std::vector<int> bad, onDevice, onHost;
  for (int r = 0; r < h_.nranks; ++r) {
    const Entry& e = all[static_cast<size_t>(r)];
    if (!e.ok) bad.push_back(r);
    (e.space == 1 ? onDevice : onHost).push_back(r);
  }
  if (!onDevice.empty() && !onHost.empty())
    return makeError(Code::kInvalidArgument,
                     "rank %d: window registration: rank(s) %s registered device memory and rank(s) %s host memory; a "
                     "window's buffers are all CUDA device memory or all host memory",
                     h_.rank, rankList(onDevice).c_str(), rankList(onHost).c_str());
  const bool device = !onDevice.empty();
  if (!windows_.empty() && device != (deviceWindows_ > 0))
    return makeError(Code::kInvalidUsage,
                     "rank %d: window registration: this communicator's windows are on %s memory and this one is on %s "
                     "memory; one communicator's windows are all on device memory (their one-sided calls run in "
                     "stream order) or all on host memory (docs/cuda.md)",
                     h_.rank, deviceWindows_ > 0 ? "device" : "host", device ? "device" : "host");
  if (!bad.empty()) {
    if (!mine.prepOk)
      return makeError(prep.code(), "rank %d: window [%p, +%zu) on device memory: %s", h_.rank, buff, size,
                       prep.message().c_str());
    if (!mine.ok && device)
      return makeError(Code::kInvalidArgument,
                       "rank %d: window [%p, +%zu) is device memory that CUDA IPC cannot share; a window on device "
                       "memory takes cudaMalloc or ncclMemAlloc memory (not managed or cuMem/VMM memory)",
                       h_.rank, buff, size);
    if (!mine.ok && where.mem == gpu::Mem::kPinned)
      return makeError(Code::kInvalidArgument,
                       "rank %d: window [%p, +%zu) is pinned host memory not from memAlloc (ncclMemAlloc): the other "
                       "ranks could not reach it",
                       h_.rank, buff, size);
    if (!mine.ok)
      return makeError(Code::kInvalidArgument,
                       "rank %d: window [%p, +%zu) does not lie in one buffer from memAlloc (ncclMemAlloc): the other "
                       "ranks could not reach it",
                       h_.rank, buff, size);
    return makeError(Code::kInvalidArgument,
                     "rank %d: window registration failed on rank(s) %s: their buffers cannot be reached by the other "
                     "ranks (host memory not from memAlloc, or device memory CUDA IPC cannot share)",
                     h_.rank, rankList(bad).c_str());
  }
  auto w = std::make_unique<Window>();
  w->id = nextWindowId_++;
  w->base = buff;
  w->size = size;
  w->device = device;
  for (const Entry& e : all) {
    Window::Peer p;
    p.ref = winRef(e);
    p.size = e.size;
    p.ipc = e.ipc;
    p.process = e.process;
    p.addr = e.addr;
    p.gpu = e.gpu;
    w->peers.push_back(p);
  }
  // Collectives on a device window's memory keep the peers' mappings between calls, as for
  // commRegister (`reg`, made before the exchange).
  w->reg = reg;
  bool remote = false;
  for (int p = 0; p < h_.nranks; ++p) remote |= viaNetwork(p);
  C4_CHECK(onPath([&] {
    if (peerSig_.empty())
      for (const Entry& e : all) peerSig_.push_back(sigRef(e));
    if (device) {
      ++deviceWindows_;
      if (remote) remoteDevice_.store(true);
    }
    windows_.push_back(std::move(w));
    return Status::ok();
  }));
  keepReg = true;
  *out = windows_.back().get();
  C4_INFO(kLogInit, "rank %d: window %p registered (%zu bytes of %s memory, %zu windows)", h_.rank, buff, size,
          device ? "device" : "host", windows_.size());
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

Status Rma::deregisterWindow(Window* w, const OnPath& onPath) {
  C4_CHECK(checkWindow("windowDeregister", w));
  // Collective. What the peers of the side channel sent before they got here is applied first: each
  // sends a fence after its puts on the same ordered channel, and this rank waits for every fence.
  Status st;
  ++fencesSent_;
  bool remote = false;
  for (int p = 0; p < h_.nranks && st.isOk(); ++p) {
    if (p == h_.rank || !viaNetwork(p)) continue;
    remote = true;
    st = sendRemote(p, kKindFence, 0, 0, nullptr, 0);
  }
  const int64_t start = detail::nowNs();
  for (int p = 0; remote && st.isOk() && p < h_.nranks; ++p) {
    if (p == h_.rank || !viaNetwork(p)) continue;
    for (;;) {
      st = drainRemote();
      if (!st.isOk() || fencesFrom(p) >= fencesSent_) break;
      st = h_.failure();
      if (!st.isOk()) break;
      if ((detail::nowNs() - start) / 1000000 > h_.timeoutMs) {
        st = makeError(Code::kTimeout, "rank %d: window deregistration: rank %d did not deregister within %lld ms",
                       h_.rank, p, static_cast<long long>(h_.timeoutMs));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Once every rank is here, no put into this window is in flight any more. Every rank says which
  // window it deregisters: ranks that deregister windows in different orders would otherwise each
  // drop a different one, and a rank would go on putting into a buffer its owner freed.
  if (st.isOk()) {
    std::vector<uint32_t> ids(static_cast<size_t>(h_.nranks), 0);
    ids[static_cast<size_t>(h_.rank)] = w->id;
    st = h_.sideChannel->allGather(ids.data(), sizeof(uint32_t));
    if (!st.isOk())
      st = makeError(st.code(), "rank %d: window deregistration (collective: every rank deregisters): %s", h_.rank,
                     st.message().c_str());
    for (int p = 0; st.isOk() && p < h_.nranks; ++p) {
      if (ids[static_cast<size_t>(p)] == w->id) continue;
      // The same answer on every rank; nothing is deregistered, so the program may deregister
      // again in the right order.
      return makeError(
          Code::kInvalidUsage,
          "rank %d: window deregistration: this rank deregisters window #%u but rank %d deregisters window #%u "
          "(numbered in registration order); every rank must deregister the same window in the same "
          "order (none was deregistered)",
          h_.rank, w->id, p, ids[static_cast<size_t>(p)]);
    }
  }
  // Whatever happened: this rank closes its CUDA IPC mappings of the peers' registered buffers (the
  // windows' among them; the others are opened again when next needed), deregisters its buffer
  // for collectives (answering the peers' deregistrations while it waits for their answers), and
  // forgets the window.
  const bool device = w->device;
  Status local = onPath([&] {
    Status first;
    if (device) {
      if (h_.gate()) h_.gate()->ipcCloseRegistered(-1);
      first = h_.deregister(w->reg);
      --deviceWindows_;
    }
    windows_.erase(std::find_if(windows_.begin(), windows_.end(), [w](const auto& p) { return p.get() == w; }));
    return first;
  });
  // The second barrier: once it returns, no peer holds a mapping of this rank's buffer, which may
  // then be freed.
  if (device && st.isOk()) {
    st = h_.sideChannel->barrier();
    if (!st.isOk())
      st = makeError(st.code(), "rank %d: window deregistration (collective: every rank deregisters): %s", h_.rank,
                     st.message().c_str());
  }
  return st.isOk() ? local : st;
}

uint64_t Rma::fencesFrom(int peer) {
  std::lock_guard<std::mutex> g(drainMu_);
  return fencesSeen_[static_cast<size_t>(peer)];
}

Status Rma::checkPeer(const char* fn, int peer) const {
  if (peer < 0 || peer >= h_.nranks)
    return makeError(Code::kInvalidArgument, "%s: peer %d is not a rank of the communicator (0..%d)", fn, peer,
                     h_.nranks - 1);
  if (sigBlock_ == nullptr)
    return makeError(Code::kInvalidUsage, "%s: no window was registered on this communicator yet", fn);
  return Status::ok();
}

bool Rma::viaNetwork(int peer) const {
  if (peer == h_.rank) return false;
  if (!mapped_) return true;
  const RankInfo& me = h_.ranks[static_cast<size_t>(h_.rank)];
  const RankInfo& them = h_.ranks[static_cast<size_t>(peer)];
  // A rank of this process, or one whose pid this process can use (same host and pid namespace),
  // is mapped; another pid namespace of this host (a container beside ours) is like another host.
  return them.process != me.process && visiblePid(me, them) == 0;
}

Status Rma::awaitCredit(int peer, uint64_t bytes) {
  const size_t sp = static_cast<size_t>(peer);
  const uint64_t window = windowBytes_;
  const int64_t start = detail::nowNs();
  for (uint32_t round = 0;; ++round) {
    // What the peers put here meanwhile is applied (and credited) while this rank waits: two ranks
    // that both put more than a window to each other before they wait would otherwise wait for
    // each other's credit until the timeout.
    if (round > 0) C4_CHECK(drainRemote());
    std::vector<std::pair<int, std::vector<char>>> credits;
    h_.sideChannel->take(kTagRmaCredit, &credits);
    for (const auto& [from, msg] : credits) {
      uint64_t applied = 0;
      if (from < 0 || from >= h_.nranks || msg.size() != sizeof(applied)) continue;
      memcpy(&applied, msg.data(), sizeof(applied));
      // Cumulative, so a late or repeated one changes nothing; never more than was sent.
      if (applied > credited_[static_cast<size_t>(from)] && applied <= sent_[static_cast<size_t>(from)])
        credited_[static_cast<size_t>(from)] = applied;
    }
    const uint64_t inFlight = sent_[sp] - credited_[sp];
    // A put larger than the window goes once nothing else is in flight.
    if (inFlight == 0 || inFlight + bytes <= window) return Status::ok();
    C4_CHECK(h_.failure());
    const int64_t waitedMs = (detail::nowNs() - start) / 1000000;
    if (waitedMs > h_.timeoutMs)
      return makeError(Code::kTimeout,
                       "rank %d: one-sided put to rank %d: %llu bytes sent through the side channel are not applied "
                       "there after %lld ms (C4_RMA_WINDOW_BYTES=%llu): it does not wait for signals (C4_TIMEOUT)",
                       h_.rank, peer, static_cast<unsigned long long>(inFlight), static_cast<long long>(waitedMs),
                       static_cast<unsigned long long>(window));
    if (round < 200) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

Status Rma::sendRemote(int peer, uint32_t kind, uint32_t window, uint64_t offset, const void* data, size_t bytes) {
  // Back-pressure: the target buffers what arrives until it applies it (its waitSignal); at most
  // C4_RMA_WINDOW_BYTES from this rank, which waits here for room (credits the target sends back).
  // Fences carry no data and must never wait (deregistration sends them to every rank first).
  const uint64_t cost = kind == kKindFence ? 0 : bytes + sizeof(RmaHdr);
  if (cost > 0) C4_CHECK(awaitCredit(peer, cost));
  RmaHdr h{kRmaMagic, kind, window, 0, offset, bytes};
  Status st = h_.sideChannel->sendParts(peer, kTagRma, &h, sizeof(h), data, bytes, h_.timeoutMs);
  if (!st.isOk())
    return makeError(st.code(), "rank %d: one-sided message to rank %d: %s", h_.rank, peer, st.message().c_str());
  sent_[static_cast<size_t>(peer)] += cost;
  return Status::ok();
}

Status Rma::drainRemote() {
  std::lock_guard<std::mutex> g(drainMu_);
  std::vector<std::pair<int, std::vector<char>>> msgs;
  h_.sideChannel->take(kTagRma, &msgs);
  auto* slots = static_cast<char*>(sigBlock_);
  for (auto& [from, msg] : msgs) {
    RmaHdr h;
    if (from < 0 || from >= h_.nranks || msg.size() < sizeof(h))
      return makeError(Code::kRemoteError, "rank %d: a malformed one-sided message (%zu bytes) from rank %d", h_.rank,
                       msg.size(), from);
    memcpy(&h, msg.data(), sizeof(h));
    if (h.magic != kRmaMagic || msg.size() - sizeof(h) != h.bytes)
      return makeError(Code::kRemoteError, "rank %d: a malformed one-sided message from rank %d", h_.rank, from);
    if (h.kind == kKindFence) {
      ++fencesSeen_[static_cast<size_t>(from)];
      continue;
    }
    applied_[static_cast<size_t>(from)] += h.bytes + sizeof(RmaHdr);
    if (h.kind == kKindPut && h.bytes > 0) {
      const Window* w = findWindow(h.window);
      if (w == nullptr || h.offset > w->size || h.bytes > w->size - h.offset)
        return makeError(Code::kRemoteError,
                         "rank %d: rank %d put %llu bytes at offset %llu of window %u, which this rank does not hold "
                         "(or not that far)",
                         h_.rank, from, static_cast<unsigned long long>(h.bytes),
                         static_cast<unsigned long long>(h.offset), h.window);
      C4_CHECK(writeLocal(w, h.offset, msg.data() + sizeof(h), h.bytes));
    } else if (h.kind != kKindPut && h.kind != kKindSignal) {
      return makeError(Code::kRemoteError, "rank %d: a one-sided message of unknown kind %u from rank %d", h_.rank,
                       h.kind, from);
    }
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(slots + static_cast<size_t>(from) * kSlotBytes), 1,
                       __ATOMIC_RELEASE);
  }
  // Tell each sender how much of what it sent is applied once that is a quarter of its window more
  // than last told (cumulative, so a lost or late one is made good by the next).
  const uint64_t quarter = windowBytes_ / 4;
  for (int p = 0; p < h_.nranks; ++p) {
    const size_t sp = static_cast<size_t>(p);
    // A quarter of the window, or whatever is owed once nothing more came (a sender may wait for less).
    const uint64_t owed = applied_[sp] - creditSent_[sp];
    if (owed == 0 || (owed < quarter && !msgs.empty())) continue;
    Status st = h_.sideChannel->send(p, kTagRmaCredit, &applied_[sp], sizeof(uint64_t), h_.timeoutMs);
    if (!st.isOk())
      return makeError(st.code(), "rank %d: telling rank %d that its puts are applied: %s", h_.rank, p,
                       st.message().c_str());
    creditSent_[sp] = applied_[sp];
  }
  return Status::ok();
}

Status Rma::resolve(int peer, const MemRef& ref, uint64_t extra, size_t bytes, char** out) {
  MemRef at = ref;
  at.off += extra;
  const RankInfo& owner = h_.ranks[static_cast<size_t>(peer)];
  Status st = maps_.resolve(PeerProcess{visiblePid(h_.ranks[static_cast<size_t>(h_.rank)], owner), owner.process}, at,
                            bytes, out);
  if (!st.isOk())
    return makeError(st.code(), "rank %d: cannot map rank %d's memory: %s", h_.rank, peer, st.message().c_str());
  return Status::ok();
}

Status Rma::writeLocal(const Window* w, size_t offset, const void* src, size_t bytes) {
  char* to = static_cast<char*>(w->base) + offset;
  if (!w->device) {
    memcpy(to, src, bytes);
    return Status::ok();
  }
  Status st = h_.gate()->copySync(to, src, bytes);
  if (!st.isOk())
    return makeError(st.code(), "rank %d: a one-sided put into this rank's device window: %s", h_.rank,
                     st.message().c_str());
  return Status::ok();
}

Status Rma::checkPut(size_t bytes, int peer, const Window* w, size_t offset) const {
  C4_CHECK(checkWindow("putSignal", w));
  C4_CHECK(checkPeer("putSignal", peer));
  const Window::Peer& dst = w->peers[static_cast<size_t>(peer)];
  if (offset > dst.size || bytes > dst.size - offset)
    return makeError(Code::kInvalidArgument,
                     "putSignal: %zu bytes at offset %zu do not fit rank %d's window of %llu bytes", bytes, offset,
                     peer, static_cast<unsigned long long>(dst.size));
  return Status::ok();
}

Status Rma::put(const void* src, size_t bytes, int peer, const Window* w, size_t offset) {
  C4_CHECK(checkPut(bytes, peer, w, offset));
  const Window::Peer& dst = w->peers[static_cast<size_t>(peer)];
  if (viaNetwork(peer)) return sendRemote(peer, kKindPut, w->id, offset, src, bytes);
  if (bytes > 0) {
    char* to = nullptr;
    C4_CHECK(resolve(peer, dst.ref, offset, bytes, &to));
    memcpy(to, src, bytes);
  }
  return signal(peer);
}

Status Rma::resolveDevice(int peer, const Window* w, size_t offset, size_t bytes, char** out) {
  const Window::Peer& dst = w->peers[static_cast<size_t>(peer)];
  if (peer == h_.rank) {
    *out = static_cast<char*>(w->base) + offset;
    return Status::ok();
  }
  Status st;
  if (dst.process == processToken()) {
    // A rank of this process: its address is valid here, once this GPU may reach its GPU.
    st = h_.gate()->peerAccess(dst.gpu);
    *out = reinterpret_cast<char*>(dst.addr) + offset;
  } else {
    gpu::IpcRef at = dst.ipc;
    at.off += offset;
    st = h_.gate()->ipcOpen(peer, at, bytes, out, /*registered=*/true);
  }
  if (!st.isOk())
    return makeError(st.code(),
                     "rank %d: cannot map rank %d's device window for a put (%s); with GPUs that cannot reach each "
                     "other set C4_RMA_MAPPED=0 (puts through host memory)",
                     h_.rank, peer, st.message().c_str());
  return Status::ok();
}

Status Rma::putDevice(const void* src, size_t bytes, int peer, const Window* w, size_t offset) {
  C4_CHECK(checkPut(bytes, peer, w, offset));
  // Through the side channel `src` is host memory: staged by the stream (api.cc) or pinned.
  if (viaNetwork(peer)) return sendRemote(peer, kKindPut, w->id, offset, src, bytes);
  if (bytes > 0) {
    char* to = nullptr;
    C4_CHECK(resolveDevice(peer, w, offset, bytes, &to));
    Status st = h_.gate()->copySync(to, src, bytes);
    if (!st.isOk())
      return makeError(st.code(), "rank %d: a put into rank %d's device window: %s", h_.rank, peer,
                       st.message().c_str());
  }
  // The copy is done (copySync waited for it): the peer that sees the signal sees the data.
  return signal(peer);
}

Status Rma::signal(int peer) {
  C4_CHECK(checkPeer("signal", peer));
  if (viaNetwork(peer)) return sendRemote(peer, kKindSignal, 0, 0, nullptr, 0);
  char* slot = nullptr;
  C4_CHECK(resolve(peer, peerSig_[static_cast<size_t>(peer)], static_cast<uint64_t>(h_.rank) * kSlotBytes,
                   sizeof(uint64_t), &slot));
  // Release: the peer that sees the new count (acquire) sees the data copied before it.
  __atomic_fetch_add(reinterpret_cast<uint64_t*>(slot), 1, __ATOMIC_RELEASE);
  return Status::ok();
}

Status Rma::checkWait(int n, const int* peers, const int* counts, std::vector<uint64_t>* target) const {
  if (sigBlock_ == nullptr)
    return makeError(Code::kInvalidUsage, "waitSignal: no window was registered on this communicator yet");
  for (int i = 0; i < n; ++i) {
    if (peers[i] < 0 || peers[i] >= h_.nranks)
      return makeError(Code::kInvalidArgument, "waitSignal: descriptor %d: peer %d is not a rank (0..%d)", i, peers[i],
                       h_.nranks - 1);
    if (counts[i] < 0)
      return makeError(Code::kInvalidArgument, "waitSignal: descriptor %d: count %d is negative", i, counts[i]);
  }
  if (target) {
    target->assign(static_cast<size_t>(h_.nranks), 0);
    for (int i = 0; i < n; ++i) (*target)[static_cast<size_t>(peers[i])] += static_cast<uint64_t>(counts[i]);
  }
  return Status::ok();
}

Status Rma::wait(int n, const int* peers, const int* counts) {
  std::vector<uint64_t> target;
  C4_CHECK(checkWait(n, peers, counts, &target));
  auto* slots = static_cast<char*>(sigBlock_);
  auto have = [&](int p) {
    return __atomic_load_n(reinterpret_cast<uint64_t*>(slots + static_cast<size_t>(p) * kSlotBytes), __ATOMIC_ACQUIRE);
  };
  const int64_t start = detail::nowNs();
  uint32_t rounds = 0;
  for (int p = 0; p < h_.nranks; ++p) {
    const size_t sp = static_cast<size_t>(p);
    if (target[sp] == 0) continue;
    const uint64_t want = consumed_[sp] + target[sp];
    const bool remote = viaNetwork(p);
    while (have(p) < want) {
      if (remote) {
        C4_CHECK(drainRemote());
        if (have(p) >= want) break;
      }
      ++rounds;
      if (rounds < 2000) continue;  // spin first: a same-host put lands within microseconds
      if ((rounds & 63) == 0) {
        C4_CHECK(h_.failure());
        const int64_t waitedMs = (detail::nowNs() - start) / 1000000;
        if (waitedMs > h_.timeoutMs)
          return makeError(Code::kTimeout,
                           "rank %d: waitSignal: waited %lld ms for %llu signal(s) from rank %d, %llu arrived "
                           "(C4_TIMEOUT)",
                           h_.rank, static_cast<long long>(waitedMs), static_cast<unsigned long long>(target[sp]), p,
                           static_cast<unsigned long long>(have(p) - consumed_[sp]));
      }
      if (rounds < 20000) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  for (int p = 0; p < h_.nranks; ++p) consumed_[static_cast<size_t>(p)] += target[static_cast<size_t>(p)];
  return Status::ok();
}

Status Rma::waitDevice(int n, const int* peers, const int* counts, void* stream) {
  std::vector<uint64_t> target;
  C4_CHECK(checkWait(n, peers, counts, &target));
  PendingWait w;
  for (int p = 0; p < h_.nranks; ++p)
    if (target[static_cast<size_t>(p)] > 0)
      w.want.emplace_back(p, consumed_[static_cast<size_t>(p)] + target[static_cast<size_t>(p)]);
  if (w.want.empty()) return Status::ok();
  C4_CHECK(h_.gate()->waitFlag(stream, &w.flag));
  // The stream waits from here: the signals are consumed now (call order, as waits consume them).
  for (const auto& [p, want] : w.want) consumed_[static_cast<size_t>(p)] = want;
  {
    std::lock_guard<std::mutex> g(pendingMu_);
    pending_.push_back(std::move(w));
    pendingCount_.store(pending_.size(), std::memory_order_relaxed);
  }
  if (h_.nudge) h_.nudge();  // it may sleep for up to its idle check: look now
  return Status::ok();
}

void Rma::pollDevice() {
  if (!devicePolling()) return;
  const int64_t now = detail::nowNs();
  if (remoteDevice_.load(std::memory_order_relaxed) && !h_.failed() && now - lastDrainNs_ > 50000) {
    lastDrainNs_ = now;
    Status st = drainRemote();
    if (!st.isOk()) (void)h_.fail(st);
  }
  std::lock_guard<std::mutex> g(pendingMu_);
  auto* slots = static_cast<char*>(sigBlock_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool done = h_.failed();
    // A stream is not a peer: the time counts from when the stream got to the wait.
    if (!done && it->startNs == 0 && h_.gate()->flagReached(it->flag)) it->startNs = now;
    if (!done) {
      done = true;
      for (const auto& [p, want] : it->want) {
        const uint64_t have =
            __atomic_load_n(reinterpret_cast<uint64_t*>(slots + static_cast<size_t>(p) * kSlotBytes), __ATOMIC_ACQUIRE);
        if (have >= want) continue;
        done = false;
        const int64_t waitedMs = it->startNs == 0 ? 0 : (now - it->startNs) / 1000000;
        if (waitedMs > h_.timeoutMs) {
          // The stream goes on (its work after the wait sees no data); the error is the communicator's.
          (void)h_.fail(makeError(Code::kTimeout,
                                  "rank %d: waitSignal (in stream order): waited %lld ms for signals from rank %d "
                                  "(%llu have come from it so far, the wait needs %llu) (C4_TIMEOUT)",
                                  h_.rank, static_cast<long long>(waitedMs), p, static_cast<unsigned long long>(have),
                                  static_cast<unsigned long long>(want)));
          done = true;
        }
        break;
      }
    }
    if (done) {
      h_.gate()->setFlag(it->flag);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  pendingCount_.store(pending_.size(), std::memory_order_relaxed);
}

}  // namespace c4
