// Multi-rank test harnesses: ranks as forked processes (real processes, real shared memory and
// sockets) or as threads of this process. A rank body returns a list of failure descriptions; the
// harness collects them so the test prints what went wrong on which rank.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace c4test {

/// Failures of one rank (empty: passed).
using Failures = std::vector<std::string>;
using RankBody = std::function<Failures(int rank, int nranks, const c4::UniqueId& id)>;

struct RankOutcome {
  int rank = 0;
  bool crashed = false;  // killed by a signal, hung past the deadline, or exited non-zero
  std::string detail;    // failures or the reason for a crash
};

/// Sets an environment variable for the lifetime of the object (forked children inherit it).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

inline int64_t monoMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

/// Runs `body` in `n` forked processes. Rank 0 creates the unique id (so its process hosts the
/// bootstrap root, as under a real launcher) and hands it to the others through pipes: the test
/// process itself starts no thread before it forks. A rank that has not exited after
/// `timeoutSec` is killed and reported as hung (a test must never hang the suite). With
/// `makeId` false no rank makes one (the body gets an all-zero id): a body that forks again must
/// do so before any thread starts, and makes its id after.
inline std::vector<RankOutcome> runForked(int n, const RankBody& body, int timeoutSec = 240, bool makeId = true) {
  std::vector<RankOutcome> out(static_cast<size_t>(n));
  std::vector<pid_t> pids(static_cast<size_t>(n));
  std::vector<int> fds(static_cast<size_t>(n));
  std::vector<int> idRead(static_cast<size_t>(n), -1), idWrite(static_cast<size_t>(n), -1);
  for (int r = 1; r < n; ++r) {
    int q[2];
    if (pipe(q) != 0) abort();
    idRead[static_cast<size_t>(r)] = q[0];
    idWrite[static_cast<size_t>(r)] = q[1];
  }
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) abort();
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      c4::UniqueId id;
      Failures f;
      bool haveId = true;
      if (!makeId) {
        memset(static_cast<void*>(&id), 0, sizeof(id));
      } else if (r == 0) {
        c4::Status st = c4::getUniqueId(&id);
        if (!st.isOk()) {
          f.push_back("getUniqueId: " + st.toString());
          haveId = false;
        }
        for (int k = 1; k < n; ++k) {
          // An all-zero id tells the others that rank 0 failed.
          c4::UniqueId sendId = id;
          if (!haveId) memset(&sendId, 0, sizeof(sendId));
          ssize_t w = write(idWrite[static_cast<size_t>(k)], &sendId, sizeof(sendId));
          (void)w;
        }
      } else {
        size_t got = 0;
        while (got < sizeof(id)) {
          ssize_t k = read(idRead[static_cast<size_t>(r)], reinterpret_cast<char*>(&id) + got, sizeof(id) - got);
          if (k <= 0) break;
          got += static_cast<size_t>(k);
        }
        static const c4::UniqueId kZero{};
        if (got != sizeof(id) || memcmp(&id, &kZero, sizeof(id)) == 0) {
          f.push_back("no unique id from rank 0");
          haveId = false;
        }
      }
      if (haveId) f = body(r, n, id);
      std::string text;
      for (const auto& s : f) text += s + "\n";
      size_t off = 0;
      while (off < text.size()) {
        ssize_t k = write(p[1], text.data() + off, text.size() - off);
        if (k <= 0) break;
        off += static_cast<size_t>(k);
      }
      close(p[1]);
      _exit(f.empty() ? 0 : 1);
    }
    close(p[1]);
    pids[static_cast<size_t>(r)] = pid;
    fds[static_cast<size_t>(r)] = p[0];
  }
  for (int r = 1; r < n; ++r) {
    close(idRead[static_cast<size_t>(r)]);
    close(idWrite[static_cast<size_t>(r)]);
  }
  // Drain the pipes while waiting so a chatty rank never blocks on a full pipe.
  int64_t deadline = monoMs() + static_cast<int64_t>(timeoutSec) * 1000;
  std::vector<bool> open(static_cast<size_t>(n), true);
  int openCount = n;
  while (openCount > 0 && monoMs() < deadline) {
    std::vector<pollfd> pfds;
    std::vector<int> which;
    for (int r = 0; r < n; ++r)
      if (open[static_cast<size_t>(r)]) {
        pfds.push_back(pollfd{fds[static_cast<size_t>(r)], POLLIN, 0});
        which.push_back(r);
      }
    if (poll(pfds.data(), pfds.size(), 200) <= 0) continue;
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = which[i];
      char buf[4096];
      ssize_t k = read(fds[static_cast<size_t>(r)], buf, sizeof(buf));
      if (k > 0) {
        out[static_cast<size_t>(r)].detail.append(buf, static_cast<size_t>(k));
      } else {
        open[static_cast<size_t>(r)] = false;
        --openCount;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    RankOutcome& o = out[static_cast<size_t>(r)];
    o.rank = r;
    if (open[static_cast<size_t>(r)]) {
      kill(pids[static_cast<size_t>(r)], SIGKILL);
      o.crashed = true;
      o.detail += "rank hung: killed after " + std::to_string(timeoutSec) + " s";
    }
    close(fds[static_cast<size_t>(r)]);
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    if (WIFSIGNALED(status) && !o.crashed) {
      o.crashed = true;
      o.detail += std::string("rank killed by signal ") + strsignal(WTERMSIG(status));
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && o.detail.empty()) {
      o.crashed = true;
      o.detail = "rank exited with status " + std::to_string(WEXITSTATUS(status));
    }
  }
  return out;
}

/// Runs `body` in `n` threads of this process.
inline std::vector<RankOutcome> runThreads(int n, const RankBody& body) {
  c4::UniqueId id;
  std::vector<RankOutcome> out(static_cast<size_t>(n));
  if (!c4::getUniqueId(&id).isOk()) {
    out[0].crashed = true;
    out[0].detail = "getUniqueId failed";
    return out;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Failures f = body(r, n, id);
      RankOutcome& o = out[static_cast<size_t>(r)];
      o.rank = r;
      for (const auto& s : f) o.detail += s + "\n";
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

/// Formats all outcomes; empty when every rank passed.
inline std::string summarize(const std::vector<RankOutcome>& outs) {
  std::string s;
  for (const auto& o : outs)
    if (o.crashed || !o.detail.empty()) s += "rank " + std::to_string(o.rank) + ":\n" + o.detail + "\n";
  return s;
}

}  // namespace c4test
