#include "sched/simulate.hpp"

#include <time.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <utility>

#include "common/status.hpp"

namespace c4::sched {
namespace {

bool isComm(StepKind k) { return k == StepKind::kSend || k == StepKind::kRecv || k == StepKind::kRecvReduce; }

const char* bufName(BufId b) {
  switch (b) {
    case BufId::kInput:
      return "input";
    case BufId::kOutput:
      return "output";
    case BufId::kScratch:
      return "scratch";
  }
  return "unknown-buffer";
}

/// Bytes a message step carries.
size_t msgBytes(const Step& s) { return s.kind == StepKind::kSend ? s.src.bytes : s.dst.bytes; }

void bufferOf(const SimBuffers& b, BufId id, uint8_t** base, size_t* size) {
  switch (id) {
    case BufId::kInput:
      *base = static_cast<uint8_t*>(b.input);
      *size = b.inputBytes;
      return;
    case BufId::kOutput:
      *base = static_cast<uint8_t*>(b.output);
      *size = b.outputBytes;
      return;
    case BufId::kScratch:
      *base = static_cast<uint8_t*>(b.scratch);
      *size = b.scratchBytes;
      return;
  }
  *base = nullptr;
  *size = 0;
}

/// The spans a step reads and the one it writes (bytes == 0 when none).
void stepAccesses(const Step& s, std::vector<Span>* reads, Span* write) {
  reads->clear();
  *write = Span();
  switch (s.kind) {
    case StepKind::kSend:
      reads->push_back(s.src);
      break;
    case StepKind::kRecv:
      *write = s.dst;
      break;
    case StepKind::kRecvReduce:
    case StepKind::kCopy:
      reads->push_back(s.src);
      *write = s.dst;
      break;
    case StepKind::kReduce:
      reads->push_back(s.src);
      reads->push_back(s.src2);
      *write = s.dst;
      break;
  }
}

std::string where(int rank, int idx, const Step& s) {
  return strFormat("rank %d step %d (%s)", rank, idx, describeStep(s).c_str());
}

Status usage(const std::string& msg) { return Status(Code::kInvalidUsage, msg); }

/// Address of a span: real pointers when buffers are known, else (buffer id, offset) in a
/// synthetic address space where distinct buffers never overlap.
uintptr_t addrOf(const Span& sp, const SimBuffers* bufs) {
  if (bufs != nullptr) {
    uint8_t* base;
    size_t size;
    bufferOf(*bufs, sp.buf, &base, &size);
    return reinterpret_cast<uintptr_t>(base) + sp.offset;
  }
  return (static_cast<uintptr_t>(sp.buf) << 56) + sp.offset;
}

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return an > 0 && bn > 0 && a < b + bn && b < a + an; }

}  // namespace

std::string describeStep(const Step& s) {
  auto span = [](const Span& sp) { return strFormat("%s[%zu,+%zu)", bufName(sp.buf), sp.offset, sp.bytes); };
  switch (s.kind) {
    case StepKind::kSend:
      return strFormat("send %s to %d", span(s.src).c_str(), s.peer);
    case StepKind::kRecv:
      return strFormat("recv %s from %d", span(s.dst).c_str(), s.peer);
    case StepKind::kRecvReduce:
      return strFormat("recvReduce %s = %s op from %d", span(s.dst).c_str(), span(s.src).c_str(), s.peer);
    case StepKind::kCopy:
      return strFormat("copy %s = %s", span(s.dst).c_str(), span(s.src).c_str());
    case StepKind::kReduce:
      return strFormat("reduce %s = %s op %s", span(s.dst).c_str(), span(s.src).c_str(), span(s.src2).c_str());
  }
  return "unknown step";
}

