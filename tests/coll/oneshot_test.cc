// The one-shot path (core/oneshot.hpp) of two ranks over arenas in this process's memory, as the
// ranks of a host share their shm segments, with the transport's peer-health answer scripted: a
// rank that waits for its peer checks the peer's health (IdleWatch, every 100 ms of waiting). A
// peer may publish its input, finish the call and leave (destroy its communicator: its transport
// reports "closed") while that check looks; all the data the waiting rank needs is in the arena
// then, so its call must complete, not fail (the flake of tests/torch/test_interop.py,
// test_one_communicator_shared_with_the_nccl_api[3]). A peer that leaves without publishing still
// fails the call.
#include "core/oneshot.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "core/exec_context.hpp"
#include "core/watchdog.hpp"
#include "trace/recorder.hpp"

namespace c4 {
namespace {

constexpr int kRanks = 2;
constexpr size_t kArenaBytes = 64 << 10;

/// The host's arenas (zeroed, as fresh shm segments are).
struct Host {
  std::vector<char*> arenas;
  Host() {
    for (int r = 0; r < kRanks; ++r) {
      char* a = static_cast<char*>(aligned_alloc(4096, kArenaBytes));
      memset(a, 0, kArenaBytes);
      arenas.push_back(a);
    }
  }
  ~Host() {
    for (char* a : arenas) free(a);
  }
};

/// A transport that offers the arenas and nothing else; its peer-health answer is `onHealth`'s.
class ArenaTransport final : public transport::Transport, public transport::HostArena {
 public:
  explicit ArenaTransport(Host* h) : h_(h) {}
  const char* name() const override { return "arena"; }
  transport::Caps caps() const override { return transport::Caps{}; }
  bool canConnect(int) const override { return false; }
  Status connect(int peer, transport::Connection**) override {
    return makeError(Code::kInternalError, "no connection to rank %d in this test", peer);
  }
  Status progress() override { return Status::ok(); }
  uint64_t progressCount() const override { return 0; }
  void abort(const std::string&) override {}
  Status peerHealth(int peer) override {
    ++healthChecks;
    return onHealth ? onHealth(peer) : Status::ok();
  }
  transport::HostArena* hostArena() override { return this; }
  char* arena(int rank) override { return h_->arenas[static_cast<size_t>(rank)]; }
  size_t arenaBytes() const override { return kArenaBytes; }

  std::function<Status(int peer)> onHealth;
  int healthChecks = 0;

 private:
  Host* h_;
};

class Context final : public ExecContext {
 public:
  explicit Context(int rank) : rank_(rank) {}
  int thisRank() const override { return rank_; }
  int numRanks() const override { return kRanks; }
  Status connection(int peer, transport::Connection**) override {
    return makeError(Code::kInternalError, "no connection to rank %d in this test", peer);
  }
  transport::Caps capsOf(int) const override { return transport::Caps{}; }
  uint8_t transportIndexOf(int) const override { return 0; }
  Status progress() override { return Status::ok(); }
  uint64_t transportProgress() const override { return 0; }
  trace::Recorder& tracer() override { return recorder_; }
  Watchdog& watchdog() override { return watchdog_; }

