// The communicator (c4::Comm) and the operations it runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "core/bootstrap.hpp"
#include "core/executor.hpp"
#include "core/tuner.hpp"
#include "sched/schedule.hpp"
#include "transports/transport.hpp"

namespace c4 {

/// One call as the user made it, validated.
struct OpDesc {
  Coll coll = Coll::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;  // root for rooted collectives, peer for Send/Recv
};

/// A PreMulSum operator created on a communicator.
struct UserOp {
  bool live = false;
  DataType dtype = DataType::kFloat32;
  ScalarResidence residence = ScalarResidence::kHostImmediate;
  unsigned char value[8] = {0};   // the scalar, for kHostImmediate
  const void* pointer = nullptr;  // read at call time, for kDevice (host memory here)
};

struct Comm {
  Comm();
  ~Comm();

  /// Joins the communicator (bootstrap, transports). Blocking.
  Status init(int nranks, const UniqueId& id, int rank, const Config& config);

  /// Runs a collective to completion (blocking), or only builds it (see prepare/Executor).
  Status runCollective(const OpDesc& op);
  /// Runs a batch of point-to-point ops (all posted together).
  Status runP2p(const std::vector<OpDesc>& ops);

  /// Builds what executes `op`: plan storage lives in *slot. Used by run* and by group execution.
  struct Prepared {
    ExecPlan plan;
    Executor exec;
    OpDesc op;
    bool noop = false;
    bool postDivide = false;  // integer Avg: divide the result by nranks afterwards
  };
  Status prepareCollective(const OpDesc& op, Prepared* out);
  Status prepareP2p(const std::vector<OpDesc>& ops, Prepared* out);
  /// After a prepared op completes: epilogue (integer Avg division).
  void finish(Prepared* p);

  /// Connection to `peer` through the transport that reaches it.
  Status connection(int peer, transport::Connection** out);
  /// Advances every transport.
  Status progressTransports();
  /// Records the first asynchronous error, tells peers (abort of transports).
  void fail(const Status& st);

  void* scratch(size_t bytes);

  // ---- identity ----
  int rank = 0;
  int nranks = 0;
  Config config;
  std::string tag;
  int localRanks = 1;   // ranks on this host
  bool oversubscribed = false;
  int64_t timeoutMs = 0;

  std::unique_ptr<Bootstrap> bootstrap;
  std::vector<RankInfo> peers;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<transport::Transport*> peerTransport;  // per rank, null if unreachable

  // ---- state ----
  uint64_t collSeq = 0;
  std::vector<uint64_t> p2pSendSeq, p2pRecvSeq;
  std::vector<UserOp> userOps;  // RedOp value kNumBuiltinOps + i
  std::mutex errMu;
  Status asyncError;
  std::atomic<bool> failed{false};
  bool finalized = false;

  Tuner tuner;

 private:
  struct CacheKey {
    int coll, dtype, root, algo;
    size_t count, chunk;
    bool operator<(const CacheKey& o) const {
      return std::tie(coll, dtype, root, algo, count, chunk) < std::tie(o.coll, o.dtype, o.root, o.algo, o.count, o.chunk);
    }
  };
  Result<const sched::Schedule*> schedule(const sched::CollArgs& args, sched::Algo algo);

  std::map<CacheKey, std::pair<std::unique_ptr<sched::Schedule>, std::list<CacheKey>::iterator>> cache_;
  std::list<CacheKey> lru_;
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
};

/// Live-communicator registry, so a destroyed or bogus pointer is an error, not a crash.
void registerComm(Comm* c);
void unregisterComm(Comm* c);
bool isLiveComm(const Comm* c);

}  // namespace c4
