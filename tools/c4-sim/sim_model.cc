#include "sim/sim_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <unordered_map>
#include <utility>

#include "common/status.hpp"

namespace c4::sim {

using sched::StepKind;

namespace {

bool isComm(StepKind k) { return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce; }

Status usage(const std::string& msg) { return Status(Code::kInvalidUsage, msg); }

std::string describe(const SimStep& s) {
  switch (s.kind) {
    case StepKind::kSend:
      return strFormat("send %llu B to %d", static_cast<unsigned long long>(s.bytes), s.peer);
    case StepKind::kRecv:
      return strFormat("recv %llu B from %d", static_cast<unsigned long long>(s.bytes), s.peer);
    case StepKind::kRecvReduce:
      return strFormat("recvReduce %llu B from %d", static_cast<unsigned long long>(s.bytes), s.peer);
    case StepKind::kCopy:
      return strFormat("copy %llu B", static_cast<unsigned long long>(s.bytes));
    case StepKind::kReduce:
      return strFormat("reduce %llu B", static_cast<unsigned long long>(s.bytes));
  }
  return "unknown step";
}

}  // namespace

double LinkEfficiency::at(size_t k) const {
  if (byShares.empty() || k == 0) return 1;
  const double x = std::log2(static_cast<double>(k));
  const size_t i = static_cast<size_t>(x);
  if (i + 1 >= byShares.size()) return byShares.back();
  const double f = x - static_cast<double>(i);
  return std::pow(byShares[i], 1 - f) * std::pow(byShares[i + 1], f);
}

size_t Program::bytesSent() const {
  size_t b = 0;
  for (const SimStep& s : steps)
    if (s.kind == StepKind::kSend) b += s.bytes;
  return b;
}

Program compile(const sched::Schedule& s) {
  Program p;
  p.steps.reserve(s.steps.size());
  size_t nd = 0;
  for (const sched::Step& st : s.steps) nd += st.deps.size();
  p.deps.reserve(nd);
  for (const sched::Step& st : s.steps) {
    SimStep o;
    o.kind = st.kind;
    o.peer = st.peer;
    switch (st.kind) {
      case StepKind::kSend:
        o.bytes = st.src.bytes;
        break;
      case StepKind::kCopy:
        o.bytes = st.dst.bytes;
        o.free = st.src.buf == st.dst.buf && st.src.offset == st.dst.offset;
        break;
      default:
        o.bytes = st.dst.bytes;
        break;
    }
    o.depBegin = static_cast<uint32_t>(p.deps.size());
    p.deps.insert(p.deps.end(), st.deps.begin(), st.deps.end());
    std::sort(p.deps.begin() + o.depBegin, p.deps.end());
    p.deps.erase(std::unique(p.deps.begin() + o.depBegin, p.deps.end()), p.deps.end());
    o.depEnd = static_cast<uint32_t>(p.deps.size());
    p.steps.push_back(o);
  }
  p.deps.shrink_to_fit();
  return p;
}

Status Fabric::build(const plan::Topology& topo, std::vector<int> hostOf, plan::Mode mode, int lanes, uint64_t seed,
                     std::vector<plan::Flow> flows, Fabric* out) {
  Fabric f;
  f.in_.topo = &topo;
  int maxPorts = 0;
  for (size_t r = 0; r < hostOf.size(); ++r) {
    const int h = hostOf[r];
    if (h < 0 || h >= topo.numHosts())
      return makeError(Code::kInvalidArgument, "rank %zu placed on host %d; topology %s has %d hosts", r, h,
                       topo.source().c_str(), topo.numHosts());
    const int np = static_cast<int>(topo.host(h).ports.size());
    if (np == 0)
      return makeError(Code::kInvalidArgument, "host %s of topology %s has no port", topo.host(h).name.c_str(),
                       topo.source().c_str());
    plan::RankPlace p;
    p.host = h;
    for (int q = 0; q < np; ++q) p.ports.push_back(q);
    maxPorts = std::max(maxPorts, np);
    f.in_.ranks.push_back(std::move(p));
  }
  if (lanes < 0) return makeError(Code::kInvalidArgument, "%d lanes per connection", lanes);
  f.in_.lanes = lanes > 0 ? lanes : std::max(2, maxPorts);
  f.in_.mode = mode;
  f.in_.seed = seed;
  f.in_.flows = std::move(flows);
  C4_CHECK(plan::makePlan(f.in_, &f.plan_));
  f.hostOf_ = std::move(hostOf);
  *out = std::move(f);
  return Status::ok();
}

int Fabric::lanes(int src, int dst) const {
  const plan::PlannedConn* c = plan_.find(src, dst);
  return c != nullptr && !c->lanes.empty() ? static_cast<int>(c->lanes.size()) : in_.lanes;
}

void Fabric::laneLinks(int src, int dst, int lane, std::vector<int>* out) const {
  const plan::Topology& t = *in_.topo;
  const int a = std::min(src, dst), b = std::max(src, dst);
  const plan::RankPlace& ra = in_.ranks[static_cast<size_t>(a)];
  const plan::RankPlace& rb = in_.ranks[static_cast<size_t>(b)];
  const plan::PlannedConn* c = plan_.find(a, b);
  plan::HostPort ha, hb;
  int path = 0, back = -1;
  if (c != nullptr && lane >= 0 && lane < static_cast<int>(c->lanes.size())) {
    const plan::LaneChoice& l = c->lanes[static_cast<size_t>(lane)];
    ha = plan::HostPort{ra.host, ra.ports[static_cast<size_t>(l.localPort)]};
    hb = plan::HostPort{rb.host, rb.ports[static_cast<size_t>(l.remotePort)]};
    path = l.path;
    back = l.backPath;
  } else {
    // What the transport does unplanned: lane l on port l mod ports of both ends.
    const size_t pa = static_cast<size_t>(lane) % ra.ports.size();
    ha = plan::HostPort{ra.host, ra.ports[pa]};
    hb = plan::HostPort{rb.host, rb.ports[pa % rb.ports.size()]};
  }
  if (src == a) {
    t.pathLinks(ha, hb, path, out);
  } else if (back >= 0) {
    t.pathLinks(hb, ha, back, out);  // the fabric's hash gave the replies their own path
  } else {
    std::vector<int> fwd;
    t.pathLinks(ha, hb, path, &fwd);
    out->clear();
    for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) out->push_back(t.link(*it).reverse);
  }
}

