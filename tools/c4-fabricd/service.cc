#include "service.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/fdio.hpp"
#include "common/socket.hpp"
#include "common/status.hpp"
#include "planner/fabric_book.hpp"
#include "planner/fabric_client.hpp"
#include "planner/fabric_wire.hpp"
#include "planner/topology.hpp"
#include "store.hpp"

namespace c4::fabricd {

namespace wire = plan::wire;

namespace {

constexpr int64_t kGreetingMs = 5000;  // from accept to the job's greeting
constexpr int64_t kFrameMs = 60000;    // from a frame's header to its last payload byte
constexpr int64_t kIdleMs = 600000;    // a connection with no traffic is closed
constexpr int64_t kTickMs = 1000;      // leases are checked this often
constexpr size_t kReadChunk = 64u << 10;
// Payload bytes held at once over all connections: an announced frame (up to kMaxFrameBytes) is
// read only once its bytes fit, so that strangers announcing 16 MiB each on --max-clients
// connections cannot take 16 GiB. Frames up to kSmallFrame always fit.
constexpr size_t kBufferBudget = 256u << 20;
constexpr size_t kSmallFrame = 64u << 10;
// Refused connections (strangers: junk, another key) logged one by one per window; the rest are
// counted and summed up when the window ends, so that a flood cannot fill the log or the events.
constexpr int kRefusalsPerWindow = 20;
constexpr int64_t kRefusalWindowMs = 10000;
constexpr int kAcceptsPerWake = 64;

int64_t wallMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

Status randomBytes(void* p, size_t n) {
  char* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = getrandom(b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return sysError("getrandom", errno);
    b += k;
    n -= static_cast<size_t>(k);
  }
  return Status::ok();
}

// A name from a job, fit for one log line: control bytes escaped.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == '\'')
      out += strFormat("\\x%02x", ch);
    else
      out += static_cast<char>(ch);
  }
  return out;
}

std::string jobLabel(const std::string& name, uint64_t id) {
  return strFormat("job '%s' (id %016llx)", printable(name).c_str(), static_cast<unsigned long long>(id));
}

struct Conn {
  enum class State { kGreeting, kHeader, kWaitBudget, kPayload };
  detail::Fd fd;
  std::string peer;
  State state = State::kGreeting;
  std::string in;  // bytes of the greeting, header or payload being received (never more)
  wire::FrameHeader hdr;
  size_t reserved = 0;  // of kBufferBudget, for the payload being received
  uint64_t waitSerial = 0;
  std::string out;  // sealed bytes not yet sent
  size_t outOff = 0;
  wire::Session session;
  uint64_t recvSeq = 0, sendSeq = 0;
  int64_t deadlineMs = 0;  // the greeting's or the payload's; 0: none
  int64_t lastActiveMs = 0;
  bool dead = false;
  bool pendingOut() const { return outOff < out.size(); }
};

}  // namespace

void logLine(const char* fmt, ...) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  gmtime_r(&ts.tv_sec, &t);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &t);
  va_list ap;
  va_start(ap, fmt);
  const std::string msg = strFormatV(fmt, ap);
  va_end(ap);
  const std::string line =
      strFormat("c4-fabricd: %s.%03dZ %s\n", stamp, static_cast<int>(ts.tv_nsec / 1000000), msg.c_str());
  (void)writeAll(STDERR_FILENO, line.data(), line.size());
}

struct Service::Impl {
  explicit Impl(plan::Topology topo) : book(std::move(topo)) {}

  Options opt;
  plan::FabricBook book;
  wire::Key key;
  std::unique_ptr<Store> store;
  detail::Fd listenFd, sigFd;
  std::string listenAddr;
  detail::AcceptGuard acceptGuard{"c4-fabricd"};
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<char> scratch = std::vector<char>(kReadChunk);
  size_t reservedTotal = 0;
  uint64_t waitSerial = 0;
  int64_t nextTickMs = 0;
  bool eventsAdded = false;
  int64_t refusalWindowMs = -1;
  int refusalsInWindow = 0;
  uint64_t refusalsFolded = 0;

  Status restore();
  Status listen();
  int loop();
  int shutdown(int code);

  int64_t grantLease(int64_t asked) const {
    return asked <= 0 ? opt.leaseMs : std::min(std::max(asked, opt.minLeaseMs), wire::kMaxLeaseMs);
  }
  void event(const char* kind, uint64_t job, const std::string& text);
  void refuseConn(Conn& c, int64_t now, const std::string& why);
  void noteRefusal(int64_t now, const std::string& text);
  void flushRefusals(int64_t now);
  void refuseJob(const std::string& text, uint64_t job = 0);

