// The trace ring on its own: wrap-around, readers racing a writer (snapshot and the signal-safe
// dump never return a torn event), several recorders written concurrently, the file layout.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trace/temp_dir.hpp"
#include "trace/recorder.hpp"

namespace {

using c4::trace::Event;
using c4::trace::EventType;
using c4::trace::FileHeader;
using c4::trace::Recorder;

std::string tempDir() { return c4test::tempDir("c4trace-ring"); }

/// An event whose fields all derive from i, so a torn copy is detectable.
Event patterned(uint64_t i) {
  Event e;
  e.type = EventType::kOp;
  e.t0 = i * 7 + 1;
  e.t1 = i * 7 + 5;
  e.bytes = i * 3;
  e.seq = static_cast<uint32_t>(i);
  e.peer = static_cast<int32_t>(i % 1000);
  e.coll = static_cast<uint8_t>(i % 11);
  e.dtype = static_cast<uint8_t>(i % 12);
  e.flags = static_cast<uint8_t>(i & 0xff);
  return e;
}

bool consistent(const Event& e) {
  uint64_t i = e.seq;  // low 32 bits are enough for these tests
  return e.t0 == i * 7 + 1 && e.t1 == i * 7 + 5 && e.bytes == i * 3 && e.peer == static_cast<int32_t>(i % 1000) &&
         e.coll == i % 11 && e.dtype == i % 12 && e.flags == (i & 0xff);
}

Recorder* makeRecorder(const std::string& dir, int rank, int buffer) {
  setenv("C4_TRACE", "op", 1);
  setenv("C4_TRACE_DIR", dir.c_str(), 1);
  setenv("C4_TRACE_BUFFER", std::to_string(buffer).c_str(), 1);
  auto* r = new Recorder();
  c4::trace::RecorderInfo info;
  info.rank = rank;
  info.nranks = 8;
  info.commTag = "0123456789abcdef";
  info.host = "testhost";
  EXPECT_TRUE(r->init(info).isOk());
  return r;
}

struct ParsedFile {
  FileHeader h;
  std::vector<Event> events;
  std::string names;
};

bool parseFile(const std::string& path, ParsedFile* out) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < sizeof(FileHeader)) return false;
  memcpy(static_cast<void*>(&out->h), data.data(), sizeof(FileHeader));
  size_t need = sizeof(FileHeader) + out->h.nEvents * sizeof(Event) + out->h.namesBytes;
  if (data.size() != need) return false;
  out->events.resize(out->h.nEvents);
  if (out->h.nEvents)
    memcpy(static_cast<void*>(out->events.data()), data.data() + sizeof(FileHeader), out->h.nEvents * sizeof(Event));
  out->names = data.substr(sizeof(FileHeader) + out->h.nEvents * sizeof(Event));
  return true;
}

TEST(TraceRing, WrapsAroundKeepingTheNewest) {
  std::string dir = tempDir();
  Recorder* r = makeRecorder(dir, 0, 16);
  for (uint64_t i = 0; i < 100; ++i) r->record(patterned(i));
  std::vector<Event> evs;
  uint64_t dropped = 0;
  r->snapshot(&evs, &dropped);
  // Capacity 16; the slot the writer refills next is never read: 15 newest events.
  ASSERT_EQ(evs.size(), 15u);
  EXPECT_EQ(dropped, 85u);
  for (size_t k = 0; k < evs.size(); ++k) {
    EXPECT_EQ(evs[k].seq, 85 + k);
    EXPECT_TRUE(consistent(evs[k]));
  }
  std::string path;
  ASSERT_TRUE(r->dump(c4::trace::DumpReason::kRequest, &path).isOk());
  ParsedFile f;
  ASSERT_TRUE(parseFile(path, &f)) << path;
  EXPECT_EQ(memcmp(f.h.magic, c4::trace::kFileMagic, 8), 0);
  EXPECT_EQ(f.h.version, c4::trace::kFileVersion);
  EXPECT_EQ(f.h.totalEvents, 100u);
  EXPECT_EQ(f.h.nEvents, 15u);
  EXPECT_EQ(f.h.firstIndex, 85u);
  EXPECT_EQ(f.h.validFrom, 85u);
  EXPECT_EQ(f.h.reason, static_cast<uint32_t>(c4::trace::DumpReason::kRequest));
  EXPECT_STREQ(f.h.host, "testhost");
  for (size_t k = 0; k < f.events.size(); ++k) EXPECT_EQ(f.events[k].seq, 85 + k);
  delete r;
}

