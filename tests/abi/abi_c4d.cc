// C4D through the NCCL ABI (docs/c4d.md): a program built against NVIDIA's nccl.h runs 3 ranks on
// our libnccl.so.2; rank 2 dies (C4_FAULT kill before collective 3). The survivors' ncclAllReduce
// must return ncclRemoteError or ncclSystemError, ncclGetLastError must carry the diagnosis
// ("[C4D dead_rank" naming rank 2), ncclCommGetAsyncError must report the error, and ncclCommAbort
// must return. Exit 0 on success.
#include C4_NVIDIA_NCCL_H

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int runRank(int rank, int n, const ncclUniqueId& id) {
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(nullptr));
    return 1;
  }
  std::vector<float> buf(1 << 16, 1.0f);
  ncclResult_t r = ncclSuccess;
  for (int k = 0; k < 10 && r == ncclSuccess; ++k)
    r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
  int bad = 0;
  if (r != ncclRemoteError && r != ncclSystemError) {
    fprintf(stderr, "rank %d: ncclAllReduce returned %d (%s), not a remote or system error\n", rank, r,
            ncclGetErrorString(r));
    bad = 1;
  }
  const char* last = ncclGetLastError(comm);
  if (last == nullptr || strstr(last, "[C4D dead_rank") == nullptr || strstr(last, "rank 2") == nullptr) {
    fprintf(stderr, "rank %d: ncclGetLastError has no dead_rank diagnosis naming rank 2: %s\n", rank,
            last ? last : "(null)");
    bad = 1;
  }
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) {
    fprintf(stderr, "rank %d: ncclCommGetAsyncError reported %d\n", rank, async);
    bad = 1;
  }
  if (ncclCommAbort(comm) != ncclSuccess) bad = 1;
  if (!bad) printf("rank %d: %s\n", rank, last);
  return bad;
}

}  // namespace

int main() {
  setenv("C4_FAULT", "kill:rank=2,op=3", 1);
  setenv("C4_TIMEOUT", "20", 1);
  const int n = 3;
  // Rank 0's process makes the id (and so hosts the bootstrap root) and hands it to the others
  // through pipes: this process starts no thread before it forks (a child of a threaded process
  // may inherit a lock some thread held, e.g. the allocator's under ASan, and hang).
  int pipes[n][2];
  for (int r = 1; r < n; ++r)
    if (pipe(pipes[r]) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      ncclUniqueId id;
      if (r == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(1);
        for (int k = 1; k < n; ++k)
          if (write(pipes[k][1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(1);
      } else if (read(pipes[r][0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
        _exit(1);
      }
      fflush(stdout);
      int rc = runRank(r, n, id);
      fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    const bool ok =
        r == 2 ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
      fprintf(stderr, "rank %d: wait status %d\n", r, status);
      ++failed;
    }
  }
  printf("%s\n", failed ? "FAIL" : "PASS: the survivors' NCCL calls carry C4D's diagnosis");
  return failed ? 1 : 0;
}
