// c4::plan::Topology: the netlab topology JSON (C4_TOPO_FILE), its errors, and the generated fabrics.
#include "planner/topology.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner_fixtures.hpp"

namespace {

using c4::plan::HostPort;
using c4::plan::PortRange;
using c4::plan::Topology;
using c4test::kNetlabTopo;
using c4test::replaceOnce;

std::vector<std::string> linkNames(const Topology& t, const std::vector<int>& links) {
  std::vector<std::string> out;
  for (int l : links) out.push_back(t.link(l).name);
  return out;
}

// The path index among numPaths(a, b) whose top switch is `spine`; -1 if none.
int pathVia(const Topology& t, HostPort a, HostPort b, const std::string& spine) {
  for (int i = 0; i < t.numPaths(a, b); ++i)
    if (t.pathName(a, b, i) == spine) return i;
  return -1;
}

Topology parseNetlab() {
  Topology t;
  c4::Status st = Topology::parse(kNetlabTopo, "netlab.json", &t);
  EXPECT_TRUE(st.isOk()) << st.message();
  return t;
}

TEST(TopologyTest, NetlabJsonHostsPortsAndAddresses) {
  Topology t = parseNetlab();
  EXPECT_EQ(t.source(), "netlab.json");
  ASSERT_EQ(t.numHosts(), 4);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(t.host(h).name, "h" + std::to_string(h));
    ASSERT_EQ(t.host(h).ports.size(), 2u);
  }
  EXPECT_EQ(t.numSwitches(), 4);  // leaf0, leaf1, spine0, spine1
  EXPECT_EQ(t.numLinks(), 24);    // 12 cables, both directions
  int leaves = 0, spines = 0;
  for (int s = 0; s < t.numSwitches(); ++s) (t.sw(s).tier == 0 ? leaves : spines)++;
  EXPECT_EQ(leaves, 2);
  EXPECT_EQ(spines, 2);

  HostPort hp;
  ASSERT_TRUE(t.findAddr("10.1.0.10", &hp));
  EXPECT_EQ(hp, (HostPort{2, 0}));
  ASSERT_TRUE(t.findAddr("10.1.1.14:5000", &hp));
  EXPECT_EQ(hp, (HostPort{3, 1}));
  ASSERT_TRUE(t.findAddr("10.1.1.2", &hp));
  EXPECT_EQ(hp, (HostPort{0, 1}));
  EXPECT_FALSE(t.findAddr("10.1.0.1", &hp));  // leaf0's side of h0p0: not a host port
  EXPECT_FALSE(t.findAddr("10.9.9.9:5000", &hp));
  EXPECT_EQ(t.port(HostPort{2, 1}).addr, "10.1.1.10");
  EXPECT_EQ(t.port(HostPort{2, 1}).name, "p1");

  // Ports' links, capacities and the reverse pairing.
  const c4::plan::Port& p = t.port(HostPort{0, 0});
  EXPECT_EQ(t.link(p.up).name, "h0p0->leaf0");
  EXPECT_EQ(t.link(p.down).name, "leaf0->h0p0");
  EXPECT_EQ(t.link(p.up).cable, "h0p0-leaf0");
  EXPECT_EQ(t.sw(p.leaf).name, "leaf0");
  EXPECT_EQ(t.sw(t.port(HostPort{3, 1}).leaf).name, "leaf1");
  for (int l = 0; l < t.numLinks(); ++l) {
    EXPECT_DOUBLE_EQ(t.link(l).bps, 1e9) << t.link(l).name;
    EXPECT_EQ(t.link(t.link(l).reverse).reverse, l);
    EXPECT_NE(t.link(l).reverse, l);
  }
  EXPECT_EQ(t.findLink("leaf0->spine1"), t.findLink("leaf0-spine1"));
  ASSERT_GE(t.findLink("leaf0-spine1"), 0);
  EXPECT_EQ(t.link(t.findLink("leaf0-spine1")).name, "leaf0->spine1");
  EXPECT_EQ(t.link(t.findLink("spine1->leaf0")).reverse, t.findLink("leaf0-spine1"));
  EXPECT_EQ(t.findLink("leaf0->spine7"), -1);
  EXPECT_EQ(t.findLink("nothing"), -1);
}

