#include "planner/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <map>
#include <tuple>

namespace c4::plan {

namespace {

constexpr uint16_t kEphemeralLo = 32768, kEphemeralHi = 60999;  // Linux's default ip_local_port_range

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t pairKey(int a, int b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

// A run of link indices in a ConnWork's pool.
struct Links {
  const int* b = nullptr;
  const int* e = nullptr;
  const int* begin() const { return b; }
  const int* end() const { return e; }
};

// One way to carry a lane: ports at both ends and a path. Its links, both directions, lie in its
// connection's pool (ConnWork::fwd/back): fwd is a's port up, the fabric's links, b's port down;
// back the same cables the other way, from b.
struct Candidate {
  int pa = 0, pb = 0, path = 0;
  int route = 0;     // index of its fabric links (those between the ports) in ConnWork::routes
  uint32_t off = 0;  // its links in ConnWork::pool: nf forward, then nb back
  uint16_t nf = 0, nb = 0;
};

struct ConnWork {
  int a = 0, b = 0;
  double ab = 0, ba = 0;  // bytes per lane, each direction
  std::vector<Candidate> cands;
  std::vector<int> choice;  // candidate per lane
  // What Solver::best scores once rather than per candidate: the fabric links of each distinct
  // (leaf, leaf, path) route, each way, in the order of the candidates' own lists.
  std::vector<std::pair<std::vector<int>, std::vector<int>>> routes;
  // Every candidate's links, one allocation rather than two per candidate (thousands a lane on a
  // large fat-tree: allocating them was most of a plan's time).
  std::vector<int> pool;
  Links fwd(const Candidate& k) const { return Links{pool.data() + k.off, pool.data() + k.off + k.nf}; }
  Links back(const Candidate& k) const { return Links{pool.data() + k.off + k.nf, pool.data() + k.off + k.nf + k.nb}; }
};

std::string humanBytes(double b) {
  char buf[32];
  if (b >= 1e9)
    snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    snprintf(buf, sizeof(buf), "%.2f MB", b / 1e6);
  else if (b >= 1e3)
    snprintf(buf, sizeof(buf), "%.1f KB", b / 1e3);
  else
    snprintf(buf, sizeof(buf), "%.0f B", b);
  return buf;
}

class Solver {
 public:
  Solver(const PlanInput& in) : in_(in), t_(*in.topo) {
    secPerByte_.resize(static_cast<size_t>(t_.numLinks()));
    for (int l = 0; l < t_.numLinks(); ++l) secPerByte_[static_cast<size_t>(l)] = secondsPerByte(in, l);
    resetLoad();
  }

  /// The load before any lane of this input: the background's.
  void resetLoad() {
    if (in_.background.size() == static_cast<size_t>(t_.numLinks())) {
      load_ = in_.background;
    } else {
      load_.assign(static_cast<size_t>(t_.numLinks()), 0.0);
    }
  }

  Status build(std::vector<ConnWork>* conns) {
    const int n = static_cast<int>(in_.ranks.size());
    if (in_.lanes < 1) return makeError(Code::kInvalidArgument, "planner: %d lanes per connection", in_.lanes);
    if (!in_.background.empty()) {
      if (in_.background.size() != static_cast<size_t>(t_.numLinks()))
        return makeError(Code::kInvalidArgument, "planner: background load for %zu links; topology %s has %d",
                         in_.background.size(), t_.source().c_str(), t_.numLinks());
      for (size_t l = 0; l < in_.background.size(); ++l)
        if (!std::isfinite(in_.background[l]) || in_.background[l] < 0)
          return makeError(Code::kInvalidArgument, "planner: background load %g on link %zu", in_.background[l], l);
    }
    if (!in_.capacity.empty()) {
      if (in_.capacity.size() != static_cast<size_t>(t_.numLinks()))
        return makeError(Code::kInvalidArgument, "planner: capacity factors for %zu links; topology %s has %d",
                         in_.capacity.size(), t_.source().c_str(), t_.numLinks());
      for (size_t l = 0; l < in_.capacity.size(); ++l)
        if (!(in_.capacity[l] > 0 && in_.capacity[l] <= 1))
          return makeError(Code::kInvalidArgument, "planner: capacity factor %g on link %zu (0 < f <= 1)",
                           in_.capacity[l], l);
    }
    for (int r = 0; r < n; ++r) {
      const RankPlace& p = in_.ranks[static_cast<size_t>(r)];
      if (p.host < 0 || p.host >= t_.numHosts())
        return makeError(Code::kInvalidArgument, "planner: rank %d sits on no host of topology %s", r,
                         t_.source().c_str());
      if (p.ports.empty())
        return makeError(Code::kInvalidArgument, "planner: rank %d has no NIC port in topology %s", r,
                         t_.source().c_str());
      for (int q : p.ports)
        if (q < 0 || q >= static_cast<int>(t_.host(p.host).ports.size()))
          return makeError(Code::kInvalidArgument, "planner: rank %d names port %d of host %s, which has %zu", r, q,
                           t_.host(p.host).name.c_str(), t_.host(p.host).ports.size());
    }
    std::map<std::pair<int, int>, std::pair<double, double>> sum;
    for (const Flow& f : in_.flows) {
      if (f.src < 0 || f.src >= n || f.dst < 0 || f.dst >= n)
        return makeError(Code::kInvalidArgument, "planner: a flow from rank %d to rank %d; the job has %d ranks", f.src,
                         f.dst, n);
      if (f.src == f.dst || f.bytes <= 0) continue;
      if (in_.ranks[static_cast<size_t>(f.src)].host == in_.ranks[static_cast<size_t>(f.dst)].host) continue;
      auto& s = sum[{std::min(f.src, f.dst), std::max(f.src, f.dst)}];
      (f.src < f.dst ? s.first : s.second) += f.bytes;
    }
    for (auto& [k, v] : sum) {
      ConnWork c;
      c.a = k.first;
      c.b = k.second;
      c.ab = v.first / in_.lanes;
      c.ba = v.second / in_.lanes;
      conns->push_back(std::move(c));
    }
    // Largest first; ties by ranks (deterministic).
    std::stable_sort(conns->begin(), conns->end(),
                     [](const ConnWork& x, const ConnWork& y) { return std::max(x.ab, x.ba) > std::max(y.ab, y.ba); });
    return Status::ok();
  }

  void candidates(ConnWork& c) {
    const RankPlace& ra = in_.ranks[static_cast<size_t>(c.a)];
    const RankPlace& rb = in_.ranks[static_cast<size_t>(c.b)];
    // The routes between two leaves are the same for every pair of ports on them (Topology's
    // paths are per leaf pair): each leaf pair's first route, by index.
    std::map<std::pair<int, int>, int> firstRoute;
    std::vector<int> fwd, back;
    for (size_t pa = 0; pa < ra.ports.size(); ++pa)
      for (size_t pb = 0; pb < rb.ports.size(); ++pb) {
        // Room for all: the first port pair's share times the pairs (every pair has as many).
        if (pa == 0 && pb == 1) {
          const size_t pairs = ra.ports.size() * rb.ports.size();
          c.pool.reserve(c.pool.size() * pairs);
          c.cands.reserve(c.cands.size() * pairs);
        }
        const HostPort ha{ra.host, ra.ports[pa]}, hb{rb.host, rb.ports[pb]};
        const Port &porta = t_.port(ha), &portb = t_.port(hb);
        const int np = t_.numPaths(ha, hb);
        auto first = firstRoute.emplace(std::make_pair(porta.leaf, portb.leaf), static_cast<int>(c.routes.size()));
        for (int i = 0; i < np; ++i) {
          if (first.second) {
            t_.pathLinks(ha, hb, i, &fwd);
            back.clear();
            for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) back.push_back(t_.link(*it).reverse);
            // Between the host ports' own links (first and last each way).
            auto inner = [](const std::vector<int>& v) {
              return v.size() > 2 ? std::vector<int>(v.begin() + 1, v.end() - 1) : std::vector<int>();
            };
            c.routes.emplace_back(inner(fwd), inner(back));
          }
          Candidate k;
          k.pa = static_cast<int>(pa);
          k.pb = static_cast<int>(pb);
          k.path = i;
          k.route = first.first->second + i;
          const auto& route = c.routes[static_cast<size_t>(k.route)];
          // As Topology::pathLinks gives them: a's port up, the route, b's port down; back the
          // reverse of each, in the other order.
          k.off = static_cast<uint32_t>(c.pool.size());
          if (ha.host == hb.host) {  // within a host no link at all (build() plans no such connection)
            c.cands.push_back(k);
            continue;
          }
          c.pool.push_back(porta.up);
          c.pool.insert(c.pool.end(), route.first.begin(), route.first.end());
          c.pool.push_back(portb.down);
          k.nf = static_cast<uint16_t>(c.pool.size() - k.off);
          c.pool.push_back(t_.link(portb.down).reverse);
          c.pool.insert(c.pool.end(), route.second.begin(), route.second.end());
          c.pool.push_back(t_.link(porta.up).reverse);
          k.nb = static_cast<uint16_t>(c.pool.size() - k.off - k.nf);
          c.cands.push_back(k);
        }
      }
  }

  void apply(const ConnWork& c, const Candidate& k, double sign) {
    for (int l : c.fwd(k)) load_[static_cast<size_t>(l)] += sign * c.ab;
    for (int l : c.back(k)) load_[static_cast<size_t>(l)] += sign * c.ba;
  }

  // The most loaded of the candidate's links if the lane went there, and the sum (tie-break).
  std::pair<double, double> cost(const ConnWork& c, const Candidate& k) const {
    double worst = 0, total = 0;
    auto visit = [&](const Links& links, double w) {
      if (w <= 0) return;
      for (int l : links) {
        const double s = (load_[static_cast<size_t>(l)] + w) * secPerByte_[static_cast<size_t>(l)];
        worst = std::max(worst, s);
        total += s;
      }
    };
    visit(c.fwd(k), c.ab);
    visit(c.back(k), c.ba);
    return {worst, total};
  }

  int best(const ConnWork& c) {
    evals_ += static_cast<int64_t>(c.cands.size());
    // cost() of every candidate, from parts scored once: a candidate's links are its a-port's two
    // (up with the a->b bytes, down with b->a's), its route's, and its b-port's two; the worst is
    // the worst part's, the sum the parts' sum (cost() adds link by link: the same up to rounding,
    // which the tolerance below absorbs). A connection between 8-port hosts across a k=16
    // fat-tree has 4096 candidates per lane over 64 routes and 16 ports.
    const RankPlace& ra = in_.ranks[static_cast<size_t>(c.a)];
    const RankPlace& rb = in_.ranks[static_cast<size_t>(c.b)];
    auto score = [&](int link, double w, std::pair<double, double>* acc) {
      if (w <= 0) return;
      const double v = (load_[static_cast<size_t>(link)] + w) * secPerByte_[static_cast<size_t>(link)];
      acc->first = std::max(acc->first, v);
      acc->second += v;
    };
    partA_.assign(ra.ports.size(), {0.0, 0.0});
    for (size_t p = 0; p < ra.ports.size(); ++p) {
      const Port& port = t_.port(HostPort{ra.host, ra.ports[p]});
      score(port.up, c.ab, &partA_[p]);
      score(port.down, c.ba, &partA_[p]);
    }
    partB_.assign(rb.ports.size(), {0.0, 0.0});
    for (size_t p = 0; p < rb.ports.size(); ++p) {
      const Port& port = t_.port(HostPort{rb.host, rb.ports[p]});
      score(port.down, c.ab, &partB_[p]);
      score(port.up, c.ba, &partB_[p]);
    }
    partR_.assign(c.routes.size(), {0.0, 0.0});
    for (size_t r = 0; r < c.routes.size(); ++r) {
      for (int l : c.routes[r].first) score(l, c.ab, &partR_[r]);
      for (int l : c.routes[r].second) score(l, c.ba, &partR_[r]);
    }
    auto costOf = [&](const Candidate& k) {
      const auto& x = partA_[static_cast<size_t>(k.pa)];
      const auto& y = partR_[static_cast<size_t>(k.route)];
      const auto& z = partB_[static_cast<size_t>(k.pb)];
      return std::make_pair(std::max(x.first, std::max(y.first, z.first)), x.second + y.second + z.second);
    };
    int bi = 0;
    std::pair<double, double> bc = costOf(c.cands[0]);
    for (size_t i = 1; i < c.cands.size(); ++i) {
      auto k = costOf(c.cands[i]);
      // Relative tolerance: equal loads computed in different orders must tie.
      const double eps = 1e-12 * std::max(1.0, bc.first);
      const double eps2 = 1e-12 * std::max(1.0, bc.second);
      if (k.first < bc.first - eps || (k.first <= bc.first + eps && k.second < bc.second - eps2)) {
        bc = k;
        bi = static_cast<int>(i);
      }
    }
    return bi;
  }

  double maxSeconds(int* which) const {
    double m = 0;
    *which = -1;
    for (size_t l = 0; l < load_.size(); ++l) {
      const double s = load_[l] * secPerByte_[l];
      if (s > m * (1 + 1e-12)) {
        m = s;
        *which = static_cast<int>(l);
      }
    }
    return m;
  }

  void greedy(std::vector<ConnWork>& conns) {
    for (ConnWork& c : conns) {
      if (c.cands.empty()) candidates(c);
      c.choice.assign(static_cast<size_t>(in_.lanes), 0);
      for (int l = 0; l < in_.lanes; ++l) {
        const int k = best(c);
        c.choice[static_cast<size_t>(l)] = k;
        apply(c, c.cands[static_cast<size_t>(k)], +1);
      }
    }
  }

  // Moves lanes off the most loaded link while that lowers what their new path's worst link reads.
  void localSearch(std::vector<ConnWork>& conns) {
    for (int move = 0; move < in_.searchMoves; ++move) {
      int b = -1;
      const double m = maxSeconds(&b);
      if (b < 0) return;
      bool moved = false;
      for (ConnWork& c : conns) {
        for (size_t l = 0; l < c.choice.size() && !moved; ++l) {
          const Candidate& cur = c.cands[static_cast<size_t>(c.choice[l])];
          if (!uses(c, cur, b)) continue;
          apply(c, cur, -1);
          const int k = best(c);
          if (k != c.choice[l] && cost(c, c.cands[static_cast<size_t>(k)]).first < m * (1 - 1e-9)) {
            c.choice[l] = k;
            moved = true;
          }
          apply(c, c.cands[static_cast<size_t>(c.choice[l])], +1);
        }
        if (moved) break;
      }
      if (!moved && !chain(conns, b, m)) return;
    }
  }

  // Whether lane l of c runs over link `link` in a direction that carries its bytes.
  static bool uses(const ConnWork& c, const Candidate& k, int link) {
    const Links f = c.fwd(k), r = c.back(k);
    return (c.ab > 0 && std::find(f.begin(), f.end(), link) != f.end()) ||
           (c.ba > 0 && std::find(r.begin(), r.end(), link) != r.end());
  }

  // No single lane can leave the most loaded link b (reading m) without making another link read
  // m: an ejection chain of two. Lane X leaves b for a path whose worst link then reads m (a tie),
  // and a lane Y leaves that link for a path below m; kept only if both end below m. Bounded work.
  bool chain(std::vector<ConnWork>& conns, int b, double m) {
    const double below = m * (1 - 1e-9);
    int64_t budget = 200000;  // candidate evaluations
    for (ConnWork& cx : conns) {
      for (size_t lx = 0; lx < cx.choice.size(); ++lx) {
        const int curX = cx.choice[lx];
        if (!uses(cx, cx.cands[static_cast<size_t>(curX)], b)) continue;
        apply(cx, cx.cands[static_cast<size_t>(curX)], -1);
        for (size_t kx = 0; kx < cx.cands.size() && budget > 0; ++kx) {
          --budget;
          if (static_cast<int>(kx) == curX) continue;
          const Candidate& candX = cx.cands[kx];
          if (uses(cx, candX, b) || cost(cx, candX).first > m * (1 + 1e-9)) continue;
          apply(cx, candX, +1);
          // Each link of X's new path that now reads m must lose a lane Y to a path below m.
          std::vector<int> ties;
          for (const Links& links : {cx.fwd(candX), cx.back(candX)})
            for (int l : links)
              if (load_[static_cast<size_t>(l)] * secPerByte_[static_cast<size_t>(l)] >= below &&
                  std::find(ties.begin(), ties.end(), l) == ties.end())
                ties.push_back(l);
          struct Undo {
            ConnWork* c;
            size_t lane;
            int was;
          };
          std::vector<Undo> undo;
          bool done = true;
          for (int tie : ties) {
            if (load_[static_cast<size_t>(tie)] * secPerByte_[static_cast<size_t>(tie)] < below) continue;
            bool relieved = false;
            for (ConnWork& cy : conns) {
              for (size_t ly = 0; ly < cy.choice.size() && !relieved && budget > 0; ++ly) {
                if (&cy == &cx && ly == lx) continue;
                const int was = cy.choice[ly];
                const Candidate& curY = cy.cands[static_cast<size_t>(was)];
                if (!uses(cy, curY, tie)) continue;
                apply(cy, curY, -1);
                const int ky = best(cy);
                budget -= static_cast<int64_t>(cy.cands.size());
                if (ky != was && cost(cy, cy.cands[static_cast<size_t>(ky)]).first < below) {
                  cy.choice[ly] = ky;
                  undo.push_back(Undo{&cy, ly, was});
                  relieved = true;
                }
                apply(cy, cy.cands[static_cast<size_t>(cy.choice[ly])], +1);
              }
              if (relieved) break;
            }
            if (!relieved) {
              done = false;
              break;
            }
          }
          if (!done) {
            for (auto u = undo.rbegin(); u != undo.rend(); ++u) {
              apply(*u->c, u->c->cands[static_cast<size_t>(u->c->choice[u->lane])], -1);
              u->c->choice[u->lane] = u->was;
              apply(*u->c, u->c->cands[static_cast<size_t>(u->was)], +1);
            }
          }
          if (done) {
            cx.choice[lx] = static_cast<int>(kx);
            return true;
          }
          apply(cx, candX, -1);
        }
        apply(cx, cx.cands[static_cast<size_t>(curX)], +1);
        if (budget <= 0) return false;
      }
    }
    return false;
  }

  std::vector<double>& load() { return load_; }
  /// Candidates priced so far (the restarts' work budget: deterministic, unlike a clock).
  int64_t evals() const { return evals_; }

 private:
  const PlanInput& in_;
  const Topology& t_;
  std::vector<double> secPerByte_;
  std::vector<double> load_;
  int64_t evals_ = 0;
  // best()'s parts (worst, sum) per a-port, b-port and route; kept to reuse their memory.
  std::vector<std::pair<double, double>> partA_, partB_, partR_;
};

// The steering ranges clipped to the source ports the transport can send from.
std::vector<PortRange> clipRanges(const std::vector<PortRange>& ranges, PortRange span) {
  if (span.lo == 0 && span.hi == 0) return ranges;
  std::vector<PortRange> out;
  for (const PortRange& r : ranges) {
    const uint16_t lo = std::max(r.lo, span.lo), hi = std::min(r.hi, span.hi);
    if (lo <= hi) out.push_back(PortRange{lo, hi});
  }
  return out;
}

std::string rangesText(const std::vector<PortRange>& ranges) {
  std::string out;
  for (const PortRange& r : ranges)
    out += (out.empty() ? "" : ", ") + std::to_string(r.lo) + "-" + std::to_string(r.hi);
  return out;
}

// The ranges that steer a -> b onto path i and that the transport can send from (in.sourcePorts);
// an error where the fabric steers that path only with ports the transport cannot use.
Status usableRanges(const PlanInput& in, HostPort a, HostPort b, int i, std::vector<PortRange>* out) {
  const Topology& t = *in.topo;
  const std::vector<PortRange> all = t.steeringRanges(a, b, i);
  *out = clipRanges(all, in.sourcePorts);
  if (all.empty() || !out->empty()) return Status::ok();
  return makeError(Code::kInvalidArgument,
                   "planner: the fabric steers %s %s -> %s %s through %s with source ports %s only, and the "
                   "transport sends from %u-%u (RoCE v2: 49152-65535); give that spine an ECMP steering range there",
                   t.host(a.host).name.c_str(), t.port(a).name.c_str(), t.host(b.host).name.c_str(),
                   t.port(b).name.c_str(), t.pathName(a, b, i).c_str(), rangesText(all).c_str(),
                   static_cast<unsigned>(in.sourcePorts.lo), static_cast<unsigned>(in.sourcePorts.hi));
}

// Steering source ports: distinct per local address (host port) and path's ranges, offset by salt.
class PortAllocator {
 public:
  explicit PortAllocator(uint32_t salt) : salt_(salt) {}
  Status take(const Topology& t, HostPort local, const std::vector<PortRange>& ranges, uint16_t* port,
              PortRange* range) {
    size_t total = 0;
    for (const PortRange& r : ranges) total += static_cast<size_t>(r.hi - r.lo) + 1;
    if (total == 0) return Status::ok();
    const auto key = std::make_tuple(local.host, local.port, ranges.front().lo);
    size_t& used = used_[key];
    if (used >= total)
      return makeError(Code::kInvalidUsage,
                       "planner: the steering source ports of %s port %s (%zu) are all taken; widen the fabric's ECMP "
                       "steering range or use fewer lanes (C4_LANES)",
                       t.host(local.host).name.c_str(), t.port(local).name.c_str(), total);
    size_t k = (salt_ + used++) % total;
    for (const PortRange& r : ranges) {
      const size_t n = static_cast<size_t>(r.hi - r.lo) + 1;
      if (k < n) {
        *port = static_cast<uint16_t>(r.lo + k);
        *range = r;
        return Status::ok();
      }
      k -= n;
    }
    return Status::ok();
  }

