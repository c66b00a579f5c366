// common/: Status, the parameter registry, logging (level, subsystems, C4_DEBUG_FILE with %h/%p),
// and the operation signatures every message carries.
#include <gtest/gtest.h>
#include <stdlib.h>
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

C4_PARAM_INT(TestInt, "C4_TEST_PARAM_INT", "NCCL_TEST_PARAM_INT", 7, "test parameter")
C4_PARAM_STR(TestStr, "C4_TEST_PARAM_STR", nullptr, "dflt", "test parameter")

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