  void acceptSome(int64_t now);
  void closeConn(Conn& c);
  void onReadable(Conn& c, int64_t now);
  void advance(Conn& c, int64_t now);
  bool tryAdmit(Conn& c, int64_t now);
  void admitWaiting(int64_t now);
  void onFrame(Conn& c, int64_t now);
  void flush(Conn& c, int64_t now);
  void sweep(int64_t now);
  void tick(int64_t now);

  wire::Reply handle(Conn& c, const std::string& payload, int64_t now);
  wire::Reply doRegister(Conn& c, const wire::Request& req, int64_t now);
  wire::Reply doRenew(Conn& c, const wire::Request& req, int64_t now);
  wire::Reply doRelease(Conn& c, const wire::Request& req);
  /// Job `b`'s database row (its registration with the plan as booked) at `now` (monotonic ms),
  /// `wall` (wall-clock ms).
  static StoredJob storedOf(const plan::BookedJob& b, int64_t now, int64_t wall);
  /// Stores job `id` as the books now have it (its lanes changed: a restart books them).
  void storeJob(uint64_t id);
  /// Asks running jobs to move lanes where the books say so (FabricBook::planMoves); logs it.
  void planMoves(int64_t now);
  bool movesDue = false;  // the books changed since the last look for moves
};

Service::Service(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Service::~Service() = default;

Status Service::start(const Options& o, std::unique_ptr<Service>* out) {
  plan::Topology topo;
  if (!o.fatTree.empty())
    C4_CHECK(plan::Topology::fatTreeFromSpec(o.fatTree, &topo));
  else
    C4_CHECK(plan::Topology::load(o.topoPath, &topo));
  wire::Key key;
  C4_CHECK(plan::readKeyFile(o.keyPath, &key));
  uint64_t probe = 0;
  C4_CHECK(randomBytes(&probe, sizeof probe));
  std::unique_ptr<Impl> impl(new Impl(std::move(topo)));
  impl->opt = o;
  impl->key = key;
  C4_CHECK(Store::open(o.dbPath, impl->book.topology().hash(), &impl->store));
  C4_CHECK(impl->restore());
  C4_CHECK(impl->listen());
  out->reset(new Service(std::move(impl)));
  return Status::ok();
}

int Service::run() { return impl_->loop(); }

Status Service::Impl::restore() {
  std::vector<StoredJob> stored;
  C4_CHECK(store->loadJobs(&stored));
  const int64_t now = detail::nowMs(), wall = wallMs();
  std::vector<std::pair<uint64_t, std::string>> dropped;  // id, why
  std::vector<const plan::BookedJob*> restored;
  for (const StoredJob& j : stored) {
    wire::Request req;
    Status st = wire::parseRequest(j.spec, &req);
    if (st.isOk() && req.op != wire::Op::kRegister)
      st = makeError(Code::kInvalidArgument, "its spec is a %s request, not a registration", wire::opName(req.op));
    const int64_t lease = j.leaseMs > 0 ? std::min(j.leaseMs, wire::kMaxLeaseMs) : opt.leaseMs;
    const plan::BookedJob* b = nullptr;
    // The plan as it was booked (job.keep): nothing is planned again, nothing moves.
    if (st.isOk()) st = book.add(j.id, j.token, req.job, now, lease, &b);
    if (!st.isOk()) {
      dropped.emplace_back(j.id, st.message());
      logLine("dropping stored %s: %s", jobLabel(j.name, j.id).c_str(), st.message().c_str());
      continue;
    }
    restored.push_back(b);
  }
  Store::Transaction t(store.get());
  C4_CHECK(t.begin());
  for (const auto& [id, why] : dropped) {
    C4_CHECK(store->deleteJob(id));
    C4_CHECK(store->addEvent(wall, "refuse", id, "dropped from the database at start: " + why));
  }
  // Leases restart now: a job that is alive renews within its lease, a dead one expires.
  for (const plan::BookedJob* b : restored) C4_CHECK(store->renewJob(b->id, b->leaseMs, wall + b->leaseMs));
  C4_CHECK(t.commit());
  if (!stored.empty())
    logLine("restored %zu job(s) from %s, each leased anew from now%s", restored.size(), store->path().c_str(),
            dropped.empty() ? "" : strFormat(" (%zu dropped)", dropped.size()).c_str());
  return Status::ok();
}

Status Service::Impl::listen() {
  detail::SockAddr addr, bound;
  Status st = detail::parseHostPort(opt.listen, &addr);
  if (!st.isOk()) return makeError(Code::kInvalidArgument, "--listen %s: %s", opt.listen.c_str(), st.message().c_str());
  st = detail::listenSocket(addr, SOMAXCONN, true, &listenFd, &bound);
  if (!st.isOk())
    return makeError(Code::kInvalidArgument, "cannot listen on %s: %s", opt.listen.c_str(), st.message().c_str());
  listenAddr = bound.toString();

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigFd.reset(signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!sigFd.valid()) return sysError("signalfd", errno);

  if (!opt.portFile.empty()) {
    // Written whole under another name, then renamed: a reader never sees half of it.
    const std::string tmp = opt.portFile + ".tmp";
    const std::string text = std::to_string(bound.port()) + "\n";
    detail::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd.valid() || !writeAll(fd.get(), text.data(), text.size()))
      return makeError(Code::kInvalidArgument, "--port-file %s: %s", tmp.c_str(), strerror(errno));
    fd.reset();
    if (rename(tmp.c_str(), opt.portFile.c_str()) != 0)
      return makeError(Code::kInvalidArgument, "--port-file %s: %s", opt.portFile.c_str(), strerror(errno));
  }
  const plan::Topology& t = book.topology();
  logLine(
      "listening on %s: fabric %s (hash %016llx, %d hosts, %d links), database %s with %zu job(s), leases %lld ms "
      "by default (%lld to %lld ms), at most %zu clients",
      listenAddr.c_str(), t.source().c_str(), static_cast<unsigned long long>(t.hash()), t.numHosts(), t.numLinks(),
      store->path().c_str(), book.jobs().size(), static_cast<long long>(opt.leaseMs),
      static_cast<long long>(opt.minLeaseMs), static_cast<long long>(wire::kMaxLeaseMs), opt.maxClients);
  return Status::ok();
}

