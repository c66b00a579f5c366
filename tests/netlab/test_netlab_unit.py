#!/usr/bin/python3
"""netlab unit tests: topology plan, address plan, ECMP rule and its readers. No root, no system changes."""

import json
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "netlab"))
import netlab  # noqa: E402


class RateTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(netlab.parse_rate("200mbit"), 200 * 10**6)
        self.assertEqual(netlab.parse_rate("1gbit"), 10**9)
        self.assertEqual(netlab.parse_rate("1.5Gbit"), 1500 * 10**6)
        self.assertEqual(netlab.parse_rate("500kbit"), 500 * 10**3)
        self.assertEqual(netlab.parse_rate("1000000"), 10**6)
        self.assertEqual(netlab.parse_rate("10mbps"), 80 * 10**6)  # tc: mbps = megabytes per second
        for t in ("none", "0", "unlimited"):
            self.assertEqual(netlab.parse_rate(t), 0)
        for bad in ("fast", "10 parsecs", "-5mbit", "", "1kbit", "mbit"):
            with self.assertRaises(netlab.NetlabError, msg=bad):
                netlab.parse_rate(bad)

    def test_format(self):
        self.assertEqual(netlab.format_rate(200 * 10**6), "200mbit")
        self.assertEqual(netlab.format_rate(10**9), "1gbit")
        self.assertEqual(netlab.format_rate(0), "unlimited")

    def test_burst(self):
        self.assertEqual(netlab.tbf_burst(200 * 10**6), 128 * 1024)  # a 64 KiB GSO packet plus headers fits
        self.assertEqual(netlab.tbf_burst(10 * 10**9), 10 * 10**9 // 8 // 500)


class NameTest(unittest.TestCase):
    def test_names(self):
        for good in ("a", "t1", "my-run_2", "x" * 40):
            netlab.check_name(good)
        for bad in ("", "-a", "a b", "a/b", "x" * 41, "a.b", None):
            with self.assertRaises(netlab.NetlabError, msg=repr(bad)):
                netlab.check_name(bad)

    def test_netns_pattern_is_exact(self):
        # Fabric "a" must not claim the namespaces of fabric "a-b".
        pat = netlab._fabric_netns_re("a")
        self.assertTrue(pat.fullmatch("nl-a-h0"))
        self.assertTrue(pat.fullmatch("nl-a-spine12"))
        self.assertFalse(pat.fullmatch("nl-a-b-h0"))
        m = netlab._ANY_NETNS_RE.fullmatch("nl-a-b-leaf3")
        self.assertEqual(m.group(1), "a-b")
        self.assertIsNone(netlab._ANY_NETNS_RE.fullmatch("nl-probe123"))


class TopologyTest(unittest.TestCase):
    def topo(self, **kw):
        args = dict(name="u", hosts=2, ports=2, leaves=2, spines=2, rate="200mbit", octet=7)
        args.update(kw)
        return netlab.build_topology(**args)

    def test_key_case_layout(self):
        t = self.topo()
        json.dumps(t)  # serializable
        self.assertEqual(t["subnet"], "10.7.0.0/16")
        self.assertEqual([h["name"] for h in t["hosts"]], ["h0", "h1"])
        # host placement: all ports of a host on its leaf, hosts split evenly
        self.assertEqual([p["leaf"] for p in t["hosts"][0]["ports"]], ["leaf0", "leaf0"])
        self.assertEqual([p["leaf"] for p in t["hosts"][1]["ports"]], ["leaf1", "leaf1"])
        self.assertEqual([p["ifname"] for p in t["hosts"][1]["ports"]], ["p0", "p1"])
        self.assertEqual(t["hosts"][1]["ports"][1]["addr"], "10.7.1.6")
        self.assertEqual(t["hosts"][1]["ports"][1]["gateway"], "10.7.1.5")
        names = sorted(l["name"] for l in t["links"])
        self.assertEqual(names, ["h0p0-leaf0", "h0p1-leaf0", "h1p0-leaf1", "h1p1-leaf1", "leaf0-spine0",
                                 "leaf0-spine1", "leaf1-spine0", "leaf1-spine1"])
        self.assertTrue(all(l["rate_bps"] == 200 * 10**6 for l in t["links"]))
        self.assertEqual(netlab.find_link(t, "leaf0-h0p1")["name"], "h0p1-leaf0")
        self.assertEqual(netlab.find_link(t, "spine1-leaf0")["name"], "leaf0-spine1")
        self.assertIsNone(netlab.find_link(t, "leaf0-leaf1"))

    def test_addresses_unique_and_interface_names_short(self):
        t = self.topo(hosts=netlab.MAX_HOSTS, ports=4, leaves=8, spines=8)
        addrs = []
        for h in t["hosts"]:
            for p in h["ports"]:
                addrs += [p["addr"], p["gateway"]]
        for l in t["leaves"]:
            for u in l["uplinks"]:
                addrs += [u["addr"], u["peer_addr"]]
        self.assertEqual(len(addrs), len(set(addrs)))
        for link in t["links"]:
            self.assertLessEqual(len(link["a_if"]), 15)
            self.assertLessEqual(len(link["b_if"]), 15)
        ifs = {}
        for link in t["links"]:
            for ns, ifn in ((link["a_netns"], link["a_if"]), (link["b_netns"], link["b_if"])):
                self.assertNotIn(ifn, ifs.setdefault(ns, set()), "duplicate interface %s in %s" % (ifn, ns))
                ifs[ns].add(ifn)

    def test_rail_placement(self):
        t = self.topo(hosts=3, ports=2, leaves=2, placement="rail")
        for h in t["hosts"]:
            self.assertEqual([p["leaf"] for p in h["ports"]], ["leaf0", "leaf1"])

    def test_hosts_split_evenly(self):
        t = self.topo(hosts=4, ports=1, leaves=2)
        self.assertEqual([h["ports"][0]["leaf"] for h in t["hosts"]], ["leaf0", "leaf0", "leaf1", "leaf1"])

    def test_rejects_bad_arguments(self):
        for kw in (dict(hosts=0), dict(hosts=netlab.MAX_HOSTS + 1), dict(ports=0), dict(leaves=2, spines=0),
                   dict(spines=netlab.MAX_SPINES + 1), dict(rate="fast"), dict(placement="mesh"),
                   dict(ecmp="sport-hash"), dict(ecmp="sport-mod", block=1, port_lo=1, port_hi=30000),
                   dict(port_lo=30000, port_hi=20000), dict(port_lo=1, port_hi=65535), dict(name="bad name")):
            with self.assertRaises(netlab.NetlabError, msg=repr(kw)):
                self.topo(**kw)

    def test_single_leaf_has_no_ecmp(self):
        t = self.topo(hosts=3, leaves=1, spines=0)
        self.assertEqual(t["ecmp"]["match"], [])
        self.assertEqual(t["spines"], [])
        h0, h2 = t["hosts"][0]["ports"][0]["addr"], t["hosts"][2]["ports"][0]["addr"]
        self.assertIsNone(netlab.spine_for_packet(t, h0, h2, 20000, 7000))


class EcmpTest(unittest.TestCase):
    def test_sport_range_covers_steering_range_once(self):
        for spines in (1, 2, 3, 7):
            rule = netlab.ecmp_rule(spines, "sport-range", 20000, 29999, 1)
            self.assertEqual(len(rule), spines)
            covered = []
            for r in rule:
                covered += range(r["sport_lo"], r["sport_hi"] + 1)
            self.assertEqual(covered, list(range(20000, 30000)))
            self.assertEqual([r["spine"] for r in rule], list(range(spines)))

    def test_sport_mod_is_a_residue_class(self):
        rule = netlab.ecmp_rule(3, "sport-mod", 20000, 20999, 10)
        t = {"match": netlab.ecmp_match(rule, 3)}
        for sport in range(20000, 21000):
            self.assertEqual(netlab.ecmp_spine_index(t, sport, 7000), (sport // 10) % 3)
        rule = netlab.ecmp_rule(2, "sport-mod", 40, 49, 1)  # block 1: sport % spines
        self.assertEqual([r["spine"] for r in rule], [0, 1] * 5)

    def test_reply_follows_the_steering_port(self):
        t = netlab.build_topology("u", hosts=2, ports=2, leaves=2, spines=2, octet=3)
        a, b = t["hosts"][0]["ports"][1]["addr"], t["hosts"][1]["ports"][1]["addr"]
        for spine in ("spine0", "spine1"):
            for lo, hi in netlab.sports_for_spine(t, spine):
                for sport in (lo, (lo + hi) // 2, hi):
                    # listener on a port outside the steering range (here 7000 and an ephemeral one)
                    for listen in (7000, 45000):
                        self.assertEqual(netlab.spine_for_packet(t, a, b, sport, listen), spine)
                        self.assertEqual(netlab.spine_for_packet(t, b, a, listen, sport), spine)

    def test_unsteered_ports_hash_by_sport(self):
        t = netlab.build_topology("u", hosts=2, ports=1, leaves=2, spines=2, octet=3)
        a, b = t["hosts"][0]["ports"][0]["addr"], t["hosts"][1]["ports"][0]["addr"]
        seen = set()
        for sport in range(32768, 61000, 500):
            s = netlab.spine_for_packet(t, a, b, sport, 7000)
            self.assertEqual(s, "spine%d" % ((sport // netlab.FALLBACK_BLOCK) % 2))
            seen.add(s)
        self.assertEqual(seen, {"spine0", "spine1"})  # random ports spread, and can collide
        self.assertEqual(netlab.spine_for_packet(t, a, b, 0, 0), "spine0")  # ICMP: default spine

    def test_same_leaf_never_crosses_a_spine(self):
        t = netlab.build_topology("u", hosts=4, ports=1, leaves=2, spines=2, octet=3)
        a, b = t["hosts"][0]["ports"][0]["addr"], t["hosts"][1]["ports"][0]["addr"]
        self.assertIsNone(netlab.spine_for_packet(t, a, b, 20000, 7000))
        with self.assertRaises(netlab.NetlabError):
            netlab.spine_for_packet(t, a, "192.0.2.1", 20000, 7000)

    def test_installed_rules_match_the_json(self):
        # The leaf configuration installs exactly the JSON's first-match list, in order.
        for mode in ("sport-range", "sport-mod"):
            t = netlab.build_topology("u", hosts=2, ports=1, leaves=2, spines=3, ecmp=mode, octet=3)
            cfg = netlab._node_configs(t)
            rules = [l for l in cfg[t["leaves"][0]["netns"]][3] if l.startswith("rule add pref") and
                     ("sport" in l or "dport" in l)]
            expect = ["rule add pref %d %s %d-%d lookup %d" % (netlab.ECMP_PREF + k, m["field"], m["lo"], m["hi"],
                                                               netlab.SPINE_TABLE + m["spine"])
                      for k, m in enumerate(t["ecmp"]["match"])]
            self.assertEqual(rules, expect)
            self.assertEqual(len(t["ecmp"]["rule"]), 3 if mode == "sport-range" else 100)


if __name__ == "__main__":
    unittest.main(verbosity=2)