 private:
  uint32_t salt_;
  std::map<std::tuple<int, int, uint16_t>, size_t> used_;
};

}  // namespace

const char* modeName(Mode m) {
  switch (m) {
    case Mode::kOff:
      return "off";
    case Mode::kEcmp:
      return "ecmp";
    case Mode::kC4p:
      return "c4p";
  }
  return "?";
}

bool parseMode(const std::string& s, Mode* out) {
  for (Mode m : {Mode::kOff, Mode::kEcmp, Mode::kC4p})
    if (s == modeName(m)) {
      *out = m;
      return true;
    }
  return false;
}

double secondsPerByte(const PlanInput& in, int l) {
  const double f = static_cast<size_t>(l) < in.capacity.size() ? in.capacity[static_cast<size_t>(l)] : 1.0;
  return 8.0 / (in.topo->link(l).bps * (f > 0 ? f : 1.0));
}

const PlannedConn* Plan::find(int x, int y) const {
  auto it = index_.find(pairKey(std::min(x, y), std::max(x, y)));
  return it == index_.end() ? nullptr : &conns[it->second];
}

int Plan::bottleneck(const Topology& t) const {
  int b = -1;
  double m = 0;
  for (size_t l = 0; l < load.size(); ++l) {
    const double s = load[l] * 8.0 / t.link(static_cast<int>(l)).bps;
    if (s > m * (1 + 1e-12)) {
      m = s;
      b = static_cast<int>(l);
    }
  }
  return b;
}

double Plan::maxLinkSeconds(const Topology& t) const {
  const int b = bottleneck(t);
  return b < 0 ? 0 : load[static_cast<size_t>(b)] * 8.0 / t.link(b).bps;
}

double Plan::hostBoundSeconds(const Topology& t, const PlanInput& in) {
  // Per host: bytes out over the summed capacity of the ports its ranks use (and in, likewise).
  std::map<int, double> out, inb;
  std::map<int, std::map<int, bool>> used;
  for (const RankPlace& r : in.ranks)
    for (int p : r.ports) used[r.host][p] = true;
  for (const Flow& f : in.flows) {
    const int hs = in.ranks[static_cast<size_t>(f.src)].host, hd = in.ranks[static_cast<size_t>(f.dst)].host;
    if (hs == hd || f.bytes <= 0) continue;
    out[hs] += f.bytes;
    inb[hd] += f.bytes;
  }
  const bool bg = in.background.size() == static_cast<size_t>(t.numLinks());
  double m = 0;
  for (auto& [h, ports] : used) {
    double up = 0, down = 0;
    for (auto& [p, yes] : ports) {
      const HostPort hp{h, p};
      up += t.link(t.port(hp).up).bps;
      down += t.link(t.port(hp).down).bps;
      if (bg) {
        out[h] += in.background[static_cast<size_t>(t.port(hp).up)];
        inb[h] += in.background[static_cast<size_t>(t.port(hp).down)];
      }
    }
    m = std::max(m, out[h] * 8.0 / up);
    m = std::max(m, inb[h] * 8.0 / down);
  }
  return m;
}

void laneLinks(const PlanInput& in, const PlannedConn& c, const LaneChoice& l, bool fromA, std::vector<int>* links) {
  const Topology& t = *in.topo;
  const RankPlace& ra = in.ranks[static_cast<size_t>(c.a)];
  const RankPlace& rb = in.ranks[static_cast<size_t>(c.b)];
  const HostPort ha{ra.host, ra.ports[static_cast<size_t>(l.localPort)]},
      hb{rb.host, rb.ports[static_cast<size_t>(l.remotePort)]};
  if (fromA) {
    t.pathLinks(ha, hb, l.path, links);
  } else if (l.backPath >= 0) {
    t.pathLinks(hb, ha, l.backPath, links);  // the ECMP rule gave the replies their own path
  } else {
    std::vector<int> fwd;
    t.pathLinks(ha, hb, l.path, &fwd);
    links->clear();
    for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) links->push_back(t.link(*it).reverse);
  }
}

