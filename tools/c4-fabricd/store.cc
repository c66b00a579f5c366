#include "store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/status.hpp"

namespace c4::fabricd {

namespace {

// SQLite's INTEGER is signed 64-bit: ids and tokens travel bit for bit.
int64_t toSql(uint64_t v) {
  int64_t s;
  memcpy(&s, &v, sizeof s);
  return s;
}
uint64_t fromSql(int64_t s) {
  uint64_t v;
  memcpy(&v, &s, sizeof v);
  return v;
}

std::string hex64(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

std::string columnText(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(s, col)))
           : std::string();
}

const char* const kSchema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);"
    "CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY, token INTEGER NOT NULL, name TEXT, spec TEXT NOT NULL,"
    " registered_ms INTEGER, lease_ms INTEGER, lease_until_ms INTEGER);"
    "CREATE TABLE IF NOT EXISTS events(t_ms INTEGER, kind TEXT, job INTEGER, text TEXT);";

const char* const kStmtSql[] = {
    "BEGIN IMMEDIATE",
    "COMMIT",
    "ROLLBACK",
    "SELECT id, token, name, spec, registered_ms, lease_ms, lease_until_ms FROM jobs ORDER BY id",
    "INSERT OR REPLACE INTO jobs(id, token, name, spec, registered_ms, lease_ms, lease_until_ms)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    "UPDATE jobs SET lease_ms = ?2, lease_until_ms = ?3 WHERE id = ?1",
    "DELETE FROM jobs WHERE id = ?1",
    "INSERT INTO events(t_ms, kind, job, text) VALUES(?1, ?2, ?3, ?4)",
    // events has no declared key: rows get increasing rowids (max + 1), so the last kMaxEvents
    // are those above max - kMaxEvents.
    "DELETE FROM events WHERE rowid <= (SELECT max(rowid) FROM events) - ?1",
};

}  // namespace

Status Store::error(const char* what) const {
  return makeError(Code::kSystemError, "database %s: %s: %s", path_.c_str(), what,
                   db_ ? sqlite3_errmsg(db_) : "not open");
}

Status Store::open(const std::string& path, uint64_t topoHash, std::unique_ptr<Store>* out) {
  std::unique_ptr<Store> s(new Store());
  s->path_ = path;
  // Created here, not by SQLite, so that it is 0600 from the start (SQLite gives its -wal and -shm
  // files the database's mode): the tokens in it release jobs.
  s->lockFd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (s->lockFd_ < 0) return makeError(Code::kSystemError, "database %s: %s", path.c_str(), strerror(errno));
  struct stat st {};
  if (fstat(s->lockFd_, &st) != 0)
    return makeError(Code::kSystemError, "database %s: %s", path.c_str(), strerror(errno));
  if (!S_ISREG(st.st_mode)) return makeError(Code::kSystemError, "database %s is not a regular file", path.c_str());
  // flock and SQLite's POSIX locks do not interact on Linux; this descriptor stays open until
  // after sqlite3_close, so closing it cannot drop SQLite's locks either.
  if (flock(s->lockFd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return makeError(Code::kSystemError, "database %s is in use by another c4-fabricd (it holds a lock on it)",
                       path.c_str());
    return makeError(Code::kSystemError, "database %s: lock: %s", path.c_str(), strerror(errno));
  }
  int flags = SQLITE_OPEN_READWRITE;
#ifdef SQLITE_OPEN_NOFOLLOW
  flags |= SQLITE_OPEN_NOFOLLOW;
#endif
  if (sqlite3_open_v2(path.c_str(), &s->db_, flags, nullptr) != SQLITE_OK) return s->error("open");
  sqlite3_extended_result_codes(s->db_, 1);
  C4_CHECK(s->init(topoHash));
  *out = std::move(s);
  return Status::ok();
}

Status Store::init(uint64_t topoHash) {
  // A reader (the sqlite3 shell) may hold a lock for a moment.
  sqlite3_busy_timeout(db_, 2000);
  // WAL with synchronous=NORMAL: a commit survives the service's crash; a power loss may lose the
  // last ones, which jobs repair by re-registering with their plan (unknownJob on renewal).
  sqlite3_stmt* wal = nullptr;
  if (sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, &wal, nullptr) != SQLITE_OK)
    return error("not an SQLite database? PRAGMA journal_mode");
  const int rc = sqlite3_step(wal);
  const std::string mode = rc == SQLITE_ROW ? columnText(wal, 0) : std::string();
  sqlite3_finalize(wal);
  if (rc != SQLITE_ROW) return error("not an SQLite database? PRAGMA journal_mode");
  if (mode != "wal")
    return makeError(Code::kSystemError, "database %s: cannot use WAL journal mode (got '%s')", path_.c_str(),
                     mode.c_str());
  C4_CHECK(exec("PRAGMA synchronous=NORMAL"));
  C4_CHECK(exec(kSchema));

  // The fabric and schema the database was written for.
  std::string haveHash, haveSchema;
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT key, value FROM meta WHERE key IN ('topo_hash', 'schema')", -1, &q, nullptr) !=
      SQLITE_OK)
    return error("read meta");
  int r;
  while ((r = sqlite3_step(q)) == SQLITE_ROW) {
    const std::string key = columnText(q, 0);
    (key == "topo_hash" ? haveHash : haveSchema) = columnText(q, 1);
  }
  sqlite3_finalize(q);
  if (r != SQLITE_DONE) return error("read meta");
  const std::string wantHash = hex64(topoHash), wantSchema = std::to_string(kSchemaVersion);
  if (!haveSchema.empty() && haveSchema != wantSchema)
    return makeError(Code::kInvalidArgument,
                     "database %s has schema version %s, this c4-fabricd writes version %s: move the file away "
                     "(its jobs re-register on their own)",
                     path_.c_str(), haveSchema.c_str(), wantSchema.c_str());
  if (!haveHash.empty() && haveHash != wantHash)
    return makeError(Code::kInvalidArgument,
                     "database %s belongs to another fabric (topology hash %s, --topo has %s): pass the --topo it "
                     "was written for, or move the file away (its jobs re-register on their own)",
                     path_.c_str(), haveHash.c_str(), wantHash.c_str());
  if (haveHash.empty() || haveSchema.empty()) {
    const std::string sql = "INSERT OR REPLACE INTO meta(key, value) VALUES('topo_hash', '" + wantHash +
                            "'), ('schema', '" + wantSchema + "')";
    C4_CHECK(exec(sql.c_str()));
  }

  for (int i = 0; i < kNumStmts; ++i)
    if (sqlite3_prepare_v3(db_, kStmtSql[i], -1, SQLITE_PREPARE_PERSISTENT, &stmt_[i], nullptr) != SQLITE_OK)
      return error(kStmtSql[i]);
  return trimEvents();
}

