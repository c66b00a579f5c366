// Transport conformance: every transport of the registry (transports/registry.hpp) must pass these,
// each skipped only where the transport declares it lacks the capability (Caps, or a capability
// interface it does not hand out: LaneSetup, LaneControl, ...). Ranks are forked
// processes; each creates the transport through its registry entry, as a communicator does.
//  - ordering and sizes: many messages in flight both ways, FIFO matching, guard bytes;
//  - receive with reduction (Caps::reduceOnRecv), in place and out of place, each byte once;
//  - signatures and sizes that disagree: kInvalidUsage naming both ranks and the difference;
//  - peek: the next message's signature and size, consuming nothing;
//  - memory spaces outside Caps::spaces are refused clearly; registration round-trips;
//  - bounded memory under back-pressure: a receiver that posts late holds a bounded amount;
//  - peers that die before any traffic, in the middle of a message, and after sending;
//  - abort: the peer's pending requests fail fast naming the rank and the reason;
//  - the capability interfaces offered agree with Caps and with each other;
//  - lane retirement (LaneControl) in the middle of a message loses nothing;
//  - a lane added by the lower rank (C4P's replacement) carries data both ways, with its plan.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "tests/shm/shm_test_util.hpp"
#include "transports/registry.hpp"

namespace c4::transport {
namespace {

using testing::checkPattern;
using testing::fillPattern;
using testing::ScopedEnv;
using testing::testSig;
using testing::waitAll;

/// Every transport of the registry, except ibverbs where this machine has no RDMA device: it runs
/// in the Soft-RoCE VM (tests/rdma-vm), whose ctest checks it passed there.
std::vector<std::string> registered() {
  std::vector<std::string> out;
  const bool rdma = system("test -n \"$(ls -A /sys/class/infiniband 2>/dev/null)\"") == 0;
  for (const TransportEntry& e : transportRegistry())
    if (std::string(e.name) != "ibverbs" || rdma) out.push_back(e.name);
  return out;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  const TransportEntry& entry() const { return *findTransport(GetParam()); }
};

/// Runs the ranks; every rank must return "" and exit, except `killed` (if >= 0), which must die of SIGKILL.
void runRanks(int n, const testing::Body& body, int limitSec = 120, int killed = -1) {
  auto st = testing::runForked(
      n,
      [&](int r, Oob& oob) {
        std::string e = body(r, oob);
        if (!e.empty()) fprintf(stderr, "rank %d: %s\n", r, e.c_str());
        return e.empty() ? 0 : 1;
      },
      limitSec);
  for (int r = 0; r < n; ++r) {
    if (r == killed)
      EXPECT_TRUE(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL) << "rank " << r << " wait status " << st[r];
    else
      EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r << " wait status " << st[r];
  }
}

/// Rank r's transport of the parameter's kind (all ranks on one host; tcp reaches them anyway).
std::unique_ptr<Transport> make(const TransportEntry& e, int r, int n, const std::string& tag, Oob& oob, Status* st,
                                int64_t timeoutMs = 60000) {
  Context c = testing::makeContext(r, n, tag, &oob, timeoutMs);
  c.authKey[0] = 0x0badc0ffee0ddf00ull;
  c.authKey[1] = 0x1234567890abcdefull;
  c.pids.assign(static_cast<size_t>(n), 0);
  std::unique_ptr<Transport> t;
  *st = e.create(c, &t);
  if (st->isOk() && t->laneSetup() != nullptr) *st = t->laneSetup()->startLanes();
  return t;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// Keeps a transport progressing for a moment, so that a peer still waiting for this rank's
/// acknowledgements gets them before this rank stops driving it.
Status settle(Transport* t) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until) C4_CHECK(t->progress());
  return Status::ok();
}

/// Resident set of this process in bytes.
size_t rssBytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

TEST_P(Conformance, OrderingSizesAndGuards) {
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 65537, (1u << 20) + 3, 5u << 20};
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const size_t kGuard = 64;
    std::vector<std::vector<unsigned char>> out(sizes.size()), in(sizes.size());
    std::vector<Request> s(sizes.size()), q(sizes.size());
    std::vector<Request*> all;
    // Everything posted at once, both ways: matching is FIFO per direction.
    for (size_t i = 0; i < sizes.size(); ++i) {
      out[i].resize(sizes[i]);
      in[i].assign(sizes[i] + kGuard, 0xa5);
      fillPattern(out[i].data(), sizes[i], static_cast<uint32_t>(r * 100 + i));
      REQUIRE_OK(c->isend(out[i].data(), sizes[i], testSig(i, sizes[i]), &s[i]));
      REQUIRE_OK(c->irecv(in[i].data(), sizes[i], testSig(i, sizes[i]), nullptr, &q[i]));
      all.push_back(&s[i]);
      all.push_back(&q[i]);
    }
    REQUIRE_OK(waitAll(t.get(), all));
    for (size_t i = 0; i < sizes.size(); ++i) {
      REQUIRE(checkPattern(in[i].data(), sizes[i], static_cast<uint32_t>((1 - r) * 100 + i)), "message %zu differs", i);
      for (size_t g = 0; g < kGuard; ++g) REQUIRE(in[i][sizes[i] + g] == 0xa5, "guard after message %zu hit", i);
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

TEST_P(Conformance, ReceiveWithReductionOncePerByte) {
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    if (!t->caps().reduceOnRecv) {
      // The executor receives into a bounce buffer instead; the transport must refuse a ReduceSpec
      // or do it right, never ignore it.
      REQUIRE_OK(oob.barrier());
      return "";
    }
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    for (size_t count : {size_t{1}, size_t{1000}, size_t{(3u << 20) / 4 + 7}}) {
      std::vector<int32_t> mine(count), acc(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(i * 3 + r), acc[i] = static_cast<int32_t>(i);
      // In place (local == dst): a piece reduced twice would show.
      ReduceSpec red{MemRef(acc.data()), DataType::kInt32, RedOp::kSum};
      Request s, q;
      const OpSig sig = testSig(count, count, Coll::kAllReduce, DataType::kInt32);
      REQUIRE_OK(c->isend(mine.data(), count * 4, sig, &s));
      REQUIRE_OK(c->irecv(acc.data(), count * 4, sig, &red, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      for (size_t i = 0; i < count; ++i)
        REQUIRE(acc[i] == static_cast<int32_t>(i * 3 + (1 - r) + i), "count %zu element %zu: %d", count, i, acc[i]);
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

TEST_P(Conformance, SignatureAndSizeMismatchNameBothRanks) {
  for (size_t bytes : {size_t{64}, size_t{300000}}) {
    for (int kind = 0; kind < 2; ++kind) {  // 0: signature (count) differs, 1: size differs
      const std::string tag = testing::freshTag();
      runRanks(2, [&](int r, Oob& oob) -> std::string {
        Status st;
        auto t = make(entry(), r, 2, tag, oob, &st);
        REQUIRE_OK(st);
        Connection* c = nullptr;
        REQUIRE_OK(t->connect(1 - r, &c));
        if (r == 1) {
          std::vector<char> buf(bytes);
          Request req;
          REQUIRE_OK(c->isend(buf.data(), bytes, testSig(5, bytes), &req));
          Status w = waitAll(t.get(), {&req}, 20000);
          // The send may complete before the receiver looks, or see the receiver's abort.
          if (!w.isOk()) REQUIRE(contains(w.message(), "rank 0"), "sender: %s", w.toString().c_str());
          REQUIRE_OK(oob.barrier());
          // A send the abort left pending (ucx fails it once UCX lets go of the buffer) is failed by
          // the transport's destruction: the request and the buffer must outlive it (found by ASan:
          // the transport wrote into a request whose scope had ended).
          t.reset();
          return "";
        }
        const std::string e = testing::receiveMismatched(t.get(), c, bytes, kind);
        if (!e.empty()) return e;
        t->abort("mismatch seen");
        REQUIRE_OK(oob.barrier());
        return "";
      });
    }
  }
}

TEST_P(Conformance, PeekSeesTheNextMessageAndConsumesNothing) {
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const size_t bytes = 200000;
    std::vector<char> buf(bytes);
    if (r == 1) {
      fillPattern(buf.data(), bytes, 9);
      Request s;
      REQUIRE_OK(c->isend(buf.data(), bytes, testSig(3, bytes / 4, Coll::kSend, DataType::kFloat32), &s));
      REQUIRE_OK(waitAll(t.get(), {&s}));
      REQUIRE_OK(oob.barrier());
      return "";
    }
    bool ready = false;
    OpSig sig;
    size_t n = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!ready) {
      REQUIRE_OK(t->progress());
      REQUIRE_OK(c->peek(&ready, &sig, &n));
      REQUIRE(std::chrono::steady_clock::now() < deadline, "nothing to peek");
    }
    REQUIRE(n == bytes && sig.count == bytes / 4 && sig.coll == static_cast<uint8_t>(Coll::kSend), "peek: %zu bytes",
            n);
    bool again = false;
    REQUIRE_OK(c->peek(&again, &sig, &n));
    REQUIRE(again && n == bytes, "a second peek sees it too");
    Request q;
    REQUIRE_OK(c->irecv(buf.data(), bytes, testSig(3, bytes / 4, Coll::kRecv, DataType::kFloat32), nullptr, &q));
    REQUIRE_OK(waitAll(t.get(), {&q}));
    REQUIRE(checkPattern(buf.data(), bytes, 9), "the peeked message differs");
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

TEST_P(Conformance, MemorySpacesAndRegistration) {
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const Caps caps = t->caps();
    REQUIRE(caps.spaces & spaceBit(MemSpace::kHost), "a transport must read host memory");
    char buf[64];
    for (MemSpace sp : {MemSpace::kCudaDevice, MemSpace::kCudaHost, MemSpace::kHostShared}) {
      if (caps.spaces & spaceBit(sp)) continue;
      Request q;
      Status e = c->isend(MemRef(buf, sp), sizeof(buf), testSig(0, 64), &q);
      REQUIRE(e.code() == Code::kInvalidUsage && contains(e.message(), memSpaceName(sp)), "send from %s memory: %s",
              memSpaceName(sp), e.toString().c_str());
    }
    std::unique_ptr<MemRegion> reg;
    REQUIRE_OK(t->registerMemory(buf, sizeof(buf), MemSpace::kHost, &reg));
    REQUIRE(reg && reg->covers(buf + 8, 32) && !reg->covers(buf + 60, 8), "registration covers its range");
    REQUIRE_OK(t->deregisterMemory(reg.get()));
    // The connection still works.
    Request s, q;
    char in[64];
    REQUIRE_OK(c->isend(buf, sizeof(buf), testSig(0, 64), &s));
    REQUIRE_OK(c->irecv(in, sizeof(in), testSig(0, 64), nullptr, &q));
    REQUIRE_OK(waitAll(t.get(), {&s, &q}));
    // Messages sent from inside a registration (without a copy where the transport can: ibverbs'
    // chunks leave from the caller's buffer) arrive intact, the registration reused call after call.
    const size_t big = (size_t{1} << 20) + 13;
    std::vector<char> src(big + 64), dst(big);
    fillPattern(src.data() + 32, big, static_cast<uint32_t>(40 + r));
    std::unique_ptr<MemRegion> reg2;
    REQUIRE_OK(t->registerMemory(src.data(), src.size(), MemSpace::kHost, &reg2));
    for (uint64_t k = 1; k <= 3; ++k) {
      Request s2, q2;
      REQUIRE_OK(c->isend(MemRef(src.data() + 32, MemSpace::kHost, reg2.get()), big, testSig(k, big), &s2));
      REQUIRE_OK(c->irecv(dst.data(), big, testSig(k, big), nullptr, &q2));
      REQUIRE_OK(waitAll(t.get(), {&s2, &q2}));
      REQUIRE(checkPattern(dst.data(), big, static_cast<uint32_t>(40 + (1 - r))),
              "message %d from a registration differs", static_cast<int>(k));
    }
    REQUIRE_OK(t->deregisterMemory(reg2.get()));
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// The capability interfaces a transport hands out agree with its Caps and with each other and answer
// sensibly; one it does not offer is nullptr (core then goes without it).
TEST_P(Conformance, OfferedCapabilitiesAgreeWithCaps) {
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const Caps caps = t->caps();
    REQUIRE((c->releasedSends() != nullptr) == caps.releasesSends, "detachSend offered: %d, Caps::releasesSends: %d",
            c->releasedSends() != nullptr, caps.releasesSends);
    REQUIRE((c->laneControl() != nullptr) == (t->laneSetup() != nullptr),
            "lane control on the connection (%d) without lane setup on the transport (%d), or the reverse",
            c->laneControl() != nullptr, t->laneSetup() != nullptr);
    if (LaneSetup* lanes = t->laneSetup()) {
      REQUIRE(!lanes->portAddresses().empty(), "a transport with lanes names no NIC port");
      REQUIRE(lanes->lanesPerConnection() >= 1, "%d lanes per connection", lanes->lanesPerConnection());
      REQUIRE(lanes->existingConnection(1 - r) == c, "existingConnection is not the connection connect() made");
      REQUIRE(lanes->existingConnection(r) == nullptr, "a connection to this rank itself");
      REQUIRE(!lanes->faultDrill(1 - r, 1000, LaneFault::kReset).isOk(), "a drill on a lane that does not exist");
    }
    if (WaitSource* w = t->waitSource()) REQUIRE(w->waitFd() >= 0, "a wait source without a descriptor");
    if (HostArena* a = t->hostArena()) {
      REQUIRE(a->arenaBytes() > 0 && a->arena(r) != nullptr && a->arena(1 - r) != nullptr, "no arena of a rank here");
      REQUIRE(a->arena(2) == nullptr && a->arena(-1) == nullptr, "an arena of a rank that does not exist");
    }
    if (const RateMeter* m = c->rateMeter()) {
      uint64_t bytes = 1, ns = 1;
      m->receiveRate(&bytes, &ns);
      REQUIRE(bytes == 0 && ns == 0, "a fresh connection measured %llu bytes in %llu ns",
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(ns));
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// The receiver posts nothing for a while as the sender posts 256 MiB: the receiver holds a bounded
// amount (what the transport buffers for receives not posted yet), the sender is held back (its
// isend may answer "queue full"), and once the receives are posted everything arrives intact.
TEST_P(Conformance, BoundedMemoryUnderBackPressure) {
  ScopedEnv unexp("C4_TCP_UNEXPECTED_BYTES", "16777216");
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const int kMsgs = 64;
    const size_t kBytes = 4u << 20;
    std::vector<char> data(kBytes);
    std::vector<Request> reqs(kMsgs);
    std::vector<Request*> all;
    if (r == 0) {
      fillPattern(data.data(), kBytes, 5);
      int posted = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (std::chrono::steady_clock::now() < until) {
        if (posted < kMsgs) {
          Status s = c->isend(data.data(), kBytes, testSig(static_cast<uint64_t>(posted), kBytes), &reqs[posted]);
          if (s.isOk()) {
            all.push_back(&reqs[posted]);
            ++posted;
          } else {
            REQUIRE(isQueueFull(s), "isend: %s", s.toString().c_str());
          }
        }
        REQUIRE_OK(t->progress());
      }
      REQUIRE_OK(oob.barrier());  // the receiver measures, then posts
      for (; posted < kMsgs;) {
        Status s = c->isend(data.data(), kBytes, testSig(static_cast<uint64_t>(posted), kBytes), &reqs[posted]);
        if (s.isOk()) {
          all.push_back(&reqs[posted]);
          ++posted;
        } else {
          REQUIRE(isQueueFull(s), "isend: %s", s.toString().c_str());
          REQUIRE_OK(t->progress());
        }
      }
      REQUIRE_OK(waitAll(t.get(), all, 120000));
      REQUIRE_OK(oob.barrier());
      return "";
    }
    const size_t before = rssBytes();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < until) REQUIRE_OK(t->progress());
    const size_t grew = rssBytes() > before ? rssBytes() - before : 0;
    REQUIRE(grew < (96u << 20), "the receiver buffered %zu MiB for receives not posted yet", grew >> 20);
    REQUIRE_OK(oob.barrier());
    std::vector<std::vector<char>> in(kMsgs);
    for (int i = 0; i < kMsgs; ++i) {
      in[i].resize(kBytes);
      REQUIRE_OK(c->irecv(in[i].data(), kBytes, testSig(static_cast<uint64_t>(i), kBytes), nullptr, &reqs[i]));
      all.push_back(&reqs[i]);
    }
    REQUIRE_OK(waitAll(t.get(), all, 120000));
    for (int i = 0; i < kMsgs; ++i) REQUIRE(checkPattern(in[i].data(), kBytes, 5), "message %d differs", i);
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// A peer that dies (SIGKILL) before any traffic, in the middle of a message, or right after its
// send: the survivor's pending request fails naming the peer, long before the transport's timeout
// (60 s), and no completed request holds partial data.
TEST_P(Conformance, PeerDiesAtEachPhase) {
  for (int phase = 0; phase < 3; ++phase) {
    const std::string tag = testing::freshTag();
    runRanks(
        2,
        [&](int r, Oob& oob) -> std::string {
          Status st;
          auto t = make(entry(), r, 2, tag, oob, &st);
          REQUIRE_OK(st);
          Connection* c = nullptr;
          REQUIRE_OK(t->connect(1 - r, &c));
          // Both ends up first (one small exchange).
          char b[8] = {0};
          Request s0, q0;
          REQUIRE_OK(c->isend(b, 8, testSig(0, 8), &s0));
          REQUIRE_OK(c->irecv(b, 8, testSig(0, 8), nullptr, &q0));
          REQUIRE_OK(waitAll(t.get(), {&s0, &q0}));
          const size_t bytes = 64u << 20;
          std::vector<char> buf(bytes);
          if (r == 1) {
            if (phase == 0) raise(SIGKILL);
            fillPattern(buf.data(), bytes, 21);
            Request s;
            REQUIRE_OK(c->isend(buf.data(), bytes, testSig(1, bytes), &s));
            if (phase == 1) {
              for (int i = 0; i < 50; ++i) REQUIRE_OK(t->progress());
              raise(SIGKILL);
            }
            // phase 2: the first message is on its way whole; the peer waits for a second one.
            (void)waitAll(t.get(), {&s}, 5000);
            raise(SIGKILL);
          }
          Request q1, q2;
          std::vector<char> tail(16);
          REQUIRE_OK(c->irecv(buf.data(), bytes, testSig(1, bytes), nullptr, &q1));
          REQUIRE_OK(c->irecv(tail.data(), tail.size(), testSig(2, tail.size()), nullptr, &q2));
          const auto t0 = std::chrono::steady_clock::now();
          Status w = waitAll(t.get(), {&q1, &q2}, 30000);
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          REQUIRE(!w.isOk(), "phase %d: completed without the peer", phase);
          REQUIRE(contains(w.message(), "rank 1"), "phase %d: %s", phase, w.message().c_str());
          REQUIRE(secs < 20, "phase %d: took %.1f s", phase, secs);
          REQUIRE(q2.state == Request::kFailed, "phase %d: the second receive completed", phase);
          // The big message may have reached the kernel whole before the kill: then it is complete
          // and intact; otherwise it failed. Never complete with part of it.
          REQUIRE(q1.state == Request::kFailed || checkPattern(buf.data(), bytes, 21),
                  "phase %d: a message completed with data that differs", phase);
          return "";
        },
        120, /*killed=*/1);
  }
}

TEST_P(Conformance, AbortFailsThePeerFastNamingRankAndReason) {
  const std::string tag = testing::freshTag();
  runRanks(3, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 3, tag, oob, &st);
    REQUIRE_OK(st);
    char buf[64] = {0};
    Connection* c = nullptr;
    if (r == 1) {
      Connection* c0 = nullptr;
      Connection* c2 = nullptr;
      REQUIRE_OK(t->connect(0, &c0));
      REQUIRE_OK(t->connect(2, &c2));
      // Up and known to both peers before the abort.
      Request a, b, x, y;
      REQUIRE_OK(c0->isend(buf, 8, testSig(0, 8), &a));
      REQUIRE_OK(c2->isend(buf, 8, testSig(0, 8), &b));
      REQUIRE_OK(c0->irecv(buf, 8, testSig(0, 8), nullptr, &x));
      REQUIRE_OK(c2->irecv(buf, 8, testSig(0, 8), nullptr, &y));
      REQUIRE_OK(waitAll(t.get(), {&a, &b, &x, &y}));
      Request mine;
      REQUIRE_OK(c2->irecv(buf, sizeof(buf), testSig(1, 64), nullptr, &mine));
      REQUIRE_OK(oob.barrier());
      t->abort("boom from the test");
      REQUIRE(mine.state == Request::kFailed && contains(mine.error.message(), "boom from the test"),
              "own request: state %d %s", mine.state, mine.error.toString().c_str());
      REQUIRE(!t->progress().isOk(), "progress ok after abort");
      Request later;
      REQUIRE(!c0->isend(buf, 8, testSig(2, 8), &later).isOk(), "isend accepted after abort");
      REQUIRE_OK(oob.barrier());
      return "";
    }
    REQUIRE_OK(t->connect(1, &c));
    Request a, x;
    REQUIRE_OK(c->isend(buf, 8, testSig(0, 8), &a));
    REQUIRE_OK(c->irecv(buf, 8, testSig(0, 8), nullptr, &x));
    REQUIRE_OK(waitAll(t.get(), {&a, &x}));
    Request req;
    REQUIRE_OK(c->irecv(buf, sizeof(buf), testSig(1, 64), nullptr, &req));
    REQUIRE_OK(oob.barrier());
    const auto t0 = std::chrono::steady_clock::now();
    Status w = waitAll(t.get(), {&req}, 20000);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(w.code() == Code::kRemoteError && contains(w.message(), "rank 1") && contains(w.message(), "boom"), "%s",
            w.toString().c_str());
    REQUIRE(ms < 5000, "abort took %.0f ms to arrive", ms);
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// LaneControl: retiring a lane in the middle of a message (both directions) loses nothing.
TEST_P(Conformance, LaneRetiredMidMessageLosesNothing) {
  ScopedEnv lanes("C4_LANES", "3");
  ScopedEnv piece("C4_TCP_PIECE_BYTES", "65536");
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    LaneControl* lanesOf = c->laneControl();
    REQUIRE((lanesOf != nullptr) == (t->laneSetup() != nullptr),
            "a transport's connections have lane control where it has lane setup, and only there");
    if (lanesOf == nullptr) {
      // Both connected before either closes its transport (ucx over shared memory attaches the
      // peer's segment when it connects: a peer whose worker is gone cannot be connected).
      REQUIRE_OK(oob.barrier());
      return "";
    }
    const size_t bytes = 24u << 20;
    std::vector<char> out(bytes), in(bytes);
    fillPattern(out.data(), bytes, static_cast<uint32_t>(r + 11));
    Request s, q;
    REQUIRE_OK(c->isend(out.data(), bytes, testSig(0, bytes), &s));
    REQUIRE_OK(c->irecv(in.data(), bytes, testSig(0, bytes), nullptr, &q));
    for (int i = 0; i < 30; ++i) REQUIRE_OK(t->progress());
    if (r == 0) REQUIRE_OK(lanesOf->retireLane(1, "conformance: retired mid-message"));
    Status w = waitAll(t.get(), {&s, &q}, 20000);
    REQUIRE(w.isOk(), "%s; %s", w.toString().c_str(), c->describeState().c_str());
    REQUIRE(checkPattern(in.data(), bytes, static_cast<uint32_t>(1 - r + 11)), "message differs");
    // The next message goes over the lanes left.
    Request s2, q2;
    REQUIRE_OK(c->isend(out.data(), 1 << 20, testSig(1, 1 << 20), &s2));
    REQUIRE_OK(c->irecv(in.data(), 1 << 20, testSig(1, 1 << 20), nullptr, &q2));
    REQUIRE_OK(waitAll(t.get(), {&s2, &q2}));
    REQUIRE(c->lane(1)->state() == LaneState::kRetired, "lane 1 is %s at rank %d", laneStateName(c->lane(1)->state()),
            r);
    // The peer may still need acknowledgements of re-sent pieces from this rank.
    REQUIRE_OK(settle(t.get()));
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// LaneControl: a lane added after a retirement (C4P's replacement, opened by the lower rank with
// its plan) comes up at both ends and carries data both ways; the higher rank cannot add one. Over
// ibverbs a first attempt fails at the opener, and both ends still number the next lane alike.
TEST_P(Conformance, AddedLaneCarriesDataBothWays) {
  ScopedEnv lanes("C4_LANES", "2");
  ScopedEnv piece("C4_TCP_PIECE_BYTES", "65536");
  const std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = make(entry(), r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    int idx = -1;
    LaneControl* lanesOf = c->laneControl();
    if (lanesOf == nullptr) {
      REQUIRE_OK(oob.barrier());  // as in LaneRetiredMidMessageLosesNothing
      return "";
    }
    const size_t n = 2u << 20;
    std::vector<char> out(n), in(n);
    uint64_t seq = 0;
    auto exchange = [&]() -> std::string {
      fillPattern(out.data(), n, static_cast<uint32_t>(r * 1000 + seq));
      Request s, q;
      REQUIRE_OK(c->isend(out.data(), n, testSig(seq, n), &s));
      REQUIRE_OK(c->irecv(in.data(), n, testSig(seq, n), nullptr, &q));
      Status w = waitAll(t.get(), {&s, &q}, 20000);
      REQUIRE(w.isOk(), "message %llu: %s; %s", static_cast<unsigned long long>(seq), w.toString().c_str(),
              c->describeState().c_str());
      REQUIRE(checkPattern(in.data(), n, static_cast<uint32_t>((1 - r) * 1000 + seq)), "message %llu differs",
              static_cast<unsigned long long>(seq));
      ++seq;
      return "";
    };
    std::string e = exchange();
    if (!e.empty()) return e;
    const int before = c->numLanes();
    REQUIRE(before >= 2, "%d lanes", before);
    if (r == 1)
      REQUIRE(lanesOf->addLane(LanePlan{}, &idx).code() == Code::kInvalidUsage, "the higher rank added a lane");
    // ibverbs: the first lane added fails at the opener (C4_IB_FAULT_ADD_LANE: its queue pair is not
    // made); both ends book that index retired, so the next one is numbered alike at both ends.
    const bool failFirst = GetParam() == "ibverbs";
    const int added = before + (failFirst ? 1 : 0);
    if (r == 0) {
      REQUIRE_OK(lanesOf->retireLane(0, "conformance: replaced"));
      LanePlan plan;
      plan.sourcePort = 50123;  // RoCE: through the flow label; tcp: a port to bind (or the next free)
      plan.sourcePortLo = 50100;
      plan.sourcePortHi = 50199;
      plan.label = "conformance path";
      if (failFirst) {
        {
          ScopedEnv fault("C4_IB_FAULT_ADD_LANE", "1");
          REQUIRE(!lanesOf->addLane(plan, &idx).isOk(), "the lane meant to fail was added");
        }
        // Until the peer answered the booking, another add waits ("still being added").
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        Status a;
        while (!(a = lanesOf->addLane(plan, &idx)).isOk()) {
          REQUIRE(a.code() == Code::kInvalidUsage && std::chrono::steady_clock::now() < until, "addLane: %s",
                  a.toString().c_str());
          REQUIRE_OK(t->progress());
        }
      } else {
        REQUIRE_OK(lanesOf->addLane(plan, &idx));
      }
      REQUIRE(idx == added, "new lane index %d, expected %d", idx, added);
    }
    // The new lane joins as soon as both ends have it: messages keep flowing meanwhile.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      e = exchange();
      if (!e.empty()) return e;
      const LaneSnapshot snap = c->numLanes() > added ? c->lane(added)->snapshot() : LaneSnapshot{};
      if (snap.state == LaneState::kUp && snap.bytesSent > n / 4 && snap.bytesRecv > n / 4) break;
      REQUIRE(std::chrono::steady_clock::now() < deadline,
              "rank %d: lane %d carried nothing both ways after %llu messages (%d lanes; %s, %llu sent, %llu received)",
              r, added, static_cast<unsigned long long>(seq), c->numLanes(), laneStateName(snap.state),
              static_cast<unsigned long long>(snap.bytesSent), static_cast<unsigned long long>(snap.bytesRecv));
    }
    REQUIRE(c->numLanes() == added + 1, "%d lanes at rank %d", c->numLanes(), r);
    if (failFirst)
      REQUIRE(c->lane(before)->state() == LaneState::kRetired, "the lane that failed at the opener is %s at rank %d",
              laneStateName(c->lane(before)->state()), r);
    // It leaves from the source port its plan asked for (RoCE: both directions; tcp: the opener's).
    const std::string local = c->lane(added)->snapshot().localAddr;
    if (GetParam() == "ibverbs") {
      REQUIRE(local.find("udp 50123") != std::string::npos, "rank %d: the added lane is %s", r, local.c_str());
    } else if (r == 0) {
      const int port = atoi(local.c_str() + local.rfind(':') + 1);
      REQUIRE(port >= 50100 && port <= 50199, "the added lane left from %s", local.c_str());
    }
    REQUIRE(c->lane(0)->state() == LaneState::kRetired, "lane 0 is %s at rank %d", laneStateName(c->lane(0)->state()),
            r);
    REQUIRE_OK(settle(t.get()));
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

INSTANTIATE_TEST_SUITE_P(Registry, Conformance, ::testing::ValuesIn(registered()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace c4::transport
