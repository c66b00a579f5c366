// The tracer inside the library: event contents per collective at levels op and step, level 0 and
// run-time level changes, spans and notes, dumps (destroy, finalize, abort, fatal signals, SIGUSR2),
// thread ranks recording concurrently, and clock alignment recovered from an artificial skew.
#include "c4comm/trace.hpp"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "gtest/gtest.h"
#include "tests/coll/harness.hpp"
#include "tests/trace/temp_dir.hpp"
#include "trace/recorder.hpp"

namespace {

using c4::Coll;
using c4::DataType;
using c4::RedOp;
using c4::trace::Event;
using c4::trace::EventType;
using c4test::Failures;

std::string tempDir() { return c4test::tempDir("c4trace-test"); }

std::vector<std::string> filesIn(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  return out;
}

struct ParsedFile {
  c4::trace::FileHeader h;
  std::vector<Event> events;
  std::string names;
};

bool parseFile(const std::string& path, ParsedFile* out) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < sizeof(c4::trace::FileHeader)) return false;
  memcpy(static_cast<void*>(&out->h), data.data(), sizeof(out->h));
  const size_t evBytes = out->h.nEvents * sizeof(Event);
  if (data.size() != sizeof(out->h) + evBytes + out->h.namesBytes) return false;
  out->events.resize(out->h.nEvents);
  if (out->h.nEvents) memcpy(static_cast<void*>(out->events.data()), data.data() + sizeof(out->h), evBytes);
  out->names = data.substr(sizeof(out->h) + evBytes);
  return true;
}

/// The single file of `rank` in dir ("" if not exactly one).
std::string fileOfRank(const std::string& dir, int rank) {
  auto fs = filesIn(dir, ".r" + std::to_string(rank) + ".c4t");
  return fs.size() == 1 ? fs[0] : "";
}

std::string runTool(const std::string& args) {
  std::string cmd = std::string("python3 ") + C4_TRACE_TOOL + " " + args + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
    int st = pclose(p);
    if (st != 0) out += "\n[exit status " + std::to_string(st) + "]";
  }
  return out;
}

void must(c4::Status st, Failures* f) {
  if (!st.isOk()) f->push_back(st.toString());
}

