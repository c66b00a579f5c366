// common/: Status, the parameter registry, logging (level, subsystems, C4_DEBUG_FILE with %h/%p),
// and the operation signatures every message carries.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/logging.hpp"
#include "common/opsig.hpp"
#include "common/params.hpp"
#include "common/status.hpp"

namespace c4 {
namespace {

bool checkEven(const std::string& v, std::string* why) {
  if (v.size() % 2 == 0) return true;
  *why = "odd length";
  return false;
}

C4_PARAM_INT(TestInt, "C4_TEST_PARAM_INT", "NCCL_TEST_PARAM_INT", 7, 1, int64_t{4} << 20, kParamSameOnAllRanks,
             "test parameter")
C4_PARAM_INT(TestZero, "C4_TEST_PARAM_ZERO", nullptr, 0, 64, 128, kParamZeroToo, "test parameter")
C4_PARAM_STR(TestStr, "C4_TEST_PARAM_STR", nullptr, "dflt", {}, kParamNone, "test parameter")
C4_PARAM_STR(TestChoice, "C4_TEST_PARAM_CHOICE", "NCCL_TEST_PARAM_CHOICE", "a", "a|bb|c", kParamNone, "test parameter")
C4_PARAM_STR(TestCheck, "C4_TEST_PARAM_CHECK", nullptr, "", checkEven, kParamNone, "test parameter")

// Captures stderr, where the log goes (C4_DEBUG unset: only what is printed whatever the level),
// while `f` runs.
template <typename F>
std::string logOf(F f) {
  char path[] = "/tmp/c4-params-log-XXXXXX";
  int fd = mkstemp(path);
  unsetenv("C4_DEBUG");
  logReload();
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  f();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  return ss.str();
}

TEST(Status, OkIsCheapAndErrorsCarryTheirReason) {
  Status ok;
  EXPECT_TRUE(ok.isOk());
  EXPECT_EQ(ok.message(), "");
  EXPECT_EQ(ok.toString(), "ok");
  Status e = makeError(Code::kInvalidArgument, "count %d too large", 5);
  EXPECT_FALSE(e.isOk());
  EXPECT_EQ(e.code(), Code::kInvalidArgument);
  EXPECT_EQ(e.message(), "count 5 too large");
  EXPECT_EQ(e.toString(), "invalid argument: count 5 too large");
  Status copy = e;  // deep copy
  Status moved = std::move(e);
  EXPECT_EQ(copy.message(), moved.message());
  EXPECT_TRUE(e.isOk());  // NOLINT(bugprone-use-after-move): a moved-from Status is ok
  copy = ok;
  EXPECT_TRUE(copy.isOk());
  // A success code never stores a reason.
  EXPECT_TRUE(Status(Code::kSuccess, "ignored").message().empty());
  EXPECT_NE(sysError("open", ENOENT).message().find("No such file"), std::string::npos);
  std::string big(2000, 'x');
  EXPECT_EQ(strFormat("%s", big.c_str()).size(), 2000u);  // longer than the stack buffer
}

TEST(Params, EnvAliasesSuffixesAndBadValues) {
  unsetenv("C4_TEST_PARAM_INT");
  unsetenv("NCCL_TEST_PARAM_INT");
  EXPECT_EQ(paramTestInt(), 7);
  setenv("NCCL_TEST_PARAM_INT", "9", 1);
  EXPECT_EQ(paramTestInt(), 9);  // the NCCL name is honored
  setenv("C4_TEST_PARAM_INT", "4K", 1);
  EXPECT_EQ(paramTestInt(), 4096);  // the C4 name wins; K/M/G suffixes
  setenv("C4_TEST_PARAM_INT", "2M", 1);
  EXPECT_EQ(paramTestInt(), 2 << 20);
  setenv("C4_TEST_PARAM_INT", "0x10", 1);
  EXPECT_EQ(paramTestInt(), 16);
  setenv("C4_TEST_PARAM_INT", "12abc", 1);
  EXPECT_EQ(paramTestInt(), 7);  // not a number: default (and a warning)
  // Blanks around a number, before or after, are taken alike (" 5" passed, "5 " did not).
  setenv("C4_TEST_PARAM_INT", " 5", 1);
  EXPECT_EQ(paramTestInt(), 5);
  setenv("C4_TEST_PARAM_INT", "5 ", 1);
  EXPECT_EQ(paramTestInt(), 5);
  setenv("C4_TEST_PARAM_INT", " 5K\t", 1);
  EXPECT_EQ(paramTestInt(), 5120);
  setenv("C4_TEST_PARAM_INT", "0x7fffffffffffffffG", 1);
  EXPECT_EQ(paramTestInt(), 7);  // the suffix would overflow
  unsetenv("C4_TEST_PARAM_INT");
  unsetenv("NCCL_TEST_PARAM_INT");
  EXPECT_EQ(paramTestStr(), "dflt");
  setenv("C4_TEST_PARAM_STR", "v", 1);
  EXPECT_EQ(paramTestStr(), "v");
  unsetenv("C4_TEST_PARAM_STR");
  bool listed = false;
  for (const ParamInfo* p : allParams()) listed |= std::string(p->env) == "C4_TEST_PARAM_INT";
  EXPECT_TRUE(listed);
}

// Every setting is validated when read; a refused value is reported at the default log
// level (once per value), never silently ignored, and invalidParams() lists it for init to fail on.
TEST(Params, RangesChoicesAndChecksAreEnforcedAndReportedWhateverTheLogLevel) {
  const ParamInfo* pi = findParam("C4_TEST_PARAM_INT");
  ASSERT_NE(pi, nullptr);
  EXPECT_EQ(findParam("NCCL_TEST_PARAM_INT"), pi);
  EXPECT_EQ(paramRangeText(*pi), "1..4194304");
  EXPECT_EQ(paramRangeText(*findParam("C4_TEST_PARAM_ZERO")), "0 or 64..128");
  EXPECT_EQ(paramRangeText(*findParam("C4_TEST_PARAM_CHOICE")), "a|bb|c");
  EXPECT_EQ(paramProblem(*pi, "0"), "out of range 1..4194304");
  EXPECT_EQ(paramProblem(*pi, "5M"), "out of range 1..4194304");
  EXPECT_EQ(paramProblem(*pi, "4M"), "");
  EXPECT_EQ(paramProblem(*pi, "abc"), "not an integer");
  EXPECT_EQ(paramProblem(*pi, ""), "not an integer");
  EXPECT_EQ(paramProblem(*findParam("C4_TEST_PARAM_ZERO"), "0"), "");
  EXPECT_EQ(paramProblem(*findParam("C4_TEST_PARAM_ZERO"), "1"), "out of range 0 or 64..128");
  EXPECT_EQ(paramProblem(*findParam("C4_TEST_PARAM_CHOICE"), "b"), "expected one of a|bb|c");
  EXPECT_EQ(paramProblem(*findParam("C4_TEST_PARAM_CHOICE"), "BB"), "expected one of a|bb|c");
  EXPECT_EQ(paramProblem(*findParam("C4_TEST_PARAM_CHECK"), "abc"), "odd length");

  std::string log = logOf([] {
    setenv("C4_TEST_PARAM_INT", "0", 1);
    EXPECT_EQ(paramTestInt(), 7);
    EXPECT_EQ(paramTestInt(), 7);  // reported once
    setenv("C4_TEST_PARAM_CHOICE", "zz", 1);
    EXPECT_EQ(paramTestChoice(), "a");
    setenv("C4_TEST_PARAM_CHOICE", "bb", 1);
    EXPECT_EQ(paramTestChoice(), "bb");
    setenv("C4_TEST_PARAM_CHECK", "odd", 1);
    EXPECT_EQ(paramTestCheck(), "");
    setenv("C4_TEST_PARAM_ZERO", "1", 1);
    EXPECT_EQ(paramTestZero(), 0);
  });
  // Set by its C4_ name, a refused value makes init fail: the warning says that, and nothing about
  // a default (it said "using the default", then init failed anyway).
  EXPECT_NE(log.find("c4 WARN refusing C4_TEST_PARAM_INT=0: out of range 1..4194304; communicator init fails while "
                     "it is set (docs/params.md)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("using the default"), std::string::npos) << log;
  EXPECT_EQ(log.find("C4_TEST_PARAM_INT=0"), log.rfind("C4_TEST_PARAM_INT=0")) << log;
  EXPECT_NE(log.find("refusing C4_TEST_PARAM_CHOICE=zz: expected one of a|bb|c;"), std::string::npos) << log;
  EXPECT_NE(log.find("refusing C4_TEST_PARAM_CHECK=odd: odd length"), std::string::npos) << log;
  EXPECT_NE(log.find("refusing C4_TEST_PARAM_ZERO=1: out of range 0 or 64..128"), std::string::npos) << log;
  // By its NCCL_ alias (NVIDIA's library may take the value): ignored, the default used.
  log = logOf([] {
    unsetenv("C4_TEST_PARAM_INT");
    setenv("NCCL_TEST_PARAM_INT", "-5", 1);
    EXPECT_EQ(paramTestInt(), 7);
    unsetenv("NCCL_TEST_PARAM_INT");
  });
  EXPECT_NE(log.find("ignoring NCCL_TEST_PARAM_INT=-5: out of range 1..4194304; using the default 7"),
            std::string::npos)
      << log;

  // invalidParams: set by the C4_ name, fatal; by the NCCL alias, a warning.
  setenv("C4_TEST_PARAM_CHOICE", "zz", 1);
  unsetenv("C4_TEST_PARAM_ZERO");
  unsetenv("C4_TEST_PARAM_CHECK");
  unsetenv("C4_TEST_PARAM_INT");
  setenv("NCCL_TEST_PARAM_INT", "-3", 1);
  bool sawChoice = false, sawNccl = false;
  for (const ParamIssue& i : invalidParams()) {
    if (i.setBy == "C4_TEST_PARAM_CHOICE") {
      sawChoice = true;
      EXPECT_TRUE(i.fatal);
      EXPECT_EQ(describe(i), "C4_TEST_PARAM_CHOICE=zz: expected one of a|bb|c (docs/params.md)");
    }
    if (i.setBy == "NCCL_TEST_PARAM_INT") {
      sawNccl = true;
      EXPECT_FALSE(i.fatal);
    }
  }
  EXPECT_TRUE(sawChoice);
  EXPECT_TRUE(sawNccl);
  // The value in effect: parsed integers, the default for a refused value.
  EXPECT_EQ(paramEffective(*pi), "7");
  setenv("NCCL_TEST_PARAM_INT", "0x10", 1);
  EXPECT_EQ(paramEffective(*pi), "16");
  unsetenv("NCCL_TEST_PARAM_INT");
  unsetenv("C4_TEST_PARAM_CHOICE");
  EXPECT_EQ(paramEffective(*findParam("C4_TEST_PARAM_CHOICE")), "a");
}

// A refused C4_DEBUG is itself reported (the log level cannot be what hides it), without a
// deadlock between the logger's first use and the parameter's warning.
TEST(Params, RefusedLogLevelIsReported) {
  std::string log = logOf([] {
    setenv("C4_DEBUG", "LOUD", 1);
    logReload();
    EXPECT_FALSE(logEnabled(LogLevel::kWarn, kLogAll));
    unsetenv("C4_DEBUG");
  });
  EXPECT_NE(log.find("refusing C4_DEBUG=LOUD: expected VERSION, WARN, INFO, ABORT or TRACE"), std::string::npos) << log;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Logging, LevelsSubsystemsAndFileWithHostAndPid) {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string h(host);
  if (h.find('.') != std::string::npos) h = h.substr(0, h.find('.'));
  std::string dir = "/tmp/c4-log-test-" + std::to_string(getpid());
  std::string expect = dir + "." + h + "." + std::to_string(getpid()) + ".log";
  setenv("C4_DEBUG", "INFO", 1);
  setenv("C4_DEBUG_SUBSYS", "INIT,COLL", 1);
  setenv("C4_DEBUG_FILE", (dir + ".%h.%p.log").c_str(), 1);
  logReload();
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogInit));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogShm));    // subsystem filtered out
  EXPECT_FALSE(logEnabled(LogLevel::kTrace, kLogInit));  // above the level
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kLogShm));     // warnings pass every filter
  C4_INFO(kLogInit, "hello %d", 42);
  C4_INFO(kLogShm, "filtered");
  C4_WARN(kLogNet, "a warning");
  setenv("C4_DEBUG_SUBSYS", "^INIT", 1);
  logReload();
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogInit));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogColl));
  unsetenv("C4_DEBUG");
  unsetenv("C4_DEBUG_SUBSYS");
  unsetenv("C4_DEBUG_FILE");
  logReload();
  std::string text = slurp(expect);
  EXPECT_NE(text.find("c4 INFO hello 42"), std::string::npos) << text;
  EXPECT_NE(text.find("c4 WARN a warning"), std::string::npos) << text;
  EXPECT_EQ(text.find("filtered"), std::string::npos) << text;
  EXPECT_NE(text.find(h + ":" + std::to_string(getpid())), std::string::npos) << text;
  unlink(expect.c_str());
  EXPECT_FALSE(logEnabled(LogLevel::kWarn, kLogAll));  // off again
}