void Plan::computeLoad(const PlanInput& in) {
  const Topology& t = *in.topo;
  load.assign(static_cast<size_t>(t.numLinks()), 0.0);
  std::vector<int> links;
  for (const PlannedConn& c : conns) {
    const double live = static_cast<double>(std::max<std::ptrdiff_t>(
        1, std::count_if(c.lanes.begin(), c.lanes.end(), [](const LaneChoice& l) { return !l.retired; })));
    const double ab = c.bytesAB / live, ba = c.bytesBA / live;
    for (const LaneChoice& l : c.lanes) {
      if (l.retired) continue;
      laneLinks(in, c, l, true, &links);
      for (int e : links) load[static_cast<size_t>(e)] += ab;
      laneLinks(in, c, l, false, &links);
      for (int e : links) load[static_cast<size_t>(e)] += ba;
    }
  }
}

std::string Plan::describe(const PlanInput& in) const {
  const Topology& t = *in.topo;
  std::string s;
  char buf[512];
  for (const PlannedConn& c : conns) {
    const RankPlace& ra = in.ranks[static_cast<size_t>(c.a)];
    const RankPlace& rb = in.ranks[static_cast<size_t>(c.b)];
    for (size_t i = 0; i < c.lanes.size(); ++i) {
      const LaneChoice& l = c.lanes[i];
      if (l.retired) continue;
      HostPort ha{ra.host, ra.ports[static_cast<size_t>(l.localPort)]},
          hb{rb.host, rb.ports[static_cast<size_t>(l.remotePort)]};
      const std::string via = t.pathName(ha, hb, l.path);
      const std::string back = l.backPath >= 0 && l.backPath != l.path ? t.pathName(hb, ha, l.backPath) : via;
      snprintf(buf, sizeof(buf), "rank %d <-> rank %d lane %zu: %s%s -> %s%s%s%s%s%s, sport %u, %s -> / %s <-\n", c.a,
               c.b, i, t.host(ha.host).name.c_str(), t.port(ha).name.c_str(), t.host(hb.host).name.c_str(),
               t.port(hb).name.c_str(), via.empty() ? "" : " via ", via.c_str(), back != via ? ", back via " : "",
               back != via ? back.c_str() : "", static_cast<unsigned>(l.sourcePort),
               humanBytes(c.bytesAB / static_cast<double>(c.lanes.size())).c_str(),
               humanBytes(c.bytesBA / static_cast<double>(c.lanes.size())).c_str());
      s += buf;
    }
  }
  return s;
}

