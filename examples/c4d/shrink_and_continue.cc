// C4D example: a training loop that loses a rank, is told which one and why, shrinks the
// communicator without it and continues from its last state (docs/c4d.md).
//
//   c4d-shrink-example --spawn 4 --kill-rank 2 --kill-step 6 [--steps 20]
//       forks 4 ranks on this host; rank 2 dies (SIGKILL) at step 6
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. c4d-shrink-example [--kill-rank R ...]
//       one rank of a launched job (torchrun's variables, Open MPI's or Slurm's)
//
// The "model" is a vector of parameters every rank holds; each step every rank computes a gradient
// from its data shard, the ranks average the gradients with AllReduce and apply them. The state
// after the last good step (parameters and step number) is the checkpoint: all survivors hold the
// same one, because every step ends in the same AllReduce result. When a step fails, the error and
// c4::getDiagnoses name the culprit; the survivors exclude it with c4::commShrink, restore the
// checkpoint and redo the step with the ranks they have. Exit status 0 when the survivors finish
// with identical parameters.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "c4comm/c4comm.hpp"

namespace {

struct Options {
  int spawn = 0;
  int killRank = -1;
  int killStep = -1;
  int steps = 20;
  size_t params = 1 << 16;
};

// A gradient that depends on the step, the parameters and the data shard of this rank.
void gradient(const std::vector<float>& w, int step, int shard, std::vector<float>* g) {
  for (size_t i = 0; i < w.size(); ++i)
    g->at(i) = 0.01f * (w[i] - std::sin(0.001f * static_cast<float>(i + shard))) + 0.001f * step;
}

int train(c4::Comm* comm, const Options& o) {
  int rank = 0, n = 0;
  (void)c4::commUserRank(comm, &rank);
  (void)c4::commCount(comm, &n);
  const int myRank = rank;  // this process's rank in the first communicator (its data shard)
  std::vector<float> w(o.params, 1.0f), g(o.params);
  std::vector<float> ckptW = w;  // the last good state
  int ckptStep = 0;
  for (int step = 0; step < o.steps;) {
    if (myRank == o.killRank && step == o.killStep) {
      std::printf("rank %d: dying at step %d\n", myRank, step);
      std::fflush(stdout);
      raise(SIGKILL);
    }
    gradient(w, step, myRank, &g);
    c4::Status st = c4::allReduce(g.data(), g.data(), g.size(), c4::DataType::kFloat32, c4::RedOp::kSum, comm);
    if (st.isOk()) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= g[i] / static_cast<float>(n);
      ++step;
      ckptW = w;
      ckptStep = step;
      continue;
    }
    // The step failed: who is at fault, and why?
    std::printf("rank %d: step %d failed: %s\n", myRank, step, st.message().c_str());
    std::vector<c4::Diagnosis> ds;
    (void)c4::getDiagnoses(comm, &ds);
    std::vector<int> culprits;
    for (const c4::Diagnosis& d : ds) {
      if (d.kind != "dead_rank" && d.kind != "noncomm_hang" && d.kind != "comm_hang") continue;
      std::printf("rank %d: C4D says %s: %s (confidence %.0f%%)\n", myRank, d.kind.c_str(), d.summary.c_str(),
                  100 * d.confidence);
      if (d.kind != "comm_hang") culprits = d.ranks;  // a link fault has no rank to exclude
    }
    if (culprits.empty()) {
      std::printf("rank %d: no rank to exclude; giving up\n", myRank);
      (void)c4::commAbort(comm);
      return 1;
    }
    // Isolate and continue: a communicator of the survivors, the last good state, the same step.
    c4::Comm* smaller = nullptr;
    st = c4::commShrink(comm, culprits.data(), static_cast<int>(culprits.size()), &smaller);
    (void)c4::commAbort(comm);
    if (!st.isOk()) {
      std::printf("rank %d: shrink failed: %s\n", myRank, st.message().c_str());
      return 1;
    }
    comm = smaller;
    (void)c4::commUserRank(comm, &rank);
    (void)c4::commCount(comm, &n);
    w = ckptW;
    step = ckptStep;
    std::printf("rank %d: continues as rank %d of %d from step %d\n", myRank, rank, n, step);
  }
  // The survivors must agree: the largest and the smallest checksum over the ranks are equal.
  double sum = 0;
  for (float x : w) sum += x;
  double mx = sum, mn = sum;
  c4::Status a = c4::allReduce(&mx, &mx, 1, c4::DataType::kFloat64, c4::RedOp::kMax, comm);
  c4::Status b = c4::allReduce(&mn, &mn, 1, c4::DataType::kFloat64, c4::RedOp::kMin, comm);
  const bool same = a.isOk() && b.isOk() && mx == mn;
  std::printf("rank %d: finished %d steps with %d ranks, checksum %.6f (%s)\n", myRank, o.steps, n, sum,
              same ? "identical on every rank" : "RANKS DISAGREE");
  (void)c4::commDestroy(comm);
  return same ? 0 : 1;
}

int usage() {
  std::fprintf(stderr,
               "usage: c4d-shrink-example [--spawn N] [--kill-rank R --kill-step S] [--steps K] [--params P]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // forked ranks _exit: their lines must be out by then
  Options o;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int* v) {
      if (i + 1 >= argc) return false;
      *v = std::atoi(argv[++i]);
      return true;
    };
    int p = 0;
    if (!std::strcmp(argv[i], "--spawn")       ? !next(&o.spawn)
        : !std::strcmp(argv[i], "--kill-rank") ? !next(&o.killRank)
        : !std::strcmp(argv[i], "--kill-step") ? !next(&o.killStep)
        : !std::strcmp(argv[i], "--steps")     ? !next(&o.steps)
        : !std::strcmp(argv[i], "--params")    ? !(next(&p) && (o.params = static_cast<size_t>(p), true))
                                               : true)
      return usage();
  }
  if (o.spawn <= 0) {
    c4::Comm* comm = nullptr;
    c4::Status st = c4::commInitFromEnv(&comm);
    if (!st.isOk()) {
      std::fprintf(stderr, "init: %s\n", st.message().c_str());
      return 1;
    }
    return train(comm, o);
  }
  // --spawn: the ranks are forked children; rank 0's makes the id (and hosts the bootstrap root)
  // and hands it to the others through pipes, so that this process starts no thread before it
  // forks (a child of a threaded process may inherit a lock some thread held).
  std::vector<std::array<int, 2>> pipes(static_cast<size_t>(o.spawn));
  for (int r = 1; r < o.spawn; ++r)
    if (pipe(pipes[static_cast<size_t>(r)].data()) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < o.spawn; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      c4::UniqueId id;
      if (r == 0) {
        if (!c4::getUniqueId(&id).isOk()) _exit(1);
        for (int k = 1; k < o.spawn; ++k)
          if (write(pipes[static_cast<size_t>(k)][1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(1);
      } else if (read(pipes[static_cast<size_t>(r)][0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
        _exit(1);
      }
      c4::Comm* comm = nullptr;
      c4::Status st = c4::commInitRank(&comm, o.spawn, id, r);
      if (!st.isOk()) {
        std::fprintf(stderr, "rank %d: init: %s\n", r, st.message().c_str());
        _exit(1);
      }
      std::fflush(stdout);
      _exit(train(comm, o));
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (int r = 0; r < o.spawn; ++r) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (r == o.killRank ? !killed : !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) rc = 1;
  }
  std::printf("%s\n", rc == 0 ? "ok: the survivors shrank around the lost rank and finished" : "FAILED");
  return rc;
}