void Service::Impl::event(const char* kind, uint64_t job, const std::string& text) {
  Status st = store->addEvent(wallMs(), kind, job, text);
  if (!st.isOk())
    logLine("%s", st.message().c_str());
  else
    eventsAdded = true;
}

void Service::Impl::noteRefusal(int64_t now, const std::string& text) {
  flushRefusals(now);
  if (refusalWindowMs < 0) refusalWindowMs = now;
  if (refusalsInWindow++ < kRefusalsPerWindow) {
    logLine("%s", text.c_str());
    event("refuse", 0, text);
  } else {
    ++refusalsFolded;
  }
}

void Service::Impl::flushRefusals(int64_t now) {
  if (refusalWindowMs < 0 || now - refusalWindowMs < kRefusalWindowMs) return;
  if (refusalsFolded > 0) {
    const std::string text =
        strFormat("%llu more connection(s) refused in the last %lld s, not logged one by one",
                  static_cast<unsigned long long>(refusalsFolded), static_cast<long long>(kRefusalWindowMs / 1000));
    logLine("%s", text.c_str());
    event("refuse", 0, text);
  }
  refusalWindowMs = -1;
  refusalsInWindow = 0;
  refusalsFolded = 0;
}

void Service::Impl::refuseConn(Conn& c, int64_t now, const std::string& why) {
  noteRefusal(now, "refused connection from " + c.peer + ": " + why);
  closeConn(c);
}

// Refusals of authenticated requests: they come from holders of the key, so each is logged.
void Service::Impl::refuseJob(const std::string& text, uint64_t job) {
  logLine("%s", text.c_str());
  event("refuse", job, text);
}

void Service::Impl::closeConn(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  reservedTotal -= c.reserved;
  c.reserved = 0;
  c.fd.reset();
  std::string().swap(c.in);
  std::string().swap(c.out);
  c.outOff = 0;
}

void Service::Impl::acceptSome(int64_t now) {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    detail::Fd fd;
    detail::SockAddr peer;
    Status st = acceptGuard.accept(listenFd.get(), &fd, &peer);
    if (!st.isOk()) {
      logLine("%s", st.message().c_str());
      return;
    }
    if (!fd.valid()) return;
    const std::string from = peer.toString();
    if (conns.size() >= opt.maxClients) {
      noteRefusal(now, strFormat("refused connection from %s: %zu clients connected (--max-clients)", from.c_str(),
                                 conns.size()));
      continue;  // fd closes here
    }
    std::unique_ptr<Conn> c(new Conn());
    wire::Greeting g;
    st = randomBytes(&g.nonce, sizeof g.nonce);
    if (!st.isOk()) {
      logLine("refused connection from %s: %s", from.c_str(), st.message().c_str());
      continue;
    }
    c->fd = std::move(fd);
    c->peer = from;
    c->session.key = key;
    c->session.serviceNonce = g.nonce;
    c->out = wire::encodeGreeting(g);
    c->deadlineMs = now + kGreetingMs;
    c->lastActiveMs = now;
    if (opt.verbose) logLine("connection from %s", from.c_str());
    conns.push_back(std::move(c));
    flush(*conns.back(), now);
  }
}

