// Test helper: schedule files (docs/schedules.md) written from known algorithms, for the loader's
// tests (tests/sched) and the collective matrix over loaded schedules (tests/coll).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace c4::sched::test {

/// One step as the file writes it.
struct GenStep {
  const char* op;
  int peer;
  int chunk;
  std::vector<int> deps;
};

inline int gmod(int a, int n) { return ((a % n) + n) % n; }

/// The JSON text of a schedule file with `steps[r]` for rank r.
inline std::string scheduleJson(const std::string& name, const std::string& coll, int n, int chunks,
                                const std::vector<std::vector<GenStep>>& steps, const std::string& extra = "") {
  std::string s = "{\"format\": \"c4comm-schedule\", \"version\": 1, \"name\": \"" + name + "\", \"collective\": \"" +
                  coll + "\", \"nranks\": " + std::to_string(n) + ", \"chunks\": " + std::to_string(chunks) + extra +
                  ", \"ranks\": [";
  for (size_t r = 0; r < steps.size(); ++r) {
    s += r ? ", {\"steps\": [" : "{\"steps\": [";
    for (size_t i = 0; i < steps[r].size(); ++i) {
      const GenStep& g = steps[r][i];
      s += (i ? ", " : "") + std::string("{\"op\": \"") + g.op + "\", \"peer\": " + std::to_string(g.peer) +
           ", \"chunk\": " + std::to_string(g.chunk);
      if (!g.deps.empty()) {
        s += ", \"deps\": [";
        for (size_t k = 0; k < g.deps.size(); ++k) s += (k ? ", " : "") + std::to_string(g.deps[k]);
        s += "]";
      }
      s += "}";
    }
    s += "]}";
  }
  return s + "]}";
}

/// Ring allgather steps: at step k rank r forwards block r-k to r+1 and receives block r-k-1.
inline void ringAllGatherSteps(int n, int chunks, std::vector<std::vector<GenStep>>* steps) {
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < n - 1; ++k)
      for (int p = 0; p < chunks; ++p) {
        (*steps)[static_cast<size_t>(r)].push_back({"send", gmod(r + 1, n), gmod(r - k, n) * chunks + p, {}});
        (*steps)[static_cast<size_t>(r)].push_back({"recv", gmod(r - 1, n), gmod(r - k - 1, n) * chunks + p, {}});
      }
}

/// Ring reduce-scatter steps: block q's partial starts at rank q+1 and is complete at rank q.
inline void ringReduceScatterSteps(int n, int chunks, std::vector<std::vector<GenStep>>* steps) {
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < n - 1; ++k)
      for (int p = 0; p < chunks; ++p) {
        (*steps)[static_cast<size_t>(r)].push_back(
            {"send-partial", gmod(r + 1, n), gmod(r - 1 - k, n) * chunks + p, {}});
        (*steps)[static_cast<size_t>(r)].push_back(
            {"recv-reduce", gmod(r - 1, n), gmod(r - 2 - k, n) * chunks + p, {}});
      }
}

/// "allgather", "reducescatter" or "allreduce" (reduce-scatter, then allgather) as a ring file.
inline std::string ringFile(const std::string& coll, int n, int chunks, const std::string& name = "") {
  std::vector<std::vector<GenStep>> steps(static_cast<size_t>(n));
  if (coll != "allgather") ringReduceScatterSteps(n, chunks, &steps);
  if (coll != "reducescatter") ringAllGatherSteps(n, chunks, &steps);
  return scheduleJson(name.empty() ? "ring-" + coll + "-" + std::to_string(n) + "x" + std::to_string(chunks) : name,
                      coll, n, chunks, steps);
}

