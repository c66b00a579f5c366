// Internal to c4_sched: the helper every generator uses to emit steps. It derives each step's deps
// from the byte regions the step reads and writes (read-after-write, write-after-read,
// write-after-write), treating kInput and kOutput as aliased the way an in-place call aliases them,
// so one schedule is correct whether or not the caller's buffers alias (unless CollArgs::aliased is
// false: then they are separate address spaces).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "sched/schedule.hpp"

namespace c4::sched::detail {

/// A range of elements [off, off + len).
struct Range {
  size_t off = 0;
  size_t len = 0;
  size_t end() const { return off + len; }
};

/// Part `i` of `total` elements split into `parts` near-equal consecutive parts (the first
/// total % parts parts get one extra element). Every rank computes the same split.
Range splitRange(size_t total, int parts, int i);

/// Elements per pipeline piece for `chunkBytes` (0 means no pipelining).
size_t chunkElems(size_t chunkBytes, size_t elemSize);

/// Splits `r` into ceil(len / chunk) near-equal pieces (none when r is empty). Depends only on the
/// length and `chunk`, so the two ends of a transfer compute the same pieces.
std::vector<Range> pieces(Range r, size_t chunk);

/// Largest power of two <= n (n >= 1).
int floorPow2(int n);

/// a mod n in [0, n).
inline int mod(int a, int n) { return ((a % n) + n) % n; }

/// Calls fa on a[i] then fc on c[i] for i = 0, 1, ...: keeps a send and a receive to one peer
/// alternating so neither direction waits behind the other's whole message.
template <typename Fa, typename Fc>
void interleave(const std::vector<Range>& a, const std::vector<Range>& c, Fa fa, Fc fc) {
  size_t n = a.size() > c.size() ? a.size() : c.size();
  for (size_t i = 0; i < n; ++i) {
    if (i < a.size()) fa(a[i]);
    if (i < c.size()) fc(c[i]);
  }
}

/// Emits one rank's steps and computes their dependencies.
class Builder {
 public:
  explicit Builder(const CollArgs& args);

  const CollArgs& args() const { return args_; }
  int rank() const { return args_.rank; }
  int nranks() const { return args_.nranks; }
  size_t count() const { return args_.count; }
  /// Elements per pipeline piece.
  size_t chunk() const { return chunk_; }
  std::vector<Range> piecesOf(Range r) const { return pieces(r, chunk_); }

  /// Spans over element ranges of each buffer. scratch() grows the schedule's scratchBytes.
  Span in(Range r) const { return span(BufId::kInput, r); }
  Span out(Range r) const { return span(BufId::kOutput, r); }
  Span scratch(Range r);

  /// Each returns the new step's index, or -1 when nothing was emitted (empty span; a copy onto
  /// itself is still emitted because the executor treats it as a no-op).
  /// `peerReduces`: the peer receives this with recvReduce (see Step::peerReduces).
  int send(int peer, Span src, bool peerReduces = false);
  int sendToReduce(int peer, Span src) { return send(peer, src, true); }
  int recv(int peer, Span dst);
  int recvReduce(int peer, Span src, Span dst);
  int copy(Span src, Span dst);
  int reduce(Span src, Span src2, Span dst);

  /// Adds dependencies to step `step` (each lower than `step`; a schedule file's explicit deps).
  void addDeps(int step, const std::vector<int32_t>& deps);

  Schedule finish(Algo algo);

 private:
  struct Seg {
    size_t end = 0;
    int lastWriter = -1;
    std::vector<int> readers;  // since lastWriter
  };
  using SegMap = std::map<size_t, Seg>;

  Span span(BufId buf, Range r) const;
  int add(Step step, const Span* reads, int nreads, const Span* write);
  void access(const Span& s, bool write, int step, std::vector<int>* deps);
  static void splitAt(SegMap& m, size_t x);

  CollArgs args_;
  size_t esz_;
  size_t chunk_;
  size_t inBase_ = 0;   // byte offset of kInput inside its address space
  size_t outBase_ = 0;  // byte offset of kOutput inside its address space
  int outSpace_ = 0;    // 0 when output aliases input's space, else 1
  SegMap spaces_[3];    // in/out (aliased), out when not aliased, scratch
  Schedule sched_;
};

}  // namespace c4::sched::detail