Store::~Store() { (void)close(); }

Status Store::close() {
  Status st;
  if (db_) {
    for (sqlite3_stmt*& s : stmt_) {
      sqlite3_finalize(s);
      s = nullptr;
    }
    // Everything is committed already; fold the WAL into the database file so that the file alone
    // holds the jobs (a copy of it taken now is complete).
    if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr) != SQLITE_OK)
      st = error("checkpoint");
    if (sqlite3_close(db_) != SQLITE_OK && st.isOk()) st = error("close");
    db_ = nullptr;
  } else if (lockFd_ < 0) {
    return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  }
  if (lockFd_ >= 0) {
    ::close(lockFd_);
    lockFd_ = -1;
  }
  return st;
}

Status Store::exec(const char* sql) {
  char* msg = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) != SQLITE_OK) {
    Status st = makeError(Code::kSystemError, "database %s: %s: %s", path_.c_str(), sql, msg ? msg : "error");
    sqlite3_free(msg);
    return st;
  }
  return Status::ok();
}

Status Store::run(Stmt s) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_stmt* st = stmt_[s];
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
  }
  Status out = rc == SQLITE_DONE ? Status::ok() : error(kStmtSql[s]);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

Status Store::loadJobs(std::vector<StoredJob>* out) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_stmt* s = stmt_[kSelectJobs];
  std::vector<StoredJob> jobs;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    StoredJob j;
    j.id = fromSql(sqlite3_column_int64(s, 0));
    j.token = fromSql(sqlite3_column_int64(s, 1));
    j.name = columnText(s, 2);
    j.spec = columnText(s, 3);
    j.registeredMs = sqlite3_column_int64(s, 4);
    j.leaseMs = sqlite3_column_int64(s, 5);
    j.leaseUntilMs = sqlite3_column_int64(s, 6);
    jobs.push_back(std::move(j));
  }
  Status st = rc == SQLITE_DONE ? Status::ok() : error("read jobs");
  sqlite3_reset(s);
  if (st.isOk()) *out = std::move(jobs);
  return st;
}

Status Store::putJob(const StoredJob& j) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_stmt* s = stmt_[kPutJob];
  sqlite3_bind_int64(s, 1, toSql(j.id));
  sqlite3_bind_int64(s, 2, toSql(j.token));
  sqlite3_bind_text(s, 3, j.name.data(), static_cast<int>(j.name.size()), SQLITE_STATIC);
  sqlite3_bind_text(s, 4, j.spec.data(), static_cast<int>(j.spec.size()), SQLITE_STATIC);
  sqlite3_bind_int64(s, 5, j.registeredMs);
  sqlite3_bind_int64(s, 6, j.leaseMs);
  sqlite3_bind_int64(s, 7, j.leaseUntilMs);
  return run(kPutJob);
}

Status Store::renewJob(uint64_t id, int64_t leaseMs, int64_t leaseUntilMs) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_stmt* s = stmt_[kRenewJob];
  sqlite3_bind_int64(s, 1, toSql(id));
  sqlite3_bind_int64(s, 2, leaseMs);
  sqlite3_bind_int64(s, 3, leaseUntilMs);
  return run(kRenewJob);
}

Status Store::deleteJob(uint64_t id) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_bind_int64(stmt_[kDeleteJob], 1, toSql(id));
  return run(kDeleteJob);
}

Status Store::addEvent(int64_t tMs, const char* kind, uint64_t job, const std::string& text) {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_stmt* s = stmt_[kAddEvent];
  sqlite3_bind_int64(s, 1, tMs);
  sqlite3_bind_text(s, 2, kind, -1, SQLITE_STATIC);
  sqlite3_bind_int64(s, 3, toSql(job));
  sqlite3_bind_text(s, 4, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
  return run(kAddEvent);
}

Status Store::trimEvents() {
  if (!db_) return makeError(Code::kInvalidUsage, "database %s: closed", path_.c_str());
  sqlite3_bind_int64(stmt_[kTrim], 1, kMaxEvents);
  return run(kTrim);
}

Status Store::Transaction::begin() {
  C4_CHECK(s_->run(kBegin));
  open_ = true;
  return Status::ok();
}

Status Store::Transaction::commit() {
  C4_CHECK(s_->run(kCommit));
  open_ = false;
  return Status::ok();
}

Store::Transaction::~Transaction() {
  if (open_ && s_->db_) (void)s_->run(kRollback);
}

}  // namespace c4::fabricd
