// Schedule files (docs/schedules.md): the loader's checks, each with the error it must give, and
// loaded schedules run through the simulator for every size, chunking, data type and aliasing.
#include "sched/schedule_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sched/schedule_file_gen.hpp"
#include "tests/sched/sim_harness.hpp"

namespace c4::sched::test {
namespace {

using json = nlohmann::json;

Algo mustRegister(const std::string& text, const std::string& source) {
  auto f = std::make_shared<ScheduleFile>();
  Status st = parseScheduleFile(text, source, f.get());
  EXPECT_TRUE(st.isOk()) << st.toString();
  if (!st.isOk()) return Algo::kRing;
  Result<Algo> id = registerSchedule(f);
  EXPECT_TRUE(id.isOk()) << id.status().toString();
  return id.isOk() ? id.value() : Algo::kRing;
}

// C4_TEST_QUICK=1 (the sanitizer pass of scripts/test.sh) leaves out 1000 elements in 8-byte chunks,
// the slowest case to simulate: 8-byte chunks run with 7 elements, 1000 elements in 1 KiB chunks, and
// the full run checked every case's values.
bool quickSkips(size_t count, size_t chunkBytes) {
  static const bool quick = getenv("C4_TEST_QUICK") != nullptr;
  return quick && count >= 1000 && chunkBytes == 8;
}

// The loader's error for `text`, or "" when it loads.
std::string loadError(const std::string& text) {
  ScheduleFile f;
  Status st = parseScheduleFile(text, "t.json", &f);
  return st.isOk() ? std::string() : st.message();
}

TEST(ScheduleFile, RingFilesRunEveryCaseThroughTheSimulator) {
  for (const char* coll : {"allgather", "reducescatter", "allreduce"}) {
    for (int n : {1, 2, 3, 5}) {
      for (int chunks : {1, 3}) {
        const Algo id = mustRegister(ringFile(coll, n, chunks), "ring");
        ASSERT_GE(static_cast<int>(id), kNumAlgos);
        std::shared_ptr<const ScheduleFile> f = registeredSchedule(id);
        ASSERT_TRUE(f);
        EXPECT_EQ(std::string(algoName(id)), "file:" + f->name);
        const Coll c = f->coll;
        EXPECT_TRUE(supports(id, c, n));
        EXPECT_FALSE(supports(id, c, n + 1));
        EXPECT_FALSE(supports(id, c == Coll::kAllGather ? Coll::kAllReduce : Coll::kAllGather, n));
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          for (size_t chunkBytes : {size_t{0}, size_t{8}, size_t{1024}}) {
            if (quickSkips(count, chunkBytes)) continue;
            for (bool inPlace : {false, true}) {
              for (DataType dt : {DataType::kInt32, DataType::kFloat32, DataType::kInt64}) {
                CaseSpec cs;
                cs.coll = c;
                cs.algo = id;
                cs.nranks = n;
                cs.count = count;
                cs.chunkBytes = chunkBytes;
                cs.inPlace = inPlace;
                cs.dtype = dt;
                cs.exactValues = dt != DataType::kFloat32;
                cs.seed = count * 31 + chunkBytes;
                EXPECT_TRUE(runCase(cs)) << coll << " n=" << n << " chunks=" << chunks;
              }
            }
          }
        }
      }
    }
  }
}

TEST(ScheduleFile, RelayWithExplicitDepsAndMaxReduction) {
  const Algo id = mustRegister(starAllGatherFile(4, 2), "star");
  for (size_t count : {size_t{1}, size_t{5}, size_t{4099}}) {
    CaseSpec cs;
    cs.coll = Coll::kAllGather;
    cs.algo = id;
    cs.nranks = 4;
    cs.count = count;
    cs.chunkBytes = 64;
    EXPECT_TRUE(runCase(cs));
  }
  const Algo ar = mustRegister(ringFile("allreduce", 4, 2, "ring-ar-max"), "ring");
  CaseSpec cs;
  cs.coll = Coll::kAllReduce;
  cs.algo = ar;
  cs.nranks = 4;
  cs.count = 333;
  cs.op = RedOp::kMax;
  EXPECT_TRUE(runCase(cs));
}

TEST(ScheduleFile, AlltoAllFilesRunEveryCaseThroughTheSimulator) {
  for (bool relay : {false, true}) {
    for (int n : {1, 2, 3, 5}) {
      for (int chunks : {1, 3}) {
        const Algo id = mustRegister(alltoallFile(n, chunks, relay), "a2a");
        ASSERT_GE(static_cast<int>(id), kNumAlgos);
        EXPECT_TRUE(supports(id, Coll::kAlltoAll, n));
        EXPECT_FALSE(supports(id, Coll::kAllGather, n));
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          for (size_t chunkBytes : {size_t{0}, size_t{8}, size_t{1024}}) {
            if (quickSkips(count, chunkBytes)) continue;
            for (DataType dt : {DataType::kInt32, DataType::kInt8, DataType::kFloat64}) {
              CaseSpec cs;
              cs.coll = Coll::kAlltoAll;
              cs.algo = id;
              cs.nranks = n;
              cs.count = count;
              cs.chunkBytes = chunkBytes;
              cs.dtype = dt;
              cs.seed = count * 17 + chunkBytes + static_cast<size_t>(relay);
              EXPECT_TRUE(runCase(cs)) << (relay ? "relay" : "pairwise") << " n=" << n << " chunks=" << chunks
                                       << " count=" << count;
            }
          }
        }
      }
    }
  }
  // Relayed chunks wait in scratch: rank 0 of the relay keeps every chunk between two other ranks.
  ScheduleFile f;
  ASSERT_TRUE(parseScheduleFile(alltoallFile(4, 2, true), "relay.json", &f).isOk());
  CollArgs a;
  a.coll = Coll::kAlltoAll;
  a.nranks = 4;
  a.count = 10;
  a.dtype = DataType::kInt32;
  a.aliased = false;
  Result<Schedule> s0 = buildFromFile(f, a);
  ASSERT_TRUE(s0.isOk()) << s0.status().toString();
  EXPECT_EQ(s0.value().scratchBytes, size_t{3 * 2 * 10 * 4});  // 3 x 2 blocks relayed, 10 int32 each
  a.rank = 1;
  Result<Schedule> s1 = buildFromFile(f, a);
  ASSERT_TRUE(s1.isOk());
  EXPECT_EQ(s1.value().scratchBytes, size_t{0});
  // Cost model: pairwise sends (n-1)/n of the nominal bytes from every rank in one message depth;
  // the relay's rank 0 sends its own 3 blocks and 6 relayed ones: 9/4.
  std::shared_ptr<const ScheduleFile> pw = registeredSchedule(mustRegister(alltoallFile(4, 1, false), "pw"));
  EXPECT_NEAR(pw->sendFraction, 0.75, 1e-9);
  EXPECT_NEAR(f.sendFraction, 2.25, 1e-9);
  // Two hops per relayed block, queued behind each other on rank 0's links: deeper than pairwise.
  EXPECT_GT(f.depth, pw->depth) << "pairwise " << pw->depth << ", relay " << f.depth;
  EXPECT_GE(pw->depth, 1);
}

