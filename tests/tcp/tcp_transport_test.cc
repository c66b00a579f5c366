// Tests of the tcp transport with ranks as forked processes on loopback: message sizes and lanes,
// striping over two loopback "NIC ports" (127.0.0.1 and 127.0.0.2), receives with reduction,
// late receives, many messages in flight, mismatches, and every failure the transport must name:
// a peer that closes, a reset connection, a peer that never connects, an impostor, abort.
#include "transports/tcp/tcp_transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.hpp"
#include "common/status.hpp"
#include "tests/shm/shm_test_util.hpp"
#include "transports/tcp/tcp_wire.hpp"

namespace c4::transport {
namespace {

using testing::Body;
using testing::checkPattern;
using testing::fillPattern;
using testing::ScopedEnv;
using testing::testSig;
using testing::waitAll;

constexpr uint64_t kKey0 = 0x0123456789abcdefull, kKey1 = 0xfedcba9876543210ull;

void runRanks(int n, const Body& body, int limitSec = 120) {
  auto st = testing::runForked(
      n,
      [&](int r, Oob& oob) {
        std::string e = body(r, oob);
        if (!e.empty()) fprintf(stderr, "rank %d: %s\n", r, e.c_str());
        return e.empty() ? 0 : 1;
      },
      limitSec);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r << " wait status " << st[r];
}

Context tcpContext(int r, int n, const std::string& tag, Oob* oob, int64_t timeoutMs = 60000) {
  Context c = testing::makeContext(r, n, tag, oob, timeoutMs);
  c.authKey[0] = kKey0;
  c.authKey[1] = kKey1;
  return c;
}

std::unique_ptr<Transport> create(int r, int n, const std::string& tag, Oob& oob, Status* st,
                                  int64_t timeoutMs = 60000) {
  std::unique_ptr<Transport> t;
  *st = createTcpTransport(tcpContext(r, n, tag, &oob, timeoutMs), &t);
  return t;
}

/// Creates rank r's transport of a 2-rank test and connects it to the other rank: "" or what failed.
std::string connectPair(int r, const std::string& tag, Oob& oob, std::unique_ptr<Transport>* t, Connection** c,
                        int64_t timeoutMs = 60000) {
  Status st;
  *t = create(r, 2, tag, oob, &st, timeoutMs);
  REQUIRE_OK(st);
  REQUIRE_OK((*t)->connect(1 - r, c));
  return "";
}

TcpTransport* tcpOf(const std::unique_ptr<Transport>& t) { return dynamic_cast<TcpTransport*>(t.get()); }

/// Every lane of the connection to `peer` as it is now.
std::vector<LaneSnapshot> laneStats(Transport* t, int peer) {
  Connection* c = nullptr;
  std::vector<LaneSnapshot> out;
  if (!t->connect(peer, &c).isOk()) return out;
  for (int i = 0; i < c->numLanes(); ++i) out.push_back(c->lane(i)->snapshot());
  return out;
}

uint32_t seedOf(int src, int dst, int i, size_t bytes) {
  return static_cast<uint32_t>(src * 1000003 + dst * 7919 + i * 31 + bytes);
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

struct LaneParam {
  int lanes;
  const char* ports;  // C4_TCP_PORTS
};
std::string laneName(const ::testing::TestParamInfo<LaneParam>& p) {
  return "lanes" + std::to_string(p.param.lanes) + (strchr(p.param.ports, ',') ? "_2ports" : "_1port");
}

class TcpLanes : public ::testing::TestWithParam<LaneParam> {
 protected:
  void SetUp() override {
    lanes_ = std::make_unique<ScopedEnv>("C4_LANES", std::to_string(GetParam().lanes).c_str());
    ports_ = std::make_unique<ScopedEnv>("C4_TCP_PORTS", GetParam().ports);
    // Small pieces, so a few MiB are striped over every lane many times.
    piece_ = std::make_unique<ScopedEnv>("C4_TCP_PIECE_BYTES", "65536");
  }
  std::unique_ptr<ScopedEnv> lanes_, ports_, piece_;
};

// Sizes across the piece boundary in both directions at once; every byte lands at its offset and
// the guard bytes after each buffer stay untouched; with several MiB every lane carries pieces.
TEST_P(TcpLanes, SizesStripingAndGuards) {
  const std::vector<size_t> sizes = {0, 1, 4097, 65536, 65537, 3 * 65536 + 5, (5u << 20) + 13};
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    REQUIRE(tcpOf(t) && tcpOf(t)->lanesPerConnection() == GetParam().lanes, "lanes");
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const size_t kGuard = 64;
    for (size_t i = 0; i < sizes.size(); ++i) {
      size_t bytes = sizes[i];
      std::vector<unsigned char> out(bytes + kGuard), in(bytes + kGuard, 0xa5);
      fillPattern(out.data(), bytes, seedOf(r, 1 - r, static_cast<int>(i), bytes));
      Request s, q;
      REQUIRE_OK(c->isend(out.data(), bytes, testSig(i, bytes), &s));
      REQUIRE_OK(c->irecv(in.data(), bytes, testSig(i, bytes), nullptr, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      REQUIRE(checkPattern(in.data(), bytes, seedOf(1 - r, r, static_cast<int>(i), bytes)), "%zu bytes differ", bytes);
      for (size_t g = 0; g < kGuard; ++g)
        REQUIRE(in[bytes + g] == 0xa5, "guard byte %zu after %zu bytes hit", g, bytes);
    }
    std::vector<LaneSnapshot> stats = laneStats(t.get(), 1 - r);
    REQUIRE(stats.size() == static_cast<size_t>(GetParam().lanes), "%zu lane stats", stats.size());
    const bool twoPorts = strchr(GetParam().ports, ',') != nullptr;
    for (const LaneSnapshot& s : stats) {
      const bool up = s.state == LaneState::kUp;
      REQUIRE(up && s.bytesSent > (1u << 20) && s.bytesRecv > (1u << 20), "lane %d carried %llu/%llu bytes (%s)",
              s.index, static_cast<unsigned long long>(s.bytesSent), static_cast<unsigned long long>(s.bytesRecv),
              laneStateName(s.state));
      // Lane i uses port i mod 2: its local address is 127.0.0.1 or 127.0.0.2 accordingly.
      if (twoPorts) {
        const char* want = s.index % 2 == 0 ? "127.0.0.1:" : "127.0.0.2:";
        REQUIRE(s.localAddr.rfind(want, 0) == 0 && s.remoteAddr.rfind(want, 0) == 0, "lane %d: %s -> %s", s.index,
                s.localAddr.c_str(), s.remoteAddr.c_str());
      }
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// Receives that reduce (float sum, int32 max) over many pieces and lanes.
TEST_P(TcpLanes, ReceiveWithReduction) {
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    std::unique_ptr<Transport> t;
    Connection* c = nullptr;
    const std::string e = connectPair(r, tag, oob, &t, &c);
    if (!e.empty()) return e;
    for (size_t count : {size_t{1}, size_t{1000}, size_t{(3u << 20) / 4 + 7}}) {
      std::vector<float> mine(count), got(count + 16, -1.f), local(count);
      for (size_t i = 0; i < count; ++i) {
        mine[i] = static_cast<float>((i * 7 + r) % 1000);
        local[i] = static_cast<float>(i % 13);
      }
      ReduceSpec red;
      red.local = local.data();
      red.dtype = DataType::kFloat32;
      red.op = RedOp::kSum;
      Request s, q;
      REQUIRE_OK(c->isend(mine.data(), count * 4, testSig(count, count, Coll::kAllReduce, DataType::kFloat32), &s));
      REQUIRE_OK(
          c->irecv(got.data(), count * 4, testSig(count, count, Coll::kAllReduce, DataType::kFloat32), &red, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      for (size_t i = 0; i < count; ++i) {
        float want = static_cast<float>((i * 7 + (1 - r)) % 1000) + static_cast<float>(i % 13);
        REQUIRE(got[i] == want, "count %zu element %zu: %f != %f", count, i, got[i], want);
      }
      REQUIRE(got[count] == -1.f, "wrote past the receive");
      // In place: local == dst.
      std::vector<int32_t> a(count), b(count);
      for (size_t i = 0; i < count; ++i) a[i] = static_cast<int32_t>(i * (r + 1)), b[i] = static_cast<int32_t>(i * 2);
      red.local = b.data();
      red.dtype = DataType::kInt32;
      red.op = RedOp::kMax;
      REQUIRE_OK(c->isend(a.data(), count * 4, testSig(count + 1, count, Coll::kAllReduce, DataType::kInt32), &s));
      REQUIRE_OK(
          c->irecv(b.data(), count * 4, testSig(count + 1, count, Coll::kAllReduce, DataType::kInt32), &red, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      for (size_t i = 0; i < count; ++i) {
        int32_t want = std::max(static_cast<int32_t>(i * (2 - r)), static_cast<int32_t>(i * 2));
        REQUIRE(b[i] == want, "max element %zu: %d != %d", i, b[i], want);
      }
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// Many messages of mixed sizes in flight in both directions, receives posted in bursts.
TEST_P(TcpLanes, ManyMessagesInFlightBothDirections) {
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    std::unique_ptr<Transport> t;
    Connection* c = nullptr;
    const std::string e = connectPair(r, tag, oob, &t, &c);
    if (!e.empty()) return e;
    const int kMsgs = 300;
    auto sizeOf = [](int i) { return static_cast<size_t>(i % 7 == 0 ? 200000 + i : (i * 37) % 3000); };
    std::vector<std::vector<char>> outs(kMsgs), ins(kMsgs);
    std::vector<Request> sr(kMsgs), rr(kMsgs);
    std::vector<Request*> all;
    for (int i = 0; i < kMsgs; ++i) {
      outs[i].resize(sizeOf(i));
      ins[i].resize(sizeOf(i));
      fillPattern(outs[i].data(), outs[i].size(), seedOf(r, 1 - r, i, outs[i].size()));
      REQUIRE_OK(c->isend(outs[i].data(), outs[i].size(), testSig(i, outs[i].size()), &sr[i]));
      all.push_back(&sr[i]);
    }
    for (int i = 0; i < kMsgs; ++i) {
      REQUIRE_OK(c->irecv(ins[i].data(), ins[i].size(), testSig(i, ins[i].size()), nullptr, &rr[i]));
      all.push_back(&rr[i]);
      if (i % 50 == 0) (void)t->progress();
    }
    REQUIRE_OK(waitAll(t.get(), all));
    for (int i = 0; i < kMsgs; ++i)
      REQUIRE(checkPattern(ins[i].data(), ins[i].size(), seedOf(1 - r, r, i, ins[i].size())), "message %d differs", i);
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

INSTANTIATE_TEST_SUITE_P(All, TcpLanes,
                         ::testing::Values(LaneParam{1, "127.0.0.1"}, LaneParam{2, "127.0.0.1"},
                                           LaneParam{4, "127.0.0.1"}, LaneParam{2, "127.0.0.1,127.0.0.2"},
                                           LaneParam{4, "127.0.0.1,127.0.0.2"}),
                         laneName);

// The sender runs far ahead of the receiver: data is buffered (and beyond C4_TCP_UNEXPECTED_BYTES
// the lanes stop reading), then every receive is posted late and still gets its bytes, plain and
// reducing. Three ranks, all pairs, collective and point-to-point messages.
TEST(TcpTransport, LateReceivesAndBackPressure) {
  ScopedEnv limit("C4_TCP_UNEXPECTED_BYTES", "1048576");
  ScopedEnv piece("C4_TCP_PIECE_BYTES", "131072");
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  std::string tag = testing::freshTag();
  const int n = 3, kMsgs = 12;
  const size_t bytes = 700000;  // 12 x 700 KB per pair: well beyond the 1 MiB limit
  runRanks(n, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, n, tag, oob, &st);
    REQUIRE_OK(st);
    std::vector<Connection*> c(n, nullptr);
    for (int p = 0; p < n; ++p)
      if (p != r) REQUIRE_OK(t->connect(p, &c[p]));
    std::vector<std::vector<char>> outs(n * kMsgs), ins(n * kMsgs);
    std::vector<Request> sr(n * kMsgs), rr(n * kMsgs);
    std::vector<Request*> sends, recvs;
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (int i = 0; i < kMsgs; ++i) {
        auto& o = outs[p * kMsgs + i];
        o.resize(bytes);
        fillPattern(o.data(), bytes, seedOf(r, p, i, bytes));
        // Odd messages are point-to-point (a Send received by a Recv): their unexpected pieces must
        // still be recognized as one message (a regression: they were compared with sigMatches).
        REQUIRE_OK(c[p]->isend(o.data(), bytes, testSig(i, bytes, i % 2 ? Coll::kSend : Coll::kAllReduce),
                               &sr[p * kMsgs + i]));
        sends.push_back(&sr[p * kMsgs + i]);
      }
    }
    // Drive only the sends for a while: the peers buffer what they can, then push back.
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    while (std::chrono::steady_clock::now() < until) REQUIRE_OK(t->progress());
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      for (int i = 0; i < kMsgs; ++i) {
        auto& in = ins[p * kMsgs + i];
        in.resize(bytes);
        REQUIRE_OK(c[p]->irecv(in.data(), bytes, testSig(i, bytes, i % 2 ? Coll::kRecv : Coll::kAllReduce), nullptr,
                               &rr[p * kMsgs + i]));
        recvs.push_back(&rr[p * kMsgs + i]);
      }
    }
    std::vector<Request*> all = sends;
    all.insert(all.end(), recvs.begin(), recvs.end());
    REQUIRE_OK(waitAll(t.get(), all));
    for (int p = 0; p < n; ++p)
      for (int i = 0; p != r && i < kMsgs; ++i)
        REQUIRE(checkPattern(ins[p * kMsgs + i].data(), bytes, seedOf(p, r, i, bytes)), "from %d message %d", p, i);
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// Receives posted one at a time, each only after the previous completed, while the sender is far
// ahead on two lanes: a lane that stopped reading for want of room can hold the header of the very
// message whose receive is posted next, with nothing of it buffered. Posting that receive must
// restart the lane (a regression: a 64 MiB AllReduce over tcp waited forever).
TEST(TcpTransport, LateReceivePostedOneAtATimeRestartsAStoppedLane) {
  ScopedEnv limit("C4_TCP_UNEXPECTED_BYTES", "1048576");
  ScopedEnv lanes("C4_LANES", "2");
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  std::string tag = testing::freshTag();
  const int kMsgs = 24;
  const size_t bytes = 400000;  // one piece each: lane k carries messages k, k+2, ...
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    std::unique_ptr<Transport> t;
    Connection* c = nullptr;
    const std::string e = connectPair(r, tag, oob, &t, &c, 20000);
    if (!e.empty()) return e;
    std::vector<std::vector<char>> bufs(kMsgs, std::vector<char>(bytes));
    std::vector<Request> reqs(kMsgs);
    if (r == 0) {
      std::vector<Request*> all;
      for (int i = 0; i < kMsgs; ++i) {
        fillPattern(bufs[i].data(), bytes, seedOf(0, 1, i, bytes));
        REQUIRE_OK(c->isend(bufs[i].data(), bytes, testSig(i, bytes), &reqs[i]));
        all.push_back(&reqs[i]);
      }
      REQUIRE_OK(waitAll(t.get(), all, 15000));
    } else {
      // Let the lanes fill the 1 MiB allowance and stop.
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
      while (std::chrono::steady_clock::now() < until) REQUIRE_OK(t->progress());
      for (int i = 0; i < kMsgs; ++i) {
        REQUIRE_OK(c->irecv(bufs[i].data(), bytes, testSig(i, bytes), nullptr, &reqs[i]));
        REQUIRE_OK(waitAll(t.get(), {&reqs[i]}, 15000));
        REQUIRE(checkPattern(bufs[i].data(), bytes, seedOf(0, 1, i, bytes)), "message %d", i);
      }
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// A receive whose signature or size differs fails with kInvalidUsage naming both ranks and the
// difference; the sender then sees the connection closed (not a hang).
// Closes every socket of this process with SO_LINGER 0 (the kernel sends RST) and exits.
[[noreturn]] void resetAllSocketsAndExit() {
  for (int fd = 3; fd < 1024; ++fd) {
    int type = 0;
    socklen_t len = sizeof(type);
    sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0 || ss.ss_family != AF_INET) continue;
    linger lg{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
  }
  _exit(0);
}

// The peer goes away in the middle of a large message: (0) its transport is destroyed (FIN),
// (1) it resets every connection (RST), (2) it exits. The receiver fails within the timeout
// with an error naming rank 1, and no request completes with partial data.
TEST(TcpTransport, PeerGoneMidMessageIsReported) {
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  ScopedEnv lanes("C4_LANES", "2");
  for (int how = 0; how < 3; ++how) {
    std::string tag = testing::freshTag();
    runRanks(2, [&](int r, Oob& oob) -> std::string {
      std::unique_ptr<Transport> t;
      Connection* c = nullptr;
      const std::string e = connectPair(r, tag, oob, &t, &c, 15000);
      if (!e.empty()) return e;
      const size_t bytes = 256u << 20;  // far more than the socket buffers hold
      std::vector<char> buf(bytes);
      Request req;
      if (r == 1) {
        REQUIRE_OK(c->isend(buf.data(), bytes, testSig(1, bytes), &req));
        // Wait until some MiB are on their way (every lane up), then go away mid-message.
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (;;) {
          REQUIRE_OK(t->progress());
          uint64_t sent = 0;
          for (const LaneSnapshot& s : laneStats(t.get(), 0)) sent += s.state == LaneState::kUp ? s.bytesSent : 0;
          if (sent > (8u << 20)) break;
          REQUIRE(std::chrono::steady_clock::now() < until, "lanes never carried data");
        }
        REQUIRE(req.state == Request::kPending, "256 MiB went out at once?");
        if (how == 0) {
          t.reset();
          _exit(0);
        }
        if (how == 1) resetAllSocketsAndExit();
        _exit(0);
      }
      REQUIRE_OK(c->irecv(buf.data(), bytes, testSig(1, bytes), nullptr, &req));
      auto t0 = std::chrono::steady_clock::now();
      Status w = waitAll(t.get(), {&req}, 60000);
      REQUIRE(!w.isOk() && req.state == Request::kFailed, "receive of a broken message: %s", w.toString().c_str());
      REQUIRE(w.code() == Code::kRemoteError && contains(w.message(), "rank 1"), "how %d: %s", how,
              w.toString().c_str());
      REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15), "took too long");
      fprintf(stderr, "how %d: %s\n", how, w.message().c_str());
      return "";
    });
  }
}

// The lower rank (which opens the lanes) never connects: the higher rank's receive fails after
// C4_TIMEOUT with an error naming it, instead of hanging.
TEST(TcpTransport, PeerThatNeverConnectsTimesOut) {
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st, 1500);
    REQUIRE_OK(st);
    if (r == 0) {
      REQUIRE_OK(oob.barrier());
      return "";
    }
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(0, &c));
    char b[8];
    Request req;
    REQUIRE_OK(c->irecv(b, 8, testSig(0, 8), nullptr, &req));
    Status w = waitAll(t.get(), {&req}, 20000);
    // Rank 0 is alive and listening, so the liveness probes (every C4_TCP_PROBE_MS) do not end the
    // wait: C4_TIMEOUT does.
    REQUIRE(
        w.code() == Code::kRemoteError && contains(w.message(), "rank 0") && contains(w.message(), "never connected"),
        "%s", w.toString().c_str());
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

TEST(TcpTransport, PeerGoneBeforeConnectingIsFoundByTheProbe) {
  // Rank 0 (the side that connects) leaves before it opened its lanes. Rank 1 learns it from a
  // refused liveness probe after about C4_TCP_PROBE_MS, not after C4_TIMEOUT (20 s here); with
  // probes off it waits for the timeout (1.5 s then).
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  for (const char* probeMs : {"300", "0"}) {
    ScopedEnv probe("C4_TCP_PROBE_MS", probeMs);
    const bool probing = strcmp(probeMs, "0") != 0;
    std::string tag = testing::freshTag();
    runRanks(2, [&](int r, Oob& oob) -> std::string {
      Status st;
      auto t = create(r, 2, tag, oob, &st, probing ? 20000 : 1500);
      REQUIRE_OK(st);
      if (r == 0) {
        t.reset();  // its listening sockets close, as when the process exits
        REQUIRE_OK(oob.barrier());
        return "";
      }
      Connection* c = nullptr;
      REQUIRE_OK(t->connect(0, &c));
      char b[8];
      Request req;
      REQUIRE_OK(c->irecv(b, 8, testSig(0, 8), nullptr, &req));
      const int64_t t0 = detail::nowMs();
      Status w = waitAll(t.get(), {&req}, 30000);
      const int64_t took = detail::nowMs() - t0;
      if (probing) {
        REQUIRE(w.code() == Code::kRemoteError && contains(w.message(), "rank 0") &&
                    contains(w.message(), "refuses connections") && took < 5000,
                "after %lld ms: %s", static_cast<long long>(took), w.toString().c_str());
      } else {
        REQUIRE(w.code() == Code::kRemoteError && contains(w.message(), "never connected"), "%s", w.toString().c_str());
      }
      REQUIRE_OK(oob.barrier());
      return "";
    });
  }
}

/// Raw connection to `addr` ("ip:port") with a blocking 10 s receive timeout; -1 on failure.
int rawConnect(const std::string& addr) {
  detail::SockAddr a;
  if (!detail::parseHostPort(addr, &a).isOk()) return -1;
  int fd = socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, a.sa(), a.len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Impostors connect to rank 1 before rank 0 does: one sends garbage, one a well-formed hello with a
// wrong proof of the key. Rank 1 drops both (logged) and the real lanes still work.
TEST(TcpTransport, ImpostorsAreDroppedAndTheJobWorks) {
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  ScopedEnv lanes("C4_LANES", "2");
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE_OK(st);
    char addr[64] = {0};
    std::vector<char> all(2 * sizeof(addr));
    if (r == 1) snprintf(all.data() + sizeof(addr), sizeof(addr), "%s", tcpOf(t)->portAddresses()[0].c_str());
    REQUIRE_OK(oob.allGather(all.data(), sizeof(addr)));
    memcpy(addr, all.data() + sizeof(addr), sizeof(addr));
    std::string impostorResult = "not run";
    std::thread impostor;
    if (r == 0) {
      impostor = std::thread([&] {
        int g = rawConnect(addr);
        int h = rawConnect(addr);
        if (g < 0 || h < 0) {
          impostorResult = "cannot connect";
          return;
        }
        char junk[64];
        memset(junk, 0x5a, sizeof(junk));
        (void)!write(g, junk, sizeof(junk));
        tcpwire::Hello hello{tcpwire::kHelloMagic, tcpwire::kVersion, 0, 0, 1, 0, 2, 42};
        hello.tagHash = tcpwire::tagHash(std::array<uint64_t, 2>{kKey0, kKey1}.data(), tag.data(), tag.size());
        (void)!write(h, &hello, sizeof(hello));
        tcpwire::Challenge ch{};
        if (recv(h, &ch, sizeof(ch), MSG_WAITALL) != static_cast<ssize_t>(sizeof(ch))) {
          impostorResult = "no challenge";
          return;
        }
        const uint64_t wrongKey[2] = {1, 2};
        tcpwire::Proof pr{tcpwire::kProofMagic, 0, tcpwire::handshakeMac(wrongKey, false, hello, ch.nonce)};
        (void)!write(h, &pr, sizeof(pr));
        // Dropped: EOF, or a reset where the garbage was not read.
        auto dropped = [](int fd) {
          char c;
          ssize_t k = recv(fd, &c, 1, 0);
          return k == 0 || (k < 0 && errno == ECONNRESET);
        };
        bool a = dropped(g), b = dropped(h);
        impostorResult = a && b ? "" : strFormat("impostor not dropped (garbage: %d, wrong proof: %d)", a, b);
        close(g);
        close(h);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    // Rank 1 progresses while the impostors knock; then the real exchange.
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    while (r == 1 && std::chrono::steady_clock::now() < until) REQUIRE_OK(t->progress());
    Connection* c = nullptr;
    REQUIRE_OK(t->connect(1 - r, &c));
    const size_t bytes = 1u << 20;
    std::vector<char> out(bytes), in(bytes);
    fillPattern(out.data(), bytes, r);
    Request s, q;
    REQUIRE_OK(c->isend(out.data(), bytes, testSig(0, bytes), &s));
    REQUIRE_OK(c->irecv(in.data(), bytes, testSig(0, bytes), nullptr, &q));
    REQUIRE_OK(waitAll(t.get(), {&s, &q}));
    REQUIRE(checkPattern(in.data(), bytes, 1 - r), "data differs");
    if (r == 0) {
      impostor.join();
      REQUIRE(impostorResult.empty(), "%s", impostorResult.c_str());
    }
    REQUIRE_OK(oob.barrier());
    return "";
  });
}

// The lane-plan hook chooses each lane's source port; C4_TCP_SPORT_BASE follows its formula.
TEST(TcpTransport, LanePlanAndSourcePortBase) {
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1,127.0.0.2");
  ScopedEnv lanes("C4_LANES", "2");
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  for (int mode = 0; mode < 2; ++mode) {
    ScopedEnv sport("C4_TCP_SPORT_BASE", mode == 1 ? std::to_string(base).c_str() : nullptr);
    std::string tag = testing::freshTag();
    runRanks(2, [&](int r, Oob& oob) -> std::string {
      Context ctx = tcpContext(r, 2, tag, &oob);
      if (mode == 0)
        ctx.lanePlan = [&](int peer, int lane) {
          LanePlan p;
          p.localPort = 1 - lane;  // swapped: lane 0 on port 1
          p.sourcePort = static_cast<uint16_t>(base + 100 + lane);
          return p;
        };
      std::unique_ptr<Transport> t;
      REQUIRE_OK(createTcpTransport(ctx, &t));
      Connection* c = nullptr;
      REQUIRE_OK(t->connect(1 - r, &c));
      std::vector<char> out(1 << 20), in(1 << 20);
      Request s, q;
      REQUIRE_OK(c->isend(out.data(), out.size(), testSig(0, out.size()), &s));
      REQUIRE_OK(c->irecv(in.data(), in.size(), testSig(0, in.size()), nullptr, &q));
      REQUIRE_OK(waitAll(t.get(), {&s, &q}));
      if (r == 0) {
        for (const LaneSnapshot& ls : laneStats(t.get(), 1)) {
          int port = mode == 0 ? base + 100 + ls.index : base + (0 * 2 + 1) * 2 + ls.index;
          std::string ip =
              mode == 0 ? (ls.index == 0 ? "127.0.0.2" : "127.0.0.1") : (ls.index == 0 ? "127.0.0.1" : "127.0.0.2");
          std::string want = ip + ":" + std::to_string(port);
          REQUIRE(ls.localAddr == want, "mode %d lane %d: local %s, want %s", mode, ls.index, ls.localAddr.c_str(),
                  want.c_str());
          REQUIRE(ls.remoteAddr.rfind(ip + ":", 0) == 0, "lane %d remote %s", ls.index, ls.remoteAddr.c_str());
        }
      }
      REQUIRE_OK(oob.barrier());
      return "";
    });
  }
}

// Ranks that disagree on C4_LANES fail setup with an error naming both values.
TEST(TcpTransport, LaneCountMismatchFailsSetup) {
  ScopedEnv ports("C4_TCP_PORTS", "127.0.0.1");
  std::string tag = testing::freshTag();
  runRanks(2, [&](int r, Oob& oob) -> std::string {
    setenv("C4_LANES", r == 0 ? "1" : "2", 1);
    Status st;
    auto t = create(r, 2, tag, oob, &st);
    REQUIRE(!st.isOk() && contains(st.message(), "C4_LANES"), "%s", st.toString().c_str());
    return "";
  });
}

}  // namespace
}  // namespace c4::transport