std::vector<plan::Flow> flowsOf(const std::vector<Program>& programs) {
  std::unordered_map<uint64_t, double> sum;
  for (size_t r = 0; r < programs.size(); ++r)
    for (const SimStep& s : programs[r].steps)
      if (s.kind == StepKind::kSend)
        sum[static_cast<uint64_t>(r) << 32 | static_cast<uint32_t>(s.peer)] += static_cast<double>(s.bytes);
  std::vector<plan::Flow> out;
  out.reserve(sum.size());
  for (const auto& [k, b] : sum)
    out.push_back(plan::Flow{static_cast<int>(k >> 32), static_cast<int>(k & 0xffffffffu), b});
  std::sort(out.begin(), out.end(),
            [](const plan::Flow& x, const plan::Flow& y) { return x.src != y.src ? x.src < y.src : x.dst < y.dst; });
  return out;
}

namespace {

constexpr int kMaxPath = 8;  // links on a path: host up, up to 4 switch links, host down

enum class EvType : uint8_t { kLocalDone, kEligible, kFinish };

struct Event {
  double t;
  uint64_t seq;
  int32_t a, b;
  uint32_t ver;
  EvType type;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// The simulation. Rates are bytes per second; a transfer is one lane's share of one message.
//
// Fair sharing: events at one time are handled together; then the links whose transfers changed
// are re-filled. A link a transfer started on always; one that transfers only left once the
// capacity they freed exceeds CostModel::slack of the link (so that a thousand transfers leaving a
// link one by one do not re-fill it a thousand times). The transfers on those links, the links
// those cross, and so on (the connected set) get their max-min fair rates by progressive filling:
// the link with the least capacity per unfixed transfer fixes its transfers at that share, and so
// on. Only a transfer whose rate changed gets a new finish event. Where the connected set holds
// more than CostModel::exactLimit transfers beyond those on the changed links (all-to-all traffic
// makes every transfer one set), only the transfers on the changed links are re-filled, over the
// capacity the others leave: rates stay feasible, but capacity freed reaches only transfers that
// share a link with the change.
class Engine {
 public:
  Engine(const std::vector<Program>& progs, const Fabric& fab, const CostModel& m)
      : progs_(progs), fab_(fab), m_(m), n_(static_cast<int>(progs.size())) {}

  Status run(SimResult* out, const ProgressFn& progress) {
    C4_CHECK(index());
    initLinks();
    for (int r = 0; r < n_; ++r) {
      Rank& R = ranks_[static_cast<size_t>(r)];
      for (size_t i = 0; i + 1 < R.st.size(); ++i)
        if (R.st[i].pending == 0) depsDone(r, static_cast<int>(i));
    }
    drain();
    C4_CHECK(err_);
    rerate();
    auto lastReport = std::chrono::steady_clock::now();
    size_t nextCheck = 8192;
    while (!events_.empty()) {
      now_ = events_.top().t;
      const double horizon = now_ + now_ * 1e-12 + 1e-15;
      while (!events_.empty() && events_.top().t <= horizon) {
        const Event ev = events_.top();
        events_.pop();
        ++res_.events;
        handle(ev);
        drain();
        C4_CHECK(err_);
      }
      rerate();
      if (progress && res_.events >= nextCheck) {
        nextCheck = res_.events + 8192;
        const auto t = std::chrono::steady_clock::now();
        if (t - lastReport > std::chrono::seconds(1)) {
          lastReport = t;
          progress(static_cast<double>(stepsDone_) / static_cast<double>(std::max<size_t>(1, totalSteps_)));
        }
      }
    }
    if (stepsDone_ < totalSteps_) return usage(deadlockReport());
    finishResult();
    *out = std::move(res_);
    return Status::ok();
  }

 private:
  enum : uint8_t { kDepsDone = 1, kPosted = 2, kDone = 4 };
  enum : char { kLeft = 1, kStarted = 2 };  // isDirty_