TEST(TopologyTest, NetlabJsonPaths) {
  Topology t = parseNetlab();
  const HostPort h0p0{0, 0}, h1p1{1, 1}, h2p0{2, 0}, h0p1{0, 1};
  // Different leaves: one path per spine.
  ASSERT_EQ(t.numPaths(h0p0, h2p0), 2);
  EXPECT_EQ(t.numPaths(h2p0, h0p0), 2);
  std::set<std::string> tops;
  std::vector<int> links;
  for (int i = 0; i < 2; ++i) {
    const std::string sp = t.pathName(h0p0, h2p0, i);
    tops.insert(sp);
    t.pathLinks(h0p0, h2p0, i, &links);
    EXPECT_EQ(linkNames(t, links),
              (std::vector<std::string>{"h0p0->leaf0", "leaf0->" + sp, sp + "->leaf1", "leaf1->h2p0"}));
  }
  EXPECT_EQ(tops, (std::set<std::string>{"spine0", "spine1"}));
  const int via1 = pathVia(t, h0p0, h2p0, "spine1");
  ASSERT_GE(via1, 0);
  t.pathLinks(h0p0, h2p0, via1, &links);
  EXPECT_EQ(linkNames(t, links),
            (std::vector<std::string>{"h0p0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h2p0"}));
  // The way back over the same spine is the same links reversed.
  std::vector<int> back;
  t.pathLinks(h2p0, h0p0, pathVia(t, h2p0, h0p0, "spine1"), &back);
  ASSERT_EQ(back.size(), links.size());
  for (size_t i = 0; i < links.size(); ++i) EXPECT_EQ(back[i], t.link(links[links.size() - 1 - i]).reverse);

  // One leaf: a single path through it, no spine.
  EXPECT_EQ(t.numPaths(h0p0, h1p1), 1);
  t.pathLinks(h0p0, h1p1, 0, &links);
  EXPECT_EQ(linkNames(t, links), (std::vector<std::string>{"h0p0->leaf0", "leaf0->h1p1"}));
  EXPECT_EQ(t.pathName(h0p0, h1p1, 0), "");
  // Ports of one host: no fabric link at all.
  EXPECT_EQ(t.numPaths(h0p0, h0p1), 1);
  t.pathLinks(h0p0, h0p1, 0, &links);
  EXPECT_TRUE(links.empty());
}

TEST(TopologyTest, NetlabJsonEcmpRule) {
  Topology t = parseNetlab();
  EXPECT_TRUE(t.steerable());
  const HostPort a{0, 1}, b{3, 0};
  const int via0 = pathVia(t, a, b, "spine0"), via1 = pathVia(t, a, b, "spine1");
  ASSERT_GE(via0, 0);
  ASSERT_GE(via1, 0);
  // Steering ranges: the rule's.
  auto r0 = t.steeringRanges(a, b, via0), r1 = t.steeringRanges(a, b, via1);
  ASSERT_EQ(r0.size(), 1u);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r0[0].lo, 20000);
  EXPECT_EQ(r0[0].hi, 24999);
  EXPECT_EQ(r1[0].lo, 25000);
  EXPECT_EQ(r1[0].hi, 29999);
  EXPECT_TRUE(t.steeringRanges(HostPort{0, 0}, HostPort{1, 0}, 0).empty());  // one leaf: nothing to steer
  EXPECT_TRUE(t.steeringRanges(HostPort{0, 0}, HostPort{0, 1}, 0).empty());

  // The match list: steering ports first, then the server's port (the reply direction), then the
  // fallback blocks (sport / 1024) % 2 for the kernel's ports; default spine 0.
  const uint16_t eph = 40000;  // a listening port outside the steering ranges
  EXPECT_EQ(t.pathByPorts(a, b, 25000, eph), via1);
  EXPECT_EQ(t.pathByPorts(a, b, 29999, eph), via1);
  EXPECT_EQ(t.pathByPorts(a, b, 20000, eph), via0);
  EXPECT_EQ(t.pathByPorts(a, b, 24999, eph), via0);
  EXPECT_EQ(t.pathByPorts(a, b, 27123, 22000), via1);                      // sport entries come first
  EXPECT_EQ(t.pathByPorts(b, a, eph, 27123), pathVia(t, b, a, "spine1"));  // the reply follows the steered sport
  EXPECT_EQ(t.pathByPorts(b, a, eph, 21000), pathVia(t, b, a, "spine0"));
  EXPECT_EQ(t.pathByPorts(a, b, 33000, eph), via0);  // 33000 / 1024 = 32
  EXPECT_EQ(t.pathByPorts(a, b, 34000, eph), via1);  // 33
  int checked = 0;
  for (int sport = 1; sport <= 65534; sport += 97) {
    if (sport >= 20000 && sport <= 29999) continue;
    const int spine = (sport / 1024) % 2;
    ASSERT_EQ(t.pathByPorts(a, b, static_cast<uint16_t>(sport), eph), spine == 0 ? via0 : via1) << "sport " << sport;
    ++checked;
  }
  EXPECT_GT(checked, 500);
  EXPECT_EQ(t.pathByPorts(a, b, 65535, eph), via0);                         // no entry: default_spine 0
  EXPECT_EQ(t.pathByPorts(HostPort{0, 0}, HostPort{1, 1}, 25000, eph), 0);  // one leaf
}

