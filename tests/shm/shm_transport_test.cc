// Tests of the shm transport with ranks as threads (same pid: memcpy single copy) and as forked
// processes (CMA), with single copy on and off (C4_SHM_CMA=0: everything streams through the ring).
#include "transports/shm/shm_transport.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "shm_test_util.hpp"

namespace c4::transport {
namespace {

using testing::Body;
using testing::checkPattern;
using testing::fillPattern;
using testing::makeContext;
using testing::ScopedEnv;
using testing::testSig;
using testing::waitAll;

enum class Mode { kThreads, kForked };

void runRanks(Mode mode, int n, const Body& body) {
  if (mode == Mode::kThreads) {
    std::vector<std::string> errs(n);
    testing::runThreads(n, [&](int r, Oob& oob) { errs[r] = body(r, oob); });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errs[r], "") << "rank " << r;
  } else {
    auto st = testing::runForked(n, [&](int r, Oob& oob) {
      std::string e = body(r, oob);
      if (!e.empty()) fprintf(stderr, "rank %d: %s\n", r, e.c_str());
      return e.empty() ? 0 : 1;
    });
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r << " wait status " << st[r];
  }
}

size_t slotPayload() { return static_cast<size_t>(paramShmSlotBytes()) - 64; }
size_t cmaThreshold() { return static_cast<size_t>(paramShmCmaThreshold()); }

std::unique_ptr<Transport> create(int r, int n, const std::string& tag, Oob& oob, Status* st,
                                  int64_t timeoutMs = 60000) {
  std::unique_ptr<Transport> t;
  *st = createShmTransport(makeContext(r, n, tag, &oob, timeoutMs), &t);
  return t;
}

uint32_t seedOf(int src, int dst, int i, size_t bytes) {
  return static_cast<uint32_t>(src * 1000003 + dst * 7919 + i * 31 + bytes);
}

struct ModeParam {
  Mode mode;
  bool singleCopy;
};
std::string modeName(const ::testing::TestParamInfo<ModeParam>& p) {
  return std::string(p.param.mode == Mode::kThreads ? "Threads" : "Forked") +
         (p.param.singleCopy ? "SingleCopy" : "RingOnly");
}

class ShmModes : public ::testing::TestWithParam<ModeParam> {
 protected:
  void SetUp() override {
    env_ = std::make_unique<ScopedEnv>("C4_SHM_CMA", GetParam().singleCopy ? "1" : "0");
    // Fixed protocol sizes, so the boundary cases below (slot size, single-copy threshold) are
    // exercised on both sides whatever the defaults are.
    slotEnv_ = std::make_unique<ScopedEnv>("C4_SHM_SLOT_BYTES", "32768");
    cmaEnv_ = std::make_unique<ScopedEnv>("C4_SHM_CMA_THRESHOLD", "32768");
    localEnv_ = std::make_unique<ScopedEnv>("C4_SHM_LOCAL_COPY_THRESHOLD", "32768");
    tag_ = testing::freshTag();
  }
  void TearDown() override {
    EXPECT_TRUE(testing::shmLeftovers(tag_).empty()) << "segments left in /dev/shm for tag " << tag_;
  }
  std::unique_ptr<ScopedEnv> env_, slotEnv_, cmaEnv_, localEnv_;
  std::string tag_;
};

// Ping-pong and a short stream for every boundary size.
TEST_P(ShmModes, PingPongAndStreamsAcrossBoundaries) {
  const size_t p = slotPayload(), thr = cmaThreshold();
  std::vector<size_t> sizes = {0, 1, 8, p - 1, p, p + 1, 2 * p + 7, thr - 1, thr, thr + 1, (1u << 20) + 3, 64u << 20};
  std::string tag = tag_;
  runRanks(GetParam().mode, 2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    uint64_t seq = 0;
    for (size_t bytes : sizes) {
      std::vector<char> buf(bytes + 1), got(bytes + 1);
      // Ping-pong: 0 -> 1, then 1 -> 0 (the echo).
      for (int leg = 0; leg < 2; ++leg, ++seq) {
        int src = leg == 0 ? 0 : 1;
        Request req;
        if (r == src) {
          fillPattern(buf.data(), bytes, seedOf(src, 1 - src, static_cast<int>(seq), bytes));
          REQUIRE_OK(c->isend(buf.data(), bytes, testSig(seq, bytes), &req));
        } else {
          got[bytes] = 0x5a;  // guard byte must survive
          REQUIRE_OK(c->irecv(got.data(), bytes, testSig(seq, bytes), nullptr, &req));
        }
        REQUIRE_OK(waitAll(t.get(), {&req}));
        if (r != src) {
          REQUIRE(checkPattern(got.data(), bytes, seedOf(src, 1 - src, static_cast<int>(seq), bytes)),
                  "ping-pong of %zu bytes: data differs", bytes);
          REQUIRE(got[bytes] == 0x5a, "ping-pong of %zu bytes wrote past the end", bytes);
        }
      }
      // Stream: several messages in flight from rank 0 to rank 1.
      if (bytes <= (1u << 20) + 3) {
        const int k = 6;
        std::vector<std::vector<char>> bufs(k, std::vector<char>(bytes));
        std::vector<Request> reqs(k);
        std::vector<Request*> ptrs;
        for (int i = 0; i < k; ++i) {
          ptrs.push_back(&reqs[i]);
          uint32_t seed = seedOf(0, 1, static_cast<int>(seq + i), bytes);
          if (r == 0) {
            fillPattern(bufs[i].data(), bytes, seed);
            REQUIRE_OK(c->isend(bufs[i].data(), bytes, testSig(seq + i, bytes), &reqs[i]));
          } else {
            REQUIRE_OK(c->irecv(bufs[i].data(), bytes, testSig(seq + i, bytes), nullptr, &reqs[i]));
          }
        }
        REQUIRE_OK(waitAll(t.get(), ptrs));
        if (r == 1)
          for (int i = 0; i < k; ++i)
            REQUIRE(checkPattern(bufs[i].data(), bytes, seedOf(0, 1, static_cast<int>(seq + i), bytes)),
                    "stream message %d of %zu bytes differs", i, bytes);
        seq += k;
      }
    }
    return "";
  });
}

