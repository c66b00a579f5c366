// ProcessGroupC4: the torch.distributed backend "c4" over libc4comm (CPU and CUDA tensors).
//
// Every operation is validated in the calling thread (bad arguments raise at once), then queued
// as a closure on a worker thread that owns the c4 communicator and runs the queue in issue order,
// so collectives reach c4comm in the same order on every rank. The returned WorkC4 completes (or
// fails with c4comm's reason) when the closure has run; its Future carries the output tensors,
// which is what DDP's communication hooks consume.
//
// Point-to-point send/recv do not use the collective communicator: each direction between two
// ranks gets its own two-rank communicator and worker, created on first use through the Store.
// Sends to a peer therefore never wait behind collectives or behind receives from that peer, and
// an isend/irecv exchange between two ranks cannot deadlock. Messages between a pair are matched
// in issue order; tags are accepted and ignored (as ProcessGroupNCCL does).
//
// Receive from any source (recv without src) waits on the receive channel of every peer: it queues
// a probe task on each (c4::iprobe of that pair), and the first task that finds a message claims
// the receive and takes it; the others see it claimed and end. A peer that has never sent to this
// rank has no channel yet: a watcher thread looks for the unique id its first send publishes in
// the Store and creates the channel then, so no channel waits for a peer that never sends. Every
// receive channel created while receives from any source are pending gets their probe tasks
// first, so receives are matched in the order they were issued, as in MPI.
//
// CUDA tensors (torch >= 2.2) follow ProcessGroupNCCL's stream semantics: at the call, an event on
// the tensors' current stream; the worker makes the group's own stream (one per GPU, from torch's
// pool) wait for it and issues the c4 calls on that stream (they return at once: c4comm orders
// device work on the stream), then records "done" there. Work::wait() and the Future make the
// caller's current stream wait for "done"; the host waits only for the worker to have issued the
// calls. The operation's closure (and so its tensors) is kept until "done" has passed, so the
// caching allocator cannot hand the memory out while the group's stream still uses it.
//
// Exceptions are used here (the torch edge), never inside libc4comm.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/torch/compat.hpp"
#include "c4comm/c4comm.hpp"

namespace c4torch {

#if C4_TORCH_CUDA
/// A CUDA operation's stream order (see the top of this file).
struct CudaOrder {
  CudaOrder(c10::Device d, c10::Stream s) : device(d), internal(s) {}
  c10::Device device;
  c10::Stream internal;                     // the group's stream on `device`
  c10::Event ready{c10::DeviceType::CUDA};  // the caller's current stream at the call
  c10::Event done{c10::DeviceType::CUDA};   // `internal` after the operation's c4 calls
  std::atomic<bool> recorded{false};        // `done` was recorded (the worker ran the operation)
  std::shared_ptr<void> keep;               // the operation (its tensors) until `done` has passed
};
#endif

/// A Work whose completion is set by the worker that ran the operation.
class WorkC4 : public ::c10d::Work {
 public:
  /// `opName` is a string literal (PyTorch's name of the op); `outputs` become the Future's value.
  /// `devices`: the GPU of a CUDA operation (its Future is then CUDA-aware), else empty.
  WorkC4(int rank, ::c10d::OpType type, const char* opName, const char* profilingTitle, uint64_t seq,
         std::vector<at::Tensor> outputs, std::vector<c10::Device> devices = {});

  /// Blocks until the operation finished (CUDA: was issued on the group's stream); timeout 0
  /// (kNoTimeout) waits without limit. Rethrows the operation's error. Then synchronize().
  bool wait(std::chrono::milliseconds timeout) override;
  /// CPU: no-op. CUDA: the caller's current stream waits for the operation's "done" event.
  void synchronize() override;
  /// CUDA: issued and "done" passed on the GPU.
  bool isCompleted() override;
  /// A Future completed with the output tensors (a list), or failed with the operation's error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }

  /// The sender of a completed receive from any source (Python's work._source_rank()).
  int sourceRank() const override;
  void setSourceRank(int rank) { sourceRank_.store(rank); }

#if TORCH_VERSION_MAJOR >= 2
  /// A Future completed with a c10d::WorkResult (SUCCESS, TIMEOUT, COMM_ERROR) instead of raising.
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  /// Milliseconds the operation ran on the worker (once completed).
  float getDuration() const override;
  /// The operation's number in its process group (issue order).
  uint64_t getSequencenumber() const override { return seq_; }
  /// The process group's timeout (c4comm fails a call that sees no progress for it).
  std::chrono::milliseconds getTimeout() const override { return timeout_; }
#endif
  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }
  /// Called on the worker around the operation's c4 calls (getDuration).
  void markStart() { startNs_.store(nowNs()); }
  void markEnd() { endNs_.store(nowNs()); }

