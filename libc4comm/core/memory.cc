#include "core/memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/logging.hpp"
#include "common/process.hpp"
#include "common/status.hpp"

namespace c4 {

namespace {

struct Alloc {
  size_t bytes;
  uint64_t id;
  int fd;
  bool internal;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Alloc> byBase;
  std::map<uint64_t, uintptr_t> byId;
  uint64_t nextId = 1;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: buffers may be freed during exit
  return *r;
}

// The program's live allocations (not the library's probe pages): while 0, collectives skip the
// lookups (memUserAllocations).
std::atomic<size_t> liveUserAllocs{0};

size_t pageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

/// The name of allocation `id` of the process with token `process` (what memfd_create is given).
std::string memfdName(uint64_t process, uint64_t id) {
  char name[64];
  snprintf(name, sizeof name, "c4comm-mem:%016llx:%llu", static_cast<unsigned long long>(process),
           static_cast<unsigned long long>(id));
  return name;
}

/// Ok if `fd` (opened from a peer's /proc/<pid>/fd/<n>) is allocation `id` of process `process`:
/// a memfd of that name, sealed against shrinking. Else why not.
Status checkIdentity(int fd, uint64_t process, uint64_t id, const char* path) {
  char link[64], target[256];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  target[n > 0 ? n : 0] = 0;
  // A memfd reads "/memfd:<name> (deleted)".
  const std::string want = "/memfd:" + memfdName(process, id) + " (deleted)";
  if (want != target)
    return makeError(Code::kRemoteError,
                     "%s is not the peer's buffer (allocation %llu) but %s: the peer freed it (or its process is "
                     "gone and the pid names another); nothing was written",
                     path, static_cast<unsigned long long>(id), target[0] ? target : "unknown");
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return makeError(Code::kRemoteError, "%s (allocation %llu) is not sealed against shrinking; not mapped", path,
                     static_cast<unsigned long long>(id));
  return Status::ok();
}

}  // namespace

Status memAllocShared(void** ptr, size_t size, bool internal) {
  if (!ptr) return makeError(Code::kInvalidArgument, "memAlloc: ptr is NULL");
  if (size == 0) return makeError(Code::kInvalidArgument, "memAlloc: size is 0");
  const size_t page = pageSize();
  if (size > SIZE_MAX - page) return makeError(Code::kInvalidArgument, "memAlloc: size %zu is too large", size);
  const size_t bytes = (size + page - 1) / page * page;
  Registry& r = registry();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    id = r.nextId++;  // never reused, even if this allocation fails
  }
  const std::string name = memfdName(processToken(), id);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 && errno == EMFILE) {
    // Every allocation holds its memfd: raise the soft limit on open files to the hard one (as
    // runtimes that hold many descriptors do) and try once more.
    rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      const rlim_t was = lim.rlim_cur;
      lim.rlim_cur = lim.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &lim) == 0) {
        C4_INFO(kLogAlloc, "memAlloc: raised the open-file limit from %llu to %llu (one per allocation)",
                static_cast<unsigned long long>(was), static_cast<unsigned long long>(lim.rlim_cur));
        fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
      }
    }
  }
  if (fd < 0) {
    const int e = errno;
    return makeError(Code::kSystemError, "memAlloc: memfd_create failed: %s%s", strerror(e),
                     e == EMFILE ? " (each allocation holds a file descriptor: allocate fewer, larger buffers, or "
                                   "raise ulimit -n)"
                                 : "");
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    close(fd);
    return makeError(Code::kSystemError, "memAlloc: sizing %zu bytes failed: %s", bytes, strerror(e));
  }
  // The size is final: a peer's mapping of it can never fault past the end (SIGBUS).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(fd);
    return makeError(Code::kSystemError, "memAlloc: sealing the allocation failed: %s", strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return makeError(Code::kSystemError, "memAlloc: mapping %zu bytes failed: %s", bytes, strerror(e));
  }
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.byBase[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, id, fd, internal};
    r.byId[id] = reinterpret_cast<uintptr_t>(p);
  }
  if (!internal) liveUserAllocs.fetch_add(1, std::memory_order_release);
  *ptr = p;
  return Status::ok();
}

