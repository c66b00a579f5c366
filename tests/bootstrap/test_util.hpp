// Helpers for the bootstrap tests: environment guards, thread ranks and forked ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "core/bootstrap.hpp"

namespace c4::test {

/// Sets / unsets environment variables for a scope and restores the previous values (and reloads
/// the log settings) on destruction.
class EnvGuard {
 public:
  EnvGuard() = default;
  ~EnvGuard();
  void set(const std::string& name, const std::string& value);
  void unset(const std::string& name);
  /// Unsets every launcher variable (torchrun, Open MPI, Slurm, C4_COMM_ID, ...).
  void clearLaunchVars();

 private:
  void remember(const std::string& name);
  std::map<std::string, std::pair<bool, std::string>> saved_;
};

/// A RankInfo for `rank` of this process.
RankInfo testRankInfo(int rank);

/// Runs fn(rank) on n threads and joins them.
void runThreads(int n, const std::function<void(int)>& fn);

/// Forks n children; child r runs fn(r) and exits with its return value (0 = success). Returns the
/// exit codes (-signal if killed; 124 if it had to be killed at timeoutMs).
std::vector<int> forkRanks(int n, int64_t timeoutMs, const std::function<int(int)>& fn);

/// Like forkRanks, but the parent makes a UniqueId (bootstrapGetUniqueId) after forking and hands
/// it to every child through a pipe (no fork while the root thread runs).
std::vector<int> forkRanksWithId(int n, int64_t timeoutMs, const std::function<int(int, const UniqueId&)>& fn);

/// Waits (up to timeoutMs) until no bootstrap root thread of this process is serving.
bool waitRootsGone(int64_t timeoutMs);

/// Deterministic test payload byte for (rank, index).
inline uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 131 + i * 7 + 1); }

}  // namespace c4::test