 private:
  int rank_;
  trace::Recorder recorder_;
  Watchdog watchdog_;
};

/// One rank: its communicator's parts that the one-shot path uses, and its buffers.
struct Rank {
  Context ctx;
  ArenaTransport t;
  OneShot os;
  std::vector<float> in, out;
  Rank(Host* h, int rank) : ctx(rank), t(h), in(3, static_cast<float>(rank + 1)), out(3, 0.0f) {
    os.init(&ctx, kRanks, &t);
  }
  /// Enters AllReduce (sum of 3 floats, the call's sequence number 0), as Comm does.
  Status start(const OpDesc& op, const OpSig& sig) {
    os.announce(sig, CallMode::kOneShot);
    return os.start(op, sig, in.data(), out.data(), kernels::KOp::kSum, nullptr);
  }
};

OpDesc allReduce3() {
  OpDesc op;
  op.coll = Coll::kAllReduce;
  op.count = 3;
  op.dtype = DataType::kFloat32;
  op.op = RedOp::kSum;
  return op;
}

OpSig sigOf(const OpDesc& op) {
  OpSig s;
  s.seq = 0;
  s.count = op.count;
  s.coll = static_cast<uint8_t>(op.coll);
  s.dtype = static_cast<uint8_t>(op.dtype);
  s.op = static_cast<uint8_t>(op.op);
  return s;
}

/// Polls rank `r`'s call until it is done, fails, or its transport was asked `checks` times for
/// the peer's health and the call still waits. The health checks come every 100 ms of waiting, so
/// the loop ends by itself; the wall-clock bound only keeps a broken build from hanging the suite.
Status pollUntil(Rank& r, int checks, bool* done) {
  *done = false;
  const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!*done && std::chrono::steady_clock::now() < giveUp) {
    Status st = r.os.poll(done);
    if (!st.isOk()) return st;
    if (!*done && r.t.healthChecks >= checks) {
      // One more poll after the check: what it found in the arena decides.
      st = r.os.poll(done);
      return st;
    }
  }
  return Status::ok();
}

TEST(OneShot, PeerThatFinishesAndLeavesDuringTheHealthCheckFailsNothing) {
  Host host;
  Rank r0(&host, 0), r1(&host, 1);
  ASSERT_TRUE(r0.os.enabled());
  const OpDesc op = allReduce3();
  const OpSig sig = sigOf(op);

  ASSERT_TRUE(r0.start(op, sig).isOk());  // rank 0 publishes and waits for rank 1
  bool peerDone = false;
  r0.t.onHealth = [&](int peer) -> Status {
    EXPECT_EQ(peer, 1);
    // While rank 0 looks at rank 1's health: rank 1 enters the call, finds rank 0's input, finishes,
    // and destroys its communicator (its transport is closed from now on).
    Status st = r1.start(op, sig);
    if (st.isOk()) st = r1.os.poll(&peerDone);
    if (st.isOk() && peerDone) r1.os.markDone(sig.seq);
    EXPECT_TRUE(st.isOk()) << st.message();
    return makeError(Code::kRemoteError, "shm: rank %d (pid 0 on test) closed its transport", peer);
  };
  bool done = false;
  Status st = pollUntil(r0, 1, &done);
  ASSERT_TRUE(peerDone) << "rank 1 did not finish within rank 0's health check";
  EXPECT_EQ(r0.t.healthChecks, 1);
  ASSERT_TRUE(st.isOk()) << "rank 0 failed a call whose data were all published: " << st.message();
  ASSERT_TRUE(done) << "rank 0 did not finish after rank 1 had published and left";
  r0.os.markDone(sig.seq);
  EXPECT_EQ(r0.out, std::vector<float>(3, 3.0f));
  EXPECT_EQ(r1.out, std::vector<float>(3, 3.0f));
}

TEST(OneShot, PeerThatLeavesWithoutPublishingFailsTheCall) {
  Host host;
  Rank r0(&host, 0);
  const OpDesc op = allReduce3();
  const OpSig sig = sigOf(op);
  ASSERT_TRUE(r0.start(op, sig).isOk());
  r0.t.onHealth = [](int peer) {
    return makeError(Code::kRemoteError, "shm: rank %d (pid 0 on test) closed its transport", peer);
  };
  bool done = false;
  Status st = pollUntil(r0, 1, &done);
  EXPECT_FALSE(done);
  ASSERT_FALSE(st.isOk()) << "a peer that left without publishing must fail the call";
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("closed its transport"), std::string::npos) << st.message();
  EXPECT_EQ(r0.out, std::vector<float>(3, 0.0f));  // nothing written
}

}  // namespace
}  // namespace c4