void Service::Impl::flush(Conn& c, int64_t now) {
  while (!c.dead && c.pendingOut()) {
    size_t n = 0;
    Status st = detail::writeSome(c.fd.get(), c.out.data() + c.outOff, c.out.size() - c.outOff, &n);
    if (!st.isOk()) {
      if (opt.verbose) logLine("connection from %s: %s", c.peer.c_str(), st.message().c_str());
      closeConn(c);
      return;
    }
    if (n == 0) return;
    c.outOff += n;
    c.lastActiveMs = now;
  }
  if (!c.dead && !c.out.empty()) {
    c.outOff = 0;
    if (c.out.capacity() > (1u << 20))
      std::string().swap(c.out);
    else
      c.out.clear();
  }
}

void Service::Impl::onReadable(Conn& c, int64_t now) {
  // One request at a time: while its reply is unsent, nothing more is read (the job waits for it).
  while (!c.dead && !c.pendingOut() && c.state != Conn::State::kWaitBudget) {
    const size_t need = c.state == Conn::State::kGreeting ? wire::kGreetingBytes
                        : c.state == Conn::State::kHeader ? wire::kHeaderBytes
                                                          : c.hdr.length;
    size_t n = 0;
    Status st = detail::readSome(c.fd.get(), scratch.data(), std::min(need - c.in.size(), scratch.size()), &n);
    if (!st.isOk()) {
      if (c.state == Conn::State::kHeader && c.in.empty()) {
        if (opt.verbose) logLine("connection from %s closed", c.peer.c_str());
      } else if (opt.verbose) {
        logLine("connection from %s closed mid-%s: %s", c.peer.c_str(),
                c.state == Conn::State::kGreeting ? "greeting" : "frame", st.message().c_str());
      }
      closeConn(c);
      return;
    }
    if (n == 0) return;
    c.in.append(scratch.data(), n);
    c.lastActiveMs = now;
    if (c.in.size() == need) advance(c, now);
  }
}

void Service::Impl::advance(Conn& c, int64_t now) {
  switch (c.state) {
    case Conn::State::kGreeting: {
      wire::Greeting g;
      Status st = wire::parseGreeting(c.in.data(), c.in.size(), &g);
      if (!st.isOk()) return refuseConn(c, now, st.message());
      c.session.jobNonce = g.nonce;
      c.in.clear();
      c.state = Conn::State::kHeader;
      c.deadlineMs = 0;
      return;
    }
    case Conn::State::kHeader: {
      // The length is checked here, before a byte of the payload is read or held.
      Status st = wire::parseFrameHeader(c.in.data(), c.in.size(), wire::kMaxFrameBytes, &c.hdr);
      if (!st.isOk())
        return refuseConn(
            c, now, strFormat("frame %llu: %s", static_cast<unsigned long long>(c.recvSeq), st.message().c_str()));
      if (c.hdr.seq != c.recvSeq)
        return refuseConn(
            c, now,
            strFormat("frame %llu arrived numbered %llu (replayed or out of order)",
                      static_cast<unsigned long long>(c.recvSeq), static_cast<unsigned long long>(c.hdr.seq)));
      c.in.clear();
      if (c.hdr.length == 0) return onFrame(c, now);
      c.state = Conn::State::kWaitBudget;
      c.waitSerial = ++waitSerial;
      if (!tryAdmit(c, now) && opt.verbose)
        logLine("connection from %s: a frame of %u bytes waits for buffer space", c.peer.c_str(), c.hdr.length);
      return;
    }
    case Conn::State::kPayload:
      return onFrame(c, now);
    case Conn::State::kWaitBudget:
      return;
  }
}

bool Service::Impl::tryAdmit(Conn& c, int64_t now) {
  const size_t n = c.hdr.length;
  if (n > kSmallFrame && reservedTotal + n > kBufferBudget) return false;
  c.reserved = n;
  reservedTotal += n;
  c.state = Conn::State::kPayload;
  c.deadlineMs = now + kFrameMs;
  return true;
}

void Service::Impl::admitWaiting(int64_t now) {
  std::vector<Conn*> waiting;
  for (auto& c : conns)
    if (!c->dead && c->state == Conn::State::kWaitBudget) waiting.push_back(c.get());
  std::sort(waiting.begin(), waiting.end(), [](Conn* x, Conn* y) { return x->waitSerial < y->waitSerial; });
  for (Conn* c : waiting) {
    if (!tryAdmit(*c, now)) return;  // first come, first served: a large frame is not overtaken forever
    onReadable(*c, now);
  }
}