#define CHECK_OR(cond, msg)                                                                                \
  do {                                                                                                     \
    if (!(cond)) f.push_back(std::string("rank ") + std::to_string(rank) + ": " + (msg) + " (" #cond ")"); \
  } while (0)

struct Expected {
  Coll coll;
  uint64_t bytes;
  int peer;
  bool small;
};

/// Runs one call of every collective plus a send/recv pair and checks the events they left.
Failures everyCollective(int rank, int n, const c4::UniqueId& id, const char* level, const std::string& dir) {
  Failures f;
  setenv("C4_TRACE", level, 1);
  setenv("C4_TRACE_DIR", dir.c_str(), 1);
  c4::Comm* comm = nullptr;
  if (!c4::commInitRank(&comm, n, id, rank).isOk()) return {"init failed"};
  const size_t big = 65536, small = 4, c = 1024;
  std::vector<float> in(big * static_cast<size_t>(n), 1.0f), out(big * static_cast<size_t>(n), 0.0f);
  std::vector<Expected> want;
  auto ok = [&](c4::Status st, const char* what) {
    if (!st.isOk()) f.push_back(std::string(what) + ": " + st.toString());
  };
  ok(c4::allReduce(in.data(), out.data(), small, DataType::kFloat32, RedOp::kSum, comm), "allReduce small");
  want.push_back({Coll::kAllReduce, small * 4, -1, true});
  ok(c4::allReduce(in.data(), out.data(), big, DataType::kFloat32, RedOp::kMax, comm), "allReduce big");
  want.push_back({Coll::kAllReduce, big * 4, -1, false});  // 256 KiB: through the executor
  ok(c4::allGather(in.data(), out.data(), c, DataType::kFloat32, comm), "allGather");
  want.push_back({Coll::kAllGather, c * 4 * n, -1, false});
  ok(c4::broadcast(in.data(), out.data(), c, DataType::kFloat32, 1 % n, comm), "broadcast");
  want.push_back({Coll::kBroadcast, c * 4, 1 % n, false});
  ok(c4::reduceScatter(in.data(), out.data(), c, DataType::kFloat32, RedOp::kSum, comm), "reduceScatter");
  want.push_back({Coll::kReduceScatter, c * 4 * n, -1, false});
  ok(c4::reduce(in.data(), out.data(), c, DataType::kFloat32, RedOp::kSum, n - 1, comm), "reduce");
  want.push_back({Coll::kReduce, c * 4, n - 1, false});
  ok(c4::alltoAll(in.data(), out.data(), c, DataType::kFloat32, comm), "alltoAll");
  want.push_back({Coll::kAlltoAll, c * 4 * n, -1, false});
  ok(c4::gather(in.data(), out.data(), c, DataType::kFloat32, 0, comm), "gather");
  want.push_back({Coll::kGather, c * 4 * n, 0, false});
  ok(c4::scatter(in.data(), out.data(), c, DataType::kFloat32, 1 % n, comm), "scatter");
  want.push_back({Coll::kScatter, c * 4 * n, 1 % n, false});
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  ok(c4::groupStart(), "groupStart");
  ok(c4::send(in.data(), 512, DataType::kFloat32, next, comm), "send");
  ok(c4::recv(out.data(), 512, DataType::kFloat32, prev, comm), "recv");
  ok(c4::groupEnd(), "groupEnd");
  want.push_back({Coll::kSend, 2048, next, false});
  want.push_back({Coll::kRecv, 2048, prev, false});

  std::vector<Event> evs;
  uint64_t dropped = 9;
  ok(c4::trace::readEvents(comm, &evs, &dropped), "readEvents");
  CHECK_OR(dropped == 0, "events dropped");
  std::vector<Event> ops, steps;
  for (const Event& e : evs) {
    if (e.type == EventType::kOp) ops.push_back(e);
    if (e.type == EventType::kStep) steps.push_back(e);  // not diagnoses (e.g. a rank moved off a shared CPU)
  }
  CHECK_OR(ops.size() == want.size(), "op events: " + std::to_string(ops.size()));
  for (size_t i = 0; i < ops.size() && i < want.size(); ++i) {
    const Event& e = ops[i];
    const Expected& w = want[i];
    const std::string at = "op " + std::to_string(i) + " (" + c4::collName(w.coll) + ")";
    CHECK_OR(e.coll == static_cast<uint8_t>(w.coll), at + ": coll " + std::to_string(e.coll));
    CHECK_OR(e.bytes == w.bytes, at + ": bytes " + std::to_string(e.bytes));
    CHECK_OR(e.dtype == static_cast<uint8_t>(DataType::kFloat32), at + ": dtype");
    CHECK_OR(e.peer == w.peer, at + ": peer/root " + std::to_string(e.peer));
    CHECK_OR(e.t1 >= e.t0 && e.t0 > 0, at + ": times");
    // The send and the receive of one group share their interval.
    if (i > 0 && w.coll != Coll::kRecv) CHECK_OR(e.t0 >= ops[i - 1].t1, at + ": starts before the previous op ended");
    if (w.coll != Coll::kSend && w.coll != Coll::kRecv) {
      CHECK_OR(e.seq == i, at + ": seq " + std::to_string(e.seq));
      if (w.small) {
        CHECK_OR(e.algo == c4::trace::kAlgoOneShot, at + ": algo " + std::to_string(e.algo));
      } else {
        CHECK_OR(e.algo <= 4 || e.algo == c4::trace::kAlgoOneShot, at + ": algo " + std::to_string(e.algo));
      }
    } else {
      CHECK_OR(e.algo == c4::trace::kAlgoP2p && e.seq == 0, at + ": p2p algo/seq");
    }
  }
  if (!ops.empty()) CHECK_OR(ops[1].redop == static_cast<uint8_t>(RedOp::kMax), "redop of the big allReduce");
  if (std::string(level) == "op") {
    CHECK_OR(steps.empty(), "step events at level op: " + std::to_string(steps.size()));
  } else {
    // Every step lies inside its operation; sends and receives name valid peers.
    size_t bigSteps = 0, sendBytes = 0, recvBytes = 0;
    for (const Event& s : steps) {
      CHECK_OR(s.type == EventType::kStep, "unexpected event type " + std::to_string(int(s.type)));
      bool inside = false;
      for (const Event& o : ops)
        if (o.coll == s.coll && (o.seq == s.seq) && s.t0 >= o.t0 && s.t1 <= o.t1 && s.t1 >= s.t0) inside = true;
      CHECK_OR(inside,
               "step of coll " + std::to_string(s.coll) + " seq " + std::to_string(s.seq) + " outside its operation");
      auto kind = static_cast<c4::trace::StepKind>(s.redop);
      if (kind == c4::trace::StepKind::kSend || kind == c4::trace::StepKind::kRecv ||
          kind == c4::trace::StepKind::kRecvReduce)
        CHECK_OR(s.peer >= 0 && s.peer < n && s.peer != rank, "step peer " + std::to_string(s.peer));
      if (s.coll == static_cast<uint8_t>(Coll::kAllReduce) && s.seq == 1) {
        ++bigSteps;
        if (kind == c4::trace::StepKind::kSend) sendBytes += s.bytes;
        if (kind != c4::trace::StepKind::kSend && s.peer >= 0) recvBytes += s.bytes;
      }
      CHECK_OR(s.lane == 0, "lane of a shm step");
    }
    CHECK_OR(bigSteps > 0, "no steps for the big allReduce");
    // Any AllReduce algorithm moves at least (n-1)/n of the data in and out of every rank.
    CHECK_OR(sendBytes * n >= big * 4 * (n - 1) && recvBytes * n >= big * 4 * (n - 1),
             "allReduce step bytes: sent " + std::to_string(sendBytes) + ", received " + std::to_string(recvBytes));
    bool smallHasSteps = false;
    for (const Event& s : steps) smallHasSteps |= s.coll == 0 && s.seq == 0;
    CHECK_OR(!smallHasSteps, "the one-shot allReduce has no steps");
  }
  ok(c4::commDestroy(comm), "destroy");
  ParsedFile pf;
  const std::string path = fileOfRank(dir, rank);
  CHECK_OR(!path.empty() && parseFile(path, &pf), "trace file of rank " + std::to_string(rank) + " in " + dir);
  if (!path.empty()) {
    size_t fileOps = 0;
    for (const Event& e : pf.events) fileOps += e.type == EventType::kOp;
    CHECK_OR(fileOps == want.size(), "op events in the file: " + std::to_string(fileOps));
    CHECK_OR(pf.h.reason == static_cast<uint32_t>(c4::trace::DumpReason::kDestroy), "reason destroy");
    CHECK_OR(pf.h.rank == rank && pf.h.nranks == n, "header rank/nranks");
    CHECK_OR(pf.h.level == (std::string(level) == "op" ? 1u : 2u), "header level");
    CHECK_OR(pf.h.clockSamples == 1, "clock sample at init");
  }
  return f;
}

TEST(Trace, OpLevelEventsForEveryCollective) {
  std::string dir = tempDir();
  auto outs =
      c4test::runForked(3, [&](int r, int n, const c4::UniqueId& id) { return everyCollective(r, n, id, "op", dir); });
  EXPECT_EQ(c4test::summarize(outs), "");
}

TEST(Trace, StepLevelEventsForEveryCollective) {
  std::string dir = tempDir();
  auto outs = c4test::runForked(
      3, [&](int r, int n, const c4::UniqueId& id) { return everyCollective(r, n, id, "step", dir); });
  EXPECT_EQ(c4test::summarize(outs), "");
}

// Receive-and-forward as the step trace sees it: in a 2-rank ring AllReduce every send of a
// reduced segment is posted together with the receive that reduces it (both steps begin at the
// same tick), and with C4_FORWARD=0 none is. The result is checked either way.
Failures forwardedSends(int rank, int n, const c4::UniqueId& id, bool forward, const std::string& dir, size_t* fused,
                        size_t* reduces) {
  Failures f;
  setenv("C4_TRACE", "step", 1);
  setenv("C4_TRACE_DIR", dir.c_str(), 1);
  setenv("C4_ALGO", "ring", 1);
  setenv("C4_SHM_SPREAD", "0", 1);
  setenv("C4_FORWARD", forward ? "1" : "0", 1);
  c4::Comm* comm = nullptr;
  if (!c4::commInitRank(&comm, n, id, rank).isOk()) return {"init failed"};
  const size_t count = 1 << 18;  // 1 MiB: several pipeline pieces per half
  std::vector<float> in(count), out(count, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank)) % 1000);
  c4::Status st = c4::allReduce(in.data(), out.data(), count, DataType::kFloat32, RedOp::kSum, comm);
  CHECK_OR(st.isOk(), "allReduce: " + st.toString());
  for (size_t i = 0; i < count && f.empty(); ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += static_cast<float>((i * 7 + static_cast<size_t>(r)) % 1000);
    CHECK_OR(out[i] == want, "element " + std::to_string(i));
  }
  std::vector<Event> evs;
  uint64_t dropped = 0;
  CHECK_OR(c4::trace::readEvents(comm, &evs, &dropped).isOk(), "readEvents");
  std::vector<uint64_t> reduceStarts;
  for (const Event& e : evs)
    if (e.type == EventType::kStep && static_cast<c4::trace::StepKind>(e.redop) == c4::trace::StepKind::kRecvReduce)
      reduceStarts.push_back(e.t0);
  *reduces = reduceStarts.size();
  *fused = 0;
  for (const Event& e : evs)
    if (e.type == EventType::kStep && static_cast<c4::trace::StepKind>(e.redop) == c4::trace::StepKind::kSend)
      for (uint64_t t : reduceStarts) *fused += e.t0 == t;
  CHECK_OR(c4::commDestroy(comm).isOk(), "destroy");
  return f;
}

