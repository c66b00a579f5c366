// Recursive halving / doubling over the largest power of two m <= n ranks. The standard fold makes
// any n work: each even rank r < 2*(n-m) hands its data to r+1 first and gets the result back last;
// the others take part as participants 0..m-1. Participant p stands for the consecutive real ranks
// [firstRank(p), firstRank(p+1)), so the blocks a group of participants owns are contiguous.
#include <vector>

#include "sched/generators.hpp"

namespace c4::sched::detail {
namespace {

struct Fold {
  int n = 1;
  int m = 1;
  int extra = 0;
  int nr = -1;          // participant index; -1 for an even rank folded into rank+1
  bool folded = false;  // an odd rank that also carries rank-1's data

  Fold(int nranks, int rank) : n(nranks), m(floorPow2(nranks)), extra(nranks - m) {
    if (rank < 2 * extra) {
      nr = rank % 2 == 1 ? rank / 2 : -1;
      folded = rank % 2 == 1;
    } else {
      nr = rank - extra;
    }
  }
  /// Real rank of participant p.
  int real(int p) const { return p < extra ? 2 * p + 1 : p + extra; }
  /// First real rank participant p stands for; firstRank(m) == n.
  int firstRank(int p) const { return p < extra ? 2 * p : p + extra; }
};

}  // namespace

void rhdAllReduce(Builder& b) {
  const int r = b.rank();
  const Fold f(b.nranks(), r);
  const size_t count = b.count();
  const Range all{0, count};
  if (f.nr < 0) {
    for (Range p : b.piecesOf(all)) b.sendToReduce(r + 1, b.in(p));
    for (Range p : b.piecesOf(all)) b.recv(r + 1, b.out(p));
    return;
  }
  // Participants own blocks of the vector split m ways; [lo, hi) is a range of those blocks.
  auto elems = [&](int lo, int hi) {
    size_t a = splitRange(count, f.m, lo).off, c = splitRange(count, f.m, hi).off;
    return Range{a, c - a};
  };
  bool inOut = false;  // whether this rank's partial result is in out (else still in in)
  if (f.folded) {
    for (Range p : b.piecesOf(all)) b.recvReduce(r - 1, b.in(p), b.out(p));
    inOut = true;
  }
  int lo = 0, hi = f.m;
  for (int mask = f.m / 2; mask >= 1; mask /= 2) {
    const int partner = f.real(f.nr ^ mask), mid = lo + mask;
    const bool upper = (f.nr & mask) != 0;
    const Range give = upper ? elems(lo, mid) : elems(mid, hi);
    const Range keep = upper ? elems(mid, hi) : elems(lo, mid);
    interleave(
        b.piecesOf(give), b.piecesOf(keep), [&](Range p) { b.sendToReduce(partner, inOut ? b.out(p) : b.in(p)); },
        [&](Range p) { b.recvReduce(partner, inOut ? b.out(p) : b.in(p), b.out(p)); });
    inOut = true;
    if (upper) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  for (int mask = 1; mask < f.m; mask *= 2) {
    const int partner = f.real(f.nr ^ mask);
    const bool upper = (f.nr & mask) != 0;
    const int tlo = upper ? lo - mask : hi, thi = upper ? lo : hi + mask;
    interleave(
        b.piecesOf(elems(lo, hi)), b.piecesOf(elems(tlo, thi)), [&](Range p) { b.send(partner, b.out(p)); },
        [&](Range p) { b.recv(partner, b.out(p)); });
    lo = lo < tlo ? lo : tlo;
    hi = hi > thi ? hi : thi;
  }
  if (f.folded) {
    for (Range p : b.piecesOf(all)) b.send(r - 1, b.out(p));
  }
}

void rhdAllGather(Builder& b) {
  const int r = b.rank(), n = b.nranks();
  const Fold f(n, r);
  const size_t count = b.count();
  auto blocks = [&](int a, int c) { return Range{static_cast<size_t>(a) * count, static_cast<size_t>(c - a) * count}; };
  const Range own{0, count};
  b.copy(b.in(own), b.out(blocks(r, r + 1)));
  if (f.nr < 0) {
    for (Range p : b.piecesOf(own)) b.send(r + 1, b.in(p));
    for (Range p : b.piecesOf(blocks(0, r))) b.recv(r + 1, b.out(p));
    for (Range p : b.piecesOf(blocks(r + 1, n))) b.recv(r + 1, b.out(p));
    return;
  }
  if (f.folded) {
    for (Range p : b.piecesOf(blocks(r - 1, r))) b.recv(r - 1, b.out(p));
  }
  int lo = f.nr, hi = f.nr + 1;  // participants whose blocks this rank holds
  for (int mask = 1; mask < f.m; mask *= 2) {
    const int partner = f.real(f.nr ^ mask);
    const bool upper = (f.nr & mask) != 0;
    const int tlo = upper ? lo - mask : hi, thi = upper ? lo : hi + mask;
    interleave(
        b.piecesOf(blocks(f.firstRank(lo), f.firstRank(hi))), b.piecesOf(blocks(f.firstRank(tlo), f.firstRank(thi))),
        [&](Range p) { b.send(partner, b.out(p)); }, [&](Range p) { b.recv(partner, b.out(p)); });
    lo = lo < tlo ? lo : tlo;
    hi = hi > thi ? hi : thi;
  }
  if (f.folded) {
    for (Range p : b.piecesOf(blocks(0, r - 1))) b.send(r - 1, b.out(p));
    for (Range p : b.piecesOf(blocks(r, n))) b.send(r - 1, b.out(p));
  }
}

void rhdReduceScatter(Builder& b) {
  const int r = b.rank(), n = b.nranks();
  const Fold f(n, r);
  const size_t count = b.count();
  auto blocks = [&](int a, int c) { return Range{static_cast<size_t>(a) * count, static_cast<size_t>(c - a) * count}; };
  if (f.nr < 0) {
    for (Range p : b.piecesOf(blocks(0, n))) b.sendToReduce(r + 1, b.in(p));
    for (Range p : b.piecesOf(Range{0, count})) b.recv(r + 1, b.out(p));
    return;
  }
  auto group = [&](int lo, int hi) { return blocks(f.firstRank(lo), f.firstRank(hi)); };
  // Partial sums live in scratch; it covers the whole input on a folded rank, else only the half
  // kept by the first halving step (everything written later lies inside it).
  size_t wBase = 0;
  if (!f.folded) wBase = (f.nr & (f.m / 2)) != 0 ? group(f.m / 2, f.m).off : 0;
  auto work = [&](Range p) { return b.scratch(Range{p.off - wBase, p.len}); };
  bool inWork = false;
  if (f.folded) {
    for (Range p : b.piecesOf(blocks(0, n))) b.recvReduce(r - 1, b.in(p), work(p));
    inWork = true;
  }
  int lo = 0, hi = f.m;
  for (int mask = f.m / 2; mask >= 1; mask /= 2) {
    const int partner = f.real(f.nr ^ mask), mid = lo + mask;
    const bool upper = (f.nr & mask) != 0;
    const Range give = upper ? group(lo, mid) : group(mid, hi);
    const Range keep = upper ? group(mid, hi) : group(lo, mid);
    // The last step of an unfolded rank keeps exactly its own block: reduce straight into out.
    const bool last = mask == 1 && !f.folded;
    const size_t ownOff = static_cast<size_t>(r) * count;
    interleave(
        b.piecesOf(give), b.piecesOf(keep), [&](Range p) { b.sendToReduce(partner, inWork ? work(p) : b.in(p)); },
        [&](Range p) {
          const Span src = inWork ? work(p) : b.in(p);
          b.recvReduce(partner, src, last ? b.out(Range{p.off - ownOff, p.len}) : work(p));
        });
    inWork = true;
    if (upper) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (f.folded) {
    b.copy(work(blocks(r, r + 1)), b.out(Range{0, count}));
    for (Range p : b.piecesOf(blocks(r - 1, r))) b.send(r - 1, work(p));
  }
}

}  // namespace c4::sched::detail