TEST(TopologyTest, NetlabRailSportMod) {
  Topology t;
  c4::Status st = Topology::parse(c4test::kNetlabRailMod, "rail.json", &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  ASSERT_EQ(t.numHosts(), 2);
  EXPECT_EQ(t.numSwitches(), 5);
  EXPECT_TRUE(t.steerable());
  // Rail: p0 of both hosts on leaf0, p1 on leaf1.
  EXPECT_EQ(t.sw(t.port(HostPort{1, 0}).leaf).name, "leaf0");
  EXPECT_EQ(t.sw(t.port(HostPort{0, 1}).leaf).name, "leaf1");
  EXPECT_EQ(t.numPaths(HostPort{0, 0}, HostPort{1, 0}), 1);
  EXPECT_EQ(t.numPaths(HostPort{0, 1}, HostPort{1, 1}), 1);
  EXPECT_EQ(t.numPaths(HostPort{0, 0}, HostPort{0, 1}), 1);  // one host: no fabric link
  std::vector<int> links;
  t.pathLinks(HostPort{0, 0}, HostPort{0, 1}, 0, &links);
  EXPECT_TRUE(links.empty());
  const HostPort a{0, 0}, b{1, 1};
  ASSERT_EQ(t.numPaths(a, b), 3);
  // sport-mod: sports 20000-20599 steer onto spine (sport / 100) % 3, two 100-port ranges each.
  const std::map<std::string, std::vector<std::pair<int, int>>> want = {{"spine0", {{20100, 20199}, {20400, 20499}}},
                                                                        {"spine1", {{20200, 20299}, {20500, 20599}}},
                                                                        {"spine2", {{20000, 20099}, {20300, 20399}}}};
  for (int i = 0; i < 3; ++i) {
    const std::string sp = t.pathName(a, b, i);
    ASSERT_TRUE(want.count(sp)) << sp;
    std::vector<std::pair<int, int>> got;
    for (const PortRange& r : t.steeringRanges(a, b, i)) got.emplace_back(r.lo, r.hi);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want.at(sp)) << sp;
    for (const auto& [lo, hi] : got)
      for (int port = lo; port <= hi; port += 33) {
        EXPECT_EQ(t.pathByPorts(a, b, static_cast<uint16_t>(port), 40000), i) << port;
        // The reply (server's port 40000 as sport) follows the dport entries onto the same spine.
        EXPECT_EQ(t.pathName(b, a, t.pathByPorts(b, a, 40000, static_cast<uint16_t>(port))), sp) << port;
      }
  }
  // Outside the steering range: the fallback blocks over 3 spines.
  for (int sport : {1, 1024, 2048, 33000, 40000, 61000})
    EXPECT_EQ(t.pathName(a, b, t.pathByPorts(a, b, static_cast<uint16_t>(sport), 40000)),
              "spine" + std::to_string((sport / 1024) % 3))
        << sport;
}

// The tools' --fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT] (c4-plan, c4-fabricd, c4-fabric-load).
TEST(TopologyTest, FatTreeSpecs) {
  Topology t;
  ASSERT_TRUE(Topology::fatTreeFromSpec("16,8,8,100", &t).isOk());
  EXPECT_EQ(t.numHosts(), 1024);
  EXPECT_EQ(t.host(0).ports.size(), 8u);
  EXPECT_EQ(t.hash(), Topology::fatTree(16, 8, 8, 100e9).hash());
  ASSERT_TRUE(Topology::fatTreeFromSpec("4,2,2", &t).isOk());
  EXPECT_EQ(t.numHosts(), 16);
  EXPECT_EQ(t.hash(), Topology::fatTree(4, 2, 2, 1e9).hash());
  for (const char* bad : {"", "3,2,2", "4,2", "4,2,2,0", "4,2,2,1,5", "4,2.5,2", "a,b,c", "4,2,17", "66,1,1", "4,0,1",
                          "4,2,2,", "4;2;2", "4,2,2x"}) {
    c4::Status st = Topology::fatTreeFromSpec(bad, &t);
    ASSERT_FALSE(st.isOk()) << bad;
    EXPECT_NE(st.message().find(std::string("--fat-tree ") + bad + ":"), std::string::npos) << st.message();
  }
}