TEST(ScheduleFile, AlltoAllRulesNameTheStep) {
  const json good = json::parse(alltoallFile(3, 1, true, "a2a-good"));
  ASSERT_EQ(loadError(good.dump()), "");
  {
    json j = good;  // rank 1's first step sends block 1->0; make rank 2 receive it instead of 0's
    j["ranks"][1]["steps"][2] = {{"op", "recv"}, {"peer", 0}, {"chunk", 5}};  // block 5 = 1 -> 2: its own input
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("rank 1 step 2 (recv chunk 5 (block 5: rank 1 to rank 2, part 0), peer 0): receives a chunk "
                       "of the rank's own input"),
              std::string::npos)
        << err;
  }
  {
    json j = good;  // rank 1 sends block 2 -> 0 (chunk 6), which only rank 2 has
    j["ranks"][1]["steps"][0]["chunk"] = 6;
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("rank 1 step 0 (send chunk 6 (block 6: rank 2 to rank 0, part 0), peer 0): sends data the "
                       "rank does not have at that point"),
              std::string::npos)
        << err;
  }
  {
    json j = good;  // rank 0 receives block 2 -> 2 (chunk 8) in place of block 2 -> 1
    j["ranks"][0]["steps"][3]["chunk"] = 8;
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("rank 0 step 3 (recv chunk 8 (block 8: rank 2 to rank 2, part 0), peer 2): names a block a "
                       "rank sends itself"),
              std::string::npos)
        << err;
  }
  {
    json j = good;
    j["ranks"][0]["steps"][0]["op"] = "recv-reduce";
    EXPECT_NE(loadError(j.dump()).find("alltoall schedules have no \"recv-reduce\" steps"), std::string::npos)
        << loadError(j.dump());
  }
  {
    json j = good;  // rank 2 never receives block 1 -> 2 (its last receive)
    j["ranks"][2]["steps"].erase(j["ranks"][2]["steps"].size() - 1);
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("rank 2 ends without chunk 5 (block 5: rank 1 to rank 2"), std::string::npos) << err;
  }
  {
    json j = good;  // 65536 ranks: 2^32 blocks, counted without overflow
    j["nranks"] = 65536;
    EXPECT_NE(loadError(j.dump()).find("4294967296 blocks x 1 chunks is more chunks than a schedule may have"),
              std::string::npos)
        << loadError(j.dump());
  }
  {
    json j = good;
    j["ranks"][0]["steps"][0]["chunk"] = 9;  // 3 x 3 blocks x 1 chunk: 0..8
    EXPECT_NE(loadError(j.dump()).find("\"chunk\" is 9, outside 0..8"), std::string::npos) << loadError(j.dump());
  }
}

