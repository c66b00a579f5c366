// c4-trace-bench: the tracer on a realistic workload and its cost.
//
//   c4-trace-bench replay [-np 4] [-steps 3] [-o DIR]
//       Replays the collectives of data-parallel and tensor-parallel training steps, in the order and
//       sizes such jobs issue them, with compute gaps between them, traced (C4_TRACE, default op).
//       DP step (PyTorch DDP-like): 25 MiB gradient buckets all-reduced in reverse layer order as the
//       backward pass produces them, then a loss and a gradient-norm AllReduce of one float each.
//       TP step (Megatron-like, per layer): AllGather of the sequence-parallel activations, two
//       AllReduces (attention and MLP outputs) forward, ReduceScatter of the gradients backward.
//       One rank computes 10% slower, as a straggler would. Then: c4-trace report DIR.
//   c4-trace-bench overhead [-np 2] [-b 8] [-iters 20000] [-rounds 15]
//       AllReduce of -b bytes (float sum), rounds of blocks at levels 0, op and step alternating in
//       one run (trace::setLevel); prints the median time per op of each level and the overheads.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/trace.hpp"

namespace {

struct Opts {
  std::string mode;
  int np = 0;
  int steps = 3;
  std::string dir;
  size_t bytes = 8;
  int iters = 20000;
  int rounds = 15;
};

double nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

void compute(double us) {
  const double end = nowUs() + us;
  while (nowUs() < end) {
  }
}

#define CHECK(expr)                                                                     \
  do {                                                                                  \
    c4::Status st_ = (expr);                                                            \
    if (!st_.isOk()) {                                                                  \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #expr, st_.toString().c_str()); \
      _exit(1);                                                                         \
    }                                                                                   \
  } while (0)

void replay(const Opts& o, int rank, int n, c4::Comm* comm) {
  const double slow = rank == n - 1 ? 1.1 : 1.0;  // the straggler
  // DP: 12 layers of ~8.7 M parameters (fp32 gradients), bucketed at 25 MiB like DDP.
  const size_t bucketElems = (25u << 20) / 4;
  const size_t layerElems = 8700000;
  std::vector<float> grads(bucketElems, 1.0f), act(1 << 22, 1.0f), out((1 << 22) * static_cast<size_t>(n), 0.0f);
  float scalar = 1.0f;
  for (int step = 0; step < o.steps; ++step) {
    uint64_t t0 = c4::trace::now();
    compute(3000 * slow);  // forward
    size_t pending = 0;
    int bucket = 0;
    for (int layer = 11; layer >= 0; --layer) {
      compute(400 * slow);  // backward of one layer
      pending += layerElems;
      while (pending >= bucketElems) {
        uint64_t b0 = c4::trace::now();
        CHECK(c4::allReduce(grads.data(), grads.data(), bucketElems, c4::DataType::kFloat32, c4::RedOp::kSum, comm));
        CHECK(c4::trace::addSpan(comm, ("dp bucket " + std::to_string(bucket++)).c_str(), b0, c4::trace::now(),
                                 bucketElems * 4));
        pending -= bucketElems;
      }
    }
    if (pending)
      CHECK(c4::allReduce(grads.data(), grads.data(), pending, c4::DataType::kFloat32, c4::RedOp::kSum, comm));
    CHECK(c4::allReduce(&scalar, &scalar, 1, c4::DataType::kFloat32, c4::RedOp::kSum, comm));  // loss
    CHECK(c4::allReduce(&scalar, &scalar, 1, c4::DataType::kFloat32, c4::RedOp::kMax, comm));  // grad norm
    CHECK(c4::trace::addSpan(comm, "dp step", t0, c4::trace::now()));
  }
  // TP: 8 layers, sequence 2048 x hidden 4096 in bf16 split over the ranks (sequence parallel).
  const size_t tokens = 2048, hidden = 4096;
  const size_t shard = tokens * hidden / static_cast<size_t>(n);  // bf16 elements per rank
  std::vector<uint16_t> a(shard * static_cast<size_t>(n), 0), b(shard * static_cast<size_t>(n), 0);
  for (int step = 0; step < o.steps; ++step) {
    uint64_t t0 = c4::trace::now();
    for (int layer = 0; layer < 8; ++layer) {
      CHECK(c4::allGather(a.data(), b.data(), shard, c4::DataType::kBfloat16, comm));  // gather the sequence
      compute(150 * slow);                                                             // attention
      CHECK(c4::allReduce(b.data(), b.data(), shard * n / 4, c4::DataType::kBfloat16, c4::RedOp::kSum, comm));
      compute(200 * slow);  // MLP
      CHECK(c4::allReduce(b.data(), b.data(), shard * n / 4, c4::DataType::kBfloat16, c4::RedOp::kSum, comm));
    }
    for (int layer = 7; layer >= 0; --layer) {
      compute(300 * slow);  // backward
      CHECK(c4::reduceScatter(b.data(), a.data(), shard, c4::DataType::kBfloat16, c4::RedOp::kSum, comm));
      CHECK(c4::allGather(a.data(), b.data(), shard, c4::DataType::kBfloat16, comm));
    }
    CHECK(c4::trace::addSpan(comm, "tp step", t0, c4::trace::now()));
  }
  (void)out;
  (void)act;
}

void overhead(const Opts& o, int rank, int n, c4::Comm* comm) {
  const size_t count = std::max<size_t>(1, o.bytes / 4);
  std::vector<float> x(count, 1.0f);
  const c4::trace::Level levels[3] = {c4::trace::Level::kOff, c4::trace::Level::kOp, c4::trace::Level::kStep};
  std::vector<double> per[3];
  for (int w = 0; w < o.iters / 4; ++w)
    CHECK(c4::allReduce(x.data(), x.data(), count, c4::DataType::kFloat32, c4::RedOp::kSum, comm));
  for (int round = 0; round < o.rounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      // Rotate the order each round so no level always runs first.
      const int l = (k + round) % 3;
      CHECK(c4::trace::setLevel(comm, levels[l]));
      double t0 = nowUs();
      for (int i = 0; i < o.iters; ++i)
        CHECK(c4::allReduce(x.data(), x.data(), count, c4::DataType::kFloat32, c4::RedOp::kSum, comm));
      double us = (nowUs() - t0) / o.iters;
      // Every rank reports the slowest rank's time, like c4-perf.
      double m = us;
      CHECK(c4::allReduce(&us, &m, 1, c4::DataType::kFloat64, c4::RedOp::kMax, comm));
      per[l].push_back(m);
    }
  }
  if (rank != 0) return;
  double med[3];
  for (int l = 0; l < 3; ++l) {
    std::sort(per[l].begin(), per[l].end());
    med[l] = per[l][per[l].size() / 2];
  }
  printf("AllReduce %zu bytes, %d ranks, %d rounds x %d iterations per level (median of rounds):\n", count * 4, n,
         o.rounds, o.iters);
  printf("  C4_TRACE=0    %10.3f us/op\n", med[0]);
  printf("  C4_TRACE=op   %10.3f us/op  (%+.2f%%)\n", med[1], 100 * (med[1] / med[0] - 1));
  printf("  C4_TRACE=step %10.3f us/op  (%+.2f%%)\n", med[2], 100 * (med[2] / med[0] - 1));
}

