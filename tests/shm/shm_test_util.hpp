// Test harnesses for the shm transport: ranks as threads of this process (ThreadHub) or as forked
// processes (runForked, with an allGather relayed by the parent over socketpairs). Header-only so
// that bench/shm can reuse it.
#pragma once

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fdio.hpp"
#include "common/status.hpp"
#include "transports/idle.hpp"
#include "transports/transport.hpp"

namespace c4::transport::testing {

/// A fresh communicator tag (hex, unique per process and call).
inline std::string freshTag() {
  static std::atomic<int> counter{0};
  return strFormat("%x%04x%04x", static_cast<unsigned>(getpid()), counter.fetch_add(1) & 0xffff,
                   static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count() & 0xffff));
}

/// Names in /dev/shm that belong to communicator `tag`.
inline std::vector<std::string> shmLeftovers(const std::string& tag) {
  std::vector<std::string> out;
  std::string prefix = "c4shm-" + tag + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

/// In-process allGather/barrier for thread ranks.
class ThreadHub {
 public:
  explicit ThreadHub(int n) : n_(n) {}
  int size() const { return n_; }
  Status allGather(int rank, void* data, size_t bytesPerRank) {
    std::unique_lock<std::mutex> lk(mu_);
    if (buf_.size() < n_ * bytesPerRank) buf_.resize(n_ * bytesPerRank);
    memcpy(buf_.data() + rank * bytesPerRank, static_cast<char*>(data) + rank * bytesPerRank, bytesPerRank);
    barrierLocked(lk);
    memcpy(data, buf_.data(), n_ * bytesPerRank);
    barrierLocked(lk);
    return Status::ok();
  }

 private:
  void barrierLocked(std::unique_lock<std::mutex>& lk) {
    uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  std::vector<char> buf_;
};

class ThreadOob : public Oob {
 public:
  ThreadOob(ThreadHub* hub, int rank) : hub_(hub), rank_(rank) {}
  Status allGather(void* data, size_t bytesPerRank) override { return hub_->allGather(rank_, data, bytesPerRank); }
  Status barrier() override {
    std::vector<char> b(hub_->size());
    return hub_->allGather(rank_, b.data(), 1);
  }

 private:
  ThreadHub* hub_;
  int rank_;
};

using c4::readAll;
using c4::writeAll;

/// allGather through the parent process: send our slice, get everything back.
class ForkOob : public Oob {
 public:
  ForkOob(int fd, int rank, int n) : fd_(fd), rank_(rank), n_(n) {}
  Status allGather(void* data, size_t bytesPerRank) override {
    uint64_t b = bytesPerRank;
    if (!writeAll(fd_, &b, sizeof(b)) ||
        !writeAll(fd_, static_cast<char*>(data) + rank_ * bytesPerRank, bytesPerRank) ||
        !readAll(fd_, data, n_ * bytesPerRank))
      return makeError(Code::kRemoteError, "test oob: hub went away");
    return Status::ok();
  }
  Status barrier() override {
    std::vector<char> b(n_);
    return allGather(b.data(), 1);
  }

 private:
  int fd_, rank_, n_;
};

/// Forks n ranks running body(rank, oob) (its return value is the exit code), relays their
/// allGathers, and returns each rank's wait status. A rank that dies ends the relay; the others
/// then see their Oob fail. Each child is killed by alarm() after `limitSec`.
inline std::vector<int> runForked(int n, const std::function<int(int, Oob&)>& body, int limitSec = 120) {
  std::vector<int> parentFd(n), childFd(n);
  for (int r = 0; r < n; ++r) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
    parentFd[r] = sv[0];
    childFd[r] = sv[1];
  }
  fflush(nullptr);
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      for (int q = 0; q < n; ++q) {
        close(parentFd[q]);
        if (q != r) close(childFd[q]);
      }
      alarm(limitSec);
      int rc;
      {
        ForkOob oob(childFd[r], r, n);
        rc = body(r, oob);
      }
      fflush(nullptr);
      _exit(rc);
    }
    pids[r] = p;
  }
  for (int r = 0; r < n; ++r) close(childFd[r]);
  // Relay rounds until a rank disconnects (normally: all finished).
  while (true) {
    uint64_t bpr = 0;
    std::vector<char> all;
    bool ok = true;
    for (int r = 0; r < n && ok; ++r) {
      uint64_t b = 0;
      ok = readAll(parentFd[r], &b, sizeof(b));
      if (!ok) break;
      if (r == 0) {
        bpr = b;
        all.assign(n * bpr, 0);
      }
      ok = b == bpr && readAll(parentFd[r], all.data() + r * bpr, bpr);
    }
    if (!ok) break;
    for (int r = 0; r < n; ++r) writeAll(parentFd[r], all.data(), all.size());
  }
  for (int r = 0; r < n; ++r) close(parentFd[r]);
  std::vector<int> status(n, -1);
  for (int r = 0; r < n; ++r) {
    int st = 0;
    if (C4_SYSCALL_RETRY(waitpid(pids[r], &st, 0)) == pids[r]) status[r] = st;
  }
  return status;
}