// Every rank sends to and receives from every other rank (itself included), all posted at once;
// FIFO order is checked through per-message patterns.
TEST_P(ShmModes, ManyMessagesInFlightBothDirections) {
  const size_t p = slotPayload(), thr = cmaThreshold();
  const std::vector<size_t> sizes = {0, 1, 100, p + 1, 3 * p, thr + 1, 200000, 8};
  const int n = GetParam().mode == Mode::kThreads ? 8 : 3;
  const int perPeer = GetParam().mode == Mode::kThreads ? 24 : 40;
  std::string tag = tag_;
  runRanks(GetParam().mode, n, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, n, tag, oob, &st);
    REQUIRE_OK(st);
    std::vector<std::vector<char>> sbuf, rbuf;
    std::vector<Request> reqs(2 * n * perPeer);
    std::vector<Request*> ptrs;
    sbuf.reserve(n * perPeer);
    rbuf.reserve(n * perPeer);
    int k = 0;
    for (int i = 0; i < perPeer; ++i) {
      for (int d = 0; d < n; ++d) {
        int peer = (r + d) % n;
        Connection* c = nullptr;
        REQUIRE_OK(t->connect(peer, &c));
        size_t sb = sizes[(i + r) % sizes.size()], rb = sizes[(i + peer) % sizes.size()];
        sbuf.emplace_back(sb);
        fillPattern(sbuf.back().data(), sb, seedOf(r, peer, i, sb));
        REQUIRE_OK(c->isend(sbuf.back().data(), sb, testSig(i, sb), &reqs[k]));
        ptrs.push_back(&reqs[k++]);
        rbuf.emplace_back(rb);
        REQUIRE_OK(c->irecv(rbuf.back().data(), rb, testSig(i, rb), nullptr, &reqs[k]));
        ptrs.push_back(&reqs[k++]);
      }
    }
    REQUIRE_OK(waitAll(t.get(), ptrs, 120000));
    int m = 0;
    for (int i = 0; i < perPeer; ++i)
      for (int d = 0; d < n; ++d, ++m) {
        int peer = (r + d) % n;
        size_t rb = sizes[(i + peer) % sizes.size()];
        REQUIRE(checkPattern(rbuf[m].data(), rb, seedOf(peer, r, i, rb)), "message %d from rank %d (%zu B) differs", i,
                peer, rb);
      }
    return "";
  });
}

