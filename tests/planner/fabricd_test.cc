// c4-fabricd, the fabric service (docs/c4p.md "The fabric service"), as a real process on a real
// socket: each test starts its own daemon on an ephemeral port (its port file in a temporary
// directory), talks to it through plan::FabricClient or a raw socket, and kills it at the end.
// Jobs placed apart, release, leases, renewals, strangers and junk refused, malformed requests
// answered, SIGTERM and restarts on the same or a fresh database. Deadlines are hang guards only.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.hpp"
#include "common/socket.hpp"
#include "planner/fabric_client.hpp"
#include "planner/fabric_wire.hpp"
#include "planner/planner.hpp"
#include "planner/topology.hpp"
#include "planner_fixtures.hpp"

#ifndef C4_TEST_FABRICD
#error "C4_TEST_FABRICD (the c4-fabricd binary) must be defined by the build"
#endif

namespace {

using c4::Status;
using c4::plan::FabricClient;
using c4::plan::HostPort;
using c4::plan::PlannedConn;
using c4::plan::RankPlace;
using c4::plan::Topology;
namespace wire = c4::plan::wire;
namespace detail = c4::detail;
using json = nlohmann::json;

constexpr int64_t kHangMs = 30000;  // a hang guard, never a margin
constexpr double kBytes = 1e9;      // each way of a 2-rank ring: 8 s on a 1 Gbit/s link

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool writeFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fchmod(fd, mode);
  close(fd);
  return ok;
}

void pause10ms() { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }

std::string hexId(uint64_t id) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(id));
  return b;
}

bool sameConns(const std::vector<PlannedConn>& x, const std::vector<PlannedConn>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].a != y[i].a || x[i].b != y[i].b || x[i].lanes.size() != y[i].lanes.size()) return false;
    for (size_t l = 0; l < x[i].lanes.size(); ++l) {
      const auto &p = x[i].lanes[l], &q = y[i].lanes[l];
      if (p.localPort != q.localPort || p.remotePort != q.remotePort || p.path != q.path || p.backPath != q.backPath ||
          p.sourcePort != q.sourcePort || p.sourceRange.lo != q.sourceRange.lo ||
          p.sourceRange.hi != q.sourceRange.hi || p.retired != q.retired)
        return false;
    }
  }
  return true;
}

class FabricdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "c4-fabricd-test-XXXXXX";
    ASSERT_NE(mkdtemp(&tmpl[0]), nullptr) << strerror(errno);
    dir_ = tmpl;
    topoPath_ = dir_ + "/topo.json";
    keyPath_ = dir_ + "/key";
    db_ = dir_ + "/fabric.db";
    ASSERT_TRUE(writeFile(topoPath_, c4test::kNetlabTopo, 0644));
    ASSERT_TRUE(writeFile(keyPath_, "a secret of the test's own, 42 bytes long\n", 0600));
    ASSERT_TRUE(Topology::load(topoPath_, &topo_).isOk());
    ASSERT_TRUE(c4::plan::readKeyFile(keyPath_, &key_).isOk());
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    if (HasFailure())
      for (int i = 0; i < starts_; ++i) {
        const std::string log = dir_ + "/daemon" + std::to_string(i) + ".log";
        fprintf(stderr, "---- %s ----\n%s", log.c_str(), readFile(log).c_str());
      }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  /// Starts c4-fabricd (fork/exec, stderr to its log) with --listen 127.0.0.1:0 --port-file, and
  /// waits for the port file. `db` defaults to the test's database.
  ::testing::AssertionResult start(std::vector<std::string> extra = {}, const std::string& db = "",
                                   const std::string& topo = "") {
    if (pid_ > 0) return ::testing::AssertionFailure() << "a daemon is running already";
    const std::string portFile = dir_ + "/port" + std::to_string(starts_);
    std::vector<std::string> args = {C4_TEST_FABRICD,
                                     "--topo",
                                     topo.empty() ? topoPath_ : topo,
                                     "--key-file",
                                     keyPath_,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--port-file",
                                     portFile,
                                     "--db",
                                     db.empty() ? db_ : db};
    args.insert(args.end(), extra.begin(), extra.end());
    logPath_ = dir_ + "/daemon" + std::to_string(starts_++) + ".log";
    pid_ = spawn(args, logPath_);
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork: " << strerror(errno);
    const int64_t deadline = detail::nowMs() + kHangMs;
    for (;;) {
      const std::string text = readFile(portFile);
      if (!text.empty() && text.back() == '\n') {
        port_ = std::stoi(text);
        addr_ = "127.0.0.1:" + std::to_string(port_);
        return ::testing::AssertionSuccess();
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure() << "c4-fabricd exited (status " << st << ") before listening:\n"
                                             << readFile(logPath_);
      }
      if (detail::nowMs() > deadline)
        return ::testing::AssertionFailure() << "no port file after " << kHangMs << " ms:\n" << readFile(logPath_);
      pause10ms();
    }
  }

  static pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int logFd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int nullFd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(nullFd, 0);
      dup2(logFd, 1);
      dup2(logFd, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(logFd);
    close(nullFd);
    return pid;
  }

  /// Runs c4-fabricd with `args` to its end (it must not start serving); its exit status and log.
  static int runToExit(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> all = {C4_TEST_FABRICD};
    all.insert(all.end(), args.begin(), args.end());
    const pid_t pid = spawn(all, log);
    const int64_t deadline = detail::nowMs() + kHangMs;
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
      if (detail::nowMs() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
      }
      pause10ms();
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  /// Sends `sig` and reaps the daemon; its wait status, or -1 after kHangMs.
  int stop(int sig = SIGTERM) {
    kill(pid_, sig);
    const int64_t deadline = detail::nowMs() + kHangMs;
    int st = 0;
    while (waitpid(pid_, &st, WNOHANG) != pid_) {
      if (detail::nowMs() > deadline) return -1;
      pause10ms();
    }
    pid_ = -1;
    return st;
  }

  bool alive() const {
    int st = 0;
    return pid_ > 0 && waitpid(pid_, &st, WNOHANG) == 0;
  }

  /// Until the daemon's log has `text` (kHangMs at most).
  ::testing::AssertionResult logged(const std::string& text) {
    const int64_t deadline = detail::nowMs() + kHangMs;
    while (readFile(logPath_).find(text) == std::string::npos) {
      if (detail::nowMs() > deadline)
        return ::testing::AssertionFailure() << "no \"" << text << "\" in the log:\n" << readFile(logPath_);
      pause10ms();
    }
    return ::testing::AssertionSuccess();
  }

  Status call(const wire::Request& req, wire::Reply* rep, const wire::Key* key = nullptr) {
    std::unique_ptr<FabricClient> c;
    Status st = FabricClient::connect(addr_, key ? *key : key_, kHangMs, &c);
    if (!st.isOk()) return st;
    return c->call(req, rep, kHangMs);
  }

  wire::JobSpec spec(const std::string& name, int hostA, int hostB) const {
    wire::JobSpec j;
    j.name = name;
    j.topoHash = topo_.hash();
    for (int h : {hostA, hostB}) {
      RankPlace r;
      r.host = h;
      r.ports = {0};
      r.listenPorts = {0};
      j.ranks.push_back(r);
    }
    j.flows = c4test::ringFlows(2, kBytes);
    j.lanes = 1;
    return j;
  }

  wire::Reply registerJob(const wire::JobSpec& j, int64_t leaseMs = 600000) {
    wire::Request req;
    req.op = wire::Op::kRegister;
    req.job = j;
    req.leaseMs = leaseMs;
    wire::Reply rep;
    Status st = call(req, &rep);
    EXPECT_TRUE(st.isOk()) << st.toString();
    EXPECT_TRUE(rep.ok) << rep.error;
    return rep;
  }

  wire::Reply renew(uint64_t id, uint64_t token, int64_t leaseMs) {
    wire::Request req;
    req.op = wire::Op::kRenew;
    req.id = id;
    req.token = token;
    req.leaseMs = leaseMs;
    wire::Reply rep;
    Status st = call(req, &rep);
    EXPECT_TRUE(st.isOk()) << st.toString();
    return rep;
  }

  wire::Reply release(uint64_t id, uint64_t token) {
    wire::Request req;
    req.op = wire::Op::kRelease;
    req.id = id;
    req.token = token;
    wire::Reply rep;
    Status st = call(req, &rep);
    EXPECT_TRUE(st.isOk()) << st.toString();
    return rep;
  }

  json status() {
    wire::Request req;
    req.op = wire::Op::kStatus;
    wire::Reply rep;
    Status st = call(req, &rep);
    EXPECT_TRUE(st.isOk()) << st.toString();
    EXPECT_TRUE(rep.ok) << rep.error;
    json v = json::parse(rep.status, nullptr, false);
    EXPECT_TRUE(v.is_object()) << rep.status;
    return v.is_object() ? v : json::object();
  }

  /// The job's entry in the service's view (null if it is not there).
  json statusJob(const json& st, uint64_t id) {
    for (const json& j : st.value("jobs", json::array()))
      if (j.value("id", std::string()) == hexId(id)) return j;
    return json();
  }

  /// Until the service no longer lists job `id` (kHangMs at most).
  ::testing::AssertionResult gone(uint64_t id) {
    const int64_t deadline = detail::nowMs() + kHangMs;
    while (!statusJob(status(), id).is_null()) {
      if (detail::nowMs() > deadline) return ::testing::AssertionFailure() << "job " << hexId(id) << " still listed";
      pause10ms();
    }
    return ::testing::AssertionSuccess();
  }

  /// The spine the first lane of a 2-rank job's plan crosses ("spine0").
  std::string spineOf(const wire::JobSpec& j, const std::vector<PlannedConn>& conns) const {
    if (conns.size() != 1 || conns[0].lanes.empty()) return "";
    const PlannedConn& c = conns[0];
    const RankPlace& a = j.ranks[static_cast<size_t>(c.a)];
    const RankPlace& b = j.ranks[static_cast<size_t>(c.b)];
    const HostPort pa{a.host, a.ports[static_cast<size_t>(c.lanes[0].localPort)]};
    const HostPort pb{b.host, b.ports[static_cast<size_t>(c.lanes[0].remotePort)]};
    return topo_.pathName(pa, pb, c.lanes[0].path);
  }

  // A connection by hand: the greetings, then frames sealed here.
  struct Raw {
    detail::Fd fd;
    wire::Session session;
  };

  ::testing::AssertionResult rawConnect(Raw* r, const wire::Key& key) {
    detail::SockAddr a;
    Status st = detail::parseHostPort(addr_, &a);
    if (st.isOk()) st = detail::connectSocket(a, detail::nowMs() + kHangMs, -1, &r->fd);
    char g[wire::kGreetingBytes];
    if (st.isOk()) st = detail::recvAll(r->fd.get(), g, sizeof g, detail::nowMs() + kHangMs, -1, "greeting");
    wire::Greeting theirs;
    if (st.isOk()) st = wire::parseGreeting(g, sizeof g, &theirs);
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
    r->session.key = key;
    r->session.serviceNonce = theirs.nonce;
    r->session.jobNonce = 0x1234567890abcdefull ^ static_cast<uint64_t>(detail::nowNs());
    return ::testing::AssertionSuccess();
  }

  /// rawConnect, then the job's greeting.
  ::testing::AssertionResult rawSession(Raw* r, const wire::Key& key) {
    auto ok = rawConnect(r, key);
    if (!ok) return ok;
    wire::Greeting mine;
    mine.nonce = r->session.jobNonce;
    return sendBytes(*r, wire::encodeGreeting(mine));
  }

  static ::testing::AssertionResult sendBytes(Raw& r, const std::string& bytes) {
    Status st = detail::sendAll(r.fd.get(), bytes.data(), bytes.size(), detail::nowMs() + kHangMs, -1, "send");
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
    return ::testing::AssertionSuccess();
  }

  /// Reads reply `seq` of the raw session and checks its seal.
  static ::testing::AssertionResult rawReply(Raw& r, uint64_t seq, wire::Reply* rep) {
    char hb[wire::kHeaderBytes];
    Status st = detail::recvAll(r.fd.get(), hb, sizeof hb, detail::nowMs() + kHangMs, -1, "reply header");
    wire::FrameHeader h;
    if (st.isOk()) st = wire::parseFrameHeader(hb, sizeof hb, wire::kMaxFrameBytes, &h);
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
    std::string body(h.length, '\0');
    st = detail::recvAll(r.fd.get(), &body[0], body.size(), detail::nowMs() + kHangMs, -1, "reply");
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString();
    if (!wire::frameAuthentic(r.session, wire::Dir::kToJob, seq, h, body.data()))
      return ::testing::AssertionFailure() << "reply " << seq << " is not sealed with the key";
    st = wire::parseReply(body, rep);
    if (!st.isOk()) return ::testing::AssertionFailure() << st.toString() << ": " << body;
    return ::testing::AssertionSuccess();
  }

  /// Whether the service closes the raw connection (reading and dropping whatever it still sends).
  static bool closedByService(Raw& r) {
    const int64_t deadline = detail::nowMs() + kHangMs;
    char buf[256];
    for (;;) {
      size_t n = 0;
      Status st = detail::readSome(r.fd.get(), buf, sizeof buf, &n);
      if (!st.isOk()) return true;  // EOF or a reset
      if (n > 0) continue;
      if (detail::nowMs() > deadline) return false;
      pollfd p{r.fd.get(), POLLIN, 0};
      poll(&p, 1, detail::msLeft(deadline));
    }
  }

  std::string dir_, topoPath_, keyPath_, db_, logPath_, addr_;
  Topology topo_;
  wire::Key key_;
  pid_t pid_ = -1;
  int port_ = 0;
  int starts_ = 0;
};

