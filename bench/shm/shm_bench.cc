// Micro-benchmark of the shm transport between two ranks: 8-byte ping-pong latency, one-way and
// exchange bandwidth, and one-way receive-with-reduction (float sum) bandwidth.
//   shm_bench [fork|threads] [maxBytes]
// Tune with the C4_SHM_* parameters (e.g. C4_SHM_CMA=0, C4_SHM_CMA_THRESHOLD=0). No assertions.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/shm/shm_test_util.hpp"
#include "transports/shm/shm_transport.hpp"

using namespace c4;
using namespace c4::transport;
using namespace c4::transport::testing;

namespace {

double nowSec() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void check(const Status& st, const char* what) {
  if (!st.isOk()) {
    fprintf(stderr, "%s: %s\n", what, st.toString().c_str());
    exit(1);
  }
}

// kind 0: one-way 0 -> 1; 1: exchange; 2: one-way with float-sum reduction on the receiver.
double runBandwidth(Transport* t, Connection* c, int rank, size_t bytes, int iters, int kind, uint64_t* seq, Oob& oob) {
  std::vector<char> sbuf(bytes, 1), rbuf(bytes, 0), local(bytes, 0);
  const int window = 4;
  std::vector<Request> reqs(2 * window);
  check(oob.barrier(), "barrier");
  double t0 = nowSec();
  for (int i = 0; i < iters; i += window) {
    int w = std::min(window, iters - i);
    std::vector<Request*> ptrs;
    for (int j = 0; j < w; ++j) {
      OpSig sig = testSig(*seq + j, bytes);
      if ((kind != 1 && rank == 0) || kind == 1) {
        check(c->isend(sbuf.data(), bytes, sig, &reqs[2 * j]), "isend");
        ptrs.push_back(&reqs[2 * j]);
      }
      if ((kind != 1 && rank == 1) || kind == 1) {
        ReduceSpec red;
        red.dtype = DataType::kFloat32;
        red.local = local.data();
        check(c->irecv(rbuf.data(), bytes, sig, kind == 2 ? &red : nullptr, &reqs[2 * j + 1]), "irecv");
        ptrs.push_back(&reqs[2 * j + 1]);
      }
    }
    *seq += w;
    check(waitAll(t, ptrs), "wait");
  }
  // The receiver's completion ends the measurement for both.
  Request ack;
  OpSig sig = testSig((*seq)++, 0);
  char dummy = 0;
  if (rank == 1)
    check(c->isend(&dummy, 0, sig, &ack), "ack");
  else
    check(c->irecv(&dummy, 0, sig, nullptr, &ack), "ack");
  check(waitAll(t, {&ack}), "ack wait");
  double dt = nowSec() - t0;
  return static_cast<double>(bytes) * iters * (kind == 1 ? 2 : 1) / dt / 1e9;
}

int body(int rank, Oob& oob, const std::string& tag, size_t maxBytes) {
  std::unique_ptr<Transport> t;
  check(createShmTransport(makeContext(rank, 2, tag, &oob), &t), "create");
  Connection* c = nullptr;
  check(t->connect(1 - rank, &c), "connect");
  uint64_t seq = 0;
  // Latency: 8-byte ping-pong.
  {
    char buf[8] = {0};
    const int iters = 20000;
    double t0 = 0;
    for (int i = -1000; i < iters; ++i) {
      if (i == 0) t0 = nowSec();
      Request a, b;
      OpSig s1 = testSig(seq++, 8), s2 = testSig(seq++, 8);
      if (rank == 0) {
        check(c->isend(buf, 8, s1, &a), "isend");
        check(c->irecv(buf, 8, s2, nullptr, &b), "irecv");
      } else {
        check(c->irecv(buf, 8, s1, nullptr, &a), "irecv");
        check(c->isend(buf, 8, s2, &b), "isend");
      }
      check(waitAll(t.get(), {&a, &b}), "wait");
    }
    if (rank == 0) printf("latency 8B (half round trip): %.2f us\n", (nowSec() - t0) / iters / 2 * 1e6);
  }
  if (rank == 0) printf("%12s %12s %12s %12s\n", "bytes", "oneway GB/s", "exch GB/s", "reduce GB/s");
  for (size_t bytes = 1024; bytes <= maxBytes; bytes *= 2) {
    int iters = static_cast<int>(std::max<size_t>(8, std::min<size_t>(4000, (512u << 20) / bytes)));
    double bw[3];
    for (int kind = 0; kind < 3; ++kind) bw[kind] = runBandwidth(t.get(), c, rank, bytes, iters, kind, &seq, oob);
    if (rank == 0) printf("%12zu %12.2f %12.2f %12.2f\n", bytes, bw[0], bw[1], bw[2]);
    fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "fork";
  size_t maxBytes = argc > 2 ? strtoull(argv[2], nullptr, 0) : (64u << 20);
  std::string tag = freshTag();
  printf(
      "shm_bench mode=%s C4_SHM_CMA=%s C4_SHM_CMA_THRESHOLD=%s C4_SHM_SLOT_BYTES=%s C4_SHM_SLOTS=%s "
      "C4_SHM_CMA_PIECE=%s\n",
      mode.c_str(), getenv("C4_SHM_CMA") ?: "-", getenv("C4_SHM_CMA_THRESHOLD") ?: "-",
      getenv("C4_SHM_SLOT_BYTES") ?: "-", getenv("C4_SHM_SLOTS") ?: "-", getenv("C4_SHM_CMA_PIECE") ?: "-");
  fflush(stdout);
  if (mode == "threads") {
    runThreads(2, [&](int r, Oob& oob) { body(r, oob, tag, maxBytes); });
    return 0;
  }
  auto st = runForked(
      2, [&](int r, Oob& oob) { return body(r, oob, tag, maxBytes); }, 600);
  for (int s : st)
    if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) return 1;
  return 0;
}
