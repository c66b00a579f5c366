// Direct generators: every transfer goes straight from its source rank to its destination rank
// (one hop). Reductions receive every contribution into scratch and combine them locally in rank
// order 0, 1, ..., n-1, so every rank computes each element in the same order.
#include <vector>

#include "sched/generators.hpp"

namespace c4::sched::detail {
namespace {

/// Scratch slot of contribution from rank q (q != r) for a rank r: slots skip r.
int slotOf(int q, int r) { return q < r ? q : q - 1; }

/// dst = ((x(0) op x(1)) op x(2)) ... op x(n-1), where x(r) is this rank's own contribution. dst
/// may alias x(r) (in-place calls), so partial results accumulate in x(0)'s received copy until
/// x(r) has been consumed.
template <typename X>
void orderedReduce(Builder& b, int n, int r, X x, Span dst) {
  Span acc = x(0);
  for (int k = 1; k < n; ++k) {
    const Span d = k >= r ? dst : x(0);
    b.reduce(acc, x(k), d);
    acc = d;
  }
}

Range at(size_t base, Range p) { return Range{base + p.off, p.len}; }

}  // namespace

void directAllReduce(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const size_t count = b.count();
  auto slot = [&](int q, Range p) { return b.scratch(at(static_cast<size_t>(slotOf(q, r)) * count, p)); };
  for (Range p : b.piecesOf(Range{0, count})) {
    for (int d = 1; d < n; ++d) b.send((r + d) % n, b.in(p));
    for (int d = 1; d < n; ++d) b.recv(mod(r - d, n), slot(mod(r - d, n), p));
    orderedReduce(
        b, n, r, [&](int k) { return k == r ? b.in(p) : slot(k, p); }, b.out(p));
  }
}

void directAllGather(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const size_t count = b.count();
  auto blk = [&](int q, Range p) { return at(static_cast<size_t>(q) * count, p); };
  b.copy(b.in(Range{0, count}), b.out(blk(r, Range{0, count})));
  for (Range p : b.piecesOf(Range{0, count})) {
    for (int d = 1; d < n; ++d) b.send((r + d) % n, b.in(p));
    for (int d = 1; d < n; ++d) b.recv(mod(r - d, n), b.out(blk(mod(r - d, n), p)));
  }
}

void directReduceScatter(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const size_t count = b.count();
  auto blk = [&](int q, Range p) { return at(static_cast<size_t>(q) * count, p); };
  auto slot = [&](int q, Range p) { return b.scratch(at(static_cast<size_t>(slotOf(q, r)) * count, p)); };
  for (Range p : b.piecesOf(Range{0, count})) {
    for (int d = 1; d < n; ++d) b.send((r + d) % n, b.in(blk((r + d) % n, p)));
    for (int d = 1; d < n; ++d) b.recv(mod(r - d, n), slot(mod(r - d, n), p));
    orderedReduce(
        b, n, r, [&](int k) { return k == r ? b.in(blk(r, p)) : slot(k, p); }, b.out(p));
  }
}

void directBroadcast(Builder& b) {
  const int n = b.nranks(), r = b.rank(), root = b.args().root;
  const Range all{0, b.count()};
  for (Range p : b.piecesOf(all)) {
    if (r == root) {
      for (int d = 1; d < n; ++d) b.send((root + d) % n, b.in(p));
    } else {
      b.recv(root, b.out(p));
    }
  }
  if (r == root) b.copy(b.in(all), b.out(all));
}

void directReduce(Builder& b) {
  const int n = b.nranks(), r = b.rank(), root = b.args().root;
  const size_t count = b.count();
  auto slot = [&](int q, Range p) { return b.scratch(at(static_cast<size_t>(slotOf(q, r)) * count, p)); };
  for (Range p : b.piecesOf(Range{0, count})) {
    if (r != root) {
      b.send(root, b.in(p));
      continue;
    }
    for (int d = 1; d < n; ++d) b.recv(mod(r - d, n), slot(mod(r - d, n), p));
    orderedReduce(
        b, n, r, [&](int k) { return k == r ? b.in(p) : slot(k, p); }, b.out(p));
  }
}

void directAlltoAll(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const size_t count = b.count();
  auto blk = [&](int q, Range p) { return at(static_cast<size_t>(q) * count, p); };
  const Range all{0, count};
  b.copy(b.in(blk(r, all)), b.out(blk(r, all)));
  // Pairwise exchange: at step k send to r+k and receive from r-k.
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = mod(r - k, n);
    interleave(
        b.piecesOf(blk(to, all)), b.piecesOf(blk(from, all)), [&](Range p) { b.send(to, b.in(p)); },
        [&](Range p) { b.recv(from, b.out(p)); });
  }
}

void directGather(Builder& b) {
  const int n = b.nranks(), r = b.rank(), root = b.args().root;
  const size_t count = b.count();
  const Range all{0, count};
  if (r != root) {
    for (Range p : b.piecesOf(all)) b.send(root, b.in(p));
    return;
  }
  b.copy(b.in(all), b.out(at(static_cast<size_t>(root) * count, all)));
  for (Range p : b.piecesOf(all)) {
    for (int d = 1; d < n; ++d) {
      const int q = (root + d) % n;
      b.recv(q, b.out(at(static_cast<size_t>(q) * count, p)));
    }
  }
}

void directScatter(Builder& b) {
  const int n = b.nranks(), r = b.rank(), root = b.args().root;
  const size_t count = b.count();
  const Range all{0, count};
  if (r != root) {
    for (Range p : b.piecesOf(all)) b.recv(root, b.out(p));
    return;
  }
  for (Range p : b.piecesOf(all)) {
    for (int d = 1; d < n; ++d) {
      const int q = (root + d) % n;
      b.send(q, b.in(at(static_cast<size_t>(q) * count, p)));
    }
  }
  b.copy(b.in(at(static_cast<size_t>(root) * count, all)), b.out(all));
}

}  // namespace c4::sched::detail