TEST(TopologyTest, NumberOutOfRangeIsAnErrorNotAnAbort) {
  // nlohmann's out_of_range escaped the catch of parse_error and ended the process (found by
  // fuzzing, tests/fuzz/regressions/topology).
  Topology t;
  c4::Status st = Topology::parse(R"({"version": 1, "links": [{"name": "a", "rate_bps": 1e999}]})", "t.json", &t);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("C4_TOPO_FILE t.json: not valid JSON"), std::string::npos) << st.message();
}

TEST(TopologyTest, NumbersOutOfRangeAreNamedNotCast) {
  // The error named rate_bps through a cast to long long, undefined for -1e300 (found by fuzzing).
  Topology t;
  c4::Status st = Topology::parse(R"({"version": 1, "links": [{"name": "a", "rate_bps": -1e300}]})", "t.json", &t);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("rate_bps = -1e+300"), std::string::npos) << st.message();
  st = Topology::parse(R"({"version": 1, "links": [{"name": "a", "rate_bps": 0}]})", "t.json", &t);
  EXPECT_NE(st.message().find("rate_bps = 0 "), std::string::npos) << st.message();
}

TEST(TopologyTest, LoadFromFileAndMissingFile) {
  char dir[] = "/tmp/c4plan-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/topo.json";
  {
    std::ofstream f(path);
    f << kNetlabTopo;
  }
  Topology t;
  c4::Status st = Topology::load(path, &t);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(t.source(), path);
  EXPECT_EQ(t.numHosts(), 4);
  EXPECT_TRUE(t.steerable());
  // The same bytes give the same hash; other bytes another.
  Topology same, other;
  ASSERT_TRUE(Topology::parse(kNetlabTopo, "x", &same).isOk());
  ASSERT_TRUE(Topology::parse(replaceOnce(kNetlabTopo, "\"name\": \"t\"", "\"name\": \"u\""), "x", &other).isOk());
  EXPECT_EQ(t.hash(), same.hash());
  EXPECT_NE(t.hash(), other.hash());
  std::remove(path.c_str());

  Topology missing;
  st = Topology::load(path, &missing);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cannot be read"), std::string::npos) << st.message();
  rmdir(dir);
}

struct BadCase {
  const char* what;
  std::string text;
  std::vector<std::string> expect;  // substrings of the error
};