TEST(Trace, ReducedSegmentsLeaveWithTheirReceive) {
  for (bool forward : {true, false}) {
    std::string dir = tempDir();
    auto outs = c4test::runForked(2, [&](int r, int n, const c4::UniqueId& id) {
      size_t fused = 0, reduces = 0;
      Failures f = forwardedSends(r, n, id, forward, dir, &fused, &reduces);
      if (reduces < 2) f.push_back("only " + std::to_string(reduces) + " reducing receives");
      if (forward && fused != reduces)
        f.push_back(std::to_string(fused) + " of " + std::to_string(reduces) + " reduced segments forwarded with it");
      if (!forward && fused != 0) f.push_back(std::to_string(fused) + " sends fused with C4_FORWARD=0");
      return f;
    });
    EXPECT_EQ(c4test::summarize(outs), "") << "C4_FORWARD=" << forward;
  }
}

TEST(Trace, LevelZeroRecordsNothingUntilEnabled) {
  std::string dir = tempDir();
  auto outs = c4test::runForked(2, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE", "0", 1);
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_SHM_SPREAD", "0", 1);  // exactly one event: no note from a rank moving off a shared CPU
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 5; ++i) must(c4::allReduce(x, x, 4, DataType::kFloat32, RedOp::kSum, comm), &f);
    c4::trace::Level lv = c4::trace::Level::kStep;
    CHECK_OR(c4::trace::getLevel(comm, &lv).isOk() && lv == c4::trace::Level::kOff, "level 0");
    std::vector<Event> evs;
    CHECK_OR(c4::trace::readEvents(comm, &evs).isOk() && evs.empty(), "no events at level 0");
    CHECK_OR(c4::trace::flush(comm).code() == c4::Code::kInvalidUsage, "flush without a trace");
    CHECK_OR(c4::trace::setLevel(comm, static_cast<c4::trace::Level>(7)).code() == c4::Code::kInvalidArgument,
             "bad level");
    CHECK_OR(c4::trace::setLevel(comm, c4::trace::Level::kOp).isOk(), "setLevel op");
    must(c4::allReduce(x, x, 4, DataType::kFloat32, RedOp::kSum, comm), &f);
    CHECK_OR(c4::trace::readEvents(comm, &evs).isOk() && evs.size() == 1 && evs[0].seq == 5,
             "one op after enabling (seq 5)");
    must(c4::commDestroy(comm), &f);
    return f;
  });
  EXPECT_EQ(c4test::summarize(outs), "");
}

