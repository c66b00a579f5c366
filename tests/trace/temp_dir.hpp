// Temporary directories for the tracer's tests, removed with their files when the test process
// exits (not when one of its forked ranks does).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace c4test {

struct TempDirs {
  pid_t owner = getpid();
  std::vector<std::string> dirs;
  ~TempDirs() {
    if (getpid() != owner) return;
    for (const std::string& d : dirs)
      nftw(
          d.c_str(), [](const char* path, const struct stat*, int, FTW*) { return ::remove(path); }, 16,
          FTW_DEPTH | FTW_PHYS);
  }
};

/// A fresh directory /tmp/<prefix>-XXXXXX (or /tmp if none can be made).
inline std::string tempDir(const char* prefix) {
  static TempDirs dirs;
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  if (!mkdtemp(&tmpl[0])) return "/tmp";
  dirs.dirs.push_back(tmpl);
  return tmpl;
}

}  // namespace c4test
