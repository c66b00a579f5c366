#include "sched/builder.hpp"

#include <algorithm>
#include <utility>

namespace c4::sched::detail {

Range splitRange(size_t total, int parts, int i) {
  size_t p = static_cast<size_t>(parts);
  size_t idx = static_cast<size_t>(i);
  size_t base = total / p;
  size_t rem = total % p;
  Range r;
  r.off = idx * base + std::min(idx, rem);
  r.len = base + (idx < rem ? 1 : 0);
  return r;
}

size_t chunkElems(size_t chunkBytes, size_t elemSize) {
  if (chunkBytes == 0) return 0;
  return std::max<size_t>(1, chunkBytes / elemSize);
}

std::vector<Range> pieces(Range r, size_t chunk) {
  std::vector<Range> out;
  if (r.len == 0) return out;
  size_t n = chunk == 0 ? 1 : (r.len + chunk - 1) / chunk;
  out.reserve(n);
  size_t base = r.len / n, rem = r.len % n, off = r.off;
  for (size_t i = 0; i < n; ++i) {
    size_t len = base + (i < rem ? 1 : 0);
    out.push_back(Range{off, len});
    off += len;
  }
  return out;
}

int floorPow2(int n) {
  int m = 1;
  while (m * 2 <= n) m *= 2;
  return m;
}

Builder::Builder(const CollArgs& args)
    : args_(args), esz_(dataTypeSize(args.dtype)), chunk_(chunkElems(args.chunkBytes, esz_)) {
  size_t rankBytes = static_cast<size_t>(args.rank) * args.count * esz_;
  switch (args.coll) {
    case Coll::kAllReduce:
    case Coll::kBroadcast:
    case Coll::kReduce:
      break;  // same pointer when in place
    case Coll::kAllGather:
    case Coll::kGather:
      inBase_ = rankBytes;  // input == output + rank * count
      break;
    case Coll::kReduceScatter:
    case Coll::kScatter:
      outBase_ = rankBytes;  // output == input + rank * count
      break;
    default:
      outSpace_ = 1;  // no in-place form: the buffers are distinct
      break;
  }
  if (!args.aliased) outSpace_ = 1;  // the caller's buffers are disjoint
  sched_.algo = Algo::kRing;
}

Span Builder::span(BufId buf, Range r) const {
  Span s;
  s.buf = buf;
  s.offset = r.off * esz_;
  s.bytes = r.len * esz_;
  return s;
}

Span Builder::scratch(Range r) {
  Span s = span(BufId::kScratch, r);
  sched_.scratchBytes = std::max(sched_.scratchBytes, s.offset + s.bytes);
  return s;
}

void Builder::splitAt(SegMap& m, size_t x) {
  auto it = m.upper_bound(x);
  if (it == m.begin()) return;
  --it;
  if (it->first < x && x < it->second.end) {
    Seg tail = it->second;
    it->second.end = x;
    m.emplace_hint(std::next(it), x, std::move(tail));
  }
}

void Builder::access(const Span& s, bool write, int step, std::vector<int>* deps) {
  if (s.bytes == 0) return;
  int space = 2;
  size_t lo = s.offset;
  if (s.buf == BufId::kInput) {
    space = 0;
    lo += inBase_;
  } else if (s.buf == BufId::kOutput) {
    space = outSpace_;
    lo += outBase_;
  }
  size_t hi = lo + s.bytes;
  SegMap& m = spaces_[space];
  splitAt(m, lo);
  splitAt(m, hi);
  size_t cur = lo;
  auto it = m.lower_bound(lo);
  while (cur < hi) {
    if (it == m.end() || it->first > cur) {
      size_t gapEnd = it == m.end() ? hi : std::min(hi, it->first);
      Seg fresh;
      fresh.end = gapEnd;
      it = m.emplace_hint(it, cur, std::move(fresh));
    }
    Seg& seg = it->second;
    if (seg.lastWriter >= 0) deps->push_back(seg.lastWriter);
    if (write) {
      deps->insert(deps->end(), seg.readers.begin(), seg.readers.end());
      seg.readers.clear();
      seg.lastWriter = step;
    } else if (seg.readers.empty() || seg.readers.back() != step) {
      seg.readers.push_back(step);
    }
    cur = seg.end;
    ++it;
  }
}

int Builder::add(Step step, const Span* reads, int nreads, const Span* write) {
  int idx = static_cast<int>(sched_.steps.size());
  std::vector<int> deps;
  for (int i = 0; i < nreads; ++i) access(reads[i], false, idx, &deps);
  if (write != nullptr) access(*write, true, idx, &deps);
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  deps.erase(std::remove(deps.begin(), deps.end(), idx), deps.end());
  step.deps.assign(deps.begin(), deps.end());
  sched_.steps.push_back(std::move(step));
  return idx;
}

int Builder::send(int peer, Span src, bool peerReduces) {
  if (src.bytes == 0) return -1;
  Step s;
  s.kind = StepKind::kSend;
  s.peer = peer;
  s.src = src;
  s.peerReduces = peerReduces;
  return add(std::move(s), &src, 1, nullptr);
}

int Builder::recv(int peer, Span dst) {
  if (dst.bytes == 0) return -1;
  Step s;
  s.kind = StepKind::kRecv;
  s.peer = peer;
  s.dst = dst;
  return add(std::move(s), nullptr, 0, &dst);
}

int Builder::recvReduce(int peer, Span src, Span dst) {
  if (dst.bytes == 0) return -1;
  Step s;
  s.kind = StepKind::kRecvReduce;
  s.peer = peer;
  s.src = src;
  s.dst = dst;
  return add(std::move(s), &src, 1, &dst);
}

int Builder::copy(Span src, Span dst) {
  if (dst.bytes == 0) return -1;
  Step s;
  s.kind = StepKind::kCopy;
  s.src = src;
  s.dst = dst;
  return add(std::move(s), &src, 1, &dst);
}

int Builder::reduce(Span src, Span src2, Span dst) {
  if (dst.bytes == 0) return -1;
  Step s;
  s.kind = StepKind::kReduce;
  s.src = src;
  s.src2 = src2;
  s.dst = dst;
  Span reads[2] = {src, src2};
  return add(std::move(s), reads, 2, &dst);
}

void Builder::addDeps(int step, const std::vector<int32_t>& deps) {
  std::vector<int32_t>& d = sched_.steps[static_cast<size_t>(step)].deps;
  for (int32_t x : deps)
    if (x < step) d.push_back(x);
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
}

Schedule Builder::finish(Algo algo) {
  sched_.algo = algo;
  Schedule out = std::move(sched_);
  sched_ = Schedule();
  for (auto& m : spaces_) m.clear();
  return out;
}

}  // namespace c4::sched::detail
