#include "bench/soak/soak_ops.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

#include "bench/soak/soak_data.hpp"

namespace c4 {
namespace soak {
namespace {

constexpr size_t kGuard = 64;            // guard bytes before and after every buffer
constexpr unsigned char kPoison = 0xA5;  // receive buffers before the call
constexpr int kReportsPerCall = 4;

unsigned char guardByte(size_t k) { return static_cast<unsigned char>(0xC3 ^ (k * 29)); }

// A counter-based generator: every rank draws the same sequence from the same seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return mix64(s_ += 0x9e3779b97f4a7c15ull); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return uniform() < p; }

 private:
  uint64_t s_;
};

bool reduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce; }
bool rooted(Coll c) { return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter; }

// Blocks of `count` elements per rank in the larger of the two buffers.
size_t blockFactor(Coll c, int n) {
  switch (c) {
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAlltoAll:
    case Coll::kGather:
    case Coll::kScatter:
      return static_cast<size_t>(n);
    default:
      return 1;
  }
}

// 0, 1, small odd counts, and otherwise log-uniform bytes up to maxElems elements (half of them odd).
size_t drawCount(Rng& rng, size_t es, size_t maxElems) {
  if (maxElems == 0) return 0;
  double u = rng.uniform();
  if (u < 0.06) return 0;
  if (u < 0.12) return 1;
  if (u < 0.17) return std::min(maxElems, 2 * rng.below(8) + 3);
  const double maxBytes = static_cast<double>(maxElems * es);
  size_t bytes = static_cast<size_t>(std::exp(rng.uniform() * std::log(maxBytes)));
  size_t c = std::max<size_t>(1, std::min(maxElems, bytes / es));
  if (rng.chance(0.5) && (c | 1) <= maxElems) c |= 1;
  return c;
}

CollCall drawColl(Rng& rng, Coll coll, int n, size_t maxBytes) {
  CollCall c;
  c.coll = coll;
  c.dt = static_cast<DataType>(rng.below(kNumDataTypes));
  const size_t es = dataTypeSize(c.dt);
  c.op = static_cast<int>(rng.below(kPreMulSum + 1));
  c.root = static_cast<int>(rng.below(static_cast<uint64_t>(n)));
  c.inPlace = rng.chance(0.5);
  c.nullUnused = rng.chance(0.5);
  double s = rng.uniform();
  c.shareMode = s < 0.15 ? 1 : s < 0.2 ? 2 : 0;
  c.scalarOnDevice = rng.chance(0.5);
  for (int r = 0; r < n; ++r)
    c.scalarIdx.push_back(static_cast<int>(rng.below(static_cast<uint64_t>(premulScalarCount(c.dt)))));
  c.count = drawCount(rng, es, maxBytes / (es * blockFactor(coll, n)));
  c.seed = rng.next();
  if (!reduces(coll)) c.op = 0;
  return c;
}

std::vector<P2pMsg> drawMsgs(Rng& rng, int n, size_t maxBytes) {
  std::vector<P2pMsg> out;
  const int m = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(2 * n)));
  for (int k = 0; k < m; ++k) {
    P2pMsg msg;
    msg.src = static_cast<int>(rng.below(static_cast<uint64_t>(n)));
    msg.dst = static_cast<int>(rng.below(static_cast<uint64_t>(n)));
    // A send to oneself now and then; otherwise another rank.
    if (msg.dst == msg.src && !rng.chance(0.15)) msg.dst = (msg.src + 1 + static_cast<int>(rng.below(n - 1))) % n;
    msg.dt = static_cast<DataType>(rng.below(kNumDataTypes));
    msg.count = drawCount(rng, dataTypeSize(msg.dt), maxBytes / 2 / dataTypeSize(msg.dt));
    msg.seed = rng.next();
    out.push_back(msg);
  }
  return out;
}

const Coll kColls[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter, Coll::kBroadcast,
                       Coll::kReduce,    Coll::kAlltoAll,  Coll::kGather,        Coll::kScatter};