void Service::Impl::onFrame(Conn& c, int64_t now) {
  const bool authentic = wire::frameAuthentic(c.session, wire::Dir::kToService, c.recvSeq, c.hdr, c.in.data());
  reservedTotal -= c.reserved;
  c.reserved = 0;
  if (!authentic)
    return refuseConn(c, now,
                      strFormat("frame %llu fails authentication (another key, or tampered with)",
                                static_cast<unsigned long long>(c.recvSeq)));
  ++c.recvSeq;
  std::string payload;
  payload.swap(c.in);
  c.state = Conn::State::kHeader;
  c.deadlineMs = 0;
  const wire::Reply rep = handle(c, payload, now);
  std::string text = wire::encodeReply(rep);
  if (text.size() > wire::kMaxFrameBytes) {
    wire::Reply e;
    e.error = strFormat("fabric service: the reply has %zu bytes, above the frame limit of %zu", text.size(),
                        wire::kMaxFrameBytes);
    text = wire::encodeReply(e);
  }
  c.out += wire::sealFrame(c.session, wire::Dir::kToJob, c.sendSeq++, text);
  flush(c, now);
}

wire::Reply Service::Impl::handle(Conn& c, const std::string& payload, int64_t now) {
  wire::Request req;
  Status st = wire::parseRequest(payload, &req);
  if (!st.isOk()) {
    refuseJob(strFormat("refused a request from %s: %s", c.peer.c_str(), st.message().c_str()));
    wire::Reply rep;
    rep.error = st.message();
    return rep;
  }
  switch (req.op) {
    case wire::Op::kRegister:
      return doRegister(c, req, now);
    case wire::Op::kRenew:
      return doRenew(c, req, now);
    case wire::Op::kRelease:
      return doRelease(c, req);
    case wire::Op::kStatus: {
      if (opt.verbose) logLine("status for %s", c.peer.c_str());
      wire::Reply rep;
      rep.ok = true;
      rep.status = book.statusJson(now);
      return rep;
    }
  }
  wire::Reply rep;
  rep.error = "fabric service: an unknown op";
  return rep;
}

wire::Reply Service::Impl::doRegister(Conn& c, const wire::Request& req, int64_t now) {
  wire::Reply rep;
  const int64_t lease = grantLease(req.leaseMs);
  uint64_t id = 0, token = 0;
  Status st;
  do {
    st = randomBytes(&id, sizeof id);
    id &= static_cast<uint64_t>(INT64_MAX);  // positive in SQLite's INTEGER, and in the sqlite3 shell
  } while (st.isOk() && (id == 0 || book.find(id) != nullptr));
  while (st.isOk() && token == 0) st = randomBytes(&token, sizeof token);
  const double before = book.fabricSeconds();
  const plan::BookedJob* b = nullptr;
  if (st.isOk()) st = book.add(id, token, req.job, now, lease, &b);
  if (!st.isOk()) {
    refuseJob(strFormat("refused job '%s' from %s: %s", printable(req.job.name).c_str(), c.peer.c_str(),
                        st.message().c_str()));
    rep.error = st.message();
    return rep;
  }
  const bool kept = !req.job.keep.empty();
  const double after = book.fabricSeconds();
  const double solo = b->plan.maxLinkSeconds(book.topology());
  const std::string label = jobLabel(b->spec.name, id);
  const std::string text = strFormat(
      "register %s from %s: %zu ranks, %zu flows, %d lane(s) per connection, lease %lld ms, %s; most "
      "loaded link %.3f ms before, %.3f ms after (the job alone %.3f ms)",
      label.c_str(), c.peer.c_str(), b->spec.ranks.size(), b->spec.flows.size(), b->spec.lanes,
      static_cast<long long>(lease), kept ? "its own plan booked as it is" : "planned on the others' load",
      before * 1e3, after * 1e3, solo * 1e3);

  const int64_t wall = wallMs();
  const StoredJob sj = storedOf(*b, now, wall);
  st = [&]() -> Status {
    Store::Transaction t(store.get());
    C4_CHECK(t.begin());
    C4_CHECK(store->putJob(sj));
    C4_CHECK(store->addEvent(wall, "register", id, text));
    return t.commit();
  }();
  if (!st.isOk()) {
    // Not booked unless stored: a restart must not forget a job that was told it is booked.
    bool unknown = false;
    (void)book.release(id, token, &unknown);
    refuseJob(
        strFormat("refused %s from %s: cannot store it: %s", label.c_str(), c.peer.c_str(), st.message().c_str()));
    rep.error = "fabric service: cannot store the job: " + st.message();
    return rep;
  }
  eventsAdded = true;
  movesDue = true;
  logLine("%s", text.c_str());
  rep.ok = true;
  rep.id = id;
  rep.token = token;
  rep.leaseMs = lease;
  rep.conns = b->plan.conns;
  rep.fabricSeconds = after;
  rep.soloSeconds = solo;
  return rep;
}