// C4_DEBUG_FILE followed a symbolic link (fopen "a"), unlike the trace and diagnosis
// files: a predictable name such as /tmp/c4.%h.%p.log let another user point it anywhere. Now a
// link is not followed (the log goes to standard error, saying why), nor a FIFO opened; and %%
// is a percent sign.
TEST(Logging, TheLogFileIsNeverALinkAndPercentIsExpanded) {
  const std::string dir = "/tmp/c4-log-link-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string target = dir + "/victim", link = dir + "/c4.log";
  { std::ofstream(target) << "untouched\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  std::string log = logOf([&] {
    setenv("C4_DEBUG", "WARN", 1);
    setenv("C4_DEBUG_FILE", link.c_str(), 1);
    logReload();
    C4_WARN(kLogNet, "through the link?");
    unsetenv("C4_DEBUG_FILE");
    unsetenv("C4_DEBUG");
    logReload();
  });
  EXPECT_EQ(slurp(target), "untouched\n");
  EXPECT_NE(log.find("C4_DEBUG_FILE=" + link + ": is a symbolic link, not followed; logging to standard error"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("through the link?"), std::string::npos) << log;
  // A FIFO nobody reads: refused at once, not a hang.
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string why;
  EXPECT_EQ(openAppend(fifo, &why), -1);
  EXPECT_EQ(why, "is a FIFO nobody reads");
  // %% and the other patterns.
  EXPECT_EQ(expandPathPattern("a%%b.%p.%r.%x", 3), "a%b." + std::to_string(getpid()) + ".3.%x");
  EXPECT_EQ(expandPathPattern("%r", -1), "%r");
  const std::string pct = dir + "/x%%y.log";
  log = logOf([&] {
    setenv("C4_DEBUG", "WARN", 1);
    setenv("C4_DEBUG_FILE", pct.c_str(), 1);
    logReload();
    C4_WARN(kLogNet, "into x%%y");
    unsetenv("C4_DEBUG_FILE");
    unsetenv("C4_DEBUG");
    logReload();
  });
  EXPECT_NE(slurp(dir + "/x%y.log").find("into x%y"), std::string::npos);
  for (const char* f : {"/victim", "/c4.log", "/fifo", "/x%y.log"}) unlink((dir + f).c_str());
  rmdir(dir.c_str());
}