TEST(ScheduleFile, SameContentRegistersOnceAndTheCostModelIsFilled) {
  const std::string text = ringFile("allreduce", 4, 1, "cost-ar");
  const Algo a = mustRegister(text, "a");
  const int before = numAlgos();
  const Algo b = mustRegister(text, "b");
  EXPECT_EQ(a, b);
  EXPECT_EQ(numAlgos(), before);
  std::shared_ptr<const ScheduleFile> f = registeredSchedule(a);
  // A ring allreduce on 4 ranks: 2 (n-1) = 6 messages deep; each rank sends 2 (n-1)/n of the vector
  // and reduces (n-1)/n of it.
  EXPECT_EQ(f->depth, 6);
  EXPECT_NEAR(f->sendFraction, 1.5, 0.1);
  EXPECT_NEAR(f->reduceFraction, 0.75, 0.05);
  EXPECT_EQ(registeredSchedule(Algo::kRing), nullptr);
}

TEST(ScheduleFile, LoadsFromDiskAndNamesAMissingFile) {
  const std::string path = writeTemp(ringFile("allgather", 3, 2, "disk-ag"), "c4-sched-disk");
  ASSERT_FALSE(path.empty());
  Result<Algo> id = loadAndRegister(path);
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  Result<Algo> again = loadAndRegister(path);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(id.value(), again.value());
  unlink(path.c_str());
  Result<Algo> missing = loadAndRegister(path);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

// What a schedule file may cost init. Only regular files (a FIFO blocked init past
// C4_TIMEOUT, /dev/zero read until memory ran out, a directory was "not JSON"), at most
// C4_SCHEDULE_FILE_MAX_BYTES, and the header of a file for another size of communicator is read
// without its steps.
TEST(ScheduleFile, OnlyRegularFilesOfBoundedSize) {
  auto errorOf = [](const std::string& path) {
    Result<Algo> id = loadAndRegister(path);
    return id.isOk() ? std::string() : id.status().message();
  };
  EXPECT_NE(errorOf("/dev/zero").find("is a character device, not a regular file"), std::string::npos)
      << errorOf("/dev/zero");
  EXPECT_NE(errorOf("/tmp").find("is a directory, not a regular file"), std::string::npos) << errorOf("/tmp");
  const std::string fifo = "/tmp/c4-sched-fifo-" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(errorOf(fifo).find("is a FIFO, not a regular file"), std::string::npos) << errorOf(fifo);
  int ranks = 0;
  std::string coll;
  EXPECT_FALSE(peekScheduleFile(fifo, &ranks, &coll).isOk());
  unlink(fifo.c_str());
  const std::string path = writeTemp(ringFile("allreduce", 4, 1, "capped"), "c4-sched-capped");
  setenv("C4_SCHEDULE_FILE_MAX_BYTES", "1024", 1);
  const std::string capped = errorOf(path);
  unsetenv("C4_SCHEDULE_FILE_MAX_BYTES");
  EXPECT_NE(capped.find("more than C4_SCHEDULE_FILE_MAX_BYTES=1024"), std::string::npos) << capped;
  EXPECT_EQ(errorOf(path), "");
  unlink(path.c_str());
}

TEST(ScheduleFile, TheHeaderOfALargeFileIsReadAloneAndTheCheckHasADeadline) {
  const std::string text = ringFile("allreduce", 32, 1, "big-ring");
  const std::string path = writeTemp(text, "c4-sched-big");
  int ranks = 0;
  std::string coll;
  ASSERT_TRUE(peekScheduleFile(path, &ranks, &coll).isOk());
  EXPECT_EQ(ranks, 32);
  EXPECT_EQ(coll, "allreduce");
  // The header after the steps: found all the same.
  json j = json::parse(text);
  const std::string late = "{\"ranks\": " + j["ranks"].dump() + ", \"nranks\": 32, \"collective\": \"allreduce\"}";
  ASSERT_GT(late.size(), size_t{65536}) << "the header must lie past peekScheduleFile's first read";
  const std::string latePath = writeTemp(late, "c4-sched-late");
  ASSERT_TRUE(peekScheduleFile(latePath, &ranks, &coll).isOk());
  EXPECT_EQ(ranks, 32);
  unlink(latePath.c_str());
  const std::string junk = writeTemp("{\"x\": 1}", "c4-sched-junk");
  EXPECT_FALSE(peekScheduleFile(junk, &ranks, &coll).isOk());
  unlink(junk.c_str());
  // Checking takes a while; with no time left it stops at once and says why.
  ScheduleFile f;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const Status st = parseScheduleFile(text, path, &f, static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
  EXPECT_NE(st.message().find("takes longer than this communicator's init may wait"), std::string::npos)
      << st.toString();
  unlink(path.c_str());
}

TEST(ScheduleFile, BuildRefusesAnotherCollectiveOrRankCount) {
  ScheduleFile f;
  ASSERT_TRUE(parseScheduleFile(ringFile("allgather", 3, 1), "x.json", &f).isOk());
  CollArgs a;
  a.coll = Coll::kAllReduce;
  a.nranks = 3;
  a.count = 10;
  EXPECT_FALSE(buildFromFile(f, a).isOk());
  a.coll = Coll::kAllGather;
  a.nranks = 4;
  Result<Schedule> r = buildFromFile(f, a);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("of 3 ranks"), std::string::npos) << r.status().message();
}

// Malformed files: each is refused with an error that names what is wrong (and where).
TEST(ScheduleFile, MalformedFilesAreRefusedNamingTheStep) {
  const json good = json::parse(ringFile("allgather", 3, 1, "good"));
  ASSERT_EQ(loadError(good.dump()), "");
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;  // a substring of the error
  };
  const std::vector<Case> cases = {
      {"not json", nullptr, "not JSON"},
      {"format", [](json& j) { j["format"] = "nccl"; }, "\"format\" must be"},
      {"version", [](json& j) { j["version"] = 2; }, "reads version 1"},
      {"unknown key", [](json& j) { j["chunk"] = 1; }, "unknown key \"chunk\""},
      {"name", [](json& j) { j["name"] = "a b"; }, "\"name\" must be"},
      {"collective", [](json& j) { j["collective"] = "broadcast"; }, "\"collective\" must be"},
      {"nranks vs ranks", [](json& j) { j["nranks"] = 4; }, "\"ranks\" has 3 entries for \"nranks\" 4"},
      {"chunks", [](json& j) { j["chunks"] = 0; }, "\"chunks\" is 0"},
      {"peer range", [](json& j) { j["ranks"][1]["steps"][0]["peer"] = 3; }, "rank 1 step 0: \"peer\" is 3"},
      {"self peer", [](json& j) { j["ranks"][1]["steps"][0]["peer"] = 1; }, "rank 1 step 0: \"peer\" is the rank"},
      {"chunk range", [](json& j) { j["ranks"][2]["steps"][1]["chunk"] = 3; }, "rank 2 step 1: \"chunk\" is 3"},
      {"op", [](json& j) { j["ranks"][0]["steps"][0]["op"] = "put"; }, "rank 0 step 0: \"op\" must be"},
      {"op for coll", [](json& j) { j["ranks"][0]["steps"][0]["op"] = "send-partial"; },
       "allgather schedules have no \"send-partial\" steps"},
      {"unknown step key", [](json& j) { j["ranks"][0]["steps"][0]["bytes"] = 4; }, "rank 0 step 0: unknown key"},
      {"dep range", [](json& j) { j["ranks"][0]["steps"][1]["deps"] = {9}; }, "names a step that does not exist"},
      {"dep cycle",
       [](json& j) {
         j["ranks"][0]["steps"][0]["deps"] = {2};
         j["ranks"][0]["steps"][2]["deps"] = {0};
       },
       "rank 0 step 0: dependency cycle 0 -> 2 -> 0"},
      {"self dep", [](json& j) { j["ranks"][0]["steps"][1]["deps"] = {1}; }, "rank 0 step 1 depends on itself"},
      // Rank 1 forwards block 2 (step 2) before it received it: swap its first receive's chunk.
      {"send before receive", [](json& j) { j["ranks"][1]["steps"][2]["chunk"] = 2; },
       "rank 1 step 2 (send chunk 2 (block 2 part 0), peer 2): sends data the rank does not have"},
      {"received twice", [](json& j) { j["ranks"][1]["steps"][3]["chunk"] = 0; },
       "receives a chunk the rank already has"},
      {"ends without", [](json& j) { j["ranks"][2]["steps"].erase(3); }, "rank 2 ends without chunk"},
  };
  for (const Case& c : cases) {
    std::string text;
    if (c.edit == nullptr) {
      text = "{\"format\": ";
    } else {
      json j = good;
      c.edit(j);
      text = j.dump();
    }
    const std::string err = loadError(text);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": got \"" << err << "\"";
    EXPECT_NE(err.find("t.json"), std::string::npos) << c.what << ": " << err;
  }
}