TEST(TopologyTest, BadFilesNameTheEntry) {
  const std::string good = kNetlabTopo;
  std::vector<BadCase> cases = {
      {"not JSON", "{\"version\": 1, \"hosts\": [", {"not valid JSON"}},
      {"not an object", "[1, 2, 3]", {"not a JSON object"}},
      {"wrong version", replaceOnce(good, "{\"version\": 1,", "{\"version\": 2,"), {"version 2", "version 1"}},
      {"port on an unknown leaf",
       replaceOnce(good, "\"leaf\": \"leaf0\", \"link\": \"h0p0-leaf0\"",
                   "\"leaf\": \"leaf7\", \"link\": \"h0p0-leaf0\""),
       {"hosts[0] (h0) ports[0]", "h0/p0", "leaf \"leaf7\"", "not in leaves"}},
      {"port with no leaf",
       replaceOnce(good, "\"leaf\": \"leaf0\", \"link\": \"h0p1-leaf0\"", "\"link\": \"h0p1-leaf0\""),
       {"hosts[0] (h0) ports[1]", "h0/p1", "no leaf"}},
      {"port on a spine",
       replaceOnce(good, "\"leaf\": \"leaf1\", \"link\": \"h3p0-leaf1\"",
                   "\"leaf\": \"spine0\", \"link\": \"h3p0-leaf1\""),
       {"hosts[3] (h3) ports[0]", "leaf \"spine0\"", "not in leaves"}},
      {"leaf lists an unknown host",
       replaceOnce(good, "{\"host\": \"h1\", \"port\": \"p0\"", "{\"host\": \"h9\", \"port\": \"p0\""),
       {"leaves[0] (leaf0) ports[2]", "host \"h9\"", "not in hosts"}},
      {"zero capacity",
       replaceOnce(good, "\"b\": \"spine1\", \"b_if\": \"l0\", \"b_netns\": \"nl-t-spine1\", \"rate_bps\": 1000000000}",
                   "\"b\": \"spine1\", \"b_if\": \"l0\", \"b_netns\": \"nl-t-spine1\", \"rate_bps\": 0}"),
       {"links[9] (leaf0-spine1)", "rate_bps = 0", "zero or negative"}},
      {"negative capacity",
       replaceOnce(good, "\"b_if\": \"h2p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": 1000000000}",
                   "\"b_if\": \"h2p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": -5}"),
       {"links[5] (h2p1-leaf1)", "rate_bps = -5", "zero or negative"}},
      {"capacity not a number",
       replaceOnce(good, "\"b_if\": \"h2p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": 1000000000}",
                   "\"b_if\": \"h2p1\", \"b_netns\": \"nl-t-leaf1\", \"rate_bps\": \"1g\"}"),
       {"links[5] (h2p1-leaf1)", "\"rate_bps\""}},
      {"port names a link not in links",
       replaceOnce(good, "\"leaf\": \"leaf1\", \"link\": \"h2p1-leaf1\"",
                   "\"leaf\": \"leaf1\", \"link\": \"h2p1-leafX\""),
       {"hosts[2] (h2) ports[1]", "link \"h2p1-leafX\"", "not in links"}},
      {"uplink to an unknown spine",
       replaceOnce(good, "{\"spine\": \"spine1\", \"ifname\": \"s1\", \"addr\": \"10.1.129.5\"",
                   "{\"spine\": \"spine7\", \"ifname\": \"s1\", \"addr\": \"10.1.129.5\""),
       {"leaves[1] (leaf1) uplinks[1]", "spine \"spine7\"", "not in spines"}},
      {"two uplinks to one spine",
       replaceOnce(good, "{\"spine\": \"spine1\", \"ifname\": \"s1\", \"addr\": \"10.1.129.5\"",
                   "{\"spine\": \"spine0\", \"ifname\": \"s1\", \"addr\": \"10.1.129.5\""),
       {"leaves[1] (leaf1) uplinks[1]", "second uplink to spine0"}},
      {"rule names spine 5 of 2",
       replaceOnce(good, "{\"spine\": 1, \"sport_lo\": 25000", "{\"spine\": 5, \"sport_lo\": 25000"),
       {"ecmp.rule[1]", "names spine 5", "2 spine(s)", "no uplink"}},
      {"match names spine 2 of 2",
       replaceOnce(good, "{\"field\": \"sport\", \"lo\": 1024, \"hi\": 2047, \"spine\": 1}",
                   "{\"field\": \"sport\", \"lo\": 1024, \"hi\": 2047, \"spine\": 2}"),
       {"ecmp.match[5]", "names spine 2", "no uplink"}},
      {"match with an unknown field",
       replaceOnce(good, "{\"field\": \"dport\", \"lo\": 20000", "{\"field\": \"proto\", \"lo\": 20000"),
       {"ecmp.match[2]", "field \"proto\"", "sport or dport"}},
      {"rule disagrees with the match list",
       replaceOnce(good, "{\"field\": \"sport\", \"lo\": 25000, \"hi\": 29999, \"spine\": 1}",
                   "{\"field\": \"sport\", \"lo\": 25000, \"hi\": 29999, \"spine\": 0}"),
       {"ecmp.rule", "source port 25000 steers onto spine1 by the rule but onto spine0 by the match list"}},
      {"a match entry inside a steering range sends it elsewhere",
       replaceOnce(good, "{\"field\": \"sport\", \"lo\": 20000, \"hi\": 24999, \"spine\": 0}",
                   "{\"field\": \"sport\", \"lo\": 26000, \"hi\": 26999, \"spine\": 0}, "
                   "{\"field\": \"sport\", \"lo\": 20000, \"hi\": 24999, \"spine\": 0}"),
       {"ecmp.rule", "source port 26000 steers onto spine1 by the rule but onto spine0 by the match list"}},
      {"default_spine out of range",
       replaceOnce(good, "\"default_spine\": 0", "\"default_spine\": 1e30"),
       {"ecmp", "default_spine", "names no spine"}},
      {"two leaves share no spine (no ECMP rule)",
       replaceOnce(good.substr(0, good.find(",\n \"ecmp\":")) + "\n}",
                   "{\"spine\": \"spine0\", \"ifname\": \"s0\", \"addr\": \"10.1.128.5\", \"peer_addr\": "
                   "\"10.1.128.6\", \"subnet\": \"10.1.128.4/30\", \"link\": \"leaf1-spine0\", \"table\": 100},\n    "
                   "{\"spine\": \"spine1\", \"ifname\": \"s1\", \"addr\": \"10.1.129.5\", \"peer_addr\": "
                   "\"10.1.129.6\", \"subnet\": \"10.1.129.4/30\", \"link\": \"leaf1-spine1\", \"table\": 101}",
                   ""),
       {"leaves", "leaf0 and leaf1", "share no spine"}},
      {"port out of range",
       replaceOnce(good, "\"sport_lo\": 25000", "\"sport_lo\": 70000"),
       {"ecmp.rule[1]", "\"sport_lo\"", "not a TCP port"}},
      {"duplicate address",
       replaceOnce(good, "\"addr\": \"10.1.0.6\"", "\"addr\": \"10.1.0.2\""),
       {"hosts[1] (h1) ports[0]", "address 10.1.0.2 used twice"}},
      {"not an address",
       replaceOnce(good, "\"addr\": \"10.1.0.6\"", "\"addr\": \"10.1.0.600\""),
       {"hosts[1] (h1) ports[0]", "\"10.1.0.600\" is not an IP address"}},
      {"duplicate host name",
       replaceOnce(good, "{\"name\": \"h3\", \"index\": 3", "{\"name\": \"h1\", \"index\": 3"),
       {"hosts[3] (h1)", "host name repeated"}},
      {"duplicate link name",
       replaceOnce(good, "{\"name\": \"h3p1-leaf1\", \"kind\"", "{\"name\": \"h3p0-leaf1\", \"kind\""),
       {"links[7] (h3p0-leaf1)", "link name repeated"}},
      {"no hosts", replaceOnce(good, "\"hosts\": [", "\"hostz\": ["), {"top level", "\"hosts\""}},
  };
  for (const BadCase& c : cases) {
    Topology t;
    c4::Status st = Topology::parse(c.text, "bad.json", &t);
    ASSERT_FALSE(st.isOk()) << c.what;
    EXPECT_EQ(st.code(), c4::Code::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find("bad.json"), std::string::npos) << c.what << ": " << st.message();
    for (const std::string& s : c.expect)
      EXPECT_NE(st.message().find(s), std::string::npos) << c.what << ": \"" << s << "\" not in: " << st.message();
  }
  // Each mutation changed one entry of a file that parses.
  Topology t;
  EXPECT_TRUE(Topology::parse(good, "good.json", &t).isOk());
}

