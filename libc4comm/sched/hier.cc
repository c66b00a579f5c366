// Hierarchical generators for ranks spread over several hosts: reduce inside each host (shared
// memory), cross the network with as few bytes and hops as possible, then spread the result inside
// each host again. Hosts come from CollArgs::hostOf (all ranks on one host when it is empty).
//
// AllReduce, every host holding L ranks (the "2D" scheme):
//   1. ring reduce-scatter inside the host: local rank i ends with segment (i+1) mod L of the
//      host's partial sum;
//   2. ring allreduce of that segment across hosts among the ranks with the same local index: L
//      rings in parallel, each carrying 1/L of the vector, so every NIC port of a host can carry one;
//   3. ring allgather of the segments inside the host.
// A host's network traffic is 2 (H-1)/H of the vector for H hosts, against 2 (n-1)/n for a flat
// ring over all n ranks, and the network latency term drops from 2 (n-1) to 2 (H-1) hops.
// Hosts of different sizes use host leaders instead: a chain reduce to each host's first rank, a
// ring allreduce among the leaders, a chain broadcast back.
// Every element is reduced once in one fixed order and then copied, so results are bitwise
// identical on all ranks.
#include <algorithm>
#include <map>

#include "sched/generators.hpp"

namespace c4::sched::detail {
namespace {

using SpanOf = Span (Builder::*)(Range) const;

/// A ring over `members` (real ranks, in ring order) in which this rank sits at index `me`.
struct RingOn {
  const std::vector<int>& members;
  int me;
  int size() const { return static_cast<int>(members.size()); }
  int next() const { return members[static_cast<size_t>(mod(me + 1, size()))]; }
  int prev() const { return members[static_cast<size_t>(mod(me - 1, size()))]; }
};

/// Reduce-scatter of segs[j] (one per member) around the ring: segment j starts at member j from
/// `own`, each hop computes acc = own op incoming, and it is complete in `acc` at member j-1. So
/// afterwards member i holds segment (i+1) mod m.
void reduceScatterOn(Builder& b, const RingOn& ring, const std::vector<Range>& segs, SpanOf own, SpanOf acc) {
  const int m = ring.size();
  for (int k = 0; k < m - 1; ++k) {
    interleave(
        b.piecesOf(segs[static_cast<size_t>(mod(ring.me - k, m))]),
        b.piecesOf(segs[static_cast<size_t>(mod(ring.me - k - 1, m))]),
        [&](Range p) { b.sendToReduce(ring.next(), k == 0 ? (b.*own)(p) : (b.*acc)(p)); },
        [&](Range p) { b.recvReduce(ring.prev(), (b.*own)(p), (b.*acc)(p)); });
  }
}

/// Allgather around the ring of segments laid out as reduceScatterOn leaves them (member i holds
/// segment (i+1) mod m in `acc`); afterwards every member holds every segment in `acc`.
void allGatherOn(Builder& b, const RingOn& ring, const std::vector<Range>& segs, SpanOf acc) {
  const int m = ring.size();
  for (int k = 0; k < m - 1; ++k) {
    interleave(
        b.piecesOf(segs[static_cast<size_t>(mod(ring.me + 1 - k, m))]),
        b.piecesOf(segs[static_cast<size_t>(mod(ring.me - k, m))]), [&](Range p) { b.send(ring.next(), (b.*acc)(p)); },
        [&](Range p) { b.recv(ring.prev(), (b.*acc)(p)); });
  }
}

/// `all` split into `parts` consecutive near-equal ranges.
std::vector<Range> split(Range all, int parts) {
  std::vector<Range> out;
  for (int j = 0; j < parts; ++j) {
    Range r = splitRange(all.len, parts, j);
    out.push_back(Range{all.off + r.off, r.len});
  }
  return out;
}

/// Ring allreduce of `all` among `ring`'s members: `own` holds this rank's contribution, the
/// result lands in out.
void allReduceOn(Builder& b, const RingOn& ring, Range all, SpanOf own) {
  if (ring.size() < 2) {
    if (own != &Builder::out) b.copy(b.in(all), b.out(all));
    return;
  }
  const std::vector<Range> segs = split(all, ring.size());
  reduceScatterOn(b, ring, segs, own, &Builder::out);
  allGatherOn(b, ring, segs, &Builder::out);
}

/// Ranks grouped by host, hosts in order of their first rank, ranks ascending inside a host.
std::vector<std::vector<int>> hostGroups(const CollArgs& a) {
  std::vector<std::vector<int>> groups;
  std::map<int32_t, size_t> index;
  for (int r = 0; r < a.nranks; ++r) {
    const int32_t h = a.hostOf.empty() ? 0 : a.hostOf[static_cast<size_t>(r)];
    auto it = index.find(h);
    if (it == index.end()) {
      it = index.emplace(h, groups.size()).first;
      groups.emplace_back();
    }
    groups[it->second].push_back(r);
  }
  return groups;
}

}  // namespace

void hierAllReduce(Builder& b) {
  const std::vector<std::vector<int>> groups = hostGroups(b.args());
  const int H = static_cast<int>(groups.size());
  int h = 0, i = 0;
  for (int g = 0; g < H; ++g) {
    auto it = std::find(groups[static_cast<size_t>(g)].begin(), groups[static_cast<size_t>(g)].end(), b.rank());
    if (it != groups[static_cast<size_t>(g)].end()) {
      h = g;
      i = static_cast<int>(it - groups[static_cast<size_t>(g)].begin());
    }
  }
  const std::vector<int>& local = groups[static_cast<size_t>(h)];
  const int L = static_cast<int>(local.size());
  const Range all{0, b.count()};
  const bool equal = std::all_of(groups.begin(), groups.end(),
                                 [&](const std::vector<int>& g) { return static_cast<int>(g.size()) == L; });
  if (equal) {
    // 1. Inside the host: member i ends with segment (i+1) mod L of the host's partial result.
    const std::vector<Range> segs = split(all, L);
    if (L > 1) reduceScatterOn(b, RingOn{local, i}, segs, &Builder::in, &Builder::out);
    // 2. Across hosts, among the ranks with this local index.
    std::vector<int> peers;
    for (const auto& g : groups) peers.push_back(g[static_cast<size_t>(i)]);
    allReduceOn(b, RingOn{peers, h}, L > 1 ? segs[static_cast<size_t>(mod(i + 1, L))] : all,
                L > 1 ? &Builder::out : &Builder::in);
    // 3. Inside the host again.
    if (L > 1) allGatherOn(b, RingOn{local, i}, segs, &Builder::out);
    return;
  }
  // Hosts of different sizes: chain-reduce to the host's first rank (member L-1 starts, each member
  // adds its input and passes on, member 0 finishes), allreduce among the leaders, chain-broadcast
  // back down.
  const std::vector<Range> ps = b.piecesOf(all);
  for (Range p : ps) {
    if (L == 1) break;
    if (i == L - 1) {
      b.sendToReduce(local[static_cast<size_t>(i - 1)], b.in(p));
    } else {
      b.recvReduce(local[static_cast<size_t>(i + 1)], b.in(p), b.out(p));
      if (i > 0) b.sendToReduce(local[static_cast<size_t>(i - 1)], b.out(p));
    }
  }
  if (i == 0) {
    std::vector<int> leaders;
    for (const auto& g : groups) leaders.push_back(g[0]);
    allReduceOn(b, RingOn{leaders, h}, all, L > 1 ? &Builder::out : &Builder::in);
  }
  for (Range p : ps) {
    if (L == 1) break;
    if (i > 0) b.recv(local[static_cast<size_t>(i - 1)], b.out(p));
    if (i < L - 1) b.send(local[static_cast<size_t>(i + 1)], b.out(p));
  }
}

}  // namespace c4::sched::detail
