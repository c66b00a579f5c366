// Fixtures for the planner's tests: the leaf-spine topology JSON that tools/netlab writes, and
// helpers that place ranks and build flows.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "planner/planner.hpp"
#include "planner/topology.hpp"

namespace c4test {

// Written by tools/netlab's own generator (only the layout of the lines changed):
//   python3 -c "import sys; sys.path.insert(0, 'tools/netlab'); import netlab, json;
//               print(json.dumps(netlab.build_topology('t', hosts=4, ports=2, leaves=2, spines=2)))"
// 4 hosts x 2 ports, h0 and h1 on leaf0, h2 and h3 on leaf1, spines spine0 and spine1, every link
// 1 Gbit/s; the ECMP rule steers source ports 20000-24999 onto spine0 and 25000-29999 onto spine1,
// and the match list sends other source ports to spine (sport / 1024) % 2.
inline const char* const kNetlabTopo = R"json(
{"version": 1, "name": "t", "subnet": "10.1.0.0/16", "netns_prefix": "nl-t-", "placement": "host",
 "hosts": [
  {"name": "h0", "index": 0, "netns": "nl-t-h0", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.2", "prefix_len": 30, "subnet": "10.1.0.0/30", "gateway": "10.1.0.1", "leaf": "leaf0", "link": "h0p0-leaf0", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.2", "prefix_len": 30, "subnet": "10.1.1.0/30", "gateway": "10.1.1.1", "leaf": "leaf0", "link": "h0p1-leaf0", "rate_bps": 1000000000}]},
  {"name": "h1", "index": 1, "netns": "nl-t-h1", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.6", "prefix_len": 30, "subnet": "10.1.0.4/30", "gateway": "10.1.0.5", "leaf": "leaf0", "link": "h1p0-leaf0", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.6", "prefix_len": 30, "subnet": "10.1.1.4/30", "gateway": "10.1.1.5", "leaf": "leaf0", "link": "h1p1-leaf0", "rate_bps": 1000000000}]},
  {"name": "h2", "index": 2, "netns": "nl-t-h2", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.10", "prefix_len": 30, "subnet": "10.1.0.8/30", "gateway": "10.1.0.9", "leaf": "leaf1", "link": "h2p0-leaf1", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.10", "prefix_len": 30, "subnet": "10.1.1.8/30", "gateway": "10.1.1.9", "leaf": "leaf1", "link": "h2p1-leaf1", "rate_bps": 1000000000}]},
  {"name": "h3", "index": 3, "netns": "nl-t-h3", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.14", "prefix_len": 30, "subnet": "10.1.0.12/30", "gateway": "10.1.0.13", "leaf": "leaf1", "link": "h3p0-leaf1", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.14", "prefix_len": 30, "subnet": "10.1.1.12/30", "gateway": "10.1.1.13", "leaf": "leaf1", "link": "h3p1-leaf1", "rate_bps": 1000000000}]}],
 "leaves": [
  {"name": "leaf0", "index": 0, "netns": "nl-t-leaf0", "ports": [
    {"host": "h0", "port": "p0", "ifname": "h0p0", "addr": "10.1.0.1", "peer_addr": "10.1.0.2", "subnet": "10.1.0.0/30", "link": "h0p0-leaf0"},
    {"host": "h0", "port": "p1", "ifname": "h0p1", "addr": "10.1.1.1", "peer_addr": "10.1.1.2", "subnet": "10.1.1.0/30", "link": "h0p1-leaf0"},
    {"host": "h1", "port": "p0", "ifname": "h1p0", "addr": "10.1.0.5", "peer_addr": "10.1.0.6", "subnet": "10.1.0.4/30", "link": "h1p0-leaf0"},
    {"host": "h1", "port": "p1", "ifname": "h1p1", "addr": "10.1.1.5", "peer_addr": "10.1.1.6", "subnet": "10.1.1.4/30", "link": "h1p1-leaf0"}],
   "uplinks": [
    {"spine": "spine0", "ifname": "s0", "addr": "10.1.128.1", "peer_addr": "10.1.128.2", "subnet": "10.1.128.0/30", "link": "leaf0-spine0", "table": 100},
    {"spine": "spine1", "ifname": "s1", "addr": "10.1.129.1", "peer_addr": "10.1.129.2", "subnet": "10.1.129.0/30", "link": "leaf0-spine1", "table": 101}]},
  {"name": "leaf1", "index": 1, "netns": "nl-t-leaf1", "ports": [
    {"host": "h2", "port": "p0", "ifname": "h2p0", "addr": "10.1.0.9", "peer_addr": "10.1.0.10", "subnet": "10.1.0.8/30", "link": "h2p0-leaf1"},
    {"host": "h2", "port": "p1", "ifname": "h2p1", "addr": "10.1.1.9", "peer_addr": "10.1.1.10", "subnet": "10.1.1.8/30", "link": "h2p1-leaf1"},
    {"host": "h3", "port": "p0", "ifname": "h3p0", "addr": "10.1.0.13", "peer_addr": "10.1.0.14", "subnet": "10.1.0.12/30", "link": "h3p0-leaf1"},
    {"host": "h3", "port": "p1", "ifname": "h3p1", "addr": "10.1.1.13", "peer_addr": "10.1.1.14", "subnet": "10.1.1.12/30", "link": "h3p1-leaf1"}],
   "uplinks": [
    {"spine": "spine0", "ifname": "s0", "addr": "10.1.128.5", "peer_addr": "10.1.128.6", "subnet": "10.1.128.4/30", "link": "leaf1-spine0", "table": 100},
    {"spine": "spine1", "ifname": "s1", "addr": "10.1.129.5", "peer_addr": "10.1.129.6", "subnet": "10.1.129.4/30", "link": "leaf1-spine1", "table": 101}]}],
 "spines": [
  {"name": "spine0", "index": 0, "netns": "nl-t-spine0", "downlinks": [
    {"leaf": "leaf0", "ifname": "l0", "addr": "10.1.128.2", "peer_addr": "10.1.128.1", "link": "leaf0-spine0"},
    {"leaf": "leaf1", "ifname": "l1", "addr": "10.1.128.6", "peer_addr": "10.1.128.5", "link": "leaf1-spine0"}]},
  {"name": "spine1", "index": 1, "netns": "nl-t-spine1", "downlinks": [
    {"leaf": "leaf0", "ifname": "l0", "addr": "10.1.129.2", "peer_addr": "10.1.129.1", "link": "leaf0-spine1"},
    {"leaf": "leaf1", "ifname": "l1", "addr": "10.1.129.6", "peer_addr": "10.1.129.5", "link": "leaf1-spine1"}]}],
 "links": [
  {"name": "h0p0-leaf0", "kind": "host", "a": "h0", "a_if": "p0", "a_netns": "nl-t-h0", "b": "leaf0", "b_if": "h0p0", "b_netns": "nl-t-leaf0", "rate_bps": 1000000000},
  {"name": "h0p1-leaf0", "kind": "host", "a": "h0", "a_if": "p1", "a_netns": "nl-t-h0", "b": "leaf0", "b_if": "h0p1", "b_netns": "nl-t-leaf0", "rate_bps": 1000000000},
  {"name": "h1p0-leaf0", "kind": "host", "a": "h1", "a_if": "p0", "a_netns": "nl-t-h1", "b": "leaf0", "b_if": "h1p0", "b_netns": "nl-t-leaf0", "rate_bps": 1000000000},
  {"name": "h1p1-leaf0", "kind": "host", "a": "h1", "a_if": "p1", "a_netns": "nl-t-h1", "b": "leaf0", "b_if": "h1p1", "b_netns": "nl-t-leaf0", "rate_bps": 1000000000},
  {"name": "h2p0-leaf1", "kind": "host", "a": "h2", "a_if": "p0", "a_netns": "nl-t-h2", "b": "leaf1", "b_if": "h2p0", "b_netns": "nl-t-leaf1", "rate_bps": 1000000000},
  {"name": "h2p1-leaf1", "kind": "host", "a": "h2", "a_if": "p1", "a_netns": "nl-t-h2", "b": "leaf1", "b_if": "h2p1", "b_netns": "nl-t-leaf1", "rate_bps": 1000000000},
  {"name": "h3p0-leaf1", "kind": "host", "a": "h3", "a_if": "p0", "a_netns": "nl-t-h3", "b": "leaf1", "b_if": "h3p0", "b_netns": "nl-t-leaf1", "rate_bps": 1000000000},
  {"name": "h3p1-leaf1", "kind": "host", "a": "h3", "a_if": "p1", "a_netns": "nl-t-h3", "b": "leaf1", "b_if": "h3p1", "b_netns": "nl-t-leaf1", "rate_bps": 1000000000},
  {"name": "leaf0-spine0", "kind": "uplink", "a": "leaf0", "a_if": "s0", "a_netns": "nl-t-leaf0", "b": "spine0", "b_if": "l0", "b_netns": "nl-t-spine0", "rate_bps": 1000000000},
  {"name": "leaf0-spine1", "kind": "uplink", "a": "leaf0", "a_if": "s1", "a_netns": "nl-t-leaf0", "b": "spine1", "b_if": "l0", "b_netns": "nl-t-spine1", "rate_bps": 1000000000},
  {"name": "leaf1-spine0", "kind": "uplink", "a": "leaf1", "a_if": "s0", "a_netns": "nl-t-leaf1", "b": "spine0", "b_if": "l1", "b_netns": "nl-t-spine0", "rate_bps": 1000000000},
  {"name": "leaf1-spine1", "kind": "uplink", "a": "leaf1", "a_if": "s1", "a_netns": "nl-t-leaf1", "b": "spine1", "b_if": "l1", "b_netns": "nl-t-spine1", "rate_bps": 1000000000}],
 "ecmp": {"key": "sport", "mode": "sport-range", "port_lo": 20000, "port_hi": 29999, "block": 1, "spines": 2, "fallback_block": 1024, "default_spine": 0, "decided_at": "leaf",
  "rule": [{"spine": 0, "sport_lo": 20000, "sport_hi": 24999}, {"spine": 1, "sport_lo": 25000, "sport_hi": 29999}],
  "match": [
    {"field": "sport", "lo": 20000, "hi": 24999, "spine": 0},
    {"field": "sport", "lo": 25000, "hi": 29999, "spine": 1},
    {"field": "dport", "lo": 20000, "hi": 24999, "spine": 0},
    {"field": "dport", "lo": 25000, "hi": 29999, "spine": 1},
    {"field": "sport", "lo": 1, "hi": 1023, "spine": 0},
    {"field": "sport", "lo": 1024, "hi": 2047, "spine": 1},
    {"field": "sport", "lo": 2048, "hi": 3071, "spine": 0},
    {"field": "sport", "lo": 3072, "hi": 4095, "spine": 1},
    {"field": "sport", "lo": 4096, "hi": 5119, "spine": 0},
    {"field": "sport", "lo": 5120, "hi": 6143, "spine": 1},
    {"field": "sport", "lo": 6144, "hi": 7167, "spine": 0},
    {"field": "sport", "lo": 7168, "hi": 8191, "spine": 1},
    {"field": "sport", "lo": 8192, "hi": 9215, "spine": 0},
    {"field": "sport", "lo": 9216, "hi": 10239, "spine": 1},
    {"field": "sport", "lo": 10240, "hi": 11263, "spine": 0},
    {"field": "sport", "lo": 11264, "hi": 12287, "spine": 1},
    {"field": "sport", "lo": 12288, "hi": 13311, "spine": 0},
    {"field": "sport", "lo": 13312, "hi": 14335, "spine": 1},
    {"field": "sport", "lo": 14336, "hi": 15359, "spine": 0},
    {"field": "sport", "lo": 15360, "hi": 16383, "spine": 1},
    {"field": "sport", "lo": 16384, "hi": 17407, "spine": 0},
    {"field": "sport", "lo": 17408, "hi": 18431, "spine": 1},
    {"field": "sport", "lo": 18432, "hi": 19455, "spine": 0},
    {"field": "sport", "lo": 19456, "hi": 20479, "spine": 1},
    {"field": "sport", "lo": 20480, "hi": 21503, "spine": 0},
    {"field": "sport", "lo": 21504, "hi": 22527, "spine": 1},
    {"field": "sport", "lo": 22528, "hi": 23551, "spine": 0},
    {"field": "sport", "lo": 23552, "hi": 24575, "spine": 1},
    {"field": "sport", "lo": 24576, "hi": 25599, "spine": 0},
    {"field": "sport", "lo": 25600, "hi": 26623, "spine": 1},
    {"field": "sport", "lo": 26624, "hi": 27647, "spine": 0},
    {"field": "sport", "lo": 27648, "hi": 28671, "spine": 1},
    {"field": "sport", "lo": 28672, "hi": 29695, "spine": 0},
    {"field": "sport", "lo": 29696, "hi": 30719, "spine": 1},
    {"field": "sport", "lo": 30720, "hi": 31743, "spine": 0},
    {"field": "sport", "lo": 31744, "hi": 32767, "spine": 1},
    {"field": "sport", "lo": 32768, "hi": 33791, "spine": 0},
    {"field": "sport", "lo": 33792, "hi": 34815, "spine": 1},
    {"field": "sport", "lo": 34816, "hi": 35839, "spine": 0},
    {"field": "sport", "lo": 35840, "hi": 36863, "spine": 1},
    {"field": "sport", "lo": 36864, "hi": 37887, "spine": 0},
    {"field": "sport", "lo": 37888, "hi": 38911, "spine": 1},
    {"field": "sport", "lo": 38912, "hi": 39935, "spine": 0},
    {"field": "sport", "lo": 39936, "hi": 40959, "spine": 1},
    {"field": "sport", "lo": 40960, "hi": 41983, "spine": 0},
    {"field": "sport", "lo": 41984, "hi": 43007, "spine": 1},
    {"field": "sport", "lo": 43008, "hi": 44031, "spine": 0},
    {"field": "sport", "lo": 44032, "hi": 45055, "spine": 1},
    {"field": "sport", "lo": 45056, "hi": 46079, "spine": 0},
    {"field": "sport", "lo": 46080, "hi": 47103, "spine": 1},
    {"field": "sport", "lo": 47104, "hi": 48127, "spine": 0},
    {"field": "sport", "lo": 48128, "hi": 49151, "spine": 1},
    {"field": "sport", "lo": 49152, "hi": 50175, "spine": 0},
    {"field": "sport", "lo": 50176, "hi": 51199, "spine": 1},
    {"field": "sport", "lo": 51200, "hi": 52223, "spine": 0},
    {"field": "sport", "lo": 52224, "hi": 53247, "spine": 1},
    {"field": "sport", "lo": 53248, "hi": 54271, "spine": 0},
    {"field": "sport", "lo": 54272, "hi": 55295, "spine": 1},
    {"field": "sport", "lo": 55296, "hi": 56319, "spine": 0},
    {"field": "sport", "lo": 56320, "hi": 57343, "spine": 1},
    {"field": "sport", "lo": 57344, "hi": 58367, "spine": 0},
    {"field": "sport", "lo": 58368, "hi": 59391, "spine": 1},
    {"field": "sport", "lo": 59392, "hi": 60415, "spine": 0},
    {"field": "sport", "lo": 60416, "hi": 61439, "spine": 1},
    {"field": "sport", "lo": 61440, "hi": 62463, "spine": 0},
    {"field": "sport", "lo": 62464, "hi": 63487, "spine": 1},
    {"field": "sport", "lo": 63488, "hi": 64511, "spine": 0},
    {"field": "sport", "lo": 64512, "hi": 65534, "spine": 1}]}}
)json";

