// Shareable host memory (c4::memAlloc, ncclMemAlloc) and the mappings of other ranks' memory.
//
// memAlloc backs each allocation with its own memfd mapped MAP_SHARED, and records it in a
// process-wide registry. A rank of the same host maps a peer's allocation by opening
// /proc/<pid>/fd/<fd> (the same check as reading /proc/<pid>/mem, weaker than CMA's), so
// collectives on such buffers can read and write the peers' buffers directly (core/zerocopy.hpp).
// Ranks of one process find each other's allocations in the registry and use them in place.
//
// What is opened is checked before it is mapped: the fd number may have been closed and reused
// (the peer freed the buffer, then opened a file), and the pid may name another process (the peer
// exited and its pid was reused, or it lives in another pid namespace). Each memfd is named after
// its process's token and its allocation id ("c4comm-mem:<token>:<id>") and sealed against
// shrinking, so a mapping is made only of a file that is that very allocation, and a peer's
// mapping can never turn into SIGBUS. A pid is only used where the owner's pid namespace is ours.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>

#include "c4comm/status.hpp"

namespace c4 {

/// The process that owns an allocation, as a rank of this host sees it.
struct PeerProcess {
  int32_t pid = 0;       // usable here (same host and pid namespace), else 0
  uint64_t process = 0;  // its processToken()
};

/// Where a buffer lies inside a shareable allocation.
struct MemRef {
  uint64_t id = 0;   // process-unique allocation id (never reused); 0: not shareable
  int32_t fd = -1;   // the allocation's memfd in its owner's process
  uint64_t off = 0;  // offset of the buffer in the allocation
};

/// Allocates `size` bytes (rounded up to a page) of zeroed, page-aligned, shareable memory.
/// `internal`: the library's own (a probe page), not counted by memUserAllocations().
Status memAllocShared(void** ptr, size_t size, bool internal = false);
/// Frees what memAllocShared returned; anything else is kInvalidArgument.
Status memFreeShared(void* ptr);
/// True if [p, p + len) lies inside one live allocation of this process; fills *ref.
bool memLookup(const void* p, size_t len, MemRef* ref);
/// False while the program holds no shareable memory (the library's own probe pages do not count):
/// collectives then skip the lookups.
bool memUserAllocations();
/// Base address of allocation `id` of this process, or null if it is not live.
char* memLocalBase(uint64_t id, size_t* size);

/// One rank's cache of the allocations of other processes that it mapped, least recently used
/// first out. Not thread-safe (one per communicator; collectives of a communicator are serial).
class PeerMappings {
 public:
  explicit PeerMappings(size_t capacity = 32) : capacity_(capacity) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  /// The address of [ref.off, ref.off + len) of allocation ref.id of process `owner` (this process:
  /// in place). Maps the allocation on first use, once the file behind the owner's fd proves to be
  /// that allocation (else kRemoteError: it was freed, or the pid names another process).
  Status resolve(const PeerProcess& owner, const MemRef& ref, size_t len, char** out);
  size_t size() const { return maps_.size(); }

 private:
  struct Map {
    uint64_t process;
    uint64_t id;
    char* base;
    size_t bytes;
  };
  std::list<Map> maps_;  // most recently used first
  size_t capacity_;
};

}  // namespace c4
