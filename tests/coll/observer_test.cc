// The call observers' list (core/observer.hpp): every event reaches the observers that take it,
// in the order they were added, and only those; an idle round's verdict and a failure's
// explanation pass from one observer to the next.
#include "core/observer.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "core/call.hpp"

namespace c4 {
namespace {

struct Log {
  std::vector<std::string> lines;
};

class Recording final : public CallObserver {
 public:
  Recording(Log* log, std::string name, unsigned events) : log_(log), name_(std::move(name)), events_(events) {}
  unsigned events() const override { return events_; }
  void started(PreparedCall& p) override { put("started " + std::to_string(p.sig.seq)); }
  void progressed(const PreparedCall& p) override { put("progressed " + std::to_string(p.sig.seq)); }
  Status idle(const PreparedCall&, Status verdict) override {
    put(std::string("idle ") + (verdict.isOk() ? "ok" : verdict.message()));
    if (!idleVerdict.empty() && verdict.isOk()) return makeError(Code::kRemoteError, "%s", idleVerdict.c_str());
    if (!verdict.isOk() && appendToVerdict) return Status(verdict.code(), verdict.message() + " + " + name_);
    return verdict;
  }
  void finished(PreparedCall& p, uint64_t t1) override {
    put("finished " + std::to_string(p.sig.seq) + " at " + std::to_string(t1));
  }
  Status explain(const Status& st) override {
    put("explain " + st.message());
    return Status(st.code(), st.message() + " [" + name_ + "]");
  }
  void failed(const Status& st) override { put("failed " + st.message()); }

  std::string idleVerdict;  // "": keeps an Ok verdict
  bool appendToVerdict = false;

 private:
  void put(const std::string& s) { log_->lines.push_back(name_ + ": " + s); }
  Log* log_;
  std::string name_;
  unsigned events_;
};

constexpr unsigned kAll = CallObserver::kStarted | CallObserver::kProgressed | CallObserver::kIdle |
                          CallObserver::kFinished | CallObserver::kFailed;

TEST(CallObservers, EveryEventInOrderToThoseThatTakeIt) {
  Log log;
  CallObservers obs;
  obs.add(std::make_unique<Recording>(&log, "a", kAll));
  obs.add(std::make_unique<Recording>(&log, "b", CallObserver::kStarted | CallObserver::kFinished));
  obs.add(std::make_unique<Recording>(&log, "c", CallObserver::kProgressed | CallObserver::kFailed));
  EXPECT_EQ(obs.size(), 3u);
  PreparedCall p;
  p.sig.seq = 7;
  obs.started(p);
  obs.progressed(p);
  EXPECT_TRUE(obs.idle(p).isOk());
  obs.finished(p, 42);
  const std::vector<std::string> want = {"a: started 7", "b: started 7",        "a: progressed 7",    "c: progressed 7",
                                         "a: idle ok",   "a: finished 7 at 42", "b: finished 7 at 42"};
  EXPECT_EQ(log.lines, want);
}

TEST(CallObservers, AnIdleVerdictReachesTheObserversAfterIt) {
  Log log;
  CallObservers obs;
  auto first = std::make_unique<Recording>(&log, "watchdog", CallObserver::kIdle);
  first->idleVerdict = "no progress";
  auto second = std::make_unique<Recording>(&log, "c4d", CallObserver::kIdle);
  second->appendToVerdict = true;
  obs.add(std::move(first));
  obs.add(std::move(second));
  PreparedCall p;
  const Status st = obs.idle(p);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_EQ(st.message(), "no progress + c4d");
  const std::vector<std::string> want = {"watchdog: idle ok", "c4d: idle no progress"};
  EXPECT_EQ(log.lines, want);
}

TEST(CallObservers, AFailureIsExplainedInOrderThenAnnounced) {
  Log log;
  CallObservers obs;
  obs.add(std::make_unique<Recording>(&log, "x", CallObserver::kFailed));
  obs.add(std::make_unique<Recording>(&log, "y", CallObserver::kStarted));  // takes no failure
  obs.add(std::make_unique<Recording>(&log, "z", CallObserver::kFailed));
  const Status explained = obs.explain(makeError(Code::kSystemError, "link down"));
  EXPECT_EQ(explained.code(), Code::kSystemError);
  EXPECT_EQ(explained.message(), "link down [x] [z]");
  obs.failed(explained);
  const std::vector<std::string> want = {"x: explain link down", "z: explain link down [x]",
                                         "x: failed link down [x] [z]", "z: failed link down [x] [z]"};
  EXPECT_EQ(log.lines, want);
}

TEST(CallObservers, AnEmptyListIsSilentAndOk) {
  CallObservers obs;
  PreparedCall p;
  obs.started(p);
  obs.progressed(p);
  obs.finished(p, 1);
  EXPECT_TRUE(obs.idle(p).isOk());
  EXPECT_EQ(obs.explain(makeError(Code::kRemoteError, "e")).message(), "e");
}

}  // namespace
}  // namespace c4
