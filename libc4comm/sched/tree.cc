// Binomial-tree generators over ranks relative to the root (v = rank - root mod n): the parent of
// v is v minus its lowest set bit, its children are v + 2^j for 2^j below that bit. Pipelined by
// piece: piece p moves down (or up) the tree while piece p+1 follows one hop behind.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sched/generators.hpp"

namespace c4::sched::detail {
namespace {

struct BinomialTree {
  int n = 1;
  int root = 0;
  int v = 0;                  // this rank, relative to the root
  int parent = -1;            // real rank, -1 at the root
  std::vector<int> children;  // real ranks, smallest subtree first
  int height = 0;             // ceil(log2 n)

  BinomialTree(int nranks, int rootRank, int rank) : n(nranks), root(rootRank), v(mod(rank - rootRank, nranks)) {
    int low = v == 0 ? n : (v & -v);
    for (int mask = 1; mask < low && v + mask < n; mask <<= 1) children.push_back(real(v + mask));
    if (v != 0) parent = real(v - (v & -v));
    while ((1 << height) < n) ++height;
  }
  int real(int rel) const { return (rel + root) % n; }
};

}  // namespace

void treeAllReduce(Builder& b) {
  const BinomialTree t(b.nranks(), 0, b.rank());
  const std::vector<Range> ps = b.piecesOf(Range{0, b.count()});
  const int64_t m = static_cast<int64_t>(t.children.size());
  const int64_t depth = __builtin_popcount(static_cast<unsigned>(t.v));
  // Sends and receives to one peer are posted in step order, so a step that cannot run yet holds
  // back the later ones to that peer. Steps are therefore emitted in the order their data is
  // expected (one piece per hop and link): piece i from the k-th child at i+k+1, to the parent at
  // i+m, the result from the parent at i+height+depth. The key keeps each piece's own order.
  // Forwarding the result to the children is keyed kSendDelay pieces later: keyed with no delay, a
  // rank's next reduction receive from a child waits behind that send, which waits for the result,
  // which waits for this rank's reduction send: a cycle that halves the pipeline's rate.
  constexpr int64_t kSendDelay = 2;
  struct Ev {
    int64_t key;
    size_t seq;
    int what;  // 0: reduce from child `peer`; 1: send to parent; 2: receive result; 3: send result
    size_t piece;
    int peer;
  };
  std::vector<Ev> evs;
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t pi = static_cast<int64_t>(i);
    for (size_t k = 0; k < t.children.size(); ++k) {
      evs.push_back(Ev{4 * (pi + static_cast<int64_t>(k) + 1), evs.size(), 0, i, t.children[k]});
    }
    if (t.parent >= 0) evs.push_back(Ev{4 * (pi + m) + 1, evs.size(), 1, i, t.parent});
    if (t.parent >= 0) evs.push_back(Ev{4 * (pi + t.height + depth) + 2, evs.size(), 2, i, t.parent});
    for (auto it = t.children.rbegin(); it != t.children.rend(); ++it) {
      evs.push_back(Ev{4 * (pi + kSendDelay + t.height + depth) + 3, evs.size(), 3, i, *it});
    }
  }
  std::sort(evs.begin(), evs.end(),
            [](const Ev& x, const Ev& y) { return x.key != y.key ? x.key < y.key : x.seq < y.seq; });
  // Reduce to rank 0: out = in op child_1 op child_2 ... (one fixed order, so the root's result,
  // which every rank receives, is the same bits everywhere).
  std::vector<char> started(ps.size(), 0);  // whether out holds this piece's partial result
  for (const Ev& e : evs) {
    const Range p = ps[e.piece];
    switch (e.what) {
      case 0:
        b.recvReduce(e.peer, started[e.piece] ? b.out(p) : b.in(p), b.out(p));
        started[e.piece] = 1;
        break;
      case 1:
        b.sendToReduce(e.peer, started[e.piece] ? b.out(p) : b.in(p));
        break;
      case 2:
        b.recv(e.peer, b.out(p));
        break;
      default:
        b.send(e.peer, b.out(p));
        break;
    }
  }
}

void treeBroadcast(Builder& b) {
  const BinomialTree t(b.nranks(), b.args().root, b.rank());
  const Range all{0, b.count()};
  for (Range p : b.piecesOf(all)) {
    if (t.parent >= 0) b.recv(t.parent, b.out(p));
    // Largest subtree first: it is the deepest.
    for (auto it = t.children.rbegin(); it != t.children.rend(); ++it) {
      b.send(*it, t.parent >= 0 ? b.out(p) : b.in(p));
    }
  }
  if (t.parent < 0) b.copy(b.in(all), b.out(all));
}

void treeReduce(Builder& b) {
  const BinomialTree t(b.nranks(), b.args().root, b.rank());
  // The root accumulates in its output; other ranks with children in scratch (no output there).
  for (Range p : b.piecesOf(Range{0, b.count()})) {
    const Span acc = t.parent < 0 ? b.out(p) : (t.children.empty() ? Span() : b.scratch(p));
    bool first = true;
    for (int c : t.children) {
      b.recvReduce(c, first ? b.in(p) : acc, acc);
      first = false;
    }
    if (t.parent >= 0) b.sendToReduce(t.parent, first ? b.in(p) : acc);
  }
}

}  // namespace c4::sched::detail