std::string Plan::describeLoad(const Topology& t, int maxLines) const {
  std::vector<int> order;
  for (size_t l = 0; l < load.size(); ++l)
    if (load[l] > 0) order.push_back(static_cast<int>(l));
  auto secs = [&](int l) { return load[static_cast<size_t>(l)] * 8.0 / t.link(l).bps; };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return secs(x) > secs(y); });
  const double top = order.empty() ? 0 : secs(order.front());
  std::string s;
  char buf[256];
  int n = 0;
  for (int l : order) {
    if (maxLines > 0 && n++ >= maxLines) break;
    snprintf(buf, sizeof(buf), "%-24s %10s %9.2f ms %4.0f%%\n", t.link(l).name.c_str(),
             humanBytes(load[static_cast<size_t>(l)]).c_str(), secs(l) * 1e3, top > 0 ? 100.0 * secs(l) / top : 0.0);
    s += buf;
  }
  return s;
}

namespace {

// No plan beats the busiest host's bytes over its ports, nor the bytes leaving (entering) a leaf
// for other leaves over its uplinks (what an oversubscribed fabric imposes).
double lowerBound(const PlanInput& in) {
  const Topology& t = *in.topo;
  double m = Plan::hostBoundSeconds(t, in);
  std::map<int, double> out, inb;  // leaf -> bytes
  for (const Flow& f : in.flows) {
    const RankPlace& rs = in.ranks[static_cast<size_t>(f.src)];
    const RankPlace& rd = in.ranks[static_cast<size_t>(f.dst)];
    if (rs.host == rd.host || f.bytes <= 0) continue;
    const int ls = t.port(HostPort{rs.host, rs.ports[0]}).leaf, ld = t.port(HostPort{rd.host, rd.ports[0]}).leaf;
    if (ls == ld) continue;
    out[ls] += f.bytes;
    inb[ld] += f.bytes;
  }
  const bool bg = in.background.size() == static_cast<size_t>(t.numLinks());
  for (int side = 0; side < 2; ++side)
    for (auto& [leaf, bytes] : side == 0 ? out : inb) {
      double bps = 0, more = 0;
      for (int l : t.sw(leaf).up) {
        bps += t.link(l).bps;
        // Into the leaf: the reverse of its uplinks.
        if (bg) more += in.background[static_cast<size_t>(side == 0 ? l : t.link(l).reverse)];
      }
      if (bps > 0) m = std::max(m, (bytes + more) * 8.0 / bps);
    }
  // A link keeps at least its background.
  for (size_t l = 0; bg && l < in.background.size(); ++l)
    m = std::max(m, in.background[l] * 8.0 / t.link(static_cast<int>(l)).bps);
  return m;
}

}  // namespace

