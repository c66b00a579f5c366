// c4-p2p-bw: one-way point-to-point bandwidth between two local ranks, the way ucx_perftest's tag_bw
// measures UCX's: rank 0 sends `iters` messages of `bytes` to rank 1, `window` at a time
// in one group (rank 1 receives them the same way), after `warmup` untimed ones; rank 1 answers the
// last with one byte, and the time is rank 0's from the first send to that answer. Whatever
// transport C4_TRANSPORT selects carries it (C4_TRANSPORT=ucx for the comparison).
//
//   c4-p2p-bw [bytes=4M] [iters=200] [window=16] [warmup=20]
// C4_P2P_PIN=1 pins rank r to CPU r.
// Prints "c4-p2p-bw: <bytes> B x <iters>: <MB/s> MB/s (MB = 2^20 B, as ucx_perftest)".
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace {

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return static_cast<size_t>(v);
}

int fail(int rank, const char* what, const c4::Status& st) {
  fprintf(stderr, "c4-p2p-bw: rank %d: %s: %s\n", rank, what, st.toString().c_str());
  return 1;
}

int runRank(int rank, const c4::UniqueId& id, size_t bytes, int iters, int window, int warmup) {
  // C4_P2P_PIN=1: rank r (and every thread it starts) on CPU r, as compare.sh runs ucx_perftest's two
  // processes with taskset; on a 2-core machine an unpinned pair swings 2x with the scheduler's placement.
  const char* pin = getenv("C4_P2P_PIN");
  if (pin && atoi(pin) != 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("c4-p2p-bw: sched_setaffinity");
  }
  c4::Comm* comm = nullptr;
  c4::Status st = c4::commInitRank(&comm, 2, id, rank);
  if (!st.isOk()) return fail(rank, "init", st);
  // As ucx_perftest: every message of a window from (into) the same buffer, so that both measure the
  // transport rather than the caches (C4_P2P_DISTINCT=1: a buffer per message, and the data checked).
  const char* distinctEnv = getenv("C4_P2P_DISTINCT");
  const bool distinct = distinctEnv && atoi(distinctEnv) != 0;
  std::vector<char> buf(bytes * static_cast<size_t>(distinct ? window : 1), static_cast<char>(rank + 1));
  char ack = 0;
  const int peer = 1 - rank;
  auto batch = [&](int n) -> c4::Status {
    c4::Status g = c4::groupStart();
    if (!g.isOk()) return g;
    for (int k = 0; k < n; ++k) {
      char* p = buf.data() + (distinct ? bytes * static_cast<size_t>(k) : 0);
      c4::Status s = rank == 0 ? c4::send(p, bytes, c4::DataType::kUint8, peer, comm)
                               : c4::recv(p, bytes, c4::DataType::kUint8, peer, comm);
      if (!s.isOk()) {
        (void)c4::groupEnd();
        return s;
      }
    }
    return c4::groupEnd();
  };
  auto round = [&](int msgs) -> c4::Status {
    for (int done = 0; done < msgs;) {
      const int n = std::min(window, msgs - done);
      c4::Status b = batch(n);
      if (!b.isOk()) return b;
      done += n;
    }
    // The answer: rank 0's time covers delivery of the last message.
    return rank == 0 ? c4::recv(&ack, 1, c4::DataType::kUint8, peer, comm)
                     : c4::send(&ack, 1, c4::DataType::kUint8, peer, comm);
  };
  st = round(warmup);
  if (!st.isOk()) return fail(rank, "warm-up", st);
  const auto t0 = std::chrono::steady_clock::now();
  st = round(iters);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.isOk()) return fail(rank, "timed round", st);
  if (rank == 1 && distinct) {
    // Every byte of the last window is rank 0's pattern.
    for (char c : buf)
      if (c != 1) return fail(rank, "check", c4::Status(c4::Code::kInternalError, "received data differs"));
  } else if (rank == 0) {
    printf("c4-p2p-bw: %zu B x %d (window %d): %.2f MB/s (MB = 2^20 B, as ucx_perftest)\n", bytes, iters, window,
           static_cast<double>(bytes) * iters / secs / (1 << 20));
  }
  (void)c4::commDestroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? parseSize(argv[1]) : (4u << 20);
  const int iters = argc > 2 ? atoi(argv[2]) : 200;
  const int window = argc > 3 ? atoi(argv[3]) : 16;
  const int warmup = argc > 4 ? atoi(argv[4]) : 20;
  if (bytes == 0 || iters < 1 || window < 1 || warmup < 0) {
    fprintf(stderr, "usage: c4-p2p-bw [bytes=4M] [iters=200] [window=16] [warmup=20]\n");
    return 2;
  }
  // Rank 0's process makes the id after the fork (no thread exists when it forks), and hands it on.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    close(fds[1]);
    c4::UniqueId id;
    if (read(fds[0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(1);
    _exit(runRank(1, id, bytes, iters, window, warmup));
  }
  close(fds[0]);
  c4::UniqueId id;
  c4::Status st = c4::getUniqueId(&id);
  if (!st.isOk() || write(fds[1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    kill(child, SIGKILL);
    return fail(0, "unique id", st);
  }
  close(fds[1]);
  int rc = runRank(0, id, bytes, iters, window, warmup);
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