  // What the run keeps per step, together (one cache line or two: big runs are memory bound).
  struct StepState {
    uint32_t depBegin = 0;  // range of Rank::dependents: up to the next step's depBegin
    int32_t pending = 0;    // deps not yet complete
    int32_t slot = -1;      // a message step's peer slot (-1: local step)
    uint32_t seq = 0;       // a message step's ordinal among the sends to / receives from its peer
    uint8_t flags = 0;
  };
  struct Rank {
    std::vector<StepState> st;   // per step, and one more (the end of the last one's dependents)
    std::vector<int32_t> peers;  // sorted: the ranks it exchanges messages with (its slots)
    std::vector<uint32_t> commBegin, sendBegin, recvBegin;  // per slot (+1)
    std::vector<int32_t> comm, sends, recvs;                // message steps per slot, in step order
    std::vector<int32_t> backSlot;                          // per slot: this rank's slot at the peer
    std::vector<int32_t> dependents;
    std::vector<uint32_t> nextPost;  // per slot: index into comm of the next step to post
    std::vector<uint32_t> sendsPosted, recvsPosted;
    double localFree = 0;  // when its copies and reductions are done
  };
  struct Channel {
    uint32_t laneBegin = 0, lanes = 0;
    uint32_t nextLane = 0;  // where the next message's first piece goes
    double alpha = 0;
  };
  struct Lane {
    uint32_t pathBegin = 0;
    uint32_t pathLen = 0;
    int32_t busy = -1;             // the transfer on the wire
    int32_t head = -1, tail = -1;  // eligible transfers waiting behind it
  };
  struct Message {
    int32_t a, si, b, ri;
    int32_t parts;
  };
  struct Transfer {
    int32_t msg = -1, lane = -1;
    double bytes = 0, remaining = 0, rate = 0, last = 0, newRate = 0;
    uint32_t version = 0;
    uint32_t mark = 0, frozen = 0;  // rerate epochs
    int32_t next = -1;
    int32_t nlinks = 0;
    int32_t links[kMaxPath];
    int32_t pos[kMaxPath];  // index in each link's active list
  };

  // ---- setup ----

  Status index() {
    if (fab_.nranks() != n_)
      return makeError(Code::kInvalidArgument, "simulate: %d programs for a fabric of %d ranks", n_, fab_.nranks());
    ranks_.resize(static_cast<size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const Program& p = progs_[static_cast<size_t>(r)];
      Rank& R = ranks_[static_cast<size_t>(r)];
      const size_t ns = p.steps.size();
      totalSteps_ += ns;
      for (size_t i = 0; i < ns; ++i) {
        const SimStep& s = p.steps[i];
        if (s.depEnd < s.depBegin || s.depEnd > p.deps.size())
          return usage(strFormat("rank %d step %zu (%s): dep range out of bounds", r, i, describe(s).c_str()));
        for (uint32_t d = s.depBegin; d < s.depEnd; ++d)
          if (p.deps[d] < 0 || static_cast<size_t>(p.deps[d]) >= i)
            return usage(strFormat("rank %d step %zu (%s): dep %d is not a lower step index", r, i, describe(s).c_str(),
                                   p.deps[d]));
        if (isComm(s.kind)) {
          if (s.peer < 0 || s.peer >= n_ || s.peer == r)
            return usage(strFormat("rank %d step %zu (%s): peer %d invalid for %d ranks", r, i, describe(s).c_str(),
                                   s.peer, n_));
          R.peers.push_back(s.peer);
        }
      }
      std::sort(R.peers.begin(), R.peers.end());
      R.peers.erase(std::unique(R.peers.begin(), R.peers.end()), R.peers.end());
      const size_t np = R.peers.size();
      R.st.assign(ns + 1, StepState());
      R.commBegin.assign(np + 1, 0);
      R.sendBegin.assign(np + 1, 0);
      R.recvBegin.assign(np + 1, 0);
      for (size_t i = 0; i < ns; ++i) {
        const SimStep& s = p.steps[i];
        if (!isComm(s.kind)) continue;
        const int sl = static_cast<int>(std::lower_bound(R.peers.begin(), R.peers.end(), s.peer) - R.peers.begin());
        R.st[i].slot = sl;
        ++R.commBegin[static_cast<size_t>(sl) + 1];
        ++(s.kind == StepKind::kSend ? R.sendBegin : R.recvBegin)[static_cast<size_t>(sl) + 1];
      }
      for (size_t k = 0; k < np; ++k) {
        R.commBegin[k + 1] += R.commBegin[k];
        R.sendBegin[k + 1] += R.sendBegin[k];
        R.recvBegin[k + 1] += R.recvBegin[k];
      }
      R.comm.resize(R.commBegin[np]);
      R.sends.resize(R.sendBegin[np]);
      R.recvs.resize(R.recvBegin[np]);
      std::vector<uint32_t> fc(R.commBegin.begin(), R.commBegin.end() - 1);
      std::vector<uint32_t> fs(R.sendBegin.begin(), R.sendBegin.end() - 1);
      std::vector<uint32_t> fr(R.recvBegin.begin(), R.recvBegin.end() - 1);
      for (size_t i = 0; i < ns; ++i) {
        const int sl = R.st[i].slot;
        if (sl < 0) continue;
        const size_t k = static_cast<size_t>(sl);
        R.comm[fc[k]++] = static_cast<int32_t>(i);
        if (p.steps[i].kind == StepKind::kSend) {
          R.st[i].seq = fs[k] - R.sendBegin[k];
          R.sends[fs[k]++] = static_cast<int32_t>(i);
        } else {
          R.st[i].seq = fr[k] - R.recvBegin[k];
          R.recvs[fr[k]++] = static_cast<int32_t>(i);
        }
      }
      // Dependents (reverse edges) and pending counts.
      for (size_t i = 0; i < ns; ++i) {
        const SimStep& s = p.steps[i];
        R.st[i].pending = static_cast<int32_t>(s.depEnd - s.depBegin);
        for (uint32_t d = s.depBegin; d < s.depEnd; ++d) ++R.st[static_cast<size_t>(p.deps[d]) + 1].depBegin;
      }
      for (size_t i = 0; i < ns; ++i) R.st[i + 1].depBegin += R.st[i].depBegin;
      R.dependents.resize(R.st[ns].depBegin);
      std::vector<uint32_t> fd(ns);
      for (size_t i = 0; i < ns; ++i) fd[i] = R.st[i].depBegin;
      for (size_t i = 0; i < ns; ++i) {
        const SimStep& s = p.steps[i];
        for (uint32_t d = s.depBegin; d < s.depEnd; ++d)
          R.dependents[fd[static_cast<size_t>(p.deps[d])]++] = static_cast<int32_t>(i);
      }
      R.nextPost.assign(R.commBegin.begin(), R.commBegin.end() - 1);
      R.sendsPosted.assign(np, 0);
      R.recvsPosted.assign(np, 0);
    }
    // Every send from a to b needs a receive at b from a, in equal numbers.
    for (int r = 0; r < n_; ++r) {
      Rank& R = ranks_[static_cast<size_t>(r)];
      R.backSlot.assign(R.peers.size(), -1);
      for (size_t k = 0; k < R.peers.size(); ++k) {
        const int p = R.peers[k];
        const Rank& P = ranks_[static_cast<size_t>(p)];
        auto it = std::lower_bound(P.peers.begin(), P.peers.end(), r);
        const int back = it != P.peers.end() && *it == r ? static_cast<int>(it - P.peers.begin()) : -1;
        const uint32_t mySends = R.sendBegin[k + 1] - R.sendBegin[k];
        const uint32_t myRecvs = R.recvBegin[k + 1] - R.recvBegin[k];
        const uint32_t theirRecvs = back < 0 ? 0 : P.recvBegin[static_cast<size_t>(back) + 1] - P.recvBegin[back];
        const uint32_t theirSends = back < 0 ? 0 : P.sendBegin[static_cast<size_t>(back) + 1] - P.sendBegin[back];
        if (mySends != theirRecvs)
          return usage(
              strFormat("unmatched messages: rank %d posts %u sends to rank %d, rank %d posts %u receives "
                        "from rank %d",
                        r, mySends, p, p, theirRecvs, r));
        if (myRecvs != theirSends)
          return usage(
              strFormat("unmatched messages: rank %d posts %u sends to rank %d, rank %d posts %u receives "
                        "from rank %d",
                        p, theirSends, r, r, myRecvs, p));
        R.backSlot[k] = back;
      }
    }
    return Status::ok();
  }

