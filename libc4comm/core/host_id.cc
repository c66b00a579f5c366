// localHostId(): ranks with equal ids share a kernel, a boot and a network namespace, so they can
// use shared memory and loopback between them.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/params.hpp"
#include "common/siphash.hpp"
#include "core/bootstrap.hpp"

namespace c4 {

C4_PARAM_STR(HostId, "C4_HOSTID", nullptr, "", {}, kParamNone,
             "Override the host id: an integer (decimal or 0x hex) is used as is, any other string is hashed")

namespace {

const uint8_t kHostIdKey[16] = {'c', '4', 'c', 'o', 'm', 'm', '-', 'h', 'o', 's', 't', '-', 'i', 'd', '-', '1'};

uint64_t hashString(const std::string& s) { return sipHash24(kHostIdKey, s.data(), s.size()); }

std::string bootId() {
  std::string id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, id);
  return id;
}

unsigned long long nsInode(const char* path) {
  struct stat st;
  return ::stat(path, &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

}  // namespace

uint64_t localHostId() {
  std::string over = paramHostId();
  if (!over.empty()) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = strtoull(over.c_str(), &end, 0);
    if (errno == 0 && end != over.c_str() && *end == '\0' && over[0] != '-') return v;
    return hashString(over);
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  // Separators keep ("ab","c") and ("a","bc") apart.
  return hashString(std::string(host) + '\n' + bootId() + '\n' + std::to_string(nsInode("/proc/self/ns/net")));
}

uint64_t localClockId(int64_t skewNs) {
  return hashString("clock\n" + bootId() + '\n' + std::to_string(nsInode("/proc/self/ns/time")) + '\n' +
                    std::to_string(skewNs));
}

}  // namespace c4
