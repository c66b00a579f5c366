#include "tests/coll/coll_matrix.hpp"

#include <cstdio>
#include <memory>

#include "c4comm/trace.hpp"

namespace c4test {

namespace {
constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xCD;
constexpr unsigned char kPoison = 0xA5;

/// A buffer with guard bytes on both sides, to catch writes outside the result; from
/// c4::memAlloc when `shareable` (the zero-copy path then reads and writes it from other ranks).
struct Guarded {
  struct Free {
    bool shared;
    void operator()(unsigned char* p) const {
      if (shared) {
        (void)c4::memFree(p);
      } else {
        delete[] p;
      }
    }
  };
  std::unique_ptr<unsigned char, Free> mem;
  size_t bytes = 0;
  Guarded(size_t b, bool shareable) : mem(nullptr, Free{shareable}), bytes(b) {
    void* p = nullptr;
    if (shareable && !c4::memAlloc(&p, b + 2 * kGuard).isOk()) abort();
    mem.reset(shareable ? static_cast<unsigned char*>(p) : new unsigned char[b + 2 * kGuard]);
    memset(mem.get(), kGuardByte, b + 2 * kGuard);
    memset(data(), kPoison, b);
  }
  unsigned char* data() { return mem.get() + kGuard; }
  bool guardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem.get()[i] != kGuardByte || mem.get()[kGuard + bytes + i] != kGuardByte) return false;
    return true;
  }
};

/// What the zero-copy path takes (core/zerocopy.cc, ZeroCopy::offer): every collective but
/// Send/Recv, and reductions other than PreMulSum and floating-point Avg.
bool zeroCopyCall(Coll c, DataType dt, RedOp op, size_t count) {
  if (count == 0) return false;
  switch (c) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kReduce:
      return static_cast<int>(op) < static_cast<int>(RedOp::kAvg) || (op == RedOp::kAvg && !c4::isFloatType(dt));
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kGather:
    case Coll::kScatter:
    case Coll::kAlltoAll:
      return true;
    default:
      return false;
  }
}

// The device zero-copy path's calls (core/zerocopy.cc, ZeroCopy::mayDefer).
bool deviceZeroCopyCall(Coll c, RedOp op, size_t count, bool inPlace) {
  if (count == 0) return false;
  if (c == Coll::kAlltoAll) return !inPlace;
  if (c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce)
    return static_cast<int>(op) < static_cast<int>(RedOp::kAvg);
  return zeroCopyCall(c, c4::DataType::kFloat32, op, count);
}

bool reduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce; }
}  // namespace

std::string MatrixRunner::caseName(Coll coll, DataType dt, RedOp op, size_t count, bool inPlace, int root) const {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s %s %s count=%zu %s root=%d nranks=%d", c4::collName(coll), c4::dataTypeName(dt),
           reduces(coll) ? c4::redOpName(op) : "-", count, inPlace ? "in-place" : "out-of-place", root, n_);
  return buf;
}

void MatrixRunner::fail(const std::string& what) {
  if (++failCount_ <= 20) failures_.push_back(what);
}