// Receive with reduction for float sum and int32 max, in place (local == dst) and not, for sizes
// that take the eager, multi-slot and single-copy (staged) paths.
TEST_P(ShmModes, ReceiveWithReduction) {
  const size_t p = slotPayload(), thr = cmaThreshold();
  const std::vector<size_t> counts = {1, 7, p / 4 - 1, p / 4 + 1, 3 * p / 4 + 5, thr / 4 + 1, (3u << 20) / 4 + 13};
  std::string tag = tag_;
  runRanks(GetParam().mode, 2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    uint64_t seq = 0;
    for (size_t count : counts) {
      for (int variant = 0; variant < 4; ++variant, ++seq) {
        bool isFloat = variant < 2, inPlace = variant % 2 == 0;
        DataType dt = isFloat ? DataType::kFloat32 : DataType::kInt32;
        OpSig sig = testSig(seq, count, Coll::kAllReduce, dt);
        size_t bytes = count * 4;
        Request req;
        if (r == 1) {
          std::vector<char> src(bytes);
          for (size_t i = 0; i < count; ++i) {
            if (isFloat) {
              float v = static_cast<float>((i * 7 + seq) % 1000);
              memcpy(src.data() + 4 * i, &v, 4);
            } else {
              int32_t v = static_cast<int32_t>((i * 13 + seq) % 2001) - 1000;
              memcpy(src.data() + 4 * i, &v, 4);
            }
          }
          REQUIRE_OK(c->isend(src.data(), bytes, sig, &req));
          REQUIRE_OK(waitAll(t.get(), {&req}));
          continue;
        }
        std::vector<char> local(bytes), dst(bytes + 4, 0);
        for (size_t i = 0; i < count; ++i) {
          if (isFloat) {
            float v = static_cast<float>(i % 500) * 0.5f;
            memcpy(local.data() + 4 * i, &v, 4);
          } else {
            int32_t v = static_cast<int32_t>((i * 17) % 1501) - 750;
            memcpy(local.data() + 4 * i, &v, 4);
          }
        }
        std::vector<char> localCopy = local;
        ReduceSpec red;
        red.dtype = dt;
        red.op = isFloat ? RedOp::kSum : RedOp::kMax;
        char* out = inPlace ? local.data() : dst.data();
        red.local = local.data();
        REQUIRE_OK(c->irecv(out, bytes, sig, &red, &req));
        REQUIRE_OK(waitAll(t.get(), {&req}));
        for (size_t i = 0; i < count; ++i) {
          if (isFloat) {
            float a, b;
            memcpy(&a, localCopy.data() + 4 * i, 4);
            memcpy(&b, out + 4 * i, 4);
            float expect = a + static_cast<float>((i * 7 + seq) % 1000);
            REQUIRE(b == expect, "float sum count %zu elem %zu: %g vs %g (inPlace %d)", count, i, b, expect, inPlace);
          } else {
            int32_t a, b;
            memcpy(&a, localCopy.data() + 4 * i, 4);
            memcpy(&b, out + 4 * i, 4);
            int32_t expect = std::max(a, static_cast<int32_t>((i * 13 + seq) % 2001) - 1000);
            REQUIRE(b == expect, "int32 max count %zu elem %zu: %d vs %d (inPlace %d)", count, i, b, expect, inPlace);
          }
        }
        if (!inPlace) REQUIRE(memcmp(local.data(), localCopy.data(), bytes) == 0, "local was modified");
      }
    }
    return "";
  });
}