int usage() {
  fprintf(stderr,
          "usage: c4-trace-bench replay [-np N] [-steps S] [-o DIR]\n"
          "       c4-trace-bench overhead [-np N] [-b BYTES] [-iters I] [-rounds R]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  Opts o;
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "-np") {
      o.np = atoi(v.c_str());
    } else if (k == "-steps") {
      o.steps = atoi(v.c_str());
    } else if (k == "-o") {
      o.dir = v;
    } else if (k == "-b") {
      double m = 1;
      char suf = v.empty() ? 0 : v.back();
      if (suf == 'K' || suf == 'k') m = 1024;
      if (suf == 'M' || suf == 'm') m = 1 << 20;
      o.bytes = static_cast<size_t>(atof(v.c_str()) * m);
    } else if (k == "-iters") {
      o.iters = atoi(v.c_str());
    } else if (k == "-rounds") {
      o.rounds = atoi(v.c_str());
    } else {
      return usage();
    }
  }
  if (o.mode != "replay" && o.mode != "overhead") return usage();
  const int n = o.np > 0 ? o.np : (o.mode == "replay" ? 4 : 2);
  if (!o.dir.empty()) setenv("C4_TRACE_DIR", o.dir.c_str(), 1);
  // Ranks are forked processes; rank 0 creates the id (and serves the bootstrap root).
  std::vector<int> idPipe(2 * n);
  for (int r = 1; r < n; ++r)
    if (pipe(&idPipe[2 * r]) != 0) return 1;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      c4::UniqueId id;
      if (rank == 0) {
        CHECK(c4::getUniqueId(&id));
        for (int r = 1; r < n; ++r)
          if (write(idPipe[2 * r + 1], &id, sizeof(id)) != sizeof(id)) _exit(1);
      } else if (read(idPipe[2 * rank], &id, sizeof(id)) != sizeof(id)) {
        _exit(1);
      }
      c4::Comm* comm = nullptr;
      c4::Config cfg;
      cfg.name = o.mode;
      CHECK(c4::commInitRank(&comm, n, id, rank, cfg));
      if (o.mode == "replay") {
        replay(o, rank, n, comm);
        std::string path;
        CHECK(c4::commFinalize(comm));
        if (rank == 0) printf("trace written to %s\n", c4::trace::directory().c_str());
      } else {
        overhead(o, rank, n, comm);
      }
      CHECK(c4::commDestroy(comm));
      fflush(stdout);
      _exit(0);
    }
    pids.push_back(pid);
  }
  int bad = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad ? 1 : 0;
}