wire::Reply Service::Impl::doRenew(Conn& c, const wire::Request& req, int64_t now) {
  wire::Reply rep;
  bool unknown = false;
  // Asking for no lease keeps the job's own.
  Status st = book.renew(req.id, req.token, now, req.leaseMs > 0 ? grantLease(req.leaseMs) : 0, &unknown);
  if (unknown) {
    logLine("renewal of unknown job %016llx from %s: told to register again", static_cast<unsigned long long>(req.id),
            c.peer.c_str());
    rep.unknownJob = true;
    rep.error = st.message() + ": register again";
    return rep;
  }
  const plan::BookedJob* b = book.find(req.id);
  if (!st.isOk()) {
    refuseJob(strFormat("refused renewal of %s from %s: %s", jobLabel(b->spec.name, req.id).c_str(), c.peer.c_str(),
                        st.message().c_str()),
              req.id);
    rep.error = st.message();
    return rep;
  }
  st = store->renewJob(req.id, b->leaseMs, wallMs() + b->leaseMs);
  if (!st.isOk()) logLine("renewal of %s: %s", jobLabel(b->spec.name, req.id).c_str(), st.message().c_str());
  if (opt.verbose)
    logLine("renew %s from %s: lease %lld ms", jobLabel(b->spec.name, req.id).c_str(), c.peer.c_str(),
            static_cast<long long>(b->leaseMs));
  const std::string label = jobLabel(b->spec.name, req.id);
  if (!req.report.empty()) {
    // The job's lanes as it runs them, and its samples: links it found slow or cut are booked for
    // every job, and the jobs crossing them are asked to move at once.
    std::vector<int> changed;
    st = book.report(req.id, req.token, req.report, now, opt.linkHoldMs, &changed);
    if (!st.isOk()) {
      refuseJob(strFormat("refused the report of %s from %s: %s", label.c_str(), c.peer.c_str(), st.message().c_str()),
                req.id);
    } else {
      if (!req.report.lanes.empty()) {
        storeJob(req.id);
        movesDue = true;
        if (opt.verbose) logLine("%s runs new lanes on %zu connection(s)", label.c_str(), req.report.lanes.size());
      }
      for (int l : changed) {
        const plan::LinkHealth& h = book.linkHealth().at(l);
        const std::string text = strFormat(
            "link %s booked %s (planned at %.0f%% of its capacity for %lld s) from the lanes of %s; most loaded "
            "link now %.3f ms",
            book.topology().link(l).name.c_str(), plan::linkStateName(h.state), h.capacity * 100,
            static_cast<long long>(opt.linkHoldMs / 1000), label.c_str(), book.fabricSeconds() * 1e3);
        logLine("%s", text.c_str());
        event("health", req.id, text);
      }
      if (!changed.empty()) planMoves(now);
    }
  }
  rep.ok = true;
  rep.id = req.id;
  rep.leaseMs = b->leaseMs;
  rep.moves = book.takeMoves(req.id, &rep.moveWhy);
  if (!rep.moves.empty()) logLine("%s takes %zu lane move(s) with its renewal", label.c_str(), rep.moves.size());
  return rep;
}

StoredJob Service::Impl::storedOf(const plan::BookedJob& b, int64_t now, int64_t wall) {
  // What a restart books again: the registration with the plan as booked.
  wire::Request keep;
  keep.op = wire::Op::kRegister;
  keep.job = b.spec;
  keep.job.keep = b.plan.conns;
  keep.leaseMs = b.leaseMs;
  StoredJob sj;
  sj.id = b.id;
  sj.token = b.token;
  sj.name = b.spec.name;
  sj.spec = wire::encodeRequest(keep);
  sj.registeredMs = wall - (now - b.registeredMs);
  sj.leaseMs = b.leaseMs;
  sj.leaseUntilMs = wall + (b.leaseUntilMs - now);
  return sj;
}

void Service::Impl::storeJob(uint64_t id) {
  const plan::BookedJob* b = book.find(id);
  if (b == nullptr) return;
  Status st = store->putJob(storedOf(*b, detail::nowMs(), wallMs()));
  if (!st.isOk()) logLine("storing %s: %s", jobLabel(b->spec.name, id).c_str(), st.message().c_str());
}

