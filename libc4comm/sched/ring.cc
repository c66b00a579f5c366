// Ring generators: every rank sends to rank+1 and receives from rank-1 (chains start at the root
// for rooted collectives). Transfers are cut into pieces of about chunkBytes and steps are emitted
// ring-step major, piece minor, so piece p of hop k+1 leaves as soon as piece p of hop k arrived.
#include "sched/generators.hpp"

namespace c4::sched::detail {

void ringAllReduce(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto seg = [&](int s) { return splitRange(b.count(), n, mod(s, n)); };
  // Reduce-scatter: segment s starts at rank s (from its input) and is complete at rank s-1, each
  // hop computing out = in op incoming, so every element is reduced in one order.
  for (int k = 0; k < n - 1; ++k) {
    interleave(
        b.piecesOf(seg(r - k)), b.piecesOf(seg(r - k - 1)),
        [&](Range p) { b.sendToReduce(next, k == 0 ? b.in(p) : b.out(p)); },
        [&](Range p) { b.recvReduce(prev, b.in(p), b.out(p)); });
  }
  // Allgather: rank r owns segment r+1 and forwards what it received one hop earlier.
  for (int k = 0; k < n - 1; ++k) {
    interleave(
        b.piecesOf(seg(r + 1 - k)), b.piecesOf(seg(r - k)), [&](Range p) { b.send(next, b.out(p)); },
        [&](Range p) { b.recv(prev, b.out(p)); });
  }
}

void ringAllGather(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const size_t count = b.count();
  auto blk = [&](int q, Range p) { return Range{static_cast<size_t>(mod(q, n)) * count + p.off, p.len}; };
  const std::vector<Range> ps = b.piecesOf(Range{0, count});
  for (int k = 0; k < n - 1; ++k) {
    interleave(
        ps, ps, [&](Range p) { b.send(next, k == 0 ? b.in(p) : b.out(blk(r - k, p))); },
        [&](Range p) { b.recv(prev, b.out(blk(r - k - 1, p))); });
  }
  b.copy(b.in(Range{0, count}), b.out(blk(r, Range{0, count})));
}

void ringReduceScatter(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const size_t count = b.count();
  auto blk = [&](int q, Range p) { return Range{static_cast<size_t>(mod(q, n)) * count + p.off, p.len}; };
  // Partial sums of block q live in scratch slot (q - r - 1) mod n; block r never needs one.
  auto slot = [&](int q, Range p) { return Range{static_cast<size_t>(mod(q - r - 1, n)) * count + p.off, p.len}; };
  const std::vector<Range> ps = b.piecesOf(Range{0, count});
  // Block q starts at rank q+1 and completes at rank q after n-1 hops.
  for (int k = 0; k < n - 1; ++k) {
    const int sb = mod(r - 1 - k, n), rb = mod(r - 2 - k, n);
    interleave(
        ps, ps, [&](Range p) { b.sendToReduce(next, k == 0 ? b.in(blk(sb, p)) : b.scratch(slot(sb, p))); },
        [&](Range p) {
          if (rb == r) {
            b.recvReduce(prev, b.in(blk(rb, p)), b.out(p));
          } else {
            b.recvReduce(prev, b.in(blk(rb, p)), b.scratch(slot(rb, p)));
          }
        });
  }
}

void ringBroadcast(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const int v = mod(r - b.args().root, n);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const Range all{0, b.count()};
  for (Range p : b.piecesOf(all)) {
    if (v == 0) {
      b.send(next, b.in(p));
    } else {
      b.recv(prev, b.out(p));
      if (v != n - 1) b.send(next, b.out(p));
    }
  }
  if (v == 0) b.copy(b.in(all), b.out(all));
}

void ringReduce(Builder& b) {
  const int n = b.nranks(), r = b.rank();
  const int v = mod(r - b.args().root, n);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  // Chain root+1 -> root+2 -> ... -> root-1 -> root; intermediate ranks accumulate in scratch.
  for (Range p : b.piecesOf(Range{0, b.count()})) {
    if (v == 1) {
      b.sendToReduce(next, b.in(p));
    } else if (v == 0) {
      b.recvReduce(prev, b.in(p), b.out(p));
    } else {
      b.recvReduce(prev, b.in(p), b.scratch(p));
      b.sendToReduce(next, b.scratch(p));
    }
  }
}

}  // namespace c4::sched::detail