// The same generator in its other modes: rail placement (port i of every host on leaf i % leaves)
// and sport-mod steering (spine (sport / 100) % 3 for sports 20000-20599: two 100-port ranges
// per spine), 3 spines:
//   netlab.build_topology('r', hosts=2, ports=2, leaves=2, spines=3, ecmp='sport-mod',
//                         placement='rail', port_lo=20000, port_hi=20599, block=100)
inline const char* const kNetlabRailMod = R"json(
{"version": 1, "name": "r", "subnet": "10.1.0.0/16", "netns_prefix": "nl-r-", "placement": "rail",
 "hosts": [
  {"name": "h0", "index": 0, "netns": "nl-r-h0", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.2", "prefix_len": 30, "subnet": "10.1.0.0/30", "gateway": "10.1.0.1", "leaf": "leaf0", "link": "h0p0-leaf0", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.2", "prefix_len": 30, "subnet": "10.1.1.0/30", "gateway": "10.1.1.1", "leaf": "leaf1", "link": "h0p1-leaf1", "rate_bps": 1000000000}]},
  {"name": "h1", "index": 1, "netns": "nl-r-h1", "ports": [
    {"name": "p0", "index": 0, "ifname": "p0", "addr": "10.1.0.6", "prefix_len": 30, "subnet": "10.1.0.4/30", "gateway": "10.1.0.5", "leaf": "leaf0", "link": "h1p0-leaf0", "rate_bps": 1000000000},
    {"name": "p1", "index": 1, "ifname": "p1", "addr": "10.1.1.6", "prefix_len": 30, "subnet": "10.1.1.4/30", "gateway": "10.1.1.5", "leaf": "leaf1", "link": "h1p1-leaf1", "rate_bps": 1000000000}]}],
 "leaves": [
  {"name": "leaf0", "index": 0, "netns": "nl-r-leaf0", "ports": [
    {"host": "h0", "port": "p0", "ifname": "h0p0", "addr": "10.1.0.1", "peer_addr": "10.1.0.2", "subnet": "10.1.0.0/30", "link": "h0p0-leaf0"},
    {"host": "h1", "port": "p0", "ifname": "h1p0", "addr": "10.1.0.5", "peer_addr": "10.1.0.6", "subnet": "10.1.0.4/30", "link": "h1p0-leaf0"}],
   "uplinks": [
    {"spine": "spine0", "ifname": "s0", "addr": "10.1.128.1", "peer_addr": "10.1.128.2", "subnet": "10.1.128.0/30", "link": "leaf0-spine0", "table": 100},
    {"spine": "spine1", "ifname": "s1", "addr": "10.1.129.1", "peer_addr": "10.1.129.2", "subnet": "10.1.129.0/30", "link": "leaf0-spine1", "table": 101},
    {"spine": "spine2", "ifname": "s2", "addr": "10.1.130.1", "peer_addr": "10.1.130.2", "subnet": "10.1.130.0/30", "link": "leaf0-spine2", "table": 102}]},
  {"name": "leaf1", "index": 1, "netns": "nl-r-leaf1", "ports": [
    {"host": "h0", "port": "p1", "ifname": "h0p1", "addr": "10.1.1.1", "peer_addr": "10.1.1.2", "subnet": "10.1.1.0/30", "link": "h0p1-leaf1"},
    {"host": "h1", "port": "p1", "ifname": "h1p1", "addr": "10.1.1.5", "peer_addr": "10.1.1.6", "subnet": "10.1.1.4/30", "link": "h1p1-leaf1"}],
   "uplinks": [
    {"spine": "spine0", "ifname": "s0", "addr": "10.1.128.5", "peer_addr": "10.1.128.6", "subnet": "10.1.128.4/30", "link": "leaf1-spine0", "table": 100},
    {"spine": "spine1", "ifname": "s1", "addr": "10.1.129.5", "peer_addr": "10.1.129.6", "subnet": "10.1.129.4/30", "link": "leaf1-spine1", "table": 101},
    {"spine": "spine2", "ifname": "s2", "addr": "10.1.130.5", "peer_addr": "10.1.130.6", "subnet": "10.1.130.4/30", "link": "leaf1-spine2", "table": 102}]}],
 "spines": [
  {"name": "spine0", "index": 0, "netns": "nl-r-spine0", "downlinks": [
    {"leaf": "leaf0", "ifname": "l0", "addr": "10.1.128.2", "peer_addr": "10.1.128.1", "link": "leaf0-spine0"},
    {"leaf": "leaf1", "ifname": "l1", "addr": "10.1.128.6", "peer_addr": "10.1.128.5", "link": "leaf1-spine0"}]},
  {"name": "spine1", "index": 1, "netns": "nl-r-spine1", "downlinks": [
    {"leaf": "leaf0", "ifname": "l0", "addr": "10.1.129.2", "peer_addr": "10.1.129.1", "link": "leaf0-spine1"},
    {"leaf": "leaf1", "ifname": "l1", "addr": "10.1.129.6", "peer_addr": "10.1.129.5", "link": "leaf1-spine1"}]},
  {"name": "spine2", "index": 2, "netns": "nl-r-spine2", "downlinks": [
    {"leaf": "leaf0", "ifname": "l0", "addr": "10.1.130.2", "peer_addr": "10.1.130.1", "link": "leaf0-spine2"},
    {"leaf": "leaf1", "ifname": "l1", "addr": "10.1.130.6", "peer_addr": "10.1.130.5", "link": "leaf1-spine2"}]}],
 "links": [
  {"name": "h0p0-leaf0", "kind": "host", "a": "h0", "a_if": "p0", "a_netns": "nl-r-h0", "b": "leaf0", "b_if": "h0p0", "b_netns": "nl-r-leaf0", "rate_bps": 1000000000},
  {"name": "h0p1-leaf1", "kind": "host", "a": "h0", "a_if": "p1", "a_netns": "nl-r-h0", "b": "leaf1", "b_if": "h0p1", "b_netns": "nl-r-leaf1", "rate_bps": 1000000000},
  {"name": "h1p0-leaf0", "kind": "host", "a": "h1", "a_if": "p0", "a_netns": "nl-r-h1", "b": "leaf0", "b_if": "h1p0", "b_netns": "nl-r-leaf0", "rate_bps": 1000000000},
  {"name": "h1p1-leaf1", "kind": "host", "a": "h1", "a_if": "p1", "a_netns": "nl-r-h1", "b": "leaf1", "b_if": "h1p1", "b_netns": "nl-r-leaf1", "rate_bps": 1000000000},
  {"name": "leaf0-spine0", "kind": "uplink", "a": "leaf0", "a_if": "s0", "a_netns": "nl-r-leaf0", "b": "spine0", "b_if": "l0", "b_netns": "nl-r-spine0", "rate_bps": 1000000000},
  {"name": "leaf0-spine1", "kind": "uplink", "a": "leaf0", "a_if": "s1", "a_netns": "nl-r-leaf0", "b": "spine1", "b_if": "l0", "b_netns": "nl-r-spine1", "rate_bps": 1000000000},
  {"name": "leaf0-spine2", "kind": "uplink", "a": "leaf0", "a_if": "s2", "a_netns": "nl-r-leaf0", "b": "spine2", "b_if": "l0", "b_netns": "nl-r-spine2", "rate_bps": 1000000000},
  {"name": "leaf1-spine0", "kind": "uplink", "a": "leaf1", "a_if": "s0", "a_netns": "nl-r-leaf1", "b": "spine0", "b_if": "l1", "b_netns": "nl-r-spine0", "rate_bps": 1000000000},
  {"name": "leaf1-spine1", "kind": "uplink", "a": "leaf1", "a_if": "s1", "a_netns": "nl-r-leaf1", "b": "spine1", "b_if": "l1", "b_netns": "nl-r-spine1", "rate_bps": 1000000000},
  {"name": "leaf1-spine2", "kind": "uplink", "a": "leaf1", "a_if": "s2", "a_netns": "nl-r-leaf1", "b": "spine2", "b_if": "l1", "b_netns": "nl-r-spine2", "rate_bps": 1000000000}],
 "ecmp": {"key": "sport", "mode": "sport-mod", "port_lo": 20000, "port_hi": 20599, "block": 100, "spines": 3, "fallback_block": 1024, "default_spine": 0, "decided_at": "leaf", "rule": [
   {"spine": 2, "sport_lo": 20000, "sport_hi": 20099},
   {"spine": 0, "sport_lo": 20100, "sport_hi": 20199},
   {"spine": 1, "sport_lo": 20200, "sport_hi": 20299},
   {"spine": 2, "sport_lo": 20300, "sport_hi": 20399},
   {"spine": 0, "sport_lo": 20400, "sport_hi": 20499},
   {"spine": 1, "sport_lo": 20500, "sport_hi": 20599}],
  "match": [
   {"field": "sport", "lo": 20000, "hi": 20099, "spine": 2},
   {"field": "sport", "lo": 20100, "hi": 20199, "spine": 0},
   {"field": "sport", "lo": 20200, "hi": 20299, "spine": 1},
   {"field": "sport", "lo": 20300, "hi": 20399, "spine": 2},
   {"field": "sport", "lo": 20400, "hi": 20499, "spine": 0},
   {"field": "sport", "lo": 20500, "hi": 20599, "spine": 1},
   {"field": "dport", "lo": 20000, "hi": 20099, "spine": 2},
   {"field": "dport", "lo": 20100, "hi": 20199, "spine": 0},
   {"field": "dport", "lo": 20200, "hi": 20299, "spine": 1},
   {"field": "dport", "lo": 20300, "hi": 20399, "spine": 2},
   {"field": "dport", "lo": 20400, "hi": 20499, "spine": 0},
   {"field": "dport", "lo": 20500, "hi": 20599, "spine": 1},
   {"field": "sport", "lo": 1, "hi": 1023, "spine": 0},
   {"field": "sport", "lo": 1024, "hi": 2047, "spine": 1},
   {"field": "sport", "lo": 2048, "hi": 3071, "spine": 2},
   {"field": "sport", "lo": 3072, "hi": 4095, "spine": 0},
   {"field": "sport", "lo": 4096, "hi": 5119, "spine": 1},
   {"field": "sport", "lo": 5120, "hi": 6143, "spine": 2},
   {"field": "sport", "lo": 6144, "hi": 7167, "spine": 0},
   {"field": "sport", "lo": 7168, "hi": 8191, "spine": 1},
   {"field": "sport", "lo": 8192, "hi": 9215, "spine": 2},
   {"field": "sport", "lo": 9216, "hi": 10239, "spine": 0},
   {"field": "sport", "lo": 10240, "hi": 11263, "spine": 1},
   {"field": "sport", "lo": 11264, "hi": 12287, "spine": 2},
   {"field": "sport", "lo": 12288, "hi": 13311, "spine": 0},
   {"field": "sport", "lo": 13312, "hi": 14335, "spine": 1},
   {"field": "sport", "lo": 14336, "hi": 15359, "spine": 2},
   {"field": "sport", "lo": 15360, "hi": 16383, "spine": 0},
   {"field": "sport", "lo": 16384, "hi": 17407, "spine": 1},
   {"field": "sport", "lo": 17408, "hi": 18431, "spine": 2},
   {"field": "sport", "lo": 18432, "hi": 19455, "spine": 0},
   {"field": "sport", "lo": 19456, "hi": 20479, "spine": 1},
   {"field": "sport", "lo": 20480, "hi": 21503, "spine": 2},
   {"field": "sport", "lo": 21504, "hi": 22527, "spine": 0},
   {"field": "sport", "lo": 22528, "hi": 23551, "spine": 1},
   {"field": "sport", "lo": 23552, "hi": 24575, "spine": 2},
   {"field": "sport", "lo": 24576, "hi": 25599, "spine": 0},
   {"field": "sport", "lo": 25600, "hi": 26623, "spine": 1},
   {"field": "sport", "lo": 26624, "hi": 27647, "spine": 2},
   {"field": "sport", "lo": 27648, "hi": 28671, "spine": 0},
   {"field": "sport", "lo": 28672, "hi": 29695, "spine": 1},
   {"field": "sport", "lo": 29696, "hi": 30719, "spine": 2},
   {"field": "sport", "lo": 30720, "hi": 31743, "spine": 0},
   {"field": "sport", "lo": 31744, "hi": 32767, "spine": 1},
   {"field": "sport", "lo": 32768, "hi": 33791, "spine": 2},
   {"field": "sport", "lo": 33792, "hi": 34815, "spine": 0},
   {"field": "sport", "lo": 34816, "hi": 35839, "spine": 1},
   {"field": "sport", "lo": 35840, "hi": 36863, "spine": 2},
   {"field": "sport", "lo": 36864, "hi": 37887, "spine": 0},
   {"field": "sport", "lo": 37888, "hi": 38911, "spine": 1},
   {"field": "sport", "lo": 38912, "hi": 39935, "spine": 2},
   {"field": "sport", "lo": 39936, "hi": 40959, "spine": 0},
   {"field": "sport", "lo": 40960, "hi": 41983, "spine": 1},
   {"field": "sport", "lo": 41984, "hi": 43007, "spine": 2},
   {"field": "sport", "lo": 43008, "hi": 44031, "spine": 0},
   {"field": "sport", "lo": 44032, "hi": 45055, "spine": 1},
   {"field": "sport", "lo": 45056, "hi": 46079, "spine": 2},
   {"field": "sport", "lo": 46080, "hi": 47103, "spine": 0},
   {"field": "sport", "lo": 47104, "hi": 48127, "spine": 1},
   {"field": "sport", "lo": 48128, "hi": 49151, "spine": 2},
   {"field": "sport", "lo": 49152, "hi": 50175, "spine": 0},
   {"field": "sport", "lo": 50176, "hi": 51199, "spine": 1},
   {"field": "sport", "lo": 51200, "hi": 52223, "spine": 2},
   {"field": "sport", "lo": 52224, "hi": 53247, "spine": 0},
   {"field": "sport", "lo": 53248, "hi": 54271, "spine": 1},
   {"field": "sport", "lo": 54272, "hi": 55295, "spine": 2},
   {"field": "sport", "lo": 55296, "hi": 56319, "spine": 0},
   {"field": "sport", "lo": 56320, "hi": 57343, "spine": 1},
   {"field": "sport", "lo": 57344, "hi": 58367, "spine": 2},
   {"field": "sport", "lo": 58368, "hi": 59391, "spine": 0},
   {"field": "sport", "lo": 59392, "hi": 60415, "spine": 1},
   {"field": "sport", "lo": 60416, "hi": 61439, "spine": 2},
   {"field": "sport", "lo": 61440, "hi": 62463, "spine": 0},
   {"field": "sport", "lo": 62464, "hi": 63487, "spine": 1},
   {"field": "sport", "lo": 63488, "hi": 64511, "spine": 2},
   {"field": "sport", "lo": 64512, "hi": 65534, "spine": 0}]}}
)json";