void Service::Impl::planMoves(int64_t now) {
  movesDue = false;
  plan::MovePolicy policy;
  policy.minIntervalMs = opt.moveIntervalMs;
  policy.minGain = opt.moveGain;
  const double before = book.fabricSeconds();
  const std::vector<uint64_t> moved = book.planMoves(now, policy);
  for (uint64_t id : moved) {
    const plan::BookedJob* b = book.find(id);
    const std::string text =
        strFormat("move %zu lane(s) of %s: %s; most loaded link %.3f ms -> %.3f ms", b->moves.size(),
                  jobLabel(b->spec.name, id).c_str(), b->moveWhy.c_str(), before * 1e3, book.fabricSeconds() * 1e3);
    logLine("%s", text.c_str());
    event("move", id, text);
    storeJob(id);
  }
}

wire::Reply Service::Impl::doRelease(Conn& c, const wire::Request& req) {
  wire::Reply rep;
  const plan::BookedJob* b = book.find(req.id);
  const std::string label = jobLabel(b ? b->spec.name : std::string(), req.id);
  bool unknown = false;
  Status st = book.release(req.id, req.token, &unknown);
  if (unknown) {
    logLine("release of unknown job %016llx from %s", static_cast<unsigned long long>(req.id), c.peer.c_str());
    rep.unknownJob = true;
    rep.error = st.message();
    return rep;
  }
  if (!st.isOk()) {
    refuseJob(strFormat("refused release of %s from %s: %s", label.c_str(), c.peer.c_str(), st.message().c_str()),
              req.id);
    rep.error = st.message();
    return rep;
  }
  movesDue = true;
  const std::string text = strFormat("release %s from %s; most loaded link now %.3f ms", label.c_str(), c.peer.c_str(),
                                     book.fabricSeconds() * 1e3);
  st = [&]() -> Status {
    Store::Transaction t(store.get());
    C4_CHECK(t.begin());
    C4_CHECK(store->deleteJob(req.id));
    C4_CHECK(store->addEvent(wallMs(), "release", req.id, text));
    return t.commit();
  }();
  if (st.isOk()) eventsAdded = true;
  logLine("%s", text.c_str());
  if (!st.isOk())
    logLine("release of %s: %s (a restart books it again until its lease runs out)", label.c_str(),
            st.message().c_str());
  rep.ok = true;
  rep.id = req.id;
  return rep;
}

void Service::Impl::tick(int64_t now) {
  std::map<uint64_t, std::pair<std::string, int64_t>> due;  // id: name, lease
  for (const auto& [id, j] : book.jobs())
    if (j.leaseUntilMs <= now) due[id] = {j.spec.name, j.leaseMs};
  std::vector<int> healed;
  for (const auto& [l, h] : book.linkHealth())
    if (h.untilMs <= now) healed.push_back(l);
  const std::vector<uint64_t> gone = book.expire(now);
  for (int l : healed) {
    const std::string text =
        strFormat("link %s believed well again (booked bad for %lld s; jobs may use it)",
                  book.topology().link(l).name.c_str(), static_cast<long long>(opt.linkHoldMs / 1000));
    logLine("%s", text.c_str());
    event("health", 0, text);
  }
  if (!gone.empty() || !healed.empty()) movesDue = true;
  if (!gone.empty()) {
    const double after = book.fabricSeconds();
    std::vector<std::pair<uint64_t, std::string>> lines;
    for (uint64_t id : gone) {
      auto it = due.find(id);
      const std::string name = it == due.end() ? std::string() : it->second.first;
      const long long lease = it == due.end() ? 0 : static_cast<long long>(it->second.second);
      lines.emplace_back(id,
                         strFormat("expire %s: no renewal within its lease of %lld ms; most loaded link now %.3f ms",
                                   jobLabel(name, id).c_str(), lease, after * 1e3));
    }
    const int64_t wall = wallMs();
    Status st = [&]() -> Status {
      Store::Transaction t(store.get());
      C4_CHECK(t.begin());
      for (const auto& [id, text] : lines) {
        C4_CHECK(store->deleteJob(id));
        C4_CHECK(store->addEvent(wall, "expire", id, text));
      }
      return t.commit();
    }();
    for (const auto& l : lines) logLine("%s", l.second.c_str());
    if (st.isOk())
      eventsAdded = true;
    else
      logLine("expiry: %s (a restart books the expired jobs again until their leases run out)", st.message().c_str());
  }
  if (movesDue) planMoves(now);
  flushRefusals(now);
  if (eventsAdded) {
    Status st = store->trimEvents();
    if (!st.isOk()) logLine("%s", st.message().c_str());
    eventsAdded = false;
  }
}