  void initLinks() {
    const plan::Topology& t = fab_.topo();
    numTopoLinks_ = t.numLinks();
    const size_t nl = static_cast<size_t>(numTopoLinks_) + 2 * static_cast<size_t>(n_);
    cap_.resize(nl);
    for (int l = 0; l < numTopoLinks_; ++l) cap_[static_cast<size_t>(l)] = t.link(l).bps / 8;
    for (size_t l = static_cast<size_t>(numTopoLinks_); l < nl; ++l) cap_[l] = m_.intraBytesPerSec;
    // Each topology link's efficiency curve: the entry for its rate, else the default one.
    eff_.assign(nl, nullptr);
    for (int l = 0; l < numTopoLinks_; ++l) {
      const double bps = t.link(l).bps;
      for (const LinkEfficiency& e : m_.efficiency) {
        if (e.bps > 0 && std::fabs(e.bps - bps) <= 0.01 * e.bps) {
          eff_[static_cast<size_t>(l)] = &e;
          break;
        }
        if (e.bps == 0 && eff_[static_cast<size_t>(l)] == nullptr) eff_[static_cast<size_t>(l)] = &e;
      }
    }
    flows_.assign(nl, {});
    used_.assign(nl, 0);
    rem_.assign(nl, 0);
    cnt_.assign(nl, 0);
    linkMark_.assign(nl, 0);
    local_.assign(nl, 0);
    isDirty_.assign(nl, 0);
    res_.linkBytes.assign(static_cast<size_t>(numTopoLinks_), 0);
  }

  // ---- steps ----

  void complete(int r, int i) {
    Rank& R = ranks_[static_cast<size_t>(r)];
    R.st[static_cast<size_t>(i)].flags |= kDone;
    ++stepsDone_;
    lastDone_ = std::max(lastDone_, now_);
    const uint32_t end = R.st[static_cast<size_t>(i) + 1].depBegin;
    for (uint32_t k = R.st[static_cast<size_t>(i)].depBegin; k < end; ++k) {
      const int j = R.dependents[k];
      if (--R.st[static_cast<size_t>(j)].pending == 0) depsDone(r, j);
    }
  }

  void drain() {
    while (!done_.empty() && err_.isOk()) {
      const std::pair<int, int> d = done_.back();
      done_.pop_back();
      complete(d.first, d.second);
    }
  }

  void depsDone(int r, int i) {
    Rank& R = ranks_[static_cast<size_t>(r)];
    R.st[static_cast<size_t>(i)].flags |= kDepsDone;
    const SimStep& s = progs_[static_cast<size_t>(r)].steps[static_cast<size_t>(i)];
    if (!isComm(s.kind)) {
      runLocal(r, i, s);
      return;
    }
    const int sl = R.st[static_cast<size_t>(i)].slot;
    const uint32_t np = R.nextPost[static_cast<size_t>(sl)];
    if (np < R.commBegin[static_cast<size_t>(sl) + 1] && R.comm[np] == i) postFrom(r, sl);
  }

  void runLocal(int r, int i, const SimStep& s) {
    const double cost = s.free ? 0.0 : static_cast<double>(s.bytes) / m_.memBytesPerSec;
    if (cost <= 0) {
      done_.emplace_back(r, i);
      return;
    }
    Rank& R = ranks_[static_cast<size_t>(r)];
    R.localFree = std::max(R.localFree, now_) + cost;
    push(R.localFree, EvType::kLocalDone, r, i, 0);
  }

