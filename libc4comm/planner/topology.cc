#include "planner/topology.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/hash.hpp"

namespace c4::plan {

namespace {

using json = nlohmann::json;

std::string stripPort(const std::string& addr) {
  // "10.1.0.2:4000" -> "10.1.0.2"; "[fe80::1]:4000" -> "fe80::1"; a bare IPv6 address stays.
  if (!addr.empty() && addr[0] == '[') {
    size_t e = addr.find(']');
    return e == std::string::npos ? addr : addr.substr(1, e - 1);
  }
  size_t c = addr.find(':');
  if (c != std::string::npos && addr.find(':', c + 1) == std::string::npos) return addr.substr(0, c);
  return addr;
}

// A number of the file in an error: an integer when it is one, else as %g. Not a cast to long long:
// that is undefined for a value out of its range (rate_bps = -1e300; found by fuzzing).
std::string numText(double v) {
  if (v >= -9e18 && v <= 9e18 && v == static_cast<double>(static_cast<long long>(v)))
    return std::to_string(static_cast<long long>(v));
  return strFormat("%g", v);
}

bool isAddress(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// Readers of one JSON entry; each error names the file and the entry (`where`).
struct Reader {
  const std::string& src;
  Status err;

  bool fail(const std::string& where, const std::string& what) {
    if (err.isOk())
      err = makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: %s: %s", src.c_str(), where.c_str(), what.c_str());
    return false;
  }
  bool str(const json& o, const char* key, const std::string& where, std::string* out) {
    auto it = o.find(key);
    if (it == o.end() || !it->is_string() || it->get<std::string>().empty())
      return fail(where, std::string("missing or empty string field \"") + key + "\"");
    *out = it->get<std::string>();
    return true;
  }
  bool num(const json& o, const char* key, const std::string& where, double* out) {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number()) return fail(where, std::string("missing number field \"") + key + "\"");
    *out = it->get<double>();
    return true;
  }
  bool arr(const json& o, const char* key, const std::string& where, const json** out, bool nonEmpty) {
    auto it = o.find(key);
    if (it == o.end() || !it->is_array()) return fail(where, std::string("missing array field \"") + key + "\"");
    if (nonEmpty && it->empty()) return fail(where, std::string("\"") + key + "\" is empty");
    *out = &*it;
    return true;
  }
  bool port(const json& o, const char* key, const std::string& where, uint16_t* out) {
    double v = 0;
    if (!num(o, key, where, &v)) return false;
    if (v < 1 || v > 65535 || v != static_cast<double>(static_cast<int>(v)))
      return fail(where, std::string("\"") + key + "\" = " + std::to_string(v) + " is not a TCP port (1-65535)");
    *out = static_cast<uint16_t>(v);
    return true;
  }
};

std::string entry(const char* list, size_t i, const json& o) {
  std::string s = std::string(list) + "[" + std::to_string(i) + "]";
  auto it = o.find("name");
  if (it != o.end() && it->is_string()) s += " (" + it->get<std::string>() + ")";
  return s;
}

}  // namespace

int Topology::addSwitch(const std::string& name, int tier) {
  Switch s;
  s.name = name;
  s.tier = tier;
  switches_.push_back(std::move(s));
  return static_cast<int>(switches_.size()) - 1;
}

int Topology::addCable(const std::string& cable, const std::string& aName, int a, const std::string& bName, int b,
                       double bps) {
  Link ab, ba;
  ab.name = aName + "->" + bName;
  ba.name = bName + "->" + aName;
  ab.cable = ba.cable = cable;
  ab.from = ba.to = a;
  ab.to = ba.from = b;
  ab.bps = ba.bps = bps;
  const int i = static_cast<int>(links_.size());
  ab.reverse = i + 1;
  ba.reverse = i;
  linkByName_[ab.name] = i;
  linkByName_[ba.name] = i + 1;
  links_.push_back(std::move(ab));
  links_.push_back(std::move(ba));
  return i;
}

void Topology::addHost(const std::string& name, int ports, int leaf, double bps) {
  Host host;
  host.name = name;
  const std::string& ln = switches_[static_cast<size_t>(leaf)].name;
  for (int p = 0; p < ports; ++p) {
    Port port;
    port.name = "p" + std::to_string(p);
    port.leaf = leaf;
    const std::string pn = name + port.name;
    port.up = addCable(pn + "-" + ln, pn, -1, ln, leaf, bps);
    port.down = links_[static_cast<size_t>(port.up)].reverse;
    host.ports.push_back(std::move(port));
  }
  hosts_.push_back(std::move(host));
}

void Topology::finish() {
  byAddr_.clear();
  for (size_t h = 0; h < hosts_.size(); ++h)
    for (size_t p = 0; p < hosts_[h].ports.size(); ++p)
      if (!hosts_[h].ports[p].addr.empty())
        byAddr_[hosts_[h].ports[p].addr] = HostPort{static_cast<int>(h), static_cast<int>(p)};
  cache_.clear();
}

int Topology::findLink(const std::string& name) const {
  auto it = linkByName_.find(name);
  if (it != linkByName_.end()) return it->second;
  // A cable name "a-b" in the direction a -> b.
  for (size_t d = name.find('-'); d != std::string::npos; d = name.find('-', d + 1)) {
    auto j = linkByName_.find(name.substr(0, d) + "->" + name.substr(d + 1));
    if (j != linkByName_.end() && links_[static_cast<size_t>(j->second)].cable == name) return j->second;
  }
  return -1;
}

bool Topology::findAddr(const std::string& addr, HostPort* out) const {
  auto it = byAddr_.find(stripPort(addr));
  if (it == byAddr_.end()) return false;
  *out = it->second;
  return true;
}

Status Topology::load(const std::string& path, Topology* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: cannot be read: %s", path.c_str(), strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: read error", path.c_str());
  return parse(ss.str(), path, out);
}

