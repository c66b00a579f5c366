#include "core/diagnose.hpp"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "common/status.hpp"

namespace c4 {

namespace {

std::string hostOf(const std::vector<RankView>& ranks, int r) {
  return r >= 0 && static_cast<size_t>(r) < ranks.size() && !ranks[static_cast<size_t>(r)].host.empty()
             ? ranks[static_cast<size_t>(r)].host
             : "?";
}

std::string rankName(const std::vector<RankView>& ranks, int r) {
  if (r < 0 || static_cast<size_t>(r) >= ranks.size()) return strFormat("rank %d", r);
  const RankView& v = ranks[static_cast<size_t>(r)];
  return strFormat("rank %d (host %s, pid %d)", r, v.host.empty() ? "?" : v.host.c_str(), v.pid);
}

std::string listRanks(const std::vector<int>& rs) {
  std::string s;
  for (size_t i = 0; i < rs.size(); ++i) s += (i ? (i + 1 == rs.size() ? " and " : ", ") : "") + std::to_string(rs[i]);
  return s;
}

void addCulprit(Diagnosis* d, const std::vector<RankView>& ranks, int r) {
  if (std::find(d->ranks.begin(), d->ranks.end(), r) != d->ranks.end()) return;
  d->ranks.push_back(r);
  const std::string h = hostOf(ranks, r);
  if (std::find(d->hosts.begin(), d->hosts.end(), h) == d->hosts.end()) d->hosts.push_back(h);
}

double seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

// Where rank v stands, in words, for the evidence.
std::string standing(const RankView& v, int64_t seq) {
  if (v.gone) return "gone (" + v.goneWhy + ")";
  if (v.leftInOrder) return "left the communicator";
  if (!v.known) return "no heartbeat yet";
  std::string s;
  if (v.entered > v.left)
    s = strFormat("in collective seq %llu for %.1f s", static_cast<unsigned long long>(v.entered - 1),
                  seconds(v.enteredAgoMs));
  else if (v.inP2p)
    s = "in a send/receive batch";
  else if (!v.inside.empty())
    s = "inside c4comm in " + v.inside;
  else if (v.left > 0)
    s = strFormat("idle since it left collective seq %llu %.1f s ago", static_cast<unsigned long long>(v.left - 1),
                  seconds(v.leftAgoMs));
  else
    s = "has not entered any collective";
  if (seq >= 0 && v.entered > static_cast<uint64_t>(seq) + 1 && v.entered > v.left) s += " (ahead: it left this one)";
  if (v.stalledMs > 0) {
    s += strFormat(", stalled %.1f s", seconds(v.stalledMs));
    if (!v.waitingOn.empty())
      s += " waiting on rank" + std::string(v.waitingOn.size() > 1 ? "s " : " ") + listRanks(v.waitingOn);
  }
  if (v.unresponsive) s += strFormat(", heartbeat silent for %.1f s", seconds(v.silentMs));
  return s;
}

}  // namespace

Diagnosis classifyFailure(int self, const std::string& error, const std::vector<RankView>& ranks) {
  Diagnosis d;
  std::vector<int> gone;
  for (const RankView& v : ranks)
    if (v.rank != self && v.gone && v.failed.empty()) gone.push_back(v.rank);
  if (gone.empty()) return d;
  d.kind = "dead_rank";
  for (int r : gone) addCulprit(&d, ranks, r);
  d.confidence = 0.95;
  std::string who;
  for (int r : gone)
    who += (who.empty() ? "" : "; ") + rankName(ranks, r) + ": " + ranks[static_cast<size_t>(r)].goneWhy;
  d.summary = strFormat("rank%s %s died (process gone)", gone.size() > 1 ? "s" : "", listRanks(gone).c_str());
  d.evidence = who + "; the data path reported: " + error;
  return d;
}

Diagnosis classifyHang(const HangInput& in) {
  Diagnosis d;
  d.seq = in.seq;
  const std::vector<RankView>& R = in.ranks;
  auto valid = [&](int r) { return r >= 0 && static_cast<size_t>(r) < R.size() && r != in.self; };
  // 1. Dead ranks explain everything.
  std::vector<int> dead, silentIn, missing, behind;
  for (const RankView& v : R) {
    if (v.rank == in.self) continue;
    if (v.gone && v.failed.empty()) dead.push_back(v.rank);
  }
  // 2. Ranks that never entered this collective (or are idle while this rank waits on them).
  for (const RankView& v : R) {
    if (v.rank == in.self || v.gone || v.leftInOrder) continue;
    bool notThere;
    if (in.seq >= 0) {
      notThere = v.entered < static_cast<uint64_t>(in.seq) + 1;  // never entered seq
      // Still inside an earlier collective that this rank has left (its last data to the rank was
      // lost, say), and answering: it is stuck in communication, not busy outside c4comm. (A silent
      // one's last heartbeat may predate its leaving that collective: it stays a non-communication
      // hang, as before.)
      if (notThere && v.entered > v.left && !v.unresponsive) {
        behind.push_back(v.rank);
        notThere = false;
      }
    } else {
      // Point-to-point: a rank this one waits on that is in no operation at all.
      const bool waited = std::find(in.waitingOn.begin(), in.waitingOn.end(), v.rank) != in.waitingOn.end();
      notThere = waited && !v.inP2p && v.entered <= v.left;
    }
    if (!notThere) {
      if (v.unresponsive) silentIn.push_back(v.rank);  // went silent inside the operation
      continue;
    }
    missing.push_back(v.rank);
  }
  std::string ev = "this rank (" + std::to_string(in.self) + ") waits in " + in.what;
  if (!in.waitingOn.empty())
    ev += " on rank" + std::string(in.waitingOn.size() > 1 ? "s " : " ") + listRanks(in.waitingOn);
  auto evidenceOf = [&](const std::vector<int>& rs) {
    std::string s = ev;
    for (int r : rs)
      if (valid(r)) s += "; rank " + std::to_string(r) + ": " + standing(R[static_cast<size_t>(r)], in.seq);
    return s;
  };
  if (!dead.empty() || !silentIn.empty()) {
    d.kind = "dead_rank";
    std::vector<int> all = dead;
    all.insert(all.end(), silentIn.begin(), silentIn.end());
    for (int r : all) addCulprit(&d, R, r);
    d.confidence = dead.empty() ? 0.7 : 0.95;
    std::string s;
    for (int r : dead) s += (s.empty() ? "" : "; ") + rankName(R, r) + " is gone";
    for (int r : silentIn)
      s += (s.empty() ? "" : "; ") + strFormat("%s stopped answering inside the operation (no heartbeat for %.1f s)",
                                               rankName(R, r).c_str(), seconds(R[static_cast<size_t>(r)].silentMs));
    d.summary = s;
    d.evidence = evidenceOf(all);
    return d;
  }
  if (!missing.empty()) {
    d.kind = "noncomm_hang";
    for (int r : missing) addCulprit(&d, R, r);
    d.confidence = 0.9;
    std::string s;
    for (int r : missing) {
      const RankView& v = R[static_cast<size_t>(r)];
      std::string last = v.left > 0 ? strFormat("its last collective was seq %llu, left %.1f s ago",
                                                static_cast<unsigned long long>(v.left - 1), seconds(v.leftAgoMs))
                                    : std::string("it has not run a collective yet");
      if (v.unresponsive) {
        last += strFormat("; its heartbeat stopped %.1f s ago (process stopped, frozen or unreachable)",
                          seconds(v.silentMs));
        d.confidence = 0.8;
      } else if (!v.inside.empty()) {
        last += "; it waits inside c4comm in " + v.inside +
                ", a call the other ranks did not make (the ranks' calls do not match)";
      } else {
        last += "; it is alive (heartbeats), so it is busy outside c4comm";
      }
      s += (s.empty() ? "" : "; ") +
           strFormat("%s never entered %s: %s", rankName(R, r).c_str(),
                     in.seq >= 0 ? strFormat("collective seq %lld", static_cast<long long>(in.seq)).c_str()
                                 : "the matching send/receive",
                     last.c_str());
    }
    d.summary = s;
    d.evidence = evidenceOf(missing);
    return d;
  }
  // 3. Everyone is in: a communication hang. The culprit pairs are those with data in flight that
  // does not move (an end's lanes busy); else those waiting on each other; else the pairs this
  // rank waits on.
  d.kind = "comm_hang";
  std::set<std::pair<int, int>> pairs;
  for (const RankView& a : R)
    for (int b : a.rank == in.self ? in.stuckTo : a.stuckTo)
      if (b >= 0 && static_cast<size_t>(b) < R.size() && b != a.rank)
        pairs.insert({std::min(a.rank, b), std::max(a.rank, b)});
  d.confidence = 0.9;
  if (pairs.empty()) d.confidence = 0.75;
  for (const RankView& a : R) {
    if (!pairs.empty() && d.confidence > 0.8) break;
    const std::vector<int>& wa = a.rank == in.self ? in.waitingOn : a.waitingOn;
    for (int b : wa) {
      if (b < 0 || static_cast<size_t>(b) >= R.size()) continue;
      const std::vector<int>& wb = b == in.self ? in.waitingOn : R[static_cast<size_t>(b)].waitingOn;
      if (std::find(wb.begin(), wb.end(), a.rank) != wb.end()) pairs.insert({std::min(a.rank, b), std::max(a.rank, b)});
    }
  }
  if (pairs.empty()) {
    for (int b : in.waitingOn) pairs.insert({std::min(in.self, b), std::max(in.self, b)});
    d.confidence = 0.6;
  }
  std::string s;
  for (const auto& p : pairs) {
    d.links.push_back(p);
    addCulprit(&d, R, p.first);
    addCulprit(&d, R, p.second);
    s += (s.empty() ? "" : "; ") + strFormat("the link between rank %d (host %s) and rank %d (host %s)", p.first,
                                             hostOf(R, p.first).c_str(), p.second, hostOf(R, p.second).c_str());
  }
  std::string where = "every rank entered " + in.what;
  if (!behind.empty()) {
    where = "every rank is inside a collective (";
    for (size_t i = 0; i < behind.size(); ++i)
      where += strFormat("%s%s still in seq %llu", i ? ", " : "", rankName(R, behind[i]).c_str(),
                         static_cast<unsigned long long>(R[static_cast<size_t>(behind[i])].entered - 1));
    where += ", which this rank left; the others in " + in.what + ")";
  }
  d.summary = where + ", and no data moves on " + (s.empty() ? "some link" : s);
  std::string e = evidenceOf(in.waitingOn);
  for (size_t i = 0; i < in.waitingOn.size() && i < in.states.size(); ++i)
    if (!in.states[i].empty()) e += "; connection to rank " + std::to_string(in.waitingOn[i]) + ": " + in.states[i];
  d.evidence = e;
  return d;
}

// ---- slowdowns ----

void SlowDetector::addOp(int r, uint64_t seq, int64_t enterNs, int64_t gapNs) {
  auto& m = enters_[r];
  m[seq] = Arrival{enterNs, gapNs};
  while (m.size() > 256) m.erase(m.begin());
}

void SlowDetector::addRates(int r, int64_t nowNs, const std::vector<PeerRate>& rates) {
  for (const PeerRate& pr : rates) {
    auto& v = samples_[{pr.peer, r}];
    if (!v.empty() && v.back().bytes == pr.bytes && v.back().ns == pr.ns &&
        nowNs - v.back().t < cfg_.windowMs * 1000000)
      continue;  // nothing new
    v.push_back({nowNs, pr.bytes, pr.ns});
    // Keep one sample older than the window (the baseline) and the ones inside it.
    while (v.size() > 2 && nowNs - v[1].t > cfg_.windowMs * 1000000) v.erase(v.begin());
    if (!pr.lanes.empty()) lanes_[{pr.peer, r}] = pr.lanes;
  }
}

std::vector<Diagnosis> SlowDetector::analyze(int64_t nowNs, const std::vector<bool>& live,
                                             const std::vector<std::string>& hostOf) {
  std::vector<Diagnosis> out;
  const int n = static_cast<int>(live.size());
  auto host = [&](int r) { return r >= 0 && r < static_cast<int>(hostOf.size()) ? hostOf[r] : std::string("?"); };
  std::set<std::string> seen;  // findings of this look
  auto finding = [&](const std::string& key) -> bool {
    seen.insert(key);
    if (++streak_[key] < cfg_.confirmations) return false;
    auto it = reported_.find(key);
    if (it != reported_.end() && nowNs - it->second < cfg_.repeatMs * 1000000) return false;
    reported_[key] = nowNs;
    return true;
  };

  // noncomm_slow: who arrives last, by how much, over the recent collectives all live ranks ran.
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r)
    if (live[r] && enters_.count(r)) ranks.push_back(r);
  if (ranks.size() >= 2 &&
      static_cast<int>(ranks.size()) == static_cast<int>(std::count(live.begin(), live.end(), true))) {
    std::vector<uint64_t> common;
    for (const auto& kv : enters_[ranks[0]]) {
      bool all = true;
      for (size_t i = 1; i < ranks.size() && all; ++i) all = enters_[ranks[i]].count(kv.first) > 0;
      if (all && nowNs - kv.second.enter < 4 * cfg_.windowMs * 1000000) common.push_back(kv.first);
    }
    if (common.size() > 32) common.erase(common.begin(), common.end() - 32);
    if (static_cast<int>(common.size()) >= cfg_.minOps) {
      std::map<int, int> lastCount;
      std::map<int, std::vector<double>> lateness;
      for (uint64_t s : common) {
        int lastR = -1;
        int64_t lastT = 0;
        for (int r : ranks) {
          const int64_t t = enters_[r][s].enter;
          if (lastR < 0 || t > lastT) lastR = r, lastT = t;
        }
        ++lastCount[lastR];
        std::vector<int64_t> others, otherGaps;
        for (int r : ranks) {
          if (r == lastR) continue;
          others.push_back(enters_[r][s].enter);
          if (enters_[r][s].gap >= 0) otherGaps.push_back(enters_[r][s].gap);
        }
        auto median = [](std::vector<int64_t>& v) {
          std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
          return v[v.size() / 2];
        };
        double late = static_cast<double>(lastT - median(others)) / 1e6;
        const int64_t gap = enters_[lastR][s].gap;
        if (gap >= 0 && !otherGaps.empty()) late = std::min(late, static_cast<double>(gap - median(otherGaps)) / 1e6);
        lateness[lastR].push_back(late);
      }
      for (const auto& kv : lastCount) {
        const int r = kv.first;
        if (kv.second * 4 < static_cast<int>(common.size()) * 3) continue;  // last in < 75% of them
        std::vector<double> l = lateness[r];
        std::nth_element(l.begin(), l.begin() + static_cast<long>(l.size() / 2), l.end());
        const double med = l[l.size() / 2];
        if (med < static_cast<double>(cfg_.stragglerMs)) continue;
        if (!finding("noncomm_slow:" + std::to_string(r))) continue;
        Diagnosis d;
        d.kind = "noncomm_slow";
        d.ranks = {r};
        d.hosts = {host(r)};
        d.lateMs = med;
        d.seq = static_cast<int64_t>(common.back());
        d.confidence = std::min(0.95, 0.5 + 0.5 * kv.second / static_cast<double>(common.size()));
        d.summary = strFormat(
            "rank %d (host %s) is a straggler: it arrived last at %d of the last %zu collectives, %.0f ms after the "
            "others (median), so they wait for it",
            r, host(r).c_str(), kv.second, common.size(), med);
        d.evidence =
            strFormat("collectives seq %llu..%llu; arrival times from the heartbeats; threshold %lld ms",
                      static_cast<unsigned long long>(common.front()), static_cast<unsigned long long>(common.back()),
                      static_cast<long long>(cfg_.stragglerMs));
        out.push_back(d);
      }
    }
  }