// The jobs table of a database the daemon has closed: id -> (token, spec).
std::map<uint64_t, std::pair<uint64_t, std::string>> storedJobs(const std::string& db) {
  std::map<uint64_t, std::pair<uint64_t, std::string>> out;
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, "SELECT id, token, spec FROM jobs", -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(h);
  while (s && sqlite3_step(s) == SQLITE_ROW)
    out[static_cast<uint64_t>(sqlite3_column_int64(s, 0))] = {static_cast<uint64_t>(sqlite3_column_int64(s, 1)),
                                                              reinterpret_cast<const char*>(sqlite3_column_text(s, 2))};
  sqlite3_finalize(s);
  sqlite3_close(h);
  return out;
}

// The events of kind `kind` about job `id` in a closed database.
int storedEvents(const std::string& db, const std::string& kind, uint64_t id) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, "SELECT count(*) FROM events WHERE kind = ?1 AND job = ?2", -1, &s, nullptr),
            SQLITE_OK);
  sqlite3_bind_text(s, 1, kind.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 2, static_cast<int64_t>(id));
  const int n = s && sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
  sqlite3_finalize(s);
  sqlite3_close(h);
  return n;
}

TEST_F(FabricdTest, TwoJobsLandOnDifferentSpines) {
  ASSERT_TRUE(start());
  const wire::JobSpec a = spec("job A", 0, 2), b = spec("job B", 1, 3);
  const wire::Reply ra = registerJob(a);
  const wire::Reply rb = registerJob(b);
  ASSERT_TRUE(ra.ok && rb.ok);
  ASSERT_EQ(ra.conns.size(), 1u);
  ASSERT_EQ(rb.conns.size(), 1u);
  const std::string sa = spineOf(a, ra.conns), sb = spineOf(b, rb.conns);
  EXPECT_FALSE(sa.empty());
  EXPECT_NE(sa, sb) << "the service put both jobs on " << sa;
  // Planned alone, B would take A's spine: the service moved it.
  c4::plan::PlanInput in;
  in.topo = &topo_;
  in.ranks = b.ranks;
  in.flows = b.flows;
  in.lanes = 1;
  c4::plan::Plan alone;
  ASSERT_TRUE(c4::plan::makePlan(in, &alone).isOk());
  EXPECT_EQ(spineOf(b, alone.conns), sa);
  // Each job alone needs 8 s on its links; together they still need 8 s.
  EXPECT_NEAR(ra.soloSeconds, kBytes * 8 / 1e9, 1e-9);
  EXPECT_NEAR(ra.fabricSeconds, ra.soloSeconds, 1e-9);
  EXPECT_NEAR(rb.soloSeconds, ra.soloSeconds, 1e-9);
  EXPECT_NEAR(rb.fabricSeconds, ra.soloSeconds, 1e-9);
  EXPECT_NE(ra.id, rb.id);
  EXPECT_NE(ra.id, 0u);
  EXPECT_NE(ra.token, 0u);
  const json st = status();
  EXPECT_EQ(st.value("jobs", json::array()).size(), 2u);
  EXPECT_NEAR(st.value("fabric_s", 0.0), ra.soloSeconds, 1e-9);
  EXPECT_FALSE(statusJob(st, ra.id).is_null());
  EXPECT_TRUE(logged("register job 'job A' (id " + hexId(ra.id) + ")"));
  EXPECT_TRUE(logged("register job 'job B' (id " + hexId(rb.id) + ")"));
}