  // Posts the slot's message steps in order while their deps are complete.
  void postFrom(int r, int sl) {
    Rank& R = ranks_[static_cast<size_t>(r)];
    const size_t k = static_cast<size_t>(sl);
    while (R.nextPost[k] < R.commBegin[k + 1] && err_.isOk()) {
      const int j = R.comm[R.nextPost[k]];
      if (!(R.st[static_cast<size_t>(j)].flags & kDepsDone)) break;
      ++R.nextPost[k];
      post(r, j);
    }
  }

  void post(int r, int j) {
    Rank& R = ranks_[static_cast<size_t>(r)];
    StepState& S = R.st[static_cast<size_t>(j)];
    S.flags |= kPosted;
    const SimStep& s = progs_[static_cast<size_t>(r)].steps[static_cast<size_t>(j)];
    const size_t sl = static_cast<size_t>(S.slot);
    const size_t bs = static_cast<size_t>(R.backSlot[sl]);
    const uint32_t q = S.seq;
    const Rank& P = ranks_[static_cast<size_t>(s.peer)];
    if (s.kind == StepKind::kSend) {
      ++R.sendsPosted[sl];
      if (P.recvsPosted[bs] > q) match(r, j, s.peer, P.recvs[P.recvBegin[bs] + q]);
    } else {
      ++R.recvsPosted[sl];
      if (P.sendsPosted[bs] > q) match(s.peer, P.sends[P.sendBegin[bs] + q], r, j);
    }
  }

  // ---- messages ----

  uint32_t channel(int a, int b) {
    const uint64_t key = static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b);
    auto it = chanIndex_.find(key);
    if (it != chanIndex_.end()) return it->second;
    Channel c;
    c.laneBegin = static_cast<uint32_t>(lanes_.size());
    if (fab_.hostOf(a) == fab_.hostOf(b)) {
      c.lanes = 1;
      c.alpha = m_.alphaIntra;
      Lane l;
      l.pathBegin = static_cast<uint32_t>(pathPool_.size());
      l.pathLen = 2;
      pathPool_.push_back(numTopoLinks_ + 2 * a);      // a's intra-host egress
      pathPool_.push_back(numTopoLinks_ + 2 * b + 1);  // b's intra-host ingress
      lanes_.push_back(l);
    } else {
      c.lanes = static_cast<uint32_t>(std::max(1, fab_.lanes(a, b)));
      c.alpha = m_.alpha;
      for (uint32_t k = 0; k < c.lanes; ++k) {
        fab_.laneLinks(a, b, static_cast<int>(k), &path_);
        if (path_.empty() || path_.size() > static_cast<size_t>(kMaxPath)) {
          err_ =
              makeError(Code::kInvalidArgument, "lane %u from rank %d to rank %d crosses %zu links (1..%d supported)",
                        k, a, b, path_.size(), kMaxPath);
          path_.assign(1, 0);
        }
        Lane l;
        l.pathBegin = static_cast<uint32_t>(pathPool_.size());
        l.pathLen = static_cast<uint32_t>(path_.size());
        pathPool_.insert(pathPool_.end(), path_.begin(), path_.end());
        lanes_.push_back(l);
      }
    }
    const uint32_t id = static_cast<uint32_t>(chans_.size());
    chans_.push_back(c);
    chanIndex_.emplace(key, id);
    return id;
  }

  void match(int a, int si, int b, int ri) {
    const SimStep& ss = progs_[static_cast<size_t>(a)].steps[static_cast<size_t>(si)];
    const SimStep& rs = progs_[static_cast<size_t>(b)].steps[static_cast<size_t>(ri)];
    if (ss.bytes != rs.bytes) {
      err_ = usage(strFormat("size mismatch: rank %d step %d (%s) matches rank %d step %d (%s)", a, si,
                             describe(ss).c_str(), b, ri, describe(rs).c_str()));
      return;
    }
    ++res_.messages;
    const uint64_t bytes = ss.bytes;
    const uint32_t ci = channel(a, b);
    if (!err_.isOk()) return;
    Channel& c = chans_[ci];
    (fab_.hostOf(a) == fab_.hostOf(b) ? res_.intraBytes : res_.interBytes) += static_cast<double>(bytes);
    int32_t mi;
    if (!freeMsgs_.empty()) {
      mi = freeMsgs_.back();
      freeMsgs_.pop_back();
    } else {
      mi = static_cast<int32_t>(msgs_.size());
      msgs_.emplace_back();
    }
    msgs_[static_cast<size_t>(mi)] = Message{a, si, b, ri, 0};
    // Each lane's share: pieces dealt round-robin from c.nextLane, or equal shares.
    const uint32_t nl = c.lanes;
    shares_.assign(nl, 0);
    if (nl == 1) {
      shares_[0] = bytes;
    } else if (m_.pieceBytes == 0) {
      for (uint32_t k = 0; k < nl; ++k) shares_[k] = bytes / nl + (k < bytes % nl ? 1 : 0);
    } else {
      const uint64_t pb = m_.pieceBytes;
      const uint64_t pieces = bytes == 0 ? 1 : (bytes - 1) / pb + 1;
      const uint64_t lastSize = bytes - (pieces - 1) * pb;
      const uint32_t lastLane = static_cast<uint32_t>((c.nextLane + pieces - 1) % nl);
      for (uint32_t k = 0; k < nl; ++k) {
        const uint64_t off = (k + nl - c.nextLane) % nl;  // k's turn in this message's deal
        const uint64_t count = pieces / nl + (off < pieces % nl ? 1 : 0);
        shares_[k] = count * pb - (k == lastLane ? pb - lastSize : 0);
      }
      c.nextLane = static_cast<uint32_t>((c.nextLane + pieces) % nl);
    }
    if (bytes == 0) shares_[0] = 0;
    const double alpha = c.alpha;
    const uint32_t laneBegin = c.laneBegin;
    for (uint32_t k = 0; k < nl; ++k) {
      if (shares_[k] == 0 && !(bytes == 0 && k == 0)) continue;
      const int32_t x = allocTransfer();
      Transfer& T = xfers_[static_cast<size_t>(x)];
      T.msg = mi;
      T.lane = static_cast<int32_t>(laneBegin + k);
      T.bytes = static_cast<double>(shares_[k]);
      ++msgs_[static_cast<size_t>(mi)].parts;
      ++res_.transfers;
      if (alpha > 0)
        push(now_ + alpha, EvType::kEligible, x, 0, 0);
      else
        eligible(x);
    }
  }