Status Topology::parse(const std::string& text, const std::string& source, Topology* out) {
  Topology t;
  t.source_ = source;
  t.hash_ = fnv1a(text);
  Reader rd{source, Status::ok()};
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Find where it broke for the message.
    std::string why = "not valid JSON";
    try {
      json again = json::parse(text);
      (void)again;
    } catch (const json::exception& e) {
      // Not only parse_error: a number out of range ("1e999") throws out_of_range, which escaped
      // and ended the process at init (found by fuzzing).
      why = std::string("not valid JSON (") + e.what() + ")";
    }
    return makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: %s", source.c_str(), why.c_str());
  }
  if (!doc.is_object()) return makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: not a JSON object", source.c_str());
  double version = 0;
  if (!rd.num(doc, "version", "top level", &version)) return rd.err;
  if (version != 1)
    return makeError(Code::kInvalidArgument, "C4_TOPO_FILE %s: version %g; this build reads version 1", source.c_str(),
                     version);

  // Cables and their capacities.
  const json* links = nullptr;
  if (!rd.arr(doc, "links", "top level", &links, true)) return rd.err;
  std::map<std::string, double> cableBps;
  for (size_t i = 0; i < links->size(); ++i) {
    const json& l = (*links)[i];
    const std::string where = entry("links", i, l);
    if (!l.is_object()) return rd.fail(where, "not an object"), rd.err;
    std::string name;
    double bps = 0;
    if (!rd.str(l, "name", where, &name) || !rd.num(l, "rate_bps", where, &bps)) return rd.err;
    if (!(bps > 0))
      return rd.fail(where, "capacity rate_bps = " + numText(bps) +
                                " (zero or negative; netlab writes 0 for unshaped links: give the fabric rates, "
                                "or set C4_PLANNER=off)"),
             rd.err;
    if (!cableBps.emplace(name, bps).second) return rd.fail(where, "link name repeated"), rd.err;
  }
  auto capacity = [&](const std::string& where, const std::string& cable, double* bps) {
    auto it = cableBps.find(cable);
    if (it == cableBps.end()) return rd.fail(where, "names link \"" + cable + "\", which is not in links");
    *bps = it->second;
    return true;
  };

  // Spines, then leaves with their uplinks (tier 0 leaves, tier 1 spines).
  std::map<std::string, int> swByName;
  const json* spines = nullptr;
  auto sit = doc.find("spines");
  if (sit != doc.end()) {
    if (!rd.arr(doc, "spines", "top level", &spines, false)) return rd.err;
  }
  std::vector<std::string> spineNames;
  if (spines != nullptr)
    for (size_t i = 0; i < spines->size(); ++i) {
      const json& s = (*spines)[i];
      const std::string where = entry("spines", i, s);
      std::string name;
      if (!s.is_object() || !rd.str(s, "name", where, &name)) return rd.fail(where, "not an object"), rd.err;
      if (swByName.count(name)) return rd.fail(where, "switch name repeated"), rd.err;
      spineNames.push_back(name);
      swByName[name] = -1;  // placed after the leaves
    }
  const json* leaves = nullptr;
  if (!rd.arr(doc, "leaves", "top level", &leaves, true)) return rd.err;
  for (size_t i = 0; i < leaves->size(); ++i) {
    const json& l = (*leaves)[i];
    const std::string where = entry("leaves", i, l);
    std::string name;
    if (!l.is_object() || !rd.str(l, "name", where, &name)) return rd.fail(where, "not an object"), rd.err;
    if (swByName.count(name)) return rd.fail(where, "switch name repeated"), rd.err;
    swByName[name] = t.addSwitch(name, 0);
  }
  for (const std::string& s : spineNames) t.spineSwitch_.push_back(swByName[s] = t.addSwitch(s, 1));
  for (size_t i = 0; i < leaves->size(); ++i) {
    const json& l = (*leaves)[i];
    const std::string where = entry("leaves", i, l);
    const int leaf = swByName[l["name"].get<std::string>()];
    auto uit = l.find("uplinks");
    if (uit == l.end()) continue;
    if (!uit->is_array()) return rd.fail(where, "\"uplinks\" is not an array"), rd.err;
    for (size_t u = 0; u < uit->size(); ++u) {
      const json& up = (*uit)[u];
      const std::string uw = where + " uplinks[" + std::to_string(u) + "]";
      std::string spine, cable;
      double bps = 0;
      if (!up.is_object() || !rd.str(up, "spine", uw, &spine) || !rd.str(up, "link", uw, &cable)) return rd.err;
      auto s = swByName.find(spine);
      if (s == swByName.end() || t.switches_[static_cast<size_t>(s->second)].tier != 1)
        return rd.fail(uw, "names spine \"" + spine + "\", which is not in spines"), rd.err;
      if (!capacity(uw, cable, &bps)) return rd.err;
      for (int e : t.switches_[static_cast<size_t>(leaf)].up)
        if (t.links_[static_cast<size_t>(e)].to == s->second) return rd.fail(uw, "a second uplink to " + spine), rd.err;
      const int e = t.addCable(cable, t.switches_[static_cast<size_t>(leaf)].name, leaf, spine, s->second, bps);
      t.switches_[static_cast<size_t>(leaf)].up.push_back(e);
    }
  }

  // Hosts and their ports.
  const json* hosts = nullptr;
  if (!rd.arr(doc, "hosts", "top level", &hosts, true)) return rd.err;
  std::set<std::string> hostNames, addrs;
  for (size_t i = 0; i < hosts->size(); ++i) {
    const json& h = (*hosts)[i];
    const std::string where = entry("hosts", i, h);
    Host host;
    const json* ports = nullptr;
    if (!h.is_object() || !rd.str(h, "name", where, &host.name) || !rd.arr(h, "ports", where, &ports, true))
      return rd.fail(where, "not an object"), rd.err;
    if (!hostNames.insert(host.name).second) return rd.fail(where, "host name repeated"), rd.err;
    for (size_t p = 0; p < ports->size(); ++p) {
      const json& pj = (*ports)[p];
      const std::string pw = where + " ports[" + std::to_string(p) + "]";
      Port port;
      std::string leafName, cable;
      double bps = 0;
      if (!pj.is_object() || !rd.str(pj, "name", pw, &port.name) || !rd.str(pj, "addr", pw, &port.addr)) return rd.err;
      if (!isAddress(port.addr)) return rd.fail(pw, "addr \"" + port.addr + "\" is not an IP address"), rd.err;
      if (!addrs.insert(port.addr).second) return rd.fail(pw, "address " + port.addr + " used twice"), rd.err;
      auto lit = pj.find("leaf");
      if (lit == pj.end() || !lit->is_string() || lit->get<std::string>().empty())
        return rd.fail(pw, "port " + host.name + "/" + port.name + " is on no leaf (no \"leaf\" field)"), rd.err;
      leafName = lit->get<std::string>();
      auto s = swByName.find(leafName);
      if (s == swByName.end() || t.switches_[static_cast<size_t>(s->second)].tier != 0)
        return rd.fail(pw, "port " + host.name + "/" + port.name + " names leaf \"" + leafName +
                               "\", which is not in leaves"),
               rd.err;
      if (!rd.str(pj, "link", pw, &cable) || !capacity(pw, cable, &bps)) return rd.err;
      port.leaf = s->second;
      const std::string pn = host.name + port.name;
      port.up = t.addCable(cable, pn, -1, leafName, port.leaf, bps);
      port.down = t.links_[static_cast<size_t>(port.up)].reverse;
      host.ports.push_back(std::move(port));
    }
    t.hosts_.push_back(std::move(host));
  }
  // Leaves' lists of attached host ports, where given, must name known hosts.
  for (size_t i = 0; i < leaves->size(); ++i) {
    const json& l = (*leaves)[i];
    auto pit = l.find("ports");
    if (pit == l.end() || !pit->is_array()) continue;
    for (size_t p = 0; p < pit->size(); ++p) {
      const json& pj = (*pit)[p];
      auto hn = pj.find("host");
      if (hn != pj.end() && hn->is_string() && !hostNames.count(hn->get<std::string>()))
        return rd.fail(entry("leaves", i, l) + " ports[" + std::to_string(p) + "]",
                       "names host \"" + hn->get<std::string>() + "\", which is not in hosts"),
               rd.err;
    }
  }

  // The ECMP rule: steering ranges per spine, and the first-match list.
  auto eit = doc.find("ecmp");
  if (eit != doc.end() && eit->is_object() && !t.spineSwitch_.empty()) {
    const json& e = *eit;
    const int nsp = static_cast<int>(t.spineSwitch_.size());
    double dflt = 0;
    if (e.contains("default_spine") && !rd.num(e, "default_spine", "ecmp", &dflt)) return rd.err;
    if (!(dflt >= 0 && dflt < nsp && dflt == static_cast<double>(static_cast<int>(dflt))))
      return rd.fail("ecmp", "default_spine " + std::to_string(dflt) + " names no spine (the fabric has " +
                                 std::to_string(nsp) + ")"),
             rd.err;
    t.defaultSpine_ = static_cast<int>(dflt);
    auto spineOk = [&](const std::string& where, double v, int* out) {
      if (v < 0 || v >= nsp || v != static_cast<double>(static_cast<int>(v)))
        return rd.fail(where, "names spine " + numText(v) + ", but the fabric has " + std::to_string(nsp) +
                                  " spine(s): no uplink for it");
      *out = static_cast<int>(v);
      // Every leaf needs an uplink to it, or the rule routes into nothing.
      const int sw = t.spineSwitch_[static_cast<size_t>(*out)];
      for (const Switch& s : t.switches_) {
        if (s.tier != 0) continue;
        bool has = false;
        for (int l : s.up) has |= t.links_[static_cast<size_t>(l)].to == sw;
        if (!has)
          return rd.fail(where, "steers onto " + t.switches_[static_cast<size_t>(sw)].name + ", but " + s.name +
                                    " has no uplink to it");
      }
      return true;
    };
    const json* rule = nullptr;
    if (e.contains("rule")) {
      if (!rd.arr(e, "rule", "ecmp", &rule, false)) return rd.err;
      for (size_t i = 0; i < rule->size(); ++i) {
        const json& r = (*rule)[i];
        const std::string where = "ecmp.rule[" + std::to_string(i) + "]";
        double sp = 0;
        PortRange pr;
        int s = 0;
        if (!r.is_object() || !rd.num(r, "spine", where, &sp) || !spineOk(where, sp, &s) ||
            !rd.port(r, "sport_lo", where, &pr.lo) || !rd.port(r, "sport_hi", where, &pr.hi))
          return rd.fail(where, "not an object"), rd.err;
        if (pr.lo > pr.hi) return rd.fail(where, "sport_lo > sport_hi"), rd.err;
        t.steer_[t.spineSwitch_[static_cast<size_t>(s)]].push_back(pr);
      }
    }
    const json* match = nullptr;
    if (e.contains("match")) {
      if (!rd.arr(e, "match", "ecmp", &match, false)) return rd.err;
      for (size_t i = 0; i < match->size(); ++i) {
        const json& m = (*match)[i];
        const std::string where = "ecmp.match[" + std::to_string(i) + "]";
        MatchRule mr;
        std::string field;
        double sp = 0;
        if (!m.is_object() || !rd.str(m, "field", where, &field) || !rd.port(m, "lo", where, &mr.lo) ||
            !rd.port(m, "hi", where, &mr.hi) || !rd.num(m, "spine", where, &sp) || !spineOk(where, sp, &mr.spine))
          return rd.fail(where, "not an object"), rd.err;
        if (field != "sport" && field != "dport")
          return rd.fail(where, "field \"" + field + "\" (sport or dport expected)"), rd.err;
        if (mr.lo > mr.hi) return rd.fail(where, "lo > hi"), rd.err;
        mr.dport = field == "dport";
        t.match_.push_back(mr);
      }
    }
    // A steering range must steer where it says: every one of its ports, as a source port, first
    // matches its own spine in the match list (walked in order over what is still unmatched;
    // destination-port entries are not checked: they match the replies, whose destination is the
    // steered source port).
    if (!t.match_.empty()) {
      for (const auto& steer : t.steer_) {
        const int sw = steer.first;  // not a structured binding: clang (C++17) cannot capture those
        for (const PortRange& r : steer.second) {
          std::vector<std::pair<int, int>> open{{r.lo, r.hi}};
          auto wrong = [&](int port, int spine) {
            const int gotSw = t.spineSwitch_[static_cast<size_t>(spine)];
            return rd.fail("ecmp.rule", "source port " + std::to_string(port) + " steers onto " +
                                            t.switches_[static_cast<size_t>(sw)].name + " by the rule but onto " +
                                            t.switches_[static_cast<size_t>(gotSw)].name + " by the match list");
          };
          for (const MatchRule& m : t.match_) {
            if (m.dport) continue;
            std::vector<std::pair<int, int>> rest;
            for (auto [lo, hi] : open) {
              const int a = std::max<int>(lo, m.lo), b = std::min<int>(hi, m.hi);
              if (a > b) {
                rest.emplace_back(lo, hi);
                continue;
              }
              if (t.spineSwitch_[static_cast<size_t>(m.spine)] != sw) return wrong(a, m.spine), rd.err;
              if (lo < a) rest.emplace_back(lo, a - 1);
              if (b < hi) rest.emplace_back(b + 1, hi);
            }
            open.swap(rest);
            if (open.empty()) break;
          }
          if (!open.empty() && t.spineSwitch_[static_cast<size_t>(t.defaultSpine_)] != sw)
            return wrong(open.front().first, t.defaultSpine_), rd.err;
        }
      }
    }
    t.steerable_ = !t.steer_.empty();
  }
  t.finish();
  // Every two leaves with hosts must reach each other (through some spine).
  std::vector<int> used;
  for (const Host& h : t.hosts_)
    for (const Port& p : h.ports)
      if (std::find(used.begin(), used.end(), p.leaf) == used.end()) used.push_back(p.leaf);
  for (size_t i = 0; i < used.size(); ++i)
    for (size_t j = i + 1; j < used.size(); ++j)
      if (t.leafPaths(used[i], used[j]).links.empty())
        return rd.fail("leaves", t.switches_[static_cast<size_t>(used[i])].name + " and " +
                                     t.switches_[static_cast<size_t>(used[j])].name +
                                     " have hosts but share no spine: no path between them"),
               rd.err;
  *out = std::move(t);
  return Status::ok();
}