TEST_F(FabricdTest, ReleaseFreesTheLinks) {
  ASSERT_TRUE(start());
  const wire::JobSpec a = spec("job A", 0, 2), b = spec("job B", 1, 3), c = spec("job C", 0, 2);
  const wire::Reply ra = registerJob(a);
  const wire::Reply rb = registerJob(b);
  ASSERT_TRUE(ra.ok && rb.ok);
  const wire::Reply rel = release(ra.id, ra.token);
  EXPECT_TRUE(rel.ok) << rel.error;
  EXPECT_TRUE(logged("release job 'job A' (id " + hexId(ra.id) + ")"));
  const json st = status();
  EXPECT_TRUE(statusJob(st, ra.id).is_null());
  EXPECT_FALSE(statusJob(st, rb.id).is_null());
  // C, on A's hosts, gets A's spine and ports: it shares no link, as A did not.
  const wire::Reply rc = registerJob(c);
  ASSERT_TRUE(rc.ok);
  EXPECT_EQ(spineOf(c, rc.conns), spineOf(a, ra.conns));
  EXPECT_NEAR(rc.fabricSeconds, rc.soloSeconds, 1e-9);
  // Released twice: the service has no such job.
  const wire::Reply again = release(ra.id, ra.token);
  EXPECT_FALSE(again.ok);
  EXPECT_TRUE(again.unknownJob);
}

TEST_F(FabricdTest, ReleaseWithAWrongTokenIsRefused) {
  ASSERT_TRUE(start());
  const wire::Reply ra = registerJob(spec("job A", 0, 2));
  ASSERT_TRUE(ra.ok);
  const wire::Reply bad = release(ra.id, ra.token + 1);
  EXPECT_FALSE(bad.ok);
  EXPECT_FALSE(bad.unknownJob);
  EXPECT_NE(bad.error.find("token"), std::string::npos) << bad.error;
  EXPECT_TRUE(logged("refused release of job 'job A'"));
  EXPECT_FALSE(statusJob(status(), ra.id).is_null());
  const wire::Reply badRenew = renew(ra.id, ra.token ^ 1, 0);
  EXPECT_FALSE(badRenew.ok);
  EXPECT_FALSE(badRenew.unknownJob);
  EXPECT_TRUE(release(ra.id, ra.token).ok);
  EXPECT_TRUE(statusJob(status(), ra.id).is_null());
  ASSERT_EQ(stop(), 0);
  EXPECT_EQ(storedEvents(db_, "refuse", ra.id), 2);
  EXPECT_EQ(storedEvents(db_, "release", ra.id), 1);
  EXPECT_TRUE(storedJobs(db_).empty());
}

TEST_F(FabricdTest, ALeaseWithoutRenewalExpires) {
  ASSERT_TRUE(start({"--min-lease-ms", "100"}));
  const wire::Reply ra = registerJob(spec("short", 0, 2), 300);
  const wire::Reply rb = registerJob(spec("long", 1, 3), 600000);
  ASSERT_TRUE(ra.ok && rb.ok);
  EXPECT_EQ(ra.leaseMs, 300);
  EXPECT_TRUE(gone(ra.id));
  EXPECT_TRUE(logged("expire job 'short' (id " + hexId(ra.id) + ")"));
  EXPECT_FALSE(statusJob(status(), rb.id).is_null());
  // Its links are free: a job on its hosts shares nothing.
  const wire::Reply rc = registerJob(spec("after", 0, 2));
  EXPECT_NEAR(rc.fabricSeconds, rc.soloSeconds, 1e-9);
  // The database forgot it and recorded why.
  ASSERT_EQ(stop(), 0);
  const auto jobs = storedJobs(db_);
  EXPECT_EQ(jobs.count(ra.id), 0u);
  EXPECT_EQ(jobs.count(rb.id), 1u);
  EXPECT_EQ(storedEvents(db_, "expire", ra.id), 1);
  EXPECT_EQ(storedEvents(db_, "register", ra.id), 1);
}