  int32_t allocTransfer() {
    int32_t x;
    if (!freeXfers_.empty()) {
      x = freeXfers_.back();
      freeXfers_.pop_back();
    } else {
      x = static_cast<int32_t>(xfers_.size());
      xfers_.emplace_back();
    }
    Transfer& T = xfers_[static_cast<size_t>(x)];
    ++T.version;  // events of the slot's earlier transfer go stale
    T.next = -1;
    T.rate = 0;
    T.nlinks = 0;
    return x;
  }

  void eligible(int32_t x) {
    Lane& L = lanes_[static_cast<size_t>(xfers_[static_cast<size_t>(x)].lane)];
    if (L.busy < 0) {
      start(x);
      return;
    }
    if (L.tail >= 0)
      xfers_[static_cast<size_t>(L.tail)].next = x;
    else
      L.head = x;
    L.tail = x;
  }

  void start(int32_t x) {
    Transfer& T = xfers_[static_cast<size_t>(x)];
    Lane& L = lanes_[static_cast<size_t>(T.lane)];
    L.busy = x;
    T.remaining = T.bytes;
    T.rate = 0;
    T.last = now_;
    T.nlinks = static_cast<int32_t>(L.pathLen);
    for (int k = 0; k < T.nlinks; ++k) {
      const int l = pathPool_[L.pathBegin + static_cast<uint32_t>(k)];
      T.links[k] = l;
      T.pos[k] = static_cast<int32_t>(flows_[static_cast<size_t>(l)].size());
      flows_[static_cast<size_t>(l)].push_back(x);
      if (l < numTopoLinks_) res_.linkBytes[static_cast<size_t>(l)] += T.bytes;
      dirty(l, true);
    }
  }

  void finish(int32_t x) {
    Transfer& T = xfers_[static_cast<size_t>(x)];
    for (int k = 0; k < T.nlinks; ++k) {
      const int l = T.links[k];
      auto& fl = flows_[static_cast<size_t>(l)];
      const int32_t moved = fl.back();
      fl[static_cast<size_t>(T.pos[k])] = moved;
      if (moved != x) {
        Transfer& M = xfers_[static_cast<size_t>(moved)];
        for (int q = 0; q < M.nlinks; ++q)
          if (M.links[q] == l) M.pos[q] = T.pos[k];
      }
      fl.pop_back();
      used_[static_cast<size_t>(l)] -= T.rate;
      dirty(l, false);
    }
    T.nlinks = 0;
    T.rate = 0;
    ++T.version;
    Lane& L = lanes_[static_cast<size_t>(T.lane)];
    L.busy = -1;
    if (L.head >= 0) {
      const int32_t y = L.head;
      L.head = xfers_[static_cast<size_t>(y)].next;
      if (L.head < 0) L.tail = -1;
      start(y);
    }
    Message& M = msgs_[static_cast<size_t>(xfers_[static_cast<size_t>(x)].msg)];
    if (--M.parts == 0) {
      done_.emplace_back(M.a, M.si);
      done_.emplace_back(M.b, M.ri);
      freeMsgs_.push_back(xfers_[static_cast<size_t>(x)].msg);
    }
    freeXfers_.push_back(x);
  }

  // ---- events and rates ----

  void push(double t, EvType type, int32_t a, int32_t b, uint32_t ver) {
    events_.push(Event{t, seq_++, a, b, ver, type});
  }

  void handle(const Event& ev) {
    switch (ev.type) {
      case EvType::kLocalDone:
        done_.emplace_back(ev.a, ev.b);
        break;
      case EvType::kEligible:
        eligible(ev.a);
        break;
      case EvType::kFinish:
        if (xfers_[static_cast<size_t>(ev.a)].version == ev.ver && xfers_[static_cast<size_t>(ev.a)].nlinks > 0)
          finish(ev.a);
        break;
    }
  }

  // What a link gives its transfers together now: its rate at the efficiency of its share count.
  double capNow(size_t l) const {
    const LinkEfficiency* e = eff_[l];
    return e == nullptr ? cap_[l] : cap_[l] * e->at(flows_[l].size());
  }

  // A link whose transfers change: a transfer started on it (its rate must be set) or left it.
  void dirty(int l, bool started) {
    char& d = isDirty_[static_cast<size_t>(l)];
    if (d == 0) dirty_.push_back(l);
    if (started)
      d = kStarted;
    else if (d == 0)
      d = kLeft;
  }