bool MatrixRunner::runCase(Coll coll, DataType dt, RedOp op, size_t count, bool inPlace, int root) {
  const size_t es = c4::dataTypeSize(dt);
  const size_t n = static_cast<size_t>(n_);
  const size_t r = static_cast<size_t>(rank_);
  const std::string name = caseName(coll, dt, op, count, inPlace, root);

  // PreMulSum: a per-rank scalar (1 or 2), created for this call.
  std::vector<double> scalars(n, 1.0);
  RedOp callOp = op;
  bool premul = static_cast<int>(op) >= c4::kNumBuiltinOps;
  if (premul) {
    for (size_t k = 0; k < n; ++k) scalars[k] = static_cast<double>(k % 2 + 1);
    unsigned char s[8];
    storeValue(dt, s, scalars[r]);
    c4::Status st = c4::redOpCreatePreMulSum(&callOp, s, dt, c4::ScalarResidence::kHostImmediate, comm_);
    if (!st.isOk()) {
      fail(name + ": redOpCreatePreMulSum: " + st.toString());
      return false;
    }
  }
  RedOp valueOp = premul ? RedOp::kSum : op;

  size_t inElems = count, outElems = count;
  switch (coll) {
    case Coll::kAllGather:
      outElems = n * count;
      break;
    case Coll::kReduceScatter:
      inElems = n * count;
      break;
    case Coll::kAlltoAll:
      inElems = outElems = n * count;
      break;
    case Coll::kGather:
      outElems = n * count;
      break;
    case Coll::kScatter:
      inElems = n * count;
      break;
    default:
      break;
  }
  const bool shareable = opt_.shareable == 1 || (opt_.shareable == 2 && rank_ % 2 == 0);
  Guarded in(inElems * es, shareable), out(outElems * es, shareable);
  // Fill this rank's input.
  if (reduces(coll)) {
    for (size_t i = 0; i < inElems; ++i) {
      size_t idx = coll == Coll::kReduceScatter ? i : i;
      storeValue(dt, in.data() + i * es, inputValue(valueOp, dt, rank_, idx));
    }
  } else {
    for (size_t j = 0; j < inElems * es; ++j) in.data()[j] = patternByte(rank_, j);
  }
  std::vector<unsigned char> inCopy(in.data(), in.data() + in.bytes);

  const void* sendp = in.data();
  void* recvp = out.data();
  bool rooted = coll == Coll::kBroadcast || coll == Coll::kReduce || coll == Coll::kGather || coll == Coll::kScatter;
  if (inPlace) {
    switch (coll) {
      case Coll::kAllReduce:
      case Coll::kBroadcast:
      case Coll::kReduce:
      case Coll::kAlltoAll:
        memcpy(out.data(), in.data(), in.bytes);
        sendp = out.data();
        break;
      case Coll::kAllGather:
        memcpy(out.data() + r * count * es, in.data(), in.bytes);
        sendp = out.data() + r * count * es;
        break;
      case Coll::kReduceScatter:
        // recvbuff = sendbuff + rank*count: the input lives in a buffer of its own here.
        sendp = in.data();
        recvp = in.data() + r * count * es;
        break;
      case Coll::kGather:
        if (rank_ == root) {
          memcpy(out.data() + r * count * es, in.data(), in.bytes);
          sendp = out.data() + r * count * es;
        }
        break;
      case Coll::kScatter:
        if (rank_ == root) recvp = in.data() + r * count * es;
        break;
      default:
        break;
    }
  }
  if (rooted && rank_ != root) {
    // Only the root's buffer matters there: pass NULL to prove nobody touches it.
    if (coll == Coll::kReduce || coll == Coll::kGather) recvp = nullptr;
    if (coll == Coll::kBroadcast || coll == Coll::kScatter) sendp = nullptr;
  }

  // Device mode: every buffer (guards included) gets a device copy; the call runs on those, on the
  // mirror's stream, and the results come back on the same stream before the checks below.
  DeviceMirror* dev = opt_.device;
  void* stream = dev ? dev->stream : nullptr;
  unsigned char* dIn = dev ? dev->upload(in.mem.get(), in.bytes + 2 * kGuard) + kGuard : nullptr;
  unsigned char* dOut = dev ? dev->upload(out.mem.get(), out.bytes + 2 * kGuard) + kGuard : nullptr;
  auto onDevice = [&](const void* p) -> void* {
    const auto* b = static_cast<const unsigned char*>(p);
    if (!dev || !b) return const_cast<void*>(p);
    if (b >= in.data() && b <= in.data() + in.bytes) return dIn + (b - in.data());
    return dOut + (b - out.data());
  };
  auto bringBack = [&](c4::Status* st) {
    if (!dev) return;
    dev->download(in.mem.get(), dIn - kGuard, in.bytes + 2 * kGuard);
    dev->download(out.mem.get(), dOut - kGuard, out.bytes + 2 * kGuard);
    std::string why;
    if (!dev->sync(&why) && st->isOk()) *st = c4::Status(c4::Code::kUnhandledCudaError, why);
    dev->release();
  };
  sendp = onDevice(sendp);
  recvp = onDevice(recvp);

  c4::Status st;
  switch (coll) {
    case Coll::kAllReduce:
      st = c4::allReduce(sendp, recvp, count, dt, callOp, comm_, stream);
      break;
    case Coll::kAllGather:
      st = c4::allGather(sendp, recvp, count, dt, comm_, stream);
      break;
    case Coll::kBroadcast:
      st = c4::broadcast(sendp, recvp, count, dt, root, comm_, stream);
      break;
    case Coll::kReduceScatter:
      st = c4::reduceScatter(sendp, recvp, count, dt, callOp, comm_, stream);
      break;
    case Coll::kReduce:
      st = c4::reduce(sendp, recvp, count, dt, callOp, root, comm_, stream);
      break;
    case Coll::kAlltoAll:
      st = c4::alltoAll(sendp, recvp, count, dt, comm_, stream);
      break;
    case Coll::kGather:
      st = c4::gather(sendp, recvp, count, dt, root, comm_, stream);
      break;
    case Coll::kScatter:
      st = c4::scatter(sendp, recvp, count, dt, root, comm_, stream);
      break;
    case Coll::kSend: {
      // Ring exchange plus a message to self, all in one group.
      int next = (rank_ + 1) % n_, prev = (rank_ - 1 + n_) % n_;
      Guarded self(count * es, false);
      unsigned char* dSelf = dev ? dev->upload(self.mem.get(), self.bytes + 2 * kGuard) + kGuard : self.data();
      st = c4::groupStart();
      if (st.isOk()) st = c4::send(onDevice(in.data()), count, dt, next, comm_, stream);
      if (st.isOk()) st = c4::recv(onDevice(out.data()), count, dt, prev, comm_, stream);
      if (st.isOk()) st = c4::send(onDevice(in.data()), count, dt, rank_, comm_, stream);
      if (st.isOk()) st = c4::recv(dSelf, count, dt, rank_, comm_, stream);
      c4::Status end = c4::groupEnd();
      if (st.isOk()) st = end;
      if (dev) dev->download(self.mem.get(), dSelf - kGuard, self.bytes + 2 * kGuard);
      bringBack(&st);
      if (st.isOk() && count && memcmp(self.data(), in.data(), count * es) != 0)
        fail(name + ": send to self: wrong data");
      for (size_t j = 0; j < count * es && st.isOk(); ++j)
        if (out.data()[j] != patternByte(prev, j)) {
          fail(name + ": received wrong data from rank " + std::to_string(prev) + " at byte " + std::to_string(j));
          break;
        }
      if (premul) (void)c4::redOpDestroy(callOp, comm_);
      if (!st.isOk()) fail(name + ": " + st.toString());
      return st.isOk();
    }
    default:
      break;
  }
  bringBack(&st);
  if (dev && recvp) {
    // The checks below read the host copies: the results' place in them.
    const auto* b = static_cast<unsigned char*>(recvp);
    recvp = b >= dIn && b <= dIn + in.bytes ? in.data() + (b - dIn) : out.data() + (b - dOut);
  }
  if (premul) {
    c4::Status d = c4::redOpDestroy(callOp, comm_);
    if (!d.isOk()) fail(name + ": redOpDestroy: " + d.toString());
  }
  if (!st.isOk()) {
    fail(name + ": call failed: " + st.toString());
    return false;
  }
  if (opt_.shareable == 1 && n_ > 1 && zeroCopyCall(coll, dt, op, count)) ++zeroCopyExpected_;
  if (opt_.device && opt_.deviceZeroCopy && n_ > 1 && deviceZeroCopyCall(coll, op, count, inPlace)) ++zeroCopyExpected_;
  int before = failCount_;
  if (!in.guardsIntact() || !out.guardsIntact()) fail(name + ": wrote outside its buffers");
  if (!inPlace && in.bytes && memcmp(in.data(), inCopy.data(), in.bytes) != 0)
    fail(name + ": modified its input buffer");

  // Expected result.
  const unsigned char* res = static_cast<const unsigned char*>(recvp);
  auto checkReduced = [&](const unsigned char* got, size_t elems, size_t baseIdx) {
    double tol = (op == RedOp::kAvg || premul) ? tolerance(dt) : 0.0;
    for (size_t i = 0; i < elems; ++i) {
      double exp = reference(op, dt, n_, baseIdx + i, scalars);
      double g = loadValue(dt, got + i * es);
      bool ok = tol == 0 ? (g == exp) : std::fabs(g - exp) <= tol * std::max(1.0, std::fabs(exp));
      if (!ok) {
        char b[160];
        snprintf(b, sizeof(b), ": element %zu is %.9g, expected %.9g", i, g, exp);
        fail(name + b);
        return;
      }
    }
  };
  auto checkBytes = [&](const unsigned char* got, size_t bytes, int srcRank, size_t srcOff, const char* what) {
    for (size_t j = 0; j < bytes; ++j)
      if (got[j] != patternByte(srcRank, srcOff + j)) {
        fail(name + ": " + what + " from rank " + std::to_string(srcRank) + " wrong at byte " + std::to_string(j));
        return;
      }
  };
  switch (coll) {
    case Coll::kAllReduce:
      checkReduced(res, count, 0);
      break;
    case Coll::kReduceScatter: {
      // Element i of my block is element r*count+i of every rank's input.
      double tol = (op == RedOp::kAvg || premul) ? tolerance(dt) : 0.0;
      for (size_t i = 0; i < count; ++i) {
        double exp = reference(op, dt, n_, r * count + i, scalars);
        double g = loadValue(dt, res + i * es);
        bool ok = tol == 0 ? (g == exp) : std::fabs(g - exp) <= tol * std::max(1.0, std::fabs(exp));
        if (!ok) {
          char b[160];
          snprintf(b, sizeof(b), ": element %zu is %.9g, expected %.9g", i, g, exp);
          fail(name + b);
          break;
        }
      }
      break;
    }
    case Coll::kReduce:
      if (rank_ == root) checkReduced(res, count, 0);
      break;
    case Coll::kAllGather:
      for (int s = 0; s < n_; ++s) checkBytes(res + static_cast<size_t>(s) * count * es, count * es, s, 0, "block");
      break;
    case Coll::kBroadcast:
      checkBytes(res, count * es, root, 0, "data");
      break;
    case Coll::kAlltoAll:
      for (int s = 0; s < n_; ++s)
        checkBytes(res + static_cast<size_t>(s) * count * es, count * es, s, r * count * es, "block");
      break;
    case Coll::kGather:
      if (rank_ == root)
        for (int s = 0; s < n_; ++s) checkBytes(res + static_cast<size_t>(s) * count * es, count * es, s, 0, "block");
      break;
    case Coll::kScatter:
      checkBytes(res, count * es, root, r * count * es, "block");
      break;
    default:
      break;
  }
  return failCount_ == before;
}