Status validateSchedule(const Schedule& sched, int rank, int nranks, const SimBuffers* bufs) {
  std::vector<Span> reads;
  Span write;
  for (size_t i = 0; i < sched.steps.size(); ++i) {
    const Step& s = sched.steps[i];
    const int idx = static_cast<int>(i);
    for (int32_t d : s.deps) {
      if (d < 0 || d >= idx) return usage(where(rank, idx, s) + strFormat(": dep %d is not a lower step index", d));
    }
    if (isComm(s.kind)) {
      if (s.peer < 0 || s.peer >= nranks || s.peer == rank) {
        return usage(where(rank, idx, s) + strFormat(": peer %d invalid for %d ranks", s.peer, nranks));
      }
      if (msgBytes(s) == 0) return usage(where(rank, idx, s) + ": zero-byte message");
    }
    if ((s.kind == StepKind::kRecvReduce || s.kind == StepKind::kCopy || s.kind == StepKind::kReduce) &&
        s.src.bytes != s.dst.bytes) {
      return usage(where(rank, idx, s) + strFormat(": src has %zu bytes, dst %zu", s.src.bytes, s.dst.bytes));
    }
    if (s.kind == StepKind::kReduce && s.src2.bytes != s.dst.bytes) {
      return usage(where(rank, idx, s) + strFormat(": src2 has %zu bytes, dst %zu", s.src2.bytes, s.dst.bytes));
    }
    stepAccesses(s, &reads, &write);
    std::vector<Span> all = reads;
    if (write.bytes > 0) all.push_back(write);
    for (const Span& sp : all) {
      if (sp.bytes == 0) continue;
      if (static_cast<uint8_t>(sp.buf) > static_cast<uint8_t>(BufId::kScratch)) {
        return usage(where(rank, idx, s) + ": unknown buffer id");
      }
      if (sp.buf == BufId::kScratch && (sp.offset > sched.scratchBytes || sched.scratchBytes - sp.offset < sp.bytes)) {
        return usage(where(rank, idx, s) +
                     strFormat(": scratch range ends past the schedule's scratchBytes %zu", sched.scratchBytes));
      }
      if (bufs == nullptr) continue;
      uint8_t* base;
      size_t size;
      bufferOf(*bufs, sp.buf, &base, &size);
      if (base == nullptr)
        return usage(where(rank, idx, s) + strFormat(": touches the null %s buffer", bufName(sp.buf)));
      if (sp.offset > size || size - sp.offset < sp.bytes) {
        return usage(where(rank, idx, s) + strFormat(": %s range ends past its %zu bytes", bufName(sp.buf), size));
      }
    }
    // Within a step, a source and the destination are either the same bytes or disjoint.
    if (write.bytes > 0) {
      const uintptr_t w = addrOf(write, bufs);
      for (const Span& r : reads) {
        const uintptr_t a = addrOf(r, bufs);
        if (a != w && overlaps(a, r.bytes, w, write.bytes)) {
          return usage(where(rank, idx, s) + ": source partially overlaps destination");
        }
      }
    }
  }
  return Status::ok();
}