Topology Topology::flat(const std::vector<int>& portsPerHost, double bps) {
  Topology t;
  t.source_ = "flat";
  std::string key = "flat";
  const int sw = t.addSwitch("fabric", 0);
  for (size_t h = 0; h < portsPerHost.size(); ++h) {
    key += "," + std::to_string(portsPerHost[h]);
    t.addHost("host" + std::to_string(h), portsPerHost[h], sw, bps);
  }
  t.hash_ = fnv1a(key);
  t.finish();
  return t;
}

Topology Topology::leafSpine(int hosts, int ports, int leaves, int spines, double hostBps, double uplinkBps) {
  Topology t;
  t.source_ = "leaf-spine " + std::to_string(hosts) + "x" + std::to_string(ports) + " " + std::to_string(leaves) +
              " leaves " + std::to_string(spines) + " spines";
  for (int l = 0; l < leaves; ++l) t.addSwitch("leaf" + std::to_string(l), 0);
  for (int s = 0; s < spines; ++s) t.spineSwitch_.push_back(t.addSwitch("spine" + std::to_string(s), 1));
  for (int l = 0; l < leaves; ++l)
    for (int s = 0; s < spines; ++s) {
      const std::string ln = "leaf" + std::to_string(l), sn = "spine" + std::to_string(s);
      t.switches_[static_cast<size_t>(l)].up.push_back(
          t.addCable(ln + "-" + sn, ln, l, sn, t.spineSwitch_[static_cast<size_t>(s)], uplinkBps));
    }
  for (int h = 0; h < hosts; ++h)
    t.addHost("h" + std::to_string(h), ports, static_cast<int>(static_cast<int64_t>(h) * leaves / hosts), hostBps);
  t.hash_ = fnv1a(t.source_);
  t.finish();
  return t;
}