Status makePlan(const PlanInput& in, Plan* out) {
  if (in.topo == nullptr) return makeError(Code::kInvalidArgument, "planner: no topology");
  const Topology& t = *in.topo;
  Solver solver(in);
  std::vector<ConnWork> work;
  Status st = solver.build(&work);
  if (!st.isOk()) return st;
  Plan p;
  p.mode = in.mode;
  if (in.mode == Mode::kC4p) {
    solver.greedy(work);
    solver.localSearch(work);
    // Above the host-port bound, single moves and short chains can be stuck where a long swap
    // would help (lanes as colours of a bipartite graph across a fat-tree's pods). Greedy again
    // from other orders (connections and tie-breaks shuffled, seeded: every rank gets the same
    // plan), within a budget of work, keeping the best.
    int b = -1;
    double bestMax = solver.maxSeconds(&b);
    const double bound = lowerBound(in);
    const int64_t budget = solver.evals() + std::min<int64_t>(solver.evals() * in.restarts, 5000000);
    uint64_t rng = 0x5EED;
    for (int r = 0; r < in.restarts && bestMax > bound * (1 + 1e-9) && solver.evals() < budget; ++r) {
      std::vector<ConnWork> trial = work;
      for (size_t i = trial.size(); i > 1; --i) std::swap(trial[i - 1], trial[(rng = splitmix(rng)) % i]);
      for (ConnWork& c : trial)
        for (size_t i = c.cands.size(); i > 1; --i) std::swap(c.cands[i - 1], c.cands[(rng = splitmix(rng)) % i]);
      solver.resetLoad();
      solver.greedy(trial);
      solver.localSearch(trial);
      const double m = solver.maxSeconds(&b);
      if (m < bestMax * (1 - 1e-9)) {
        bestMax = m;
        work = std::move(trial);
      }
    }
  }
  PortAllocator ports(in.portSalt);
  for (ConnWork& w : work) {
    PlannedConn c;
    c.a = w.a;
    c.b = w.b;
    c.bytesAB = w.ab * in.lanes;
    c.bytesBA = w.ba * in.lanes;
    const RankPlace& ra = in.ranks[static_cast<size_t>(w.a)];
    const RankPlace& rb = in.ranks[static_cast<size_t>(w.b)];
    for (int l = 0; l < in.lanes; ++l) {
      LaneChoice lc;
      if (in.mode == Mode::kC4p) {
        const Candidate& k = w.cands[static_cast<size_t>(w.choice[static_cast<size_t>(l)])];
        lc.localPort = k.pa;
        lc.remotePort = k.pb;
        lc.path = k.path;
        HostPort ha{ra.host, ra.ports[static_cast<size_t>(k.pa)]}, hb{rb.host, rb.ports[static_cast<size_t>(k.pb)]};
        std::vector<PortRange> ranges;
        st = usableRanges(in, ha, hb, k.path, &ranges);
        if (st.isOk()) st = ports.take(t, ha, ranges, &lc.sourcePort, &lc.sourceRange);
        if (!st.isOk()) return st;
        // The replies follow the steering source port only if the peer's listening port does not
        // match an earlier entry of the fabric's rule; where it does, book them where they go.
        const size_t rp = static_cast<size_t>(k.pb);
        if (lc.sourcePort != 0 && rp < rb.listenPorts.size() && rb.listenPorts[rp] != 0) {
          const int back = t.pathByPorts(hb, ha, rb.listenPorts[rp], lc.sourcePort);
          if (t.pathName(hb, ha, back) != t.pathName(ha, hb, lc.path)) lc.backPath = back;
        }
      } else {
        // What the transport does unplanned: lane l on port l mod ports at both ends; a random
        // source port (ecmp: seeded; off: the kernel's, estimated with a seed) and the fabric's
        // hash for each direction.
        lc.localPort = l % static_cast<int>(ra.ports.size());
        lc.remotePort = lc.localPort % static_cast<int>(rb.ports.size());
        HostPort ha{ra.host, ra.ports[static_cast<size_t>(lc.localPort)]},
            hb{rb.host, rb.ports[static_cast<size_t>(lc.remotePort)]};
        const uint64_t r = splitmix(in.seed ^ splitmix(pairKey(w.a, w.b) * 131 + static_cast<uint64_t>(l)));
        // A random port of those the transport sends from (tcp: the kernel's ephemeral range).
        const bool span = in.sourcePorts.hi != 0;
        const uint16_t lo = span ? in.sourcePorts.lo : kEphemeralLo, hi = span ? in.sourcePorts.hi : kEphemeralHi;
        const uint16_t sport = static_cast<uint16_t>(lo + r % (static_cast<uint32_t>(hi - lo) + 1));
        uint16_t dport = rb.listenPorts.size() > static_cast<size_t>(lc.remotePort)
                             ? rb.listenPorts[static_cast<size_t>(lc.remotePort)]
                             : 0;
        if (dport == 0) dport = static_cast<uint16_t>(kEphemeralLo + (r >> 20) % (kEphemeralHi - kEphemeralLo + 1));
        lc.path = t.pathByPorts(ha, hb, sport, dport);
        lc.backPath = t.pathByPorts(hb, ha, dport, sport);
        if (in.mode == Mode::kEcmp) {
          lc.sourcePort = sport;
          lc.sourceRange = PortRange{lo, hi};
        }
      }
      c.lanes.push_back(lc);
    }
    p.index_[pairKey(c.a, c.b)] = p.conns.size();
    p.conns.push_back(std::move(c));
  }
  p.computeLoad(in);
  *out = std::move(p);
  return Status::ok();
}