TEST(OpSig, MatchingDescriptionAndDifferences) {
  OpSig a;
  a.seq = 3;
  a.count = 1024;
  a.coll = static_cast<uint8_t>(Coll::kAllReduce);
  a.dtype = static_cast<uint8_t>(DataType::kFloat32);
  a.op = static_cast<uint8_t>(RedOp::kSum);
  OpSig b = a;
  EXPECT_TRUE(sigMatches(a, b));
  EXPECT_EQ(describeSig(a), "AllReduce seq 3 count 1024 float sum");
  b.count = 2048;
  b.dtype = static_cast<uint8_t>(DataType::kFloat16);
  EXPECT_FALSE(sigMatches(a, b));
  EXPECT_EQ(diffSigs(a, b), "count 1024 vs 2048; datatype float vs half");
  // Send matches Recv; two Sends do not.
  OpSig s = a, r = a;
  s.coll = static_cast<uint8_t>(Coll::kSend);
  r.coll = static_cast<uint8_t>(Coll::kRecv);
  EXPECT_TRUE(sigMatches(s, r));
  EXPECT_FALSE(sigMatches(s, s));
  OpSig bc = a;
  bc.coll = static_cast<uint8_t>(Coll::kBroadcast);
  bc.root = 2;
  EXPECT_EQ(describeSig(bc), "Broadcast seq 3 count 1024 float root 2");
}

}  // namespace
}  // namespace c4
