// Bootstrap: how ranks find each other. ncclGetUniqueId starts a root listener (a thread of the
// calling process) whose address and a random secret travel in the 128-byte UniqueId. Every rank
// connects to the root, proves the secret (challenge-response keyed by it; a connection that fails
// is dropped and logged), and receives every rank's RankInfo. Ranks then keep direct sockets to
// each other: a ring for allGather/barrier and lazily opened pairwise links for send/recv (the side
// channel C4D will use).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "c4comm/c4comm.hpp"
#include "c4comm/status.hpp"
#include "core/bootstrap_wire.hpp"  // RankInfo
#include "transports/transport.hpp"

namespace c4 {

/// hash(hostname, boot id, network-namespace inode), or C4_HOSTID if set. Ranks in different
/// network namespaces on one machine get different ids.
uint64_t localHostId();
/// hash(boot id, time-namespace inode, skewNs): ranks with equal ids read the same trace clock
/// (CLOCK_MONOTONIC of one kernel plus the test-only skew, C4_TRACE_TEST_SKEW_NS), so their traces
/// need no clock alignment.
uint64_t localClockId(int64_t skewNs);

/// Fills *id and starts a root thread in this process that serves exactly one communicator
/// (it exits once all ranks have been served, or after the bootstrap timeout). The root binds to
/// C4_COMM_ID / NCCL_COMM_ID ("host:port", then the secret is derived as documented) if set,
/// otherwise to the interface chosen by C4_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on an ephemeral port.
Status bootstrapGetUniqueId(UniqueId* id);

/// Like bootstrapGetUniqueId but for a fixed root address (launcher init): the secret is derived
/// from `secretSeed`. If `startRoot`, this process serves as root.
Status bootstrapUniqueIdForAddress(const std::string& hostPort, const std::string& secretSeed, bool startRoot,
                                   UniqueId* id);

/// A 16-hex-digit tag unique to the communicator created from `id` (used to name OS objects).
std::string commTagOf(const UniqueId& id);

/// Threading: one background thread per Bootstrap accepts and authenticates incoming connections
/// and drains incoming send/recv traffic into per-(peer, tag) queues, so send() never waits for
/// the peer to call recv(). allGather/barrier run on the calling thread over the ring sockets
/// (serialized by a mutex); send/recv are thread-safe; abort() may be called from any thread.
/// Every blocking call waits at most timeoutMs (given to create) per call.
class Bootstrap : public transport::Oob {
 public:
  /// Joins the communicator `id` as `rank` of `nranks`. Blocks until every rank joined or
  /// `timeoutMs` passed (error names the ranks that never arrived, if known). `cancelFd` (optional,
  /// not owned, must outlive the bootstrap): once it is readable, the join and every later blocking
  /// call fail fast, as after abort() (an abort during a nonblocking init).
  static Status create(const UniqueId& id, int rank, int nranks, const RankInfo& mine, int64_t timeoutMs,
                       std::unique_ptr<Bootstrap>* out, int cancelFd = -1);
  ~Bootstrap() override;

  int rank() const;
  int nranks() const;
  /// Every rank's info, indexed by rank.
  const std::vector<RankInfo>& rankInfo() const;

  Status allGather(void* data, size_t bytesPerRank) override;
  Status barrier() override;
  /// Point-to-point side channel; messages with the same (peer, tag) arrive in order; a recv
  /// blocks until a message with that tag from that peer arrives (or timeout / abort). `timeoutMs`
  /// < 0: the bootstrap's timeout.
  Status send(int peer, uint32_t tag, const void* data, size_t bytes);
  /// send() waiting at most `timeoutMs` (connect, handshake and write; C4D's heartbeats).
  Status send(int peer, uint32_t tag, const void* data, size_t bytes, int64_t timeoutMs);
  /// One message of `head` followed by `data`, without joining them first (one-sided puts).
  Status sendParts(int peer, uint32_t tag, const void* head, size_t headBytes, const void* data, size_t bytes,
                   int64_t timeoutMs);
  /// Rank 0's *data to every rank, over a binomial tree of the side channel (log2(nranks) steps,
  /// each rank sends at most log2(nranks) copies): collective, every rank calls it with the same
  /// `tag`; on the others *data is replaced. At most 256 MiB.
  Status broadcast(uint32_t tag, std::string* data);
  /// Takes every message with `tag` already there, from any rank, oldest first per rank; never
  /// blocks.
  void take(uint32_t tag, std::vector<std::pair<int, std::vector<char>>>* out);
  /// The address `peer` listens on for the side channel ("ip:port").
  std::string peerAddress(int peer) const;
  /// Why `peer`'s incoming send/recv stream closed or broke ("" while it is open or never was).
  std::string peerStreamError(int peer) const;
  /// Whether an incoming send/recv stream from `peer` is open: what it sent last may not have been
  /// read yet (a process that exited closed it, but this side has not seen the end).
  bool peerStreamOpen(int peer) const;
  Status recv(int peer, uint32_t tag, void* data, size_t bytes, int64_t timeoutMs = -1);
  /// recv from whichever rank of `from` has a message with `tag` first (lowest rank among those
  /// already there); *peer says which. Fails if one of them closed with an error before sending.
  Status recvAny(const std::vector<int>& from, uint32_t tag, int* peer, void* data, size_t bytes,
                 int64_t timeoutMs = -1);
  /// Makes every blocked or later call fail fast with kRemoteError (thread-safe, never blocks).
  void abort();
  /// Makes blocked and later allGather/barrier calls fail fast with kRemoteError; send and recv
  /// keep working, so the ranks that are left can still agree on something (commShrink) after a
  /// failure. Thread-safe, never blocks.
  void interruptCollectives();