TEST(Trace, SpansNotesAndFlush) {
  std::string dir = tempDir();
  auto outs = c4test::runForked(1, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);  // the default, also when the suite runs with C4_TRACE=0
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    uint64_t t0 = c4::trace::now();
    float x[2] = {1, 2};
    must(c4::allReduce(x, x, 2, DataType::kFloat32, RedOp::kSum, comm), &f);
    uint64_t t1 = c4::trace::now();
    CHECK_OR(c4::trace::addSpan(comm, "bucket 0", t0, t1, 8).isOk(), "addSpan");
    CHECK_OR(c4::trace::addSpan(comm, "backwards", t1, t0).code() == c4::Code::kInvalidArgument, "reversed span");
    CHECK_OR(c4::trace::addNote(comm, "hello from the test").isOk(), "addNote");
    std::string path;
    CHECK_OR(c4::trace::flush(comm, &path).isOk() && path == fileOfRank(dir, 0), "flush path " + path);
    std::vector<Event> evs;
    must(c4::trace::readEvents(comm, &evs), &f);
    CHECK_OR(evs.size() == 3 && evs[1].type == EventType::kSpan && evs[2].type == EventType::kDiag, "op, span, note");
    if (evs.size() == 3) {
      CHECK_OR(evs[1].t0 <= evs[0].t0 && evs[1].t1 >= evs[0].t1 && evs[1].bytes == 8, "span encloses the op");
      int64_t ns = c4::trace::ticksToNs(t0);
      CHECK_OR(static_cast<int64_t>(evs[1].t0) == ns, "readEvents converts like ticksToNs");
    }
    must(c4::commDestroy(comm), &f);
    return f;
  });
  ASSERT_EQ(c4test::summarize(outs), "");
  std::string out = runTool("summary " + dir);
  EXPECT_NE(out.find("bucket 0 x1"), std::string::npos) << out;
  EXPECT_NE(out.find("hello from the test"), std::string::npos) << out;
  EXPECT_NE(out.find("AllReduce"), std::string::npos) << out;
}

