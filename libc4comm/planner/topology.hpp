// C4P's model of the network fabric (docs/c4p.md): hosts with NIC ports, the switches they hang off
// (leaves, and above them spines or aggregation and core tiers), directed links with capacities, the
// equal-cost paths between two host ports, and the fabric's ECMP rule (which path a connection with
// given TCP ports takes, and which source ports steer a connection onto a chosen path).
//
// Sources: the JSON that tools/netlab writes (C4_TOPO_FILE, docs/netlab.md "Topology JSON"); a flat
// model built from the ranks' own NIC ports when no file is given (one non-blocking switch: every
// path equal, only the ports differ); and generated leaf-spine and 3-tier fat-trees (tests,
// c4-plan). Immutable once built; path queries cache per leaf pair (not thread-safe: one thread).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "c4comm/status.hpp"
#include "common/status.hpp"

namespace c4::plan {

/// One direction of a physical link.
struct Link {
  std::string name;   // "h0p0->leaf0", "leaf0->spine1"
  std::string cable;  // the physical link's name in the file ("h0p0-leaf0")
  int from = -1;      // switch index, or -1 for a host port
  int to = -1;        // switch index, or -1 for a host port
  int reverse = -1;   // the same cable's other direction
  double bps = 0;     // capacity, bits per second (> 0)
};

struct Port {
  std::string name;  // "p0"
  std::string addr;  // "10.1.0.2" (empty in generated topologies)
  int leaf = -1;     // switch index
  int up = -1;       // link host port -> leaf
  int down = -1;     // link leaf -> host port
};

struct Host {
  std::string name;
  std::vector<Port> ports;
};

struct Switch {
  std::string name;
  int tier = 0;         // 0 leaf, 1 spine / aggregation, 2 core
  std::vector<int> up;  // links to the tier above
};

/// A host port: host index and port index within the host.
struct HostPort {
  int host = -1;
  int port = -1;
  bool operator==(const HostPort& o) const { return host == o.host && port == o.port; }
};

/// A source-port range that steers a connection (both directions) onto one path.
struct PortRange {
  uint16_t lo = 0, hi = 0;
};

class Topology {
 public:
  /// Reads C4_TOPO_FILE's format from `path`. Errors name the file and the offending entry.
  static Status load(const std::string& path, Topology* out);
  /// The same from text; `source` names it in errors.
  static Status parse(const std::string& text, const std::string& source, Topology* out);
  /// No file: `portsPerHost[h]` ports on host h, all on one switch, every link `bps`.
  static Topology flat(const std::vector<int>& portsPerHost, double bps = 1e9);
  /// Generated two-tier fabric: `hosts` hosts with `ports` ports each, hosts split evenly over
  /// `leaves` (all ports of a host on its leaf), every leaf linked to every spine.
  static Topology leafSpine(int hosts, int ports, int leaves, int spines, double hostBps, double uplinkBps);
  /// Generated three-tier k-ary fat-tree (k even): k pods of k/2 leaves and k/2 aggregation
  /// switches, (k/2)^2 cores, `hostsPerLeaf` hosts per leaf with `ports` ports each (all on its leaf).
  static Topology fatTree(int k, int hostsPerLeaf, int ports, double bps);
  /// The fat-tree of the tools' `--fat-tree K,HOSTS_PER_LEAF,PORTS[,GBIT]`: K even in 2..64, 1 to
  /// 64 hosts per leaf, 1 to 16 ports each, every link GBIT Gbit/s (default 1). kInvalidArgument
  /// naming the spec otherwise.
  static Status fatTreeFromSpec(const std::string& spec, Topology* out);

  const std::string& source() const { return source_; }
  /// FNV-1a of the file's bytes (or of the generated parameters): ranks compare it.
  uint64_t hash() const { return hash_; }

  int numHosts() const { return static_cast<int>(hosts_.size()); }
  const Host& host(int h) const { return hosts_[static_cast<size_t>(h)]; }
  const Port& port(HostPort hp) const {
    return hosts_[static_cast<size_t>(hp.host)].ports[static_cast<size_t>(hp.port)];
  }
  int numSwitches() const { return static_cast<int>(switches_.size()); }
  const Switch& sw(int i) const { return switches_[static_cast<size_t>(i)]; }
  int numLinks() const { return static_cast<int>(links_.size()); }
  const Link& link(int i) const { return links_[static_cast<size_t>(i)]; }
  /// The directed link named "a->b", or the cable "a-b" in the direction a to b; -1 if none.
  int findLink(const std::string& name) const;
  /// The host port with address `addr` ("10.1.0.2"; a ":port" suffix is ignored); false if none.
  bool findAddr(const std::string& addr, HostPort* out) const;

  /// Equal-cost (shortest valley-free) paths between two host ports: at least 1 (a single path
  /// through the leaf when both hang off one leaf; between ports of one host no fabric link at all).
  int numPaths(HostPort a, HostPort b) const;
  /// The directed links from a to b on path `i` (0 <= i < numPaths): a's port up, the switch links,
  /// b's port down. The way back is the same links reversed (Link::reverse), as the ECMP rule keeps
  /// a steered connection's replies on its path.
  void pathLinks(HostPort a, HostPort b, int i, std::vector<int>* out) const;
  /// The switch at the top of path i ("spine1"), or "" when the path crosses no spine.
  std::string pathName(HostPort a, HostPort b, int i) const;

  /// True when source ports choose the path (a netlab file with an ECMP rule); generated and flat
  /// topologies are only planned, not steered.
  bool steerable() const { return steerable_; }
  /// The source-port ranges that steer a connection opened at a towards b onto path i (empty when
  /// the path is the only one, or the fabric is not steerable).
  std::vector<PortRange> steeringRanges(HostPort a, HostPort b, int i) const;
  /// Which path the fabric gives the a->b direction of a connection with these TCP ports (the ECMP
  /// rule of the file; a hash of the ports for generated fabrics).
  int pathByPorts(HostPort a, HostPort b, uint16_t sport, uint16_t dport) const;

 private:
  struct MatchRule {
    bool dport = false;
    uint16_t lo = 0, hi = 0;
    int spine = 0;  // index among the tier-1 switches in file order
  };
  // Paths between two leaves: switch links only, and the top switch of each.
  struct LeafPaths {
    std::vector<std::vector<int>> links;
    std::vector<int> top;
  };
  const LeafPaths& leafPaths(int la, int lb) const;
  int addSwitch(const std::string& name, int tier);
  /// Adds both directions of a cable between switches or a host port and a switch; returns the
  /// a -> b link.
  int addCable(const std::string& cable, const std::string& aName, int a, const std::string& bName, int b, double bps);
  /// Adds a host with `ports` ports p0.. on switch `leaf`, each linked at `bps`.
  void addHost(const std::string& name, int ports, int leaf, double bps);
  void finish();

  std::string source_;
  uint64_t hash_ = 0;
  std::vector<Host> hosts_;
  std::vector<Switch> switches_;
  std::vector<Link> links_;
  std::map<std::string, int> linkByName_;
  std::map<std::string, HostPort> byAddr_;
  bool steerable_ = false;
  std::vector<int> spineSwitch_;                 // ECMP spine index -> switch index
  std::map<int, std::vector<PortRange>> steer_;  // switch index of a spine -> its steering ranges
  std::vector<MatchRule> match_;
  int defaultSpine_ = 0;
  mutable std::map<std::pair<int, int>, LeafPaths> cache_;
};

}  // namespace c4::plan