TEST_F(FabricdTest, LeasesAreClamped) {
  ASSERT_TRUE(start({"--lease-ms", "45000"}));
  EXPECT_EQ(registerJob(spec("none asked", 0, 2), 0).leaseMs, 45000);
  EXPECT_EQ(registerJob(spec("too short", 1, 3), 300).leaseMs, 1000);
  EXPECT_EQ(registerJob(spec("a day", 0, 3), wire::kMaxLeaseMs).leaseMs, wire::kMaxLeaseMs);
}

TEST_F(FabricdTest, RenewExtendsTheLease) {
  ASSERT_TRUE(start({"--min-lease-ms", "100"}));
  const wire::Reply ra = registerJob(spec("job A", 0, 2), 20000);
  ASSERT_TRUE(ra.ok);
  EXPECT_LE(statusJob(status(), ra.id).value("lease_left_ms", -1), 20000);
  const wire::Reply r1 = renew(ra.id, ra.token, 600000);
  EXPECT_TRUE(r1.ok) << r1.error;
  EXPECT_EQ(r1.leaseMs, 600000);
  EXPECT_GT(statusJob(status(), ra.id).value("lease_left_ms", -1), 20000);
  // No lease asked: the job keeps its own.
  const wire::Reply r2 = renew(ra.id, ra.token, 0);
  EXPECT_TRUE(r2.ok) << r2.error;
  EXPECT_EQ(r2.leaseMs, 600000);
  // A renewal sets the lease from now, shorter too: this one runs out.
  const wire::Reply r3 = renew(ra.id, ra.token, 300);
  EXPECT_TRUE(r3.ok) << r3.error;
  EXPECT_TRUE(gone(ra.id));
  const wire::Reply late = renew(ra.id, ra.token, 600000);
  EXPECT_FALSE(late.ok);
  EXPECT_TRUE(late.unknownJob);
}

TEST_F(FabricdTest, AWrongKeyIsRefusedAndTheServiceGoesOn) {
  ASSERT_TRUE(start());
  wire::Key other;
  ASSERT_TRUE(wire::keyFromSecret("another secret, not the service's", &other).isOk());
  std::unique_ptr<FabricClient> c;
  ASSERT_TRUE(FabricClient::connect(addr_, other, kHangMs, &c).isOk());  // greetings carry no key
  wire::Request req;
  req.op = wire::Op::kStatus;
  wire::Reply rep;
  EXPECT_FALSE(c->call(req, &rep, kHangMs).isOk());
  EXPECT_TRUE(logged("refused connection from 127.0.0.1:"));
  EXPECT_TRUE(logged("fails authentication"));
  EXPECT_TRUE(status().is_object());
  EXPECT_TRUE(registerJob(spec("job A", 0, 2)).ok);
}

TEST_F(FabricdTest, AReplayedFrameIsRefused) {
  ASSERT_TRUE(start());
  Raw r;
  ASSERT_TRUE(rawSession(&r, key_));
  wire::Request req;
  req.op = wire::Op::kStatus;
  const std::string frame = wire::sealFrame(r.session, wire::Dir::kToService, 0, wire::encodeRequest(req));
  ASSERT_TRUE(sendBytes(r, frame));
  wire::Reply rep;
  ASSERT_TRUE(rawReply(r, 0, &rep));
  EXPECT_TRUE(rep.ok) << rep.error;
  ASSERT_TRUE(sendBytes(r, frame));  // the same frame again
  EXPECT_TRUE(closedByService(r));
  EXPECT_TRUE(logged("replayed or out of order"));

  // The same frame on another connection (other nonces): its MAC is wrong there.
  Raw r2;
  ASSERT_TRUE(rawSession(&r2, key_));
  ASSERT_TRUE(sendBytes(r2, frame));
  EXPECT_TRUE(closedByService(r2));
  EXPECT_TRUE(logged("frame 0 fails authentication"));
  EXPECT_TRUE(status().is_object());
}

