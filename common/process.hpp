// Who this process is, as other processes of the host can tell.
//
// A pid names a process only within one pid namespace: two ranks of one host in two containers may
// both be pid 2, and rank 1's pid in its namespace may be a bystander's in rank 0's. So same-process
// questions use processToken(), and a peer's pid is used (/proc/<pid>, pidfd, CMA) only when its
// pidNamespaceId() equals this process's.
#pragma once

#include <cstdint>

namespace c4 {

/// A random 64-bit token of this process, never 0, the same on every thread: two ranks with equal
/// tokens are one process.
uint64_t processToken();

/// The inode of this process's pid namespace (0 if unknown): on one host, equal ids mean the pids
/// of the two processes name the same processes.
uint64_t pidNamespaceId();

}  // namespace c4