TEST(Trace, RingWrapsAroundInACommunicator) {
  std::string dir = tempDir();
  auto outs = c4test::runForked(2, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    setenv("C4_TRACE_BUFFER", "32", 1);
    setenv("C4_SHM_SPREAD", "0", 1);  // exactly 100 events: no note from a rank moving off a shared CPU
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    float x[2] = {1, 2};
    for (int i = 0; i < 100; ++i) must(c4::allReduce(x, x, 2, DataType::kFloat32, RedOp::kSum, comm), &f);
    std::vector<Event> evs;
    uint64_t dropped = 0;
    must(c4::trace::readEvents(comm, &evs, &dropped), &f);
    CHECK_OR(evs.size() == 31 && dropped == 69, "31 newest kept: " + std::to_string(evs.size()));
    for (size_t i = 0; i < evs.size(); ++i) CHECK_OR(evs[i].seq == 69 + i, "seq after wrap");
    must(c4::commDestroy(comm), &f);
    ParsedFile pf;
    CHECK_OR(parseFile(fileOfRank(dir, rank), &pf) && pf.h.totalEvents == 100 && pf.h.nEvents == 31, "file");
    return f;
  });
  EXPECT_EQ(c4test::summarize(outs), "");
}

TEST(Trace, ThreadRanksRecordConcurrently) {
  std::string dir = tempDir();
  // In a forked process, so this test process keeps no communicator threads.
  auto outs = c4test::runForked(1, [&](int, int, const c4::UniqueId&) {
    Failures f;
    const int rank = 0;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "step", 1);
    constexpr int kRanks = 4, kIters = 300;
    c4::Comm* comms[kRanks] = {};
    if (!c4::commInitAll(comms, kRanks).isOk()) return Failures{"commInitAll failed"};
    std::vector<std::thread> threads;
    std::vector<std::string> errs(kRanks);
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        std::vector<float> x(20000, 1.0f);
        for (int i = 0; i < kIters; ++i) {
          uint64_t t0 = c4::trace::now();
          if (!c4::allReduce(x.data(), x.data(), i % 2 ? 4 : x.size(), DataType::kFloat32, RedOp::kSum, comms[r])
                   .isOk())
            errs[r] = "allReduce failed";
          if (!c4::trace::addSpan(comms[r], "iteration", t0, c4::trace::now()).isOk()) errs[r] = "addSpan failed";
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      CHECK_OR(errs[r].empty(), errs[r]);
      std::vector<Event> evs;
      must(c4::trace::readEvents(comms[r], &evs), &f);
      size_t ops = 0, spans = 0;
      for (const Event& e : evs) {
        if (e.type == EventType::kOp) CHECK_OR(e.seq == ops++, "seq order on thread rank " + std::to_string(r));
        spans += e.type == EventType::kSpan;
      }
      CHECK_OR(ops == kIters && spans == kIters, "thread rank " + std::to_string(r) + ": " + std::to_string(ops) +
                                                     " ops, " + std::to_string(spans) + " spans");
    }
    for (int r = 0; r < kRanks; ++r) must(c4::commDestroy(comms[r]), &f);
    CHECK_OR(filesIn(dir, ".c4t").size() == kRanks, "one file per thread rank");
    return f;
  });
  EXPECT_EQ(c4test::summarize(outs), "");
}

TEST(Trace, DumpOnAbort) {
  std::string dir = tempDir();
  auto outs = c4test::runForked(2, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    float x[2] = {1, 2};
    for (int i = 0; i < 7; ++i) must(c4::allReduce(x, x, 2, DataType::kFloat32, RedOp::kSum, comm), &f);
    must(c4::commAbort(comm), &f);
    ParsedFile pf;
    CHECK_OR(parseFile(fileOfRank(dir, rank), &pf), "file after abort");
    CHECK_OR(pf.h.reason == static_cast<uint32_t>(c4::trace::DumpReason::kAbort), "reason abort");
    size_t ops = 0, errors = 0;
    for (const Event& e : pf.events) {
      ops += e.type == EventType::kOp;
      if (e.type == EventType::kError) {
        ++errors;
        CHECK_OR(std::string(pf.names.c_str() + e.seq).find("aborted the communicator") != std::string::npos,
                 "error text: " + std::string(pf.names.c_str() + e.seq));
      }
    }
    CHECK_OR(ops == 7 && errors == 1, "7 ops and the abort: " + std::to_string(ops) + ", " + std::to_string(errors));
    return f;
  });
  EXPECT_EQ(c4test::summarize(outs), "");
}