void Service::Impl::sweep(int64_t now) {
  for (auto& p : conns) {
    Conn& c = *p;
    if (c.dead) continue;
    if (c.deadlineMs > 0 && now >= c.deadlineMs) {
      if (c.state == Conn::State::kGreeting)
        refuseConn(c, now, strFormat("no greeting within %lld s", static_cast<long long>(kGreetingMs / 1000)));
      else
        refuseConn(
            c, now,
            strFormat("frame %llu: %zu of its %u bytes within %lld s", static_cast<unsigned long long>(c.recvSeq),
                      c.in.size(), c.hdr.length, static_cast<long long>(kFrameMs / 1000)));
    } else if (now - c.lastActiveMs >= kIdleMs) {
      logLine("closing the connection from %s: idle for %lld minutes", c.peer.c_str(),
              static_cast<long long>(kIdleMs / 60000));
      closeConn(c);
    }
  }
  conns.erase(std::remove_if(conns.begin(), conns.end(), [](const std::unique_ptr<Conn>& c) { return c->dead; }),
              conns.end());
}

int Service::Impl::loop() {
  std::vector<pollfd> pfds;
  nextTickMs = detail::nowMs() + kTickMs;
  for (;;) {
    int64_t now = detail::nowMs();
    const bool listening = !acceptGuard.paused(now);
    pfds.clear();
    pfds.push_back({sigFd.get(), POLLIN, 0});
    pfds.push_back({listening ? listenFd.get() : -1, POLLIN, 0});
    int64_t wake = nextTickMs;
    if (!listening) wake = std::min(wake, acceptGuard.resumeAtMs());
    for (auto& c : conns) {
      short ev = 0;
      if (c->pendingOut())
        ev = POLLOUT;
      else if (c->state != Conn::State::kWaitBudget)
        ev = POLLIN;
      pfds.push_back({c->fd.get(), ev, 0});
      if (c->deadlineMs > 0) wake = std::min(wake, c->deadlineMs);
      wake = std::min(wake, c->lastActiveMs + kIdleMs);
    }
    const int timeout = static_cast<int>(std::max<int64_t>(0, std::min(wake - now, kTickMs)));
    const int rc = poll(pfds.data(), pfds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      logLine("poll: %s", strerror(errno));
      return shutdown(1);
    }
    now = detail::nowMs();
    if (rc > 0 && (pfds[0].revents & POLLIN)) {
      signalfd_siginfo si{};
      const ssize_t n = read(sigFd.get(), &si, sizeof si);
      const int sig = n == static_cast<ssize_t>(sizeof si) ? static_cast<int>(si.ssi_signo) : SIGTERM;
      logLine("%s: shutting down; %zu job(s) kept in %s", sig == SIGINT ? "SIGINT" : "SIGTERM", book.jobs().size(),
              store->path().c_str());
      return shutdown(0);
    }
    if (rc > 0) {
      // Only the connections polled: those accepted below come after them.
      const size_t polled = pfds.size() - 2;
      for (size_t i = 0; i < polled; ++i) {
        Conn& c = *conns[i];
        const short re = pfds[i + 2].revents;
        if (re == 0 || c.dead) continue;
        if (re & POLLNVAL) {
          logLine("connection from %s: invalid descriptor", c.peer.c_str());
          closeConn(c);
          continue;
        }
        if (c.pendingOut()) {
          flush(c, now);  // an error (POLLERR, POLLHUP) shows as a failed send
          if (!c.dead && !c.pendingOut()) onReadable(c, now);
        } else if (c.state == Conn::State::kWaitBudget) {
          if (re & (POLLERR | POLLHUP)) {
            if (opt.verbose) logLine("connection from %s closed mid-frame", c.peer.c_str());
            closeConn(c);
          }
        } else {
          onReadable(c, now);
        }
      }
    }
    sweep(now);
    admitWaiting(now);
    if ((rc > 0 && listening && (pfds[1].revents & POLLIN)) || acceptGuard.retryDue(now)) acceptSome(now);
    if (now >= nextTickMs) {
      tick(now);
      nextTickMs = now + kTickMs;
    }
  }
}

int Service::Impl::shutdown(int code) {
  for (auto& c : conns) closeConn(*c);
  conns.clear();
  listenFd.reset();
  Status st = store->close();
  if (!st.isOk()) {
    logLine("%s", st.message().c_str());
    return 1;
  }
  logLine("stopped");
  return code;
}

}  // namespace c4::fabricd
