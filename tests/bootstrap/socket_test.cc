#include "common/socket.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace c4::detail {
namespace {

TEST(Socket, IfNameMatchesNcclSemantics) {
  EXPECT_TRUE(ifNameMatches("eth0", ""));
  EXPECT_TRUE(ifNameMatches("eth0", "eth"));
  EXPECT_TRUE(ifNameMatches("eth0", "ib,eth"));
  EXPECT_FALSE(ifNameMatches("eth0", "ib"));
  EXPECT_FALSE(ifNameMatches("eth0", "=eth"));
  EXPECT_TRUE(ifNameMatches("eth0", "=eth0"));
  EXPECT_FALSE(ifNameMatches("eth0", "^eth"));
  EXPECT_TRUE(ifNameMatches("lo", "^eth,docker"));
  EXPECT_TRUE(ifNameMatches("eth10", "^=eth1"));
  EXPECT_FALSE(ifNameMatches("eth1", "^=eth1"));
}

TEST(Socket, ParseHostPort) {
  SockAddr a;
  ASSERT_TRUE(parseHostPort("127.0.0.1:1234", &a).isOk());
  EXPECT_EQ(AF_INET, a.family());
  EXPECT_EQ(1234, a.port());
  EXPECT_TRUE(a.isLoopback());
  EXPECT_EQ("127.0.0.1:1234", a.toString());
  ASSERT_TRUE(parseHostPort("[::1]:80", &a).isOk());
  EXPECT_EQ(AF_INET6, a.family());
  EXPECT_TRUE(a.isLoopback());
  EXPECT_EQ("[::1]:80", a.toString());
  ASSERT_TRUE(parseHostPort("localhost:5", &a).isOk());
  EXPECT_EQ(5, a.port());
  EXPECT_FALSE(parseHostPort("127.0.0.1", &a).isOk());
  EXPECT_FALSE(parseHostPort("127.0.0.1:70000", &a).isOk());
  EXPECT_FALSE(parseHostPort("127.0.0.1:x", &a).isOk());
  EXPECT_FALSE(parseHostPort("[::1:80", &a).isOk());
  WireAddr w = toWire(a);
  SockAddr b;
  ASSERT_TRUE(fromWire(w, &b).isOk());
  EXPECT_EQ(a.toString(), b.toString());
}

TEST(Socket, ChooseInterfaceHonorsSpec) {
  NetIf nif;
  ASSERT_TRUE(chooseInterface("lo", nullptr, &nif).isOk());
  EXPECT_EQ("lo", nif.name);
  EXPECT_TRUE(nif.addr.isLoopback());
  EXPECT_EQ(AF_INET, nif.addr.family());
  Status st = chooseInterface("=no-such-if0", nullptr, &nif);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(std::string::npos, st.message().find("no-such-if0")) << st.message();
  ASSERT_TRUE(chooseInterface("", nullptr, &nif).isOk());
  bool hasOther = false;
  for (const NetIf& n : listInterfaces())
    if (!n.addr.isLoopback() && n.addr.family() == AF_INET && n.name.compare(0, 6, "docker") != 0) hasOther = true;
  EXPECT_EQ(hasOther, !nif.addr.isLoopback()) << nif.name;
  if (hasOther) {
    ASSERT_TRUE(chooseInterface("^lo", nullptr, &nif).isOk());
    EXPECT_NE("lo", nif.name);
  }
  // Reaching a loopback root means listening on loopback.
  SockAddr root;
  ASSERT_TRUE(parseHostPort("127.0.0.1:1", &root).isOk());
  ASSERT_TRUE(chooseInterface("", &root, &nif).isOk());
  EXPECT_TRUE(nif.addr.isLoopback());
}

TEST(Socket, LargeSimultaneousExchangeDoesNotDeadlock) {
  NetIf lo;
  ASSERT_TRUE(chooseInterface("lo", nullptr, &lo).isOk());
  Fd listener;
  SockAddr bound;
  ASSERT_TRUE(listenSocket(lo.addr, 16, false, &listener, &bound).isOk());
  const size_t n = 8 << 20;
  std::vector<char> a(n, 'a'), b(n, 'b'), ra(n), rb(n);
  Fd client;
  ASSERT_TRUE(connectSocket(bound, nowMs() + 5000, -1, &client).isOk());
  Fd server;
  for (int i = 0; i < 1000 && !server.valid(); ++i) {
    ASSERT_TRUE(acceptSocket(listener.get(), &server, nullptr).isOk());
    if (!server.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(server.valid());
  Status s1, s2;
  std::thread t(
      [&] { s1 = sendRecvAll(client.get(), a.data(), n, client.get(), ra.data(), n, nowMs() + 10000, -1, "client"); });
  s2 = sendRecvAll(server.get(), b.data(), n, server.get(), rb.data(), n, nowMs() + 10000, -1, "server");
  t.join();
  ASSERT_TRUE(s1.isOk()) << s1.message();
  ASSERT_TRUE(s2.isOk()) << s2.message();
  EXPECT_EQ(b, ra);
  EXPECT_EQ(a, rb);
}

TEST(Socket, RecvTimesOutAndNamesWhat) {
  NetIf lo;
  ASSERT_TRUE(chooseInterface("lo", nullptr, &lo).isOk());
  Fd listener;
  SockAddr bound;
  ASSERT_TRUE(listenSocket(lo.addr, 16, false, &listener, &bound).isOk());
  Fd client;
  ASSERT_TRUE(connectSocket(bound, nowMs() + 5000, -1, &client).isOk());
  char c;
  int64_t t0 = nowMs();
  Status st = recvAll(client.get(), &c, 1, nowMs() + 100, -1, "waiting for the thing");
  EXPECT_GE(nowMs() - t0, 100);
  EXPECT_EQ(Code::kRemoteError, st.code());
  EXPECT_NE(std::string::npos, st.message().find("waiting for the thing: timed out")) << st.message();
}

// Seen on CI: accept(2) takes a descriptor before it looks at the queue, so out of descriptors it
// fails with EMFILE even when nothing is queued. When the last failure of an episode met an empty
// queue the listener never turned readable again, nobody called accept(), and the episode's end was
// never reported (BootstrapTest.OutOfFileDescriptors... failed on "no recovery logged"). retryDue()
// tells the owner to try once the pause ends, readable or not. Runs in a child: limits are per process.
TEST(Socket, AcceptGuardEndsAnEpisodeThatFailedOnAnEmptyQueue) {
  char logPath[] = "/tmp/c4-guard-log-XXXXXX";
  int logFd = mkstemp(logPath);
  ASSERT_GE(logFd, 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int err = fcntl(2, F_DUPFD_CLOEXEC, 100);  // the test's stderr, for failures
    dup2(logFd, 2);                                  // the log goes to the file
    auto fail = [err](const char* what) {
      dprintf(err, "%s\n", what);
      _exit(1);
    };
    auto log = [&]() {
      std::ifstream in(logPath);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    NetIf lo;
    Fd listener;
    SockAddr bound;
    if (!chooseInterface("lo", nullptr, &lo).isOk() || !listenSocket(lo.addr, 16, false, &listener, &bound).isOk())
      fail("no listener");
    // Not one descriptor to spare: a low limit, and every slot under it taken.
    rlimit saved{}, rl{};
    getrlimit(RLIMIT_NOFILE, &saved);
    rl = saved;
    rl.rlim_cur = 128;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) fail("setrlimit");
    std::vector<int> hogs;
    for (int fd; (fd = dup(0)) >= 0;) hogs.push_back(fd);
    if (errno != EMFILE) fail("dup did not run out of descriptors");
    AcceptGuard guard("test listener");
    Fd got;
    SockAddr peer;
    if (!guard.accept(listener.get(), &got, &peer).isOk() || got.valid()) fail("accept did not fail quietly");
    if (guard.failures() != 1) fail("the failure was not counted (the queue was empty: EMFILE regardless?)");
    // Paused for 1 ms (a loaded machine may be past it already).
    if (guard.resumeAtMs() == 0) fail("no pause after the failure");
    const int64_t now = nowMs();
    if (guard.paused(now) && guard.retryDue(now)) fail("retry due while paused");
    for (int fd : hogs) close(fd);
    setrlimit(RLIMIT_NOFILE, &saved);
    while (guard.paused(nowMs())) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Nothing is queued: the listener is not readable, yet the owner must try again.
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) fail("the listener is readable with an empty queue");
    if (!guard.retryDue(nowMs())) fail("no retry due after the pause, with the episode open");
    if (!guard.accept(listener.get(), &got, &peer).isOk() || got.valid()) fail("the retry accepted something");
    if (guard.retryDue(nowMs())) fail("retry still due after the episode ended");
    const std::string text = log();
    if (text.find("Too many open files") == std::string::npos) fail(("the failure is not logged:\n" + text).c_str());
    if (text.find("accepting connections again (1 accept(s) failed") == std::string::npos)
      fail(("the end of the episode is not logged:\n" + text).c_str());
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  close(logFd);
  unlink(logPath);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status));
}

}  // namespace
}  // namespace c4::detail