/// Forks a one-rank job that records 3 ops and then runs `end`; returns the child's wait status.
int childWithTrace(const std::string& dir, void (*end)()) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    c4::UniqueId id;
    c4::Comm* comm = nullptr;
    if (!c4::getUniqueId(&id).isOk() || !c4::commInitRank(&comm, 1, id, 0).isOk()) _exit(3);
    float x[2] = {1, 2};
    for (int i = 0; i < 3; ++i) (void)c4::allReduce(x, x, 2, DataType::kFloat32, RedOp::kSum, comm);
    end();
    // SIGUSR2 does not end the process: more work, then a normal destroy.
    ParsedFile pf;
    if (!parseFile(fileOfRank(dir, 0), &pf) || pf.h.reason != static_cast<uint32_t>(c4::trace::DumpReason::kRequest) ||
        pf.events.size() != 3)
      _exit(4);
    if (!c4::allReduce(x, x, 2, DataType::kFloat32, RedOp::kSum, comm).isOk()) _exit(5);
    if (!c4::commDestroy(comm).isOk()) _exit(6);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(Trace, DumpOnFatalSignalsThenPreviousHandlerRuns) {
  struct Case {
    int sig;
    void (*end)();
  };
  const Case cases[] = {{SIGTERM, [] { raise(SIGTERM); }}, {SIGABRT, [] { abort(); }}};
  for (const Case& c : cases) {
    std::string dir = tempDir();
    int status = childWithTrace(dir, c.end);
    // The default action still happens after the dump (the handler chains).
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == c.sig) << "status " << status << " for " << strsignal(c.sig);
    ParsedFile pf;
    ASSERT_TRUE(parseFile(fileOfRank(dir, 0), &pf)) << strsignal(c.sig);
    EXPECT_EQ(pf.h.reason, static_cast<uint32_t>(c4::trace::DumpReason::kSignal));
    EXPECT_EQ(pf.events.size(), 3u);
  }
}

TEST(Trace, DumpOnSigusr2AndWorkContinues) {
  std::string dir = tempDir();
  int status = childWithTrace(dir, [] { raise(SIGUSR2); });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: init failed, 4: no request dump";
  ParsedFile pf;
  ASSERT_TRUE(parseFile(fileOfRank(dir, 0), &pf));
  EXPECT_EQ(pf.h.reason, static_cast<uint32_t>(c4::trace::DumpReason::kDestroy));
  EXPECT_EQ(pf.events.size(), 4u);
}