  const char* opName() const { return opName_; }
  uint64_t seq() const { return seq_; }
  /// Called once, on the worker thread: completes the Future, then the Work. `error` empty = ok.
  void complete(const std::string& error);
#if C4_TORCH_CUDA
  void setCuda(std::shared_ptr<CudaOrder> c) { cuda_ = std::move(c); }
#endif

 private:
#if C4_TORCH_CUDA
  std::shared_ptr<CudaOrder> cuda_;
#endif
  const char* opName_;
  uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10::ivalue::Future> futureResult_;  // a WorkResult code (torch 2.x)
  std::atomic<int> sourceRank_{-1};
  std::chrono::milliseconds timeout_{0};
  std::atomic<int64_t> startNs_{0}, endNs_{0};
};

/// One c4 communicator and the thread that runs its operations in FIFO order. The communicator is
/// created on that thread by `init` before the first operation (lazily for p2p channels).
class Channel {
 public:
  /// What runs on the worker: c4 calls on `comm`, returning c4comm's status.
  using Op = std::function<c4::Status(c4::Comm* comm)>;
  /// Creates the communicator; `cancelled` turns true when the channel is closed or aborted, and an
  /// init that waits for a peer should then give up.
  using Init = std::function<c4::Status(c4::Comm** comm, const std::atomic<bool>& cancelled)>;
  /// Told the task's error ("" = ok) after it ran, or the creation error if the communicator failed.
  using Done = std::function<void(const std::string& error)>;

  /// `ownsComm` false: the communicator is the application's (adopted, see ProcessGroupC4), so
  /// closing the channel leaves it alive.
  Channel(std::string name, Init init, bool ownsComm = true);
  /// close() without a reason: runs what is queued, then destroys the communicator (aborts it if it
  /// failed). Bounded by C4_TIMEOUT since every queued c4 call is.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Queues `op`; `work` is completed when it ran. `describe` prefixes error messages.
  void enqueue(c10::intrusive_ptr<WorkC4> work, Op op, std::string describe);
  /// Queues `op` with a completion of the caller's own. On a closed channel `done` is told at once.
  void enqueue(Op op, Done done, std::string describe);

  /// Graceful end (Backend::shutdown): what is queued runs, then the worker ends and the
  /// communicator is destroyed; later operations fail with `why`. Idempotent.
  void close(const std::string& why);
  /// Backend::abort: revokes the communicator (an operation in flight fails at once), fails what is
  /// queued and every later operation with `why`, and returns without waiting for the worker (whose
  /// communicator init may wait on a peer); the destructor joins it and aborts the communicator.
  void abort(const std::string& why);

  /// Interop (c4comm_torch.nccl_comm): waits until every operation queued before it has run, then
  /// holds the worker until resume(), so that the caller may use the communicator through the NCCL
  /// API meanwhile (one thread at a time, as c4comm requires). Returns the communicator (null, with
  /// `error` set, if it failed or the channel is closed). One pause at a time.
  c4::Comm* pause(std::string* error);
  void resume();
  struct Gate;  // one pause (defined in the .cc)

 private:
  struct Item {
    Op op;
    Done done;
    std::string describe;
  };
  void loop();

