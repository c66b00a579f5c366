// c4-fabricd's memory across restarts (docs/c4p.md "The fabric service"): one SQLite database with
// the fabric it serves (meta: the topology's hash, the schema version), every job it keeps (jobs:
// id, token, the registration with the booked plan as its keep list, lease) and what happened
// (events: register, release, expire, refuse; the last kMaxEvents rows). WAL journal, prepared
// statements; the caller groups writes with Transaction. One thread.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c4comm/status.hpp"

namespace c4::fabricd {

/// A job as the database holds it. Times are wall-clock ms (CLOCK_REALTIME).
struct StoredJob {
  uint64_t id = 0, token = 0;
  std::string name;
  std::string spec;  // wire::encodeRequest of a kRegister request whose job.keep is the booked plan
  int64_t registeredMs = 0, leaseMs = 0, leaseUntilMs = 0;
};

class Store {
 public:
  static constexpr int kSchemaVersion = 1;
  static constexpr int64_t kMaxEvents = 100000;

  /// Opens (creating it with mode 0600) the database at `path` for the fabric whose topology hash
  /// is `topoHash`, and takes an exclusive lock on it (flock) so that a second service cannot
  /// share it. Errors: kInvalidArgument when the database belongs to another fabric or another
  /// schema (the message says what to do), kSystemError for anything else (unreadable, locked,
  /// not a database).
  static Status open(const std::string& path, uint64_t topoHash, std::unique_ptr<Store>* out);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const { return path_; }

  /// Every stored job, by id.
  Status loadJobs(std::vector<StoredJob>* out);
  /// Inserts the job (or replaces the row with its id).
  Status putJob(const StoredJob& job);
  /// Sets a job's lease (ms) and when it runs out (wall clock). A missing row is not an error.
  Status renewJob(uint64_t id, int64_t leaseMs, int64_t leaseUntilMs);
  /// Deletes a job's row (a missing row is not an error).
  Status deleteJob(uint64_t id);
  /// Appends an event: kind is "register", "release", "expire" or "refuse"; job 0 when none.
  Status addEvent(int64_t tMs, const char* kind, uint64_t job, const std::string& text);
  /// Deletes all but the last kMaxEvents events (cheap when there is nothing to delete).
  Status trimEvents();
  /// Writes the WAL back into the database file and closes it (the destructor does the same,
  /// ignoring errors). Further calls fail.
  Status close();

  /// A transaction: begun by begin(), rolled back on destruction unless commit() succeeded.
  class Transaction {
   public:
    explicit Transaction(Store* s) : s_(s) {}
    ~Transaction();
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;
    Status begin();
    Status commit();

   private:
    Store* s_;
    bool open_ = false;
  };

 private:
  enum Stmt { kBegin, kCommit, kRollback, kSelectJobs, kPutJob, kRenewJob, kDeleteJob, kAddEvent, kTrim, kNumStmts };
  Store() = default;
  Status init(uint64_t topoHash);
  Status exec(const char* sql);
  /// Resets statement `s`, runs it to completion (rows ignored) and resets it again.
  Status run(Stmt s);
  Status error(const char* what) const;

  std::string path_;
  int lockFd_ = -1;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_[kNumStmts] = {};
};

}  // namespace c4::fabricd