// Receive-and-forward (irecvForward) along 0 -> 1 -> 2: rank 1 forwards every message, plain or
// reduced, in place or not, to rank 2. Rings of two slots, so pieces trickle. In the first round
// rank 2 receives at once and rank 1 writes most pieces to dst and to rank 2 in the same pass; in
// the second rank 2 starts late, so rank 1's ring to it fills and forwards fall back to sending
// pieces after the receive wrote them, and back. Some forwards queue behind a plain send; rank 0
// offers single copy for every other message, so forwards also follow receives that pull. Rank
// 1's results and rank 2's copies must be exact.
TEST_P(ShmModes, ForwardedReceivesArriveWholeWhateverTheRingDoes) {
  const size_t p = slotPayload();
  const std::vector<size_t> sizes = {4, p - 4, p, p + 4, 3 * p + 8, (1u << 20) + 4};
  // Within one process a message above the local copy threshold goes by single copy unless that
  // is off, and a forward cannot be one; between processes a forward always streams.
  const bool singleLocal = GetParam().mode == Mode::kThreads && GetParam().singleCopy;
  std::string tag = tag_;
  auto dataOf = [](size_t m, size_t i) { return static_cast<int32_t>((i * 7 + m * 131) % 100003); };
  auto localOf = [](size_t m, size_t i) { return static_cast<int32_t>((i * 5 + m) % 65521) - 30000; };
  ScopedEnv slots("C4_SHM_SLOTS", "2");
  runRanks(GetParam().mode, 3, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 3, tag, oob, &st);
    REQUIRE_OK(st);
    // Messages m = round * perRound + 2 * size index + (0: plain, 1: reduced int32 sum); every
    // third one at rank 1 follows an extra 100-byte send to rank 2.
    const size_t perRound = 2 * sizes.size(), nmsg = 2 * perRound;
    auto bytesOf = [&](size_t m) { return sizes[m % perRound / 2]; };
    auto reduced = [](size_t m) { return m % 2 == 1; };
    auto extra = [](size_t m) { return m % 3 == 1; };
    auto sigIn = [&](size_t m) { return testSig(m, bytesOf(m), Coll::kAllReduce, DataType::kInt32); };
    auto sigOut = [&](size_t m) { return testSig(1000 + m, bytesOf(m), Coll::kAllReduce, DataType::kInt32); };
    std::vector<std::vector<char>> bufs(nmsg), extras(nmsg);
    std::vector<Request> reqs(2 * nmsg), extraReqs(nmsg);
    std::vector<Request*> all;
    if (r == 0) {
      Connection* c = nullptr;
      REQUIRE_OK(t->connect(1, &c));
      for (size_t m = 0; m < nmsg; ++m) {
        bufs[m].resize(bytesOf(m));
        for (size_t i = 0; i < bytesOf(m) / 4; ++i) {
          const int32_t v = dataOf(m, i);
          memcpy(bufs[m].data() + 4 * i, &v, 4);
        }
        REQUIRE_OK(c->isend(bufs[m].data(), bytesOf(m), sigIn(m), &reqs[m], SendHint{m % 4 < 2}));
        all.push_back(&reqs[m]);
      }
      REQUIRE_OK(waitAll(t.get(), all));
      return "";
    }
    if (r == 2) {
      Connection* c = nullptr;
      REQUIRE_OK(t->connect(1, &c));
      for (size_t m = 0; m < nmsg; ++m) {
        if (m == perRound) {
          REQUIRE_OK(waitAll(t.get(), all));
          usleep(100000);  // let rank 1's ring to us fill up
        }
        if (extra(m)) {
          extras[m].resize(100);
          REQUIRE_OK(c->irecv(extras[m].data(), 100, testSig(2000 + m, 100), nullptr, &extraReqs[m]));
          all.push_back(&extraReqs[m]);
        }
        bufs[m].resize(bytesOf(m));
        REQUIRE_OK(c->irecv(bufs[m].data(), bytesOf(m), sigOut(m), nullptr, &reqs[m]));
        all.push_back(&reqs[m]);
      }
      REQUIRE_OK(waitAll(t.get(), all));
      for (size_t m = 0; m < nmsg; ++m) {
        if (extra(m))
          REQUIRE(checkPattern(extras[m].data(), 100, seedOf(1, 2, static_cast<int>(m), 100)), "extra %zu", m);
        for (size_t i = 0; i < bytesOf(m) / 4; ++i) {
          int32_t got;
          memcpy(&got, bufs[m].data() + 4 * i, 4);
          const int32_t want = reduced(m) ? dataOf(m, i) + localOf(m, i) : dataOf(m, i);
          REQUIRE(got == want, "rank 2, message %zu (%zu bytes), element %zu: %d, expected %d", m, bytesOf(m), i, got,
                  want);
        }
      }
      return "";
    }
    Connection *from = nullptr, *to = nullptr;
    REQUIRE_OK(t->connect(0, &from));
    REQUIRE_OK(t->connect(2, &to));
    Forwarding* fwd = from->forwarding();
    REQUIRE(fwd != nullptr, "shm connections forward");
    REQUIRE(fwd->canForward(to, 100, SendHint{true}), "a 100-byte forward was refused");
    REQUIRE(fwd->canForward(to, 1 << 20, SendHint{false}) == !singleLocal, "1 MiB forward: wrong answer");
    std::vector<std::vector<char>> locals(nmsg);
    std::vector<ReduceSpec> reds(nmsg);
    size_t forwarded = 0;
    for (size_t m = 0; m < nmsg; ++m) {
      if (extra(m)) {
        extras[m].resize(100);
        fillPattern(extras[m].data(), 100, seedOf(1, 2, static_cast<int>(m), 100));
        REQUIRE_OK(to->isend(extras[m].data(), 100, testSig(2000 + m, 100), &extraReqs[m]));
        all.push_back(&extraReqs[m]);
      }
      bufs[m].resize(bytesOf(m));
      ReduceSpec* red = nullptr;
      if (reduced(m)) {
        locals[m].resize(bytesOf(m));
        for (size_t i = 0; i < bytesOf(m) / 4; ++i) {
          const int32_t v = localOf(m, i);
          memcpy(locals[m].data() + 4 * i, &v, 4);
        }
        reds[m] = ReduceSpec{MemRef(locals[m].data()), DataType::kInt32, RedOp::kSum};
        red = &reds[m];
      }
      char* dst = reduced(m) && m % 4 == 3 ? locals[m].data() : bufs[m].data();  // some in place
      if (fwd->canForward(to, bytesOf(m), SendHint{false})) {
        REQUIRE_OK(fwd->irecvForward(dst, bytesOf(m), sigIn(m), red, &reqs[m], to, sigOut(m), &reqs[nmsg + m]));
        all.push_back(&reqs[m]);
        all.push_back(&reqs[nmsg + m]);
        ++forwarded;
      } else {  // as the executor does: receive, then send
        REQUIRE_OK(from->irecv(dst, bytesOf(m), sigIn(m), red, &reqs[m]));
        REQUIRE_OK(waitAll(t.get(), {&reqs[m]}));
        REQUIRE_OK(to->isend(dst, bytesOf(m), sigOut(m), &reqs[nmsg + m]));
        all.push_back(&reqs[nmsg + m]);
      }
    }
    // (Within one process: the four sizes up to the 32 KiB threshold, plain and reduced, twice.)
    REQUIRE(forwarded == (singleLocal ? 16u : nmsg), "only %zu of %zu messages forwarded", forwarded, nmsg);
    REQUIRE_OK(waitAll(t.get(), all));
    for (size_t m = 0; m < nmsg; ++m) {
      const char* got = reduced(m) && m % 4 == 3 ? locals[m].data() : bufs[m].data();
      for (size_t i = 0; i < bytesOf(m) / 4; ++i) {
        int32_t v;
        memcpy(&v, got + 4 * i, 4);
        const int32_t want = reduced(m) ? dataOf(m, i) + localOf(m, i) : dataOf(m, i);
        REQUIRE(v == want, "rank 1, message %zu, element %zu: %d, expected %d", m, i, v, want);
      }
    }
    return "";
  });
}