  std::string name_;
  Init init_;
  bool ownsComm_;
  c4::Comm* comm_ = nullptr;  // written by the worker under mu_ once init ran
  c4::Status initStatus_;
  bool initDone_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::string closed_;  // why later operations fail ("" = open); guarded by mu_
  bool aborted_ = false;
  std::shared_ptr<Gate> gate_;  // the pause in effect (mu_)
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

struct AnySourceRecv;

class ProcessGroupC4 : public BackendBase {
 public:
  /// Creates the collective communicator through `store` (rank 0 publishes a c4 unique id under a
  /// key unique to this store generation, the others read it). Blocks until every rank joined;
  /// raises (c10::Error) with c4comm's reason on failure. `timeout` bounds waits on the store.
  ProcessGroupC4(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  /// A group over an existing communicator `comm` (rank and size are its own): a split's child
  /// (owned), or one the application made and hands in (c4comm_torch.adopt_comm: not owned, stays
  /// alive after the group). `store` serves the point-to-point channels.
  ProcessGroupC4(const c10::intrusive_ptr<::c10d::Store>& store, c4::Comm* comm, bool ownsComm,
                 std::chrono::milliseconds timeout);
  ~ProcessGroupC4() override;

  const std::string getBackendName() const override { return "c4"; }

  /// The collective communicator, as the ncclComm_t of c4comm's libnccl.so.2 (ProcessGroupNCCL's
  /// _comm_ptr()). Use it only inside pause()/resume().
  c4::Comm* comm() const { return comm_; }
  c4::Comm* pause(std::string* error) { return main_->pause(error); }
  void resume() { main_->resume(); }

#if TORCH_VERSION_MAJOR >= 2
  // ncclCommSplit semantics for torch.distributed.split_group: every rank of this group calls
  // split (a collective c4::commSplit on this group's worker, after what was issued before);
  // those in `ranks` get the child group, the others (NCCL_SPLIT_NOCOLOR) nullptr.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<::c10d::Backend::Options>& opts) override;
  c10::intrusive_ptr<::c10d::Backend::Options> getBackendOptions() override;
  /// Fails what is pending and every later operation at once (communicators revoked, then aborted).
  void abort() override;
  /// Runs what was issued, then frees the communicators; later operations fail.
  void shutdown() override;
  /// gloo's protocol over the point-to-point channels: ranks > 0 send to rank 0 and wait for its
  /// reply; rank 0 waits for each within opts.timeout and raises naming the ranks that did not come
  /// (the first, or with waitAllRanks all of them).
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
#endif

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override;
#if TORCH_VERSION_MAJOR >= 2
  // torch 2.x: FSDP2's collectives (one AllGather / ReduceScatter per tensor, run as one c4 group).
  // 2.15 renamed them all_gather_single_coalesced / reduce_scatter_single_coalesced; those forward
  // to these.
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplitSizes,
                                                 std::vector<int64_t>& inputSplitSizes,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;

 private:
  /// Queues `op` on `ch` and returns its Work. The operation's device is `like`'s, else its
  /// outputs' (every output must be there); a CUDA one is ordered on streams (top of this file).
  c10::intrusive_ptr<::c10d::Work> enqueue(Channel& ch, ::c10d::OpType type, const char* opName,
                                           const char* profilingTitle, std::vector<at::Tensor> outputs, Channel::Op op,
                                           const at::Tensor& like = at::Tensor());
  /// The channel that carries this rank's sends to `peer` (send=true) or receives from it. A new
  /// receive channel first gets the probe tasks of the pending receives from any source.
  Channel& p2pChannel(int peer, bool send);
  /// The Store key under which rank `src` publishes the unique id of its sends to `dst`.
  std::string p2pKey(int src, int dst) const;
  /// Queues the probe task of `a` on `ch`, the receive channel from `peer` (anyMu_ held).
  void watchPeer(const std::shared_ptr<AnySourceRecv>& a, int peer, Channel& ch);
  /// The watcher thread: creates the receive channel of a peer once its first send is announced
  /// in the Store, while receives from any source wait; fails those past the timeout.
  void anySourceLoop();

  /// Sets up what both constructors share once comm_ exists (diagnoses, the main channel).
  void start(bool ownsComm);
  /// Closes every channel (shutdown: gracefully; abort: at once) and fails pending receives from
  /// any source with `why`.
  void closeAll(const std::string& why, bool abort);

  c10::intrusive_ptr<::c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  c4::Comm* comm_ = nullptr;  // the collective communicator (main_ runs its calls)
  int64_t generation_ = 0;    // which c4 communicator of this store this group is
  uint64_t seq_ = 0;          // operations issued (guarded by seqMu_)
  std::mutex seqMu_;
  std::unique_ptr<Channel> main_;
  std::mutex p2pMu_;
  std::string closed_;  // why this group takes no more operations (shutdown/abort/destroy); p2pMu_
  std::map<std::pair<int, bool>, std::unique_ptr<Channel>> p2p_;
  // Receives from any source not yet settled, in issue order. Lock order: p2pMu_, then anyMu_.
  std::mutex anyMu_;
  std::condition_variable anyCv_;
  std::vector<std::shared_ptr<AnySourceRecv>> anyPending_;
  bool anyStop_ = false;
  std::thread anyWatcher_;                              // started by the first receive from any source
  c10::intrusive_ptr<::c10d::Store> lastNoColorStore_;  // the store of the split this rank was last left out of
#if C4_TORCH_CUDA
  // CUDA operations (guarded by seqMu_): the group's stream per GPU, and the operations whose
  // "done" has not passed yet (their closures, so their tensors, stay alive).
  std::map<c10::DeviceIndex, c10::Stream> cudaStreams_;
  std::deque<std::shared_ptr<CudaOrder>> cudaPending_;
#endif
};

/// Called from Python's atexit (c4comm_torch registers it): from then on the workers leave the
/// tensors of the operations they finish alive instead of releasing them. Releasing a tensor that has
/// a Python object takes the GIL, and a thread that asks for it while the interpreter finalizes is
/// ended by Python (pthread_exit), which std::terminate()s through the worker's noexcept frames;
/// groups still referenced at exit (FSDP2 keeps them) would otherwise abort the process.
void pythonExiting();

/// C4D's diagnoses (docs/c4d.md) of every c4 process group of this process, oldest first, as JSON
/// records (c4comm_torch.diagnoses()). Each group's communicator reports into it.
std::vector<std::string> diagnoses();

}  // namespace c4torch