Status Topology::fatTreeFromSpec(const std::string& spec, Topology* out) {
  std::vector<double> v;
  const char* p = spec.c_str();
  for (;;) {
    char* end = nullptr;
    const double x = strtod(p, &end);
    if (end == p || v.size() == 4) {
      v.clear();
      break;
    }
    v.push_back(x);
    if (*end == '\0') break;
    if (*end != ',') {
      v.clear();
      break;
    }
    p = end + 1;
  }
  auto whole = [](double x, double lo, double hi) { return x >= lo && x <= hi && x == static_cast<int>(x); };
  if (v.size() < 3 || !whole(v[0], 2, 64) || static_cast<int>(v[0]) % 2 != 0 || !whole(v[1], 1, 64) ||
      !whole(v[2], 1, 16) || (v.size() == 4 && !(v[3] > 0 && v[3] <= 1e6)))
    return makeError(Code::kInvalidArgument,
                     "--fat-tree %s: expected K,HOSTS_PER_LEAF,PORTS[,GBIT] (K even, 2..64; 1..64 hosts per leaf; "
                     "1..16 ports; GBIT > 0)",
                     spec.c_str());
  *out =
      fatTree(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), (v.size() == 4 ? v[3] : 1) * 1e9);
  return Status::ok();
}

Topology Topology::fatTree(int k, int hostsPerLeaf, int ports, double bps) {
  Topology t;
  t.source_ =
      "fat-tree k=" + std::to_string(k) + " " + std::to_string(hostsPerLeaf) + " hosts/leaf x" + std::to_string(ports);
  const int half = k / 2;
  // Switch indices: leaves first (pod-major), then aggregation, then core.
  for (int p = 0; p < k; ++p)
    for (int i = 0; i < half; ++i) t.addSwitch("leaf" + std::to_string(p * half + i), 0);
  const int aggBase = t.numSwitches();
  for (int p = 0; p < k; ++p)
    for (int i = 0; i < half; ++i) t.addSwitch("agg" + std::to_string(p * half + i), 1);
  const int coreBase = t.numSwitches();
  for (int c = 0; c < half * half; ++c) t.addSwitch("core" + std::to_string(c), 2);
  auto name = [&](int s) { return t.switches_[static_cast<size_t>(s)].name; };
  for (int p = 0; p < k; ++p)
    for (int i = 0; i < half; ++i) {
      const int leaf = p * half + i;
      for (int j = 0; j < half; ++j) {
        const int agg = aggBase + p * half + j;
        t.switches_[static_cast<size_t>(leaf)].up.push_back(
            t.addCable(name(leaf) + "-" + name(agg), name(leaf), leaf, name(agg), agg, bps));
      }
    }
  for (int p = 0; p < k; ++p)
    for (int j = 0; j < half; ++j) {
      const int agg = aggBase + p * half + j;
      for (int c = 0; c < half; ++c) {
        const int core = coreBase + j * half + c;  // aggregation switch j of every pod reaches cores j*half..
        t.switches_[static_cast<size_t>(agg)].up.push_back(
            t.addCable(name(agg) + "-" + name(core), name(agg), agg, name(core), core, bps));
      }
    }
  int h = 0;
  for (int leaf = 0; leaf < k * half; ++leaf)
    for (int i = 0; i < hostsPerLeaf; ++i, ++h) t.addHost("h" + std::to_string(h), ports, leaf, bps);
  t.hash_ = fnv1a(t.source_);
  t.finish();
  return t;
}