  // comm_slow: receive rates per (sender, receiver) over the window.
  struct Cell {
    int from, to;
    double rate;  // bytes/s
    uint64_t bytes;
  };
  std::vector<Cell> cells;
  for (const auto& kv : samples_) {
    const auto& v = kv.second;
    const int from = kv.first.first, to = kv.first.second;
    if (v.size() < 2 || from >= n || to >= n || !live[from] || !live[to]) continue;
    if (nowNs - v.back().t > cfg_.windowMs * 1000000) continue;  // no traffic lately
    const uint64_t b = v.back().bytes - v.front().bytes, t = v.back().ns - v.front().ns;
    if (b < cfg_.minBytes || t == 0) continue;
    cells.push_back({from, to, static_cast<double>(b) * 1e9 / static_cast<double>(t), b});
  }
  lastRates_.clear();
  for (const Cell& c : cells)
    lastRates_ += strFormat("%s%d->%d %.0f MB/s", lastRates_.empty() ? "" : ", ", c.from, c.to, c.rate / 1e6);
  if (cells.size() >= 2) {
    std::vector<double> rates;
    for (const Cell& c : cells) rates.push_back(c.rate);
    std::sort(rates.begin(), rates.end());
    const double ref = rates[(rates.size() * 3) / 4 < rates.size() ? (rates.size() * 3) / 4 : rates.size() - 1];
    const double limit = ref * cfg_.slowPercent / 100.0;
    std::map<int, std::pair<int, int>> perRank;  // rank -> (cells, slow cells)
    for (const Cell& c : cells)
      for (int r : {c.from, c.to}) {
        ++perRank[r].first;
        if (c.rate < limit) ++perRank[r].second;
      }
    std::set<int> slowNodes;
    for (const auto& kv : perRank)
      if (kv.second.first >= 2 && kv.second.second == kv.second.first) slowNodes.insert(kv.first);
    // A node is only the culprit if some pair works well (else nothing to compare with).
    if (slowNodes.size() * 2 > perRank.size()) slowNodes.clear();
    for (int r : slowNodes) {
      std::vector<std::string> parts;
      for (const Cell& c : cells)
        if (c.from == r || c.to == r) parts.push_back(strFormat("%d->%d %.0f MB/s", c.from, c.to, c.rate / 1e6));
      std::string detail;
      for (const auto& p : parts) detail += (detail.empty() ? "" : ", ") + p;
      if (!finding("comm_slow:node:" + std::to_string(r))) continue;
      Diagnosis d;
      d.kind = "comm_slow";
      d.ranks = {r};
      d.hosts = {host(r)};
      d.confidence = 0.8;
      d.summary = strFormat(
          "rank %d's node or NIC (host %s) is slow: every pair it sends or receives on runs below %d%% of the fast "
          "pairs (%.0f MB/s)",
          r, host(r).c_str(), cfg_.slowPercent, ref / 1e6);
      d.evidence = "receive rates over the last " + std::to_string(cfg_.windowMs / 1000) + " s: " + detail;
      out.push_back(d);
    }
    for (const Cell& c : cells) {
      if (c.rate >= limit || slowNodes.count(c.from) || slowNodes.count(c.to)) continue;
      if (!finding(strFormat("comm_slow:link:%d:%d", c.from, c.to))) continue;
      Diagnosis d;
      d.kind = "comm_slow";
      d.ranks = {c.from, c.to};
      d.hosts = {host(c.from)};
      if (host(c.to) != host(c.from)) d.hosts.push_back(host(c.to));
      d.links = {{c.from, c.to}};
      d.confidence = 0.75;
      auto ln = lanes_.find({c.from, c.to});
      d.summary = strFormat(
          "the link from rank %d (host %s) to rank %d (host %s) is slow: %.0f MB/s against %.0f MB/s on the fast pairs "
          "(%.0f%%)",
          c.from, host(c.from).c_str(), c.to, host(c.to).c_str(), c.rate / 1e6, ref / 1e6, 100.0 * c.rate / ref);
      d.evidence = strFormat("%.1f MB received by rank %d from rank %d in the last %lld s", c.bytes / 1e6, c.to, c.from,
                             static_cast<long long>(cfg_.windowMs / 1000));
      if (ln != lanes_.end()) d.evidence += "; lanes (receiver's end -> sender's end): " + ln->second;
      out.push_back(d);
    }
  }
  for (auto it = streak_.begin(); it != streak_.end();) it = seen.count(it->first) ? std::next(it) : streak_.erase(it);
  return out;
}

std::string diagnosisJson(const Diagnosis& d, const std::string& commTag, int rank, int nranks) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char when[64];
  tm t;
  gmtime_r(&ts.tv_sec, &t);
  snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
           t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000000);
  nlohmann::json j;
  j["c4d"] = 1;
  j["class"] = d.kind;
  j["time"] = when;
  j["time_ns"] = static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
  j["comm"] = commTag;
  j["rank"] = rank;
  j["nranks"] = nranks;
  j["reporter"] = d.reporter;
  if (d.seq >= 0) j["seq"] = d.seq;
  nlohmann::json c;
  c["ranks"] = d.ranks;
  c["hosts"] = d.hosts;
  nlohmann::json links = nlohmann::json::array();
  for (const auto& l : d.links) links.push_back({l.first, l.second});
  c["links"] = links;
  if (d.kind == "noncomm_slow") c["late_ms"] = d.lateMs;
  j["culprit"] = c;
  j["summary"] = d.summary;
  j["evidence"] = d.evidence;
  j["confidence"] = d.confidence;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace c4