TEST(ScheduleFile, ReductionRulesAndTheSimulatorCatchWhatStructureCannot) {
  const json rs = json::parse(ringFile("reducescatter", 3, 1, "rs"));
  const json ar = json::parse(ringFile("allreduce", 3, 1, "ar"));
  ASSERT_EQ(loadError(rs.dump()), "");
  ASSERT_EQ(loadError(ar.dump()), "");
  {
    json j = rs;  // rank 0 sends its partial of block 2 twice
    j["ranks"][0]["steps"][2] = {{"op", "send-partial"}, {"peer", 1}, {"chunk", 2}};
    EXPECT_NE(loadError(j.dump()).find("sends the chunk's partial a second time"), std::string::npos)
        << loadError(j.dump());
  }
  {
    json j = rs;  // a partial of the rank's own block
    j["ranks"][0]["steps"][0]["chunk"] = 0;
    EXPECT_NE(loadError(j.dump()).find("sends a partial of a block the rank owns"), std::string::npos)
        << loadError(j.dump());
  }
  {
    json j = ar;  // allreduce: rank 1 receives a final value of its own block
    j["ranks"][1]["steps"][5] = {{"op", "recv"}, {"peer", 0}, {"chunk", 1}};
    EXPECT_NE(loadError(j.dump()).find("receives the final value of a block the rank owns"), std::string::npos)
        << loadError(j.dump());
  }
  {
    json j = rs;  // messages that do not match: rank 1 receives from 2 instead of 0
    j["ranks"][1]["steps"][1]["peer"] = 2;
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("schedule simulator refuses it"), std::string::npos) << err;
  }
  {
    json j = json::parse(ringFile("allgather", 3, 1, "ag"));
    // Every message matches and every step reads data the rank has, but rank 2 files the block it
    // gets first (block 1) as block 0 and forwards it so: the data ends in the wrong place.
    j["ranks"][2]["steps"][1]["chunk"] = 0;
    j["ranks"][2]["steps"][2]["chunk"] = 0;
    j["ranks"][2]["steps"][3]["chunk"] = 1;
    const std::string err = loadError(j.dump());
    EXPECT_NE(err.find("wrong result"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace c4::sched::test