// A receive whose signature or size differs fails on the receiver with kInvalidUsage naming both
// ranks and the difference; the receiver then aborts and the sender fails fast.
INSTANTIATE_TEST_SUITE_P(All, ShmModes,
                         ::testing::Values(ModeParam{Mode::kThreads, true}, ModeParam{Mode::kThreads, false},
                                           ModeParam{Mode::kForked, true}, ModeParam{Mode::kForked, false}),
                         modeName);

// A peer process killed with SIGKILL while streaming a message through the ring.
TEST(ShmTransport, PeerKilledMidStreamIsReported) {
  ScopedEnv env("C4_SHM_CMA", "0");
  ScopedEnv slots("C4_SHM_SLOT_BYTES", "32768");
  std::string tag = testing::freshTag();
  auto st = testing::runForked(2, [&](int r, Oob& oob) -> int {
    Status s;
    auto t = create(r, 2, tag, oob, &s);
    if (!s.isOk()) return 2;
    Connection* c = nullptr;
    if (!t->connect(1 - r, &c).isOk()) return 3;
    const size_t bytes = 64u << 20;
    std::vector<char> buf(bytes);
    Request req;
    if (r == 1) {
      if (!c->isend(buf.data(), bytes, testSig(1, bytes), &req).isOk()) return 4;
      (void)t->progress();  // fills the ring
      usleep(50000);        // the receiver drains it
      (void)t->progress();  // fills it again
      raise(SIGKILL);
    }
    if (!c->irecv(buf.data(), bytes, testSig(1, bytes), nullptr, &req).isOk()) return 5;
    Status w = waitAll(t.get(), {&req}, 20000);
    fprintf(stderr, "rank 0 saw: %s\n", w.toString().c_str());
    if (w.code() != Code::kRemoteError) return 6;
    if (w.message().find("rank 1") == std::string::npos || w.message().find("exited") == std::string::npos) return 7;
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0) << "rank 0 status " << st[0];
  EXPECT_TRUE(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL) << "rank 1 status " << st[1];
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// A peer process killed after posting a single-copy descriptor: the pull fails and names it.
TEST(ShmTransport, PeerKilledBeforeSingleCopyPullIsReported) {
  ScopedEnv env("C4_SHM_CMA", "1");
  std::string tag = testing::freshTag();
  auto st = testing::runForked(2, [&](int r, Oob& oob) -> int {
    Status s;
    auto t = create(r, 2, tag, oob, &s);
    if (!s.isOk()) return 2;
    Connection* c = nullptr;
    if (!t->connect(1 - r, &c).isOk()) return 3;
    const size_t bytes = 64u << 20;
    std::vector<char> buf(bytes);
    Request req;
    if (r == 1) {
      if (!c->isend(buf.data(), bytes, testSig(1, bytes), &req).isOk()) return 4;
      (void)t->progress();  // posts the descriptor
      raise(SIGKILL);
    }
    usleep(100000);
    if (!c->irecv(buf.data(), bytes, testSig(1, bytes), nullptr, &req).isOk()) return 5;
    Status w = waitAll(t.get(), {&req}, 20000);
    fprintf(stderr, "rank 0 saw: %s\n", w.toString().c_str());
    if (w.code() != Code::kRemoteError) return 6;
    if (w.message().find("rank 1") == std::string::npos) return 7;
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0) << "rank 0 status " << st[0];
  EXPECT_TRUE(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL) << "rank 1 status " << st[1];
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// A peer that destroys its transport while we wait for it is reported, not waited on forever.
TEST(ShmTransport, PeerClosedIsReported) {
  std::string tag = testing::freshTag();
  runRanks(Mode::kThreads, 2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    if (r == 1) {
      t.reset();
      REQUIRE_OK(oob.barrier());
      return "";
    }
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1, &c));
    char buf[8];
    Request req;
    REQUIRE_OK(c->irecv(buf, 8, testSig(1, 8), nullptr, &req));
    REQUIRE_OK(oob.barrier());
    Status w = waitAll(t.get(), {&req}, 20000);
    REQUIRE(w.code() == Code::kRemoteError && w.message().find("rank 1") != std::string::npos &&
                w.message().find("closed") != std::string::npos,
            "got %s", w.toString().c_str());
    return "";
  });
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// ctx.timeoutMs bounds how long a request may see no progress at all.
TEST(ShmTransport, SilentPeerTimesOut) {
  std::string tag = testing::freshTag();
  std::atomic<bool> done{false};
  runRanks(Mode::kThreads, 2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st, /*timeoutMs=*/300);
    REQUIRE_OK(st);
    if (r == 1) {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return "";
    }
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1, &c));
    char buf[8];
    Request req;
    REQUIRE_OK(c->irecv(buf, 8, testSig(1, 8), nullptr, &req));
    Status w = waitAll(t.get(), {&req}, 20000);
    done = true;
    REQUIRE(w.code() == Code::kRemoteError && w.message().find("no progress") != std::string::npos &&
                w.message().find("rank 1") != std::string::npos,
            "got %s", w.toString().c_str());
    return "";
  });
}