const Topology::LeafPaths& Topology::leafPaths(int la, int lb) const {
  auto key = std::make_pair(la, lb);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  LeafPaths out;
  if (la == lb) {
    out.links.emplace_back();
    out.top.push_back(-1);
  } else {
    // Up-paths of growing height from both leaves; the shortest height at which they meet gives all
    // equal-cost valley-free paths (up from la, down to lb).
    struct Up {
      int node;
      std::vector<int> links;
    };
    std::vector<Up> fromA{{la, {}}}, fromB{{lb, {}}};
    for (int height = 1; height <= 4 && out.links.empty(); ++height) {
      std::vector<Up> na, nb;
      for (const Up& u : fromA)
        for (int l : switches_[static_cast<size_t>(u.node)].up) {
          Up v{links_[static_cast<size_t>(l)].to, u.links};
          v.links.push_back(l);
          na.push_back(std::move(v));
        }
      for (const Up& u : fromB)
        for (int l : switches_[static_cast<size_t>(u.node)].up) {
          Up v{links_[static_cast<size_t>(l)].to, u.links};
          v.links.push_back(l);
          nb.push_back(std::move(v));
        }
      fromA = std::move(na);
      fromB = std::move(nb);
      for (const Up& a : fromA)
        for (const Up& b : fromB) {
          if (a.node != b.node) continue;
          std::vector<int> p = a.links;
          for (auto r = b.links.rbegin(); r != b.links.rend(); ++r)
            p.push_back(links_[static_cast<size_t>(*r)].reverse);
          out.links.push_back(std::move(p));
          out.top.push_back(a.node);
        }
    }
  }
  return cache_.emplace(key, std::move(out)).first->second;
}