/// Runs n thread ranks of body(rank, oob).
inline void runThreads(int n, const std::function<void(int, Oob&)>& body) {
  ThreadHub hub(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      ThreadOob oob(&hub, r);
      body(r, oob);
    });
  for (auto& t : th) t.join();
}

/// Same-host context for rank r of n.
inline Context makeContext(int rank, int n, const std::string& tag, Oob* oob, int64_t timeoutMs = 60000) {
  Context c;
  c.rank = rank;
  c.nranks = n;
  c.commTag = tag;
  c.hostIds.assign(n, 42);
  c.pids.assign(n, 0);
  c.oob = oob;
  c.timeoutMs = timeoutMs;
  return c;
}

/// Drives progress() until every request is done or one failed, with waitHint() back-off.
/// Returns the first failure (request error or progress() error), or a timeout error.
inline Status waitAll(Transport* t, const std::vector<Request*>& reqs, int64_t limitMs = 60000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limitMs);
  int idle = 0;
  size_t lastDone = 0;
  while (true) {
    Status st = t->progress();
    size_t done = 0;
    for (Request* r : reqs) {
      if (r->state == Request::kFailed) return r->error;
      done += r->state == Request::kDone;
    }
    if (done == reqs.size()) return Status::ok();
    if (!st.isOk()) return st;
    if (done != lastDone) {
      idle = 0;
      lastDone = done;
    }
    waitHint(idle++);
    if (std::chrono::steady_clock::now() > deadline)
      return makeError(Code::kInternalError, "test: waitAll timed out (%zu of %zu done)", done, reqs.size());
  }
}

/// A deterministic byte pattern for message `index` from `src` to `dst`.
inline void fillPattern(void* p, size_t bytes, uint32_t seed) {
  auto* c = static_cast<unsigned char*>(p);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    c[i] = static_cast<unsigned char>(x >> 24);
  }
}
inline bool checkPattern(const void* p, size_t bytes, uint32_t seed) {
  std::vector<unsigned char> ref(bytes);
  fillPattern(ref.data(), bytes, seed);
  return bytes == 0 || memcmp(ref.data(), p, bytes) == 0;
}

inline OpSig testSig(uint64_t seq, uint64_t count, Coll coll = Coll::kAllReduce, DataType dt = DataType::kUint8) {
  OpSig s;
  s.seq = seq;
  s.count = count;
  s.coll = static_cast<uint8_t>(coll);
  s.dtype = static_cast<uint8_t>(dt);
  s.op = 0;
  s.root = -1;
  return s;
}

/// Sets an environment variable for the scope (transport params are read when a transport is made).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    if (old) old_ = old, hadOld_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (hadOld_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool hadOld_ = false;
};

/// A rank's test body: "" on success, else what went wrong (see REQUIRE / REQUIRE_OK).
using Body = std::function<std::string(int rank, Oob& oob)>;

}  // namespace c4::transport::testing

// In a Body: return the formatted reason when a condition or a Status fails.
#define REQUIRE(cond, ...)                            \
  do {                                                \
    if (!(cond)) return ::c4::strFormat(__VA_ARGS__); \
  } while (0)
#define REQUIRE_OK(expr)                                                            \
  do {                                                                              \
    ::c4::Status s_ = (expr);                                                       \
    if (!s_.isOk()) return ::c4::strFormat("%s: %s", #expr, s_.toString().c_str()); \
  } while (0)

namespace c4::transport::testing {

/// The receiving side of a mismatch test (rank 1 sent `bytes` under testSig(5, bytes)): posts a
/// receive that differs in the signature's count (`kind` 0) or in its size (1), and checks that it
/// fails with kInvalidUsage naming both ranks and the difference, and that the broken connection
/// refuses later receives. "" on success, else what went wrong.
inline std::string receiveMismatched(Transport* t, Connection* c, size_t bytes, int kind) {
  std::vector<char> buf(bytes + 64);
  const OpSig expected = testSig(5, kind == 0 ? bytes + 1 : bytes);
  const size_t want = kind == 0 ? bytes : bytes + 64;
  Request req;
  REQUIRE_OK(c->irecv(buf.data(), want, expected, nullptr, &req));
  Status w = waitAll(t, {&req});
  REQUIRE(w.code() == Code::kInvalidUsage, "receiver got %s", w.toString().c_str());
  REQUIRE(req.state == Request::kFailed, "request not failed");
  const std::string& m = w.message();
  auto has = [&m](const std::string& s) { return m.find(s) != std::string::npos; };
  REQUIRE(has("rank 1") && has("rank 0"), "%s", m.c_str());
  if (kind == 0)
    REQUIRE(has("count"), "signature difference not named: %s", m.c_str());
  else
    REQUIRE(has(strFormat("%zu bytes", bytes)) && has(strFormat("%zu bytes", want)), "sizes not named: %s", m.c_str());
  Request again;
  REQUIRE(!c->irecv(buf.data(), 8, testSig(6, 8), nullptr, &again).isOk(), "broken connection accepted irecv");
  REQUIRE(again.state == Request::kFailed, "second request not failed");
  return "";
}

}  // namespace c4::transport::testing