TEST(TopologyTest, GeneratedLeafSpine) {
  const Topology t = Topology::leafSpine(8, 2, 2, 4, 100e9, 400e9);
  ASSERT_EQ(t.numHosts(), 8);
  EXPECT_EQ(t.numSwitches(), 6);
  EXPECT_EQ(t.numLinks(), 2 * (8 * 2 + 2 * 4));
  EXPECT_FALSE(t.steerable());
  EXPECT_EQ(t.sw(t.port(HostPort{3, 1}).leaf).name, "leaf0");
  EXPECT_EQ(t.sw(t.port(HostPort{4, 0}).leaf).name, "leaf1");
  EXPECT_EQ(t.numPaths(HostPort{0, 0}, HostPort{7, 1}), 4);
  EXPECT_EQ(t.numPaths(HostPort{0, 0}, HostPort{3, 1}), 1);
  std::vector<int> links;
  std::set<std::string> tops;
  for (int i = 0; i < 4; ++i) {
    t.pathLinks(HostPort{0, 1}, HostPort{7, 0}, i, &links);
    ASSERT_EQ(links.size(), 4u);
    EXPECT_DOUBLE_EQ(t.link(links[0]).bps, 100e9);
    EXPECT_DOUBLE_EQ(t.link(links[1]).bps, 400e9);
    EXPECT_DOUBLE_EQ(t.link(links[2]).bps, 400e9);
    EXPECT_EQ(t.link(links[0]).name, "h0p1->leaf0");
    EXPECT_EQ(t.link(links[3]).name, "leaf1->h7p0");
    tops.insert(t.pathName(HostPort{0, 1}, HostPort{7, 0}, i));
    EXPECT_TRUE(t.steeringRanges(HostPort{0, 1}, HostPort{7, 0}, i).empty());
  }
  EXPECT_EQ(tops.size(), 4u);
  // Generated fabrics hash the ports: every path index is reachable and stays in range.
  std::set<int> seen;
  for (int s = 32768; s < 32768 + 200; ++s) {
    const int p = t.pathByPorts(HostPort{0, 0}, HostPort{7, 0}, static_cast<uint16_t>(s), 40000);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 4);
    seen.insert(p);
  }
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_NE(t.hash(), Topology::leafSpine(8, 2, 2, 2, 100e9, 400e9).hash());
}

