#include "common/process.hpp"

#include <pthread.h>
#include <sys/stat.h>

#include <atomic>
#include <mutex>
#include <random>

namespace c4 {

namespace {

std::atomic<uint64_t> gToken{0};

// A child of fork() is another process: it draws its own token at first use.
void forgetTokenInChild() { gToken.store(0, std::memory_order_relaxed); }

}  // namespace

uint64_t processToken() {
  uint64_t t = gToken.load(std::memory_order_acquire);
  if (t != 0) return t;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, forgetTokenInChild); });
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  if (v == 0) v = 1;
  // Threads racing here agree on the first one stored.
  return gToken.compare_exchange_strong(t, v, std::memory_order_acq_rel) ? v : t;
}

uint64_t pidNamespaceId() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace c4