// Whether lane choice `l` of the connection (a, b) fits the ranks' ports, the fabric's paths and
// the transport's source ports; the error starts with `where`.
static Status checkChoice(const PlanInput& in, int a, int b, const LaneChoice& l, const std::string& where) {
  const Topology& t = *in.topo;
  const RankPlace& ra = in.ranks[static_cast<size_t>(a)];
  const RankPlace& rb = in.ranks[static_cast<size_t>(b)];
  if (l.localPort < 0 || l.localPort >= static_cast<int>(ra.ports.size()) || l.remotePort < 0 ||
      l.remotePort >= static_cast<int>(rb.ports.size()))
    return makeError(Code::kInvalidArgument, "%s: ports %d and %d, the ranks have %zu and %zu", where.c_str(),
                     l.localPort, l.remotePort, ra.ports.size(), rb.ports.size());
  const HostPort ha{ra.host, ra.ports[static_cast<size_t>(l.localPort)]},
      hb{rb.host, rb.ports[static_cast<size_t>(l.remotePort)]};
  if (l.path < 0 || l.path >= t.numPaths(ha, hb) || l.backPath < -1 || l.backPath >= t.numPaths(hb, ha))
    return makeError(Code::kInvalidArgument, "%s: path %d (back %d) of %d", where.c_str(), l.path, l.backPath,
                     t.numPaths(ha, hb));
  const bool span = in.sourcePorts.hi != 0;
  if (span && l.sourcePort != 0 && (l.sourcePort < in.sourcePorts.lo || l.sourcePort > in.sourcePorts.hi))
    return makeError(Code::kInvalidArgument, "%s: source port %u outside %u-%u", where.c_str(), l.sourcePort,
                     in.sourcePorts.lo, in.sourcePorts.hi);
  if (l.sourceRange.lo > l.sourceRange.hi)
    return makeError(Code::kInvalidArgument, "%s: source ports %u-%u", where.c_str(), l.sourceRange.lo,
                     l.sourceRange.hi);
  return Status::ok();
}