 private:
  struct Impl;
  explicit Bootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Who a communicator's ranks are and how to reach them without the data path: what its services
/// (C4D, the one-sided calls) are given at init.
struct RankDirectory {
  int rank = 0, nranks = 0;
  std::vector<RankInfo> ranks;       // index = rank
  Bootstrap* sideChannel = nullptr;  // the bootstrap's authenticated point-to-point links
};

/// Clock alignment to rank 0 (for the tracer), NTP-style over the side channel. Ranks whose
/// RankInfo::clockId equals rank 0's read its very clock: offset 0, no messages. Rank 0 answers
/// `rounds` pings from every other rank, in the order they arrive (all ranks ping at once, so 64
/// oversubscribed ranks take `rounds` scheduling delays, not 63 x `rounds`); every other rank keeps the sample with the
/// smallest round trip: offset = ((t1 - t0) + (t2 - t3)) / 2 = rank 0's clock minus this rank's,
/// wrong by at most rtt / 2. `clockNs` is the clock compared. Collective; each receive waits at
/// most `timeoutMs`. On rank 0 the result is {0, 0, now}.
struct ClockOffset {
  int64_t offsetNs = 0;
  int64_t rttNs = 0;
  int64_t atNs = 0;  // this rank's clockNs() at the chosen sample
};
Status clockSyncToRank0(Bootstrap& b, int rounds, int64_t timeoutMs, int64_t (*clockNs)(), ClockOffset* out);

/// What a launcher told this process.
struct LaunchInfo {
  int rank = -1;
  int nranks = -1;
  int localRank = -1;
  std::string launcher;      // "torchrun", "mpirun", "slurm"
  std::string rootHostPort;  // where rank 0 serves the bootstrap root, if the launcher tells us
  std::string jobKey;        // a string identifying this job (used to derive the shared secret / file)
  int localSize = -1;        // ranks on this host per the launcher (-1: unknown)
};

/// Reads torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT -> root at
/// MASTER_ADDR:MASTER_PORT+1 unless C4_COMM_ID is set), Open MPI (OMPI_COMM_WORLD_RANK/SIZE/
/// LOCAL_RANK) and Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID).
/// Fails with kInvalidUsage naming what is missing when no launcher is recognized.
Status readLaunchInfo(LaunchInfo* out);

/// Produces the same UniqueId on every rank of the job: from C4_COMM_ID or the launcher's root
/// address when known; else (all ranks on one host) through a rendezvous file under /dev/shm keyed
/// by the job, written by rank 0 with mode 0600 and read by the others. Rank 0 starts the root.
Status uniqueIdFromLaunch(const LaunchInfo& info, int64_t timeoutMs, UniqueId* id);

namespace detail {
// Internal to the bootstrap (bootstrap.cc, launch_env.cc) and its tests; not for other layers.

/// Like bootstrapGetUniqueId but always on an ephemeral port of the chosen interface (ignores
/// C4_COMM_ID: use it for ids made inside a job, e.g. commSplit, where a fixed port would clash).
/// If `rendezvousFile` is not empty the root removes it once every rank joined or when it gives up.
Status bootstrapEphemeralUniqueId(const std::string& rendezvousFile, UniqueId* id);
/// The root address stored in `id` ("host:port"); kInvalidArgument if `id` is not a c4 UniqueId.
Status uniqueIdRootAddress(const UniqueId& id, std::string* hostPort);
/// Root threads of this process still serving (tests wait for 0 to check cleanup).
int activeBootstrapRoots();
/// C4_COMM_ID / NCCL_COMM_ID ("" if unset) and C4_SECRET ("" if unset), from the param registry.
std::string commIdEnv();
std::string secretEnv();
/// The path of the /dev/shm rendezvous file for launcher init number `seq` of job `jobKey`.
std::string launchRendezvousPath(const std::string& jobKey, int seq);
}  // namespace detail

}  // namespace c4
