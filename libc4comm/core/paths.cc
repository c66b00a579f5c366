// The three paths of core/paths.hpp over the communicator's parts.
#include "core/paths.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm.hpp"

namespace c4 {

namespace {

/// The executor over the transports.
class MessagePath final : public ExecPath {
 public:
  PathKind kind() const override { return PathKind::kMessages; }
  Status start(PreparedCall* p) override { return p->exec->start(p->bases, p->spaces); }
  Status poll(PreparedCall* p, bool* done, bool* progressed) override {
    Status st = p->exec->poll(done);
    *progressed = p->exec->madeProgress();
    return st;
  }
  std::string waitingOn(const PreparedCall* p) const override { return p->exec->waitingOn(); }
  std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall* p) const override {
    return p->exec->waitingRanks();
  }
};

/// Small calls through the shared arenas (core/oneshot.hpp).
class OneShotPath final : public ExecPath {
 public:
  explicit OneShotPath(Comm* c) : c_(c) {}
  PathKind kind() const override { return PathKind::kOneShot; }
  Status start(PreparedCall* p) override {
    trace::Event e;
    if (p->traceOneShot) e = callEvent(*p, c_->nranks);
    return c_->oneShot.start(p->op, p->sig, p->bases[static_cast<int>(BufBase::kInput)],
                             const_cast<void*>(p->bases[static_cast<int>(BufBase::kOutput)]), p->kop,
                             p->traceOneShot ? &e : nullptr);
  }
  Status poll(PreparedCall* p, bool* done, bool* progressed) override {
    Status st = c_->oneShot.poll(done);
    *progressed = c_->oneShot.madeProgress();
    return st;
  }
  std::string waitingOn(const PreparedCall*) const override { return c_->oneShot.waitingOn(); }
  std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall*) const override {
    if (c_->oneShot.waitingFor() < 0) return {};
    return {{c_->oneShot.waitingFor(), "one-shot path (shared memory)"}};
  }

 private:
  Comm* c_;
};

/// Between the ranks' shared buffers (core/zerocopy.hpp); the message plan when a peer does not offer.
class ZeroCopyPath final : public ExecPath {
 public:
  ZeroCopyPath(Comm* c, ExecPath* messages) : c_(c), messages_(messages) {}
  PathKind kind() const override { return PathKind::kZeroCopy; }
  Status start(PreparedCall* p) override {
    c_->zeroCopy.start(p->op, p->sig, p->kop);
    return Status::ok();
  }
  Status poll(PreparedCall* p, bool* done, bool* progressed) override {
    bool fallback = false;
    Status st = c_->zeroCopy.poll(done, &fallback);
    *progressed = c_->zeroCopy.madeProgress();
    if (*done) p->traceAlgo = trace::kAlgoZeroCopy;
    if (!st.isOk() || !fallback) return st;
    // A peer runs this call through messages: so does every rank.
    p->path = messages_;
    p->kind = PathKind::kMessages;
    *done = false;
    return messages_->start(p);
  }
  std::string waitingOn(const PreparedCall*) const override { return c_->zeroCopy.waitingOn(); }
  std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall* p) const override {
    if (c_->zeroCopy.waitingFor() < 0) return {};
    return {{c_->zeroCopy.waitingFor(), "zero-copy path (shared memory)"}};
  }

 private:
  Comm* c_;
  ExecPath* messages_;
};
}  // namespace

std::unique_ptr<ExecPath> makeMessagePath() { return std::make_unique<MessagePath>(); }
std::unique_ptr<ExecPath> makeOneShotPath(Comm* c) { return std::make_unique<OneShotPath>(c); }
std::unique_ptr<ExecPath> makeZeroCopyPath(Comm* c, ExecPath* messages) {
  return std::make_unique<ZeroCopyPath>(c, messages);
}

}  // namespace c4