TEST(Trace, ClockSkewIsRecoveredAndMergedTimelinesLineUp) {
  std::string dir = tempDir();
  const int64_t kSkew = 5000000000LL;  // rank 1's clock runs 5 s ahead
  auto outs = c4test::runForked(3, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    setenv("C4_TRACE_TEST_SKEW_NS", rank == 1 ? std::to_string(kSkew).c_str() : "0", 1);
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    std::vector<float> x(50000, 1.0f);
    for (int i = 0; i < 20; ++i)
      must(c4::allReduce(x.data(), x.data(), i % 2 ? 4 : x.size(), DataType::kFloat32, RedOp::kSum, comm), &f);
    CHECK_OR(c4::commFinalize(comm).isOk(), "finalize");
    must(c4::commDestroy(comm), &f);
    return f;
  });
  ASSERT_EQ(c4test::summarize(outs), "");
  for (int r = 0; r < 3; ++r) {
    ParsedFile pf;
    ASSERT_TRUE(parseFile(fileOfRank(dir, r), &pf)) << "rank " << r;
    EXPECT_EQ(pf.h.reason, static_cast<uint32_t>(c4::trace::DumpReason::kFinalize));
    ASSERT_EQ(pf.h.clockSamples, 2u) << "rank " << r;
    const int64_t truth = r == 1 ? -kSkew : 0;  // rank 0's clock minus this rank's (one host)
    for (int k = 0; k < 2; ++k) {
      const c4::trace::ClockSample& s = pf.h.clock[k];
      // NTP bound: the error is at most half the round trip (plus the clock reads' own cost).
      const int64_t bound = s.rttNs / 2 + 2000;
      printf("rank %d sample %d: offset %lld ns (truth %lld), rtt %lld ns, error %lld ns, bound %lld ns\n", r, k,
             static_cast<long long>(s.offsetNs), static_cast<long long>(truth), static_cast<long long>(s.rttNs),
             static_cast<long long>(s.offsetNs - truth), static_cast<long long>(bound));
      EXPECT_LE(std::llabs(s.offsetNs - truth), bound) << "rank " << r << " sample " << k;
      if (r == 0) {
        EXPECT_EQ(s.rttNs, 0);
      }
      // Rank 2 reads rank 0's very clock (same kernel, no skew): no ping-pong, offset exactly 0.
      // Rank 1's skewed clock is measured.
      if (r == 2) {
        EXPECT_EQ(s.rttNs, 0);
        EXPECT_EQ(s.offsetNs, 0);
      }
      if (r == 1) {
        EXPECT_GT(s.rttNs, 0);
      }
    }
  }
  // Merged by c4-trace: without alignment the activity would span more than 5 s.
  std::string out = runTool("report " + dir + " -o " + dir + "/r.html --json " + dir + "/r.json --quiet");
  ASSERT_EQ(out.find("[exit status"), std::string::npos) << out;
  std::ifstream in(dir + "/r.json");
  std::string js((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = js.find("\"span_ns\":");
  ASSERT_NE(at, std::string::npos) << js.substr(0, 500);
  long long span = atoll(js.c_str() + at + 10);
  printf("merged activity spans %lld ns\n", span);
  EXPECT_GT(span, 0);
  EXPECT_LT(span, kSkew / 2);
}

// The writer used to open "<file>.tmp" with O_CREAT|O_TRUNC, following a link
// planted there (a predictable name: the tag repeats between torchrun runs). Now neither a link at
// the temporary name nor one at the final name gets written through.
TEST(TraceFiles, DumpDoesNotWriteThroughAPlantedLink) {
  std::string dir = tempDir();
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "precious"; }
  auto outs = c4test::runForked(1, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    setenv("C4_TRACE_DIR", dir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    c4::Comm* comm = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    std::string path;
    CHECK_OR(c4::trace::flush(comm, &path).isOk(), "first flush");
    unlink(path.c_str());
    CHECK_OR(symlink(victim.c_str(), (path + ".tmp").c_str()) == 0, "plant the .tmp link");
    CHECK_OR(symlink(victim.c_str(), path.c_str()) == 0, "plant the final link");
    CHECK_OR(c4::trace::flush(comm, &path).isOk(), "flush with links planted");
    struct stat st;
    CHECK_OR(lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0,
             "the trace file is a regular file readable by its owner only");
    must(c4::commDestroy(comm), &f);
    return f;
  });
  ASSERT_EQ(c4test::summarize(outs), "");
  std::string content;
  std::getline(std::ifstream(victim), content);
  EXPECT_EQ(content, "precious") << "the trace writer wrote through a planted link";
}