Status adoptPlan(const PlanInput& in, const std::vector<PlannedConn>& conns, Plan* out) {
  if (in.topo == nullptr) return makeError(Code::kInvalidArgument, "planner: no topology");
  Solver solver(in);
  std::vector<ConnWork> work;
  Status st = solver.build(&work);
  if (!st.isOk()) return st;
  std::unordered_map<uint64_t, const ConnWork*> want;
  for (const ConnWork& w : work) want[pairKey(w.a, w.b)] = &w;
  if (conns.size() != work.size())
    return makeError(Code::kInvalidArgument, "planner: the plan has %zu connection(s), the job's flows need %zu",
                     conns.size(), work.size());
  Plan p;
  p.mode = Mode::kC4p;
  for (const PlannedConn& c : conns) {
    const int n = static_cast<int>(in.ranks.size());
    if (c.a < 0 || c.b >= n || c.a >= c.b)
      return makeError(Code::kInvalidArgument, "planner: the plan connects ranks %d and %d of %d", c.a, c.b, n);
    auto w = want.find(pairKey(c.a, c.b));
    if (w == want.end())
      return makeError(Code::kInvalidArgument, "planner: the plan connects ranks %d and %d, which exchange no bytes",
                       c.a, c.b);
    if (p.index_.count(pairKey(c.a, c.b)))
      return makeError(Code::kInvalidArgument, "planner: the plan lists ranks %d and %d twice", c.a, c.b);
    int live = 0;
    for (size_t i = 0; i < c.lanes.size(); ++i) {
      const LaneChoice& l = c.lanes[i];
      st = checkChoice(in, c.a, c.b, l, strFormat("planner: lane %zu of ranks %d and %d", i, c.a, c.b));
      if (!st.isOk()) return st;
      live += !l.retired;
    }
    if (live == 0)
      return makeError(Code::kInvalidArgument, "planner: the plan gives ranks %d and %d no lane in service", c.a, c.b);
    PlannedConn pc = c;
    pc.bytesAB = w->second->ab * in.lanes;
    pc.bytesBA = w->second->ba * in.lanes;
    p.index_[pairKey(c.a, c.b)] = p.conns.size();
    p.conns.push_back(std::move(pc));
  }
  p.computeLoad(in);
  *out = std::move(p);
  return Status::ok();
}

double fabricSeconds(const PlanInput& in, const Plan& plan) {
  const bool bg = in.background.size() == plan.load.size();
  double m = 0;
  for (size_t l = 0; l < plan.load.size(); ++l)
    m = std::max(m, (plan.load[l] + (bg ? in.background[l] : 0.0)) * secondsPerByte(in, static_cast<int>(l)));
  return m;
}

namespace {

// The lane's two host ports.
void laneEnds(const PlanInput& in, const PlannedConn& c, const LaneChoice& l, HostPort* ha, HostPort* hb) {
  const RankPlace& ra = in.ranks[static_cast<size_t>(c.a)];
  const RankPlace& rb = in.ranks[static_cast<size_t>(c.b)];
  *ha = HostPort{ra.host, ra.ports[static_cast<size_t>(l.localPort)]};
  *hb = HostPort{rb.host, rb.ports[static_cast<size_t>(l.remotePort)]};
}

}  // namespace

void markLaneLinks(const PlanInput& in, const Plan& plan, int a, int b, int lane, std::vector<char>* marks) {
  const Topology& t = *in.topo;
  marks->resize(static_cast<size_t>(t.numLinks()), 0);
  const PlannedConn* c = plan.find(a, b);
  if (c == nullptr || lane < 0 || lane >= static_cast<int>(c->lanes.size())) return;
  HostPort ha, hb;
  laneEnds(in, *c, c->lanes[static_cast<size_t>(lane)], &ha, &hb);
  std::vector<int> links;
  t.pathLinks(ha, hb, c->lanes[static_cast<size_t>(lane)].path, &links);
  for (int l : links) {
    if (t.link(l).from < 0 || t.link(l).to < 0) continue;  // a host port: not the fabric's
    (*marks)[static_cast<size_t>(l)] = 1;
    (*marks)[static_cast<size_t>(t.link(l).reverse)] = 1;
  }
}

std::string lanePath(const PlanInput& in, const Plan& plan, int a, int b, int lane) {
  const Topology& t = *in.topo;
  const PlannedConn* c = plan.find(a, b);
  if (c == nullptr || lane < 0 || lane >= static_cast<int>(c->lanes.size())) return "?";
  HostPort ha, hb;
  laneEnds(in, *c, c->lanes[static_cast<size_t>(lane)], &ha, &hb);
  std::vector<int> links;
  t.pathLinks(ha, hb, c->lanes[static_cast<size_t>(lane)].path, &links);
  std::string s = t.host(ha.host).name + t.port(ha).name;
  for (int l : links) {
    const Link& k = t.link(l);
    s += " -> " + (k.to >= 0 ? t.sw(k.to).name : t.host(hb.host).name + t.port(hb).name);
  }
  return s;
}

Status replaceLane(const PlanInput& in, Plan* plan, int a, int b, int lane, const std::vector<char>& avoid,
                   bool spareOnly, bool* found, LaneChoice* out) {
  *found = false;
  const Topology& t = *in.topo;
  auto it = plan->index_.find(pairKey(std::min(a, b), std::max(a, b)));
  if (it == plan->index_.end())
    return makeError(Code::kInvalidArgument, "planner: no planned connection between ranks %d and %d", a, b);
  PlannedConn& c = plan->conns[it->second];
  if (lane < 0 || lane >= static_cast<int>(c.lanes.size()))
    return makeError(Code::kInvalidArgument, "planner: lane %d of ranks %d-%d out of range [0, %zu)", lane, c.a, c.b,
                     c.lanes.size());
  c.lanes[static_cast<size_t>(lane)].retired = true;
  plan->computeLoad(in);
  // Candidates as the plan made them, priced with the load as it is now and the new lane's share.
  Solver solver(in);
  solver.load() = plan->load;
  if (in.background.size() == solver.load().size())
    for (size_t l = 0; l < in.background.size(); ++l) solver.load()[l] += in.background[l];
  ConnWork w;
  w.a = c.a;
  w.b = c.b;
  const double live = static_cast<double>(
      1 + std::count_if(c.lanes.begin(), c.lanes.end(), [](const LaneChoice& l) { return !l.retired; }));
  w.ab = c.bytesAB / live;
  w.ba = c.bytesBA / live;
  solver.candidates(w);
  int best = -1;
  std::pair<double, double> bc{0, 0};
  for (size_t i = 0; i < w.cands.size(); ++i) {
    const Candidate& k = w.cands[i];
    bool ok = true;
    for (int dir = 0; dir < 2; ++dir) {
      const double wdir = dir == 0 ? w.ab : w.ba;
      for (int l : dir == 0 ? w.fwd(k) : w.back(k)) {
        if (!avoid.empty() && avoid[static_cast<size_t>(l)]) ok = false;
        const bool fabric = t.link(l).from >= 0 && t.link(l).to >= 0;
        if (spareOnly && fabric && wdir > 0 && plan->load[static_cast<size_t>(l)] > 0) ok = false;
      }
    }
    if (!ok) continue;
    auto cost = solver.cost(w, k);
    if (best < 0 || cost.first < bc.first * (1 - 1e-12) ||
        (cost.first <= bc.first * (1 + 1e-12) && cost.second < bc.second * (1 - 1e-12))) {
      best = static_cast<int>(i);
      bc = cost;
    }
  }
  if (best < 0) return Status::ok();
  const Candidate& k = w.cands[static_cast<size_t>(best)];
  LaneChoice lc;
  lc.localPort = k.pa;
  lc.remotePort = k.pb;
  lc.path = k.path;
  HostPort ha{in.ranks[static_cast<size_t>(c.a)].host,
              in.ranks[static_cast<size_t>(c.a)].ports[static_cast<size_t>(k.pa)]};
  HostPort hb{in.ranks[static_cast<size_t>(c.b)].host,
              in.ranks[static_cast<size_t>(c.b)].ports[static_cast<size_t>(k.pb)]};
  const std::vector<PortRange> ranges = clipRanges(t.steeringRanges(ha, hb, k.path), in.sourcePorts);
  size_t total = 0;
  for (const PortRange& r : ranges) total += static_cast<size_t>(r.hi - r.lo) + 1;
  if (total > 0) {
    // A port of the path's ranges away from those the first plan handed out (the transport tries
    // the rest of the range if it is taken).
    size_t off = (in.portSalt + 7919u * static_cast<uint32_t>(c.lanes.size() + 1) + total / 2) % total;
    for (const PortRange& r : ranges) {
      const size_t n = static_cast<size_t>(r.hi - r.lo) + 1;
      if (off < n) {
        lc.sourcePort = static_cast<uint16_t>(r.lo + off);
        lc.sourceRange = r;
        break;
      }
      off -= n;
    }
  }
  c.lanes.push_back(lc);
  plan->computeLoad(in);
  *found = true;
  *out = lc;
  return Status::ok();
}