namespace {

struct Access {
  uintptr_t lo;
  uintptr_t hi;
  int step;
  bool write;
};

/// Every two steps touching overlapping bytes, one of them writing, must be ordered by deps.
Status checkHazards(const Schedule& sched, int rank, const SimBuffers& bufs) {
  const size_t n = sched.steps.size();
  const size_t words = (n + 63) / 64;
  std::vector<uint64_t> anc(n * words, 0);  // anc[j] bit i: step i is a transitive dep of j
  for (size_t j = 0; j < n; ++j) {
    uint64_t* row = &anc[j * words];
    for (int32_t d : sched.steps[j].deps) {
      const uint64_t* drow = &anc[static_cast<size_t>(d) * words];
      for (size_t w = 0; w < words; ++w) row[w] |= drow[w];
      row[d / 64] |= uint64_t{1} << (d % 64);
    }
  }
  std::vector<Access> acc;
  std::vector<Span> reads;
  Span write;
  for (size_t i = 0; i < n; ++i) {
    const Step& s = sched.steps[i];
    stepAccesses(s, &reads, &write);
    if (s.kind == StepKind::kCopy && addrOf(s.src, &bufs) == addrOf(s.dst, &bufs)) continue;  // no-op
    for (const Span& r : reads) {
      if (r.bytes > 0) acc.push_back(Access{addrOf(r, &bufs), addrOf(r, &bufs) + r.bytes, static_cast<int>(i), false});
    }
    if (write.bytes > 0) {
      acc.push_back(Access{addrOf(write, &bufs), addrOf(write, &bufs) + write.bytes, static_cast<int>(i), true});
    }
  }
  std::sort(acc.begin(), acc.end(), [](const Access& a, const Access& b) { return a.lo < b.lo; });
  std::vector<Access> active;
  for (const Access& a : acc) {
    size_t keep = 0;
    for (const Access& b : active) {
      if (b.hi > a.lo) active[keep++] = b;
    }
    active.resize(keep);
    for (const Access& b : active) {
      if (b.step == a.step || (!a.write && !b.write)) continue;
      const int i = std::min(a.step, b.step), j = std::max(a.step, b.step);
      if ((anc[static_cast<size_t>(j) * words + i / 64] >> (i % 64)) & 1) continue;
      const Access& ai = a.step == i ? a : b;
      const Access& aj = a.step == j ? a : b;
      return usage(
          strFormat("data race on rank %d: step %d (%s, %s) and step %d (%s, %s) touch overlapping bytes "
                    "but step %d does not depend on step %d",
                    rank, i, describeStep(sched.steps[i]).c_str(), ai.write ? "writes" : "reads", j,
                    describeStep(sched.steps[j]).c_str(), aj.write ? "writes" : "reads", j, i));
    }
    active.push_back(a);
  }
  return Status::ok();
}

class Simulator {
 public:
  Simulator(const std::vector<Schedule>& scheds, const std::vector<SimBuffers>& bufs, const ReduceFn& reduce,
            const SimOptions& opts)
      : scheds_(scheds), reduce_(reduce), opts_(opts), rng_(opts.seed), ranks_(scheds.size()) {
    const int n = static_cast<int>(scheds.size());
    for (int r = 0; r < n; ++r) {
      RankRun& rr = ranks_[r];
      rr.bufs = bufs[r];
      if (rr.bufs.scratch == nullptr && scheds[r].scratchBytes > 0) {
        rr.ownScratch.assign(scheds[r].scratchBytes, 0xCD);
        rr.bufs.scratch = rr.ownScratch.data();
        rr.bufs.scratchBytes = rr.ownScratch.size();
      }
    }
  }

  Status run(SimStats* stats) {
    const int n = static_cast<int>(scheds_.size());
    for (int r = 0; r < n; ++r) C4_CHECK(validateSchedule(scheds_[r], r, n, &ranks_[r].bufs));
    C4_CHECK(checkPairs());
    if (opts_.checkHazards) {
      size_t work = 0;
      for (int r = 0; r < n; ++r) {
        const size_t k = scheds_[r].steps.size();
        if (k <= opts_.maxHazardSteps) work += k * k;
      }
      const size_t every = work <= opts_.maxHazardWork ? 1 : (work + opts_.maxHazardWork - 1) / opts_.maxHazardWork;
      for (int r = 0; r < n; ++r) {
        if (scheds_[r].steps.size() > opts_.maxHazardSteps) continue;
        if (r != 0 && r != n - 1 && r % static_cast<int>(std::min<size_t>(every, INT32_MAX)) != 0) continue;
        C4_CHECK(pastDeadline());
        C4_CHECK(checkHazards(scheds_[r], r, ranks_[r].bufs));
      }
    }
    init();
    for (size_t round = 0; !ready_.empty(); ++round) {
      if ((round & 4095) == 0) C4_CHECK(pastDeadline());
      std::uniform_int_distribution<size_t> pick(0, ready_.size() - 1);
      const size_t k = pick(rng_);
      const std::pair<int, int> rs = ready_[k];
      ready_[k] = ready_.back();
      ready_.pop_back();
      C4_CHECK(start(rs.first, rs.second));
    }
    size_t left = 0;
    for (const RankRun& rr : ranks_) left += rr.remaining;
    if (left > 0) return usage(deadlockReport(left));
    if (stats != nullptr) *stats = stats_;
    return Status::ok();
  }

 private:
  struct RankRun {
    SimBuffers bufs;
    std::vector<uint8_t> ownScratch;
    std::vector<uint8_t> scratchInit;
    std::vector<int> pending;
    std::vector<char> depsDone, done, posted;
    std::vector<std::vector<int>> dependents;
    std::vector<int64_t> readyAt, doneAt, postAt;
    std::vector<std::vector<int>> commOf;  // by peer, in step order
    std::vector<size_t> nextPost;
    std::vector<int64_t> lastPost;
    std::vector<std::deque<int>> sendQ, recvQ;  // posted and unmatched, by peer
    size_t remaining = 0;
  };