/// Text with the first occurrence of `from` replaced by `to`; fails the test when `from` is absent
/// (the fixture changed and the mutation would test nothing).
inline std::string replaceOnce(const std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "fixture has no \"" << from << "\"";
  if (at == std::string::npos) return text;
  return text.substr(0, at) + to + text.substr(at + from.size());
}

/// The netlab fixture with every cable's rate_bps (the "links" list) replaced by `rate(i)`, i the
/// cable's index in that list.
template <typename F>
std::string netlabWithRates(F rate) {
  std::string text = kNetlabTopo;
  const std::string key = "\"rate_bps\": 1000000000}";
  size_t at = text.find("\"links\": [");
  for (int i = 0; (at = text.find(key, at)) != std::string::npos; ++i) {
    const std::string repl = "\"rate_bps\": " + std::to_string(static_cast<long long>(rate(i))) + "}";
    text.replace(at, key.size(), repl);
    at += repl.size();
  }
  return text;
}

/// A permutation of 0..n-1 from mt19937's raw output (portable, unlike std::shuffle).
inline std::vector<int> randomPermutation(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  for (int i = n - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[rng() % static_cast<uint32_t>(i + 1)]);
  return p;
}

/// One rank per host (rank i on host i), each with the host's first `ports` ports (all if <= 0).
inline std::vector<c4::plan::RankPlace> onePerHost(const c4::plan::Topology& t, int ports = 0) {
  std::vector<c4::plan::RankPlace> r(static_cast<size_t>(t.numHosts()));
  for (int h = 0; h < t.numHosts(); ++h) {
    r[static_cast<size_t>(h)].host = h;
    const int n = ports > 0 ? ports : static_cast<int>(t.host(h).ports.size());
    for (int p = 0; p < n; ++p) r[static_cast<size_t>(h)].ports.push_back(p);
  }
  return r;
}

/// Ring AllReduce's traffic: rank i sends `bytes` to rank i + 1 (mod n).
inline std::vector<c4::plan::Flow> ringFlows(int n, double bytes) {
  std::vector<c4::plan::Flow> f;
  for (int i = 0; i < n; ++i) f.push_back(c4::plan::Flow{i, (i + 1) % n, bytes});
  return f;
}

/// A shifted permutation: rank i sends `bytes` to rank i + shift (mod n).
inline std::vector<c4::plan::Flow> shiftFlows(int n, int shift, double bytes) {
  std::vector<c4::plan::Flow> f;
  for (int i = 0; i < n; ++i) f.push_back(c4::plan::Flow{i, (i + shift) % n, bytes});
  return f;
}

}  // namespace c4test