  void rerate() {
    // The links to re-fill: every one a transfer started on; one that transfers only left once
    // their capacity is worth handing out (CostModel::slack).
    active_.clear();
    size_t direct = 0;
    for (int l : dirty_) {
      const size_t li = static_cast<size_t>(l);
      const char d = isDirty_[li];
      isDirty_[li] = 0;
      if (flows_[li].empty()) {
        used_[li] = 0;
        continue;
      }
      if (d == kLeft && capNow(li) - used_[li] <= m_.slack * capNow(li)) continue;
      active_.push_back(l);
      direct += flows_[li].size();
    }
    dirty_.clear();
    if (active_.empty()) return;
    // The set starts with the active links; takeTransfersOn(l) adds l's transfers not in it yet and
    // the links they cross.
    auto startSet = [&] {
      ++epoch_;
      setLinks_.clear();
      setFlows_.clear();
      for (int l : active_) {
        linkMark_[static_cast<size_t>(l)] = epoch_;
        setLinks_.push_back(l);
      }
    };
    auto takeTransfersOn = [&](int l0) {
      for (int32_t x : flows_[static_cast<size_t>(l0)]) {
        Transfer& T = xfers_[static_cast<size_t>(x)];
        if (T.mark == epoch_) continue;
        T.mark = epoch_;
        setFlows_.push_back(x);
        for (int k = 0; k < T.nlinks; ++k) {
          const int l = T.links[k];
          if (linkMark_[static_cast<size_t>(l)] == epoch_) continue;
          linkMark_[static_cast<size_t>(l)] = epoch_;
          setLinks_.push_back(l);
        }
      }
    };
    startSet();
    // The connected set, unless it grows past exactLimit transfers beyond those on the links.
    const size_t limit = m_.exactLimit == 0 ? SIZE_MAX : m_.exactLimit + direct;
    bool exact = true;
    for (size_t i = 0; i < setLinks_.size() && exact; ++i) {
      takeTransfersOn(setLinks_[i]);
      if (setFlows_.size() > limit) exact = false;
    }
    if (!exact) {
      // Only the transfers on the links, over what the others leave.
      startSet();
      for (int l0 : active_) takeTransfersOn(l0);
      for (int l : setLinks_) {
        rem_[static_cast<size_t>(l)] = capNow(static_cast<size_t>(l)) - used_[static_cast<size_t>(l)];
        cnt_[static_cast<size_t>(l)] = 0;
      }
      for (int32_t x : setFlows_) {
        const Transfer& T = xfers_[static_cast<size_t>(x)];
        for (int k = 0; k < T.nlinks; ++k) {
          rem_[static_cast<size_t>(T.links[k])] += T.rate;
          ++cnt_[static_cast<size_t>(T.links[k])];
        }
      }
    } else {
      for (int l : setLinks_) {
        rem_[static_cast<size_t>(l)] = capNow(static_cast<size_t>(l));
        cnt_[static_cast<size_t>(l)] = static_cast<int32_t>(flows_[static_cast<size_t>(l)].size());
      }
    }
    ++res_.refills;
    if (!exact) ++res_.boundedRefills;
    res_.refilledTransfers += setFlows_.size();
    fill();
    // New rates, new finish events where a rate changed.
    if (exact)
      for (int l : setLinks_) used_[static_cast<size_t>(l)] = 0;
    for (int32_t x : setFlows_) {
      Transfer& T = xfers_[static_cast<size_t>(x)];
      const double nr = std::max(T.newRate, 1e-9);
      if (T.rate > 0) T.remaining = std::max(0.0, T.remaining - T.rate * (now_ - T.last));
      T.last = now_;
      const bool changed = T.rate <= 0 || std::fabs(nr - T.rate) > 1e-12 * T.rate;
      for (int k = 0; k < T.nlinks; ++k)
        used_[static_cast<size_t>(T.links[k])] += exact ? (changed ? nr : T.rate) : (changed ? nr - T.rate : 0.0);
      if (!changed) continue;
      T.rate = nr;
      ++T.version;
      ++res_.rerates;
      push(now_ + T.remaining / nr, EvType::kFinish, x, 0, T.version);
    }
  }