TEST(TopologyTest, GeneratedFatTree) {
  const Topology t = Topology::fatTree(4, 2, 2, 100e9);
  ASSERT_EQ(t.numHosts(), 16);  // 4 pods x 2 leaves x 2 hosts
  EXPECT_EQ(t.numSwitches(), 8 + 8 + 4);
  int tiers[3] = {0, 0, 0};
  for (int s = 0; s < t.numSwitches(); ++s) tiers[t.sw(s).tier]++;
  EXPECT_EQ(tiers[0], 8);
  EXPECT_EQ(tiers[1], 8);
  EXPECT_EQ(tiers[2], 4);
  EXPECT_EQ(t.numLinks(), 2 * (16 * 2 + 8 * 2 + 8 * 2));
  const HostPort h0{0, 0}, h1{1, 1}, h2{2, 0}, h4{4, 1}, h15{15, 1};
  EXPECT_EQ(t.numPaths(h0, h1), 1);  // one leaf
  EXPECT_EQ(t.numPaths(h0, h2), 2);  // one pod, two leaves: via either aggregation switch
  EXPECT_EQ(t.numPaths(h0, h4), 4);  // other pod: via any core
  EXPECT_EQ(t.numPaths(h15, h0), 4);
  std::vector<int> links;
  std::set<std::string> tops;
  for (int i = 0; i < 4; ++i) {
    t.pathLinks(h0, h4, i, &links);
    ASSERT_EQ(links.size(), 6u);
    // Valley-free: up through leaf, agg, core, then down; consecutive links meet.
    for (size_t k = 1; k + 1 < links.size(); ++k) EXPECT_EQ(t.link(links[k]).from, t.link(links[k - 1]).to);
    EXPECT_EQ(t.sw(t.link(links[2]).to).tier, 2);
    tops.insert(t.pathName(h0, h4, i));
  }
  EXPECT_EQ(tops, (std::set<std::string>{"core0", "core1", "core2", "core3"}));
  t.pathLinks(h0, h2, 1, &links);
  ASSERT_EQ(links.size(), 4u);
  EXPECT_EQ(t.sw(t.link(links[1]).to).tier, 1);
  // k = 8: 16 paths between pods, 4 within one.
  const Topology t8 = Topology::fatTree(8, 1, 1, 100e9);
  EXPECT_EQ(t8.numHosts(), 32);
  EXPECT_EQ(t8.numPaths(HostPort{0, 0}, HostPort{31, 0}), 16);
  EXPECT_EQ(t8.numPaths(HostPort{0, 0}, HostPort{3, 0}), 4);
}

TEST(TopologyTest, GeneratedFlat) {
  const Topology t = Topology::flat({2, 1, 3}, 25e9);
  ASSERT_EQ(t.numHosts(), 3);
  EXPECT_EQ(t.host(2).ports.size(), 3u);
  EXPECT_EQ(t.numSwitches(), 1);
  EXPECT_EQ(t.numLinks(), 12);
  EXPECT_EQ(t.numPaths(HostPort{0, 1}, HostPort{2, 2}), 1);
  std::vector<int> links;
  t.pathLinks(HostPort{0, 1}, HostPort{2, 2}, 0, &links);
  ASSERT_EQ(links.size(), 2u);
  EXPECT_DOUBLE_EQ(t.link(links[0]).bps, 25e9);
  EXPECT_FALSE(t.steerable());
  HostPort hp;
  EXPECT_FALSE(t.findAddr("10.0.0.1", &hp));  // generated ports have no address
  EXPECT_NE(t.hash(), Topology::flat({2, 1, 2}, 25e9).hash());
}

}  // namespace