Status moveLane(const PlanInput& in, Plan* plan, int a, int b, int lane, const LaneChoice& choice) {
  auto it = plan->index_.find(pairKey(std::min(a, b), std::max(a, b)));
  if (it == plan->index_.end())
    return makeError(Code::kInvalidArgument, "planner: no planned connection between ranks %d and %d", a, b);
  PlannedConn& c = plan->conns[it->second];
  if (lane < 0 || lane >= static_cast<int>(c.lanes.size()) || c.lanes[static_cast<size_t>(lane)].retired)
    return makeError(Code::kInvalidArgument, "planner: lane %d of ranks %d-%d is not in service (%zu lanes)", lane, c.a,
                     c.b, c.lanes.size());
  LaneChoice lc = choice;
  lc.retired = false;
  Status st = checkChoice(in, c.a, c.b, lc, strFormat("planner: the new lane of ranks %d and %d", c.a, c.b));
  if (!st.isOk()) return st;
  c.lanes[static_cast<size_t>(lane)].retired = true;
  c.lanes.push_back(lc);
  plan->computeLoad(in);
  return Status::ok();
}

Status exhaustivePlan(const PlanInput& in, Plan* out, int64_t maxCombos) {
  if (in.topo == nullptr) return makeError(Code::kInvalidArgument, "planner: no topology");
  Solver solver(in);
  std::vector<ConnWork> work;
  Status st = solver.build(&work);
  if (!st.isOk()) return st;
  struct Slot {
    size_t conn;
    int lane;
  };
  std::vector<Slot> slots;
  double combos = 1;
  for (size_t i = 0; i < work.size(); ++i) {
    solver.candidates(work[i]);
    work[i].choice.assign(static_cast<size_t>(in.lanes), 0);
    for (int l = 0; l < in.lanes; ++l) {
      slots.push_back(Slot{i, l});
      combos *= static_cast<double>(work[i].cands.size());
    }
  }
  if (combos > static_cast<double>(maxCombos))
    return makeError(Code::kInvalidArgument, "planner: exhaustive search over %.3g combinations (limit %lld)", combos,
                     static_cast<long long>(maxCombos));
  // Depth-first with bound: the max link reading only grows as lanes are added. Lanes of one
  // connection are interchangeable: choices are kept non-decreasing within a connection.
  double best = INFINITY;
  std::vector<std::vector<int>> bestChoice;
  std::vector<double>& load = solver.load();
  const Topology& t = *in.topo;
  auto curMax = [&](const ConnWork& c, const Candidate& k) {
    double m = 0;
    for (int l : c.fwd(k)) m = std::max(m, load[static_cast<size_t>(l)] * 8.0 / t.link(l).bps);
    for (int l : c.back(k)) m = std::max(m, load[static_cast<size_t>(l)] * 8.0 / t.link(l).bps);
    return m;
  };
  std::function<void(size_t, double)> dfs = [&](size_t s, double sofar) {
    if (sofar >= best * (1 - 1e-12)) return;
    if (s == slots.size()) {
      best = sofar;
      bestChoice.clear();
      for (const ConnWork& c : work) bestChoice.push_back(c.choice);
      return;
    }
    ConnWork& c = work[slots[s].conn];
    const int lane = slots[s].lane;
    const int from = lane > 0 ? c.choice[static_cast<size_t>(lane - 1)] : 0;
    for (int k = from; k < static_cast<int>(c.cands.size()); ++k) {
      const Candidate& cand = c.cands[static_cast<size_t>(k)];
      c.choice[static_cast<size_t>(lane)] = k;
      solver.apply(c, cand, +1);
      dfs(s + 1, std::max(sofar, curMax(c, cand)));
      solver.apply(c, cand, -1);
    }
  };
  // Links no lane of this input crosses keep their background.
  double floor = 0;
  for (size_t l = 0; l < in.background.size() && l < load.size(); ++l)
    floor = std::max(floor, load[l] * 8.0 / t.link(static_cast<int>(l)).bps);
  dfs(0, floor);
  Plan p;
  p.mode = Mode::kC4p;
  for (size_t i = 0; i < work.size(); ++i) {
    PlannedConn c;
    c.a = work[i].a;
    c.b = work[i].b;
    c.bytesAB = work[i].ab * in.lanes;
    c.bytesBA = work[i].ba * in.lanes;
    for (int k : bestChoice.empty() ? work[i].choice : bestChoice[i]) {
      const Candidate& cand = work[i].cands[static_cast<size_t>(k)];
      LaneChoice lc;
      lc.localPort = cand.pa;
      lc.remotePort = cand.pb;
      lc.path = cand.path;
      c.lanes.push_back(lc);
    }
    p.index_[pairKey(c.a, c.b)] = p.conns.size();
    p.conns.push_back(std::move(c));
  }
  p.computeLoad(in);
  *out = std::move(p);
  return Status::ok();
}

}  // namespace c4::plan