/// An allgather relayed through rank 0 (a star): every rank sends its block to 0, which forwards
/// each block to every other rank; 0's forwards carry explicit deps on their receives.
inline std::string starAllGatherFile(int n, int chunks) {
  std::vector<std::vector<GenStep>> steps(static_cast<size_t>(n));
  for (int r = 1; r < n; ++r)
    for (int p = 0; p < chunks; ++p) steps[0].push_back({"recv", r, r * chunks + p, {}});
  for (int b = 0; b < n; ++b)
    for (int d = 1; d < n; ++d) {
      if (d == b) continue;
      for (int p = 0; p < chunks; ++p) {
        std::vector<int> deps;
        if (b > 0) deps.push_back((b - 1) * chunks + p);
        steps[0].push_back({"send", d, b * chunks + p, deps});
      }
    }
  for (int r = 1; r < n; ++r) {
    for (int p = 0; p < chunks; ++p) steps[static_cast<size_t>(r)].push_back({"send", 0, r * chunks + p, {}});
    for (int b = 0; b < n; ++b)
      if (b != r)
        for (int p = 0; p < chunks; ++p) steps[static_cast<size_t>(r)].push_back({"recv", 0, b * chunks + p, {}});
  }
  return scheduleJson("star-allgather-" + std::to_string(n), "allgather", n, chunks, steps);
}

/// An alltoall file (chunk c: part c % chunks of block c / chunks = from * n + to). `relay` false:
/// the pairwise exchange of the built-in direct algorithm (at step k send to r+k, receive from
/// r-k). `relay` true: every block between two ranks other than 0 goes through rank 0, which
/// keeps it in scratch and forwards it (explicit deps on the receive that brought it).
inline std::string alltoallFile(int n, int chunks, bool relay, const std::string& name = "") {
  std::vector<std::vector<GenStep>> steps(static_cast<size_t>(n));
  auto chunk = [&](int from, int to, int p) { return (from * n + to) * chunks + p; };
  if (!relay) {
    for (int r = 0; r < n; ++r)
      for (int k = 1; k < n; ++k)
        for (int p = 0; p < chunks; ++p) {
          steps[static_cast<size_t>(r)].push_back({"send", (r + k) % n, chunk(r, (r + k) % n, p), {}});
          steps[static_cast<size_t>(r)].push_back({"recv", gmod(r - k, n), chunk(gmod(r - k, n), r, p), {}});
        }
  } else {
    std::vector<std::vector<int>> recvAt(static_cast<size_t>(n * n * chunks), std::vector<int>());
    // Rank 0 receives everything each rank sends it (its own blocks and the ones it relays), in
    // the order the sender lists them.
    for (int s = 1; s < n; ++s)
      for (int d = 0; d < n; ++d)
        for (int p = 0; p < chunks && d != s; ++p) {
          recvAt[static_cast<size_t>(chunk(s, d, p))].push_back(static_cast<int>(steps[0].size()));
          steps[0].push_back({"recv", s, chunk(s, d, p), {}});
        }
    for (int d = 1; d < n; ++d)
      for (int s = 0; s < n; ++s)
        for (int p = 0; p < chunks && s != d; ++p) {
          std::vector<int> deps = s == 0 ? std::vector<int>() : recvAt[static_cast<size_t>(chunk(s, d, p))];
          steps[0].push_back({"send", d, chunk(s, d, p), deps});
        }
    for (int r = 1; r < n; ++r) {
      for (int d = 0; d < n; ++d)
        for (int p = 0; p < chunks && d != r; ++p)
          steps[static_cast<size_t>(r)].push_back({"send", 0, chunk(r, d, p), {}});
      for (int s = 0; s < n; ++s)
        for (int p = 0; p < chunks && s != r; ++p)
          steps[static_cast<size_t>(r)].push_back({"recv", 0, chunk(s, r, p), {}});
    }
  }
  return scheduleJson(name.empty() ? std::string(relay ? "relay" : "pairwise") + "-alltoall-" + std::to_string(n) +
                                         "x" + std::to_string(chunks)
                                   : name,
                      "alltoall", n, chunks, steps);
}

/// Writes `text` to a fresh file under TMPDIR and returns its path.
inline std::string writeTemp(const std::string& text, const std::string& stem) {
  const char* dir = getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "-" + std::to_string(getpid()) + ".json";
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) return "";
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
  return path;
}

}  // namespace c4::sched::test