  // Progressive filling over setFlows_ / setLinks_ with rem_ and cnt_ set: each transfer's newRate.
  void fill() {
    // Each set link's set transfers (a link's own list also holds transfers a bounded fill leaves).
    const size_t nl = setLinks_.size();
    for (size_t i = 0; i < nl; ++i) local_[static_cast<size_t>(setLinks_[i])] = static_cast<int32_t>(i);
    setBegin_.assign(nl + 1, 0);
    for (int32_t x : setFlows_) {
      const Transfer& T = xfers_[static_cast<size_t>(x)];
      for (int k = 0; k < T.nlinks; ++k) ++setBegin_[static_cast<size_t>(local_[static_cast<size_t>(T.links[k])]) + 1];
    }
    for (size_t i = 0; i < nl; ++i) setBegin_[i + 1] += setBegin_[i];
    setOn_.resize(setBegin_[nl]);
    fillPos_.assign(setBegin_.begin(), setBegin_.end() - 1);
    for (int32_t x : setFlows_) {
      const Transfer& T = xfers_[static_cast<size_t>(x)];
      for (int k = 0; k < T.nlinks; ++k)
        setOn_[fillPos_[static_cast<size_t>(local_[static_cast<size_t>(T.links[k])])]++] = x;
    }
    heap_.clear();
    for (int l : setLinks_) {
      const size_t li = static_cast<size_t>(l);
      if (cnt_[li] > 0) heap_.emplace_back(std::max(rem_[li], 0.0) / cnt_[li], l);
    }
    auto cmp = [](const std::pair<double, int>& x, const std::pair<double, int>& y) { return x.first > y.first; };
    std::make_heap(heap_.begin(), heap_.end(), cmp);
    const uint32_t ep = epoch_;
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), cmp);
      const auto [share, l] = heap_.back();
      heap_.pop_back();
      const size_t li = static_cast<size_t>(l);
      if (cnt_[li] == 0) continue;
      const double cur = std::max(rem_[li], 0.0) / cnt_[li];
      if (cur > share) {  // stale: transfers fixed elsewhere left it a larger share
        heap_.emplace_back(cur, l);
        std::push_heap(heap_.begin(), heap_.end(), cmp);
        continue;
      }
      const size_t loc = static_cast<size_t>(local_[li]);
      for (uint32_t q = setBegin_[loc]; q < setBegin_[loc + 1]; ++q) {
        Transfer& T = xfers_[static_cast<size_t>(setOn_[q])];
        if (T.frozen == ep) continue;
        T.frozen = ep;
        T.newRate = cur;
        for (int k = 0; k < T.nlinks; ++k) {
          const size_t lk = static_cast<size_t>(T.links[k]);
          rem_[lk] -= cur;
          --cnt_[lk];
        }
      }
    }
  }

  // ---- results ----

  void finishResult() {
    res_.seconds = lastDone_;
    res_.steps = totalSteps_;
    const plan::Topology& t = fab_.topo();
    for (int l = 0; l < numTopoLinks_; ++l) {
      const double b = res_.linkBytes[static_cast<size_t>(l)];
      if (b <= 0) continue;
      const double u = res_.seconds > 0 ? b / (t.link(l).bps / 8 * res_.seconds) : 0;
      if (res_.busiestLink < 0 || u > res_.busiestUtil) {
        res_.busiestLink = l;
        res_.busiestUtil = u;
      }
    }
  }

  std::string deadlockReport() const {
    std::string msg = strFormat("deadlock: no step can make progress, %zu of %zu steps unfinished",
                                totalSteps_ - stepsDone_, totalSteps_);
    int shown = 0;
    for (int r = 0; r < n_ && shown < 4; ++r) {
      const Rank& R = ranks_[static_cast<size_t>(r)];
      const auto& steps = progs_[static_cast<size_t>(r)].steps;
      size_t i = 0;
      while (i < steps.size() && (R.st[i].flags & kDone)) ++i;
      if (i == steps.size()) continue;
      const SimStep& s = steps[i];
      msg += strFormat("; rank %d step %zu (%s)", r, i, describe(s).c_str());
      if (R.st[i].flags & kPosted) {
        msg += strFormat(" is posted and waits for rank %d's matching %s", s.peer,
                         s.kind == StepKind::kSend ? "receive" : "send");
      } else if (!(R.st[i].flags & kDepsDone)) {
        msg += " waits for unfinished deps";
      } else {
        msg += strFormat(" waits behind an earlier unposted message to rank %d", s.peer);
      }
      ++shown;
    }
    return msg;
  }

  const std::vector<Program>& progs_;
  const Fabric& fab_;
  const CostModel m_;
  const int n_;
  std::vector<Rank> ranks_;
  size_t totalSteps_ = 0, stepsDone_ = 0;
  double now_ = 0, lastDone_ = 0;
  Status err_;
  SimResult res_;
  std::vector<std::pair<int, int>> done_;  // steps completing now
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  // Connections and lanes.
  std::unordered_map<uint64_t, uint32_t> chanIndex_;
  std::vector<Channel> chans_;
  std::vector<Lane> lanes_;
  std::vector<int32_t> pathPool_;
  std::vector<int> path_;
  std::vector<uint64_t> shares_;
  std::vector<Message> msgs_;
  std::vector<int32_t> freeMsgs_;
  std::vector<Transfer> xfers_;
  std::vector<int32_t> freeXfers_;
  // Links: the topology's, then each rank's intra-host egress and ingress.
  int numTopoLinks_ = 0;
  std::vector<double> cap_, used_, rem_;
  std::vector<const LinkEfficiency*> eff_;  // per link; null: nominal rate
  std::vector<int32_t> cnt_;
  std::vector<std::vector<int32_t>> flows_;  // active transfers per link
  std::vector<uint32_t> linkMark_;
  std::vector<char> isDirty_;
  std::vector<int> dirty_, active_;
  uint32_t epoch_ = 0;
  std::vector<int> setLinks_;
  std::vector<int32_t> setFlows_;
  std::vector<std::pair<double, int>> heap_;
  std::vector<int32_t> local_;  // per link: its index in setLinks_ (valid for set links)
  std::vector<uint32_t> setBegin_, fillPos_;
  std::vector<int32_t> setOn_;  // set transfers by set link
};

}  // namespace

Status simulate(const std::vector<Program>& programs, const Fabric& fabric, const CostModel& model, SimResult* out,
                const ProgressFn& progress) {
  if (model.alpha < 0 || model.alphaIntra < 0 || !(model.intraBytesPerSec > 0) || !(model.memBytesPerSec > 0))
    return makeError(Code::kInvalidArgument,
                     "simulate: latencies must be >= 0 and bandwidths > 0 (alpha %g, alphaIntra %g, intra %g B/s, "
                     "memory %g B/s)",
                     model.alpha, model.alphaIntra, model.intraBytesPerSec, model.memBytesPerSec);
  Engine e(programs, fabric, model);
  return e.run(out, progress);
}

}  // namespace c4::sim
