#include "common/socket.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace c4::detail
