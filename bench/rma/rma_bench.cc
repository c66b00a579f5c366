// One-sided put (c4::putSignal + waitSignal, ncclPutSignal/ncclWaitSignal) against two-sided
// send/recv of the same size, between two forked ranks of one host, in one run: a ping-pong of
// `size` bytes each way, timed over `iters` round trips after warm-up; one-way time = round trip / 2.
// The put goes from memAlloc memory into the peer's window; send/recv run on ordinary host buffers
// (what a two-sided program uses) and, as a second peer, on memAlloc buffers too.
//   rma_bench [minBytes] [maxBytes] [iters] [hosts]      (defaults 4 KiB, 16 MiB, 200)
// hosts: each rank claims a host of its own (C4_HOSTID): send/recv over tcp, puts over the side channel.
// Prints one row per size: microseconds and GB/s of each, and put's bandwidth over send/recv's.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace {

double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(const c4::Status& st, const char* what) {
  if (!st.isOk()) {
    fprintf(stderr, "%s: %s\n", what, st.toString().c_str());
    exit(1);
  }
}

int runRank(int rank, const c4::UniqueId& id, size_t minB, size_t maxB, int iters, int resultFd) {
  c4::Comm* comm = nullptr;
  check(c4::commInitRank(&comm, 2, id, rank), "init");
  const int peer = 1 - rank, one = 1;
  char *win = nullptr, *src = nullptr, *shared = nullptr;
  check(c4::memAlloc(reinterpret_cast<void**>(&win), maxB), "memAlloc");
  check(c4::memAlloc(reinterpret_cast<void**>(&src), maxB), "memAlloc");
  check(c4::memAlloc(reinterpret_cast<void**>(&shared), maxB), "memAlloc");
  std::vector<char> a(maxB, 1), b(maxB, 0);
  memset(src, 2, maxB);
  c4::Window* w = nullptr;
  check(c4::windowRegister(comm, win, maxB, 0, &w), "windowRegister");
  for (size_t bytes = minB; bytes <= maxB; bytes *= 4) {
    const int warm = 10;
    double t[3] = {0, 0, 0};
    // 0: put + signal; 1: send/recv on plain buffers; 2: send/recv on memAlloc buffers.
    for (int kind = 0; kind < 3; ++kind) {
      int dummy = 0;
      check(c4::allReduce(&one, &dummy, 1, c4::DataType::kInt32, c4::RedOp::kSum, comm), "sync");
      double t0 = 0;
      for (int i = 0; i < warm + iters; ++i) {
        if (i == warm) t0 = nowUs();
        const bool first = rank == 0;
        for (int leg = 0; leg < 2; ++leg) {
          const bool sending = (leg == 0) == first;
          if (kind == 0) {
            if (sending) {
              check(c4::putSignal(src, bytes, peer, w, 0, comm), "putSignal");
            } else {
              check(c4::waitSignal(1, &peer, &one, comm), "waitSignal");
            }
          } else {
            char* out = kind == 1 ? a.data() : shared;
            char* in = kind == 1 ? b.data() : win;
            if (sending) {
              check(c4::send(out, bytes, c4::DataType::kInt8, peer, comm), "send");
            } else {
              check(c4::recv(in, bytes, c4::DataType::kInt8, peer, comm), "recv");
            }
          }
        }
      }
      t[kind] = (nowUs() - t0) / iters / 2;
    }
    if (rank == 0) {
      char line[256];
      const double gb = static_cast<double>(bytes) / 1e3;  // bytes/us = MB/s; /1e3 = GB/s
      int n = snprintf(line, sizeof line, "%10zu %10.2f %8.2f %10.2f %8.2f %10.2f %8.2f %7.2f\n", bytes, t[0],
                       gb / t[0], t[1], gb / t[1], t[2], gb / t[2], t[1] / t[0]);
      if (write(resultFd, line, static_cast<size_t>(n)) != n) return 1;
    }
  }
  check(c4::windowDeregister(comm, w), "windowDeregister");
  (void)c4::memFree(win);
  (void)c4::memFree(src);
  (void)c4::memFree(shared);
  check(c4::commDestroy(comm), "destroy");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t minB = argc > 1 ? strtoull(argv[1], nullptr, 0) : 4096;
  const size_t maxB = argc > 2 ? strtoull(argv[2], nullptr, 0) : (16u << 20);
  const int iters = argc > 3 ? atoi(argv[3]) : 200;
  const bool hosts = argc > 4 && std::string(argv[4]) == "hosts";
  if (minB == 0 || maxB < minB || iters < 1) {
    fprintf(stderr, "usage: %s [minBytes] [maxBytes] [iters]\n", argv[0]);
    return 2;
  }
  int idPipe[2], out[2];
  if (pipe(idPipe) != 0 || pipe(out) != 0) return 1;
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    if (kids[r] == 0) {
      if (hosts) setenv("C4_HOSTID", std::to_string(700 + r).c_str(), 1);
      c4::UniqueId id;
      if (r == 0) {
        check(c4::getUniqueId(&id), "getUniqueId");
        if (write(idPipe[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) _exit(1);
      } else if (read(idPipe[0], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
        _exit(1);
      }
      _exit(runRank(r, id, minB, maxB, iters, out[1]));
    }
  }
  close(out[1]);
  printf("# one-way time of a ping-pong between 2 ranks of one host%s, %d round trips per size\n",
         hosts ? " claiming a host each (tcp, side channel)" : "", iters);
  printf("# %8s %10s %8s %10s %8s %10s %8s %7s\n", "bytes", "put us", "GB/s", "sendrecv", "GB/s", "sr-shared", "GB/s",
         "put/sr");
  fflush(stdout);
  char buf[4096];
  ssize_t k;
  while ((k = read(out[0], buf, sizeof buf)) > 0) {
    fwrite(buf, 1, static_cast<size_t>(k), stdout);
    fflush(stdout);
  }
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return bad ? 1 : 0;
}