TEST_F(FabricdTest, JunkIsRefusedWithoutHarm) {
  ASSERT_TRUE(start());
  {  // Garbage instead of a greeting.
    Raw r;
    ASSERT_TRUE(rawConnect(&r, key_));
    ASSERT_TRUE(sendBytes(r, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_TRUE(closedByService(r));
    EXPECT_TRUE(logged("wrong greeting"));
  }
  {  // A greeting of another version.
    Raw r;
    ASSERT_TRUE(rawConnect(&r, key_));
    wire::Greeting g;
    g.version = wire::kVersion + 1;
    ASSERT_TRUE(sendBytes(r, wire::encodeGreeting(g)));
    EXPECT_TRUE(closedByService(r));
    EXPECT_TRUE(logged("version " + std::to_string(wire::kVersion + 1)));
  }
  {  // A greeting with the frame's magic.
    Raw r;
    ASSERT_TRUE(rawConnect(&r, key_));
    std::string g = wire::encodeGreeting(wire::Greeting{});
    const uint32_t magic = wire::kFrameMagic;
    memcpy(&g[0], &magic, sizeof magic);
    ASSERT_TRUE(sendBytes(r, g));
    EXPECT_TRUE(closedByService(r));
  }
  {  // A header announcing 4 GiB: refused before anything is read or held for it.
    Raw r;
    ASSERT_TRUE(rawSession(&r, key_));
    std::string frame = wire::sealFrame(r.session, wire::Dir::kToService, 0, "{}");
    const uint32_t huge = 0xffffffffu;
    memcpy(&frame[4], &huge, sizeof huge);
    ASSERT_TRUE(sendBytes(r, frame.substr(0, wire::kHeaderBytes)));
    EXPECT_TRUE(closedByService(r));
    EXPECT_TRUE(logged("a frame of 4294967295 bytes"));
  }
  {  // A header of another magic.
    Raw r;
    ASSERT_TRUE(rawSession(&r, key_));
    ASSERT_TRUE(sendBytes(r, std::string(wire::kHeaderBytes, '\x5a')));
    EXPECT_TRUE(closedByService(r));
    EXPECT_TRUE(logged("wrong magic"));
  }
  {  // Half a greeting, then gone.
    Raw r;
    ASSERT_TRUE(rawConnect(&r, key_));
    ASSERT_TRUE(sendBytes(r, wire::encodeGreeting(wire::Greeting{}).substr(0, 5)));
  }
  EXPECT_TRUE(alive());
  EXPECT_TRUE(registerJob(spec("job A", 0, 2)).ok);
}

TEST_F(FabricdTest, AMalformedRequestGetsAnError) {
  ASSERT_TRUE(start());
  Raw r;
  ASSERT_TRUE(rawSession(&r, key_));
  ASSERT_TRUE(sendBytes(r, wire::sealFrame(r.session, wire::Dir::kToService, 0, "{\"op\": \"status\"")));
  wire::Reply rep;
  ASSERT_TRUE(rawReply(r, 0, &rep));
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("not JSON"), std::string::npos) << rep.error;
  ASSERT_TRUE(sendBytes(r, wire::sealFrame(r.session, wire::Dir::kToService, 1, "{\"op\": \"fly\"}")));
  ASSERT_TRUE(rawReply(r, 1, &rep));
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("unknown op \"fly\""), std::string::npos) << rep.error;
  ASSERT_TRUE(sendBytes(r, wire::sealFrame(r.session, wire::Dir::kToService, 2, "{\"op\": \"renew\", \"id\": -1}")));
  ASSERT_TRUE(rawReply(r, 2, &rep));
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("\"id\""), std::string::npos) << rep.error;
  EXPECT_TRUE(logged("refused a request from 127.0.0.1:"));
  // The connection goes on.
  wire::Request req;
  req.op = wire::Op::kStatus;
  ASSERT_TRUE(sendBytes(r, wire::sealFrame(r.session, wire::Dir::kToService, 3, wire::encodeRequest(req))));
  ASSERT_TRUE(rawReply(r, 3, &rep));
  EXPECT_TRUE(rep.ok) << rep.error;
  // A job of another fabric is refused by name.
  wire::JobSpec j = spec("elsewhere", 0, 2);
  j.topoHash ^= 1;
  wire::Request reg;
  reg.op = wire::Op::kRegister;
  reg.job = j;
  ASSERT_TRUE(call(reg, &rep).isOk());
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("topology"), std::string::npos) << rep.error;
  EXPECT_TRUE(logged("refused job 'elsewhere'"));
}

TEST_F(FabricdTest, ALargeFrameArrivesInPieces) {
  ASSERT_TRUE(start());
  Raw r;
  ASSERT_TRUE(rawSession(&r, key_));
  // 3 MiB: many reads, and above what is admitted without counting (64 KiB).
  const std::string payload = "{\"op\": \"status\", \"padding\": \"" + std::string(3u << 20, 'x') + "\"}";
  const std::string frame = wire::sealFrame(r.session, wire::Dir::kToService, 0, payload);
  for (size_t at = 0; at < frame.size(); at += 100000) ASSERT_TRUE(sendBytes(r, frame.substr(at, 100000)));
  wire::Reply rep;
  ASSERT_TRUE(rawReply(r, 0, &rep));
  EXPECT_TRUE(rep.ok) << rep.error;
}