Status memFreeShared(void* ptr) {
  if (!ptr) return makeError(Code::kInvalidArgument, "memFree: ptr is NULL");
  Registry& r = registry();
  Alloc a;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.byBase.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.byBase.end())
      return makeError(Code::kInvalidArgument, "memFree: %p was not returned by memAlloc (or was freed already)", ptr);
    a = it->second;
    r.byId.erase(a.id);
    r.byBase.erase(it);
  }
  if (!a.internal) liveUserAllocs.fetch_sub(1, std::memory_order_release);
  munmap(ptr, a.bytes);
  close(a.fd);
  return Status::ok();
}

bool memLookup(const void* p, size_t len, MemRef* ref) {
  if (!p) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.byBase.upper_bound(a);
  if (it == r.byBase.begin()) return false;
  --it;
  const uintptr_t off = a - it->first;
  if (off >= it->second.bytes || len > it->second.bytes - off) return false;
  ref->id = it->second.id;
  ref->fd = it->second.fd;
  ref->off = off;
  return true;
}

bool memUserAllocations() { return liveUserAllocs.load(std::memory_order_acquire) != 0; }

char* memLocalBase(uint64_t id, size_t* size) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.byId.find(id);
  if (it == r.byId.end()) return nullptr;
  *size = r.byBase.at(it->second).bytes;
  return reinterpret_cast<char*>(it->second);
}

PeerMappings::~PeerMappings() {
  for (const Map& m : maps_)
    if (m.process != processToken()) munmap(m.base, m.bytes);
}

Status PeerMappings::resolve(const PeerProcess& owner, const MemRef& ref, size_t len, char** out) {
  const bool self = owner.process == processToken();
  auto outOfRange = [&](const Map& m) -> Status {
    if (ref.off <= m.bytes && len <= m.bytes - ref.off) return Status::ok();
    return makeError(Code::kInvalidUsage, "zero-copy: %zu bytes at offset %llu exceed allocation %llu of pid %d", len,
                     static_cast<unsigned long long>(ref.off), static_cast<unsigned long long>(ref.id), owner.pid);
  };
  for (auto it = maps_.begin(); it != maps_.end(); ++it) {
    if (it->process != owner.process || it->id != ref.id) continue;
    C4_CHECK(outOfRange(*it));
    if (it != maps_.begin()) maps_.splice(maps_.begin(), maps_, it);
    *out = maps_.front().base + ref.off;
    return Status::ok();
  }
  Map m{owner.process, ref.id, nullptr, 0};
  if (self) {
    m.base = memLocalBase(ref.id, &m.bytes);
    if (!m.base)
      return makeError(Code::kInvalidUsage, "zero-copy: allocation %llu of this process is not live",
                       static_cast<unsigned long long>(ref.id));
  } else {
    if (owner.pid <= 0)
      return makeError(Code::kRemoteError,
                       "cannot map a buffer of another process whose pid this process cannot use (another pid "
                       "namespace, as in two containers of one host)");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", owner.pid, ref.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
      return makeError(Code::kSystemError, "zero-copy: cannot open %s (a peer's buffer): %s", path, strerror(errno));
    Status same = checkIdentity(fd, owner.process, ref.id, path);
    if (!same.isOk()) {
      close(fd);
      return same;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
      close(fd);
      return makeError(Code::kSystemError, "zero-copy: %s has no size", path);
    }
    m.bytes = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
      return makeError(Code::kSystemError, "zero-copy: mapping %zu bytes of %s failed: %s", m.bytes, path, strerror(e));
    m.base = static_cast<char*>(p);
  }
  Status range = outOfRange(m);
  if (!range.isOk()) {
    if (!self) munmap(m.base, m.bytes);
    return range;
  }
  maps_.push_front(m);
  while (maps_.size() > capacity_) {
    const Map& old = maps_.back();
    if (old.process != processToken()) munmap(old.base, old.bytes);
    C4_TRACE(kLogColl, "zero-copy: unmapped allocation %llu of process %016llx (cache full)",
             static_cast<unsigned long long>(old.id), static_cast<unsigned long long>(old.process));
    maps_.pop_back();
  }
  *out = m.base + ref.off;
  return Status::ok();
}

}  // namespace c4
