// C4D end to end: real faults in forked ranks, each diagnosed with the right class and culprit on
// the survivors, within C4_TIMEOUT + 5 s, and no diagnosis at all in a clean run (docs/c4d.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <thread>

#include "c4comm/c4comm.hpp"
#include "tests/coll/harness.hpp"

using c4test::Failures;
using c4test::monoMs;
using c4test::runForked;
using c4test::ScopedEnv;

namespace {

/// pids of the ranks, in memory the forked ranks share.
struct Shared {
  std::atomic<pid_t> pid[8];
  std::atomic<int> flag[8];
  static Shared* make() {
    void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    auto* s = new (p) Shared();
    for (int i = 0; i < 8; ++i) s->pid[i] = 0, s->flag[i] = 0;
    return s;
  }
  void killAll() {
    for (int i = 0; i < 8; ++i)
      if (pid[i].load() > 0) kill(pid[i].load(), SIGKILL);
  }
  ~Shared() = default;
};

/// A fresh directory for C4_DIAG_FILE, removed with what it holds at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/c4d-test-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

/// The failures of a diagnosis check: class `kind` naming rank `culprit` in the error and in the
/// diagnoses of `comm`.
Failures expectDiagnosis(c4::Comm* comm, const c4::Status& st, const char* kind, int culprit) {
  Failures f;
  const std::string tag = std::string("[C4D ") + kind;
  if (st.isOk()) f.push_back("the operation succeeded");
  if (st.message().find(tag) == std::string::npos) f.push_back("error without '" + tag + "': " + st.message());
  if (c4::commGetAsyncError(comm).message().find(tag) == std::string::npos)
    f.push_back("async error without the diagnosis: " + c4::commGetAsyncError(comm).message());
  std::vector<c4::Diagnosis> ds;
  if (!c4::getDiagnoses(comm, &ds).isOk()) f.push_back("getDiagnoses failed");
  bool found = false;
  for (const auto& d : ds)
    if (d.kind == kind && std::find(d.ranks.begin(), d.ranks.end(), culprit) != d.ranks.end()) found = true;
  if (!found) {
    std::string all;
    for (const auto& d : ds) all += "\n  " + d.kind + ": " + d.summary;
    f.push_back(std::string("no ") + kind + " diagnosis naming rank " + std::to_string(culprit) + " among:" + all);
  }
  return f;
}

void append(Failures* a, const Failures& b) { a->insert(a->end(), b.begin(), b.end()); }

// SIGKILL of a rank in the middle of an AllReduce: every survivor's call fails within C4_TIMEOUT
// + 5 s with a dead_rank diagnosis naming it, in the error, getDiagnoses, C4_DIAG_FILE and the
// callback.
TEST(C4D, KilledRankDuringAllReduceIsADeadRank) {
  const TempDir tmp;
  ASSERT_FALSE(tmp.path.empty()) << "mkdtemp: " << strerror(errno);
  const std::string& dir = tmp.path;
  ScopedEnv diag("C4_DIAG_FILE", (dir + "/diag.r%r.jsonl").c_str());
  ScopedEnv timeout("C4_TIMEOUT", "20");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  Shared* sh = Shared::make();
  auto outs = runForked(
      4,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        sh->pid[rank] = getpid();
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::atomic<int> calls{0};
        (void)c4::setDiagnosisCallback(comm, [&](const c4::Diagnosis& d) {
          if (d.kind == "dead_rank") calls.fetch_add(1);
        });
        std::vector<float> b(size_t{1} << 22, 1.0f);  // 16 MiB: each call takes a while
        std::thread killer;
        if (rank == 0)
          killer = std::thread([sh] {
            usleep(300000);
            sh->flag[7] = static_cast<int>(monoMs() % 1000000000);
            kill(sh->pid[2].load(), SIGKILL);
          });
        int64_t failedAt = 0, killAt = 0;
        for (int k = 0; k < 100000 && st.isOk(); ++k) {
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (!st.isOk()) failedAt = monoMs();
        }
        if (killer.joinable()) killer.join();
        killAt = sh->flag[7].load();
        Failures f = expectDiagnosis(comm, st, "dead_rank", 2);
        // The figure of docs/performance.md ("C4D"): kill to the survivor's failed call.
        std::fprintf(stderr, "[C4D-FIGURE] rank %d: SIGKILL to dead_rank error: %lld ms\n", rank,
                     static_cast<long long>(failedAt % 1000000000 - killAt));
        if (failedAt % 1000000000 - killAt > 20000 + 5000) f.push_back("slower than C4_TIMEOUT + 5 s");
        if (calls.load() < 1) f.push_back("the callback saw no dead_rank");
        const std::string file = readFile(dir + "/diag.r" + std::to_string(rank) + ".jsonl");
        if (file.find("\"class\":\"dead_rank\"") == std::string::npos ||
            file.find("\"ranks\":[2]") == std::string::npos)
          f.push_back("C4_DIAG_FILE has no dead_rank record naming rank 2: " + file);
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  sh->killAll();
  for (int r : {0, 1, 3})
    EXPECT_TRUE(outs[r].detail.empty() && !outs[r].crashed) << "rank " << r << ": " << outs[r].detail;
  EXPECT_TRUE(outs[2].crashed);
}

/// Three ranks run `warmups` AllReduces; rank 1 then stops (SIGSTOP) and the others enter the next
/// one. `check(comm, st, tookMs)` judges a survivor's failed call; once both survivors judged, rank
/// 0 kills the stopped rank. Returns the survivors' failures.
std::string stoppedRankBetweenCollectives(int warmups,
                                          const std::function<Failures(c4::Comm*, const c4::Status&, int64_t)>& check) {
  Shared* sh = Shared::make();
  auto outs = runForked(
      3,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        sh->pid[rank] = getpid();
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<float> b(4096, 1.0f);
        for (int k = 0; k < warmups; ++k) {
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (!st.isOk()) return {"warm-up: " + st.toString()};
        }
        if (rank == 1) {
          raise(SIGSTOP);  // rank 0 kills this process
          return {"rank 1 ran on after SIGSTOP"};
        }
        const int64_t t0 = monoMs();
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f = check(comm, st, monoMs() - t0);
        // The stopped rank goes once both survivors have their diagnosis.
        sh->flag[0].fetch_add(1);
        for (int i = 0; i < 1000 && sh->flag[0].load() < 2; ++i) usleep(10000);
        if (rank == 0) kill(sh->pid[1].load(), SIGKILL);
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  sh->killAll();
  std::string bad;
  for (int r : {0, 2})
    if (!outs[r].detail.empty() || outs[r].crashed) bad += "rank " + std::to_string(r) + ": " + outs[r].detail + "\n";
  return bad;
}

// SIGSTOP of a rank between two collectives: the others enter the next one and wait. Its
// heartbeats stop too, but it had not entered: a non-communication hang naming it.
TEST(C4D, StoppedRankBetweenCollectivesIsANonCommunicationHang) {
  ScopedEnv timeout("C4_TIMEOUT", "3");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  ScopedEnv hbt("C4_HEARTBEAT_TIMEOUT", "1500");
  EXPECT_EQ(stoppedRankBetweenCollectives(
                5,
                [](c4::Comm* comm, const c4::Status& st, int64_t took) {
                  Failures f = expectDiagnosis(comm, st, "noncomm_hang", 1);
                  if (took > 3000 + 5000) f.push_back("took " + std::to_string(took) + " ms (C4_TIMEOUT 3 s + 5 s)");
                  std::fprintf(stderr, "[C4D-FIGURE] stopped rank to noncomm_hang error: %lld ms (C4_TIMEOUT 3 s)\n",
                               static_cast<long long>(took));
                  if (st.message().find("never entered collective seq 5") == std::string::npos)
                    f.push_back("does not say which collective: " + st.message());
                  return f;
                }),
            "");
}

// Defect: with C4_TIMEOUT below C4_HEARTBEAT_TIMEOUT, a SIGSTOPped rank was called "alive, busy
// outside c4comm" (its last heartbeat was younger than the heartbeat timeout, and its sequence
// number stale). Now a rank whose heartbeats stopped is frozen or unreachable whichever timeout is
// shorter: the diagnosis waits until its silence reaches five heartbeat periods (or the heartbeat
// timeout, if shorter) or a fresh heartbeat comes.
TEST(C4D, StoppedRankIsFrozenWhenTheTimeoutIsShorterThanTheHeartbeatTimeout) {
  ScopedEnv timeout("C4_TIMEOUT", "2");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  ScopedEnv hbt("C4_HEARTBEAT_TIMEOUT", "4000");
  EXPECT_EQ(stoppedRankBetweenCollectives(3,
                                          [](c4::Comm* comm, const c4::Status& st, int64_t) {
                                            Failures f = expectDiagnosis(comm, st, "noncomm_hang", 1);
                                            if (st.message().find("heartbeat stopped") == std::string::npos ||
                                                st.message().find("busy outside c4comm") != std::string::npos)
                                              f.push_back("does not say its heartbeat stopped: " + st.message());
                                            return f;
                                          }),
            "");
}

// Defect: a rank waiting in ncclCommWindowRegister (a collective registration the others
// did not call) was called "busy outside c4comm". Now its heartbeats say where it waits.
TEST(C4D, ARankInAnotherLibraryCallIsNotBusyOutsideC4comm) {
  ScopedEnv timeout("C4_TIMEOUT", "2");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  auto outs = runForked(
      3,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<float> b(1024, 1.0f);
        st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        if (!st.isOk()) return {"warm-up: " + st.toString()};
        Failures f;
        if (rank == 1) {
          void* win = nullptr;
          c4::Window* w = nullptr;
          if (!c4::memAlloc(&win, 4096).isOk()) return {"memAlloc"};
          st = c4::windowRegister(comm, win, 4096, 0, &w);  // the others never register: it fails
          if (st.isOk()) f.push_back("windowRegister succeeded alone");
        } else {
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          append(&f, expectDiagnosis(comm, st, "noncomm_hang", 1));
          if (st.message().find("inside c4comm in ncclCommWindowRegister") == std::string::npos)
            f.push_back("does not say where rank 1 waits: " + st.message());
        }
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  for (int r : {0, 1, 2})
    EXPECT_TRUE(outs[r].detail.empty() && !outs[r].crashed) << "rank " << r << ": " << outs[r].detail;
}

// A rank busy outside c4comm (alive: its heartbeats go on) longer than C4_TIMEOUT: a
// non-communication hang naming it, and saying it is alive. C4_FAULT injects the delay.
TEST(C4D, BusyRankIsANonCommunicationHangAndAlive) {
  ScopedEnv timeout("C4_TIMEOUT", "2");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  ScopedEnv fault("C4_FAULT", "delay:rank=2,op=3,ms=6000");
  auto outs = runForked(
      3,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<int32_t> b(1000, 1);
        for (int k = 0; k < 6 && st.isOk(); ++k)
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kInt32, c4::RedOp::kSum, comm);
        Failures f;
        if (rank != 2) {
          append(&f, expectDiagnosis(comm, st, "noncomm_hang", 2));
          if (st.message().find("it is alive") == std::string::npos)
            f.push_back("does not say it is alive: " + st.message());
        } else if (st.isOk()) {
          f.push_back("the late rank's call succeeded");
        }
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_EQ(c4test::summarize(outs), "");
}

// A straggler: one rank sleeps 150 ms before every collective. Nothing hangs, every call
// succeeds, and the reporter names it as noncomm_slow, about 150 ms late; every rank hears of it.
TEST(C4D, RankArrivingLateIsAStragglerNotAHang) {
  ScopedEnv timeout("C4_TIMEOUT", "10");
  ScopedEnv hb("C4_HEARTBEAT_MS", "100");
  ScopedEnv fault("C4_FAULT", "delay:rank=1,from=0,ms=150");
  // The straggler threshold well below the delay: once in CI (2 cores, these 3 ranks beside 8-rank
  // tests) no look found rank 1 in 120 collectives. Three looks in a row must agree, each on a
  // median lateness at or above the threshold, and the default (100 ms) left a delay of 150 ms
  // only 50 ms for descheduling to eat.
  ScopedEnv straggler("C4_STRAGGLER_MS", "50");
  auto outs = runForked(
      3,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<float> b(1 << 14, 1.0f);
        Failures f;
        std::vector<c4::Diagnosis> ds;
        bool seen = false;
        for (int k = 0; k < 120 && !seen; ++k) {
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (!st.isOk()) return {"collective " + std::to_string(k) + " failed: " + st.toString()};
          (void)c4::getDiagnoses(comm, &ds);
          int found = 0;
          for (const auto& d : ds) found += d.kind == "noncomm_slow" && d.ranks == std::vector<int>{1};
          // Every rank stops at the same collective: the flag rides on the data.
          float mine = found ? 1.0f : 0.0f, all = 0;
          st = c4::allReduce(&mine, &all, 1, c4::DataType::kFloat32, c4::RedOp::kMin, comm);
          if (!st.isOk()) return {"flag: " + st.toString()};
          seen = all > 0.5f;
        }
        if (!seen) f.push_back("no noncomm_slow naming rank 1 after 120 collectives");
        for (const auto& d : ds) {
          if (d.kind != "noncomm_slow") f.push_back("unexpected " + d.kind + ": " + d.summary);
          // A rank that sleeps 150 ms wakes later on a loaded 2-core CI machine (3 ranks and another
          // test side by side): 582 ms was measured once there. Still a straggler, and far from 0.
          if (d.kind == "noncomm_slow" && (d.lateMs < 50 || d.lateMs > 1000))
            f.push_back("late by " + std::to_string(d.lateMs) + " ms, not about 150: " + d.summary);
        }
        (void)c4::commDestroy(comm);
        return f;
      },
      120);
  EXPECT_EQ(c4test::summarize(outs), "");
}

// A stalled connection (C4_FAULT: rank 0 stops reading and writing its only lane to rank 1, as a
// cut cable would) over tcp: every rank entered the collective, nothing moves between 0 and 1: a
// communication hang naming that pair.
TEST(C4D, StalledLinkIsACommunicationHangNamingThePair) {
  ScopedEnv transport("C4_TRANSPORT", "tcp");
  ScopedEnv lanes("C4_LANES", "1");
  ScopedEnv timeout("C4_TIMEOUT", "3");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  ScopedEnv fault("C4_FAULT", "stall:rank=0,peer=1,op=4");
  auto outs = runForked(
      3,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<float> b(size_t{1} << 20, 1.0f);  // 4 MiB: more than the socket buffers hold
        for (int k = 0; k < 6 && st.isOk(); ++k)
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
        Failures f;
        if (st.isOk()) f.push_back("the collectives succeeded over a stalled link");
        if (st.message().find("[C4D comm_hang") == std::string::npos)
          f.push_back("no comm_hang in the error: " + st.message());
        std::vector<c4::Diagnosis> ds;
        (void)c4::getDiagnoses(comm, &ds);
        bool named = false;
        for (const auto& d : ds)
          for (const auto& l : d.links) named |= d.kind == "comm_hang" && l == std::make_pair(0, 1);
        if (!named) f.push_back("no comm_hang naming the link 0-1: " + st.message());
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  EXPECT_EQ(c4test::summarize(outs), "");
}

// A clean run with noisy timing (random pauses up to 30 ms, mixed sizes, point-to-point too)
// produces no diagnosis at all.
TEST(C4D, CleanNoisyRunHasNoDiagnosis) {
  ScopedEnv hb("C4_HEARTBEAT_MS", "100");
  auto outs = runForked(
      4,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        unsigned seed = 12345u + static_cast<unsigned>(rank), common = 777u;  // sizes alike, pauses not
        std::vector<float> b(size_t{1} << 20, 1.0f), r(size_t{1} << 20);
        for (int k = 0; k < 250; ++k) {  // about 5 s
          usleep(static_cast<useconds_t>(rand_r(&seed) % 30000));
          const size_t count = size_t{1} << (rand_r(&common) % 21);
          st = c4::allReduce(b.data(), r.data(), count, c4::DataType::kFloat32, c4::RedOp::kSum, comm);
          if (!st.isOk()) return {"allReduce: " + st.toString()};
          const int peer = rank ^ 1;
          (void)c4::groupStart();
          (void)c4::send(b.data(), 1024, c4::DataType::kFloat32, peer, comm);
          (void)c4::recv(r.data(), 1024, c4::DataType::kFloat32, peer, comm);
          st = c4::groupEnd();
          if (!st.isOk()) return {"send/recv: " + st.toString()};
        }
        std::vector<c4::Diagnosis> ds;
        (void)c4::getDiagnoses(comm, &ds);
        Failures f;
        for (const auto& d : ds) f.push_back("false diagnosis " + d.kind + ": " + d.summary);
        (void)c4::commDestroy(comm);
        return f;
      },
      120);
  EXPECT_EQ(c4test::summarize(outs), "");
}

// Isolate and continue: a rank dies, the survivors read the culprit from the diagnosis, shrink the
// communicator without it and go on; the results are right.
TEST(C4D, SurvivorsShrinkAroundTheDiagnosedRankAndContinue) {
  ScopedEnv timeout("C4_TIMEOUT", "20");
  ScopedEnv hb("C4_HEARTBEAT_MS", "200");
  ScopedEnv fault("C4_FAULT", "kill:rank=3,op=4");
  auto outs = runForked(
      4,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (!st.isOk()) return {"init: " + st.toString()};
        std::vector<double> b(1 << 16);
        for (int k = 0; k < 8 && st.isOk(); ++k) {
          for (auto& x : b) x = rank + 1;
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat64, c4::RedOp::kSum, comm);
        }
        if (st.isOk()) return {"no failure"};
        std::vector<c4::Diagnosis> ds;
        (void)c4::getDiagnoses(comm, &ds);
        std::vector<int> culprits;
        for (const auto& d : ds)
          if (d.kind == "dead_rank") culprits = d.ranks;
        if (culprits != std::vector<int>{3}) return {"culprits not {3}: " + st.message()};
        c4::Comm* small = nullptr;
        st = c4::commShrink(comm, culprits.data(), static_cast<int>(culprits.size()), &small);
        if (!st.isOk()) return {"shrink: " + st.toString()};
        Failures f;
        for (int k = 0; k < 5; ++k) {
          for (auto& x : b) x = rank + 1;
          st = c4::allReduce(b.data(), b.data(), b.size(), c4::DataType::kFloat64, c4::RedOp::kSum, small);
          if (!st.isOk()) return {"after shrink: " + st.toString()};
          if (b[0] != 6.0 || b.back() != 6.0) f.push_back("wrong sum after shrink: " + std::to_string(b[0]));
        }
        (void)c4::commDestroy(small);
        (void)c4::commAbort(comm);
        return f;
      },
      60);
  for (int r : {0, 1, 2})
    EXPECT_TRUE(outs[r].detail.empty() && !outs[r].crashed) << "rank " << r << ": " << outs[r].detail;
  EXPECT_TRUE(outs[3].crashed);
}

// A bad C4_FAULT fails init with an error naming it.
TEST(C4D, BadFaultSpecFailsInit) {
  ScopedEnv fault("C4_FAULT", "kill:rank=1");
  auto outs = runForked(
      2,
      [&](int rank, int n, const c4::UniqueId& id) -> Failures {
        c4::Comm* comm = nullptr;
        c4::Status st = c4::commInitRank(&comm, n, id, rank);
        if (st.isOk()) {
          (void)c4::commDestroy(comm);
          return {"init succeeded"};
        }
        if (st.message().find("C4_FAULT") == std::string::npos)
          return {"error does not name C4_FAULT: " + st.message()};
        return {};
      },
      60);
  EXPECT_EQ(c4test::summarize(outs), "");
}

}  // namespace