int Topology::numPaths(HostPort a, HostPort b) const {
  if (a.host == b.host) return 1;
  const size_t n = leafPaths(port(a).leaf, port(b).leaf).links.size();
  return n == 0 ? 1 : static_cast<int>(n);
}

void Topology::pathLinks(HostPort a, HostPort b, int i, std::vector<int>* out) const {
  out->clear();
  if (a.host == b.host) return;  // within a host: no fabric link
  const Port& pa = port(a);
  const Port& pb = port(b);
  out->push_back(pa.up);
  const LeafPaths& lp = leafPaths(pa.leaf, pb.leaf);
  if (!lp.links.empty()) {
    const auto& l = lp.links[static_cast<size_t>(i) % lp.links.size()];
    out->insert(out->end(), l.begin(), l.end());
  }
  out->push_back(pb.down);
}

std::string Topology::pathName(HostPort a, HostPort b, int i) const {
  if (a.host == b.host) return "";
  const LeafPaths& lp = leafPaths(port(a).leaf, port(b).leaf);
  if (lp.top.empty()) return "";
  const int top = lp.top[static_cast<size_t>(i) % lp.top.size()];
  return top < 0 ? "" : switches_[static_cast<size_t>(top)].name;
}

std::vector<PortRange> Topology::steeringRanges(HostPort a, HostPort b, int i) const {
  if (!steerable_ || a.host == b.host) return {};
  const LeafPaths& lp = leafPaths(port(a).leaf, port(b).leaf);
  if (lp.top.size() < 2) return {};
  auto it = steer_.find(lp.top[static_cast<size_t>(i) % lp.top.size()]);
  return it == steer_.end() ? std::vector<PortRange>{} : it->second;
}

int Topology::pathByPorts(HostPort a, HostPort b, uint16_t sport, uint16_t dport) const {
  if (a.host == b.host) return 0;
  const LeafPaths& lp = leafPaths(port(a).leaf, port(b).leaf);
  if (lp.top.size() < 2) return 0;
  if (!match_.empty()) {
    int spine = defaultSpine_;
    for (const MatchRule& m : match_) {
      const uint16_t v = m.dport ? dport : sport;
      if (v >= m.lo && v <= m.hi) {
        spine = m.spine;
        break;
      }
    }
    if (spine < static_cast<int>(spineSwitch_.size())) {
      const int sw = spineSwitch_[static_cast<size_t>(spine)];
      for (size_t i = 0; i < lp.top.size(); ++i)
        if (lp.top[i] == sw) return static_cast<int>(i);
    }
  }
  // A switch hashing the ports.
  uint64_t x = (static_cast<uint64_t>(sport) << 16 | dport) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<int>(x % lp.top.size());
}

}  // namespace c4::plan