std::string describeColl(const CollCall& c) {
  char buf[200];
  std::string op = reduces(c.coll) ? (c.op == kPreMulSum ? "premulsum" : redOpName(static_cast<RedOp>(c.op))) : "";
  snprintf(buf, sizeof(buf), "%s %s%s%s count=%zu %s", collName(c.coll), dataTypeName(c.dt), op.empty() ? "" : " ",
           op.c_str(), c.count, c.inPlace ? "in-place" : "out-of-place");
  std::string s = buf;
  if (rooted(c.coll)) s += " root=" + std::to_string(c.root);
  if (c.shareMode == 1) s += " memAlloc";
  if (c.shareMode == 2) s += " memAlloc-even-ranks";
  if (rooted(c.coll) && c.nullUnused) s += " null-unused";
  return s;
}

std::string describeMsgs(const std::vector<P2pMsg>& msgs) {
  std::string s = "sendrecv[" + std::to_string(msgs.size()) + "]:";
  for (const P2pMsg& m : msgs)
    s += " " + std::to_string(m.src) + "->" + std::to_string(m.dst) + " " + dataTypeName(m.dt) + "x" +
         std::to_string(m.count);
  return s;
}

// A buffer with guard bytes on both sides, from malloc or memAlloc, its data `misalign` bytes past
// the head guard.
class Buffer {
 public:
  Buffer(size_t bytes, bool shared, size_t misalign) : bytes_(bytes), shared_(shared) {
    head_ = kGuard + misalign;
    total_ = head_ + bytes + kGuard;
    void* p = nullptr;
    if (shared) {
      if (!memAlloc(&p, total_).isOk()) p = nullptr;
    } else {
      p = malloc(total_);
    }
    base_ = static_cast<unsigned char*>(p);
    if (!base_) return;
    for (size_t k = 0; k < head_; ++k) base_[k] = guardByte(k);
    for (size_t k = 0; k < kGuard; ++k) base_[head_ + bytes + k] = guardByte(k + 7);
    memset(data(), kPoison, bytes);
  }
  ~Buffer() {
    if (!base_) return;
    if (shared_) {
      (void)memFree(base_);
    } else {
      free(base_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  bool ok() const { return base_ != nullptr; }
  unsigned char* data() { return base_ + head_; }
  size_t bytes() const { return bytes_; }
  /// Guard bytes that changed before / after the data.
  void badGuards(size_t* before, size_t* after, size_t* firstAfter) const {
    *before = *after = 0;
    *firstAfter = SIZE_MAX;
    for (size_t k = 0; k < head_; ++k) *before += base_[k] != guardByte(k);
    for (size_t k = 0; k < kGuard; ++k)
      if (base_[head_ + bytes_ + k] != guardByte(k + 7)) {
        ++*after;
        *firstAfter = std::min(*firstAfter, k);
      }
  }

 private:
  unsigned char* base_ = nullptr;
  size_t head_ = 0;
  size_t total_ = 0;
  size_t bytes_;
  bool shared_;
};

// One region to verify after the operation.
struct Check {
  enum class Kind {
    kReduced,  // reduction result: rd's expected element firstElem + i
    kBytes,    // exact bytes: a pattern, an input that must be unchanged, or untouched poison
  };
  Kind kind = Kind::kBytes;
  const char* what = "result";  // "result", "input", "unused buffer"
  bool isResult = true;
  int call = 0;  // index into the op's call descriptions
  unsigned char* p = nullptr;
  size_t elems = 0;
  DataType dt = DataType::kUint8;
  const ReduceData* rd = nullptr;
  size_t firstElem = 0;
  std::function<void(unsigned char*)> expect;  // kBytes: writes the expected elems * es bytes
};

Status waitDone(Comm* comm, Status st) {
  int spins = 0;
  while (st.code() == Code::kInProgress) {
    st = commGetAsyncError(comm);
    if (st.code() != Code::kInProgress) break;
    if (++spins > 64)
      usleep(20);
    else
      sched_yield();
  }
  return st;
}

Status withWhat(const Status& s, const std::string& what) {
  if (s.isOk() || s.code() == Code::kInProgress) return s;
  return Status(s.code(), what + ": " + s.toString());
}

}  // namespace

const char* opKindName(OpKind k) {
  static const char* kNames[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                                 "alltoall",  "gather",    "scatter",       "sendrecv",  "group"};
  return kNames[static_cast<int>(k)];
}

std::string OpSpec::describe() const {
  if (kind == OpKind::kSendRecv) return describeMsgs(msgs);
  if (kind != OpKind::kGroup) return describeColl(colls[0]);
  std::string s = "group[" + std::to_string(calls()) + "]:";
  for (size_t k = 0; k < colls.size(); ++k) s += (k ? "; " : " ") + describeColl(colls[k]);
  if (!msgs.empty()) s += "; " + describeMsgs(msgs);
  return s;
}

OpSpec drawOp(uint64_t segSeed, int index, int nranks, size_t maxBytes) {
  OpSpec op;
  op.seed = hash2(segSeed, static_cast<uint64_t>(index));
  Rng rng(op.seed);
  // Weights of the kinds, in OpKind order.
  static const int kWeights[kNumOpKinds] = {18, 9, 10, 9, 10, 7, 7, 7, 12, 11};
  int total = 0;
  for (int w : kWeights) total += w;
  int pick = static_cast<int>(rng.below(static_cast<uint64_t>(total)));
  int k = 0;
  while (pick >= kWeights[k]) pick -= kWeights[k++];
  op.kind = static_cast<OpKind>(k);
  if (op.kind == OpKind::kSendRecv) {
    op.msgs = drawMsgs(rng, nranks, maxBytes);
  } else if (op.kind == OpKind::kGroup) {
    const int calls = 2 + static_cast<int>(rng.below(4));
    for (int c = 0; c < calls; ++c)
      op.colls.push_back(drawColl(rng, kColls[rng.below(8)], nranks, maxBytes / static_cast<size_t>(calls)));
    if (rng.chance(0.3)) op.msgs = drawMsgs(rng, nranks, maxBytes / static_cast<size_t>(calls));
  } else {
    op.colls.push_back(drawColl(rng, kColls[k], nranks, maxBytes));
  }
  return op;
}

RankRunner::RankRunner(Comm* comm, int rank, int nranks, bool nonBlocking)
    : comm_(comm), rank_(rank), nranks_(nranks), nonBlocking_(nonBlocking) {}

OpResult RankRunner::run(const OpSpec& op, const std::string& label) {
  OpResult res;
  const int r = rank_, n = nranks_;
  const size_t nn = static_cast<size_t>(n);
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<std::unique_ptr<ReduceData>> rds;
  std::vector<Check> checks;
  std::vector<std::string> callDesc;
  std::vector<std::function<Status()>> issue;
  std::vector<RedOp> userOps;
  // Premul-sum scalars passed by pointer must stay put until the call completed.
  auto scalars = std::make_shared<std::vector<std::array<unsigned char, 8>>>(op.colls.size());

  auto alloc = [&](size_t bytes, bool shared, size_t misalign) -> unsigned char* {
    bufs.push_back(std::make_unique<Buffer>(bytes, shared, misalign));
    return bufs.back()->ok() ? bufs.back()->data() : nullptr;
  };
  auto fail = [&](const Status& st) {
    res.status = st;
    // A call that failed may still reach its buffers and scalars until the communicator is aborted:
    // they are freed with the runner, after the abort.
    for (auto& b : bufs) abandoned_.push_back(std::shared_ptr<void>(std::move(b)));
    abandoned_.push_back(scalars);
    return res;
  };

  for (size_t ci = 0; ci < op.colls.size(); ++ci) {
    const CollCall& c = op.colls[ci];
    const int call = static_cast<int>(callDesc.size());
    callDesc.push_back(describeColl(c));
    const size_t es = dataTypeSize(c.dt), cnt = c.count, blk = cnt * es;
    const bool red = reduces(c.coll);
    const bool shared = c.shareMode == 1 || (c.shareMode == 2 && r % 2 == 0);
    const size_t mis = (hash2(c.seed, 100 + static_cast<uint64_t>(r)) % 4) * es;
    const bool root = r == c.root;
    const ReduceData* rd = nullptr;
    if (red) {
      rds.push_back(std::make_unique<ReduceData>(c.dt, c.op, n, c.scalarIdx, c.seed));
      rd = rds.back().get();
    }
    auto srcSeed = [&c](int k) { return hash2(c.seed, static_cast<uint64_t>(k) + 1); };
    // This rank's input, elements [first, first + elems).
    auto fillIn = [rd, r, es, srcSeed](unsigned char* dst, size_t first, size_t elems) {
      if (rd) {
        rd->fill(r, first, elems, dst);
      } else {
        patternBytes(srcSeed(r), first * es, elems * es, dst);
      }
    };
    auto addReduced = [&](unsigned char* p, size_t elems, size_t first) {
      Check ck;
      ck.kind = Check::Kind::kReduced;
      ck.call = call;
      ck.p = p;
      ck.elems = elems;
      ck.dt = c.dt;
      ck.rd = rd;
      ck.firstElem = first;
      checks.push_back(std::move(ck));
    };
    auto addBytes = [&](const char* what, bool isResult, unsigned char* p, size_t elems,
                        std::function<void(unsigned char*)> expect) {
      Check ck;
      ck.what = what;
      ck.isResult = isResult;
      ck.call = call;
      ck.p = p;
      ck.elems = elems;
      ck.dt = c.dt;
      ck.expect = std::move(expect);
      checks.push_back(std::move(ck));
    };
    // Block k of a movement result: the pattern of source rank k from byte offset off.
    auto addBlock = [&](unsigned char* p, int k, size_t off) {
      const uint64_t s = srcSeed(k);
      addBytes("result", true, p, cnt, [s, off, blk](unsigned char* d) { patternBytes(s, off, blk, d); });
    };
    auto addUnchangedInput = [&](unsigned char* p, size_t elems) {
      addBytes("input", false, p, elems, [fillIn, elems](unsigned char* d) { fillIn(d, 0, elems); });
    };
    auto addUntouched = [&](unsigned char* p, size_t elems) {
      addBytes("unused buffer", false, p, elems, [elems, es](unsigned char* d) { memset(d, kPoison, elems * es); });
    };

    const void* send = nullptr;
    void* recv = nullptr;
    const size_t inE =
        c.coll == Coll::kReduceScatter || c.coll == Coll::kAlltoAll || c.coll == Coll::kScatter ? nn * cnt : cnt;
    const size_t outE =
        c.coll == Coll::kAllGather || c.coll == Coll::kAlltoAll || c.coll == Coll::kGather ? nn * cnt : cnt;
    // Where this rank's result lands, and what it must hold.
    auto expectResult = [&](unsigned char* out) {
      switch (c.coll) {
        case Coll::kAllReduce:
          addReduced(out, cnt, 0);
          break;
        case Coll::kReduce:
          if (root) addReduced(out, cnt, 0);
          break;
        case Coll::kReduceScatter:
          addReduced(out, cnt, static_cast<size_t>(r) * cnt);
          break;
        case Coll::kAllGather:
          for (int k = 0; k < n; ++k) addBlock(out + static_cast<size_t>(k) * blk, k, 0);
          break;
        case Coll::kBroadcast:
          addBlock(out, c.root, 0);
          break;
        case Coll::kAlltoAll:
          for (int k = 0; k < n; ++k) addBlock(out + static_cast<size_t>(k) * blk, k, static_cast<size_t>(r) * blk);
          break;
        case Coll::kGather:
          if (root)
            for (int k = 0; k < n; ++k) addBlock(out + static_cast<size_t>(k) * blk, k, 0);
          break;
        case Coll::kScatter:
          addBlock(out, c.root, static_cast<size_t>(r) * blk);
          break;
        default:
          break;
      }
    };

    // Buffers: the in-place layouts NCCL defines, else separate send and receive buffers. A rank
    // that does not use one of them passes NULL (nullUnused) or a buffer that must stay untouched.
    const bool sendUnused = rooted(c.coll) && !root && (c.coll == Coll::kBroadcast || c.coll == Coll::kScatter);
    const bool recvUnused = rooted(c.coll) && !root && (c.coll == Coll::kReduce || c.coll == Coll::kGather);
    bool inPlaceHere = c.inPlace;
    if ((c.coll == Coll::kGather || c.coll == Coll::kScatter) && !root) inPlaceHere = false;
    if (inPlaceHere) {
      switch (c.coll) {
        case Coll::kAllReduce:
        case Coll::kReduce:
        case Coll::kAlltoAll:
        case Coll::kBroadcast: {
          unsigned char* b = alloc(inE * es, shared, mis);
          if (!b) return fail(Status(Code::kSystemError, label + ": memAlloc failed"));
          if (c.coll != Coll::kBroadcast || root) fillIn(b, 0, inE);
          send = recv = b;
          if (recvUnused) {
            addUnchangedInput(b, inE);  // a non-root's in-place Reduce leaves its buffer alone
          } else {
            expectResult(b);
          }
          break;
        }
        case Coll::kAllGather:
        case Coll::kGather: {
          unsigned char* b = alloc(outE * es, shared, mis);
          if (!b) return fail(Status(Code::kSystemError, label + ": memAlloc failed"));
          unsigned char* mine = b + static_cast<size_t>(r) * blk;
          fillIn(mine, 0, cnt);
          send = mine;
          recv = b;
          expectResult(b);
          break;
        }
        case Coll::kReduceScatter:
        case Coll::kScatter: {
          unsigned char* b = alloc(inE * es, shared, mis);
          if (!b) return fail(Status(Code::kSystemError, label + ": memAlloc failed"));
          fillIn(b, 0, inE);
          send = b;
          recv = b + static_cast<size_t>(r) * blk;
          expectResult(static_cast<unsigned char*>(recv));
          break;
        }
        default:
          break;
      }
    } else {
      if (!(sendUnused && c.nullUnused)) {
        unsigned char* s = alloc(inE * es, shared, mis);
        if (!s) return fail(Status(Code::kSystemError, label + ": memAlloc failed"));
        if (sendUnused) {
          addUntouched(s, inE);
        } else {
          fillIn(s, 0, inE);
          addUnchangedInput(s, inE);
        }
        send = s;
      }
      if (!(recvUnused && c.nullUnused)) {
        unsigned char* d = alloc(outE * es, shared, (mis + es) % (4 * es));
        if (!d) return fail(Status(Code::kSystemError, label + ": memAlloc failed"));
        if (recvUnused) {
          addUntouched(d, outE);
        } else {
          expectResult(d);
        }
        recv = d;
      }
    }

    RedOp callOp = static_cast<RedOp>(red && c.op < kPreMulSum ? c.op : 0);
    if (red && c.op == kPreMulSum) {
      rd->scalar(r, (*scalars)[ci].data());
      Status st =
          redOpCreatePreMulSum(&callOp, (*scalars)[ci].data(), c.dt,
                               c.scalarOnDevice ? ScalarResidence::kDevice : ScalarResidence::kHostImmediate, comm_);
      if (!st.isOk()) return fail(withWhat(st, label + ": " + callDesc[call] + ": redOpCreatePreMulSum"));
      userOps.push_back(callOp);
    }
    Comm* comm = comm_;
    const Coll coll = c.coll;
    const DataType dt = c.dt;
    const int rootRank = c.root;
    issue.push_back([=]() -> Status {
      switch (coll) {
        case Coll::kAllReduce:
          return allReduce(send, recv, cnt, dt, callOp, comm);
        case Coll::kAllGather:
          return allGather(send, recv, cnt, dt, comm);
        case Coll::kReduceScatter:
          return reduceScatter(send, recv, cnt, dt, callOp, comm);
        case Coll::kBroadcast:
          return broadcast(send, recv, cnt, dt, rootRank, comm);
        case Coll::kReduce:
          return reduce(send, recv, cnt, dt, callOp, rootRank, comm);
        case Coll::kAlltoAll:
          return alltoAll(send, recv, cnt, dt, comm);
        case Coll::kGather:
          return gather(send, recv, cnt, dt, rootRank, comm);
        case Coll::kScatter:
          return scatter(send, recv, cnt, dt, rootRank, comm);
        default:
          return Status(Code::kInternalError, "not a collective");
      }
    });
  }

  // Point-to-point: this rank's sends and receives, in message order (FIFO matching per pair).
  std::vector<std::function<Status()>> p2p;
  if (!op.msgs.empty()) {
    const int call = static_cast<int>(callDesc.size());
    callDesc.push_back(describeMsgs(op.msgs));
    struct Mine {
      unsigned char* p;
      size_t bytes;
      size_t check;  // index of its "input" check
      bool aliased;
    };
    std::vector<Mine> sends;
    for (size_t m = 0; m < op.msgs.size(); ++m) {
      const P2pMsg& msg = op.msgs[m];
      const size_t es = dataTypeSize(msg.dt), bytes = msg.count * es;
      const size_t mis = (hash2(msg.seed, 7 + static_cast<uint64_t>(r)) % 4) * es;
      const uint64_t pat = hash2(msg.seed, 1);
      Comm* comm = comm_;
      if (msg.src == r) {
        unsigned char* s = alloc(bytes, false, mis);
        if (!s) return fail(Status(Code::kSystemError, label + ": malloc failed"));
        patternBytes(pat, 0, bytes, s);
        Check ck;
        ck.what = "send buffer";
        ck.isResult = false;
        ck.call = call;
        ck.p = s;
        ck.elems = msg.count;
        ck.dt = msg.dt;
        ck.expect = [pat, bytes](unsigned char* d) { patternBytes(pat, 0, bytes, d); };
        checks.push_back(std::move(ck));
        sends.push_back({s, bytes, checks.size() - 1, false});
        p2p.push_back([=]() { return c4::send(s, msg.count, msg.dt, msg.dst, comm); });
      }
      if (msg.dst == r) {
        unsigned char* d = nullptr;
        // Now and then receive into one of this rank's send buffers of the same size (an in-place
        // exchange): the library must send the old contents.
        if (msg.src != r && hash2(op.seed, 31 * static_cast<uint64_t>(r) + m) % 3 == 0) {
          for (Mine& s : sends)
            if (!s.aliased && s.bytes == bytes && bytes > 0) {
              s.aliased = true;
              checks[s.check].elems = 0;  // overwritten by the receive
              d = s.p;
              break;
            }
        }
        if (!d) d = alloc(bytes, false, mis);
        if (!d) return fail(Status(Code::kSystemError, label + ": malloc failed"));
        Check ck;
        ck.call = call;
        ck.p = d;
        ck.elems = msg.count;
        ck.dt = msg.dt;
        ck.expect = [pat, bytes](unsigned char* x) { patternBytes(pat, 0, bytes, x); };
        checks.push_back(std::move(ck));
        p2p.push_back([=]() { return c4::recv(d, msg.count, msg.dt, msg.src, comm); });
      }
    }
  }

  // Issue: one collective alone, or a group.
  // A send/recv batch is a group even on a rank with no message in it (an empty group).
  const bool group = op.kind == OpKind::kGroup || op.kind == OpKind::kSendRecv || !p2p.empty();
  Status st;
  if (group) {
    st = groupStart();
    if (!st.isOk()) return fail(withWhat(st, label + ": groupStart"));
    for (size_t k = 0; k < issue.size() && (st.isOk() || st.code() == Code::kInProgress); ++k)
      st = withWhat(issue[k](), label + ": " + callDesc[k]);
    for (size_t k = 0; k < p2p.size() && (st.isOk() || st.code() == Code::kInProgress); ++k)
      st = withWhat(p2p[k](), label + ": " + callDesc.back());
    Status ge = groupEnd();
    if (st.isOk() || st.code() == Code::kInProgress) st = withWhat(ge, label + ": groupEnd");
  } else {
    st = withWhat(issue[0](), label + ": " + callDesc[0]);
  }
  st = withWhat(waitDone(comm_, st), label + ": " + op.describe());
  if (!st.isOk()) return fail(st);
  for (RedOp u : userOps) {
    Status ds = redOpDestroy(u, comm_);
    if (!ds.isOk()) return fail(withWhat(ds, label + ": redOpDestroy"));
  }

  // Planted faults (--inject): one flipped bit in a result, or one byte past a receive buffer.
  if (inject_ != Inject::kNone) {
    for (Check& ck : checks) {
      if (!ck.isResult || ck.elems == 0) continue;
      const size_t es = dataTypeSize(ck.dt);
      if (inject_ == Inject::kWrong) {
        ck.p[(hash2(op.seed, 99) % ck.elems) * es] ^= 1;
      } else {
        // The first guard byte after the buffer this result lies in.
        for (auto& b : bufs)
          if (ck.p >= b->data() && ck.p < b->data() + b->bytes()) {
            b->data()[b->bytes()] ^= 0xff;
            break;
          }
      }
      inject_ = Inject::kNone;
      break;
    }
  }

  // Verify every element of every check, then every guard.
  std::vector<unsigned char> want;
  for (const Check& ck : checks) {
    if (ck.elems == 0) continue;
    const size_t es = dataTypeSize(ck.dt);
    int64_t bad = 0;
    auto report = [&](size_t i, const std::string& exp, const std::string& got) {
      if (++bad > kReportsPerCall || res.reports.size() >= 16) return;
      char head[64];
      snprintf(head, sizeof(head), "%s element %zu of %zu", ck.what, i, ck.elems);
      res.reports.push_back(label + ": " + callDesc[static_cast<size_t>(ck.call)] + ": rank " + std::to_string(r) +
                            ": " + head + ": expected " + exp + " got " + got);
    };
    if (ck.kind == Check::Kind::kReduced) {
      for (size_t i = 0; i < ck.elems; ++i) {
        const unsigned char* g = ck.p + i * es;
        if (ck.rd->matches(ck.firstElem + i, g)) continue;
        unsigned char e[8];
        ck.rd->expected(ck.firstElem + i, e);
        report(i, ck.rd->format(e), ck.rd->format(g));
      }
    } else {
      want.resize(ck.elems * es);
      ck.expect(want.data());
      if (memcmp(want.data(), ck.p, want.size()) != 0) {
        for (size_t i = 0; i < ck.elems; ++i)
          if (memcmp(want.data() + i * es, ck.p + i * es, es) != 0)
            report(i, formatElement(ck.dt, want.data() + i * es), formatElement(ck.dt, ck.p + i * es));
      }
    }
    res.wrong += bad;
    if (ck.isResult) res.bytesChecked += ck.elems * es;
  }
  for (const auto& b : bufs) {
    size_t before = 0, after = 0, first = 0;
    b->badGuards(&before, &after, &first);
    if (before + after == 0) continue;
    res.outOfBounds += static_cast<int64_t>(before + after);
    if (res.reports.size() < 16) {
      char buf[160];
      snprintf(buf, sizeof(buf),
               ": rank %d: OUT OF BOUNDS: %zu guard byte(s) before and %zu after a %zu-byte buffer changed%s", r,
               before, after, b->bytes(), after ? " (first at end+" : "");
      std::string line = label + ": " + op.describe() + buf;
      if (after) line += std::to_string(first) + ")";
      res.reports.push_back(line);
    }
  }
  return res;
}

}  // namespace soak
}  // namespace c4
