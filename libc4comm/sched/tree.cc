// Binomial-tree generators over ranks relative to the root (v = rank - root mod n): the parent of
// v is v minus its lowest set bit, its children are v + 2^j for 2^j below that bit. Pipelined by
// piece: piece p moves down (or up) the tree while piece p+1 follows one hop behind.
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
  // Reduce to rank 0: out = in op child_1 op child_2 ... (one fixed order, so the root's result,
  // which every rank receives, is the same bits everywhere).
  auto reduceUp = [&](Range p) {
    bool first = true;
    for (int c : t.children) {
      b.recvReduce(c, first ? b.in(p) : b.out(p), b.out(p));
      first = false;
    }
    if (t.parent >= 0) b.send(t.parent, first ? b.in(p) : b.out(p));
  };
  auto broadcastDown = [&](Range p) {
    if (t.parent >= 0) b.recv(t.parent, b.out(p));
    for (auto it = t.children.rbegin(); it != t.children.rend(); ++it) b.send(*it, b.out(p));
  };
  // Sends and receives to one peer are posted in step order, so the broadcast of piece p is
  // emitted `lag` pieces after its reduction: a rank then never holds back a reduction receive
  // behind a broadcast send whose data cannot have arrived yet.
  const size_t lag = static_cast<size_t>(t.height) + 1;
  for (size_t i = 0; i < ps.size() + lag; ++i) {
    if (i < ps.size()) reduceUp(ps[i]);
    if (i >= lag) broadcastDown(ps[i - lag]);
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
    if (t.parent >= 0) b.send(t.parent, first ? b.in(p) : acc);
  }
}

}  // namespace c4::sched::detail