  Status pastDeadline() const {
    if (opts_.deadlineNs <= 0) return Status::ok();
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec < opts_.deadlineNs) return Status::ok();
    return makeError(Code::kTimeout, "the schedule simulation ran past its deadline");
  }

  Status checkPairs() {
    const int n = static_cast<int>(scheds_.size());
    // sends[r][p] / recvs[r][p]: step indices in order.
    std::vector<std::vector<std::vector<int>>> sends(n, std::vector<std::vector<int>>(n));
    auto recvs = sends;
    for (int r = 0; r < n; ++r) {
      const auto& steps = scheds_[r].steps;
      for (size_t i = 0; i < steps.size(); ++i) {
        if (!isComm(steps[i].kind)) continue;
        (steps[i].kind == StepKind::kSend ? sends : recvs)[r][steps[i].peer].push_back(static_cast<int>(i));
      }
    }
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        const auto& s = sends[a][b];
        const auto& v = recvs[b][a];
        for (size_t k = 0; k < std::min(s.size(), v.size()); ++k) {
          const Step& ss = scheds_[a].steps[s[k]];
          const Step& rs = scheds_[b].steps[v[k]];
          if (msgBytes(ss) != msgBytes(rs)) {
            return usage(strFormat("size mismatch: %s sends %zu bytes; the matching receive %s expects %zu bytes",
                                   where(a, s[k], ss).c_str(), msgBytes(ss), where(b, v[k], rs).c_str(), msgBytes(rs)));
          }
          if (ss.peerReduces != (rs.kind == StepKind::kRecvReduce)) {
            return usage(strFormat("protocol hint wrong: %s is marked %s but the matching receive %s %s",
                                   where(a, s[k], ss).c_str(), ss.peerReduces ? "peerReduces" : "plain",
                                   where(b, v[k], rs).c_str(),
                                   rs.kind == StepKind::kRecvReduce ? "reduces" : "does not reduce"));
          }
        }
        if (s.size() > v.size()) {
          const int i = s[v.size()];
          return usage(
              strFormat("unmatched message: %s has no matching receive (rank %d posts %zu sends to rank %d, "
                        "rank %d posts %zu receives from rank %d)",
                        where(a, i, scheds_[a].steps[i]).c_str(), a, s.size(), b, b, v.size(), a));
        }
        if (v.size() > s.size()) {
          const int i = v[s.size()];
          return usage(
              strFormat("unmatched message: %s has no matching send (rank %d posts %zu sends to rank %d, "
                        "rank %d posts %zu receives from rank %d)",
                        where(b, i, scheds_[b].steps[i]).c_str(), a, s.size(), b, b, v.size(), a));
        }
      }
    }
    return Status::ok();
  }

  void init() {
    const int n = static_cast<int>(scheds_.size());
    linkFree_.assign(static_cast<size_t>(n) * n, 0);
    for (int r = 0; r < n; ++r) {
      RankRun& rr = ranks_[r];
      const auto& steps = scheds_[r].steps;
      const size_t s = steps.size();
      rr.scratchInit.assign(rr.bufs.scratchBytes, 0);
      rr.pending.assign(s, 0);
      rr.depsDone.assign(s, 0);
      rr.done.assign(s, 0);
      rr.posted.assign(s, 0);
      rr.dependents.assign(s, {});
      rr.readyAt.assign(s, 0);
      rr.doneAt.assign(s, 0);
      rr.postAt.assign(s, 0);
      rr.commOf.assign(n, {});
      rr.nextPost.assign(n, 0);
      rr.lastPost.assign(n, 0);
      rr.sendQ.assign(n, {});
      rr.recvQ.assign(n, {});
      rr.remaining = s;
      stats_.steps += s;
      size_t msgs = 0;
      for (size_t i = 0; i < s; ++i) {
        // Duplicate deps count once.
        std::vector<int32_t> deps = steps[i].deps;
        std::sort(deps.begin(), deps.end());
        deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
        rr.pending[i] = static_cast<int>(deps.size());
        for (int32_t d : deps) rr.dependents[d].push_back(static_cast<int>(i));
        if (isComm(steps[i].kind)) {
          rr.commOf[steps[i].peer].push_back(static_cast<int>(i));
          ++msgs;
        }
      }
      stats_.maxRankMessages = std::max(stats_.maxRankMessages, msgs);
    }
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < scheds_[r].steps.size(); ++i) {
        if (ranks_[r].pending[i] == 0) depsSatisfied(r, static_cast<int>(i));
      }
    }
  }

  void depsSatisfied(int r, int i) {
    RankRun& rr = ranks_[r];
    rr.depsDone[i] = 1;
    const Step& s = scheds_[r].steps[i];
    if (!isComm(s.kind)) {
      ready_.emplace_back(r, i);
    } else if (rr.commOf[s.peer][rr.nextPost[s.peer]] == i) {
      ready_.emplace_back(r, i);
    }
  }

  void complete(int r, int i, int64_t t) {
    RankRun& rr = ranks_[r];
    rr.done[i] = 1;
    rr.doneAt[i] = t;
    stats_.hops = std::max(stats_.hops, t);
    --rr.remaining;
    for (int j : rr.dependents[i]) {
      rr.readyAt[j] = std::max(rr.readyAt[j], t);
      if (--rr.pending[j] == 0) depsSatisfied(r, j);
    }
  }

  uint8_t* ptr(int r, const Span& sp) {
    uint8_t* base;
    size_t size;
    bufferOf(ranks_[r].bufs, sp.buf, &base, &size);
    return base + sp.offset;
  }

  Status readCheck(int r, int i, const Span& sp) {
    if (!opts_.checkScratchInit || sp.buf != BufId::kScratch || sp.bytes == 0) return Status::ok();
    const auto& init = ranks_[r].scratchInit;
    for (size_t b = sp.offset; b < sp.offset + sp.bytes; ++b) {
      if (!init[b]) {
        return usage(where(r, i, scheds_[r].steps[i]) +
                     strFormat(": reads scratch byte %zu that no earlier step wrote", b));
      }
    }
    return Status::ok();
  }

  void wrote(int r, const Span& sp) {
    if (sp.buf != BufId::kScratch) return;
    std::fill(ranks_[r].scratchInit.begin() + sp.offset, ranks_[r].scratchInit.begin() + sp.offset + sp.bytes, 1);
  }

  Status start(int r, int i) {
    RankRun& rr = ranks_[r];
    const Step& s = scheds_[r].steps[i];
    const int64_t t = rr.readyAt[i];
    switch (s.kind) {
      case StepKind::kCopy: {
        C4_CHECK(readCheck(r, i, s.src));
        uint8_t* d = ptr(r, s.dst);
        const uint8_t* a = ptr(r, s.src);
        if (d != a) std::memcpy(d, a, s.dst.bytes);
        wrote(r, s.dst);
        complete(r, i, t);
        return Status::ok();
      }
      case StepKind::kReduce: {
        C4_CHECK(readCheck(r, i, s.src));
        C4_CHECK(readCheck(r, i, s.src2));
        if (!reduce_) return usage(where(r, i, s) + ": no reduce function given");
        reduce_(ptr(r, s.dst), ptr(r, s.src), ptr(r, s.src2), s.dst.bytes);
        wrote(r, s.dst);
        complete(r, i, t);
        return Status::ok();
      }
      default:
        break;
    }
    // Post a message step; the next one to this peer may now be posted too.
    const int p = s.peer;
    rr.posted[i] = 1;
    rr.postAt[i] = std::max(t, rr.lastPost[p]);
    rr.lastPost[p] = rr.postAt[i];
    ++rr.nextPost[p];
    if (rr.nextPost[p] < rr.commOf[p].size()) {
      const int j = rr.commOf[p][rr.nextPost[p]];
      if (rr.depsDone[j]) ready_.emplace_back(r, j);
    }
    if (s.kind == StepKind::kSend) {
      rr.sendQ[p].push_back(i);
      return tryMatch(r, p);
    }
    rr.recvQ[p].push_back(i);
    return tryMatch(p, r);
  }

  /// Matches posted sends from `a` to `b` with posted receives at `b` from `a`.
  Status tryMatch(int a, int b) {
    auto& sq = ranks_[a].sendQ[b];
    auto& rq = ranks_[b].recvQ[a];
    while (!sq.empty() && !rq.empty()) {
      const int si = sq.front(), ri = rq.front();
      sq.pop_front();
      rq.pop_front();
      const Step& ss = scheds_[a].steps[si];
      const Step& rs = scheds_[b].steps[ri];
      if (ss.src.bytes != rs.dst.bytes) {  // checkPairs catches this first; kept for safety
        return usage(strFormat("size mismatch: %s sends %zu bytes; %s expects %zu", where(a, si, ss).c_str(),
                               ss.src.bytes, where(b, ri, rs).c_str(), rs.dst.bytes));
      }
      C4_CHECK(readCheck(a, si, ss.src));
      const size_t bytes = ss.src.bytes;
      tmp_.assign(ptr(a, ss.src), ptr(a, ss.src) + bytes);
      if (rs.kind == StepKind::kRecv) {
        std::memcpy(ptr(b, rs.dst), tmp_.data(), bytes);
      } else {
        C4_CHECK(readCheck(b, ri, rs.src));
        if (!reduce_) return usage(where(b, ri, rs) + ": no reduce function given");
        reduce_(ptr(b, rs.dst), ptr(b, rs.src), tmp_.data(), bytes);
      }
      wrote(b, rs.dst);
      // A directed link carries one message per time unit.
      int64_t& link = linkFree_[static_cast<size_t>(a) * ranks_.size() + static_cast<size_t>(b)];
      const int64_t t = std::max({ranks_[a].postAt[si], ranks_[b].postAt[ri], link}) + 1;
      link = t;
      ++stats_.messages;
      stats_.bytes += bytes;
      complete(a, si, t);
      complete(b, ri, t);
    }
    return Status::ok();
  }

  std::string deadlockReport(size_t left) {
    std::string msg = strFormat("deadlock: no step can make progress, %zu steps unfinished", left);
    int shown = 0;
    for (size_t r = 0; r < ranks_.size() && shown < 4; ++r) {
      const RankRun& rr = ranks_[r];
      if (rr.remaining == 0) continue;
      const auto& steps = scheds_[r].steps;
      size_t i = 0;
      while (rr.done[i]) ++i;
      const Step& s = steps[i];
      const int ri = static_cast<int>(r);
      msg += "; " + where(ri, static_cast<int>(i), s);
      if (rr.posted[i]) {
        msg += strFormat(" is posted and waits for rank %d to post its matching %s", s.peer,
                         s.kind == StepKind::kSend ? "receive" : "send");
      } else if (!rr.depsDone[i]) {
        msg += " waits for unfinished deps";
        int k = 0;
        for (int32_t d : s.deps) {
          if (!rr.done[d] && k++ < 4) msg += strFormat(" %d", d);
        }
      } else {
        msg += strFormat(" waits behind step %d, an earlier unposted message to rank %d",
                         rr.commOf[s.peer][rr.nextPost[s.peer]], s.peer);
      }
      ++shown;
    }
    return msg;
  }

  const std::vector<Schedule>& scheds_;
  const ReduceFn& reduce_;
  SimOptions opts_;
  std::mt19937_64 rng_;
  std::vector<RankRun> ranks_;
  std::vector<std::pair<int, int>> ready_;
  std::vector<uint8_t> tmp_;
  std::vector<int64_t> linkFree_;  // [from * n + to]: when the link finishes its last message
  SimStats stats_;
};

}  // namespace

Status simulate(const std::vector<Schedule>& scheds, const std::vector<SimBuffers>& bufs, const ReduceFn& reduce,
                const SimOptions& opts, SimStats* stats) {
  if (scheds.empty() || bufs.size() != scheds.size()) {
    return makeError(Code::kInvalidArgument, "simulate: %zu schedules but %zu buffer sets", scheds.size(), bufs.size());
  }
  Simulator sim(scheds, bufs, reduce, opts);
  return sim.run(stats);
}

}  // namespace c4::sched
