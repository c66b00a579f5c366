// The three paths of core/paths.hpp over the communicator's parts: its executors, its one-shot
// arena and its zero-copy exchange.
#include "core/paths.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/call.hpp"
#include "core/oneshot.hpp"
#include "core/zerocopy.hpp"

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
  explicit OneShotPath(OneShot* o) : o_(o) {}
  PathKind kind() const override { return PathKind::kOneShot; }
  Status start(PreparedCall* p) override {
    trace::Event e;
    if (p->traceOneShot) e = callEvent(*p, o_->numRanks());
    return o_->start(p->op, p->sig, p->bases[static_cast<int>(BufBase::kInput)],
                     const_cast<void*>(p->bases[static_cast<int>(BufBase::kOutput)]), p->kop,
                     p->traceOneShot ? &e : nullptr);
  }
  Status poll(PreparedCall* p, bool* done, bool* progressed) override {
    Status st = o_->poll(done);
    *progressed = o_->madeProgress();
    return st;
  }
  std::string waitingOn(const PreparedCall*) const override { return o_->waitingOn(); }
  std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall*) const override {
    if (o_->waitingFor() < 0) return {};
    return {{o_->waitingFor(), "one-shot path (shared memory)"}};
  }

 private:
  OneShot* o_;
};

/// Between the ranks' shared buffers (core/zerocopy.hpp); the message plan when a peer does not offer.
class ZeroCopyPath final : public ExecPath {
 public:
  ZeroCopyPath(ZeroCopy* z, ExecPath* messages) : z_(z), messages_(messages) {}
  PathKind kind() const override { return PathKind::kZeroCopy; }
  Status start(PreparedCall* p) override {
    z_->start(p->op, p->sig, p->kop);
    return Status::ok();
  }
  Status poll(PreparedCall* p, bool* done, bool* progressed) override {
    bool fallback = false;
    Status st = z_->poll(done, &fallback);
    *progressed = z_->madeProgress();
    if (*done) p->traceAlgo = trace::kAlgoZeroCopy;
    if (!st.isOk() || !fallback) return st;
    // A peer runs this call through messages: so does every rank.
    p->path = messages_;
    p->kind = PathKind::kMessages;
    *done = false;
    return messages_->start(p);
  }
  std::string waitingOn(const PreparedCall*) const override { return z_->waitingOn(); }
  std::vector<std::pair<int, std::string>> waitingRanks(const PreparedCall*) const override {
    if (z_->waitingFor() < 0) return {};
    return {{z_->waitingFor(), "zero-copy path (shared memory)"}};
  }

 private:
  ZeroCopy* z_;
  ExecPath* messages_;
};
}  // namespace

std::unique_ptr<ExecPath> makeMessagePath() { return std::make_unique<MessagePath>(); }
std::unique_ptr<ExecPath> makeOneShotPath(OneShot* oneShot) { return std::make_unique<OneShotPath>(oneShot); }
std::unique_ptr<ExecPath> makeZeroCopyPath(ZeroCopy* zeroCopy, ExecPath* messages) {
  return std::make_unique<ZeroCopyPath>(zeroCopy, messages);
}

}  // namespace c4