Failures MatrixRunner::run(const MatrixOptions& opt) {
  opt_ = opt;
  const Coll kReducing[] = {Coll::kAllReduce, Coll::kReduceScatter, Coll::kReduce};
  const Coll kMoving[] = {Coll::kAllGather, Coll::kBroadcast, Coll::kAlltoAll,
                          Coll::kGather,    Coll::kScatter,   Coll::kSend};
  const RedOp kOps[] = {RedOp::kSum, RedOp::kProd,
                        RedOp::kMax, RedOp::kMin,
                        RedOp::kAvg, static_cast<RedOp>(c4::kNumBuiltinOps)};  // the last stands for "a PreMulSum op"
  std::vector<int> roots{0};
  if (n_ > 1) roots.push_back(n_ - 1);
  if (n_ > 2) roots.push_back(n_ / 2);

  for (size_t count : opt.counts) {
    for (bool inPlace : {false, true}) {
      for (DataType dt : kAllTypes) {
        for (Coll c : kReducing)
          for (RedOp op : kOps)
            for (int root : (c == Coll::kReduce ? roots : std::vector<int>{0}))
              if (!runCase(c, dt, op, count, inPlace, root) && failCount_ > 40) return failures_;
        if (!opt.allTypesForMovement && dt != DataType::kFloat32 && dt != DataType::kInt8) continue;
        for (Coll c : kMoving) {
          bool rooted = c == Coll::kBroadcast || c == Coll::kGather || c == Coll::kScatter;
          for (int root : (rooted ? roots : std::vector<int>{0}))
            if (!runCase(c, dt, RedOp::kSum, count, inPlace, root) && failCount_ > 40) return failures_;
        }
      }
    }
  }
  // One large size: every type with sum, every op with float and int32, movement with float.
  if (opt.bigBytes > 0) {
    for (DataType dt : kAllTypes) {
      size_t count = opt.bigBytes / c4::dataTypeSize(dt) + 3;
      for (Coll c : kReducing)
        for (RedOp op : kOps) {
          bool wide = dt == DataType::kFloat32 || dt == DataType::kInt32;
          if (op != RedOp::kSum && !wide) continue;
          runCase(c, dt, op, count, /*inPlace=*/op == RedOp::kMax, c == Coll::kReduce ? n_ - 1 : 0);
        }
      if (dt == DataType::kFloat32)
        for (Coll c : kMoving) runCase(c, dt, RedOp::kSum, count / static_cast<size_t>(n_) + 1, false, n_ > 1 ? 1 : 0);
    }
  }
  if (opt.checkZeroCopy) {
    std::vector<c4::trace::Event> events;
    uint64_t dropped = 0;
    c4::Status st = c4::trace::readEvents(comm_, &events, &dropped);
    size_t ran = 0;
    for (const c4::trace::Event& e : events)
      ran += e.type == c4::trace::EventType::kOp && e.algo == c4::trace::kAlgoZeroCopy;
    if (!st.isOk() || dropped)
      fail("reading the trace: " + st.toString() + ", " + std::to_string(dropped) + " events dropped");
    else if (ran != zeroCopyExpected_)
      fail("rank " + std::to_string(rank_) + ": " + std::to_string(ran) + " calls ran zero-copy, expected " +
           std::to_string(zeroCopyExpected_));
  }
  if (failCount_ > 20) failures_.push_back("... and " + std::to_string(failCount_ - 20) + " more failures");
  return failures_;
}

}  // namespace c4test