TEST_F(FabricdTest, SigtermKeepsTheJobsAndARestartBooksThemAgain) {
  ASSERT_TRUE(start());
  const wire::JobSpec a = spec("job A", 0, 2), b = spec("job B", 1, 3);
  const wire::Reply ra = registerJob(a);
  ASSERT_TRUE(ra.ok);
  const int st = stop(SIGTERM);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_NE(readFile(logPath_).find("SIGTERM"), std::string::npos);
  struct stat sb {};
  ASSERT_EQ(::stat(db_.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  // The database lists the job, its token and its plan.
  const auto jobs = storedJobs(db_);
  ASSERT_EQ(jobs.count(ra.id), 1u);
  EXPECT_EQ(jobs.at(ra.id).first, ra.token);
  wire::Request stored;
  ASSERT_TRUE(wire::parseRequest(jobs.at(ra.id).second, &stored).isOk());
  EXPECT_EQ(stored.op, wire::Op::kRegister);
  EXPECT_TRUE(sameConns(stored.job.keep, ra.conns));

  // Restarted on it: the job is back with the same plan, and renews.
  ASSERT_TRUE(start());
  EXPECT_TRUE(logged("restored 1 job(s)"));
  const json sj = statusJob(status(), ra.id);
  ASSERT_FALSE(sj.is_null());
  ASSERT_EQ(sj.value("lanes", json::array()).size(), 1u);
  EXPECT_EQ(sj["lanes"][0].value("sport", -1), ra.conns[0].lanes[0].sourcePort);
  EXPECT_NE(sj["lanes"][0].value("path", std::string()).find(spineOf(a, ra.conns)), std::string::npos) << sj.dump();
  const wire::Reply rn = renew(ra.id, ra.token, 0);
  EXPECT_TRUE(rn.ok) << rn.error;
  // Its load is booked: the next job goes to the other spine.
  const wire::Reply rb = registerJob(b);
  EXPECT_NE(spineOf(b, rb.conns), spineOf(a, ra.conns));
  EXPECT_NEAR(rb.fabricSeconds, rb.soloSeconds, 1e-9);
}

// Two jobs of two lanes each (one per spine). A's renewal reports one lane slow: the service books
// its spine's links slow, answers A with a move off them, gives B its move with B's next renewal,
// shows the health, and stores the moves; a renewal with a report of bad lanes is refused for the
// report and changes nothing.
TEST_F(FabricdTest, ASlowLaneReportedByOneJobMovesBothOffItsLinks) {
  ASSERT_TRUE(start({"--link-hold-ms", "600000"}));
  wire::JobSpec a = spec("job A", 0, 2), b = spec("job B", 1, 3);
  a.lanes = b.lanes = 2;
  const wire::Reply ra = registerJob(a);
  const wire::Reply rb = registerJob(b);
  ASSERT_TRUE(ra.ok && rb.ok);
  ASSERT_EQ(ra.conns[0].lanes.size(), 2u);
  auto spineOfLane = [&](const wire::JobSpec& j, const PlannedConn& c, size_t lane) {
    PlannedConn one = c;
    one.lanes = {c.lanes[lane]};
    return spineOf(j, {one});
  };
  const std::string slow = spineOfLane(a, ra.conns[0], 0);
  ASSERT_NE(slow, spineOfLane(a, ra.conns[0], 1)) << "A's lanes should take both spines";
  // A report of lanes that do not fit is refused (logged), the renewal itself goes through.
  wire::Request bad;
  bad.op = wire::Op::kRenew;
  bad.id = ra.id;
  bad.token = ra.token;
  bad.report.lanes = ra.conns;
  bad.report.lanes[0].lanes[0].remotePort = 5;
  wire::Reply rep;
  ASSERT_TRUE(call(bad, &rep).isOk());
  EXPECT_TRUE(rep.ok) << rep.error;
  EXPECT_TRUE(rep.moves.empty());
  EXPECT_TRUE(logged("refused the report of job 'job A'"));
  // The slow lane.
  wire::Request req;
  req.op = wire::Op::kRenew;
  req.id = ra.id;
  req.token = ra.token;
  req.report.samples = {{0, 1, 0, true, 2.5e7, 0.2, wire::LaneSample::Verdict::kSlow},
                        {0, 1, 1, true, 1.2e8, 1.0, wire::LaneSample::Verdict::kOk}};
  ASSERT_TRUE(call(req, &rep).isOk());
  ASSERT_TRUE(rep.ok) << rep.error;
  ASSERT_EQ(rep.moves.size(), 1u);
  EXPECT_EQ(rep.moves[0].lane, 0);
  EXPECT_NE(rep.moveWhy.find("(slow)"), std::string::npos) << rep.moveWhy;
  PlannedConn to = ra.conns[0];
  to.lanes = {rep.moves[0].choice};
  EXPECT_NE(spineOf(a, {to}), slow);
  EXPECT_TRUE(logged("booked slow"));
  // B's lane through that spine moves with B's next renewal (once).
  const wire::Reply nb = renew(rb.id, rb.token, 0);
  ASSERT_TRUE(nb.ok) << nb.error;
  ASSERT_EQ(nb.moves.size(), 1u);
  EXPECT_EQ(spineOfLane(b, rb.conns[0], static_cast<size_t>(nb.moves[0].lane)), slow);
  to.lanes = {nb.moves[0].choice};
  EXPECT_NE(spineOf(b, {to}), slow);
  EXPECT_TRUE(renew(rb.id, rb.token, 0).moves.empty());
  // The view: the links booked slow, no lane left on them.
  const json st = status();
  ASSERT_EQ(st.value("health", json::array()).size(), 2u) << st.dump(1);
  for (const json& h : st["health"]) {
    EXPECT_EQ(h.value("state", std::string()), "slow");
    EXPECT_NEAR(h.value("capacity", 0.0), 0.2, 1e-9);
    EXPECT_EQ(h.value("by", std::string()), "job A");
  }
  for (const json& j : st["jobs"])
    for (const json& l : j["lanes"]) EXPECT_EQ(l.value("path", std::string()).find(slow), std::string::npos) << l;
  // One job cannot report on another's lanes: a wrong token is refused with the renewal.
  req.id = rb.id;
  ASSERT_TRUE(call(req, &rep).isOk());
  EXPECT_FALSE(rep.ok);
  const int code = stop(SIGTERM);
  ASSERT_TRUE(WIFEXITED(code)) << code;
  EXPECT_EQ(storedEvents(db_, "move", ra.id), 1);
  EXPECT_EQ(storedEvents(db_, "move", rb.id), 1);
  EXPECT_EQ(storedEvents(db_, "health", ra.id), 2);
  // The stored plans are the moved ones (a restart books them).
  wire::Request stored;
  ASSERT_TRUE(wire::parseRequest(storedJobs(db_).at(rb.id).second, &stored).isOk());
  ASSERT_EQ(stored.job.keep[0].lanes.size(), 3u);
  EXPECT_TRUE(stored.job.keep[0].lanes[static_cast<size_t>(nb.moves[0].lane)].retired);
}

TEST_F(FabricdTest, OnAFreshDatabaseJobsRegisterAgainWithTheirPlan) {
  ASSERT_TRUE(start());
  const wire::JobSpec a = spec("job A", 0, 2), b = spec("job B", 1, 3);
  const wire::Reply ra = registerJob(a);
  ASSERT_TRUE(ra.ok);
  ASSERT_EQ(stop(SIGTERM), 0);

  ASSERT_TRUE(start({}, dir_ + "/fresh.db"));
  const wire::Reply rn = renew(ra.id, ra.token, 0);
  EXPECT_FALSE(rn.ok);
  EXPECT_TRUE(rn.unknownJob);
  wire::JobSpec again = a;
  again.keep = ra.conns;
  const wire::Reply rk = registerJob(again);
  ASSERT_TRUE(rk.ok);
  EXPECT_TRUE(sameConns(rk.conns, ra.conns));
  EXPECT_TRUE(logged("its own plan booked as it is"));
  const wire::Reply rb = registerJob(b);
  EXPECT_NE(spineOf(b, rb.conns), spineOf(a, ra.conns));
}

TEST_F(FabricdTest, ADatabaseOfAnotherFabricOrABadArgumentStopsTheStart) {
  ASSERT_TRUE(start());
  ASSERT_EQ(stop(SIGTERM), 0);
  const std::string other = dir_ + "/other.json";
  ASSERT_TRUE(writeFile(other, c4test::netlabWithRates([](int) { return 2e9; }), 0644));
  const std::string log = dir_ + "/refused.log";
  EXPECT_EQ(runToExit({"--topo", other, "--key-file", keyPath_, "--listen", "127.0.0.1:0", "--db", db_}, log), 2);
  EXPECT_NE(readFile(log).find("another fabric"), std::string::npos) << readFile(log);
  EXPECT_NE(readFile(log).find("--topo"), std::string::npos) << readFile(log);

  const std::string openKey = dir_ + "/open.key";
  ASSERT_TRUE(writeFile(openKey, "a secret anyone on the host reads\n", 0644));
  const std::string log2 = dir_ + "/key.log";
  EXPECT_EQ(runToExit({"--topo", topoPath_, "--key-file", openKey, "--db", dir_ + "/k.db"}, log2), 2);
  EXPECT_NE(readFile(log2).find("chmod 600"), std::string::npos) << readFile(log2);

  const std::string log3 = dir_ + "/args.log";
  EXPECT_EQ(runToExit({"--topo", topoPath_}, log3), 2);
  EXPECT_NE(readFile(log3).find("--key-file"), std::string::npos) << readFile(log3);
  EXPECT_EQ(runToExit({"--topo", dir_ + "/missing.json", "--key-file", keyPath_}, log3), 2);
  EXPECT_EQ(runToExit({"--topo", topoPath_, "--key-file", keyPath_, "--lease-ms", "soon"}, log3), 2);

  // A second service on a database in use is refused.
  ASSERT_TRUE(start());
  const std::string log4 = dir_ + "/twice.log";
  EXPECT_EQ(runToExit({"--topo", topoPath_, "--key-file", keyPath_, "--listen", "127.0.0.1:0", "--db", db_}, log4), 2);
  EXPECT_NE(readFile(log4).find("in use"), std::string::npos) << readFile(log4);
}

TEST_F(FabricdTest, ConnectionsBeyondMaxClientsAreClosed) {
  ASSERT_TRUE(start({"--max-clients", "2"}));
  Raw r1, r2, r3;
  ASSERT_TRUE(rawSession(&r1, key_));
  ASSERT_TRUE(rawSession(&r2, key_));
  detail::SockAddr a;
  ASSERT_TRUE(detail::parseHostPort(addr_, &a).isOk());
  ASSERT_TRUE(detail::connectSocket(a, detail::nowMs() + kHangMs, -1, &r3.fd).isOk());
  EXPECT_TRUE(closedByService(r3));
  EXPECT_TRUE(logged("--max-clients"));
  r1.fd.reset();
  // Once the service has seen r1 go, a client gets in.
  const int64_t deadline = detail::nowMs() + kHangMs;
  wire::Request req;
  req.op = wire::Op::kStatus;
  wire::Reply rep;
  while (!call(req, &rep).isOk()) {
    ASSERT_LT(detail::nowMs(), deadline) << "no client served after one of two left";
    pause10ms();
  }
  EXPECT_TRUE(rep.ok);
}

}  // namespace
