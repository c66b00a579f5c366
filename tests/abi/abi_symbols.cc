// ABI symbol test: every function NVIDIA's nccl.h declares (found with a regex at test time) must be
// declared by our include/nccl.h, and, when a library is given, exported by it twice: as ncclXxx and
// as its profiling twin pncclXxx, the former an alias of the latter. Against the header of the NCCL
// version we match, ours declares nothing more; against an older one (--older) it may.
//
//   abi_symbols [--older] <nvidia nccl.h> <our nccl.h> [<libnccl.so.2>]
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

/// Base names (without the leading "p") of every `ncclResult_t ncclX(` / `const char* ncclX(`
/// declaration, plus the names declared only without (or only with) the "p" for the caller to see.
bool parseHeader(const std::string& path, std::set<std::string>* plain, std::set<std::string>* profiled) {
  std::ifstream in(path);
  if (!in) {
    fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  static const std::regex kDecl(R"((?:ncclResult_t|const\s+char\s*\*|void)\s*(p?nccl[A-Za-z0-9_]+)\s*\()");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kDecl); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    if (name[0] == 'p') {
      profiled->insert(name.substr(1));
    } else {
      plain->insert(name);
    }
  }
  return true;
}

bool gOlder = false;  // the reference header is older than ours: ours may declare more

int compareSets(const char* what, const std::set<std::string>& want, const std::set<std::string>& have) {
  int bad = 0;
  for (const auto& n : want) {
    if (!have.count(n)) {
      fprintf(stderr, "FAIL: %s: %s is missing\n", what, n.c_str());
      ++bad;
    }
  }
  for (const auto& n : have) {
    if (!gOlder && !want.count(n)) {
      fprintf(stderr, "FAIL: %s: %s is extra (not in NVIDIA's nccl.h)\n", what, n.c_str());
      ++bad;
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--older") {
    gOlder = true;
    --argc;
    ++argv;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s [--older] <nvidia nccl.h> <our nccl.h> [<libnccl.so.2>]\n", argv[0]);
    return 2;
  }
  std::set<std::string> nvPlain, nvProf, ourPlain, ourProf;
  if (!parseHeader(argv[1], &nvPlain, &nvProf) || !parseHeader(argv[2], &ourPlain, &ourProf)) return 1;
  // A regex that silently matched nothing would make the test vacuous: NCCL 2.28 has 40 functions
  // with these return types.
  if (nvPlain.size() < 35) {
    fprintf(stderr, "FAIL: only %zu declarations found in %s; the regex no longer fits the header\n", nvPlain.size(),
            argv[1]);
    return 1;
  }
  int bad = 0;
  {
    const bool older = gOlder;
    gOlder = false;  // NVIDIA's own pairs are always complete
    bad += compareSets("NVIDIA nccl.h nccl*/pnccl* pairs", nvPlain, nvProf);
    gOlder = older;
  }
  bad += compareSets("our nccl.h vs NVIDIA's (nccl*)", nvPlain, ourPlain);
  bad += compareSets("our nccl.h vs NVIDIA's (pnccl*)", nvProf, ourProf);
  printf("%zu functions declared by %s\n", nvPlain.size(), argv[1]);

  if (argc > 3) {
    void* lib = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      fprintf(stderr, "FAIL: dlopen(%s): %s\n", argv[3], dlerror());
      return 1;
    }
    for (const auto& n : nvPlain) {
      void* plain = dlsym(lib, n.c_str());
      void* prof = dlsym(lib, ("p" + n).c_str());
      if (plain == nullptr) fprintf(stderr, "FAIL: %s does not export %s\n", argv[3], n.c_str());
      if (prof == nullptr) fprintf(stderr, "FAIL: %s does not export p%s\n", argv[3], n.c_str());
      if (plain == nullptr || prof == nullptr) {
        ++bad;
      } else if (plain != prof) {
        fprintf(stderr, "FAIL: %s is not an alias of p%s (%p vs %p)\n", n.c_str(), n.c_str(), plain, prof);
        ++bad;
      }
    }
    // void ncclResetDebugInit() is not matched by the regex above but is part of the header too.
    if (dlsym(lib, "ncclResetDebugInit") == nullptr || dlsym(lib, "pncclResetDebugInit") == nullptr) {
      fprintf(stderr, "FAIL: ncclResetDebugInit/pncclResetDebugInit not exported\n");
      ++bad;
    }
    printf("checked %zu nccl*/pnccl* pairs in %s\n", nvPlain.size() + 1, argv[3]);
    dlclose(lib);
  }
  if (bad) {
    fprintf(stderr, "%d problem(s)\n", bad);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