TEST(TraceRing, BeforeWrapEverythingIsKept) {
  std::string dir = tempDir();
  Recorder* r = makeRecorder(dir, 1, 64);
  for (uint64_t i = 0; i < 10; ++i) r->record(patterned(i));
  std::vector<Event> evs;
  uint64_t dropped = 1;
  r->snapshot(&evs, &dropped);
  ASSERT_EQ(evs.size(), 10u);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(evs[0].seq, 0u);
  delete r;
}

TEST(TraceRing, NamesAreInternedOnce) {
  std::string dir = tempDir();
  Recorder* r = makeRecorder(dir, 2, 16);
  uint32_t a = r->intern("forward");
  uint32_t b = r->intern("backward");
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(r->intern("forward"), a);
  EXPECT_EQ(r->intern(""), 0u);
  r->note("phase 1");
  std::string path;
  ASSERT_TRUE(r->dump(c4::trace::DumpReason::kRequest, &path).isOk());
  ParsedFile f;
  ASSERT_TRUE(parseFile(path, &f));
  ASSERT_EQ(f.events.size(), 1u);
  EXPECT_EQ(f.events[0].type, EventType::kDiag);
  EXPECT_STREQ(f.names.c_str() + f.events[0].seq, "phase 1");
  EXPECT_STREQ(f.names.c_str() + a, "forward");
  delete r;
}

TEST(TraceRing, ReadersRacingAWriterNeverSeeTornEvents) {
  std::string dir = tempDir();
  Recorder* r = makeRecorder(dir, 3, 1024);
  std::atomic<bool> stop{false};
  constexpr uint64_t kEvents = 2000000;
  std::thread writer([&] {
    for (uint64_t i = 0; i < kEvents; ++i) r->record(patterned(i));
    stop.store(true);
  });
  size_t snapshots = 0, dumps = 0, bad = 0;
  std::vector<Event> evs;
  while (!stop.load()) {
    uint64_t dropped = 0;
    r->snapshot(&evs, &dropped);
    ++snapshots;
    for (size_t k = 0; k < evs.size(); ++k) {
      if (!consistent(evs[k])) ++bad;
      if (k > 0 && evs[k].seq != evs[k - 1].seq + 1) ++bad;
    }
    if (snapshots % 16 == 0) {
      // The signal-safe writer, from another thread while the writer runs.
      if (c4::trace::dumpAllRaw(c4::trace::DumpReason::kRequest) >= 1) {
        ParsedFile f;
        if (parseFile(r->path(), &f)) {
          ++dumps;
          for (size_t k = 0; k < f.events.size(); ++k) {
            if (f.h.firstIndex + k < f.h.validFrom) continue;  // may be torn: readers skip these
            if (!consistent(f.events[k]) || f.events[k].seq != (f.h.firstIndex + k)) ++bad;
          }
        }
      }
    }
  }
  writer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(snapshots, 0u);
  printf("%zu snapshots and %zu dumps raced %llu writes\n", snapshots, dumps, static_cast<unsigned long long>(kEvents));
  delete r;
}

TEST(TraceRing, ConcurrentWritersOnTheirOwnRecorders) {
  std::string dir = tempDir();
  constexpr int kThreads = 4;
  constexpr uint64_t kEach = 200000;
  std::vector<Recorder*> recs;
  for (int t = 0; t < kThreads; ++t) recs.push_back(makeRecorder(dir, 10 + t, 1 << 18));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < kEach; ++i) recs[t]->record(patterned(i));
      recs[t]->intern(("thread " + std::to_string(t)).c_str());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    std::vector<Event> evs;
    uint64_t dropped = 0;
    recs[t]->snapshot(&evs, &dropped);
    ASSERT_EQ(evs.size(), kEach) << "thread " << t;
    EXPECT_EQ(dropped, 0u);
    size_t bad = 0;
    for (size_t k = 0; k < evs.size(); ++k) bad += !consistent(evs[k]) || evs[k].seq != k;
    EXPECT_EQ(bad, 0u) << "thread " << t;
    delete recs[t];
  }
}

TEST(TraceRing, ClockIsMonotonicAndCalibrated) {
  c4::trace::initClock();
  uint64_t a = c4::trace::ticks();
  int64_t na = c4::trace::toNs(a);
  usleep(20000);
  uint64_t b = c4::trace::ticks();
  int64_t nb = c4::trace::toNs(b);
  EXPECT_GT(b, a);
  // 20 ms of sleep is at least 20 ms on the trace clock (and not absurdly more on a busy machine).
  EXPECT_GE(nb - na, 19000000);
  EXPECT_LT(nb - na, 5000000000LL);
  EXPECT_GT(c4::trace::ticksPerNs(), 0.0);
}

}  // namespace