// Ranks whose ring geometry differs fail setup on every rank, naming the culprit; nothing leaks.
TEST(ShmTransport, SetupMismatchFailsEverywhereAndCleansUp) {
  std::string tag = testing::freshTag();
  auto st = testing::runForked(3, [&](int r, Oob& oob) -> int {
    if (r == 2) setenv("C4_SHM_SLOTS", "4", 1);
    Status s;
    auto t = create(r, 3, tag, oob, &s);
    fprintf(stderr, "rank %d setup: %s\n", r, s.toString().c_str());
    if (s.isOk() || t) return 1;
    if (s.code() != Code::kInvalidUsage && s.code() != Code::kRemoteError) return 2;
    if (s.message().find("rank 2") == std::string::npos && r != 2) return 3;
    return 0;
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// A rank can send to itself through its own inbox.
TEST(ShmTransport, SelfConnection) {
  std::string tag = testing::freshTag();
  runRanks(Mode::kThreads, 1, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 1, tag, oob, &st);
    REQUIRE_OK(st);
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(0, &c));
    for (size_t bytes : {size_t{0}, size_t{5}, size_t{3} << 20}) {
      std::vector<char> a(bytes), b(bytes);
      fillPattern(a.data(), bytes, 9);
      Request s, q;
      REQUIRE_OK(c->isend(a.data(), bytes, testSig(bytes, bytes), &s));
      REQUIRE_OK(c->irecv(b.data(), bytes, testSig(bytes, bytes), nullptr, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      REQUIRE(checkPattern(b.data(), bytes, 9), "self message of %zu bytes differs", bytes);
    }
    REQUIRE(!t->canConnect(1) && !t->connect(1, &c).isOk(), "connect out of range accepted");
    return "";
  });
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// 64 thread ranks on one host (far more than cores): setup and a ring exchange stay cheap.
TEST(ShmTransport, SixtyFourThreadRanksRing) {
  std::string tag = testing::freshTag();
  const int n = 64;
  auto t0 = std::chrono::steady_clock::now();
  runRanks(Mode::kThreads, n, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, n, tag, oob, &st);
    REQUIRE_OK(st);
    Connection *next = nullptr, *prev = nullptr;
    REQUIRE_OK(t->connect((r + 1) % n, &next));
    REQUIRE_OK(t->connect((r + n - 1) % n, &prev));
    uint64_t out = 1000 + r, in = 0;
    Request s, q;
    REQUIRE_OK(next->isend(&out, 8, testSig(1, 8), &s));
    REQUIRE_OK(prev->irecv(&in, 8, testSig(1, 8), nullptr, &q));
    REQUIRE_OK(waitAll(t.get(), {&s, &q}));
    REQUIRE(in == static_cast<uint64_t>(1000 + (r + n - 1) % n), "got %llu", static_cast<unsigned long long>(in));
    REQUIRE_OK(oob.barrier());
    return "";
  });
  printf("64 thread ranks: setup + ring exchange %.1f ms\n",
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

// Ranks on other hosts are not reachable.
TEST(ShmTransport, OtherHostsAreNotReachable) {
  std::string tag = testing::freshTag();
  testing::runThreads(3, [&](int r, Oob& oob) {
    Context ctx = makeContext(r, 3, tag, &oob);
    ctx.hostIds = {1, 1, 2};
    std::unique_ptr<Transport> t;
    ASSERT_TRUE(createShmTransport(ctx, &t).isOk());
    EXPECT_EQ(t->canConnect(2), r == 2);
    EXPECT_EQ(t->canConnect(0), r != 2);
    EXPECT_TRUE(t->caps().sameHostOnly);
  });
  EXPECT_TRUE(testing::shmLeftovers(tag).empty());
}

}  // namespace
}  // namespace c4::transport