// Without C4_TRACE_DIR traces go under $TMPDIR/c4trace-<uid>, made private (0700); a base that
// others can write to is refused with a warning (traces stay in memory), and job directories older
// than C4_TRACE_KEEP_DAYS are pruned there.
TEST(TraceFiles, DefaultDirectoryIsPrivateRefusedOrPruned) {
  for (int variant = 0; variant < 2; ++variant) {
    const std::string tmp = tempDir();
    const std::string base = tmp + "/c4trace-" + std::to_string(geteuid());
    if (variant == 1) {
      ASSERT_EQ(mkdir(base.c_str(), 0700), 0);
      ASSERT_EQ(chmod(base.c_str(), 0777), 0);  // anyone may plant files here
    } else {
      ASSERT_EQ(mkdir(base.c_str(), 0700), 0);
      for (const char* job : {"old-job", "young-job"}) {
        const std::string d = base + "/" + job;
        ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
        std::ofstream(d + "/x.r0.c4t") << "x";
      }
      struct timeval tv[2] = {{time(nullptr) - 10 * 86400, 0}, {time(nullptr) - 10 * 86400, 0}};
      ASSERT_EQ(utimes((base + "/old-job").c_str(), tv), 0);
    }
    auto outs = c4test::runForked(1, [&](int rank, int n, const c4::UniqueId& id) {
      Failures f;
      unsetenv("C4_TRACE_DIR");
      setenv("TMPDIR", tmp.c_str(), 1);
      setenv("C4_TRACE", "op", 1);
      c4::Comm* comm = nullptr;
      if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
      std::string path;
      c4::Status st = c4::trace::flush(comm, &path);
      if (variant == 0) {
        CHECK_OR(st.isOk() && path.compare(0, base.size(), base) == 0, "trace not under " + base + ": " + path);
        struct stat sb;
        CHECK_OR(lstat(base.c_str(), &sb) == 0 && (sb.st_mode & 0777) == 0700, "base not 0700");
      } else {
        CHECK_OR(!st.isOk() && st.message().find("not private") != std::string::npos,
                 "a world-writable base was used: " + st.toString());
      }
      must(c4::commDestroy(comm), &f);
      return f;
    });
    ASSERT_EQ(c4test::summarize(outs), "") << "variant " << variant;
    struct stat sb;
    if (variant == 0) {
      EXPECT_NE(lstat((base + "/old-job").c_str(), &sb), 0) << "the 10-day-old job directory was not pruned";
      EXPECT_EQ(lstat((base + "/young-job/x.r0.c4t").c_str(), &sb), 0) << "a recent job directory was pruned";
    } else {
      DIR* d = opendir(base.c_str());
      int entries = 0;
      while (d && readdir(d)) ++entries;
      if (d) closedir(d);
      EXPECT_EQ(entries, 2) << "something was written into the refused base";
    }
  }
}

/// What the ranks log (at the default level) when C4_TRACE_DIR is `traceDir`: `nranks` forked ranks
/// each make a communicator and, with `split`, a second one from it; *outcome gets their failures.
std::string logWithTraceDir(const std::string& traceDir, int nranks, bool split, std::string* outcome) {
  char logPath[] = "/tmp/c4-trace-dir-log-XXXXXX";
  const int logFd = mkstemp(logPath);
  if (logFd < 0) return "mkstemp failed";
  auto outs = c4test::runForked(nranks, [&](int rank, int n, const c4::UniqueId& id) {
    Failures f;
    unsetenv("C4_DEBUG");
    c4::reloadLogConfig();
    setenv("C4_TRACE_DIR", traceDir.c_str(), 1);
    setenv("C4_TRACE", "op", 1);
    dup2(logFd, 2);
    c4::Comm* comm = nullptr;
    c4::Comm* child = nullptr;
    if (!c4::commInitRank(&comm, n, id, rank).isOk()) return Failures{"init failed"};
    // A second communicator of the process: no second warning.
    if (split && !c4::commSplit(comm, 0, rank, &child).isOk()) f.push_back("split failed");
    if (child) must(c4::commDestroy(child), &f);
    must(c4::commDestroy(comm), &f);
    return f;
  });
  *outcome = c4test::summarize(outs);
  std::ifstream in(logPath);
  std::stringstream ss;
  ss << in.rdbuf();
  close(logFd);
  unlink(logPath);
  return ss.str();
}

// A C4_TRACE_DIR that cannot be written used to be noticed only with C4_DEBUG=WARN. The
// warning is now printed whatever the log level, once per directory; init still succeeds.
TEST(TraceFiles, UnwritableDirectoryIsReportedWhateverTheLogLevel) {
  const std::string dir = tempDir();
  { std::ofstream(dir + "/a-file") << "x"; }
  const std::string bad = dir + "/a-file/traces";  // under a regular file: cannot be made
  std::string outcome;
  const std::string log = logWithTraceDir(bad, 2, true, &outcome);
  ASSERT_EQ(outcome, "");
  EXPECT_NE(log.find("cannot create directory " + bad), std::string::npos) << log;
  size_t lines = 0;
  for (size_t at = log.find("traces stay in memory"); at != std::string::npos;
       at = log.find("traces stay in memory", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2u) << "one warning per process (2 ranks, 2 communicators each):\n" << log;
}

// C4_TRACE_DIR naming a regular file said "Permission denied"; it says what it is.
TEST(TraceFiles, ADirectoryThatIsAFileIsCalledSo) {
  const std::string dir = tempDir();
  const std::string file = dir + "/a-file";
  { std::ofstream(file) << "x"; }
  std::string outcome;
  const std::string log = logWithTraceDir(file, 1, false, &outcome);
  ASSERT_EQ(outcome, "");
  EXPECT_NE(log.find(file + " is not a directory"), std::string::npos) << log;
  EXPECT_EQ(log.find("Permission denied"), std::string::npos) << log;
}

}  // namespace
